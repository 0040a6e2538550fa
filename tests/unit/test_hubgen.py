"""The synthetic NAS hub (tools/hubgen.py) really contains every trap from the night-shift log."""
import fnmatch
import hashlib
import itertools
import json
import os
import re
import stat
import struct
import subprocess
import sys

import pytest

import hubgen

MAIN = hubgen.MAIN_REPO
DRAFTER = hubgen.DRAFTER_REPO
HUBGEN_PY = os.path.abspath(hubgen.__file__)
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture(scope="module")
def nas(tmp_path_factory):
    return hubgen.build_nas_hub(str(tmp_path_factory.mktemp("nas")))


def _repo_dir(desc, repo_id):
    return os.path.join(desc["hub"], desc["repos"][repo_id]["folder"])


def _snapshot(desc, repo_id, commit=None):
    repo = desc["repos"][repo_id]
    return os.path.join(_repo_dir(desc, repo_id), "snapshots", commit or repo["commit"])


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def _hash_for_name(data, name):
    return hubgen.sha256_hex(data) if len(name) == 64 else hubgen.git_blob_sha1(data)


def _walk_files(top):
    """Snapshot-relative paths of every non-directory entry (links included) below top."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(top):
        for name in filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), top).replace(os.sep, "/"))
    return out


def _hf_match(path, allow, ignore):
    """huggingface_hub pattern semantics (a pattern ending in '/' matches everything below)."""
    def norm(pats):
        return [p + "*" if p.endswith("/") else p for p in (pats or [])]
    if allow is not None and not any(fnmatch.fnmatch(path, p) for p in norm(allow)):
        return False
    return not any(fnmatch.fnmatch(path, p) for p in norm(ignore))


# ------------------------------------------------------------------------------ helpers


def test_git_blob_sha1_matches_git():
    # `printf 'hello\n' | git hash-object --stdin` and the empty blob
    assert hubgen.git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert hubgen.git_blob_sha1(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert hubgen.sha256_hex(b"") == hashlib.sha256(b"").hexdigest()


def test_write_safetensors_pads_to_total_size(tmp_path):
    tensors = {"a.w": b"\x01" * 10, "b.w": b"\x02" * 3}
    plain = hubgen.write_safetensors(None, tensors)
    (n,) = struct.unpack("<Q", plain[:8])
    assert n % 8 == 0 and len(plain) == 8 + n + 13
    header = json.loads(plain[8:8 + n])
    assert header["a.w"] == {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]}
    assert header["b.w"]["data_offsets"] == [10, 13]

    path = tmp_path / "x.safetensors"
    padded = hubgen.write_safetensors(str(path), tensors, total_size=1000)
    assert len(padded) == 1000 and path.read_bytes() == padded
    n2, header2 = hubgen.read_safetensors_header(str(path))
    a, b = header2["b.w"]["data_offsets"]
    assert b == 1000 - 8 - n2 and header2["b.w"]["shape"] == [b - a]
    assert padded[8 + n2 + a:8 + n2 + a + 3] == b"\x02" * 3  # original bytes first, zero padding after

    assert hubgen.write_safetensors(None, tensors, total_size=1000) == padded
    with pytest.raises(ValueError):
        hubgen.write_safetensors(None, tensors, total_size=50)
    with pytest.raises(ValueError):
        hubgen.write_safetensors(None, {})


# ------------------------------------------------------------------------------ shape


def test_description_shape(nas):
    assert os.path.isabs(nas["hub"]) and os.path.basename(nas["hub"]) == "hub"
    assert set(nas["repos"]) == {MAIN, DRAFTER}
    assert nas["allow_patterns"] and nas["ignore_patterns"] == ["page15/"]
    for repo_id, repo in nas["repos"].items():
        assert repo["folder"] == "models--" + repo_id.replace("/", "--")
        assert HEX40.match(repo["commit"])
        assert repo["refs"]["main"] == repo["commit"]
        for rel, f in repo["files"].items():
            assert f["kind"] in ("link", "real"), rel
            assert isinstance(f["size"], int) and HEX64.match(f["sha256"])
            if f["kind"] == "link":
                assert HEX40.match(f["etag"]) or HEX64.match(f["etag"])
            else:
                assert f["etag"] is None
    main = nas["repos"][MAIN]
    assert HEX40.match(main["old_commit"]) and main["old_commit"] != main["commit"]
    assert nas["repos"][DRAFTER]["old_commit"] is None
    assert any("/" in rel for rel, f in main["files"].items() if f["kind"] == "link")
    json.dumps(nas)  # the CLI prints it


def test_refs_on_disk(nas):
    for repo_id, repo in nas["repos"].items():
        for ref, commit in repo["refs"].items():
            assert _read(os.path.join(_repo_dir(nas, repo_id), "refs", ref)).decode() == commit
    assert nas["repos"][MAIN]["refs"]["v1"] == nas["repos"][MAIN]["old_commit"]


# ------------------------------------------------------------------------------ link chains


def test_every_snapshot_link_resolves_to_content_named_by_its_etag(nas):
    for repo_id, repo in nas["repos"].items():
        snap = _snapshot(nas, repo_id)
        assert _walk_files(snap) == set(repo["files"])
        for rel, f in repo["files"].items():
            path = os.path.join(snap, rel)
            if f["kind"] != "link":
                continue
            assert os.path.islink(path), rel
            target = os.readlink(path)
            assert target == "../" * (rel.count("/") + 2) + "blobs/" + f["etag"], (rel, target)
            data = _read(os.path.realpath(path))
            assert _hash_for_name(data, f["etag"]) == f["etag"], rel
            assert len(data) == f["size"] and hubgen.sha256_hex(data) == f["sha256"]
            assert hubgen.git_blob_sha1(data) == f["blob_id"]


def test_repo_blobs_use_all_three_forms(nas):
    main = nas["repos"][MAIN]
    repo_blobs = os.path.join(_repo_dir(nas, MAIN), "blobs")
    shard_forms = {main["files"][s]["blob_form"] for s in main["shards"]}
    assert shard_forms == {"real", "rel-store", "abs-store"}
    for rel, f in main["files"].items():
        if f["kind"] != "link":
            continue
        blob = os.path.join(repo_blobs, f["etag"])
        if f["blob_form"] == "real":
            assert stat.S_ISREG(os.lstat(blob).st_mode), rel
            assert f["store_path"] is None
            continue
        assert os.path.islink(blob), rel
        target = os.readlink(blob)
        store_path = os.path.join(nas["hub"], "blobs", f["etag"][:2], f["etag"])
        assert f["store_path"] == store_path
        if f["blob_form"] == "abs-store":
            assert target == store_path
        else:
            assert target == "../../blobs/%s/%s" % (f["etag"][:2], f["etag"])
        assert stat.S_ISREG(os.lstat(store_path).st_mode)
        assert os.path.realpath(blob) == os.path.realpath(store_path)
    # regular (git sha1) blobs never live in the store
    assert all(f["blob_form"] == "real" for f in main["files"].values()
               if f["kind"] == "link" and len(f["etag"]) == 40)


def test_drafter_blobs_are_plain_files(nas):
    repo_blobs = os.path.join(_repo_dir(nas, DRAFTER), "blobs")
    for f in nas["repos"][DRAFTER]["files"].values():
        assert f["kind"] == "link" and f["blob_form"] == "real"
        assert stat.S_ISREG(os.lstat(os.path.join(repo_blobs, f["etag"])).st_mode)


def test_store_is_marked_and_holds_only_referenced_payloads(nas):
    store = os.path.join(nas["hub"], "blobs")
    assert _read(os.path.join(store, hubgen.SHARED_STORE_MARKER)) == b"1\n"
    payloads = set()
    for prefix in os.listdir(store):
        if prefix == hubgen.SHARED_STORE_MARKER:
            continue
        assert re.match(r"^[0-9a-f]{2}$", prefix)
        for name in os.listdir(os.path.join(store, prefix)):
            if HEX64.match(name):
                assert name.startswith(prefix)
                payloads.add(os.path.join(store, prefix, name))
            else:
                assert name.endswith((".refs", ".lock")), name
    referenced = {f["store_path"] for f in nas["repos"][MAIN]["files"].values() if f.get("store_path")}
    assert payloads == referenced


# ------------------------------------------------------------------------------ traps


def test_page15_is_real_files_excluded_by_the_demo_patterns(nas):
    main = nas["repos"][MAIN]
    snap = _snapshot(nas, MAIN)
    assert len(main["page15"]) >= 5
    assert {p.split("/")[1] for p in main["page15"]} >= {"a", "b"}
    for rel in main["page15"]:
        path = os.path.join(snap, rel)
        assert rel.startswith("page15/") and main["files"][rel]["kind"] == "real"
        assert stat.S_ISREG(os.lstat(path).st_mode) and not os.path.islink(path)
        data = _read(path)
        assert 1024 <= len(data) == main["files"][rel]["size"]
        assert hubgen.sha256_hex(data) == main["files"][rel]["sha256"]
        assert not _hf_match(rel, nas["allow_patterns"], nas["ignore_patterns"])
    for rel, f in main["files"].items():
        if not rel.startswith("page15/"):
            assert f["kind"] == "link"
            assert _hf_match(rel, nas["allow_patterns"], nas["ignore_patterns"]), rel


def test_shards_share_one_size_but_not_content(nas):
    main = nas["repos"][MAIN]
    snap = _snapshot(nas, MAIN)
    assert len(main["shards"]) == nas["n_shards"] == 6
    assert main["shards"][0] == "model-00001-of-00006.safetensors"
    sizes = {os.path.getsize(os.path.join(snap, s)) for s in main["shards"]}
    assert sizes == {nas["shard_size"]}
    assert len({main["files"][s]["sha256"] for s in main["shards"]}) == len(main["shards"])
    pairs = {tuple(sorted(p)) for p in main["same_size_pairs"]}
    assert pairs == {tuple(sorted(p)) for p in itertools.combinations(main["shards"], 2)}
    for a, b in main["same_size_pairs"]:
        assert main["files"][a]["size"] == main["files"][b]["size"]
        assert main["files"][a]["etag"] != main["files"][b]["etag"]


@pytest.mark.parametrize("repo_id", [MAIN, DRAFTER])
def test_safetensors_headers_parse_and_match_the_index(nas, repo_id):
    repo = nas["repos"][repo_id]
    snap = _snapshot(nas, repo_id)
    index = json.loads(_read(os.path.join(snap, "model.safetensors.index.json")))
    mapped = {}
    total = 0
    for shard in repo["shards"]:
        path = os.path.join(snap, shard)
        n, header = hubgen.read_safetensors_header(path)
        assert n % 8 == 0 and header["__metadata__"] == {"format": "pt"}
        data_len = os.path.getsize(path) - 8 - n
        spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
        assert spans[0][0] == 0 and spans[-1][1] == data_len
        assert all(x[1] == y[0] for x, y in zip(spans, spans[1:]))  # contiguous, no overlap
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            assert meta["dtype"] == "U8" and meta["shape"] == [b - a] and b > a
            assert name not in mapped, "duplicate tensor %s" % name
            mapped[name] = shard
            total += b - a
            if repo_id == MAIN:
                assert re.match(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.w1\.trellis$", name)
    assert index["weight_map"] == mapped
    assert index["metadata"]["total_size"] == total


def test_trees_json_lists_the_current_snapshot(nas):
    for repo_id, repo in nas["repos"].items():
        path = os.path.join(_repo_dir(nas, repo_id), "trees", repo["commit"] + ".json")
        assert repo["trees"] == path
        assert os.listdir(os.path.dirname(path)) == [repo["commit"] + ".json"]
        tree = json.loads(_read(path))
        assert tree["format_version"] == 1
        assert set(tree["files"]) == set(repo["files"])
        snap = _snapshot(nas, repo_id)
        for rel, entry in tree["files"].items():
            data = _read(os.path.join(snap, rel))
            assert entry["size"] == len(data) == repo["files"][rel]["size"]
            assert entry["blob_id"] == hubgen.git_blob_sha1(data)
            etag = repo["files"][rel]["etag"]
            if etag and len(etag) == 64:
                assert entry["lfs_sha256"] == etag == hubgen.sha256_hex(data)
                assert entry["lfs_size"] == len(data)
            else:
                assert "lfs_sha256" not in entry and "lfs_size" not in entry


def test_old_revision_differs_and_is_not_in_the_current_snapshot(nas):
    main = nas["repos"][MAIN]
    old_snap = _snapshot(nas, MAIN, main["old_commit"])
    assert _walk_files(old_snap) == set(main["old_files"]) < set(main["files"])
    first = main["shards"][0]
    old, new = main["old_files"][first], main["files"][first]
    assert old["size"] == new["size"] and old["etag"] != new["etag"]
    assert main["old_only_etags"] == [old["etag"]]
    data = _read(os.path.realpath(os.path.join(old_snap, first)))
    assert hubgen.sha256_hex(data) == old["etag"]
    current = {os.path.realpath(os.path.join(_snapshot(nas, MAIN), r)) for r in main["files"]}
    assert os.path.realpath(os.path.join(old_snap, first)) not in current
    for rel in set(main["old_files"]) - {first}:
        assert main["old_files"][rel]["etag"] == main["files"][rel]["etag"]


def test_noise_is_present_and_never_content(nas):
    main = nas["repos"][MAIN]
    repo_dir = _repo_dir(nas, MAIN)
    marker = os.path.join(repo_dir, ".no_exist", main["commit"], "generation_config.json")
    assert os.path.isfile(marker) and os.path.getsize(marker) == 0
    locks = os.path.join(nas["hub"], ".locks")
    lock_files = [os.path.join(d, f) for d, _, fs in os.walk(locks) for f in fs]
    assert lock_files and all(os.path.getsize(p) == 0 for p in lock_files)
    content = {os.path.realpath(os.path.join(_snapshot(nas, r), rel))
               for r, repo in nas["repos"].items() for rel in repo["files"]}
    for rel in nas["noise"]:
        path = os.path.join(nas["hub"], rel)
        assert os.path.lexists(path), rel
        assert os.path.realpath(path) not in content
    assert any(p.endswith(".incomplete") for p in nas["noise"])


# ------------------------------------------------------------------------------ generation


def _fingerprint(desc):
    return {r: {p: (f["etag"], f["sha256"]) for p, f in repo["files"].items()}
            for r, repo in desc["repos"].items()}


def test_deterministic_per_seed(tmp_path):
    a = hubgen.build_nas_hub(tmp_path / "a", shard_size=4096, n_shards=3, seed=7)  # Path is fine too
    b = hubgen.build_nas_hub(str(tmp_path / "b"), shard_size=4096, n_shards=3, seed=7)
    c = hubgen.build_nas_hub(str(tmp_path / "c"), shard_size=4096, n_shards=3, seed=8)
    assert _fingerprint(a) == _fingerprint(b) != _fingerprint(c)
    assert a["repos"][MAIN]["commit"] == b["repos"][MAIN]["commit"] != c["repos"][MAIN]["commit"]


def test_refuses_an_existing_hub_and_bad_sizes(tmp_path):
    (tmp_path / "hub").mkdir()
    with pytest.raises(FileExistsError):
        hubgen.build_nas_hub(str(tmp_path))
    with pytest.raises(ValueError):
        hubgen.build_nas_hub(str(tmp_path / "x"), shard_size=100)
    with pytest.raises(ValueError):
        hubgen.build_nas_hub(str(tmp_path / "y"), n_shards=0)


@pytest.mark.parametrize("n_shards", [1, 2])
def test_few_shards_still_have_store_links(tmp_path, n_shards):
    desc = hubgen.build_nas_hub(str(tmp_path), shard_size=2048, n_shards=n_shards)
    main = desc["repos"][MAIN]
    forms = [main["files"][s]["blob_form"] for s in main["shards"]]
    assert forms == ["rel-store", "abs-store"][:n_shards]
    assert main["same_size_pairs"] == ([] if n_shards == 1 else [main["shards"]])
    # real repo blobs are still present (regular files and the old shard)
    assert "real" in {f["blob_form"] for f in main["files"].values() if f["kind"] == "link"}


def test_multi_mib_shards_are_exact_and_differ_at_every_mib(tmp_path):
    size = 3 * (1 << 20) + 12345
    desc = hubgen.build_nas_hub(str(tmp_path), shard_size=size, n_shards=3)
    main = desc["repos"][MAIN]
    paths = [os.path.join(_snapshot(desc, MAIN), s) for s in main["shards"]]
    windows = []
    for path in paths:
        assert os.path.getsize(path) == size
        n, header = hubgen.read_safetensors_header(path)
        assert max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__") == size - 8 - n
        with open(path, "rb") as fh:
            for off in (1 << 20, 2 << 20, 1 << 19, size - 4096):
                fh.seek(off)
                windows.append(fh.read(4096))
    assert len(set(windows)) == len(windows)  # no two sampled windows equal, within or across shards


def test_cli_json(tmp_path):
    cmd = [sys.executable, HUBGEN_PY, "--root", str(tmp_path), "--shard-size", "4096", "--shards", "3", "--json"]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout
    desc = json.loads(out)
    assert desc["hub"] == str(tmp_path / "hub") and desc["n_shards"] == 3
    assert set(desc["repos"][MAIN]["files"]) >= {"config.json", "model-00003-of-00003.safetensors"}
    again = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert again.returncode == 2 and b"already exists" in again.stderr


# ------------------------------------------------------------------------------ huggingface_hub's view


def test_scan_cache_dir_sees_both_repos_without_warnings(nas):
    hf = pytest.importorskip("huggingface_hub")
    info = hf.scan_cache_dir(nas["hub"])
    assert info.warnings == []
    repos = {r.repo_id: r for r in info.repos}
    assert set(repos) == {MAIN, DRAFTER}
    revs = {rev.commit_hash: rev for rev in repos[MAIN].revisions}
    main = nas["repos"][MAIN]
    assert set(revs) == {main["commit"], main["old_commit"]}
    assert revs[main["commit"]].refs == frozenset({"main"})
    assert revs[main["old_commit"]].refs == frozenset({"v1"})
    assert len(revs[main["commit"]].files) == len(main["files"])


def test_hf_hub_download_offline_returns_the_snapshot_file(nas):
    hf = pytest.importorskip("huggingface_hub")
    main = nas["repos"][MAIN]
    for rel in ("config.json", "extras/generation_config.json", main["shards"][1]):
        path = hf.hf_hub_download(MAIN, rel, cache_dir=nas["hub"], local_files_only=True)
        assert path == os.path.join(_snapshot(nas, MAIN), rel)
        assert hubgen.sha256_hex(_read(path)) == main["files"][rel]["sha256"]
    old = hf.hf_hub_download(MAIN, main["shards"][0], revision="v1", cache_dir=nas["hub"],
                             local_files_only=True)
    assert hubgen.sha256_hex(_read(old)) == main["old_files"][main["shards"][0]]["sha256"]


def test_offline_snapshot_download_reads_the_trees_listing(tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    errors = pytest.importorskip("huggingface_hub.errors")
    desc = hubgen.build_nas_hub(str(tmp_path), shard_size=2048, n_shards=3)
    snap = _snapshot(desc, MAIN)
    assert hf.snapshot_download(MAIN, cache_dir=desc["hub"], local_files_only=True) == snap
    os.unlink(os.path.join(snap, desc["repos"][MAIN]["page15"][0]))
    with pytest.raises(errors.IncompleteSnapshotError):
        hf.snapshot_download(MAIN, cache_dir=desc["hub"], local_files_only=True)
    assert hf.snapshot_download(MAIN, cache_dir=desc["hub"], local_files_only=True,
                                allow_patterns=desc["allow_patterns"],
                                ignore_patterns=desc["ignore_patterns"]) == snap


def test_hf_native_variant(tmp_path):
    desc = hubgen.build_nas_hub(str(tmp_path), shard_size=2048, n_shards=3, hf_native=True)
    main = desc["repos"][MAIN]
    tree = json.loads(_read(main["trees"]))["files"]
    for s in main["shards"]:
        f = main["files"][s]
        data = _read(os.path.realpath(os.path.join(_snapshot(desc, MAIN), s)))
        assert hubgen.sha256_hex(data) == f["etag"]  # the repo-level name is still the hash ...
        pointer = hubgen.lfs_pointer(f["etag"], f["size"])
        assert tree[s]["blob_id"] == hubgen.git_blob_sha1(pointer) != f["blob_id"]
        if f["store_path"]:
            name = os.path.basename(f["store_path"])
            assert name != f["etag"] and tree[s]["xet_hash"] == name  # ... the store name is not
    hf = pytest.importorskip("huggingface_hub")
    assert hf.scan_cache_dir(desc["hub"]).warnings == []
    assert hf.snapshot_download(MAIN, cache_dir=desc["hub"], local_files_only=True) == _snapshot(desc, MAIN)
