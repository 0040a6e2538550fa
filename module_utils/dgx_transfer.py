# -*- coding: utf-8 -*-
"""Crash-safe file placement on the local disk: the local hub as a tree of real directories,
name-checked copies, atomic links, temp debris, repo locks.

A file only ever appears under its final name complete and fsynced, and a blob only when the bytes
that were written hash to its name; anything a killed run left behind carries TEMP_PREFIX and is
removed by the next run (under the repo lock). Every write and removal happens relative to a
directory opened without following symlinks, so nothing outside the local hub is ever touched.
Runs on the nodes' system Python: stdlib only, Python 3.8 syntax.
"""
from __future__ import absolute_import, division, print_function

import collections
import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import stat
import threading
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import (atomic_write_bytes, is_temp_name, not_own_file, open_own_file,
                                             open_regular, remove_path, temp_name_for, unlink_quietly, walk_tree)
from ansible.module_utils.dgx_hashing import READ_CHUNK, Cancelled, ChunkBuffer, NameHasher, advise
from ansible.module_utils.dgx_mounts import mount_point_problem, mount_problem

# Errors of the local disk a copy cannot get past, reported with the space figures.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)


class SourceProblem(StageError):
    """The NAS side of one copy is wrong (hash, size, changed underneath); other copies can go on."""

    def __init__(self, message, source, blob_name=None, got=None, error=None):
        StageError.__init__(self, message)
        self.source, self.blob_name, self.got = source, blob_name, got
        self.error = error      # the OSError of a failed read, when that was the problem


class LocalWriteError(StageError):
    """Writing the local disk failed (no space, I/O error): the run cannot go on."""

    def __init__(self, message, path, written, error):
        StageError.__init__(self, message)
        self.path, self.written, self.errno = path, written, error


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
    """Why `root/rel` cannot be written through (a component is a symlink or not a directory), or None.

    Missing components are fine (they will be created as real directories). The root itself may be
    a symlink: that is where the operator put the hub.
    """
    path = root
    for part in _split(rel):
        if part == "..":
            return "%s leaves the local hub root %s" % (rel, root)
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return ("%s is a symlink to %s: the local hub must be real directories, and dgx-stage never writes or "
                    "removes through a link (it could reach the NAS or another repo's files). Replace the link "
                    "with a real directory (or point hub_local_root at the real location); nothing was written "
                    "or removed" % (path, os.readlink(path)))
        if not stat.S_ISDIR(st.st_mode):
            return "%s is not a directory: move it out of the local hub; nothing was written or removed" % path
    return None


class LocalTree(object):
    """The local hub root: a tree of real directories this module owns and writes only inside."""

    def __init__(self, root):
        self.root = os.path.abspath(root)

    def refuse_unsafe_dirs(self, rel_dirs):
        """StageError for the first directory on the way to any of rel_dirs that is a symlink, not a
        directory, or a mount point."""
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
        """LocalDir for root/rel, opened component by component without following any symlink."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        path = self.root
        try:
            for part in _split(rel):
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


def _write_all(fd, view):
    while len(view):
        written = os.write(fd, view)
        view = view[written:]


# Written data is flushed and dropped from the page cache every FLUSH_EVERY bytes: 300 GB of weights
# never pile up as dirty pages or evict the running engine's cache, and the final fsync is short.
FLUSH_EVERY = 64 * 1024 * 1024


def _flush(dst_fd, final, flushed, copied):
    try:
        os.fdatasync(dst_fd)
    except OSError as exc:
        raise LocalWriteError("flushing %s to disk failed: %s" % (final, exc), final, copied, exc.errno)
    advise(dst_fd, "POSIX_FADV_DONTNEED", flushed, copied - flushed)
    return copied


def _identity(st):
    """What must hold still while a file is copied: a rewrite that restores the mtime still moves ctime."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def copy_verified(source, directory, name, size, blob_name=None, progress=None, buf=None, source_fd=None):
    """Copy `source` to `directory/name` through a fsynced temp file and one rename; returns bytes copied.

    With source_fd (an open file of the caller's, read from its start and left open), that file is
    read and `source` only names it in messages.

    The source is read once, in large chunks: each chunk is hashed (when blob_name is given: sha256 or
    git blob sha1, as the hub named the blob) and written from the same buffer. The temp file gets
    `name` only when the source kept its size and mtime during the copy and the bytes hash to
    blob_name; otherwise SourceProblem, and no file by that name is created or replaced.
    Replacing by rename also breaks any hardlink the old file had (a wrong shard is never written through).
    Local write failures raise LocalWriteError; every failure removes the temp file.
    """
    buf = buf or ChunkBuffer()
    hasher = NameHasher(blob_name, size) if blob_name else None
    final = directory.join(name)
    if source_fd is not None:
        src_fd = os.dup(source_fd)
        os.lseek(src_fd, 0, os.SEEK_SET)
    else:
        try:
            # O_NONBLOCK: a FIFO planted on the NAS must fail the open, not hang the run holding the lock.
            src_fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise SourceProblem("cannot open %s on the NAS: %s; check the NAS mount" % (source, exc), source)
    temp = temp_name_for(name)
    created = False
    try:
        before = os.fstat(src_fd)
        if not stat.S_ISREG(before.st_mode):
            raise SourceProblem("%s is not a regular file: repair the source hub" % source, source)
        advise(src_fd, "POSIX_FADV_SEQUENTIAL")
        dst_fd = _create_temp(directory, temp, final)
        created = True
        try:
            copied = _copy_chunks(src_fd, source, dst_fd, final, size, buf, hasher, progress)
            _refuse_changed_source(src_fd, before, source, copied, size)
            _sync_to_disk(dst_fd, final, copied)
        finally:
            os.close(dst_fd)
        if hasher is not None and not hasher.matches():
            raise SourceProblem("%s does not hash to its own name %s (its bytes hash to %s): the NAS blob is "
                                "corrupt; re-download it on the NAS; nothing was staged under that name"
                                % (source, blob_name, hasher.hexdigest()), source, blob_name, hasher.hexdigest())
        os.replace(temp, name, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)
    except BaseException:
        if created:
            unlink_quietly(temp, dir_fd=directory.fd)
        raise
    finally:
        os.close(src_fd)
    return copied


def _create_temp(directory, temp, final):
    """The temp file's fd, created new in `directory` (never through a link)."""
    try:
        return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                       dir_fd=directory.fd)
    except OSError as exc:
        raise LocalWriteError("cannot create a temp file in %s: %s" % (directory.path, exc), final, 0, exc.errno)


def _copy_chunks(src_fd, source, dst_fd, final, size, buf, hasher, progress):
    """The copy loop: read a chunk, hash it, write it from the same buffer; returns bytes copied.

    Reads stop one chunk past the expected size, so a source that grew is noticed without reading
    all of it.
    """
    copied = flushed = 0
    while copied <= size:
        buf.check()
        try:
            got = os.readv(src_fd, [buf.data])
        except OSError as exc:
            raise SourceProblem("reading %s failed after %d of %d bytes: %s; check the NAS"
                                % (source, copied, size, exc), source, error=exc)
        if not got:
            break
        chunk = buf.view[:got]
        if hasher is not None:
            hasher.update(chunk)
        try:
            _write_all(dst_fd, chunk)
        except OSError as exc:
            raise LocalWriteError("writing %s failed after %d of %d bytes: %s"
                                  % (final, copied, size, exc), final, copied, exc.errno)
        advise(src_fd, "POSIX_FADV_DONTNEED", copied, got)
        copied += got
        if copied - flushed >= FLUSH_EVERY:
            flushed = _flush(dst_fd, final, flushed, copied)
        if progress is not None:
            progress(got)
    return copied


def _sync_to_disk(dst_fd, final, copied):
    """fsync the copy, then drop its pages: the engine's page cache is worth more than ours."""
    try:
        os.fsync(dst_fd)
    except OSError as exc:
        raise LocalWriteError("flushing %s to disk failed: %s" % (final, exc), final, copied, exc.errno)
    advise(dst_fd, "POSIX_FADV_DONTNEED")


def _refuse_changed_source(src_fd, before, source, copied, size):
    """SourceProblem when the source is not the file it was when the copy started."""
    after = os.fstat(src_fd)
    if copied != size or _identity(after) != _identity(before):
        raise SourceProblem("%s changed while it was copied (%d bytes read, %d expected; size %d -> %d): "
                            "is something writing the NAS copy? Re-run when it is stable; nothing was "
                            "staged for it" % (source, copied, size, before.st_size, after.st_size), source)


class CandidateRejected(StageError):
    """A peer candidate that is not the blob its name says (or not a plain file): never given the name."""


# A candidate is opened without following a link, and a FIFO must fail or return at once, never block.
_CANDIDATE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def adopt_candidate(peer, directory, name, size, buf=None, progress=None):
    """Copy the candidate `peer/name` (a copy another host sent) to `directory/name` through
    copy_verified: a new file, hashed while it is written, given the name only when its bytes hash to
    `name` at `size`. True when the blob got its name from the candidate, False when there is none.

    The candidate is never moved or linked: whatever a handle opened on it, or a hard link made to
    it, does later cannot reach the blob. It is lstat-ed first and opened only when it is a regular
    file (never a link, FIFO or device), and the open file must be the one lstat-ed. Anything else
    raises CandidateRejected. The candidate is removed right after its copy or its rejection (a
    directory is left for the peer_dir clean-up to report). `progress(count)` gets the bytes read.
    """
    try:
        st = os.stat(name, dir_fd=peer.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CandidateRejected("it cannot be examined: %s" % _os_error_text(exc))
    try:
        fd = _open_candidate(peer, name, size, st)
        try:
            _copy_candidate(peer, directory, name, size, fd, buf, progress)
        finally:
            os.close(fd)
    finally:
        _drop_candidate(peer, name, st)
    return True


def _os_error_text(exc):
    return "%s (errno %s)" % (exc.strerror or exc, exc.errno) if exc.errno else str(exc)


def _open_candidate(peer, name, size, st):
    """The fd of the regular file `st` (lstat of peer/name) describes, or CandidateRejected."""
    if stat.S_ISLNK(st.st_mode):
        raise CandidateRejected("it is a symlink, not a file: not followed")
    if not stat.S_ISREG(st.st_mode):
        raise CandidateRejected("it is %s, not a regular file: not opened" % _kind_of(st.st_mode))
    if st.st_size != size:
        raise CandidateRejected("its size is %d bytes, the blob's is %d" % (st.st_size, size))
    try:
        fd = os.open(name, _CANDIDATE_FLAGS, dir_fd=peer.fd)
    except OSError as exc:
        raise CandidateRejected("it cannot be opened: %s" % _os_error_text(exc))
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise CandidateRejected("it was replaced between its check and its opening: is something still "
                                "writing peer_dir?")
    return fd


def _copy_candidate(peer, directory, name, size, fd, buf, progress):
    try:
        copy_verified(peer.join(name), directory, name, size, blob_name=name, progress=progress, buf=buf,
                      source_fd=fd)
    except SourceProblem as problem:
        if problem.got is not None:
            raise CandidateRejected("its bytes hash to %s, not to its name" % problem.got)
        if problem.error is not None:
            raise CandidateRejected("reading it failed: %s" % _os_error_text(problem.error))
        raise CandidateRejected("it changed while it was copied: is something still writing peer_dir?")


def _kind_of(mode):
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return words
    return "of file type %o" % stat.S_IFMT(mode)


def _drop_candidate(peer, name, st):
    """Remove peer/name when it is still the entry `st` describes and not a directory (a later file
    there is the clean-up's; a directory is named by the clean-up, never entered)."""
    try:
        now = os.stat(name, dir_fd=peer.fd, follow_symlinks=False)
    except OSError:
        return
    if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) and not stat.S_ISDIR(now.st_mode):
        unlink_quietly(name, dir_fd=peer.fd)


# rsync --delay-updates (ansible.posix.synchronize's default) stages a transfer in this folder of the
# destination; an interrupted copy leaves it behind, holding files only.
RSYNC_DELAY_DIR = ".~tmp~"


def clear_peer_dir(tree, rel):
    """Remove the scratch directory root/rel and what is directly in it (files, temp files, links -
    never a link's target) and rsync's delay-updates folder with the files directly in it, through
    fsutil.remove_path; any other directory inside it, and a mount point, is not entered but named
    and stays with what holds it. Returns the problems (texts), [] when it is gone or was never there."""
    path = os.path.join(tree.root, rel)
    parent_rel, leaf = os.path.split(rel.rstrip("/"))
    try:
        with tree.open_dir(parent_rel) as parent:
            left = remove_path(leaf, dir_fd=parent.fd, around_mounts=True, shown_as=path,
                               enter=lambda below: below == RSYNC_DELAY_DIR)
    except FileNotFoundError:
        return []
    except (StageError, OSError) as exc:
        return ["peer_dir %s was not removed: %s" % (path, exc)]
    problems = [why for _folder, why in left or [] if why]
    foreign = [os.path.relpath(folder, path) for folder, why in left or [] if not why]
    if foreign:
        problems.append("peer_dir %s holds director%s (%s) that dgx-stage does not enter: remove %s by hand"
                        % (path, "y" if len(foreign) == 1 else "ies", ", ".join(foreign),
                           "it" if len(foreign) == 1 else "them"))
    return problems


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


def run_workers(items, task, workers):
    """Call task(item, buf) for every item, `workers` at a time, in the order given (biggest first
    keeps the tail short). Each worker owns one ChunkBuffer, so memory is constant.

    task handles per-item problems itself. An exception it raises (a full disk) stops the pool: no
    new item starts, the items in flight stop at their next chunk (Cancelled, removing their temp
    files), and the exception is raised here. Ctrl-C or SIGTERM in the caller's thread does the same
    before it propagates, so no worker outlives the call. With one worker (or one item) everything
    runs in the caller's thread.
    """
    pending = collections.deque(items)
    size = chunk_size(workers)
    if workers <= 1 or len(pending) <= 1:
        buf = ChunkBuffer(size)
        for item in pending:
            task(item, buf)
        return
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def worker(done):
        try:
            _work_until_done(pending, lock, stop, errors, task, ChunkBuffer(size, stop))
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
    """Start `count` worker threads and wait until each is done; Ctrl-C or SIGTERM meanwhile (even
    while they are still being started) stops all that started, each within one chunk, removing its
    temp file, before it propagates. Completion is an Event of our own: a Thread.join interrupted by
    Ctrl-C can leave that thread marked finished while it still runs."""
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
    """Delay these signals for the calling thread until the block ends (threads started inside inherit
    the mask, so the signals then reach this thread only); delivered, if any came, on the way out."""
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


# A run id as the lock file holds it (one word of ASCII).
RUN_ID = re.compile(r"^[A-Za-z0-9_.:+-]{1,80}$")


def lock_holder(text):
    """{pid, run_id, since} of the run a lock file names (`<pid> <run id> <since>`; a bare pid from an older
    release); unknown parts are None."""
    words = (text or "").split()
    pid = int(words[0]) if words and words[0].isdigit() else None
    run_id = words[1] if len(words) > 1 and words[1] != "-" else None
    since = words[2] if len(words) > 2 else None
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
    starts waiting and on_wait(None) once it holds the lock, so whoever watches it can say whom it waits for."""

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
            # A regular file is opened as found (another run may wait on it); anything else is replaced unopened.
            self._fd = open_regular(self.NAME, lock_dir.fd, os.O_RDWR, create=True)
            if self._fd is None:
                self._fd = open_own_file(self.NAME, lock_dir.fd)
            self._wait_for_lock(lock_dir)
        return self

    def _holder(self):
        return lock_holder(os.pread(self._fd, 256, 0).decode("ascii", "replace"))

    def _wait_for_lock(self, lock_dir):
        deadline = time.monotonic() + self.timeout
        waited = False
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
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



PROGRESS_NAME = "dgx-stage.progress.json"
# Its key for the NAS blobs found failing their names and not proven good since (dgx_nas_suspects).
SUSPECTS_KEY = "nas_corrupt"
# The steps of a pass whose bytes are counted: content checks of local files, then copies and repairs.
STEPS = ("hashing", "copying")
# A rate (and so an ETA) is given only once the pass has worked this long and read something.
RATE_AFTER_S = 1.0
# The progress file is rewritten at most this often while bytes move (and at every step and the end).
PROGRESS_EVERY_S = 1.0


def utc_text(seconds):
    """ISO 8601 UTC, to the second: 2026-09-27T03:14:15Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _read_json(name, dir_fd):
    """The JSON object in dir_fd/name (never through a link), or {} when absent or unreadable."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return {}
    try:
        data = json.loads(os.read(fd, 1024 * 1024).decode("utf-8"))
    except ValueError:
        return {}
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else {}


class PassMeter(object):
    """The figures of one pass of one repo, kept by every worker at once (thread-safe): bytes read on
    each side, files and bytes done and to do, the file in hand, how it ended.

    Its work comes in two steps: `hashing` (content checks of files present locally: a full hash, or
    sampled reads of both sides) and `copying` (copies and repairs; a copy's bytes are NAS reads).
    bytes_done is every byte a step read; bytes_total grows when a check reads more than planned
    (a disagreeing copy hashed), and equals bytes_done once the pass finished. A file counts once in
    files_done/files_total, when all its work is over (a repaired one after its copy).
    eta_s is null until a rate is known (RATE_AFTER_S of work and a byte read), 0 once finished.

    With attach(lock_dir), the figures go to the progress file in that directory: at each step, at
    the end, and in between at most once per `interval` seconds. The file keeps the latest figures of
    every pass under `passes` (a verify pass never hides the last stage's); its top-level keys are the
    pass running now or run last, and `nas_corrupt` holds `suspects`: the NAS blobs passes found failing
    their names and none proved good since (dgx_nas_suspects decides which; the meter keeps them).
    """

    def __init__(self, phase, repo_id, verify, clock=time.monotonic, wall=time.time, interval=None):
        self.phase, self.repo_id, self.verify = phase, repo_id, verify
        self.commit = None
        self._clock, self._wall = clock, wall
        self.interval = PROGRESS_EVERY_S if interval is None else interval
        self._lock = threading.Lock()
        self._started, self._started_at = clock(), wall()
        self._read = {"local": 0, "nas": 0}
        self._steps = dict((step, {"files_done": 0, "files_total": 0, "bytes_done": 0, "bytes_total": 0})
                           for step in STEPS)
        self._files = {"done": 0, "total": 0}
        self.step, self.current, self.status, self.error = "planning", None, "running", None
        self._dir_fd = None
        self._passes = {}
        self.suspects = {}
        self._last_write = None

    # -- what the workers report ------------------------------------------------------------------

    def plan(self, step, files, nbytes, new_files=True):
        """Add work to `step`: `files` files of `nbytes` bytes; new_files=False for a file already
        counted (a repair found by its check)."""
        with self._lock:
            figures = self._steps[step]
            figures["files_total"] += files
            figures["bytes_total"] += nbytes
            if new_files:
                self._files["total"] += files

    def begin(self, step):
        with self._lock:
            self.step = step
            self._write_locked()

    def working_on(self, path):
        with self._lock:
            self.current = path

    def count(self, step, local=0, nas=0):
        """Bytes just read by `step`, on the local disk and on the NAS."""
        with self._lock:
            self._read["local"] += local
            self._read["nas"] += nas
            figures = self._steps[step]
            figures["bytes_done"] += local + nas
            figures["bytes_total"] = max(figures["bytes_total"], figures["bytes_done"])
            if self._dir_fd is not None and self._clock() - self._last_write >= self.interval:
                self._write_locked()

    def reader(self, step, side):
        """A callback counting `side` (local or nas) bytes read by `step`: for feed_file, copy_verified."""
        return lambda count: self.count(step, **{side: count})

    def item_done(self, step, file_done=True):
        """One file's work in `step` is over (file_done: and all its work this pass)."""
        with self._lock:
            self._steps[step]["files_done"] += 1
            if file_done:
                self._files["done"] += 1

    def bytes_done(self, step):
        with self._lock:
            return self._steps[step]["bytes_done"]

    def bytes_read(self):
        with self._lock:
            return dict(self._read)

    def add_reads(self, other):
        """Count the bytes another meter read (a pre-check before the lock) in this one's tally."""
        theirs = other.bytes_read()
        with self._lock:
            for side, count in theirs.items():
                self._read[side] += count

    # -- the progress file --------------------------------------------------------------------------

    def attach(self, lock_dir):
        """Write the progress file in lock_dir from now on, keeping the other passes' figures it holds."""
        with self._lock:
            document = _read_json(PROGRESS_NAME, lock_dir.fd)
            previous = document.get("passes")
            self._passes = dict((k, v) for k, v in previous.items() if isinstance(v, dict)) \
                if isinstance(previous, dict) else {}
            suspects = document.get(SUSPECTS_KEY)
            self.suspects = dict((k, v) for k, v in suspects.items() if isinstance(v, dict)) \
                if isinstance(suspects, dict) else {}
            self._dir_fd = lock_dir.fd
            self._write_locked()

    def close(self, status, error=None):
        """The pass is over: ok, failed or interrupted (Ctrl-C, SIGTERM). Written at once; the meter
        no longer writes after this (its directory is closed by the caller)."""
        with self._lock:
            self.status, self.error = status, error
            self.step, self.current = "done", None
            if status == "ok":     # a check that stopped at its first differing sample read less than planned
                for figures in self._steps.values():
                    figures["bytes_total"] = figures["bytes_done"]
            self._write_locked()
            self._dir_fd = None

    def figures(self):
        with self._lock:
            return self._figures_locked()

    def _figures_locked(self):
        now = self._clock()
        elapsed = max(now - self._started, 0.0)
        done = sum(f["bytes_done"] for f in self._steps.values())
        total = sum(f["bytes_total"] for f in self._steps.values())
        # While running, a rate (and an ETA) once there is a second of work to judge by; at the end, the mean.
        measured = elapsed >= RATE_AFTER_S or (self.status != "running" and elapsed > 0)
        rate = done / elapsed if measured and done else None
        if self.status == "ok":
            eta = 0.0
        elif self.status == "running" and rate:
            eta = round((total - done) / rate, 1)
        else:
            eta = None
        return {
            "pass": self.phase, "repo_id": self.repo_id, "commit": self.commit, "verify": self.verify,
            "pid": os.getpid(), "started_at": utc_text(self._started_at),
            "updated_at": utc_text(self._started_at + elapsed), "elapsed_s": round(elapsed, 1),
            "step": self.step, "current": self.current,
            "files_done": self._files["done"], "files_total": self._files["total"],
            "bytes_done": done, "bytes_total": total,
            "mib_per_s": round(rate / 1048576, 1) if rate is not None else None, "eta_s": eta,
            "bytes_read": dict(self._read),
            "hashing": dict(self._steps["hashing"]), "copying": dict(self._steps["copying"]),
            "status": self.status, "finished": self.status == "ok", "aborted": self.status not in ("ok", "running"),
            "error": self.error,
        }

    def _write_locked(self):
        if self._dir_fd is None:
            return
        self._last_write = self._clock()
        figures = self._figures_locked()
        passes = dict(self._passes)
        passes[self.phase] = figures
        document = dict(figures, passes=passes)
        document[SUSPECTS_KEY] = self.suspects
        try:
            atomic_write_bytes(PROGRESS_NAME, json.dumps(document, indent=1, sort_keys=True).encode("utf-8"),
                               dir_fd=self._dir_fd)
        except OSError:
            pass   # the progress file is for watching; a full or failing disk is reported by the copy itself
