"""Check a snapshot's safetensors index against its shard headers, reading headers only.

A shard's header is an 8-byte little-endian length followed by that many bytes of JSON
({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}); offsets are
relative to the end of the header. Tensor data is never read.
"""
import json
import os
import struct

from ansible.module_utils.dgx_errors import StageError

DEFAULT_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Real headers are a few MiB at most; a bigger length means a corrupt or non-safetensors file.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# Bytes per element of the byte-aligned dtypes; others (sub-byte float formats) are not size-checked.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "C64": 8,
    "U64": 8, "I64": 8, "F64": 8,
}
_MAX_PROBLEMS_SHOWN = 10


def _unique_keys(pairs):
    """json object hook: a key given twice in one header would silently shadow a tensor."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError("key %r appears twice" % key)
        seen[key] = value
    return seen


def read_header(path, max_bytes=MAX_HEADER_BYTES):
    """Return (header dict, header bytes read incl. the 8-byte length, file size)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise StageError("%s: malformed safetensors header: file is %d bytes, shorter than "
                                 "the 8-byte header length; re-stage this shard" % (path, size))
            (length,) = struct.unpack("<Q", prefix)
            if length < 2 or length > max_bytes or 8 + length > size:
                raise StageError("%s: malformed safetensors header: header length %d is impossible "
                                 "for a %d-byte file (cap %d); re-stage this shard"
                                 % (path, length, size, max_bytes))
            raw = handle.read(length)
    except OSError as exc:
        raise StageError("%s: cannot read shard header: %s; check the file and its blob link"
                         % (path, exc))
    if len(raw) != length:
        raise StageError("%s: malformed safetensors header: short read (%d of %d bytes); "
                         "re-stage this shard" % (path, len(raw), length))
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise StageError("%s: malformed safetensors header: invalid JSON (%s); re-stage this shard"
                         % (path, exc))
    if not isinstance(header, dict):
        raise StageError("%s: malformed safetensors header: not a JSON object; re-stage this shard"
                         % path)
    return header, 8 + length, size


def _is_uint(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def tensor_problem(name, info):
    """Return why one header entry is malformed, or None."""
    if not isinstance(info, dict):
        return "entry is not an object"
    for field in ("dtype", "shape", "data_offsets"):
        if field not in info:
            return "missing %s" % field
    if not isinstance(info["dtype"], str):
        return "dtype is not a string"
    shape = info["shape"]
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        return "shape %r is not a list of non-negative integers" % (shape,)
    offsets = info["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) for o in offsets):
        return "data_offsets %r is not [begin, end]" % (offsets,)
    if offsets[1] < offsets[0]:
        return "data_offsets %r are inverted" % (offsets,)
    width = DTYPE_BYTES.get(info["dtype"])
    if width is not None:
        count = 1
        for dim in shape:
            count *= dim
        if count * width != offsets[1] - offsets[0]:
            return "data_offsets %r span %d bytes but %s%r needs %d" % (
                offsets, offsets[1] - offsets[0], info["dtype"], shape, count * width)
    return None


def check_header(path, header, header_bytes, file_size):
    """Return the tensor names of one shard header; raise on any malformed entry or bad offset."""
    data_size = file_size - header_bytes
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        problem = tensor_problem(name, info)
        if problem:
            raise StageError("%s: malformed safetensors header: tensor %s: %s; re-stage this shard"
                             % (path, name, problem))
        begin, end = info["data_offsets"]
        if end > data_size:
            raise StageError("%s: tensor %s data_offsets [%d, %d] run past the end of the file "
                             "(%d data bytes); the shard is truncated or the wrong blob, re-stage it"
                             % (path, name, begin, end, data_size))
        spans.append((begin, end, name))
    spans.sort()
    # Track the furthest end so far: comparing neighbours only misses overlaps across a
    # zero-length tensor sitting between two overlapping ones.
    last_end, last_name = 0, None
    for begin, end, name in spans:
        if end == begin:
            continue
        if begin < last_end:
            raise StageError("%s: tensors %s and %s have overlapping data_offsets (%s starts at %d, "
                             "before %d); the header is corrupt, re-stage this shard"
                             % (path, last_name, name, name, begin, last_end))
        last_end, last_name = end, name
    return [s[2] for s in spans]


def read_shard(path):
    """Return (tensor names, header bytes read) of one shard."""
    header, header_bytes, size = read_header(path)
    return check_header(path, header, header_bytes, size), header_bytes


def load_weight_map(index_path):
    """Return the index's weight_map {tensor: shard file name}."""
    try:
        with open(index_path, "rb") as handle:
            index = json.loads(handle.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StageError("%s: cannot read the safetensors index: %s; re-stage it" % (index_path, exc))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise StageError("%s: no weight_map object of {tensor: shard file}; re-stage the index"
                         % index_path)
    return weight_map


def _shard_path(base, shard):
    if not shard or os.path.isabs(shard) or ".." in shard.split("/"):
        raise StageError("weight_map names shard %r, which is not a relative path inside %s; "
                         "fix the index" % (shard, base))
    return os.path.join(base, shard)


def _summarise(problems):
    shown = problems[:_MAX_PROBLEMS_SHOWN]
    more = len(problems) - len(shown)
    tail = "; and %d more" % more if more else ""
    return "; ".join(shown) + tail


def check_shards(base, shards, weight_map=None, index_path=None, absent_ok=()):
    """Read every shard header; check keys against weight_map and for cross-shard duplicates.

    absent_ok: absolute paths of shards left out on purpose (a rank's sparse copy); their
    absence is not a problem and their keys are not looked for.
    Returns {shards, tensors, checked_bytes, absent}. Raises StageError listing every problem found.
    """
    problems = []
    absent = []
    keys = {}
    owner = {}
    checked = 0
    tensors = 0
    for shard in shards:
        path = _shard_path(base, shard)
        if not os.path.lexists(path) and os.path.normpath(path) in absent_ok:
            absent.append(shard)
            continue
        if not os.path.exists(path):
            kind = "a dangling symlink" if os.path.islink(path) else "missing"
            problems.append("shard %s named in %s is %s; stage it again"
                            % (path, index_path or "the snapshot", kind))
            continue
        try:
            names, header_bytes = read_shard(path)
        except StageError as exc:
            problems.append(str(exc))
            continue
        checked += header_bytes
        tensors += len(names)
        keys[shard] = set(names)
        for name in names:
            if name in owner:
                problems.append("Duplicate mapped checkpoint key: %s is in both %s and %s; a "
                                "shard link points at the wrong blob, re-stage and verify"
                                % (name, owner[name], shard))
            else:
                owner[name] = shard
    for name in sorted(weight_map or {}):
        shard = weight_map[name]
        if shard in keys and name not in keys[shard]:
            found = " (it is in %s)" % owner[name] if name in owner else ""
            problems.append("%s maps %s to %s, but that shard lacks it%s; the shard link points "
                            "at the wrong blob, re-stage and verify"
                            % (index_path, name, shard, found))
    if problems:
        raise StageError("safetensors check failed in %s: %s" % (base, _summarise(problems)))
    return {"shards": len(shards) - len(absent), "tensors": tensors, "checked_bytes": checked, "absent": absent}


def check_snapshot(path, index=None, absent_ok=()):
    """Check a snapshot dir: through its index if any, else its top-level *.safetensors files.

    absent_ok: snapshot-relative paths the staging patterns left out (they may be missing).
    Returns {shards, tensors, checked_bytes, absent, index, msg}.
    """
    absent_ok = set(os.path.normpath(os.path.join(path, p)) for p in absent_ok)
    if not os.path.isdir(path):
        raise StageError("%s is not a directory; point path at a local snapshot dir "
                         "(<hub>/models--org--name/snapshots/<commit>)" % path)
    index_path = os.path.join(path, index or DEFAULT_INDEX)
    if os.path.lexists(index_path):
        weight_map = load_weight_map(index_path)
        base = os.path.dirname(index_path)
        shards = sorted(set(weight_map.values()))
        result = check_shards(base, shards, weight_map, index_path, absent_ok)
        result.update(index=index_path, msg="%d shards, %d tensors match %s" % (
            result["shards"], result["tensors"], index_path))
        return result
    if index:
        raise StageError("%s does not exist; fix the index option or stage the index file"
                         % index_path)
    # No index: loaders read every top-level *.safetensors, so check each and look for duplicates.
    shards = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not shards:
        return {"shards": 0, "tensors": 0, "checked_bytes": 0, "absent": [], "index": None,
                "msg": "no safetensors files in %s: nothing to check" % path}
    result = check_shards(path, shards)
    result.update(index=None, msg="no index; %d safetensors file(s), %d tensors checked" % (
        result["shards"], result["tensors"]))
    return result
