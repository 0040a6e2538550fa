"""roles/report/action_plugins/host_report.py: the report written on the controller, in the task's own process, is
the module's: the same files and result for the same options, nothing written in check mode, bad input refused."""
import importlib.util
import json
import os
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail

from modrun import REPO_ROOT, run_main

_SPEC = importlib.util.spec_from_file_location(
    "dgx_host_report_action", os.path.join(REPO_ROOT, "roles", "report", "action_plugins", "host_report.py"))
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
