# -*- coding: utf-8 -*-
"""Crash-safe file placement on the local disk: atomic copies and links, temp debris, repo locks.

A file only ever appears under its final name complete and fsynced; anything a killed run left
behind carries TEMP_PREFIX and is removed by the next run (under the repo lock).
Runs on the nodes' system Python: stdlib only, Python 3.8 syntax.
"""
from __future__ import absolute_import, division, print_function

import errno
import fcntl
import os
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import fsync_dir, is_temp_name, temp_path_for
from ansible.module_utils.dgx_hashing import feed_file

COPY_CHUNK = 16 * 1024 * 1024


def _copy_kernel(src_fd, dst_fd, size, progress):
    """sendfile keeps the bytes in the kernel: as fast as cp when nothing needs to see them."""
    offset = 0
    while offset < size:
        sent = os.sendfile(dst_fd, src_fd, offset, min(COPY_CHUNK, size - offset))
        if sent == 0:
            break
        offset += sent
        if progress:
            progress(sent)
    return offset


def copy_atomic(source, final_path, size, hasher=None, check=None, progress=None):
    """Copy source to final_path via a fsynced temp file and a rename.

    hasher: fed the complete temp file, which the copy just left in the page cache; proving the
    local bytes (not the NAS stream) catches a bad write as well as a corrupt NAS blob.
    check(temp_path) -> error text or None: runs on the complete temp file before it gets its name.
    Replacing by rename also breaks any hardlink the old file had, so a wrong shard that was
    hardlinked here is never written through.
    """
    temp = temp_path_for(final_path)
    src_fd = os.open(source, os.O_RDONLY)
    try:
        dst_fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            copied = _copy_kernel(src_fd, dst_fd, size, progress)
            if copied != size or os.fstat(src_fd).st_size != size:
                raise StageError("%s changed while it was copied (%d of %d bytes): is something writing "
                                 "the NAS copy? Re-run when it is stable" % (source, copied, size))
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
        if hasher is not None and (feed_file(temp, hasher) != size or not hasher.matches()):
            raise StageError("%s does not hash to its own name %s: the NAS blob is corrupt; "
                             "re-download it on the NAS, nothing was staged for it" % (source, hasher.name))
        problem = check(temp) if check else None
        if problem:
            raise StageError(problem)
        os.chmod(temp, 0o644)
        os.replace(temp, final_path)
        fsync_dir(os.path.dirname(final_path))
    except BaseException:
        _unlink_quietly(temp)
        raise
    finally:
        os.close(src_fd)
    return copied


def symlink_atomic(target, final_path):
    """Point final_path at target, replacing whatever is there (file, link) in one rename."""
    temp = temp_path_for(final_path)
    os.symlink(target, temp)
    try:
        os.replace(temp, final_path)
    except BaseException:
        _unlink_quietly(temp)
        raise


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def find_temp_debris(top):
    """Temp files a killed run left anywhere below top."""
    found = []
    for dirpath, _dirs, files in os.walk(top):
        found.extend(os.path.join(dirpath, f) for f in files if is_temp_name(f))
    return sorted(found)


class RepoLock(object):
    """An exclusive flock on a lock file; two runs on one local repo never interleave."""

    def __init__(self, path, timeout):
        self.path = path
        self.timeout = timeout
        self._fd = None

    def __enter__(self):
        lock_dir = os.path.dirname(self.path)
        if not os.path.isdir(lock_dir):
            os.makedirs(lock_dir)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    holder = os.pread(self._fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                    os.close(self._fd)
                    raise StageError("another dgx-stage run (pid %s) holds %s; wait for it to finish "
                                     "or raise lock_timeout" % (holder, self.path))
                time.sleep(0.2)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode("ascii"), 0)
        return self

    def __exit__(self, *exc_info):
        os.close(self._fd)
        self._fd = None
        return False
