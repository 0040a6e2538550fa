#!/usr/bin/env python3
"""Synthetic NAS Hugging Face hub cache holding every trap from the 2026-09-27 night-shift log.

Used by the unit/integration tests, ``make demo`` (scripts/demo.py), the Molecule scenarios and the
benchmark. Stdlib only; everything is deterministic from ``seed`` (reruns are byte-identical).

Layout written under ``ROOT/hub`` (the NAS hub root)::

    hub/
      .locks/models--.../<etag>.lock                 noise (empty)
      blobs/.huggingface-shared-blobs                 hub-level 2-char store marker ("1\\n")
      blobs/<xx>/<name>                               real payloads of store-backed shards
      blobs/<xx>/<name>.refs / <name>.lock            store bookkeeping noise (as huggingface_hub writes it)
      models--coolbho3k--DeepSeek-V4.1-Flash-EXL3-3bpw/
        refs/main -> current commit, refs/v1 -> old commit
        blobs/<etag>                                  real file | ../../blobs/<xx>/<etag> | /abs/hub/blobs/<xx>/<etag>
        blobs/<etag>.incomplete                       interrupted-download noise
        snapshots/<commit>/...                        ../../blobs/<etag> links (+1 ../ per sub-dir)
        snapshots/<commit>/page15/{a,b}/...           REAL files (the optional pack, never staged)
        snapshots/<old_commit>/...                    older revision, one shard with other content
        trees/<commit>.json                           huggingface_hub 2.x tree listing
        .no_exist/<commit>/generation_config.json     empty marker
      models--coolbho3k--DSpark-drafter/              small repo, plain real blobs

Traps reproduced: link -> repo blob -> hub store (relative and absolute hops); page15 as real files
inside the snapshot; every weight shard has the same size but different content (size-based dedup
binds the wrong shard); an older revision with a same-size, different shard; non-content noise.

CLI: ``python3 tools/hubgen.py --root DIR [--shard-size BYTES] [--shards N] [--seed S] [--engram WORLD_SIZE] [--json]``

The engram layout (``add_engram_repo``, ``build_engram_hub``): a repo with shared files and per-rank
``engram/rank-{rank}-of-{world_size}/`` tables for a lane of world_size hosts.
"""

import argparse
import hashlib
import itertools
import json
import os
import random
import struct
import sys
import time

MAIN_REPO = "coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw"
DRAFTER_REPO = "coolbho3k/DSpark-drafter"

#: The demo's stage patterns: everything except the optional page15 pack.
ALLOW_PATTERNS = ["*"]
IGNORE_PATTERNS = ["page15/"]

#: Forms a repo-level ``blobs/<etag>`` takes (see module docstring).
FORM_REAL = "real"
FORM_REL_STORE = "rel-store"
FORM_ABS_STORE = "abs-store"
_SHARD_FORMS = (FORM_REL_STORE, FORM_ABS_STORE, FORM_REAL)  # shard i gets _SHARD_FORMS[i % 3]

SHARED_STORE_MARKER = ".huggingface-shared-blobs"  # huggingface_hub >= 2.4 skips a marked hub/blobs
_CHUNK = 1 << 20
_TENSORS_PER_SHARD = 3
MIN_SHARD_SIZE = 1024


# --------------------------------------------------------------------------------------------
# hashing helpers (public: other tests use them)
# --------------------------------------------------------------------------------------------

def flip_byte(path, offset):
    """A fault the tests inject: invert the byte at offset in place (same size, same inode, wrong hash)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def git_blob_sha1(data):
    """Git blob id of ``data``: sha1(b"blob <size>\\0" + data), 40 hex. Regular hub files are named by it."""
    h = hashlib.sha1(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def sha256_hex(data):
    """sha256 of ``data``, 64 hex. LFS hub files are named by it."""
    return hashlib.sha256(data).hexdigest()


def lfs_pointer(sha256, size):
    """The git-lfs pointer text the Hub stores in git for an LFS file."""
    return ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha256, size)).encode()


# --------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------

def _header_json(entries):
    """entries: list of (name, size) in data order -> compact header JSON bytes (unpadded)."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, size in entries:
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    return json.dumps(header, separators=(",", ":")).encode()


def _pad8(raw):
    return raw + b" " * (-len(raw) % 8)


def _plan_safetensors(names_sizes, total_size=None):
    """Return (header_bytes_padded, final [(name, size)]) for a U8-only safetensors file.

    With ``total_size`` the LAST tensor grows so the file is exactly ``total_size`` bytes.
    """
    entries = [(str(n), int(s)) for n, s in names_sizes]
    if not entries:
        raise ValueError("a safetensors file needs at least one tensor")
    if any(s < 0 for _, s in entries):
        raise ValueError("negative tensor size")
    if total_size is None:
        return _pad8(_header_json(entries)), entries
    # Size the header with a last tensor at least as long (in digits) as any real value, then pad
    # the real header to that length: the file size no longer depends on the header's digits.
    fixed = entries[:-1]
    probe = _pad8(_header_json(fixed + [(entries[-1][0], int(total_size))]))
    last = int(total_size) - 8 - len(probe) - sum(s for _, s in fixed)
    if last < entries[-1][1]:
        raise ValueError("total_size %d too small for these tensors (need >= %d)"
                         % (total_size, int(total_size) - last + entries[-1][1]))
    final = fixed + [(entries[-1][0], last)]
    raw = _header_json(final)
    header = raw + b" " * (len(probe) - len(raw))
    return header, final


def write_safetensors(path_or_fileobj, tensors, total_size=None):
    """Write a valid safetensors file of U8 tensors and return the bytes written.

    ``tensors``: {name: raw bytes}, in data order. With ``total_size`` the last tensor is zero-padded
    so the file is exactly ``total_size`` bytes (the trap: shards of equal size). ``path_or_fileobj``
    may be a path, a binary file object, or None (just return the bytes).
    """
    items = list(tensors.items())
    header, final = _plan_safetensors([(n, len(b)) for n, b in items], total_size)
    parts = [struct.pack("<Q", len(header)), header]
    for (name, data), (_, size) in zip(items, final):
        parts.append(bytes(data) + b"\0" * (size - len(data)))
    blob = b"".join(parts)
    if path_or_fileobj is None:
        return blob
    if hasattr(path_or_fileobj, "write"):
        path_or_fileobj.write(blob)
    else:
        with open(path_or_fileobj, "wb") as fh:
            fh.write(blob)
    return blob


def read_safetensors_header(path):
    """Parse a safetensors file's header: returns (header_len, header dict). For tests."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n).decode("utf-8"))


# --------------------------------------------------------------------------------------------
# deterministic content
# --------------------------------------------------------------------------------------------

def _rng(seed, label):
    return random.Random("hubgen:%d:%s" % (seed, label))


def _data_stream(seed, label, length):
    """Yield ``length`` deterministic pseudo-random bytes in <= 1 MiB chunks, without holding them all.

    One random block (<= 1 MiB) per stream; chunk c is that block rotated by c*7919 and stamped with c,
    so every MiB differs at every offset and two streams (labels) never share a window.
    """
    if length <= 0:
        return
    blk_len = min(length, _CHUNK)
    block = memoryview(_rng(seed, label).randbytes(blk_len))
    c = 0
    while length > 0:
        n = min(blk_len, length)
        if c == 0 or blk_len < 16:
            yield block[:n]
        else:
            # chunk = pack(c) + (block rotated left by k)[8:n], as zero-copy slices of the block
            k = (c * 7919) % blk_len
            yield struct.pack("<Q", c)[:n]
            start, want = (k + 8) % blk_len, n - 8
            while want > 0:
                take = min(want, blk_len - start)
                yield block[start:start + take]
                want -= take
                start = 0
        length -= n
        c += 1


def _small_bytes(seed, label, size):
    return _rng(seed, label).randbytes(size)


def _json_bytes(obj):
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _commit(seed, label):
    return hashlib.sha1(("hubgen-commit:%d:%s" % (seed, label)).encode()).hexdigest()


def _xet_name(etag):
    """Stand-in for a Xet hash (huggingface_hub names its store entries so): 64 hex, != content sha256."""
    return hashlib.sha256(("xet-sim:" + etag).encode()).hexdigest()


def _write_hashed(path, chunks, size):
    """Write the chunks (``size`` bytes in all) to path; returns (sha256, git blob sha1) of the content."""
    h256 = hashlib.sha256()
    h1 = hashlib.sha1(b"blob %d\0" % size)
    written = 0
    with open(path, "wb") as fh:
        for chunk in chunks:
            fh.write(chunk)
            h256.update(chunk)
            h1.update(chunk)
            written += len(chunk)
    if written != size:
        raise AssertionError("stream produced %d bytes, expected %d" % (written, size))
    return h256.hexdigest(), h1.hexdigest()


def repo_folder(repo_id, repo_type="model"):
    return "%ss--%s" % (repo_type, repo_id.replace("/", "--"))


# --------------------------------------------------------------------------------------------
# builder
# --------------------------------------------------------------------------------------------

class _Hub(object):
    def __init__(self, hub, seed, hf_native):
        self.hub = hub
        self.seed = seed
        self.hf_native = hf_native
        self.store = os.path.join(hub, "blobs")
        self.noise = []
        self._store_refs = {}  # store path -> [hub-relative repo blob paths]

    # -- blobs ----------------------------------------------------------------------------
    def put_blob(self, repo_dir, chunks, size, lfs, form):
        """Stream ``chunks`` (total ``size`` bytes) into the repo's blob store in the given form.

        Returns a dict: etag, size, sha256, blob_id (git sha1 of content), form, store_path.
        """
        blobs = os.path.join(repo_dir, "blobs")
        tmp = os.path.join(blobs, ".hubgen.tmp")
        sha256, blob_id = _write_hashed(tmp, chunks, size)
        etag = sha256 if lfs else blob_id
        repo_blob = os.path.join(blobs, etag)
        info = {"etag": etag, "size": size, "sha256": sha256, "blob_id": blob_id,
                "form": form, "store_path": None}
        if os.path.lexists(repo_blob):  # same content twice in one repo: one blob
            os.unlink(tmp)
            info["form"] = self._form_of(repo_blob)
            info["store_path"] = os.path.realpath(repo_blob) if info["form"] != FORM_REAL else None
            return info
        if form == FORM_REAL:
            os.rename(tmp, repo_blob)
            return info
        info["store_path"] = self._put_in_store(tmp, repo_blob, lfs, form)
        return info

    def _put_in_store(self, tmp, repo_blob, lfs, form):
        """Move tmp into the hub-level store and link the repo blob to it; returns the store path."""
        if not lfs:
            raise ValueError("only sha256-named (LFS) blobs live in the hub store")
        etag = os.path.basename(repo_blob)
        name = _xet_name(etag) if self.hf_native else etag
        prefix = os.path.join(self.store, name[:2])
        os.makedirs(prefix, exist_ok=True)
        store_path = os.path.join(prefix, name)
        os.rename(tmp, store_path)
        if form == FORM_REL_STORE:
            os.symlink(os.path.relpath(store_path, os.path.dirname(repo_blob)), repo_blob)
        elif form == FORM_ABS_STORE:
            os.symlink(store_path, repo_blob)
        else:
            raise ValueError("unknown blob form %r" % (form,))
        self._store_refs.setdefault(store_path, []).append(os.path.relpath(repo_blob, self.hub))
        return store_path

    @staticmethod
    def _form_of(repo_blob):
        if not os.path.islink(repo_blob):
            return FORM_REAL
        return FORM_ABS_STORE if os.path.isabs(os.readlink(repo_blob)) else FORM_REL_STORE

    def put_bytes(self, repo_dir, data, lfs=False, form=FORM_REAL):
        return self.put_blob(repo_dir, [data], len(data), lfs, form)

    def finish_store(self):
        """Write huggingface_hub's store bookkeeping: marker, <name>.refs manifests, a .lock."""
        if not self._store_refs:
            return
        marker = os.path.join(self.store, SHARED_STORE_MARKER)
        with open(marker, "w") as fh:
            fh.write("1\n")
        self.noise.append(os.path.relpath(marker, self.hub))
        for i, (store_path, refs) in enumerate(sorted(self._store_refs.items())):
            manifest = store_path + ".refs"
            with open(manifest, "w") as fh:
                fh.write("".join(r + "\n" for r in refs))
            self.noise.append(os.path.relpath(manifest, self.hub))
            if i == 0:
                open(store_path + ".lock", "w").close()
                self.noise.append(os.path.relpath(store_path + ".lock", self.hub))

    # -- snapshots --------------------------------------------------------------------------
    @staticmethod
    def link(snapshot, rel, repo_dir, etag):
        dst = os.path.join(snapshot, *rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.symlink(os.path.relpath(os.path.join(repo_dir, "blobs", etag), os.path.dirname(dst)), dst)

    def add(self, files, repo_dir, snapshot, rel, data, lfs=False, form=FORM_REAL):
        """Blob `data` linked from snapshot/rel, its entry recorded in files."""
        info = self.put_bytes(repo_dir, data, lfs=lfs, form=form)
        self.link(snapshot, rel, repo_dir, info["etag"])
        files[rel] = _file_entry(info)


def _new_repo(hub, repo_id):
    repo_dir = os.path.join(hub, repo_folder(repo_id))
    for sub in ("blobs", "refs", "snapshots"):
        os.makedirs(os.path.join(repo_dir, sub))
    return repo_dir


def _write_text(path, text):
    _write_bytes(path, text.encode())


def _write_bytes(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def _file_entry(info, kind="link"):
    return {"kind": kind, "etag": info["etag"] if kind == "link" else None, "size": info["size"],
            "sha256": info["sha256"], "blob_id": info["blob_id"],
            "blob_form": info["form"] if kind == "link" else None, "store_path": info.get("store_path")}


def _write_trees(hub_obj, repo_dir, commit, files):
    """trees/<commit>.json exactly as huggingface_hub 2.x writes it (indent=1, sorted paths)."""
    out = {}
    for path in sorted(files):
        f = files[path]
        lfs = f["kind"] == "link" and len(f["etag"]) == 64
        if lfs and hub_obj.hf_native:
            entry = {"size": f["size"], "blob_id": git_blob_sha1(lfs_pointer(f["sha256"], f["size"]))}
        else:
            entry = {"size": f["size"], "blob_id": f["blob_id"]}
        if lfs:
            entry["lfs_sha256"] = f["sha256"]
            entry["lfs_size"] = f["size"]
            if hub_obj.hf_native:
                entry["xet_hash"] = _xet_name(f["etag"])
        out[path] = entry
    path = os.path.join(repo_dir, "trees", commit + ".json")
    _write_text(path, json.dumps({"format_version": 1, "files": out}, indent=1))
    return path


def _shard_names(n):
    return ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]


def _write_shard(hub_obj, repo_dir, label, tensor_names, shard_size, form):
    """Stream one safetensors shard of exactly ``shard_size`` bytes; returns (blob info, [(name, size)])."""
    overhead = 8 + len(_pad8(_header_json([(t, shard_size) for t in tensor_names])))
    data_len = shard_size - overhead
    if data_len < len(tensor_names):
        raise ValueError("shard_size %d too small (minimum about %d)" % (shard_size, overhead + 64))
    quarter = max(1, data_len // (len(tensor_names) + 1))
    header, final = _plan_safetensors([(t, quarter) for t in tensor_names[:-1]]
                                      + [(tensor_names[-1], 1)], shard_size)
    data_total = sum(s for _, s in final)
    chunks = itertools.chain([struct.pack("<Q", len(header)) + header],
                             _data_stream(hub_obj.seed, label, data_total))
    info = hub_obj.put_blob(repo_dir, chunks, shard_size, lfs=True, form=form)
    return info, final


def _build_main(hub_obj, shard_size, n_shards):
    seed = hub_obj.seed
    repo_id = MAIN_REPO
    repo_dir = _new_repo(hub_obj.hub, repo_id)
    commit = _commit(seed, repo_id + "@main")
    old_commit = _commit(seed, repo_id + "@v1")
    snap = os.path.join(repo_dir, "snapshots", commit)
    old_snap = os.path.join(repo_dir, "snapshots", old_commit)
    os.makedirs(snap)
    os.makedirs(old_snap)
    files = {}
    _main_small_files(hub_obj, repo_dir, snap, files, n_shards)
    shard_names = _shard_names(n_shards)
    shard_tensors = _main_shards(hub_obj, repo_dir, snap, files, shard_names, shard_size)
    page15 = _main_page15(hub_obj, snap, files)
    trees = _write_trees(hub_obj, repo_dir, commit, files)
    old_files = _main_old_revision(hub_obj, repo_dir, old_snap, files, shard_names[0], shard_tensors, shard_size)
    old_only = sorted(set(f["etag"] for f in old_files.values())
                      - set(f["etag"] for f in files.values() if f["etag"]))

    _write_text(os.path.join(repo_dir, "refs", "main"), commit)
    _write_text(os.path.join(repo_dir, "refs", "v1"), old_commit)
    _main_noise(hub_obj, repo_dir, commit, files["config.json"]["etag"])

    pairs = [[a, b] for a, b in itertools.combinations(shard_names, 2)]
    return repo_id, {
        "folder": repo_folder(repo_id), "commit": commit, "old_commit": old_commit,
        "refs": {"main": commit, "v1": old_commit},
        "files": files, "page15": page15, "same_size_pairs": pairs,
        "shards": shard_names, "old_files": old_files, "old_only_etags": old_only,
        "trees": trees,
    }


def _main_small_files(hub_obj, repo_dir, snap, files, n_shards):
    """Config, tokenizer and extras (extras/ nests): small git-sha1 blobs, linked from the snapshot."""
    seed = hub_obj.seed
    small = {
        "config.json": _json_bytes({
            "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
            "hidden_size": 7168, "num_hidden_layers": n_shards, "n_routed_experts": 384,
            "num_experts_per_tok": 8, "vocab_size": 129280, "torch_dtype": "bfloat16",
            "hubgen_seed": seed}),
        "tokenizer.json": _json_bytes({
            "version": "1.0", "model": {"type": "BPE", "vocab": {
                _small_bytes(seed, "tok%d" % i, 6).hex(): i for i in range(160)}}}),
        "tokenizer_config.json": _json_bytes({
            "bos_token": "<|begin_of_sentence|>", "eos_token": "<|end_of_sentence|>",
            "model_max_length": 163840, "tokenizer_class": "LlamaTokenizerFast"}),
        "quantization_config.json": _json_bytes({
            "quant_method": "exl3", "bits": 3.0, "head_bits": 6, "calibration": {"rows": 250},
            "version": "0.0.7"}),
        "extras/generation_config.json": _json_bytes({
            "bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 0.6}),
        "extras/chat/chat_template.jinja": (
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|Assistant|>\n").encode(),
    }
    for rel, data in small.items():
        hub_obj.add(files, repo_dir, snap, rel, data)


def _main_shards(hub_obj, repo_dir, snap, files, shard_names, shard_size):
    """Weight shards (same size, different content, three blob forms) and their index; returns
    {shard: [(tensor, size)]}."""
    weight_map = {}
    total_size = 0
    shard_tensors = {}
    for i, name in enumerate(shard_names):
        tnames = ["model.layers.%d.mlp.experts.%d.w1.trellis" % (i, 300 + j)
                  for j in range(_TENSORS_PER_SHARD)]
        info, final = _write_shard(hub_obj, repo_dir, "%s:%s" % (MAIN_REPO, name), tnames, shard_size,
                                   _SHARD_FORMS[i % len(_SHARD_FORMS)])
        hub_obj.link(snap, name, repo_dir, info["etag"])
        files[name] = _file_entry(info)
        shard_tensors[name] = final
        for t, s in final:
            weight_map[t] = name
            total_size += s
    hub_obj.add(files, repo_dir, snap, "model.safetensors.index.json",
                _json_bytes({"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}))
    return shard_tensors


def _main_page15(hub_obj, snap, files):
    """The page15 pack: REAL files inside the snapshot (never staged; bound from the NAS)."""
    seed = hub_obj.seed
    page15 = []
    for k, rel in enumerate(["page15/a/engram-0000.bin", "page15/a/engram-0001.bin",
                             "page15/a/engram-0002.bin", "page15/b/engram-0003.bin",
                             "page15/b/pack.json"]):
        if rel.endswith(".json"):
            data = _json_bytes({"pack": "page15", "optional": True, "decode_gain": "+1.4%",
                                "files": sorted(page15),
                                "engram_table": [_small_bytes(seed, "page15:%d" % e, 16).hex()
                                                 for e in range(48)]})
        else:
            data = _small_bytes(seed, "%s:%s" % (MAIN_REPO, rel), 3072 + 1111 * k)
        _write_bytes(os.path.join(snap, rel), data)
        files[rel] = {"kind": "real", "etag": None, "size": len(data), "sha256": sha256_hex(data),
                      "blob_id": git_blob_sha1(data), "blob_form": None, "store_path": None}
        page15.append(rel)
    return page15


def _main_old_revision(hub_obj, repo_dir, old_snap, files, first, shard_tensors, shard_size):
    """The old revision: shares some blobs, has a same-size different first shard; never staged."""
    old_files = {}
    for rel in ("config.json", "tokenizer.json"):
        hub_obj.link(old_snap, rel, repo_dir, files[rel]["etag"])
        old_files[rel] = dict(files[rel])
    tnames = [t for t, _ in shard_tensors[first]]
    info, _ = _write_shard(hub_obj, repo_dir, "%s:%s@old" % (MAIN_REPO, first), tnames, shard_size, FORM_REAL)
    hub_obj.link(old_snap, first, repo_dir, info["etag"])
    old_files[first] = _file_entry(info)
    return old_files


def _main_noise(hub_obj, repo_dir, commit, config_etag):
    """Noise that is not content: a .no_exist marker, a lock, an interrupted download."""
    marker = os.path.join(repo_dir, ".no_exist", commit, "generation_config.json")
    _write_text(marker, "")
    lock = os.path.join(hub_obj.hub, ".locks", repo_folder(MAIN_REPO), config_etag + ".lock")
    _write_text(lock, "")
    partial = os.path.join(repo_dir, "blobs", sha256_hex(b"interrupted") + ".incomplete")
    with open(partial, "wb") as fh:
        fh.write(_small_bytes(hub_obj.seed, "incomplete", 1000))
    hub_obj.noise.extend(os.path.relpath(p, hub_obj.hub) for p in (marker, lock, partial))


def _build_drafter(hub_obj):
    seed = hub_obj.seed
    repo_id = DRAFTER_REPO
    repo_dir = _new_repo(hub_obj.hub, repo_id)
    commit = _commit(seed, repo_id + "@main")
    snap = os.path.join(repo_dir, "snapshots", commit)
    os.makedirs(snap)
    files = {}
    hub_obj.add(files, repo_dir, snap, "config.json", _json_bytes({
        "architectures": ["DSparkDrafter"], "model_type": "dspark", "num_hidden_layers": 2, "hidden_size": 2048,
        "target": MAIN_REPO}))
    names = _shard_names(2)
    weight_map = {}
    total = 0
    for i, (name, size) in enumerate(zip(names, (12288, 9216))):
        tensors = {"model.layers.%d.self_attn.q_proj.weight" % i:
                   _small_bytes(seed, "%s:%s:q" % (repo_id, name), 2048),
                   "model.layers.%d.mlp.down_proj.weight" % i:
                   _small_bytes(seed, "%s:%s:d" % (repo_id, name), 1024)}
        for t, t_size in _plan_safetensors([(t, len(b)) for t, b in tensors.items()], size)[1]:
            weight_map[t] = name
            total += t_size
        hub_obj.add(files, repo_dir, snap, name, write_safetensors(None, tensors, total_size=size), lfs=True)
    hub_obj.add(files, repo_dir, snap, "model.safetensors.index.json",
                _json_bytes({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}))
    trees = _write_trees(hub_obj, repo_dir, commit, files)
    _write_text(os.path.join(repo_dir, "refs", "main"), commit)
    return repo_id, {
        "folder": repo_folder(repo_id), "commit": commit, "old_commit": None, "refs": {"main": commit},
        "files": files, "page15": [], "same_size_pairs": [], "shards": names, "old_files": {},
        "old_only_etags": [], "trees": trees,
    }


# --------------------------------------------------------------------------------------------
# the engram layout (per-rank sparse tables for a lane of world_size hosts)
# --------------------------------------------------------------------------------------------

ENGRAM_REPO = "dgx-stage/engram-lane-test"
#: The files every rank stages (config, the dense shard and its index, engram/shared/).
ENGRAM_SHARED_PATTERNS = ["config.json", "model*", "engram/shared/*"]
#: A rank's own part, as a stage_repos rank_patterns template list.
ENGRAM_RANK_TEMPLATES = ["engram/rank-{rank}-of-{world_size}/*"]
ENGRAM_SEED = 7
ENGRAM_TABLES_PER_RANK = 2


def engram_rank_dir(rank, world_size):
    """Snapshot-relative folder of one rank's tables: engram/rank-<rank>-of-<world_size>."""
    return "engram/rank-%d-of-%d" % (rank, world_size)


def _unique_bytes(files, paths):
    """Bytes of the distinct blobs behind ``paths`` (one blob copied once however many paths name it)."""
    return sum(dict((files[p]["etag"], files[p]["size"]) for p in paths).values())


def add_engram_repo(hub, world_size, repo_id=ENGRAM_REPO, seed=ENGRAM_SEED, table_size=5120, dense_size=4096,
                    hf_native=False):
    """Write an engram repo for a lane of ``world_size`` ranks into the existing hub root ``hub``.

    Shared files: ``config.json``, ``engram/shared/vocab.json``, one dense shard
    ``model-00001-of-00001.safetensors`` (``dense_size`` payload bytes) and ``model.safetensors.index.json``
    mapping every tensor, the rank tables' included. Per rank, under ``engram/rank-<r>-of-<world_size>/``:
    ``meta.json`` and ENGRAM_TABLES_PER_RANK table shards ``table-0000<t>.safetensors`` (``table_size``
    payload bytes each, keys and values 2:3). Blobs are named by their hash, snapshot entries link into
    ../blobs, and the last rank's first table lives in the hub-level store behind a relative link (the
    log's trap). Deterministic from ``seed``; with the defaults and world_size 2 it is the repo
    tests/integration/test_rank_templates.py writes.

    Returns {"repo_id", "folder", "commit", "world_size", "files": {path: hubgen file entry},
    "shared": [paths], "ranks": {rank: [paths]}, "shared_bytes", "rank_bytes": {rank: bytes} (distinct
    blobs), "allow_patterns", "rank_patterns", "trees", "noise"}.
    """
    world_size = int(world_size)
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if int(table_size) < 5 or int(dense_size) < 1:
        raise ValueError("table_size must be >= 5 bytes and dense_size >= 1 byte")
    hub = os.path.abspath(os.fspath(hub))
    hub_obj = _Hub(hub, int(seed), bool(hf_native))
    repo_dir = _new_repo(hub, repo_id)
    commit = _commit(hub_obj.seed, repo_id + "@main")
    snap = os.path.join(repo_dir, "snapshots", commit)
    os.makedirs(snap)
    files, weight_map, total = {}, {}, [0]

    def put(rel, data, lfs=False, form=FORM_REAL):
        hub_obj.add(files, repo_dir, snap, rel, data, lfs=lfs, form=form)

    def put_shard(rel, tensors, form=FORM_REAL):
        for name, raw in tensors.items():
            weight_map[name] = rel
            total[0] += len(raw)
        put(rel, write_safetensors(None, tensors), lfs=True, form=form)

    put("config.json", _json_bytes({"architectures": ["DeepseekV4ForCausalLM"], "engram_ranks": world_size}))
    put("engram/shared/vocab.json", _json_bytes({"ngram": 3, "buckets": 4096}))
    put_shard("model-00001-of-00001.safetensors",
              {"model.embed_tokens.weight": _small_bytes(hub_obj.seed, "dense", int(dense_size))})
    keys = int(table_size) * 2 // 5
    ranks = {}
    for rank in range(world_size):
        folder = engram_rank_dir(rank, world_size)
        put(folder + "/meta.json", _json_bytes({"rank": rank, "world_size": world_size}))
        for table in range(ENGRAM_TABLES_PER_RANK):
            label = "engram.%d.table.%d" % (rank, table)
            form = FORM_REL_STORE if (rank, table) == (world_size - 1, 0) else FORM_REAL
            put_shard("%s/table-%05d.safetensors" % (folder, table),
                      {label + ".keys": _small_bytes(hub_obj.seed, label + "k", keys),
                       label + ".values": _small_bytes(hub_obj.seed, label + "v", int(table_size) - keys)}, form)
        ranks[rank] = sorted(p for p in files if p.startswith(folder + "/"))
    put("model.safetensors.index.json",
        _json_bytes({"metadata": {"total_size": total[0]}, "weight_map": dict(sorted(weight_map.items()))}))
    trees = _write_trees(hub_obj, repo_dir, commit, files)
    _write_text(os.path.join(repo_dir, "refs", "main"), commit)
    hub_obj.finish_store()
    shared = sorted(p for p in files if not p.startswith("engram/rank-"))
    return {
        "repo_id": repo_id, "folder": repo_folder(repo_id), "commit": commit, "world_size": world_size,
        "files": files, "shared": shared, "ranks": ranks,
        "shared_bytes": _unique_bytes(files, shared),
        "rank_bytes": dict((rank, _unique_bytes(files, paths)) for rank, paths in ranks.items()),
        "allow_patterns": list(ENGRAM_SHARED_PATTERNS), "rank_patterns": list(ENGRAM_RANK_TEMPLATES),
        "trees": trees, "noise": sorted(hub_obj.noise),
    }


def build_engram_hub(root, world_size, **kwargs):
    """Create ``root/hub`` (must not exist) holding only the engram repo (add_engram_repo's keyword
    arguments); returns {"hub", "store", "repos": {repo_id: add_engram_repo's description}, "duration_s"}."""
    t0 = time.monotonic()
    hub = os.path.join(os.path.abspath(os.fspath(root)), "hub")
    if os.path.lexists(hub):
        raise FileExistsError("%s already exists; hubgen only creates a fresh hub" % hub)
    os.makedirs(os.path.join(hub, ".locks"))
    desc = add_engram_repo(hub, world_size, **kwargs)
    return {"hub": hub, "store": os.path.join(hub, "blobs"), "repos": {desc["repo_id"]: desc},
            "duration_s": round(time.monotonic() - t0, 3)}


def build_nas_hub(root, shard_size=64 * 1024, n_shards=6, seed=0, hf_native=False):
    """Create ``root/hub`` (must not exist) with both repos and every trap; return its description.

    Returned dict::

        {"hub": abs hub root, "store": abs hub/blobs,
         "repos": {repo_id: {"folder", "commit", "old_commit" (or None), "refs": {name: commit},
                             "files": {snapshot-relative path: {"kind": "link"|"real",
                                       "etag" (None for real), "size", "sha256", "blob_id" (git sha1),
                                       "blob_form": "real"|"rel-store"|"abs-store"|None,
                                       "store_path": abs path in hub/blobs or None}},
                             "page15": [...], "same_size_pairs": [[a, b], ...], "shards": [...],
                             "old_files": {...same shape...}, "old_only_etags": [...],
                             "trees": abs path of trees/<commit>.json}},
         "allow_patterns": [...], "ignore_patterns": [...],
         "noise": [hub-relative paths that are not content], "shard_size", "n_shards", "seed",
         "hf_native", "duration_s"}

    ``hf_native=True`` switches two details to what huggingface_hub 2.4 itself produces: store entries
    are named by a (simulated) Xet hash instead of the etag, and trees' ``blob_id`` of LFS files is the
    git sha1 of the LFS pointer, not of the content.
    """
    t0 = time.monotonic()
    shard_size = int(shard_size)
    n_shards = int(n_shards)
    if n_shards < 1 or n_shards > 99999:
        raise ValueError("n_shards must be 1..99999")
    if shard_size < MIN_SHARD_SIZE:
        raise ValueError("shard_size must be >= %d bytes" % MIN_SHARD_SIZE)
    root = os.path.abspath(os.fspath(root))
    hub = os.path.join(root, "hub")
    if os.path.lexists(hub):
        raise FileExistsError("%s already exists; hubgen only creates a fresh hub" % hub)
    if not os.path.isdir(root):
        os.makedirs(root)
    os.mkdir(hub)
    hub_obj = _Hub(hub, int(seed), bool(hf_native))
    os.makedirs(os.path.join(hub, ".locks"))
    repos = {}
    for builder in (lambda: _build_main(hub_obj, shard_size, n_shards), lambda: _build_drafter(hub_obj)):
        repo_id, desc = builder()
        repos[repo_id] = desc
    hub_obj.finish_store()
    return {
        "hub": hub, "store": hub_obj.store, "repos": repos,
        "allow_patterns": list(ALLOW_PATTERNS), "ignore_patterns": list(IGNORE_PATTERNS),
        "noise": sorted(hub_obj.noise), "shard_size": shard_size, "n_shards": n_shards,
        "seed": int(seed), "hf_native": bool(hf_native),
        "duration_s": round(time.monotonic() - t0, 3),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="directory to create hub/ in (hub/ must not exist)")
    p.add_argument("--shard-size", type=int, default=64 * 1024, help="bytes per weight shard (all equal)")
    p.add_argument("--shards", type=int, default=6, help="number of weight shards in the main repo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-native", action="store_true",
                   help="Xet-named store entries and pointer blob_ids, as huggingface_hub 2.4 writes them")
    p.add_argument("--json", action="store_true", help="print the JSON description")
    p.add_argument("--engram", type=int, metavar="WORLD_SIZE",
                   help="also write the engram repo (%s) with per-rank tables for WORLD_SIZE ranks" % ENGRAM_REPO)
    a = p.parse_args(argv)
    try:
        desc = build_nas_hub(a.root, shard_size=a.shard_size, n_shards=a.shards, seed=a.seed,
                             hf_native=a.hf_native)
        if a.engram is not None:
            engram = add_engram_repo(desc["hub"], a.engram, hf_native=a.hf_native)
            desc["repos"][engram["repo_id"]] = engram
    except (ValueError, OSError) as e:
        p.exit(2, "hubgen: error: %s\n" % e)
    if a.json:
        json.dump(desc, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    else:
        for repo_id, r in sorted(desc["repos"].items()):
            print("%s  commit %s  files %d (page15 %d)"
                  % (repo_id, r["commit"], len(r["files"]), len(r.get("page15", []))))
        print("hub %s  (%d x %d-byte shards, %.2fs)" % (desc["hub"], desc["n_shards"], desc["shard_size"],
                                                         desc["duration_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
