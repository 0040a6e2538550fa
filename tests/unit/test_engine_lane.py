"""The lane-wide decisions in Python: module_utils/dgx_nodestate.py (the mount manifest read on the node, the
bound files' fingerprint, the holders of a port, on a fake /proc) and the engine role's lane filters
(roles/engine/filter_plugins/engine_lane.py: container lists, labels, restart reasons, strays, earlier worlds,
the lane's plan). tests/integration/test_engine_lane.py runs them on real Podman and Docker."""
import json
import hashlib
import os
import time
import socket

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible.module_utils.dgx_nodestate import (file_identity, files_fingerprint, listening_inodes, local_sources,
                                                 missing_paths, port_holders, read_manifest)
from ansible.module_utils import dgx_secrets as lane_secrets
from ansible.module_utils.dgx_runtime import container_facts
from pluginfile import load_filter

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


lane = load_filter("engine", "engine_lane")
ID1, ID2, ID3 = "a" * 64, "b" * 64, "c" * 64


# ------------------------------------------------------------------------------------------------
# dgx_nodestate: the fingerprint
# ------------------------------------------------------------------------------------------------

def test_the_fingerprint_changes_with_a_new_inode_a_missing_file_or_new_bytes_and_not_with_order(tmp_path):
    blob, other = tmp_path / "blob", tmp_path / "other"
    blob.write_bytes(b"x" * 10)
    other.write_bytes(b"y")
    first, pairs, missing = files_fingerprint([str(blob), str(other)])
    assert files_fingerprint([str(other), str(blob), str(blob)])[0] == first   # order, duplicates
    assert len(pairs) == 2 and missing == []
    assert files_fingerprint([str(blob), str(other)])[0] == first             # nothing changed

    # A verify repair: the same name and bytes, a new file (inode) renamed into place.
    st = os.stat(str(blob))
    fresh = tmp_path / "fresh"
    fresh.write_bytes(b"x" * 10)
    os.utime(str(fresh), ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(str(fresh), str(blob))
    repaired = files_fingerprint([str(blob), str(other)])[0]
    assert repaired != first

    with open(str(blob), "r+b") as handle:                              # bytes rewritten in place
        handle.write(b"z" * 11)
    rewritten = files_fingerprint([str(blob), str(other)])[0]
    assert rewritten != repaired

    # Rewritten in place again, same size, and the mtime put back: only the ctime tells.
    before = os.stat(str(blob))
    time.sleep(0.01)
    with open(str(blob), "r+b") as handle:
        handle.write(b"w" * 11)
    os.utime(str(blob), ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(str(blob)).st_mtime_ns == before.st_mtime_ns
    assert files_fingerprint([str(blob), str(other)])[0] != rewritten

    os.unlink(str(other))                                               # pruned
    pruned, pairs, missing = files_fingerprint([str(blob), str(other)])
    assert missing == [str(other)] and dict(pairs)[str(other)] == "missing"
    assert files_fingerprint([])[0] == files_fingerprint([])[0]


def test_file_identity_follows_links_and_names_errors(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"abc")
    link = tmp_path / "link"
    link.symlink_to("target")
    st = os.stat(str(target))
    assert file_identity(str(link)) == "%d:%d:3:%d:%d" % (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    assert file_identity(str(tmp_path / "nope")) == "missing"
    assert file_identity(str(target) + "/below") == "missing"         # ENOTDIR
    assert file_identity("x" * 5000).startswith("error:ENAMETOOLONG")


@pytest.mark.parametrize("content, why", [
    (None, "cannot read it: No such file or directory"),
    (b"{not json", "not JSON: "),
    (b"[1, 2]", "not a mount manifest: not a JSON object"),
    (b'{"repos": []}', "not a mount manifest: no list of repos and of mounts"),
    (b'{"mounts": []}', "not a mount manifest: no list of repos and of mounts"),
    (b'{"repos": [], "mounts": [{"source": 7, "target": "/hub/a", "origin": "local"}]}',
     "not a mount manifest: mount 0 has no text source and target"),
    (b'{"repos": [], "mounts": [{"source": "/a", "target": "/hub/a"}, "junk"]}',
     "not a mount manifest: mount 1 has no text source and target"),
])
def test_a_manifest_that_cannot_be_read_says_why(tmp_path, content, why):
    path = tmp_path / "engine-manifest.json"
    if content is not None:
        path.write_bytes(content)
    manifest, error = read_manifest(str(path))
    assert manifest is None and error.startswith(why), error


def test_the_manifest_read_and_its_local_sources(tmp_path):
    mounts = [{"source": "/nvme/hub/blobs/a", "target": "/hub/a", "read_only": True, "origin": "local"},
              {"source": "/nas/hub/page15", "target": "/hub/page15", "read_only": True, "origin": "nas"},
              {"source": "/nvme/hub/blobs/b", "target": "/hub/b", "read_only": True, "origin": "local"}]
    path = tmp_path / "engine-manifest.json"
    path.write_text(json.dumps({"repos": [], "mounts": mounts, "counts": {}}))
    manifest, error = read_manifest(str(path))
    assert error is None and manifest["mounts"] == mounts
    assert local_sources(manifest) == ["/nvme/hub/blobs/a", "/nvme/hub/blobs/b"]
    assert local_sources({}) == []


def test_missing_paths_count_a_link_as_there_and_refuse_what_cannot_be_looked_at(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dangling").symlink_to("nowhere")
    (tmp_path / "file").write_text("x")
    paths = [str(tmp_path / name) for name in ("dir", "dangling", "gone", "file/below", "~")]
    assert missing_paths(paths) == [str(tmp_path / "gone"), str(tmp_path / "file/below"), str(tmp_path / "~")]
    with pytest.raises(OSError):
        missing_paths(["x" * 5000])


# ------------------------------------------------------------------------------------------------
# dgx_nodestate: who holds a port (a fake /proc)
# ------------------------------------------------------------------------------------------------

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0
   1: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1
   2: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0
"""
TCP6 = """  sl  local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0 100 0 0 10 0
"""


def fake_proc(root, processes):
    """processes: {pid: (comm, cgroup text, [socket inodes])}."""
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text(TCP)
    (root / "net" / "tcp6").write_text(TCP6)
    for pid, (comm, cgroup, inodes) in processes.items():
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "cgroup").write_text(cgroup)
        (fd / "0").symlink_to("/dev/null")
        for n, inode in enumerate(inodes):
            (fd / str(n + 3)).symlink_to("socket:[%d]" % inode)
    (root / "self").mkdir()
    return str(root)


def test_only_listening_sockets_count(tmp_path):
    proc = fake_proc(tmp_path / "proc", {})
    assert listening_inodes(8000, proc) == {111, 444} and listening_inodes(22, proc) == {333}
    assert listening_inodes(0x9C40, proc) == set()          # the remote end of a connection
    assert listening_inodes(8000, str(tmp_path / "no-proc")) == set()
    # A row it cannot read is skipped, the others still count.
    with open(os.path.join(proc, "net", "tcp"), "a") as table:
        table.write("   9: garbage:ZZ 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 x 1\n")
    assert listening_inodes(8000, proc) == {111, 444}


def test_port_holders_name_the_process_and_its_container(tmp_path):
    proc = fake_proc(tmp_path / "proc", {
        10: ("python3", "0::/libpod_parent/libpod-%s\n" % ID1, [111]),
        11: ("python3", "0::/system.slice/docker-%s.scope\n" % ID2, [444, 999]),
        12: ("sshd", "0::/system.slice/ssh.service\n", [333]),
        13: ("nc", "0::/user.slice\n", [222]),              # a connection on 8000, not a listener
    })
    assert listening_inodes(8000, proc) == {111, 444}
    assert port_holders(8000, proc) == [
        {"pid": 10, "command": "python3", "container_id": ID1},
        {"pid": 11, "command": "python3", "container_id": ID2}]
    assert port_holders(22, proc) == [{"pid": 12, "command": "sshd", "container_id": ""}]
    assert port_holders(9, proc) == []


def test_port_holders_on_this_machine_finds_our_own_listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        holders = port_holders(port)
    if os.geteuid() == 0 or holders:
        assert [h["pid"] for h in holders] == [os.getpid()]


# ------------------------------------------------------------------------------------------------
# the lane filters
# ------------------------------------------------------------------------------------------------

def podman_info(cid, name, labels=None, running=True, exit_code=0, env=None):
    return {"Id": cid, "Name": name, "ImageName": "localhost/engine:1",
            "State": {"Running": running, "Status": "running" if running else "exited", "ExitCode": exit_code},
            "Config": {"Labels": labels, "Env": ["%s=%s" % kv for kv in (env or {}).items()], "Image": "engine:1"}}


def labels_for(lane_name="exl3_2x", hosts=("dgx1", "dgx2"), rank=0, **over):
    spec = {"lane": lane_name, "lane_hosts": list(hosts), "rank": rank, "world_size": len(hosts), "port": 8000,
            "run_id": "20261130T204512Z-3fa2", "image": "engine:1", "image_id": "f" * 64,
            "command": ["serve", "--port", 8000], "env": {"RANK": rank, "WORLD_SIZE": len(hosts)},
            "mounts": "m" * 64, "files": "1" * 64, "devices": []}
    spec.update(over)
    return lane.dgx_engine_labels(spec)


def container(cid, name, labels, running=True, env=None, exit_code=0, wanted=None):
    """One podman container as engine_containers lists it; wanted: the environment the engine would get."""
    return container_facts(podman_info(cid, name, labels, running, exit_code, env), wanted)


def test_container_facts_name_changed_variables_only():
    podman = container_facts(podman_info(ID1, "e1", {"a": "b"}, False, 3, {"K": "v=w", "L": "same"}),
                             {"K": "hf_new", "L": "same"})
    assert dict((k, podman[k]) for k in ("id", "name", "running", "status", "exit_code", "labels", "env_changed",
                                         "image", "restart_policy")) == {
        "id": ID1, "name": "e1", "running": False, "status": "exited", "exit_code": 3, "labels": {"a": "b"},
        "env_changed": ["K"], "image": "localhost/engine:1", "restart_policy": ""}
    # Names only: neither a value nor anything derived from one (a digest of a short value is its value).
    assert "v=w" not in repr(podman) and "hf_new" not in repr(podman)
    assert hashlib.sha256(b"v=w").hexdigest() not in repr(podman)
    assert container_facts(podman_info(ID1, "e1", {}, env={"K": "v"}))["env_changed"] is None  # nothing to compare


def test_labels_are_strings_one_per_aspect_and_secrets_are_digests():
    labels = labels_for(env={"HF_TOKEN": "hf_secret", "RANK": 0})
    assert all(isinstance(v, str) for v in labels.values())
    assert labels["dgx-stage.lane-hosts"] == "dgx1,dgx2" and labels["dgx-stage.world-size"] == "2"
    assert "hf_secret" not in repr(labels) and len(labels["dgx-stage.env-sha256"]) == 64
    assert labels_for(env={"RANK": "0", "WORLD_SIZE": "2"}) == labels_for()      # values compared as text
    with pytest.raises(AnsibleFilterError, match="missing files"):
        lane.dgx_engine_labels({k: 1 for k in ("lane", "lane_hosts", "rank", "world_size", "port", "run_id",
                                               "image", "image_id", "command", "env", "mounts", "devices")})


def test_no_reasons_when_the_running_container_is_what_would_start():
    desired = labels_for()
    own = container(ID1, "e1", dict(desired, **{"dgx-stage.run-id": "an-earlier-run"}), env={"RANK": "0"},
                    wanted={"RANK": "0", "WORLD_SIZE": "2"})
    assert lane.dgx_restart_reasons(own, desired) == []


@pytest.mark.parametrize("change, reason", [
    ({"files": "2" * 64}, "bound files changed (a verify repair, re-stage or prune: new or missing inodes)"),
    ({"mounts": "n" * 64}, "mounts changed"),
    ({"image_id": "e" * 64}, "image rebuilt or re-pulled (id ffffffffffff -> eeeeeeeeeeee)"),
    ({"image": "engine:2"}, "image engine:1 -> engine:2"),
    ({"command": ["serve"]}, "command changed"),
    ({"devices": ["nvidia.com/gpu=all"]}, "GPU devices changed"),
    ({"port": 8001}, "port 8000 -> 8001"),
    ({"lane_hosts": ["dgx1", "dgx3"]}, "lane hosts dgx1,dgx2 -> dgx1,dgx3"),
])
def test_each_aspect_gives_its_reason(change, reason):
    own = container(ID1, "e1", labels_for())
    assert lane.dgx_restart_reasons(own, labels_for(**change)) == [reason]


def test_env_reasons_name_the_variables_when_the_runtime_shows_them():
    running = {"RANK": "0", "WORLD_SIZE": "2", "PATH": "/bin"}
    env = {"RANK": "0", "WORLD_SIZE": "2", "DOUBLE_KNOB": "1"}
    own = container(ID1, "e1", labels_for(), env=running, wanted=env)
    assert lane.dgx_restart_reasons(own, labels_for(env=env)) == ["env changed (DOUBLE_KNOB)"]
    own = container(ID1, "e1", labels_for(), env=running, wanted={"RANK": "0"})
    assert lane.dgx_restart_reasons(own, labels_for(env={"RANK": 0})) == ["env changed (a variable removed)"]
    docker_own = dict(own, env_changed=None)
    assert lane.dgx_restart_reasons(docker_own, labels_for(env=env)) == ["env changed"]


def test_state_image_strays_and_the_dry_run_give_reasons():
    desired = labels_for()
    assert lane.dgx_restart_reasons(None, desired) == ["container missing"]
    dead = container(ID1, "e1", desired, running=False, exit_code=3)
    assert lane.dgx_restart_reasons(dead, desired) == ["container exited (exit code 3)"]
    old = container(ID1, "e1", {"dgx-stage.mounts-sha256": "m" * 64})
    assert lane.dgx_restart_reasons(old, desired) == [
        "the container predates the lane labels (started by an earlier dgx-stage)"]
    own = container(ID1, "e1", desired)
    # A missing image (check mode with engine_pull=missing): said once, its id not compared.
    assert lane.dgx_restart_reasons(own, labels_for(image_id=""), image_present=False, pull="missing") == [
        "image engine:1 is not on this host (engine_pull=missing)"]
    assert lane.dgx_restart_reasons(own, desired, dry_run_changed=True) == [
        "the runtime would recreate it (a container setting changed)"]
    stray = {"why": "x holds the engine name e1 (not started by dgx-stage)"}
    assert lane.dgx_restart_reasons(None, desired, strays=[stray]) == [
        "x holds the engine name e1 (not started by dgx-stage): it is stopped first", "container missing"]


def test_the_survey_tells_this_lanes_containers_from_strays():
    mine = container(ID1, "e1", labels_for())
    other_rank = container(ID2, "e2", labels_for(rank=1))
    survey = lane.dgx_lane_survey([mine, other_rank], "e1", "exl3_2x", ["dgx1", "dgx2"], ["e1", "e2"], "dgx1", 8000,
                                  [{"pid": 5, "command": "python3", "container_id": ID1}])
    assert survey == {"own": mine, "run_id": "20261130T204512Z-3fa2", "strays": [], "worlds": []}
    # An unlabelled container of an earlier dgx-stage under the engine name is ours (it restarts, not refused).
    legacy = container(ID1, "e1", {"dgx-stage.mounts-sha256": "m" * 64})
    survey = lane.dgx_lane_survey([legacy], "e1", "exl3_2x", ["dgx1", "dgx2"], ["e1", "e2"], "dgx1")
    assert survey["own"] == legacy and survey["run_id"] == "" and survey["strays"] == []


def test_strays_hold_the_name_or_the_port():
    foreign = container(ID1, "e1", {"maintainer": "someone"})
    other_lane = container(ID2, "e2", labels_for("sglang_4x", ("dgx1", "dgx2", "dgx3", "dgx4"), rank=1))
    on_port = container(ID3, "old-engine", None)
    holders = [{"pid": 7, "command": "python3", "container_id": ID3},
               {"pid": 8, "command": "nc", "container_id": ""},
               {"pid": 9, "command": "dockerd-thing", "container_id": "d" * 64}]
    survey = lane.dgx_lane_survey([foreign, other_lane, on_port], "e1", "exl3_2x", ["dgx1", "dgx2"], ["e1", "e2"],
                                  "dgx1", 8000, holders)
    assert survey["own"] is None and survey["run_id"] == ""
    lines = lane.dgx_stray_lines(survey["strays"])
    assert lines == [
        "dgx1: e1 holds the engine name e1 (not started by dgx-stage)",
        "dgx1: old-engine (not started by dgx-stage) listens on port 8000",
        "dgx1: container dddddddddddd of another runtime listens on port 8000 (not ours to stop: stop it yourself)",
        "dgx1: host process pid 8 (nc) listens on port 8000 (not ours to stop: stop it yourself)"]
    assert [s["stoppable"] for s in survey["strays"]] == [True, True, False, False]
    # dgx2's engine name held by a rank of another lane: a stray, and its world is remembered.
    survey = lane.dgx_lane_survey([other_lane], "e2", "exl3_2x", ["dgx1", "dgx2"], ["e1", "e2"], "dgx2")
    assert lane.dgx_stray_lines(survey["strays"]) == [
        "dgx2: e2 holds the engine name e2 (an engine of lane sglang_4x, rank 1 of dgx1,dgx2,dgx3,dgx4)"]
    assert survey["worlds"] == [{"lane": "sglang_4x", "lane_hosts": "dgx1,dgx2,dgx3,dgx4"}]


def test_an_earlier_engine_of_this_rank_under_another_name_is_a_stray():
    """engine_name (and port) changed on a running lane: the old container still runs as this host's rank
    (its labels say so) and holds the GPUs; it is a stray, not forgotten. Another rank's engine (in a test
    lane sharing one runtime) and a stopped old one are not."""
    renamed = container(ID2, "old-e2", labels_for(rank=1))
    other_rank = container(ID1, "e1", labels_for(rank=0))
    stopped = container(ID3, "older-e2", labels_for(rank=1), running=False)
    survey = lane.dgx_lane_survey([renamed, other_rank, stopped], "e2", "exl3_2x", ["dgx1", "dgx2"], ["e1", "e2"],
                                  "dgx2", 8001)
    assert survey["own"] is None
    assert lane.dgx_stray_lines(survey["strays"]) == [
        "dgx2: old-e2 is still running as this host's engine (an engine of lane exl3_2x, rank 1 of dgx1,dgx2)"]
    assert survey["strays"][0]["stoppable"] is True
    assert lane.dgx_lane_survey([renamed], "e1", "exl3_2x", ["dgx1", "dgx2"], ["e1", "e2"], "dgx1")["strays"] == []


def test_a_name_holder_on_the_port_is_one_stray():
    foreign = container(ID1, "e1", None)
    survey = lane.dgx_lane_survey([foreign], "e1", "exl3_2x", ["dgx1"], ["e1"], "dgx1", 8000,
                                  [{"pid": 7, "command": "python3", "container_id": ID1}])
    assert lane.dgx_stray_lines(survey["strays"]) == [
        "dgx1: e1 holds the engine name e1 (not started by dgx-stage) listens on port 8000"]


def test_hosts_that_left_the_lane_come_from_earlier_worlds():
    surveys = [{"worlds": [{"lane": "sglang_4x", "lane_hosts": "dgx1,dgx2,dgx3,dgx4"}]},
               {"worlds": [{"lane": "sglang_4x", "lane_hosts": "dgx1,dgx2,dgx3,dgx4"},
                           {"lane": "exl3_2x", "lane_hosts": "dgx1,dgx2,gone"}]},
               None]
    assert lane.dgx_left_hosts(surveys, ["dgx1", "dgx2"], ["dgx1", "dgx2", "dgx3", "dgx4"]) == [
        {"host": "dgx3", "lane": "sglang_4x", "lane_hosts": "dgx1,dgx2,dgx3,dgx4"},
        {"host": "dgx4", "lane": "sglang_4x", "lane_hosts": "dgx1,dgx2,dgx3,dgx4"}]
    # The same lane with fewer hosts: its own container's world names the host that left.
    own = container(ID1, "e1", labels_for(hosts=("dgx1", "dgx2", "dgx3")))
    survey = lane.dgx_lane_survey([own], "e1", "exl3_2x", ["dgx1", "dgx2"], ["e1", "e2"], "dgx1")
    assert survey["own"] == own
    assert lane.dgx_left_hosts([survey], ["dgx1", "dgx2"], ["dgx1", "dgx2", "dgx3"]) == [
        {"host": "dgx3", "lane": "exl3_2x", "lane_hosts": "dgx1,dgx2,dgx3"}]


def test_left_strays_are_that_hosts_rank_of_the_dead_world():
    world = ("dgx1", "dgx2", "dgx3", "dgx4")
    item = {"host": "dgx3", "lane": "sglang_4x", "lane_hosts": ",".join(world)}
    listing = [podman_info(ID1, "e3", labels_for("sglang_4x", world, rank=2)),
               podman_info(ID2, "e1", labels_for("sglang_4x", world, rank=0)),        # another host's rank
               podman_info(ID3, "e9", labels_for("sglang_4x", world, rank=2), running=False),
               podman_info("d" * 64, "x", labels_for("exl3_2x", ("dgx3",), rank=0))]   # another world
    podman = {"results": [{"item": item, "runtime": "podman", "containers": [container_facts(c) for c in listing]},
                          {"item": dict(item, host="dgx4"), "unreachable": True},
                          {"item": dict(item, host="dgx5"), "skipped": True}]}
    found = lane.dgx_left_strays(podman)
    assert found["unchecked"] == ["dgx4"]
    assert found["strays"] == [{"host": "dgx3", "id": ID1, "name": "e3", "stoppable": True, "runtime": "podman",
                                "why": "e3 on dgx3, no longer in the lane, is rank 2 of lane sglang_4x "
                                       "(dgx1,dgx2,dgx3,dgx4): a dead world"}]
    assert lane.dgx_left_strays({}) == {"strays": [], "unchecked": []}


def test_the_lane_restarts_as_one_or_the_one_rank_named():
    plans = [{"host": "dgx2", "rank": 1, "reasons": ["env changed (X)"]}, {"host": "dgx1", "rank": 0, "reasons": []}]
    plan = lane.dgx_lane_plan(plans)
    assert plan == {"restart": ["dgx1", "dgx2"], "held": {},
                    "reasons": {"dgx1": ["the lane restarts as one (dgx2: env changed (X))"],
                                "dgx2": ["env changed (X)"]}}
    quiet = [dict(p, reasons=[]) for p in plans]
    assert plan["held"] == {}
    assert lane.dgx_lane_plan(quiet) == {"restart": [], "reasons": {}, "held": {}}
    assert lane.dgx_lane_plan(quiet, "dgx2") == {"restart": ["dgx2"], "held": {},
                                                  "reasons": {"dgx2": ["forced by engine_restart_only"]}}
    # A forced single-rank restart leaves the other ranks' own reasons undone: they are named, not lost.
    assert lane.dgx_lane_plan(plans, "dgx1") == {"restart": ["dgx1"], "held": {"dgx2": ["env changed (X)"]},
                                                 "reasons": {"dgx1": ["forced by engine_restart_only"]}}
    with pytest.raises(AnsibleFilterError, match="not a rank in play"):
        lane.dgx_lane_plan(quiet, "dgx9")


def test_the_container_task_never_pulls():
    """engine_pull governs the plan's explicit pull only: the container tasks (plan, remove, start) never
    contact a registry, whatever engine_pull says."""
    with open(os.path.join(REPO_ROOT, "roles", "engine", "tasks", "container.yml")) as handle:
        tasks = yaml.safe_load(handle)
    tasks = [t for task in tasks for t in task.get("block", [task])]
    modules = [t for t in tasks if "community.docker.docker_container" in t or "containers.podman.podman_container" in t]
    assert len(modules) == 2
    for task in modules:
        args = task.get("community.docker.docker_container") or task.get("containers.podman.podman_container")
        assert args["pull"] == "never"


def test_bind_problems_name_a_bound_file_missing_or_not_a_file_and_a_ref_moved_past_the_manifest(tmp_path):
    from ansible.module_utils.dgx_nodestate import bind_problems

    repo = tmp_path / "hub" / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "blobs" / "aa").write_bytes(b"x")
    (repo / "blobs" / "bb").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    nas_repo = tmp_path / "nas" / "hub" / "models--org--m"
    nas_snapshot = nas_repo / "snapshots" / ("c" * 40)
    (nas_snapshot / "page15").mkdir(parents=True)
    (nas_repo / "blobs").mkdir()
    (nas_repo / "blobs" / "ee").write_bytes(b"x")
    (nas_snapshot / "e.safetensors").symlink_to("../../blobs/ee")             # the hub layout: bound as it is
    manifest = {"repos": [{"repo_id": "org/m", "revision": "main", "commit": "c" * 40,
                           "local_snapshot": str(repo / "snapshots" / ("c" * 40)), "nas_snapshot": str(nas_snapshot)}],
                "mounts": [{"source": str(repo / "blobs" / name), "target": "/hub/x/" + name, "read_only": True,
                            "origin": "local"} for name in ("aa", "bb", "gone")]
                + [{"source": str(nas_snapshot / name), "target": "/hub/y/" + name, "read_only": True,
                    "origin": "nas"} for name in ("e.safetensors", "page15")]}
    assert bind_problems(manifest) == ["%s is not a regular file" % (repo / "blobs" / "bb"),
                                       "%s is missing" % (repo / "blobs" / "gone")]
    (repo / "refs" / "main").write_text("d" * 40)
    assert bind_problems(manifest)[-1] == (
        "org/m@main: the manifest binds commit %s but the local hub's ref %s names %s now (staged since the manifest "
        "was written)" % ("c" * 40, repo / "refs" / "main", "d" * 40))
    # A snapshot written with a trailing slash is the same folder: the moved ref is still seen.
    manifest["repos"][0]["local_snapshot"] += "/"
    assert "names %s now" % ("d" * 40) in bind_problems(manifest)[-1]
    # A manifest not shaped as engine_manifest writes it is one problem, not a crash.
    for broken, says in (([], "not a JSON object"), ({"repos": ["org/m"], "mounts": []}, "a repo is not an object"),
                         ({"repos": [], "mounts": {"a": 1}}, "no list of repos and of mounts"),
                         ({"repos": [], "mounts": [{"origin": "local"}]}, "mount 0 has no text source and target"),
                         ({"repos": [{"repo_id": "org/m", "revision": 1, "commit": "c", "local_snapshot": "/s"}],
                           "mounts": []},
                          "org/m: the manifest's revision, commit or snapshot is not text")):
        assert len(bind_problems(broken)) == 1 and says in bind_problems(broken)[0], broken


def test_bind_problems_name_a_local_blob_swapped_for_a_link_and_a_nas_source_that_does_not_end_in_a_nas_file(
        tmp_path):
    """A staged blob is a regular file: a link put in its place (to anything) is refused. A NAS snapshot file is a
    link into the repo's blobs by design: what it ends at must be a readable regular file inside the NAS hub."""
    from ansible.module_utils.dgx_nodestate import bind_problems

    local_blobs = tmp_path / "hub" / "models--org--m" / "blobs"
    local_blobs.mkdir(parents=True)
    (tmp_path / "elsewhere").write_bytes(b"other bytes")
    (local_blobs / "aa").symlink_to(tmp_path / "elsewhere")
    nas_repo = tmp_path / "nas" / "hub" / "models--org--m"
    nas_snapshot = nas_repo / "snapshots" / ("c" * 40)
    nas_snapshot.mkdir(parents=True)
    (nas_repo / "blobs").mkdir()
    os.mkfifo(str(nas_repo / "blobs" / "ee"))
    (nas_snapshot / "good").symlink_to("../../blobs/ff")
    (nas_repo / "blobs" / "ff").write_bytes(b"x")
    (nas_snapshot / "fifo").symlink_to("../../blobs/ee")
    (nas_snapshot / "gone").symlink_to("../../blobs/00")
    (nas_snapshot / "escapes").symlink_to(tmp_path / "elsewhere")
    stray = tmp_path / "nas" / "stray"
    stray.write_bytes(b"x")
    manifest = {"repos": [{"repo_id": "org/m", "nas_snapshot": str(nas_snapshot),
                           "local_snapshot": str(local_blobs.parent / "snapshots" / ("c" * 40))}],
                "mounts": [{"source": str(local_blobs / "aa"), "target": "/hub/a", "origin": "local"}]
                + [{"source": str(path), "target": "/hub/" + path.name, "origin": "nas"}
                   for path in (nas_snapshot / "good", nas_snapshot / "fifo", nas_snapshot / "gone",
                                nas_snapshot / "escapes", stray)]}
    assert bind_problems(manifest) == [
        "%s is a symlink, not a regular file" % (local_blobs / "aa"),
        "NAS source %s resolves to %s, outside the NAS hub %s" % (
            nas_snapshot / "escapes", tmp_path / "elsewhere", os.path.realpath(str(tmp_path / "nas" / "hub"))),
        "NAS source %s is not a regular file" % (nas_snapshot / "fifo"),
        "NAS source %s is missing" % (nas_snapshot / "gone"),
        "NAS source %s is in no NAS snapshot of the manifest's repos" % stray]


def _one_blob_manifest(tmp_path):
    repo = tmp_path / "hub" / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "blobs" / "aa").write_bytes(b"staged")
    (repo / "refs" / "main").write_text("c" * 40)
    manifest = {"repos": [{"repo_id": "org/m", "revision": "main", "commit": "c" * 40,
                           "local_snapshot": str(repo / "snapshots" / ("c" * 40))}],
                "mounts": [{"source": str(repo / "blobs" / "aa"), "target": "/hub/aa", "read_only": True,
                            "origin": "local"}]}
    return repo, manifest


@pytest.mark.parametrize("swapped", ["blobs", "repo folder"])
def test_bind_problems_name_a_folder_on_the_way_to_a_local_source_swapped_for_a_link(tmp_path, swapped):
    """A staged file's last component alone is not enough: a folder on its way (blobs/, the repo folder) renamed
    aside and a link to another folder with a same-named file put in its place would bind other bytes."""
    from ansible.module_utils.dgx_nodestate import bind_problems

    repo, manifest = _one_blob_manifest(tmp_path)
    assert bind_problems(manifest) == []
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "blobs").mkdir(parents=True)
    (elsewhere / "blobs" / "aa").write_bytes(b"other")
    (elsewhere / "refs").mkdir()
    (elsewhere / "refs" / "main").write_text("c" * 40)
    moved = repo / "blobs" if swapped == "blobs" else repo
    os.rename(str(moved), str(moved) + ".aside")
    os.symlink(str(elsewhere / "blobs" if swapped == "blobs" else elsewhere), str(moved))
    problems = bind_problems(manifest)
    assert problems and problems[0].startswith(
        "%s has a symlink or a mount on the way: %s is a symlink to " % (repo / "blobs" / "aa", moved)), problems


def test_bind_problems_name_a_local_source_outside_the_manifest_s_local_repos(tmp_path):
    from ansible.module_utils.dgx_nodestate import bind_problems

    repo, manifest = _one_blob_manifest(tmp_path)
    (tmp_path / "hub" / "stray").write_bytes(b"x")
    manifest["mounts"][0]["source"] = str(tmp_path / "hub" / "stray")
    assert bind_problems(manifest) == [
        "%s is in no local repo folder of the manifest's repos (%s): a local bind is a staged file"
        % (tmp_path / "hub" / "stray", repo)]


@pytest.mark.parametrize("ref", ["a folder", "a symlink", "missing"])
def test_a_local_ref_that_cannot_be_read_is_a_bind_problem_naming_it_and_a_missing_one_is_none(tmp_path, ref):
    """A ref that cannot be read cannot say the manifest's commit is still the one staged; no ref at all means
    the manifest took the NAS's commit (nothing staged, or bound from the NAS)."""
    from ansible.module_utils.dgx_nodestate import bind_problems

    repo, manifest = _one_blob_manifest(tmp_path)
    main = repo / "refs" / "main"
    main.unlink()
    if ref == "a folder":
        main.mkdir()
    elif ref == "a symlink":
        (tmp_path / "other-ref").write_text("c" * 40)
        main.symlink_to(tmp_path / "other-ref")
    says = {"a folder": "is not a regular file", "a symlink": "is a symlink, not a regular file"}
    assert bind_problems(manifest) == ([] if ref == "missing" else [
        "org/m@main: the local hub's ref %s %s, so whether the manifest's commit %s is still the one staged cannot "
        "be told; make it a file naming the commit (stage again)" % (main, says[ref], "c" * 40)])


def test_a_nul_byte_in_a_manifest_path_is_a_bind_problem_naming_the_mount_not_a_crash(tmp_path):
    import modrun

    repo, manifest = _one_blob_manifest(tmp_path)
    manifest["repos"][0]["revision"] = "ma\x00in"
    manifest["mounts"].append({"source": "/hub/a\x00b", "target": "/hub/b", "read_only": True, "origin": "local"})
    manifest["mounts"].append({"source": "/nas/a\x00b", "target": "/hub/c", "read_only": True, "origin": "nas"})
    result = modrun.run_main("engine_node_state", {"manifest_content": manifest})
    assert result["bind_problems"] == [
        "mount %d of the manifest: its source '/%s/a\\x00b' contains a NUL (U+0000): control characters are refused "
        "in bind paths (mount tables, logs and CSV mount specs rewrite them); rename the file" % (index, top)
        for index, top in ((1, "hub"), (2, "nas"))] + [
        "org/m@ma\x00in: the local hub's ref %s cannot be opened (a NUL byte in the path), so whether the "
        "manifest's commit %s is still the one staged cannot be told; make it a file naming the commit (stage again)"
        % (repo / "refs" / "ma\x00in", "c" * 40)]
    assert result["files"] == 2 and not result.get("failed")


def test_a_runtime_message_is_shown_without_the_secret_values_it_quotes():
    secrets = lane.dgx_secret_values({"HF_TOKEN": "hf_abcdef123456", "MODEL_PATH": "/models/m", "GPUS": "0,1"},
                                     ["python3", "-m", "serve", "--api-key", "sk-4f9", "--tp", "8"])
    message = ('Error: cannot start python3: env HF_TOKEN=hf_abcdef123456 invalid; {"Env": ["X=sk-4f9\\"]}; '
               "--api-key 'sk-4f9' at %2Fmodels%2Fm, tp 8 on GPUs 0,1")
    assert lane.dgx_redact(message, secrets) == (
        'Error: cannot start python3: env HF_TOKEN=<hidden> invalid; {"Env": ["X=<hidden>\\"]}; '
        "--api-key '<hidden>' at <hidden>, tp 8 on GPUs 0,1")
    assert lane.dgx_redact(None, secrets) == ""


def test_secret_values_are_engine_envs_values_and_the_commands_secret_flags_in_every_quoted_form():
    values = lane.dgx_secret_values({"HF_TOKEN": 'hf_a"bc\\def', "DEBUG": "1"},
                                    ["serve", "--api-key=k3y-one", "--max-total-tokens", "512",
                                     "bash -c 'serve --hf-token tok-two'"])
    assert {'hf_a"bc\\def', 'hf_a\\"bc\\\\def', "hf_a%22bc%5Cdef", "k3y-one", "tok-two"} <= set(values)
    # Settings stay readable: a short value, the flags themselves, a tokens count.
    assert not {"1", "serve", "--api-key", "512", "--max-total-tokens"} & set(values)
    assert values == sorted(values, key=lambda v: (-len(v), v))      # the longest is replaced first
    with pytest.raises(AnsibleFilterError, match="HF_TOKEN: a credential of 3 characters"):
        lane.dgx_secret_values({"HF_TOKEN": "abc"})
    with pytest.raises(AnsibleFilterError, match="engine_command"):
        lane.dgx_secret_values({}, ["--api-key", "x"])
    with pytest.raises(AnsibleFilterError, match="HF_TOKEN: a credential of 3 characters"):
        lane.dgx_secret_values({"HF_TOKEN": "abc\n"})


@pytest.mark.parametrize("env, command, message, secret", [
    ({}, ["bash", "-c", "export HF_TOKEN=hf_realtoken123; exec serve"], "hf_token='hf_realtoken123'", "hf_realtoken123"),
    ({}, ["sh", "-c", "serve --api-key sk-live-9999&&true"], "api_key='sk-live-9999'", "sk-live-9999"),
    ({}, ["serve", "--apikey", "sk-live-7777"], "ServerArgs(apikey='sk-live-7777')", "sk-live-7777"),
    ({}, ["serve", "--config", '{"api_key": "sk-live-5555", "tp": 8}'], "config={'api_key': 'sk-live-5555'}",
     "sk-live-5555"),
    ({"PROXY_PASSWORD": "p@ss w/rd!"}, [], "proxy=http://u:p%40ss+w%2Frd%21@proxy", "p%40ss+w%2Frd%21"),
    ({"PROXY_PASSWORD": "p@ss/wrd!"}, [], "proxy=http://u:p%40ss/wrd%21@proxy", "p%40ss/wrd%21"),
    ({"HF_TOKEN": "hf_a/b@c1234"}, [], "url=hf_a%2fb%40c1234", "hf_a%2fb%40c1234"),
])
def test_a_secret_is_hidden_whatever_shell_operator_json_or_url_form_carries_it(env, command, message, secret):
    shown = lane.dgx_redact(message, lane.dgx_secret_values(env, command))
    assert secret in message and secret not in shown and "<hidden>" in shown, shown


@pytest.mark.parametrize("name", ["--api-key", "--hf-token", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY",
                                  "--apikey", "--pass", "--pw", "--ssl-keyfile-password", "Authorization", "api_key"])
def test_a_name_whose_last_word_is_a_credential_word_is_secret(name):
    assert lane_secrets.secret_name(name)


@pytest.mark.parametrize("command", [
    ["serve", "--eos-token-id", "2"], ["serve", "--pad-token-id", "0"], ["serve", "--token-budget", "64"],
    ["serve", "--monkey", "1"], ["serve", "--hotkey", "a"], ["serve", "--oauth", "1"],
    ["serve", "--hf-overrides", '{"num_key_value_heads": 8}'],
    ["serve", "--override-generation-config", '{"bos_token_id": 0}'],
    ["serve", "--override-tokenizer-config", '{"bos_token": "<s>"}'],
    ["serve", "--disable-auth", "--tp", "8"], ["sh", "-c", "serve --no-auth && true"],
    ["docker", "run", "-u", "1000:1000", "img"],
])
def test_settings_named_after_tokens_or_keys_are_neither_refused_nor_hidden(command):
    assert lane.dgx_secret_values({}, command) == []


@pytest.mark.parametrize("env, command, message", [
    ({}, ["serve", "--config", '{"api_key": ["sk-live-1111"]}'], "keys=['sk-live-1111']"),
    ({}, ["serve", '--hf-overrides={"api_key": "sk-live-2222"}'], "api_key='sk-live-2222'"),
    ({}, ["serve", "--headers", '{"Authorization": "Bearer sk-live-3333"}'], "bad token sk-live-3333"),
    ({}, ["serve", "--header", "Authorization: Bearer sk-live-4444"], "bad token sk-live-4444"),
    ({}, ["bash", "-c", "curl -H 'Authorization: Basic dXNlcjpwYXNz' http://x"], "creds dXNlcjpwYXNz"),
    ({}, ["bash", "-c", "curl -u admin:sk-live-5555 http://x"], "user admin:sk-live-5555"),
    ({}, ["serve", "--remote", "https://user:sk-live-6666@host/x"], "password sk-live-6666 refused"),
    ({"PROXY": "http://me:sk-live-7777@proxy:3128"}, [], "login sk-live-7777 failed"),
    ({}, ["serve", "--pass", "sk-live-8888"], "pass=sk-live-8888"),
    ({}, ["serve", "--pw", "sk-live-9999"], "pw=sk-live-9999"),
    ({}, ["curl", "--header=Authorization: Bearer sk-live-4545"], "bad token sk-live-4545"),
    # A value read from a YAML block or a file keeps its newline; a program shows it stripped.
    ({"HF_TOKEN": "sk-live-1212\n"}, [], "invalid token sk-live-1212."),
    ({}, ["serve", "--api-key", " sk-live-2121\n"], "api_key='sk-live-2121'"),
])
def test_a_secret_in_a_json_list_a_header_a_user_flag_or_a_url_is_hidden(env, command, message):
    shown = lane.dgx_redact(message, lane.dgx_secret_values(env, command))
    assert "sk-live-" not in shown and "dXNlcjpwYXNz" not in shown and "<hidden>" in shown, shown


def test_overlapping_secrets_leave_no_piece_of_either():
    secrets = lane.dgx_secret_values({"A_TOKEN": "abcdXYZ", "B_TOKEN": "XYZ123"})
    assert lane.dgx_redact("joined=abcdXYZ123 and XYZ123abcdXYZ", secrets) == "joined=<hidden> and <hidden>"


def test_a_lane_host_that_cannot_be_reached_for_its_strays_fails():
    # Else the rank restarts its engine beside the stray it could not stop.
    outcomes = lane.dgx_stop_outcomes(
        [{"results": [{"item": {"name": "old", "host": "dgx1"}, "unreachable": True, "msg": "ssh: timed out"},
                      {"item": {"name": "rank3", "host": "dgx3"}, "unreachable": True, "msg": "ssh: timed out"}]}],
        ["dgx0", "dgx1"])
    assert outcomes["failed"] == ["could not stop old on dgx1: dgx1 could not be reached (ssh: timed out)"]
    assert [line.split(" was not")[0] for line in outcomes["unreached"]] == ["rank3 on dgx3"]

def test_the_strays_that_could_not_be_stopped_are_said_one_line_each():
    outcomes = lane.dgx_stop_outcomes([
        {"results": [{"item": {"name": "old", "host": "dgx1"}, "changed": True},
                     {"item": {"name": "odd", "host": "dgx1"}, "failed": True, "msg": "no such container"}]},
        {"skipped": True},
        {"results": [{"item": {"name": "rank3", "host": "dgx3"}, "unreachable": True, "msg": "ssh: timed out"}]},
        {}])
    assert outcomes == {"failed": ["could not stop odd on dgx1: no such container"],
                        "unreached": ["rank3 on dgx3 was not stopped: dgx3 could not be reached (ssh: timed out); "
                                      "stop it there when it is back"]}


