"""What the operator sees while a playbook runs, through rich: a progress bar per host on a terminal, else one
`[host] line` per new poll line, no escape codes."""
import os

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

from dgx_stage import table, use_module_utils

use_module_utils()
from ansible.module_utils.dgx_job_poll import human_eta, human_rate  # noqa: E402
from ansible.module_utils.dgx_status import one_line  # noqa: E402


class _Console(Console):
    def on_broken_pipe(self):
        # `dgx-stage stage | head`: the reader left; the run goes on silently to its end and its run.json.
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.file.fileno())
        os.close(devnull)


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


class Display(object):
    def __init__(self, stream, verbose=False, terminal=None):
        terminal = stream.isatty() if terminal is None else terminal
        self.console = _Console(file=stream, force_terminal=terminal, emoji=False,
                                color_system="auto" if terminal else None)
        self.verbose = verbose
        self.shown = {}   # host -> its lines printed: a repo's last poll arrives as the item's and the task's result
        # markup=False: host names and repo ids are text ("[/]" in a host name raised MarkupError)
        self.bars = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                             TextColumn("{task.percentage:>3.0f}%"), DownloadColumn(binary_units=True),
                             TextColumn("{task.fields[rate]}"), TextColumn("ETA {task.fields[eta]}"),
                             console=self.console) if terminal else None
        self.tasks = {}

    def __enter__(self):
        if self.bars:
            self.bars.start()
        return self

    def __exit__(self, *exc):
        if self.bars:
            self.bars.stop()
        return False

    def progress(self, host, entry):
        if not self.bars:
            line = entry.get("line") or ""
            if line and line not in self.shown.setdefault(host, set()):
                self.shown[host].add(line)
                self.print(host_line(host, line))
            return
        prog = entry.get("progress") or {}
        fields = dict(description=progress_description(host, prog), total=prog.get("bytes_total") or None,
                      completed=prog.get("bytes_done") or 0,
                      rate="-" if prog.get("mib_per_s") is None else human_rate(prog["mib_per_s"]),
                      eta="done" if entry.get("finished") else "-" if prog.get("eta_s") is None
                      else human_eta(prog["eta_s"]))
        if host in self.tasks:
            self.bars.update(self.tasks[host], **fields)
        else:
            self.tasks[host] = self.bars.add_task(**fields)

    def output(self, text):
        if self.verbose:
            self.print(text.replace("\r\n", "\n"))

    def print(self, text=""):
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def table(self, rows, title):
        table.print_table(self.console, rows, title, None if self.bars else table.PLAIN_WIDTH)
