"""The engine container's mount list: every file of the NAS snapshot, a staged one from its local blob, the rest
read-only from the NAS (one mount per maximal directory with nothing local in it, else one per file)."""
import os
import posixpath
import stat

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import is_within
from ansible.module_utils.dgx_hashing import file_matches_own_name
from ansible.module_utils.dgx_hubcache import list_refs, repo_folder_name, resolve_snapshot_link, scan_snapshot
from ansible.module_utils.dgx_hubcache import resolve_commit as hubcache_resolve_commit
from ansible.module_utils.dgx_mountspec import mount_path_problem
from ansible.module_utils.dgx_mounts import is_mounted_file, mount_point_problem
from ansible.module_utils.dgx_localtree import linked_dir_problem

def resolve_commit(local_repo, nas_repo, revision):
    """The local copy's commit for revision when it has that ref or snapshot (a broken ref is an error), else the
    NAS's."""
    if revision in list_refs(local_repo) or os.path.isdir(os.path.join(local_repo, "snapshots", revision)):
        return hubcache_resolve_commit(local_repo, revision)
    return hubcache_resolve_commit(nas_repo, revision)


def _regular_file(path, size=None):
    """path when it is itself a regular file (of `size` bytes, when given), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size):
        return path
    return None


def snapshot_path(snapshot, rel):
    return os.path.join(snapshot, *rel.split("/"))


def local_source(local_repo, local_snapshot, entry, local_root_real):
    """The staged copy of one NAS snapshot entry, or None (then the NAS is bound). A blob link is local when the
    local link names the same blob, a regular file: the name decides, so a NAS blob that rotted after staging never
    displaces the proven copy (sizes that differ are settled by hashing). A real file must have the NAS size."""
    path = snapshot_path(local_snapshot, entry.path)
    if not os.path.islink(path):
        return _regular_file(path, entry.size) if entry.kind == "real" else None
    try:
        etag, alias_of, _real = resolve_snapshot_link(path, local_repo, local_snapshot, local_root_real)
    except StageError:
        return None
    if entry.kind == "link":
        blob = _regular_file(os.path.join(local_repo, "blobs", etag)) if etag == entry.etag else None
        if blob and os.lstat(blob).st_size != entry.size and not file_matches_own_name(blob, etag):
            return None       # the sizes disagree and the local copy is the wrong side
        return blob
    if alias_of is None or entry.alias_of is None:
        return None
    return _regular_file(snapshot_path(local_snapshot, alias_of), entry.size)


def stays_inside(link_path, directory):
    """True if a file is reachable inside a bind of directory: a real file, or a relative symlink staying inside
    it lexically and resolved (any other link dangles in the container)."""
    if not os.path.islink(link_path):
        return True
    text = os.readlink(link_path)
    if os.path.isabs(text):
        return False
    lexical = os.path.normpath(os.path.join(os.path.dirname(link_path), text))
    return (is_within(lexical, os.path.normpath(directory))
            and is_within(os.path.realpath(link_path), os.path.realpath(directory)))


def _mount(source, target, origin):
    return {"source": source, "target": target, "read_only": True, "origin": origin}


def planned_source(local_repo, local_snapshot, entry):
    """Where the stage pass puts one selected NAS entry."""
    if entry.kind == "link":
        return os.path.join(local_repo, "blobs", entry.etag)
    return snapshot_path(local_snapshot, entry.path)


def plan_for(plan, repo):
    """The stage plan's row for this repo and revision, or None."""
    for record in plan or []:
        if (record.get("repo_id") == repo["repo_id"]
                and (record.get("repo_type") or "model") == repo["repo_type"]
                and (record.get("revision") or "main") == repo["revision"] and record.get("commit")):
            return record
    return None


def plan_snapshot_mounts(files, local, nas_snapshot, target_snapshot, fallbacks=None):
    """Mounts for one snapshot. local: {rel: local source}; fallbacks: {rel: why a staged file is bound from the
    NAS}, the fallback_reason of the NAS mount covering it."""
    mounts = []
    fallbacks = fallbacks or {}

    def nas_mount(source, target, covered):
        mount = _mount(source, target, "nas")
        reasons = [fallbacks[f] for f in covered if f in fallbacks]
        if reasons:
            mount["fallback_reason"] = reasons[0]
        mounts.append(mount)

    def visit(rel_dir):
        below = [f for f in files if not rel_dir or f.startswith(rel_dir + "/")]
        nas_dir = os.path.join(nas_snapshot, rel_dir) if rel_dir else nas_snapshot
        if not any(f in local for f in below) and all(
                stays_inside(os.path.join(nas_snapshot, f), nas_dir) for f in below):
            target = posixpath.join(target_snapshot, rel_dir) if rel_dir else target_snapshot
            nas_mount(nas_dir, target, below)
            return
        depth = len(rel_dir.split("/")) if rel_dir else 0
        subdirs = set()
        for rel in below:
            parts = rel.split("/")
            if len(parts) > depth + 1:
                subdirs.add("/".join(parts[:depth + 1]))
            elif rel in local:
                mounts.append(_mount(local[rel], posixpath.join(target_snapshot, rel), "local"))
            else:
                nas_mount(os.path.join(nas_snapshot, rel), posixpath.join(target_snapshot, rel), [rel])
        for sub in sorted(subdirs):
            visit(sub)

    if files:
        visit("")
    return mounts


def normalise_repo(entry):
    """Defaults for one stage_repos entry (the module's spec requires repo_id); extra keys are ignored."""
    return {"repo_id": entry["repo_id"],
            "revision": entry.get("revision") or "main",
            "repo_type": entry.get("repo_type") or "model"}


def _check_root(name, path, must_exist):
    if not path or not os.path.isabs(path):
        raise StageError("%s %r must be an absolute path; fix the inventory" % (name, path))
    path = os.path.normpath(path)
    if must_exist and not os.path.isdir(path):
        raise StageError("%s %s is not a directory; mount the NAS hub or fix %s" % (name, path, name))
    return path


def plan_repo(hub_local_root, hub_nas_root, entry, target_root, plan=None, bind_from="local"):
    """(repo record, mounts, NAS file paths, planned sources) of one repo. plan (check mode): the stage pass's
    rows, whose commit and files the real run stages; bind_from "nas" reads nothing of the local hub."""
    repo = normalise_repo(entry)
    folder = repo_folder_name(repo["repo_id"], repo["repo_type"])
    local_repo = os.path.join(hub_local_root, folder)
    nas_repo = os.path.join(hub_nas_root, folder)
    from_local = bind_from == "local"
    staging = plan_for(plan, repo) if from_local else None
    if staging:
        commit = staging["commit"]
    elif from_local:
        commit = resolve_commit(local_repo, nas_repo, repo["revision"])
    else:
        commit = hubcache_resolve_commit(nas_repo, repo["revision"])
    nas_snapshot = os.path.join(nas_repo, "snapshots", commit)
    if not os.path.isdir(nas_snapshot):
        raise StageError("%s does not exist: the NAS has no snapshot for %s@%s (commit %s); "
                         "fix the revision or the local ref %s"
                         % (nas_snapshot, repo["repo_id"], repo["revision"], commit,
                            os.path.join(local_repo, "refs", repo["revision"])))
    local_snapshot = os.path.join(local_repo, "snapshots", commit)
    target = posixpath.join(target_root, folder, "snapshots", commit)
    entries = scan_snapshot(nas_repo, commit, hub_nas_root)
    files = [e.path for e in entries]
    local_root_real = os.path.realpath(hub_local_root)
    excluded = set((staging or {}).get("excluded_paths") or [])
    pruned = set((staging or {}).get("pruned") or [])
    local, planned, fallbacks = {}, set(), {}
    for entry in entries if from_local else ():
        # A linked folder on the way could show any same-size file from elsewhere as the staged copy.
        fallbacks_here = _linked_folder(hub_local_root, folder, commit, entry)
        if fallbacks_here:
            fallbacks[entry.path] = fallbacks_here
            continue
        source = local_source(local_repo, local_snapshot, entry, local_root_real)
        if source and is_mounted_file(source):
            fallbacks[entry.path] = _not_local("%s is a mount point" % source, _MOUNTED)
            continue
        if staging is not None:
            if entry.path in excluded:
                if source in pruned or snapshot_path(local_snapshot, entry.path) in pruned:
                    source = None      # the stage pass removes it: the real run binds the NAS file
            elif source is None:
                source = planned_source(local_repo, local_snapshot, entry)
                planned.add(source)
        if source:
            local[entry.path] = source
    record = dict(repo, commit=commit, folder=folder, local_snapshot=local_snapshot,
                  nas_snapshot=nas_snapshot, target=target)
    mounts = plan_snapshot_mounts(files, local, nas_snapshot, target, fallbacks)
    return record, mounts, [os.path.join(nas_snapshot, f) for f in files], planned


def _linked_folder(hub_local_root, folder, commit, entry):
    """Why a folder on the local path of entry (and blobs/ for a blob) is no real directory of the local hub."""
    rels = [posixpath.join(folder, "snapshots", commit, posixpath.dirname(entry.path))]
    if entry.kind == "link":
        rels.append(posixpath.join(folder, "blobs"))
    for rel in rels:
        problem = linked_dir_problem(hub_local_root, rel)
        if problem:
            return _not_local(problem.split(": the local hub must be", 1)[0], "the local hub must be real directories")
        mounted = mount_point_problem(hub_local_root, rel)
        if mounted:
            return _not_local(mounted.split(":", 1)[0], _MOUNTED)
    return None


_MOUNTED = "a bind mount shows files from elsewhere"


def _not_local(what, why):
    return "not bound from the local disk: %s (%s); bound read-only from the NAS" % (what, why)


def build_manifest(hub_local_root, hub_nas_root, repos, target_root="/hub", plan=None, bind_from="local"):
    """(manifest, NAS file paths); with a plan, `planned` lists the targets the stage pass has still to write."""
    hub_local_root = _check_root("hub_local_root", hub_local_root, False)
    hub_nas_root = _check_root("hub_nas_root", hub_nas_root, True)
    if not target_root or not posixpath.isabs(target_root):
        raise StageError("target_root %r must be an absolute in-container path" % (target_root,))
    target_root = posixpath.normpath(target_root)
    if not repos:
        raise StageError("repos is empty: nothing to mount; set stage_repos")
    records, mounts, nas_files, folders, planned = [], [], [], set(), set()
    for entry in repos:
        record, repo_mounts, files, repo_planned = plan_repo(hub_local_root, hub_nas_root, entry, target_root,
                                                             plan, bind_from)
        if record["folder"] in folders:
            raise StageError("repo %s is listed twice in repos; remove one entry" % record["repo_id"])
        folders.add(record["folder"])
        records.append(record)
        mounts.extend(repo_mounts)
        nas_files.extend(files)
        planned |= repo_planned
    mounts.sort(key=lambda m: m["target"])
    local_count = sum(1 for m in mounts if m["origin"] == "local")
    manifest = {"repos": records, "mounts": mounts,
                "counts": {"local": local_count, "nas": len(mounts) - local_count,
                           "total": len(mounts)},
                "bind_from": bind_from}
    problems = coverage_problems(manifest, nas_files, planned)
    if problems:
        raise StageError("mount manifest is inconsistent: %s" % "; ".join(problems[:10])
                         + ("; and %d more" % (len(problems) - 10) if len(problems) > 10 else ""))
    if plan is not None:
        manifest["planned"] = [m["target"] for m in mounts if m["origin"] == "local" and m["source"] in planned]
    return manifest, nas_files


def _file_target(repos, nas_file):
    for repo in repos:
        if is_within(nas_file, repo["nas_snapshot"]):
            rel = os.path.relpath(nas_file, repo["nas_snapshot"])
            return posixpath.join(repo["target"], rel.replace(os.sep, "/"))
    return None


def _ancestors(target):
    parent = posixpath.dirname(target)
    while parent and parent != target:
        yield parent
        target, parent = parent, posixpath.dirname(parent)


def mount_problems(mounts, planned=()):
    """Problems of the mount list alone: unbindable paths, missing sources, shared or nested targets, rw NAS."""
    problems = []
    by_target = {}
    for mount in mounts:
        for key in ("source", "target"):
            problem = mount_path_problem(mount[key])
            if problem:
                problems.append("mount %s %s" % (key, problem))
        if mount["target"] in by_target:
            problems.append("two mounts share target %s (%s and %s)"
                            % (mount["target"], by_target[mount["target"]]["source"], mount["source"]))
        by_target[mount["target"]] = mount
        if mount["source"] not in planned and not os.path.exists(mount["source"]):
            problems.append("mount source %s does not exist (or is a dangling link)" % mount["source"])
        if mount.get("origin") == "nas" and mount.get("read_only") is not True:
            problems.append("NAS mount %s is not read_only" % mount["source"])
    for mount in mounts:
        for parent in _ancestors(mount["target"]):
            outer = by_target.get(parent)
            if outer is not None and os.path.isdir(outer["source"]):
                problems.append("target %s is nested inside directory mount %s"
                                % (mount["target"], parent))
    return problems


def coverage_problems(manifest, nas_files, planned=()):
    """mount_problems, and a NAS snapshot file not reachable through exactly one mount, or linking out of its
    directory mount."""
    mounts = manifest["mounts"]
    problems = mount_problems(mounts, planned)
    by_target = {m["target"]: m for m in mounts}
    for nas_file in nas_files:
        target = _file_target(manifest["repos"], nas_file)
        if target is None:
            problems.append("%s is not in any listed repo's NAS snapshot" % nas_file)
            continue
        covering = [t for t in [target] + list(_ancestors(target)) if t in by_target]
        if len(covering) != 1:
            problems.append("%s is reachable through %d mounts (%s), not exactly one"
                            % (nas_file, len(covering), ", ".join(covering) or "none"))
            continue
        mount = by_target[covering[0]]
        if covering[0] != target and not stays_inside(nas_file, mount["source"]):
            problems.append("%s is a symlink leaving directory mount %s; it would dangle in the "
                            "container" % (nas_file, mount["source"]))
    return problems
