#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: safetensors_check
short_description: Check a staged snapshot's safetensors index against its shard headers
version_added: "1.0.0"
description:
  - Reads the index's C(weight_map) and the header of every shard it names (shard links are followed); tensor
    data is never read, so a 300 GB checkpoint is checked in seconds (hf_hub_mirror proves the bytes).
  - A shard passes exactly when the C(safetensors) 0.8.0 loader would load it (header length, JSON, dtypes,
    shapes, C(data_offsets) tiling the data section exactly), except that a tensor name given twice in one
    header is refused.
  - Across shards it fails when the index maps a tensor to a shard that lacks it, a tensor is in two shards
    (C(Duplicate mapped checkpoint key), as the engine says when a shard link points at the wrong blob), or an
    indexed shard is missing. Every shard is checked; the message names ten problems at most, RV(problems) all.
  - Without an index, every top-level C(*.safetensors) file is checked; none at all passes with RV(shards=0).
author: dgx-stage maintainers
options:
  path:
    description:
      - Local snapshot directory, C(<hub>/models--org--name/snapshots/<commit>).
    type: path
    required: true
  index:
    description:
      - Index file, relative to O(path). Shard names in it are relative to its directory.
      - When omitted, C(model.safetensors.index.json) is used if present. When given, it must exist.
    type: str
  absent_ok:
    description:
      - Snapshot-relative paths the staging patterns left out on purpose (a rank's sparse copy, from
        hf_hub_mirror's C(excluded_paths)). A shard listed here may be missing; its keys are not looked for.
    type: list
    elements: str
    default: []
  nas_path:
    description:
      - The NAS snapshot the local one was staged from, C(<NAS hub>/models--org--name/snapshots/<commit>). The
        header of each O(absent_ok) shard not on the local disk is read there (only where its link chain ends at a
        regular file inside that NAS hub) and checked like a local one; RV(nas_shards) lists them.
      - When omitted, such shards are skipped - listed in RV(absent), their keys not looked for.
    type: path
  repo_id:
    description: The repo the snapshot belongs to; only echoed in RV(report), so a caller needs no shaping.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only; behaves the same in check mode.
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: full
    details: Only reads shard headers; it never writes.
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
"""

EXAMPLES = r"""
- name: Check the staged checkpoint's shard headers against its index
  safetensors_check:
    path: "{{ mirror.snapshot }}"

- name: A rank's sparse copy - its own shards here, the ones it left on the NAS read there
  safetensors_check:
    path: "{{ mirror.snapshot }}"
    absent_ok: "{{ mirror.excluded_paths }}"
    nas_path: "{{ hub_nas_root }}/{{ mirror.snapshot | relpath(hub_local_root) }}"
"""

RETURN = r"""
absent:
  description: Shards named in the index that are not on disk and are allowed to be (O(absent_ok)).
  returned: success
  type: list
  elements: str
nas_shards:
  description: Shards of RV(absent) whose headers were read from O(nas_path) and checked (empty without it).
  returned: success
  type: list
  elements: str
shards:
  description: Number of shard files whose headers were checked, on the local disk and (O(nas_path)) on the NAS.
  returned: success
  type: int
  sample: 69
tensors:
  description: Number of tensors found in the checked headers.
  returned: success
  type: int
  sample: 94211
checked_bytes:
  description: Header bytes read (8-byte length plus JSON per shard).
  returned: success
  type: int
  sample: 10485760
index:
  description: Index file used, or null when there was none.
  returned: success
  type: str
  sample: /nvme/hub/models--org--name/snapshots/0123abcd/model.safetensors.index.json
msg:
  description: One-line summary; on failure, every failing shard (up to ten) with its first problems.
  returned: always
  type: str
  sample: 69 shards, 94211 tensors match model.safetensors.index.json
report:
  description: The host report's row for this check.
  returned: success
  type: dict
  contains:
    repo_id:
      description: O(repo_id) as given (null when not given).
      type: str
    shards:
      description: As RV(shards).
      type: int
    tensors:
      description: As RV(tensors).
      type: int
    nas_shards:
      description: How many of them were read from the NAS (RV(nas_shards)).
      type: int
problems:
  description: Every problem found, one line each, naming the shard (and the tensor where there is one).
  returned: failure
  type: list
  elements: str
  sample:
    - "/nvme/hub/models--org--name/snapshots/0123abcd/model-00002-of-00069.safetensors: tensor
      layers.1.w: unknown dtype 'F8_E4M3FN' (the safetensors loader refuses it)"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_safetensors import check_snapshot

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    index=dict(type="str"),
    absent_ok=dict(type="list", elements="str", default=[]),
    nas_path=dict(type="path"),
    repo_id=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = check_snapshot(module.params["path"], module.params["index"], module.params["absent_ok"],
                                module.params["nas_path"])
    except StageError as exc:
        module.fail_json(msg=str(exc), problems=getattr(exc, "problems", [str(exc)]))
    result["report"] = {"repo_id": module.params["repo_id"], "shards": result["shards"], "tensors": result["tensors"],
                        "nas_shards": len(result["nas_shards"])}
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
