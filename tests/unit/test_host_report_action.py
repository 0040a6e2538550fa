"""roles/report/action_plugins/host_report.py: the report written on the controller, in the task's own process, is
the module's: the same files and result for the same options, nothing written in check mode, bad input refused."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail

from modrun import REPO_ROOT, run_main

PLUGIN = os.path.join(REPO_ROOT, "roles", "report", "action_plugins", "host_report.py")
_SPEC = importlib.util.spec_from_file_location("dgx_host_report_action", PLUGIN)
plugin = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(plugin)

ARGS = {"host": "dgx1", "run_id": "20261130T204512Z-3fa2", "run_started": "2026-11-30T20:45:12Z",
        "tags": ["stage"], "play": "stage", "play_started": "2026-11-30T20:45:14Z",
        "play_finished": "2026-11-30T20:46:00Z",
        "passes": {"stage": [{"repo_id": "org/model", "status": "ok", "bytes_copied": 3}]},
        "lane": "exl3_2x", "rank": 0, "world_size": 2, "hub_nas_root": "/nas/hub", "hub_local_root": "/nvme/hub"}


def run_action(args, check_mode=False):
    """The action plugin's run() for a task with these args, as the task executor calls it."""
    task = mock.MagicMock(args=dict(args), check_mode=check_mode, async_val=0, action="host_report")
    connection = mock.MagicMock()
    connection._shell.tmpdir = None
    action = plugin.ActionModule(task, connection, mock.MagicMock(), loader=None, templar=None)
    return action.run(task_vars={})


def read(path):
    with open(path) as handle:
        return json.load(handle)


def test_the_action_writes_what_the_module_writes(tmp_path):
    by_module = run_main("host_report", dict(ARGS, dir=str(tmp_path / "module")))
    by_action = run_action(dict(ARGS, dir=str(tmp_path / "action")))
    assert not by_action.get("failed") and by_action["changed"] is True and by_action["status"] == "running"
    for path, view in (("history_path", "report"), ("latest_path", "latest")):
        assert read(by_action[path]) == read(by_module[path]) == by_action[view]
    assert by_action["invocation"]["module_args"]["host"] == "dgx1"
    assert by_action["warnings"] == []
    end = dict((key, value) for key, value in ARGS.items() if not key.startswith("play"))
    ended = run_action(dict(end, dir=str(tmp_path / "action"), run_end=True))
    assert ended["status"] == "ok" and read(ended["latest_path"])["status"] == "ok"


def test_check_mode_writes_nothing(tmp_path):
    result = run_action(dict(ARGS, dir=str(tmp_path / "reports")), check_mode=True)
    assert result["changed"] is False and result["report"]["status"] == "running"
    assert not os.path.exists(str(tmp_path / "reports"))


@pytest.mark.parametrize("bad, named", [
    ({"run_id": "../x"}, "run_id '../x' is not a run id"),
    ({"play_started": None}, "play_started"),
    ({"color": "red"}, "color"),
])
def test_bad_input_is_refused_naming_it(tmp_path, bad, named):
    with pytest.raises(AnsibleActionFail, match=named.replace(".", r"\.")):
        run_action(dict(ARGS, dir=str(tmp_path / "reports"), **bad))
    assert not os.path.exists(str(tmp_path / "reports"))


def test_a_failed_tasks_result_is_not_echoed(tmp_path):
    """The failed task's whole result may hold what it kept out of the output (no_log): the report keeps its
    message, and the action's result does not carry the rest."""
    failed = dict(ARGS, dir=str(tmp_path / "reports"), play_failed=True, failed_task="Stage | Copy",
                  failed_result={"msg": "copy failed", "cmd": ["curl", "-H", "Authorization: secret-xyz"]})
    result = run_action(failed)
    assert result["status"] == "failed" and result["report"]["failed_msg"] == "copy failed"
    assert "failed_result" not in result["invocation"]["module_args"]
    assert "secret-xyz" not in json.dumps(result) and "secret-xyz" not in open(result["latest_path"]).read()


# The plugin loaded in a fresh Python, as Ansible's main process loads it, with no ansible.cfg.
IMPORT_CHECK = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("action", sys.argv[1])
action = importlib.util.module_from_spec(spec)
spec.loader.exec_module(action)
try:
    print(action.report_functions()[0]["host"]["type"])
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def import_check(plugin, cwd):
    env = dict(os.environ, ANSIBLE_MODULE_UTILS=str(cwd / "elsewhere"))
    env.pop("ANSIBLE_CONFIG", None)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", IMPORT_CHECK, plugin], cwd=str(cwd), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    return proc.stdout.decode().strip().splitlines()[-1]


def test_without_a_module_utils_path_the_projects_own_is_used_and_else_the_fix_is_named(tmp_path):
    assert import_check(PLUGIN, tmp_path) == "str"
    alone = tmp_path / "roles" / "report" / "action_plugins"
    alone.mkdir(parents=True)
    shutil.copy(PLUGIN, str(alone))
    got = import_check(str(alone / "host_report.py"), tmp_path)
    assert got.startswith("AnsibleActionFail") and "ANSIBLE_MODULE_UTILS" in got and "dgx_errors" in got, got
