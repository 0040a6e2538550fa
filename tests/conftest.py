"""Shared pytest set-up: tools/ (the synthetic hub generator) and tests/ (the helpers every suite
shares) importable, and the repo's module_utils under the names the modules import them by."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(REPO_ROOT, "tools"), os.path.join(REPO_ROOT, "tests"), REPO_ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import pytest  # noqa: E402
from dgx_stage import use_module_utils  # noqa: E402

import processes  # noqa: E402

use_module_utils()

# The Ctrl-C tests (test_transfer, test_mirror) need Python's own SIGINT handler. A test run started in the
# background of a shell without job control (nohup ... &, some CI runners) inherits SIGINT ignored, and
# Python then installs none: _thread.interrupt_main does nothing and a waiting test hangs.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def kill_at_teardown():
    """kill_at_teardown(proc_or_pid, ..., environ=None) -> processes.Tree recorded now, killed (SIGKILL) at
    teardown, after the test's assertions. For a test that kills or interrupts what it started on purpose (the
    behaviour under test): call it just before that kill, while the parents still link every worker, so the
    workers that setsid'd away and outlive the kill are ended too; `environ` (an entry of the run's environment
    unique to the test, e.g. its ANSIBLE_LOCAL_TEMP) also reaches the background jobs, which daemonize. Teardown
    fails naming any that will not end."""
    trees = []

    def record(*roots, environ=None):
        trees.append(processes.Tree(*roots, environ=environ))
        return trees[-1]

    yield record
    errors = []
    for tree in trees:
        try:
            tree.kill()
        except RuntimeError as err:
            errors.append(str(err))
    assert not errors, errors
