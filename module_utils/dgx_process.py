"""Whether a process is still there, the one way the dgx-stage code asks.
"""
import os


def process_started(pid):
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat field 22); None when unknown. A
    pid with another start time is another process that reuses the number."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid, started=None):
    """Whether process `pid` exists: one of another user's (EPERM) counts as alive. With `started` (see
    process_started), a process that reuses the pid does not count."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    if started is None:
        return True
    now = process_started(pid)
    return now is None or now == started
