"""hf_hub_mirror through Ansible (`ansible localhost -m hf_hub_mirror`), against a read-only NAS hub.

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
from conftest import parse_module_output
from treestate import blob_matches_name

MAIN = hubgen.MAIN_REPO
from ansible.module_utils.dgx_fsutil import TEMP_PREFIX  # what a killed copy leaves behind
DOCUMENTED = {"changed", "commit", "snapshot", "files", "blobs", "bytes_copied", "excluded_paths", "duration_s"}


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


def test_module_run_returns_documented_keys_and_is_idempotent(nas_hub, local_hub, run_module):
    repo = nas_hub["repos"][MAIN]
    files = staged_files(nas_hub)
    blobs = unique_blobs(files)
    started = time.monotonic()
    first = run_module(main_args(nas_hub, local_hub))
    wall = time.monotonic() - started
    assert DOCUMENTED <= set(first), sorted(DOCUMENTED - set(first))
    assert first["changed"] is True and not first.get("failed")
    assert first["commit"] == repo["commit"]
    assert first["snapshot"] == os.path.join(local_repo(nas_hub, local_hub), "snapshots", repo["commit"])
    assert first["files"] == {"total": len(repo["files"]), "local": len(files), "excluded": len(repo["page15"]),
                              "dangling": 0}
    assert first["blobs"] == {"copied": len(blobs), "reused": 0, "repaired": 0}
    assert first["bytes_copied"] == sum(blobs.values())
    assert sorted(first["excluded_paths"]) == sorted(repo["page15"])
    assert isinstance(first["duration_s"], float) and 0 <= first["duration_s"] < wall
    for path, info in files.items():
        entry = os.path.join(first["snapshot"], *path.split("/"))
        assert os.readlink(entry) == "../" * (path.count("/") + 2) + "blobs/" + info["etag"]
        assert blob_matches_name(entry, info["etag"])
    second = run_module(main_args(nas_hub, local_hub))
    assert second["changed"] is False
    assert second["blobs"] == {"copied": 0, "reused": len(blobs), "repaired": 0}
    assert second["bytes_copied"] == 0


def test_module_check_mode_changes_nothing(nas_hub, local_hub, run_module, tree_state):
    before = tree_state(local_hub)
    result = run_module(main_args(nas_hub, local_hub), check=True)
    blobs = unique_blobs(staged_files(nas_hub))
    assert result["changed"] is True
    assert result["blobs"] == {"copied": len(blobs), "reused": 0, "repaired": 0}
    assert result["bytes_copied"] == sum(blobs.values())
    assert tree_state.diff(before, tree_state(local_hub)) == []
    assert os.listdir(str(local_hub)) == []
    run_module(main_args(nas_hub, local_hub))
    before = tree_state(local_hub)
    again = run_module(main_args(nas_hub, local_hub), check=True)
    assert again["changed"] is False and again["blobs"]["copied"] == 0
    assert tree_state.diff(before, tree_state(local_hub)) == []


def test_module_diff_lists_every_copied_blob(nas_hub, local_hub, run_module):
    blobs = unique_blobs(staged_files(nas_hub))
    result = run_module(main_args(nas_hub, local_hub), diff=True)
    text = result["diff"]["prepared"]
    blob_dir = os.path.join(local_repo(nas_hub, local_hub), "blobs")
    copies = [line for line in text.splitlines() if line.startswith("+ copy ")]
    assert len(copies) == len(blobs)
    for etag in blobs:
        assert sum(1 for line in copies if line.startswith("+ copy %s " % os.path.join(blob_dir, etag))) == 1, etag
    assert "+ ref main = %s" % nas_hub["repos"][MAIN]["commit"] in text
    nothing = run_module(main_args(nas_hub, local_hub), diff=True)
    assert nothing["changed"] is False and "+ copy " not in nothing.get("diff", {}).get("prepared", "")


def test_module_failure_is_reported_with_message(nas_hub, local_hub, run_module, tree_state):
    before = tree_state(local_hub)
    result = run_module(main_args(nas_hub, local_hub, repo_id="coolbho3k/NoSuchModel"))
    assert result["failed"] is True and result.get("changed", False) is False
    assert "unknown repo coolbho3k/NoSuchModel" in result["msg"]
    for repo in nas_hub["repos"].values():
        assert repo["folder"] in result["msg"]
    assert tree_state.diff(before, tree_state(local_hub)) == []


# ------------------------------------------------------------------------------------------------
# lesson 8: atomic writes survive SIGKILL
# ------------------------------------------------------------------------------------------------

def _descendants(root_pid):
    """Pids of root_pid and every process below it (the module runs in its own session under ansible)."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _kill_tree(root_pid):
    """SIGKILL every process group of our ansible run (its worker calls setsid), no other process."""
    groups = set()
    for pid in _descendants(root_pid):
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


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
        _kill_tree(proc.pid)
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


def test_non_utf8_file_names_do_not_break_the_result(make_nas_hub, local_hub, run_module):
    # a page15 file whose name is not UTF-8 (an old tool's Latin-1): staged or excluded, the module's
    # result still reaches the controller, the name shown with U+FFFD
    nas = make_nas_hub()
    snap = os.path.join(nas["hub"], nas["repos"][MAIN]["folder"], "snapshots", nas["repos"][MAIN]["commit"])
    page15 = os.path.join(snap, "page15")
    os.chmod(page15, 0o755)
    with open(os.path.join(os.fsencode(page15), b"caf\xe9.bin"), "wb") as handle:
        handle.write(b"latin-1 named")
    os.chmod(page15, 0o555)
    nas.freeze()
    excluded = run_module(main_args(nas, local_hub))
    assert "page15/caf\ufffd.bin" in excluded["excluded_paths"]
    staged = run_module(main_args(nas, local_hub, ignore_patterns=[]))
    assert staged["changed"] is True and not staged.get("failed")
    assert os.path.isfile(os.path.join(os.fsencode(local_repo(nas, local_hub)), b"snapshots",
                                       nas["repos"][MAIN]["commit"].encode(), b"page15", b"caf\xe9.bin"))


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
                                                                                  spawn_module, run_module):
    shard_size = 128 * 1024 * 1024
    nas = make_nas_hub(shard_size=shard_size, n_shards=3)
    blob_dir = os.path.join(local_repo(nas, local_hub), "blobs")
    args = main_args(nas, local_hub, workers=3)
    proc = spawn_module(args)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _copy_in_flight(blob_dir, 1024 * 1024, shard_size):
            time.sleep(0.002)
        pids = _module_pids()
        assert pids, "no module process found"
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        out, _err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
    result = parse_module_output(out.decode("utf-8", "replace"))
    assert result.get("failed") and "interrupted" in result["msg"], result
    assert not [n for n in os.listdir(blob_dir) if n.startswith(TEMP_PREFIX)]
    assert not os.path.exists(os.path.join(local_repo(nas, local_hub), "refs", "main"))
    assert run_module(args)["changed"] is True and run_module(args)["changed"] is False


# ------------------------------------------------------------------------------------------------
# peer_dir: blobs another host of the lane sent are copied only when they hash to their names
# ------------------------------------------------------------------------------------------------

def test_module_adopts_a_good_peer_blob_and_refetches_a_corrupt_one_from_the_nas(nas_hub, local_hub, run_module):
    repo = nas_hub["repos"][MAIN]
    blobs = unique_blobs(staged_files(nas_hub))
    good, corrupt = [repo["files"][shard]["etag"] for shard in repo["shards"][:2]]
    peer_dir = os.path.join(str(local_hub), ".locks", "dgx-stage-peer", repo["folder"])
    os.makedirs(peer_dir)
    for etag in (good, corrupt):
        with open(os.path.realpath(os.path.join(nas_hub.repo_dir(), "blobs", etag)), "rb") as src:
            data = bytearray(src.read())
        if etag == corrupt:
            data[len(data) // 2] ^= 0xFF          # corrupted in transit: same size, one byte flipped
        with open(os.path.join(peer_dir, etag), "wb") as dst:
            dst.write(data)
    good_inode = os.stat(os.path.join(peer_dir, good)).st_ino
    args = main_args(nas_hub, local_hub, peer_dir=peer_dir)
    check = run_module(args, check=True)
    assert check["wanted_blobs"] == sorted(blobs) and sorted(os.listdir(peer_dir)) == sorted([good, corrupt])
    result = run_module(args)
    assert result["changed"] is True and not result.get("failed")
    assert result["bytes_from_peers"] == blobs[good]
    assert result["bytes_from_nas"] == sum(blobs.values()) - blobs[good]
    assert result["bytes_copied"] == sum(blobs.values())
    assert [(r["blob"], r["paths"]) for r in result["peer_rejected"]] == [(corrupt, [repo["shards"][1]])]
    assert result["report"]["bytes_from_peers"] == blobs[good] and result["report"]["peer_rejected"] == 1
    assert result["source_snapshot"] == nas_hub.snapshot_dir()
    blob_dir = os.path.join(local_repo(nas_hub, local_hub), "blobs")
    blob = os.stat(os.path.join(blob_dir, good))
    assert blob.st_ino != good_inode and blob.st_nlink == 1               # copied (a new file), never moved
    for etag in blobs:
        assert blob_matches_name(os.path.join(blob_dir, etag), etag), etag
    assert not os.path.lexists(peer_dir)
    again = run_module(args)
    assert again["changed"] is False and (again["bytes_from_nas"], again["bytes_from_peers"]) == (0, 0)
