"""sglang_4x: after the plays of stage-deepseek.yml (engine off) on the four nodes of the lane, each node holds
exactly the shared files of the engram repo plus its own rank's tables (rank templates), every blob named by its
hash and the verify pass ok; its mount manifest binds the other ranks' tables from the NAS, read-only, every NAS
file reachable once; no more than stage_nas_readers (2) nodes staged at once, by the host reports' stage windows;
the NAS is unchanged."""

import pytest

import dgxcheck

HOSTS = ["dgx1", "dgx2", "dgx3", "dgx4"]


def rank_repo(repo, rank, world_size):
    """The stage_repos entry as one rank stages it: the shared patterns plus its own expanded templates."""
    own = [p.replace("{rank}", str(rank)).replace("{world_size}", str(world_size)) for p in repo["rank_patterns"]]
    return dict(repo, allow_patterns=list(repo["allow_patterns"]) + own)


@pytest.fixture(scope="module")
def node(host):
    """(name, rank, inventory vars, probe answer with the manifest); one probe per node."""
    name, hvars, answer = dgxcheck.probe_node(host)
    return name, HOSTS.index(name), hvars, answer


def test_each_node_holds_the_shared_files_and_exactly_its_ranks_tables(node):
    _name, rank, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_nas_read_only(answer, hvars["hub_nas_root"]))
    dgxcheck.ok(dgxcheck.check_blobs(answer))
    dgxcheck.ok(dgxcheck.check_all_local(answer, hvars["hub_nas_root"]))
    [repo] = hvars["stage_repos"]
    # Selected files present with their NAS content; the other ranks' files absent, their content nowhere local.
    dgxcheck.ok(dgxcheck.check_snapshot(answer, hvars["hub_nas_root"], hvars["hub_local_root"],
                                        rank_repo(repo, rank, len(HOSTS))))
    _commit, files = dgxcheck.nas_snapshot(hvars["hub_nas_root"], repo)
    own = "engram/rank-%d-of-%d/" % (rank, len(HOSTS))
    tables = [p for p, entry in answer["tree"].items()
              if "/snapshots/" in p and "/engram/rank-" in p and entry["type"] != "dir"]
    assert tables and all(own in p for p in tables), tables
    assert len(tables) == len([p for p in files if p.startswith(own)]), tables


def test_the_manifest_binds_the_other_ranks_tables_from_the_nas_read_only(node):
    _name, rank, hvars, answer = node
    manifest = answer["manifest"]
    assert manifest, "no manifest at %s" % hvars["engine_manifest_path"]
    dgxcheck.ok(dgxcheck.check_manifest(manifest, answer["stat"], hvars["hub_nas_root"], hvars["hub_local_root"],
                                        hvars["stage_repos"]))
    nas_targets = [m["target"] for m in manifest["mounts"] if m["origin"] == "nas"]
    for other in range(len(HOSTS)):
        folder = "/engram/rank-%d-of-%d" % (other, len(HOSTS))
        bound = [t for t in nas_targets if folder in t]
        assert bool(bound) == (other != rank), (rank, other, nas_targets)


def test_the_report_shows_the_rank_and_a_verify_pass_ok(node):
    name, rank, hvars, _answer = node
    rep = dgxcheck.report(name)
    assert (rep["host"], rep["lane"], rep["rank"], rep["world_size"], rep["status"]) == (
        name, "sglang_4x", rank, 4, "ok")
    [verify] = rep["passes"]["verify"]
    assert verify["repo_id"] == hvars["stage_repos"][0]["repo_id"] and verify["status"] == "ok", verify
    assert verify["files"]["dangling"] == 0 and verify["verify"] == "full", verify
    assert rep["bytes_from_nas"] > 0 and rep["bytes_from_peers"] == 0, rep


def test_no_more_than_two_nodes_read_the_nas_at_once():
    reports = [dgxcheck.report(name) for name in HOSTS]
    windows = [(r["stage_started"], r["stage_finished"]) for r in reports]
    assert all(s and f and s <= f for s, f in windows), windows
    readers = dgxcheck.inventory_vars("dgx1")["stage_nas_readers"]
    assert dgxcheck.most_at_once(windows) <= readers == 2, windows


def test_nas_unchanged_byte_for_byte():
    """Last: the NAS against the fingerprint taken before converge (every path, lstat, sha256)."""
    dgxcheck.ok(dgxcheck.nas_unchanged())
