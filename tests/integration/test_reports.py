"""The host reports through ansible-playbook (DESIGN "Host reports"): every run writes
<host>-<run_id>.json and updates <host>.json, with identity, status, tags, the failed task, per-play
timestamps and the stage pass's bytes; a failed host says so at once; a --tags verify run keeps the last
stage pass; a --check run keeps the last real results."""
import json
import os
import re
import time

from conftest import failures, run_playbook
from hubgen import DRAFTER_REPO, MAIN_REPO

STAGE_TAGS = "preflight,stage,verify"
RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{4}$")
ISO = "%Y-%m-%dT%H:%M:%SZ"


def write_lane(tmp_path, nas, hosts, **extra):
    """A local lane: each host a local-connection host with its own hub_local_root (<tmp>/<host>/hub)."""
    members = {}
    for name in hosts:
        members[name] = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                         "hub_local_root": str(tmp_path / name / "hub")}
    group_vars = {"lane": "exl3_2x", "hub_nas_root": nas, "engine_enabled": False,
                  "stage_report_dir": str(tmp_path / "reports"),
                  "stage_repos": [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}, {"repo_id": DRAFTER_REPO}]}
    group_vars.update(extra)
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"all": {"children": {"exl3_2x": {"hosts": members}}, "vars": group_vars}}))
    return str(path)


def run(tmp_path, inventory, *args, tags=STAGE_TAGS):
    """One ansible-playbook run: (exit code, parsed output, (UTC second before, UTC second after))."""
    before = time.strftime(ISO, time.gmtime())
    code, data = run_playbook(tmp_path, inventory, "--tags", tags, *args)
    return code, data, (before, time.strftime(ISO, time.gmtime()))


def staged_dgx1(work, nas):
    """staged_hub's one-host lane dgx1 with both repos (write_lane's defaults)."""
    return write_lane(work, nas["hub"], ["dgx1"])


def staged_dgx1_drafter(work, nas):
    """staged_hub's one-host lane dgx1 with the drafter only, writing its metrics textfile in <dir>/metrics (the
    node_metrics tests read it; the other users rewrite the inventory without it)."""
    (work / "metrics").mkdir()
    return write_lane(work, nas["hub"], ["dgx1"], stage_metrics_dir=str(work / "metrics"),
                      stage_repos=[{"repo_id": DRAFTER_REPO}])


def staged_rank0_rank1(work, nas):
    """staged_hub's two-host lane rank0, rank1 with both repos."""
    return write_lane(work, nas["hub"], ["rank0", "rank1"])


def reports(tmp_path):
    """{file name: parsed report} of the report directory."""
    directory = tmp_path / "reports"
    return dict((p.name, json.loads(p.read_text())) for p in sorted(directory.iterdir()))


def staged_bytes(local_hub):
    """Bytes of the regular files staged under a local hub's repos: the blobs and real snapshot files."""
    total = 0
    for folder in os.listdir(local_hub):
        for sub in ("blobs", "snapshots"):
            for dirpath, _dirs, files in os.walk(os.path.join(local_hub, folder, sub)):
                total += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in files
                             if not os.path.islink(os.path.join(dirpath, f)))
    return total


def assert_in_order(*stamps):
    """ISO 8601 UTC stamps (to the second), each no later than the next."""
    for stamp in stamps:
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", stamp), stamp
    assert list(stamps) == sorted(stamps), stamps


def flip_nas_byte(nas_hub, path):
    """Bit rot in the middle of a NAS file (same size and mtime); the NAS is frozen again after."""
    real = os.path.realpath(os.path.join(nas_hub.snapshot_dir(), path))
    st = os.stat(real)
    nas_hub.thaw()
    try:
        with open(real, "r+b") as handle:
            handle.seek(st.st_size // 2)
            byte = handle.read(1)
            handle.seek(st.st_size // 2)
            handle.write(bytes([byte[0] ^ 0xFF]))
        os.utime(real, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        nas_hub.freeze()


# --- identity, history and the stage pass ---------------------------------------------------------------

def test_two_runs_of_a_two_host_lane_leave_two_history_files_per_host_and_a_correct_latest_view(staged_hub):
    hosts = ["rank0", "rank1"]
    # The first run: staged_hub's (once a session; its files restored for this test, its output and times kept).
    lane = staged_hub("rank0-rank1", staged_rank0_rank1)
    tmp_path, nas_hub, inventory = lane["dir"], lane["nas"], lane["inventory"]
    code, data, (before, after) = lane["code"], lane["data"], lane["times"]
    assert code == 0, failures(data)
    first = reports(tmp_path)
    run_ids = set(first[h + ".json"]["run_id"] for h in hosts)
    assert len(run_ids) == 1, run_ids                       # one id and one start for the whole run
    run_id = run_ids.pop()
    assert RUN_ID.match(run_id) and sorted(first) == sorted([h + ".json" for h in hosts]
                                                            + ["%s-%s.json" % (h, run_id) for h in hosts])
    assert len(set(first[h + ".json"]["started"] for h in hosts)) == 1
    for rank, host in enumerate(hosts):
        latest, history = first[host + ".json"], first["%s-%s.json" % (host, run_id)]
        assert (latest["host"], latest["rank"], latest["world_size"], latest["lane"]) == (host, rank, 2, "exl3_2x")
        assert latest["status"] == "ok" and latest["check_mode"] is False
        assert latest["tags"] == sorted(STAGE_TAGS.split(","))
        assert "failed_task" not in latest
        assert list(latest["plays"]) == ["preflight", "stage", "verify"]
        assert_in_order(before, latest["started"], latest["plays"]["preflight"]["started"], latest["stage_started"],
                        latest["stage_finished"], latest["plays"]["verify"]["started"], latest["finished"], after)
        # The stage pass read every staged byte from the NAS (a fresh node), none from a peer.
        local = str(tmp_path / host / "hub")
        assert latest["bytes_from_nas"] == staged_bytes(local) > 0 and latest["bytes_from_peers"] == 0
        assert latest["bytes_from_nas"] == sum(r["bytes_copied"] for r in latest["passes"]["stage"])
        # Every key the older readers use is still there.
        assert [r["repo_id"] for r in latest["passes"]["verify"]] == [MAIN_REPO, DRAFTER_REPO]
        assert latest["weights"][0]["shards"] == nas_hub["n_shards"] and latest["hub_local_root"] == local
        # This run's file is this run's view: the same run, the same passes.
        for key in ("run_id", "started", "finished", "status", "tags", "plays", "passes", "weights",
                    "stage_started", "stage_finished", "bytes_from_nas"):
            assert history[key] == latest[key], key

    # Second run: nothing to copy. Its own file, and a latest view that is the second run.
    code, data, _times = run(tmp_path, inventory)
    assert code == 0, failures(data)
    second = reports(tmp_path)
    assert len(second) == 3 * len(hosts)
    run_id2 = second["rank0.json"]["run_id"]
    assert run_id2 != run_id and second["rank1.json"]["run_id"] == run_id2
    for host in hosts:
        latest = second[host + ".json"]
        # The latest view adds what outlives a run: the last real run and the NAS findings kept across runs.
        assert latest == dict(second["%s-%s.json" % (host, run_id2)], last_real_run=latest["last_real_run"],
                              nas_suspects={})
        assert latest["last_real_run"]["run_id"] == run_id2 and latest["status"] == "ok"
        assert latest["bytes_from_nas"] == 0 and latest["stage_started"] > first[host + ".json"]["stage_started"]
        assert second["%s-%s.json" % (host, run_id)] == first["%s-%s.json" % (host, run_id)]   # history kept


def test_a_verify_run_keeps_the_previous_stage_pass_with_its_timestamps(staged_hub):
    lane = staged_hub("dgx1", staged_dgx1)            # a good stage run of the lane
    tmp_path, inventory = lane["dir"], lane["inventory"]
    staged = reports(tmp_path)["dgx1.json"]
    code, data, _times = run(tmp_path, inventory, tags="verify")
    assert code == 0, failures(data)
    latest = reports(tmp_path)["dgx1.json"]
    assert latest["run_id"] != staged["run_id"] and latest["tags"] == ["verify"] and latest["status"] == "ok"
    # The stage (and preflight) pass of the first run, with its own run id, timestamps and bytes.
    for name in ("preflight", "stage"):
        assert latest["plays"][name] == staged["plays"][name] and latest["passes"][name] == staged["passes"][name]
    assert latest["plays"]["stage"]["run_id"] == staged["run_id"]
    assert (latest["stage_started"], latest["stage_finished"], latest["bytes_from_nas"]) == (
        staged["stage_started"], staged["stage_finished"], staged["bytes_from_nas"])
    # The verify pass is this run's.
    assert latest["plays"]["verify"]["run_id"] == latest["run_id"]
    assert latest["plays"]["verify"]["started"] > staged["plays"]["verify"]["finished"]
    # This run's own file: only verify ran.
    history = reports(tmp_path)["dgx1-%s.json" % latest["run_id"]]
    assert list(history["plays"]) == ["verify"] and list(history["passes"]) == ["verify"]
    assert history["stage_started"] is None and history["bytes_from_nas"] == 0


def test_a_check_run_marks_check_and_keeps_the_last_real_results(staged_hub):
    lane = staged_hub("dgx1", staged_dgx1)            # a good stage run of the lane
    tmp_path, inventory, nas_hub = lane["dir"], lane["inventory"], lane["nas"]
    real = reports(tmp_path)["dgx1.json"]
    # The drafter goes missing locally: the check run plans to copy it again, and copies nothing.
    drafter_dir = tmp_path / "dgx1" / "hub" / nas_hub["repos"][DRAFTER_REPO]["folder"]
    os.rename(str(drafter_dir), str(tmp_path / "drafter-aside"))
    code, data, _times = run(tmp_path, inventory, "--check")
    assert code == 0, failures(data)
    assert not drafter_dir.exists()
    latest = reports(tmp_path)["dgx1.json"]
    assert latest["status"] == "check" and latest["check_mode"] is True and latest["run_id"] != real["run_id"]
    for key in ("plays", "passes", "weights", "engine", "stage_started", "stage_finished", "bytes_from_nas",
                "last_real_run"):
        assert latest[key] == real[key], key
    assert latest["last_real_run"]["run_id"] == real["run_id"] and latest["last_real_run"]["status"] == "ok"
    plan = latest["check"]
    assert plan["run_id"] == latest["run_id"] and plan["status"] == "check"
    rows = dict((r["repo_id"], r) for r in plan["passes"]["stage"])
    assert rows[DRAFTER_REPO]["status"] == "check" and rows[DRAFTER_REPO]["bytes_copied"] > 0
    history = reports(tmp_path)["dgx1-%s.json" % latest["run_id"]]
    assert history["status"] == "check" and history["bytes_from_nas"] == 0 and history["passes"] == plan["passes"]


# --- failures ------------------------------------------------------------------------------------------------

def test_a_host_that_fails_in_stage_reports_failed_with_the_task_at_once(staged_hub):
    # Yesterday: only the drafter, a good run.
    lane = staged_hub("dgx1-drafter", staged_dgx1_drafter)
    tmp_path, nas_hub = lane["dir"], lane["nas"]
    good = reports(tmp_path)["dgx1.json"]
    # Today: the main repo too, with a NAS shard that no longer hashes to its name.
    shard = nas_hub["repos"][MAIN_REPO]["shards"][1]
    flip_nas_byte(nas_hub, shard)
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"])
    code, data, _times = run(tmp_path, inventory)
    assert code != 0 and data["stats"]["dgx1"]["failures"] == 1
    latest = reports(tmp_path)["dgx1.json"]
    assert latest["status"] == "failed" and latest["run_id"] != good["run_id"]
    assert latest["failed_play"] == "stage"
    assert latest["failed_task"].startswith("Mirror | Each repo from the NAS hub to the local hub, pass stage")
    assert shard in latest["failed_msg"] and nas_hub["repos"][MAIN_REPO]["files"][shard]["etag"] in latest["failed_msg"]
    assert latest["plays"]["stage"]["status"] == "failed" and latest["plays"]["stage"]["run_id"] == latest["run_id"]
    rows = dict((r["repo_id"], r) for r in latest["passes"]["stage"])
    assert rows[MAIN_REPO]["status"] == "failed" and rows[MAIN_REPO]["nas_corrupt"] == [shard]
    # Written right then: the verify play did not run for the host; yesterday's verify stays, marked as such.
    assert latest["plays"]["verify"]["run_id"] == good["run_id"]
    history = reports(tmp_path)["dgx1-%s.json" % latest["run_id"]]
    assert history["status"] == "failed" and "verify" not in history["plays"]
    assert reports(tmp_path)["dgx1-%s.json" % good["run_id"]]["status"] == "ok"


def test_a_host_that_fails_in_verify_reports_failed_with_the_task(staged_hub):
    """A weight blob replaced by its same-size sibling (stage_verify none): safetensors_check fails verify."""
    lane = staged_hub("dgx1", staged_dgx1)            # a good stage run of the lane
    tmp_path, nas_hub = lane["dir"], lane["nas"]
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], stage_verify="none")
    staged = reports(tmp_path)["dgx1.json"]
    repo = nas_hub["repos"][MAIN_REPO]
    path_a, path_b = repo["same_size_pairs"][0]
    blobs = tmp_path / "dgx1" / "hub" / repo["folder"] / "blobs"
    (blobs / repo["files"][path_a]["etag"]).unlink()
    os.link(str(blobs / repo["files"][path_b]["etag"]), str(blobs / repo["files"][path_a]["etag"]))
    code, data, _times = run(tmp_path, inventory, tags="verify")
    assert code != 0
    latest = reports(tmp_path)["dgx1.json"]
    assert latest["status"] == "failed" and latest["failed_play"] == "verify" and latest["tags"] == ["verify"]
    assert latest["failed_task"] == "Verify | Check each snapshot's safetensors index against the shard headers"
    assert MAIN_REPO in latest["failed_msg"] and "Duplicate mapped checkpoint key" in latest["failed_msg"]
    assert latest["plays"]["verify"]["status"] == "failed"
    assert latest["plays"]["stage"] == staged["plays"]["stage"]          # not run: the last stage pass, kept


def test_in_a_two_host_lane_a_host_failing_preflight_and_the_lane_it_stops_both_report_it(tmp_path, nas_hub):
    """rank1's local hub root is a file: its preflight fails; preflight is lane-wide, so rank0 fails at the
    lane check naming rank1, and neither stages."""
    inventory = write_lane(tmp_path, nas_hub["hub"], ["rank0", "rank1"])
    (tmp_path / "rank1").mkdir()
    (tmp_path / "rank1" / "hub").write_text("not a directory")
    code, data, _times = run(tmp_path, inventory)
    assert code != 0
    found = reports(tmp_path)
    ok, failed = found["rank0.json"], found["rank1.json"]
    assert ok["status"] == "failed" and ok["failed_play"] == "preflight" and list(ok["plays"]) == ["preflight"]
    assert "Preflight did not pass on rank1" in ok["failed_msg"] and ok["stage_started"] is None, ok
    assert not (tmp_path / "rank0" / "hub").exists() or os.listdir(str(tmp_path / "rank0" / "hub")) == []
    assert failed["status"] == "failed" and failed["failed_play"] == "preflight" and failed["failed_task"]
    assert "Every host of the lane passed preflight" not in failed["failed_task"]    # its own check failed
    assert list(failed["plays"]) == ["preflight"] and failed["stage_started"] is None
    assert failed["run_id"] == ok["run_id"] and failed["started"] == ok["started"]


def test_a_host_left_out_by_limit_keeps_its_report(staged_hub):
    """--limit rank1: rank0 is not in the run; its reports are not touched (never marked lost)."""
    lane = staged_hub("rank0-rank1", staged_rank0_rank1)   # a good stage run of the lane
    tmp_path, inventory = lane["dir"], lane["inventory"]
    before = reports(tmp_path)["rank0.json"]
    code, data, _times = run(tmp_path, inventory, "--limit", "rank1")
    assert code == 0, failures(data)
    found = reports(tmp_path)
    assert found["rank0.json"] == before
    assert found["rank1.json"]["status"] == "ok" and found["rank1.json"]["rank"] == 1
    assert found["rank1.json"]["world_size"] == 2


def test_a_host_lost_during_the_run_never_keeps_yesterdays_ok(staged_hub):
    """rank1 staged fine yesterday; today it is unreachable: both its files say failed for today's run (and
    rank0, whose lane lost a host, fails at the lane-wide preflight naming it)."""
    lane = staged_hub("rank0-rank1", staged_rank0_rank1)   # a good stage run of the lane
    tmp_path, inventory = lane["dir"], lane["inventory"]
    yesterday = reports(tmp_path)["rank1.json"]
    lane = json.loads(open(inventory).read())
    lane["all"]["children"]["exl3_2x"]["hosts"]["rank1"].update(
        ansible_connection="ssh", ansible_host="127.0.0.1", ansible_port=1, ansible_ssh_common_args="-o ConnectTimeout=3")
    with open(inventory, "w") as handle:
        json.dump(lane, handle)
    code, _data, _times = run(tmp_path, inventory)
    assert code != 0
    found = reports(tmp_path)
    ok, lost = found["rank0.json"], found["rank1.json"]
    assert lost["run_id"] == ok["run_id"] != yesterday["run_id"]
    assert ok["status"] == "failed" and ok["failed_play"] == "preflight" and "rank1" in ok["failed_msg"], ok
    assert lost["status"] == "failed" and lost["failed_task"] == "(host unreachable)", lost
    assert "unreachable" in lost["failed_msg"] and lost["finished"]
    assert found["rank1-%s.json" % ok["run_id"]]["status"] == "failed"
    assert lost["passes"]["stage"] == yesterday["passes"]["stage"]       # the last real results stay


def test_a_report_dir_the_controller_cannot_write_stops_the_run_before_a_node_is_written(tmp_path, nas_hub):
    """The dgx_report callback can only say so when it cannot write a report: the lane selection refuses the
    run first, naming the dir and the fix, and no node's hub is touched (a path under a file: even root cannot
    create it)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    inventory = write_lane(tmp_path, nas_hub["hub"], ["node0", "node1"], stage_report_dir=str(blocker / "reports"))
    code, data, _times = run(tmp_path, inventory)
    assert code != 0
    failed = failures(data)
    assert len(failed) == 2 and all(str(blocker / "reports") in line and "stage_report_dir" in line
                                    for line in failed), failed
    assert not (tmp_path / "node0").exists() and not (tmp_path / "node1").exists()
