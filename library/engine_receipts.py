#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_receipts
short_description: Clear the engine's per-run receipt roots before serve
version_added: "1.0.0"
description:
  - The engine writes per-run receipts strict-on-exists (C(mkdir(exist_ok=False)), C(open('xb'))),
    so a receipt root left over from an earlier run makes every restart fail with C(FileExistsError).
  - Removes each listed root that is a direct child of O(parent). A root that is a symlink is
    unlinked; its target is left untouched. Read-only files and directories inside a root are
    made writable before removal; run with become so ownership is no obstacle.
  - Refuses, removing nothing, while a live process has a file open or its working directory
    under a root (found through C(/proc/*/fd) and C(/proc/*/cwd)), unless O(force=true).
author: dgx-stage maintainers
options:
  parent:
    description:
      - Directory holding the receipt roots. Must be absolute and must not be (or resolve to) C(/).
    type: path
    default: /cache
  names:
    description:
      - Bare directory names of the receipt roots under O(parent).
      - Names containing C(/) or C(..), C(.) itself and empty names are refused.
    type: list
    elements: str
    default: [ds41-backend-attestation, ds41-combined-ready, ds41-display-kv]
  state:
    description:
      - Only V(absent) is supported.
    type: str
    choices: [absent]
    default: absent
  force:
    description:
      - Remove the roots even if a live process holds a file under one of them.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports in RV(removed) what would be removed and touches nothing; the in-use check still runs.
  diff_mode:
    support: full
    details: Each root present before, absent after.
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: full
    details: Once the roots are gone a second run removes nothing.
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
  - Missing roots are not an error; the task then reports no change.
"""

EXAMPLES = r"""
- name: Clear stale receipt roots so the engine can write this run's receipts
  engine_receipts:
    parent: "{{ receipt_parent }}"
    names: "{{ receipt_roots }}"
    state: absent
  become: true
"""

RETURN = r"""
removed:
  description: Receipt roots removed (in check mode, the ones that would be removed).
  returned: success
  type: list
  elements: str
  sample: [/cache/ds41-backend-attestation]
would_remove:
  description: Receipt roots found present, i.e. the removal plan.
  returned: success
  type: list
  elements: str
  sample: [/cache/ds41-backend-attestation]
holders:
  description: Processes found holding a file under a root (only non-empty with O(force=true); see the warning).
  returned: success
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    name:
      description: Process name (C(/proc/<pid>/comm)).
      type: str
    path:
      description: The open file or working directory under a root.
      type: str
  sample: [{pid: 4242, name: python3, path: /cache/ds41-combined-ready/worker.json}]
diff:
  description: "Each root of RV(would_remove) as C(<path>: present) before and C(<path>: absent) after."
  returned: success
  type: dict
  contains:
    before:
      description: "One C(<path>: present) line per root found."
      type: str
    after:
      description: "One C(<path>: absent) line per root found."
      type: str
msg:
  description: Why nothing was removed (a bad name or parent, a root in use), or which removal failed.
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS, clear_receipts, format_holders

ARGUMENT_SPEC = dict(
    parent=dict(type="path", default="/cache"),
    names=dict(type="list", elements="str", default=list(RECEIPT_ROOTS)),
    state=dict(type="str", choices=["absent"], default="absent"),
    force=dict(type="bool", default=False),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        result = clear_receipts(params["parent"], params["names"], force=params["force"],
                                check_mode=module.check_mode)
    except StageError as exc:
        module.fail_json(msg=str(exc))
    if result["holders"]:
        module.warn("force: removed receipt roots while in use: %s" % format_holders(result["holders"]))
    changed = bool(result["removed"])
    diff = {"before": "".join("%s: present\n" % p for p in result["would_remove"]),
            "after": "".join("%s: absent\n" % p for p in result["would_remove"])}
    module.exit_json(changed=changed, diff=diff, **result)


if __name__ == "__main__":
    main()
