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
import json
import os
import re
import shutil
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import atomic_write_bytes
from ansible.module_utils.dgx_hashing import (NameHasher, file_matches_name, file_sha256, name_is_hash,
                                              samples_match)
from ansible.module_utils.dgx_hubcache import (blob_link_target, is_within, list_refs, read_tree_listing,
                                               repo_folder_name, resolve_commit, scan_snapshot, path_selected,
                                               tree_listing_for, unmatched_patterns)
from ansible.module_utils.dgx_transfer import (RepoLock, copy_atomic, find_temp_debris, symlink_atomic)

VERIFY_MODES = ("sample", "full", "none")
SIZE_SUFFIXES = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


class MirrorRequest(object):
    """The module's parameters, validated once."""

    def __init__(self, src, dest, repo_id, repo_type="model", revision="main", allow_patterns=None,
                 ignore_patterns=None, verify="sample", reserve="2%", prune=False, lock_timeout=60):
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
        self.folder = repo_folder_name(repo_id, repo_type)


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


def content_problem(local, source, size, etag, verify):
    """Why an existing local file is not a good copy, or None. Content decides, never size alone."""
    if os.path.islink(local):
        return "link"               # e.g. a link into the NAS store: nothing local behind it
    if not os.path.exists(local):
        return "missing"
    if not os.path.isfile(local):
        return "not-a-file"
    if os.stat(local).st_size != size:
        return "size"
    if verify == "none":
        return None
    if verify == "sample":
        return None if samples_match(local, source, size) else "content"
    if etag and name_is_hash(etag):
        return None if file_matches_name(local, etag, size) else "content"
    return None if file_sha256(local) == file_sha256(source) else "content"


def _blobs_of_other_snapshots(dest_repo, commit):
    """Blob names linked from local snapshots other than `commit` (prune must keep them)."""
    keep = set()
    snaps = os.path.join(dest_repo, "snapshots")
    if not os.path.isdir(snaps):
        return keep
    for name in os.listdir(snaps):
        if name == commit:
            continue
        for dirpath, _dirs, files in os.walk(os.path.join(snaps, name)):
            for f in files:
                full = os.path.join(dirpath, f)
                if os.path.islink(full):
                    keep.add(os.path.basename(os.readlink(full)))
    return keep


def _local_paths(top):
    """Every non-directory entry below top, relative, '/'-separated."""
    found = []
    for dirpath, _dirs, files in os.walk(top):
        found.extend(os.path.relpath(os.path.join(dirpath, f), top).replace(os.sep, "/") for f in files)
    return found


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
        raise StageError("unknown repo %s: %s not found; the NAS hub holds: %s"
                         % (req.repo_id, plan.src_repo, ", ".join(known) or "nothing"))
    plan.commit = resolve_commit(plan.src_repo, req.revision)
    plan.entries = scan_snapshot(plan.src_repo, plan.commit, req.src)
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

    plan.dest_repo = os.path.join(req.dest, req.folder)
    plan.snapshot = os.path.join(plan.dest_repo, "snapshots", plan.commit)
    _plan_files(plan, req)
    _plan_metadata(plan, req)
    _plan_cleanup(plan, req)
    return plan


def _plan_files(plan, req):
    by_blob = {}
    for entry in plan.selected:
        local = os.path.join(plan.snapshot, *entry.path.split("/"))
        if entry.kind == "real":
            reason = content_problem(local, entry.source, entry.size, None, req.verify)
            if reason:
                plan.writes.append(Work(local, entry.source, entry.size, None, reason, [entry.path]))
            continue
        by_blob.setdefault(entry.etag, []).append(entry)
        target = blob_link_target(entry.path, entry.etag)
        if not (os.path.islink(local) and os.readlink(local) == target):
            plan.links.append((local, target))
    for etag in sorted(by_blob):
        first = by_blob[etag][0]
        final = os.path.join(plan.dest_repo, "blobs", etag)
        reason = content_problem(final, first.source, first.size, etag, req.verify)
        if reason:
            plan.writes.append(Work(final, first.source, first.size, etag, reason,
                                    [e.path for e in by_blob[etag]]))
        else:
            plan.blobs_reused += 1


def _plan_metadata(plan, req):
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
    plan.debris = find_temp_debris(plan.dest_repo)
    debris = set(plan.debris)
    wanted_paths = set(e.path for e in plan.selected)
    unwanted = []
    if os.path.isdir(plan.snapshot):
        unwanted.extend(os.path.join(plan.snapshot, *p.split("/")) for p in _local_paths(plan.snapshot)
                        if p not in wanted_paths)
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
    need = plan.write_bytes
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


class Progress(object):
    """Throttled progress file next to the repo lock, for operators watching a long copy."""

    def __init__(self, path, total, label):
        self.path, self.total, self.label = path, total, label
        self.done = 0
        self.started = time.monotonic()
        self._last = 0.0

    def __call__(self, count):
        self.done += count
        now = time.monotonic()
        if self.path and now - self._last >= 2.0:
            self._last = now
            self.write(finished=False)

    def write(self, finished):
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        state = {"repo": self.label, "bytes_done": self.done, "bytes_total": self.total,
                 "mib_per_s": round(rate / 1048576, 1), "elapsed_s": round(elapsed, 1),
                 "eta_s": round((self.total - self.done) / rate, 1) if rate and not finished else 0,
                 "finished": finished}
        atomic_write_bytes(self.path, json.dumps(state).encode("utf-8"))


def _sample_check(source, size):
    def check(temp):
        if not samples_match(temp, source, size):
            return "copy of %s reads back different from the NAS: check the local disk" % source
        return None
    return check


def _ensure_parent(path):
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent)


def _copy_one(work, verify, progress):
    _ensure_parent(work.final)
    hasher, check = None, None
    if verify == "full" and work.etag and name_is_hash(work.etag):
        hasher = NameHasher(work.etag, work.size)
    elif verify != "none":
        check = _sample_check(work.source, work.size)
    copy_atomic(work.source, work.final, work.size, hasher=hasher, check=check, progress=progress)


def _write_small_file(path, data):
    _ensure_parent(path)
    atomic_write_bytes(path, data)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _remove_empty_dirs(top):
    for dirpath, _dirs, _files in os.walk(top, topdown=False):
        if dirpath != top and not os.listdir(dirpath):
            os.rmdir(dirpath)


def apply_plan(plan, req, progress_path=None):
    """Carry the plan out; debris and prune first so their space is free for the copies."""
    for path in plan.debris + plan.prune:
        _remove(path)
    if plan.prune and os.path.isdir(plan.snapshot):
        _remove_empty_dirs(plan.snapshot)
    progress = Progress(progress_path, plan.write_bytes, "%s@%s" % (req.repo_id, plan.commit[:12]))
    blobs_first = sorted(plan.writes, key=lambda w: (w.etag is None, w.final))
    for work in blobs_first:
        _copy_one(work, req.verify, progress)
    for link, target in plan.links:
        _ensure_parent(link)
        symlink_atomic(target, link)
    for name, commit in sorted(plan.refs.items()):
        _write_small_file(os.path.join(plan.dest_repo, "refs", *name.split("/")), commit.encode("ascii"))
    if plan.tree_listing is not None:
        _write_small_file(os.path.join(plan.dest_repo, "trees", plan.commit + ".json"), plan.tree_listing)
    if progress_path:
        progress.write(finished=True)


def count_dangling(plan, dest_root):
    """Selected snapshot entries that do not resolve to a regular file on the local disk."""
    dest_real = os.path.realpath(dest_root)
    bad = []
    for entry in plan.selected:
        local = os.path.join(plan.snapshot, *entry.path.split("/"))
        real = os.path.realpath(local)
        if not (os.path.isfile(real) and is_within(real, dest_real)):
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


def run_mirror(req, check_mode=False, progress_path=None):
    """Plan, check space, apply (unless check_mode) and return the module result."""
    started = time.monotonic()
    if check_mode:
        plan = plan_mirror(req, check_mode=True)
        space = check_space(plan, req)
        dangling = []
    else:
        # Bad input and a disk that cannot even hold the missing files are refused before the lock
        # file is created: a read-only pass that stats but reads no content (verify none).
        quick = copy.copy(req)
        quick.verify = "none"
        try:
            preflight = plan_mirror(quick)
        except OSError:  # a run holding the lock changed the local copy under us: the locked plan decides
            preflight = None
        if preflight is not None:
            check_space(preflight, quick)
        lock_path = os.path.join(req.dest, ".locks", req.folder, "dgx-stage.lock")
        with RepoLock(lock_path, req.lock_timeout):
            plan = plan_mirror(req)
            space = check_space(plan, req)
            apply_plan(plan, req, progress_path)
            dangling = count_dangling(plan, req.dest)
        if dangling:
            raise StageError("after staging, %d file(s) of %s still do not resolve to local files (e.g. %s): "
                             "the local disk changed under the run; re-run" % (len(dangling), req.repo_id,
                                                                              dangling[0]))
    copies = [w for w in plan.writes if w.etag and not w.is_repair]
    repairs = [w for w in plan.writes if w.etag and w.is_repair]
    real_writes = [w for w in plan.writes if not w.etag]
    return {
        "changed": plan.changes,
        "commit": plan.commit,
        "snapshot": plan.snapshot,
        "files": {"total": len(plan.entries), "local": len(plan.selected), "excluded": len(plan.excluded),
                  "dangling": len(dangling)},
        "blobs": {"copied": len(copies), "reused": plan.blobs_reused, "repaired": len(repairs)},
        "real_files": {"copied": len([w for w in real_writes if not w.is_repair]),
                       "repaired": len([w for w in real_writes if w.is_repair])},
        "repaired_paths": sorted(p for w in plan.writes if w.is_repair for p in w.paths),
        "links_written": len(plan.links),
        "refs_written": sorted(plan.refs),
        "bytes_copied": plan.write_bytes,
        "bytes_staged": sum(e.size for e in plan.selected),
        "excluded_paths": [e.path for e in plan.excluded],
        "pruned": plan.prune,
        "stale_paths": plan.stale,
        "debris_removed": plan.debris,
        "verify": req.verify,
        "space": space,
        "duration_s": round(time.monotonic() - started, 3),
        "warnings": plan.warnings,
        "diff_text": describe_plan(plan),
    }
