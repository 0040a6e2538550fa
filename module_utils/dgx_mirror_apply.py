"""Applying a plan in a crash-safe order (debris and prune, blobs, snapshot links, then refs and the tree listing):
a killed run never leaves a ref to an incomplete snapshot or a torn file under a final name.
"""
import contextlib
import errno
import os
import stat

from ansible.module_utils.dgx_copy import (DISK_ERRNOS, CandidateRejected, LocalWriteError, SourceProblem,
                                           adopt_candidate, copy_verified)
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import atomic_write_bytes, remove_empty_dirs, remove_path
from ansible.module_utils.dgx_hashing import hash_as_named
from ansible.module_utils.dgx_hubcache import content_of
from ansible.module_utils.dgx_localtree import LocalTree, symlink_atomic
from ansible.module_utils.dgx_mirror_plan import nas_corrupt_record
from ansible.module_utils.dgx_progress_file import PassMeter
from ansible.module_utils.dgx_space import disk_space, existing_ancestor
from ansible.module_utils.dgx_units import human_bytes
from ansible.module_utils.dgx_workers import run_workers


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


def _remove_local(tree, path):
    """Remove a path below the local hub root through its parent opened without following any link."""
    with tree.open_dir(os.path.dirname(path)) as parent:
        remove_path(os.path.basename(path), dir_fd=parent.fd, shown_as=path)


def _disk_error(error, what, req, plan, outcome, written=None):
    """A local write error with the file, the disk, the bytes still needed and the bytes free."""
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
    """Copy one Work item from its peer candidate if that proves its name, else from the NAS; problems recorded."""
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
    """A NAS blob failed its name while copied: keep a local copy that passes it, remove one that does not. The copy
    is read through the directory the run holds open, as it is removed: its path may lead elsewhere by now."""
    name = os.path.basename(work.final)
    local = "absent"
    try:
        st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and \
            hash_as_named(name, work.etag, st.st_size, buf, meter.reader("copying", "local"),
                          dir_fd=directory.fd)[0] == work.etag:
        local = "kept"
    elif st is not None:
        os.unlink(name, dir_fd=directory.fd)   # it has the name but not the bytes: never serve it
        local = "removed"
    if local != "kept":
        outcome.unavailable.update(work.paths)
    return nas_corrupt_record(work, problem.got, local, "its bytes hash to %s" % problem.got)


def _write_blobs(tree, plan, req, meter, outcome):
    """Copies and repairs, `req.workers` in flight, biggest first; blobs before real snapshot files."""
    with contextlib.ExitStack() as opened:
        dirs = dict((parent, opened.enter_context(tree.open_dir(parent, create=True)))
                    for parent in dict.fromkeys(os.path.dirname(w.final) for w in plan.writes))
        peer = None
        if req.peer_dir and plan.wanted_blobs:
            with contextlib.suppress(FileNotFoundError):
                peer = opened.enter_context(tree.open_dir(req.peer_dir))

        def place(work, buf):
            try:
                _place(dirs[os.path.dirname(work.final)], work, meter, buf, outcome, peer)
            except LocalWriteError as exc:
                if exc.errno in DISK_ERRNOS:
                    raise _disk_error(exc.errno, exc.path, req, plan, outcome, exc.written)
                raise

        if plan.writes:
            meter.begin("copying")
        run_workers(sorted(plan.writes, key=lambda w: (w.etag is None, -w.size, w.final)), place, req.workers,
                    req.read_cap)
        for directory in dirs.values():
            try:
                os.fsync(directory.fd)
            except OSError as exc:
                raise _disk_error(exc.errno, "the directory %s" % directory.path, req, plan, outcome)


def _write_links(tree, plan):
    """Snapshot links in one rename each; every directory that got links is fsynced before refs are written."""
    by_dir = {}
    for link, target in plan.links:
        by_dir.setdefault(os.path.dirname(link), []).append((os.path.basename(link), target))
    for parent in sorted(by_dir):
        with tree.open_dir(parent, create=True) as directory:
            for name, target in by_dir[parent]:
                symlink_atomic(directory, name, target)
            os.fsync(directory.fd)


def _write_small_file(tree, path, data):
    with tree.open_dir(os.path.dirname(path), create=True) as directory:
        atomic_write_bytes(os.path.basename(path), data, dir_fd=directory.fd)


def apply_plan(plan, req, outcome, meter=None):
    """Carry the plan out (removals first: their space is the copies'); while a selected path lacks good content,
    no link to it is written and refs/ and trees/ stay as they were."""
    tree = LocalTree(req.dest)
    meter = meter or PassMeter(req.phase, req.repo_id, req.verify)
    outcome.applied = True
    outcome.nas_corrupt.extend(plan.nas_corrupt)
    # A lock lost (its directory removed or renamed) stops the run before it removes or links anything.
    meter.check_held()
    for path in plan.debris + plan.prune:
        _remove_local(tree, path)
    if plan.prune and os.path.isdir(plan.snapshot):
        with tree.open_dir(plan.snapshot) as snapshot:
            remove_empty_dirs(snapshot.fd, snapshot.path)
    _write_blobs(tree, plan, req, meter, outcome)
    # No link to content this run could not stage (nor an alias link to such a file).
    blocked = set(os.path.join(plan.snapshot, *p.split("/")) for p in outcome.unavailable)
    plan.links = [(link, target) for link, target in plan.links
                  if link not in blocked and os.path.normpath(os.path.join(os.path.dirname(link), target)) not in blocked]
    meter.check_held()
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
