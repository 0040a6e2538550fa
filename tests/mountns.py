"""Real mount points for tests, in a mount namespace of their own: root only, and nothing mounted there is
ever seen by the host or outlives the test."""
import ctypes
import os
import subprocess
import traceback

import pytest

CLONE_NEWNS = 0x00020000


def in_private_mount_namespace(func):
    """func() in a forked child that has a mount namespace of its own (every mount private); the child's
    exit code: 0 when func returned, 1 when it raised (its traceback on stderr)."""
    if os.geteuid() != 0:
        pytest.skip("a mount namespace of its own needs root")
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
            subprocess.check_call(["mount", "--make-rprivate", "/"])
            func()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def bind_mount(source, target):
    """`mount --bind source target` (in the namespace of in_private_mount_namespace)."""
    subprocess.check_call(["mount", "--bind", str(source), str(target)])
