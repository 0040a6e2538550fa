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
  - Refuses, removing nothing, while a root is in use, unless O(force=true). In use is judged as the
    host sees it, whatever path a container uses - a process whose working directory, open file or
    mapped file (C(/proc/<pid>/cwd), C(/proc/<pid>/fd/*), C(/proc/<pid>/maps)) is, by device and inode,
    a root or something under it; or a process in another mount namespace (a container) that has a
    root, something inside it, or O(parent) mounted, or a directory above O(parent) mounted read-write
    (C(/proc/<pid>/mountinfo)), since a live engine with the receipt parent bound writes its receipts
    there, and a container binding an ancestor read-write can make them. The host's own mounts are not
    holders.
  - The failure names the roots, each holder (pid, command, the container from C(/proc/<pid>/cgroup)
    when it runs in one, what it holds and the path it sees) and the fix.
  - Roots held only by O(live_container) (this host's running engine) belong to the live run; they
    are left in place and returned in RV(kept) instead of failing.
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
      - Remove the roots even if a live process holds one of them (O(live_container) included), or one
        holds a mount point (the mount and the folders holding it stay, in RV(mounts_kept)).
    type: bool
    default: false
  live_container:
    description:
      - Id (full, or a prefix of at least 12 characters) of this host's running engine container.
        Roots held only by its processes are kept (RV(kept)), not refused - they belong to the live
        run. Any other holder still makes the task fail. Empty - every holder refuses.
    type: str
    default: ""
  inventory_hostname:
    description:
      - This node's name in the inventory, the C(--limit) of the C(dgx-stage) command a refusal gives as the fix
        (C(dgx-stage clean-receipts --limit dgx2 -e receipt_force=true)); without it the command names the lane.
    type: str
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
  description: Receipt roots found present and not kept, i.e. the removal plan.
  returned: success
  type: list
  elements: str
  sample: [/cache/ds41-backend-attestation]
kept:
  description: Roots left in place because only O(live_container) holds them (the live run's receipts).
  returned: success
  type: list
  elements: str
  sample: [/cache/ds41-backend-attestation]
mounts_kept:
  description:
    - Mount points inside the roots, left in place with the folders holding them. Non-empty only with
      O(force=true); without it, a root holding a mount point fails the task and nothing is removed.
  returned: success
  type: list
  elements: str
  sample: [/cache/ds41-combined-ready/models]
holders:
  description:
    - What holds a root - non-empty on success only with O(force=true) (see the warning) or when
      O(live_container) holds roots (RV(kept)).
  returned: success
  type: list
  elements: dict
  contains:
    pid:
      description: Process id (for a mount, the lowest pid of that mount namespace).
      type: int
    name:
      description: Process name (C(/proc/<pid>/comm)).
      type: str
    container:
      description: Id of the container the process runs in (from C(/proc/<pid>/cgroup)); empty when none.
      type: str
    how:
      description:
        - V(open) (an open file), V(cwd), V(mapped) (a mapped file), V(mount) (a bind of a root, something in
          one, or O(parent)) or V(ancestor) (a read-write bind of a directory containing O(parent)).
      type: str
    path:
      description:
        - What is held, as a host path - a root, a file under one, for a mount possibly O(parent), for
          V(ancestor) the bound directory (its path inside its filesystem and device when the host shows it
          nowhere).
      type: str
    seen_as:
      description: The path the process sees it by (its fd or cwd link text, or the mount point).
      type: str
    roots:
      description: The receipt roots this holds (every root for a mount of O(parent) or an ancestor).
      type: list
      elements: str
  sample: [{pid: 4242, name: python3, container: 018a9bfdf3cebcadf93f3007272220059bfe1e622297531dff97fad81746ce62,
            how: open, path: /cache/ds41-combined-ready/worker.json, seen_as: /cache/ds41-combined-ready/worker.json,
            roots: [/cache/ds41-combined-ready]}]
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
        module.warn("force: removed receipt roots while in use: %s" % format_holders(result["holders"]))
    if result["mounts_kept"]:
        module.warn("force: left these mount points and the folders holding them: %s"
                    % ", ".join(result["mounts_kept"]))
    changed = bool(result["removed"])
    diff = {"before": "".join("%s: present\n" % p for p in result["would_remove"]),
            "after": "".join("%s: absent\n" % p for p in result["would_remove"])}
    module.exit_json(changed=changed, diff=diff, **result)


if __name__ == "__main__":
    main()
