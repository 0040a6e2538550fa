"""Running test code as an unprivileged owner: tests run as root in CI, where file modes do not
stop anything, so code whose point is permissions runs in a forked child as nobody."""
import os
import pathlib
import shutil
import tempfile

NOBODY = 65534


def run_as_nobody(func):
    """func() in a child with uid/gid nobody when we are root (else in-process); its exit code."""
    if os.geteuid() != 0:
        func()
        return 0
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            func()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def nobody_owned_dir(fallback, prefix):
    """Generator for a fixture: a dir nobody owns and can reach (pytest's tmp dirs are private to
    root); the fallback dir when we are not root."""
    if os.geteuid() != 0:
        yield fallback
        return
    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, 0o755)
    os.chown(path, NOBODY, NOBODY)
    yield pathlib.Path(path)
    shutil.rmtree(path, onerror=lambda func, p, exc: (os.chmod(os.path.dirname(p), 0o755), func(p)))
