# -*- coding: utf-8 -*-
"""Mirror one revision of one repo from a NAS hub cache to a local hub cache, verified.

plan_mirror() reads both sides and decides everything (nothing written); check_space() refuses a
plan the disk cannot hold; apply_plan() performs it in a crash-safe order: debris and prune first,
then blobs, then snapshot links, refs and the tree listing last, so a killed run never leaves a
ref pointing at an incomplete snapshot or a torn file under a final name.
Runs on the nodes' system Python: stdlib only, Python 3.8 syntax.
"""
from __future__ import absolute_import, division, print_function

import copy
import errno
import os
import posixpath
import re
import stat
import time

from ansible.module_utils.dgx_errors import StageError, fix_command
from ansible.module_utils.dgx_fsutil import (TEMP_PREFIX, atomic_write_bytes, fsync_dir, is_temp_name, is_within,
                                             open_to_read, remove_empty_dirs, remove_path, walk_tree)
from ansible.module_utils.dgx_hashing import (file_sha256, hash_as_named, name_is_hash, sampled_bytes,
                                              samples_match)
from ansible.module_utils.dgx_hubcache import (blob_link_target, content_of, first_match, list_refs,
                                               read_tree_listing, repo_folder_name, resolve_commit, scan_snapshot, path_selected,
                                               tree_listing_for, unmatched_patterns)
from ansible.module_utils.dgx_mounts import mount_point_problem
from ansible.module_utils.dgx_nas_suspects import remembered
from ansible.module_utils.dgx_copy import (DISK_ERRNOS, CandidateRejected, LocalWriteError, SourceProblem, adopt_candidate,
                                          clear_peer_dir, copy_verified)
from ansible.module_utils.dgx_localtree import LocalTree, find_temp_debris, linked_dir_problem, symlink_atomic
from ansible.module_utils.dgx_progress_file import PROGRESS_NAME, PassMeter
from ansible.module_utils.dgx_repolock import RepoLock
from ansible.module_utils.dgx_units import human_bytes, utc_text
from ansible.module_utils.dgx_workers import default_workers, run_workers

VERIFY_MODES = ("sample", "full", "none")
PHASES = ("stage", "verify")
# Why a selected file has no local copy at all (copy_missing=false refuses these); a present regular
# file that fails its check ("size", "content") is a repair.
NOT_STAGED = ("missing", "link", "not-a-file")
# How many not-staged paths a refusal names before it gives the count of the rest.
NAMED_IN_MESSAGES = 5
MAX_WORKERS_PARAM = 32
SIZE_SUFFIXES = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


class MirrorRequest(object):
    """The module's parameters, validated once."""

    def __init__(self, src, dest, repo_id, repo_type="model", revision="main", allow_patterns=None,
                 ignore_patterns=None, verify="sample", reserve="2%", prune=False, lock_timeout=60, workers=None,
                 copy_missing=True, phase="stage", peer_dir=None, require_match=None, other_rank_patterns=None,
                 host=None, run_id=None, on_lock_wait=None):
        if verify not in VERIFY_MODES:
            raise StageError("verify must be one of %s, not %r" % (", ".join(VERIFY_MODES), verify))
        if phase not in PHASES:
            raise StageError("phase must be one of %s, not %r" % (", ".join(PHASES), phase))
        self.src = os.path.abspath(src)
        self.dest = os.path.abspath(dest)
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.revision = revision or "main"
        self.allow_patterns = list(allow_patterns) if allow_patterns else None
        self.ignore_patterns = list(ignore_patterns) if ignore_patterns else None
        self.verify = verify
        self.reserve = reserve
        self.prune = prune
        self.lock_timeout = lock_timeout
        if workers is not None and not 1 <= int(workers) <= MAX_WORKERS_PARAM:
            raise StageError("workers must be between 1 and %d, not %r" % (MAX_WORKERS_PARAM, workers))
        self.workers = int(workers) if workers else default_workers()
        self.folder = repo_folder_name(repo_id, repo_type)
        self.copy_missing = bool(copy_missing)
        self.phase = phase
        self.peer_dir_given = peer_dir    # as given: a relative path or '..' in it is refused
        self.peer_dir = os.path.abspath(peer_dir) if peer_dir else None
        self.require_match = list(require_match) if require_match else []
        self.other_rank_patterns = list(other_rank_patterns) if other_rank_patterns else []
        self.host = host           # the inventory's name for this node: the --limit of the commands messages give
        self.run_id = run_id       # the lane's run id, written to the repo lock: whom a second run waits for
        self.on_lock_wait = on_lock_wait   # RepoLock's on_wait: the background job tells its polls


class MirrorFailed(StageError):
    """The run could not stage everything; `result` holds what it did and what is wrong (nas_corrupt)."""

    def __init__(self, message, result):
        StageError.__init__(self, message)
        self.result = result


class NotStaged(StageError):
    """copy_missing is off and selected files have no local copy: refused before anything is written."""

    def __init__(self, message, plan, paths):
        StageError.__init__(self, message)
        self.plan, self.paths = plan, paths


class Work(object):
    """One file to write: a blob under blobs/ or a real file inside the snapshot. local_hash: what the
    local bytes hashed to when a check read them all (as the blob is named; sha256 for a real file)."""

    __slots__ = ("final", "source", "size", "etag", "reason", "paths", "local_hash", "checked")

    def __init__(self, final, source, size, etag, reason, paths):
        self.final, self.source, self.size, self.etag, self.reason, self.paths = (
            final, source, size, etag, reason, paths)
        self.local_hash = None
        self.checked = False      # a content check read it (then it already counts in the progress files)

    @property
    def is_repair(self):
        return self.reason != "missing"


class Plan(object):
    def __init__(self):
        self.commit = None
        self.src_repo = self.dest_repo = self.snapshot = None
        self.entries = []          # every file of the source snapshot
        self.selected = []         # the ones the patterns stage
        self.excluded = []
        self.rank_files = 0        # how many selected files this host's rank patterns (require_match) select
        self.writes = []           # Work items: blobs and real files to copy or repair
        self.to_prove = []         # Work items present locally, whose content prove_present decides
        self.nas_corrupt = []      # nas_corrupt_record()s found while planning (the local copy is kept)
        self.blobs_reused = 0
        self.links = []            # (link path, target text) to (re)write
        self.refs = {}             # ref name -> commit to write
        self.tree_listing = None   # bytes of the local trees/<commit>.json, when it must change
        self.prune = []            # local paths to remove (not wanted)
        self.stale = []            # unwanted local paths kept because prune is off
        self.debris = []           # temp files of killed runs
        self.freed_bytes = 0
        self.peer_bytes = 0        # bytes of the writes whose peer_dir candidate counts as on disk (candidate_size)
        self.peer_peak = 0         # the largest counted candidates, one per worker: copies alongside their candidates
        self.warnings = []

    @property
    def write_bytes(self):
        return sum(w.size for w in self.writes)

    @property
    def wanted_blobs(self):
        """Blob names (under blobs/) the plan copies: what a peer may send to peer_dir."""
        return sorted(set(w.etag for w in self.writes if w.etag))

    @property
    def changes(self):
        return bool(self.writes or self.links or self.refs or self.tree_listing or self.prune or self.debris)


def parse_size(value):
    """Bytes from 12345, '12345', '10G', '1.5T' (binary units)."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", str(value), re.IGNORECASE)
    if not match:
        raise StageError("cannot read %r as a size: use bytes, a K/M/G/T suffix, or N%%" % (value,))
    return int(float(match.group(1)) * SIZE_SUFFIXES[match.group(2).upper()])


def parse_reserve(value, disk_total):
    """The free space to keep, from bytes/size text or 'N%' of the disk."""
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise StageError("cannot read reserve %r: use bytes or N%%" % (value,))
        if not 0 <= percent < 100:
            raise StageError("reserve %r must be between 0%% and 100%%" % (value,))
        return int(disk_total * percent / 100)
    return parse_size(text)


def disk_space(path):
    """(free bytes for unprivileged writers, total bytes) of the filesystem holding path."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def existing_ancestor(path):
    """path itself or its nearest existing parent: where free space is measured."""
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def check_roots(req, check_mode=False):
    """Both hub roots exist and do not overlap. In check mode a dest not created yet is fine
    (a fresh node: the stage play creates it), measured as empty."""
    if not os.path.isdir(req.src):
        raise StageError("src hub root %s does not exist or is not a directory: is the NAS mounted? "
                         "(hub_nas_root)" % req.src)
    if not os.path.isdir(req.dest) and not (check_mode and not os.path.exists(req.dest)):
        raise StageError("dest hub root %s does not exist or is not a directory: create it first "
                         "(hub_local_root; the stage role does)" % req.dest)
    src_real, dest_real = os.path.realpath(req.src), os.path.realpath(req.dest)
    if is_within(dest_real, src_real) or is_within(src_real, dest_real):
        raise StageError("src %s and dest %s overlap: the local hub must be outside the NAS hub and vice versa"
                         % (req.src, req.dest))


def presence_problem(local, size):
    """Why an existing local file cannot be a good copy without reading it, or None (then its
    content decides, as `verify` says). A link is never a copy: e.g. a link into the NAS store."""
    try:
        st = os.lstat(local)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if not stat.S_ISREG(st.st_mode):
        return "not-a-file"
    return "size" if st.st_size != size else None


def content_matches(work, verify, buf, meter):
    """Prove one present file: sampled raw compare with the NAS (sample), or every byte against the
    blob's name (full; a real snapshot file has no name and is compared with the NAS by sha256).
    A full check keeps what the local bytes hashed to in work.local_hash."""
    if verify == "sample":
        return samples_match(work.final, work.source, work.size,
                             on_read=lambda local, nas: meter.count("hashing", local=local, nas=nas))
    if work.etag:
        work.local_hash, count = hash_as_named(work.final, work.etag, work.size, buf, meter.reader("hashing", "local"))
        return count == work.size and work.local_hash == work.etag
    work.local_hash = file_sha256(work.final, buf, meter.reader("hashing", "local"))
    return work.local_hash == file_sha256(work.source, buf, meter.reader("hashing", "nas"))


def reads_content(work, verify):
    """Whether proving this present file reads its bytes (else its size alone decides)."""
    return verify != "none" or work.reason == "size"


def _check_bytes(work, verify):
    """The bytes proving this present file reads when all goes well (the progress file's plan)."""
    if work.reason == "size":
        try:
            return os.lstat(work.final).st_size
        except OSError:
            return 0
    if verify == "sample":
        return 2 * sampled_bytes(work.size)
    return work.size if work.etag else 2 * work.size


def prove_present(plan, req, meter):
    """Content checks of every present file, `req.workers` at a time.

    A file that fails becomes a repair. A blob whose local copy disagrees with the NAS (sampled bytes,
    or size) is first hashed against its own name: when the local copy passes, the NAS copy is the
    corrupt one; it is reported in `nas_corrupt` and the good local copy is kept, in check mode too.
    """
    verdicts = {}        # id(work) -> content_verdict(); dict writes are atomic across workers
    meter.plan("copying", len(plan.writes), plan.write_bytes)
    checked = [w for w in plan.to_prove if reads_content(w, req.verify)]
    if checked:
        meter.plan("hashing", len(checked), sum(_check_bytes(w, req.verify) for w in checked))
        meter.begin("hashing")

    def prove(work, buf):
        meter.working_on(work.paths[0])
        verdict = verdicts[id(work)] = content_verdict(work, req.verify, buf, meter)
        if reads_content(work, req.verify):
            work.checked = True
            meter.item_done("hashing", file_done=verdict not in ("missing", "size", "content"))

    run_workers(sorted(plan.to_prove, key=lambda w: -w.size), prove, req.workers)
    for work in plan.to_prove:
        verdict = verdicts[id(work)]
        if verdict in ("missing", "size", "content"):
            work.reason = verdict
            plan.writes.append(work)
            meter.plan("copying", 1, work.size, new_files=not work.checked)
        elif verdict == "nas-corrupt":
            plan.nas_corrupt.append(nas_corrupt_record(work, None, "kept", _disagreement(work, req)))
        elif work.etag:
            plan.blobs_reused += 1


def content_verdict(work, verify, buf, meter):
    """"ok", "nas-corrupt" (the local copy passes its name, the NAS disagrees) or why to repair it.
    Whenever the local copy is wrong, work.local_hash says what its bytes hash to (as the blob is
    named, at the local size; sha256 for a real file)."""
    try:
        if work.reason != "size" and (verify == "none" or content_matches(work, verify, buf, meter)):
            return "ok"
        full_check = verify == "full" and work.reason != "size"
        if not full_check or work.local_hash is None:
            work.local_hash = _local_hash(work, buf, meter)
        if work.etag and not full_check and work.local_hash == work.etag:
            return "nas-corrupt"
        return work.reason
    except FileNotFoundError:     # removed under us (not by a dgx-stage run: we hold the lock)
        return "missing"


def _local_hash(work, buf, meter):
    """What the whole local file hashes to: as its blob is named, at its own size; sha256 for a real file."""
    local = meter.reader("hashing", "local")
    if work.etag:
        return hash_as_named(work.final, work.etag, None, buf, local)[0]
    return file_sha256(work.final, buf, local)


def _disagreement(work, req):
    if work.reason == "size":
        return "its NAS size (%d bytes) differs from the blob's true size (%d)" % (
            work.size, os.lstat(work.final).st_size)
    return "its sampled bytes differ from the local copy's" if req.verify == "sample" else "it differs"


def nas_corrupt_record(work, nas_hash, local, why):
    """One `nas_corrupt_blobs` entry: a NAS blob that does not hold the bytes its name says."""
    return {"path": work.paths[0], "paths": list(work.paths), "blob": work.etag, "nas_source": work.source,
            "nas_hash": nas_hash, "local": local, "why": why}


def _blobs_of_other_snapshots(dest_repo, commit):
    """Blob names linked from local snapshots other than `commit` (prune must keep them)."""
    keep = set()
    snaps = os.path.join(dest_repo, "snapshots")
    if not os.path.isdir(snaps):
        return keep
    for name in os.listdir(snaps):
        if name != commit:
            keep.update(os.path.basename(os.readlink(path))
                        for path, _rel, is_dir in walk_tree(os.path.join(snaps, name))
                        if not is_dir and os.path.islink(path))
    return keep


def _freed_by_removal(path):
    st = os.lstat(path)
    return st.st_size if (not os.path.islink(path) and st.st_nlink == 1) else 0


def plan_mirror(req, check_mode=False, meter=None):
    """Read the source and the local copy and decide every action. Writes nothing.

    The content checks of present files come last (`meter` counts what they read); before them, with
    copy_missing off, selected files with no local copy refuse the run (NotStaged)."""
    meter = meter or PassMeter(req.phase, req.repo_id, req.verify)
    check_roots(req, check_mode)
    plan = Plan()
    plan.src_repo = os.path.join(req.src, req.folder)
    if not os.path.isdir(plan.src_repo):
        known = sorted(d for d in os.listdir(req.src) if "--" in d)
        if not known:
            raise StageError("unknown repo %s: the NAS hub root %s holds no repo folders at all (no models--*, "
                             "datasets--*): is the NAS mounted there? An empty mount point looks exactly like "
                             "this; check `findmnt %s` on the node, or fix hub_nas_root"
                             % (req.repo_id, req.src, req.src))
        raise StageError("unknown repo %s: %s not found; the NAS hub holds: %s"
                         % (req.repo_id, plan.src_repo, ", ".join(known)))
    refuse_bad_peer_dir(req)
    plan.commit = meter.commit = resolve_commit(plan.src_repo, req.revision)
    plan.entries = scan_snapshot(plan.src_repo, plan.commit, req.src, strict=False)
    if not plan.entries:
        raise StageError("snapshot %s of %s is empty on the NAS" % (plan.commit, req.repo_id))
    plan.selected = [e for e in plan.entries if path_selected(e.path, req.allow_patterns, req.ignore_patterns)]
    plan.excluded = [e for e in plan.entries if not path_selected(e.path, req.allow_patterns, req.ignore_patterns)]
    refuse_overlapping_ranks(plan, req)
    refuse_unmatched_required(plan, req)
    plan.rank_files = len([e for e in plan.selected if first_match(e.path, req.require_match) is not None])
    if not plan.selected:
        raise StageError("allow_patterns %s / ignore_patterns %s select none of the %d files of %s@%s: "
                         "check the patterns (fnmatch on snapshot-relative paths, 'dir/' for a whole dir)"
                         % (req.allow_patterns, req.ignore_patterns, len(plan.entries), req.repo_id,
                            plan.commit))
    for pattern in unmatched_patterns([e.path for e in plan.entries], req.allow_patterns):
        plan.warnings.append("allow pattern %r matches no file of %s@%s" % (pattern, req.repo_id, plan.commit))
    _refuse_bad_entries(plan)
    plan.dest_repo = os.path.join(req.dest, req.folder)
    plan.snapshot = os.path.join(plan.dest_repo, "snapshots", plan.commit)
    refuse_unsafe_local_dirs(req, plan.commit)
    _refuse_in_the_way(plan)
    _plan_files(plan)
    _plan_metadata(plan)
    _plan_cleanup(plan, req)
    if not req.copy_missing:
        refuse_not_staged(plan, req)
    prove_present(plan, req, meter)
    if not req.copy_missing:
        refuse_not_staged(plan, req)      # a file removed while the others were proven
    _count_candidates(plan, req)
    return plan


def source_snapshot(plan):
    """The NAS snapshot directory the plan reads (None before the commit is known)."""
    return os.path.join(plan.src_repo, "snapshots", plan.commit) if plan.commit else None


def refuse_overlapping_ranks(plan, req):
    """StageError when a file of the snapshot is selected both by this host's rank patterns (require_match) and
    by another rank's (other_rank_patterns): rank files partition the repo, and such a file is ignored on both
    hosts, so neither stages it and the lane reads it from the NAS."""
    for entry in plan.entries:
        own = first_match(entry.path, req.require_match)
        other = first_match(entry.path, req.other_rank_patterns) if own is not None else None
        if other is not None:
            raise StageError("rank patterns overlap: %s of %s@%s is selected by this host's rank pattern %r and by "
                             "another rank's pattern %r, so neither host would stage it; make each rank's "
                             "patterns select files of its own (rank_patterns), nothing was written"
                             % (entry.path, req.repo_id, plan.commit, own, other))


def refuse_unmatched_required(plan, req):
    """StageError when a require_match pattern (the host's rank patterns) matches no file this run selects
    (after allow_patterns and ignore_patterns): a lane larger than the checkpoint was cut for, a typo, or
    patterns that exclude the rank's files would otherwise stage the shared files only."""
    for pattern in unmatched_patterns([e.path for e in plan.selected], req.require_match):
        excluded_only = not unmatched_patterns([e.path for e in plan.excluded], [pattern])
        raise StageError("rank pattern %r matches no file of %s@%s %s: check rank_patterns and the lane's size "
                         "(require_match holds this host's rank patterns; fnmatch on snapshot-relative paths, "
                         "'dir/' for a whole dir); nothing was written"
                         % (pattern, req.repo_id, plan.commit,
                            "that this run selects (it matches only files that allow_patterns %s / ignore_patterns "
                            "%s exclude)" % (req.allow_patterns, req.ignore_patterns) if excluded_only
                            else "that this run selects"))


def peer_dir_rel(req):
    """peer_dir relative to dest ('/'-separated), or None without one."""
    if not req.peer_dir:
        return None
    return os.path.relpath(req.peer_dir, req.dest).replace(os.sep, "/")


def peer_dir_problem(req):
    """Why peer_dir cannot be the run's scratch directory, or None. The run removes it and what is
    left in it, so it must be a directory of its own inside dest: not dest, not in a repo folder or a
    repo's lock directory, reached through no symlink."""
    if not req.peer_dir:
        return None
    convention = os.path.join(req.dest, ".locks", PEER_PARENT, req.folder)
    fix = ("the run removes peer_dir and what is left in it, so it must be a scratch directory of its own inside "
           "dest, by convention %s; nothing was written" % convention)
    given = getattr(req, "peer_dir_given", None) or req.peer_dir
    if not os.path.isabs(given) or ".." in given.replace(os.sep, "/").split("/"):
        return "peer_dir %s is not an absolute path without '..' components: %s" % (given, fix)
    if req.peer_dir == req.dest:
        return "peer_dir %s is dest: %s" % (req.peer_dir, fix)
    if not is_within(req.peer_dir, req.dest):
        return "peer_dir %s is not inside dest %s: %s" % (req.peer_dir, req.dest, fix)
    parts = peer_dir_rel(req).split("/")
    if "--" in parts[0] or parts == [".locks"] or (parts[0] == ".locks" and "--" in parts[1]):
        return "peer_dir %s is %s: %s" % (
            req.peer_dir, "a repo's lock directory (or inside one)" if parts[0] == ".locks" and len(parts) > 1
            else "the lock root" if parts == [".locks"] else "inside the repo folder %s" % parts[0], fix)
    if parts[-1] != req.folder or len(parts) < 2 or parts[-2] != PEER_PARENT:
        # the clean-up deletes what peer_dir holds: it must be this repo's, never another repo's candidates
        return ("peer_dir %s is not this repo's candidate folder: its name must be %s and its parent's %s: %s"
                % (req.peer_dir, req.folder, PEER_PARENT, fix))
    if os.path.isdir(req.dest):
        problem = linked_dir_problem(req.dest, peer_dir_rel(req)) or mount_point_problem(req.dest, peer_dir_rel(req))
        if problem:
            return "peer_dir %s: %s" % (req.peer_dir, problem)
    return None


# peer_dir's parent folder (by convention <dest>/.locks/dgx-stage-peer/<repo folder>)
PEER_PARENT = "dgx-stage-peer"


def refuse_bad_peer_dir(req):
    problem = peer_dir_problem(req)
    if problem:
        raise StageError(problem)


def candidate_present(req, work, blobs_dev=None):
    """Whether peer_dir holds a regular file named like this Work's blob at its size (not yet hashed) that
    occupies its bytes on the disk of blobs/ (device blobs_dev; st_blocks cover its size, so a sparse
    file does not count): the space its removal gives back."""
    if not req.peer_dir or not work.etag:
        return False
    try:
        st = os.lstat(os.path.join(req.peer_dir, work.etag))
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_size == work.size and st.st_blocks * 512 >= st.st_size
            and (blobs_dev is None or st.st_dev == blobs_dev))


def _count_candidates(plan, req):
    """plan.peer_bytes and plan.peer_peak. Each candidate is copied (a new file) and then removed: while
    `workers` copies are in flight their candidates are still there, so the need is the bytes to write,
    minus the candidates' bytes, plus the largest candidates one per worker (the peak)."""
    if not req.peer_dir:
        return
    blobs_dev = os.lstat(existing_ancestor(os.path.join(plan.dest_repo, "blobs"))).st_dev
    sizes = sorted((w.size for w in plan.writes if candidate_present(req, w, blobs_dev)), reverse=True)
    plan.peer_bytes = sum(sizes)
    plan.peer_peak = sum(sizes[:req.workers])


def refuse_not_staged(plan, req):
    """NotStaged when selected files have no local copy (a verify pass proves, it does not copy)."""
    missing = sorted(set(p for w in plan.writes if w.reason in NOT_STAGED for p in w.paths))
    if missing:
        raise NotStaged(
            "%d of the %d selected file(s) of %s@%s are not staged on this node (%s): this %s pass proves the "
            "local copy and copies nothing (copy_missing=false). Stage them first, which verifies too: %s; "
            "nothing was written"
            % (len(missing), len(plan.selected), req.repo_id, plan.commit[:12], name_some(missing), req.phase,
               fix_command("stage", req.host)),
            plan, missing)


def name_some(paths, most=NAMED_IN_MESSAGES):
    """'a, b, c' or 'a, b, c and 7 more': a long list named by its first few and a count."""
    shown = ", ".join(paths[:most])
    return shown if len(paths) <= most else "%s and %d more" % (shown, len(paths) - most)


def _refuse_bad_entries(plan):
    """What the patterns select must be stageable; an excluded bad entry is left to the NAS, with a warning."""
    for entry in plan.excluded:
        if entry.kind == "bad":
            plan.warnings.append("%s (excluded by the patterns, left to the NAS): %s" % (entry.path, entry.problem))
    for entry in plan.selected:
        if entry.kind == "bad":
            raise StageError(entry.problem)
        if is_temp_name(os.path.basename(entry.path)):
            raise StageError("%s: the name has the form of dgx-stage's temp files (%s...), which a later run would "
                             "remove as debris; rename it on the hub or exclude it" % (entry.path, TEMP_PREFIX))
        if entry.etag and not name_is_hash(entry.etag):
            raise StageError("%s links to blobs/%s, which is not named by a sha256 or git blob sha1: its content "
                             "cannot be proven against its name, so it is not staged; repair the source hub"
                             % (entry.path, entry.etag))


def _refuse_in_the_way(plan):
    """A directory where the run must put a file (a snapshot entry, a blob, a ref, the tree listing)."""
    paths = [os.path.join(plan.snapshot, *e.path.split("/")) for e in plan.selected]
    paths += [os.path.join(plan.dest_repo, "blobs", e.etag) for e in plan.selected if e.etag]
    paths += [os.path.join(plan.dest_repo, "refs", *name.split("/")) for name in list_refs(plan.src_repo)]
    paths.append(os.path.join(plan.dest_repo, "trees", plan.commit + ".json"))
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            raise StageError("%s is a directory where the staged revision has a file: move it out of the local hub "
                             "and re-run; nothing was written" % path)


def refuse_unsafe_local_dirs(req, commit):
    """Every directory the run may write or remove in must be a real directory inside dest, on dest's
    own mount (check mode too): a symlinked or mounted repo folder, blobs/, snapshot or lock dir is
    refused, naming it."""
    if not os.path.isdir(req.dest):
        return
    tree = LocalTree(req.dest)
    folder = req.folder
    tree.refuse_unsafe_dirs([folder + "/blobs", folder + "/trees", ".locks/" + folder])
    for rel in (folder + "/snapshots/" + commit, folder + "/refs"):
        tree.refuse_unsafe_dirs_below(rel)


def alias_link_text(path, alias_of):
    """Relative link text from snapshot path `path` to snapshot path `alias_of`."""
    return posixpath.relpath(alias_of, posixpath.dirname(path) or ".")


def _plan_files(plan):
    by_blob = {}
    selected_paths = set(e.path for e in plan.selected)
    for entry in plan.selected:
        local = os.path.join(plan.snapshot, *entry.path.split("/"))
        if entry.alias_of and entry.alias_of in selected_paths:
            # A link between two real snapshot files stays a link, so the content is stored once.
            target = alias_link_text(entry.path, entry.alias_of)
            if not (os.path.islink(local) and os.readlink(local) == target):
                plan.links.append((local, target))
            continue
        if entry.kind == "real":
            _plan_content(plan, Work(local, entry.source, entry.size, None, "content", [entry.path]))
            continue
        by_blob.setdefault(entry.etag, []).append(entry)
        target = blob_link_target(entry.path, entry.etag)
        if not (os.path.islink(local) and os.readlink(local) == target):
            plan.links.append((local, target))
    for etag in sorted(by_blob):
        first = by_blob[etag][0]
        final = os.path.join(plan.dest_repo, "blobs", etag)
        _plan_content(plan, Work(final, first.source, first.size, etag, "content", [e.path for e in by_blob[etag]]))


def _plan_content(plan, work):
    """A missing file, a link or a non-file is written; a present one (even of another size: the NAS
    may be the wrong side) is proven by prove_present."""
    problem = presence_problem(work.final, work.size)
    if problem in (None, "size"):
        work.reason = problem or "content"
        plan.to_prove.append(work)
    else:
        work.reason = problem
        plan.writes.append(work)


def _plan_metadata(plan):
    for name, commit in sorted(list_refs(plan.src_repo).items()):
        if commit != plan.commit:
            continue
        local_ref = os.path.join(plan.dest_repo, "refs", *name.split("/"))
        current = None
        try:
            with open_to_read(local_ref, follow=False) as handle:
                current = handle.read().decode("utf-8", "replace").strip()
        except OSError:
            pass            # missing, or not a regular file: the ref is written again (by rename)
        if current != commit:
            plan.refs[name] = commit
    listing = read_tree_listing(plan.src_repo, plan.commit)
    if listing is not None:
        wanted = tree_listing_for(listing, [e.path for e in plan.selected])
        local_tree = os.path.join(plan.dest_repo, "trees", plan.commit + ".json")
        current = None
        try:
            with open_to_read(local_tree, follow=False) as handle:
                current = handle.read()
        except OSError:
            pass
        if current != wanted:
            plan.tree_listing = wanted


def _plan_cleanup(plan, req):
    if not os.path.isdir(plan.dest_repo):
        return
    # Debris only where this run writes: another revision's snapshot is that revision's business.
    plan.debris = sorted(p for top in (os.path.join(plan.dest_repo, d) for d in ("blobs", "refs", "trees"))
                         for p in find_temp_debris(top)) + find_temp_debris(plan.snapshot) + find_temp_debris(
                             os.path.join(req.dest, lock_dir_rel(req.folder)))
    debris = set(plan.debris)
    wanted_paths = set(e.path for e in plan.selected)
    unwanted = [path for path, rel, is_dir in walk_tree(plan.snapshot) if not is_dir and rel not in wanted_paths]
    blobs_dir = os.path.join(plan.dest_repo, "blobs")
    if os.path.isdir(blobs_dir):
        keep = set(e.etag for e in plan.selected if e.etag) | _blobs_of_other_snapshots(plan.dest_repo, plan.commit)
        unwanted.extend(os.path.join(blobs_dir, name) for name in sorted(os.listdir(blobs_dir))
                        if name not in keep and os.path.join(blobs_dir, name) not in debris)
    unwanted = [p for p in unwanted if p not in debris]
    if req.prune:
        plan.prune = unwanted
    else:
        plan.stale = unwanted
        if unwanted:
            plan.warnings.append("%d local file(s) of %s are not part of the staged revision (e.g. %s); "
                                 "reclaim them with %s" % (len(unwanted), req.repo_id, unwanted[0],
                                                           fix_command("stage", req.host, "stage_prune=true")))
    plan.freed_bytes = sum(_freed_by_removal(p) for p in plan.prune + plan.debris)


def space_figures(plan, req):
    """The free-space figures of a plan (the module's `space`): free, reserve, need, reclaimable."""
    free, total = disk_space(existing_ancestor(req.dest))
    # need: file bytes; block rounding and metadata are what stage_reserve is for
    # Candidates in peer_dir are already on this disk and removed once copied (or rejected): see _count_candidates.
    return {"free": free, "reserve": parse_reserve(req.reserve, total),
            "need": plan.write_bytes - plan.peer_bytes + plan.peer_peak,
            "reclaimable": plan.freed_bytes, "peers": plan.peer_bytes, "peers_peak": plan.peer_peak}


def check_space(plan, req):
    """Refuse, before anything is written, a plan that would leave less than `reserve` free."""
    space = space_figures(plan, req)
    free, reserve, need = space["free"], space["reserve"], space["need"]
    available = free + plan.freed_bytes - reserve
    if need > available:
        raise StageError(
            "not enough space on %s to stage %s@%s: need %d bytes (%s) to copy, available %d bytes (%s) "
            "= free %s + reclaimable %s - reserve %s. Free space on the disk, narrow allow_patterns/"
            "ignore_patterns, or lower stage_reserve; nothing was written"
            % (req.dest, req.repo_id, plan.commit[:12], need, human_bytes(need), max(available, 0),
               human_bytes(max(available, 0)), human_bytes(free), human_bytes(plan.freed_bytes),
               human_bytes(reserve)))
    return space


def lock_dir_rel(folder):
    """`.locks/<repo folder>` below the local hub root: the repo lock and the progress file."""
    return ".locks/" + folder


class Outcome(object):
    """What applying a plan did, blob by blob, and which source problems it met."""

    def __init__(self):
        self.written = []          # Work items now under their final name
        self.nas_corrupt = []      # {path, paths, blob, nas_sha, local} for NAS blobs failing their name
        self.source_errors = []    # messages of other source problems (changed during the copy, unreadable)
        self.unavailable = set()   # snapshot paths with no good local content after this run
        self.applied = False       # apply_plan ran (else the run was refused before writing anything)
        self.from_peers = []       # Work items adopted (or copied) from a peer_dir candidate
        self.peer_rejected = []    # {blob, paths, why} of candidates that were not their blob

    @property
    def failed(self):
        return bool(self.nas_corrupt or self.source_errors)


def _rel(tree, path):
    return os.path.relpath(path, tree.root)


def _remove_local(tree, path):
    """Remove a file, a link (never its target) or a directory tree below the local hub root, through
    its parent directory opened without following any link."""
    with tree.open_dir(os.path.dirname(_rel(tree, path))) as parent:
        remove_path(os.path.basename(path), dir_fd=parent.fd, shown_as=path)


def _disk_error(error, what, req, plan, outcome, written=None):
    """A local write error turned into what the operator needs: file, disk, bytes needed and free.
    Still needed: the bytes to write less those already under their names (bytes read from a rejected
    candidate, or copied to a temp file that was removed, wrote nothing that stays)."""
    free, _total = disk_space(existing_ancestor(req.dest))
    still_needed = max(plan.write_bytes - sum(w.size for w in list(outcome.written)), 0)
    cause = {errno.ENOSPC: "the local disk is full", errno.EDQUOT: "the disk quota is exhausted",
             errno.EIO: "the local disk reported an I/O error", errno.EROFS: "the local disk is read-only"}.get(
                 error, "the local write failed")
    return StageError(
        "%s while writing %s%s: this run still needs %s (%d bytes) on %s, which has %s (%d bytes) free. %s; "
        "what is already staged is kept and re-used by the next run"
        % (cause, what, "" if written is None else " (%s of this file written; temp file removed)"
           % human_bytes(written), human_bytes(still_needed), still_needed, req.dest, human_bytes(free), free,
           "Free space on the disk or narrow the patterns, then re-run" if error in (errno.ENOSPC, errno.EDQUOT)
           else "Check the disk (dmesg, smartctl) before re-running"))


def _place(directory, work, meter, buf, outcome, peer=None):
    """Copy one Work item into `directory` with its name check; a NAS-side problem is recorded, not raised.
    A blob whose candidate in `peer` (peer_dir, open) hashes to its name while copied is copied from it
    instead (a new file, the candidate then removed), reading nothing from the NAS; a candidate that does
    not is removed, recorded in outcome.peer_rejected and the NAS copy is made as usual."""
    name = os.path.basename(work.final)
    meter.working_on(work.paths[0])
    if peer is not None and work.etag:
        try:
            if adopt_candidate(peer, directory, name, work.size, buf, meter.reader("copying", "local")):
                outcome.from_peers.append(work)
                outcome.written.append(work)
                meter.item_done("copying")
                return
        except CandidateRejected as exc:
            outcome.peer_rejected.append({"blob": work.etag, "paths": list(work.paths), "why": str(exc)})
    try:
        copy_verified(work.source, directory, name, work.size, blob_name=work.etag,
                      progress=meter.reader("copying", "nas"), buf=buf)
        outcome.written.append(work)
    except SourceProblem as problem:
        if work.etag is None or problem.got is None:
            outcome.source_errors.append(str(problem))
            outcome.unavailable.update(work.paths)
        else:
            outcome.nas_corrupt.append(_nas_corrupt_record(directory, work, problem, outcome, buf, meter))
    meter.item_done("copying")      # copied, or its NAS problem recorded: this file's work is over


def _nas_corrupt_record(directory, work, problem, outcome, buf, meter):
    """A NAS blob failed its name while copied: keep a local copy that passes it, remove one that does not."""
    name = os.path.basename(work.final)
    local = "absent"
    try:
        st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and \
            hash_as_named(work.final, work.etag, None, buf, meter.reader("copying", "local"))[0] == work.etag:
        local = "kept"
    elif st is not None:
        os.unlink(name, dir_fd=directory.fd)   # it has the name but not the bytes: never serve it
        local = "removed"
    if local != "kept":
        outcome.unavailable.update(work.paths)
    return nas_corrupt_record(work, problem.got, local, "its bytes hash to %s" % problem.got)


def _open_peer_dir(tree, req, plan):
    """peer_dir opened without following links, or None (none given, not there, no blob to copy)."""
    if not req.peer_dir or not plan.wanted_blobs:
        return None
    try:
        return tree.open_dir(peer_dir_rel(req))
    except FileNotFoundError:
        return None


def _write_blobs(tree, plan, req, meter, outcome):
    """Copies and repairs, `req.workers` in flight, biggest first; blobs before real snapshot files."""
    dirs = {}
    peer = None
    try:
        for work in plan.writes:
            parent = os.path.dirname(work.final)
            if parent not in dirs:
                dirs[parent] = tree.open_dir(_rel(tree, parent), create=True)
        peer = _open_peer_dir(tree, req, plan)

        def place(work, buf):
            try:
                _place(dirs[os.path.dirname(work.final)], work, meter, buf, outcome, peer)
            except LocalWriteError as exc:
                if exc.errno in DISK_ERRNOS:
                    raise _disk_error(exc.errno, exc.path, req, plan, outcome, exc.written)
                raise

        if plan.writes:
            meter.begin("copying")
        run_workers(sorted(plan.writes, key=lambda w: (w.etag is None, -w.size, w.final)), place, req.workers)
        for directory in dirs.values():
            try:
                fsync_dir(dir_fd=directory.fd)
            except OSError as exc:
                raise _disk_error(exc.errno, "the directory %s" % directory.path, req, plan, outcome)
    finally:
        for directory in dirs.values():
            directory.close()
        if peer is not None:
            peer.close()


def _write_links(tree, plan):
    """Snapshot links in one rename each; every directory that got links is fsynced before refs are written."""
    by_dir = {}
    for link, target in plan.links:
        by_dir.setdefault(os.path.dirname(link), []).append((os.path.basename(link), target))
    for parent in sorted(by_dir):
        with tree.open_dir(_rel(tree, parent), create=True) as directory:
            for name, target in by_dir[parent]:
                symlink_atomic(directory, name, target)
            fsync_dir(dir_fd=directory.fd)


def _write_small_file(tree, path, data):
    with tree.open_dir(_rel(tree, os.path.dirname(path)), create=True) as directory:
        atomic_write_bytes(os.path.basename(path), data, dir_fd=directory.fd)


def apply_plan(plan, req, outcome, meter=None):
    """Carry the plan out; debris and prune first so their space is free for the copies (`meter`
    counts them and feeds the progress file).

    Fills `outcome` as it goes (so a run that fails half-way still reports what it did). NAS-side problems of single blobs do not stop the other copies; while any
    selected path has no good local content, no link to it is written and refs/ and trees/ stay as
    they were, so no ref ever points at an incomplete snapshot.
    """
    tree = LocalTree(req.dest)
    meter = meter or PassMeter(req.phase, req.repo_id, req.verify)
    outcome.applied = True
    outcome.nas_corrupt.extend(plan.nas_corrupt)
    for path in plan.debris + plan.prune:
        _remove_local(tree, path)
    if plan.prune and os.path.isdir(plan.snapshot):
        with tree.open_dir(_rel(tree, plan.snapshot)) as snapshot:
            remove_empty_dirs(snapshot.fd, snapshot.path)
    _write_blobs(tree, plan, req, meter, outcome)
    # No link to content this run could not stage (nor an alias link to such a file).
    blocked = set(os.path.join(plan.snapshot, *p.split("/")) for p in outcome.unavailable)
    plan.links = [(link, target) for link, target in plan.links
                  if link not in blocked and os.path.normpath(os.path.join(os.path.dirname(link), target)) not in blocked]
    try:
        _write_links(tree, plan)
        if not outcome.unavailable:
            for name, commit in sorted(plan.refs.items()):
                _write_small_file(tree, os.path.join(plan.dest_repo, "refs", *name.split("/")),
                                  commit.encode("ascii"))
            if plan.tree_listing is not None:
                _write_small_file(tree, os.path.join(plan.dest_repo, "trees", plan.commit + ".json"),
                                  plan.tree_listing)
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise _disk_error(exc.errno, "the snapshot links, refs and tree listing of %s" % plan.snapshot,
                              req, plan, outcome)
        raise


def count_dangling(plan, dest_root):
    """Selected snapshot entries that do not resolve to a regular file on the local disk."""
    dest_real = os.path.realpath(dest_root)
    bad = []
    for entry in plan.selected:
        try:
            content_of(os.path.join(plan.snapshot, *entry.path.split("/")), dest_real)
        except StageError:
            bad.append(entry.path)
    return bad


def _count(number, what):
    return "%d %s%s" % (number, what, "" if number == 1 else "s")


def plan_headline(plan, check_mode):
    """'would copy 13 files, 47.9 GiB; would repair 1 file, 3.0 GiB; ...' (check mode) or 'copied ...':
    the plan in one line, sizes in binary units; '' when there is nothing to do."""
    verbs = ("would copy", "would repair", "would prune", "would remove", "would write") if check_mode else (
        "copied", "repaired", "pruned", "removed", "wrote")
    copies = [w for w in plan.writes if not w.is_repair]
    repairs = [w for w in plan.writes if w.is_repair]
    parts = []
    if copies:
        parts.append("%s %s, %s" % (verbs[0], _count(len(copies), "file"), human_bytes(sum(w.size for w in copies))))
    if repairs:
        parts.append("%s %s, %s" % (verbs[1], _count(len(repairs), "file"), human_bytes(sum(w.size for w in repairs))))
    if plan.prune:
        parts.append("%s %s (%s freed)" % (verbs[2], _count(len(plan.prune), "path"), human_bytes(plan.freed_bytes)))
    if plan.debris:
        parts.append("%s %s of killed runs" % (verbs[3], _count(len(plan.debris), "temp file")))
    metadata = []
    if plan.links:
        metadata.append(_count(len(plan.links), "snapshot link"))
    if plan.refs:
        metadata.append("ref%s %s" % ("" if len(plan.refs) == 1 else "s", ", ".join(sorted(plan.refs))))
    if plan.tree_listing is not None:
        metadata.append("the tree listing")
    if metadata:
        parts.append("%s %s" % (verbs[4], ", ".join(metadata)))
    return "; ".join(parts)


def describe_plan(plan, check_mode=False):
    """Human diff text, what --diff shows: the plan's headline, then one line per copy, repair, prune,
    ref and link (a link that comes with a copy is said by the copy's line)."""
    headline = plan_headline(plan, check_mode)
    if not headline:
        return ""
    lines = [headline]
    for path in plan.debris:
        lines.append("- remove temp debris %s" % path)
    for path in plan.prune:
        lines.append("- prune %s" % path)
    with_copies = set()
    for work in plan.writes:
        verb = "repair (%s)" % work.reason if work.is_repair else "copy"
        lines.append("+ %s %s (%s) for %s" % (verb, work.final, human_bytes(work.size), ", ".join(work.paths)))
        with_copies.update(os.path.join(plan.snapshot, *p.split("/")) for p in work.paths)
    for link, target in plan.links:
        if link not in with_copies:
            lines.append("+ link %s -> %s" % (link, target))
    for name, commit in sorted(plan.refs.items()):
        lines.append("+ ref %s = %s" % (name, commit))
    if plan.tree_listing is not None:
        lines.append("+ tree listing trees/%s.json" % plan.commit)
    return "\n".join(lines) + "\n"


def run_mirror(req, check_mode=False, progress=True):
    """Plan, check space, apply (unless check_mode) and return the module result.

    Raises StageError for bad input (nothing written), MirrorFailed (with the result) when some
    selected file could not be staged or a NAS blob fails its name, or when copy_missing is off and
    selected files have no local copy (nothing written). Under the repo lock the pass keeps the
    progress file (unless progress=False), which says how it ended: ok, failed or interrupted, and
    once it started writing, at its end (ok, failed or interrupted) removes peer_dir with what is left in
    it; a run refused before writing (bad input, require_match, space, files not staged; before or after
    taking the lock) leaves peer_dir alone.
    """
    started = time.monotonic()
    meter = PassMeter(req.phase, req.repo_id, req.verify)
    if check_mode:
        return _check_mode_run(req, started, meter)
    _refuse_before_locking(req, started, meter)
    tree = LocalTree(req.dest)
    with RepoLock(tree, lock_dir_rel(req.folder), req.lock_timeout, req.run_id, req.on_lock_wait):
        with tree.open_dir(lock_dir_rel(req.folder)) as lock_dir:
            if progress:
                meter.attach(lock_dir)
            writing = []        # set once the run starts writing: only then is peer_dir removed
            try:
                try:
                    result = _run_locked(tree, req, meter, started, writing)
                finally:
                    peer_problems = _clear_peer_dir(tree, req) if writing else []
            except KeyboardInterrupt as exc:
                meter.close("interrupted", "interrupted (%s)" % (str(exc) or "Ctrl-C"))
                raise
            except MirrorFailed as exc:
                exc.result["warnings"].extend(peer_problems)
                meter.close("failed", str(exc))
                raise
            except BaseException as exc:
                meter.close("failed", str(exc) or type(exc).__name__)
                raise
            result["warnings"].extend(peer_problems)
            meter.close("ok")
    return result


def _clear_peer_dir(tree, req):
    """Remove peer_dir (scratch) and what is left in it; the problems, as warnings. Never raises: it runs
    on the way out of a failed or interrupted run too."""
    if not req.peer_dir:
        return []
    try:
        return clear_peer_dir(tree, peer_dir_rel(req))
    except Exception as exc:  # pylint: disable=broad-except  # a clean-up problem must not hide the run's
        return ["peer_dir %s was not removed: %s" % (req.peer_dir, exc)]


def _run_locked(tree, req, meter, started, writing):
    """The locked run; `writing` gets an item when it starts writing. A refusal before that (bad input,
    require_match, space, files not staged) leaves peer_dir as it is: its message says nothing was
    written, and the next run uses or removes the candidates."""
    try:
        plan = plan_mirror(req, meter=meter)
    except NotStaged as exc:
        raise _refused(exc, req, meter, started)
    space = check_space(plan, req)
    writing.append(True)
    outcome = _apply_locked(tree, plan, req, space, started, meter)
    # A NAS blob stays suspect until a copy from the NAS proves its name: a green full verify reads no NAS byte.
    meter.suspects = remembered(meter.suspects, outcome.nas_corrupt,
                                [w.etag for w in outcome.written if w not in outcome.from_peers], utc_text(time.time()))
    dangling = count_dangling(plan, req.dest)
    result = _result(plan, req, outcome, space, dangling, started, meter)
    if outcome.failed:
        raise MirrorFailed(_failure_text(req, plan, outcome), with_report(result, req, failed=True))
    if dangling:
        raise MirrorFailed("after staging, %d file(s) of %s still do not resolve to local files (e.g. %s): "
                           "the local disk changed under the run; re-run" % (len(dangling), req.repo_id, dangling[0]),
                           with_report(result, req, failed=True))
    return with_report(result, req)


def _check_mode_run(req, started, meter):
    """What the run would do, changing nothing; NAS blobs already known to fail their names fail it, as
    the real run would, and so do files not staged when copy_missing is off."""
    try:
        plan = plan_mirror(req, check_mode=True, meter=meter)
    except NotStaged as exc:
        raise _refused(exc, req, meter, started, check_mode=True)
    result = _result(plan, req, None, check_space(plan, req), [], started, meter)
    if plan.nas_corrupt:
        outcome = Outcome()
        outcome.nas_corrupt.extend(plan.nas_corrupt)
        raise MirrorFailed(_failure_text(req, plan, outcome), with_report(result, req, check_mode=True, failed=True))
    return with_report(result, req, check_mode=True)


def _refused(exc, req, meter, started, check_mode=False):
    """MirrorFailed for a NotStaged refusal: the result of a run that did nothing, the paths unstaged."""
    outcome = Outcome()
    outcome.unavailable.update(exc.paths)
    result = _result(exc.plan, req, outcome, space_figures(exc.plan, req), [], started, meter)
    return MirrorFailed(str(exc), with_report(result, req, check_mode=check_mode, failed=True))


def _refuse_before_locking(req, started, meter):
    """Bad input, files not staged (copy_missing off) and a disk that cannot even hold the missing files
    are refused before the lock file is created: a read-only pass that stats but reads no content
    (verify none; what it reads to judge a copy of the wrong size counts in meter's bytes read)."""
    quick = copy.copy(req)
    quick.verify = "none"
    quick_meter = PassMeter(req.phase, req.repo_id, quick.verify)
    try:
        preflight = plan_mirror(quick, meter=quick_meter)
    except NotStaged as exc:
        preflight = exc
    except OSError:  # a run holding the lock changed the local copy under us: the locked plan decides
        preflight = None
    meter.add_reads(quick_meter)
    if isinstance(preflight, NotStaged):
        raise _refused(preflight, req, meter, started)
    if preflight is not None:
        check_space(preflight, quick)


def _apply_locked(tree, plan, req, space, started, meter):
    """apply_plan under the repo lock; a full or failing disk stops the run, saying what was done and found."""
    outcome = Outcome()
    try:
        apply_plan(plan, req, outcome, meter)
    except StageError as exc:
        found = _failure_text(req, plan, outcome)
        raise MirrorFailed("%s%s" % (exc, "; also: " + found if found else ""),
                           with_report(_result(plan, req, outcome, space, [], started, meter), req, failed=True))
    return outcome


REPORT_KEYS = ("commit", "snapshot", "files", "blobs", "bytes_copied", "bytes_staged", "bytes_read", "duration_s",
               "verify", "phase", "changed", "repaired_paths", "repairs", "pruned", "excluded_paths", "nas_corrupt",
               "unstaged_paths", "bytes_from_nas", "bytes_from_peers")


def with_report(result, req, check_mode=False, failed=False):
    """Add `report`: this repo's row of the host report, shaped here so the role only passes it on."""
    row = dict((key, result[key]) for key in REPORT_KEYS)
    row.update(repo_id=req.repo_id, repo_type=req.repo_type, revision=req.revision, check_mode=check_mode,
               status="failed" if failed else ("check" if check_mode else "ok"),
               peer_rejected=len(result["peer_rejected"]))
    result["report"] = row
    result["summary"] = summary_line(result, req, check_mode, failed)
    return result


def summary_line(result, req, check_mode, failed):
    """One line for the operator: what the pass did (or would do: 'would copy N files, X GiB'), what it
    found already right, what it read on each side, how long it took."""
    blobs, real = result["blobs"], result["real_files"]
    copied, repaired = blobs["copied"] + real["copied"], blobs["repaired"] + real["repaired"]
    repaired_bytes = sum(r["size"] for r in result["repairs"])
    would = "would " if check_mode else ""
    parts = []
    if copied or req.phase == "stage":
        parts.append("%s%s %s, %s" % (would, "copy" if check_mode else "copied", _count(copied, "file"),
                                      human_bytes(result["bytes_copied"] - repaired_bytes)))
    peers = []
    if result["bytes_from_peers"]:
        peers.append("%s from peers" % human_bytes(result["bytes_from_peers"]))
    if result["peer_rejected"]:
        peers.append("%s rejected" % _count(len(result["peer_rejected"]), "peer blob"))
    if peers:
        parts[-1:] = [", ".join(parts[-1:] + peers)]
    if repaired or req.phase == "verify":
        parts.append("%s%s %s, %s" % (would, "repair" if check_mode else "repaired", _count(repaired, "file"),
                                      human_bytes(repaired_bytes)))
    if blobs["reused"]:
        parts.append("%d blob(s) %s" % (blobs["reused"], "already local (sizes checked)" if req.verify == "none"
                                        else "proven by content (verify=%s) and kept" % req.verify))
    if req.require_match:
        parts.append("stages %s and %s (%s)" % (_count(result["files"]["shared"], "shared file"),
                                                _count(result["files"]["rank"], "rank file"),
                                                ", ".join(req.require_match)))
    if result["files"]["excluded"]:
        parts.append("%d file(s) left on the NAS" % result["files"]["excluded"])
    read = result["bytes_read"]
    text = "%s@%s %s pass%s: %s; read %s local + %s NAS in %.1f s" % (
        req.repo_id, (result["commit"] or "")[:12], req.phase, " (check mode)" if check_mode else "",
        "; ".join(parts), human_bytes(read["local"]), human_bytes(read["nas"]), result["duration_s"])
    if not check_mode and result["duration_s"] >= 0.1 and read["local"] + read["nas"]:
        text += " (%.1f MiB/s)" % ((read["local"] + read["nas"]) / 1048576.0 / result["duration_s"])
    return text + ("; FAILED" if failed else "")


def _failure_text(req, plan, outcome):
    local_words = {"kept": "the local copy was kept: it hashes to its name",
                   "removed": "the local copy did not hash to its name either and was removed",
                   "absent": "nothing was staged under that name"}
    parts = ["%s (blobs/%s): %s on the NAS (%s); %s"
             % (r["path"], r["blob"], r["why"], r["nas_source"], local_words[r["local"]])
             for r in outcome.nas_corrupt]
    text = ""
    if parts:
        text = ("%d NAS blob(s) of %s@%s do not hold the bytes their names say: %s. Re-download them on the NAS, "
                "then re-run"
                % (len(parts), req.repo_id, plan.commit[:12], "; ".join(parts)))
    if outcome.source_errors:
        text += ("; " if text else "") + "; ".join(outcome.source_errors)
    if outcome.unavailable:
        text += ("; %d snapshot path(s) are not staged, so refs/ and trees/ were left as they were"
                 % len(outcome.unavailable))
    return text


REPAIR_WORDS = {"size": "its size differs from the NAS copy's", "content": "it failed its content check",
                "link": "it was a symlink, not a local copy", "not-a-file": "it was not a regular file"}


def repair_record(work):
    """One `repairs` entry: a present local file that was wrong (or, in check mode, would be replaced)."""
    return {"path": work.paths[0], "paths": list(work.paths), "blob": work.etag, "reason": work.reason,
            "local_hash": work.local_hash, "size": work.size}


def repair_warning(record, req, check_mode, from_peer=False):
    """The module warning of one repair: snapshot path, blob name, what the local bytes hashed to."""
    what = "blobs/%s" % record["blob"] if record["blob"] else "a real snapshot file, compared by sha256"
    hashed = "; the local bytes hashed to %s%s" % ("" if record["blob"] else "sha256 ", record["local_hash"]) \
        if record["local_hash"] else ""
    return "%s %s (%s) of %s: %s (%s pass, verify=%s)%s; %s" % (
        "would repair" if check_mode else "repaired", record["path"], what, req.repo_id,
        REPAIR_WORDS.get(record["reason"], record["reason"]), req.phase, req.verify, hashed,
        "a real run replaces it with a verified NAS copy" if check_mode
        else "replaced by a peer copy verified against its name" if from_peer
        else "replaced by a NAS copy verified against its name" if record["blob"] else "replaced by the NAS copy")


def peer_warning(record, req):
    """The module warning of one rejected peer_dir candidate (a copy damaged in transit, or not a file)."""
    return "peer_dir candidate blobs/%s of %s (%s) was not adopted: %s; it was fetched from the NAS instead" % (
        record["blob"], req.repo_id, name_some(record["paths"]), record["why"])


def _done(plan, outcome):
    """(written Work items, links, refs, prune, debris, tree listing written): what the plan would do
    (outcome None), did, or nothing (a refused run)."""
    if outcome is None:
        return plan.writes, plan.links, sorted(plan.refs), plan.prune, plan.debris, plan.tree_listing is not None
    if not outcome.applied:
        return [], [], [], [], [], False
    complete = not outcome.unavailable
    return (outcome.written, plan.links, sorted(plan.refs) if complete else [], plan.prune, plan.debris,
            plan.tree_listing is not None and complete)


def _result(plan, req, outcome, space, dangling, started, meter):
    """The module result; in check mode (outcome None) what the plan would do."""
    done, links, refs_written, pruned, debris, listing = _done(plan, outcome)
    nas_corrupt = plan.nas_corrupt if outcome is None else outcome.nas_corrupt
    repairs = [repair_record(w) for w in done if w.is_repair]
    check_mode = outcome is None
    # In check mode the candidates of the right size stand for what would come from peers (not hashed).
    from_peers = plan.peer_bytes if check_mode else sum(w.size for w in outcome.from_peers)
    peer_blobs = set() if check_mode else set(w.etag for w in outcome.from_peers)
    bytes_copied = sum(w.size for w in done)
    return {
        "changed": bool(done or links or refs_written or pruned or debris or listing
                        or any(r["local"] == "removed" for r in nas_corrupt)),
        "commit": plan.commit,
        "snapshot": plan.snapshot,
        "files": {"total": len(plan.entries), "local": len(plan.selected), "excluded": len(plan.excluded),
                  "dangling": len(dangling), "rank": plan.rank_files, "shared": len(plan.selected) - plan.rank_files},
        "blobs": {"copied": len([w for w in done if w.etag and not w.is_repair]), "reused": plan.blobs_reused,
                  "repaired": len([w for w in done if w.etag and w.is_repair])},
        "real_files": {"copied": len([w for w in done if not w.etag and not w.is_repair]),
                       "repaired": len([w for w in done if not w.etag and w.is_repair])},
        "repaired_paths": sorted(p for w in done if w.is_repair for p in w.paths),
        "repairs": repairs,
        "links_written": len(links),
        "refs_written": refs_written,
        "bytes_copied": bytes_copied,
        "bytes_from_nas": bytes_copied - from_peers,
        "bytes_from_peers": from_peers,
        "peer_rejected": [] if check_mode else list(outcome.peer_rejected),
        "wanted_blobs": plan.wanted_blobs,
        "source_snapshot": source_snapshot(plan),
        "bytes_staged": sum(e.size for e in plan.selected),
        "bytes_read": meter.bytes_read(),
        "excluded_paths": [e.path for e in plan.excluded],
        "pruned": pruned,
        "stale_paths": plan.stale,
        "debris_removed": debris,
        "nas_corrupt": sorted(p for r in nas_corrupt for p in r["paths"]),
        "nas_corrupt_blobs": nas_corrupt,
        "unstaged_paths": [] if outcome is None else sorted(outcome.unavailable),
        "verify": req.verify,
        "phase": req.phase,
        "copy_missing": req.copy_missing,
        "progress_file": os.path.join(req.dest, lock_dir_rel(req.folder), PROGRESS_NAME),
        "space": space,
        "duration_s": round(time.monotonic() - started, 3),
        "warnings": plan.warnings + [repair_warning(r, req, check_mode, r["blob"] in peer_blobs) for r in repairs]
        + [peer_warning(r, req) for r in ([] if check_mode else outcome.peer_rejected)],
        "diff_text": describe_plan(plan, check_mode) if outcome is None or outcome.applied else "",
    }
