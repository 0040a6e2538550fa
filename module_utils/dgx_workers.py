"""The copy workers: a bounded thread pool within a constant buffer budget, stopped together by a failure,
Ctrl-C or SIGTERM so that none outlives the call.
"""
import collections
import contextlib
import os
import signal
import threading

from ansible.module_utils.dgx_hashing import READ_CHUNK, Cancelled, ChunkBuffer

# Blobs in flight by default: enough to overlap NAS reads, hashing and local writes on every core.
MAX_WORKERS = 8
# The read buffers of all workers together stay within this, so memory is constant whatever the
# file sizes and worker count (a worker's chunk shrinks, down to 1 MiB, as workers are added).
BUFFER_BUDGET = 32 * 1024 * 1024
MIN_CHUNK = 1024 * 1024


def default_workers():
    return max(2, min(os.cpu_count() or 2, MAX_WORKERS))


def chunk_size(workers):
    return max(MIN_CHUNK, min(READ_CHUNK, BUFFER_BUDGET // max(workers, 1)))


def run_workers(items, task, workers, cap=None):
    """Call task(item, buf) for every item in order, `workers` at a time, each worker owning one ChunkBuffer
    whose reads share the read cap `cap` (a dgx_throttle.ReadCap, or None).
    An exception from task (a full disk), Ctrl-C or SIGTERM stops the pool: no new item starts, those in
    flight stop at their next chunk (Cancelled) and the exception is raised here once no worker runs.
    One worker or one item runs in the caller's thread."""
    pending = collections.deque(items)
    size = chunk_size(workers)
    if workers <= 1 or len(pending) <= 1:
        buf = ChunkBuffer(size, cap=cap)
        for item in pending:
            task(item, buf)
        return
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def worker(done):
        try:
            _work_until_done(pending, lock, stop, errors, task, ChunkBuffer(size, stop, cap))
        finally:
            done.set()

    _start_and_wait(worker, min(workers, len(pending)), stop)
    if errors:
        raise errors[0]


def _work_until_done(pending, lock, stop, errors, task, buf):
    while not stop.is_set():
        with lock:
            if not pending:
                return
            item = pending.popleft()
        try:
            task(item, buf)
        except Cancelled:
            return
        except BaseException as exc:  # pylint: disable=broad-except  # re-raised in the caller
            with lock:
                errors.append(exc)
            stop.set()
            return


def _start_and_wait(worker, count, stop):
    """Start `count` worker threads and wait for each; Ctrl-C or SIGTERM meanwhile stops all that started before
    it propagates. Completion is an Event of our own: a Thread.join interrupted by Ctrl-C can leave a thread
    marked finished while it still runs."""
    done = []
    try:
        # Ctrl-C or SIGTERM held back while the threads start: one delivered between a thread's start and
        # its event being listed would leave that thread unwaited-for, its temp file behind at exit.
        with signals_held(signal.SIGINT, signal.SIGTERM):
            for number in range(count):
                event = threading.Event()
                thread = threading.Thread(target=worker, args=(event,), name="dgx-stage-%d" % number)
                thread.daemon = True      # SIGKILL aside, every exit below waits for it first
                thread.start()
                done.append(event)
        for event in done:
            while not event.wait(0.2):    # short waits keep Ctrl-C deliverable to this thread
                pass
    except BaseException:
        stop.set()
        for event in done:
            while not event.wait(0.2):
                pass
        raise


@contextlib.contextmanager
def signals_held(*signums):
    """Delay these signals for the calling thread (and threads started inside) until the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def raise_interrupt_on_sigterm():
    """SIGTERM stops a run the way Ctrl-C does (workers stopped, temp files removed, a result returned)."""
    def interrupt(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, interrupt)
