"""callback_plugins/dgx_warm_plugins.py: a worker forked after a task starts finds the Jinja plugins loaded."""
import importlib.util
import os

import pytest
from ansible.plugins.loader import filter_loader, test_loader

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("dgx_warm_plugins",
                                               os.path.join(REPO_ROOT, "callback_plugins", "dgx_warm_plugins.py"))
warm = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(warm)

LATE_FILTER = """class FilterModule(object):
    def filters(self):
        return {"dgx_test_late_filter": lambda value: value}
"""


# pylint: disable=protected-access
@pytest.fixture
def empty_loaders():
    """The filter and test loaders with empty caches; their search paths and caches as they were afterwards."""
    saved = [(loader, list(loader._extra_dirs)) for loader in (filter_loader, test_loader)]
    for loader, _dirs in saved:
        loader._clear_caches()
    yield
    for loader, dirs in saved:
        loader._extra_dirs[:] = dirs
        loader._clear_caches()


def loaded_in_a_forked_child(names):
    """Whether a child forked now finds each of names among the loaded filter plugins (it loads none itself)."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            cached = filter_loader._cached_non_collection_wrappers
            code = 0 if all(name in cached for name in names) else 1
        finally:
            os._exit(code)      # never back into pytest: the child only answers
    _pid, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), "the forked child failed to look"
    return code == 0


def test_a_worker_forked_after_a_task_starts_inherits_the_loaded_filters_and_tests_even_a_roles_added_later(
        tmp_path, empty_loaders):
    filter_loader.add_directory(os.path.join(REPO_ROOT, "roles", "engine", "filter_plugins"))
    filter_loader._clear_caches()
    assert not loaded_in_a_forked_child(["to_json", "dgx_lane_plan"])
    callback = warm.CallbackModule()
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert loaded_in_a_forked_child(["to_json", "dgx_lane_plan"])
    assert test_loader._cached_non_collection_wrappers
    # A role included later adds its directory (the cache empties); the next task's start loads it with the rest.
    (tmp_path / "late.py").write_text(LATE_FILTER)
    filter_loader.add_directory(str(tmp_path))
    assert not loaded_in_a_forked_child(["to_json"])
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert loaded_in_a_forked_child(["to_json", "dgx_lane_plan", "dgx_test_late_filter"])


def test_a_handler_starting_loads_them_too(empty_loaders):
    assert not loaded_in_a_forked_child(["to_json"])
    warm.CallbackModule().v2_playbook_on_handler_task_start(task=None)
    assert loaded_in_a_forked_child(["to_json"])
