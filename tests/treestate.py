"""Test oracles shared by every suite: file and blob-name hashes computed independently of
module_utils, and whole-tree snapshots to prove "nothing was written" (the NAS is read-only to
every node, but tests run as root, so permissions alone would not catch a write), and the worker
threads a stopped run must not leave behind."""
import hashlib
import json
import os
import stat
import threading
import time


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(4 * 1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def blob_matches_name(path, name):
    """True when the file's content is what its hub blob name says (sha256 or git blob sha1)."""
    if len(name) == 64:
        return sha256_file(path) == name
    digest = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(4 * 1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest() == name


def tree_snapshot(root, content=True):
    """{relative path: (mode, inode, size, mtime_ns, link text, sha256)} for root and everything below it.

    Directories are included (their mtime changes when an entry is created or removed), links are
    never followed.
    """
    root = str(root)
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + sorted(dirnames) + sorted(filenames):
            full = os.path.join(dirpath, name) if name else dirpath
            if not name and dirpath != root:
                continue  # directories are recorded by their parent's listing
            st = os.lstat(full)
            link = os.readlink(full) if stat.S_ISLNK(st.st_mode) else None
            digest = sha256_file(full) if (content and stat.S_ISREG(st.st_mode)) else None
            rel = os.path.relpath(full, root)
            snap[rel] = (st.st_mode, st.st_ino, st.st_size if not stat.S_ISDIR(st.st_mode) else None,
                         st.st_mtime_ns, link, digest)
    return snap


def snapshot_diff(before, after):
    """Readable list of what changed between two tree_snapshot() results ([] when identical)."""
    changes = []
    for path in sorted(set(before) | set(after)):
        if path not in after:
            changes.append("removed %s" % path)
        elif path not in before:
            changes.append("added %s" % path)
        elif before[path] != after[path]:
            changes.append("changed %s: %r -> %r" % (path, before[path], after[path]))
    return changes


def set_writable(root, writable):
    """chmod -R a-w (or u+w back) on a tree, never following links."""
    for dirpath, dirnames, filenames in os.walk(str(root)):
        for name in [None] + dirnames + filenames:
            full = dirpath if name is None else os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            os.chmod(full, (mode | stat.S_IWUSR) if writable else (mode & ~0o222))


def workers_still_running(grace=1.0):
    """dgx-stage worker threads still alive after a grace period (each sets its done event as its last act)."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        alive = [t for t in threading.enumerate() if t.name.startswith("dgx-stage-")]
        if not alive:
            return []
        time.sleep(0.01)
    return alive


def manifest_text(manifest):
    """The mount manifest file's text as the engine role's template renders it (to_nice_json(indent=2))."""
    return json.dumps(manifest, indent=2, sort_keys=True)
