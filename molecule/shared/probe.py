"""Runs INSIDE a node (sent by molecule/conftest.py as `python3 -c`): one JSON answer per call.

    probe.py ROOT [--stat PATH]... [--read PATH]...

tree:      every path under ROOT (links not followed): type, link text, realpath, size, nlink, device,
           and for regular files their sha256 and git blob sha1 (the two ways hub blobs are named)
root:      ROOT's realpath and device
stat:      for each --stat PATH: lexists, type, link text, realpath
read:      for each --read PATH: its text (None when missing)
mounts:    /proc/self/mountinfo as [{mount_point, options}]
statvfs:   ROOT's file system: size and free bytes

Stdlib only; the node's system Python.
"""
import argparse
import hashlib
import json
import os
import stat
import sys


def _kind(mode):
    return {stat.S_IFLNK: "link", stat.S_IFDIR: "dir", stat.S_IFREG: "file"}.get(stat.S_IFMT(mode), "other")


def _hashes(path, size):
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha256.update(chunk)
            sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest()


def _entry(path):
    st = os.lstat(path)
    kind = _kind(st.st_mode)
    out = {"type": kind, "link": os.readlink(path) if kind == "link" else None,
           "real": os.path.realpath(path), "size": st.st_size, "nlink": st.st_nlink, "dev": st.st_dev,
           "mode": st.st_mode & 0o7777, "uid": st.st_uid}
    if kind == "file":
        out["sha256"], out["gitsha1"] = _hashes(path, st.st_size)
    return out


def _unescape(field):
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--stat", action="append", default=[])
    parser.add_argument("--read", action="append", default=[])
    args = parser.parse_args(argv)
    root = args.root
    with open("/proc/self/mountinfo") as handle:
        mounts = [{"mount_point": _unescape(line.split()[4]), "options": line.split()[5].split(",")} for line in handle]
    out = {"tree": {}, "root": None, "mounts": mounts, "read": dict((path, _read(path)) for path in args.read),
           "stat": dict((path, dict(_entry(path), lexists=True) if os.path.lexists(path) else {"lexists": False})
                        for path in args.stat)}
    if os.path.isdir(root):
        for dirpath, dirnames, filenames in os.walk(root):
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                out["tree"][os.path.relpath(full, root)] = _entry(full)
        vfs = os.statvfs(root)
        out["root"] = {"real": os.path.realpath(root), "dev": os.stat(root).st_dev}
        out["statvfs"] = {"size": vfs.f_blocks * vfs.f_frsize, "free": vfs.f_bavail * vfs.f_frsize}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
