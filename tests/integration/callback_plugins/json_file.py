"""ansible.posix.json's output written to the file $DGX_TEST_JSON_FILE, as a notification callback: a test
reads the plays' results of the very run whose operator output (the default stdout callback and the lane
summary) it reads, instead of running the playbook once per callback."""
import json
import os

from ansible.parsing.ajson import AnsibleJSONEncoder
from ansible.plugins.callback import CallbackBase
from ansible_collections.ansible.posix.plugins.callback.json import CallbackModule as JsonCallback


class CallbackModule(JsonCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "json_file"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        # The json callback's own state, without its stdout options (json_indent, show_custom_stats).
        CallbackBase.__init__(self, display)
        self.results = []
        self._task_map = {}
        self._is_lockstep = False
        self._json_indent = None

    def v2_playbook_on_stats(self, stats):
        """The json callback's document (plays and stats), to the file."""
        summary = dict((host, stats.summarize(host)) for host in sorted(stats.processed.keys()))
        with open(os.environ["DGX_TEST_JSON_FILE"], "w") as handle:
            json.dump({"plays": self.results, "stats": summary}, handle, cls=AnsibleJSONEncoder)
