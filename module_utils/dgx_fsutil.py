"""Small filesystem helpers shared by the dgx-stage modules (stdlib only, Python 3.8+)."""
import os
import shutil
import stat
import sys


# Every temp file the project writes carries this prefix, so the next run can tell a killed
# run's leftovers from real content and remove them.
TEMP_PREFIX = ".dgx-stage-tmp."


def temp_path_for(final_path):
    """A unique sibling of final_path (same dir, so os.replace is atomic) recognisable as debris."""
    directory, name = os.path.split(os.path.abspath(final_path))
    return os.path.join(directory, "%s%s.%d.%s" % (TEMP_PREFIX, name, os.getpid(), os.urandom(4).hex()))


def is_temp_name(name):
    return name.startswith(TEMP_PREFIX)


def fsync_dir(path):
    """fsync a directory so a rename or unlink inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path, data, mode=0o644):
    """Write data to path atomically: temp file in the same dir, fsync, os.replace, fsync dir.

    Readers see either the old file or the new one, never a partial write.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; set the requested mode before the file becomes visible.
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


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
