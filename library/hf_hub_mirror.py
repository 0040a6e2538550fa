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
  - Copies the files of one revision of one repo that O(allow_patterns)/O(ignore_patterns) select from the NAS
    hub cache O(src) into the local hub cache O(dest), laid out so C(huggingface_hub) loads it offline (C(refs/),
    relative C(snapshots/) links, real C(blobs/), C(trees/<commit>.json)); nothing local resolves into the NAS.
  - Every blob written is hashed against its name (sha256, or git blob sha1 for 40-hex names) and gets that name
    only when it matches; a NAS blob that does not fails the run (RV(nas_corrupt)). Local blobs already there are
    proven as O(verify) says; a wrong one is replaced and warned about (RV(repairs)).
  - Writes go to fsynced temp files renamed into place, under a per-repo lock, only through real directories
    inside O(dest) (a symlinked one is refused before anything is written, in check mode too). Refuses before
    writing on bad input (missing roots, an empty NAS root, unknown repo or revision, dangling or escaping links,
    patterns selecting nothing) and when the disk cannot hold the copy plus O(reserve).
  - Past its input checks (not in check mode) a run keeps its figures in RV(progress_file), which M(mirror_job)
    and M(stage_status) read.
  - A run that fails once content is being copied or proven returns its whole result with RV(msg); one that fails
    before (bad input, lock timeout, no space, interrupt) returns RV(msg) and a RV(report) row without figures.
author: dgx-stage maintainers
options:
  src: {description: NAS hub cache root (the directory holding C(models--*)). Only read., type: path, required: true}
  dest: {description: Local hub cache root on the node's NVMe. Must exist., type: path, required: true}
  repo_id: {description: "Repo id, C(org/name).", type: str, required: true}
  repo_type: {description: Kind of repo., type: str, default: model, choices: [model, dataset, space]}
  revision: {description: "Branch, tag or 40-hex commit to stage.", type: str, default: main}
  allow_patterns:
    description: Only paths matching one of these are staged (huggingface_hub semantics; a pattern ending in C(/)
      matches everything below it).
    type: list
    elements: str
  ignore_patterns: {description: Paths matching one of these are not staged., type: list, elements: str}
  copy_missing:
    description: Copy selected files that have no local copy. V(false) (the verify pass) copies nothing new, still
      repairs a wrong copy, and fails before writing anything when selected files are not staged.
    type: bool
    default: true
  phase:
    description: The pass this run is, as named in the progress file and the results.
    type: str
    choices: [stage, verify]
    default: stage
  verify:
    description:
      - How local blobs already there are proven. V(sample) compares size and about 1 MiB of head, tail and middle
        blocks with the NAS file; V(full) hashes every local blob against its name, reading nothing on the NAS;
        V(none) trusts sizes.
    type: str
    choices: [sample, full, none]
    default: sample
  reserve:
    description: Free space to leave on the local disk after staging, bytes (C(10G) style suffixes allowed) or C(N%).
    type: str
    default: 2%
  prune:
    description: Remove local files of this repo outside the wanted state; other snapshots and their blobs are kept.
    type: bool
    default: false
  lock_timeout:
    description: Seconds to wait for another run holding the repo lock before failing, naming that run.
    type: int
    default: 60
  run_id: {description: "The lane's run id, written into the repo lock this run holds.", type: str}
  workers:
    description: Files copied or checked at once, 1 to 32; unset - the node's CPU count, between 2 and 8. All read
      buffers together stay within 32 MiB.
    type: int
  max_mib_s:
    description:
      - Reads of this run (copies, content checks, peer candidates), all workers together, stay at or under this
        many MiB/s averaged over any 5 s; V(0) - no cap. Each read waits its turn, so a capped run beside a
        serving engine leaves it the rest of the NAS link and the disk. RV(achieved_mib_s) is what it got.
    type: int
    default: 0
  io_priority:
    description:
      - V(idle) puts the run (and its workers) in the idle I/O class (C(ioprio_set)), so the engine's reads go
        first where the disk's I/O scheduler honours classes; V(normal) leaves the class as it is. What was
        applied, or why the kernel refused, is RV(io_priority).
    type: str
    choices: [normal, idle]
    default: normal
  lease_file:
    description:
      - For a background run (C(async)) - a C(dgx-lease.*) file (inside O(dest) only under its C(.locks)) whose
        mtime the controller renews (M(mirror_job) polls). Left unrenewed for O(lease_timeout) seconds, or
        removed, the run stops as on Ctrl-C and fails saying so. Ignored in check mode.
    type: path
  lease_timeout: {description: Seconds O(lease_file) may go unrenewed., type: int, default: 120}
  peer_dir:
    description:
      - This repo's candidate folder, C(<dest>/.locks/dgx-stage-peer/<repo folder>), holding blobs another host of
        the lane sent (the stage role's fan-out). A regular file there named by a blob the run would copy is
        copied like a NAS file and named only when its bytes hash to that blob; any other is listed in
        RV(peer_rejected) and the blob comes from the NAS.
      - Once a run (not in check mode) has started writing, the folder is emptied and removed. Any other path,
        one reached through a link, or a mount point is refused before anything is written.
    type: path
  require_match:
    description:
      - This host's rank patterns; one that matches no selected file fails the run before anything is written. The
        files they match are RV(files.rank).
    type: list
    elements: str
  other_rank_patterns:
    description: The lane's other ranks' patterns; a file that one of them and one of O(require_match) both select
      fails the run before anything is written.
    type: list
    elements: str
  inventory_hostname: {description: "This node's inventory name, the C(--limit) of fix commands.", type: str}
  time_limit:
    description: With O(lease_file), seconds after which the run stops itself as on Ctrl-C (set it below the task's
      C(async)); V(0) - none.
    type: int
    default: 0
extends_documentation_fragment:
  - dgx_node
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Reports what would be copied, repaired and pruned; changes nothing (takes no lock).
  diff_mode:
    support: full
    details: The plan in one line, then one line per copy, repair, prune, ref and link.
  idempotent:
    details: A second run finds every blob proven and every link, ref and tree listing in place.
notes:
  - A blob adopted from O(peer_dir) is not read on the NAS, so that run does not see a corrupt NAS copy of it; a run
    without candidates, or a verify pass with O(verify=sample), does.
"""

EXAMPLES = r"""
- name: Stage the EXL3 checkpoint without the optional page15 pack
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw
    ignore_patterns: ["page15/"]
    prune: true

- name: Verify pass - prove local blobs, copy nothing new
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DSpark-drafter
    verify: full
    copy_missing: false
    phase: verify

- name: Stage beside a serving engine - reads at most 500 MiB/s, idle I/O class
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw
    max_mib_s: 500
    io_priority: idle
"""

RETURN = r"""
commit:
  description: Commit hash that was staged.
  returned: &result success; on failure when the run has a result
  type: str
  sample: 0123456789abcdef0123456789abcdef01234567
snapshot:
  description: Local snapshot directory.
  returned: *result
  type: str
  sample: /raid/hf-local/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
files:
  description: Files of the source snapshot.
  returned: *result
  type: dict
  contains:
    total: {description: Files of the NAS snapshot., type: int}
    local: {description: Files the patterns select (staged)., type: int}
    excluded: {description: Files the patterns leave out (RV(excluded_paths))., type: int}
    dangling: {description: Local entries that do not resolve to a local file after the run., type: int}
    rank: {description: Staged files O(require_match) selects; V(0) without it., type: int}
    shared: {description: Staged files that are not rank files., type: int}
  sample: {total: 14, local: 9, excluded: 5, dangling: 0, rank: 1, shared: 8}
blobs:
  description: Unique blobs under C(blobs/) (in check mode, what would be done).
  returned: *result
  type: dict
  contains:
    copied: {description: Blobs copied (missing locally)., type: int}
    reused: {description: Local blobs proven right and kept., type: int}
    repaired: {description: Local blobs replaced because wrong., type: int}
  sample: {copied: 7, reused: 0, repaired: 0}
real_files:
  description: Real files inside the snapshot (no blob name), such as a selected page15 pack.
  returned: *result
  type: dict
  contains:
    copied: {description: Real files copied., type: int}
    repaired: {description: Real files replaced because wrong., type: int}
repaired_paths:
  description: Snapshot paths whose wrong local content was replaced.
  returned: *result
  type: list
  elements: str
repairs:
  description: One record per local file that was (in check mode, would be) replaced; each is also a warning.
  returned: *result
  type: list
  elements: dict
  contains:
    blob: {description: The blob name; null for a real snapshot file., type: str}
    reason: {description: "V(size), V(content), V(link) or V(not-a-file).", type: str}
    local_hash: {description: What the local bytes hashed to; null when there were none., type: str}
    path: {description: The snapshot path the warning names., type: str}
    paths: {description: All snapshot paths served by this file., type: list, elements: str}
    size: {description: The file's size on the NAS., type: int}
links_written: {description: "Snapshot links written (would be, in check mode).", returned: *result, type: int}
refs_written:
  description: Ref names written under C(refs/); empty when files were left unstaged.
  returned: *result
  type: list
  elements: str
  sample: [main]
bytes_copied: {description: "Bytes written (would be), copies and repairs.", returned: *result, type: int}
bytes_from_nas: {description: Bytes of RV(bytes_copied) read from the NAS., returned: *result, type: int}
bytes_from_peers:
  description: Bytes of RV(bytes_copied) taken from O(peer_dir) candidates.
  returned: *result
  type: int
peer_rejected:
  description: The O(peer_dir) candidates not adopted; each is also a warning. Empty in check mode.
  returned: *result
  type: list
  elements: dict
  contains:
    blob: {description: The candidate's blob name., type: str}
    paths: {description: The snapshot paths served by that blob., type: list, elements: str}
    why: {description: Why it was rejected., type: str}
wanted_blobs:
  description: Names of the blobs this run copies or repairs (in check mode, would) - what a peer may send.
  returned: *result
  type: list
  elements: str
source_snapshot: {description: The NAS snapshot directory read., returned: *result, type: str}
bytes_staged: {description: Bytes of the selected files., returned: *result, type: int}
bytes_read:
  description: Bytes this run read on each side (copies and checks).
  returned: *result
  type: dict
  contains:
    local: {description: Bytes read from the local disk., type: int}
    nas: {description: Bytes read from the NAS., type: int}
  sample: {local: 0, nas: 50331648}
excluded_paths:
  description: Snapshot paths not staged (the manifest binds them from the NAS).
  returned: *result
  type: list
  elements: str
  sample: [page15/a/00.bin]
pruned: {description: Local paths O(prune) removed (would remove)., returned: *result, type: list, elements: str}
stale_paths:
  description: Local paths outside the staged state, kept (O(prune) off).
  returned: *result
  type: list
  elements: str
debris_removed:
  description: Temp files of killed runs removed (would be).
  returned: *result
  type: list
  elements: str
nas_corrupt:
  description: Snapshot paths whose NAS blob fails its name (the run fails).
  returned: *result
  type: list
  elements: str
nas_corrupt_blobs:
  description: One record per NAS blob that failed its name.
  returned: *result
  type: list
  elements: dict
  contains:
    path: {description: First snapshot path of the blob., type: str}
    paths: {description: Every snapshot path of the blob., type: list, elements: str}
    blob: {description: The blob name (the expected hash)., type: str}
    nas_source: {description: The NAS file that was read., type: str}
    nas_hash: {description: What the NAS bytes hashed to; null when found wrong by comparison., type: str}
    local: {description: "V(kept) (the local copy hashes to its name), V(removed) or V(absent).", type: str}
    why: {description: How the NAS copy was found wrong., type: str}
unstaged_paths:
  description: Selected snapshot paths with no good local copy after this run (with O(copy_missing=false), the run
    then wrote nothing).
  returned: *result
  type: list
  elements: str
verify: {description: O(verify)., returned: success; on failure when the run has a result, type: str}
phase: {description: O(phase)., returned: success; on failure when the run has a result, type: str}
copy_missing: {description: O(copy_missing)., returned: success; on failure when the run has a result, type: bool}
progress_file:
  description: The repo's progress file, C(<dest>/.locks/<repo folder>/dgx-stage.progress.json).
  returned: *result
  type: str
summary:
  description: One line for the operator - what the pass did, what it proved, the bytes read, the time.
  returned: *result
  type: str
space:
  description: The free-space check, in bytes.
  returned: *result
  type: dict
  contains:
    free: {description: Free bytes on the local disk before the run., type: int}
    reserve: {description: Bytes O(reserve) keeps free., type: int}
    need: {description: "Bytes the plan writes, less RV(space.peers), plus RV(space.peers_peak).", type: int}
    peers: {description: Bytes of O(peer_dir) candidates whose space is freed once copied., type: int}
    peers_peak: {description: The largest of them (one per worker) still on the disk during their copies., type: int}
    reclaimable: {description: "Bytes the plan frees (prune, debris).", type: int}
duration_s: {description: The module's own run time in seconds., returned: *result, type: float}
read_s:
  description: "Seconds from the first step that read (checks or copies) to the last byte read."
  returned: *result
  type: float
max_mib_s: {description: O(max_mib_s)., returned: *result, type: int}
achieved_mib_s:
  description: RV(bytes_read) (both sides) per RV(read_s), in MiB/s; null under a second of reading.
  returned: *result
  type: float
io_priority:
  description: The I/O class of the run, as the kernel reports it after O(io_priority) was applied.
  returned: *result
  type: dict
  contains:
    requested: {description: O(io_priority)., type: str}
    applied:
      description: "The class C(ioprio_get) reports - V(idle), V(best-effort), V(realtime) or V(none) (the default,
        best-effort by nice); null when it cannot be read."
      type: str
    problem:
      description: "Why the class could not be set (the kernel refused ioprio_set, an unknown architecture); else null."
      type: str
    scheduler:
      description: "The I/O scheduler of the disk holding O(dest) (e.g. V(none), V(mq-deadline), V(bfq)); null when
        it has none (tmpfs, overlay)."
      type: str
    note:
      description: "Set when the class is idle but the scheduler ignores classes (V(none), V(kyber)): then only
        O(max_mib_s) protects the engine."
      type: str
  sample: {requested: idle, applied: idle, problem: null, scheduler: none, note: "the local disk's I/O scheduler ..."}
report:
  description:
    - This repo's row of the host report (keys not described are the results of the same name). A run that ends
      without its figures returns a V(failed) row of RV(report.repo_id), RV(report.repo_type), RV(report.revision),
      RV(report.status), RV(report.check_mode), RV(report.verify) and RV(report.phase) only.
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
    peer_rejected: {returned: when the run has a result, description: How many RV(peer_rejected)., type: int}
    bytes_read: {returned: when the run has a result, description: RV(bytes_read)., type: dict}
    duration_s: {returned: when the run has a result, description: RV(duration_s)., type: float}
    read_s: {returned: when the run has a result, description: RV(read_s)., type: float}
    max_mib_s: {returned: when the run has a result, description: RV(max_mib_s)., type: int}
    achieved_mib_s: {returned: when the run has a result, description: RV(achieved_mib_s)., type: float}
    io_priority: {returned: when the run has a result, description: RV(io_priority)., type: dict}
    verify: {description: RV(verify)., type: str}
    phase: {description: RV(phase)., type: str}
    changed: {returned: when the run has a result, description: The run changed (would change) the hub., type: bool}
    repaired_paths: {returned: when the run has a result, description: RV(repaired_paths)., type: list, elements: str}
    repairs: {returned: when the run has a result, description: RV(repairs)., type: list, elements: dict}
    pruned: {returned: when the run has a result, description: RV(pruned)., type: list, elements: str}
    excluded_paths: {returned: when the run has a result, description: RV(excluded_paths)., type: list, elements: str}
    nas_corrupt: {returned: when the run has a result, description: RV(nas_corrupt)., type: list, elements: str}
    nas_corrupt_blobs:
      returned: when the run has a result
      description: RV(nas_corrupt_blobs); engine_manifest reads them from the host report.
      type: list
      elements: dict
    unstaged_paths: {returned: when the run has a result, description: RV(unstaged_paths)., type: list, elements: str}
diff:
  description: The plan in one line, then one line per copy, repair, prune and ref.
  returned: success when in diff mode and something changes
  type: dict
  contains:
    before_header: {description: C(<snapshot> (local))., type: str}
    after_header: {description: C(<snapshot> (staged))., type: str}
    prepared: {description: The lines., type: str}
msg: {description: "What failed, naming the files, the NAS blobs and the fix.", returned: failure, type: str}
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
    max_mib_s=dict(type="int", default=0),
    io_priority=dict(type="str", default="normal", choices=["normal", "idle"]),
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
