"""Fixtures shared by the integration tests: a read-only synthetic NAS hub, a local hub, the module runner.

The NAS is read-only to every node. Tests run as root here, so `chmod a-w` does not stop a write:
every NAS fixture therefore also snapshots the whole NAS tree (path, lstat mode/size/mtime, link
text, sha256 of content) and fails the test at teardown if a single byte or inode attribute changed.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from nashub import build_nas
from treestate import set_writable, snapshot_diff, tree_snapshot

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The ansible binaries of the interpreter running pytest (the project venv in CI); no machine paths.
BIN_DIR = os.path.dirname(sys.executable)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running crash test (still part of `make test`)")


# Files whose tests run engine containers under the same inventory host names share a group, so they never
# run at once: the lane plan takes any running engine labelled as this host's rank (whatever the runtime) for
# a stray, so two such files side by side would fail each other. test_engine_ready.py names its hosts
# ready1..ready4 so that it runs beside test_engine_lane.py (dgx1..dgx4).
SHARED_ENGINE_HOSTS = {
    "test_engine_one_rank.py": "engine-localhost",
    "test_receipts_in_use.py": "engine-localhost",
}


# The longest groups start first, so that no worker is left alone with a long one at the end (about the wall
# seconds of each on the 2-core machine; a group not named here starts after these, in file order).
LONGEST_GROUPS_FIRST = ("engine-localhost", "test_engine_lane.py", "test_runbooks.py", "test_lane_fanout.py",
                        "test_output.py", "test_reports.py", "test_engine_ready.py")


def scheduling_group(nodeid):
    """The group a test runs in: its file, or the shared group of SHARED_ENGINE_HOSTS."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return SHARED_ENGINE_HOSTS.get(name, name)


def pytest_collection_modifyitems(items):
    """Tests in the order of LONGEST_GROUPS_FIRST, each file's own order kept (the workers take groups in this order)."""
    here = os.path.dirname(os.path.abspath(__file__))
    unknown = [g for g in LONGEST_GROUPS_FIRST
               if g not in SHARED_ENGINE_HOSTS.values() and not os.path.isfile(os.path.join(here, g))]
    if unknown:
        raise pytest.UsageError("tests/integration/conftest.py: LONGEST_GROUPS_FIRST names no file or group %s: "
                                "rename or remove it there" % ", ".join(unknown))

    def rank(item):
        group = scheduling_group(item.nodeid)
        return LONGEST_GROUPS_FIRST.index(group) if group in LONGEST_GROUPS_FIRST else len(LONGEST_GROUPS_FIRST)
    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)     # a hook of pytest-xdist: a run without it has none
def pytest_xdist_make_scheduler(config, log):
    """make integration's workers take whole groups: a file's tests run in order on one worker and share its
    module fixtures, while other files run beside it (xdist's own loadgroup marks do not reach the scheduler
    under this pytest)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return scheduling_group(nodeid)

    config.option.loadscopereorder = False      # groups in collection order (LONGEST_GROUPS_FIRST), not by test count
    return FileGroupScheduling(config, log)


@pytest.fixture
def make_nas_hub(tmp_path):
    """Factory: make_nas_hub(shard_size=..., n_shards=..., seed=...) -> nashub.NasHub, read-only, checked at
    teardown."""
    made = []

    def make(shard_size=64 * 1024, n_shards=6, seed=0, name="nas"):
        made.append(build_nas(tmp_path / name, shard_size=shard_size, n_shards=n_shards, seed=seed))
        return made[-1]

    yield make
    try:
        for desc in made:
            desc.assert_unchanged()
    finally:
        for desc in made:
            desc.thaw()


@pytest.fixture
def nas_hub(make_nas_hub):
    """A small synthetic NAS hub (6 x 64 KiB shards, every trap of the log), read-only."""
    return make_nas_hub()


@pytest.fixture(scope="session")
def _staged_hub_templates():
    """key -> the session's staged template of staged_hub (built on first use)."""
    templates = {}
    yield templates
    for template in templates.values():
        template["nas"].thaw()
        set_writable(template["saved"], True)


@pytest.fixture
def staged_hub(_staged_hub_templates, tmp_path_factory):
    """staged_hub(key, write_inventory, tags=..., plant=None, ok=True) -> {"dir", "nas", "inventory", "code",
    "data", "times"}: the state a stage-deepseek.yml run (--tags preflight,stage,verify by default) left, for
    tests that start from "staged yesterday" (or from one failed run) and then check it or what a later run does.

    The first call of a key in the session builds the default NAS hub (as nas_hub: 6 x 64 KiB shards, seed 0)
    under a fresh dir, lets plant(nas) plant a trap in it if given (plant thaws and freezes the NAS itself),
    writes the inventory with write_inventory(dir, nas) -> path (everything the run writes must be under dir:
    local hubs, reports, temp dirs), runs it once (it must succeed; with ok=False it must fail) and keeps a copy
    of dir. Every later call restores dir from that copy at the same path (the reports, progress files and
    inventory name it): each test gets the run's files untouched by the tests before it, without running it
    again. The run's own output is under "code" and "data" (run_playbook's), "times" the UTC seconds (ISO 8601)
    just before and after it. The NAS copy is read-only and checked at teardown as nas_hub's is (a test may
    plant a trap with thaw/freeze)."""
    used = []

    def get(key, write_inventory, tags="preflight,stage,verify", plant=None, ok=True):
        template = _staged_hub_templates.get(key)
        if template is None:
            base = tmp_path_factory.mktemp("staged-" + key)
            work = base / "work"
            work.mkdir()
            nas = build_nas(work / "nas")
            if plant is not None:
                plant(nas)
            inventory = write_inventory(work, nas)
            before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            code, data = run_playbook(work, inventory, "--tags", tags)
            after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            assert (code == 0) == ok, (code, failures(data))
            nas.assert_unchanged()
            saved = base / "saved"
            shutil.copytree(str(work), str(saved), symlinks=True)
            template = _staged_hub_templates[key] = {
                "dir": work, "saved": saved, "nas": nas, "inventory": inventory, "code": code, "data": data,
                "times": (before, after)}
        else:
            work = template["dir"]
            if os.path.lexists(str(work)):
                set_writable(work, True)
                shutil.rmtree(str(work))
            shutil.copytree(str(template["saved"]), str(work), symlinks=True)
            template["nas"].freeze()    # the restored copy is the one compared at teardown
        used.append(template)
        return dict((name, template[name]) for name in ("dir", "nas", "inventory", "code", "data", "times"))

    yield get
    try:
        for template in used:
            template["nas"].assert_unchanged()
    finally:
        for template in used:
            template["nas"].thaw()


@pytest.fixture
def local_hub(tmp_path):
    """An empty local hub root (exists, as hub_local_root must)."""
    path = tmp_path / "local"
    path.mkdir()
    return path


def ansible_env(tmp_path):
    # The modules' own temp files too (a module killed by a test leaves its extracted payload there, not in /tmp).
    temp_dir = os.path.join(str(tmp_path), "tmp")
    os.makedirs(temp_dir, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "TMPDIR": temp_dir,
        "ANSIBLE_CONFIG": os.path.join(REPO_ROOT, "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_LOCAL_TEMP": os.path.join(str(tmp_path), "ansible-local-tmp"),
        "ANSIBLE_REMOTE_TMP": os.path.join(str(tmp_path), "ansible-remote-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
        "PATH": BIN_DIR + os.pathsep + env.get("PATH", ""),
    })
    return env


def own_environ(tmp_path):
    """The entry of ansible_env(tmp_path) that every process of such a run inherits and no other test's carries,
    for processes.Tree's environ: the background stage jobs daemonize, out of reach of the playbook's tree."""
    return {"ANSIBLE_LOCAL_TEMP": ansible_env(tmp_path)["ANSIBLE_LOCAL_TEMP"]}


def run_playbook(workdir, inventory, *args):
    """Run stage-deepseek.yml with the json callback: (exit code, parsed output with elapsed_s)."""
    env = ansible_env(workdir)
    conf = os.path.join(REPO_ROOT, "molecule", "containers.conf")
    env.setdefault("CONTAINERS_CONF", conf)   # runc and the VM's ulimits, as the Makefile exports
    cmd = [os.path.join(BIN_DIR, "ansible-playbook"), "-i", str(inventory),
           os.path.join(REPO_ROOT, "stage-deepseek.yml")] + list(args)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    out = proc.stdout.decode("utf-8", "replace")
    try:
        data = json.loads(out)
    except ValueError:
        raise AssertionError("ansible-playbook rc=%d, output is not JSON:\n%s\n%s"
                             % (proc.returncode, out[-5000:], proc.stderr.decode("utf-8", "replace")[-3000:]))
    data["elapsed_s"] = time.monotonic() - started
    return proc.returncode, data


def failures(data):
    """Readable 'host task: msg' lines of the failed results in a run_playbook() output."""
    return ["%s %s: %s" % (host, task["task"]["name"], result.get("msg"))
            for play in data["plays"] for task in play["tasks"]
            for host, result in task["hosts"].items() if result.get("failed")]


def module_command(args, check=False, diff=False):
    """The ad-hoc command running hf_hub_mirror on localhost with the test interpreter."""
    cmd = [os.path.join(BIN_DIR, "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % sys.executable,
           "-m", "hf_hub_mirror", "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    return cmd


def parse_module_output(stdout):
    """The localhost result of the single ad-hoc task from the json callback's output."""
    data = json.loads(stdout)
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.fixture
def run_module(tmp_path):
    """run_module(args, check=False, diff=False) -> the module's result dict (parsed json callback)."""

    def run(args, check=False, diff=False, timeout=300):
        proc = subprocess.run(module_command(args, check, diff), cwd=REPO_ROOT, env=ansible_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        out = proc.stdout.decode("utf-8", "replace")
        try:
            result = parse_module_output(out)
        except (ValueError, KeyError, IndexError):
            raise AssertionError("ansible rc=%d, output not parseable:\nstdout:\n%s\nstderr:\n%s"
                                 % (proc.returncode, out, proc.stderr.decode("utf-8", "replace")))
        # rc 2 = a host failed; anything else non-zero is ansible itself going wrong.
        assert proc.returncode == (2 if result.get("failed") else 0), (proc.returncode, result)
        return result

    return run


@pytest.fixture
def spawn_module(tmp_path):
    """spawn_module(args) -> Popen of the ad-hoc run in a new session, for tests that kill it."""

    def spawn(args, check=False, diff=False):
        return subprocess.Popen(module_command(args, check, diff), cwd=REPO_ROOT, env=ansible_env(tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    return spawn


@pytest.fixture
def tree_state():
    """tree_state(root) -> snapshot; tree_state.diff(before, after) -> list of changes ([] when identical)."""

    def take(root):
        return tree_snapshot(root)

    take.diff = snapshot_diff
    return take
