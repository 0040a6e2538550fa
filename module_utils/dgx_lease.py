"""The lease of a background job: renewed by its polls, so a job whose controller was killed stops itself
within the lease time and releases its repo lock; a job waiting for another run's lock notes whom in it.
"""
import fcntl
import json
import os
import signal
import threading
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import open_own_file, read_small
from ansible.module_utils.dgx_jobs import LEASE_FILE, open_jobs_dir, remove_files
from ansible.module_utils.dgx_process import process_alive


def renew_lease(dest, path, pid=None, waiting=None, renewal=True):
    """Touch the lease file in the jobs dir (open_own_file: never through a link): its mtime is the last renewal.
    pid (the job's, first line) and waiting (the lock holder it waits for, second line, JSON) are the job's own
    note, written with renewal=False: its mtime is put back, under the file's flock so no poll's renewal is lost."""
    with open_jobs_dir(dest, os.path.dirname(os.path.abspath(path))) as jobs:
        fd = open_own_file(_lease_name(path), jobs.fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = os.fstat(fd)
        if pid:
            os.ftruncate(fd, 0)
            os.write(fd, ("%d\n%s" % (pid, json.dumps(waiting, sort_keys=True) + "\n" if waiting else "")).encode("ascii"))
        if renewal:
            os.utime(fd)
        else:
            os.utime(fd, ns=(before.st_atime_ns, before.st_mtime_ns))
    finally:
        os.close(fd)


def read_lease(path):
    """(pid, waiting) from the lease file (see renew_lease): None for what it does not say (no file yet, garbage)."""
    try:
        lines = (read_small(path, 4096) or b"").decode("ascii", "replace").split("\n")
    except OSError:
        return None, None
    first = lines[0].strip()
    pid = int(first) if first.isdigit() and int(first) > 1 else None
    try:
        waiting = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else None
    except ValueError:
        waiting = None
    return pid, waiting if isinstance(waiting, dict) else None


def lease_process_gone(path):
    """Whether the job process the lease names is gone (or its pid reused by another program); False when the
    lease names none or the process cannot be seen."""
    pid = read_lease(path)[0]
    if pid is None:
        return False
    if not process_alive(pid):
        return True
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"hf_hub_mirror" not in handle.read()
    except OSError:             # no /proc, or it ended just now: the next poll looks again
        return False


def lease_age(path, now=None):
    """Seconds since the lease was last renewed; None when there is no lease file (it was ended)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (time.time() if now is None else now) - st.st_mtime


def end_lease(dest, path):
    """Remove the lease file; True when it was there."""
    return bool(remove_files(dest, os.path.dirname(os.path.abspath(path)), [_lease_name(path)]))


def _lease_name(path):
    """The lease file's name, refused unless it is a lease name (LEASE_FILE)."""
    name = os.path.basename(path)
    if not LEASE_FILE.match(name):
        raise StageError("lease_file %s is not a lease file (its name must start with dgx-lease.): nothing was "
                         "written or removed" % path)
    return name


class LeaseWatch(object):
    """SIGTERM this process when its lease is not renewed for `timeout` seconds (or is gone), or at time_limit:
    a job whose controller was killed stops through its interrupted path, releasing the repo lock."""

    def __init__(self, dest, path, timeout, every=None, stop_process=None, clock=time.time, time_limit=None):
        self.dest, self.path, self.timeout = dest, path, float(timeout)
        self.fired = None
        # time_limit: stop before Ansible's async wrapper SIGKILLs the job (temp files left, no message).
        self.time_limit = float(time_limit) if time_limit else None
        self.deadline = clock() + self.time_limit if self.time_limit else None
        # A short limit is looked at often enough to beat the wrapper.
        self.every = every if every is not None else max(0.2, min(5.0, self.timeout / 4.0,
                                                                  (self.time_limit or self.timeout) / 4.0))
        self.timed_out = False
        self._clock = clock
        self._stop_process = stop_process or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self._done = threading.Event()
        self._thread = None

    def expired(self):
        """None while the lease holds, else why it does not."""
        if self.deadline is not None and self._clock() >= self.deadline:
            self.timed_out = True
            return "its time limit of %d s was reached" % self.time_limit
        age = lease_age(self.path, self._clock())
        if age is None:
            return "its lease file %s is gone" % self.path
        if age > self.timeout:
            return "its lease %s was not renewed for %d s (lease_timeout %d s)" % (self.path, age, self.timeout)
        return None

    def check(self):
        """One look at the lease: stops the process (once) when it expired; True then."""
        why = self.expired()
        if why and self.fired is None:
            self.fired = why
            self._stop_process()
        return bool(why)

    def note_waiting(self, holder):
        """RepoLock's on_wait: say in the lease file whom the job waits for (None: no one now), keeping its
        mtime - the job's own write is no renewal."""
        try:
            renew_lease(self.dest, self.path, os.getpid(), holder, renewal=False)
        except (OSError, StageError):
            pass    # the note is for the operator's eyes; the lock wait goes on

    def start(self):
        renew_lease(self.dest, self.path, os.getpid())   # the job's start is a renewal; its pid lets polls see it die
        self._thread = threading.Thread(target=self._watch, name="dgx-stage-lease")
        self._thread.daemon = True
        self._thread.start()
        return self

    def _watch(self):
        while not self._done.wait(self.every):
            if self.check():
                return

    def stop(self):
        self._done.set()

    def message(self):
        if self.timed_out:
            return ("stopped: %s (the background job's time limit, stage_async_timeout less a margin): raise "
                    "stage_async_timeout (seconds) for a pass this long" % self.fired)
        return ("stopped: %s - the controller that started this background job is gone (killed or "
                "interrupted) or stopped polling it" % self.fired)
