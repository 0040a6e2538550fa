"""Load the Jinja filter and test plugins once, in the controller's main process, before it forks a worker.

Every task on every host runs in a worker forked from the main process, and a worker that templates a filter or
a test first loads every filter and test plugin file on the search path (about 20 ms of CPU each time) unless the
main process already holds them. Loaded here, before each task is queued, every worker inherits them. A role
loaded later (include_role) adds its plugin directory, which empties the loader's cache: the next task refills it.
As with the plugins Ansible itself loads in the main process, a plugin file is read once per run (one edited
during a run is not read again), and a file that cannot be loaded is warned about at the first task.
"""
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
    name: dgx_warm_plugins
    type: aggregate
    short_description: load the Jinja filter and test plugins in the main process, so each worker inherits them
    description:
      - Before each task is queued, loads every filter and test plugin on the search path (a no-op when they are
        loaded already), so the workers forked for the task do not load them again each.
      - A plugin file is read once per run, and one that cannot be loaded is warned about at the first task
        rather than at the first task that uses a filter. Nothing else a run does or prints changes.
    requirements:
      - enabled in ansible.cfg (callbacks_enabled)
"""


def load_jinja_plugins():
    """Fill the filter and test loaders' caches (cheap when they are full): the loaders build them on first use."""
    for loader in (filter_loader, test_loader):
        next(iter(loader.all()), None)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dgx_warm_plugins"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_task_start(self, task, is_conditional):
        load_jinja_plugins()

    def v2_playbook_on_handler_task_start(self, task):
        load_jinja_plugins()
