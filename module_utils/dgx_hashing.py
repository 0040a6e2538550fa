"""Content checks for hub blobs: a blob's name is its hash, and sampled comparison against the NAS.
"""
import hashlib
import os
import re

SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
GIT_SHA1_NAME = re.compile(r"^[0-9a-f]{40}$")
READ_CHUNK = 8 * 1024 * 1024

# Sampled comparison: head and tail catch truncation and headers; blocks spread over the middle
# catch a different shard of the same size. Cheap (1 MiB a blob a side) and it reads content, so it
# survives stale NFS attributes that fool size/mtime checks.
SAMPLE_EDGE = 256 * 1024
SAMPLE_BLOCK = 64 * 1024
SAMPLE_MIDDLE_BLOCKS = 8


class NameHasher(object):
    """Hashes a stream the way the hub named the blob: sha256 for LFS, git blob sha1 otherwise."""

    def __init__(self, name, size):
        self.name = name
        if SHA256_NAME.match(name):
            self._hash = hashlib.sha256()
        elif GIT_SHA1_NAME.match(name):
            self._hash = hashlib.sha1(b"blob %d\0" % size)
        else:
            raise ValueError("blob name %r is not a sha256 or git sha1" % name)

    def update(self, data):
        self._hash.update(data)

    def hexdigest(self):
        return self._hash.hexdigest()

    def matches(self):
        return self.hexdigest() == self.name


def name_is_hash(name):
    return bool(SHA256_NAME.match(name) or GIT_SHA1_NAME.match(name))


class Cancelled(BaseException):
    """The run is stopping: a long read stops at its next chunk and its temp file is removed."""


class ChunkBuffer(object):
    """A worker's reusable read buffer, taken on first use: large chunks keep NFS streaming and let hashlib
    release the GIL. check() raises Cancelled once the run is stopping; every read waits its turn under the
    run's read cap (a dgx_throttle.ReadCap shared by all workers), when there is one."""

    def __init__(self, size=READ_CHUNK, stop=None, cap=None):
        self.size = size
        self._stop = stop
        self.cap = cap
        self._data = self._view = None

    @property
    def data(self):
        if self._data is None:
            self._data = bytearray(self.size)
            self._view = memoryview(self._data)
        return self._data

    @property
    def view(self):
        return self._view if self._view is not None else memoryview(self.data)

    def check(self):
        if self._stop is not None and self._stop.is_set():
            raise Cancelled()

    def pace(self, nbytes):
        """Wait until the read cap lets `nbytes` be read (at once without a cap)."""
        if self.cap is not None:
            self.cap.reserve(nbytes, self._stop)
        self.check()

    def read_from(self, fd, left=None):
        """One read of fd into the buffer, within the read cap: the byte count (0 at the end of the file). left: the
        bytes the caller still expects (None: unknown); under a cap a read where none are left asks for one byte, so
        the read that finds the end of a file holds no turn of the cap that other workers wait behind."""
        self.check()
        if self.cap is None:
            return os.readv(fd, [self.data])
        wanted = self.cap.read_size(self.size if left is None or left < 0 else max(1, min(self.size, left)))
        self.pace(wanted)
        got = os.readv(fd, [self.view[:wanted]])
        self.cap.give_back(wanted - got)
        return got


def advise(fd, advice, offset=0, length=0):
    """posix_fadvise `advice` on a range (the whole file by default), where supported."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, getattr(os, advice))
        except (OSError, AttributeError):
            pass


def feed_file(path, consumer, buf=None, on_read=None, dir_fd=None):
    """Stream a file into consumer.update(), returning the byte count; pages are dropped once hashed, so re-proving
    300 GB never evicts the running engine's page cache. dir_fd: path is a name in that open directory, and a
    symlink there is not followed (what is read is what the caller then keeps or removes through the same fd)."""
    buf = buf or ChunkBuffer()
    total = 0
    nofollow = os.O_NOFOLLOW if dir_fd is not None else 0
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | nofollow, dir_fd=dir_fd)
    try:
        advise(fd, "POSIX_FADV_SEQUENTIAL")
        expected = os.fstat(fd).st_size
        while True:
            got = buf.read_from(fd, expected - total)
            if not got:
                return total
            consumer.update(buf.view[:got])
            advise(fd, "POSIX_FADV_DONTNEED", total, got)
            total += got
            if on_read is not None:
                on_read(got)
    finally:
        os.close(fd)


def hash_as_named(path, name, size=None, buf=None, on_read=None, dir_fd=None):
    """(hex digest, bytes read) of the file hashed as blob `name` is named, at `size` (default its own)."""
    if size is None:
        size = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_size
    hasher = NameHasher(name, size)
    count = feed_file(path, hasher, buf, on_read, dir_fd)
    return hasher.hexdigest(), count


def file_matches_own_name(path, name, buf=None):
    """Whether the file hashes to its blob name at its own size: which side is right, without a NAS read."""
    size = os.lstat(path).st_size
    digest, count = hash_as_named(path, name, size, buf)
    return count == size and digest == name


def file_sha256(path, buf=None, on_read=None):
    digest = hashlib.sha256()
    feed_file(path, digest, buf, on_read)
    return digest.hexdigest()


def sample_ranges(size, edge=SAMPLE_EDGE, block=SAMPLE_BLOCK, middle=SAMPLE_MIDDLE_BLOCKS):
    """Sorted, non-overlapping (offset, length) ranges: head, evenly spread middle blocks, tail."""
    if size <= 2 * edge + middle * block:
        return [(0, size)] if size else []
    ranges = [(0, edge)]
    span = size - 2 * edge - block
    for i in range(middle):
        ranges.append((edge + span * (i + 1) // (middle + 1), block))
    ranges.append((size - edge, edge))
    return ranges


def sampled_bytes(size):
    """Bytes samples_match reads from each side of a file of `size` bytes when they all match."""
    return sum(length for _offset, length in sample_ranges(size))


def _sample_reads(size, buf):
    """The sampled ranges, each cut into reads the read cap allows for a pair (one read on each side)."""
    cap = getattr(buf, "cap", None)
    for offset, length in sample_ranges(size):
        step = length if cap is None else max(1, cap.read_size(length) // 2)
        for start in range(offset, offset + length, step):
            yield start, min(step, offset + length - start)


def samples_match(local_path, source_path, size, on_read=None, buf=None):
    """Same raw bytes at the sampled ranges of both files of `size` bytes (a byte changed between two samples is
    not seen: verify=full is); buf paces the reads under its read cap."""
    fds = []
    try:
        for path in (local_path, source_path):
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
            advise(fds[-1], "POSIX_FADV_RANDOM")    # read the samples, not the readahead around them
        for offset, length in _sample_reads(size, buf):
            if buf is not None:
                buf.pace(2 * length)
            local, nas = os.pread(fds[0], length, offset), os.pread(fds[1], length, offset)
            if on_read is not None:
                on_read(len(local), len(nas))
            if local != nas:
                return False
        return True
    finally:
        for fd in fds:
            os.close(fd)
