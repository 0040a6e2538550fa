"""Check a snapshot's safetensors index against its shard headers, reading headers only.

A shard is an 8-byte little-endian unsigned length N, N bytes of UTF-8 JSON (the header), then the
data section. The header maps each tensor name to {dtype, shape, data_offsets: [begin, end]}
(offsets relative to the start of the data section) and may hold "__metadata__", a map of strings.
Tensor data is never read: the data section's size is the file size minus 8 minus N.

A header passes exactly when the safetensors loader accepts it (rules of the Rust crate's
SafeTensors::read_metadata and Metadata::validate, checked against the Python package
safetensors 0.8.0 on a 64-bit host), with one deliberate exception: a tensor name given twice in one
header is refused here, where the loader silently keeps the last entry. The rules:

 1. The file has at least 8 bytes; N <= 100,000,000 (MAX_HEADER_BYTES); 8 + N <= file size.
 2. The header is UTF-8 holding one JSON value (whitespace around it allowed, so space padding is
    fine), parsed like serde_json: no NaN/Infinity, no number beyond a double's range, no \\u escape
    naming half of a UTF-16 surrogate pair, at most MAX_NESTING levels of [ and {. Depth is measured
    before parsing, so a deeply nested header cannot exhaust the stack.
 3. The value is an object. "__metadata__" appears at most once and is null or an object whose
    values are all strings. Every other key is a tensor.
 4. A tensor entry is an object with dtype, shape and data_offsets, each exactly once (other fields
    are ignored), or an array [dtype, shape, data_offsets].
 5. dtype names a known element type (DTYPE_BITS; the loader also takes the form {"F16": null}).
 6. shape is an array of integers in [0, 2**64); data_offsets is an array of two such integers,
    begin <= end. Integers written with a fraction or exponent, or as -0, are floats: refused.
 7. Elements (the product of shape, left to right) times bits per element stays below 2**64, is a
    whole number of bytes, and equals end - begin.
 8. Sorted by (begin, end) the tensors tile the data section: the first begins at 0, each begins
    where the previous ended (no gap, no overlap; a zero-size tensor sits on a boundary) and the
    last ends at the end of the file (no trailing bytes). No tensors: the data section is empty.
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
_MAX_PROBLEMS_SHOWN = 10
_MAX_SHARD_PROBLEMS_SHOWN = 3

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(u"[\ud800-\udfff]")


class ShardError(StageError):
    """One shard breaks the format; ``problems`` (a list, or one text) lists every way it does."""

    def __init__(self, path, problems):
        self.path = path
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        shown = self.problems[:_MAX_SHARD_PROBLEMS_SHOWN]
        more = len(self.problems) - len(shown)
        StageError.__init__(self, "%s: malformed safetensors header: %s%s; re-stage this shard" % (
            path, "; ".join(shown), " (and %d more problems)" % more if more else ""))


class SafetensorsCheckError(StageError):
    """The check failed; the message summarises, ``problems`` lists every problem found."""

    def __init__(self, msg, problems):
        StageError.__init__(self, msg)
        self.problems = list(problems)


# --- JSON the way the loader parses it ----------------------------------------------------------

class _JsonObject(dict):
    """A parsed JSON object. As in the loader's maps the last of repeated keys wins; the earlier
    (key, value) pairs are kept in ``shadowed`` because the loader still type-checks them."""

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
    """Deepest nesting of [ and { outside strings; stops counting once past ``limit``.

    For valid JSON this is exact; for invalid JSON it bounds how deep a parser gets before the
    error, so a parse is safe when this is small.
    """
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
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
                raise ShardError(path, "file is %d bytes, shorter than the 8-byte header length"
                                 % size)
            (length,) = struct.unpack("<Q", prefix)
            if length > max_bytes:
                raise ShardError(path, "header length %d is over the format's cap %d"
                                 % (length, max_bytes))
            if 8 + length > size:
                raise ShardError(path, "header length %d runs past the end of the %d-byte file"
                                 % (length, size))
            raw = handle.read(length)
    except OSError as exc:
        raise StageError("%s: cannot read shard header: %s; check the file and its blob link"
                         % (path, exc))
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
    if isinstance(value, dict) and len(value) == 1 and not _shadowed(value):
        name, unit = next(iter(value.items()))
        if unit is not None:
            raise ValueError("dtype %r is not a dtype name" % (value,))
    elif isinstance(value, str):
        name = value
    else:
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
            raise ValueError("entry is an array of %d items, not [dtype, shape, data_offsets]"
                             % len(info))
        dtype, shape, offsets = info
    elif isinstance(info, dict):
        repeated = set(key for key, _value in _shadowed(info))
        for field in TENSOR_FIELDS:
            if field not in info:
                raise ValueError("missing %s" % field)
            if field in repeated:
                raise ValueError("%s given twice" % field)
        dtype, shape, offsets = (info[field] for field in TENSOR_FIELDS)
    else:
        raise ValueError("entry is not an object")
    dtype = dtype_name(dtype)
    if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
        raise ValueError("shape %r is not a list of non-negative integers (each below 2**64)"
                         % (shape,))
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_u64(o) for o in offsets):
        raise ValueError("data_offsets %r is not [begin, end] of non-negative integers"
                         % (offsets,))
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


def _inspect(header, data_size):
    """(problems, spans) of one parsed header: spans are (begin, end, name) in data order."""
    problems = metadata_problems(header)
    for name in sorted(set(key for key, _value in _shadowed(header) if key != "__metadata__")):
        problems.append("tensor %s appears twice; a loader would silently keep only the last" % name)
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = tensor_span(info)
        except ValueError as exc:
            problems.append("tensor %s: %s" % (name, exc))
            continue
        spans.append((begin, end, name))
    spans.sort()
    if not problems:
        problems = layout_problems(spans, data_size)
    return problems, spans


def read_shard(path):
    """(tensor names in data order, header bytes read) of one shard; ShardError lists every problem."""
    header, header_bytes, size = read_header(path)
    problems, spans = _inspect(header, size - header_bytes)
    if problems:
        raise ShardError(path, problems)
    return [name for _begin, _end, name in spans], header_bytes


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


class _ShardTally(object):
    """What check_shards found so far: summary lines, every problem in order (``details``), each shard's keys."""

    def __init__(self):
        self.shard_problems, self.key_problems, self.details = [], [], []
        self.absent = []
        self.nas = []        # absent shards whose header was read from the NAS snapshot
        self.keys = {}       # shard -> set of its tensor names
        self.owner = {}      # tensor name -> the first shard holding it
        self.checked = self.tensors = 0

    def broken_shard(self, line, details=None):
        self.shard_problems.append(line)
        self.details.extend([line] if details is None else details)

    def key_problem(self, line):
        self.key_problems.append(line)
        self.details.append(line)

    def add(self, shard, names, header_bytes):
        self.checked += header_bytes
        self.tensors += len(names)
        self.keys[shard] = set(names)
        for name in names:
            if name in self.owner:
                self.key_problem("Duplicate mapped checkpoint key: %s is in both %s and %s; a shard link points "
                                 "at the wrong blob, re-stage and verify" % (name, self.owner[name], shard))
            else:
                self.owner[name] = shard


def _read_shard_into(tally, path, shard, index_path):
    """Read one shard's header into tally; a missing or malformed shard is a problem, not an exception."""
    if not os.path.exists(path):
        kind = "a dangling symlink" if os.path.islink(path) else "missing"
        tally.broken_shard("shard %s named in %s is %s; stage it again" % (path, index_path or "the snapshot", kind))
        return
    try:
        names, header_bytes = read_shard(path)
    except ShardError as exc:
        tally.broken_shard(str(exc), ["%s: %s" % (path, problem) for problem in exc.problems])
        return
    except StageError as exc:
        tally.broken_shard(str(exc))
        return
    tally.add(shard, names, header_bytes)


def _check_weight_map(tally, weight_map, index_path):
    """Every tensor the index maps to a shard that was read must be in that shard."""
    for name in sorted(weight_map or {}):
        shard = weight_map[name]
        if shard in tally.keys and name not in tally.keys[shard]:
            found = " (it is in %s)" % tally.owner[name] if name in tally.owner else ""
            tally.key_problem("%s maps %s to %s, but that shard lacks it%s; the shard link points at the wrong "
                              "blob, re-stage and verify" % (index_path, name, shard, found))


class NasSnapshot(object):
    """The NAS snapshot a rank's sparse copy was staged from, walked once (scan_snapshot: a shard is read only
    where its link chain ends at a regular file inside that NAS hub)."""

    def __init__(self, nas_path, local_snapshot):
        self.path = os.path.abspath(nas_path)
        self.local = os.path.abspath(local_snapshot)
        self._entries = None

    def _scan(self):
        snapshots = os.path.dirname(self.path)
        if os.path.basename(snapshots) != "snapshots" or not os.path.isdir(self.path):
            raise StageError("nas_path %s is not a NAS snapshot directory (<NAS hub>/models--org--name/snapshots/"
                             "<commit>); point it at the snapshot the local one was staged from" % self.path)
        repo_dir = os.path.dirname(snapshots)
        entries = scan_snapshot(repo_dir, os.path.basename(self.path), os.path.dirname(repo_dir), strict=False)
        return dict((entry.path, entry) for entry in entries)

    def source(self, local_path):
        """(real path of the shard's content on the NAS, None) or (None, why it cannot be read there)."""
        if self._entries is None:
            self._entries = self._scan()
        rel = os.path.relpath(os.path.normpath(local_path), self.local).replace(os.sep, "/")
        entry = self._entries.get(rel)
        nas_file = os.path.join(self.path, rel)
        if entry is None:
            return None, "shard %s is not on the local disk and %s is not in the NAS snapshot" % (rel, nas_file)
        if entry.kind == "bad":
            return None, "shard %s is not on the local disk and its NAS copy cannot be read: %s" % (rel, entry.problem)
        return entry.source, None


def check_shards(base, shards, weight_map=None, index_path=None, absent_ok=(), nas=None):
    """Read every shard header; check keys against weight_map and for cross-shard duplicates.

    absent_ok: absolute paths of shards left out on purpose, read from `nas` (a NasSnapshot) when given, else
    skipped. Returns {shards, tensors, checked_bytes, absent, nas_shards}; SafetensorsCheckError names the
    failing shards, then key problems, and lists every problem.
    """
    tally = _ShardTally()
    for shard in shards:
        path = _shard_path(base, shard)
        if not os.path.lexists(path) and os.path.normpath(path) in absent_ok:
            tally.absent.append(shard)
            if nas is not None:
                source, problem = nas.source(path)
                if problem:
                    tally.broken_shard(problem)
                else:
                    tally.nas.append(shard)
                    _read_shard_into(tally, source, shard, index_path)
        else:
            _read_shard_into(tally, path, shard, index_path)
    _check_weight_map(tally, weight_map, index_path)
    if tally.shard_problems or tally.key_problems:
        raise SafetensorsCheckError("safetensors check failed in %s: %s"
                                    % (base, _summarise(tally.shard_problems + tally.key_problems)), tally.details)
    return {"shards": len(shards) - len(tally.absent) + len(tally.nas), "tensors": tally.tensors,
            "checked_bytes": tally.checked, "absent": tally.absent, "nas_shards": tally.nas}


def check_snapshot(path, index=None, absent_ok=(), nas_path=None):
    """Check a snapshot dir through its index if any, else its top-level *.safetensors files (absent_ok:
    snapshot-relative paths left out, read from nas_path when given). Returns check_shards' dict, index, msg."""
    absent_ok = set(os.path.normpath(os.path.join(path, p)) for p in absent_ok)
    if not os.path.isdir(path):
        raise StageError("%s is not a directory; point path at a local snapshot dir "
                         "(<hub>/models--org--name/snapshots/<commit>)" % path)
    nas = NasSnapshot(nas_path, path) if nas_path else None
    index_path = os.path.join(path, index or DEFAULT_INDEX)
    if os.path.lexists(index_path):
        weight_map = load_weight_map(index_path)
        base = os.path.dirname(index_path)
        shards = sorted(set(weight_map.values()))
        result = check_shards(base, shards, weight_map, index_path, absent_ok, nas)
        from_nas = " (%d of them read from the NAS)" % len(result["nas_shards"]) if result["nas_shards"] else ""
        result.update(index=index_path, msg="%d shards%s, %d tensors match %s" % (
            result["shards"], from_nas, result["tensors"], index_path))
        return result
    if index:
        raise StageError("%s does not exist; fix the index option or stage the index file"
                         % index_path)
    # No index: loaders read every top-level *.safetensors, so check each and look for duplicates.
    shards = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not shards:
        return {"shards": 0, "tensors": 0, "checked_bytes": 0, "absent": [], "nas_shards": [], "index": None,
                "msg": "no safetensors files in %s: nothing to check" % path}
    result = check_shards(path, shards)
    result.update(index=None, msg="no index; %d safetensors file(s), %d tensors checked" % (
        result["shards"], result["tensors"]))
    return result
