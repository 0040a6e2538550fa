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
import json
import os
import posixpath
import re
import stat
import threading
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import (TEMP_PREFIX, atomic_write_bytes, fsync_dir, is_temp_name, is_within,
                                             remove_path, walk_tree)
from ansible.module_utils.dgx_hashing import (file_matches_name, file_matches_own_name, file_sha256, name_is_hash,
                                              samples_match)
from ansible.module_utils.dgx_hubcache import (blob_link_target, content_of, list_refs, read_tree_listing,
                                               repo_folder_name, resolve_commit, scan_snapshot, path_selected,
                                               tree_listing_for, unmatched_patterns)
from ansible.module_utils.dgx_transfer import (DISK_ERRNOS, LocalTree, LocalWriteError, RepoLock, SourceProblem,
                                               copy_verified, default_workers, find_temp_debris, run_workers,
                                               symlink_atomic)

VERIFY_MODES = ("sample", "full", "none")
MAX_WORKERS_PARAM = 32
SIZE_SUFFIXES = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


class MirrorRequest(object):
    """The module's parameters, validated once."""

    def __init__(self, src, dest, repo_id, repo_type="model", revision="main", allow_patterns=None,
                 ignore_patterns=None, verify="sample", reserve="2%", prune=False, lock_timeout=60, workers=None):
        if verify not in VERIFY_MODES:
            raise StageError("verify must be one of %s, not %r" % (", ".join(VERIFY_MODES), verify))
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


class MirrorFailed(StageError):
    """The run could not stage everything; `result` holds what it did and what is wrong (nas_corrupt)."""

    def __init__(self, message, result):
        StageError.__init__(self, message)
        self.result = result


class Work(object):
    """One file to write: a blob under blobs/ or a real file inside the snapshot."""

    __slots__ = ("final", "source", "size", "etag", "reason", "paths")

    def __init__(self, final, source, size, etag, reason, paths):
        self.final, self.source, self.size, self.etag, self.reason, self.paths = (
            final, source, size, etag, reason, paths)

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
        self.warnings = []

    @property
    def write_bytes(self):
        return sum(w.size for w in self.writes)

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


def human_bytes(count):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return ("%d %s" % (count, unit)) if unit == "B" else ("%.1f %s" % (count, unit))
        count /= 1024.0


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


def content_matches(work, verify, buf):
    """Prove one present file: sampled raw compare with the NAS (sample), or every byte against the
    blob's name (full; a real snapshot file has no name and is compared with the NAS by sha256)."""
    if verify == "sample":
        return samples_match(work.final, work.source, work.size)
    if work.etag:
        return file_matches_name(work.final, work.etag, work.size, buf)
    return file_sha256(work.final, buf) == file_sha256(work.source, buf)


def prove_present(plan, req):
    """Content checks of every present file, `req.workers` at a time.

    A file that fails becomes a repair. A blob whose local copy disagrees with the NAS (sampled bytes,
    or size) is first hashed against its own name: when the local copy passes, the NAS copy is the
    corrupt one; it is reported in `nas_corrupt` and the good local copy is kept, in check mode too.
    """
    verdicts = {}        # id(work) -> content_verdict(); dict writes are atomic across workers

    def prove(work, buf):
        verdicts[id(work)] = content_verdict(work, req.verify, buf)

    run_workers(sorted(plan.to_prove, key=lambda w: -w.size), prove, req.workers)
    for work in plan.to_prove:
        verdict = verdicts[id(work)]
        if verdict in ("missing", "size", "content"):
            work.reason = verdict
            plan.writes.append(work)
        elif verdict == "nas-corrupt":
            plan.nas_corrupt.append(nas_corrupt_record(work, None, "kept", _disagreement(work, req)))
        elif work.etag:
            plan.blobs_reused += 1


def content_verdict(work, verify, buf):
    """"ok", "nas-corrupt" (the local copy passes its name, the NAS disagrees) or why to repair it."""
    try:
        if work.reason != "size" and (verify == "none" or content_matches(work, verify, buf)):
            return "ok"
        if work.etag and not (verify == "full" and work.reason != "size") and \
                file_matches_own_name(work.final, work.etag, buf):
            return "nas-corrupt"
        return work.reason
    except FileNotFoundError:     # removed under us (not by a dgx-stage run: we hold the lock)
        return "missing"


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


def plan_mirror(req, check_mode=False):
    """Read the source and the local copy and decide every action. Writes nothing."""
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
    plan.commit = resolve_commit(plan.src_repo, req.revision)
    plan.entries = scan_snapshot(plan.src_repo, plan.commit, req.src, strict=False)
    if not plan.entries:
        raise StageError("snapshot %s of %s is empty on the NAS" % (plan.commit, req.repo_id))
    plan.selected = [e for e in plan.entries if path_selected(e.path, req.allow_patterns, req.ignore_patterns)]
    plan.excluded = [e for e in plan.entries if not path_selected(e.path, req.allow_patterns, req.ignore_patterns)]
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
    refuse_linked_local_dirs(req, plan.commit)
    _refuse_in_the_way(plan)
    _plan_files(plan, req)
    _plan_metadata(plan)
    _plan_cleanup(plan, req)
    return plan


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


def refuse_linked_local_dirs(req, commit):
    """Every directory the run may write or remove in must be a real directory inside dest (check
    mode too): a symlinked repo folder, blobs/, snapshot or lock dir is refused, naming the link."""
    if not os.path.isdir(req.dest):
        return
    tree = LocalTree(req.dest)
    folder = req.folder
    tree.refuse_links([folder + "/blobs", folder + "/trees", ".locks/" + folder])
    for rel in (folder + "/snapshots/" + commit, folder + "/refs"):
        tree.refuse_links_below(rel)


def alias_link_text(path, alias_of):
    """Relative link text from snapshot path `path` to snapshot path `alias_of`."""
    return posixpath.relpath(alias_of, posixpath.dirname(path) or ".")


def _plan_files(plan, req):
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
    prove_present(plan, req)


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
        if os.path.isfile(local_ref):
            with open(local_ref) as handle:
                current = handle.read().strip()
        if current != commit:
            plan.refs[name] = commit
    listing = read_tree_listing(plan.src_repo, plan.commit)
    if listing is not None:
        wanted = tree_listing_for(listing, [e.path for e in plan.selected])
        local_tree = os.path.join(plan.dest_repo, "trees", plan.commit + ".json")
        current = None
        if os.path.isfile(local_tree):
            with open(local_tree, "rb") as handle:
                current = handle.read()
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
                                 "set prune: true to reclaim them" % (len(unwanted), req.repo_id, unwanted[0]))
    plan.freed_bytes = sum(_freed_by_removal(p) for p in plan.prune + plan.debris)


def check_space(plan, req):
    """Refuse, before anything is written, a plan that would leave less than `reserve` free."""
    free, total = disk_space(existing_ancestor(req.dest))
    reserve = parse_reserve(req.reserve, total)
    need = plan.write_bytes   # file bytes; block rounding and metadata are what stage_reserve is for
    available = free + plan.freed_bytes - reserve
    if need > available:
        raise StageError(
            "not enough space on %s to stage %s@%s: need %d bytes (%s) to copy, available %d bytes (%s) "
            "= free %s + reclaimable %s - reserve %s. Free space on the disk, narrow allow_patterns/"
            "ignore_patterns, or lower stage_reserve; nothing was written"
            % (req.dest, req.repo_id, plan.commit[:12], need, human_bytes(need), max(available, 0),
               human_bytes(max(available, 0)), human_bytes(free), human_bytes(plan.freed_bytes),
               human_bytes(reserve)))
    return {"free": free, "reserve": reserve, "need": need, "reclaimable": plan.freed_bytes}


PROGRESS_NAME = "dgx-stage.progress.json"


def lock_dir_rel(folder):
    """`.locks/<repo folder>` below the local hub root: the repo lock and the progress file."""
    return ".locks/" + folder


class Progress(object):
    """Throttled progress file next to the repo lock, for operators watching a long copy."""

    def __init__(self, lock_dir, total, label):
        self.lock_dir, self.total, self.label = lock_dir, total, label
        self.done = 0
        self.started = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()    # workers report concurrently

    def __call__(self, count):
        with self._lock:
            self.done += count
            now = time.monotonic()
            if self.lock_dir is None or now - self._last < 2.0:
                return
            self._last = now
            self.write(finished=False)

    def write(self, finished):
        if self.lock_dir is None:
            return
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        state = {"repo": self.label, "bytes_done": self.done, "bytes_total": self.total,
                 "mib_per_s": round(rate / 1048576, 1), "elapsed_s": round(elapsed, 1),
                 "eta_s": round((self.total - self.done) / rate, 1) if rate and not finished else 0,
                 "finished": finished}
        try:
            atomic_write_bytes(PROGRESS_NAME, json.dumps(state).encode("utf-8"), dir_fd=self.lock_dir.fd)
        except OSError:
            pass   # the progress file is for watching; a full or failing disk is reported by the copy itself


class Outcome(object):
    """What applying a plan did, blob by blob, and which source problems it met."""

    def __init__(self):
        self.written = []          # Work items now under their final name
        self.nas_corrupt = []      # {path, paths, blob, nas_sha, local} for NAS blobs failing their name
        self.source_errors = []    # messages of other source problems (changed during the copy, unreadable)
        self.unavailable = set()   # snapshot paths with no good local content after this run

    @property
    def failed(self):
        return bool(self.nas_corrupt or self.source_errors)


def _rel(tree, path):
    return os.path.relpath(path, tree.root)


def _remove_local(tree, path):
    """Remove a file, a link (never its target) or a directory tree below the local hub root, through
    its parent directory opened without following any link."""
    with tree.open_dir(os.path.dirname(_rel(tree, path))) as parent:
        remove_path(os.path.basename(path), dir_fd=parent.fd)


def _remove_empty_dirs(top):
    """Remove the empty directories below top, deepest first (a parent emptied by that goes too)."""
    for path, _rel, is_dir in reversed(list(walk_tree(top))):
        if is_dir and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)


def _disk_error(error, what, req, plan, progress, written=None):
    """A local write error turned into what the operator needs: file, disk, bytes needed and free."""
    free, _total = disk_space(existing_ancestor(req.dest))
    still_needed = max(plan.write_bytes - progress.done, 0)
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


def _place(directory, work, progress, buf, outcome):
    """Copy one Work item into `directory` with its name check; a NAS-side problem is recorded, not raised."""
    name = os.path.basename(work.final)
    try:
        copy_verified(work.source, directory, name, work.size, blob_name=work.etag, progress=progress, buf=buf)
        outcome.written.append(work)
    except SourceProblem as problem:
        if work.etag is None or problem.got is None:
            outcome.source_errors.append(str(problem))
            outcome.unavailable.update(work.paths)
            return
        outcome.nas_corrupt.append(_nas_corrupt_record(directory, work, problem, outcome, buf))


def _nas_corrupt_record(directory, work, problem, outcome, buf):
    """A NAS blob failed its name while copied: keep a local copy that passes it, remove one that does not."""
    name = os.path.basename(work.final)
    local = "absent"
    try:
        st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and file_matches_own_name(work.final, work.etag, buf):
        local = "kept"
    elif st is not None:
        os.unlink(name, dir_fd=directory.fd)   # it has the name but not the bytes: never serve it
        local = "removed"
    if local != "kept":
        outcome.unavailable.update(work.paths)
    return nas_corrupt_record(work, problem.got, local, "its bytes hash to %s" % problem.got)


def _write_blobs(tree, plan, req, progress, outcome):
    """Copies and repairs, `req.workers` in flight, biggest first; blobs before real snapshot files."""
    dirs = {}
    try:
        for work in plan.writes:
            parent = os.path.dirname(work.final)
            if parent not in dirs:
                dirs[parent] = tree.open_dir(_rel(tree, parent), create=True)

        def place(work, buf):
            try:
                _place(dirs[os.path.dirname(work.final)], work, progress, buf, outcome)
            except LocalWriteError as exc:
                if exc.errno in DISK_ERRNOS:
                    raise _disk_error(exc.errno, exc.path, req, plan, progress, exc.written)
                raise

        run_workers(sorted(plan.writes, key=lambda w: (w.etag is None, -w.size, w.final)), place, req.workers)
        for directory in dirs.values():
            try:
                fsync_dir(dir_fd=directory.fd)
            except OSError as exc:
                raise _disk_error(exc.errno, "the directory %s" % directory.path, req, plan, progress)
    finally:
        for directory in dirs.values():
            directory.close()


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


def apply_plan(plan, req, outcome, progress_dir=None):
    """Carry the plan out; debris and prune first so their space is free for the copies.

    Fills `outcome` as it goes (so a run that fails half-way still reports what it did). NAS-side problems of single blobs do not stop the other copies; while any
    selected path has no good local content, no link to it is written and refs/ and trees/ stay as
    they were, so no ref ever points at an incomplete snapshot.
    """
    tree = LocalTree(req.dest)
    outcome.nas_corrupt.extend(plan.nas_corrupt)
    for path in plan.debris + plan.prune:
        _remove_local(tree, path)
    if plan.prune and os.path.isdir(plan.snapshot):
        _remove_empty_dirs(plan.snapshot)
    progress = Progress(progress_dir, plan.write_bytes, "%s@%s" % (req.repo_id, plan.commit[:12]))
    _write_blobs(tree, plan, req, progress, outcome)
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
                              req, plan, progress)
        raise
    progress.write(finished=True)


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


def describe_plan(plan):
    """Human diff text: one line per action, what check/diff mode shows."""
    lines = []
    for path in plan.debris:
        lines.append("- remove temp debris %s" % path)
    for path in plan.prune:
        lines.append("- prune %s" % path)
    for work in plan.writes:
        verb = "repair (%s)" % work.reason if work.is_repair else "copy"
        lines.append("+ %s %s (%s) for %s" % (verb, work.final, human_bytes(work.size), ", ".join(work.paths)))
    for link, target in plan.links:
        lines.append("+ link %s -> %s" % (link, target))
    for name, commit in sorted(plan.refs.items()):
        lines.append("+ ref %s = %s" % (name, commit))
    if plan.tree_listing is not None:
        lines.append("+ tree listing trees/%s.json" % plan.commit)
    return "\n".join(lines) + ("\n" if lines else "")


def run_mirror(req, check_mode=False, progress=True):
    """Plan, check space, apply (unless check_mode) and return the module result.

    Raises StageError for bad input (nothing written), MirrorFailed (with the result) when some
    selected file could not be staged or a NAS blob fails its name.
    """
    started = time.monotonic()
    if check_mode:
        return _check_mode_run(req, started)
    _refuse_before_locking(req)
    tree = LocalTree(req.dest)
    with RepoLock(tree, lock_dir_rel(req.folder), req.lock_timeout):
        plan = plan_mirror(req)
        space = check_space(plan, req)
        outcome = _apply_locked(tree, plan, req, space, started, progress)
        dangling = count_dangling(plan, req.dest)
    result = _result(plan, req, outcome, space, dangling, started)
    if outcome.failed:
        raise MirrorFailed(_failure_text(req, plan, outcome), with_report(result, req, failed=True))
    if dangling:
        raise MirrorFailed("after staging, %d file(s) of %s still do not resolve to local files (e.g. %s): "
                           "the local disk changed under the run; re-run" % (len(dangling), req.repo_id, dangling[0]),
                           with_report(result, req, failed=True))
    return with_report(result, req)


def _check_mode_run(req, started):
    """What the run would do, changing nothing; NAS blobs already known to fail their names fail it, as
    the real run would."""
    plan = plan_mirror(req, check_mode=True)
    result = _result(plan, req, None, check_space(plan, req), [], started)
    if plan.nas_corrupt:
        outcome = Outcome()
        outcome.nas_corrupt.extend(plan.nas_corrupt)
        raise MirrorFailed(_failure_text(req, plan, outcome), with_report(result, req, check_mode=True, failed=True))
    return with_report(result, req, check_mode=True)


def _refuse_before_locking(req):
    """Bad input and a disk that cannot even hold the missing files are refused before the lock file
    is created: a read-only pass that stats but reads no content (verify none)."""
    quick = copy.copy(req)
    quick.verify = "none"
    try:
        preflight = plan_mirror(quick)
    except OSError:  # a run holding the lock changed the local copy under us: the locked plan decides
        return
    check_space(preflight, quick)


def _apply_locked(tree, plan, req, space, started, progress):
    """apply_plan under the repo lock; a full or failing disk stops the run, saying what was done and found."""
    outcome = Outcome()
    try:
        with tree.open_dir(lock_dir_rel(req.folder)) as lock_dir:
            apply_plan(plan, req, outcome, lock_dir if progress else None)
    except StageError as exc:
        found = _failure_text(req, plan, outcome)
        raise MirrorFailed("%s%s" % (exc, "; also: " + found if found else ""),
                           with_report(_result(plan, req, outcome, space, [], started), req, failed=True))
    return outcome


REPORT_KEYS = ("commit", "snapshot", "files", "blobs", "bytes_copied", "bytes_staged", "duration_s", "verify",
               "changed", "repaired_paths", "pruned", "excluded_paths", "nas_corrupt", "unstaged_paths")


def with_report(result, req, check_mode=False, failed=False):
    """Add `report`: this repo's row of the host report, shaped here so the role only passes it on."""
    row = dict((key, result[key]) for key in REPORT_KEYS)
    row.update(repo_id=req.repo_id, revision=req.revision, check_mode=check_mode,
               status="failed" if failed else ("check" if check_mode else "ok"))
    result["report"] = row
    return result


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


def _result(plan, req, outcome, space, dangling, started):
    """The module result; in check mode (outcome None) what the plan would do."""
    done = plan.writes if outcome is None else outcome.written
    refs_written = sorted(plan.refs) if outcome is None or not outcome.unavailable else []
    nas_corrupt = plan.nas_corrupt if outcome is None else outcome.nas_corrupt
    return {
        "changed": plan.changes if outcome is None else bool(
            outcome.written or plan.links or refs_written or plan.prune or plan.debris
            or (plan.tree_listing is not None and not outcome.unavailable)
            or any(r["local"] == "removed" for r in nas_corrupt)),
        "commit": plan.commit,
        "snapshot": plan.snapshot,
        "files": {"total": len(plan.entries), "local": len(plan.selected), "excluded": len(plan.excluded),
                  "dangling": len(dangling)},
        "blobs": {"copied": len([w for w in done if w.etag and not w.is_repair]), "reused": plan.blobs_reused,
                  "repaired": len([w for w in done if w.etag and w.is_repair])},
        "real_files": {"copied": len([w for w in done if not w.etag and not w.is_repair]),
                       "repaired": len([w for w in done if not w.etag and w.is_repair])},
        "repaired_paths": sorted(p for w in done if w.is_repair for p in w.paths),
        "links_written": len(plan.links),
        "refs_written": refs_written,
        "bytes_copied": sum(w.size for w in done),
        "bytes_staged": sum(e.size for e in plan.selected),
        "excluded_paths": [e.path for e in plan.excluded],
        "pruned": plan.prune,
        "stale_paths": plan.stale,
        "debris_removed": plan.debris,
        "nas_corrupt": sorted(p for r in nas_corrupt for p in r["paths"]),
        "nas_corrupt_blobs": nas_corrupt,
        "unstaged_paths": [] if outcome is None else sorted(outcome.unavailable),
        "verify": req.verify,
        "space": space,
        "duration_s": round(time.monotonic() - started, 3),
        "warnings": plan.warnings,
        "diff_text": describe_plan(plan),
    }
