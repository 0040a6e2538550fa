"""Rank templates on a lane of two local-connection hosts: one stage_repos entry whose
rank_patterns is the list ["engram/rank-{rank}-of-{world_size}/*"], expanded on each host from its place in
the lane. Each host stages exactly the shared files plus its own rank's engram tables; its mount manifest
binds the other rank's tables read-only from the NAS, every NAS snapshot file reachable through exactly one
mount, and the verify pass checks the index against the local shards and the other rank's NAS headers.
A bad rank pattern is refused on every host before anything is written. How each form of rank_patterns
(templates, a map keyed by rank number or its text) expands is the filter's, tests/unit/test_stage_lane.py.

The engram repo is hubgen.add_engram_repo's, written into the shared NAS hub beside hubgen's two repos (blobs
named by their hash, snapshot links into ../blobs, one table in the hub-level store behind a relative link)."""
import json
import os

import pytest

import hubgen
from conftest import failures, run_playbook
from treestate import sha256_file

ENGRAM_REPO = "dgx-stage/engram-lane-test"
WORLD_SIZE = 2
HOSTS = ["rank0", "rank1"]
TAGS = "preflight,stage,verify,manifest"
SHARED_PATTERNS = ["config.json", "model*", "engram/shared/*"]
RANK_TEMPLATES = ["engram/rank-{rank}-of-{world_size}/*"]


def rank_dir(rank):
    return "engram/rank-%d-of-%d" % (rank, WORLD_SIZE)


def _add_engram_repo(nas, ranks=None):
    """ENGRAM_REPO in the NAS hub: shared files (config, dense shard, index, engram/shared/) and per rank (of
    `ranks`, default all) two engram table shards and a meta file; the index maps every tensor."""
    return hubgen.add_engram_repo(nas["hub"], WORLD_SIZE, ranks=ranks)


@pytest.fixture
def engram_nas(nas_hub):
    """The shared NAS hub with the engram repo added, read-only again (checked unchanged at teardown)."""
    nas_hub.thaw()
    try:
        repo = _add_engram_repo(nas_hub)
    finally:
        nas_hub.freeze()
    return nas_hub["hub"], repo


def write_lane(tmp_path, nas, rank_patterns, host_vars=None):
    """Two local-connection hosts in one lane group, each with its own hub_local_root (<tmp>/<host>/hub),
    so each host's manifest is <tmp>/<host>/engine-mounts.json; host_vars[host] adds to or overrides them."""
    members = dict((name, dict({"ansible_connection": "local",
                                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                                "hub_local_root": str(tmp_path / name / "hub")}, **(host_vars or {}).get(name, {})))
                   for name in HOSTS)
    group_vars = {"lane": "sglang_2x", "hub_nas_root": nas, "engine_enabled": False, "stage_verify": "full",
                  "stage_report_dir": str(tmp_path / "reports"),
                  "stage_repos": [{"repo_id": ENGRAM_REPO, "allow_patterns": SHARED_PATTERNS,
                                   "rank_patterns": rank_patterns}]}     # the explicit form keeps working
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"all": {"children": {"sglang_2x": {"hosts": members}}, "vars": group_vars}}))
    return str(path)


def snapshot_files(snapshot):
    """Snapshot-relative paths of every file (link or real) under a snapshot directory."""
    found = []
    for dirpath, _dirs, names in os.walk(snapshot):
        found.extend(os.path.relpath(os.path.join(dirpath, n), snapshot) for n in names)
    return sorted(found)


def host_results(data, name_part, host):
    return [task["hosts"][host] for play in data["plays"] for task in play["tasks"]
            if name_part in task["task"]["name"] and host in task["hosts"]]


def test_each_rank_stages_the_shared_files_and_its_own_tables_and_binds_the_rest_from_the_nas(
        tmp_path, engram_nas, monkeypatch):
    nas, repo = engram_nas
    # rank1's hub_local_root is written with ~ (HOME is tmp_path for this run): the verify pass still finds
    # the other rank's shards on the NAS, in the NAS snapshot the mirror read (a path rebuilt from
    # hub_local_root led elsewhere). Its manifest path is given whole: Ansible's template action expands ~
    # from the user's passwd entry, not from HOME.
    monkeypatch.setenv("HOME", str(tmp_path))
    inventory = write_lane(tmp_path, nas, RANK_TEMPLATES, host_vars={"rank1": {
        "hub_local_root": "~/rank1/hub", "engine_manifest_path": str(tmp_path / "rank1" / "engine-mounts.json")}})
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS)
    assert code == 0, failures(data)

    every = sorted(repo["files"])
    shared = sorted(p for p in every if not p.startswith("engram/rank-"))
    assert shared == ["config.json", "engram/shared/vocab.json", "model-00001-of-00001.safetensors",
                      "model.safetensors.index.json"]
    for rank, host in enumerate(HOSTS):
        own = sorted(p for p in every if p.startswith(rank_dir(rank) + "/"))
        other = sorted(set(every) - set(shared) - set(own))
        assert len(own) == 3 and len(other) == 3
        local = tmp_path / host / "hub"

        # Exactly the shared files and this rank's: snapshot entries and the blobs behind them.
        snapshot = local / repo["folder"] / "snapshots" / repo["commit"]
        assert snapshot_files(str(snapshot)) == sorted(shared + own), host
        blobs = sorted(os.listdir(str(local / repo["folder"] / "blobs")))
        assert blobs == sorted(repo["files"][p]["etag"] for p in shared + own), host
        for rel in shared + own:
            assert sha256_file(str(snapshot / rel)) == repo["files"][rel]["sha256"], (host, rel)

        # The verify pass checked the index against this rank's shards on its disk and the other rank's
        # shards against their headers on the NAS.
        [weights] = [r for result in host_results(data, "safetensors index against the shard headers", host)
                     for r in result["results"]]
        assert not weights.get("failed"), weights
        other_shards = [p for p in other if p.endswith(".safetensors")]
        assert sorted(weights["absent"]) == other_shards and sorted(weights["nas_shards"]) == other_shards, host
        assert (weights["shards"], weights["report"]["nas_shards"]) == (5, 2), weights

        # The manifest: shared and own files from this host's disk, the other rank's read-only from the NAS,
        # every NAS snapshot file reachable through exactly one mount, with the NAS file's bytes.
        with open(str(tmp_path / host / "engine-mounts.json")) as handle:
            manifest = json.load(handle)
        [record] = manifest["repos"]
        assert record["commit"] == repo["commit"]
        for mount in manifest["mounts"]:
            assert mount["read_only"] is True
        for rel in every:
            target = record["target"] + "/" + rel
            covering = [m for m in manifest["mounts"]
                        if target == m["target"] or target.startswith(m["target"] + "/")]
            assert len(covering) == 1, (host, rel, covering)
            mount = covering[0]
            source = mount["source"] if target == mount["target"] else os.path.join(
                mount["source"], os.path.relpath(target, mount["target"]))
            if rel in other:
                assert mount["origin"] == "nas" and mount["source"].startswith(nas + os.sep), (host, rel, mount)
                assert os.path.realpath(source).startswith(os.path.realpath(nas) + os.sep), (host, rel, mount)
            else:
                assert mount["origin"] == "local", (host, rel, mount)
                assert os.path.realpath(source).startswith(os.path.realpath(str(local)) + os.sep), (host, rel, mount)
            assert sha256_file(source) == repo["files"][rel]["sha256"], (host, rel)
        assert manifest["counts"]["local"] == len(shared) + len(own), (host, manifest["counts"])


def test_a_bad_rank_pattern_fails_every_host_before_anything_is_written(tmp_path, engram_nas):
    """The filter's refusals themselves (unknown placeholders, bad map keys...) are tests/unit/test_stage_lane.py's;
    this is one of them reaching every host of the lane in preflight."""
    nas, _repo = engram_nas
    named = "{ranks}"
    inventory = write_lane(tmp_path, nas, ["engram/rank-{rank}-of-{ranks}/*"])
    code, data = run_playbook(tmp_path, inventory, "--tags", "preflight,stage")
    assert code != 0
    for host in HOSTS:
        [preflight] = host_results(data, "Each repo from the NAS hub to the local hub, pass preflight", host)
        messages = [r.get("msg", "") for r in preflight.get("results", []) if r.get("failed")]
        assert messages and ENGRAM_REPO in messages[0] and named in messages[0], (host, failures(data), preflight)
        assert not (tmp_path / host / "hub").exists(), host


def test_a_rank_template_matching_no_file_for_one_rank_fails_the_lane_in_preflight(tmp_path, nas_hub):
    """A NAS cut for fewer ranks than the lane has (only rank 0's tables here): rank 1's expanded template
    matches nothing (hf_hub_mirror require_match), so rank 1 fails its preflight naming the pattern, rank 0
    fails the lane-wide check naming rank 1, and neither host writes a byte - where rank 1 used to stage the
    shared files alone and the engine found its tables missing."""
    nas_hub.thaw()
    try:
        _add_engram_repo(nas_hub, ranks=[0])
    finally:
        nas_hub.freeze()
    inventory = write_lane(tmp_path, nas_hub["hub"], RANK_TEMPLATES)
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS)
    assert code != 0

    [preflight] = host_results(data, "Each repo from the NAS hub to the local hub, pass preflight", "rank1")
    messages = [r.get("msg", "") for r in preflight.get("results", []) if r.get("failed")]
    assert messages and "'engram/rank-1-of-2/*' matches no file" in messages[0], (failures(data), preflight)
    assert ENGRAM_REPO in messages[0], messages
    with open(str(tmp_path / "reports" / "rank0.json")) as handle:
        rank0 = json.load(handle)
    assert rank0["status"] == "failed", rank0
    assert rank0["failed_task"].startswith("Lane gate | Every host of the lane passed"), rank0
    assert "rank1 failed its checks" in rank0["failed_msg"], rank0
    assert "Nothing was written on any host" in rank0["failed_msg"], rank0
    for host in HOSTS:
        assert not (tmp_path / host).exists(), host   # no hub, no manifest
