#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_node_state
short_description: Read the engine's mount manifest and fingerprint the files it binds, on the node
version_added: "1.0.0"
description:
  - Reads the mount manifest (O(manifest), or O(manifest_content) for a C(--check) run's) and checks its binds.
  - Fingerprints the identity (device, inode, size, mtime, ctime) of what each local bind's source resolves to; a
    repair, re-stage or prune changes it while the manifest stays the same, and the engine role restarts the lane.
author: dgx-stage maintainers
options:
  manifest: {description: Path of the mount manifest on the node., type: path}
  manifest_content: {description: "The mount manifest itself, used instead of reading O(manifest).", type: dict}
  directories:
    description: Paths to look for, as written (a link counts as there); one that cannot be looked at fails.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - dgx_node
  - dgx_node.read_only
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Check mode reads the same.
"""

EXAMPLES = r"""
- name: Read the mount manifest and fingerprint the staged files it binds
  engine_node_state:
    manifest: /etc/dgx-stage/engine-manifest.json
    directories: [/cache]
  register: node_state
  become: true
"""

RETURN = r"""
fingerprint:
  description: sha256 hex over each local bind source (sorted, once) with the identity of what it resolves to.
  returned: success
  type: str
  sample: 3b5d5c3712955042212316173ccf37be800c8c4a3c1b5c6e2e1d40fb7ab2d6a1
files: {description: How many distinct paths were fingerprinted., returned: success, type: int, sample: 141}
manifest:
  description: The mount manifest; null when it cannot be read.
  returned: success when O(manifest) is set or O(manifest_content) is set
  type: dict
  contains:
    repos: {description: The repos the manifest binds., type: list, elements: dict}
    mounts: {description: The binds., type: list, elements: dict}
    counts: {description: Binds by origin., type: dict}
  sample: {repos: [{repo_id: org/model, target: /hub/models--org--model/snapshots/0a1b2c}], mounts: [], counts: {}}
manifest_error:
  description: Why the manifest cannot be used; empty when it was read.
  returned: success when O(manifest) is set or O(manifest_content) is set
  type: str
  sample: "cannot read it: No such file or directory"
directories_missing: {description: The O(directories) where nothing is., returned: success, type: list, elements: str}
bind_problems:
  description: Why the lane cannot start from the manifest (a source missing or unreadable, a path no runtime binds as
    written, a local ref moved past the commit), one text each; empty when it can.
  returned: success when O(manifest) is set or O(manifest_content) is set
  type: list
  elements: str
  sample: ["/raid/hf-local/hub/models--org--model/blobs/9f2c is missing"]
missing: {description: The fingerprinted paths where nothing is., returned: success, type: list, elements: str}
msg: {description: Why the node could not be read., returned: failure, type: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_nodestate import (bind_problems, checked_manifest, files_fingerprint, local_sources,
                                                missing_paths, read_manifest)


ARGUMENT_SPEC = dict(
    manifest=dict(type="path"),
    manifest_content=dict(type="dict"),
    directories=dict(type="list", elements="str", default=[]),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           mutually_exclusive=[("manifest", "manifest_content")])
    params = module.params
    result = dict(changed=False)
    files = []
    if params["manifest"] is not None or params["manifest_content"] is not None:
        manifest, error = (checked_manifest(params["manifest_content"]) if params["manifest_content"] is not None
                           else read_manifest(params["manifest"]))
        result.update(manifest=manifest, manifest_error=error or "", bind_problems=[])
        if manifest:
            result["bind_problems"], files = bind_problems(manifest), local_sources(manifest)
    try:
        missing_dirs = missing_paths(params["directories"])
    except OSError as exc:
        module.fail_json(msg="cannot look for %s: %s (check its parent's permissions, or become_root)"
                         % (exc.filename, exc.strerror))
    fingerprint, pairs, missing = files_fingerprint(files)
    result.update(fingerprint=fingerprint, files=len(pairs), missing=missing, directories_missing=missing_dirs)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
