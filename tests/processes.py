"""Ending what a test started as a whole tree of processes.

Neither a process group nor a session holds everything a test starts: ansible-playbook's workers and the
async wrapper call setsid. Once a process dies its children belong to init, out of reach of a walk from the
process the test started. So a Tree records every descendant while their parents still link them (the
ppid field of /proc/<pid>/stat: /proc/<pid>/task/*/children exists only on kernels built with it), and at
kill time walks again from every process it recorded, so a worker that setsid'd away and outlived its
parent is still found, with whatever it started since.

A background job that daemonizes (Ansible's async wrapper forks twice) is below init from its start: no walk
from the playbook reaches it. It inherits the playbook's environment, though: a Tree given `environ` also takes
in every process whose environment holds those entries (a path under the test's own tmp dir names its processes).

    processes.kill_tree(proc)           SIGKILL proc and all below it, wait until they are gone
    tree = processes.Tree(proc)         record the tree now (before a test kills part of it on purpose)
    tree.kill()                         later: the rest of it, and what the recorded processes started since

A process is named by its pid and its start time, so a pid reused by an unrelated process is never signalled.
Processes are reaped by their parents: a Popen given as a root is waited for here (its returncode then says
how it died); the others are children of init or of a recorded process once it is gone.
"""
import contextlib
import os
import signal
import subprocess
import time


def _stat(pid):
    """(ppid, state letter, start time in clock ticks since boot) of pid, None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()     # the command name before it may hold spaces and ')'
    return int(fields[1]), fields[0].decode("ascii", "replace"), int(fields[19])


def running(pid, start=None):
    """True while pid is a process (not a zombie), and the one that started at `start` when given."""
    stat = _stat(pid)
    return stat is not None and stat[1] not in ("Z", "X") and (start is None or stat[2] == start)


def describe(pid):
    """'pid (state S): command line' for messages."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        cmdline = "?"
    stat = _stat(pid)
    return "%d (state %s): %s" % (pid, stat[1] if stat else "gone", cmdline[:300])


def _scan(environ=()):
    """(ppid -> [(pid, start time)] of every process now, [(pid, start time)] of those whose environment holds
    every entry of `environ` (b"NAME=value"); none when environ is empty)."""
    children, carrying = {}, []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        stat = _stat(pid)
        if stat is None:
            continue
        children.setdefault(stat[0], []).append((pid, stat[2]))
        if environ:
            try:
                with open("/proc/%d/environ" % pid, "rb") as handle:
                    entries = set(handle.read().split(b"\0"))
            except OSError:
                continue
            if all(entry in entries for entry in environ):
                carrying.append((pid, stat[2]))
    return children, carrying


def _ancestors():
    """This process and every one above it: never part of a tree it kills."""
    found, pid = set(), os.getpid()
    while pid > 0 and pid not in found:
        found.add(pid)
        stat = _stat(pid)
        pid = stat[0] if stat else 0
    return found


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Tree(object):
    """The processes below one or more roots (pids or Popen objects, the roots included), recorded now; with
    `environ` ({name: value}), also every process whose environment holds all of it, and the ones below it."""

    def __init__(self, *roots, environ=None):
        self.procs = {}     # pid -> start time
        self.environ = sorted(("%s=%s" % item).encode() for item in (environ or {}).items())
        self.spared = _ancestors()
        self.popens = [root for root in roots if isinstance(root, subprocess.Popen)]
        for root in roots:
            if isinstance(root, subprocess.Popen):
                if root.returncode is not None:      # reaped: its pid may be another process's by now
                    continue
                root = root.pid
            stat = _stat(root)
            if stat is not None and root not in self.spared:
                self.procs[root] = stat[2]
        self.refresh()

    def __contains__(self, pid):
        return pid in self.procs

    def alive(self):
        """The recorded processes still running, by pid."""
        return sorted(pid for pid, start in self.procs.items() if running(pid, start))

    def refresh(self):
        """Record the children of every recorded process still running (and the processes carrying `environ`),
        again until no new one turns up."""
        while True:
            children, carrying = _scan(self.environ)
            new = dict((pid, start) for pid, start in carrying
                       if pid not in self.spared and self.procs.get(pid) != start)
            for pid in self.alive():
                for child, start in children.get(pid, ()):
                    if child not in self.spared and self.procs.get(child) != start:
                        new[child] = start
            if not new:
                return
            self.procs.update(new)

    def _freeze(self, settle=5.0):
        """SIGSTOP every recorded process and what they started, until none is left unstopped: a stopped
        process starts nothing, so the last walk is complete. A process stops only on its way back to user
        space, so each walk waits (up to `settle` seconds) for the ones just told to stop."""
        stopped = set()
        while True:
            self.refresh()
            todo = [pid for pid in self.alive() if pid not in stopped]
            if not todo:
                return sorted(stopped)
            for pid in todo:
                _signal(pid, signal.SIGSTOP)
                stopped.add(pid)
            deadline = time.monotonic() + settle
            while time.monotonic() < deadline:
                states = [_stat(pid) for pid in todo]
                if all(s is None or s[1] in ("T", "t", "Z", "X") for s in states):
                    break
                time.sleep(0.01)

    def kill(self, sig=signal.SIGKILL, timeout=30.0):
        """Send sig to every recorded process still running and to everything they started since (stopped
        first, so nothing new starts in between, then let go on to take it), and wait until they have all
        ended: the Popen roots reaped here. The pids signalled; RuntimeError naming any still running
        after `timeout` seconds."""
        frozen = self._freeze()
        targets = self.alive()
        for pid in targets:
            _signal(pid, sig)
        if sig != signal.SIGKILL:
            for pid in frozen:
                _signal(pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        for popen in self.popens:
            try:
                popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self.alive()
        if left:
            raise RuntimeError("still running %.0f s after %s: %s" % (
                timeout, signal.Signals(sig).name, "; ".join(describe(pid) for pid in left)))
        return targets


def kill_tree(*roots, sig=signal.SIGKILL, timeout=30.0, environ=None):
    """Send sig to every process below the roots (pids or Popen objects), roots included, in whatever session
    or process group (and to those carrying `environ`, as Tree), and wait until they are gone (Popen roots
    reaped). The pids signalled."""
    return Tree(*roots, environ=environ).kill(sig, timeout)


@contextlib.contextmanager
def fails_if_blocked(seconds, what):
    """Raise AssertionError(what) inside the block when it runs longer than `seconds` (SIGALRM): a call that
    would block for ever (a FIFO opened for reading) fails the test instead of hanging the suite."""
    def blocked(_signum, _frame):
        raise AssertionError(what)

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)

