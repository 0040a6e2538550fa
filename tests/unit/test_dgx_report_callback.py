"""The dgx_report callback (callback_plugins/dgx_report.py) driven by the results Ansible sends it: which play
record and which end of the run each host's report gets."""
import importlib.util
import json
import os

import pytest
from ansible import context
from ansible.module_utils.common.collections import ImmutableDict

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("dgx_report_callback",
                                               os.path.join(REPO_ROOT, "callback_plugins", "dgx_report.py"))
callback = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(callback)

RUN_ID = "20260101T000000Z-abcd"


class Host(object):
    def __init__(self, name):
        self.name = name

    def get_name(self):
        return self.name


class Task(object):
    def __init__(self, name, action="ansible.builtin.command", task_vars=None, run_once=False,
                 ignore_unreachable=False):
        self.name, self.action, self._vars = name, action, dict(task_vars or {})
        self.run_once, self.ignore_unreachable = run_once, ignore_unreachable

    def get_vars(self):
        return dict(self._vars)


class Play(object):
    def __init__(self, play_vars):
        self._vars = play_vars

    def get_vars(self):
        return dict(self._vars)


class Result(object):
    def __init__(self, host, task, result):
        self.host, self.task, self.result = Host(host), task, result
        self.task_fields = {"name": task.name}


class Run(object):
    """One run as the callback sees it: the lane facts set on every host, then the plays the test drives."""

    def __init__(self, directory, hosts, check=False):
        context.CLIARGS = ImmutableDict(tags=("all",), skip_tags=(), check=check)
        self.callback = callback.CallbackModule()
        self.directory = str(directory)
        self.play({})
        facts = {"lane_name": "lane", "lane_hosts": hosts, "lane_targets": hosts, "lane_run_id": RUN_ID,
                 "lane_run_started": "2026-01-01T00:00:00Z", "lane_report_dir": self.directory}
        for host in hosts:
            self.ok(host, "Lane facts", {"ansible_facts": facts}, action="ansible.builtin.set_fact")

    def play(self, play_vars):
        self.callback.v2_playbook_on_play_start(Play(play_vars))

    def _start(self, host, task):
        self.callback.v2_runner_on_start(Host(host), task)
        return task

    def ok(self, host, name, result=None, **task):
        task = self._start(host, Task(name, **task))
        self.callback.v2_runner_on_ok(Result(host, task, dict(result or {})))

    def fail(self, host, name, msg="boom", ignore_errors=False, **task):
        task = self._start(host, Task(name, **task))
        self.callback.v2_runner_on_failed(Result(host, task, {"failed": True, "msg": msg}), ignore_errors=ignore_errors)

    def unreachable(self, host, name, **task):
        task = self._start(host, Task(name, **task))
        self.callback.v2_runner_on_unreachable(Result(host, task, {"unreachable": True, "msg": "ssh: no route"}))

    def stats(self):
        self.callback.v2_playbook_on_stats(None)

    def report(self, host, latest=False):
        path = os.path.join(self.directory, "%s.json" % host if latest else "%s-%s.json" % (host, RUN_ID))
        with open(path) as handle:
            return json.load(handle)


@pytest.fixture(autouse=True)
def _cli_args():
    saved = context.CLIARGS
    yield
    context.CLIARGS = saved


def test_a_host_lost_in_a_play_never_has_that_play_recorded_ok(tmp_path):
    run = Run(tmp_path, ["a", "b"])
    run.play({"dgx_play": "stage"})
    run.ok("a", "Copy"), run.ok("b", "Copy")
    run.unreachable("a", "Copy more"), run.ok("b", "Copy more")
    run.play({"dgx_play": "verify"})
    run.ok("b", "Verify")
    run.play({"dgx_run_end": True})
    for report in (run.report("a"), run.report("a", latest=True)):
        assert report["status"] == "failed" and report["failed_play"] == "stage"
        assert report["plays"].get("stage", {}).get("status") != "ok"
    assert run.report("b")["status"] == "ok"


def test_a_run_once_failure_fails_every_host_of_the_play(tmp_path):
    # Ansible fails every host of the play at a run_once task's failure, with one result (the first host's):
    # the other hosts run no further task, not even a rescue.
    run = Run(tmp_path, ["a", "b"])
    run.play({"dgx_play": "bench"})
    run.ok("a", "Every rank is up"), run.ok("b", "Every rank is up")
    run.fail("a", "Run the bench file", msg="the bench file is missing", run_once=True)
    run.ok("a", "The failed host's textfile", task_vars={"dgx_play_failed": True})
    run.fail("a", "Fail the host", msg="The bench play failed", task_vars={"dgx_play_failed": True})
    run.stats()
    for host in ("a", "b"):
        report = run.report(host)
        assert (report["status"], report["failed_play"]) == ("failed", "bench"), host
        assert (report["failed_task"], report["failed_msg"]) == ("Run the bench file", "the bench file is missing")


def test_a_run_once_failure_a_roles_rescue_takes_is_no_failure(tmp_path):
    run = Run(tmp_path, ["a", "b"])
    run.play({"dgx_play": "engine"})
    run.ok("a", "Start"), run.ok("b", "Start")
    run.fail("a", "Wait | Ask each rank outside the play", run_once=True)
    run.ok("a", "Wait | A rank outside the play could not be asked")
    run.ok("b", "Wait | A rank outside the play could not be asked")
    run.ok("a", "Wait | Next round"), run.ok("b", "Wait | Next round")
    run.play({"dgx_run_end": True})
    assert run.report("a")["status"] == run.report("b")["status"] == "ok"


class Display(object):
    def __init__(self):
        self.errors, self.warnings = [], []

    def error(self, msg, *args, **kwargs):
        self.errors.append(msg)

    def warning(self, msg, *args, **kwargs):
        self.warnings.append(msg)


def test_a_report_that_cannot_be_made_is_an_error_and_the_other_hosts_and_plays_are_still_recorded(tmp_path):
    run = Run(tmp_path, ["a", "b"])
    run.callback._display = display = Display()
    run.play({"dgx_play": "stage"})
    run.ok("a", "Keep the rows", {"ansible_facts": {"stage_passes": ["not", "a", "dict"]}})
    run.ok("b", "Keep the rows")
    run.play({"dgx_play": "verify"})
    run.ok("a", "Verify"), run.ok("b", "Verify")
    run.play({"dgx_run_end": True})
    assert any("the host report of a" in error for error in display.errors), display.errors
    assert list(run.report("b")["plays"]) == ["stage", "verify"]
    assert run.report("b")["status"] == "ok"


def test_a_play_marked_with_an_unknown_tag_is_an_error(tmp_path):
    run = Run(tmp_path, ["a"])
    run.callback._display = display = Display()
    run.play({"dgx_play": "stgae"})
    assert any("stgae" in error for error in display.errors), display.errors
