"""hubgen's engram layout: a repo with shared files and per-rank tables for a lane of any size,
written with hubgen's hub writer (blobs named by their hash, snapshot links, one table in the hub store)."""
import fnmatch
import json
import os
import subprocess
import sys

import pytest

import hubgen

HUBGEN_PY = os.path.abspath(hubgen.__file__)


@pytest.fixture(scope="module")
def engram4(tmp_path_factory):
    return hubgen.build_engram_hub(str(tmp_path_factory.mktemp("engram")), 4, table_size=6000, dense_size=9000)


def _repo(desc):
    [repo] = desc["repos"].values()
    return repo


def _snapshot(desc):
    repo = _repo(desc)
    return os.path.join(desc["hub"], repo["folder"], "snapshots", repo["commit"])


def _walk(top):
    found = []
    for dirpath, _dirs, names in os.walk(top):
        found.extend(os.path.relpath(os.path.join(dirpath, n), top) for n in names)
    return sorted(found)


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _expand(templates, rank, world_size):
    return [t.replace("{rank}", str(rank)).replace("{world_size}", str(world_size)) for t in templates]


def test_shared_files_and_each_rank_folder_for_four_ranks(engram4):
    repo = _repo(engram4)
    assert repo["world_size"] == 4 and repo["repo_id"] == hubgen.ENGRAM_REPO
    assert repo["shared"] == ["config.json", "engram/shared/vocab.json", "model-00001-of-00001.safetensors",
                              "model.safetensors.index.json"]
    assert sorted(repo["ranks"]) == [0, 1, 2, 3]
    for rank, paths in repo["ranks"].items():
        folder = "engram/rank-%d-of-4" % rank
        assert folder == hubgen.engram_rank_dir(rank, 4)
        assert paths == [folder + "/meta.json", folder + "/table-00000.safetensors",
                         folder + "/table-00001.safetensors"]
        meta = json.loads(_read(os.path.join(_snapshot(engram4), folder, "meta.json")))
        assert meta == {"rank": rank, "world_size": 4}
    every = sorted(repo["shared"] + [p for paths in repo["ranks"].values() for p in paths])
    assert _walk(_snapshot(engram4)) == every == sorted(repo["files"])


def test_the_patterns_select_exactly_the_shared_files_plus_one_ranks_part(engram4):
    """The stage_repos entry the lane uses: allow_patterns for the shared part, the rank templates for a rank's."""
    repo = _repo(engram4)
    for rank in range(4):
        patterns = repo["allow_patterns"] + _expand(repo["rank_patterns"], rank, 4)
        picked = sorted(p for p in repo["files"] if any(fnmatch.fnmatchcase(p, pat) for pat in patterns))
        assert picked == sorted(repo["shared"] + repo["ranks"][rank]), rank


def test_every_snapshot_entry_links_into_blobs_named_by_the_content_hash(engram4):
    repo = _repo(engram4)
    snap = _snapshot(engram4)
    for rel, entry in repo["files"].items():
        link = os.path.join(snap, rel)
        assert os.path.islink(link) and not os.path.isabs(os.readlink(link)), rel
        assert os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link))) == \
            os.path.join(engram4["hub"], repo["folder"], "blobs", entry["etag"]), rel
        data = _read(link)
        named = hubgen.sha256_hex(data) if rel.endswith(".safetensors") else hubgen.git_blob_sha1(data)
        assert named == entry["etag"] and len(data) == entry["size"], rel


def test_the_last_ranks_first_table_sits_in_the_hub_store_behind_a_relative_link(engram4):
    repo = _repo(engram4)
    store_backed = sorted(rel for rel, entry in repo["files"].items() if entry["blob_form"] != hubgen.FORM_REAL)
    assert store_backed == ["engram/rank-3-of-4/table-00000.safetensors"]
    entry = repo["files"][store_backed[0]]
    repo_blob = os.path.join(engram4["hub"], repo["folder"], "blobs", entry["etag"])
    assert entry["blob_form"] == hubgen.FORM_REL_STORE and not os.path.isabs(os.readlink(repo_blob))
    assert os.path.realpath(repo_blob) == entry["store_path"]
    assert entry["store_path"].startswith(os.path.join(engram4["hub"], "blobs") + os.sep)
    assert os.path.isfile(os.path.join(engram4["hub"], "blobs", hubgen.SHARED_STORE_MARKER))


def test_the_index_maps_every_tensor_of_every_shard(engram4):
    repo = _repo(engram4)
    snap = _snapshot(engram4)
    index = json.loads(_read(os.path.join(snap, "model.safetensors.index.json")))
    headers, total = {}, 0
    for rel in repo["files"]:
        if rel.endswith(".safetensors"):
            _n, header = hubgen.read_safetensors_header(os.path.join(snap, rel))
            for name, meta in header.items():
                if name != "__metadata__":
                    headers[name] = rel
                    total += meta["data_offsets"][1] - meta["data_offsets"][0]
    assert index["weight_map"] == headers
    assert index["metadata"]["total_size"] == total == 9000 + 4 * 2 * 6000
    assert len([t for t, rel in headers.items() if rel.startswith("engram/rank-")]) == 4 * 2 * 2


def test_byte_figures_count_each_distinct_blob_once(engram4):
    repo = _repo(engram4)
    files = repo["files"]
    assert repo["shared_bytes"] == sum(files[p]["size"] for p in repo["shared"])
    for rank, paths in repo["ranks"].items():
        assert repo["rank_bytes"][rank] == sum(files[p]["size"] for p in paths)
        assert repo["rank_bytes"][rank] > 2 * 6000
    assert repo["shared_bytes"] > 9000


def test_trees_list_every_file(engram4):
    repo = _repo(engram4)
    with open(repo["trees"]) as handle:
        trees = json.load(handle)
    assert sorted(trees["files"]) == sorted(repo["files"])
    assert {rel: entry["size"] for rel, entry in trees["files"].items()} == \
        {rel: entry["size"] for rel, entry in repo["files"].items()}


def test_deterministic_and_sized_by_world_size(tmp_path):
    one = hubgen.build_engram_hub(str(tmp_path / "a"), 3)
    two = hubgen.build_engram_hub(str(tmp_path / "b"), 3)
    etags = lambda desc: dict((rel, e["etag"]) for rel, e in _repo(desc)["files"].items())  # noqa: E731
    assert etags(one) == etags(two)
    assert sorted(_repo(one)["ranks"]) == [0, 1, 2]
    solo = hubgen.build_engram_hub(str(tmp_path / "c"), 1)
    assert _repo(solo)["ranks"][0][0] == "engram/rank-0-of-1/meta.json"
    # Another lane size is another layout: rank folders and config differ, the dense shard does not.
    assert etags(one)["config.json"] != etags(solo)["config.json"]
    assert etags(one)["model-00001-of-00001.safetensors"] == etags(solo)["model-00001-of-00001.safetensors"]


def test_added_beside_the_trap_hub_repos(tmp_path):
    desc = hubgen.build_nas_hub(str(tmp_path), shard_size=4096, n_shards=2)
    engram = hubgen.add_engram_repo(desc["hub"], 2)
    assert sorted(os.listdir(desc["hub"])) == sorted(
        [".locks", "blobs"] + [r["folder"] for r in desc["repos"].values()] + [engram["folder"]])
    assert len(engram["files"]) == 4 + 2 * 3


def test_refuses_bad_input_and_an_existing_hub(tmp_path):
    with pytest.raises(ValueError, match="world_size"):
        hubgen.build_engram_hub(str(tmp_path / "zero"), 0)
    with pytest.raises(ValueError, match="table_size"):
        hubgen.build_engram_hub(str(tmp_path / "tiny"), 2, table_size=2)
    hubgen.build_engram_hub(str(tmp_path / "x"), 2)
    with pytest.raises(FileExistsError):
        hubgen.build_engram_hub(str(tmp_path / "x"), 2)


def test_cli_adds_the_engram_repo(tmp_path):
    out = subprocess.check_output([sys.executable, HUBGEN_PY, "--root", str(tmp_path), "--shard-size", "4096",
                                   "--shards", "2", "--engram", "4", "--json"])
    desc = json.loads(out)
    assert sorted(desc["repos"]) == sorted([hubgen.MAIN_REPO, hubgen.DRAFTER_REPO, hubgen.ENGRAM_REPO])
    assert sorted(desc["repos"][hubgen.ENGRAM_REPO]["ranks"]) == ["0", "1", "2", "3"]
    plain = subprocess.check_output([sys.executable, HUBGEN_PY, "--root", str(tmp_path / "p"), "--shard-size",
                                     "4096", "--shards", "2", "--engram", "2"]).decode()
    assert hubgen.ENGRAM_REPO in plain
