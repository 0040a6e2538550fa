"""What a run of the playbooks without the front end prints besides Ansible's own output: the lane summary
(dgx_stage/summary.py, printed by the dgx_report callback from the host reports it wrote) and the dgx_stdout
callback's lines (copy progress, the status play's lines). The table itself is test_frontend_table.py's."""
import importlib.util
import os
import sys

import pytest

from dgx_stage import summary

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_ID = "20261130T204512Z-3fa2"
RUN = {"id": RUN_ID, "inventory": "inventory/dgx", "playbook": "stage-deepseek.yml", "check": False, "wall_s": 8.44}


def _plugin(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, "callback_plugins", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(host, rank, status="ok", lane="exl3_2x", **fields):
    return dict({"host": host, "run_id": RUN_ID, "rank": rank, "lane": lane, "status": status,
                 "passes": {"stage": [{"repo_id": "org/x", "bytes_copied": 1024 * 1024, "duration_s": 1.0,
                                       "files": {"local": 3, "excluded": 0}, "blobs": {"repaired": 0}}]}}, **fields)


def _paths(reports):
    return dict((host, "/srv/reports/%s-%s.json" % (host, RUN_ID)) for host in reports)


def lane(reports, run=None, stopped=None, engine_runs=None):
    return summary.lane_summary(reports, _paths(reports), dict(RUN, **(run or {})), stopped, engine_runs)


FAILED = {"failed_play": "stage", "failed_task": "stage : Mirror | x", "failed_msg": "1 NAS blob(s)\n do not hold"}


def test_the_summary_is_the_reports_table_in_rank_order_under_one_title():
    lines = lane({"n2": report("n2", 1), "n1": report("n1", 0)})
    assert lines[0] == "DGX-STAGE LANE SUMMARY: lane exl3_2x, 2 hosts, run %s" % RUN_ID
    rows = [line.split()[:4] for line in lines[1].splitlines()[:3]]
    assert rows == [["HOST", "RUN", "STATUS", "FILES"], ["n1", RUN_ID, "ok", "3/0"], ["n2", RUN_ID, "ok", "3/0"]]
    assert all(len(line) <= 100 for line in lines[1].splitlines())          # folded for a 100-column terminal
    assert lines[-1] == "wall time 8s; 2/2 hosts ok"


def test_nothing_to_say_without_a_report():
    assert lane({}) == []


def test_a_failed_host_is_named_as_the_front_end_names_it_with_what_to_read_and_run():
    lines = lane({"dgx2": report("dgx2", 0, "failed", **FAILED)})
    assert lines[-3] == "wall time 8s; 0/1 hosts ok; FAILED: dgx2"
    assert lines[-2] == "host dgx2 failed in play stage, task stage : Mirror | x: 1 NAS blob(s) do not hold"
    assert lines[-1] == ("next step: read the error above and the host report /srv/reports/dgx2.json; fix the cause, "
                         "then re-run: ansible-playbook -i inventory/dgx stage-deepseek.yml --limit dgx2  "
                         "(or only that play: --tags stage)")


def test_a_host_that_became_unreachable_is_asked_to_answer():
    lines = lane({"dgx3": report("dgx3", 0, "failed", failed_play="stage", failed_task="(host unreachable)",
                                 failed_msg="dgx3 did not reach the end of the run")})
    assert lines[-2].startswith("host dgx3 unreachable in play stage")
    assert lines[-1] == ("next step: check that dgx3 answers (ssh, its Python), then re-run: "
                         "ansible-playbook -i inventory/dgx stage-deepseek.yml --limit dgx3")


def test_a_message_is_one_line_cut_for_the_screen():
    lines = lane({"n1": report("n1", 0, "failed", failed_play="stage", failed_task="t",
                               failed_msg="bad\x1b[31m" + " padding" * 60)})
    assert lines[-2].endswith("...") and "\x1b" not in lines[-2] and "\\x1b" in lines[-2]


NOT_STAGED = ("hf_hub_mirror a: 11 of the 11 selected file(s) of a@b7a6f9ba26b1 are not staged on this node (x): "
              "this verify pass proves the local copy and copies nothing (copy_missing=false). Stage them first, "
              "which verifies too: `dgx-stage stage --limit n1`; nothing was written")


def test_the_next_step_follows_what_the_failure_asks_for():
    """verify refused for files not staged says to stage: re-running only verify fails again."""
    assert summary.tags_asked(NOT_STAGED) == ["preflight", "stage", "verify", "manifest"]
    assert summary.tags_asked("run --tags=stage,verify or --tags receipts") == ["stage", "verify", "receipts"]
    lines = lane({"n1": report("n1", 0, "failed", failed_play="verify", failed_task="t", failed_msg=NOT_STAGED)})
    assert lines[-1].endswith("--limit n1  (or only those plays: --tags preflight,stage,verify,manifest)")


def test_the_next_step_names_the_whole_lane_when_its_engine_runs():
    """The engine play refuses --limit on part of a lane: a re-run that reaches it names every rank; a
    pre-engine play alone may still be re-run on the failed host."""
    reports = {"dgx1": report("dgx1", 0), "dgx2": report("dgx2", 1, "failed", failed_play="stage", failed_task="t",
                                                         failed_msg="bad")}
    step = lane(reports, engine_runs={"dgx1": True, "dgx2": True})[-1]
    assert "stage-deepseek.yml --limit dgx1,dgx2  (or only that play on dgx2: " in step
    assert "--limit dgx2 --tags stage)" in step and step.endswith("; the whole lane dgx1,dgx2, as its engine "
                                                                  "restarts as one")
    engine = summary.rerun_command(RUN, "dgx2", "engine", "bad", lane=["dgx1", "dgx2"])
    assert "--limit dgx1,dgx2  (or only that play: --tags engine)" in engine and "--limit dgx2 " not in engine
    alone = lane(reports, engine_runs={"dgx1": False, "dgx2": False})[-1]
    assert "--limit dgx2" in alone and "dgx1" not in alone


def test_check_mode_and_an_engine_left_off_are_said_once():
    checked = lane({"n1": report("n1", 0, "check")}, run={"check": True}, engine_runs={"n1": False})
    assert checked[0].endswith("CHECK MODE (nothing was written)")
    assert checked[-1] == "wall time 8s; 1/1 hosts checked"
    idle = lane({"n1": report("n1", 0)}, engine_runs={"n1": False})
    assert idle[-1] == "wall time 8s; 1/1 hosts ok; engine not started (engine_enabled is false)"


def test_an_interrupted_run_marks_its_unfinished_hosts_and_re_runs_them_with_its_own_tags():
    """Ctrl-C: the reports of the hosts that did not finish still say running (never ok); the summary says
    interrupted, and one next step re-runs them; a host that had failed stays failed."""
    reports = {"n1": report("n1", 0, "running"), "n2": report("n2", 1, "running"),
               "n3": report("n3", 2, "failed", failed_play="preflight", failed_task="space", failed_msg="full")}
    lines = lane(reports, run={"rerun_args": ["--tags", "preflight,stage"]}, stopped="INTERRUPTED")
    assert lines[0].endswith(", run %s, INTERRUPTED" % RUN_ID)
    assert [line.split()[2] for line in lines[1].splitlines()[1:4]] == ["interrupted", "interrupted", "failed"]
    assert reports["n1"]["status"] == "running"      # the reports are the writer's: the summary changes none
    total = next(line for line in lines if line.startswith("wall time"))
    assert total == "wall time 8s; 0/3 hosts ok; FAILED: n3; INTERRUPTED: n1, n2"
    assert lines[-1] == ("next step: the run was interrupted before n1, n2 finished; what is staged is kept and "
                         "reused, so re-run: ansible-playbook -i inventory/dgx stage-deepseek.yml --limit n1,n2 "
                         "--tags preflight,stage")
    stopped = lane({"n1": report("n1", 0, "running")}, run={"inventory": None, "extra_vars": ["-e stage_verify=..."],
                                                            "rerun_args": ["--check"]}, stopped="STOPPED")
    assert stopped[-1] == ("next step: the run was stopped before n1 finished; what is staged is kept and reused, so "
                           "re-run: ansible-playbook stage-deepseek.yml --limit n1 --check  (again with "
                           "-e stage_verify=...)")


def test_the_run_is_named_from_ansibles_command_line():
    run = summary.run_of({"inventory": ("/elsewhere/inv",), "tags": ("verify", "preflight", "stage"),
                          "check": True, "extra_vars": ()}, os.path.join(REPO_ROOT, "stage-deepseek.yml"), REPO_ROOT)
    assert run == {"inventory": "/elsewhere/inv", "playbook": "stage-deepseek.yml", "check": True,
                   "rerun_args": ["--tags", "preflight,stage,verify", "--check"], "extra_vars": []}


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


@pytest.mark.parametrize("stdout, environ, wanted", [
    ("dgx_stdout", {}, True), ("ansible.builtin.json", {}, False), ("awx_display", {summary.FRONT_END_RUN: RUN_ID},
                                                                    False)])
def test_under_the_front_end_or_into_json_there_is_no_summary(stdout, environ, wanted):
    """The front end draws the run's table from the same reports: one table a run."""
    assert summary.summary_wanted(stdout, environ) is wanted


# ---- the collector prints the summary once its reports are final -----------------------------------------

class _Obj(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Display(object):
    verbosity = 0

    def __init__(self):
        self.lines, self.problems = [], []

    def display(self, msg, **_kw):
        self.lines += msg.splitlines()

    def warning(self, msg, **_kw):
        self.problems.append(msg)

    error = warning


def _host(name):
    return _Obj(get_name=lambda: name)


def _result(host, data, action="ansible.builtin.set_fact", name="t"):
    task = _Obj(action=action, ignore_unreachable=False, get_name=lambda: name, get_vars=lambda: {})
    return _Obj(result=data, host=_host(host), task=task, task_fields={"name": name})


def test_the_collector_prints_the_summary_after_its_last_write_once(tmp_path, monkeypatch):
    dgx_report = _plugin("dgx_report")
    monkeypatch.setattr(dgx_report.context, "CLIARGS", {"inventory": ("inventory/dgx",), "check": False,
                                                        "tags": ("all",)})
    monkeypatch.setattr(dgx_report.summary, "summary_wanted", lambda stdout: True)
    display = _Display()
    callback = dgx_report.CallbackModule(display=display)
    monkeypatch.setattr(dgx_report.atexit, "register", lambda hook: None)      # no exit hook in the test process
    monkeypatch.setattr(dgx_report.signal, "signal", lambda *args: None)
    callback.v2_playbook_on_start(_Obj(_file_name="stage-deepseek.yml"))
    facts = {"lane_name": "exl3_2x", "lane_hosts": ["n1"], "lane_targets": ["n1"], "lane_rank": 0,
             "lane_world_size": 1, "lane_run_id": RUN_ID, "lane_run_started": "2026-11-30T20:45:12Z",
             "lane_report_dir": str(tmp_path), "lane_engine_runs": False}
    callback.v2_runner_on_ok(_result("n1", {"ansible_facts": facts}))
    callback.v2_playbook_on_play_start(_Obj(get_vars=lambda: {"dgx_play": "preflight"}))
    callback.v2_runner_on_start(_host("n1"), _Obj(get_vars=lambda: {}))
    callback.v2_runner_on_ok(_result("n1", {"changed": False}, action="hf_hub_mirror"))
    callback.v2_playbook_on_stats(_Obj(failures={}, dark={}))
    callback._at_exit()                                  # the exit after the stats: nothing more
    assert display.problems == []
    assert display.lines[0] == "DGX-STAGE LANE SUMMARY: lane exl3_2x, 1 host, run %s" % RUN_ID
    assert display.lines[2].split()[:3] == ["n1", RUN_ID, "ok"]        # the report as written at the end
    assert display.lines[-1].endswith("; 1/1 hosts ok; engine not started (engine_enabled is false)")
    assert sum(line.startswith("DGX-STAGE") for line in display.lines) == 1
    assert sorted(os.listdir(str(tmp_path))) == ["n1-%s.json" % RUN_ID, "n1.json"]


# ---- the stdout callback ----------------------------------------------------------------------------------

@pytest.fixture
def stdout(monkeypatch):
    from ansible.plugins.loader import callback_loader
    callback = callback_loader.get("dgx_stdout")      # as Ansible loads it: its options are the default's
    callback.set_options()
    dgx_stdout = sys.modules[type(callback).__module__]
    display = _Display()
    callback._display = display
    retried = []
    monkeypatch.setattr(dgx_stdout.DefaultCallback, "v2_runner_retry", lambda self, result: retried.append(result))
    monkeypatch.setattr(dgx_stdout.DefaultCallback, "v2_runner_on_ok", lambda self, result: None)
    monkeypatch.setattr(dgx_stdout.DefaultCallback, "v2_runner_on_unreachable", lambda self, result: None)
    monkeypatch.setattr(dgx_stdout.DefaultCallback, "v2_playbook_on_stats", lambda self, stats: None)
    monkeypatch.setattr(dgx_stdout.context, "CLIARGS", {"inventory": ("inventory/dgx",), "check": False})
    return dgx_stdout, callback, display, retried


def test_a_progress_poll_retry_prints_its_line_instead_of_failed_retrying(stdout):
    _module, callback, display, retried = stdout
    line = "stage org/x: 12.3 GiB of 300.0 GiB (4%), 812 MiB/s, ETA 6m12s, current: model-00003.safetensors"
    callback.v2_runner_retry(_result("dgx1", {"line": line, "attempts": 1, "retries": 9}, action="mirror_job"))
    other = _result("dgx1", {"attempts": 1, "retries": 3}, action="ansible.builtin.uri")
    callback.v2_runner_retry(other)
    assert display.lines == ["[dgx1] " + line] and retried == [other]
    # A NAS file name in the line must not forge a line or drive the terminal.
    callback.v2_runner_retry(_result("dgx1", {"line": "stage org/x: current: a\nb\x1b[2J"}, action="mirror_job"))
    assert display.lines[-1] == "[dgx1] stage org/x: current: a\\nb\\x1b[2J"


def test_a_status_run_prints_each_hosts_status_lines_in_rank_order(stdout):
    _module, callback, display, _retried = stdout
    callback._playbook = "playbooks/status.yml"
    for host, rank in (("n2", "1"), ("n1", "0"), ("n3", "2")):
        callback.v2_runner_on_ok(_result(host, {"ansible_facts": {"lane_name": "exl3_2x", "lane_rank": rank}}))
    callback.v2_runner_on_ok(_result("n2", {"lines": ["org/x@main: not staged", "engine e: disabled"]},
                                     action="stage_status"))
    callback.v2_runner_on_ok(_result("n1", {"lines": ["org/x@main: commit 1a2b, 5 files, 1.2 GiB local",
                                                      "bad\nn2 (rank 1): spoofed"]}, action="stage_status"))
    callback.v2_runner_on_unreachable(_result("n3", {"msg": "ssh: connect refused"}))
    callback.v2_playbook_on_stats(_Obj(failures={}, dark={"n3": 1}))
    assert display.lines == [
        "DGX-STAGE STATUS: lane exl3_2x, 3 hosts",
        "n1 (rank 0):",
        "  org/x@main: commit 1a2b, 5 files, 1.2 GiB local",
        "  bad\\nn2 (rank 1): spoofed",                                 # one line: a newline cannot fake a host
        "n2 (rank 1):",
        "  org/x@main: not staged",
        "  engine e: disabled",
        "n3 (rank 2): unreachable: ssh: connect refused",
        "2/3 hosts read; NOT READ: n3",
        "next step: check that n3 answers (ssh, its Python), then re-run: "
        "ansible-playbook -i inventory/dgx playbooks/status.yml --limit n3"]


def test_a_failed_status_host_says_where_and_a_stage_run_prints_no_status_lines(stdout):
    _module, callback, display, _retried = stdout
    assert summary.status_lines({"n1": {"rank": 0, "failure": {"play": "Select the lane", "task": "t",
                                                               "msg": "no lane"}}}, RUN) == [
        "DGX-STAGE STATUS: lane ?, 1 host", "n1 (rank 0): failed: Select the lane: t: no lane",
        "0/1 hosts read; NOT READ: n1"]
    callback._playbook = "stage-deepseek.yml"
    callback.v2_runner_on_ok(_result("n1", {"ansible_facts": {"lane_name": "exl3_2x", "lane_rank": "0"}}))
    callback.v2_playbook_on_stats(_Obj(failures={}, dark={}))
    assert display.lines == []


def test_a_no_log_failure_reaches_the_default_printer_without_its_exception(stdout, monkeypatch):
    dgx_stdout, callback, _display, _retried = stdout
    printed = []
    monkeypatch.setattr(dgx_stdout.DefaultCallback, "v2_runner_on_failed",
                        lambda self, result, ignore_errors=False: printed.append(dict(result.result)))
    hidden = {"censored": "the output has been hidden", "exception": "Action failed: hf_SECRETVALUE", "failed": True}
    callback.v2_runner_on_failed(_result("n1", hidden, action="ansible.builtin.fail"), ignore_errors=True)
    shown = {"msg": "no such file", "exception": "Traceback: no such file", "failed": True}
    callback.v2_runner_on_failed(_result("n1", shown, action="ansible.builtin.file"), ignore_errors=True)
    assert "SECRETVALUE" not in repr(printed[0]) and printed[0]["censored"]
    assert printed[1]["exception"] == "Traceback: no such file"       # a result not hidden keeps it


def test_host_and_lane_names_with_control_characters_cannot_forge_summary_or_status_lines():
    host, bad = "n\x1b[2J1\nfake", "\x1b]0;t\x07lane"
    lines = lane({host: report(host, 0, "failed", lane=bad, **FAILED)})
    status = summary.status_lines({host: {"rank": 0, "lane": bad, "lines": ["ok\rforged"]},
                                   "n2": {"unreachable": True, "failure": {"msg": "ssh\x1b[2J"}}}, RUN)
    for line in lines[:1] + lines[2:] + status:
        assert not any(ch in line for ch in "\x1b\x07\n\r"), repr(line)
    assert lines[0].startswith("DGX-STAGE LANE SUMMARY: lane \\x1b]0;t\\x07lane, 1 host")
    assert status[1:3] == ["n\\x1b[2J1\\nfake (rank 0):", "  ok\\rforged"]
