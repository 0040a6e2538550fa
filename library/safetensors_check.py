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
  - Reads the index's C(weight_map) and the header of every shard it names, never tensor data (M(hf_hub_mirror)
    proves the bytes). A shard passes when the C(safetensors) 0.8.0 loader would load it, and a tensor name
    given twice in one header is refused too.
  - Fails when the index maps a tensor to a shard that lacks it, a tensor is in two shards, or an indexed shard is
    missing. Without an index every top-level C(*.safetensors) file is checked; none at all passes.
author: dgx-stage maintainers
options:
  path: {description: The local snapshot directory., type: path, required: true}
  index:
    description: Index file, relative to O(path), that must exist; unset - C(model.safetensors.index.json) if present.
    type: str
  absent_ok:
    description: Snapshot paths left out on purpose (M(hf_hub_mirror)'s C(excluded_paths)); such a shard may be missing.
    type: list
    elements: str
    default: []
  nas_path:
    description: The NAS snapshot the local one was staged from; the O(absent_ok) shards not on the local disk are
      checked there (RV(nas_shards)). Unset - they are skipped.
    type: path
  repo_id: {description: "The repo the snapshot belongs to, echoed in RV(report).", type: str}
extends_documentation_fragment:
  - dgx_node
  - dgx_node.read_only
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Read-only; behaves the same in check mode.
  idempotent:
    details: Only reads shard headers; it never writes.
"""

EXAMPLES = r"""
- name: Check the staged checkpoint's shard headers against its index
  safetensors_check:
    path: "{{ mirror.snapshot }}"
    absent_ok: "{{ mirror.excluded_paths }}"
    nas_path: "{{ mirror.source_snapshot }}"
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
tensors: {description: Number of tensors found in the checked headers., returned: success, type: int, sample: 94211}
checked_bytes: {description: Header bytes read., returned: success, type: int, sample: 10485760}
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
    repo_id: {description: O(repo_id) as given (null when not given)., type: str}
    shards: {description: As RV(shards)., type: int}
    tensors: {description: As RV(tensors)., type: int}
    nas_shards: {description: How many of them were read from the NAS (RV(nas_shards))., type: int}
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
