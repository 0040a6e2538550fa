# -*- coding: utf-8 -*-
"""Content checks for hub blobs: a blob's name is its hash, and sampled comparison against the NAS.

Runs on the nodes' system Python: stdlib only, Python 3.8 syntax.
"""
from __future__ import absolute_import, division, print_function

import hashlib
import re

SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
GIT_SHA1_NAME = re.compile(r"^[0-9a-f]{40}$")
READ_CHUNK = 1024 * 1024

# Sampled comparison: head and tail catch truncation and headers; blocks spread over the middle
# catch a different shard of the same size. Cheap (~2.5 MiB a blob) and it reads content, so it
# survives stale NFS attributes that fool size/mtime checks.
SAMPLE_EDGE = 1024 * 1024
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


def feed_file(path, consumer, chunk=READ_CHUNK):
    """Stream a file into consumer.update() through one reused buffer; returns the byte count."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            got = handle.readinto(buf)
            if not got:
                return total
            consumer.update(view[:got])
            total += got


def file_matches_name(path, name, size):
    """True when the file's content hashes to its blob name (no source read needed)."""
    hasher = NameHasher(name, size)
    if feed_file(path, hasher) != size:
        return False
    return hasher.matches()


def file_sha256(path):
    digest = hashlib.sha256()
    feed_file(path, digest)
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


def sampled_digest(path, ranges):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for offset, length in ranges:
            handle.seek(offset)
            digest.update(handle.read(length))
    return digest.hexdigest()


def samples_match(local_path, source_path, size):
    """Same bytes at the sampled ranges of both files (caller has checked both sizes equal `size`)."""
    ranges = sample_ranges(size)
    return sampled_digest(local_path, ranges) == sampled_digest(source_path, ranges)
