"""The container runtimes the engine tests run on: Podman and Docker, each with its CLI and a skip reason.

Docker comes from scripts/docker-daemon.sh (make integration runs the suite under it: dockerd is started
when none answers and stopped afterwards); a test needing Docker skips, naming why, only when no daemon
answers. The engine double image is put into Docker by tests/engine_double/build.sh under the same fully
qualified local name, so Docker never looks for it in a registry.
"""
import functools
import os
import shutil
import subprocess

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNTIMES = ("podman", "docker")


def runtime_env():
    env = dict(os.environ)
    conf = os.path.join(REPO_ROOT, "molecule", "containers.conf")
    if "CONTAINERS_CONF" not in env and os.path.exists(conf):
        env["CONTAINERS_CONF"] = conf  # runtime=runc and the VM's ulimits (the Makefile exports the same)
    return env


def cli(runtime, *args, **kwargs):
    """Run `<runtime> ARGS...` (podman or docker), output captured."""
    return subprocess.run([runtime] + list(args), env=runtime_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=kwargs.pop("timeout", 120), **kwargs)


@functools.lru_cache(maxsize=None)
def unusable(runtime):
    """Why `runtime` cannot run containers here, or None."""
    hint = {"podman": "make system-packages installs it",
            "docker": "make system-packages installs docker.io; scripts/docker-daemon.sh start runs dockerd"}[runtime]
    if runtime == "docker" and unusable("podman"):
        return "the engine double image is built with Podman, which cannot run: %s" % unusable("podman")
    if not shutil.which(runtime):
        return "%s is not installed (%s)" % (runtime, hint)
    try:
        info = cli(runtime, "info", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "%s info failed: %s" % (runtime, exc)
    if info.returncode != 0:
        return "%s does not answer (%s): %s" % (
            runtime, hint, info.stderr.decode("utf-8", "replace").strip()[:300])
    return None


def params(runtimes=RUNTIMES):
    """pytest params, one per runtime, each skipped with its reason when that runtime cannot run."""
    return [pytest.param(r, id=r, marks=pytest.mark.skipif(unusable(r) is not None, reason=str(unusable(r))))
            for r in runtimes]


def container_ids(runtime, name):
    """'<id> <started at>' of a container, '' when there is none."""
    proc = cli(runtime, "inspect", "--type", "container", "--format", "{{.Id}} {{.State.StartedAt}}", name)
    return proc.stdout.decode().strip() if proc.returncode == 0 else ""


def remove(runtime, *names):
    """Remove the named containers (this test's own), if they exist."""
    for name in names:
        cli(runtime, "rm", "--force", name)
