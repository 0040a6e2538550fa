"""Blob names are hashes; sampled comparison catches a same-size different file."""
import hashlib
import os

from ansible.module_utils import dgx_hashing as hs


def git_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_name_hasher_sha256_and_git_sha1(tmp_path):
    data = os.urandom(5000)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert hs.file_matches_own_name(str(path), hashlib.sha256(data).hexdigest())
    assert hs.file_matches_own_name(str(path), git_sha1(data))
    assert not hs.file_matches_own_name(str(path), hashlib.sha256(b"other").hexdigest())
    assert hs.hash_as_named(str(path), git_sha1(data), len(data) + 1)[0] != git_sha1(data)


def test_name_is_hash():
    assert hs.name_is_hash("a" * 64) and hs.name_is_hash("b" * 40)
    assert not hs.name_is_hash("weights.bin") and not hs.name_is_hash("A" * 64)


def test_sample_ranges_cover_small_files_whole():
    assert hs.sample_ranges(0) == []
    assert hs.sample_ranges(1000) == [(0, 1000)]


def test_sample_ranges_spread_sorted_and_disjoint():
    size = 10 * 1024 * 1024 * 1024
    ranges = hs.sample_ranges(size)
    assert ranges[0] == (0, hs.SAMPLE_EDGE) and ranges[-1] == (size - hs.SAMPLE_EDGE, hs.SAMPLE_EDGE)
    assert len(ranges) == hs.SAMPLE_MIDDLE_BLOCKS + 2
    for (a, alen), (b, _blen) in zip(ranges, ranges[1:]):
        assert a + alen <= b
    middles = [off for off, _ in ranges[1:-1]]
    assert middles[0] < size // 4 and middles[-1] > 3 * size // 4


def test_samples_catch_a_difference_in_the_middle(tmp_path):
    size = 8 * 1024 * 1024
    data = bytearray(os.urandom(size))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(bytes(data))
    offset, _ = hs.sample_ranges(size)[3]
    data[offset + 10] ^= 0xFF
    b.write_bytes(bytes(data))
    assert hs.samples_match(str(a), str(a), size)
    assert not hs.samples_match(str(a), str(b), size)
