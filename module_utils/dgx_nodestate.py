# -*- coding: utf-8 -*-
"""What the engine container would meet on this node, read without changing anything.

read_manifest(path)               -> (the mount manifest, None) or (None, why it cannot be read or used)
checked_manifest(manifest)        -> (manifest, None) or (None, why it is no mount manifest)
local_sources(manifest)           -> the host paths of the manifest's binds from the local disk
bind_problems(manifest)           -> why the lane cannot start from the manifest: a source or target no runtime
                                     binds as written, a local source outside the manifest's local repos, reached
                                     through a link or a mount, missing, not a regular file (a link included) or
                                     unreadable, a NAS source outside the NAS hub or not resolving to a readable
                                     file, a local ref that cannot be read or moved past its commit
missing_paths(paths)              -> the paths where nothing is (OSError for one that cannot be looked at)
files_fingerprint(paths)          -> (sha256 hex, [(path, identity)], [missing paths]): the identity of every
                                     file the container binds (st_dev, st_ino, st_size, st_mtime_ns and
                                     st_ctime_ns of what the path resolves to: a rewrite in place that puts
                                     the old mtime back still moves the ctime). A bind pins an inode: a verify repair or a
                                     re-stage writes a new inode under the same name, a prune removes it, and
                                     the running container keeps reading the old bytes. The fingerprint
                                     changes in each case, so the role restarts the lane.
listening_inodes(port, proc_root) -> socket inodes listening on TCP `port` (IPv4 and IPv6), from /proc/net
port_holders(port, proc_root)     -> [{pid, command, container_id}]: the processes holding those sockets,
                                     with the container a process runs in (its cgroup), "" for a host process
python_modules(names)             -> {executable, version, missing}: the modules of names this Python cannot
                                     import (community.docker needs `requests` in the node's Python)

Reads /proc of the node's own network namespace: host-network containers (the engine's) listen there.
Stdlib only; runs on the nodes' system Python.
"""

import errno
import hashlib
import json
import os
import stat
import sys

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import is_within
from ansible.module_utils.dgx_localtree import LocalTree
from ansible.module_utils.dgx_mountspec import mount_path_problem
from ansible.module_utils.dgx_receipts import container_of

TCP_LISTEN = "0A"


def read_manifest(path):
    """(the mount manifest JSON at path, None), or (None, why it cannot be read): no file there, not JSON, or
    not a manifest (a list of repos, and of mounts each with a text source and target)."""
    try:
        with open(path, "rb") as handle:
            manifest = json.loads(handle.read().decode("utf-8"))
    except OSError as exc:
        return None, "cannot read it: %s" % (exc.strerror or exc)
    except ValueError as exc:
        return None, "not JSON: %s" % exc
    return checked_manifest(manifest)


def checked_manifest(manifest):
    """(manifest, None) when it is a mount manifest (DESIGN: {"repos": [...], "mounts": [{source, target,
    read_only, origin}], "counts": {...}}), else (None, what makes it none)."""
    problem = None
    if not isinstance(manifest, dict):
        problem = "not a JSON object"
    elif not all(isinstance(manifest.get(key), list) for key in ("repos", "mounts")):
        problem = "no list of repos and of mounts"
    else:
        for index, mount in enumerate(manifest["mounts"]):
            if not isinstance(mount, dict) or not all(isinstance(mount.get(key), str) for key in ("source", "target")):
                problem = "mount %d has no text source and target" % index
                break
    return (None, "not a mount manifest: %s" % problem) if problem else (manifest, None)


def local_sources(manifest):
    """The host paths the manifest binds from the local disk (origin local): the files a restage or a repair
    gives a new inode."""
    return [mount["source"] for mount in manifest.get("mounts") or [] if mount.get("origin") == "local"]


def bind_problems(manifest):
    """Why the manifest cannot be started from as it is, one text each, [] when it can: a mount whose source or
    target no runtime binds as written (a NUL byte, a path not in normal form: dgx_mountspec), a local bind whose
    source is outside the local repo folders of the manifest's repos, has a link or a mount on the way, is
    missing, not a regular file (a link included) or cannot be read (the runtime would fail that rank's start,
    after the earlier ranks were stopped, or bind other bytes), a NAS bind whose source does not resolve inside
    the NAS hub to a readable file (or folder), or a repo whose local ref cannot be read or moved past the
    commit the manifest binds (a revision staged since the manifest was written). A manifest not shaped as
    engine_manifest writes it is one problem naming what is wrong."""
    shape = _shape_problem(manifest)
    if shape:
        return [shape]
    problems, unbindable = [], set()
    for index, mount in enumerate(manifest.get("mounts") or []):
        for key in ("source", "target"):
            why = mount_path_problem(mount.get(key)) if key in mount else None
            if why:
                problems.append("mount %d of the manifest: its %s %s" % (index, key, why))
                unbindable.add(index)
    mounts = [mount for index, mount in enumerate(manifest.get("mounts") or []) if index not in unbindable]
    repo_folders = _local_repo_folders(manifest)
    for path in sorted(set(m["source"] for m in mounts if m.get("origin") == "local")):
        why = _local_unusable(path, repo_folders)
        if why:
            problems.append("%s %s" % (path, why))
    snapshots = _nas_snapshots(manifest)
    for path in sorted(set(m["source"] for m in mounts if m.get("origin") == "nas")):
        why = _nas_unusable(path, snapshots)
        if why:
            problems.append("NAS source %s %s" % (path, why))
    for repo in manifest.get("repos") or []:
        moved = _ref_moved(repo)
        if moved:
            problems.append(moved)
    return problems


def _shape_problem(manifest):
    if not isinstance(manifest, dict):
        return "the manifest is not a JSON object; write it again (the manifest play)"
    for key in ("mounts", "repos"):
        entries = manifest.get(key) or []
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            return "the manifest's %s is not a list of objects; write it again (the manifest play)" % key
    if not all(isinstance(mount.get("source"), str) for mount in manifest.get("mounts") or []
               if mount.get("origin") in ("local", "nas")):
        return "a mount of the manifest has no source path; write it again (the manifest play)"
    return None


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_problem(exc):
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return "is missing"
    if exc.errno == errno.ELOOP:
        return "is a symlink, not a regular file"
    return "cannot be read (%s)" % errno.errorcode.get(exc.errno, exc.errno)


def _regular_problem(fd):
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    return None if stat.S_ISREG(mode) else "is not a regular file"


def _unusable(path):
    """Why the file at path cannot be bound, or None: it is missing, cannot be read, or is not a regular file - a
    link at its last component included, never followed."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return _open_problem(exc)
    return _regular_problem(fd)


def _local_repo_folders(manifest):
    """[(local repo folder, its hub root)] of the manifest's repos, from their local snapshots
    (<hub>/<repo folder>/snapshots/<commit>)."""
    found = []
    for repo in manifest.get("repos") or []:
        snapshot = repo.get("local_snapshot")
        if isinstance(snapshot, str) and snapshot:
            folder = os.path.dirname(os.path.dirname(os.path.normpath(snapshot)))
            found.append((folder, os.path.dirname(folder)))
    return found


def _open_in_local_hub(hub, rel):
    """(fd, None) of the file rel ('/'-separated) below the local hub root, each folder on the way opened
    through the local tree (never through a link, never into a mount point) and the file with O_NOFOLLOW; or
    (None, why not): a folder on the way swapped for a link would show the container other bytes under the
    staged file's name."""
    folder, name = rel.rsplit("/", 1) if "/" in rel else ("", rel)
    try:
        with LocalTree(hub).open_dir(folder) as parent:
            return os.open(name, _OPEN_FLAGS, dir_fd=parent.fd), None
    except StageError as exc:
        return None, "has a symlink or a mount on the way: %s" % exc
    except ValueError:
        return None, "cannot be opened (a NUL byte in the path)"
    except OSError as exc:
        return None, _open_problem(exc)


def _local_unusable(path, repo_folders):
    """Why the local bind source at path cannot be bound as the staged file, or None. It lies in a local repo
    folder of the manifest's repos and is opened from the local hub root without following any link: a staged
    file is a regular file reached through real folders, and a link anywhere on its way could show the
    container anything."""
    inside = [(folder, hub) for folder, hub in repo_folders if path != folder and is_within(path, folder)]
    if not inside:
        return "is in no local repo folder of the manifest's repos (%s): a local bind is a staged file" % (
            ", ".join(sorted(set(folder for folder, _hub in repo_folders))) or "none names a local snapshot")
    hub = inside[0][1]
    fd, why = _open_in_local_hub(hub, os.path.relpath(path, hub).replace(os.sep, "/"))
    return why or _regular_problem(fd)


def _nas_snapshots(manifest):
    """[(NAS snapshot folder, the real path of its NAS hub)] of the manifest's repos."""
    found = []
    for repo in manifest.get("repos") or []:
        snapshot = repo.get("nas_snapshot")
        if isinstance(snapshot, str) and snapshot:
            snapshot = os.path.normpath(snapshot)
            # <hub>/<repo folder>/snapshots/<commit>
            found.append((snapshot, os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(snapshot))))))
    return found


def _nas_unusable(path, snapshots):
    """Why a NAS bind source cannot be bound, or None. It lies in a NAS snapshot the manifest names; a snapshot
    file is a link into the repo's blobs by design, so what it resolves to is checked: inside the NAS hub, and a
    readable regular file (or, for a folder bound whole, a readable folder)."""
    hubs = [hub for snapshot, hub in snapshots if is_within(os.path.normpath(path), snapshot)]
    if not hubs:
        return "is in no NAS snapshot of the manifest's repos"
    real = os.path.realpath(path)
    if not is_within(real, hubs[0]):
        return "resolves to %s, outside the NAS hub %s" % (real, hubs[0])
    if os.path.isdir(real):
        return None if os.access(real, os.R_OK | os.X_OK) else "is a folder that cannot be read"
    return _unusable(real)


def _ref_moved(repo):
    """A text when the local hub's ref for the repo's revision names another commit than the manifest's, or
    cannot be read (a folder, a link, a link on the way). No ref at all is no problem: the manifest took the
    NAS's commit then (nothing staged yet, or bound from the NAS)."""
    revision, commit, snapshot = repo.get("revision"), repo.get("commit"), repo.get("local_snapshot")
    if not (revision and commit and snapshot) or revision == commit:
        return None
    if not all(isinstance(value, str) for value in (revision, commit, snapshot)):
        return "%s: the manifest's revision, commit or snapshot is not text" % (repo.get("repo_id"),)
    # normpath: a snapshot written with a trailing slash names the same folder.
    folder = os.path.dirname(os.path.dirname(os.path.normpath(snapshot)))
    ref = os.path.join(folder, "refs", *revision.split("/"))
    fd, why = _open_in_local_hub(os.path.dirname(folder), "%s/refs/%s" % (os.path.basename(folder), revision))
    now = ""
    if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
        with os.fdopen(fd, "rb") as handle:
            now = handle.read(256).decode("utf-8", "replace").strip()
    elif fd is not None:
        os.close(fd)
        why = "is not a regular file"
    if why == "is missing":
        return None
    if why:
        return ("%s@%s: the local hub's ref %s %s, so whether the manifest's commit %s is still the one staged "
                "cannot be told; make it a file naming the commit (stage again)"
                % (repo.get("repo_id"), revision, ref, why, commit))
    if now and now != commit:
        return ("%s@%s: the manifest binds commit %s but the local hub's ref %s names %s now (staged since the "
                "manifest was written)" % (repo.get("repo_id"), revision, commit, ref, now))
    return None


def missing_paths(paths):
    """The paths of paths where nothing is (a link counts, as it is, dangling or not); a path that cannot be
    looked at (a parent that cannot be searched) raises OSError rather than passing for missing."""
    missing = []
    for path in paths:
        try:
            os.lstat(path)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
            missing.append(path)
    return missing


def file_identity(path):
    """"dev:ino:size:mtime_ns:ctime_ns" of what path resolves to; "missing" when nothing is there,
    "error:<errno>"."""
    try:
        st = os.stat(path)
    except ValueError:
        return "error:NUL"      # a NUL byte in the path: bind_problems names the mount
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "missing"
        return "error:%s" % (errno.errorcode.get(exc.errno, exc.errno))
    return "%d:%d:%d:%d:%d" % (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def files_fingerprint(paths):
    """(sha256 hex over the sorted (path, identity) pairs, the pairs, the paths that are missing)."""
    pairs = [(path, file_identity(path)) for path in sorted(set(paths))]
    digest = hashlib.sha256()
    for path, identity in pairs:
        digest.update(os.fsencode(path) + b"\0" + identity.encode("ascii") + b"\n")
    return digest.hexdigest(), pairs, [path for path, identity in pairs if identity == "missing"]


def parse_proc_net_tcp(text):
    """[(local port, socket inode)] of the LISTEN sockets in a /proc/net/tcp or tcp6 table."""
    out = []
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        try:
            port = int(fields[1].rsplit(":", 1)[1], 16)
            inode = int(fields[9])
        except (IndexError, ValueError):
            continue
        if inode:
            out.append((port, inode))
    return out


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return None


def listening_inodes(port, proc_root="/proc"):
    """Socket inodes listening on TCP `port`, IPv4 and IPv6."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for listen_port, inode in parse_proc_net_tcp(_read(os.path.join(proc_root, "net", table))):
            if listen_port == port:
                inodes.add(inode)
    return inodes


def port_holders(port, proc_root="/proc"):
    """Every process with a socket listening on TCP `port`: [{pid, command, container_id}], by pid."""
    wanted = set("socket:[%d]" % inode for inode in listening_inodes(port, proc_root))
    holders = []
    if not wanted:
        return holders
    for pid in sorted((p for p in os.listdir(proc_root) if p.isdigit()), key=int):
        fd_dir = os.path.join(proc_root, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue   # gone, or not ours to read
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                holders.append({"pid": int(pid),
                                "command": (_read(os.path.join(proc_root, pid, "comm")) or "?").strip() or "?",
                                "container_id": container_of(_read(os.path.join(proc_root, pid, "cgroup")))})
                break
    return holders


def python_modules(names, finder=None):
    """{executable, version, missing}: which top-level modules of names this Python cannot find (not imported:
    finding is enough, and importing could have side effects)."""
    if finder is None:
        import importlib.util
        finder = importlib.util.find_spec
    missing = []
    for name in names:
        try:
            found = finder(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3], "missing": missing}
