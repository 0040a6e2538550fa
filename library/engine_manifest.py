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
  - For each repo, resolves the commit (local C(refs/<revision>), else a 40-hex revision with a
    local snapshot, else the same on the NAS) and walks the NAS snapshot, the source of truth for
    every file.
  - A file whose local copy resolves to a regular file inside O(hub_local_root), every folder on its local
    path a real directory there, is bound from that local blob (C(origin=local)).
  - Everything else is bound read-only from the NAS (C(origin=nas)). A maximal directory with no
    local file in it (the optional page15 pack) becomes one directory mount; other files get one
    mount each, with the NAS file as source.
  - A directory is only bound whole when every file in it is a real file (or a relative link that
    stays inside it). Snapshot links such as C(../../blobs/<sha>) would dangle inside the
    container, so such files are bound one by one, resolved on the host.
  - With O(bind_from=nas) the local hub is not read - its refs, links and blobs are left as they
    are and ignored, only dgx-stage's own record of NAS blobs found corrupt is read - and every file is bound read-only from the NAS snapshot of the NAS's commit
    (C(origin=nas)), so a lane whose local disks are suspect serves the NAS weights without anything
    being removed. V(local) again binds the staged copies.
  - A file bound from the NAS whose blob a stage or verify pass found failing its name (kept under
    C(nas_corrupt) in the repo's progress file, C(<hub_local_root>/.locks/<repo folder>/dgx-stage.progress.json))
    fails the module naming the file, the blob and the NAS file, unless O(allow_corrupt_nas) (then a warning).
    A NAS file changed since it was found is hashed again and bound when its bytes now hash to its name.
  - So does a file bound from the NAS whose blob the host's latest report on the controller (O(host_report))
    lists under C(nas_suspects) (every blob a real stage or verify pass found, whatever passes ran since) or
    C(nas_corrupt_blobs) of a real stage or verify row of its repo (C(nas_corrupt) at the row's commit, for a row
    written before rows named blobs), the blob a path names being its snapshot link's first hop, when the node's own record does not hold it - a roll-back onto
    a wiped or swapped local hub, or another O(hub_local_root). Such a NAS file is hashed, and bound when its bytes
    hash to its name (re-downloaded since). Check mode decides the same.
  - Before returning, checks that every source exists, no two mounts share a target, no target
    is nested in a directory mount, every NAS mount is read-only, and every NAS snapshot file is
    reachable through exactly one mount.
  - Changes nothing; a role renders RV(manifest) to C(engine_manifest_path) with a template.
author: dgx-stage maintainers
options:
  hub_local_root:
    description: Node-local hub cache root (holds C(models--*)). May be missing; then nothing is local.
    type: path
    required: true
  hub_nas_root:
    description: NAS hub cache root (holds C(models--*)); read only.
    type: path
    required: true
  repos:
    description:
      - Repos to mount; C(stage_repos) can be passed unchanged.
    type: list
    elements: dict
    required: true
    suboptions:
      repo_id:
        description: C(org/name).
        type: str
        required: true
      revision:
        description: Branch, tag or 40-hex commit.
        type: str
        default: main
      repo_type:
        description: Hub repo type.
        type: str
        choices: [model, dataset, space]
        default: model
      allow_patterns:
        description: Accepted so C(stage_repos) entries pass validation; not used here.
        type: raw
      ignore_patterns:
        description: Accepted so C(stage_repos) entries pass validation; not used here.
        type: raw
      rank_patterns:
        description:
          - Accepted so C(stage_repos) entries pass validation (a map rank -> patterns, or a list of templates
            with C({rank}) and C({world_size})); not used here - whatever a rank staged is found on its local
            disk, and every other file of the NAS snapshot is bound read-only from the NAS.
        type: raw
  plan:
    description:
      - Check mode only (ignored otherwise, so a real run binds only what is on disk). The stage pass's
        plan, its C(hf_hub_mirror) RV(hf_hub_mirror#module:report) rows from check mode passed unchanged;
        each row's C(repo_id), C(repo_type), C(commit) and C(excluded_paths) are read, other keys ignored.
      - A file a row's repo and commit select (not in its C(excluded_paths)) and that is not on the local
        disk yet is bound from where the stage pass will put it (C(origin=local), listed in RV(manifest.planned)), so
        the manifest predicts what the real run binds. A row for another commit plans nothing.
    type: list
    elements: dict
  target_root:
    description: Hub root inside the container; targets are C(<target_root>/<repo folder>/snapshots/<commit>/<path>).
    type: str
    default: /hub
  bind_from:
    description:
      - V(local) binds every file staged on the local disk from there and the rest from the NAS.
      - V(nas) binds every file from the NAS, read-only, ignoring local copies (and O(plan)); the commit is
        the NAS's for the revision. Nothing local is read, changed or removed.
    type: str
    choices: [local, nas]
    default: local
  allow_corrupt_nas:
    description:
      - Bind NAS files found corrupt anyway, with a warning (C(engine_allow_corrupt_nas)); RV(nas_corrupt) lists them.
    type: bool
    default: false
  host_report:
    description:
      - The text (JSON) of this host's latest report on the controller, C(<report dir>/<host>.json); its
        C(nas_suspects), C(passes.stage) and C(passes.verify) rows (C(repo_id), C(repo_type), C(check_mode),
        C(commit), C(nas_corrupt_blobs), C(nas_corrupt)) and C(plays) are read. Empty - no report yet - adds no
        suspect.
      - A text that is not a JSON object, or whose parts read are of another shape (a path that is no relative
        snapshot path, a blob that is no blob name), fails the module for every repo, as an unreadable record of
        the node does, unless O(allow_corrupt_nas).
    type: str
    default: ""
  host_report_path:
    description: Where O(host_report) is on the controller; only named in messages.
    type: str
    default: the host report
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only; in check mode O(plan) adds the files the stage pass would copy.
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: full
    details: The same staged trees give the same manifest; the module never writes.
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
"""

EXAMPLES = r"""
- name: Compute the engine mounts
  engine_manifest:
    hub_local_root: "{{ hub_local_root }}"
    hub_nas_root: "{{ hub_nas_root }}"
    repos: "{{ stage_repos }}"
  register: engine_mounts

- name: Write the manifest
  ansible.builtin.copy:
    content: "{{ engine_mounts.manifest | to_nice_json(indent=2) }}"
    dest: "{{ engine_manifest_path }}"
    mode: "0644"

- name: Serve the NAS weights while the local disk is suspect (the local hub is left as it is)
  engine_manifest:
    hub_local_root: "{{ hub_local_root }}"
    hub_nas_root: "{{ hub_nas_root }}"
    repos: "{{ stage_repos }}"
    bind_from: nas
    host_report: "{{ lookup('ansible.builtin.file', report_file) }}"
    host_report_path: "{{ report_file }}"
  vars:
    report_file: "reports/{{ inventory_hostname }}.json"
  register: engine_mounts
"""

RETURN = r"""
manifest:
  description: The mount manifest, C({repos, mounts, counts, bind_from}); mounts are sorted by target.
  returned: success
  type: dict
  contains:
    repos:
      description: One record per entry of O(repos), in order.
      type: list
      elements: dict
      contains:
        repo_id:
          description: C(org/name).
          type: str
        repo_type:
          description: Hub repo type.
          type: str
        revision:
          description: The revision asked for.
          type: str
        commit:
          description: The commit it resolved to.
          type: str
        folder:
          description: The repo folder name, C(models--org--name).
          type: str
        local_snapshot:
          description: The snapshot directory under O(hub_local_root) (it may not exist).
          type: str
        nas_snapshot:
          description: The snapshot directory under O(hub_nas_root).
          type: str
        target:
          description: The snapshot directory inside the container.
          type: str
    mounts:
      description: Every bind, sorted by target.
      type: list
      elements: dict
      contains:
        source:
          description: Host path - a local blob, or a NAS file or directory.
          type: str
        target:
          description: Path inside the container.
          type: str
        read_only:
          description: Always true.
          type: bool
        origin:
          description: V(local) or V(nas).
          type: str
        fallback_reason:
          description:
            - On a V(nas) mount only, when a file it covers is staged but not bound from the local disk because a
              folder on its local path is not a real directory inside O(hub_local_root) (a symlink); says which.
          type: str
          returned: when such a file is covered
    planned:
      description:
        - Check mode with O(plan) only, and not part of the manifest file - the targets of local binds whose
          file the stage pass has still to copy.
      type: list
      elements: str
      returned: success when check mode with O(plan)
    counts:
      description: Mounts by origin (RV(counts) without its C(planned)).
      type: dict
      contains: &counts
        local:
          description: Mounts from the local disk.
          type: int
        nas:
          description: Mounts from the NAS.
          type: int
        total:
          description: All mounts.
          type: int
    bind_from:
      description: O(bind_from), V(local) or V(nas), which C(dgx-stage status) reports.
      type: str
  sample:
    repos:
      - repo_id: org/name
        repo_type: model
        revision: main
        commit: 0123456789abcdef0123456789abcdef01234567
        folder: models--org--name
        local_snapshot: /nvme/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
        nas_snapshot: /nas/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
        target: /hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
    mounts:
      - source: /nvme/hub/models--org--name/blobs/4d2f0c
        target: /hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567/config.json
        read_only: true
        origin: local
      - source: /nas/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567/page15
        target: /hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567/page15
        read_only: true
        origin: nas
    counts: {local: 1, nas: 1, total: 2}
    bind_from: local
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
  description:
    - The files the manifest binds from the NAS whose blob was found failing its name and not proven since, by the
      node's own record or by the host report (O(host_report)).
  returned: success; on failure when the manifest would bind them
  type: list
  elements: dict
  contains:
    repo_id:
      description: The repo.
      type: str
    path:
      description: The file's path in the snapshot (null when the repo's record or the host report cannot be read; RV(nas_corrupt[].why) says why).
      type: str
    blob:
      description: The blob's name, the hash its bytes must have.
      type: str
    nas_file:
      description: The NAS snapshot file bound.
      type: str
    why:
      description:
        - When and how it was found corrupt (and, from the host report, its path on the controller), or why the NAS
          file still does not prove its name.
      type: str
  sample:
    - repo_id: org/model
      path: model-00002-of-00006.safetensors
      blob: 982d84f448ad773b5ac6642a6accdbcdc0aecc5328987cc880396127e1ece6df
      nas_file: /mnt/nas/hf/models--org--model/snapshots/1a2b3c/model-00002-of-00006.safetensors
      why: found corrupt 2026-12-01T10:18:45Z (its sampled bytes differ from the local copy's) and unchanged since
msg:
  description:
    - Why no manifest could be computed (a missing NAS root or snapshot, an inconsistent mount list), or the
      NAS files found corrupt it would bind.
  returned: failure
  type: str
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
