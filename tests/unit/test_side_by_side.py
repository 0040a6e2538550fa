"""scripts/side-by-side.sh: two make targets at once, failing when either fails, and nothing left running when
it is stopped or killed (a cancelled CI job kills it: the Molecule runs it started must end too)."""
import os
import signal
import subprocess
import time
import uuid

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "side-by-side.sh")


@pytest.fixture
def makefile(tmp_path):
    """A Makefile with a passing, a failing and a long target, and a unique tag for the environment."""
    tag = uuid.uuid4().hex
    (tmp_path / "Makefile").write_text(
        "ok:\n\t@echo ok-done\n"
        "bad:\n\t@echo bad-done; false\n"
        "long:\n\t@sleep 60; echo long-done\n")
    return tmp_path, tag


@pytest.mark.parametrize("background, foreground, code, said", [
    ("ok", "ok", 0, []),
    ("bad", "ok", 1, ["make bad: failed (just above)"]),
    ("ok", "bad", 1, ["make bad: failed (above)"]),
    ("bad", "bad", 1, ["make bad: failed (above)", "make bad: failed (just above)"]),
])
def test_the_exit_code_is_a_failure_when_either_side_fails_and_says_which(makefile, background, foreground, code,
                                                                            said):
    cwd, _tag = makefile
    proc = subprocess.run([SCRIPT, background, foreground], cwd=str(cwd), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=60, env=dict(os.environ, MAKE="make"))
    out = proc.stdout.decode()
    assert proc.returncode == code, out
    assert "---- make %s (ran beside make %s) ----" % (background, foreground) in out
    assert [line for line in out.splitlines() if line.endswith("above)")] == said


def _running(tag):
    """The pids whose environment carries SIDE_BY_SIDE_TEST=tag (every process the script started)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%s/environ" % pid, "rb") as handle:
                if b"SIDE_BY_SIDE_TEST=" + tag.encode() in handle.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


def _name(pid):
    try:
        with open("/proc/%s/comm" % pid) as handle:
            return handle.read().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGKILL, -9)])
def test_nothing_it_started_runs_on_once_it_is_stopped_or_killed(makefile, signum, code):
    cwd, tag = makefile
    # As from a terminal: under nohup (HUP ignored) bash may not trap HUP, and the script rightly ignores it.
    proc = subprocess.Popen([SCRIPT, "long", "long"], cwd=str(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=dict(os.environ, MAKE="make", SIDE_BY_SIDE_TEST=tag),
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    deadline = time.monotonic() + 20
    while len([p for p in _running(tag) if _name(p) == "sleep"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [_name(p) for p in _running(tag)].count("sleep") == 2
    proc.send_signal(signum)
    assert proc.wait(timeout=20) == code
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while _running(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(tag) == []
