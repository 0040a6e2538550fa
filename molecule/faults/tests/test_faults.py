"""faults: after converge (full checkpoint refused, the fitting one staged), prove the staged state on
every node, and that the scenario's premise holds: the disk really is too small."""
import pytest

import dgxcheck


@pytest.fixture(scope="module")
def node(host):
    name = host.backend.name
    hvars = dgxcheck.inventory_vars(name)
    answer = dgxcheck.probe(host, hvars["hub_local_root"],
                            read_paths=dgxcheck.ref_paths(hvars["hub_local_root"], hvars["stage_repos"]))
    return name, hvars, answer


def test_the_full_checkpoint_does_not_fit_the_local_disk(node):
    """The premise: without it the refusal in converge would prove nothing."""
    _name, hvars, answer = node
    full = sum(f["size"] for repo in hvars["faults_full_repos"]
               for f in dgxcheck.nas_snapshot(hvars["hub_nas_root"], repo)[1].values())
    fits = sum(f["size"] for repo in hvars["stage_repos"]
               for path, f in dgxcheck.nas_snapshot(hvars["hub_nas_root"], repo)[1].items()
               if dgxcheck.selected(path, repo.get("allow_patterns"), repo.get("ignore_patterns")))
    disk = answer["statvfs"]["size"]
    assert full > disk, "the local disk (%d bytes) holds the full checkpoint (%d bytes)" % (disk, full)
    assert fits < disk, "set-up: the fitting patterns select %d bytes, disk %d" % (fits, disk)


def test_every_blob_is_a_regular_file_named_by_its_hash(node):
    dgxcheck.ok(dgxcheck.check_blobs(node[2]))


def test_nothing_local_resolves_into_the_nas(node):
    _name, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_all_local(answer, hvars["hub_nas_root"]))


def test_snapshots_hold_exactly_what_fits(node):
    _name, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_snapshots(answer, hvars))


def test_the_verify_play_proved_what_fits(node):
    """The verify pass found nothing to repair or missing, and the weights check read the staged shards' own
    headers (the index, which names all six, stays on the NAS)."""
    name, _hvars, _answer = node
    rep = dgxcheck.report(name)
    verify = {p["repo_id"]: p for p in rep["passes"]["verify"]}
    assert all(p["files"]["dangling"] == 0 and p["blobs"]["repaired"] == 0 for p in verify.values()), verify
    assert [w["shards"] for w in rep["weights"]] == [3, 2], rep["weights"]


def test_nas_is_read_only_in_the_node(node):
    _name, hvars, answer = node
    dgxcheck.ok(dgxcheck.check_nas_read_only(answer, hvars["hub_nas_root"]))


def test_nas_unchanged_byte_for_byte():
    dgxcheck.ok(dgxcheck.nas_unchanged())
