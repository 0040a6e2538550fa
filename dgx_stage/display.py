"""What the operator sees while a playbook runs: one progress bar per host on a terminal (rich), one plain
line per progress update otherwise (`[host] line`, no escape codes)."""
import io
import os
import sys

from dgx_stage import use_module_utils

use_module_utils()
from ansible.module_utils.dgx_job_poll import human_eta, human_rate  # noqa: E402
from ansible.module_utils.dgx_status import one_line  # noqa: E402


def progress_description(host, progress):
    """'host pass repo' of a bar, and whom it waits for while another run holds the repo."""
    parts = [host, progress.get("pass") or "", progress.get("repo_id") or ""]
    waiting = progress.get("waiting")
    if isinstance(waiting, dict):
        parts.append("waiting for run %s (pid %s, since %s)" % (waiting.get("run_id") or "?", waiting.get("pid") or "?",
                                                               waiting.get("since") or "?"))
    return one_line(" ".join(p for p in parts if p))


def host_line(host, line):
    """'[host] line' of a progress update, one line: a host, repo or file name cannot forge another."""
    return one_line("[%s] %s" % (host, line))


def _or_dash(shown, value):
    """A bar's rate or ETA field: "-" until the poll has a figure (dgx_job_poll words it)."""
    return "-" if value is None else shown(value)


class PlainDisplay(object):
    """Line per update; a line a host already showed is not printed again (the final poll of a repo
    arrives both as the loop item's result and the task's)."""

    def __init__(self, stream=None, verbose=False):
        self.stream = stream or sys.stdout
        self.verbose = verbose
        self.shown = {}
        self.closed = False      # the reader of a pipe went away

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def progress(self, host, entry):
        line = entry.get("line") or ""
        if not line or line in self.shown.setdefault(host, set()):
            return
        self.shown[host].add(line)
        self.print(host_line(host, line))

    def output(self, text):
        if self.verbose:
            self.print(text.replace("\r\n", "\n"))

    def print(self, text=""):
        if self.closed:
            return
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except BrokenPipeError:
            # `dgx-stage stage | head`: the reader left, the run goes on to its end and its run.json (a
            # traceback here left ansible-playbook running unrecorded and run.json "running").
            self.closed = True
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())   # nor a second error when Python flushes at exit
                os.close(devnull)
            except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
                pass


class RichDisplay(object):
    """rich Progress, a bar per host: description (host, pass, repo), bar, bytes done/total, rate, ETA."""

    def __init__(self, console, verbose=False):
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn
        self.console = console
        self.verbose = verbose
        # markup=False: host names and repo ids are text ("[/]" in a host name raised MarkupError)
        self.bars = Progress(TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                             DownloadColumn(binary_units=True), TextColumn("{task.fields[rate]}"),
                             TextColumn("ETA {task.fields[eta]}"), console=console, transient=False)
        self.tasks = {}

    def __enter__(self):
        self.bars.start()
        return self

    def __exit__(self, *exc):
        self.bars.stop()
        return False

    def progress(self, host, entry):
        prog = entry.get("progress") or {}
        fields = {"description": progress_description(host, prog), "rate": _or_dash(human_rate, prog.get("mib_per_s")),
                  "eta": "done" if entry.get("finished") else _or_dash(human_eta, prog.get("eta_s"))}
        total = prog.get("bytes_total") or None
        done = prog.get("bytes_done") or 0
        if host not in self.tasks:
            self.tasks[host] = self.bars.add_task(total=total, completed=done, **fields)
        else:
            self.bars.update(self.tasks[host], total=total, completed=done, **fields)

    def output(self, text):
        if self.verbose:
            self.console.print(text.replace("\r\n", "\n"), markup=False, highlight=False)

    def print(self, text=""):
        self.console.print(text, markup=False, highlight=False)
