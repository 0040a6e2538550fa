#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: safetensors_check
short_description: Check a staged snapshot's safetensors index against its shard headers
description:
  - Reads the index's C(weight_map) and the header of every shard it names (an 8-byte
    little-endian length plus JSON); tensor data is never read, so a 300 GB checkpoint is
    checked in seconds.
  - Fails, naming shard and tensor, when a tensor is mapped to a shard that lacks it, a tensor is
    in two shards (C(Duplicate mapped checkpoint key), the error the engine raises when a shard
    link points at the wrong blob), a header is malformed (bad length, invalid JSON, a tensor
    without dtype/shape/data_offsets, offsets that disagree with dtype and shape), data offsets
    run past the end of the file or overlap, or a shard named by the index is missing.
  - Shards are normally symlinks into C(../../blobs); they are followed.
  - Without an index, every top-level C(*.safetensors) file (usually the single
    C(model.safetensors)) is checked. A snapshot without safetensors files passes with RV(shards=0).
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
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Read-only; behaves the same in check mode.
  diff_mode:
    support: none
  idempotent:
    description: Only reads shard headers; it never writes.
    support: full
  platform:
    support: full
    platforms: posix
author: dgx-stage
"""

EXAMPLES = r"""
- name: Check the staged checkpoint's shard headers against its index
  safetensors_check:
    path: "{{ mirror.snapshot }}"
"""

RETURN = r"""
absent:
  description: Shards named in the index that are not on disk and are allowed to be (O(absent_ok)).
  returned: success
  type: list
  elements: str
shards:
  description: Number of shard files whose headers were checked.
  returned: always
  type: int
  sample: 69
tensors:
  description: Number of tensors found in the checked headers.
  returned: always
  type: int
  sample: 94211
checked_bytes:
  description: Header bytes read (8-byte length plus JSON per shard).
  returned: always
  type: int
  sample: 10485760
index:
  description: Index file used, or null when there was none.
  returned: always
  type: str
  sample: /nvme/hub/models--org--name/snapshots/0123abcd/model.safetensors.index.json
msg:
  description: One-line summary.
  returned: always
  type: str
  sample: 69 shards, 94211 tensors match model.safetensors.index.json
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_safetensors import check_snapshot


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            index=dict(type="str"),
            absent_ok=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    try:
        result = check_snapshot(module.params["path"], module.params["index"], module.params["absent_ok"])
    except StageError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
