"""Small filesystem helpers shared by the dgx-stage modules."""
import errno
import hashlib
import os
import re
import stat

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_mounts import (chmod_handle, describe_mount, mount_problem, mounts_below, on_other_mount,
                                             reopen)


# Every temp file the project writes carries this prefix: the next run tells a killed run's debris by it.
TEMP_PREFIX = ".dgx-stage-tmp."
# The longest file name the local filesystems take (ext4, xfs: 255 bytes).
NAME_MAX = 255


def temp_name_for(name):
    """A unique temp name for `name`, recognisable as debris, never over NAME_MAX (a long name: head~digest)."""
    tail = ".%d.%s" % (os.getpid(), os.urandom(4).hex())
    room = NAME_MAX - len(TEMP_PREFIX) - len(tail)
    encoded = os.fsencode(name)
    if len(encoded) > room:
        digest = hashlib.sha1(encoded).hexdigest()[:12]
        # fsdecode maps any byte slice (even one cutting a UTF-8 sequence) back to the same bytes.
        name = "%s~%s" % (os.fsdecode(encoded[:room - len(digest) - 1]), digest)
    return TEMP_PREFIX + name + tail


# prefix, name (or head~digest), pid, 8 hex: what temp_name_for makes, and nothing a hub would hold by chance.
_TEMP_NAME = re.compile(r"^%s.+\.\d+\.[0-9a-f]{8}$" % re.escape(TEMP_PREFIX), re.DOTALL)


def is_temp_name(name):
    return bool(_TEMP_NAME.match(name))


def atomic_write_bytes(path, data, mode=0o644, dir_fd=None):
    """Write data to path (with dir_fd: a name in it) through a fsynced temp file and one rename."""
    if dir_fd is None:
        directory, name = os.path.split(os.path.abspath(path))
        parent_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    else:
        name, parent_fd = path, dir_fd
    tmp = temp_name_for(name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                # Created 0600; set the requested mode before the file becomes visible.
                os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            os.replace(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            unlink_quietly(tmp, dir_fd=parent_fd)
            raise
        os.fsync(parent_fd)     # the rename survives a crash
    finally:
        if dir_fd is None:
            os.close(parent_fd)


def open_regular(name, dir_fd, flags, mode=0o644, create=False):
    """An fd (flags, no link followed) of the regular file `name` in dir_fd, or None when missing (unless create)
    or not a regular file; looked at through O_PATH first, so a FIFO or device is never opened."""
    for _attempt in range(2):
        try:
            handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                return None
            try:
                return os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                               dir_fd=dir_fd)
            except FileExistsError:
                continue
        try:
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                return None
            return reopen(handle, flags | os.O_NONBLOCK, name)
        finally:
            os.close(handle)
    return None


def not_own_file(fd, dir_fd):
    """Why the open fd is not dir_fd's file alone (a hard link, another kind of file, a bind mount), or None."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_nlink != 1:
        return "it has %d names (a hard link)" % st.st_nlink
    if on_other_mount(fd, dir_fd):
        return "it is a mount point (a file bind-mounted there)"
    return None


def open_own_file(name, dir_fd, mode=0o644):
    """An O_RDWR fd of the regular file `name` in dir_fd that is its alone (not_own_file), created when missing;
    a hard link or other file planted there is replaced by an empty one first, a mount there is a StageError."""
    why = None
    for _attempt in range(2):
        fd = open_regular(name, dir_fd, os.O_RDWR, mode=mode, create=True)
        if fd is not None:
            why = not_own_file(fd, dir_fd)
            if why is None:
                return fd
            os.close(fd)
        try:
            atomic_write_bytes(name, b"", mode=mode, dir_fd=dir_fd)
        except OSError as exc:
            raise StageError("%s cannot be written: %s, and it cannot be replaced (%s); nothing was written to "
                             "it: unmount or remove it" % (name, why or "it is not a regular file", exc.strerror))
    raise StageError("%s keeps getting another name (a hard link) or another kind of file put in its place: "
                     "find what writes there; nothing was written to it" % name)


def open_to_read(path, follow=True):
    """A binary file object of the regular file at path, opened without blocking (a FIFO fails, EINVAL)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return os.fdopen(fd, "rb")


def read_small(name, limit, dir_fd=None):
    """At most limit bytes of the regular file name (never through a final link), or None when there is none."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return read_up_to(fd, limit) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def read_up_to(fd, limit):
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def unlink_quietly(path, dir_fd=None):
    """Remove a file or symlink if it is there; never raises (cleanup on an error path)."""
    try:
        os.unlink(path, dir_fd=dir_fd)
    except OSError:
        pass


def is_within(path, root):
    """True when path is root itself or below it (both already real, or both lexical: no resolving here)."""
    root = root.rstrip(os.sep) or os.sep
    return path == root or path.startswith(root + os.sep) or root == os.sep


def walk_tree(top, unlisted=None):
    """Every entry below top as (path, rel, is_dir), parents first, sorted, never entering a link (a link to a dir
    has is_dir true); a missing top yields nothing, an unlistable folder is a StageError unless `unlisted` takes it."""
    pending = [(top, "")]
    while pending:
        dirpath, rel_dir = pending.pop()
        try:
            with os.scandir(dirpath) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            if dirpath == top and isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                return
            if unlisted is None:
                raise _walk_error(exc.filename or dirpath, exc)
            unlisted.append(dirpath)
            continue
        dirs, files = [], []
        for entry in entries:
            try:
                (dirs if entry.is_dir() else files).append(entry)
            except OSError as exc:
                if not entry.is_symlink() and unlisted is None:
                    raise _walk_error(entry.path, exc)
                files.append(entry)
        for group, is_dir in ((dirs, True), (files, False)):
            for entry in group:
                yield entry.path, rel_dir + entry.name, is_dir
        pending.extend((entry.path, rel_dir + entry.name + "/") for entry in reversed(dirs)
                       if not entry.is_symlink())


def _walk_error(path, exc):
    return StageError("cannot list %s: %s (%s): nothing is decided from a partial listing; make the folder "
                      "readable by the user the play runs as (an NFS export with root_squash maps root to "
                      "nobody) and run again" % (path, exc.strerror, errno.errorcode.get(exc.errno, exc.errno)))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_path(path, dir_fd=None, around_mounts=False, shown_as=None, enter=None):
    """Remove a file, a symlink (never its target) or a tree (path, or a name in dir_fd) through handles, each
    directory opened from its parent without following a link, checked to be the one listed and given u+rwx when
    lacking. A mount point is a StageError, or with around_mounts left with its parents; with enter, a folder is
    entered only when enter(its '/'-separated rel). Returns False for nothing there, else True, or with
    around_mounts/enter the (path, why) pairs left (why None: not entered). Messages say shown_as."""
    if dir_fd is None:
        directory, name = os.path.split(os.path.abspath(path))
        parent_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        name, parent_fd = path, dir_fd
    leaving = around_mounts or enter is not None
    try:
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        left = []
        if stat.S_ISDIR(st.st_mode):
            _remove_tree(name, parent_fd, st, shown_as or path, left if around_mounts else None, enter=enter,
                         not_entered=left)
        else:
            _unlink_entry(name, parent_fd, shown_as or path, left if around_mounts else None)
        return left if leaving else True
    finally:
        if dir_fd is None:
            os.close(parent_fd)


def _same(st, listed):
    return (st.st_dev, st.st_ino) == (listed.st_dev, listed.st_ino)


def _listed_handle(name, parent_fd, listed, path):
    """An O_PATH handle of the directory `name` of parent_fd (no link followed), checked to be `listed`."""
    replaced = StageError("%s was replaced while it was being removed (by a link or another folder): nothing "
                          "below it was touched; run again once nothing else writes there" % path)
    try:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise replaced
        raise
    if not _same(os.fstat(handle), listed):
        os.close(handle)
        raise replaced
    return handle


def _open_listed_dir(name, parent_fd, listed, path, kept, may_chmod=True):
    """The directory `name` of parent_fd opened through _listed_handle; None for a mount point left, or one it
    cannot read without may_chmod (which gives its owner u+rwx through the handle)."""
    handle = _listed_handle(name, parent_fd, listed, path)
    try:
        if _leave(path, mount_problem(parent_fd, handle, path), kept):
            return None
        if (listed.st_mode & 0o700) != 0o700 and may_chmod:
            chmod_handle(handle, stat.S_IMODE(listed.st_mode) | 0o700, path)
        try:
            return reopen(handle, os.O_RDONLY | os.O_DIRECTORY, path)
        except PermissionError:
            if may_chmod:
                raise
            return None
    finally:
        os.close(handle)


def _unlink_entry(name, dir_fd, path, kept):
    """Unlink a non-directory; False for a file mount point left in place (_leave; unlink says EBUSY)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        mounted = [m for m in mounts_below(path) if m["mount_point"] == os.path.realpath(path)]
        problem = ("%s is a mount point (%s): dgx-stage never removes anything on another mount; unmount it, "
                   "then run again" % (path, describe_mount(mounted[-1]) if mounted else "a file bind mount"))
        _leave(path, problem, kept)
        return False
    return True


class _Level(object):
    """One directory of a removal in progress: its entries still to handle, whether something in it stays."""

    def __init__(self, name, listed, path, rel, fd):
        self.name, self.listed, self.path, self.rel, self.keeps = name, listed, path, rel, False
        with os.scandir(fd) as entries:
            self.pending = sorted(((entry.name, entry.stat(follow_symlinks=False)) for entry in entries),
                                  reverse=True)


def _remove_tree(name, parent_fd, listed, path, kept, files=True, enter=None, not_entered=None):
    """Remove the directory `name` (lstat `listed`) of parent_fd and its contents (files false: empty directories
    only); mount points are refused, or left and recorded in `kept`; a folder enter(rel) refuses stays, recorded
    in not_entered. One directory is open at a time, going up by ".." checked to be the parent (as fts does for
    rm -r): depth costs no fds or recursion, and a folder moved mid-walk stops it."""
    fd = _open_listed_dir(name, parent_fd, listed, path, kept, may_chmod=files)
    if fd is None:
        return True
    try:
        levels = [_Level(name, listed, path, "", fd)]
        while True:
            level = levels[-1]
            if level.pending:
                child, child_st = level.pending.pop()
                child_path = os.path.join(level.path, child)
                if not stat.S_ISDIR(child_st.st_mode):
                    if not files or not _unlink_entry(child, fd, child_path, kept):
                        level.keeps = True
                    continue
                child_rel = level.rel + "/" + child if level.rel else child
                if enter is not None and not enter(child_rel):
                    handle = _listed_handle(child, fd, child_st, child_path)
                    try:
                        if not _leave(child_path, mount_problem(fd, handle, child_path), kept):
                            not_entered.append((child_path, None))
                    finally:
                        os.close(handle)
                    level.keeps = True
                    continue
                child_fd = _open_listed_dir(child, fd, child_st, child_path, kept, may_chmod=files)
                if child_fd is None:
                    level.keeps = True
                    continue
                os.close(fd)
                fd = child_fd
                levels.append(_Level(child, child_st, child_path, child_rel, fd))
                continue
            levels.pop()
            if not levels:
                break
            parent = levels[-1]
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            if not _same(os.fstat(up), parent.listed):
                os.close(up)
                raise StageError("%s was moved while it was being removed: nothing more was touched; run "
                                 "again once nothing else writes there" % level.path)
            os.close(fd)
            fd = up
            if level.keeps:
                parent.keeps = True
            else:
                os.rmdir(level.name, dir_fd=fd)
    finally:
        os.close(fd)
    if not level.keeps:
        os.rmdir(name, dir_fd=parent_fd)
    return level.keeps


def _leave(path, problem, kept):
    """Whether there is a mount point `problem` at path: recorded in kept as left in place (None: StageError)."""
    if problem and kept is None:
        raise StageError(problem)
    if problem:
        kept.append((path, problem))
    return bool(problem)


def remove_empty_dirs(dir_fd, path):
    """Remove the empty directories below the open dir_fd (at `path`), through handles, never across a mount."""
    with os.scandir(dir_fd) as entries:
        children = [(entry.name, entry.stat(follow_symlinks=False)) for entry in entries]
    for child, child_st in sorted(children):
        if stat.S_ISDIR(child_st.st_mode):
            _remove_tree(child, dir_fd, child_st, os.path.join(path, child), [], files=False)


def printable_names(value):
    """value with every str valid UTF-8 for Ansible's JSON: undecodable file name bytes show as U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(value, dict):
        return dict((printable_names(k), printable_names(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [printable_names(v) for v in value]
    return value
