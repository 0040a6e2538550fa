#!/usr/bin/env python3
"""Synthetic NAS Hugging Face hub cache holding every trap from the 2026-09-27 night-shift log.

Used by the tests, ``make demo``, the Molecule scenarios and the bench. Stdlib only; deterministic from
``seed`` (reruns are byte-identical). Layout under ``ROOT/hub``::

    .locks/models--.../<etag>.lock                   noise (empty)
    blobs/.huggingface-shared-blobs                  hub-level 2-char store marker ("1\\n")
    blobs/<xx>/<name>[.refs|.lock]                   store-backed payloads and their bookkeeping
    models--coolbho3k--DeepSeek-V4.1-Flash-EXL3-3bpw/
      refs/main, refs/v1                             current and old commit
      blobs/<etag>[.incomplete]                      real file | ../../blobs/<xx>/<etag> | /abs/hub/blobs/...
      snapshots/<commit>/...                         ../blobs/<etag> links; page15/ holds REAL files
      snapshots/<old_commit>/...                     older revision, one same-size shard with other content
      trees/<commit>.json, .no_exist/<commit>/...    huggingface_hub 2.x listing, empty marker
    models--coolbho3k--DSpark-drafter/               small repo, plain real blobs

The traps: links through repo blobs into the hub store (relative and absolute hops); page15 as real files;
equal-size shards with different content; an older revision with a same-size, different shard; noise.
``add_engram_repo`` writes per-rank ``engram/rank-{rank}-of-{world_size}/`` tables beside shared files.

CLI: ``python3 tools/hubgen.py --root DIR [--shard-size BYTES] [--shards N] [--seed S] [--engram WORLD_SIZE] [--json]``
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

#: Forms a repo-level ``blobs/<etag>`` takes.
FORM_REAL = "real"
FORM_REL_STORE = "rel-store"
FORM_ABS_STORE = "abs-store"
_SHARD_FORMS = (FORM_REL_STORE, FORM_ABS_STORE, FORM_REAL)  # shard i gets _SHARD_FORMS[i % 3]

SHARED_STORE_MARKER = ".huggingface-shared-blobs"  # huggingface_hub >= 2.4 skips a marked hub/blobs
INDEX = "model.safetensors.index.json"
_CHUNK = 1 << 20
_TENSORS_PER_SHARD = 3
MIN_SHARD_SIZE = 1024


def flip_byte(path, offset):
    """A fault the tests inject: invert the byte at offset in place (same size, same inode, wrong hash)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def git_blob_sha1(data):
    """Git blob id of ``data`` (regular hub files are named by it)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256_hex(data):
    """sha256 of ``data`` (LFS hub files are named by it)."""
    return hashlib.sha256(data).hexdigest()


def lfs_pointer(sha256, size):
    """The git-lfs pointer text the Hub stores in git for an LFS file."""
    return ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha256, size)).encode()


def repo_folder(repo_id, repo_type="model"):
    return "%ss--%s" % (repo_type, repo_id.replace("/", "--"))


def _header(entries, width=0):
    """Length prefix and JSON header of U8 tensors [(name, size)] in data order, space-padded to a multiple of 8
    bytes and to at least width bytes in all."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, size in entries:
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw = raw.ljust(max(width - 8, len(raw) + -len(raw) % 8))
    return struct.pack("<Q", len(raw)) + raw


def _plan_safetensors(entries, total_size=None):
    """(header, final [(name, size)]); with total_size the LAST tensor grows so the file is exactly that long.
    The header is padded to the width it has with the last size at total_size, so its digits never change it."""
    if not entries:
        raise ValueError("a safetensors file needs at least one tensor")
    if total_size is None:
        return _header(entries), entries
    *fixed, (name, least) = entries
    width = len(_header(fixed + [(name, total_size)]))
    last = total_size - width - sum(s for _, s in fixed)
    if last < least:
        raise ValueError("total_size %d too small for these tensors (need >= %d)"
                         % (total_size, total_size - last + least))
    final = fixed + [(name, last)]
    return _header(final, width), final


def _safetensors(tensors, total_size=None):
    """(bytes, final [(name, size)]) of a safetensors file of U8 tensors {name: raw bytes}, zero-padded."""
    header, final = _plan_safetensors([(n, len(b)) for n, b in tensors.items()], total_size)
    return header + b"".join(bytes(d).ljust(size, b"\0") for d, (_, size) in zip(tensors.values(), final)), final


def write_safetensors(path, tensors, total_size=None):
    """Write (unless path is None) and return a valid safetensors file of U8 tensors ({name: raw bytes}, in data
    order); with total_size the last tensor is zero-padded so the file is exactly that long."""
    blob = _safetensors(tensors, total_size)[0]
    if path is not None:
        _write(path, blob)
    return blob


def read_safetensors_header(path):
    """(header_len, header dict) of a safetensors file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n).decode("utf-8"))


def _small_bytes(seed, label, size):
    return random.Random("hubgen:%d:%s" % (seed, label)).randbytes(size)


def _data_stream(seed, label, length):
    """length deterministic bytes in <= 1 MiB chunks without holding them all: chunk c > 0 is one random block
    rotated by c*7919 and stamped with c, so no two MiB (or two labels' streams) share a window."""
    block = _small_bytes(seed, label, min(length, _CHUNK))
    for c, offset in enumerate(range(0, length, len(block))):
        n = min(len(block), length - offset)
        k = (c * 7919 + 8) % len(block)
        yield block[:n] if c == 0 else (struct.pack("<Q", c) + block[k:] + block[:k])[:n]


def _json_bytes(obj):
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _commit(seed, label):
    return hashlib.sha1(("hubgen-commit:%d:%s" % (seed, label)).encode()).hexdigest()


def _xet_name(etag):
    """Stand-in for a Xet hash (huggingface_hub names its store entries so): 64 hex, != content sha256."""
    return hashlib.sha256(("xet-sim:" + etag).encode()).hexdigest()


def _write(path, data=b""):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def _fresh_hub(root):
    hub = os.path.join(os.path.abspath(os.fspath(root)), "hub")
    if os.path.lexists(hub):
        raise FileExistsError("%s already exists; hubgen only creates a fresh hub" % hub)
    os.makedirs(os.path.join(hub, ".locks"))
    return hub


class Hub(object):
    """A hub root being written and its hub-level store."""

    def __init__(self, hub, seed=0, hf_native=False):
        self.hub, self.seed, self.hf_native = hub, seed, hf_native
        self.store = os.path.join(hub, "blobs")
        self.noise = []
        self.store_refs = {}  # store path -> [hub-relative repo blob paths]

    def finish_store(self):
        """huggingface_hub's store bookkeeping: the marker, <name>.refs manifests, a .lock."""
        if not self.store_refs:
            return
        paths = [_write(os.path.join(self.store, SHARED_STORE_MARKER), b"1\n")]
        for i, (store_path, refs) in enumerate(sorted(self.store_refs.items())):
            paths.append(_write(store_path + ".refs", "".join(r + "\n" for r in refs).encode()))
            if i == 0:
                paths.append(_write(store_path + ".lock"))
        self.noise += [os.path.relpath(p, self.hub) for p in paths]


class Repo(object):
    """One repo being written: blobs named by their hash, snapshot links into ../blobs, its shards' index.
    A file entry: {"kind": "link"|"real", "etag" (None for real), "size", "sha256", "blob_id" (git sha1),
    "blob_form": FORM_*|None, "store_path": abs path in hub/blobs or None}."""

    def __init__(self, hub, repo_id):
        self.hub, self.repo_id, self.folder = hub, repo_id, repo_folder(repo_id)
        self.dir = os.path.join(hub.hub, self.folder)
        os.makedirs(os.path.join(self.dir, "blobs"))
        self.commit = _commit(hub.seed, repo_id + "@main")
        self.snap = self.snapshot(self.commit)
        self.files, self.weight_map, self.total, self.refs = {}, {}, 0, {}

    def snapshot(self, commit):
        path = os.path.join(self.dir, "snapshots", commit)
        os.makedirs(path)
        return path

    def place(self, etag, write, form=FORM_REAL):
        """Blob etag in its form, write(path) putting its bytes at path; returns its store path or None."""
        repo_blob = os.path.join(self.dir, "blobs", etag)
        if form == FORM_REAL:
            write(repo_blob)
            return None
        name = _xet_name(etag) if self.hub.hf_native else etag
        store_path = os.path.join(self.hub.store, name[:2], name)
        os.makedirs(os.path.dirname(store_path), exist_ok=True)
        write(store_path)
        os.symlink(store_path if form == FORM_ABS_STORE else os.path.relpath(store_path, os.path.dirname(repo_blob)),
                   repo_blob)
        self.hub.store_refs.setdefault(store_path, []).append(os.path.relpath(repo_blob, self.hub.hub))
        return store_path

    def blob(self, chunks, size, lfs=False, form=FORM_REAL):
        """Stream chunks (size bytes in all) into a blob named by its hash, in its form; returns its entry."""
        tmp = os.path.join(self.dir, "blobs", ".hubgen.tmp")
        h256, h1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        with open(tmp, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                h256.update(chunk)
                h1.update(chunk)
        sha256, blob_id = h256.hexdigest(), h1.hexdigest()
        etag = sha256 if lfs else blob_id
        store_path = self.place(etag, lambda path: os.rename(tmp, path), form)
        return {"kind": "link", "etag": etag, "size": size, "sha256": sha256, "blob_id": blob_id,
                "blob_form": form, "store_path": store_path}

    def link(self, snap, rel, entry):
        """snap/rel, a relative link to the entry's blob; returns the entry."""
        dst = os.path.join(snap, *rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.symlink(os.path.relpath(os.path.join(self.dir, "blobs", entry["etag"]), os.path.dirname(dst)), dst)
        return entry

    def add(self, rel, data, lfs=False, form=FORM_REAL):
        self.files[rel] = self.link(self.snap, rel, self.blob([data], len(data), lfs, form))

    def add_shard(self, rel, tensors, total_size=None, form=FORM_REAL):
        """A safetensors shard of tensors ({name: bytes}), mapped in the index."""
        data, final = _safetensors(tensors, total_size)
        self.add(rel, data, lfs=True, form=form)
        self.map(rel, final)

    def map(self, rel, tensors):
        """Map [(tensor, size)] to shard rel in the index."""
        for name, size in tensors:
            self.weight_map[name] = rel
            self.total += size

    def finish(self, **refs):
        """The index (when there are shards), trees/<commit>.json as huggingface_hub 2.x writes it, refs/."""
        if self.weight_map:
            self.add(INDEX, _json_bytes({"metadata": {"total_size": self.total}, "weight_map": self.weight_map}))
        trees = {}
        for path, f in sorted(self.files.items()):
            lfs = f["kind"] == "link" and len(f["etag"]) == 64
            native = lfs and self.hub.hf_native
            trees[path] = {"size": f["size"],
                           "blob_id": git_blob_sha1(lfs_pointer(f["sha256"], f["size"])) if native else f["blob_id"]}
            if lfs:
                trees[path].update(lfs_sha256=f["sha256"], lfs_size=f["size"])
            if native:
                trees[path]["xet_hash"] = _xet_name(f["etag"])
        self.refs = dict(main=self.commit, **refs)
        for ref, commit in self.refs.items():
            _write(os.path.join(self.dir, "refs", ref), commit.encode())
        return _write(os.path.join(self.dir, "trees", self.commit + ".json"),
                      json.dumps({"format_version": 1, "files": trees}, indent=1).encode())


def shard_names(n):
    return ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]


def _stream_shard(repo, label, index, shard_size, form):
    """Main shard number index, exactly shard_size bytes, streamed: (its entry, its [(tensor, size)])."""
    names = ["model.layers.%d.mlp.experts.%d.w1.trellis" % (index, 300 + j) for j in range(_TENSORS_PER_SHARD)]
    quarter = max(1, (shard_size - len(_header([(t, shard_size) for t in names]))) // (len(names) + 1))
    header, final = _plan_safetensors([(t, quarter) for t in names[:-1]] + [(names[-1], 1)], shard_size)
    chunks = itertools.chain([header], _data_stream(repo.hub.seed, label, sum(s for _, s in final)))
    return repo.blob(chunks, shard_size, lfs=True, form=form), final


def _describe(repo, trees, shards, **main_only):
    desc = {"folder": repo.folder, "commit": repo.commit, "refs": repo.refs, "files": repo.files, "shards": shards,
            "trees": trees, "old_commit": None, "page15": [], "same_size_pairs": [], "old_files": {},
            "old_only_etags": []}
    desc.update(main_only)
    return desc


def _build_main(hub, shard_size, n_shards):
    seed = hub.seed
    repo = Repo(hub, MAIN_REPO)
    small = {  # config, tokenizer and extras (extras/ nests): small git-sha1 blobs
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
        repo.add(rel, data)
    shards = shard_names(n_shards)
    for i, name in enumerate(shards):  # one size, different content, three blob forms
        entry, final = _stream_shard(repo, "%s:%s" % (MAIN_REPO, name), i, shard_size, _SHARD_FORMS[i % 3])
        repo.files[name] = repo.link(repo.snap, name, entry)
        repo.map(name, final)
    # The optional pack: REAL files inside the snapshot, never staged (bound from the NAS).
    bins = ["page15/a/engram-0000.bin", "page15/a/engram-0001.bin", "page15/a/engram-0002.bin",
            "page15/b/engram-0003.bin"]
    page15 = dict((rel, _small_bytes(seed, "%s:%s" % (MAIN_REPO, rel), 3072 + 1111 * k)) for k, rel in enumerate(bins))
    page15["page15/b/pack.json"] = _json_bytes({
        "pack": "page15", "optional": True, "decode_gain": "+1.4%", "files": sorted(page15),
        "engram_table": [_small_bytes(seed, "page15:%d" % e, 16).hex() for e in range(48)]})
    for rel, data in page15.items():
        _write(os.path.join(repo.snap, rel), data)
        repo.files[rel] = {"kind": "real", "etag": None, "size": len(data), "sha256": sha256_hex(data),
                           "blob_id": git_blob_sha1(data), "blob_form": None, "store_path": None}
    # The old revision shares some blobs and has a same-size, different first shard; it is never staged.
    old_commit = _commit(seed, MAIN_REPO + "@v1")
    old_snap = repo.snapshot(old_commit)
    old_files = dict((rel, repo.link(old_snap, rel, dict(repo.files[rel])))
                     for rel in ("config.json", "tokenizer.json"))
    old_shard = _stream_shard(repo, "%s:%s@old" % (MAIN_REPO, shards[0]), 0, shard_size, FORM_REAL)[0]
    old_files[shards[0]] = repo.link(old_snap, shards[0], old_shard)
    trees = repo.finish(v1=old_commit)
    hub.noise += [os.path.relpath(p, hub.hub) for p in (  # not content
        _write(os.path.join(repo.dir, ".no_exist", repo.commit, "generation_config.json")),
        _write(os.path.join(hub.hub, ".locks", repo.folder, repo.files["config.json"]["etag"] + ".lock")),
        _write(os.path.join(repo.dir, "blobs", sha256_hex(b"interrupted") + ".incomplete"),
               _small_bytes(seed, "incomplete", 1000)))]
    return _describe(repo, trees, shards, old_commit=old_commit, page15=list(page15), old_files=old_files,
                     same_size_pairs=[[a, b] for a, b in itertools.combinations(shards, 2)],
                     old_only_etags=sorted(set(f["etag"] for f in old_files.values())
                                           - set(f["etag"] for f in repo.files.values())))


def _build_drafter(hub):
    repo = Repo(hub, DRAFTER_REPO)
    repo.add("config.json", _json_bytes({
        "architectures": ["DSparkDrafter"], "model_type": "dspark", "num_hidden_layers": 2, "hidden_size": 2048,
        "target": MAIN_REPO}))
    shards = shard_names(2)
    for i, (name, size) in enumerate(zip(shards, (12288, 9216))):
        repo.add_shard(name, {"model.layers.%d.self_attn.q_proj.weight" % i:
                              _small_bytes(hub.seed, "%s:%s:q" % (DRAFTER_REPO, name), 2048),
                              "model.layers.%d.mlp.down_proj.weight" % i:
                              _small_bytes(hub.seed, "%s:%s:d" % (DRAFTER_REPO, name), 1024)}, total_size=size)
    return _describe(repo, repo.finish(), shards)


ENGRAM_REPO = "dgx-stage/engram-lane-test"
#: The files every rank stages (config, the dense shard and its index, engram/shared/).
ENGRAM_SHARED_PATTERNS = ["config.json", "model*", "engram/shared/*"]
#: A rank's own part, as a stage_repos rank_patterns template list.
ENGRAM_RANK_TEMPLATES = ["engram/rank-{rank}-of-{world_size}/*"]
ENGRAM_SEED = 7
ENGRAM_TABLES_PER_RANK = 2


def engram_rank_dir(rank, world_size):
    """Snapshot-relative folder of one rank's tables."""
    return "engram/rank-%d-of-%d" % (rank, world_size)


def add_engram_repo(hub, world_size, repo_id=ENGRAM_REPO, seed=ENGRAM_SEED, table_size=5120, dense_size=4096,
                    hf_native=False, ranks=None):
    """Write an engram repo for a lane of ``world_size`` ranks into the existing hub root ``hub``: shared config,
    vocab, a dense shard of ``dense_size`` payload bytes and the index; per rank (of ``ranks``, default all), under
    ``engram_rank_dir``, ``meta.json`` and ENGRAM_TABLES_PER_RANK tables of ``table_size`` payload bytes. The last
    rank's first table sits in the hub store behind a relative link (the log's trap).

    Returns {"repo_id", "folder", "commit", "world_size", "files": {path: file entry}, "shared": [paths],
    "ranks": {rank: [paths]}, "shared_bytes", "rank_bytes": {rank: bytes}, "allow_patterns",
    "rank_patterns", "trees", "noise"}.
    """
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if table_size < 5 or dense_size < 1:
        raise ValueError("table_size must be >= 5 bytes and dense_size >= 1 byte")
    hub_obj = Hub(os.path.abspath(os.fspath(hub)), seed, hf_native)
    repo = Repo(hub_obj, repo_id)
    repo.add("config.json", _json_bytes({"architectures": ["DeepseekV4ForCausalLM"], "engram_ranks": world_size}))
    repo.add("engram/shared/vocab.json", _json_bytes({"ngram": 3, "buckets": 4096}))
    repo.add_shard("model-00001-of-00001.safetensors",
                   {"model.embed_tokens.weight": _small_bytes(seed, "dense", dense_size)})
    keys = table_size * 2 // 5
    rank_files = {}
    for rank in range(world_size) if ranks is None else ranks:
        folder = engram_rank_dir(rank, world_size)
        repo.add(folder + "/meta.json", _json_bytes({"rank": rank, "world_size": world_size}))
        for table in range(ENGRAM_TABLES_PER_RANK):
            label = "engram.%d.table.%d" % (rank, table)
            repo.add_shard("%s/table-%05d.safetensors" % (folder, table),
                           {label + ".keys": _small_bytes(seed, label + "k", keys),
                            label + ".values": _small_bytes(seed, label + "v", table_size - keys)},
                           form=FORM_REL_STORE if (rank, table) == (world_size - 1, 0) else FORM_REAL)
        rank_files[rank] = sorted(p for p in repo.files if p.startswith(folder + "/"))
    trees = repo.finish()
    hub_obj.finish_store()
    shared = sorted(p for p in repo.files if not p.startswith("engram/rank-"))
    size = lambda paths: sum(repo.files[p]["size"] for p in paths)  # noqa: E731  (every blob is distinct)
    return {
        "repo_id": repo_id, "folder": repo.folder, "commit": repo.commit, "world_size": world_size,
        "files": repo.files, "shared": shared, "ranks": rank_files, "shared_bytes": size(shared),
        "rank_bytes": dict((rank, size(paths)) for rank, paths in rank_files.items()),
        "allow_patterns": list(ENGRAM_SHARED_PATTERNS), "rank_patterns": list(ENGRAM_RANK_TEMPLATES),
        "trees": trees, "noise": sorted(hub_obj.noise),
    }


def build_engram_hub(root, world_size, **kwargs):
    """A fresh ``root/hub`` holding only the engram repo (add_engram_repo's keyword arguments):
    {"hub", "store", "repos": {repo_id: add_engram_repo's description}, "duration_s"}."""
    t0 = time.monotonic()
    hub = _fresh_hub(root)
    desc = add_engram_repo(hub, world_size, **kwargs)
    return {"hub": hub, "store": os.path.join(hub, "blobs"), "repos": {desc["repo_id"]: desc},
            "duration_s": round(time.monotonic() - t0, 3)}


def build_nas_hub(root, shard_size=64 * 1024, n_shards=6, seed=0, hf_native=False):
    """A fresh ``root/hub`` with both repos and every trap; returns its description::

        {"hub", "store": abs hub/blobs, "allow_patterns", "ignore_patterns", "noise": [hub-relative paths
         that are not content], "shard_size", "n_shards", "seed", "hf_native", "duration_s",
         "repos": {repo_id: {"folder", "commit", "old_commit" (or None), "refs": {name: commit},
                             "files": {snapshot path: file entry (see Repo)}, "page15": [...],
                             "same_size_pairs": [[a, b], ...], "shards": [...], "old_files": {...},
                             "old_only_etags": [...], "trees": abs path of trees/<commit>.json}}}

    ``hf_native=True``: as huggingface_hub 2.4 writes it, store entries are named by a (simulated) Xet
    hash, and trees' ``blob_id`` of LFS files is the git sha1 of the LFS pointer.
    """
    t0 = time.monotonic()
    if not 1 <= n_shards <= 99999:
        raise ValueError("n_shards must be 1..99999")
    if shard_size < MIN_SHARD_SIZE:
        raise ValueError("shard_size must be >= %d bytes" % MIN_SHARD_SIZE)
    hub = Hub(_fresh_hub(root), seed, hf_native)
    repos = {MAIN_REPO: _build_main(hub, shard_size, n_shards), DRAFTER_REPO: _build_drafter(hub)}
    hub.finish_store()
    return {
        "hub": hub.hub, "store": hub.store, "repos": repos,
        "allow_patterns": list(ALLOW_PATTERNS), "ignore_patterns": list(IGNORE_PATTERNS),
        "noise": sorted(hub.noise), "shard_size": shard_size, "n_shards": n_shards,
        "seed": seed, "hf_native": hf_native, "duration_s": round(time.monotonic() - t0, 3),
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
