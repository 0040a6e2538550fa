"""The verify pass and the progress file through ansible-playbook: the verify pass copies nothing new, each
pass says what it read, and the progress file can be watched (during a copy, after it, after a failure and
after a SIGKILL, a verify pass keeping the stage figures). What each verify mode catches and repairs is
tests/unit/test_mirror.py's; a repair through the plays is tests/integration/test_output.py's, and so is
`--check --diff` on a fresh lane.

Runs on localhost (one local-connection host) with a throwaway inventory in the style of
test_stage_playbook.py. The tests that watch a copy give the module a NAS that reads at a known pace:
its Python starts with a sitecustomize that sleeps before each chunk read (os.readv), so a few hundred
MiB take seconds, whatever the page cache holds.
"""
import calendar
import json
import os
import re
import signal
import subprocess
import sys
import time

import processes
from ansible.module_utils.dgx_progress_file import PROGRESS_NAME
from conftest import BIN_DIR, REPO_ROOT, ansible_env, failures, own_environ, run_playbook
from hubgen import DRAFTER_REPO, MAIN_REPO
from test_reports import write_lane
from test_stage_playbook import _corrupt_nas_shard, mirror_results, play
from treestate import snapshot_diff, tree_snapshot

STAGE = "preflight,stage"
MIB = 1024 * 1024
WATCHED_SHARD = 128 * MIB           # 4 shards: a few hundred MiB to copy, ~3 s at the paced rate
CHUNK_DELAY_S = 0.1                 # per 8 MiB chunk and worker: ~160 MiB/s with two workers


def lane(tmp_path, nas, hosts=("localhost",), interpreter=None, **extra):
    """(inventory path, {host: its hub_local_root}) of a local lane (test_reports.write_lane), the module
    run by `interpreter` when given."""
    path = write_lane(tmp_path, nas["hub"], hosts, **extra)
    if interpreter:
        with open(path) as handle:
            inventory = json.load(handle)
        for host in inventory["all"]["children"]["exl3_2x"]["hosts"].values():
            host["ansible_python_interpreter"] = interpreter
        with open(path, "w") as handle:
            json.dump(inventory, handle)
    return path, dict((host, tmp_path / host / "hub") for host in hosts)


def paced_python(tmp_path, delay=CHUNK_DELAY_S):
    """An interpreter for the module whose chunk reads (NAS copies, local hashes) each wait `delay` s."""
    site = tmp_path / "paced-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, time\n"
        "_readv = os.readv\n"
        "def _paced_readv(fd, buffers):\n"
        "    time.sleep(%r)\n"
        "    return _readv(fd, buffers)\n"
        "os.readv = _paced_readv\n" % delay)
    wrapper = tmp_path / "paced-python"
    wrapper.write_text('#!/bin/sh\nPYTHONPATH="%s" exec "%s" "$@"\n' % (site, sys.executable))
    wrapper.chmod(0o755)
    return str(wrapper)


def localhost_lane(work, nas):
    """staged_hub's lane of lane(): localhost, its local hub <dir>/localhost/hub."""
    return lane(work, nas)[0]


def corrupt_main_shard(nas):
    """staged_hub's trap: bit rot in the main repo's second shard on the NAS (re-frozen)."""
    _corrupt_nas_shard(nas, nas["repos"][MAIN_REPO]["shards"][1])


def failed_on_a_corrupt_nas_shard(staged_hub):
    """One --tags preflight,stage run of lane() on a fresh node whose NAS has corrupt_main_shard's bit rot: it
    fails. Run once a session for the tests that check what that failure left (conftest.staged_hub)."""
    return staged_hub("localhost-corrupt-nas", localhost_lane, tags=STAGE, plant=corrupt_main_shard, ok=False)


def run_failures(out):
    """The failed tasks' messages of a json-callback run (the whole output when it is not JSON)."""
    try:
        return failures(json.loads(out))
    except ValueError:
        return [out[-3000:]]


class Playbook(object):
    """ansible-playbook stage-deepseek.yml in the background (json callback unless env says otherwise);
    its output goes to files, so a long watch never blocks it on a full pipe."""

    def __init__(self, tmp_path, inventory, *args, **env):
        cmd = [os.path.join(BIN_DIR, "ansible-playbook"), "-i", inventory,
               os.path.join(REPO_ROOT, "stage-deepseek.yml")] + list(args)
        self.out_path, self.err_path = str(tmp_path / "playbook.out"), str(tmp_path / "playbook.err")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=dict(ansible_env(tmp_path), **env), stdout=out,
                                         stderr=err)

    def poll(self):
        return self.proc.poll()

    def finish(self, timeout=300):
        """(exit code, stdout text, stderr text) once it ended; killed if it outlives `timeout`."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                processes.kill_tree(self.proc)
        with open(self.out_path, "rb") as out, open(self.err_path, "rb") as err:
            return self.proc.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")


def progress_path(local, nas, repo_id=MAIN_REPO):
    return os.path.join(str(local), ".locks", nas["repos"][repo_id]["folder"], PROGRESS_NAME)


def read_progress(path):
    """The progress file, or None before the first write (it is replaced atomically: never torn)."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def utc_seconds(text):
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", text), text
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def to_copy(nas, repo_id=MAIN_REPO):
    """(files, bytes) a fresh stage of the repo (page15/ left out) copies: unique blobs and real files."""
    files = dict((p, f) for p, f in nas["repos"][repo_id]["files"].items() if not p.startswith("page15/"))
    blobs = dict((f["etag"], f["size"]) for f in files.values() if f["kind"] == "link")
    real = [f["size"] for f in files.values() if f["kind"] == "real"]
    return len(blobs) + len(real), sum(blobs.values()) + sum(real)


def watch(run, path, until=None, timeout=300):
    """Every distinct progress document seen while the playbook runs (with whether its pid was alive
    then); stops early once until(doc) holds. Returns the list."""
    seen = []
    deadline = time.monotonic() + timeout
    while run.poll() is None and time.monotonic() < deadline:
        doc = read_progress(path)
        if doc is not None and (not seen or seen[-1][0] != doc):
            seen.append((doc, pid_alive(doc["pid"])))
            if until is not None and until(doc):
                break
        time.sleep(0.02)
    return seen


def mirror_row(tasks, stage_pass, repo_id=MAIN_REPO):
    return [r for r in mirror_results(tasks, stage_pass) if r["item"]["repo_id"] == repo_id][0]


# ------------------------------------------------------------------------------------------------
# verify says what it proved
# ------------------------------------------------------------------------------------------------

def test_verify_on_an_empty_local_root_fails_naming_what_is_not_staged_and_writes_nothing(tmp_path, nas_hub):
    inventory, roots = lane(tmp_path, nas_hub)
    local_hub = roots["localhost"]
    local_hub.mkdir(parents=True)
    before = tree_snapshot(local_hub)
    code, tasks, _stats = play(tmp_path, inventory, tags="verify")
    assert code != 0
    rows = dict((r["item"]["repo_id"], r) for r in mirror_results(tasks, "verify"))
    for repo_id, row in rows.items():
        files = sorted(p for p in nas_hub["repos"][repo_id]["files"] if not p.startswith("page15/"))
        assert row["failed"] and row["unstaged_paths"] == files and row["report"]["status"] == "failed"
        assert "%d of the %d selected file(s) of %s" % (len(files), len(files), repo_id) in row["msg"]
        assert files[0] in row["msg"] and "`dgx-stage stage --limit localhost`" in row["msg"] and row["bytes_copied"] == 0
    assert sorted(rows) == sorted([MAIN_REPO, DRAFTER_REPO])
    # No blob, no lock, no progress file. The background jobs' dir came and went (.locks/dgx-stage-async,
    # removed once empty): the root's own mtime moved, nothing else.
    assert [d for d in snapshot_diff(before, tree_snapshot(local_hub)) if not d.startswith("changed .:")] == []
    assert os.listdir(str(local_hub)) == []
    assert not [name for name in tasks if name.startswith("Verify | Check each snapshot")]


# ------------------------------------------------------------------------------------------------
# the progress file
# ------------------------------------------------------------------------------------------------

def test_progress_file_during_and_after_a_copy(tmp_path, make_nas_hub):
    nas = make_nas_hub(shard_size=WATCHED_SHARD, n_shards=4)
    files, nbytes = to_copy(nas)
    inventory, roots = lane(tmp_path, nas, interpreter=paced_python(tmp_path), stage_workers=2)
    path = progress_path(roots["localhost"], nas)
    run = Playbook(tmp_path, inventory, "--tags", STAGE)
    seen = watch(run, path)
    code, out, err = run.finish()
    assert code == 0, (run_failures(out), err[-3000:])
    copying = [(doc, alive) for doc, alive in seen if doc["status"] == "running" and doc["step"] == "copying"]
    assert copying and all(alive for _doc, alive in copying)
    mid = [doc for doc, _alive in copying if 0 < doc["bytes_done"] < doc["bytes_total"]]
    assert len(mid) >= 2, [d["bytes_done"] for d, _a in seen]          # it moves during the copy
    selected = set(p for p in nas["repos"][MAIN_REPO]["files"] if not p.startswith("page15/"))
    for doc in mid:
        assert (doc["pass"], doc["finished"], doc["aborted"]) == ("stage", False, False)
        assert (doc["files_total"], doc["bytes_total"]) == (files, nbytes) and doc["files_done"] < files
        assert doc["current"] in selected and doc["bytes_read"]["nas"] == doc["bytes_done"]
        assert (doc["eta_s"] is None) == (doc["mib_per_s"] is None)
        assert doc["eta_s"] is not None or doc["elapsed_s"] < 2        # a rate once a second of work is in
        assert abs(utc_seconds(doc["updated_at"]) - time.time()) < 600
    assert [d["bytes_done"] for d in mid] == sorted(d["bytes_done"] for d in mid)
    assert any(d["eta_s"] is not None and d["eta_s"] > 0 for d in mid)

    done = read_progress(path)
    assert (done["status"], done["finished"], done["aborted"], done["eta_s"]) == ("ok", True, False, 0)
    assert (done["files_done"], done["files_total"], done["bytes_done"], done["bytes_total"]) == (
        files, files, nbytes, nbytes)
    assert done["current"] is None and done["mib_per_s"] > 0 and not pid_alive(done["pid"])
    assert utc_seconds(done["updated_at"]) >= utc_seconds(mid[-1]["updated_at"])


def test_progress_file_after_a_sigkill_shows_a_dead_unfinished_run(tmp_path, make_nas_hub, kill_at_teardown):
    nas = make_nas_hub(shard_size=WATCHED_SHARD, n_shards=4)
    inventory, roots = lane(tmp_path, nas, interpreter=paced_python(tmp_path), stage_workers=2)
    path = progress_path(roots["localhost"], nas)
    run = Playbook(tmp_path, inventory, "--tags", STAGE)
    try:
        seen = watch(run, path, until=lambda doc: doc["step"] == "copying" and doc["bytes_done"] > 0)
        assert seen and seen[-1][1], "never saw the copy running"
        kill_at_teardown(run.proc, environ=own_environ(tmp_path))   # the module's async wrapper daemonized
        os.kill(seen[-1][0]["pid"], signal.SIGKILL)
    finally:
        code, _out, _err = run.finish(timeout=120)
    assert code != 0
    dead = read_progress(path)
    assert dead["pid"] == seen[-1][0]["pid"] and not pid_alive(dead["pid"])
    assert (dead["status"], dead["finished"], dead["aborted"]) == ("running", False, False)
    assert 0 < dead["bytes_done"] < dead["bytes_total"]
    assert time.time() - utc_seconds(dead["updated_at"]) >= 0          # its age only grows from here

    code, data = run_playbook(tmp_path, inventory, "--tags", STAGE)     # the next run takes over the file
    assert code == 0, failures(data)
    again = read_progress(path)
    assert (again["status"], again["finished"], again["aborted"]) == ("ok", True, False)
    assert again["pid"] != dead["pid"]


def test_progress_file_after_a_failing_run_says_aborted(staged_hub):
    failed = failed_on_a_corrupt_nas_shard(staged_hub)
    nas_hub, local_hub, code = failed["nas"], failed["dir"] / "localhost" / "hub", failed["code"]
    shard = nas_hub["repos"][MAIN_REPO]["shards"][1]
    info = nas_hub["repos"][MAIN_REPO]["files"][shard]
    assert code != 0
    doc = read_progress(progress_path(local_hub, nas_hub))
    assert (doc["pass"], doc["status"], doc["finished"], doc["aborted"]) == ("stage", "failed", False, True)
    assert info["etag"] in doc["error"] and not pid_alive(doc["pid"]) and doc["eta_s"] is None
    drafter = read_progress(progress_path(local_hub, nas_hub, DRAFTER_REPO))
    assert (drafter["status"], drafter["finished"], drafter["aborted"]) == ("ok", True, False)


def test_verify_after_stage_keeps_the_stage_figures_and_hashes_in_the_open(tmp_path, nas_hub):
    inventory, roots = lane(tmp_path, nas_hub, stage_verify="full")
    local_hub = roots["localhost"]
    code, tasks, _stats = play(tmp_path, inventory, tags="preflight,stage,verify")
    assert code == 0, tasks
    staged, verified = mirror_row(tasks, "stage"), mirror_row(tasks, "verify")
    files, nbytes = to_copy(nas_hub)
    doc = read_progress(progress_path(local_hub, nas_hub))
    assert doc["pass"] == "verify" and sorted(doc["passes"]) == ["stage", "verify"]
    stage_figures = doc["passes"]["stage"]
    assert (stage_figures["finished"], stage_figures["bytes_done"], stage_figures["files_done"]) == (
        True, staged["bytes_copied"], files)
    assert doc["passes"]["verify"]["hashing"] == {"files_done": files, "files_total": files, "bytes_done": nbytes,
                                                  "bytes_total": nbytes}
    assert doc["bytes_read"] == verified["bytes_read"] == {"local": nbytes, "nas": 0}

    code, _tasks, _stats = play(tmp_path, inventory, tags="verify")
    assert code == 0
    later = read_progress(progress_path(local_hub, nas_hub))
    assert later["passes"]["stage"] == stage_figures and later["updated_at"] >= doc["updated_at"]

    code, _tasks, _stats = play(tmp_path, inventory, tags="stage")      # nothing to do: truthful, verify kept
    assert code == 0
    idle = read_progress(progress_path(local_hub, nas_hub))
    assert (idle["pass"], idle["finished"], idle["files_total"], idle["bytes_total"]) == ("stage", True, 0, 0)
    assert idle["passes"]["verify"] == later["passes"]["verify"]

