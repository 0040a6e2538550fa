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
  - The engine writes its receipts strict-on-exists, so a receipt root left by an earlier run fails every restart
    with C(FileExistsError). Removes each listed root under O(parent); a symlink root is unlinked, its target
    left alone.
  - Refuses, removing nothing, while a process holds a root (unless O(force=true)), judged by device and inode as
    the host sees it - its cwd, an open or mapped file under a root, or (another mount namespace) a bind of a
    root, something in one, O(parent), or read-write a directory above O(parent). The failure names each holder
    and the fix; so does a C(/proc) that cannot be listed. Roots held only by O(live_container) are kept (RV(kept)).
author: dgx-stage maintainers
options:
  parent: {description: Absolute directory holding the receipt roots; not C(/)., type: path, default: /cache}
  names:
    description: Bare directory names of the receipt roots (no C(/), C(..), C(.) or empty name).
    type: list
    elements: str
    default: [ds41-backend-attestation, ds41-combined-ready, ds41-display-kv]
  state: {description: Only V(absent) is supported., type: str, choices: [absent], default: absent}
  force:
    description: Remove the roots even while held, or holding a mount point (which stays, RV(mounts_kept)).
    type: bool
    default: false
  live_container:
    description: Id (or a 12+ character prefix) of this host's running engine, whose roots are the live run's.
    type: str
    default: ""
  inventory_hostname: {description: "This node's name, the C(--limit) of the fix command a refusal gives.", type: str}
extends_documentation_fragment:
  - dgx_node
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: RV(removed) says what would go; the in-use check still runs.
  diff_mode:
    support: full
    details: Each root present before, absent after.
  idempotent:
    details: Once the roots are gone nothing is removed.
notes:
  - Missing roots are no error.
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
would_remove: {description: The roots present and not kept., returned: success, type: list, elements: str}
kept: {description: Roots only O(live_container) holds (left)., returned: success, type: list, elements: str}
mounts_kept:
  description: Mount points inside the roots left in place with the folders holding them (O(force=true) only).
  returned: success
  type: list
  elements: str
  sample: [/cache/ds41-combined-ready/models]
holders:
  description: What holds a root (on success only with O(force=true) or RV(kept)).
  returned: success
  type: list
  elements: dict
  contains:
    pid: {description: "Process id (for a mount, the lowest pid of that mount namespace).", type: int}
    name: {description: Process name (C(/proc/<pid>/comm))., type: str}
    container: {description: Id of the container the process runs in (its cgroup); empty when none., type: str}
    how: {description: "V(open), V(cwd), V(mapped), V(mount) (a bind) or V(ancestor).", type: str}
    path: {description: "What is held, as a host path (for V(ancestor) the bound directory).", type: str}
    seen_as: {description: "The path the process sees it by (its fd or cwd link, or the mount point).", type: str}
    roots: {description: The receipt roots it holds., type: list, elements: str}
diff:
  description: "Each root of RV(would_remove), C(<path>: present) before, C(<path>: absent) after."
  returned: success
  type: dict
  contains:
    before: {description: "C(<path>: present) lines.", type: str}
    after: {description: "C(<path>: absent) lines.", type: str}
msg: {description: "Why nothing was removed, or which removal failed.", returned: failure, type: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS, clear_receipts, format_holder

ARGUMENT_SPEC = dict(
    parent=dict(type="path", default="/cache"),
    names=dict(type="list", elements="str", default=list(RECEIPT_ROOTS)),
    state=dict(type="str", choices=["absent"], default="absent"),
    force=dict(type="bool", default=False),
    live_container=dict(type="str", default=""),
    inventory_hostname=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        result = clear_receipts(params["parent"], params["names"], force=params["force"],
                                check_mode=module.check_mode, live_container=params["live_container"],
                                host=params["inventory_hostname"])
    except StageError as exc:
        module.fail_json(msg=str(exc))
    if result["holders"] and params["force"]:
        module.warn("force: removed receipt roots while in use: %s"
                    % "; ".join(format_holder(h) for h in result["holders"]))
    if result["mounts_kept"]:
        module.warn("force: left these mount points and the folders holding them: %s"
                    % ", ".join(result["mounts_kept"]))
    diff = {"before": "".join("%s: present\n" % p for p in result["would_remove"]),
            "after": "".join("%s: absent\n" % p for p in result["would_remove"])}
    module.exit_json(changed=bool(result["removed"]), diff=diff, **result)


if __name__ == "__main__":
    main()
