#!/usr/bin/env python3
"""Hub layouts for `make bench` (scripts/bench.py), cached under one root and keyed by their parameters.

- ``hubgen_hub``: tools/hubgen.py's realistic NAS hub (store-level link chains, page15 real files,
  same-size shards, an older revision), dense data.
- ``sparse_hub``: a NAS hub whose weight shards are SPARSE files: a few MiB of data (head, tail, one
  64 KiB block every 32 MiB) and holes between, so a >= 100 GiB layout takes well under 1 GB of disk.
  Blob names are the real sha256 of each file's logical content (holes read as zeros), computed once
  from the layout without reading the file back and cached with the layout. Shards use the NAS's three
  blob forms (real file, relative and absolute link into the hub-level ``blobs/<xx>/`` store).
- ``stage_like_module``: the local hub as hf_hub_mirror leaves it after staging a sparse hub, made
  with sparse copies instead of the module's dense writes (``blobs/<name>``, ``snapshots/<commit>/``
  links, ``refs/``, ``trees/<commit>.json``).
- ``flat_copy``: a sparse copy of a snapshot with links followed (what ``cp -rL`` / ``rsync -aL`` leave).

A cached layout is complete when its ``layout.json`` exists; anything else under its key is rebuilt.
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import hubgen  # noqa: E402  (the synthetic hub generator of the tests and the demo)

MIB = 1 << 20
GIB = 1 << 30
EDGE = 1 * MIB             # data at the head and the tail of every sparse shard
BLOCK = 64 * 1024          # plus one data block ...
STRIDE = 32 * MIB          # ... somewhere in every STRIDE of the middle
_ZEROS = memoryview(bytes(8 * MIB))
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
INDEX = "model.safetensors.index.json"


def layout_marker(path):
    return os.path.join(path, "layout.json")


def cached(root, key, build):
    """The description of layout `key` under root, built by build(path) -> dict when not complete."""
    path = os.path.join(root, key)
    marker = layout_marker(path)
    if os.path.isfile(marker):
        with open(marker) as handle:
            return json.load(handle)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    desc = build(path)
    desc.update(key=key, path=path)
    with open(marker + ".tmp", "w") as handle:
        json.dump(desc, handle, indent=1, sort_keys=True)
    os.replace(marker + ".tmp", marker)
    return desc


def hubgen_hub(root, n_shards, shard_size, seed=0):
    """tools/hubgen.py's NAS hub (both repos, every trap) with n_shards x shard_size weight shards."""
    key = "hubgen-%dx%dMiB-seed%d" % (n_shards, shard_size // MIB, seed)
    return cached(root, key, lambda path: hubgen.build_nas_hub(path, shard_size=shard_size, n_shards=n_shards,
                                                               seed=seed))


# ------------------------------------------------------------------------------------------------
# sparse shards
# ------------------------------------------------------------------------------------------------

def data_segments(size, rng):
    """Sorted, non-overlapping (offset, length) data ranges of a sparse shard; holes elsewhere."""
    if size <= 2 * EDGE + STRIDE:
        return [(0, size)]
    segments = [(0, EDGE)]
    for start in range(STRIDE, size - EDGE - STRIDE + 1, STRIDE):
        segments.append((start + rng.randrange(0, STRIDE - BLOCK, 4096), BLOCK))
    segments.append((size - EDGE, EDGE))
    return segments


class SparseShard(object):
    """One shard's layout and data (deterministic from its label), its sha256 and a writer."""

    def __init__(self, label, size):
        rng = random.Random("benchhub:" + label)
        self.size = size
        self.segments = [(offset, rng.randbytes(length)) for offset, length in data_segments(size, rng)]
        self.sha256 = None

    @property
    def data_bytes(self):
        return sum(len(data) for _, data in self.segments)

    def digest(self):
        """sha256 of the logical content (data plus zeros for the holes), without touching the disk."""
        h = hashlib.sha256()
        pos = 0
        for offset, data in self.segments + [(self.size, b"")]:
            while pos < offset:
                step = min(offset - pos, len(_ZEROS))
                h.update(_ZEROS[:step])      # large updates release the GIL: shards hash in parallel
                pos += step
            h.update(data)
            pos += len(data)
        self.sha256 = h.hexdigest()
        return self

    def write(self, path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for offset, data in self.segments:
                os.pwrite(fd, data, offset)
            os.ftruncate(fd, self.size)
        finally:
            os.close(fd)


def _put_store(hub, repo_dir, etag, write, absolute):
    """The blob in the hub-level store hub/blobs/<xx>/<etag>, the repo blob a link to it."""
    store_dir = os.path.join(hub, "blobs", etag[:2])
    os.makedirs(store_dir, exist_ok=True)
    store = os.path.join(store_dir, etag)
    write(store)
    repo_blob = os.path.join(repo_dir, "blobs", etag)
    os.symlink(store if absolute else os.path.relpath(store, os.path.dirname(repo_blob)), repo_blob)


def sparse_hub(root, repo_id, n_shards, shard_size, metadata=True, seed=0):
    """A NAS hub with one repo: n_shards sparse weight shards (+ 4 small files and the index when
    metadata), so a 141-blob layout is 136 shards + 5 small files. Returns its description."""
    key = "sparse-%s-%dx%dMiB%s-seed%d" % (repo_id.replace("/", "--"), n_shards, shard_size // MIB,
                                          "-meta" if metadata else "", seed)

    def build(path):
        hub = os.path.join(path, "hub")
        folder = hubgen.repo_folder(repo_id)
        repo_dir = os.path.join(hub, folder)
        commit = hashlib.sha1(("benchhub:%s" % key).encode()).hexdigest()
        snapshot = os.path.join(repo_dir, "snapshots", commit)
        for sub in ("blobs", "refs", "trees", snapshot):
            os.makedirs(os.path.join(repo_dir, sub), exist_ok=True)
        names = ["model-%05d-of-%05d.safetensors" % (i + 1, n_shards) for i in range(n_shards)]

        def place(i):
            """Hash shard i from its layout, then write it in its NAS form: real, relative or absolute
            store link (the shard's data is dropped once written)."""
            shard = SparseShard("%d:%s:%s" % (seed, key, names[i]), shard_size).digest()
            if i % 3 == 0:
                shard.write(os.path.join(repo_dir, "blobs", shard.sha256))
            else:
                _put_store(hub, repo_dir, shard.sha256, shard.write, absolute=i % 3 == 2)
            pointer = hubgen.lfs_pointer(shard.sha256, shard.size)
            return names[i], {"etag": shard.sha256, "size": shard.size, "data_bytes": shard.data_bytes,
                              "tree": {"size": shard.size, "blob_id": hubgen.git_blob_sha1(pointer),
                                       "lfs_sha256": shard.sha256, "lfs_size": shard.size}}

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            files = dict(pool.map(place, range(n_shards)))
        if metadata:
            files.update(_small_files(repo_dir, random.Random("benchhub-small:%d:%s" % (seed, key)), names,
                                      n_shards * shard_size))
        for name, info in files.items():
            os.symlink("../../blobs/" + info["etag"], os.path.join(snapshot, name))
        with open(os.path.join(repo_dir, "refs", "main"), "w") as handle:
            handle.write(commit)
        listing = {"format_version": 1, "files": dict((n, files[n]["tree"]) for n in sorted(files))}
        with open(os.path.join(repo_dir, "trees", commit + ".json"), "w") as handle:
            json.dump(listing, handle, indent=1)   # as huggingface_hub 2.x writes it
        return {"hub": hub, "repo_id": repo_id, "folder": folder, "commit": commit, "files": files,
                "blobs": len(files), "logical_bytes": sum(f["size"] for f in files.values()),
                "data_bytes": sum(f["data_bytes"] for f in files.values()), "listing": listing}

    return cached(root, key, build)


def _small_files(repo_dir, rng, shard_names, total_size):
    """The small files and the index of a sparse hub, as plain git-sha1 blobs: {name: file info}."""
    small = dict((name, json.dumps({"bench": name, "data": rng.randbytes(1500).hex()}).encode())
                 for name in SMALL_FILES)
    small[INDEX] = json.dumps({"metadata": {"total_size": total_size},
                               "weight_map": dict(("w.%d" % i, n) for i, n in enumerate(shard_names))}).encode()
    files = {}
    for name, data in small.items():
        etag = hubgen.git_blob_sha1(data)
        with open(os.path.join(repo_dir, "blobs", etag), "wb") as handle:
            handle.write(data)
        files[name] = {"etag": etag, "size": len(data), "data_bytes": len(data),
                       "tree": {"size": len(data), "blob_id": etag}}
    return files


# ------------------------------------------------------------------------------------------------
# local copies
# ------------------------------------------------------------------------------------------------

def sparse_copy(source, dest):
    subprocess.check_call(["cp", "--sparse=always", "--preserve=mode,timestamps", source, dest])


def stage_like_module(desc, dest_hub):
    """Lay out `desc` (a sparse_hub) under dest_hub exactly as hf_hub_mirror leaves a fully staged repo,
    with sparse copies of the NAS blobs: a run of the module on it must report changed=false."""
    nas_repo = os.path.join(desc["hub"], desc["folder"])
    repo = os.path.join(dest_hub, desc["folder"])
    snapshot = os.path.join(repo, "snapshots", desc["commit"])
    for sub in ("blobs", "refs", "trees", snapshot):
        os.makedirs(os.path.join(repo, sub), exist_ok=True)
    for name, info in sorted(desc["files"].items()):
        sparse_copy(os.path.realpath(os.path.join(nas_repo, "blobs", info["etag"])),
                    os.path.join(repo, "blobs", info["etag"]))
        os.symlink("../../blobs/" + info["etag"], os.path.join(snapshot, name))
    with open(os.path.join(repo, "refs", "main"), "w") as handle:
        handle.write(desc["commit"])
    # The module writes the NAS listing restricted to the staged paths (here: all), indent 2, sorted keys.
    with open(os.path.join(repo, "trees", desc["commit"] + ".json"), "wb") as handle:
        handle.write(json.dumps(desc["listing"], indent=2, sort_keys=True).encode("utf-8") + b"\n")
    return snapshot


def flat_copy(snapshot, dest):
    """Sparse copy of a snapshot's files with links followed, modes and times kept."""
    os.makedirs(dest, exist_ok=True)
    subprocess.check_call(["cp", "-rL", "--sparse=always", "--preserve=mode,timestamps",
                           snapshot + "/.", dest])
    return dest


def file_states(top):
    """{relative path: (inode, size, mtime, ctime, link text)} of every entry below top: any write,
    replacement or relink shows up as a changed state."""
    states = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            states[os.path.relpath(path, top)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                                  os.readlink(path) if os.path.islink(path) else None)
    return states


def allocated_bytes(top):
    """Bytes actually allocated on disk below top (sparse files count their data blocks only)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total
