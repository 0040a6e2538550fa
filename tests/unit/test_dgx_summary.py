"""The lane summary's data shaping (callback_plugins/dgx_summary.py): plain rows in, lines out."""
import importlib.util
import json
import os
import re
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("dgx_summary",
                                               os.path.join(REPO_ROOT, "callback_plugins", "dgx_summary.py"))
summary = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(summary)

MIB = 1024 * 1024
GIB = 1024 * MIB


def row(repo="org/model", copied=0, reused=0, repaired=0, nbytes=0, duration=0.0, verify="none", status="ok",
        check=False):
    return {"repo_id": repo, "revision": "main", "commit": "b7a6f9ba26b1707994fd55fc4fd1d165b3963805",
            "blobs": {"copied": copied, "reused": reused, "repaired": repaired}, "bytes_copied": nbytes,
            "duration_s": duration, "verify": verify, "status": status, "check_mode": check}


def table(lines):
    """{(host, repo): {column: cell}} of a summary's table (cells are split on two or more spaces)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("HOST "))
    header = re.split(r"\s{2,}", lines[start])
    cells = {}
    for line in lines[start + 1:]:
        if line.startswith(("wall time", "Stage pass")):   # the table ends where the stage pass block starts
            break
        parts = dict(zip(header, re.split(r"\s{2,}", line, maxsplit=len(header) - 1)))
        cells[(parts["HOST"], parts["REPO"])] = parts
    return cells


@pytest.mark.parametrize("seconds,text", [(8.44, "8.4 s"), (185, "3 min 05 s"), (3725, "1 h 02 min")])
def test_wall_time_reads_at_a_glance(seconds, text):
    assert summary.human_seconds(seconds) == text


def test_pass_is_the_plays_tag_then_the_modules_phase():
    assert summary.pass_of(("preflight",), "stage") == "preflight"
    assert summary.pass_of(("always", "verify"), "stage") == "verify"
    assert summary.pass_of((), "verify") == "verify"
    assert summary.pass_of(None, None) == "stage"


def test_a_real_run_adds_stage_and_verify_and_the_plan_does_not_count():
    merged = summary.merge_repo({
        "preflight": row(copied=13, nbytes=48 * MIB, duration=0.01, status="check", check=True),
        "stage": row(copied=13, reused=4, nbytes=48 * MIB, duration=1.5),
        "verify": row(reused=17, repaired=1, nbytes=8 * MIB, duration=0.5, verify="full"),
    })
    assert (merged["copied"], merged["reused"], merged["repaired"]) == (13, 4, 1)
    assert merged["bytes"] == 56 * MIB and merged["duration_s"] == pytest.approx(2.0)
    assert merged["mib_per_s"] == pytest.approx(28.0)
    assert (merged["verify"], merged["status"]) == ("full", "ok")


def test_a_no_op_run_has_no_rate():
    merged = summary.merge_repo({"stage": row(reused=17, duration=0.01), "verify": row(reused=17, verify="sample")})
    assert merged["bytes"] == 0 and merged["mib_per_s"] is None and merged["verify"] == "sample"


def test_check_mode_is_the_plan_of_one_pass_with_no_rate():
    plan = row(copied=13, nbytes=48 * MIB, duration=0.002, status="check", check=True)
    merged = summary.merge_repo({"preflight": plan, "stage": plan, "verify": dict(plan, verify="sample")})
    assert (merged["copied"], merged["bytes"], merged["status"]) == (13, 48 * MIB, "check")
    assert merged["mib_per_s"] is None


def test_a_failed_row_fails_the_repo_and_verify_alone_stands_for_itself():
    merged = summary.merge_repo({"stage": row(copied=3, status="failed")})
    assert merged["status"] == "failed" and merged["verify"] == "-"
    merged = summary.merge_repo({"verify": row(reused=17, repaired=2, verify="full")})
    assert (merged["reused"], merged["repaired"], merged["verify"]) == (17, 2, "full")


def plan_row(repo="org/model", copied=11, nbytes=48 * MIB):
    return row(repo=repo, copied=copied, nbytes=nbytes, duration=0.01, status="check", check=True)


def test_in_a_real_run_the_preflight_plan_is_never_counted_as_done():
    """--tags preflight (or a run that stopped after it): the plan is no figure of what was done."""
    merged = summary.merge_repo({"preflight": plan_row()}, check_mode=False)
    assert merged["status"] == "preflight only"
    assert [merged[key] for key in ("copied", "reused", "repaired", "bytes", "mib_per_s")] == [None] * 5
    lines = summary.summary_lines(_state(n1={"rank": 0, "lane": "l", "repos": {"a": {"preflight": plan_row()}}}))
    cells = table(lines)[("n1", "org/model")]
    assert (cells["COPIED"], cells["GiB"], cells["STATUS"]) == ("-", "-", "preflight only")
    assert lines[-1] == "wall time 8.4 s; 1/1 hosts ok"


def test_verify_without_stage_takes_its_figures_from_the_verify_row():
    """--tags preflight,verify: on an empty root the verify pass fails having copied nothing; after a flip
    -e stage_verify=full repairs, and the repair is in REPAIRED and the totals."""
    empty = summary.merge_repo({"preflight": plan_row(),
                                "verify": row(status="failed", verify="sample")}, check_mode=False)
    assert (empty["copied"], empty["bytes"], empty["status"], empty["verify"]) == (0, 0, "failed", "sample")
    flip = dict(row(reused=10, repaired=1, nbytes=64 * 1024, duration=0.02, verify="full"),
                repairs=[{"path": "model-00002.safetensors", "size": 64 * 1024}])
    fixed = summary.merge_repo({"preflight": plan_row(copied=0, nbytes=0), "verify": flip}, check_mode=False)
    assert (fixed["copied"], fixed["reused"], fixed["repaired"], fixed["status"]) == (0, 10, 1, "ok")
    assert fixed["bytes"] == 64 * 1024 and fixed["repaired_bytes"] == 64 * 1024
    lines = summary.summary_lines(_state(n1={"rank": 0, "lane": "l", "repos": {"a": {
        "preflight": plan_row(copied=0, nbytes=0), "verify": flip}}}))
    assert table(lines)[("n1", "org/model")]["REPAIRED"] == "1"
    assert lines[-1] == "wall time 8.4 s; 1/1 hosts ok; copied 0 files, 0 B; repaired 1 (64.0 KiB)"


def test_a_pass_that_failed_without_a_row_fails_the_repo_and_counts_nothing():
    """The stage call refused before it had a result (another run held the lock): the callback's own row
    fails the repo; the preflight plan does not stand in for it."""
    refused = {"repo_id": "org/model", "repo_type": "model", "revision": "main", "status": "failed",
               "no_report": True, "check_mode": False}
    merged = summary.merge_repo({"preflight": plan_row(nbytes=128 * MIB), "stage": refused}, check_mode=False)
    assert (merged["copied"], merged["bytes"], merged["status"], merged["verify"]) == (None, None, "failed", "-")
    lines = summary.summary_lines(_state(n1={
        "rank": 0, "lane": "l", "failed": True, "report_path": "reports/n1.json",
        "failure": {"play": "stage", "tag": "stage", "task": "Mirror", "msg": "another dgx-stage run holds it"},
        "repos": {"a": {"preflight": plan_row(nbytes=128 * MIB), "stage": refused},
                  "b": {"preflight": plan_row(repo="org/b", copied=2, nbytes=MIB),
                        "stage": row(repo="org/b", copied=2, nbytes=MIB, duration=1.0)}}}))
    assert table(lines)[("n1", "org/model")]["STATUS"] == "failed: stage: Mirror"
    assert table(lines)[("n1", "org/model")]["COPIED"] == "-"
    assert "; copied 2 files, 1.0 MiB; repaired 0; FAILED: n1" in lines[-3]


def test_check_mode_shows_the_plan_even_of_preflight_alone():
    plan = plan_row(copied=13)
    assert summary.merge_repo({"preflight": plan}, check_mode=True)["copied"] == 13
    assert summary.merge_repo({"preflight": plan}, check_mode=True)["status"] == "check"
    assert summary.merge_repo({"preflight": plan, "stage": plan})["status"] == "check"   # read off the rows


def test_a_model_and_a_dataset_of_one_id_are_two_rows_and_the_type_is_shown():
    model, dataset = row(repo="org/x", copied=4), dict(row(repo="org/x", copied=2), repo_type="dataset")
    assert summary.repo_key(model) != summary.repo_key(dataset)
    assert summary.repo_key(dict(model, repo_type="model")) == summary.repo_key(model)
    repos = {summary.repo_key(model): {"stage": model}, summary.repo_key(dataset): {"stage": dataset}}
    lines = summary.summary_lines(_state(n1={"rank": 0, "lane": "l", "repos": repos}))
    cells = table(lines)
    assert list(cells) == [("n1", "org/x"), ("n1", "org/x (dataset)")]
    assert cells[("n1", "org/x (dataset)")]["COPIED"] == "2"


def test_real_files_count_as_copied_files():
    assert summary.files_copied(dict(row(copied=2), real_files={"copied": 3})) == 5


def test_host_rows_put_the_failed_task_on_the_failed_repo_or_a_row_of_its_own():
    failure = {"play": "stage", "task": "stage : Mirror | Each repo", "msg": "bad blob"}
    repos = {"a@main": {"stage": row(repo="a", status="failed")}, "b@main": {"stage": row(repo="b")}}
    rows = summary.host_rows("n1", 1, repos, "failed", failure)
    assert [r["status"] for r in rows] == ["failed: stage: stage : Mirror | Each repo", "ok"]
    later = summary.host_rows("n1", 1, {"b@main": {"stage": row(repo="b")}}, "failed",
                              {"play": "manifest", "task": "engine : Manifest | Write"})
    assert [(r["repo_id"], r["status"]) for r in later] == [("b", "ok"),
                                                           ("-", "failed: manifest: engine : Manifest | Write")]
    bare = summary.host_rows("n2", 0, {}, "unreachable", {"play": "preflight", "task": "Gathering Facts"})
    assert bare == [{"host": "n2", "rank": 0, "repo_id": "-", "status": "unreachable: preflight: Gathering Facts"}]
    went_on = summary.host_rows("n3", 2, {"a@main": {"stage": row(repo="a", status="failed")}}, "ok")
    assert went_on[0]["status"] == "failed (host went on)"


def test_next_step_names_the_host_task_report_and_command():
    lines = summary.next_step_lines("dgx2", "failed", {"play": "stage", "tag": "stage", "task": "stage : Mirror | x",
                                                       "msg": "1 NAS blob(s)\n do not hold"},
                                    "reports/dgx2.json", "inventory/dgx", "stage-deepseek.yml")
    assert lines[0] == "dgx2 failed in play stage, task 'stage : Mirror | x': 1 NAS blob(s) do not hold"
    assert lines[1].startswith("next step: read the error above and the host report reports/dgx2.json")
    assert "ansible-playbook -i inventory/dgx stage-deepseek.yml --limit dgx2" in lines[1]
    assert "--tags stage" in lines[1]
    gone = summary.next_step_lines("dgx3", "unreachable", {"play": "Lane facts", "task": "Gathering Facts"}, None,
                                   None, None)
    assert gone[0] == "dgx3 unreachable in play Lane facts, task 'Gathering Facts'"
    assert "check that dgx3 answers" in gone[1] and "--tags" not in gone[1]
    untagged = summary.next_step_lines("dgx4", "failed", {"play": "Lane facts", "tag": None, "task": "t"}, None,
                                       None, None)
    assert "--tags" not in untagged[1]


def test_next_step_names_no_report_file_it_does_not_know():
    """No report from this run: the host's report directory (the lane's lane_report_dir) is named only when an earlier run left the file there; never reports/<host>.json by guess."""
    failure = {"play": "Lane facts", "tag": None, "task": "Gathering Facts", "msg": "no python"}
    unknown = summary.next_step_lines("dgx4", "failed", failure, None, "inventory/dgx", "stage-deepseek.yml")
    assert unknown[1].startswith("next step: read the error above (this run wrote no host report for dgx4); ")
    assert ".json" not in unknown[1]
    missing = summary.next_step_lines("dgx4", "failed", failure, None, "inventory/dgx", "stage-deepseek.yml",
                                      "/srv/reports/dgx4.json", False)
    assert "/srv/reports/dgx4.json" not in missing[1] and "wrote no host report" in missing[1]
    earlier = summary.next_step_lines("dgx4", "failed", failure, None, "inventory/dgx", "stage-deepseek.yml",
                                      "/srv/reports/dgx4.json", True)
    assert ("read the error above and the host report /srv/reports/dgx4.json (from an earlier run: this run "
            "wrote none)") in earlier[1]


NOT_STAGED = ("hf_hub_mirror a: 11 of the 11 selected file(s) of a@b7a6f9ba26b1 are not staged on this node (x): "
              "this verify pass proves the local copy and copies nothing (copy_missing=false). Stage them first, "
              "which verifies too: `dgx-stage stage --limit n1`; nothing was written" + " padding" * 40)


def test_next_step_follows_what_the_failure_asks_for():
    """verify refused for files not staged says to stage: re-running only verify fails again."""
    assert summary.tags_asked(NOT_STAGED) == ["preflight", "stage", "verify", "manifest"]
    assert summary.tags_asked("run --tags=stage,verify or --tags receipts") == ["stage", "verify", "receipts"]
    lines = summary.next_step_lines("n1", "failed", {"play": "verify", "tag": "verify", "task": "t",
                                                     "msg": NOT_STAGED}, "reports/n1.json", None, None)
    assert lines[0].endswith("...")      # the message is cut for the screen, not for reading what it asks
    assert lines[1].endswith("--limit n1  (or only those plays: --tags preflight,stage,verify,manifest)")
    plain = summary.next_step_lines("n1", "failed", {"play": "stage", "tag": "stage", "task": "t", "msg": "bad"},
                                    "reports/n1.json", None, None)
    assert plain[1].endswith("--limit n1  (or only that play: --tags stage)")


def test_next_step_names_the_whole_lane_when_its_engine_runs():
    """The engine play refuses --limit on part of a lane: a re-run that reaches it names every rank; a
    pre-engine play alone may still be re-run on the failed host."""
    failure = {"play": "stage", "tag": "stage", "task": "t", "msg": "bad"}
    lines = summary.next_step_lines("dgx2", "failed", failure, "reports/dgx2.json", "inventory/dgx",
                                    "stage-deepseek.yml", lane=["dgx1", "dgx2"])
    assert "stage-deepseek.yml --limit dgx1,dgx2  (or only that play on dgx2: " in lines[1]
    assert "--limit dgx2 --tags stage)" in lines[1]
    assert lines[1].endswith("; the whole lane dgx1,dgx2, as its engine restarts as one")
    engine = summary.next_step_lines("dgx2", "failed", dict(failure, play="engine", tag="engine"), None,
                                     None, None, lane=["dgx1", "dgx2"])
    assert "--limit dgx1,dgx2  (or only that play: --tags engine)" in engine[1]
    assert "--limit dgx2 " not in engine[1]
    state = _state(dgx1={"rank": 0, "lane": "exl3_2x", "engine_runs": True},
                   dgx2={"rank": 1, "lane": "exl3_2x", "engine_runs": True, "failed": True, "failure": failure})
    assert any("--limit dgx1,dgx2" in line for line in summary.summary_lines(state))
    state["hosts"]["dgx1"]["engine_runs"] = state["hosts"]["dgx2"]["engine_runs"] = False
    steps = [line for line in summary.summary_lines(state) if line.startswith("next step")]
    assert steps and "--limit dgx2" in steps[0] and "dgx1" not in steps[0]


def _state(**hosts):
    return {"hosts": hosts, "check_mode": False, "inventory": "inventory/demo", "playbook": "stage-deepseek.yml",
            "wall_s": 8.44, "run_id": "20261130T204512Z-3fa2"}


def test_summary_is_one_table_ordered_by_rank_with_totals():
    repos = {"a@main": {"stage": row(repo="a", copied=2, nbytes=GIB, duration=2.0),
                        "verify": row(repo="a", reused=2, verify="sample")}}
    lines = summary.summary_lines(_state(
        n2={"rank": 1, "lane": "exl3_2x", "repos": repos},
        n1={"rank": 0, "lane": "exl3_2x", "repos": repos},
        bystander={"lane": "exl3_2x", "repos": {}},     # in the inventory, not in the lane
    ))
    assert lines[0] == "DGX-STAGE LANE SUMMARY: lane exl3_2x, 2 hosts, run 20261130T204512Z-3fa2"
    cells = table(lines)
    assert list(cells) == [("n1", "a"), ("n2", "a")]
    first = cells[("n1", "a")]
    assert (first["RANK"], first["COPIED"], first["GiB"], first["MiB/s"], first["STATUS"]) == ("0", "2", "1.00",
                                                                                              "512", "ok")
    assert lines[-1] == "wall time 8.4 s; 2/2 hosts ok; copied 4 files, 2.0 GiB; repaired 0"


def test_summary_of_a_failed_host_ends_with_its_next_step():
    lines = summary.summary_lines(_state(
        n1={"rank": 0, "lane": "l", "repos": {"a@main": {"stage": row(repo="a", status="failed")}}, "failed": True,
            "failure": {"play": "stage", "task": "stage : Mirror | x", "msg": "corrupt"},
            "report_path": "reports/n1.json"},
        n2={"rank": 1, "lane": "l", "repos": {"a@main": {"stage": row(repo="a")}}},
    ))
    assert table(lines)[("n1", "a")]["STATUS"] == "failed: stage: stage : Mirror | x"
    assert table(lines)[("n2", "a")]["STATUS"] == "ok"
    assert "1/2 hosts ok" in lines[-3] and lines[-3].endswith("FAILED: n1")
    assert lines[-2] == "n1 failed in play stage, task 'stage : Mirror | x': corrupt"
    assert lines[-1].startswith("next step: ") and "reports/n1.json" in lines[-1] and "--limit n1" in lines[-1]


def test_check_mode_says_what_would_be_copied():
    plan = row(repo="a", copied=13, nbytes=48 * MIB, status="check", check=True)
    state = dict(_state(n1={"rank": 0, "lane": "l", "repos": {"a@main": {"preflight": plan, "stage": plan}}}),
                 check_mode=True)
    lines = summary.summary_lines(state)
    assert lines[0].endswith("CHECK MODE (nothing was written)")
    assert "TO COPY" in lines[1] and table(lines)[("n1", "a")]["STATUS"] == "check"
    assert lines[-1] == "wall time 8.4 s; 1/1 hosts checked; would copy 13 files, 0.05 GiB (48.0 MiB)"


def test_an_engine_left_off_is_said_once():
    repos = {"a@main": {"stage": row(repo="a")}}
    lines = summary.summary_lines(_state(n1={"rank": 0, "lane": "l", "repos": repos, "engine_runs": False}))
    assert lines[-1].endswith("; engine not started (engine_enabled is false)")
    lines = summary.summary_lines(_state(n1={"rank": 0, "lane": "l", "repos": repos, "engine_runs": True}))
    assert "engine" not in lines[-1]


def test_nothing_to_say_without_a_lane():
    assert summary.summary_lines(_state(other={"repos": {}})) == []


def test_an_interrupted_run_says_so_with_the_hosts_that_did_not_finish():
    """Ctrl-C: no recap. The repos the pass in flight had not reported are interrupted; a host that had
    already failed stays failed; one next step re-runs the unfinished hosts with the run's own tags."""
    done = {"preflight": plan_row(repo="a"), "stage": row(repo="a", copied=3, nbytes=MIB, duration=1.0)}
    state = dict(_state(
        n1={"rank": 0, "lane": "l", "repos": {"a": done, "b": {"preflight": plan_row(repo="b")}},
            "running": {"play": "stage", "task": "stage : Mirror | Each repo", "pass": "stage"}},
        n2={"rank": 1, "lane": "l", "repos": {"a": {"preflight": plan_row(repo="a")}},
            "running": {"play": "Write report", "task": "Report | Write", "pass": None}},
        n3={"rank": 2, "lane": "l", "repos": {}, "failed": True, "report_path": "reports/n3.json",
            "failure": {"play": "preflight", "tag": "preflight", "task": "space", "msg": "full"}},
    ), stopped="INTERRUPTED", rerun_args=["--tags", "preflight,stage"])
    lines = summary.summary_lines(state)
    assert lines[0].endswith(", run 20261130T204512Z-3fa2, INTERRUPTED")
    cells = table(lines)
    assert cells[("n1", "a")]["STATUS"] == "ok" and cells[("n1", "a")]["COPIED"] == "3"
    assert cells[("n1", "b")]["STATUS"] == "interrupted: stage: stage : Mirror | Each repo"
    assert cells[("n2", "a")]["STATUS"] == "preflight only"
    assert cells[("n2", "-")]["STATUS"] == "interrupted: Write report: Report | Write"
    assert cells[("n3", "-")]["STATUS"] == "failed: preflight: space"
    total = next(line for line in lines if line.startswith("wall time"))
    assert total == ("wall time 8.4 s; 0/3 hosts ok; copied 3 files, 1.0 MiB; repaired 0; FAILED: n3; "
                     "INTERRUPTED: n1, n2")
    assert lines[-1] == ("next step: the run was interrupted before n1, n2 finished; what is staged is kept and "
                         "reused, so re-run: ansible-playbook -i inventory/demo stage-deepseek.yml --limit n1,n2 "
                         "--tags preflight,stage")
    assert sum(line.startswith("next step: ") for line in lines) == 2     # n3's own, and the re-run
    stopped = summary.interrupted_step(["n1"], {"stopped": "STOPPED", "extra_vars": ["-e stage_verify=..."],
                                                "rerun_args": ["--check"]})
    assert stopped == ["next step: the run was stopped before n1 finished; what is staged is kept and reused, so "
                       "re-run: ansible-playbook stage-deepseek.yml --limit n1 --check  (again with -e stage_verify=...)"]


def test_the_re_run_names_the_extra_vars_by_name_never_by_the_front_ends_files_nor_by_value(tmp_path):
    """The front end writes each inline -e value to a file of its run and removes it when the run ends."""
    written = tmp_path / "runs" / "20261201T100000Z-stage-aaaa" / "extra-vars" / "extra-vars-0.json"
    written.parent.mkdir(parents=True)
    written.write_text('{"engine_env": {"HF_TOKEN": "hf_plantedSECRET"}, "stage_verify": "full"}')
    own = tmp_path / "site.yml"
    own.write_text("engine_port: 8001\n")
    named = summary.rerun_extra_vars(["@%s" % written, "@%s" % own, "engine_pull=missing token=hf_plantedSECRET"])
    assert named == ["-e engine_env=...", "-e stage_verify=...", "-e @%s" % own, "-e engine_pull=...",
                     "-e token=..."]


class _Obj(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _result(host, data, action="hf_hub_mirror"):
    return _Obj(result=data, host=_Obj(get_name=lambda: host), task=_Obj(action=action, get_name=lambda: "t"))


def test_the_callback_keeps_a_model_and_a_dataset_apart_and_notes_a_call_without_a_row():
    callback = summary.CallbackModule()
    callback._play_tags = ("stage",)
    callback.v2_runner_item_on_ok(_result("n1", {"report": row(repo="org/x", copied=4)}))
    callback.v2_runner_item_on_ok(_result("n1", {"report": dict(row(repo="org/x", copied=2),
                                                                 repo_type="dataset")}))
    callback.v2_runner_item_on_failed(_result("n1", {"msg": "lock", "item": {"repo_id": "org/y"}}))
    repos = callback.state["hosts"]["n1"]["repos"]
    assert list(repos) == ["model:org/x@main", "dataset:org/x@main", "model:org/y@main"]
    assert repos["model:org/y@main"]["stage"]["status"] == "failed"
    assert repos["model:org/y@main"]["stage"]["no_report"] is True


def test_a_failed_hosts_report_is_named_from_the_lane_report_dir(tmp_path):
    """This run's report of a failed host (the dgx_report callback wrote it) by its latest view; a host without
    the lane facts (lost before them) is looked for in the lane's report dir, named only when it is there."""
    callback = summary.CallbackModule()
    callback.v2_runner_on_ok(_result("n1", {"ansible_facts": {"lane_report_dir": str(tmp_path),
                                                              "lane_run_id": "20261130T204512Z-3fa2"}}))
    (tmp_path / "n1-20261130T204512Z-3fa2.json").write_text("{}")
    (tmp_path / "n3.json").write_text("{}")
    for name in ("n1", "n2", "n3"):
        callback._host(name)["failed"] = True
    callback._report_files()
    hosts = callback.state["hosts"]
    assert hosts["n1"]["report_path"] == str(tmp_path / "n1.json")
    assert hosts["n2"]["report_seen"] is False and "report_path" not in hosts["n2"]
    assert hosts["n3"]["report_seen"] is True and hosts["n3"]["report_file"] == str(tmp_path / "n3.json")


# ---- progress lines of the background stage and verify jobs -------------------------------------------

class _Display(object):
    verbosity = 0

    def __init__(self):
        self.lines = []

    def display(self, msg, **_kw):
        self.lines.append(msg)


class _Stdout(object):
    def __init__(self, name):
        self.CALLBACK_NAME = name
        self.retried = []

    def v2_runner_retry(self, result):
        self.retried.append(result.result)


class _QueueManager(object):
    """Calls its callbacks the way Ansible's task queue manager does: stdout first, from its own method."""

    def __init__(self, *plugins):
        self._callback_plugins = list(plugins)

    def send_callback(self, method, *args):
        for plugin in self._callback_plugins:
            if hasattr(plugin, method):
                getattr(plugin, method)(*args)


def _poll(host, line):
    return _result(host, {"line": line, "finished": False, "attempts": 1, "retries": 9}, action="mirror_job")


@pytest.mark.parametrize("stdout_name, replaced", [("default", True), ("awx_display", False), ("json", False)])
def test_a_progress_poll_retry_prints_its_line_instead_of_failed_retrying(stdout_name, replaced):
    display = _Display()
    callback = summary.CallbackModule(display=display)
    callback._watching = True             # no SIGINT handler and exit hook in the test process
    stdout = _Stdout(stdout_name)
    tqm = _QueueManager(stdout, callback)
    tqm.send_callback("v2_playbook_on_start", _Obj(_file_name="stage-deepseek.yml"))
    line = "stage org/x: 12.3 GiB of 300.0 GiB (4%), 812 MiB/s, ETA 6m12s, current: model-00003.safetensors"
    tqm.send_callback("v2_runner_retry", _poll("dgx1", line))
    other = _result("dgx1", {"attempts": 1, "retries": 3}, action="ansible.builtin.uri")
    tqm.send_callback("v2_runner_retry", other)
    if replaced:
        # The default callback's FAILED - RETRYING is left out for the poll only; the poll's line is printed.
        assert stdout.retried == [other.result]
        assert display.lines == ["[dgx1] " + line]
    else:
        # ansible-runner's retry is an event the front end reads, json prints its own: both untouched.
        assert len(stdout.retried) == 2 and display.lines == []


def test_the_row_of_a_background_job_comes_from_its_result_task():
    callback = summary.CallbackModule()
    callback._play_tags = ("verify",)
    callback.v2_runner_on_start(_Obj(get_name=lambda: "n1"), _Obj(action="mirror_job", get_name=lambda: "t"))
    assert callback.state["hosts"]["n1"]["running"]["pass"] == "verify"
    callback.v2_runner_item_on_ok(_result("n1", {"report": row(repo="org/x", verify="sample")}, action="mirror_job"))
    callback.v2_runner_item_on_failed(_result("n1", {"msg": "lock", "item": {"repo_id": "org/y"}},
                                              action="mirror_job"))
    callback.v2_runner_on_ok(_result("n1", {"line": "verify org/z: starting", "finished": False},
                                     action="mirror_job"))      # a poll: no row
    repos = callback.state["hosts"]["n1"]["repos"]
    assert list(repos) == ["model:org/x@main", "model:org/y@main"]
    assert repos["model:org/x@main"]["verify"]["verify"] == "sample"
    assert repos["model:org/y@main"]["verify"]["no_report"] is True


def test_a_run_stopped_by_ctrl_c_mid_copy_prints_its_table_once_at_exit(monkeypatch):
    """What the callback sees of a plain ansible-playbook run interrupted while the stage pass copies (the
    events of test_output's Ctrl-C run, which sends the real signal): the lane facts, the preflight plan of
    both repos, the stage play's progress poll in flight, then no stats. The table comes at exit, once (a
    late recap prints nothing more): INTERRUPTED, the plan counted as nothing done, both repos of the pass in
    flight interrupted there, and the re-run of the unfinished host with the run's own tags."""
    main, drafter = "coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw", "coolbho3k/DSpark-drafter"
    monkeypatch.setattr(summary.CallbackModule, "_quiet", lambda self: False)
    monkeypatch.setattr(summary.context, "CLIARGS", {"inventory": ("inventory/dgx",), "check": False,
                                                    "tags": ("verify", "preflight", "stage")})
    display = _Display()
    callback = summary.CallbackModule(display=display)
    callback._watching = True             # no SIGINT handler and exit hook in the test process
    callback.v2_playbook_on_start(_Obj(_file_name="stage-deepseek.yml"))
    callback.v2_runner_on_ok(_result("localhost", {"ansible_facts": {
        "lane_name": "exl3_2x", "lane_rank": 0, "lane_run_id": "20261201T233929Z-93b8"}}, action="ansible.builtin.set_fact"))
    callback.v2_playbook_on_play_start(_Obj(tags=["preflight"], get_name=lambda: "Preflight - every host, lane-wide"))
    for repo in (main, drafter):
        callback.v2_runner_item_on_ok(_result("localhost", {"report": dict(plan_row(repo=repo), phase="preflight")}))
    callback.v2_playbook_on_play_start(_Obj(tags=["stage"], get_name=lambda: "Stage - copy the selected files"))
    poll = _Obj(action="mirror_job", get_name=lambda: "stage : Mirror | Progress, pass stage, repo " + main)
    callback.v2_playbook_on_task_start(poll, False)
    callback.v2_runner_on_start(_Obj(get_name=lambda: "localhost"), poll)
    callback._interrupted = True          # what its SIGINT handler notes before Ansible stops the run
    callback._at_exit()
    callback.v2_playbook_on_stats(_Obj(failures={}, dark={}))
    lines = "\n".join(display.lines).splitlines()
    assert sum(line.startswith("DGX-STAGE LANE SUMMARY") for line in lines) == 1, lines
    assert lines[0] == "DGX-STAGE LANE SUMMARY: lane exl3_2x, 1 host, run 20261201T233929Z-93b8, INTERRUPTED"
    cells = table(lines)
    for repo in (main, drafter):
        assert cells[("localhost", repo)]["STATUS"] == "interrupted: stage: stage : Mirror | Progress, pass stage, " \
                                                      "repo " + main, cells
        assert [cells[("localhost", repo)][c] for c in ("COPIED", "REUSED", "REPAIRED", "GiB")] == ["-"] * 4
    total = next(line for line in lines if line.startswith("wall time"))
    assert total.endswith("; 0/1 hosts ok; INTERRUPTED: localhost"), total
    assert [line for line in lines if line.startswith("next step")] == [
        "next step: the run was interrupted before localhost finished; what is staged is kept and reused, so "
        "re-run: ansible-playbook -i inventory/dgx stage-deepseek.yml --limit localhost --tags preflight,stage,verify"]


# ---- the status playbook: each host's status lines in place of the table --------------------------------

def _status_callback():
    display = _Display()
    callback = summary.CallbackModule(display=display)
    callback._watching = True             # no SIGINT handler and exit hook in the test process
    callback.state.update(inventory="inventory/dgx", playbook="playbooks/status.yml")
    callback._started = 0.0
    return callback, display


def test_a_status_run_prints_each_hosts_status_lines_instead_of_an_empty_table(monkeypatch):
    monkeypatch.setattr(summary.CallbackModule, "_quiet", lambda self: False)
    callback, display = _status_callback()
    for host, rank in (("n2", 1), ("n1", 0), ("n3", 2)):
        callback.v2_runner_on_ok(_result(host, {"ansible_facts": {"lane_name": "exl3_2x", "lane_rank": rank}},
                                         action="ansible.builtin.set_fact"))
    callback.v2_runner_on_ok(_result("n2", {"lines": ["org/x@main: not staged", "engine e: disabled"],
                                            "status": {}}, action="stage_status"))
    callback.v2_runner_on_ok(_result("n1", {"lines": ["org/x@main: commit 1a2b, 5 files, 1.2 GiB local",
                                                      "bad\nn2 (rank 1): spoofed"], "status": {}},
                                     action="stage_status"))
    callback.v2_runner_on_unreachable(_result("n3", {"msg": "ssh: connect refused"}))
    stats = _Obj(failures={}, dark={"n3": 1})
    callback.v2_playbook_on_stats(stats)
    out = "\n".join(display.lines).splitlines()
    assert not any(line.startswith("HOST ") for line in out)           # no lane table
    assert out[:7] == [
        "DGX-STAGE STATUS: lane exl3_2x, 3 hosts",
        "n1 (rank 0):",
        "  org/x@main: commit 1a2b, 5 files, 1.2 GiB local",
        "  bad\\nn2 (rank 1): spoofed",                                 # one line: a newline cannot fake a host
        "n2 (rank 1):",
        "  org/x@main: not staged",
        "  engine e: disabled"]
    assert out[7] == "n3 (rank 2): unreachable: ssh: connect refused"
    assert out[8] == "2/3 hosts read; NOT READ: n3"
    assert out[9] == ("next step: check that n3 answers (ssh, its Python), then re-run: "
                      "ansible-playbook -i inventory/dgx playbooks/status.yml --limit n3")


def test_the_status_playbook_is_recognised_by_name_when_no_host_could_be_read():
    callback, _display = _status_callback()
    callback._watching = True
    callback.v2_playbook_on_start(_Obj(_file_name=os.path.join(REPO_ROOT, "playbooks", "status.yml")))
    assert callback.state["status"] is True
    lines = summary.summary_lines(dict(callback.state, hosts={"n1": {"rank": 0, "failed": True, "failure": {
        "play": "Select the lane", "task": "t", "msg": "no lane"}}}))
    assert lines == ["DGX-STAGE STATUS: lane ?, 1 host", "n1 (rank 0): failed: Select the lane: t: no lane",
                     "0/1 hosts read; NOT READ: n1"]
    callback.v2_playbook_on_start(_Obj(_file_name="stage-deepseek.yml"))
    assert callback.state["status"] is False


# ---- the stage pass block: each host's own stage window and where its bytes came from ---------------------

def _lane_run(check=False, world_size=4, readers=2, rejected_on=3):
    """A plain ansible-playbook run of a lane seen by the callback: select-lane's facts, then the stage pass in
    waves of `readers` hosts in rank order (each host's stage_window facts around its mirror_job rows), with
    fan-out (rank 0 reads the NAS alone, the others take 40 MiB from peers and read their own 8 MiB);
    `rejected_on` rejected one peer blob. Returns the printed lines."""
    display = _Display()
    callback = summary.CallbackModule(display=display)
    callback._watching = True             # no SIGINT handler and exit hook in the test process
    callback.state.update(inventory="inventory/demo-4x", playbook="stage-deepseek.yml", check_mode=check,
                          run_started="2026-12-01T10:59:58Z")
    callback._started = time.monotonic()
    names = ["dgx%d" % (rank + 1) for rank in range(world_size)]
    for rank, host in enumerate(names):
        callback.v2_runner_on_ok(_result(host, {"ansible_facts": {"lane_name": "sglang_4x", "lane_rank": rank}},
                                         action="ansible.builtin.set_fact"))
    callback._play_tags = ("stage",)
    for rank, host in enumerate(names):
        wave = rank // readers
        window = {"started": "2026-12-01T11:%02d:10Z" % (1 + 3 * wave)}
        callback.v2_runner_on_ok(_result(host, {"ansible_facts": {"stage_window": dict(window)}},
                                         action="ansible.builtin.set_fact"))
        nas, peers = (48 * MIB, 0) if rank == 0 else (8 * MIB, 40 * MIB)
        report = dict(row(repo="org/engram", copied=5, nbytes=nas + peers, duration=3.0, status="check" if check
                          else "ok", check=check), bytes_from_nas=nas, bytes_from_peers=peers,
                      peer_rejected=int(rank == rejected_on))
        callback.v2_runner_on_ok(_result(host, {"report": report}, action="mirror_job"))
        window["finished"] = "2026-12-01T11:%02d:40Z" % (3 + 3 * wave)
        callback.v2_runner_on_ok(_result(host, {"ansible_facts": {"stage_window": window}},
                                         action="ansible.builtin.set_fact"))
    callback._quiet = lambda: False
    callback.v2_playbook_on_stats(_Obj(failures={}, dark={}))
    return "\n".join(display.lines).splitlines()


def test_a_lane_run_prints_each_hosts_stage_window_and_bytes_from_the_nas_and_from_peers():
    lines = _lane_run()
    at = lines.index("Stage pass (UTC)")
    assert at == 6 and [line.split()[0] for line in lines[2:6]] == ["dgx1", "dgx2", "dgx3", "dgx4"]   # the table
    assert lines[at:at + 7] == [
        "Stage pass (UTC)",
        "HOST  STAGE WINDOW       FROM NAS  FROM PEERS  PEER REJECTED",
        "dgx1  11:01:10-11:03:40  48.0 MiB  0 B         0",
        "dgx2  11:01:10-11:03:40  8.0 MiB   40.0 MiB    0",
        "dgx3  11:04:10-11:06:40  8.0 MiB   40.0 MiB    0",
        "dgx4  11:04:10-11:06:40  8.0 MiB   40.0 MiB    1",
        "lane: 72.0 MiB from the NAS, 120.0 MiB from peers"]
    assert lines[at + 7].startswith("wall time ") and "4/4 hosts ok" in lines[at + 7]


def test_no_rejected_column_without_a_rejection_and_a_check_run_read_nothing():
    lines = _lane_run(world_size=2, rejected_on=None)
    at = lines.index("Stage pass (UTC)")
    assert lines[at + 1] == "HOST  STAGE WINDOW       FROM NAS  FROM PEERS"
    lines = _lane_run(check=True, world_size=2, rejected_on=None)
    at = lines.index("Stage pass (UTC)")
    assert lines[at + 2:at + 4] == ["dgx1  11:01:10-11:03:40  -         -", "dgx2  11:01:10-11:03:40  -         -"]
    assert lines[at + 4].startswith("wall time ")     # no lane total: nothing was read


def test_a_single_host_staging_from_the_nas_prints_no_stage_pass_block():
    lines = _lane_run(world_size=1)
    assert not any(line.startswith("Stage pass") for line in lines)
    assert lines[3].startswith("wall time ") and len(lines) == 4          # head, table header, row, total
    # Alone but with peer bytes (or a rejected peer blob): the block shows.
    hosts = {"n1": {"rank": 1, "repos": {"a": {"stage": dict(row(repo="a", nbytes=MIB), bytes_from_peers=MIB)}},
                    "stage_window": {"started": "2026-12-01T23:59:59Z", "finished": "2026-12-02T00:00:09Z"}}}
    assert summary.stage_pass_lines(hosts, ["n1"], run_started="2026-12-01T23:00:00Z") == [
        "Stage pass (UTC)", "HOST  STAGE WINDOW                    FROM NAS  FROM PEERS",
        "n1    23:59:59 - 2026-12-02 00:00:09  0 B       1.0 MiB"]


def test_a_row_without_bytes_from_nas_read_its_copies_from_the_nas_and_a_window_may_lack_its_end():
    info = {"repos": {"a": {"stage": row(repo="a", nbytes=3 * MIB)},
                      "b": {"stage": dict(row(repo="b", nbytes=5 * MIB), bytes_from_peers=2 * MIB,
                                          peer_rejected=[{"blob": "x"}])},
                      "c": {"preflight": plan_row(repo="c")}}}
    assert summary.stage_figures(info) == (6 * MIB, 2 * MIB, 1, True)
    assert summary.stage_window({"started": "2026-12-01T11:01:10Z"}, "2026-12-01T11:00:00Z") == "11:01:10-?"
    assert summary.stage_window({}, "2026-12-01T11:00:00Z") == "-"


def test_a_failed_host_to_host_copy_is_said_under_the_stage_pass_block():
    # The stage role's ok debug result says it; with display_ok_hosts = false nothing else would.
    hosts = {"n1": {"rank": 0, "repos": {"a": {"stage": dict(row(repo="a", nbytes=MIB), bytes_from_nas=MIB)}},
                    "stage_window": {"started": "2026-12-01T11:00:00Z", "finished": "2026-12-01T11:00:09Z"}},
             "n2": {"rank": 1, "repos": {"a": {"stage": dict(row(repo="a", nbytes=MIB), bytes_from_nas=MIB)}},
                    "stage_window": {"started": "2026-12-01T11:00:09Z", "finished": "2026-12-01T11:00:19Z"},
                    "peer_copy_failed": ["org/a: the copy from n1 failed (unreachable: no route); its blobs come "
                                         "from the NAS"]}}
    lines = summary.stage_pass_lines(hosts, ["n1", "n2"], run_started="2026-12-01T11:00:00Z")
    assert lines[-1] == "n2: org/a: the copy from n1 failed (unreachable: no route); its blobs come from the NAS"
    assert lines[-2].startswith("lane: ")


def test_the_callback_collects_the_failed_copy_message_of_the_stage_roles_task():
    callback = summary.CallbackModule(display=_Display())
    task = _Obj(action="ansible.builtin.debug", get_name=lambda: "stage : " + summary.PEER_COPY_FAILED)
    result = _Obj(host=_Obj(get_name=lambda: "n2"), task=task,
                  result={"msg": "org/a: the copy from n1 failed\n(rc 255: x); its blobs come from the NAS"})
    callback.v2_runner_item_on_ok(result)
    assert callback.state["hosts"]["n2"]["peer_copy_failed"] == [
        "org/a: the copy from n1 failed (rc 255: x); its blobs come from the NAS"]


# ---- recorded runs: the table of what the callback received from a real run ---------------------------------
# tests/unit/fixtures/summary/<run>.json: the callback events of a real `ansible-playbook stage-deepseek.yml` run
# on the synthetic NAS hub (tests/nashub.py, one local host), in order, each result trimmed to the keys the
# callback reads and its paths made neutral (/data/lane: the run's directory); "cli" is the run's command line as
# Ansible's context holds it.

SUMMARY_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "summary")
MAIN_REPO = "coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw"
DRAFTER_REPO = "coolbho3k/DSpark-drafter"


def _recorded_task(info):
    return _Obj(action=info["action"], ignore_errors=info["ignore_errors"], get_name=lambda: info["name"])


def replay(name, monkeypatch):
    """The lines the callback prints for a recorded run: (exit code of the run, lines)."""
    with open(os.path.join(SUMMARY_FIXTURES, name + ".json")) as handle:
        run = json.load(handle)
    monkeypatch.setattr(summary.context, "CLIARGS", dict((key, tuple(value) if isinstance(value, list) else value)
                                                          for key, value in run["cli"].items()))
    monkeypatch.setattr(summary.CallbackModule, "_quiet", lambda self: False)
    display = _Display()
    callback = summary.CallbackModule(display=display)
    callback._watching = True             # no SIGINT handler and exit hook in the test process
    callback.v2_playbook_on_start(_Obj(_file_name=run["playbook"]))
    for event in run["events"]:
        kind = event[0]
        if kind == "play":
            callback.v2_playbook_on_play_start(_Obj(tags=event[1]["tags"], get_name=lambda n=event[1]["name"]: n))
        elif kind == "task":
            callback.v2_playbook_on_task_start(_recorded_task(event[1]), False)
        elif kind == "start":
            callback.v2_runner_on_start(_Obj(get_name=lambda h=event[1]: h), _recorded_task(event[2]))
        elif kind == "stats":
            callback.v2_playbook_on_stats(_Obj(**event[1]))
        else:
            host, task, data, extra = event[1], _recorded_task(event[2]), event[3], event[4]
            result = _Obj(result=data, host=_Obj(get_name=lambda h=host: h), task=task)
            handler = getattr(callback, "v2_runner_" + kind.replace("item_", "item_on_") if kind.startswith("item_")
                              else "v2_runner_on_" + kind)
            handler(result, **extra)
    return run["rc"], "\n".join(display.lines).splitlines()


def summary_parts(lines):
    """(title line, [{column: cell}] in order, total line, the lines after it) of one printed summary."""
    [start] = [i for i, line in enumerate(lines) if line.startswith("DGX-STAGE LANE SUMMARY")]
    header = re.split(r"\s{2,}", lines[start + 1])
    rows, end = [], start + 2
    while not lines[end].startswith("wall time"):
        rows.append(dict(zip(header, re.split(r"\s{2,}", lines[end], maxsplit=len(header) - 1))))
        end += 1
    return lines[start], rows, lines[end], lines[end + 1:]


def test_a_verify_pass_on_an_empty_root_counts_nothing_and_asks_for_the_stage_play(monkeypatch):
    """--tags preflight,verify on a node with nothing staged: the verify pass refuses, writing nothing. The table
    says that (not the preflight's plan as copied), and the next step follows the message: the stage play, then
    verify - not verify alone, which fails again."""
    code, lines = replay("verify-empty-root", monkeypatch)
    assert code != 0
    _title, rows, total, after = summary_parts(lines)
    assert [(r["REPO"], r["COPIED"], r["REUSED"], r["GiB"], r["VERIFY"]) for r in rows] == [
        (MAIN_REPO, "0", "0", "0.00", "sample"), (DRAFTER_REPO, "0", "0", "0.00", "sample")]
    assert all(r["STATUS"].startswith("failed: verify: ") for r in rows), rows
    assert "; 0/1 hosts ok; copied 0 files, 0 B; repaired 0; FAILED: localhost" in total, total
    assert "not staged on this node" in after[0]
    assert after[1].endswith("--limit localhost  (or only those plays: --tags stage,verify)"), after[1]


def test_a_repo_whose_stage_call_failed_without_a_result_is_failed_and_counts_nothing(monkeypatch):
    """Another run held the drafter's lock past stage_lock_timeout: the module refused with no result. The
    drafter's row fails (it was not copied; the preflight plan is not shown as copied) and the totals count only
    what the main repo copied."""
    code, lines = replay("lock-held", monkeypatch)
    assert code != 0
    _title, rows, total, after = summary_parts(lines)
    row = dict((r["REPO"], r) for r in rows)
    assert row[MAIN_REPO]["STATUS"] == "ok" and int(row[MAIN_REPO]["COPIED"]) > 0
    drafter = row[DRAFTER_REPO]
    assert (drafter["COPIED"], drafter["GiB"]) == ("-", "-"), rows
    assert drafter["STATUS"].startswith("failed: stage: "), rows
    assert "; copied %s files, " % row[MAIN_REPO]["COPIED"] in total, total
    assert "holds" in after[0] and "lock_timeout" in after[0]


def test_a_repo_refused_by_preflight_leaves_the_other_plan_uncounted(monkeypatch):
    """Preflight refused the main repo (a revision the NAS does not have): nothing was written, so the drafter's
    plan is no copy - its row says only the preflight ran over it."""
    code, lines = replay("preflight-refused", monkeypatch)
    assert code != 0
    _title, rows, total, _after = summary_parts(lines)
    row = dict((r["REPO"], r) for r in rows)
    assert row[MAIN_REPO]["STATUS"].startswith("failed: preflight: "), rows
    assert (row[DRAFTER_REPO]["COPIED"], row[DRAFTER_REPO]["STATUS"]) == ("-", "preflight only"), rows
    assert "copied" not in total and "; 0/1 hosts ok; FAILED: localhost" in total, total


def test_a_model_and_a_dataset_with_one_id_get_a_row_each(monkeypatch):
    code, lines = replay("model-and-dataset", monkeypatch)
    assert code == 0
    _title, rows, total, _after = summary_parts(lines)
    assert [r["REPO"] for r in rows] == [DRAFTER_REPO, DRAFTER_REPO + " (dataset)"], rows
    copied = [int(r["COPIED"]) for r in rows]
    assert copied[0] > 0 and copied[0] == copied[1] and "copied %d files" % sum(copied) in total


def test_a_direct_playbook_run_warns_of_each_extra_var_dgx_stage_would_refuse(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    n1: {ansible_connection: local, site_tuning: 1}\n")
    warnings = summary.extra_var_warnings(["stage_verfy=full", "site_tuning=2", "stage_verify=full", "lane_rank"],
                                          [str(inventory)])
    assert len(warnings) == 2, warnings
    assert "-e stage_verfy: no play or role reads stage_verfy; did you mean stage_verify?" in warnings[0]
    assert "-e lane_rank has no value" in warnings[1]
    assert summary.extra_var_warnings([], [str(inventory)]) == []
    # A value that does not parse is named by its place: its text may be a token.
    assert summary.extra_var_warnings(["stage_verify=full", '{"engine_env": {"HF_TOKEN": "hf_SECRET"}'],
                                      [str(inventory)]) == [
        "the 2nd -e does not parse as JSON or YAML (at its end: a bracket or a quote is not closed); its text is not "
        "shown, as it may hold a secret"]


@pytest.mark.parametrize("front_end, printed", [(False, True), (True, False)])
def test_under_the_front_end_the_run_has_one_table_its_own(monkeypatch, front_end, printed):
    """The front end draws the run's table from the host reports: the callback draws none beside it, not even
    into the full log; a plain ansible-playbook run gets the lane summary."""
    monkeypatch.delenv(summary.FRONT_END_RUN, raising=False)
    if front_end:
        monkeypatch.setenv(summary.FRONT_END_RUN, "20261201T233929Z-93b8")
    monkeypatch.setattr(summary.context, "CLIARGS", {"inventory": ("inventory/dgx",), "check": False, "tags": ()})
    display = _Display()
    callback = summary.CallbackModule(display=display)
    callback._watching = True
    callback.v2_playbook_on_start(_Obj(_file_name="stage-deepseek.yml"))
    callback.v2_runner_on_ok(_result("localhost", {"ansible_facts": {
        "lane_name": "exl3_2x", "lane_rank": 0, "lane_run_id": "20261201T233929Z-93b8"}}, action="ansible.builtin.set_fact"))
    callback.v2_playbook_on_stats(_Obj(failures={}, dark={}))
    assert any(line.startswith("DGX-STAGE LANE SUMMARY") for line in display.lines) is printed, display.lines
