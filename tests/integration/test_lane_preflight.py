"""Lane-wide preflight on a lane of three local-connection hosts, each with its own
hub_local_root, and one small shared NAS hub: every host's checks run before any host copies, and when a
host of the lane fails its preflight (no room for stage_reserve: for one repo, or for all its repos together)
or cannot be reached, the play fails on every host, nothing is written on any host, and each other host's
report names the host(s) at fault and says that nothing was written. A host --limit leaves out is not waited
for. The space arithmetic itself is tests/unit/test_mirror.py's (one repo) and test_stage_space.py's (all
repos together); preflight runs hf_hub_mirror in check mode, so a --check run refuses alike."""
import json
import os
import subprocess

import pytest

from conftest import failures, run_playbook
from hubgen import DRAFTER_REPO, MAIN_REPO
from treestate import snapshot_diff, tree_snapshot

HOSTS = ["node0", "node1", "node2"]
TAGS = "preflight,stage,verify,manifest"
# More than any disk holds: the preflight space check of that host fails.
IMPOSSIBLE_RESERVE = str(2 ** 60)
LANE_CHECK = "Lane gate | Every host of the lane passed preflight"


@pytest.fixture
def small_nas(make_nas_hub):
    """A tiny NAS hub: the drafter repo is all the lane stages (a few KiB)."""
    return make_nas_hub(shard_size=4096, n_shards=2)["hub"]


def write_lane(tmp_path, nas, **host_vars):
    """The three hosts in lane group dgx_lane, in rank order, local connection unless host_vars[host] says
    otherwise; each host's hub (<tmp>/<host>/hub) exists and holds an operator's file, so a tree snapshot of
    <tmp>/<host> (hub and mount manifest) shows any write."""
    members = {}
    for name in HOSTS:
        (tmp_path / name / "hub").mkdir(parents=True, exist_ok=True)     # a test may have mounted a disk there
        (tmp_path / name / "hub" / "README.operator").write_text("kept\n")
        members[name] = dict({"ansible_connection": "local",
                              "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                              "hub_local_root": str(tmp_path / name / "hub")}, **host_vars.get(name, {}))
    group_vars = {"lane": "dgx_lane", "hub_nas_root": nas, "engine_enabled": False, "stage_verify": "full",
                  "stage_report_dir": str(tmp_path / "reports"), "stage_repos": [{"repo_id": DRAFTER_REPO}]}
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"all": {"children": {"dgx_lane": {"hosts": members}}, "vars": group_vars}}))
    return str(path)


def host_trees(tmp_path):
    return dict((name, tree_snapshot(str(tmp_path / name))) for name in HOSTS)


def report(tmp_path, host):
    with open(str(tmp_path / "reports" / (host + ".json"))) as handle:
        return json.load(handle)


def plays_reached(data):
    """Names of the plays in which some task ran on some host."""
    return [p["play"]["name"].split(" - ")[0] for p in data["plays"] if any(t["hosts"] for t in p["tasks"])]


def assert_lane_stopped_in_preflight(tmp_path, data, before, healthy, at_fault, at_fault_why):
    """Nothing written on any host, no play after preflight ran, and each healthy host's preflight failed
    at the lane check, its report naming the host(s) at fault and that nothing was written."""
    for name in HOSTS:
        assert snapshot_diff(before[name], tree_snapshot(str(tmp_path / name))) == [], name
    assert plays_reached(data) == ["Select the hosts of the lane", "Lane facts", "Preflight"], plays_reached(data)
    for name in healthy:
        view = report(tmp_path, name)
        assert (view["status"], view["failed_play"]) == ("failed", "preflight"), view
        assert view["failed_task"].startswith(LANE_CHECK), view
        assert view["failed_msg"].startswith("Preflight did not pass on %s of lane dgx_lane" % at_fault), view
        assert at_fault_why in view["failed_msg"] and "Nothing was written on any host" in view["failed_msg"], view


@pytest.fixture
def small_disk(tmp_path):
    """node2's local disk: a 16 MiB tmpfs under its hub root, so its free space is exact and nobody else writes
    to it; it holds the operator's file write_lane puts in every hub."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-capped tmpfs needs root (CI runs as root)")
    path = tmp_path / "node2" / "hub"
    path.mkdir(parents=True)
    subprocess.check_call(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)])
    (path / "README.operator").write_text("kept\n")
    yield path
    subprocess.check_call(["umount", str(path)])


def free_bytes(path):
    stats = os.statvfs(str(path))
    return stats.f_bavail * stats.f_frsize


def to_copy(repo, ignore_page15=True):
    """Bytes a fresh stage of a NAS repo copies: its unique blobs and real files (page15/ left out)."""
    files = [f for p, f in repo["files"].items() if not (ignore_page15 and p.startswith("page15/"))]
    return sum(dict((f["etag"], f["size"]) for f in files if f["kind"] == "link").values()) + sum(
        f["size"] for f in files if f["kind"] == "real")


def test_hosts_without_room_fail_the_whole_lane_and_nothing_is_written(tmp_path, make_nas_hub, small_disk):
    """node1 has no room for one repo (the mirror's own check refuses it); node2's disk holds each of its two
    repos alone but not both together (the preflight's check of all repos together refuses it)."""
    nas = make_nas_hub(shard_size=4096, n_shards=2)
    repos = [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}, {"repo_id": DRAFTER_REPO}]
    need = [to_copy(nas["repos"][repo["repo_id"]]) for repo in repos]
    room = max(need) + min(need) // 2
    inventory = write_lane(tmp_path, nas["hub"], node1={"stage_reserve": IMPOSSIBLE_RESERVE}, node2={
        "stage_repos": repos, "stage_reserve": str(free_bytes(small_disk) - room)})
    before = host_trees(tmp_path)
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS)
    assert code != 0
    assert_lane_stopped_in_preflight(tmp_path, data, before, ["node0"], "node1, node2",
                                     "of lane dgx_lane: node1, node2 failed their checks (their host reports say "
                                     "why). ")
    # Each host at fault says why: node1 its own space check (the mirror's, per repo, in preflight)...
    view = report(tmp_path, "node1")
    assert (view["failed_play"], view["failed_task"]) == (
        "preflight", "Mirror | Each repo from the NAS hub to the local hub, pass preflight"), view
    assert "not enough space on %s" % (tmp_path / "node1" / "hub") in view["failed_msg"], view
    assert " need %d bytes " % to_copy(nas["repos"][DRAFTER_REPO]) in view["failed_msg"], view
    assert "stage_reserve" in view["failed_msg"], view
    # ...node2 the check of all its repos together, after each passed alone.
    view = report(tmp_path, "node2")
    assert (view["failed_play"], view["failed_task"]) == (
        "preflight", "Preflight | The local disk holds all repos together, with the reserve left free"), view
    assert view["failed_msg"].startswith("Not enough space on node2:%s: staging needs " % small_disk), view
    assert "(%d bytes), available " % sum(need) in view["failed_msg"], view
    assert "(%d bytes: free " % room in view["failed_msg"], view
    assert [row["status"] for row in view["passes"]["preflight"]] == ["check", "check"], view


def test_an_unreachable_host_fails_the_lane_and_limit_leaves_it_out(tmp_path, small_nas):
    # A closed port: the connection is refused at once.
    lost = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
            "ansible_python_interpreter": "/usr/bin/python3"}
    inventory = write_lane(tmp_path, small_nas, node1=lost)
    before = host_trees(tmp_path)
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS)
    assert code != 0 and data["stats"]["node1"]["unreachable"] > 0, data["stats"]
    assert_lane_stopped_in_preflight(tmp_path, data, before, ["node0", "node2"], "node1",
                                     "of lane dgx_lane: node1 unreachable or failed earlier in the run. ")

    # Without it, the rest of the lane stages: the check waits only for the hosts this run targets.
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS, "--limit", "node0,node2")
    assert code == 0, failures(data)
    for name in ("node0", "node2"):
        assert report(tmp_path, name)["status"] == "ok", report(tmp_path, name)
        assert (tmp_path / name / "engine-mounts.json").is_file(), name
    assert snapshot_diff(before["node1"], tree_snapshot(str(tmp_path / "node1"))) == []


def test_fanout_inputs_are_checked_in_preflight_on_every_host(tmp_path, small_nas):
    """With stage_peer_fanout, a receiving host's candidate folder reached through a symlink (rsync would write
    through it, outside the hub) and a stage_nas_readers that gives no wave both fail preflight: the lane stops
    before any host copies, and nothing is written outside the hubs either."""
    outside = tmp_path / "outside"
    outside.mkdir()
    fanout = {"stage_peer_fanout": True}
    inventory = write_lane(tmp_path, small_nas, node0=fanout, node1=dict(fanout, stage_nas_readers=-1),
                           node2=fanout)
    (tmp_path / "node2" / "hub" / ".locks").mkdir()
    (tmp_path / "node2" / "hub" / ".locks" / "dgx-stage-peer").symlink_to(outside)
    before = host_trees(tmp_path)
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS)
    assert code != 0
    assert_lane_stopped_in_preflight(tmp_path, data, before, ["node0"], "node1, node2", "failed their checks")
    assert list(outside.iterdir()) == []
    assert "stage_nas_readers" in report(tmp_path, "node1")["failed_msg"], report(tmp_path, "node1")
    assert "symlink" in report(tmp_path, "node2")["failed_msg"], report(tmp_path, "node2")
