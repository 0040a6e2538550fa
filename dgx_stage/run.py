"""One playbook run through ansible-runner: events to the display, signals to ansible-playbook, run.json.

ansible-playbook runs in its own session, so a Ctrl-C reaches only us: the first one (or SIGTERM) is forwarded as
SIGINT to its process group (it stops after its summary), a second one cancels the run."""
import contextlib
import os
import queue
import shlex
import shutil
import signal
import sys

from dgx_stage import (EXIT_ANSIBLE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, REPO, UsageError, extravars, runs,
                       summary, table, use_module_utils)
from dgx_stage.display import Display
from dgx_stage.events import RunState

use_module_utils()
from ansible.module_utils.dgx_units import utc_text  # noqa: E402

LOG_TAIL = 25   # lines of the log shown when ansible-playbook failed with no host result


# ansible-playbook as ansible-runner starts it: through this shim, which asks the kernel to send it SIGINT
# when the front end dies (SIGKILL, OOM: no handler of ours runs), so it never stages on with nobody watching.
GUARD = """#!%(python)s
import ctypes, os, signal, sys
PR_SET_PDEATHSIG = 1
try:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGINT), 0, 0, 0)
except (AttributeError, OSError):   # no prctl (not Linux): run unguarded rather than not at all
    pass
else:
    if os.getppid() != %(parent)d:   # the front end died before the request took effect
        sys.exit(99)
os.execv(%(playbook)r, [%(playbook)r] + sys.argv[1:])
"""


def write_guard(bin_dir, playbook=None):
    """<bin_dir>/ansible-playbook: the shim above, ending its run with this front end."""
    real = playbook or os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "ansible-playbook")
    os.makedirs(bin_dir, exist_ok=True)
    path = os.path.join(bin_dir, "ansible-playbook")
    with open(path, "w") as handle:
        handle.write(GUARD % {"python": sys.executable, "parent": os.getpid(), "playbook": real})
    os.chmod(path, 0o755)
    return path


def runner_env(guard_dir):
    """The repo's ansible.cfg and callback plugins, the guard then this interpreter's ansible-playbook first."""
    plugins = [os.path.join(REPO, "callback_plugins")] + [p for p in [os.environ.get("ANSIBLE_CALLBACK_PLUGINS")] if p]
    bin_dirs = [guard_dir, os.path.dirname(os.path.abspath(sys.executable))]
    return {"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"), "ANSIBLE_CALLBACK_PLUGINS": os.pathsep.join(plugins),
            "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
            "PATH": os.pathsep.join(bin_dirs + [os.environ.get("PATH", os.defpath)])}


def visible_result(event):
    """A changed or failed result, or an unreachable host (what makes a play worth naming)."""
    name, data = event.get("event"), event.get("event_data") or {}
    if name == "runner_on_unreachable" or (name == "runner_on_failed" and not data.get("ignore_errors")):
        return True
    return name == "runner_on_ok" and bool((data.get("res") or {}).get("changed"))


def runner_cmdline(tags, limit, extra_vars, check, verbose):
    """ansible-playbook's arguments besides the inventory and the playbook (a shell-quoted string)."""
    args = (["--tags", tags] if tags else []) + (["--limit", limit] if limit else [])
    args += [word for value in extra_vars for word in ("-e", value)]
    args += (["--check", "--diff"] if check else []) + (["-" + "v" * (verbose - 1)] if verbose > 1 else [])
    return " ".join(shlex.quote(a) for a in args)


def changes_text(changed):
    """What the run changed, from the recap's per-host counts: "0 changes", "3 changes (dgx1 2, dgx2 1)"."""
    hosts = ", ".join("%s %d" % (host, n) for host, n in sorted(changed.items()) if n)
    return summary.plural(sum(changed.values()), "change") + (" (%s)" % hosts if hosts else "")


class PlaybookRun(object):
    def __init__(self, spec, runs_dir, out=None):
        self.spec = spec
        self.runs_dir = runs_dir
        self.out = out or sys.stdout
        self.ident = runs.new_ident()
        self.run_dir = os.path.join(runs_dir, self.ident)
        self.state = RunState()
        self.events = queue.Queue()
        self.interrupts = 0
        self.forwarded_to = None
        self.record = {}

    def _on_signal(self, signum, _frame):
        self.interrupts += 1
        if self.interrupts == 1:
            self._forward()
            self.events.put({"_note": "interrupted (%s): SIGINT forwarded to ansible-playbook%s; it stops after "
                                      "its summary. Again to cancel at once."
                                      % (signal.Signals(signum).name,
                                         " (pid %d)" % self.forwarded_to if self.forwarded_to else
                                         " as soon as it runs")})
        elif self.interrupts == 2:
            self.events.put({"_note": "interrupted again: cancelling the run"})

    def _forward(self):
        """SIGINT to ansible-playbook's process group once an event named its pid (the run loop retries until then)."""
        if self.state.pid:
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(self.state.pid), signal.SIGINT)
                self.forwarded_to = self.state.pid

    def _write_record(self, **fields):
        self.record.update(fields, run_id=self.state.run_id, report_dir=self.state.report_dir,
                           reports=dict(self.state.history_paths),
                           receipts_removed=dict(sorted(self.state.receipts_removed.items())))
        runs.write_json(os.path.join(self.run_dir, "run.json"), self.record)

    def _read_reports(self):
        reports, paths = runs.run_reports(self.state.report_dirs, self.ident)
        self.state.reports.update(reports)
        self.state.history_paths.update(paths)

    def _make_run_dir(self):
        fix = "; pass --runs-dir or set DGX_STAGE_RUNS_DIR"
        for _attempt in range(20):
            try:
                os.makedirs(self.runs_dir, exist_ok=True)
                os.mkdir(self.run_dir)
                return
            except FileExistsError:
                if not os.path.isdir(self.runs_dir):
                    raise UsageError("runs dir %s is not a directory%s" % (self.runs_dir, fix))
                self.ident = runs.new_ident()
                self.run_dir = os.path.join(self.runs_dir, self.ident)
            except OSError as exc:
                raise UsageError("cannot record the run under %s (%s)%s" % (self.runs_dir, exc.strerror or exc, fix))
        raise UsageError("no free run ident under %s" % self.runs_dir)

    def run(self):
        # Our handlers from the start: a Ctrl-C while ansible-runner loads is forwarded once the playbook runs.
        handlers = dict((signum, signal.signal(signum, self._on_signal)) for signum in (signal.SIGINT, signal.SIGTERM))
        try:
            return self._run()
        finally:
            shutil.rmtree(os.path.join(self.run_dir, runs.EXTRA_VARS), ignore_errors=True)
            runs.scrub_command(self.run_dir)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)

    def _run(self):
        import ansible_runner
        spec = self.spec
        self._make_run_dir()
        runs.sweep_extra_vars(self.runs_dir)
        recorded = dict((key, spec[key]) for key in ("subcommand", "playbook", "tags", "inventory", "limit", "check"))
        recorded.update(runs.this_process())
        self._write_record(ident=self.ident, extra_vars=[extravars.described(v) for v in spec["extra_vars"]],
                           status="running", rc=None, exit_code=None, started=utc_text(), finished=None,
                           artifacts=self.run_dir, log=os.path.join(self.run_dir, "stdout"), **recorded)
        display = Display(self.out, spec["verbose"] > 0)
        display.print("dgx-stage %s: %s%s on %s%s (run %s)" % (
            spec["subcommand"], spec["playbook"], " --tags " + spec["tags"] if spec["tags"] else "",
            spec["inventory"], " --limit " + spec["limit"] if spec["limit"] else "", self.ident))
        thread = None
        try:
            extra_vars = extravars.as_files(spec["extra_vars"], os.path.join(self.run_dir, runs.EXTRA_VARS))
            thread, runner = ansible_runner.run_async(
                private_data_dir=self.run_dir, artifact_dir=self.runs_dir, ident=self.ident, project_dir=REPO,
                playbook=os.path.join(REPO, spec["playbook"]), inventory=spec["inventory"],
                cmdline=runner_cmdline(spec["tags"], spec["limit"], extra_vars, spec["check"], spec["verbose"]),
                envvars=dict(runner_env(os.path.dirname(write_guard(os.path.join(self.run_dir, "bin")))),
                             **runs.run_identity_env(self.ident)),
                quiet=True, settings={"pexpect_timeout": 0.5, "suppress_ansible_output": True},
                event_handler=self._on_event, status_handler=self._on_status,
                cancel_callback=lambda: self.interrupts >= 2)
            with display:
                self._watch(thread, display)
            thread.join()
        except Exception as exc:
            # The front end itself failed: the run must not go on unwatched, nor its run.json say "running".
            self.interrupts = max(self.interrupts, 2)   # ansible-runner's cancel callback ends the run
            if thread is not None:
                thread.join(timeout=120)
            if thread is None or not thread.is_alive():
                with contextlib.suppress(OSError):   # the front end's own error is the one to report
                    self._read_reports()
                    self._settle_reports(self.state.failed_hosts())
            self._write_record(status="error", exit_code=EXIT_ANSIBLE, finished=utc_text(),
                               error="dgx-stage failed: %s: %s" % (type(exc).__name__, exc))
            raise
        return self._finish(runner, display)

    def _watch(self, thread, display):
        shown_play = None
        while thread.is_alive() or not self.events.empty():
            if self.interrupts == 1 and self.forwarded_to is None:
                self._forward()
            try:
                event = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            if "_note" in event:
                display.print(event["_note"])
                continue
            updates = self.state.handle(event)
            if event.get("event") in ("playbook_on_play_start", "playbook_on_stats"):
                self._read_reports()   # the callback writes the reports as each play ends
            if self.state.history_paths != self.record["reports"]:
                self._write_record()   # a killed front end's run.json still leads `report` to them
            # A play is named once it shows something: the plays the tags skip still run bookkeeping tasks.
            if self.state.play != shown_play and not self.spec["verbose"] and (
                    any(u[0] == "progress" for u in updates) or visible_result(event)):
                shown_play = self.state.play
                display.print("play: %s" % shown_play)
            for update in updates:
                if update[0] == "progress":
                    display.progress(update[1], update[2])
                else:
                    display.output(update[1])

    def _on_event(self, event):
        self.events.put(event)
        return True   # keep it in the artifacts (job_events/)

    def _on_status(self, status, runner_config=None):
        if status.get("status") == "running":   # runner has written its `command` artifact, environment and all
            runs.scrub_command(self.run_dir)

    def _finish(self, runner, display):
        state = self.state
        self._read_reports()
        failures = state.failed_hosts()
        if self.interrupts:
            code, status = EXIT_INTERRUPTED, "interrupted"
        elif failures:
            code, status = EXIT_FAILED, "failed"
        elif runner.rc != 0:
            code, status = EXIT_ANSIBLE, "error"
        else:
            code, status = EXIT_OK, "ok"
        self._settle_reports(failures)
        changed = dict(sorted((state.stats or {}).get("changed", {}).items()))
        self._write_record(status=status, runner_status=runner.status, rc=runner.rc, exit_code=code,
                           finished=utc_text(), failures=failures, changed=changed)
        if self.spec["subcommand"] == "status":
            hosts = dict((host, dict(state.lanes.get(host, {}), lines=lines))
                         for host, lines in state.status_lines.items())
            run = {"inventory": self.spec["inventory"], "playbook": self.spec["playbook"]}
            display.print("\n".join(summary.status_lines(hosts, run)) or "no host reported its status")
        elif state.reports:
            display.table(table.table_rows(state.reports, state.receipts_removed), "dgx-stage %s: run %s, %s"
                          % (self.spec["subcommand"], state.run_id, changes_text(changed)))
        else:
            display.print("no host report was written in this run")
        for failure in failures:
            display.print(table.failure_line(failure, self.spec["inventory"]))
        if code == EXIT_ANSIBLE:
            display.print("ansible-playbook exited %s with no host failure; the end of its log:" % runner.rc)
            display.print(self._log_tail())
        if self.interrupts:
            display.print("interrupted: exit %d (the host reports of this run say interrupted)" % code)
        display.print("artifacts: %s" % self.run_dir)
        display.print("full log: %s" % os.path.join(self.run_dir, "stdout"))
        return code

    def _settle_reports(self, failures):
        """Settle the reports still `running` (all `interrupted` after an interrupt: a rescue may have run)."""
        if self.state.run_id:
            seen = {} if self.interrupts else dict((f["host"], f) for f in failures)
            self.state.reports.update(runs.settle_unfinished(self.state.history_paths, self.state.run_id, seen))

    def _log_tail(self):
        try:
            with open(os.path.join(self.run_dir, "stdout"), errors="replace") as handle:
                return "\n".join(handle.read().replace("\r\n", "\n").splitlines()[-LOG_TAIL:])
        except OSError:
            return "(no log)"
