"""dgx_safetensors: index weight_map vs shard headers, reading headers only.

The format rules are checked against the real loader: a corpus of good and bad shards must get the
same verdict from dgx_safetensors and from the `safetensors` package (a test dependency only; the
module itself stays stdlib).
"""
import json
import os
import re
import struct

import pytest
import safetensors
import yaml
from safetensors import deserialize

import processes
from ansible.module_utils import dgx_safetensors
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_safetensors import check_snapshot, read_header, read_shard
import modrun
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

    real_open_to_read = dgx_safetensors.open_to_read

    def counting_open(path, *args, **kwargs):
        return Counting(real_open_to_read(path, *args, **kwargs), os.path.basename(str(path)))

    monkeypatch.setattr(dgx_safetensors, "open_to_read", counting_open)
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


def test_sub_byte_dtype_is_size_checked_in_bits(tmp_path):
    single(tmp_path, header={"w": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}, data_size=2)
    assert check_snapshot(str(tmp_path))["tensors"] == 1
    single(tmp_path, header={"w": {"dtype": "F4", "shape": [4], "data_offsets": [0, 1]}}, data_size=1)
    with pytest.raises(StageError, match=re.escape("span 1 bytes but F4[4] needs 2")):
        check_snapshot(str(tmp_path))


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


# --- a rank's sparse copy: the shards left on the NAS are checked there (nas_path) ----------------

def sparse_copy(tmp_path):
    """A NAS hub with both shards (../../blobs links) and a rank's local snapshot holding the index and
    SHARD1 only: (local snapshot, NAS snapshot)."""
    nas = make_snapshot(tmp_path / "nas" / "hub")
    local = tmp_path / "local" / "hub" / "models--org--name" / "snapshots" / nas.name
    local.mkdir(parents=True)
    for name in ("model.safetensors.index.json", SHARD1):
        (local / name).write_bytes((nas / name).read_bytes())
    return local, nas


def test_a_shard_left_on_the_nas_is_checked_from_its_nas_header(tmp_path):
    local, nas = sparse_copy(tmp_path)
    result = check_snapshot(str(local), absent_ok=[SHARD2], nas_path=str(nas))
    assert result["absent"] == [SHARD2] and result["nas_shards"] == [SHARD2]
    assert (result["shards"], result["tensors"]) == (2, 6)
    assert result["checked_bytes"] == header_size(local / SHARD1) + header_size(nas / SHARD2)
    assert "(1 of them read from the NAS)" in result["msg"]
    # Without nas_path the shard is skipped, as before.
    result = check_snapshot(str(local), absent_ok=[SHARD2])
    assert (result["shards"], result["tensors"], result["nas_shards"]) == (1, 3, [])


def test_the_index_is_checked_against_the_nas_header_of_a_shard_left_there(tmp_path):
    """A key the index maps to the NAS shard that lacks it, and a key in a local and a NAS shard, both fail."""
    local, nas = sparse_copy(tmp_path)
    index = json.loads((local / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.1.9.w"] = SHARD2
    (local / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(StageError, match="maps layers.1.9.w to %s, but that shard lacks it" % SHARD2):
        check_snapshot(str(local), absent_ok=[SHARD2], nas_path=str(nas))
    assert check_snapshot(str(local), absent_ok=[SHARD2])["shards"] == 1     # not seen without nas_path

    local, nas = sparse_copy(tmp_path / "dup")
    write_shard(local / SHARD1, tensors("layers.1"))      # the local shard holds the NAS shard's keys
    index = {"weight_map": dict([(k, SHARD1) for k in tensors("layers.1")] + [("other", SHARD2)])}
    (local / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(StageError, match="Duplicate mapped checkpoint key: layers.1.0.w is in both"):
        check_snapshot(str(local), absent_ok=[SHARD2], nas_path=str(nas))


def test_a_nas_shard_whose_link_leaves_the_nas_hub_is_not_read(tmp_path):
    local, nas = sparse_copy(tmp_path)
    outside = write_shard(tmp_path / "elsewhere.safetensors", tensors("layers.1"))
    blob = nas.parent.parent / "blobs" / ("blob-" + SHARD2)
    blob.unlink()
    blob.symlink_to(outside)
    with pytest.raises(StageError) as err:
        check_snapshot(str(local), absent_ok=[SHARD2], nas_path=str(nas))
    assert SHARD2 in str(err.value) and "outside the source hub root" in str(err.value)


def test_a_shard_missing_from_the_nas_snapshot_fails_naming_it(tmp_path):
    local, nas = sparse_copy(tmp_path)
    (nas / SHARD2).unlink()
    with pytest.raises(StageError, match="%s is not on the local disk and .* is not in the NAS snapshot" % SHARD2):
        check_snapshot(str(local), absent_ok=[SHARD2], nas_path=str(nas))


def test_nas_path_must_be_a_snapshot_dir_and_is_only_read_for_an_absent_shard(tmp_path):
    local, nas = sparse_copy(tmp_path)
    with pytest.raises(StageError, match="not a NAS snapshot directory"):
        check_snapshot(str(local), absent_ok=[SHARD2], nas_path=str(nas.parent.parent))
    (local / SHARD2).write_bytes((nas / SHARD2).read_bytes())
    result = check_snapshot(str(local), absent_ok=[SHARD2], nas_path=str(tmp_path / "no-such-nas"))
    assert (result["shards"], result["nas_shards"], result["absent"]) == (2, [], [])


def test_module_reports_the_shards_read_from_the_nas(tmp_path):
    local, nas = sparse_copy(tmp_path)
    result = run_main({"path": str(local), "absent_ok": [SHARD2], "nas_path": str(nas), "repo_id": "org/name"})
    assert not result.get("failed"), result
    assert result["nas_shards"] == [SHARD2]
    assert result["report"] == {"repo_id": "org/name", "shards": 2, "tensors": 6, "nas_shards": 1}


# --- the format, exactly: a corpus of shards judged by the real safetensors loader ---------------

def test_the_loader_is_the_pinned_version():
    """The rules (DTYPE_BITS, caps) were read from this version; a new pin means re-reading them."""
    assert safetensors.__version__ == "0.8.0"


def st(header, data=0, length=None):
    """Shard bytes: 8-byte little-endian length, the header, then the data section.

    header: a dict (dumped compactly), a str (encoded as UTF-8) or raw bytes; data: bytes, or an
    int for that many filler bytes; length: the length field when it must lie about the header.
    """
    if isinstance(header, bytes):
        raw = header
    elif isinstance(header, str):
        raw = header.encode("utf-8")
    else:
        raw = json.dumps(header, separators=(",", ":")).encode()
    if isinstance(data, int):
        data = b"\x5a" * data
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


E1 = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'  # a one-byte tensor, as header text


def with_field(value):
    """Header text: one valid one-byte tensor carrying an extra field (the loader ignores it)."""
    return '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":%s}}' % value


def meta(value):
    return '{"__metadata__":{"k":%s}}' % value


U64_MAX = 2 ** 64 - 1

GOOD_SHARDS = [
    ("one-tensor", st({"w": t("F32", [2], 0, 8)}, 8)),
    ("tensors-and-metadata", st({"__metadata__": {"format": "pt"}, "a": t("F16", [2, 2], 0, 8),
                                 "b": t("BF16", [3], 8, 14)}, 14)),
    ("header-padded-with-spaces", st('{"a":%s}' % E1 + " " * 7, 1)),
    ("whitespace-around-header", st(' \n\t{"a":%s}\r\n ' % E1, 1)),
    ("header-order-is-not-data-order", st({"b": t("U8", [2], 2, 4), "a": t("U8", [2], 0, 2)}, 4)),
    ("zero-size-tensors-on-boundaries", st({"z0": t("U8", [0], 0, 0), "a": t("U8", [4], 0, 4),
                                            "z1": t("F32", [0, 5], 4, 4), "b": t("U8", [2], 4, 6),
                                            "z2": t("U8", [3, 0], 6, 6)}, 6)),
    ("scalar", st({"s": t("F64", [], 0, 8)}, 8)),
    ("empty-header-no-data", st("{}")),
    ("metadata-only", st({"__metadata__": {"a": "b"}})),
    ("metadata-null", st('{"__metadata__":null}')),
    ("metadata-key-repeated", st('{"__metadata__":{"a":"b","a":"c"}}')),
    ("empty-tensor-name", st({"": t("U8", [1], 0, 1)}, 1)),
    ("escapes-and-surrogate-pair", st('{"__metadata__":{"e":"\\ud83d\\ude00\\n\\/"},"caf\\u00e9":%s}'
                                      % E1, 1)),
    ("brackets-inside-strings", st(meta('"\\"' + "[{" * 5000 + '"'), 0)),
    ("unknown-entry-fields-ignored", st(with_field('[1,{"y":null,"y":[true,-5,-0,1.5e3]},"s",1e-999]'), 1)),
    ("big-integer-in-unknown-field", st(with_field("1" + "0" * 300), 1)),
    ("nesting-127-levels", st(with_field("[" * 125 + "]" * 125), 1)),
    ("entry-as-array", st('{"a":["U8",[1],[0,1]]}', 1)),
    ("dtype-as-unit-variant-map", st('{"a":{"dtype":{"U8":null},"shape":[1],"data_offsets":[0,1]}}', 1)),
    ("zero-dim-before-huge-dims", st({"a": t("U8", [0, U64_MAX, 2], 0, 0)})),
    ("f4-whole-bytes", st({"a": t("F4", [2, 3], 0, 3)}, 3)),
    ("f6-whole-bytes", st({"a": t("F6_E2M3", [4], 0, 3), "b": t("F6_E3M2", [8], 3, 9)}, 9)),
]

BAD_SHARDS = [
    ("empty-file", b""),
    ("shorter-than-length-field", b"\x02\x00\x00\x00\x00\x00\x00"),
    ("header-length-0", st(b"")),
    ("header-length-past-end-of-file", st("{}", 0, length=64)),
    ("header-length-over-100MB-cap", st("{}", 0, length=100000001)),
    ("gap-between-tensors", st({"a": t("U8", [2], 0, 2), "b": t("U8", [2], 4, 6)}, 6)),
    ("gap-at-start", st({"a": t("U8", [2], 2, 4)}, 4)),
    ("trailing-bytes", st({"a": t("U8", [2], 0, 2)}, 3)),
    ("data-past-end-of-file", st({"a": t("U8", [4], 0, 4)}, 2)),
    ("overlap", st({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 2, 6)}, 6)),
    ("same-range-twice", st({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 0, 4)}, 4)),
    ("zero-size-inside-another", st({"a": t("U8", [4], 0, 4), "z": t("U8", [0], 2, 2)}, 4)),
    ("zero-size-past-the-end", st({"a": t("U8", [1], 0, 1), "z": t("U8", [0], 2, 2)}, 1)),
    ("empty-header-with-data", st("{}", 4)),
    ("unknown-dtype", st({"a": t("F8_E4M3FN", [1], 0, 1)}, 1)),
    ("lowercase-dtype", st({"a": t("f32", [1], 0, 4)}, 4)),
    ("dtype-null", st({"a": t(None, [1], 0, 1)}, 1)),
    ("dtype-list", st({"a": t(["U8"], [1], 0, 1)}, 1)),
    ("dtype-map-to-non-null", st('{"a":{"dtype":{"U8":0},"shape":[1],"data_offsets":[0,1]}}', 1)),
    ("dtype-map-two-keys", st('{"a":{"dtype":{"U8":null,"U8":null},"shape":[1],"data_offsets":[0,1]}}', 1)),
    ("shape-times-dtype-is-not-the-range", st({"a": t("F32", [3], 0, 8)}, 8)),
    ("sub-byte-not-whole-bytes", st({"a": t("F4", [3], 0, 2)}, 2)),
    ("negative-offset", st({"a": t("U8", [1], -1, 0)}, 1)),
    ("float-offset", st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0.0,1]}}', 1)),
    ("exponent-offset", st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1e0]}}', 1)),
    ("negative-zero-offset", st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-0,1]}}', 1)),
    ("offset-2**64", st({"a": t("U8", [0], 2 ** 64, 2 ** 64)})),
    ("inverted-offsets", st({"a": t("U8", [1], 1, 0)}, 1)),
    ("three-offsets", st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}', 1)),
    ("offsets-object", st('{"a":{"dtype":"U8","shape":[1],"data_offsets":{"0":0,"1":1}}}', 1)),
    ("negative-dim", st({"a": t("U8", [-1], 0, 1)}, 1)),
    ("float-dim", st('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', 1)),
    ("bool-dim", st('{"a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', 1)),
    ("shape-null", st('{"a":{"dtype":"U8","shape":null,"data_offsets":[0,1]}}', 1)),
    ("element-count-overflows", st({"a": t("U8", [U64_MAX, 2, 0], 0, 0)})),
    ("bit-count-overflows", st({"a": t("F64", [2 ** 61], 0, 0)})),
    ("metadata-int-value", st(meta("1"))),
    ("metadata-null-value", st(meta("null"))),
    ("metadata-nested-value", st(meta('{"b":"c"}'))),
    ("metadata-list", st('{"__metadata__":["a"]}')),
    ("metadata-string", st('{"__metadata__":"pt"}')),
    ("metadata-twice", st('{"__metadata__":{},"__metadata__":{}}')),
    ("metadata-shadowed-int-value", st('{"__metadata__":{"a":1,"a":"b"}}')),
    ("metadata-holding-a-tensor", st('{"__metadata__":%s}' % E1, 1)),
    ("entry-null", st('{"a":null}')),
    ("entry-number", st('{"a":1}')),
    ("entry-array-of-2", st('{"a":["U8",[1]]}', 1)),
    ("entry-array-of-4", st('{"a":["U8",[1],[0,1],1]}', 1)),
    ("entry-missing-shape", st('{"a":{"dtype":"U8","data_offsets":[0,1]}}', 1)),
    ("entry-field-twice", st('{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1)),
    ("header-array", st("[]")),
    ("header-string", st('"x"')),
    ("header-number", st("1")),
    ("header-null", st("null")),
    ("invalid-utf8", st(b'{"\xff":' + E1.encode() + b"}", 1)),
    ("utf8-overlong", st(b'{"\xc0\xaf":' + E1.encode() + b"}", 1)),
    ("utf8-bom", st(b"\xef\xbb\xbf{}")),
    ("not-json", st("{not json}", 8)),
    ("trailing-comma", st('{"a":%s,}' % E1, 1)),
    ("two-objects", st("{}{}")),
    ("trailing-nul", st("{}\x00")),
    ("nan", st(with_field("NaN"), 1)),
    ("infinity", st(with_field("-Infinity"), 1)),
    ("float-out-of-range", st(with_field("1e999"), 1)),
    ("integer-out-of-range", st(with_field("1" + "0" * 400), 1)),
    ("lone-high-surrogate", st(meta('"\\ud800"'))),
    ("lone-low-surrogate", st(meta('"\\udc00"'))),
    ("reversed-surrogate-pair", st(meta('"\\udc00\\ud800"'))),
    ("high-surrogate-then-letter", st(meta('"\\ud800\\u0041"'))),
    ("surrogate-in-tensor-name", st('{"a\\ud800":%s}' % E1, 1)),
    ("surrogate-in-shadowed-field", st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],'
                                       '"x":"\\ud800","x":1}}', 1)),
    ("control-char-in-string", st(meta('"\x01"'))),
    ("invalid-escape", st(meta('"\\x"'))),
    ("nesting-128-levels", st(with_field("[" * 126 + "]" * 126), 1)),
    ("deep-nesting-objects", st('{"a":' * 100000)),
    ("deep-nesting-arrays", st("[" * 100000 + "]" * 100000)),
    ("deep-nesting-in-metadata", st('{"__metadata__":' + '{"a":' * 100000 + "1" + "}" * 100001)),
]


def ours_accepts(tmp_path, blob):
    path = tmp_path / "model.safetensors"
    path.write_bytes(blob)
    try:
        read_shard(str(path))
    except StageError as exc:
        assert str(path) in str(exc), "the error must name the shard: %s" % exc
        return False
    return True


def loader_accepts(blob):
    try:
        deserialize(blob)
    except Exception:  # the loader's SafetensorError, whatever its message
        return False
    return True


@pytest.mark.parametrize("blob,accepted", [pytest.param(b, True, id=n) for n, b in GOOD_SHARDS]
                         + [pytest.param(b, False, id=n) for n, b in BAD_SHARDS])
def test_corpus_verdicts_match_the_safetensors_loader(tmp_path, blob, accepted):
    assert loader_accepts(blob) is accepted, "the corpus entry is mislabelled"
    assert ours_accepts(tmp_path, blob) is accepted


def test_dtypes_are_exactly_the_loaders(tmp_path):
    """The loader lists the dtypes it knows when it meets an unknown one: the same set as ours."""
    with pytest.raises(Exception) as err:
        deserialize(st({"a": t("NOPE", [1], 0, 1)}, 1))
    known = set(re.findall(r"`(\w+)`", str(err.value).split("expected one of", 1)[1]))
    assert known == set(dgx_safetensors.DTYPE_BITS)


@pytest.mark.parametrize("dtype", sorted(dgx_safetensors.DTYPE_BITS))
def test_dtype_byte_sizes_match_the_loader(tmp_path, dtype):
    """Every dtype's size in bits, sub-byte ones included: whole-byte counts load, the rest do not."""
    for count in (1, 2, 3, 4, 8):
        bits = count * dgx_safetensors.DTYPE_BITS[dtype]
        for nbytes in sorted(set([bits // 8, (bits + 7) // 8, bits // 8 + 1])):
            blob = st({"a": t(dtype, [count], 0, nbytes)}, nbytes)
            verdict = loader_accepts(blob)
            assert verdict is (bits == nbytes * 8), (dtype, count, nbytes)
            assert ours_accepts(tmp_path, blob) is verdict, (dtype, count, nbytes)


def test_a_repeated_tensor_name_is_refused_where_the_loader_keeps_the_last(tmp_path):
    """The one deliberate difference from the loader: it would silently drop one entry."""
    blob = st('{"a":%s,"a":%s}' % (E1, E1), 1)
    assert loader_accepts(blob)
    assert not ours_accepts(tmp_path, blob)


@pytest.mark.parametrize("length,accepted", [(100000000, True), (100000001, False)])
def test_header_length_cap_is_the_loaders(tmp_path, length, accepted):
    """A valid header padded with spaces to exactly the cap loads; one byte more does not."""
    blob = st("{}" + " " * (length - 2))
    assert loader_accepts(blob) is accepted
    assert ours_accepts(tmp_path, blob) is accepted


def test_nesting_is_measured_before_parsing(tmp_path, monkeypatch):
    """json.loads never sees a header nested past the loader's limit: no recursion to exhaust."""
    def no_parse(*args, **kwargs):
        raise AssertionError("json.loads called on a too-deep header")

    monkeypatch.setattr(dgx_safetensors.json, "loads", no_parse)
    path = tmp_path / "model.safetensors"
    path.write_bytes(st('{"a":' * 100000))
    with pytest.raises(StageError, match="nested more than 127 levels"):
        read_shard(str(path))


def test_deeply_nested_index_is_a_clear_error(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map":' + "[" * 100000)
    with pytest.raises(StageError, match="model.safetensors.index.json: cannot read.*nested"):
        check_snapshot(str(tmp_path))


def test_every_problem_of_a_shard_is_listed(tmp_path):
    header = {"a": t("F8_E4M3FN", [1], 0, 1), "b": t("F32", [3], 1, 9), "__metadata__": {"n": 1}}
    path = tmp_path / "model.safetensors"
    path.write_bytes(st(header, 9))
    with pytest.raises(dgx_safetensors.ShardError) as err:
        read_shard(str(path))
    problems = err.value.problems
    assert len(problems) == 3
    assert "__metadata__ n is not a string" in problems[0]
    assert "tensor a: unknown dtype 'F8_E4M3FN'" in problems[1]
    assert "tensor b: data_offsets [1, 9] span 8 bytes but F32[3] needs 12" in problems[2]


@pytest.mark.parametrize("header,data,fragment", [
    ({"a": t("U8", [2], 0, 2), "b": t("U8", [2], 4, 6)}, 6, "data bytes [2, 4) before tensor b belong to no tensor"),
    ({"a": t("U8", [2], 0, 2)}, 5, "3 trailing data bytes after the last tensor"),
    ({}, 4, "the header lists no tensors but the data section holds 4 bytes"),
    ({"a": t("U8", [4], 0, 4), "z": t("U8", [0], 2, 2)}, 4, "tensors a and z have overlapping"),
])
def test_layout_messages(tmp_path, header, data, fragment):
    single(tmp_path, header=header, data_size=data)
    with pytest.raises(StageError, match=re.escape(fragment)):
        check_snapshot(str(tmp_path))


def test_many_broken_shards_all_in_problems(tmp_path):
    names = ["s%02d.safetensors" % i for i in range(12)]
    for name in names:
        (tmp_path / name).write_bytes(st({"w": t("F32", [2], 0, 8)}, 9))  # one trailing byte each
    with pytest.raises(dgx_safetensors.SafetensorsCheckError) as err:
        check_snapshot(str(tmp_path))
    assert "and 2 more" in str(err.value)
    assert len(err.value.problems) == 12
    assert all(any(name in p for p in err.value.problems) for name in names)


def test_a_broken_shard_is_named_before_a_flood_of_key_problems(tmp_path):
    many = {"k%02d" % i: t("U8", [1], i, i + 1) for i in range(12)}
    (tmp_path / "a.safetensors").write_bytes(st(many, 12))
    (tmp_path / "b.safetensors").write_bytes(st(many, 12))  # 12 duplicate keys
    (tmp_path / "c.safetensors").write_bytes(st({"z": t("F8_E4M3FN", [1], 0, 1)}, 1))
    with pytest.raises(dgx_safetensors.SafetensorsCheckError) as err:
        check_snapshot(str(tmp_path))
    msg = str(err.value)
    assert msg.index("c.safetensors: malformed") < msg.index("Duplicate mapped checkpoint key")
    assert "and 3 more" in msg and len(err.value.problems) == 13


# --- the module itself, through main() -----------------------------------------------------------

def run_main(args, check_mode=False):
    return modrun.run_main("safetensors_check", args, check_mode=check_mode)


def test_module_names_every_broken_shard_and_checks_the_rest(tmp_path):
    """One shard nested 100,000 deep, one with a gap, one good: both broken ones named, the good
    one still checked (its missing key reported), and nothing crashes."""
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "s1.safetensors").write_bytes(st('{"a":' * 100000))
    (snap / "s2.safetensors").write_bytes(st({"b": t("U8", [2], 0, 2), "c": t("U8", [2], 3, 5)}, 5))
    (snap / "s3.safetensors").write_bytes(st({"d": t("U8", [2], 0, 2)}, 2))
    weight_map = {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors",
                  "d": "s3.safetensors", "e": "s3.safetensors"}
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    result = run_main({"path": str(snap)})
    assert result["failed"] is True
    msg = result["msg"]
    assert "s1.safetensors: malformed safetensors header: JSON nested more than 127 levels" in msg
    assert "s2.safetensors: malformed safetensors header: data bytes [2, 3) before tensor c" in msg
    assert "maps e to s3.safetensors, but that shard lacks it" in msg
    problems = result["problems"]
    assert len(problems) == 3
    assert problems[0].startswith(str(snap / "s1.safetensors") + ": JSON nested more than 127")
    assert problems[1].startswith(str(snap / "s2.safetensors") + ": data bytes [2, 3)")


def test_module_passes_a_good_snapshot(tmp_path):
    snap = make_snapshot(tmp_path)
    result = run_main({"path": str(snap)})
    assert not result.get("failed") and result["changed"] is False
    assert (result["shards"], result["tensors"]) == (2, 6)


def test_module_docs_match_its_argument_spec_and_results(tmp_path):
    module = modrun.load("safetensors_check")
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert set(doc["options"]) == set(module.ARGUMENT_SPEC)
    for name, spec in module.ARGUMENT_SPEC.items():
        assert doc["options"][name]["type"] == spec["type"], name
        assert bool(doc["options"][name].get("required")) == bool(spec.get("required")), name
    documented = set(yaml.safe_load(module.RETURN))
    ok = run_main({"path": str(make_snapshot(tmp_path))})
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(st("{}", 1))
    bad = run_main({"path": str(tmp_path / "bad")})
    standard = {"changed", "failed", "invocation"}
    assert set(ok) - standard <= documented
    assert set(bad) - standard <= documented


def test_module_in_check_mode_passes_a_snapshot_without_safetensors_files(tmp_path):
    # A tokenizer-only repo under --check: the module runs (it only reads) and has nothing to check.
    (tmp_path / "tokenizer.json").write_text("{}")
    result = run_main({"path": str(tmp_path)}, check_mode=True)
    assert result["shards"] == 0 and "nothing to check" in result["msg"]


@pytest.mark.parametrize("planted", ["model.safetensors.index.json", SHARD1])
def test_a_fifo_in_place_of_the_index_or_a_shard_fails_naming_it_instead_of_hanging(tmp_path, planted):
    snap = make_snapshot(tmp_path, as_links=False)
    os.unlink(str(snap / planted))
    os.mkfifo(str(snap / planted))
    with processes.fails_if_blocked(5, "the check blocked on a FIFO"):
        with pytest.raises(StageError) as failed:
            check_snapshot(str(snap))
    assert planted in str(failed.value) and "not a regular file" in str(failed.value), str(failed.value)
