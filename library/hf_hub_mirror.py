#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hf_hub_mirror
short_description: Mirror one revision of a Hugging Face hub cache repo from a NAS hub to a local hub, verified
version_added: "1.0.0"
description:
  - Copies the files of one revision of one repo that C(allow_patterns)/C(ignore_patterns) select from the NAS
    hub cache C(src) into the local hub cache C(dest), leaving a hub cache C(huggingface_hub) loads offline
    (C(refs/), relative C(snapshots/) links, real C(blobs/), a C(trees/<commit>.json) of what was staged).
  - Follows link chains through the NAS's hub-level C(blobs/<sha[:2]>/<sha>) store; every local blob is a real
    file and nothing local resolves into the NAS. A link between snapshot files resolves to the blob its chain
    reaches; a link to a real snapshot file stays a link when both are staged. Real snapshot files (the optional
    page15 pack) are staged only when selected; excluded paths are returned for the NAS-fallback manifest.
  - Every blob written (copy or repair) is hashed against its name (sha256, or git blob sha1 for 40-hex names)
    on the pass that writes it and renamed to that name only when it matches. A NAS blob that fails is listed in
    RV(nas_corrupt) and fails the repo; a local copy of it that hashes to its name is kept, any other removed. A
    real snapshot file has no name to check; its copy is refused when the NAS file changes size or mtime meanwhile.
  - Existing local blobs are proven as O(verify) says (sizes alone only with V(none)); a wrong one (say another
    shard of the same size hardlinked in its place) is replaced atomically, returned in RV(repairs) and warned
    about, naming the snapshot path, the blob and what the local bytes hashed to.
  - Every directory it writes or removes in (repo folder, C(blobs/), C(snapshots/<commit>/...), C(refs/),
    C(trees/), C(.locks/)) must be a real directory inside C(dest); a symlinked one is refused, naming the link
    and its target, before anything is written (in check mode too). Writes never follow links.
  - Refuses before writing when the disk cannot hold the copy plus O(reserve), and on bad input (missing roots,
    an empty NAS root (is it mounted?), unknown repo or revision, dangling or escaping links, blobs not named by a
    hash, patterns selecting nothing). A local disk failing or filling mid-copy is reported with the file, the
    disk, the bytes still needed and free.
  - Writes go to a temp file, fsynced and renamed; a killed run leaves no torn blob and the next run removes its
    debris. A per-repo lock keeps two runs from interleaving.
  - Past the input checks (not in check mode) the run keeps C(<dest>/.locks/<repo folder>/dgx-stage.progress.json),
    rewritten atomically about once a second by the pass O(phase) names - C(updated_at), C(pid), C(pass),
    C(current), C(step), C(files_done)/C(files_total), C(bytes_done)/C(bytes_total), C(mib_per_s), C(eta_s) (null
    until a rate is known), C(bytes_read), the C(hashing) and C(copying) figures, C(status) (V(running), V(ok),
    V(failed), V(interrupted)), C(finished), C(aborted) (stopped on an error, Ctrl-C or SIGTERM), C(error) - and
    each pass's latest figures under C(passes). A SIGKILLed run leaves C(status=running) with its C(pid) gone.
  - A run that fails once content is being proven or copied (a corrupt NAS blob, a local disk failing, a NAS file
    changing during its copy, files left unstaged or dangling) returns its whole result with RV(msg) and
    RV(report) C(status=failed); bad input, a lock held too long, too little space or an interrupt return
    RV(msg) and a RV(report) row without figures.
author: dgx-stage maintainers
options:
  src: {description: NAS hub cache root (the directory holding C(models--*)). Only read., type: path, required: true}
  dest: {description: Local hub cache root on the node's NVMe. Must exist., type: path, required: true}
  repo_id: {description: "Repo id, C(org/name).", type: str, required: true}
  repo_type: {description: Kind of repo., type: str, default: model, choices: [model, dataset, space]}
  revision: {description: "Branch, tag or 40-hex commit to stage.", type: str, default: main}
  allow_patterns:
    description:
      - Only paths matching one of these are staged (huggingface_hub semantics, fnmatch on the snapshot-relative
        path; a pattern ending in C(/) matches everything below it).
    type: list
    elements: str
  ignore_patterns: {description: Paths matching one of these are not staged., type: list, elements: str}
  copy_missing:
    description:
      - Copy selected files that have no local copy (a missing blob, a link where the copy should be).
      - V(false) (the stage role's verify pass) copies nothing new (a present copy failing its check is still
        repaired) and fails before anything is written (in check mode too) when selected files are not staged,
        naming the first few and their count and saying to run the stage play first.
    type: bool
    default: true
  phase:
    description: The pass this run is, as named in the progress file and the results.
    type: str
    choices: [stage, verify]
    default: stage
  verify:
    description:
      - How local blobs are proven right.
      - C(sample) compares size plus head, tail and spread middle blocks (about 1 MiB a side) of the local copy and
        the NAS file; it survives stale NFS mtimes but misses a byte changed between two samples.
      - C(full) hashes every local blob against its own name, with no NAS read.
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
      - Remove local files of this repo outside the wanted state (stale copies of excluded files, blobs no local
        snapshot links to). Other local snapshots and their blobs are kept.
    type: bool
    default: false
  lock_timeout:
    description:
      - Seconds to wait for another run holding the repo lock before failing, naming that run (its O(run_id), pid,
        since when). With O(lease_file), the lease file says meanwhile for whom it waits, for the mirror_job polls.
    type: int
    default: 60
  run_id:
    description: The lane's run id, written with this process's pid and the time into the repo lock it holds.
    type: str
  workers:
    description:
      - Files in flight at once, for copies and content checks; each reads in chunks into one reused buffer, all
        buffers together within 32 MiB, whatever the file size.
      - Unset - the node's CPU count, between 2 and 8; at most 32.
    type: int
  lease_file:
    description:
      - For a background run (C(async)) - a file whose mtime the controller renews while it watches (the stage
        role's mirror_job polls touch it). The run writes its pid into it (a poll finding that process gone without
        a result fails the job) and checks it every few seconds; unrenewed for O(lease_timeout) seconds, or
        removed, it stops as on Ctrl-C (copies in flight stopped within a chunk, temp files removed, no ref for an
        incomplete snapshot, lock released) and fails saying so. Unset - a run whose controller died runs to its
        end.
      - Refused before anything is written when its directory is or passes a symlink inside O(dest), or is inside
        O(dest) but not under its C(.locks). Ignored in check mode.
    type: path
  lease_timeout:
    description: Seconds O(lease_file) may go unrenewed before the run stops itself.
    type: int
    default: 120
  peer_dir:
    description:
      - This repo's candidate folder C(<dest>/.locks/dgx-stage-peer/<repo folder>), holding blobs another host of
        the lane copied there, named by their blob names (the stage role's fan-out). Missing - no candidates.
      - A blob the run would copy is first looked for there. A regular file C(<peer_dir>/<blob>) (lstat-ed first,
        opened without following links or blocking and only when the open file is the one lstat-ed, so a FIFO or
        device is never opened) is copied into C(blobs/) like a NAS copy and named only when the bytes written hash
        to the blob at the NAS size; it is never moved or linked, and is removed right after its copy or rejection.
        Anything else (other bytes or size, a link, FIFO or directory, unreadable, changing meanwhile) is listed in
        RV(peer_rejected) and the blob comes from the NAS.
      - The space check counts a candidate (RV(space.peers)) only when it is a regular file of the blob's size on
        the filesystem of C(blobs/) whose allocated blocks cover it; the largest ones still there while their
        copies are in flight (one per worker) are added back as RV(space.peers_peak).
      - Once a run (not in check mode) has started writing - ok, failed or interrupted - O(peer_dir) is removed with
        what is directly in it (files, links, never a link's target; rsync's C(.~tmp~) and its files); another
        directory in it is named in a warning and not entered, and one on another mount is never emptied. A run
        refused before writing, and check mode, leave it as it is.
      - Refused before anything is written (in check mode too) when not absolute or with C(..), O(dest) itself or
        outside it, in or at a repo folder, the lock root or a repo's lock directory, not named as this repo's
        folder under C(dgx-stage-peer) (so another repo's candidates are never removed), reached through a symlink,
        or a mount point or below one inside O(dest) (C(st_dev) differing from its parent's, or listed in
        C(/proc/self/mountinfo)).
    type: path
  require_match:
    description:
      - This host's rank patterns (the stage role's expanded C(rank_patterns)), each of which must match at least
        one selected file (matched like O(allow_patterns)); one that matches none fails the run before anything is
        written (in check mode too), naming the pattern, the repo and the commit, and whether it matches only
        excluded files.
      - The selected files they match are RV(files.rank); the others RV(files.shared).
    type: list
    elements: str
  other_rank_patterns:
    description:
      - The lane's other ranks' patterns (the role also lists them in O(ignore_patterns)). A snapshot file that one
        of them and one of O(require_match) both select fails the run before anything is written (in check mode
        too), naming the file and both patterns, since rank files partition the repo.
    type: list
    elements: str
  inventory_hostname:
    description: This node's inventory name, the C(--limit) of the C(dgx-stage) commands the messages give as the fix;
      without it they name the whole lane.
    type: str
  time_limit:
    description:
      - With O(lease_file) - seconds after which the run stops itself the same way and fails saying so; set it below
        the task's C(async) limit, where Ansible kills the run with SIGKILL instead. V(0) - none.
    type: int
    default: 0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports what would be copied, repaired and pruned; changes nothing (takes no lock).
  diff_mode:
    support: full
    details: >-
      The diff opens with the plan in one line (V(would copy 13 files, 47.9 GiB; would repair ...) in check mode,
      V(copied ...) otherwise, sizes in binary units), then one line per copy, repair, prune, ref and link (a link
      that comes with a copy is said by the copy's line).
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: full
    details: A second run finds every blob proven and every link, ref and tree listing in place.
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
  - A blob taken from a good O(peer_dir) candidate is never read on the NAS, so a NAS copy of it that is
    corrupt goes unreported by that run (RV(nas_corrupt) only names NAS blobs the run read); a run without
    candidates, or the verify pass with O(verify=full) against the NAS, finds it.
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

- name: Stage rank 1 of 4, adopting the blobs a peer host already sent (each hashed against its name first)
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw
    allow_patterns: ["*.json", "*.safetensors", "engram/rank-1-of-4/*"]
    require_match: ["engram/rank-1-of-4/*"]
    other_rank_patterns: ["engram/rank-0-of-4/*", "engram/rank-2-of-4/*", "engram/rank-3-of-4/*"]
    peer_dir: /raid/hf-local/hub/.locks/dgx-stage-peer/models--coolbho3k--DeepSeek-V4.1-Flash-EXL3-3bpw

- name: Prove every local blob against its name (no NAS read); fail, copying nothing, if files are not staged
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DSpark-drafter
    verify: full
    copy_missing: false
    phase: verify
"""

RETURN = r"""
commit:
  description: Commit hash that was staged.
  returned: success; on failure when the run has a result
  type: str
  sample: 0123456789abcdef0123456789abcdef01234567
snapshot:
  description: Local snapshot directory.
  returned: success; on failure when the run has a result
  type: str
  sample: /raid/hf-local/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
files:
  description: Files of the source snapshot.
  returned: success; on failure when the run has a result
  type: dict
  contains:
    total: {description: Files of the NAS snapshot., type: int}
    local: {description: Files the patterns select (staged)., type: int}
    excluded: {description: Files the patterns leave out (RV(excluded_paths))., type: int}
    dangling: {description: Local entries that do not resolve to a local file after the run., type: int}
    rank:
      description: Staged files that O(require_match) selects - this host's rank files; V(0) without it.
      type: int
    shared:
      description: Staged files that are not this host's rank files (RV(files.local) minus RV(files.rank)).
      type: int
  sample: {total: 14, local: 9, excluded: 5, dangling: 0, rank: 1, shared: 8}
blobs:
  description: Unique blobs under C(blobs/) - in check mode, what would be done.
  returned: success; on failure when the run has a result
  type: dict
  contains:
    copied: {description: Blobs copied from the NAS (missing locally)., type: int}
    reused: {description: Local blobs proven right and kept., type: int}
    repaired: {description: Local blobs replaced because wrong (size or content)., type: int}
  sample: {copied: 7, reused: 0, repaired: 0}
real_files:
  description: Real files inside the snapshot (no blob name), such as a selected page15 pack.
  returned: success; on failure when the run has a result
  type: dict
  contains:
    copied: {description: Real files copied., type: int}
    repaired: {description: Real files replaced because wrong., type: int}
  sample: {copied: 0, repaired: 0}
repaired_paths:
  description: Snapshot paths whose local content was wrong and was replaced.
  returned: success; on failure when the run has a result
  type: list
  elements: str
repairs:
  description:
    - One record per local file that was wrong and was replaced (in check mode, would be); each is also a module
      warning.
  returned: success; on failure when the run has a result
  type: list
  elements: dict
  contains:
    blob: {description: The blob name (the hash its bytes should have); null for a real snapshot file., type: str}
    reason:
      description: V(size) (its size differs from the NAS copy's), V(content) (it failed its content check),
        V(link) (a symlink where the copy should be) or V(not-a-file).
      type: str
    local_hash:
      description: What the local bytes hashed to, as the blob is named (sha256, or git blob sha1 at the local size);
        sha256 for a real snapshot file. Null when there were no local bytes (V(link), V(not-a-file)).
      type: str
    path: {description: The snapshot path the warning names (the blob's first)., type: str}
    paths: {description: All snapshot paths served by this file., type: list, elements: str}
    size: {description: The file's size on the NAS (the bytes the repair copies)., type: int}
links_written:
  description: Snapshot links written (or, in check mode, that would be written).
  returned: success; on failure when the run has a result
  type: int
refs_written:
  description: Ref names written under C(refs/); empty when files were left unstaged.
  returned: success; on failure when the run has a result
  type: list
  elements: str
  sample: [main]
bytes_copied:
  description: Bytes written (copies and repairs); in check mode, bytes that would be written.
  returned: success; on failure when the run has a result
  type: int
bytes_from_nas:
  description:
    - Bytes of RV(bytes_copied) copied from the NAS; in check mode, what would be (the candidates of the right size
      in O(peer_dir) not counted).
  returned: success; on failure when the run has a result
  type: int
bytes_from_peers:
  description:
    - Bytes of RV(bytes_copied) copied from O(peer_dir) candidates that hashed to their names; in check mode, the
      bytes of the candidates counted in RV(space.peers) (not hashed yet). 0 without O(peer_dir).
  returned: success; on failure when the run has a result
  type: int
peer_rejected:
  description:
    - One record per O(peer_dir) candidate that was not adopted (the blob was fetched from the NAS); each is also a
      module warning. Empty in check mode.
  returned: success; on failure when the run has a result
  type: list
  elements: dict
  contains:
    blob: {description: The blob name the candidate had., type: str}
    paths: {description: The snapshot paths served by that blob., type: list, elements: str}
    why:
      description: >-
        Why it was rejected (its hash, its size, not a regular file, it could not be opened or read - with the
        error text -, changed or replaced).
      type: str
wanted_blobs:
  description:
    - Sorted names of the blobs under C(blobs/) this run copies (in check mode, would copy) - copies and repairs -
      what a peer may send to O(peer_dir).
  returned: success; on failure when the run has a result
  type: list
  elements: str
source_snapshot:
  description: The NAS snapshot directory read.
  returned: success; on failure when the run has a result
  type: str
  sample: /mnt/nas/hf/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
bytes_staged:
  description: Bytes of the selected files (what the local snapshot holds when complete).
  returned: success; on failure when the run has a result
  type: int
bytes_read:
  description: Bytes this run read on each side - sampled reads, full hashes and copies (in check mode, the checks).
  returned: success; on failure when the run has a result
  type: dict
  contains:
    local: {description: Bytes read from the local disk (content checks of present files)., type: int}
    nas: {description: "Bytes read from the NAS (copies, sampled reads, hashes of real files).", type: int}
  sample: {local: 0, nas: 50331648}
excluded_paths:
  description: Snapshot paths not staged (the NAS-fallback manifest binds them from the NAS).
  returned: success; on failure when the run has a result
  type: list
  elements: str
  sample: [page15/a/00.bin]
pruned:
  description: Local paths removed (or, in check mode, that would be removed) because prune is on.
  returned: success; on failure when the run has a result
  type: list
  elements: str
stale_paths:
  description: Local paths not part of the staged state, kept because prune is off (see the warning).
  returned: success; on failure when the run has a result
  type: list
  elements: str
debris_removed:
  description: Temp files of killed runs removed (in check mode, that would be removed).
  returned: success; on failure when the run has a result
  type: list
  elements: str
nas_corrupt:
  description: Snapshot paths whose NAS blob does not hash to its name (the module then fails).
  returned: success; on failure when the run has a result
  type: list
  elements: str
nas_corrupt_blobs:
  description: One record per NAS blob that failed its name.
  returned: success; on failure when the run has a result
  type: list
  elements: dict
  contains:
    path: {description: First snapshot path of the blob., type: str}
    paths: {description: Every snapshot path of the blob., type: list, elements: str}
    blob: {description: The blob name (the expected hash)., type: str}
    nas_source: {description: The NAS file that was read., type: str}
    nas_hash:
      description: What the NAS bytes hashed to; null when the NAS copy was found wrong by comparison with a
        local copy that passes its name.
      type: str
    local:
      description: V(kept) (the local copy hashes to its name), V(removed) (it did not) or V(absent).
      type: str
    why: {description: How the NAS copy was found wrong., type: str}
unstaged_paths:
  description: Selected snapshot paths with no good local content after this run (links to them are not written); with
    O(copy_missing=false), the files found not staged (the run then wrote nothing).
  returned: success; on failure when the run has a result
  type: list
  elements: str
verify:
  description: O(verify), as used.
  returned: success; on failure when the run has a result
  type: str
phase:
  description: O(phase), as used.
  returned: success; on failure when the run has a result
  type: str
copy_missing:
  description: O(copy_missing), as used.
  returned: success; on failure when the run has a result
  type: bool
progress_file:
  description: The repo's progress file (written by runs past the input checks, never in check mode).
  returned: success; on failure when the run has a result
  type: str
  sample: /raid/hf-local/hub/.locks/models--org--name/dgx-stage.progress.json
summary:
  description: One line for the operator - what the pass did (in check mode, V(would copy N files, X GiB)), what it
    proved, the bytes read on each side, the time.
  returned: success; on failure when the run has a result
  type: str
space:
  description: The free-space check, in bytes.
  returned: success; on failure when the run has a result
  type: dict
  contains:
    free: {description: Free bytes on the local disk before the run., type: int}
    reserve: {description: Bytes O(reserve) keeps free., type: int}
    need: {description: "Bytes the plan writes, less RV(space.peers), plus RV(space.peers_peak).", type: int}
    peers:
      description: Bytes of the O(peer_dir) candidates that free their space once copied - regular files of their blob's
        size on the filesystem of C(blobs/), their allocated blocks covering that size. 0 without O(peer_dir).
      type: int
    peers_peak:
      description:
        - The largest of those candidates, one per worker (O(workers)) - still on the disk while their copies are
          written. 0 without O(peer_dir).
      type: int
    reclaimable: {description: "Bytes the plan frees (prune, debris).", type: int}
duration_s:
  description: The module's own run time in seconds.
  returned: success; on failure when the run has a result
  type: float
report:
  description: This repo's row of the host report, shaped by the module; the stage role passes it on. The keys
    not described here are the module's own results of the same name. A run that ends without its figures
    (bad input, the repo lock held past O(lock_timeout), interrupted) returns a row too - V(failed), with only
    RV(report.repo_id), RV(report.repo_type), RV(report.revision), RV(report.status), RV(report.check_mode),
    RV(report.verify) and RV(report.phase); a pass with a row lacking RV(report.files) did not finish.
  returned: always
  type: dict
  contains:
    repo_id: {description: O(repo_id)., type: str}
    repo_type: {description: O(repo_type)., type: str}
    revision: {description: O(revision)., type: str}
    status: {description: "V(ok), V(failed) or V(check) (check mode).", type: str}
    check_mode: {description: The run was in check mode., type: bool}
    commit: {returned: when the run has a result, description: RV(commit)., type: str}
    snapshot: {returned: when the run has a result, description: RV(snapshot)., type: str}
    files: {returned: when the run has a result, description: RV(files)., type: dict}
    blobs: {returned: when the run has a result, description: RV(blobs)., type: dict}
    bytes_copied: {returned: when the run has a result, description: RV(bytes_copied)., type: int}
    bytes_staged: {returned: when the run has a result, description: RV(bytes_staged)., type: int}
    bytes_from_nas: {returned: when the run has a result, description: RV(bytes_from_nas)., type: int}
    bytes_from_peers: {returned: when the run has a result, description: RV(bytes_from_peers)., type: int}
    peer_rejected:
      returned: when the run has a result
      description: How many O(peer_dir) candidates were rejected (RV(peer_rejected)).
      type: int
    bytes_read: {returned: when the run has a result, description: RV(bytes_read)., type: dict}
    duration_s: {returned: when the run has a result, description: RV(duration_s)., type: float}
    verify: {description: RV(verify)., type: str}
    phase: {description: RV(phase)., type: str}
    changed:
      returned: when the run has a result
      description: Whether the run changed the local hub (or, in check mode, would).
      type: bool
    repaired_paths: {returned: when the run has a result, description: RV(repaired_paths)., type: list, elements: str}
    repairs: {returned: when the run has a result, description: RV(repairs)., type: list, elements: dict}
    pruned: {returned: when the run has a result, description: RV(pruned)., type: list, elements: str}
    excluded_paths: {returned: when the run has a result, description: RV(excluded_paths)., type: list, elements: str}
    nas_corrupt: {returned: when the run has a result, description: RV(nas_corrupt)., type: list, elements: str}
    nas_corrupt_blobs:
      returned: when the run has a result
      description:
        - RV(nas_corrupt_blobs); engine_manifest reads them from the host report on the controller, so a roll-back
          onto a wiped local hub still refuses them.
      type: list
      elements: dict
    unstaged_paths: {returned: when the run has a result, description: RV(unstaged_paths)., type: list, elements: str}
diff:
  description: What the run did (or would do) - the plan in one line, then one line per copy, repair, prune and ref.
  returned: success when in diff mode and something changes
  type: dict
  contains:
    before_header: {description: C(<snapshot> (local))., type: str}
    after_header: {description: C(<snapshot> (staged))., type: str}
    prepared:
      description: The lines, the first one the plan (V(would copy 13 files, 47.9 GiB; ...) in check mode).
      type: str
msg:
  description: What failed, naming the files, the NAS blobs and the fix.
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import printable_names
from ansible.module_utils.dgx_lease import LeaseWatch
from ansible.module_utils.dgx_mirror import run_mirror
from ansible.module_utils.dgx_mirror_request import MirrorFailed, MirrorRequest
from ansible.module_utils.dgx_mirror_result import unfinished_report
from ansible.module_utils.dgx_workers import raise_interrupt_on_sigterm


ARGUMENT_SPEC = dict(
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
    run_id=dict(type="str"),
    workers=dict(type="int"),
    copy_missing=dict(type="bool", default=True),
    phase=dict(type="str", default="stage", choices=["stage", "verify"]),
    lease_file=dict(type="path"),
    lease_timeout=dict(type="int", default=120),
    time_limit=dict(type="int", default=0),
    peer_dir=dict(type="path"),
    require_match=dict(type="list", elements="str"),
    other_rank_patterns=dict(type="list", elements="str"),
    inventory_hostname=dict(type="str"),
)

# The options the module itself handles; the others are MirrorRequest's own.
NOT_REQUEST = ("lease_file", "lease_timeout", "time_limit", "inventory_hostname")


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    raise_interrupt_on_sigterm()
    # The row of a run that ends without its figures: every repo asked for has one.
    unfinished = unfinished_report(params["repo_id"], params["repo_type"], params["revision"], params["phase"],
                                   params["verify"], module.check_mode)
    lease = failure = None
    try:
        if params["lease_file"] and not module.check_mode:
            try:
                lease = LeaseWatch(params["dest"], params["lease_file"], params["lease_timeout"],
                                   time_limit=params["time_limit"]).start()
            except StageError as exc:
                raise StageError("lease_file %s: %s" % (params["lease_file"], exc))
        request = MirrorRequest(host=params["inventory_hostname"],
                                on_lock_wait=lease.note_waiting if lease is not None else None,
                                **dict((key, params[key]) for key in ARGUMENT_SPEC if key not in NOT_REQUEST))
        result = run_mirror(request, check_mode=module.check_mode)
    except MirrorFailed as exc:
        result, failure = exc.result, "hf_hub_mirror %s: %s" % (params["repo_id"], exc)
    except (StageError, OSError) as exc:
        module.fail_json(msg=printable_names("hf_hub_mirror %s: %s" % (params["repo_id"], exc)),
                         report=unfinished)
    except KeyboardInterrupt as exc:
        why = lease.message() if lease is not None and lease.fired else exc or "Ctrl-C"
        module.fail_json(msg="hf_hub_mirror %s: interrupted (%s): the copies in flight were stopped and their temp "
                             "files removed; no ref was written for an incomplete snapshot. Re-run to finish"
                         % (params["repo_id"], why), report=unfinished)
    finally:
        if lease is not None:
            lease.stop()
    result = printable_names(result)
    diff_text = result.pop("diff_text")
    for warning in result.pop("warnings"):
        module.warn(warning)
    if failure:
        module.fail_json(msg=printable_names(failure), **result)
    if module._diff and diff_text:
        result["diff"] = {"before_header": "%s (local)" % result["snapshot"],
                          "after_header": "%s (staged)" % result["snapshot"], "prepared": diff_text}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
