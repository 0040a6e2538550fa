#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_manifest
short_description: Compute the engine container's mount list for staged hub repos
version_added: "1.0.0"
description:
  - Binds every file of each repo's NAS snapshot into the container - from its local blob when it is staged
    (C(origin=local)), else read-only from the NAS (C(origin=nas)), a whole directory where nothing in it is local.
  - A NAS-bound file whose blob a stage or verify pass found failing its name (the progress file, or O(host_report))
    fails the module unless its NAS bytes now hash to its name or O(allow_corrupt_nas) is set.
  - Checks the result (every source exists, targets unique, every NAS file reached through exactly one mount) and
    writes nothing; the role renders RV(manifest).
author: dgx-stage maintainers
options:
  hub_local_root: {description: Node-local hub cache root; when missing nothing is local., type: path, required: true}
  hub_nas_root: {description: NAS hub cache root; read only., type: path, required: true}
  repos:
    description: Repos to mount; C(stage_repos) as it is.
    type: list
    elements: dict
    required: true
    suboptions:
      repo_id: {description: C(org/name)., type: str, required: true}
      revision: {description: "Branch, tag or 40-hex commit.", type: str, default: main}
      repo_type: {description: Hub repo type., type: str, choices: [model, dataset, space], default: model}
      allow_patterns: {description: Accepted from C(stage_repos); unused., type: raw}
      ignore_patterns: {description: Accepted from C(stage_repos); unused., type: raw}
      rank_patterns: {description: Accepted from C(stage_repos); unused., type: raw}
  plan:
    description:
      - Check mode only. The stage pass's check-mode RV(hf_hub_mirror#module:report) rows; a file not yet local is
        bound from where the stage pass puts it (RV(manifest.planned)).
    type: list
    elements: dict
  target_root:
    description: Hub root inside the container; targets are C(<target_root>/<repo folder>/snapshots/<commit>/<path>).
    type: str
    default: /hub
  bind_from:
    description: V(local) binds staged files from the local disk; V(nas) binds every file from the NAS (a roll-back).
    type: str
    choices: [local, nas]
    default: local
  allow_corrupt_nas: {description: "Bind NAS files found corrupt anyway, with a warning.", type: bool, default: false}
  host_report:
    description: The JSON text of this host's latest report on the controller, whose NAS suspects count too; an
      unreadable one fails the module unless O(allow_corrupt_nas).
    type: str
    default: ""
  host_report_path:
    description: Where O(host_report) is on the controller, for messages.
    type: str
    default: the host report
extends_documentation_fragment:
  - dgx_node
  - dgx_node.read_only
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: O(plan) adds the files the stage pass would copy.
"""

EXAMPLES = r"""
- name: Compute the engine mounts
  engine_manifest:
    hub_local_root: "{{ hub_local_root }}"
    hub_nas_root: "{{ hub_nas_root }}"
    repos: "{{ stage_repos }}"
  register: engine_mounts
"""

RETURN = r"""
manifest:
  description: The mount manifest.
  returned: success
  type: dict
  contains:
    repos:
      description: One record per entry of O(repos), in order.
      type: list
      elements: dict
      contains:
        repo_id: {description: C(org/name)., type: str}
        repo_type: {description: Hub repo type., type: str}
        revision: {description: The revision asked for., type: str}
        commit: {description: The commit it resolved to., type: str}
        folder: {description: "The repo folder name, C(models--org--name).", type: str}
        local_snapshot: {description: The snapshot directory under O(hub_local_root) (may not exist)., type: str}
        nas_snapshot: {description: The snapshot directory under O(hub_nas_root)., type: str}
        target: {description: The snapshot directory inside the container., type: str}
    mounts:
      description: Every bind, sorted by target.
      type: list
      elements: dict
      contains:
        source: {description: "Host path - a local blob, or a NAS file or directory.", type: str}
        target: {description: Path inside the container., type: str}
        read_only: {description: Always true., type: bool}
        origin: {description: V(local) or V(nas)., type: str}
        fallback_reason:
          description: Why a staged file this V(nas) mount covers is not bound from the local disk.
          type: str
          returned: when such a file is covered
    planned:
      description: Targets of local binds the stage pass has still to copy (not in the manifest file).
      type: list
      elements: str
      returned: success when check mode with O(plan)
    counts:
      description: Mounts by origin.
      type: dict
      contains: &counts
        local: {description: Mounts from the local disk., type: int}
        nas: {description: Mounts from the NAS., type: int}
        total: {description: All mounts., type: int}
    bind_from: {description: O(bind_from)., type: str}
counts:
  description: Mounts by origin.
  returned: success
  type: dict
  contains:
    <<: *counts
    planned:
      description: Of the local mounts, those whose file the stage pass has still to copy.
      type: int
      returned: success when check mode with O(plan)
  sample: {local: 141, nas: 30, total: 171}
nas_corrupt:
  description: NAS-bound files whose blob was found failing its name and not proven since.
  returned: success; on failure when the manifest would bind them
  type: list
  elements: dict
  contains:
    repo_id: {description: The repo., type: str}
    path: {description: The file's snapshot path (null when the record cannot be read)., type: str}
    blob: {description: "The blob's name, the hash its bytes must have.", type: str}
    nas_file: {description: The NAS snapshot file bound., type: str}
    why: {description: "When and how it was found corrupt, or why the NAS file still fails its name.", type: str}
msg: {description: "Why no manifest could be computed, or the corrupt NAS files bound.", returned: failure, type: str}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_manifest import build_manifest
from ansible.module_utils.dgx_nas_suspects import bound_suspects, report_suspects, suspect_text


ARGUMENT_SPEC = dict(
    hub_local_root=dict(type="path", required=True),
    hub_nas_root=dict(type="path", required=True),
    repos=dict(type="list", elements="dict", required=True, options=dict(
        repo_id=dict(type="str", required=True),
        revision=dict(type="str", default="main"),
        repo_type=dict(type="str", choices=["model", "dataset", "space"], default="model"),
        allow_patterns=dict(type="raw"),
        ignore_patterns=dict(type="raw"),
        rank_patterns=dict(type="raw"),
    )),
    plan=dict(type="list", elements="dict"),
    target_root=dict(type="str", default="/hub"),
    bind_from=dict(type="str", choices=["local", "nas"], default="local"),
    allow_corrupt_nas=dict(type="bool", default=False),
    host_report=dict(type="str", default=""),
    host_report_path=dict(type="str", default="the host report"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        manifest, _nas_files = build_manifest(params["hub_local_root"], params["hub_nas_root"],
                                              params["repos"], params["target_root"],
                                              params["plan"] if module.check_mode else None,
                                              params["bind_from"])
    except StageError as exc:
        module.fail_json(msg=str(exc))
    counts = dict(manifest["counts"])
    if "planned" in manifest:
        counts["planned"] = len(manifest["planned"])
    elif params["bind_from"] == "local" and not os.path.isdir(params["hub_local_root"]):
        module.warn("hub_local_root %s does not exist: every file is mounted from the NAS"
                    % params["hub_local_root"])
    suspects = bound_suspects(manifest, params["hub_local_root"])
    suspects += report_suspects(manifest, params["host_report"], params["host_report_path"], params["hub_local_root"])
    if suspects and not params["allow_corrupt_nas"]:
        module.fail_json(msg=suspect_text(suspects, False, params["bind_from"]), nas_corrupt=suspects)
    if suspects:
        module.warn(suspect_text(suspects, True, params["bind_from"]))
    module.exit_json(changed=False, manifest=manifest, counts=counts, nas_corrupt=suspects)


if __name__ == "__main__":
    main()
