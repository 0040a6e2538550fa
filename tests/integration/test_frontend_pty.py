""".venv/bin/dgx-stage on a real terminal (a pseudo-terminal from Python's pty module): the operator sees the
host's progress bar advance during a paced copy and the final table.

The screen is the bytes the front end wrote to the terminal, escape codes and all; the test reads the
bar's percentage and byte count each time rich redrew it.
"""
import fcntl
import json
import os
import re
import select
import struct
import subprocess
import termios
import time

import processes
import pytest
from conftest import BIN_DIR, REPO_ROOT
from hubgen import MAIN_REPO
from test_frontend import POLL, frontend_env, paced_lane

SGR = re.compile(r"\x1b\[[0-9;]*m")                                   # colours: dropped
MOVES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")   # cursor moves, line erases: line breaks
COLUMNS, ROWS = 200, 50


def run_in_pty(argv, env, timeout=300):
    """(exit code, everything written to the terminal) of argv run with a pseudo-terminal as its stdio."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    screen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _w, _x = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:   # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                screen += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            processes.kill_tree(proc)
        os.close(master)
    return code, screen.decode("utf-8", "replace")


def test_stage_on_a_terminal_shows_the_bar_advance_and_the_final_table(tmp_path, make_nas_hub):
    dgx_stage = os.path.join(BIN_DIR, "dgx-stage")
    if not os.path.exists(dgx_stage):
        pytest.skip("no %s: `make setup` installs the front end" % dgx_stage)
    nas, inventory, roots = paced_lane(tmp_path, make_nas_hub)
    env = dict(frontend_env(tmp_path), TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(ROWS))
    env.pop("NO_COLOR", None)
    code, screen = run_in_pty([dgx_stage, "stage", "-i", inventory] + POLL, env)
    (tmp_path / "screen.txt").write_text(screen)   # kept for a failure's reader
    text = MOVES.sub("\n", SGR.sub("", screen))
    assert code == 0, text[-5000:]
    assert "\x1b[" in screen   # a terminal gets rich's drawing, not plain lines
    assert "[dgx1] " not in text
    # The bar of the main repo's stage pass, each time it was drawn: percentage and bytes done.
    bar = re.compile(r"dgx1 stage %s .*? (\d+)%% +([\d.]+)/([\d.]+) MiB" % re.escape(MAIN_REPO))
    draws = [(int(m.group(1)), float(m.group(2))) for m in bar.finditer(text)]
    assert len(set(draws)) >= 2, text[-5000:]
    percents = sorted(set(p for p, _b in draws))
    assert len(percents) >= 2 and percents[0] < 100, percents
    done_bytes = [b for _p, b in draws]
    assert max(done_bytes) > min(done_bytes), draws
    # The final table, after the bars: the host's row with this run's id and status.
    with open(str(tmp_path / "reports" / "dgx1.json")) as handle:
        report = json.load(handle)
    tail = text[text.rindex("HOST"):]
    assert report["run_id"] in tail and "ok" in tail and "dgx1" in tail, tail
