"""What the engine container would meet on this node (the mount manifest, the identity of the files it binds,
who listens on the API port), read without changing anything."""

import errno
import hashlib
import importlib.util
import json
import os
import stat
import sys

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import is_within
from ansible.module_utils.dgx_localtree import LocalTree
from ansible.module_utils.dgx_mountspec import mount_path_problem
from ansible.module_utils.dgx_receipts import container_of, fd_links, process_name, read_text

TCP_LISTEN = "0A"


def read_manifest(path):
    """(the mount manifest JSON at path, None), or (None, why it cannot be read or used)."""
    try:
        with open(path, "rb") as handle:
            manifest = json.loads(handle.read().decode("utf-8"))
    except OSError as exc:
        return None, "cannot read it: %s" % (exc.strerror or exc)
    except ValueError as exc:
        return None, "not JSON: %s" % exc
    return checked_manifest(manifest)


def checked_manifest(manifest):
    """(manifest, None) when it is shaped as engine_manifest writes it, else (None, what makes it no manifest)."""
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
    """The host paths the manifest binds from the local disk: a restage or a repair gives them a new inode."""
    return [mount["source"] for mount in manifest.get("mounts") or [] if mount.get("origin") == "local"]


def bind_problems(manifest):
    """Why the lane cannot start from the manifest as it is, one text each: the runtime would fail a rank's start
    after the earlier ranks were stopped, or bind other bytes than the staged ones."""
    manifest, shape = checked_manifest(manifest)
    if manifest and not all(isinstance(repo, dict) for repo in manifest["repos"]):
        shape = "not a mount manifest: a repo is not an object"
    if shape:
        return ["%s; write it again (the manifest play)" % shape]
    problems, unbindable = [], set()
    for index, mount in enumerate(manifest["mounts"]):
        for key in ("source", "target"):
            why = mount_path_problem(mount[key])
            if why:
                problems.append("mount %d of the manifest: its %s %s" % (index, key, why))
                unbindable.add(index)
    mounts = [mount for index, mount in enumerate(manifest["mounts"]) if index not in unbindable]
    for origin, say, unusable in (("local", "%s %s", _local_unusable), ("nas", "NAS source %s %s", _nas_unusable)):
        snapshots = _snapshots(manifest, origin + "_snapshot")
        for path in sorted(set(m["source"] for m in mounts if m.get("origin") == origin)):
            why = unusable(path, snapshots)
            if why:
                problems.append(say % (path, why))
    return problems + [moved for moved in map(_ref_moved, manifest["repos"]) if moved]


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_problem(exc):
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return "is missing"
    if exc.errno == errno.ELOOP:
        return "is a symlink, not a regular file"
    return "cannot be read (%s)" % errno.errorcode.get(exc.errno, exc.errno)


def _file_head(fd, size=0):
    """(the first size bytes of the regular file fd, None), else (None, why not); fd is closed."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "is not a regular file"
        return os.read(fd, size), None
    finally:
        os.close(fd)


def _snapshots(manifest, key):
    """[(snapshot, repo folder, hub root)] of the manifest's repos' snapshot under key."""
    found = []
    for repo in manifest["repos"]:
        snapshot = repo.get(key)
        if isinstance(snapshot, str) and snapshot:
            snapshot = os.path.normpath(snapshot)
            folder = os.path.dirname(os.path.dirname(snapshot))
            found.append((snapshot, folder, os.path.dirname(folder)))
    return found


def _staged_head(hub, rel, size=0):
    """_file_head() of the file rel ('/'-separated) below the local hub root, opened through real folders only
    (a linked folder would show the container other bytes under the staged name)."""
    folder, _sep, name = rel.rpartition("/")
    try:
        with LocalTree(hub).open_dir(folder) as parent:
            return _file_head(os.open(name, _OPEN_FLAGS, dir_fd=parent.fd), size)
    except StageError as exc:
        return None, "has a symlink or a mount on the way: %s" % exc
    except ValueError:
        return None, "cannot be opened (a NUL byte in the path)"
    except OSError as exc:
        return None, _open_problem(exc)


def _local_unusable(path, repo_folders):
    """Why the local bind source at path is not a staged file (a regular file in a local repo folder of the
    manifest, reached through real folders), or None."""
    inside = [(folder, hub) for _snap, folder, hub in repo_folders if path != folder and is_within(path, folder)]
    if not inside:
        return "is in no local repo folder of the manifest's repos (%s): a local bind is a staged file" % (
            ", ".join(sorted(set(folder for _snap, folder, _hub in repo_folders))) or "none names a local snapshot")
    hub = inside[0][1]
    return _staged_head(hub, os.path.relpath(path, hub).replace(os.sep, "/"))[1]


def _nas_unusable(path, snapshots):
    """Why a NAS bind source cannot be bound, or None: snapshot files link into the blobs, so what it resolves to
    must be a readable file (or folder) inside the NAS hub."""
    hubs = [os.path.realpath(hub) for snap, _folder, hub in snapshots if is_within(os.path.normpath(path), snap)]
    if not hubs:
        return "is in no NAS snapshot of the manifest's repos"
    real = os.path.realpath(path)
    if not is_within(real, hubs[0]):
        return "resolves to %s, outside the NAS hub %s" % (real, hubs[0])
    if os.path.isdir(real):
        return None if os.access(real, os.R_OK | os.X_OK) else "is a folder that cannot be read"
    try:
        return _file_head(os.open(real, _OPEN_FLAGS))[1]
    except OSError as exc:
        return _open_problem(exc)


def _ref_moved(repo):
    """A text when the local ref of the repo's revision names another commit than the manifest's, or cannot be
    read; no ref is no problem (the manifest took the NAS's commit)."""
    revision, commit, snapshot = repo.get("revision"), repo.get("commit"), repo.get("local_snapshot")
    if not (revision and commit and snapshot) or revision == commit:
        return None
    if not all(isinstance(value, str) for value in (revision, commit, snapshot)):
        return "%s: the manifest's revision, commit or snapshot is not text" % (repo.get("repo_id"),)
    # normpath: a snapshot written with a trailing slash names the same folder.
    folder = os.path.dirname(os.path.dirname(os.path.normpath(snapshot)))
    ref = os.path.join(folder, "refs", *revision.split("/"))
    head, why = _staged_head(os.path.dirname(folder), "%s/refs/%s" % (os.path.basename(folder), revision), 256)
    if why == "is missing":
        return None
    if why:
        return ("%s@%s: the local hub's ref %s %s, so whether the manifest's commit %s is still the one staged "
                "cannot be told; make it a file naming the commit (stage again)"
                % (repo.get("repo_id"), revision, ref, why, commit))
    now = head.decode("utf-8", "replace").strip()
    if now and now != commit:
        return ("%s@%s: the manifest binds commit %s but the local hub's ref %s names %s now (staged since the "
                "manifest was written)" % (repo.get("repo_id"), revision, commit, ref, now))
    return None


def missing_paths(paths):
    """The paths where nothing is (a link, dangling or not, is something); OSError for one that cannot be looked
    at."""
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
    """"dev:ino:size:mtime_ns:ctime_ns" of what path resolves to (ctime: a rewrite that puts the old mtime back
    still moves it), "missing" or "error:<errno>"."""
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


def listening_inodes(port, proc_root="/proc"):
    """Socket inodes listening on TCP `port`, IPv4 and IPv6 (the LISTEN rows of /proc/net/tcp and tcp6)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for line in (read_text(os.path.join(proc_root, "net", table)) or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            try:   # a row this parser cannot read is skipped: the port-holder check must not crash on it
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(int(fields[9]))
            except (IndexError, ValueError):
                continue
    return inodes - {0}


def port_holders(port, proc_root="/proc"):
    """Every process with a socket listening on TCP `port`: [{pid, command, container_id}], by pid."""
    wanted = set("socket:[%d]" % inode for inode in listening_inodes(port, proc_root))
    pids = sorted((p for p in os.listdir(proc_root) if p.isdigit()), key=int) if wanted else []
    return [{"pid": int(pid), "command": process_name(proc_root, pid),
             "container_id": container_of(read_text(os.path.join(proc_root, pid, "cgroup")))}
            for pid in pids if any(text in wanted for _link, text in fd_links(proc_root, pid))]


def python_modules(names):
    """{executable, version, missing}: the modules of names this Python cannot find (found, not imported: an import
    could have side effects)."""
    def found(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False
    return {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3],
            "missing": [name for name in names if not found(name)]}
