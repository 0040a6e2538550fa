"""Small filesystem helpers shared by the dgx-stage modules (stdlib only, Python 3.8+)."""
import hashlib
import os
import re
import stat


# Every temp file the project writes carries this prefix, so the next run can tell a killed
# run's leftovers from real content and remove them.
TEMP_PREFIX = ".dgx-stage-tmp."
# The longest file name the local filesystems take (ext4, xfs: 255 bytes).
NAME_MAX = 255


def temp_name_for(name):
    """A unique temp name for `name`, recognisable as debris and never longer than NAME_MAX bytes.

    A final name close to NAME_MAX keeps only its head plus a digest of the whole name, so the
    temp name of a 250-byte file name still fits (instead of failing with ENAMETOOLONG).
    """
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


def fsync_dir(path=None, dir_fd=None):
    """fsync a directory (by path, or an open dir_fd) so a rename or unlink inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY) if dir_fd is None else dir_fd
    try:
        os.fsync(fd)
    finally:
        if dir_fd is None:
            os.close(fd)


def atomic_write_bytes(path, data, mode=0o644, dir_fd=None):
    """Write data to path atomically: temp file in the same dir, fsync, os.replace, fsync dir.

    With dir_fd, path is a plain name inside that open directory: nothing on the way is resolved
    again, and neither the temp file nor the final name is ever followed if it is a symlink.
    Readers see either the old file or the new one, never a partial write.
    """
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
        fsync_dir(dir_fd=parent_fd)
    finally:
        if dir_fd is None:
            os.close(parent_fd)


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


def walk_tree(top):
    """Every entry below top as (path, rel, is_dir): the one way the modules walk a tree.

    Parents come before their contents and names are sorted, so the order is the same on every run.
    `rel` is relative to top and '/'-separated. A link is never entered: a link to a directory is
    listed with is_dir true (as os.walk sorts it), any other link with is_dir false. A missing top
    yields nothing.
    """
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for names, is_dir in ((dirnames, True), (sorted(filenames), False)):
            for name in names:
                path = os.path.join(dirpath, name)
                yield path, os.path.relpath(path, top).replace(os.sep, "/"), is_dir


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_path(path, dir_fd=None):
    """Remove a file, a symlink (never its target) or a whole directory tree; False if nothing was there.

    With dir_fd, path is a plain name inside that open directory. Nothing is followed: a tree is
    emptied through file descriptors, each directory opened without following a link relative to
    its parent, so a link inside it (or one swapped in while it is removed) never leads the removal
    outside. Directories the owner may not read or write are given u+rwx first, so an unprivileged
    owner removes a tree with read-only parts as root would.
    """
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        _remove_tree(path, dir_fd, st.st_mode)
    else:
        os.unlink(path, dir_fd=dir_fd)
    return True


def _remove_tree(name, parent_fd, mode):
    """Remove the directory `name` (of lstat mode `mode`) inside parent_fd and everything in it."""
    if (mode & 0o700) != 0o700:
        # lstat said directory just now (Linux has no chmod that refuses a link)
        os.chmod(name, stat.S_IMODE(mode) | 0o700, dir_fd=parent_fd)
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        with os.scandir(fd) as entries:
            children = [(entry.name, entry.stat(follow_symlinks=False).st_mode) for entry in entries]
        for child, child_mode in children:
            if stat.S_ISDIR(child_mode):
                _remove_tree(child, fd, child_mode)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def printable_names(value):
    """value with every str made valid UTF-8 for Ansible's JSON result: file names with undecodable
    bytes (surrogate escapes) show U+FFFD instead of failing the whole result on the controller."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(value, dict):
        return dict((printable_names(k), printable_names(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [printable_names(v) for v in value]
    return value
