"""process_alive: a live pid, a gone one, and a pid reused by another process (a different start time)."""
import os
import shutil
import subprocess
import sys
import time

from ansible.module_utils.dgx_process import process_alive, process_started


def test_this_process_is_alive_with_its_own_start_time():
    started = process_started(os.getpid())
    assert isinstance(started, int) and started > 0
    assert process_alive(os.getpid(), started)


def test_a_process_with_another_start_time_reuses_the_pid_and_does_not_count():
    started = process_started(os.getpid())
    assert process_alive(os.getpid())
    assert not process_alive(os.getpid(), started + 1)


def test_a_gone_process_is_not_alive_and_has_no_start_time():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not process_alive(child.pid)
    assert process_started(child.pid) is None


def test_a_name_with_parentheses_and_spaces_does_not_shift_the_fields(tmp_path):
    link = tmp_path / "a) b c"
    os.symlink(shutil.which("sleep"), str(link))
    child = subprocess.Popen([str(link), "30"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:      # comm is set once the exec is done
            with open("/proc/%d/comm" % child.pid) as handle:
                if handle.read().strip() == "a) b c":
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the child never took the name a) b c")
        started = process_started(child.pid)
        assert started >= process_started(os.getpid())
        assert process_alive(child.pid, started) and not process_alive(child.pid, started - 1)
    finally:
        child.kill()
        child.wait()
