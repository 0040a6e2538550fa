"""Staging beside a serving engine: one cap on the read rate of all copy workers together (ReadCap), and the idle
I/O class for the module's process and the workers it starts (set_io_priority).
"""
import ctypes
import ctypes.util
import errno
import os
import platform
import threading
import time

MIB = 1024 * 1024
# The cap holds over any window of this many seconds: a read is at most READ_SLICE_S of the cap, and the pace is
# kept LATE_S plus that much under the cap, so even the window that ends with a whole read, after a read that
# started up to LATE_S after its turn (a busy machine), never sums above it.
WINDOW_S = 5.0
READ_SLICE_S = 0.1
LATE_S = 0.05
MIN_READ = 64 * 1024


class ReadCap(object):
    """At most `mib_s` MiB/s read by every worker together, averaged over any WINDOW_S: a read reserves its bytes
    on one timeline before it starts and waits for its turn. Idle time earns no credit (no burst after a pause)."""

    def __init__(self, mib_s, clock=time.monotonic, sleep=time.sleep):
        if not mib_s or mib_s < 0:
            raise ValueError("a read cap must be a positive MiB/s, not %r" % (mib_s,))
        self.mib_s = mib_s
        self.pace = mib_s * MIB * (1.0 - (READ_SLICE_S + LATE_S) / WINDOW_S)    # bytes/s
        self.largest_read = max(MIN_READ, int(mib_s * MIB * READ_SLICE_S))
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._free_at = None        # when the bytes reserved so far have been paid for
        self._mine = threading.local()  # the end of this thread's latest reservation

    def read_size(self, wanted):
        """How much one read may ask for: a read larger than a slice of the cap would be a burst."""
        return max(1, min(wanted, self.largest_read))

    def reserve(self, nbytes, stop=None):
        """Wait until `nbytes` may be read (stop: an Event that cuts the wait short; the caller checks it)."""
        delay = self.delay_for(nbytes)
        if delay > 0:
            if stop is not None:
                stop.wait(delay)
            else:
                self._sleep(delay)

    def delay_for(self, nbytes):
        """Reserve `nbytes` on the timeline; the seconds to wait before reading them."""
        with self._lock:
            now = self._clock()
            start = now if self._free_at is None or self._free_at < now else self._free_at
            self._free_at = self._mine.end = start + nbytes / self.pace
            return start - now

    def give_back(self, nbytes):
        """A read that got fewer bytes than it reserved (the end of a file) returns the rest, while its reservation
        is still the last one: a later one already has its turn, and a turn given twice would read over the cap."""
        if nbytes > 0:
            with self._lock:
                if self._free_at is not None and self._free_at == getattr(self._mine, "end", None):
                    self._free_at -= nbytes / self.pace


# ioprio_set(2) and ioprio_get(2): the syscall numbers per architecture (Python's os has no wrapper).
IOPRIO_SYSCALLS = {"x86_64": (251, 252), "aarch64": (30, 31), "arm64": (30, 31), "riscv64": (30, 31),
                   "ppc64le": (273, 274), "ppc64": (273, 274), "s390x": (282, 283)}
IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_SHIFT = 13
IO_CLASSES = {0: "none", 1: "realtime", 2: "best-effort", 3: "idle"}
IDLE_CLASS = 3
# I/O schedulers that order requests by I/O class; the others (none, kyber) ignore it.
CLASS_AWARE_SCHEDULERS = ("bfq", "mq-deadline", "cfq")


def _libc_syscall():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return libc.syscall


def set_io_priority(wanted, path=None, machine=None, syscall=None, threads=None):
    """Put every thread of this process in the I/O class `wanted` (normal: leave it as it is); the threads started
    later inherit it. What the kernel then reports for the calling thread, or why it refused: {requested, applied,
    problem, scheduler, note}; never raises."""
    report = {"requested": wanted, "applied": None, "problem": None, "scheduler": disk_scheduler(path),
              "note": None}
    if machine is None and platform.system() != "Linux":
        report["problem"] = "ioprio_set is Linux only, not %s" % platform.system()
        return report
    arch = machine or platform.machine()
    if arch not in IOPRIO_SYSCALLS:
        report["problem"] = "ioprio_set is not known on this architecture (%s)" % arch
        return report
    try:
        call = syscall or _libc_syscall()
    except OSError as exc:
        report["problem"] = "the C library cannot be loaded for ioprio_set: %s" % exc
        return report
    set_number, get_number = IOPRIO_SYSCALLS[arch]
    if wanted == "idle":
        for tid in (threads if threads is not None else _own_threads()):
            if call(set_number, IOPRIO_WHO_PROCESS, tid, IDLE_CLASS << IOPRIO_CLASS_SHIFT) != 0:
                code = ctypes.get_errno()
                if code != errno.ESRCH:         # a thread that ended meanwhile
                    report["problem"] = "the kernel refused the idle I/O class: ioprio_set failed with %s (%s)" % (
                        errno.errorcode.get(code, code), os.strerror(code))
                    break
    current = call(get_number, IOPRIO_WHO_PROCESS, 0)
    report["applied"] = IO_CLASSES.get(current >> IOPRIO_CLASS_SHIFT, str(current)) if current >= 0 else None
    if wanted == "idle" and report["applied"] == "idle" and report["scheduler"] and \
            report["scheduler"] not in CLASS_AWARE_SCHEDULERS:
        report["note"] = ("the local disk's I/O scheduler (%s) does not order requests by I/O class: there only "
                          "stage_max_mib_s keeps the engine's reads first" % report["scheduler"])
    return report


def _own_threads():
    """The thread ids of this process (the calling one as 0: ioprio_set's "this thread")."""
    try:
        return [0] + [int(tid) for tid in os.listdir("/proc/self/task") if int(tid) != threading.get_native_id()]
    except (OSError, AttributeError):
        return [0]


def disk_scheduler(path, sysfs="/sys/dev/block"):
    """The I/O scheduler of the block device holding `path` ([name] in its queue/scheduler), or None."""
    if not path:
        return None
    try:
        device = os.stat(path).st_dev
        base = os.path.join(sysfs, "%d:%d" % (os.major(device), os.minor(device)))
        for queue in (os.path.join(base, "queue"), os.path.join(base, "..", "queue")):   # a partition's: its disk's
            if os.path.isdir(queue):
                with open(os.path.join(queue, "scheduler")) as handle:
                    text = handle.read()
                return text[text.index("[") + 1:text.index("]")] if "[" in text else text.strip() or None
    except (OSError, ValueError):
        pass
    return None
