"""Name-checked copies onto the local disk: a file appears under its final name only complete and fsynced, a blob
only when the bytes written hash to its name (a peer's candidate too); a killed copy leaves TEMP_PREFIX debris.
"""
import errno
import os
import stat

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import remove_path, temp_name_for, unlink_quietly
from ansible.module_utils.dgx_hashing import ChunkBuffer, NameHasher, advise

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


# Written data is flushed and dropped from the page cache every FLUSH_EVERY bytes: 300 GB of weights
# never pile up as dirty pages or evict the running engine's cache, and the final fsync is short.
FLUSH_EVERY = 64 * 1024 * 1024


def _sync(dst_fd, final, copied, flushed=0, data_only=False):
    """Sync the copy up to `copied` bytes and drop those pages: the engine's page cache is worth more than ours."""
    try:
        (os.fdatasync if data_only else os.fsync)(dst_fd)
    except OSError as exc:
        raise LocalWriteError("flushing %s to disk failed: %s" % (final, exc), final, copied, exc.errno)
    advise(dst_fd, "POSIX_FADV_DONTNEED", flushed, copied - flushed)
    return copied


def copy_verified(source, directory, name, size, blob_name=None, progress=None, buf=None, source_fd=None):
    """Copy `source` (or the open source_fd it names) to `directory/name` through a fsynced temp file and one rename,
    hashed as blob_name is named; SourceProblem for a source that changed or hashes wrong, LocalWriteError for the
    local disk; no temp file stays."""
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
        try:
            dst_fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=directory.fd)
        except OSError as exc:
            raise LocalWriteError("cannot create a temp file in %s: %s" % (directory.path, exc), final, 0, exc.errno)
        created = True
        try:
            copied = _copy_chunks(src_fd, source, dst_fd, final, size, buf, hasher, progress)
            after = os.fstat(src_fd)
            # The source must hold still: a rewrite that restores the mtime still moves ctime.
            if copied != size or any(getattr(before, key) != getattr(after, key)
                                     for key in ("st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")):
                raise SourceProblem("%s changed while it was copied (%d bytes read, %d expected; size %d -> %d): "
                                    "is something writing the NAS copy? Re-run when it is stable; nothing was "
                                    "staged for it" % (source, copied, size, before.st_size, after.st_size), source)
            _sync(dst_fd, final, copied)
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


def _copy_chunks(src_fd, source, dst_fd, final, size, buf, hasher, progress):
    """Read, hash and write chunk by chunk; reading stops one chunk past `size` (a source that grew)."""
    copied = flushed = 0
    while copied <= size:
        try:
            got = buf.read_from(src_fd, size - copied)
        except OSError as exc:
            raise SourceProblem("reading %s failed after %d of %d bytes: %s; check the NAS"
                                % (source, copied, size, exc), source, error=exc)
        if not got:
            break
        chunk = buf.view[:got]
        if hasher is not None:
            hasher.update(chunk)
        try:
            view = chunk
            while len(view):
                view = view[os.write(dst_fd, view):]
        except OSError as exc:
            raise LocalWriteError("writing %s failed after %d of %d bytes: %s"
                                  % (final, copied, size, exc), final, copied, exc.errno)
        advise(src_fd, "POSIX_FADV_DONTNEED", copied, got)
        copied += got
        if copied - flushed >= FLUSH_EVERY:
            flushed = _sync(dst_fd, final, copied, flushed, data_only=True)
        if progress is not None:
            progress(got)
    return copied


class CandidateRejected(StageError):
    """A peer candidate that is not the blob its name says (or not a plain file): never given the name."""


def adopt_candidate(peer, directory, name, size, buf=None, progress=None):
    """Copy the regular file peer/name (never moved or linked) through copy_verified, then remove it; True when it
    gave the blob its name, False when absent, else CandidateRejected."""
    try:
        st = os.stat(name, dir_fd=peer.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CandidateRejected("it cannot be examined: %s" % _os_error_text(exc))
    try:
        fd = _open_candidate(peer, name, size, st)
        try:
            copy_verified(peer.join(name), directory, name, size, blob_name=name, progress=progress, buf=buf,
                          source_fd=fd)
        except SourceProblem as problem:
            raise CandidateRejected(
                "its bytes hash to %s, not to its name" % problem.got if problem.got is not None
                else "reading it failed: %s" % _os_error_text(problem.error) if problem.error is not None
                else "it changed while it was copied: is something still writing peer_dir?")
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
        raise CandidateRejected("it is %s, not a regular file: not opened"
                                % _KINDS.get(stat.S_IFMT(st.st_mode), "of file type %o" % stat.S_IFMT(st.st_mode)))
    if st.st_size != size:
        raise CandidateRejected("its size is %d bytes, the blob's is %d" % (st.st_size, size))
    try:
        # No link followed, and a FIFO fails or returns at once, never blocks.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=peer.fd)
    except OSError as exc:
        raise CandidateRejected("it cannot be opened: %s" % _os_error_text(exc))
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise CandidateRejected("it was replaced between its check and its opening: is something still "
                                "writing peer_dir?")
    return fd


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def _drop_candidate(peer, name, st):
    """Remove peer/name if still the non-directory `st` describes (anything else is the clean-up's)."""
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
    """Remove the scratch directory root/rel (rel: or a path below root; none: nothing) with the files and links
    (never their targets) directly in it and in rsync's delay-updates folder; another directory or a mount point in it
    stays and is named. Returns the problems as texts, never raises (it runs on failure too)."""
    if not rel:
        return []
    path = os.path.join(tree.root, rel)
    parent_rel, leaf = os.path.split(rel.rstrip("/"))
    try:
        with tree.open_dir(parent_rel) as parent:
            left = remove_path(leaf, dir_fd=parent.fd, around_mounts=True, shown_as=path,
                               enter=lambda below: below == RSYNC_DELAY_DIR)
    except FileNotFoundError:
        return []
    except Exception as exc:  # pylint: disable=broad-except  # a clean-up problem must not hide the run's
        return ["peer_dir %s was not removed: %s" % (path, exc)]
    problems = [why for _folder, why in left or [] if why]
    foreign = [os.path.relpath(folder, path) for folder, why in left or [] if not why]
    if foreign:
        problems.append("peer_dir %s holds director%s (%s) that dgx-stage does not enter: remove %s by hand"
                        % (path, "y" if len(foreign) == 1 else "ies", ", ".join(foreign),
                           "it" if len(foreign) == 1 else "them"))
    return problems
