#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: stage_status
short_description: Say what a node holds - staged commits, local files, last stage and verify, receipts, engine
version_added: "1.0.0"
description:
  - Reads, never changes, the node - per repo of O(repos) the staged commit, its local files and bytes and the last
    stage and verify pass (from its progress file); the receipt roots; the engine from O(engine_probe); the mount
    manifest. A symlink in the local hub or a garbage progress file is reported, not read through.
author: dgx-stage maintainers
options:
  hub_local_root: {description: The node-local hub cache root., type: path, required: true}
  repos:
    description: The repos to report, as in C(stage_repos) (C(repo_id), C(repo_type), C(revision); other keys ignored).
    type: list
    elements: dict
    required: true
  receipt_parent: {description: The directory holding the engine's receipt roots., type: path, default: /cache}
  receipt_roots:
    description: The receipt roots' bare names; default the three C(ds41-*) roots.
    type: list
    elements: str
  engine_enabled:
    description: The engine is enabled on this host (else it is V(disabled)).
    type: bool
    default: true
  engine_name: {description: The engine container's name., type: str, default: ds41-engine}
  engine_probe:
    description: The result of M(engine_lane_wait) with C(container) on this host ({} when it did not run).
    type: dict
    default: {}
  manifest_path: {description: The engine's mount manifest on this node; unset - not reported., type: path}
  hub_nas_root: {description: "The NAS hub cache root, to tell whether it moved past the manifest.", type: path}
extends_documentation_fragment:
  - dgx_node
  - dgx_node.read_only
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Read-only; check mode reads the same.
"""

EXAMPLES = r"""
- name: What this node holds
  stage_status:
    hub_local_root: "{{ hub_local_root }}"
    repos: "{{ stage_repos }}"
    receipt_parent: "{{ receipt_parent }}"
    receipt_roots: "{{ receipt_roots }}"
    engine_enabled: "{{ lane_engine_enabled }}"
    engine_probe: "{{ __status_probe if lane_engine_enabled else {} }}"
  register: __status
"""

RETURN = r"""
status:
  description: What the node holds.
  returned: success
  type: dict
  contains:
    hub_local_root: {description: O(hub_local_root)., type: str}
    problem: {description: "Why the local hub could not be read (RV(status.repos) empty), else null.", type: str}
    repos:
      description: One row per repo of O(repos), in their order; a field not known is null.
      type: list
      elements: dict
      contains:
        repo_id: {description: The repo id., type: str}
        repo_type: {description: "model, dataset or space.", type: str}
        revision: {description: The revision asked for (default main)., type: str}
        folder: {description: The repo folder (C(models--org--name)); null for an invalid repo id., type: str}
        state:
          description:
            - V(staged), V(not staged) (no repo folder or ref), V(snapshot missing) (the ref's snapshot is not
              there), V(refused) (a symlink where a directory must be) or V(error) (an invalid repo id, a snapshot
              that could not be read).
          type: str
        problem: {description: "What is wrong, for every state but V(staged).", type: str}
        commit: {description: The staged commit (C(refs/<revision>))., type: str}
        snapshot: {description: The local snapshot directory., type: str}
        files_local: {description: Files of the snapshot whose content is in the local repo., type: int}
        bytes_local: {description: Bytes of their distinct contents., type: int}
        dangling: {description: Snapshot links whose content is missing or outside the repo folder., type: int}
        last_staged: {description: "When the last stage pass last wrote its figures, ISO 8601 UTC.", type: str}
        last_stage_status: {description: "How it ended - V(ok), V(failed), V(interrupted) or V(running).", type: str}
        last_verified: {description: "When the last verify pass last wrote its figures, ISO 8601 UTC.", type: str}
        verify_mode: {description: "Its verify mode, V(sample), V(full) or V(none).", type: str}
        last_verify_status: {description: How it ended., type: str}
        verified_commit: {description: The commit the last verify pass proved., type: str}
        progress_problem: {description: Why the progress file could not be read (wholly or partly)., type: str}
        nas_corrupt:
          description: The NAS blobs found failing their names and not proven since (a roll-back refuses them).
          type: list
          elements: dict
          contains:
            blob: {description: The blob's name., type: str}
            paths: {description: Its snapshot paths., type: list, elements: str}
            found_at: {description: "When a pass last found it, ISO 8601 UTC, or null.", type: str}
    receipts:
      description: The receipt roots under O(receipt_parent).
      type: dict
      contains:
        parent: {description: O(receipt_parent)., type: str}
        present: {description: The names of O(receipt_roots) present there., type: list, elements: str}
        problem: {description: "Why they could not be looked up, else null.", type: str}
    engine:
      description: The engine container and its API.
      type: dict
      contains:
        enabled: {description: O(engine_enabled)., type: bool}
        name: {description: O(engine_name)., type: str}
        state:
          description:
            - V(disabled), V(running), V(exited), V(absent) (no such container, or no runtime), V(unknown) (not
              looked up, or the runtime could not answer) or the runtime's word (V(paused), V(created) ...).
          type: str
        exit_code: {description: "The exit code of a container that is not running, else null.", type: int}
        container_id: {description: "The container id, or null.", type: str}
        health:
          description: V(not checked) unless the container runs, V(ok) when the API listed its models, else
            V(unhealthy) and why.
          type: str
        models: {description: The model ids the API listed., type: list, elements: str}
        problem: {description: "Why the state is V(unknown) or V(absent), when the runtime said so.", type: str}
    manifest:
      description: The mount manifest; null without O(manifest_path).
      type: dict
      contains:
        path: {description: O(manifest_path)., type: str}
        problem:
          description: V(not written yet), V(not a regular file), or why it is not a JSON mount manifest; else null.
          type: str
        written: {description: "Its mtime, ISO 8601 UTC.", type: str}
        bind_from: {description: V(local) or V(nas) (a roll-back); null when unrecorded or invalid., type: str}
        field_problems:
          description: Each manifest field of the wrong type, with its value (not read; the rest is). Absent when
            the manifest could not be read at all.
          type: list
          elements: str
        repos:
          description: Per repo it binds.
          type: list
          elements: dict
          contains:
            repo_id: {description: The repo., type: str}
            revision: {description: Its revision., type: str}
            commit: {description: The commit the manifest binds., type: str}
            nas_commit: {description: "The commit the NAS C(refs/<revision>) names now, or null.", type: str}
            moved: {description: The NAS ref names another commit than the bound one., type: bool}
            problem: {description: "Why the NAS ref could not be read, else null.", type: str}
lines:
  description: The lines C(playbooks/status.yml) prints - one per repo, the receipts, the manifest, the engine.
  returned: success
  type: list
  elements: str
  sample:
    - "coolbho3k/DSpark-drafter@main: commit 1a2b3c4d5e6f, 5 files, 1.2 GiB local; staged 2026-11-30T20:45:12Z; verified 2026-11-30T21:02:40Z (full)"
    - "receipts under /cache: none"
    - "engine ds41-engine: disabled"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_fsutil import printable_names
from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS
from ansible.module_utils.dgx_status import host_status, status_lines

ARGUMENT_SPEC = dict(
    hub_local_root=dict(type="path", required=True),
    repos=dict(type="list", elements="dict", required=True),
    receipt_parent=dict(type="path", default="/cache"),
    receipt_roots=dict(type="list", elements="str"),
    engine_enabled=dict(type="bool", default=True),
    engine_name=dict(type="str", default="ds41-engine"),
    engine_probe=dict(type="dict", default={}),
    manifest_path=dict(type="path"),
    hub_nas_root=dict(type="path"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    roots = params["receipt_roots"] if params["receipt_roots"] is not None else list(RECEIPT_ROOTS)
    status = host_status(params["hub_local_root"], params["repos"], params["receipt_parent"], roots,
                         params["engine_enabled"], params["engine_name"], params["engine_probe"],
                         params["manifest_path"], params["hub_nas_root"])
    module.exit_json(changed=False, status=printable_names(status), lines=printable_names(status_lines(status)))


if __name__ == "__main__":
    main()
