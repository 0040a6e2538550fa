"""The mount table, read one way. Nothing is written or removed across a mount point
(a bind mount shows a folder from elsewhere): an open directory is one when its mount id (/proc/self/fdinfo, bound
to the opened directory) or st_dev differs from its parent's; without /proc: StageError, never a guess.
"""
import os
import re

from ansible.module_utils.dgx_errors import StageError

MOUNTINFO = "/proc/self/mountinfo"
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field):
    # The kernel writes space, tab, newline and backslash in mountinfo paths as \ooo.
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text):
    """[{id, dev, root, mount_point, read_only, fstype, source}] of a mountinfo text (root: what a bind shows)."""
    mounts = []
    for line in (text or "").splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        try:
            mount_id = int(fields[0])
            major, minor = (int(part) for part in fields[2].split(":"))
        except ValueError:
            continue
        tail = fields[fields.index("-", 6) + 1:] if "-" in fields[6:] else []   # fstype, source, super options
        read_only = any("ro" in options.split(",") for options in fields[5:6] + tail[2:3])
        mounts.append({"id": mount_id, "dev": (major, minor), "root": _unescape(fields[3]),
                       "mount_point": _unescape(fields[4]), "read_only": read_only,
                       "fstype": tail[0] if tail else "", "source": _unescape(tail[1]) if len(tail) > 1 else ""})
    return mounts


def _proc_missing(what, exc):
    return StageError("cannot read %s (%s): dgx-stage tells mount points by /proc and writes or removes nothing "
                      "without it; run where /proc is mounted" % (what, exc.strerror or exc))


def read_mounts():
    """parse_mountinfo of this process's mount namespace; StageError when /proc cannot be read."""
    try:
        with open(MOUNTINFO, "rb") as handle:
            # Mount points keep undecodable bytes as surrogates, as os paths do.
            return parse_mountinfo(os.fsdecode(handle.read()))
    except OSError as exc:
        raise _proc_missing(MOUNTINFO, exc)


def mount_points():
    """This namespace's mount points, same-filesystem bind mounts (same st_dev) included."""
    return set(mount["mount_point"] for mount in read_mounts())


def mount_id(fd):
    """The mount id of an open file (/proc/self/fdinfo), None before Linux 3.15; StageError without /proc."""
    path = "/proc/self/fdinfo/%d" % fd
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except OSError as exc:
        raise _proc_missing(path, exc)
    except ValueError:
        pass
    return None


def reopen(handle, flags, path):
    """The very file an O_PATH handle holds, opened with flags through its /proc link; errors name `path`."""
    return _through_handle(os.open, handle, path, flags | os.O_CLOEXEC)


def chmod_handle(handle, mode, path):
    """chmod the file of an O_PATH handle (fchmod refuses O_PATH) through its /proc link."""
    return _through_handle(os.chmod, handle, path, mode)


def _through_handle(call, handle, path, arg):
    try:
        return call("/proc/self/fd/%d" % handle, arg)
    except FileNotFoundError as exc:
        if not os.path.isdir("/proc/self/fd"):
            raise _proc_missing("/proc/self/fd", exc)
        raise OSError(exc.errno, exc.strerror, path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path)


def describe_mount(mount):
    return "%s from %s" % (mount["fstype"] or "a filesystem", mount["source"] or mount["root"])


def mount_problem(parent_fd, child_fd, path):
    """Why the open directory child_fd (at `path`) is a mount point below the open directory parent_fd, or None."""
    child_id, parent_id = mount_id(child_fd), mount_id(parent_fd)
    if os.fstat(child_fd).st_dev == os.fstat(parent_fd).st_dev:
        if child_id is not None and parent_id is not None:
            if child_id == parent_id:
                return None
        elif os.path.realpath(path) not in mount_points():
            return None
    mounted = [m for m in read_mounts() if m["id"] == child_id] or \
        [m for m in read_mounts() if m["mount_point"] == os.path.realpath(path)]
    return ("%s is a mount point (%s): dgx-stage never writes or removes anything on another mount (a bind mount "
            "shows a folder from elsewhere); unmount it, then run again; nothing below it was touched"
            % (path, describe_mount(mounted[-1]) if mounted else "another filesystem"))


def mount_point_problem(root, rel):
    """Why a directory below `root` on the way to `root/rel` is a mount point (mount_problem against its parent,
    each opened without following a link), or None; missing ones and links are linked_dir_problem's."""
    try:
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    path = root
    try:
        for part in [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]:
            path = os.path.join(path, part)
            try:
                child = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                return None
            mounted = mount_problem(fd, child, path)
            os.close(fd)
            fd = child
            if mounted:
                return ("%s is a mount point: dgx-stage never writes or removes on another mount below the local "
                        "hub root (it could be a bind mount of a folder outside the hub). Unmount it, or use a "
                        "plain directory; nothing was written or removed" % path)
        return None
    finally:
        os.close(fd)


def mounts_below(path):
    """The mounts of this namespace whose mount point is path itself or below it (path made real)."""
    real = os.path.realpath(path).rstrip(os.sep) or os.sep
    return [m for m in read_mounts()
            if m["mount_point"] == real or m["mount_point"].startswith(real + os.sep)]


def on_other_mount(fd, dir_fd):
    """Whether the open file fd is on another mount than the open directory dir_fd: by mount id (overlayfs gives a
    file its layer's st_dev), else st_dev."""
    own, parent = mount_id(fd), mount_id(dir_fd)
    if own is None or parent is None:
        return os.fstat(fd).st_dev != os.fstat(dir_fd).st_dev
    return own != parent


def is_mounted_file(path):
    """Whether the file at path (a final link not followed) is bind-mounted there."""
    folder = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        handle = os.open(os.path.basename(path), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        try:
            return on_other_mount(handle, folder)
        finally:
            os.close(handle)
    finally:
        os.close(folder)

