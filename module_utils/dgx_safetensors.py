"""Check a snapshot's safetensors index against its shard headers, reading headers only.

A shard is an 8-byte little-endian length N, N bytes of UTF-8 JSON (the header), then the data section. A header
passes exactly when the safetensors loader (0.8.0, 64-bit) accepts it, except that a tensor name given twice is
refused here where the loader silently keeps the last. The loader's rules:
 1. 8 <= file size, N <= MAX_HEADER_BYTES, 8 + N <= file size.
 2. One JSON value parsed like serde_json: no NaN/Infinity, no number beyond a double, no lone UTF-16 surrogate
    escape, at most MAX_NESTING levels (measured before parsing: a deep header cannot exhaust the stack).
 3. An object; "__metadata__" at most once, null or an object of strings; every other key is a tensor.
 4. A tensor is {dtype, shape, data_offsets} (each once, other fields ignored) or [dtype, shape, data_offsets];
    dtype in DTYPE_BITS (or {"F16": null}); shape and data_offsets [begin <= end] are integers in [0, 2**64)
    (a fraction, exponent or -0 makes a float: refused); elements * bits < 2**64, whole bytes, == end - begin.
 5. Sorted by (begin, end) the tensors tile the data section exactly: no gap, no overlap, no trailing bytes.
"""
import json
import math
import os
import re
import struct

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import open_to_read
from ansible.module_utils.dgx_hubcache import scan_snapshot

DEFAULT_INDEX = "model.safetensors.index.json"
# safetensors' MAX_HEADER_SIZE: the loader refuses a longer header whatever the file size.
MAX_HEADER_BYTES = 100000000
# serde_json's recursion limit as the loader meets it: 127 levels of [ / { load, 128 do not.
MAX_NESTING = 127
U64_MAX = 2 ** 64 - 1
# Bits per element of every dtype the safetensors 0.8.0 loader knows (its Dtype enum).
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
TENSOR_FIELDS = ("dtype", "shape", "data_offsets")

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(u"[\ud800-\udfff]")


def _some(items, most):
    """'a; b; c; and 7 more': the first `most` items and a count of the rest."""
    more = len(items) - most
    return "; ".join(items[:most]) + ("; and %d more" % more if more > 0 else "")


class ShardError(StageError):
    """One shard breaks the format; ``problems`` lists every way it does."""

    def __init__(self, path, problems):
        self.path = path
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        StageError.__init__(self, "%s: malformed safetensors header: %s; re-stage this shard"
                            % (path, _some(self.problems, 3)))


class SafetensorsCheckError(StageError):
    """The check failed; the message summarises, ``problems`` lists every problem found."""

    def __init__(self, msg, problems):
        StageError.__init__(self, msg)
        self.problems = list(problems)


# --- JSON the way the loader parses it ----------------------------------------------------------

class _JsonObject(dict):
    """A parsed JSON object: the last of repeated keys wins, as in the loader, whose type checks still see the
    earlier (key, value) pairs, kept in ``shadowed``."""

    shadowed = ()


def _shadowed(obj):
    return getattr(obj, "shadowed", ())


def _object_from_pairs(pairs):
    obj = _JsonObject(pairs)
    if len(obj) != len(pairs):
        last = dict((key, i) for i, (key, _value) in enumerate(pairs))
        obj.shadowed = [pair for i, pair in enumerate(pairs) if last[pair[0]] != i]
    return obj


def _parse_int(literal):
    if not literal.isascii():
        raise ValueError("number %r is not ASCII" % literal)
    if literal == "-0":
        return -0.0  # serde_json reads -0 as a float
    if len(literal) > 300 and math.isinf(float(literal)):
        raise ValueError("number %s... is out of range" % literal[:20])
    return int(literal)


def _parse_float(literal):
    value = float(literal)
    if math.isinf(value) or not literal.isascii():
        raise ValueError("number %s is out of range" % literal[:40])
    return value


def _parse_constant(name):
    raise ValueError("%s is not a JSON value" % name)


def nesting_depth(text, limit=MAX_NESTING):
    """Deepest nesting of [ and { outside strings (exact for valid JSON, a bound on a parser's depth otherwise),
    counted no further than past ``limit``."""
    depth = deepest = 0
    for char in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        else:
            depth -= 1
    return deepest


def _has_lone_surrogate(value):
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
            stack.extend(earlier for _key, earlier in _shadowed(item))
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _bounded_loads(text, **hooks):
    """json.loads after a nesting pre-scan: raises ValueError, never RecursionError."""
    if nesting_depth(text) > MAX_NESTING:
        raise ValueError("JSON nested more than %d levels deep (the safetensors loader stops there)"
                         % MAX_NESTING)
    try:
        return json.loads(text, **hooks)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse")
    except ValueError as exc:
        raise ValueError("invalid JSON (%s)" % exc)


def parse_header_json(text):
    """Parse header text as the loader does; raise ValueError saying why it would refuse it."""
    value = _bounded_loads(text, object_pairs_hook=_object_from_pairs, parse_int=_parse_int,
                           parse_float=_parse_float, parse_constant=_parse_constant)
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise ValueError("invalid JSON (a \\u escape is half of a UTF-16 surrogate pair)")
    return value


# --- one header ----------------------------------------------------------------------------------

def read_header(path, max_bytes=MAX_HEADER_BYTES):
    """Return (header object, header bytes read incl. the 8-byte length, file size)."""
    try:
        size = os.path.getsize(path)
        with open_to_read(path) as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise ShardError(path, "file is %d bytes, shorter than the 8-byte header length" % size)
            (length,) = struct.unpack("<Q", prefix)
            if length > max_bytes:
                raise ShardError(path, "header length %d is over the format's cap %d" % (length, max_bytes))
            if 8 + length > size:
                raise ShardError(path, "header length %d runs past the end of the %d-byte file" % (length, size))
            raw = handle.read(length)
    except OSError as exc:
        raise StageError("%s: cannot read shard header: %s; check the file and its blob link" % (path, exc))
    if len(raw) != length:
        raise ShardError(path, "short read (%d of %d bytes)" % (len(raw), length))
    if not length:
        raise ShardError(path, "header length 0 leaves no room for the JSON header")
    try:
        header = parse_header_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ShardError(path, "invalid JSON (not UTF-8: %s)" % exc)
    except ValueError as exc:
        raise ShardError(path, str(exc))
    if not isinstance(header, dict):
        raise ShardError(path, "not a JSON object")
    return header, 8 + length, size


def _is_u64(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def dtype_name(value):
    """The dtype an entry names; ValueError when the loader knows no such dtype."""
    name = value
    if isinstance(value, dict) and len(value) == 1 and not _shadowed(value):
        name, unit = next(iter(value.items()))
        if unit is not None:
            name = None
    if not isinstance(name, str):
        raise ValueError("dtype %r is not a dtype name" % (value,))
    if name not in DTYPE_BITS:
        raise ValueError("unknown dtype %r (the safetensors loader refuses it)" % name)
    return name


def byte_size(dtype, shape):
    """Bytes a tensor of ``dtype`` and ``shape`` takes, computed as the loader does."""
    count = 1
    for dim in shape:
        count *= dim
        if count > U64_MAX:
            raise ValueError("shape %r has more than 2**64 elements" % (shape,))
    bits = count * DTYPE_BITS[dtype]
    if bits > U64_MAX:
        raise ValueError("%s%r is more than 2**64 bits" % (dtype, shape))
    if bits % 8:
        raise ValueError("%s%r is %d bits, not a whole number of bytes" % (dtype, shape, bits))
    return bits // 8


def tensor_span(info):
    """Return (begin, end) of one header entry; raise ValueError saying why it is malformed."""
    if isinstance(info, list):
        if len(info) != 3:
            raise ValueError("entry is an array of %d items, not [dtype, shape, data_offsets]" % len(info))
        dtype, shape, offsets = info
    elif isinstance(info, dict):
        repeated = set(key for key, _value in _shadowed(info))
        for field in TENSOR_FIELDS:
            if field not in info or field in repeated:
                raise ValueError(("missing %s" if field not in info else "%s given twice") % field)
        dtype, shape, offsets = (info[field] for field in TENSOR_FIELDS)
    else:
        raise ValueError("entry is not an object")
    dtype = dtype_name(dtype)
    if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
        raise ValueError("shape %r is not a list of non-negative integers (each below 2**64)" % (shape,))
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_u64(o) for o in offsets):
        raise ValueError("data_offsets %r is not [begin, end] of non-negative integers" % (offsets,))
    begin, end = offsets
    if end < begin:
        raise ValueError("data_offsets %r are inverted" % (offsets,))
    size = byte_size(dtype, shape)
    if size != end - begin:
        raise ValueError("data_offsets %r span %d bytes but %s%r needs %d"
                         % (offsets, end - begin, dtype, shape, size))
    return begin, end


def metadata_problems(header):
    """Why the header's __metadata__ breaks the format (a list, empty when it is fine)."""
    if any(key == "__metadata__" for key, _value in _shadowed(header)):
        return ["__metadata__ appears twice"]
    metadata = header.get("__metadata__")
    if metadata is None:
        return []
    if not isinstance(metadata, dict):
        return ["__metadata__ is not an object of strings"]
    pairs = list(_shadowed(metadata)) + list(metadata.items())
    bad = sorted(set(key for key, value in pairs if not isinstance(value, str)))
    return ["__metadata__ %s is not a string" % key for key in bad]


def layout_problems(spans, data_size):
    """Why the tensors' (begin, end, name) spans do not tile a data section of ``data_size`` bytes."""
    if not spans and data_size:
        return ["the header lists no tensors but the data section holds %d bytes" % data_size]
    problems = []
    covered, last = 0, None
    for begin, end, name in sorted(spans):
        if begin > covered:
            problems.append("data bytes [%d, %d) before tensor %s belong to no tensor (a gap)"
                            % (covered, begin, name))
        elif begin < covered:
            problems.append("tensors %s and %s have overlapping data_offsets (%s starts at %d, "
                            "before %d)" % (last, name, name, begin, covered))
        if end >= covered:
            covered, last = end, name
    if covered > data_size:
        problems.append("tensor %s data_offsets end at %d and run past the end of the file (%d "
                        "data bytes); the shard is truncated or the wrong blob" % (last, covered, data_size))
    elif covered < data_size:
        problems.append("%d trailing data bytes after the last tensor (tensors cover %d of %d)"
                        % (data_size - covered, covered, data_size))
    return problems


def read_shard(path):
    """(tensor names in data order, header bytes read) of one shard; ShardError lists every problem."""
    header, header_bytes, size = read_header(path)
    problems = metadata_problems(header)
    for name in sorted(set(key for key, _value in _shadowed(header) if key != "__metadata__")):
        problems.append("tensor %s appears twice; a loader would silently keep only the last" % name)
    spans = []
    for name, info in header.items():
        if name != "__metadata__":
            try:
                spans.append(tensor_span(info) + (name,))
            except ValueError as exc:
                problems.append("tensor %s: %s" % (name, exc))
    problems = problems or layout_problems(spans, size - header_bytes)
    if problems:
        raise ShardError(path, problems)
    return [name for _begin, _end, name in sorted(spans)], header_bytes


# --- index and snapshot ------------------------------------------------------------------------

def load_weight_map(index_path):
    """Return the index's weight_map {tensor: shard file name}."""
    try:
        with open_to_read(index_path) as handle:
            index = _bounded_loads(handle.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StageError("%s: cannot read the safetensors index: %s; re-stage it" % (index_path, exc))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise StageError("%s: no weight_map object of {tensor: shard file}; re-stage the index" % index_path)
    return weight_map


class NasSnapshot(object):
    """The NAS snapshot a rank's sparse copy was staged from, walked on first use (scan_snapshot: a shard is read
    only where its link chain ends at a regular file inside that NAS hub)."""

    def __init__(self, nas_path, local_snapshot):
        self.path = os.path.abspath(nas_path)
        self.local = os.path.abspath(local_snapshot)
        self._entries = None

    def source(self, local_path):
        """(real path of the shard's content on the NAS, None) or (None, why it cannot be read there)."""
        if self._entries is None:
            snapshots = os.path.dirname(self.path)
            if os.path.basename(snapshots) != "snapshots" or not os.path.isdir(self.path):
                raise StageError("nas_path %s is not a NAS snapshot directory (<NAS hub>/models--org--name/"
                                 "snapshots/<commit>); point it at the snapshot the local one was staged from"
                                 % self.path)
            repo_dir = os.path.dirname(snapshots)
            self._entries = dict((entry.path, entry) for entry in scan_snapshot(
                repo_dir, os.path.basename(self.path), os.path.dirname(repo_dir), strict=False))
        rel = os.path.relpath(os.path.normpath(local_path), self.local).replace(os.sep, "/")
        entry = self._entries.get(rel)
        if entry is None:
            return None, "shard %s is not on the local disk and %s is not in the NAS snapshot" % (
                rel, os.path.join(self.path, rel))
        if entry.kind == "bad":
            return None, "shard %s is not on the local disk and its NAS copy cannot be read: %s" % (rel, entry.problem)
        return entry.source, None


def check_shards(base, shards, weight_map=None, index_path=None, absent_ok=(), nas=None):
    """Read every shard header (absent_ok: left out on purpose, read from `nas` if given) and check the keys against
    weight_map and across shards; SafetensorsCheckError names the broken shards first, then key problems."""
    broken, key_problems, details, absent, from_nas = [], [], [], [], []
    keys, owner, checked, tensors = {}, {}, 0, 0

    def problem(lines, line, listed=None):
        lines.append(line)
        details.extend([line] if listed is None else listed)

    for shard in shards:
        if not shard or os.path.isabs(shard) or ".." in shard.split("/"):
            raise StageError("weight_map names shard %r, which is not a relative path inside %s; fix the index"
                             % (shard, base))
        path = os.path.join(base, shard)
        if not os.path.lexists(path) and os.path.normpath(path) in absent_ok:
            absent.append(shard)
            if nas is None:
                continue
            path, why = nas.source(path)
            if why:
                problem(broken, why)
                continue
            from_nas.append(shard)
        elif not os.path.exists(path):
            problem(broken, "shard %s named in %s is %s; stage it again" % (
                path, index_path or "the snapshot", "a dangling symlink" if os.path.islink(path) else "missing"))
            continue
        try:
            names, header_bytes = read_shard(path)
        except ShardError as exc:
            problem(broken, str(exc), ["%s: %s" % (path, why) for why in exc.problems])
            continue
        except StageError as exc:
            problem(broken, str(exc))
            continue
        checked += header_bytes
        tensors += len(names)
        keys[shard] = set(names)
        for name in names:
            if name in owner:
                problem(key_problems, "Duplicate mapped checkpoint key: %s is in both %s and %s; a shard link points "
                        "at the wrong blob, re-stage and verify" % (name, owner[name], shard))
            else:
                owner[name] = shard
    for name in sorted(weight_map or {}):
        shard = weight_map[name]
        if shard in keys and name not in keys[shard]:
            problem(key_problems, "%s maps %s to %s, but that shard lacks it%s; the shard link points at the wrong "
                    "blob, re-stage and verify" % (index_path, name, shard, " (it is in %s)" % owner[name]
                                                   if name in owner else ""))
    if broken or key_problems:
        raise SafetensorsCheckError("safetensors check failed in %s: %s" % (base, _some(broken + key_problems, 10)),
                                    details)
    return {"shards": len(shards) - len(absent) + len(from_nas), "tensors": tensors, "checked_bytes": checked,
            "absent": absent, "nas_shards": from_nas}


def check_snapshot(path, index=None, absent_ok=(), nas_path=None):
    """Check a snapshot dir through its index if any, else its top-level *.safetensors files."""
    absent_ok = set(os.path.normpath(os.path.join(path, p)) for p in absent_ok)
    if not os.path.isdir(path):
        raise StageError("%s is not a directory; point path at a local snapshot dir "
                         "(<hub>/models--org--name/snapshots/<commit>)" % path)
    index_path = os.path.join(path, index or DEFAULT_INDEX)
    if os.path.lexists(index_path):
        weight_map = load_weight_map(index_path)
        result = check_shards(os.path.dirname(index_path), sorted(set(weight_map.values())), weight_map, index_path,
                              absent_ok, NasSnapshot(nas_path, path) if nas_path else None)
        from_nas = " (%d of them read from the NAS)" % len(result["nas_shards"]) if result["nas_shards"] else ""
        result.update(index=index_path, msg="%d shards%s, %d tensors match %s" % (
            result["shards"], from_nas, result["tensors"], index_path))
        return result
    if index:
        raise StageError("%s does not exist; fix the index option or stage the index file" % index_path)
    # No index: loaders read every top-level *.safetensors, so check each and look for duplicates.
    shards = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not shards:
        return {"shards": 0, "tensors": 0, "checked_bytes": 0, "absent": [], "nas_shards": [], "index": None,
                "msg": "no safetensors files in %s: nothing to check" % path}
    result = check_shards(path, shards)
    result.update(index=None, msg="no index; %d safetensors file(s), %d tensors checked" % (
        result["shards"], result["tensors"]))
    return result
