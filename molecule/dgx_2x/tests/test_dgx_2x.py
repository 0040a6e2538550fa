"""dgx_2x: after stage-deepseek.yml (engine off) on both nodes, prove on each node what the
night-shift log needed by hand: every staged byte right and local, page15 left on the NAS but still
reachable through a read-only bind, yesterday's receipts gone, and the NAS not touched at all."""

import pytest

import dgxcheck


@pytest.fixture(scope="module")
def node(host):
    """(name, inventory vars, probe answer) for one node; one probe per node."""
    return dgxcheck.probe_node(host, lambda hvars: dgxcheck.receipt_stat_paths(hvars["receipt_parent"]))


def test_nas_is_read_only_in_the_node(node):
    _name, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_nas_read_only(answer, hvars["hub_nas_root"]))


def test_every_blob_is_a_regular_file_named_by_its_hash(node):
    dgxcheck.ok(dgxcheck.check_blobs(node[2]))


def test_nothing_local_resolves_into_the_nas(node):
    _name, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_all_local(answer, hvars["hub_nas_root"]))


def test_snapshots_hold_the_selected_files_and_no_page15(node):
    _name, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_snapshots(answer, hvars))
    # the scenario stages the main repo without page15: make sure that case is really exercised
    excluded = [r for r in hvars["stage_repos"] if "page15/" in r.get("ignore_patterns", [])]
    assert excluded, "set-up: no repo excludes page15/"


def test_manifest_covers_every_nas_file_once_with_nas_binds_read_only(node):
    _name, hvars, answer = node
    manifest = answer["manifest"]
    assert manifest, "no manifest at %s" % hvars["engine_manifest_path"]
    dgxcheck.ok(dgxcheck.check_manifest(manifest, answer["stat"], hvars["hub_nas_root"], hvars["hub_local_root"],
                                        hvars["stage_repos"]))
    nas = [m for m in manifest["mounts"] if m["origin"] == "nas"]
    assert nas and all(m["target"].endswith("/page15") for m in nas), \
        "page15 (not staged) must be bound from the NAS as one directory: %s" % nas


def test_yesterdays_receipts_are_gone(node):
    _name, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_receipts_gone(answer, hvars["receipt_parent"]))


def test_report_matches_the_node(node):
    name, hvars, answer = node
    rep = dgxcheck.report(name)
    assert rep["host"] == name and rep["lane"] == "exl3_2x"
    assert name.endswith("-dgx%d" % (rep["rank"] + 1)) and rep["world_size"] == 2   # dgx1 is rank 0
    verify = rep["passes"]["verify"]
    assert [p["repo_id"] for p in verify] == [r["repo_id"] for r in hvars["stage_repos"]]
    assert all(p["files"]["dangling"] == 0 for p in verify)
    assert rep["engine"]["manifest"]["counts"] == answer["manifest"]["counts"]


def test_nas_unchanged_byte_for_byte():
    """Last: the NAS against the fingerprint taken before converge (every path, lstat, sha256)."""
    dgxcheck.ok(dgxcheck.nas_unchanged())
