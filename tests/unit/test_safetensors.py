"""dgx_safetensors: index weight_map vs shard headers, reading headers only."""
import builtins
import json
import os
import re
import struct

import pytest

from ansible.module_utils import dgx_safetensors
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_safetensors import check_snapshot, read_header
from hubgen import write_safetensors

WIDTH = {"F16": 2, "BF16": 2, "F32": 4, "I16": 2, "U8": 1}


def header_for(tensors):
    """{name: (dtype, shape)} -> contiguous safetensors header dict and data size."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        size = WIDTH[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    return header, offset


def write_raw(path, header_bytes, data_size, length=None):
    """Write 8-byte length + header bytes + data_size bytes of data."""
    with open(str(path), "wb") as handle:
        handle.write(struct.pack("<Q", len(header_bytes) if length is None else length))
        handle.write(header_bytes)
        handle.write(b"\x5a" * data_size)
    return path


def write_shard(path, tensors=None, header=None, data_size=None):
    if header is None:
        header, size = header_for(tensors)
        data_size = size if data_size is None else data_size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return write_raw(path, raw, data_size or 0)


def tensors(prefix, n=3):
    return {"%s.%d.w" % (prefix, i): ("F16", [4, 2]) for i in range(n)}


SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def make_snapshot(tmp_path, as_links=True):
    """A hub-like repo: shards are ../../blobs links, plus the index mapping both shards."""
    repo = tmp_path / "models--org--name"
    blobs = repo / "blobs"
    snap = repo / "snapshots" / ("c" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    weight_map = {}
    for shard, prefix in ((SHARD1, "layers.0"), (SHARD2, "layers.1")):
        t = tensors(prefix)
        blob = blobs / ("blob-" + shard)
        write_shard(blob, t)
        if as_links:
            (snap / shard).symlink_to(os.path.join("..", "..", "blobs", blob.name))
        else:
            os.replace(str(blob), str(snap / shard))
        weight_map.update({k: shard for k in t})
    index = {"metadata": {"total_size": 96}, "weight_map": weight_map}
    (snap / "model.safetensors.index.json").write_text(json.dumps(index))
    return snap


def header_size(path):
    with open(str(path), "rb") as handle:
        return 8 + struct.unpack("<Q", handle.read(8))[0]


def test_valid_linked_snapshot_counts(tmp_path):
    snap = make_snapshot(tmp_path)
    result = check_snapshot(str(snap))
    assert result["shards"] == 2 and result["tensors"] == 6
    assert result["checked_bytes"] == header_size(snap / SHARD1) + header_size(snap / SHARD2)
    assert result["index"].endswith("model.safetensors.index.json")


def test_reads_headers_only(tmp_path, monkeypatch):
    snap = make_snapshot(tmp_path, as_links=False)
    read = {}
    real_open = builtins.open

    class Counting(object):
        def __init__(self, handle, name):
            self.handle, self.name = handle, name

        def read(self, n=-1):
            data = self.handle.read(n)
            read[self.name] = read.get(self.name, 0) + len(data)
            return data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def counting_open(path, mode="r", *args, **kwargs):
        return Counting(real_open(path, mode, *args, **kwargs), os.path.basename(str(path)))

    monkeypatch.setattr(dgx_safetensors, "open", counting_open, raising=False)
    result = check_snapshot(str(snap))
    assert read[SHARD1] == header_size(snap / SHARD1) < os.path.getsize(str(snap / SHARD1))
    assert read[SHARD1] + read[SHARD2] == result["checked_bytes"]


def test_key_mapped_to_shard_that_lacks_it(tmp_path):
    snap = make_snapshot(tmp_path)
    index_path = snap / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["layers.9.w"] = SHARD2
    index_path.write_text(json.dumps(index))
    with pytest.raises(StageError) as err:
        check_snapshot(str(snap))
    assert "layers.9.w" in str(err.value) and SHARD2 in str(err.value) and "lacks" in str(err.value)


def test_duplicate_key_in_two_shards(tmp_path):
    snap = make_snapshot(tmp_path)
    # The night-shift failure: a size-dedup relinked shard 1 to shard 2's blob.
    (snap / SHARD1).unlink()
    (snap / SHARD1).symlink_to(os.readlink(str(snap / SHARD2)))
    with pytest.raises(StageError) as err:
        check_snapshot(str(snap))
    msg = str(err.value)
    assert "Duplicate mapped checkpoint key: layers.1.0.w" in msg
    assert SHARD1 in msg and SHARD2 in msg


def test_duplicate_key_inside_one_header(tmp_path):
    path = tmp_path / "model.safetensors"
    entry = '{"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}'
    write_raw(path, ('{"a": %s, "a": %s}' % (entry, entry)).encode(), 1)
    with pytest.raises(StageError, match="appears twice"):
        check_snapshot(str(tmp_path))


def test_missing_shard_named_in_weight_map(tmp_path):
    snap = make_snapshot(tmp_path)
    (snap / SHARD2).unlink()
    with pytest.raises(StageError, match="%s.*missing" % SHARD2):
        check_snapshot(str(snap))


def test_dangling_shard_link(tmp_path):
    snap = make_snapshot(tmp_path)
    os.unlink(str(snap / ".." / ".." / "blobs" / ("blob-" + SHARD1)))
    with pytest.raises(StageError, match="%s.*dangling" % SHARD1):
        check_snapshot(str(snap))


def single(tmp_path, header=None, raw=None, data_size=0, length=None):
    path = tmp_path / "model.safetensors"
    if raw is not None:
        write_raw(path, raw, data_size, length)
    else:
        write_shard(path, header=header, data_size=data_size)
    return path


GOOD = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("raw,length,data,fragment", [
    (b"", None, 0, "header length 0"),
    (b"{}", 10 ** 6, 0, "header length 1000000"),
    (b"{not json}", None, 8, "invalid JSON"),
    (b"[1, 2]", None, 0, "not a JSON object"),
    (b"\xff\xfe{}", None, 0, "invalid JSON"),
])
def test_malformed_header_bytes(tmp_path, raw, length, data, fragment):
    single(tmp_path, raw=raw, length=length, data_size=data)
    with pytest.raises(StageError) as err:
        check_snapshot(str(tmp_path))
    assert fragment in str(err.value) and "model.safetensors" in str(err.value)


def test_file_shorter_than_length_prefix(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(StageError, match="shorter than the 8-byte"):
        check_snapshot(str(tmp_path))


def test_header_length_cap(tmp_path):
    path = single(tmp_path, header={"w": GOOD}, data_size=8)
    read_header(str(path))  # fine under the default cap
    with pytest.raises(StageError, match="cap 16"):
        read_header(str(path), max_bytes=16)


@pytest.mark.parametrize("field", ["dtype", "shape", "data_offsets"])
def test_missing_tensor_field(tmp_path, field):
    entry = dict(GOOD)
    del entry[field]
    single(tmp_path, header={"w": entry}, data_size=8)
    with pytest.raises(StageError, match="tensor w: missing %s" % field):
        check_snapshot(str(tmp_path))


@pytest.mark.parametrize("entry,fragment", [
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "inverted"),
    ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "non-negative"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0]}, "not [begin, end]"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, "needs 12"),
])
def test_bad_tensor_entries(tmp_path, entry, fragment):
    single(tmp_path, header={"w": entry}, data_size=16)
    with pytest.raises(StageError, match=re.escape(fragment)):
        check_snapshot(str(tmp_path))


def test_offsets_past_end_of_file(tmp_path):
    single(tmp_path, header={"w": GOOD}, data_size=4)  # truncated: 4 of 8 data bytes
    with pytest.raises(StageError, match="run past the end of the file"):
        check_snapshot(str(tmp_path))


def test_overlapping_offsets(tmp_path):
    header = {"a": GOOD, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    single(tmp_path, header=header, data_size=12)
    with pytest.raises(StageError, match="overlapping"):
        check_snapshot(str(tmp_path))


def test_overlap_hidden_behind_a_zero_length_tensor(tmp_path):
    header = {"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
              "empty": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]},
              "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}
    single(tmp_path, header=header, data_size=16)
    with pytest.raises(StageError, match="overlapping"):
        check_snapshot(str(tmp_path))


def test_unknown_dtype_is_not_size_checked(tmp_path):
    single(tmp_path, header={"w": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}, data_size=2)
    assert check_snapshot(str(tmp_path))["tensors"] == 1


def test_single_file_without_index(tmp_path):
    path = single(tmp_path, header={"w": GOOD, "__metadata__": {"format": "pt"}}, data_size=8)
    result = check_snapshot(str(tmp_path))
    assert (result["shards"], result["tensors"], result["index"]) == (1, 1, None)
    assert result["checked_bytes"] == header_size(path)


def test_no_safetensors_is_ok(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    result = check_snapshot(str(tmp_path))
    assert (result["shards"], result["tensors"], result["checked_bytes"]) == (0, 0, 0)
    assert "nothing to check" in result["msg"]


def test_explicit_index_must_exist(tmp_path):
    with pytest.raises(StageError, match="other.index.json does not exist"):
        check_snapshot(str(tmp_path), "other.index.json")


def test_explicit_index_in_subdir(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    write_shard(sub / "s.safetensors", {"w": ("F32", [2])})
    (sub / "idx.json").write_text(json.dumps({"weight_map": {"w": "s.safetensors"}}))
    assert check_snapshot(str(tmp_path), "sub/idx.json")["shards"] == 1


def test_every_broken_shard_is_reported(tmp_path):
    snap = make_snapshot(tmp_path, as_links=False)
    for shard in (SHARD1, SHARD2):
        write_raw(snap / shard, b"garbage!", 0)
    with pytest.raises(StageError) as err:
        check_snapshot(str(snap))
    assert SHARD1 in str(err.value) and SHARD2 in str(err.value)


def test_index_without_weight_map(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(StageError, match="no weight_map"):
        check_snapshot(str(tmp_path))


def test_weight_map_shard_outside_snapshot_refused(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "../x.safetensors"}}')
    with pytest.raises(StageError, match="not a relative path inside"):
        check_snapshot(str(tmp_path))


def test_path_must_be_a_directory(tmp_path):
    with pytest.raises(StageError, match="not a directory"):
        check_snapshot(str(tmp_path / "missing"))


def test_shards_left_out_on_purpose_may_be_absent_but_others_may_not(tmp_path):
    """A rank's sparse copy stages some shards only: absent_ok names the ones left out."""
    snap = tmp_path / "snap"
    snap.mkdir()
    shard_a = write_safetensors(None, {"a.w": b"1" * 8})
    (snap / "model-00001-of-00002.safetensors").write_bytes(shard_a)
    index = {"metadata": {}, "weight_map": {"a.w": "model-00001-of-00002.safetensors",
                                            "b.w": "model-00002-of-00002.safetensors"}}
    (snap / "model.safetensors.index.json").write_text(json.dumps(index))
    result = check_snapshot(str(snap), absent_ok=["model-00002-of-00002.safetensors"])
    assert result["shards"] == 1 and result["absent"] == ["model-00002-of-00002.safetensors"]
    with pytest.raises(StageError, match="model-00002-of-00002.safetensors named in .* is missing"):
        check_snapshot(str(snap))
