"""docs/runbooks/*.md, run as an operator would: every `$ ` line of their ```console blocks, in order.

Each runbook runs in bash at the root of a copy of the work tree (the developer's own .cache/demo is never
touched), against the demo inventory (DGX_STAGE_INVENTORY=inventory/demo, HOST=localhost; the runbook's own
`export DGX_STAGE_INVENTORY=... HOST=...` line says which lane the operator sets), with the copy's .venv/bin first on
PATH. The copy is staged once the way `make demo` does it (scripts/demo.py); every runbook starts from
that staged state, restored, plus the broken state it is about (a corrupt NAS blob, stale receipts, a
corrupt local blob after a disk swap...), set up here before its commands run.

Checked per command: its exit status (0, or the code a trailing `# exits N` comment gives), and every
output line the runbook shows under it: a line matches when its words appear in order on one line of the
real output, `...` standing for anything (paths, rates), and a run id or timestamp for any other
(tests/runbook.py reads and runs the blocks). The commands must leave the NAS copy unchanged (only a
test's set-up writes to it). The copy runs its own dgx_stage package (PYTHONPATH), so the front end finds
the copy's playbooks and records its runs there.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import hubgen
from runbook import excerpt_pattern, run_steps, runbook_steps
from test_demo_unprivileged import copy_worktree
from treestate import set_writable, snapshot_diff, tree_snapshot

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
import demo  # noqa: E402  (scripts/demo.py: how `make demo` plants the stale receipts)
RUNBOOK_DIR = os.path.join(REPO_ROOT, "docs", "runbooks")
LANE_LINE = re.compile(r"^export DGX_STAGE_INVENTORY=\S+ HOST=\S+$")
DEMO_LANE = "export DGX_STAGE_INVENTORY=inventory/demo HOST=localhost"
DEMO = os.path.join(".cache", "demo")
NAS_HUB = os.path.join(DEMO, "nas", "hub")
LOCAL_HUB = os.path.join(DEMO, "local", "hub")
RUNBOOK_TIMEOUT = 300


# ------------------------------------------------------------------------------------------------
# the staged demo, once; restored before every runbook
# ------------------------------------------------------------------------------------------------

def module_build_cache_path():
    """make integration's compiled-module cache (tests/module_build_cache) when the run has one: the operator's
    commands below run the same modules as every other test."""
    if not os.environ.get("MODULE_BUILD_CACHE"):
        return []
    return [os.path.join(REPO_ROOT, "tests", "module_build_cache")]


def command_env(work):
    """What an operator's shell has at the repo root: the venv first on PATH, nothing of the test's
    Ansible settings; Ansible's home and temp dirs in the copy's .cache (as the demo keeps them)."""
    env = dict((key, value) for key, value in os.environ.items()
               if not key.startswith(("ANSIBLE_", "DGX_STAGE_", "PYTHON")))
    cache = os.path.join(work, ".cache")
    env.update({
        "PATH": os.path.join(work, ".venv", "bin") + os.pathsep + os.environ.get("PATH", os.defpath),
        # The copy's dgx_stage package (the venv's editable install maps it to the developer's tree).
        "PYTHONPATH": os.pathsep.join([work] + module_build_cache_path()),
        "PYTHONDONTWRITEBYTECODE": "1",
        "ANSIBLE_HOME": os.path.join(cache, "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": os.path.join(cache, "ansible-tmp", "local"),
        "ANSIBLE_REMOTE_TMP": os.path.join(cache, "ansible-tmp", "remote"),
        "ANSIBLE_NOCOLOR": "1",
        "NO_COLOR": "1",
        "COLUMNS": "160",
        "LANG": "C.UTF-8",
    })
    return env


def clear_tree(path):
    if os.path.lexists(path):
        set_writable(path, True)    # the demo's NAS copy is read-only by permissions for a non-root user
        shutil.rmtree(path)


@pytest.fixture(scope="module")
def staged_demo(tmp_path_factory):
    """A copy of the work tree staged by scripts/demo.py, and a copy of its .cache to restore from."""
    base = tmp_path_factory.mktemp("runbooks")
    work = str(base / "repo")
    copy_worktree(work)
    os.symlink(os.path.join(REPO_ROOT, ".venv"), os.path.join(work, ".venv"))
    proc = subprocess.run([os.path.join(work, ".venv", "bin", "python"), "scripts/demo.py"], cwd=work,
                          env=command_env(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout.decode("utf-8", "replace")[-6000:]
    saved = str(base / "cache-staged")
    shutil.copytree(os.path.join(work, ".cache"), saved, symlinks=True)
    yield {"work": work, "saved": saved}
    clear_tree(saved)
    clear_tree(os.path.join(work, ".cache"))


def restore(demo):
    """The staged demo as scripts/demo.py left it, at the same paths (reports and manifest name them)."""
    work = demo["work"]
    clear_tree(os.path.join(work, ".cache"))
    clear_tree(os.path.join(work, "reports"))
    shutil.copytree(demo["saved"], os.path.join(work, ".cache"), symlinks=True)
    return work


# ------------------------------------------------------------------------------------------------
# broken states
# ------------------------------------------------------------------------------------------------

class WritableNas(object):
    """The demo's NAS copy made writable for a set-up (it is read-only by permissions), then read-only again."""

    def __init__(self, work):
        self.root = os.path.join(work, DEMO, "nas")

    def __enter__(self):
        set_writable(self.root, True)
        return os.path.join(self.root, "hub")

    def __exit__(self, *exc):
        set_writable(self.root, False)


def repo_dir(hub, repo_id):
    return os.path.join(hub, hubgen.repo_folder(repo_id))


def snapshot_of(hub, repo_id):
    repo = repo_dir(hub, repo_id)
    with open(os.path.join(repo, "refs", "main")) as handle:
        return os.path.join(repo, "snapshots", handle.read().strip())


def shard_blob(hub, repo_id, index=0):
    """The repo blob (resolved through the hub store) behind the index-th .safetensors shard."""
    snapshot = snapshot_of(hub, repo_id)
    shard = sorted(n for n in os.listdir(snapshot) if n.endswith(".safetensors"))[index]
    return os.path.realpath(os.path.join(snapshot, shard))


def new_nas_revision(work):
    """The NAS hub got a new revision of the drafter (its main ref moved): a new config.json, the rest shared."""
    with WritableNas(work) as hub:
        repo = repo_dir(hub, hubgen.DRAFTER_REPO)
        old = snapshot_of(hub, hubgen.DRAFTER_REPO)
        old_commit = os.path.basename(old)
        commit = hubgen.git_blob_sha1(b"DSpark-drafter r2")
        config = json.dumps({"model_type": "dspark", "revision": "r2", "num_draft_tokens": 4}).encode()
        etag = hubgen.git_blob_sha1(config)
        with open(os.path.join(repo, "blobs", etag), "wb") as handle:
            handle.write(config)
        new = os.path.join(repo, "snapshots", commit)
        os.makedirs(new)
        for name in os.listdir(old):
            target = "../../blobs/" + etag if name == "config.json" else os.readlink(os.path.join(old, name))
            os.symlink(target, os.path.join(new, name))
        with open(os.path.join(repo, "trees", old_commit + ".json")) as handle:
            tree = json.load(handle)
        tree["files"]["config.json"] = {"size": len(config), "blob_id": etag}
        with open(os.path.join(repo, "trees", commit + ".json"), "w") as handle:
            json.dump(tree, handle, indent=1, sort_keys=True)
        with open(os.path.join(repo, "refs", "main"), "w") as handle:
            handle.write(commit)
    return {"commit": commit}


def wrong_shard_in_place(work):
    """The log's engine init failure #1: a weight blob hardlinked to another shard of the same size."""
    hub = os.path.join(work, LOCAL_HUB)
    first, second = shard_blob(hub, hubgen.MAIN_REPO, 0), shard_blob(hub, hubgen.MAIN_REPO, 1)
    assert os.path.getsize(first) == os.path.getsize(second)
    os.unlink(first)
    os.link(second, first)
    plant_stale_receipts(work)
    return {"blob": os.path.basename(first)}


def corrupt_local_blob(work):
    """After a disk swap the local copy came back with a flipped byte in the middle of a shard."""
    blob = shard_blob(os.path.join(work, LOCAL_HUB), hubgen.MAIN_REPO, 2)
    hubgen.flip_byte(blob, os.path.getsize(blob) // 2 + 12345)
    return {"blob": os.path.basename(blob)}


def plant_stale_receipts(work):
    """Yesterday's receipt roots, planted as `make demo` plants them."""
    parent = os.path.join(work, DEMO, "cache")
    demo.plant_stale_receipts(parent)
    return {"parent": parent}


def corrupt_nas_blob(work):
    """A NAS blob rotted after it was staged: a flipped byte in its head (the sampled blocks see it)."""
    with WritableNas(work) as hub:
        blob = shard_blob(hub, hubgen.MAIN_REPO, 1)
        hubgen.flip_byte(blob, 4096)
    return {"blob": os.path.basename(blob)}


def nothing(work):
    return {}


# Every runbook and the state it starts from (besides the staged demo).
SETUPS = {
    "stage-new-revision.md": new_nas_revision,
    "engine-init-failure.md": wrong_shard_in_place,
    "disk-swap-verify.md": corrupt_local_blob,
    "rollback-to-nas.md": nothing,
    "stale-receipts.md": plant_stale_receipts,
    "nas-blob-corrupt.md": corrupt_nas_blob,
}


def test_every_runbook_has_its_set_up():
    """So each is run below (tests/unit/test_runbooks.py checks each is listed in the index and README)."""
    names = sorted(n for n in os.listdir(RUNBOOK_DIR) if n.endswith(".md") and n != "README.md")
    assert names == sorted(SETUPS)


# ------------------------------------------------------------------------------------------------
# running one
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SETUPS))
def test_runbook(staged_demo, tmp_path, name):
    with open(os.path.join(RUNBOOK_DIR, name)) as handle:
        steps = runbook_steps(handle.read())
    assert steps and LANE_LINE.match(steps[0]["command"]), \
        "%s must start by setting the lane: export DGX_STAGE_INVENTORY=inventory/dgx HOST=<node>" % name
    assert all(s["command"].startswith(("dgx-stage ", "export ")) for s in steps), \
        "runbooks use only dgx-stage commands and shell variables"
    steps[0] = dict(steps[0], command=DEMO_LANE)
    work = restore(staged_demo)
    SETUPS[name](work)
    nas = os.path.join(work, DEMO, "nas")
    nas_before = tree_snapshot(nas)
    results = run_steps(work, steps, str(tmp_path / "out"), command_env(work), RUNBOOK_TIMEOUT)
    problems = []
    for step, (output, rc, seconds) in zip(steps, results):
        wrong = ["exited %d, the runbook says %d" % (rc, step["rc"])] if rc != step["rc"] else []
        lines = output.splitlines()
        wrong += ["no output line matches %r" % line for line in step["expect"]
                  if not any(excerpt_pattern(line).search(real) for real in lines)]
        if wrong:
            problems.append("`%s` (%.1f s): %s; its output:\n%s"
                            % (step["command"], seconds, "; ".join(wrong), output[-4000:]))
    assert not problems, "%s:\n%s" % (name, "\n".join(problems))
    assert snapshot_diff(nas_before, tree_snapshot(nas)) == [], "the runbook's commands wrote to the NAS copy"
    sys.stderr.write("%s: %s\n" % (name, ", ".join("%.1f s" % r[2] for r in results)))


# ------------------------------------------------------------------------------------------------
# a live stage of the demo: the cap holds and the workers are in the idle I/O class
# ------------------------------------------------------------------------------------------------

# MiB/s: the demo's 48 MiB take 12 s, two 5 s windows; each file's fsync (while no worker reads) is then a small
# part of the time even for the demo's 8 MiB shards.
LIVE_CAP = 4


def mirror_processes():
    """{pid: [thread ids]} of the processes running hf_hub_mirror itself (not the async wrapper naming it)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                argv = handle.read().split(b"\0")
            if len(argv) > 1 and os.path.basename(argv[1]).startswith(b"AnsiballZ_hf_hub_mirror"):
                found[int(pid)] = os.listdir("/proc/%s/task" % pid)
        except OSError:
            continue
    return found


def io_class(tid):
    """`ionice -p` of one thread: idle, none, best-effort...; None once it is gone."""
    shown = subprocess.run(["ionice", "-p", str(tid)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           universal_newlines=True)
    return shown.stdout.split(":")[0].strip() if shown.returncode == 0 else None


def test_a_live_stage_of_the_demo_holds_its_cap_with_every_worker_in_the_idle_io_class(staged_demo, tmp_path):
    work = restore(staged_demo)
    clear_tree(os.path.join(work, LOCAL_HUB))              # everything is copied again, from the NAS
    env = dict(command_env(work), DGX_STAGE_INVENTORY="inventory/demo")
    log = tmp_path / "live.log"
    with open(str(log), "w") as out:
        run = subprocess.Popen(["dgx-stage", "stage", "--live", "-e", "stage_live_max_mib_s=%d" % LIVE_CAP],
                               cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        seen = []          # (pid, {tid: class}) while the module runs
        try:
            while run.poll() is None:
                for pid, tids in mirror_processes().items():
                    classes = dict((tid, io_class(tid)) for tid in tids)
                    seen.append((pid, dict((tid, cls) for tid, cls in classes.items() if cls is not None)))
                time.sleep(0.2)
        finally:
            if run.poll() is None:
                run.kill()
    output = log.read_text()
    assert run.returncode == 0, output[-4000:]
    # While it copied, the module process had its workers (beside its main thread and lease watch), all idle; a
    # module process is in its default class only while it starts, before any thread of its own.
    copying = [classes for _pid, classes in seen if len(classes) >= 3]
    assert copying and all(set(classes.values()) == {"idle"} for classes in copying), seen
    reports = sorted(glob.glob(os.path.join(work, DEMO, "reports", "localhost-*.json")), key=os.path.getmtime)
    with open(reports[-1]) as handle:
        report = json.load(handle)
    main = [row for row in report["passes"]["stage"] if row["repo_id"] == hubgen.MAIN_REPO][0]
    assert main["max_mib_s"] == LIVE_CAP and main["io_priority"]["applied"] == "idle"
    assert main["bytes_from_nas"] > 5 * LIVE_CAP * 2 ** 20 and main["read_s"] >= 5
    assert abs(main["achieved_mib_s"] - LIVE_CAP) <= 0.1 * LIVE_CAP, main
    # The module's own clock cannot beat the cap: what it read took at least that long at the cap.
    read = main["bytes_read"]["local"] + main["bytes_read"]["nas"]
    assert main["duration_s"] >= 0.9 * read / 2 ** 20 / LIVE_CAP, main
    # The lane summary's stage pass shows the cap and the rate achieved under it (both repos of the host).
    shown = re.search(r"^localhost .* %d +(\d+\.\d)$" % LIVE_CAP, output, re.M)
    assert shown and abs(float(shown.group(1)) - LIVE_CAP) <= 0.1 * LIVE_CAP, output[-3000:]
