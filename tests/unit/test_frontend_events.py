"""dgx_stage.events and dgx_stage.display: synthetic events shaped like ansible-runner's (the keys a real
run's job_events carry: event, event_data.host/play/task/task_action/res, stdout, pid)."""
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this tree's
from dgx_stage.display import Display  # noqa: E402
from dgx_stage import runs  # noqa: E402
from dgx_stage.events import RunState, result_message  # noqa: E402
from ansible.module_utils import dgx_report  # noqa: E402  (runs puts the project's module_utils on the path)

REPO_ID = "deepseek-ai/X"


def event(name, host=None, action=None, res=None, play="Stage - copy", task="Mirror | poll", **data):
    event_data = dict(data, play=play, task=task)
    if host:
        event_data["host"] = host
    if action:
        event_data["task_action"] = action
    if res is not None:
        event_data["res"] = res
    return {"event": name, "event_data": event_data, "stdout": "", "pid": 4242, "counter": 1}


def poll(host, done, total=300, finished=False, name="runner_retry"):
    progress = {"repo_id": REPO_ID, "pass": "stage", "current": "model-00003.safetensors", "files_done": 1,
                "files_total": 9, "bytes_done": done, "bytes_total": total, "mib_per_s": 812.0, "eta_s": 372,
                "finished": finished, "aborted": False, "updated_at": "2026-12-01T10:00:00Z"}
    line = "stage %s: %d of %d%s" % (REPO_ID, done, total, ", done" if finished else "")
    return event(name, host, "mirror_job", {"progress": progress, "finished": finished, "line": line,
                                                "attempts": 2})


def stats(failures=None, dark=None, ok=None):
    return {"event": "playbook_on_stats", "stdout": "PLAY RECAP",
            "event_data": {"failures": failures or {}, "dark": dark or {}, "ok": ok or {}, "rescued": {}}}


def test_progress_polls_update_the_host_and_are_reported_as_updates():
    state = RunState()
    assert state.handle(poll("dgx1", 12)) == [("progress", "dgx1", state.progress["dgx1"])]
    state.handle(poll("dgx2", 40))
    updates = state.handle(poll("dgx1", 300, finished=True, name="runner_on_ok"))
    assert updates[0][1] == "dgx1" and updates[0][2]["finished"] is True
    assert state.progress["dgx1"]["progress"]["bytes_done"] == 300 and state.progress["dgx2"]["progress"]["bytes_done"] == 40
    assert state.pid == 4242
    # A fully qualified action counts; another module's retries do not.
    assert state.handle(dict(poll("dgx1", 5), event_data=dict(poll("dgx1", 5)["event_data"],
                                                               task_action="local.dgx.mirror_job")))
    other = poll("dgx1", 7)
    other["event_data"]["task_action"] = "ansible.builtin.async_status"
    assert state.handle(other) == [] and state.progress["dgx1"]["progress"]["bytes_done"] == 5


def test_looped_mirror_job_items_each_update_their_host():
    state = RunState()
    item = poll("dgx1", 300, finished=True)["event_data"]["res"]
    updates = state.handle(event("runner_on_ok", "dgx1", "mirror_job", {"results": [item, dict(item, line="x")]}))
    assert [u[2]["line"] for u in updates] == [item["line"], "x"]


def test_report_dirs_receipts_and_status_lines_are_taken_from_their_results(tmp_path):
    state = RunState()
    # The lane facts name where the dgx_report callback writes the host reports; run.py reads them there.
    state.handle(event("runner_on_ok", "rank0", "set_fact", {"ansible_facts": {"lane_report_dir": str(tmp_path)}}))
    state.handle(event("runner_on_ok", "rank1", "set_fact", {"ansible_facts": {"lane_report_dir": str(tmp_path),
                                                                                "lane_name": "l"}}))
    state.handle(event("runner_on_ok", "rank1", "set_fact", {"ansible_facts": {"lane_rank": 1}}))
    assert state.report_dirs == [str(tmp_path)] and state.lanes == {"rank1": {"lane": "l", "rank": 1}}
    run = {"id": "20261201T100609Z-be99", "started": "2026-12-01T10:06:09Z", "tags": [], "skip_tags": [],
           "check": False}
    for host in ("rank0", "rank1"):
        dgx_report.end_reports(str(tmp_path), host, run, reached_end=host == "rank0")
    dgx_report.end_reports(str(tmp_path), "rank0", dict(run, id="20261130T100609Z-aa00"), reached_end=True)
    reports, paths = runs.run_reports(state.report_dirs, run["id"])
    assert reports["rank0"]["status"] == "ok" and reports["rank1"]["status"] == "failed" and len(reports) == 2
    assert paths["rank1"] == str(tmp_path / "rank1-20261201T100609Z-be99.json")
    state.handle(event("runner_on_ok", "rank1", "engine_receipts", {"removed": ["/c/a", "/c/b"]}))
    state.handle(event("runner_on_ok", "rank0", "engine_receipts", {"removed": []}))
    assert state.receipts_removed == {"rank1": ["/c/a", "/c/b"], "rank0": []}
    state.handle(event("runner_on_ok", "rank0", "stage_status", {"lines": ["a: staged", "receipts: none"]}))
    assert state.status_lines == {"rank0": ["a: staged", "receipts: none"]}


def test_failed_hosts_are_those_the_recap_counts_with_the_reports_task_preferred():
    state = RunState()
    # A failure a rescue handled (not counted in the recap) and an ignored one: not named.
    state.handle(event("runner_on_failed", "rank0", "command", {"msg": "rescued"}))
    state.handle(event("runner_on_failed", "rank2", "command", {"msg": "ignored"}, ignore_errors=True))
    state.handle(event("runner_on_failed", "rank1", "fail", {"msg": "Fail the host"}, play="Stage", task="Fail"))
    state.handle(event("runner_on_unreachable", "rank3", None, {"msg": "ssh: no route"}, play="Preflight",
                       task="Gathering Facts"))
    state.reports["rank1"] = {   # as run.py reads it from the host report's file
        "host": "rank1", "run_id": "r", "status": "failed", "failed_play": "stage",
        "failed_task": "Mirror | Each repo", "failed_msg": "blob abc does not hash to its name"}
    state.handle(stats(failures={"rank0": 0, "rank1": 1}, dark={"rank3": 1}))
    assert state.failed_hosts() == [
        {"host": "rank1", "play": "stage", "task": "Mirror | Each repo", "msg": "blob abc does not hash to its name",
         "unreachable": False},
        {"host": "rank3", "play": "Preflight", "task": "Gathering Facts", "msg": "ssh: no route", "unreachable": True}]


def test_an_unreachable_host_keeps_its_connection_error_over_its_report():
    # A real run (ssh to an unused loopback address): the dgx_report callback writes the host a report that only
    # says it did not reach the end; the operator needs the ssh error and the task it happened in.
    state = RunState()
    state.handle(event("runner_on_unreachable", "dgx2", None,
                       {"msg": "Task failed: Failed to connect to the host via ssh: connection refused"},
                       play="Lane facts", task="Gathering Facts"))
    state.reports["dgx2"] = {
        "host": "dgx2", "run_id": "r", "status": "failed", "failed_play": "Lane facts",
        "failed_task": "(host unreachable)", "failed_msg": "dgx2 did not reach the end of the run"}
    state.handle(stats(dark={"dgx2": 1}))
    assert state.failed_hosts() == [
        {"host": "dgx2", "play": "Lane facts", "task": "Gathering Facts",
         "msg": "Task failed: Failed to connect to the host via ssh: connection refused", "unreachable": True}]


def test_without_a_recap_the_failure_events_decide():
    state = RunState()
    state.handle(event("runner_on_failed", "rank1", "fail", {"msg": "boom"}))
    assert [f["host"] for f in state.failed_hosts()] == ["rank1"]


def test_result_message_of_a_no_log_result_is_never_its_exception():
    hidden = {"censored": "the output has been hidden", "exception": "Action failed: hf_SECRETVALUE", "failed": True}
    assert result_message(hidden) == "the output has been hidden"


def test_result_message_of_a_loop_names_the_failed_items():
    res = {"results": [{"failed": True, "_ansible_item_label": "a@main", "msg": "bad a"}, {"failed": False},
                       {"failed": True, "item": "b", "stderr": "x\nlast words"}]}
    assert result_message(res) == "a@main: bad a; b: last words"
    assert result_message({}) == "(no message)"
    assert result_message(dict(res, msg="One or more items failed")) == "a@main: bad a; b: last words"


def test_an_unreachable_loop_item_gives_its_own_message():
    state = RunState()
    state.handle(event("runner_on_unreachable", "dgx2", "ping", {
        "msg": "All items completed", "unreachable": True,
        "results": [{"item": "a", "unreachable": True, "msg": "Failed to connect to the host via ssh: refused"}]}))
    assert state.failed_hosts()[0]["msg"] == "a: Failed to connect to the host via ssh: refused"


def test_plain_display_prints_each_hosts_line_once_without_escapes():
    out = io.StringIO()
    display = Display(out)
    state = RunState()
    for ev in (poll("dgx1", 12), poll("dgx1", 12), poll("dgx2", 5), poll("dgx1", 300, finished=True),
               poll("dgx1", 300, finished=True, name="runner_on_ok")):
        for update in state.handle(ev):
            display.progress(update[1], update[2])
    assert out.getvalue().splitlines() == ["[dgx1] stage %s: 12 of 300" % REPO_ID, "[dgx2] stage %s: 5 of 300" % REPO_ID,
                                           "[dgx1] stage %s: 300 of 300, done" % REPO_ID]
    display.output("PLAY [x]\r\n")   # the playbook's own output only with -v
    assert "PLAY" not in out.getvalue()
    Display(out, verbose=True).output("PLAY [x]")
    assert "PLAY [x]" in out.getvalue()


def test_rich_display_keeps_one_bar_per_host_with_bytes_rate_and_eta():
    out = io.StringIO()
    state = RunState()
    with Display(out, terminal=True) as display:
        for ev in (poll("dgx1", 100, total=1000), poll("dgx2", 10, total=1000), poll("dgx1", 500, total=1000)):
            for update in state.handle(ev):
                display.progress(update[1], update[2])
        tasks = dict((t.description, t) for t in display.bars.tasks)
        assert sorted(tasks) == ["dgx1 stage %s" % REPO_ID, "dgx2 stage %s" % REPO_ID]
        bar = tasks["dgx1 stage %s" % REPO_ID]
        assert (bar.completed, bar.total, bar.fields["rate"], bar.fields["eta"]) == (500, 1000, "812 MiB/s", "6m12s")


def test_plain_display_outlives_a_reader_that_went_away():
    # `dgx-stage stage | head -2`: the third line raised BrokenPipeError out of the run loop; the run went
    # on unwatched and its run.json stayed "running". Now the display falls silent and the run ends normally.
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = os.fdopen(write_end, "w")
    display = Display(stream)
    display.print("first")
    display.print("second")
    assert display.console.quiet
    stream.write("x" * 100000)
    stream.flush()                     # the fd is /dev/null now: Python's flush at exit cannot fail either
    stream.close()


def test_rich_display_and_table_show_brackets_in_names_as_text():
    # Host names are the inventory's: "[/]" raised rich's MarkupError mid-run, "[bold]" vanished.
    from rich.console import Console
    from dgx_stage import table
    out = io.StringIO()
    display = Display(out, terminal=True)
    with display:
        display.progress("we[/]ird[bold]", {"progress": {"pass": "stage", "repo_id": REPO_ID, "bytes_done": 1,
                                                         "bytes_total": 2}, "line": "x"})
    assert "we[/]ird[bold] stage " + REPO_ID in out.getvalue()
    out = io.StringIO()
    row = dict((key, "[/]") for key, _title in table.COLUMNS)
    Console(file=out, width=250, color_system=None).print(table.rich_table([dict(row, host="h[bold]")], title="[/]t"))
    assert "h[bold]" in out.getvalue() and "[/]t" in out.getvalue()


def test_progress_lines_and_bars_escape_control_characters_in_hosts_repos_and_file_names():
    # A NAS file name (the line's "current: ...") or a host name must not forge a line or drive the terminal.
    from dgx_stage.display import progress_description
    out = io.StringIO()
    Display(out).progress("dgx\x1b[2J1", {"line": "stage org/m: current: a\nb\x1b]0;t\x07.safetensors"})
    assert out.getvalue() == "[dgx\\x1b[2J1] stage org/m: current: a\\nb\\x1b]0;t\\x07.safetensors\n"
    assert progress_description("h\r", {"pass": "stage", "repo_id": "org/\x1bm"}) == "h\\r stage org/\\x1bm"
