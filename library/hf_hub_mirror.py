#!/usr/bin/python
# -*- coding: utf-8 -*-
# dgx-stage: stage one Hugging Face hub repo revision from the NAS onto the node's local disk.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hf_hub_mirror
short_description: Mirror one revision of a Hugging Face hub cache repo from a NAS hub to a local hub, verified
description:
  - Copies the files of one revision of one repo, selected by C(allow_patterns)/C(ignore_patterns), from the
    NAS hub cache C(src) into the local hub cache C(dest), and leaves a valid hub cache that
    C(huggingface_hub) loads offline (C(refs/), relative C(snapshots/) links, real C(blobs/), a
    C(trees/<commit>.json) listing only what was staged).
  - Follows link chains through the NAS's hub-level C(blobs/<sha[:2]>/<sha>) store; every local blob is a
    real file and nothing local resolves into the NAS.
  - Real files inside the NAS snapshot (the optional page15 pack) are staged only when the patterns
    select them; excluded paths are returned for the NAS-fallback mount manifest.
  - Every blob written under C(blobs/<name>) (a copy or a repair, whatever C(verify) says) is hashed against
    its name (sha256, or git blob sha1 for 40-hex names) on the same read pass that writes it, and is renamed
    to its name only when it matches. A NAS blob that fails is listed in C(nas_corrupt) and the module
    fails for the repo; a local copy that hashes to its name is kept, one that does not is removed.
  - Real files inside a snapshot have no name to check; their copy is refused when the NAS file changes
    size or mtime during the copy.
  - Existing local blobs are checked as C(verify) says, never trusted by size alone unless C(verify=none); a
    wrong one (for example another shard of the same size hardlinked in its place) is replaced atomically.
  - Every directory it writes or removes in (repo folder, C(blobs/), C(snapshots/<commit>/...), C(refs/),
    C(trees/), C(.locks/)) must be a real directory inside C(dest); a symlinked one is refused, naming the
    link and its target, before anything is written (in check mode too). Writes never follow links.
  - A link between snapshot files resolves to the blob its chain reaches; a link to a real snapshot file
    stays a link when both are staged.
  - Refuses before writing anything when the disk cannot hold the copy plus C(reserve), and on bad
    input (missing roots, an empty NAS root (is it mounted?), unknown repo or revision, dangling or escaping
    links, blobs not named by a hash, patterns selecting nothing). A local disk that fills up or fails
    mid-copy is reported with the file, the disk, the bytes still needed and free; no temp file is left.
  - Writes go to a temp file, are fsynced and renamed; a killed run leaves no torn blob and the next
    run removes its debris. A per-repo lock keeps two runs from interleaving.
  - Progress of long copies is written to C(<dest>/.locks/<repo folder>/dgx-stage.progress.json).
version_added: "1.0.0"
author: dgx-stage maintainers
options:
  src:
    description: NAS hub cache root (the directory holding C(models--*)). Only read.
    type: path
    required: true
  dest:
    description: Local hub cache root on the node's NVMe. Must exist.
    type: path
    required: true
  repo_id:
    description: Repo id, C(org/name).
    type: str
    required: true
  repo_type:
    description: Kind of repo.
    type: str
    choices: [model, dataset, space]
    default: model
  revision:
    description: Branch, tag or 40-hex commit to stage.
    type: str
    default: main
  allow_patterns:
    description:
      - Only paths matching one of these are staged (huggingface_hub semantics, fnmatch on the
        snapshot-relative path; a pattern ending in C(/) matches everything below it).
    type: list
    elements: str
  ignore_patterns:
    description: Paths matching one of these are not staged.
    type: list
    elements: str
  verify:
    description:
      - How local blobs are proven right.
      - C(sample) compares size plus sampled content (head, tail, spread middle blocks) of the local copy and
        the NAS file; it survives stale NFS mtimes.
      - C(full) hashes every local blob against its own name (sha256 or git blob sha1), with no NAS read.
      - C(none) trusts sizes.
    type: str
    choices: [sample, full, none]
    default: sample
  reserve:
    description: Free space to leave on the local disk after staging, bytes (C(10G) style suffixes allowed) or C(N%).
    type: str
    default: 2%
  prune:
    description:
      - Remove local files of this repo that are not part of the wanted state (stale copies of excluded
        files, blobs no local snapshot links to). Other local snapshots and their blobs are kept.
    type: bool
    default: false
  lock_timeout:
    description: Seconds to wait for another run holding the repo lock before failing.
    type: int
    default: 60
  workers:
    description:
      - Files in flight at once, for copies and for content checks. Each worker reads its file in chunks
        (up to 8 MiB) into one reused buffer, so memory stays constant whatever the file size.
      - When unset, the node's CPU count, at least 2 and at most 8; at most 32. The read buffers of all
        workers together stay within 32 MiB (a worker's chunk shrinks as workers are added).
    type: int
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports what would be copied, repaired and pruned; changes nothing (takes no lock).
  diff_mode:
    support: full
    details: The diff lists every copy, repair, link, ref and prune.
  idempotent:
    support: full
    description: A second run with the same arguments reports C(changed=false).
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
"""

EXAMPLES = r"""
- name: Stage the EXL3 checkpoint without the optional page15 pack
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw
    ignore_patterns: ["page15/"]
    verify: sample
    reserve: 2%
    prune: true

- name: Prove every local blob against its name (no NAS read)
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DSpark-drafter
    verify: full
"""

RETURN = r"""
commit:
  description: Commit hash that was staged.
  returned: success
  type: str
snapshot:
  description: Local snapshot directory.
  returned: success
  type: str
files:
  description:
    - Files of the source snapshot. C(total), C(local) (staged), C(excluded) (by the patterns) and
      C(dangling) (local entries that do not resolve to a local file).
  returned: success
  type: dict
  sample: {total: 14, local: 9, excluded: 5, dangling: 0}
blobs:
  description: Unique blobs copied, reused (verified in place) and repaired (replaced because wrong).
  returned: success
  type: dict
  sample: {copied: 7, reused: 0, repaired: 0}
bytes_copied:
  description: Bytes written (copies and repairs); in check mode, bytes that would be written.
  returned: success
  type: int
excluded_paths:
  description: Snapshot paths not staged (the NAS-fallback manifest binds them from the NAS).
  returned: success
  type: list
  elements: str
repaired_paths:
  description: Snapshot paths whose local content was wrong and was replaced.
  returned: success
  type: list
  elements: str
pruned:
  description: Local paths removed (or, in check mode, that would be removed) because prune is on.
  returned: success
  type: list
  elements: str
stale_paths:
  description: Local paths not part of the staged state, kept because prune is off.
  returned: success
  type: list
  elements: str
duration_s:
  description: The module's own run time in seconds.
  returned: success
  type: float
nas_corrupt:
  description:
    - Snapshot paths whose NAS blob does not hash to its name (also returned when the module fails).
  returned: always
  type: list
  elements: str
nas_corrupt_blobs:
  description: One record per NAS blob that failed its name.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: First snapshot path of the blob.
      type: str
    paths:
      description: Every snapshot path of the blob.
      type: list
      elements: str
    blob:
      description: The blob name (the expected hash).
      type: str
    nas_source:
      description: The NAS file that was read.
      type: str
    nas_hash:
      description: What the NAS bytes hashed to.
      type: str
    local:
      description: C(kept) (the local copy hashes to its name), C(removed) (it did not) or C(absent).
      type: str
unstaged_paths:
  description: Selected snapshot paths with no good local content after this run (links to them are not written).
  returned: always
  type: list
  elements: str
report:
  description:
    - This repo's row of the host report, shaped by the module (repo_id, revision, commit, files, blobs,
      bytes, duration, verify, nas_corrupt, status C(ok), C(failed) or C(check)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import printable_names
from ansible.module_utils.dgx_mirror import MirrorFailed, MirrorRequest, run_mirror
from ansible.module_utils.dgx_transfer import raise_interrupt_on_sigterm


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            repo_id=dict(type="str", required=True),
            repo_type=dict(type="str", default="model", choices=["model", "dataset", "space"]),
            revision=dict(type="str", default="main"),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            verify=dict(type="str", default="sample", choices=["sample", "full", "none"]),
            reserve=dict(type="str", default="2%"),
            prune=dict(type="bool", default=False),
            lock_timeout=dict(type="int", default=60),
            workers=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    raise_interrupt_on_sigterm()
    try:
        request = MirrorRequest(
            src=params["src"], dest=params["dest"], repo_id=params["repo_id"], repo_type=params["repo_type"],
            revision=params["revision"], allow_patterns=params["allow_patterns"],
            ignore_patterns=params["ignore_patterns"], verify=params["verify"], reserve=params["reserve"],
            prune=params["prune"], lock_timeout=params["lock_timeout"], workers=params["workers"])
        result = run_mirror(request, check_mode=module.check_mode)
    except MirrorFailed as exc:
        result = exc.result
        for key in ("diff_text", "warnings"):
            result.pop(key)
        module.fail_json(**printable_names(dict(result, msg="hf_hub_mirror %s: %s" % (params["repo_id"], exc))))
    except (StageError, OSError) as exc:
        module.fail_json(msg=printable_names("hf_hub_mirror %s: %s" % (params["repo_id"], exc)))
    except KeyboardInterrupt as exc:
        module.fail_json(msg="hf_hub_mirror %s: interrupted (%s): the copies in flight were stopped and their temp "
                             "files removed; no ref was written for an incomplete snapshot. Re-run to finish"
                         % (params["repo_id"], exc or "Ctrl-C"))
    result = printable_names(result)
    diff_text = result.pop("diff_text")
    warnings = result.pop("warnings")
    for warning in warnings:
        module.warn(warning)
    if module._diff and diff_text:
        result["diff"] = {"before_header": "%s (local)" % result["snapshot"],
                          "after_header": "%s (staged)" % result["snapshot"], "prepared": diff_text}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
