"""The repo lock: two runs on one local repo never interleave, and the one that waits can say for whom.
"""
import errno
import fcntl
import os
import re
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import open_own_file, open_regular
from ansible.module_utils.dgx_units import utc_text

# A run id as the lock file holds it (one word of ASCII).
RUN_ID = re.compile(r"^[A-Za-z0-9_.:+-]{1,80}$")


def lock_holder(text):
    """{pid, run_id, since} of the run a lock file names (`<pid> <run id> <since>`, or a bare pid); a part that
    is not one of ours (a control character, a terminal escape) is None, never quoted in a message."""
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
    """An exclusive flock on the lock directory `<dest>/.locks/<folder>` (a file in it could be replaced under the
    holder); the holder writes `<pid> <run id> <since>` into `dgx-stage.lock`. A waiting run calls on_wait(holder), then
    on_wait(None) once it holds the lock; a directory renamed aside while waited on is let go for the one named now.
    The holder writes through `directory` after check_held(), so a lock folder removed under it stops the run."""

    NAME = "dgx-stage.lock"

    def __init__(self, tree, lock_dir_rel, timeout, run_id=None, on_wait=None):
        self.tree = tree
        self.lock_dir_rel = lock_dir_rel
        self.timeout = timeout
        self.run_id = run_id if run_id and RUN_ID.match(run_id) else None
        self.on_wait = on_wait
        self.path = os.path.join(tree.root, lock_dir_rel, self.NAME)
        self._dir = None

    def __enter__(self):
        self._dir = self.tree.open_dir(self.lock_dir_rel, create=True)
        try:
            waited = self._wait_for_lock()
            self._write_holder()
        except BaseException:
            self._dir.close()
            self._dir = None
            raise
        if waited and self.on_wait is not None:
            self.on_wait(None)
        return self

    @property
    def directory(self):
        """The locked directory (LocalDir) while held: the holder writes through it, never through the name."""
        return self._dir

    def check_held(self):
        """StageError when the locked directory was removed or renamed while held; cheap before every write."""
        if self._dir is None or not self._still_named():
            raise StageError("the lock folder %s was removed or renamed while this run held it; another run may be "
                             "staging this repo now: check with `dgx-stage status`, then re-run"
                             % os.path.dirname(self.path))

    def _still_named(self):
        """Whether the locked directory is still the one the lock's name points to."""
        try:
            with self.tree.open_dir(self.lock_dir_rel) as named:
                now = os.fstat(named.fd)
        except (OSError, StageError):
            return False
        st = os.fstat(self._dir.fd)
        return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)

    def _holder(self):
        """Who the lock file names; unknown when it is missing or not a regular file (never followed)."""
        fd = open_regular(self.NAME, self._dir.fd, os.O_RDONLY)
        if fd is None:
            return lock_holder("")
        try:
            return lock_holder(os.pread(fd, 256, 0).decode("ascii", "replace"))
        finally:
            os.close(fd)

    def _wait_for_lock(self):
        deadline = time.monotonic() + self.timeout
        waited = False
        while True:
            try:
                fcntl.flock(self._dir.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            else:
                if self._still_named():
                    break
                self._dir.close()                       # its lock goes with it; wait on the directory named now
                self._dir = self.tree.open_dir(self.lock_dir_rel, create=True)
            if not waited and self.on_wait is not None:
                self.on_wait(self._holder())
            waited = True
            if time.monotonic() >= deadline:
                holder = holder_text(self._holder())
                raise StageError("another dgx-stage run, %s, holds %s; wait for it to finish "
                                 "or raise lock_timeout (stage_lock_timeout). A background stage or verify "
                                 "job whose controller was interrupted or killed holds it until it stops "
                                 "itself, within its lease time (2 minutes by default): re-run after that"
                                 % (holder, self.path))
            time.sleep(0.2)
        return waited

    def _write_holder(self):
        # open_own_file: a hard link, a bind mount, a FIFO or a symlink planted as the file is replaced by a
        # new file (or refused), so the pid reaches no other file.
        fd = open_own_file(self.NAME, self._dir.fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, ("%d %s %s\n" % (os.getpid(), self.run_id or "-", utc_text(time.time()))).encode("ascii"), 0)
        finally:
            os.close(fd)

    def __exit__(self, *_exc_info):
        if self._dir is not None:
            self._dir.close()
        self._dir = None
        return False
