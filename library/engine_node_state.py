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
  - With O(manifest), reads the mount manifest there and returns it as RV(manifest) (or why it cannot be read,
    in RV(manifest_error)); O(manifest_content) gives the manifest instead (a C(--check) run's, computed and not
    written).
  - Stats the source of every local bind of that manifest (following links, as a bind mount does) and returns
    RV(fingerprint), a sha256 over each path with the identity of what it resolves to - device, inode, size and mtime in
    nanoseconds. A bind pins an inode, so a verify repair or a re-stage (a new blob file under the same
    name) or a prune (the file gone) leaves a running container reading the old bytes while the mount
    manifest is unchanged; the fingerprint changes in each case. The engine role stores it on the
    container as a label and restarts the lane when it differs.
  - With O(directories), says which of those paths do not exist (RV(directories_missing)).
  - Reads only; changes nothing.
author: dgx-stage maintainers
options:
  manifest:
    description: Path of the mount manifest on the node (C(engine_manifest_path)), read and returned as RV(manifest).
    type: path
  manifest_content:
    description: The mount manifest itself, used instead of reading O(manifest).
    type: dict
  directories:
    description:
      - Paths to look for, as written (a link counts as there), such as the receipt directory;
        RV(directories_missing) lists those not there. One that cannot be looked at fails the module.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only; check mode reads the same.
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: full
    details: The module never writes.
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only. The container runtime's state (the containers, who
    holds the engine's port) is what C(engine_containers) says.
"""

EXAMPLES = r"""
- name: Read the mount manifest and fingerprint the staged files it binds
  engine_node_state:
    manifest: /etc/dgx-stage/engine-manifest.json
    directories: [/cache]
  register: node_state
  become: true

- name: The manifest's binds are there
  ansible.builtin.assert:
    that: node_state.bind_problems | length == 0
"""

RETURN = r"""
fingerprint:
  description: >-
    sha256 hex over the sources of the manifest's local binds (sorted, each once) with the identity of what each
    resolves to (none without a manifest).
  returned: success
  type: str
  sample: 3b5d5c3712955042212316173ccf37be800c8c4a3c1b5c6e2e1d40fb7ab2d6a1
files:
  description: How many distinct paths were fingerprinted (a missing one counts, and is listed in RV(missing)).
  returned: success
  type: int
  sample: 141
manifest:
  description: The mount manifest read from O(manifest) (or O(manifest_content)); null when it cannot be read.
  returned: success when O(manifest) is set or O(manifest_content) is set
  type: dict
  contains:
    repos:
      description: The repos the manifest binds, each with its C(target) snapshot directory in the container.
      type: list
      elements: dict
    mounts:
      description: The binds, each C(source), C(target), C(read_only) and C(origin) (C(local) or C(nas)).
      type: list
      elements: dict
    counts:
      description: How many binds come from the local disk and from the NAS (C(local), C(nas), C(total)).
      type: dict
  sample: {repos: [{repo_id: org/model, target: /hub/models--org--model/snapshots/0a1b2c}], mounts: [], counts: {}}
manifest_error:
  description: >-
    Why the manifest cannot be used (no file at O(manifest), not JSON, not a manifest - a list of repos, and of
    mounts with a text source and target); empty when it was read.
  returned: success when O(manifest) is set or O(manifest_content) is set
  type: str
  sample: "cannot read it: No such file or directory"
directories_missing:
  description: The paths of O(directories) where nothing is.
  returned: success
  type: list
  elements: str
  sample: [/cache]
bind_problems:
  description:
    - Why the lane cannot start from the manifest as it is, one text each; empty when it can.
    - A mount whose source or target no runtime binds as written (a NUL or another control character, a path not
      in normal form), named by its place in the manifest's mounts; a local bind whose source is outside the local
      repo folders of the manifest's repos, has a symlink or a mount point on its way from the local hub root,
      is missing, not a regular file (a link included) or cannot be read; a NAS bind whose source, followed as
      the hub layout links it, ends outside the NAS hub or is not a readable regular file (a readable folder,
      for a folder bound whole); or a repo whose local ref cannot be read (a folder, a link) or names another
      commit than the manifest binds (a revision staged since it was written).
  returned: success when O(manifest) is set or O(manifest_content) is set
  type: list
  elements: str
  sample: ["/raid/hf-local/hub/models--org--model/blobs/9f2c is missing"]
missing:
  description: The fingerprinted paths where nothing is (they count in RV(fingerprint) as missing).
  returned: success
  type: list
  elements: str
  sample: []
msg:
  description: >-
    Why the node could not be read (both O(manifest) and O(manifest_content), a path of
    O(directories) that cannot be looked at).
  returned: failure
  type: str
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
        result.update(manifest=manifest, manifest_error=error or "", bind_problems=bind_problems(manifest or {}))
        files = local_sources(manifest or {})
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
