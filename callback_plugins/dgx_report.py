"""The one writer of the host reports, and so the printer of the lane summary: only the writer knows its last write."""

import atexit
import os
import signal
import sys
import time

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase

# This checkout's front-end package, whether or not the Python running Ansible has it installed.
_CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)
from dgx_stage import UsageError, runs, summary, use_module_utils  # noqa: E402
from dgx_stage.events import short_action  # noqa: E402

use_module_utils()
from ansible.module_utils.dgx_errors import StageError  # noqa: E402
from ansible.module_utils.dgx_report import PLAYS, end_reports, update_reports  # noqa: E402
from ansible.module_utils.dgx_units import utc_text  # noqa: E402

DOCUMENTATION = r"""
name: dgx_report
type: aggregate
short_description: Write the dgx-stage host reports from the results of the run
description:
  - For each play marked C(dgx_play) and each host that took part in it, merges the play into the host's
    C(<report dir>/<host>-<run id>.json) and C(<host>.json) with the host's lane, stage and engine facts so far,
    when the play ends, or at the host's first failure when it enters the play's frame rescue (C(dgx_play_failed)).
  - A failure after which the host runs no other task of the play puts it out of the run, as an unreachable host
    is; ignored failures and ones a role's rescue recovers never count; a run_once task's failure is that of every
    host of the play that goes no further.
  - Records the end of the run (C(ok), C(check), or C(failed) for a host lost on the way) when the play marked
    C(dgx_run_end) starts, or at the stats when the run never reached it; an interrupted run records none (the
    front end settles its C(running) reports). Writes nothing for a run without such a play.
  - Then prints the lane summary (dgx_stage/summary.py) after the recap, or at exit for a run stopped before its
    stats, unless the front end drives the run (C(DGX_STAGE_RUN_ID)) or stdout is machine-readable.
requirements:
  - enable it in callbacks_enabled
"""

# The facts a report is made of: the lane's (playbooks/select-lane.yml) and the roles' results so far.
REPORT_FACTS = ("lane_name", "lane_rank", "lane_world_size", "lane_hosts", "lane_targets", "lane_run_id",
                "lane_run_started", "lane_report_dir", "lane_hub_nas_root", "lane_hub_local_root",
                "stage_passes", "stage_header_checks", "stage_window", "engine_report",
                "lane_engine_runs")   # the summary's only: why no engine started
# Set on one host with run_once, the same for every host: a host without its own takes them from the lane.
LANE_FACTS = ("lane_name", "lane_hosts", "lane_targets", "lane_run_id", "lane_run_started", "lane_report_dir")
# Tasks that do not make a host part of a play: roles' argument checks (tagged always) and messages.
NOT_TAKING_PART = ("validate_argument_spec", "debug", "meta")


class CallbackModule(CallbackBase):
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dgx_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super(CallbackModule, self).__init__(display=display)
        self._hosts = {}        # host -> its facts, its play (started, last result, took part) and failures
        self._lane = {}         # LANE_FACTS as any host reported them
        self._play = None       # the dgx_play of the play running, None for others
        self._reporting = False
        self._ended = False
        self._out = set()       # hosts out of the run: failed (not rescued away) or unreachable
        self._play_hosts = set()  # hosts that started a task of the play running
        self._run_args = None   # the summary's: how the run was started, set when it starts
        self._interrupted = False

    def v2_playbook_on_start(self, playbook):
        if not summary.summary_wanted(C.config.get_config_value("DEFAULT_STDOUT_CALLBACK")):
            return
        self._run_args = dict(summary.run_of(context.CLIARGS, getattr(playbook, "_file_name", None)),
                              started=time.monotonic(), pid=os.getpid())
        atexit.register(self._at_exit)
        try:
            previous = signal.getsignal(signal.SIGINT)

            def note_sigint(signum, frame):   # then Ansible's own handler: the run stops without its stats
                self._interrupted = previous != signal.SIG_IGN
                if callable(previous):
                    return previous(signum, frame)
                if previous != signal.SIG_IGN:
                    raise KeyboardInterrupt()

            signal.signal(signal.SIGINT, note_sigint)
        except (ValueError, OSError, TypeError):    # not the main thread: the exit hook still prints
            pass

    def _host(self, name):
        return self._hosts.setdefault(name, {"facts": {}, "play": None, "started": None, "last": None,
                                             "in_play": False, "failure": None, "last_failure": None,
                                             "pending": False})

    def _take_facts(self, name, result):
        items = [result] + [item for item in result.get("results") or [] if isinstance(item, dict)]
        for item in items:
            facts = item.get("ansible_facts")
            if not isinstance(facts, dict):
                continue
            for key in REPORT_FACTS:
                if key in facts:
                    self._host(name)["facts"][key] = facts[key]
                    if key in LANE_FACTS:
                        self._lane[key] = facts[key]

    def v2_playbook_on_play_start(self, play):
        self._close_play()
        self._play_hosts = set()
        play_vars = play.get_vars()
        self._play = str(play_vars["dgx_play"]) if str(play_vars.get("dgx_play")) in PLAYS else None
        if "dgx_play" in play_vars and self._play is None:
            self._display.error("dgx_play %r is not one of %s: no host report records this play"
                                % (play_vars["dgx_play"], ", ".join(PLAYS)))
        self._reporting = self._reporting or self._play is not None
        if play_vars.get("dgx_run_end") and self._reporting:
            self._record_end()

    def v2_runner_on_start(self, host, task):
        info = self._host(host.get_name())
        self._play_hosts.add(host.get_name())
        if self._play and info["play"] != self._play:
            info.update(play=self._play, started=utc_text(), in_play=False, failure=None, last_failure=None,
                        pending=False)
        if task.get_vars().get("dgx_play_failed"):
            # The play's frame rescue: the failure it rescues is the play's, written before the rescue reads it.
            if info["last_failure"] and not info["failure"]:
                self._commit(host.get_name(), info)
        else:
            info["pending"] = False   # the host went on (a rescue, an always section): not out of the run yet

    def _seen(self, result):
        info = self._host(result.host.get_name())
        info["last"] = utc_text()
        if self._play and short_action(result.task.action) not in NOT_TAKING_PART:
            info["in_play"] = True
        return info

    def v2_runner_on_ok(self, result):
        self._take_facts(result.host.get_name(), result.result)
        self._seen(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._take_facts(result.host.get_name(), result.result)
        info = self._seen(result)
        if ignore_errors or info["failure"]:
            return
        name = str(result.task_fields.get("name") or "") or str(result.task.action or "")
        failure = {"task": name, "result": result.result}
        info["last_failure"], info["pending"] = failure, True
        if getattr(result.task, "run_once", False):
            # A run_once task's failure fails every host of the play: each that runs no further task leaves with it.
            for other in self._play_hosts - self._out - {result.host.get_name()}:
                if not self._host(other)["failure"]:
                    self._host(other).update(last_failure=failure, pending=True)

    def v2_runner_on_unreachable(self, result):
        info = self._seen(result)
        if not result.task.ignore_unreachable:
            self._out.add(result.host.get_name())
            # The play is not recorded: the end of the run names it as the one the host was lost in.
            info["in_play"] = False

    def _commit(self, name, info):
        """The host's last failure is the play's (it did not go on): written now, the host out of the run."""
        info["failure"], info["pending"] = info["last_failure"], False
        self._out.add(name)
        if self._play:
            self._write_play(name, info)

    def _close_play(self):
        for name, info in self._hosts.items():
            if info["pending"]:
                self._commit(name, info)
            elif self._play and info["play"] == self._play and info["in_play"] and not info["failure"]:
                self._write_play(name, info)
            info["in_play"] = False
        self._play = None

    def _run(self, facts):
        args = context.CLIARGS
        return {"id": str(facts.get("lane_run_id") or self._lane.get("lane_run_id") or ""),
                "started": str(facts.get("lane_run_started") or self._lane.get("lane_run_started") or ""),
                "tags": sorted(str(t) for t in args.get("tags") or ("all",)),
                "skip_tags": sorted(str(t) for t in args.get("skip_tags") or ()), "check": bool(args.get("check"))}

    def _identity(self, name, facts):
        hosts = list(facts.get("lane_hosts") or self._lane.get("lane_hosts") or [])
        rank = facts.get("lane_rank", hosts.index(name) if name in hosts else None)
        world = facts.get("lane_world_size", len(hosts) if hosts else None)
        return {"lane": facts.get("lane_name") or self._lane.get("lane_name"),
                "rank": int(rank) if rank is not None else None, "world_size": int(world) if world else None,
                "hub_nas_root": facts.get("lane_hub_nas_root"), "hub_local_root": facts.get("lane_hub_local_root")}

    def _directory(self, facts):
        return str(facts.get("lane_report_dir") or self._lane.get("lane_report_dir") or "")

    def _write_play(self, name, info):
        facts = info["facts"]
        started, finished = info["started"], info["last"]
        window = facts.get("stage_window")
        if self._play == "stage" and isinstance(window, dict):   # the host's own wave, not the play's
            started, finished = window.get("started") or started, window.get("finished") or finished
        failure = info["failure"] or {}
        play = {"name": self._play, "started": started, "finished": finished, "failed": bool(failure),
                "failed_task": failure.get("task", ""), "failed_result": failure.get("result") or {}}

        def write():
            data = {"identity": self._identity(name, facts), "passes": dict(facts.get("stage_passes") or {}),
                    "weights": list(facts.get("stage_header_checks") or []),
                    "engine": dict(facts.get("engine_report") or {})}
            return update_reports(self._directory(facts), name, self._run(facts), play, data, finished=finished)
        self._write(name, write)

    def _record_end(self):
        """The end of the run for every host it targets: final for those still in it, failed for the others."""
        self._close_play()
        self._ended = True
        finished = utc_text()
        for name in self._lane.get("lane_targets") or []:
            info = self._host(name)
            facts = info["facts"]
            self._write(name, lambda: end_reports(self._directory(facts), name, self._run(facts),
                                                  name not in self._out, info["play"],
                                                  self._identity(name, facts), finished))

    def _write(self, name, write):
        try:
            for warning in write()["warnings"]:
                self._display.warning(warning)
        except (StageError, OSError) as exc:
            self._display.error("the host report of %s was not written: %s" % (name, exc))
        except Exception as exc:   # a fact of another shape: this host's report only, never the others' or later plays'
            self._display.error("the host report of %s was not written: %s: %s" % (name, type(exc).__name__, exc))

    def v2_playbook_on_stats(self, stats):
        if self._reporting and not self._ended:
            self._record_end()
        self._print_summary()

    def _at_exit(self):
        if self._run_args and os.getpid() == self._run_args["pid"]:
            self._print_summary("INTERRUPTED" if self._interrupted else "STOPPED")

    def _print_summary(self, stopped=None):
        """The lane summary, once, from what this run wrote."""
        run, self._run_args = self._run_args, None
        if not run or not self._reporting:
            return
        facts = dict((name, info["facts"]) for name, info in self._hosts.items())
        run.update(id=self._lane.get("lane_run_id"), wall_s=time.monotonic() - run["started"])
        engine_runs = dict((name, str(f.get("lane_engine_runs")).lower() == "true") for name, f in facts.items()
                           if "lane_engine_runs" in f)
        try:
            reports, paths = runs.run_reports(sorted(set(self._directory(f) for f in facts.values()) - {""}),
                                              run["id"])
            lines = summary.lane_summary(reports, paths, run, stopped, engine_runs)
            if lines:
                self._display.display("\n".join(lines))
                self._display.display("")
        except (UsageError, OSError) as exc:   # an unreadable report dir; a closed stdout at exit
            self._display.error("no lane summary: %s" % exc)
