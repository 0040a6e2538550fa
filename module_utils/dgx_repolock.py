# -*- coding: utf-8 -*-
"""The repo lock: two runs on one local repo never interleave, and the one that waits can say for whom.
Runs on the nodes' system Python: stdlib only, Python 3.8 syntax.
"""
from __future__ import absolute_import, division, print_function

import errno
import fcntl
import os
import re
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import not_own_file, open_own_file, open_regular
from ansible.module_utils.dgx_units import utc_text

# A run id as the lock file holds it (one word of ASCII).
RUN_ID = re.compile(r"^[A-Za-z0-9_.:+-]{1,80}$")


def lock_holder(text):
    """{pid, run_id, since} of the run a lock file names (`<pid> <run id> <since>`; a bare pid from an older
    release); unknown parts are None. Anyone who can write the file writes what it says: a word that is not
    one of ours (a control character, a terminal escape) is unknown, never quoted in a message."""
    words = (text or "").split()
    pid = int(words[0]) if words and words[0].isdigit() and words[0].isascii() else None
    run_id = words[1] if len(words) > 1 and words[1] != "-" and RUN_ID.match(words[1]) else None
    since = words[2] if len(words) > 2 and RUN_ID.match(words[2]) else None
    return {"pid": pid, "run_id": run_id, "since": since}


def holder_text(holder):
    """'run 20261201T101648Z-d3b7 (pid 4242, since 2026-12-01T10:16:50Z)' of lock_holder's dict."""
    said = ["pid %s" % (holder.get("pid") or "unknown")]
    if holder.get("since"):
        said.append("since %s" % holder["since"])
    return "run %s (%s)" % (holder.get("run_id") or "of unknown id", ", ".join(said))


class RepoLock(object):
    """An exclusive flock on `<dest>/.locks/<folder>/dgx-stage.lock`; two runs on one local repo never
    interleave. The lock directory is opened through the local tree (never through a symlink). The holder
    writes `<pid> <run id> <since>` into the file; a run that has to wait calls on_wait(holder) once when it
    starts waiting and on_wait(None) once it holds the lock, so whoever watches it can say whom it waits for.
    The lock is held only on the file the name points to once flock returns: a file replaced meanwhile is
    let go and the new one waited on."""

    NAME = "dgx-stage.lock"

    def __init__(self, tree, lock_dir_rel, timeout, run_id=None, on_wait=None):
        self.tree = tree
        self.lock_dir_rel = lock_dir_rel
        self.timeout = timeout
        self.run_id = run_id if run_id and RUN_ID.match(run_id) else None
        self.on_wait = on_wait
        self.path = os.path.join(tree.root, lock_dir_rel, self.NAME)
        self._fd = self._replaced = None

    def __enter__(self):
        with self.tree.open_dir(self.lock_dir_rel, create=True) as lock_dir:
            self._fd = self._open(lock_dir)
            self._wait_for_lock(lock_dir)
        return self

    def _open(self, lock_dir):
        # A regular file is opened as found (another run may wait on it); anything else is replaced unopened.
        fd = open_regular(self.NAME, lock_dir.fd, os.O_RDWR, create=True)
        return open_own_file(self.NAME, lock_dir.fd) if fd is None else fd

    def _still_named(self, lock_dir):
        """Whether the locked file is still the one the lock's name points to: a run that found a hard link
        there put a new file in its place, and whoever waited on the old one must wait on the new one."""
        try:
            named = os.stat(self.NAME, dir_fd=lock_dir.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        st = os.fstat(self._fd)
        return (st.st_dev, st.st_ino) == (named.st_dev, named.st_ino)

    def _holder(self):
        return lock_holder(os.pread(self._fd, 256, 0).decode("ascii", "replace"))

    def _wait_for_lock(self, lock_dir):
        deadline = time.monotonic() + self.timeout
        waited = False
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            else:
                if self._still_named(lock_dir):
                    break
                os.close(self._fd)                      # its lock goes with it; wait on the file named now
                self._fd = self._open(lock_dir)
            if not waited and self.on_wait is not None:
                self.on_wait(self._holder())
            waited = True
            if time.monotonic() >= deadline:
                holder = holder_text(self._holder())
                os.close(self._fd)
                raise StageError("another dgx-stage run, %s, holds %s; wait for it to finish "
                                 "or raise lock_timeout (stage_lock_timeout). A background stage or verify "
                                 "job whose controller was interrupted or killed holds it until it stops "
                                 "itself, within its lease time (2 minutes by default): re-run after that"
                                 % (holder, self.path))
            time.sleep(0.2)
        if not_own_file(self._fd, lock_dir.fd):
            # A hard link or a bind mount planted in its place: the pid goes to a new file renamed over it,
            # locked too (a mount cannot be renamed over: StageError). The old one stays locked until the end,
            # as another run may wait on it.
            self._replaced = self._fd
            self._fd = open_own_file(self.NAME, lock_dir.fd)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, ("%d %s %s\n" % (os.getpid(), self.run_id or "-", utc_text(time.time()))).encode("ascii"), 0)
        if waited and self.on_wait is not None:
            self.on_wait(None)

    def __exit__(self, *_exc_info):
        for fd in (self._fd, self._replaced):
            if fd is not None:
                os.close(fd)
        self._fd = self._replaced = None
        return False
