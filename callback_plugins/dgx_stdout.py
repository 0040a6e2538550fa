"""The repo's stdout callback: Ansible's default one with what a run without the front end needs (DOCUMENTATION)."""

import os
import sys

from ansible import context
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

# This checkout's front-end package, whether or not the Python running Ansible has it installed.
_CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)
from dgx_stage import summary  # noqa: E402
from dgx_stage.display import host_line  # noqa: E402
from dgx_stage.events import short_action  # noqa: E402

DOCUMENTATION = r"""
name: dgx_stdout
type: stdout
short_description: Ansible's default output, with copy progress, warnings kept and the status play's lines
description:
  - Ansible's default stdout callback (its options are this callback's), and besides
  - each poll of a background copy (C(mirror_job)) that retries prints C([host] <its line>) (repo, bytes done of
    total, rate, ETA, the file in hand) instead of C(FAILED - RETRYING);
  - with C(display_ok_hosts = false) an unchanged result's warnings are printed, though the result is not;
  - at the start, a warning for each C(-e) value that C(dgx-stage) would refuse (a name no play or role reads,
    a name without a value, a value outside the variable's choices or type, a name the playbooks set);
  - for C(playbooks/status.yml), after the recap, each host's status lines (the C(stage_status) result's C(lines),
    which C(display_ok_hosts = false) hides) in rank order, or why a host has none, with a next step.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout_callback in ansible.cfg
"""

class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "dgx_stdout"

    def __init__(self):
        super(CallbackModule, self).__init__()
        self._status = {}       # status.yml: host -> {lane, rank, lines, failure, unreachable}
        self._playbook = None
        self._play_name = ""

    def v2_playbook_on_start(self, playbook):
        super(CallbackModule, self).v2_playbook_on_start(playbook)
        self._playbook = getattr(playbook, "_file_name", None)
        args = context.CLIARGS
        for line in summary.extra_var_warnings(args.get("extra_vars") or (), args.get("inventory") or ()):
            self._display.warning(line)

    def v2_playbook_on_play_start(self, play):
        super(CallbackModule, self).v2_playbook_on_play_start(play)
        self._play_name = play.get_name().strip()

    def v2_runner_retry(self, result):
        """A background copy's poll: its progress line, where the default callback says FAILED - RETRYING."""
        if short_action(result.task.action) == "mirror_job" and result.result.get("line"):
            self._display.display(host_line(result.host.get_name(), result.result["line"]))
        else:
            super(CallbackModule, self).v2_runner_retry(result)

    def v2_runner_on_ok(self, result):
        super(CallbackModule, self).v2_runner_on_ok(result)
        if not result.result.get("changed") and not self.get_option("display_ok_hosts"):
            self._handle_warnings_and_exception(result)   # the default callback drops them with the result
        # The status play's: each host's lane facts and its stage_status lines.
        facts = result.result.get("ansible_facts") or {}
        if "lane_name" in facts:
            self._status_host(result)["lane"] = facts["lane_name"]
        if str(facts.get("lane_rank")).isdigit():
            self._status_host(result)["rank"] = int(facts["lane_rank"])
        if short_action(result.task.action) == "stage_status" and isinstance(result.result.get("lines"), list):
            self._status_host(result)["lines"] = result.result["lines"]

    def v2_runner_on_failed(self, result, ignore_errors=False):
        # A no_log result keeps the exception Ansible raised for it, whose text may be the hidden message
        # (an action's failure): the default callback would print it.
        if result.result.get("censored"):
            result.result.pop("exception", None)
        super(CallbackModule, self).v2_runner_on_failed(result, ignore_errors)
        if not ignore_errors:
            self._status_host(result).setdefault("failure", {
                "play": self._play_name.split(" - ")[0], "task": result.task.get_name().strip(),
                "msg": result.result.get("msg", "")})

    def v2_runner_on_unreachable(self, result):
        super(CallbackModule, self).v2_runner_on_unreachable(result)
        info = self._status_host(result)
        info["unreachable"] = True
        info.setdefault("failure", {"msg": result.result.get("msg", "")})

    def _status_host(self, result):
        return self._status.setdefault(result.host.get_name(), {})

    def v2_playbook_on_stats(self, stats):
        super(CallbackModule, self).v2_playbook_on_stats(stats)
        if any("lines" in info for info in self._status.values()) or str(self._playbook).endswith("status.yml"):
            run = summary.run_of(context.CLIARGS, self._playbook)
            lines = summary.status_lines(self._status, run)
            if lines:
                self._display.display("\n".join(lines + [""]))
