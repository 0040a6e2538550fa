"""dgx_report: the host report's two views - this run's (history) and the latest complete one - and how
they are merged and written (DESIGN "Host reports")."""
import json
import os

import pytest

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_report import (end_reports, end_view, failure_message, latest_view, real_results, run_view,
                                             settle_unfinished, stage_bytes, update_reports)

IDENTITY = {"lane": "exl3_2x", "rank": 1, "world_size": 2, "hub_nas_root": "/nas/hub", "hub_local_root": "/nvme/hub"}
MAIN, DRAFTER = "org/main", "org/drafter"


def row(repo, copied=0, status="ok", **extra):
    values = {"repo_id": repo, "status": status, "bytes_copied": copied, "check_mode": status == "check"}
    values.update(extra)
    return values


def run(run_id="20261130T204512Z-3fa2", started="2026-11-30T20:45:12Z", tags=("all",), check=False):
    return {"id": run_id, "started": started, "tags": list(tags), "skip_tags": [], "check": check}


def play(name, started="2026-11-30T20:45:14Z", failed_task=None, failed_msg=""):
    return {"name": name, "started": started, "failed": failed_task is not None, "failed_task": failed_task,
            "failed_result": {"msg": failed_msg}}


def data(passes=None, weights=None, engine=None):
    return {"identity": dict(IDENTITY), "passes": passes or {}, "weights": weights or [], "engine": engine or {}}


STAGED = {"preflight": [row(MAIN, status="check"), row(DRAFTER, status="check")],
          "stage": [row(MAIN, 1000), row(DRAFTER, 24)]}
VERIFIED = dict(STAGED, verify=[row(MAIN, 0), row(DRAFTER, 0)])
WEIGHTS = [{"repo_id": MAIN, "shards": 3, "tensors": 9}]


def full_run(directory, run_id, started, weights=WEIGHTS, check=False):
    """The stage play, then the verify play, of one run: returns the last update_reports result."""
    this = run(run_id, started, check=check)
    update_reports(directory, "dgx1", this, play("stage", started), data(STAGED), finished=_later(started, 5))
    update_reports(directory, "dgx1", this, play("verify", _later(started, 5)), data(VERIFIED, weights),
                   finished=_later(started, 9))
    return end_reports(directory, "dgx1", this, True, "verify", dict(IDENTITY), finished=_later(started, 9))


def _later(stamp, seconds):
    return stamp[:-3] + "%02d" % (int(stamp[-3:-1]) + seconds) + "Z"


# --- small parts ------------------------------------------------------------------------------------



def test_stage_bytes_sums_the_copies_of_all_repos_and_splits_peer_bytes_when_a_row_says():
    assert stage_bytes([row(MAIN, 1000), row(DRAFTER, 24)]) == (1024, 0)
    assert stage_bytes([]) == (0, 0) and stage_bytes(None) == (0, 0)
    assert stage_bytes([row(MAIN, 1000, bytes_from_peers=600)]) == (400, 600)
    assert stage_bytes([row(MAIN, 1000, bytes_from_nas=10, bytes_from_peers=990)]) == (10, 990)


def test_the_failure_message_names_each_failed_item_of_a_loop():
    assert failure_message({"msg": "Not enough space"}) == "Not enough space"
    loop = {"msg": "One or more items failed", "results": [
        {"failed": False, "msg": "ok", "_ansible_item_label": MAIN},
        {"failed": True, "msg": "Duplicate mapped checkpoint key", "_ansible_item_label": DRAFTER},
        {"failed": True, "msg": "bad", "item": {"repo_id": "org/x"}}]}
    assert failure_message(loop) == ('One or more items failed: org/drafter: Duplicate mapped checkpoint key | '
                                     '{"repo_id": "org/x"}: bad')
    assert failure_message({}) == "" and failure_message(None) == ""
    assert failure_message({"msg": ["a", "b"]}) == '["a", "b"]'


# --- this run's view ---------------------------------------------------------------------------------

def test_run_view_carries_identity_status_tags_and_the_stage_fields():
    view = run_view(None, "dgx1", run(tags=["stage", "verify"]), play("stage"), data(STAGED),
                    "2026-11-30T20:45:20Z")
    assert (view["host"], view["run_id"], view["started"], view["finished"], view["status"]) == (
        "dgx1", "20261130T204512Z-3fa2", "2026-11-30T20:45:12Z", None, "running")
    ended = end_view(view, "dgx1", run(), True, "stage", "2026-11-30T20:45:21Z", {})
    assert (ended["finished"], ended["status"]) == ("2026-11-30T20:45:21Z", "ok") and ended["plays"] == view["plays"]
    assert view["tags"] == ["stage", "verify"] and view["check_mode"] is False
    assert (view["lane"], view["rank"], view["world_size"]) == ("exl3_2x", 1, 2)
    assert (view["stage_started"], view["stage_finished"]) == ("2026-11-30T20:45:14Z", "2026-11-30T20:45:20Z")
    assert (view["bytes_from_nas"], view["bytes_from_peers"]) == (1024, 0)
    assert view["plays"]["stage"] == {"run_id": "20261130T204512Z-3fa2", "started": "2026-11-30T20:45:14Z",
                                      "finished": "2026-11-30T20:45:20Z", "status": "ok",
                                      "bytes_from_nas": 1024, "bytes_from_peers": 0}
    assert "failed_task" not in view and "failed_play" not in view


def test_run_view_accumulates_the_plays_of_the_run_in_play_order():
    first = run_view(None, "dgx1", run(), play("stage"), data(STAGED), "2026-11-30T20:45:20Z")
    second = run_view(first, "dgx1", run(), play("verify", "2026-11-30T20:45:21Z"), data(VERIFIED, WEIGHTS),
                      "2026-11-30T20:45:30Z")
    assert list(second["plays"]) == ["stage", "verify"] and list(second["passes"]) == ["preflight", "stage", "verify"]
    assert second["plays"]["stage"] == first["plays"]["stage"] and second["weights"] == WEIGHTS
    assert second["finished"] is None and second["stage_finished"] == "2026-11-30T20:45:20Z"
    # Another run's file is not this run's past.
    other = run_view(first, "dgx1", run("20261201T000000Z-0001"), play("verify"), data(), "2026-12-01T00:00:09Z")
    assert list(other["plays"]) == ["verify"] and other["stage_started"] is None and other["bytes_from_nas"] == 0


def test_a_failed_play_makes_the_run_failed_with_the_play_task_and_message():
    view = run_view(None, "dgx1", run(), play("stage", failed_task="Mirror | Each repo from the NAS hub to the local hub, pass stage",
                                              failed_msg="1 NAS blob(s) of org/main ..."),
                    data({"stage": [row(MAIN, 10, "failed"), row(DRAFTER, 24)]}), "2026-11-30T20:45:20Z")
    assert view["status"] == "failed" and view["failed_play"] == "stage"
    assert view["failed_task"] == "Mirror | Each repo from the NAS hub to the local hub, pass stage"
    assert view["failed_msg"].startswith("1 NAS blob(s)")
    assert view["plays"]["stage"]["status"] == "failed" and view["bytes_from_nas"] == 34
    # Later plays of the run do not make it ok again.
    later = run_view(view, "dgx1", run(), play("manifest"), data(), "2026-11-30T20:45:40Z")
    assert later["status"] == "failed" and later["failed_play"] == "stage"


def test_a_check_run_is_status_check_and_copies_no_bytes():
    view = run_view(None, "dgx1", run(check=True), play("stage"), data({"stage": [row(MAIN, 1000, "check")]}),
                    "2026-11-30T20:45:20Z")
    assert view["status"] == "running" and view["check_mode"] is True
    assert end_view(view, "dgx1", run(check=True), True, "stage", "2026-11-30T20:45:21Z", {})["status"] == "check"
    assert view["bytes_from_nas"] == 0 and view["plays"]["stage"]["status"] == "check"
    failed = run_view(None, "dgx1", run(check=True), play("preflight", failed_task="Preflight | space"), data(),
                      "2026-11-30T20:45:20Z")
    assert failed["status"] == "failed" and failed["check_mode"] is True


# --- the latest view -------------------------------------------------------------------------------------

def _view(run_args, name, passes, weights=None, engine=None, finished="2026-11-30T20:46:00Z", previous=None, **fail):
    """A whole run of one play: its view once the run's end is recorded."""
    this = run(**run_args)
    view = run_view(previous, "dgx1", this, play(name, **fail), data(passes, weights, engine), finished)
    return end_view(view, "dgx1", this, True, name, finished, {})


def test_the_first_latest_view_is_the_run_with_last_real_run():
    view = _view({}, "verify", VERIFIED, WEIGHTS)
    latest = latest_view(None, view)
    for key in ("run_id", "started", "finished", "status", "tags", "passes", "weights", "plays", "lane", "rank"):
        assert latest[key] == view[key], key
    assert latest["last_real_run"]["run_id"] == view["run_id"] and "check" not in latest


def test_a_verify_run_keeps_the_last_stage_pass_with_its_timestamps_and_bytes():
    staged = latest_view(None, _view({}, "stage", STAGED, finished="2026-11-30T20:45:20Z"))
    verify = _view({"run_id": "20261201T080000Z-beef", "started": "2026-12-01T08:00:00Z", "tags": ["verify"]},
                   "verify", {"verify": VERIFIED["verify"]}, WEIGHTS, finished="2026-12-01T08:00:30Z")
    latest = latest_view(staged, verify)
    assert latest["run_id"] == "20261201T080000Z-beef" and latest["tags"] == ["verify"]
    assert latest["passes"]["stage"] == STAGED["stage"] and latest["passes"]["verify"] == VERIFIED["verify"]
    assert latest["plays"]["stage"] == staged["plays"]["stage"]
    assert latest["plays"]["stage"]["run_id"] == "20261130T204512Z-3fa2"
    assert latest["plays"]["verify"]["run_id"] == "20261201T080000Z-beef"
    assert (latest["stage_started"], latest["stage_finished"], latest["bytes_from_nas"]) == (
        staged["stage_started"], "2026-11-30T20:45:20Z", 1024)
    assert latest["weights"] == WEIGHTS


def test_a_check_run_keeps_the_real_results_and_records_its_plan_apart():
    real = latest_view(None, _view({}, "verify", VERIFIED, WEIGHTS, engine={"manifest": {"counts": {"local": 17}}}))
    plan = {"stage": [row(MAIN, 999, "check")], "verify": [row(MAIN, 0, "check")]}
    check = _view({"run_id": "20261201T080000Z-0c0c", "started": "2026-12-01T08:00:00Z", "check": True}, "manifest",
                  plan, [], engine={"manifest": {"counts": {"local": 0}}})
    latest = latest_view(real, check)
    assert latest["status"] == "check" and latest["check_mode"] is True and latest["run_id"] == "20261201T080000Z-0c0c"
    for key in ("passes", "weights", "engine", "plays", "stage_started", "stage_finished", "bytes_from_nas"):
        assert latest[key] == real[key], key
    assert latest["last_real_run"] == real["last_real_run"]
    assert latest["check"]["passes"] == plan and latest["check"]["engine"]["manifest"]["counts"] == {"local": 0}
    assert latest["check"]["run_id"] == "20261201T080000Z-0c0c" and latest["check"]["status"] == "check"
    # The next real run drops the stale plan.
    again = latest_view(latest, _view({"run_id": "20261202T000000Z-0002"}, "verify", VERIFIED, WEIGHTS))
    assert "check" not in again and again["status"] == "ok" and again["last_real_run"]["run_id"] == again["run_id"]


def test_a_failed_run_never_keeps_the_earlier_success_as_latest():
    good = latest_view(None, _view({}, "verify", VERIFIED, WEIGHTS))
    failed = _view({"run_id": "20261201T080000Z-dead"}, "stage", {"stage": [row(MAIN, 10, "failed")]},
                   failed_task="Mirror | Each repo from the NAS hub to the local hub, pass stage", failed_msg="corrupt")
    latest = latest_view(good, failed)
    assert latest["status"] == "failed" and latest["failed_task"] == "Mirror | Each repo from the NAS hub to the local hub, pass stage"
    assert latest["failed_play"] == "stage" and latest["plays"]["stage"]["status"] == "failed"
    assert latest["passes"]["stage"] == [row(MAIN, 10, "failed")] and latest["bytes_from_nas"] == 10
    assert latest["passes"]["verify"] == VERIFIED["verify"]          # not run: kept, with its own run id
    assert latest["plays"]["verify"]["run_id"] == good["run_id"]
    assert latest["last_real_run"]["status"] == "failed"
    # And a good run after it clears the failure.
    fixed = latest_view(latest, _view({"run_id": "20261202T000000Z-0003"}, "stage", STAGED))
    assert fixed["status"] == "ok" and "failed_task" not in fixed and "failed_play" not in fixed


def test_weights_come_with_the_verify_play_and_engine_results_merge_key_by_key():
    first = latest_view(None, _view({}, "verify", VERIFIED, WEIGHTS,
                                    engine={"manifest": {"counts": {}}, "smoke": {"passed": True}}))
    bench = _view({"run_id": "20261201T000000Z-0004"}, "bench", {}, [], engine={"bench": {"passed": 5}})
    latest = latest_view(first, bench)
    assert latest["weights"] == WEIGHTS
    assert latest["engine"] == {"manifest": {"counts": {}}, "smoke": {"passed": True}, "bench": {"passed": 5}}
    reverify = _view({"run_id": "20261202T000000Z-0005"}, "verify", {"verify": []}, [])
    assert latest_view(latest, reverify)["weights"] == []


def test_a_latest_view_from_before_run_ids_is_read_as_real_unless_it_was_a_check_run():
    legacy = {"host": "dgx1", "check_mode": False, "passes": {"stage": STAGED["stage"]}, "weights": WEIGHTS,
              "engine": {"manifest": {}}}
    assert real_results(legacy)["passes"] == {"stage": STAGED["stage"]} and real_results(legacy)["plays"] == {}
    assert real_results(dict(legacy, check_mode=True))["passes"] == {}
    latest = latest_view(legacy, _view({}, "verify", {"verify": []}, WEIGHTS))
    assert latest["passes"]["stage"] == STAGED["stage"] and latest["stage_started"] is None


# --- the files -----------------------------------------------------------------------------------------

def test_update_reports_writes_the_run_file_and_the_latest_view(tmp_path):
    directory = str(tmp_path / "reports")
    result = full_run(directory, "20261130T204512Z-3fa2", "2026-11-30T20:45:12Z")
    assert sorted(os.listdir(directory)) == ["dgx1-20261130T204512Z-3fa2.json", "dgx1.json"]
    with open(result["history_path"]) as handle:
        history = json.load(handle)
    with open(result["latest_path"]) as handle:
        latest = json.load(handle)
    assert history == result["report"] and latest == result["latest"]
    assert list(history["plays"]) == ["stage", "verify"] and history["finished"] == "2026-11-30T20:45:21Z"
    assert history["stage_started"] == "2026-11-30T20:45:12Z" and history["stage_finished"] == "2026-11-30T20:45:17Z"
    assert latest["status"] == "ok" and latest["bytes_from_nas"] == 1024

    second = full_run(directory, "20261201T080000Z-beef", "2026-12-01T08:00:00Z")
    assert sorted(os.listdir(directory)) == ["dgx1-20261130T204512Z-3fa2.json", "dgx1-20261201T080000Z-beef.json",
                                             "dgx1.json"]
    assert second["latest"]["run_id"] == "20261201T080000Z-beef"
    with open(result["history_path"]) as handle:
        assert json.load(handle) == history               # the first run's file is left as it was


def test_update_reports_replaces_an_unreadable_latest_view_with_a_warning(tmp_path):
    (tmp_path / "dgx1.json").write_text("{not json")
    result = update_reports(str(tmp_path), "dgx1", run(), play("stage"), data(STAGED), finished="2026-11-30T20:45:20Z")
    assert result["warnings"] and "unreadable" in result["warnings"][0]
    assert json.loads((tmp_path / "dgx1.json").read_text())["status"] == "running"


def test_update_reports_without_write_writes_nothing(tmp_path):
    result = update_reports(str(tmp_path / "reports"), "dgx1", run(), play("stage"), data(STAGED), write=False)
    assert result["latest"]["status"] == "running" and not os.path.exists(str(tmp_path / "reports"))


@pytest.mark.parametrize("host, run_args, play_args, words", [
    ("../dgx1", {}, {}, "host"),
    (".hidden", {}, {}, "host"),
    ("dgx1", {"run_id": "../../etc"}, {}, "run_id"),
    ("dgx1", {"run_id": ""}, {}, "run_id"),
    ("dgx1", {"started": "2026-11-30 20:45:12"}, {}, "run_started"),
    ("dgx1", {}, {"started": ""}, "play_started"),
    ("dgx1", {}, {"name": "deploy"}, "play"),
])
def test_inputs_that_would_name_a_wrong_file_or_time_are_refused(tmp_path, host, run_args, play_args, words):
    this_play = dict(play("stage"), **play_args)
    with pytest.raises(StageError) as err:
        update_reports(str(tmp_path), host, run(**run_args), this_play, data())
    assert words in str(err.value) and os.listdir(str(tmp_path)) == []


def test_two_runs_writing_one_hosts_reports_at_once_each_merge_the_others_latest_view(tmp_path, monkeypatch):
    """Each run reads the latest view, merges its play and writes it back: without one writer at a time both read
    it first, and the second write drops the first run's play and the NAS blob it found failing its name."""
    import threading
    from ansible.module_utils import dgx_report
    both_read = threading.Barrier(4)    # each run reads its history file and the latest view
    real_read = dgx_report.read_report

    def read_then_wait(path):
        found = real_read(path)
        try:
            both_read.wait(timeout=1)
        except threading.BrokenBarrierError:
            pass
        return found
    monkeypatch.setattr(dgx_report, "read_report", read_then_wait)
    corrupt = dict(row(MAIN), nas_corrupt_blobs=[{"blob": "ab" * 32, "paths": ["a.safetensors"], "why": "hash"}])
    writers = [threading.Thread(target=update_reports, args=(str(tmp_path), "dgx1", run(run_id), play(name),
                                                             data({name: [rows]})))
               for run_id, name, rows in (("20261130T204512Z-aaaa", "stage", corrupt),
                                          ("20261130T204513Z-bbbb", "verify", row(MAIN)))]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    latest = json.loads((tmp_path / "dgx1.json").read_text())
    assert sorted(latest["plays"]) == ["stage", "verify"] and list(latest["nas_suspects"]) == ["ab" * 32]


# --- the end of the run --------------------------------------------------------------------------------

def test_a_run_is_running_until_its_end_and_a_killed_run_never_looks_good(tmp_path):
    directory = str(tmp_path)
    full_run(directory, "20261130T204512Z-3fa2", "2026-11-30T20:45:12Z")
    killed = run("20261201T080000Z-dead", "2026-12-01T08:00:00Z")
    result = update_reports(directory, "dgx1", killed, play("stage", "2026-12-01T08:00:01Z"), data(STAGED))
    assert result["latest"]["status"] == "running" and result["latest"]["finished"] is None
    assert result["latest"]["run_id"] == "20261201T080000Z-dead"


def test_a_run_over_without_its_end_recorded_is_settled_failed_with_the_failure_seen_or_interrupted(tmp_path):
    """A role's argument validation fails the host under every tag, in a play whose rescue the tags skip: the
    run ends with no failed report and no end of run; the front end settles it with what its events said."""
    directory = str(tmp_path)
    full_run(directory, "20261130T204512Z-3fa2", "2026-11-30T20:45:12Z")
    today = run("20261201T080000Z-0ff3", "2026-12-01T08:00:00Z")
    update_reports(directory, "dgx1", today, play("receipts", "2026-12-01T08:00:01Z"), data())
    failure = {"play": "Manifest", "task": "Validating arguments", "msg": "engine_bind_from: got bogus"}
    settled = settle_unfinished(directory, "dgx1", today["id"], "failed", failure)
    with open(os.path.join(directory, "dgx1.json")) as handle:
        latest = json.load(handle)
    for view in (settled, latest, latest["last_real_run"]):
        assert view["status"] == "failed" and view["run_id"] == today["id"], view
        assert (view["failed_play"], view["failed_task"], view["failed_msg"]) == tuple(failure.values())
    with open(os.path.join(directory, "dgx1-%s.json" % today["id"])) as handle:
        assert json.load(handle) == settled
    # Settled once; another run's reports, and a report not running, are left as they are.
    assert settle_unfinished(directory, "dgx1", today["id"], "interrupted") is None
    assert settle_unfinished(directory, "dgx1", "20261130T204512Z-3fa2", "interrupted") is None
    later = run("20261202T080000Z-0ff4", "2026-12-02T08:00:00Z", check=True)
    update_reports(directory, "dgx1", later, play("stage", "2026-12-02T08:00:01Z"), data())
    assert settle_unfinished(directory, "dgx1", later["id"], "interrupted")["status"] == "interrupted"
    with open(os.path.join(directory, "dgx1.json")) as handle:
        latest = json.load(handle)
    assert latest["status"] == latest["check"]["status"] == "interrupted" and "failed_msg" not in latest["check"]
    assert latest["last_real_run"]["status"] == "failed"


def test_a_host_lost_during_a_play_is_failed_at_the_end_naming_the_play(tmp_path):
    directory = str(tmp_path)
    good = full_run(directory, "20261130T204512Z-3fa2", "2026-11-30T20:45:12Z")
    today = run("20261201T080000Z-0ff1", "2026-12-01T08:00:00Z")
    update_reports(directory, "dgx1", today, play("preflight", "2026-12-01T08:00:01Z"), data())
    ended = end_reports(directory, "dgx1", today, False, "stage", dict(IDENTITY), finished="2026-12-01T08:05:00Z")
    for view in (ended["report"], ended["latest"]):
        assert view["status"] == "failed" and view["failed_play"] == "stage" and view["run_id"] == today["id"]
        assert view["failed_task"] == "(host unreachable)" and "unreachable" in view["failed_msg"]
    assert ended["latest"]["plays"]["verify"] == good["latest"]["plays"]["verify"]     # kept, with its own run id


def test_a_host_unreachable_from_the_start_gets_a_failed_report_of_this_run(tmp_path):
    full_run(str(tmp_path), "20261130T204512Z-3fa2", "2026-11-30T20:45:12Z")
    today = run("20261201T080000Z-0ff2", "2026-12-01T08:00:00Z")
    ended = end_reports(str(tmp_path), "dgx1", today, False, None, dict(IDENTITY))
    assert ended["latest"]["status"] == "failed" and ended["latest"]["failed_play"] is None
    assert "lane selection" in ended["latest"]["failed_msg"] and ended["report"]["plays"] == {}
    assert os.path.exists(ended["history_path"])


def test_the_end_keeps_a_failed_play_failed_and_ends_a_check_run_as_check(tmp_path):
    failing = run("20261201T080000Z-0ff3", "2026-12-01T08:00:00Z")
    update_reports(str(tmp_path), "dgx1", failing, play("stage", failed_task="Mirror | x", failed_msg="bad"), data())
    ended = end_reports(str(tmp_path), "dgx1", failing, False, "stage", dict(IDENTITY))
    assert ended["report"]["status"] == "failed" and ended["report"]["failed_task"] == "Mirror | x"
    checking = run("20261201T090000Z-0ff4", "2026-12-01T09:00:00Z", check=True)
    update_reports(str(tmp_path), "dgx1", checking, play("stage"), data(STAGED))
    assert end_reports(str(tmp_path), "dgx1", checking, True, "stage", dict(IDENTITY))["latest"]["status"] == "check"


def test_a_play_end_the_caller_gives_must_be_iso_8601_utc(tmp_path):
    # The stage play passes the host's own stage window (its wave): a bad stamp is refused, not written.
    bad = dict(play("stage"), finished="20:45:20")
    with pytest.raises(StageError, match="play_finished"):
        update_reports(str(tmp_path), "dgx1", run(), bad, data(STAGED), finished="20:45:20")
    good = dict(play("stage"), finished="2026-11-30T20:45:20Z")
    view = update_reports(str(tmp_path), "dgx1", run(), good, data(STAGED), finished="2026-11-30T20:45:20Z",
                          write=False)["report"]
    assert (view["stage_started"], view["stage_finished"]) == ("2026-11-30T20:45:14Z", "2026-11-30T20:45:20Z")
