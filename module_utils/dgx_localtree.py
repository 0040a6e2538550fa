"""The local hub as a tree of real directories, written and emptied only through directories opened without
following symlinks; links replaced in one rename; the temp files a killed run left behind.
"""
import errno
import os
import stat

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import is_temp_name, temp_name_for, unlink_quietly, walk_tree
from ansible.module_utils.dgx_mounts import mount_point_problem, mount_problem


class LocalDir(object):
    """An open directory of the local tree (fd + path for messages); a context manager."""

    def __init__(self, fd, path):
        self.fd, self.path = fd, path

    def join(self, name):
        return os.path.join(self.path, name)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1    # a stray use after close fails with EBADF, never resolves against the cwd

    def __enter__(self):
        return self

    def __exit__(self, *_exc_info):
        self.close()
        return False


def _split(rel):
    return [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]


def linked_dir_problem(root, rel):
    """Why `root/rel` cannot be written through (a component is a symlink or not a directory), or None; missing
    components are made later, and root itself may be a link (where the operator put the hub)."""
    path = root
    for part in _split(rel):
        if part == "..":
            return "%s leaves the local hub root %s" % (rel, root)
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a folder above it cannot be searched: nothing shows it is a real directory
            return ("cannot look at %s (%s): run as a user that can read the local hub (become); nothing was "
                    "written or removed" % (path, exc.strerror or exc))
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(path)
            except OSError:     # removed or replaced since its lstat: still no directory to go through
                target = "?"
            return ("%s is a symlink to %s: the local hub must be real directories, and dgx-stage never writes or "
                    "removes through a link (it could reach the NAS or another repo's files). Replace the link "
                    "with a real directory (or point hub_local_root at the real location); nothing was written "
                    "or removed" % (path, target))
        if not stat.S_ISDIR(st.st_mode):
            return "%s is not a directory: move it out of the local hub; nothing was written or removed" % path
    return None


class LocalTree(object):
    """The local hub root: a tree of real directories this module owns and writes only inside."""

    def __init__(self, root):
        self.root = os.path.abspath(root)

    def refuse_unsafe_dirs(self, rel_dirs):
        """StageError for the first directory towards any of rel_dirs that is a link, a non-directory or a mount."""
        for rel in rel_dirs:
            problem = linked_dir_problem(self.root, rel) or mount_point_problem(self.root, rel)
            if problem:
                raise StageError(problem)

    def refuse_unsafe_dirs_below(self, rel):
        """Like refuse_unsafe_dirs for rel and every directory below it (snapshots nest)."""
        self.refuse_unsafe_dirs([rel])
        top = os.path.join(self.root, rel)
        self.refuse_unsafe_dirs([rel + "/" + below for _path, below, is_dir in walk_tree(top) if is_dir])

    def open_dir(self, rel, create=False):
        """LocalDir for root/rel (or the path rel below root), opened component by component, no link followed."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        path = self.root
        try:
            for part in _split(os.path.relpath(rel, self.root) if os.path.isabs(rel) else rel):
                if part == "..":
                    raise StageError("%s leaves the local hub root %s" % (rel, self.root))
                path = os.path.join(path, part)
                fd = self._open_child(fd, part, path, create)
        except BaseException:
            os.close(fd)
            raise
        return LocalDir(fd, path)

    def _open_child(self, parent_fd, name, path, create):
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            child = os.open(name, flags, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(name, 0o755, dir_fd=parent_fd)
            except FileExistsError:
                pass
            child = os.open(name, flags, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StageError(linked_dir_problem(os.path.dirname(path), name)
                                 or "%s is not a directory: %s" % (path, exc))
            raise
        problem = mount_problem(parent_fd, child, path)
        if problem:
            os.close(child)
            raise StageError(problem)       # open_dir closes parent_fd
        os.close(parent_fd)
        return child


def symlink_atomic(directory, name, target):
    """Point directory/name at target, replacing whatever is there (file, link) in one rename."""
    temp = temp_name_for(name)
    os.symlink(target, temp, dir_fd=directory.fd)
    try:
        os.replace(temp, name, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)
    except BaseException:
        unlink_quietly(temp, dir_fd=directory.fd)
        raise


def find_temp_debris(top):
    """Temp files a killed run left anywhere below top."""
    return sorted(path for path, _rel, is_dir in walk_tree(top) if not is_dir and is_temp_name(os.path.basename(path)))
