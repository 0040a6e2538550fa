"""Small filesystem helpers shared by the dgx-stage modules (stdlib only, Python 3.8+)."""
import hashlib
import os
import re
import shutil
import stat
import sys


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


def temp_path_for(final_path):
    """A unique sibling of final_path (same dir, so os.replace is atomic) recognisable as debris."""
    directory, name = os.path.split(os.path.abspath(final_path))
    return os.path.join(directory, temp_name_for(name))


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


def make_dirs_owner_writable(root):
    """Add u+rwx to root and every directory below it, never following symlinks.

    Lets a tree with read-only (or unreadable) directories be removed by its owner.
    """
    _add_owner_rwx(root)
    for dirpath, dirnames, _filenames in os.walk(root):
        for name in dirnames:
            _add_owner_rwx(os.path.join(dirpath, name))


def _add_owner_rwx(path):
    st = os.lstat(path)
    # os.walk lists symlinks to directories in dirnames; chmod would follow them out of the tree.
    if stat.S_ISDIR(st.st_mode) and (st.st_mode & 0o700) != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)


def _chmod_and_retry(func, path, _exc):
    """rmtree error hook: make the entry and its parent writable, then retry once."""
    parent = os.path.dirname(path)
    _add_owner_rwx(parent)
    if os.path.isdir(path) and not os.path.islink(path):
        _add_owner_rwx(path)
    func(path)


def remove_path(path):
    """Remove a file, a symlink (never its target) or a whole directory tree.

    Read-only directories and files inside a tree are chmod-ed before removal.
    Returns False if nothing was there.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return True
    make_dirs_owner_writable(path)
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=_chmod_and_retry)  # pylint: disable=unexpected-keyword-arg
    else:
        shutil.rmtree(path, onerror=_chmod_and_retry)
    return True


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
