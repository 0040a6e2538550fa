"""The node_exporter textfile through ansible-playbook on a generated hub: with stage_metrics_dir
set each host writes <dir>/dgx_stage.prom, read back here with prometheus_client's parser - staged bytes equal
the report's, the commit label is the staged ref; a re-run rewrites only its timestamps and reports changed=0;
a failing run (a corrupt NAS blob) says last_run_success 0 and keeps the last success; --check writes nothing;
a stage_metrics_dir that is no directory fails preflight, naming it, before anything is written."""
import calendar
import json
import os
import stat
import time

from prometheus_client.parser import text_string_to_metric_families

from conftest import failures
from hubgen import DRAFTER_REPO, MAIN_REPO
from test_reports import flip_nas_byte, reports, run, staged_dgx1_drafter, write_lane

PROM = "dgx_stage.prom"


def families(path):
    """{metric name: [(labels, value)]} as Prometheus reads the file."""
    with open(path) as handle:
        text = handle.read()
    return dict((f.name, [(s.labels, s.value) for s in f.samples]) for f in text_string_to_metric_families(text))


def seconds(iso):
    return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))


def metrics_results(data):
    """The stage_metrics task results of a run, by host."""
    return dict((host, result) for play in data["plays"] for task in play["tasks"]
                if "Metrics | Write the node_exporter textfile" in task["task"]["name"]
                for host, result in task["hosts"].items())


def local_commit(tmp_path, repo_id):
    folder = "models--" + repo_id.replace("/", "--")
    return (tmp_path / "dgx1" / "hub" / folder / "refs" / "main").read_text().strip()


def staged_drafter(staged_hub):
    """A good run of the drafter only on dgx1 with stage_metrics_dir <dir>/metrics (staged once, restored: see
    conftest.staged_hub): (its dir, its NAS hub, metrics dir, inventory, the run's json output)."""
    lane = staged_hub("dgx1-drafter", staged_dgx1_drafter)
    return lane["dir"], lane["nas"], lane["dir"] / "metrics", lane["inventory"], lane["data"]


def test_a_run_writes_the_textfile_a_rerun_changes_nothing_a_failure_keeps_the_last_success(staged_hub):
    # Yesterday: the drafter only, a good run.
    tmp_path, nas_hub, metrics, inventory, data = staged_drafter(staged_hub)
    latest = reports(tmp_path)["dgx1.json"]
    path = str(metrics / PROM)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 and os.listdir(str(metrics)) == [PROM]
    got = families(path)
    staged = dict((r["repo_id"], r) for r in latest["passes"]["verify"])
    assert got["dgx_stage_repo_staged_bytes"] == [
        ({"repo": DRAFTER_REPO, "repo_type": "model", "commit": local_commit(tmp_path, DRAFTER_REPO)},
         float(staged[DRAFTER_REPO]["bytes_staged"]))]
    assert staged[DRAFTER_REPO]["bytes_staged"] > 0
    assert got["dgx_stage_last_run_success"] == [({}, 1.0)]
    last_success = seconds(latest["finished"])
    assert got["dgx_stage_last_success_timestamp_seconds"] == [({}, last_success)]
    assert got["dgx_stage_last_verify_timestamp_seconds"] == [
        ({"repo": DRAFTER_REPO, "mode": "sample"}, seconds(latest["plays"]["verify"]["finished"]))]
    assert got["dgx_stage_blobs_repaired"] == [({}, 0.0)] and got["dgx_stage_nas_corrupt_blobs"] == [({}, 0.0)]
    assert "dgx_stage_decode_tokens_per_second" not in got          # the engine is off: no decode probe ran
    assert metrics_results(data)["dgx1"]["changed"] is True

    # A re-run on the same state: the timestamps move (the file is rewritten), nothing else: changed=0.
    time.sleep(1.1)
    code, data, _times = run(tmp_path, inventory)
    assert code == 0, failures(data)
    result = metrics_results(data)["dgx1"]
    assert (result["changed"], result["change"], result["written"]) == (False, "timestamps", True)
    assert data["stats"]["dgx1"]["changed"] == 0
    rerun = families(path)
    assert rerun["dgx_stage_last_success_timestamp_seconds"][0][1] == seconds(reports(tmp_path)["dgx1.json"]["finished"])
    assert rerun["dgx_stage_repo_staged_bytes"] == got["dgx_stage_repo_staged_bytes"]
    last_success = rerun["dgx_stage_last_success_timestamp_seconds"][0][1]

    # --check: the plan is shown, nothing written.
    before = open(path).read()
    code, data, _times = run(tmp_path, inventory, "--check")
    assert code == 0, failures(data)
    assert open(path).read() == before and metrics_results(data)["dgx1"]["written"] is False

    # Today: the main repo too, with a NAS shard that no longer hashes to its name: the stage play fails.
    shard = nas_hub["repos"][MAIN_REPO]["shards"][1]
    flip_nas_byte(nas_hub, shard)
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], stage_metrics_dir=str(metrics))
    code, data, _times = run(tmp_path, inventory)
    assert code != 0 and reports(tmp_path)["dgx1.json"]["status"] == "failed"
    failed = families(path)
    assert failed["dgx_stage_last_run_success"] == [({}, 0.0)]
    assert failed["dgx_stage_last_success_timestamp_seconds"] == [({}, last_success)]   # kept
    assert failed["dgx_stage_nas_corrupt_blobs"] == [({}, 1.0)]
    # The drafter is still staged (its row of the failed run is ok); the main repo proved nothing.
    assert [labels["repo"] for labels, _v in failed["dgx_stage_repo_staged_bytes"]] == [DRAFTER_REPO]
    assert os.listdir(str(metrics)) == [PROM]                         # no temp file left behind


def test_a_metrics_dir_that_is_no_directory_fails_preflight_before_anything_is_written(tmp_path, nas_hub):
    missing = str(tmp_path / "no-such-dir")
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], stage_metrics_dir=missing)
    code, data, _times = run(tmp_path, inventory)
    assert code != 0
    latest = reports(tmp_path)["dgx1.json"]
    assert latest["failed_play"] == "preflight" and missing in latest["failed_msg"]
    assert "stage_metrics_dir" in latest["failed_msg"] and "Nothing was written" in latest["failed_msg"]
    # The rescue does not try the textfile the check just refused (one error, not the same one twice).
    assert metrics_results(data) == {}
    assert not os.path.exists(missing) and not (tmp_path / "dgx1").exists()


def test_every_host_of_a_lane_writes_its_own_textfile_from_its_own_report(tmp_path, nas_hub):
    """The end of the run is recorded once for the lane (run_once); each host still writes its own file."""
    inventory = write_lane(tmp_path, nas_hub["hub"], ["rank0", "rank1"], stage_repos=[{"repo_id": DRAFTER_REPO}])
    lane = json.loads(open(inventory).read())
    for host, member in lane["all"]["children"]["exl3_2x"]["hosts"].items():
        (tmp_path / host / "metrics").mkdir(parents=True)
        member["stage_metrics_dir"] = str(tmp_path / host / "metrics")
    with open(inventory, "w") as handle:
        json.dump(lane, handle)
    code, data, _times = run(tmp_path, inventory)
    assert code == 0, failures(data)
    for host in ("rank0", "rank1"):
        latest = reports(tmp_path)[host + ".json"]
        got = families(str(tmp_path / host / "metrics" / PROM))
        assert got["dgx_stage_last_success_timestamp_seconds"] == [({}, seconds(latest["finished"]))]
        assert got["dgx_stage_repo_staged_bytes"][0][1] == latest["passes"]["verify"][0]["bytes_staged"]



def test_a_metrics_dir_gone_by_the_end_of_the_run_fails_it_naming_the_dir_and_creates_nothing(staged_hub):
    """The directory went away after the last preflight check (here: a --tags verify run, which has no preflight
    play): the textfile cannot be written at the end and the host fails there, naming the directory and the
    fix; nothing is created in its place. (Its host report, recorded just before, still says ok.)"""
    tmp_path, _nas, metrics, inventory, _data = staged_drafter(staged_hub)
    os.remove(str(metrics / PROM))
    metrics.rmdir()
    code, data, _times = run(tmp_path, inventory, tags="verify")
    assert code == 2 and data["stats"]["dgx1"]["failures"] == 1
    [failure] = failures(data)
    assert "Metrics | Write the node_exporter textfile" in failure and str(metrics) in failure
    assert "is not an existing directory" in failure and "create it" in failure
    assert not metrics.exists()


def test_a_metrics_dir_holding_another_hosts_textfile_fails_preflight_before_anything_is_written(tmp_path, nas_hub):
    """One directory for the whole lane (NFS): the first host to write it would have its file overwritten by the
    next, which would take its last success as its own. Preflight refuses it, naming both hosts."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    theirs = "# dgx-stage textfile of host dgx9\ndgx_stage_last_success_timestamp_seconds 1796119200\n"
    (metrics / PROM).write_text(theirs)
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], stage_metrics_dir=str(metrics))
    code, data, _times = run(tmp_path, inventory)
    assert code != 0
    latest = reports(tmp_path)["dgx1.json"]
    assert latest["failed_play"] == "preflight" and "textfile of host dgx9, not dgx1" in latest["failed_msg"]
    assert (metrics / PROM).read_text() == theirs and os.listdir(str(metrics)) == [PROM]
    assert not (tmp_path / "dgx1").exists()
