"""The NAS read once per lane: four local-connection hosts in one lane group, each with its
own hub_local_root, stage hubgen's engram layout for four ranks (shared files + per-rank tables, rank templates)
from one read-only NAS hub.

With stage_peer_fanout: true and stage_nas_readers: 2, rank 0 reads the shared files from the NAS and the other
ranks receive them host to host (ansible.posix.synchronize into <hub_local_root>/.locks/dgx-stage-peer/<repo
folder>/), adopted only after a hash match: the lane reads one copy of the shared files plus each rank's own part
from the NAS, and every host still holds exactly its files, proven. A candidate corrupted in transit (an rsync
wrapper flips a byte after the copy) is rejected and fetched from the NAS. Without fan-out, no more than two
hosts' stage windows overlap (the reader limit, from the host reports). Expected figures come from the generated
layout (hubgen.add_engram_repo's description), not from the modules' own reports.
"""
import json
import os
import shutil
import stat
import sys

import pytest
from huggingface_hub import hf_hub_download, snapshot_download

import hubgen
from conftest import failures, run_playbook
from lanecheck import most_at_once
from nashub import NasHub
from treestate import sha256_file, tree_snapshot

WORLD_SIZE = 4
HOSTS = ["rank0", "rank1", "rank2", "rank3"]
TAGS = "preflight,stage,verify"
READERS = 2
CORRUPT_HOST = "rank2"   # a host of the second wave: its shared blobs come from rank0


@pytest.fixture
def engram_nas(tmp_path):
    """A NAS hub holding only the engram repo for four ranks (a 64 KiB dense shard, 8 KiB tables), read-only,
    checked unchanged at teardown."""
    root = str(tmp_path / "nas")
    nas = NasHub(hubgen.build_engram_hub(root, WORLD_SIZE, dense_size=64 * 1024, table_size=8 * 1024))
    nas["root"] = root
    nas.freeze()
    [repo] = nas["repos"].values()
    yield nas["hub"], repo
    try:
        nas.assert_unchanged()
    finally:
        nas.thaw()


def write_lane(tmp_path, nas, repo, fanout, extra_vars=None, host_vars=None):
    """Four local-connection hosts in the lane group sglang_4x, each with its own hub_local_root
    (<tmp>/<host>/hub), one shared report dir. ansible_host localhost: ansible.posix.synchronize copies to a
    local path only when the receiving host's ansible_host is a localhost name (else it tries ssh to rank1)."""
    members = dict((name, dict({"ansible_connection": "local", "ansible_host": "localhost",
                                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                                "hub_local_root": str(tmp_path / name / "hub")}, **(host_vars or {}).get(name, {})))
                   for name in HOSTS)
    group_vars = {"lane": "sglang_4x", "hub_nas_root": nas, "engine_enabled": False, "stage_verify": "full",
                  "stage_report_dir": str(tmp_path / "reports"), "stage_nas_readers": READERS,
                  "stage_peer_fanout": fanout,
                  # Written the natural way, without allow_patterns: rank files partition the repo.
                  "stage_repos": [{"repo_id": repo["repo_id"], "rank_patterns": repo["rank_patterns"]}]}
    group_vars.update(extra_vars or {})
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"all": {"children": {"sglang_4x": {"hosts": members}}, "vars": group_vars}}))
    return str(path)


def reports(tmp_path):
    out = {}
    for host in HOSTS:
        with open(str(tmp_path / "reports" / (host + ".json"))) as handle:
            out[host] = json.load(handle)
    return out


def snapshot_files(snapshot):
    """Snapshot-relative paths of every file (link or real) under a snapshot directory."""
    return sorted(rel for rel, state in tree_snapshot(snapshot, content=False).items() if not stat.S_ISDIR(state[0]))


def assert_each_host_holds_its_files_proven(tmp_path, repo, report):
    """Exactly the shared files and the host's own rank's (snapshot entries and the blobs behind them), each with
    its NAS content, the verify pass (full) ok, and no candidate folder left behind."""
    for rank, host in enumerate(HOSTS):
        wanted = sorted(repo["shared"] + repo["ranks"][rank])
        local = tmp_path / host / "hub"
        snapshot = local / repo["folder"] / "snapshots" / repo["commit"]
        assert snapshot_files(str(snapshot)) == wanted, host
        assert sorted(os.listdir(str(local / repo["folder"] / "blobs"))) == \
            sorted(set(repo["files"][p]["etag"] for p in wanted)), host
        for rel in wanted:
            assert sha256_file(str(snapshot / rel)) == repo["files"][rel]["sha256"], (host, rel)
        # huggingface_hub, offline, finds the staged snapshot and every file of it in this host's hub.
        assert snapshot_download(repo["repo_id"], cache_dir=str(local), local_files_only=True,
                                 allow_patterns=wanted) == str(snapshot)
        for rel in wanted:
            assert hf_hub_download(repo["repo_id"], rel, cache_dir=str(local), local_files_only=True) == \
                str(snapshot / rel), (host, rel)
        [verify] = report[host]["passes"]["verify"]
        assert verify["status"] == "ok" and verify["verify"] == "full", (host, verify)
        assert verify["files"]["dangling"] == 0 and verify["blobs"]["repaired"] == 0, (host, verify)
        assert not os.path.lexists(str(local / ".locks" / "dgx-stage-peer" / repo["folder"])), host


def test_fanout_reads_the_shared_files_from_the_nas_once_per_lane_and_proves_every_blob(tmp_path, engram_nas):
    nas, repo = engram_nas
    inventory = write_lane(tmp_path, nas, repo, fanout=True)
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS)
    assert code == 0, failures(data)
    report = reports(tmp_path)
    assert_each_host_holds_its_files_proven(tmp_path, repo, report)

    shared, own = repo["shared_bytes"], repo["rank_bytes"]
    # The lane read one copy of the shared files (rank 0's) and each rank's own part from the NAS.
    assert sum(r["bytes_from_nas"] for r in report.values()) == shared + sum(own.values())
    assert (report["rank0"]["bytes_from_nas"], report["rank0"]["bytes_from_peers"]) == (shared + own[0], 0)
    for rank, host in enumerate(HOSTS[1:], 1):
        assert (report[host]["bytes_from_nas"], report[host]["bytes_from_peers"]) == (own[rank], shared), host
    for rank, host in enumerate(HOSTS):
        [row] = report[host]["passes"]["stage"]
        assert (row["bytes_from_nas"], row["bytes_from_peers"], row["peer_rejected"]) == (
            report[host]["bytes_from_nas"], report[host]["bytes_from_peers"], 0), (host, row)
    # Rank 0 staged alone before any other host began (its blobs are what they receive), and the reader limit
    # still holds for the later waves.
    windows = dict((h, (report[h]["stage_started"], report[h]["stage_finished"])) for h in HOSTS)
    assert all(windows["rank0"][1] <= windows[h][0] for h in HOSTS[1:]), windows
    assert most_at_once(list(windows.values())) <= READERS, windows

    # A second stage pass finds everything in place and reads nothing (preflight and verify read nothing either).
    code, data = run_playbook(tmp_path, inventory, "--tags", "stage")
    assert code == 0, failures(data)
    assert all(data["stats"][host]["changed"] == 0 for host in HOSTS), data["stats"]
    assert [r["bytes_from_nas"] + r["bytes_from_peers"] for r in reports(tmp_path).values()] == [0] * len(HOSTS)


def write_corrupting_rsync(tmp_path, victim_root):
    """An rsync for ansible.posix.synchronize (ansible_rsync_path) that runs the real one, then, once, flips a
    byte of the largest candidate it just delivered under victim_root: a blob corrupted in transit. Each call's
    arguments go to rsync-argv.txt beside it. Returns (the wrapper's path, the file naming the blob it corrupted)."""
    real = shutil.which("rsync")
    wrapper, record = tmp_path / "rsync-corrupting", tmp_path / "rsync-corrupted.txt"
    wrapper.write_text("""#!%(python)s
import os, subprocess, sys
sys.path.insert(0, %(tools)r)
import hubgen
with open(%(argv)r, "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\\n")
rc = subprocess.call([%(real)r] + sys.argv[1:])
dest = os.path.realpath(sys.argv[-1].split(":", 1)[-1].rstrip("/"))
if rc == 0 and dest.startswith(%(victim)r + os.sep) and not os.path.exists(%(record)r):
    candidates = [os.path.join(dest, n) for n in os.listdir(dest) if os.path.isfile(os.path.join(dest, n))]
    if candidates:
        largest = max(candidates, key=os.path.getsize)
        hubgen.flip_byte(largest, os.path.getsize(largest) // 2)
        with open(%(record)r, "w") as handle:
            handle.write(os.path.basename(largest))
sys.exit(rc)
""" % {"python": sys.executable, "tools": os.path.dirname(os.path.abspath(hubgen.__file__)), "real": real,
       "victim": os.path.realpath(victim_root), "record": str(record), "argv": str(tmp_path / "rsync-argv.txt")})
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(wrapper), record


def test_a_candidate_corrupted_in_transit_is_rejected_and_fetched_from_the_nas(tmp_path, engram_nas):
    nas, repo = engram_nas
    if not shutil.which("rsync"):
        pytest.skip("rsync is not installed (make system-packages installs it)")
    victim_root = tmp_path / CORRUPT_HOST / "hub" / ".locks" / "dgx-stage-peer"
    wrapper, record = write_corrupting_rsync(tmp_path, str(victim_root))
    # A read cap too high to slow this lane down: the peer copies are sent at it (rsync's KiB/s).
    inventory = write_lane(tmp_path, nas, repo, fanout=True,
                           extra_vars={"ansible_rsync_path": wrapper, "stage_max_mib_s": 1000})
    code, data = run_playbook(tmp_path, inventory, "--tags", TAGS)
    assert code == 0, failures(data)
    assert record.exists(), "the rsync wrapper never delivered a candidate to %s" % CORRUPT_HOST
    # rank1 and rank2 take from rank0 at once and share its cap; rank3, alone in its wave, has it whole.
    calls = (tmp_path / "rsync-argv.txt").read_text().splitlines()
    assert calls and all("--bwlimit=%d" % (1024000 if "/rank3/" in call.split()[-1] else 512000) in call.split()
                         for call in calls), calls
    corrupted = record.read_text()
    [path] = [p for p, f in repo["files"].items() if f["etag"] == corrupted]
    assert path in repo["shared"], path
    size = repo["files"][path]["size"]

    # Every host still holds exactly its files, proven; the corrupted candidate was never adopted.
    report = reports(tmp_path)
    assert_each_host_holds_its_files_proven(tmp_path, repo, report)
    rank = HOSTS.index(CORRUPT_HOST)
    [row] = report[CORRUPT_HOST]["passes"]["stage"]
    assert row["peer_rejected"] == 1, row
    assert (report[CORRUPT_HOST]["bytes_from_nas"], report[CORRUPT_HOST]["bytes_from_peers"]) == (
        repo["rank_bytes"][rank] + size, repo["shared_bytes"] - size)
    # The mirror's own result names the rejected blob.
    rejected = [r for play in data["plays"] for task in play["tasks"]
                for r in task["hosts"].get(CORRUPT_HOST, {}).get("results", [])
                if isinstance(r, dict) and r.get("peer_rejected")]
    assert rejected and any(corrupted in json.dumps(item) for item in rejected[0]["peer_rejected"]), rejected
    for host in HOSTS:
        if host != CORRUPT_HOST:
            [other] = report[host]["passes"]["stage"]
            assert other["peer_rejected"] == 0, (host, other)
    assert sum(r["bytes_from_nas"] for r in report.values()) == \
        repo["shared_bytes"] + sum(repo["rank_bytes"].values()) + size


def test_without_fanout_no_more_than_stage_nas_readers_hosts_stage_at_once(tmp_path, engram_nas):
    """The stage pass alone (the verify pass is the other tests'): its windows and bytes are in the reports.
    Fan-out is switched off the way an operator does it for one run, `-e stage_peer_fanout=false` over an
    inventory that says true: the text "false" must read as false (it once turned fan-out on)."""
    nas, repo = engram_nas
    inventory = write_lane(tmp_path, nas, repo, fanout=True)
    code, data = run_playbook(tmp_path, inventory, "--tags", "preflight,stage", "-e", "stage_peer_fanout=false")
    assert code == 0, failures(data)
    report = reports(tmp_path)
    for rank, host in enumerate(HOSTS):
        snapshot = tmp_path / host / "hub" / repo["folder"] / "snapshots" / repo["commit"]
        assert snapshot_files(str(snapshot)) == sorted(repo["shared"] + repo["ranks"][rank]), host
    windows = [(report[h]["stage_started"], report[h]["stage_finished"]) for h in HOSTS]
    assert all(s and f and s <= f for s, f in windows), windows
    assert most_at_once(windows) <= READERS, windows
    # Each host read its shared files and its own part from the NAS itself.
    for rank, host in enumerate(HOSTS):
        assert (report[host]["bytes_from_nas"], report[host]["bytes_from_peers"]) == (
            repo["shared_bytes"] + repo["rank_bytes"][rank], 0), host


def test_a_host_failing_in_its_wave_ends_its_window_when_it_failed(tmp_path):
    """rank1's own engram table is corrupt on the NAS (preflight reads no content, so the stage pass fails it):
    its report's window ends when its wave did, before the next wave began - not when its report was written
    after the later waves - so the reports still show the reader limit."""
    root = str(tmp_path / "nas")
    nas = NasHub(hubgen.build_engram_hub(root, WORLD_SIZE, dense_size=64 * 1024, table_size=8 * 1024))
    nas["root"] = root
    [repo] = nas["repos"].values()
    table = sorted(p for p in repo["ranks"][1] if p.endswith(".safetensors"))[0]
    snapshot = os.path.join(nas["hub"], repo["folder"], "snapshots", repo["commit"])
    hubgen.flip_byte(os.path.realpath(os.path.join(snapshot, table)), 100)
    nas.freeze()
    try:
        inventory = write_lane(tmp_path, nas["hub"], repo, fanout=False)
        code, data = run_playbook(tmp_path, inventory, "--tags", "preflight,stage")
        assert code != 0
        report = reports(tmp_path)
        assert (report["rank1"]["status"], report["rank1"]["failed_play"]) == ("failed", "stage"), report["rank1"]
        assert [report[h]["status"] for h in ("rank0", "rank2", "rank3")] == ["ok"] * 3, failures(data)
        windows = dict((h, (report[h]["stage_started"], report[h]["stage_finished"])) for h in HOSTS)
        assert windows["rank1"][1] <= windows["rank2"][0], windows
        assert most_at_once(list(windows.values())) <= READERS, windows
        nas.assert_unchanged()
    finally:
        nas.thaw()


FAKE_SSH = """#!/bin/sh
# ssh to rank0 for its own tasks runs them here; the host-to-host copy it is asked to send cannot connect.
cmd=$(eval "printf '%s' \\"\\${$#}\\"")
case "$cmd" in *synchronize*) echo "ssh: connect to host rank0 port 22: No route to host" >&2; exit 255;; esac
exec /bin/sh -c "$cmd"
"""


def test_a_peer_that_cannot_be_reached_for_the_copy_costs_nas_reads_only(tmp_path, engram_nas):
    """rank0 answers for its own tasks but not for the copy it is to send: the receiving hosts read their blobs
    from the NAS, say so, and end ok (an unreachable delegate once made the receiving host unreachable)."""
    nas, repo = engram_nas
    fake_ssh = tmp_path / "fake-ssh"
    fake_ssh.write_text(FAKE_SSH)
    fake_ssh.chmod(0o755)
    rank0 = {"ansible_connection": "ssh", "ansible_ssh_executable": str(fake_ssh), "ansible_pipelining": False,
             "ansible_ssh_transfer_method": "piped", "ansible_python_interpreter": sys.executable}
    inventory = write_lane(tmp_path, nas, repo, fanout=True, host_vars={"rank0": rank0})
    code, data = run_playbook(tmp_path, inventory, "--tags", "preflight,stage")
    assert code == 0, failures(data)
    report = reports(tmp_path)
    for rank, host in enumerate(HOSTS):
        assert (report[host]["status"], report[host]["bytes_from_peers"]) == ("ok", 0), (host, report[host])
        assert report[host]["bytes_from_nas"] == repo["shared_bytes"] + repo["rank_bytes"][rank], host
    said = json.dumps(data)
    assert "the copy from rank0 failed" in said and "its blobs come from the NAS" in said
