"""tests/processes.py on real process trees: a child, a grandchild that calls setsid() as ansible's workers do,
and a great-grandchild the grandchild starts only once its parent is gone."""
import os
import signal
import subprocess
import sys
import time

import pytest

import processes

# One level of the tree: writes its pid to <dir>/<level>.pid, starts the next level (up to 2), and sleeps.
# Level 2 leaves the session first, and starts level 3 when its parent dies (reparented: a walk from the
# root no longer reaches it or what it starts).
NODE = r"""
import os, subprocess, sys, time
level, out = int(sys.argv[1]), sys.argv[2]
if level == 2:
    os.setsid()
with open(os.path.join(out, "%d.tmp" % level), "w") as handle:
    handle.write(str(os.getpid()))
os.rename(os.path.join(out, "%d.tmp" % level), os.path.join(out, "%d.pid" % level))
if level < 2:
    subprocess.Popen([sys.executable, __file__, str(level + 1), out])
elif level == 2:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.05)
    subprocess.Popen([sys.executable, __file__, "3", out])
time.sleep(120)
"""


def wait_for_pid(out, level, timeout=30):
    path = out / ("%d.pid" % level)
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, "level %d never started" % level
        time.sleep(0.02)
    return int(path.read_text())


@pytest.fixture
def tree(tmp_path):
    """(Popen of level 0 in its own session, {level: pid} of levels 0-2 once all run, out dir); whatever is
    left is killed at teardown by pid, so a failing helper does not leave sleepers behind."""
    script = tmp_path / "node.py"
    script.write_text(NODE)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), "0", str(out)], start_new_session=True)
    pids = dict((level, wait_for_pid(out, level)) for level in range(3))
    yield proc, pids, out
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for path in out.glob("*.pid"):
        try:
            os.kill(int(path.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_kill_tree_ends_every_level_across_sessions_and_reaps_the_root(tree):
    proc, pids, out = tree
    assert os.getsid(pids[2]) == pids[2] != os.getsid(pids[0])       # the grandchild left the session
    signalled = processes.kill_tree(proc)
    assert sorted(signalled) == sorted(pids.values())
    assert proc.returncode == -signal.SIGKILL                        # reaped here, and how it died says so
    assert not [pid for pid in pids.values() if processes.running(pid)]
    time.sleep(0.5)
    assert not (out / "3.pid").exists()    # stopped before the kill: the grandchild never saw its parent die


def test_a_tree_recorded_before_a_killpg_still_reaches_the_setsid_grandchild_and_its_late_child(tree):
    proc, pids, out = tree
    recorded = processes.Tree(proc)
    assert all(pid in recorded for pid in pids.values())
    os.killpg(proc.pid, signal.SIGKILL)     # the crash a test simulates: the session's group only
    proc.wait()
    late = wait_for_pid(out, 3)             # the grandchild, reparented, started another process
    assert processes.running(pids[2]) and processes.running(late) and not processes.running(pids[1])
    assert pids[2] not in processes.Tree(proc.pid) and pids[2] not in processes.Tree(pids[1])  # walks miss it now
    assert sorted(recorded.kill()) == sorted([pids[2], late])
    assert not processes.running(pids[2]) and not processes.running(late)


def test_only_descendants_are_signalled(tree):
    proc, pids, _out = tree
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        processes.kill_tree(pids[1])
        assert processes.running(bystander.pid) and processes.running(pids[0])
        assert not processes.running(pids[1]) and not processes.running(pids[2])
    finally:
        bystander.kill()
        bystander.wait()


def test_another_signal_reaches_stopped_processes_and_a_survivor_is_named(tmp_path):
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert stubborn.stdout.readline().strip() == b"ready"
        assert processes.kill_tree(polite, sig=signal.SIGTERM) == [polite.pid]
        assert polite.returncode == -signal.SIGTERM              # delivered, though the tree was stopped first
        with pytest.raises(RuntimeError) as err:
            processes.kill_tree(stubborn, sig=signal.SIGTERM, timeout=1)
        assert "%d (state " % stubborn.pid in str(err.value) and "SIGTERM" in str(err.value)
    finally:
        processes.kill_tree(stubborn)
        stubborn.stdout.close()
    assert stubborn.returncode == -signal.SIGKILL


def test_a_reaped_popen_is_an_empty_tree():
    done = subprocess.Popen(["true"])
    done.wait()
    assert processes.Tree(done).alive() == [] and processes.kill_tree(done) == []


# Starts a daemon as Ansible's async wrapper does (fork, setsid, fork; the middle one exits at once), prints its
# pid, and exits: the daemon is init's child from its start, and only its environment names it.
DAEMONIZE = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(120)
    os._exit(0)
os.wait()
"""


def test_a_daemon_is_found_by_its_environment_and_the_caller_is_spared(tmp_path):
    mark = {"DGX_STAGE_TEST_TREE": str(tmp_path)}
    starter = subprocess.Popen([sys.executable, "-c", DAEMONIZE], env=dict(os.environ, **mark), stdout=subprocess.PIPE)
    daemon = 0
    try:
        daemon = int(starter.stdout.readline())
        starter.wait(timeout=30)
        assert processes.running(daemon) and daemon not in processes.Tree(starter.pid)
        # The caller carries the same entry (a test's own environment may): it kills the daemon, not itself.
        code = ("import sys; sys.path.insert(0, %r); import processes\n"
                "print(processes.kill_tree(environ={'DGX_STAGE_TEST_TREE': %r}))\n"
                % (os.path.dirname(processes.__file__), str(tmp_path)))
        out = subprocess.check_output([sys.executable, "-c", code], env=dict(os.environ, **mark), timeout=60)
        assert out.decode().strip() == "[%d]" % daemon
        assert not processes.running(daemon)
    finally:
        starter.stdout.close()
        if daemon and processes.running(daemon):
            os.kill(daemon, signal.SIGKILL)
