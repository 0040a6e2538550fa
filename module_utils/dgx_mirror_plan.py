"""Planning a mirror run: read both hubs, decide every write, link, ref and removal (nothing written), and
refuse what must not be staged (unsafe local folders, overlapping ranks, unmatched patterns, missing copies).
"""
import os
import posixpath
import stat

from ansible.module_utils.dgx_errors import StageError, fix_command
from ansible.module_utils.dgx_fsutil import TEMP_PREFIX, is_temp_name, is_within, read_small, walk_tree
from ansible.module_utils.dgx_hashing import file_sha256, hash_as_named, name_is_hash, sampled_bytes, samples_match
from ansible.module_utils.dgx_hubcache import (blob_link_target, first_match, list_refs, path_selected,
                                               read_tree_listing, resolve_commit, scan_snapshot, tree_listing_for,
                                               unmatched_patterns)
from ansible.module_utils.dgx_localtree import LocalTree, find_temp_debris
from ansible.module_utils.dgx_mirror_request import NOT_STAGED, NotStaged, Plan, Work, lock_dir_rel, name_some
from ansible.module_utils.dgx_peer import count_candidates, refuse_bad_peer_dir
from ansible.module_utils.dgx_progress_file import PassMeter
from ansible.module_utils.dgx_workers import run_workers


def check_roots(req, check_mode=False):
    """Both hub roots exist and do not overlap; in check mode a dest not created yet (a fresh node) is empty."""
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


def content_matches(work, verify, buf, meter):
    """Prove one present file: sampled against the NAS, or (full) hashed against its name (a real file: the NAS's)."""
    if verify == "sample":
        return samples_match(work.final, work.source, work.size,
                             on_read=lambda local, nas: meter.count("hashing", local=local, nas=nas), buf=buf)
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
    """Content checks of every present file; one that fails is a repair, unless it hashes to its own name (then the
    NAS copy is the corrupt one and the local copy stays)."""
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

    run_workers(sorted(plan.to_prove, key=lambda w: -w.size), prove, req.workers, req.read_cap)
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
    """"ok", "nas-corrupt" (the local copy passes its name, the NAS disagrees) or why to repair it; a wrong local
    copy leaves what its bytes hash to (as its blob is named, at its own size) in work.local_hash."""
    try:
        if work.reason != "size" and (verify == "none" or content_matches(work, verify, buf, meter)):
            return "ok"
        if verify != "full" or work.reason == "size":      # a failed full check has hashed it already
            local = meter.reader("hashing", "local")
            work.local_hash = (hash_as_named(work.final, work.etag, None, buf, local)[0] if work.etag
                               else file_sha256(work.final, buf, local))
            if work.local_hash == work.etag:
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


def plan_mirror(req, check_mode=False, meter=None):
    """Read both hubs and decide every action, writing nothing (NotStaged: copy_missing off and files lack a copy)."""
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
    for entry in plan.entries:
        (plan.selected if path_selected(entry.path, req.allow_patterns, req.ignore_patterns) else plan.excluded
         ).append(entry)
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
    count_candidates(plan, req)
    return plan


def refuse_overlapping_ranks(plan, req):
    """StageError when a file is selected by this host's rank patterns and another rank's: neither would stage it."""
    for entry in plan.entries:
        own = first_match(entry.path, req.require_match)
        other = first_match(entry.path, req.other_rank_patterns) if own is not None else None
        if other is not None:
            raise StageError("rank patterns overlap: %s of %s@%s is selected by this host's rank pattern %r and by "
                             "another rank's pattern %r, so neither host would stage it; make each rank's "
                             "patterns select files of its own (rank_patterns), nothing was written"
                             % (entry.path, req.repo_id, plan.commit, own, other))


def refuse_unmatched_required(plan, req):
    """StageError when a rank pattern matches no selected file (a lane larger than the checkpoint's cut, a typo)."""
    for pattern in unmatched_patterns([e.path for e in plan.selected], req.require_match):
        excluded_only = " (it matches only files that allow_patterns %s / ignore_patterns %s exclude)" % (
            req.allow_patterns, req.ignore_patterns) if not unmatched_patterns([e.path for e in plan.excluded],
                                                                               [pattern]) else ""
        raise StageError("rank pattern %r matches no file of %s@%s that this run selects%s: check rank_patterns and "
                         "the lane's size (require_match holds this host's rank patterns; fnmatch on snapshot-relative "
                         "paths, 'dir/' for a whole dir); nothing was written"
                         % (pattern, req.repo_id, plan.commit, excluded_only))


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
    """Every directory the run may write or remove in is a real directory on dest's own mount (check mode too)."""
    if not os.path.isdir(req.dest):
        return
    tree = LocalTree(req.dest)
    folder = req.folder
    tree.refuse_unsafe_dirs([folder + "/blobs", folder + "/trees", ".locks/" + folder])
    for rel in (folder + "/snapshots/" + commit, folder + "/refs"):
        tree.refuse_unsafe_dirs_below(rel)


def _plan_files(plan):
    by_blob = {}
    selected_paths = set(e.path for e in plan.selected)
    for entry in plan.selected:
        local = os.path.join(plan.snapshot, *entry.path.split("/"))
        if entry.alias_of in selected_paths:
            # A link between two real snapshot files stays a link, so the content is stored once.
            target = posixpath.relpath(entry.alias_of, posixpath.dirname(entry.path) or ".")
        elif entry.kind == "real":
            _plan_content(plan, Work(local, entry.source, entry.size, None, "content", [entry.path]))
            continue
        else:
            by_blob.setdefault(entry.etag, []).append(entry)
            target = blob_link_target(entry.path, entry.etag)
        if not (os.path.islink(local) and os.readlink(local) == target):
            plan.links.append((local, target))
    for etag in sorted(by_blob):
        first = by_blob[etag][0]
        final = os.path.join(plan.dest_repo, "blobs", etag)
        _plan_content(plan, Work(final, first.source, first.size, etag, "content", [e.path for e in by_blob[etag]]))


def _plan_content(plan, work):
    """A missing file, link (never a good copy) or non-file is written; a present one is proven by prove_present."""
    try:
        st = os.lstat(work.final)
        work.reason = "link" if stat.S_ISLNK(st.st_mode) else "not-a-file" if not stat.S_ISREG(st.st_mode) else \
            "size" if st.st_size != work.size else "content"
    except FileNotFoundError:
        work.reason = "missing"
    (plan.to_prove if work.reason in ("size", "content") else plan.writes).append(work)


def _plan_metadata(plan):
    """Refs to this commit and the tree listing, unless the local file holds exactly what the run would write."""
    for name, commit in sorted(list_refs(plan.src_repo).items()):
        data = commit.encode("ascii")
        if commit == plan.commit and read_small(os.path.join(plan.dest_repo, "refs", *name.split("/")),
                                                len(data) + 1) != data:
            plan.refs[name] = commit
    listing = read_tree_listing(plan.src_repo, plan.commit)
    if listing is not None:
        wanted = tree_listing_for(listing, [e.path for e in plan.selected])
        if read_small(os.path.join(plan.dest_repo, "trees", plan.commit + ".json"), len(wanted) + 1) != wanted:
            plan.tree_listing = wanted


def _plan_cleanup(plan, req):
    if not os.path.isdir(plan.dest_repo):
        return
    # Debris only where this run writes: another revision's snapshot is that revision's business.
    plan.debris = [p for top in [os.path.join(plan.dest_repo, d) for d in ("blobs", "refs", "trees")] + [
        plan.snapshot, os.path.join(req.dest, lock_dir_rel(req.folder))] for p in find_temp_debris(top)]
    debris = set(plan.debris)
    wanted_paths = set(e.path for e in plan.selected)
    unwanted = [path for path, rel, is_dir in walk_tree(plan.snapshot) if not is_dir and rel not in wanted_paths]
    blobs_dir = os.path.join(plan.dest_repo, "blobs")
    if os.path.isdir(blobs_dir):
        # Blobs of this revision and those other local snapshots link to stay.
        keep = set(e.etag for e in plan.selected if e.etag) | set(
            os.path.basename(os.readlink(path)) for path, rel, is_dir in walk_tree(os.path.join(plan.dest_repo,
                                                                                              "snapshots"))
            if rel.split("/")[0] != plan.commit and not is_dir and os.path.islink(path))
        unwanted.extend(os.path.join(blobs_dir, name) for name in sorted(os.listdir(blobs_dir)) if name not in keep)
    unwanted = [p for p in unwanted if p not in debris]
    if req.prune:
        plan.prune = unwanted
    else:
        plan.stale = unwanted
        if unwanted:
            plan.warnings.append("%d local file(s) of %s are not part of the staged revision (e.g. %s); "
                                 "reclaim them with %s" % (len(unwanted), req.repo_id, unwanted[0],
                                                           fix_command("stage", req.host, "stage_prune=true")))
    # A link or a file with another name frees nothing.
    plan.freed_bytes = sum(st.st_size for st in map(os.lstat, plan.prune + plan.debris)
                           if stat.S_ISREG(st.st_mode) and st.st_nlink == 1)
