"""hf_hub_mirror through Ansible (`ansible localhost -m hf_hub_mirror`), against a read-only NAS hub: a run
killed mid-copy (SIGKILL, SIGTERM), which needs a real module process and the ansible process above it. The
module's contract otherwise (results, check and diff mode, failures, peer_dir) is proven in-process by
tests/unit/test_hf_hub_mirror.py.

The NAS fixtures (conftest.py) fail a test whose run changed a single byte or inode attribute of
the NAS tree.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

import hubgen
import processes
from conftest import parse_module_output
from treestate import blob_matches_name

MAIN = hubgen.MAIN_REPO
from ansible.module_utils.dgx_fsutil import TEMP_PREFIX  # what a killed copy leaves behind


def main_args(nas, local, **extra):
    args = {"src": nas["hub"], "dest": str(local), "repo_id": MAIN, "ignore_patterns": ["page15/"]}
    args.update(extra)
    return args


def staged_files(nas):
    return dict((p, f) for p, f in nas["repos"][MAIN]["files"].items() if not p.startswith("page15/"))


def unique_blobs(files):
    return dict((f["etag"], f["size"]) for f in files.values() if f["kind"] == "link")


def local_repo(nas, local):
    return os.path.join(str(local), nas["repos"][MAIN]["folder"])


# ------------------------------------------------------------------------------------------------
# lesson 8: atomic writes survive SIGKILL
# ------------------------------------------------------------------------------------------------

def _copy_in_flight(blob_dir, minimum, full_size):
    """Name of a file still being written in blob_dir (under a temp name or, if torn, any name), or None.

    Only files not yet at full size count: the kill must land while the copy itself is running.
    """
    try:
        names = os.listdir(blob_dir)
    except FileNotFoundError:
        return None
    for name in names:
        try:
            size = os.path.getsize(os.path.join(blob_dir, name))
        except FileNotFoundError:
            continue
        if minimum < size < full_size:
            return name
    return None


@pytest.mark.slow
def test_sigkill_mid_copy_leaves_no_torn_blob_and_rerun_recovers(make_nas_hub, local_hub, run_module, spawn_module):
    shard_size = 128 * 1024 * 1024
    nas = make_nas_hub(shard_size=shard_size, n_shards=2)
    files = staged_files(nas)
    blob_dir = os.path.join(local_repo(nas, local_hub), "blobs")
    args = main_args(nas, local_hub, verify="full")
    proc = spawn_module(args)
    seen = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            seen = _copy_in_flight(blob_dir, 1024 * 1024, shard_size)
            if seen:
                break
            time.sleep(0.002)
    finally:
        processes.kill_tree(proc)     # the module runs in its worker's own session: the whole tree, not a group
        proc.communicate(timeout=60)
    assert seen, "never saw a copy in flight in %s (run ended with rc %s)" % (blob_dir, proc.returncode)
    assert proc.returncode == -signal.SIGKILL

    names = os.listdir(blob_dir)
    finals = [n for n in names if not n.startswith(TEMP_PREFIX)]
    for name in finals:                          # nothing under a final name is torn
        assert blob_matches_name(os.path.join(blob_dir, name), name), "torn blob under its final name: " + name
    assert not os.path.exists(os.path.join(local_repo(nas, local_hub), "refs", "main"))
    debris = sorted(os.path.join(blob_dir, n) for n in names if n.startswith(TEMP_PREFIX))
    assert debris, "the kill landed after the copy finished: no debris to recover from"

    lock_dir = os.path.join(str(local_hub), ".locks", nas["repos"][MAIN]["folder"])
    progress_debris = [os.path.join(lock_dir, n) for n in os.listdir(lock_dir) if n.startswith(TEMP_PREFIX)]
    result = run_module(args)
    assert result["changed"] is True and not result.get("failed")
    # a progress file killed mid-write is debris too
    assert sorted(result["debris_removed"]) == sorted(debris + progress_debris)
    assert result["blobs"]["copied"] + result["blobs"]["reused"] == len(unique_blobs(files))
    assert result["blobs"]["reused"] == len(finals)
    remaining = os.listdir(blob_dir)
    assert not [n for n in remaining if n.startswith(TEMP_PREFIX)]
    assert sorted(remaining) == sorted(unique_blobs(files))
    for name in remaining:
        assert blob_matches_name(os.path.join(blob_dir, name), name), name

    # the result is a complete, offline-loadable hub cache whose files are the blobs just verified
    # (a subprocess: huggingface_hub reads HF_HUB_OFFLINE at import time)
    check = (
        "import os, sys\n"
        "from huggingface_hub import hf_hub_download, snapshot_download, scan_cache_dir\n"
        "cache, repo = sys.argv[1], sys.argv[2]\n"
        "snapshot_download(repo, cache_dir=cache, local_files_only=True)\n"
        "for name in sys.argv[3:]:\n"
        "    print(name, os.path.realpath(hf_hub_download(repo, name, cache_dir=cache, local_files_only=True)))\n"
        "info = scan_cache_dir(cache)\n"
        "assert not info.warnings, info.warnings\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", check, str(local_hub), MAIN] + sorted(files), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    resolved = dict(line.split(" ", 1) for line in out.stdout.decode().splitlines())
    assert resolved == dict((p, os.path.realpath(os.path.join(blob_dir, f["etag"]))) for p, f in files.items())


def _module_pids():
    """The AnsiballZ python processes of hf_hub_mirror running now."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                if b"AnsiballZ_hf_hub_mirror" in handle.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_sigterm_mid_copy_stops_the_workers_removes_their_temp_files_and_reports(make_nas_hub, local_hub,
                                                                                  spawn_module, run_module,
                                                                                  kill_at_teardown):
    shard_size = 128 * 1024 * 1024
    nas = make_nas_hub(shard_size=shard_size, n_shards=3)
    blob_dir = os.path.join(local_repo(nas, local_hub), "blobs")
    args = main_args(nas, local_hub, workers=3)
    proc = spawn_module(args)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _copy_in_flight(blob_dir, 1024 * 1024, shard_size):
            time.sleep(0.002)
        tree = kill_at_teardown(proc)
        pids = [pid for pid in _module_pids() if pid in tree]    # this run's module, not another run's
        assert pids, "no module process found"
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        out, _err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            processes.kill_tree(proc)
    result = parse_module_output(out.decode("utf-8", "replace"))
    assert result.get("failed") and "interrupted" in result["msg"], result
    assert not [n for n in os.listdir(blob_dir) if n.startswith(TEMP_PREFIX)]
    assert not os.path.exists(os.path.join(local_repo(nas, local_hub), "refs", "main"))
    assert run_module(args)["changed"] is True and run_module(args)["changed"] is False
