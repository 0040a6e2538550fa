"""callback_plugins/dgx_warm_plugins.py: a worker forked after a task starts finds the Jinja plugins loaded."""
import importlib.util
import os

from ansible.plugins.loader import filter_loader, test_loader

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("dgx_warm_plugins",
                                               os.path.join(REPO_ROOT, "callback_plugins", "dgx_warm_plugins.py"))
warm = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(warm)


def loaded_in_a_forked_child(names):
    """Whether a child forked now finds each of names among the loaded filter plugins, without loading any."""
    pid = os.fork()
    if pid == 0:
        # pylint: disable=protected-access
        cached = filter_loader._cached_non_collection_wrappers
        os._exit(0 if all(name in cached for name in names) else 1)
    _pid, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


LATE_FILTER = """class FilterModule(object):
    def filters(self):
        return {"dgx_test_late_filter": lambda value: value}
"""


def test_a_worker_forked_after_a_task_starts_inherits_the_loaded_filters_and_tests_even_a_roles_added_later(tmp_path):
    filter_loader.add_directory(os.path.join(REPO_ROOT, "roles", "engine", "filter_plugins"))
    filter_loader._clear_caches()     # pylint: disable=protected-access
    test_loader._clear_caches()       # pylint: disable=protected-access
    assert not loaded_in_a_forked_child(["to_json", "dgx_lane_plan"])
    callback = warm.CallbackModule()
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert loaded_in_a_forked_child(["to_json", "dgx_lane_plan"])
    assert test_loader._cached_non_collection_wrappers    # pylint: disable=protected-access
    # A role included later adds its directory (the cache empties); the next task's start loads it with the rest.
    (tmp_path / "late.py").write_text(LATE_FILTER)
    filter_loader.add_directory(str(tmp_path))
    assert not loaded_in_a_forked_child(["to_json"])
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert loaded_in_a_forked_child(["to_json", "dgx_lane_plan", "dgx_test_late_filter"])
