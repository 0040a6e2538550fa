"""Running test code as an unprivileged owner: tests run as root in CI, where file modes do not
stop anything, so code whose point is permissions runs in a forked child (or a command) as nobody."""
import os
import pathlib
import shutil
import subprocess
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


def as_nobody():
    """subprocess keyword arguments that run a command as nobody when we are root ({} otherwise: we are
    an unprivileged user already)."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def nobody_can_run(argv):
    """True when `argv` (e.g. [python, "-c", "pass"]) runs as nobody: every dir on its way is reachable."""
    try:
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                              timeout=60, **as_nobody()).returncode == 0
    except OSError:
        return False


def _nobody_interpreter(version):
    """A python<major.minor> on the default search path that nobody can run (None when there is none)."""
    names = ["python%d.%d" % version, "python%d" % version[0]]
    for name in names:
        path = shutil.which(name, path=os.defpath)
        probe = "import sys; sys.exit(sys.version_info[:2] != (%d, %d))" % version
        if path and nobody_can_run([path, "-c", probe]):
            return path
    return None


def nobody_venv(venv, target):
    """A venv nobody can run with the packages of `venv`: `venv` itself when nobody can run its python;
    else (its interpreter lives where only root reaches, e.g. under /root) a thin venv at `target` on a
    system interpreter of the same Python version whose site-packages points at venv's, with venv's
    console scripts and `make setup` stamps (the front end's too: its editable install is not redone).
    None when no such interpreter exists.
    """
    venv = os.path.abspath(str(venv))
    if nobody_can_run([os.path.join(venv, "bin", "python"), "-c", "import ansible"]):
        return venv
    version = tuple(int(p) for p in subprocess.check_output(
        [os.path.join(venv, "bin", "python"), "-c", "import sys; print('%d %d' % sys.version_info[:2])"]).split())
    base = _nobody_interpreter(version)
    if base is None:
        return None
    target = str(target)
    subprocess.check_call([base, "-m", "venv", "--without-pip", target])
    site = "lib/python%d.%d/site-packages" % version
    with open(os.path.join(target, site, "_dgx_stage_venv.pth"), "w") as handle:
        handle.write(os.path.join(venv, site) + "\n")
    python = os.path.join(target, "bin", "python")
    for name in sorted(os.listdir(os.path.join(venv, "bin"))):
        src, dest = os.path.join(venv, "bin", name), os.path.join(target, "bin", name)
        if os.path.lexists(dest) or not os.path.isfile(src):
            continue
        with open(src, "rb") as handle:
            first, rest = handle.readline(), handle.read()
        if first.startswith(b"#!" + venv.encode() + b"/bin/python"):
            with open(dest, "wb") as handle:
                handle.write(b"#!" + python.encode() + b"\n" + rest)
            os.chmod(dest, 0o755)
    for name in os.listdir(venv):
        if name.startswith((".requirements-", ".collections-", ".dgx-stage-")) and name.endswith(".stamp"):
            shutil.copy2(os.path.join(venv, name), os.path.join(target, name))
    return target
