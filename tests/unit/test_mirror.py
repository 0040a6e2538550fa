"""hf_hub_mirror's engine (module_utils/dgx_mirror*.py) against synthetic NAS hubs holding every trap of
the 2026-09-27 night-shift log. One test (or group) per lesson; each asserts the behaviour tightly
enough to fail when the code implementing it is removed.

Every NAS hub here is read-only by contract: it is chmod a-w and, because the tests run as root,
also compared byte for byte (and lstat for lstat) after every test.
"""
import builtins
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time

import pytest

import hubgen
from ansible.module_utils import dgx_mirror, dgx_mirror_apply, dgx_mirror_plan, dgx_space
from ansible.module_utils.dgx_copy import LocalWriteError
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_hashing import ChunkBuffer, sample_ranges
from ansible.module_utils.dgx_mirror import run_mirror
from ansible.module_utils.dgx_mirror_plan import plan_mirror
from ansible.module_utils.dgx_mirror_request import MirrorFailed, MirrorRequest
from ansible.module_utils.dgx_progress_file import PassMeter
from ansible.module_utils.dgx_nas_suspects import suspects_of
from ansible.module_utils.dgx_space import parse_reserve, parse_size
from ansible.module_utils.dgx_fsutil import TEMP_PREFIX
from ansible.module_utils.dgx_units import human_bytes
from nashub import build_nas
from mountns import bind_mount, in_private_mount_namespace
from privilege import NOBODY, nobody_owned_dir, run_as_nobody
from treestate import workers_still_running, blob_matches_name, sha256_file, snapshot_diff, tree_snapshot

MAIN = hubgen.MAIN_REPO
DRAFTER = hubgen.DRAFTER_REPO
PAGE15 = ["page15/"]
BIG_SHARD = 3 * 1024 * 1024   # > 2 MiB edges + 8 x 64 KiB middle blocks: sampling really samples
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "module_utils")


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def _small_nas(tmp_path_factory):
    nas = build_nas(tmp_path_factory.mktemp("small") / "nas")
    yield nas
    nas.thaw()


@pytest.fixture(scope="module")
def _big_nas(tmp_path_factory):
    nas = build_nas(tmp_path_factory.mktemp("big") / "nas", shard_size=BIG_SHARD, n_shards=3)
    yield nas
    nas.thaw()


@pytest.fixture
def nas(_small_nas):
    """Shared small NAS hub (6 x 64 KiB shards); fails the test if it was written."""
    yield _small_nas
    _small_nas.assert_unchanged()


@pytest.fixture
def big_nas(_big_nas):
    """Shared NAS hub with 3 MiB shards, so sample verification reads samples, not whole files."""
    yield _big_nas
    _big_nas.assert_unchanged()


@pytest.fixture
def fresh_nas(tmp_path):
    """A NAS hub of this test's own, for tests that plant traps in it (call .freeze() afterwards)."""
    nas = build_nas(tmp_path / "nas")
    yield nas
    nas.assert_unchanged()
    nas.thaw()


def _stage_template(nas, tmp_path_factory, name):
    root = tmp_path_factory.mktemp(name)
    run_mirror(MirrorRequest(src=nas["hub"], dest=str(root), repo_id=MAIN, ignore_patterns=PAGE15))
    return str(root)


@pytest.fixture(scope="module")
def _small_template(_small_nas, tmp_path_factory):
    return _stage_template(_small_nas, tmp_path_factory, "small-staged")


@pytest.fixture(scope="module")
def _big_template(_big_nas, tmp_path_factory):
    return _stage_template(_big_nas, tmp_path_factory, "big-staged")


@pytest.fixture
def prestage(request):
    """prestage(nas, local): the local hub a first run (ignore page15/) leaves, cloned from one real run
    per shared NAS hub (copying files is much cheaper than the fsyncs of staging again)."""

    def clone(nas, local):
        template = request.getfixturevalue("_big_template" if nas["shard_size"] == BIG_SHARD else "_small_template")
        folder = nas.repo()["folder"]
        shutil.copytree(os.path.join(template, folder), os.path.join(str(local), folder), symlinks=True)
        assert_all_local(nas, local)

    return clone


@pytest.fixture
def local(tmp_path):
    path = tmp_path / "local"
    path.mkdir()
    return path


def mirror_request(nas, local, repo_id=MAIN, **kwargs):
    return MirrorRequest(src=nas["hub"], dest=str(local), repo_id=repo_id, **kwargs)


def stage(nas, local, repo_id=MAIN, **kwargs):
    return run_mirror(mirror_request(nas, local, repo_id, **kwargs))


def selected(nas, repo_id=MAIN, ignore_page15=True):
    """{path: file description} of what staging with(out) the page15 pattern selects."""
    files = nas.repo(repo_id)["files"]
    return dict((p, f) for p, f in files.items() if not (ignore_page15 and p.startswith("page15/")))


def unique_blobs(files):
    return dict((f["etag"], f["size"]) for f in files.values() if f["kind"] == "link")


def local_repo(nas, local, repo_id=MAIN):
    return os.path.join(str(local), nas.repo(repo_id)["folder"])


def local_snapshot(nas, local, repo_id=MAIN, commit=None):
    return os.path.join(local_repo(nas, local, repo_id), "snapshots", commit or nas.repo(repo_id)["commit"])


def local_blob(nas, local, etag, repo_id=MAIN):
    return os.path.join(local_repo(nas, local, repo_id), "blobs", etag)


def nas_blob_real(nas, etag, repo_id=MAIN):
    return os.path.realpath(os.path.join(nas.repo_dir(repo_id), "blobs", etag))


def assert_all_local(nas, local, repo_id=MAIN, ignore_page15=True):
    """Every selected entry is a correct relative link to a real, correct local blob (or a real file)."""
    local_real = os.path.realpath(str(local))
    snap = local_snapshot(nas, local, repo_id)
    for path, info in selected(nas, repo_id, ignore_page15).items():
        entry = os.path.join(snap, *path.split("/"))
        assert os.path.realpath(entry).startswith(local_real + os.sep), path
        if info["kind"] == "real":
            assert stat.S_ISREG(os.lstat(entry).st_mode), path
            assert sha256_file(entry) == info["sha256"], path
            continue
        assert os.path.islink(entry), path
        assert os.readlink(entry) == "../" * (path.count("/") + 2) + "blobs/" + info["etag"], path
        blob = local_blob(nas, local, info["etag"], repo_id)
        assert stat.S_ISREG(os.lstat(blob).st_mode), "%s: local blob is not a regular file" % path
        assert blob_matches_name(blob, info["etag"]), path


# ------------------------------------------------------------------------------------------------
# lesson 1: link chains through the hub-level store
# ------------------------------------------------------------------------------------------------

def test_link_chains_through_hub_store_end_in_local_real_blobs(nas, local):
    files = selected(nas)
    forms = set(f["blob_form"] for f in files.values())
    assert {"real", "rel-store", "abs-store"} <= forms      # the trap is really there
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert result["blobs"] == {"copied": len(unique_blobs(files)), "reused": 0, "repaired": 0}
    assert result["files"]["dangling"] == 0
    assert_all_local(nas, local)
    # extra ../ per sub-directory, exactly as huggingface_hub writes them
    snap = local_snapshot(nas, local)
    assert os.readlink(os.path.join(snap, "extras", "chat", "chat_template.jinja")).startswith("../../../../blobs/")
    # nothing anywhere in the local hub resolves into the NAS
    local_real = os.path.realpath(str(local))
    nas_real = os.path.realpath(nas["root"])
    for dirpath, dirnames, filenames in os.walk(str(local)):
        for name in dirnames + filenames:
            real = os.path.realpath(os.path.join(dirpath, name))
            assert real.startswith(local_real + os.sep) and not real.startswith(nas_real + os.sep), real


def test_generation1_blob_links_into_nas_store_are_repaired(prestage, nas, local):
    files = selected(nas)
    prestage(nas, local)
    by_form = {}
    for path, info in sorted(files.items()):
        by_form.setdefault(info["blob_form"], path)
    planted = {}
    for form in ("rel-store", "abs-store", "real"):      # gen 1: local blobs/<sha> -> NAS (rel and abs)
        path = by_form[form]
        etag = files[path]["etag"]
        blob = local_blob(nas, local, etag)
        os.unlink(blob)
        target = nas_blob_real(nas, etag)
        os.symlink(os.path.relpath(target, os.path.dirname(blob)) if form == "rel-store" else target, blob)
        assert os.path.realpath(os.path.join(local_snapshot(nas, local), path)) == target  # resolves into NAS
        planted[path] = blob
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert result["changed"] is True
    assert result["blobs"]["repaired"] == 3
    assert result["blobs"]["copied"] == 0
    assert result["repaired_paths"] == sorted(planted)
    for blob in planted.values():
        assert not os.path.islink(blob) and os.path.isfile(blob)
    assert_all_local(nas, local)


def test_hf_native_store_names_are_not_blob_names(tmp_path, local):
    # huggingface_hub 2.4 names store entries by a Xet hash: the local blob must take the etag the
    # snapshot link names (first hop), not the name at the end of the chain.
    nas = build_nas(tmp_path / "nas", hf_native=True)
    files = selected(nas)
    store_backed = [p for p, f in files.items() if f["store_path"]]
    assert store_backed and all(os.path.basename(files[p]["store_path"]) != files[p]["etag"] for p in store_backed)
    result = stage(nas, local, ignore_patterns=PAGE15, verify="full")
    assert result["blobs"]["copied"] == len(unique_blobs(files))
    assert sorted(os.listdir(os.path.join(local_repo(nas, local), "blobs"))) == sorted(unique_blobs(files))
    assert_all_local(nas, local)
    nas.assert_unchanged()
    nas.thaw()


# ------------------------------------------------------------------------------------------------
# lesson 2: page15 real files inside the snapshot
# ------------------------------------------------------------------------------------------------

def test_page15_excluded_by_pattern_is_not_staged(nas, local):
    page15 = nas.repo()["page15"]
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert sorted(result["excluded_paths"]) == sorted(page15)
    assert result["files"] == {"total": len(nas.repo()["files"]), "local": len(nas.repo()["files"]) - len(page15),
                               "excluded": len(page15), "dangling": 0, "rank": 0,
                               "shared": len(nas.repo()["files"]) - len(page15)}
    assert result["real_files"] == {"copied": 0, "repaired": 0}
    assert not os.path.lexists(os.path.join(local_snapshot(nas, local), "page15"))
    assert result["bytes_copied"] == sum(unique_blobs(selected(nas)).values())


def test_page15_without_patterns_is_staged_as_real_files(nas, local):
    page15 = nas.repo()["page15"]
    result = stage(nas, local)
    assert result["excluded_paths"] == []
    assert result["real_files"] == {"copied": len(page15), "repaired": 0}
    snap = local_snapshot(nas, local)
    for path in page15:
        entry = os.path.join(snap, *path.split("/"))
        assert stat.S_ISREG(os.lstat(entry).st_mode), path
        with open(entry, "rb") as mine, open(os.path.join(nas.snapshot_dir(), *path.split("/")), "rb") as theirs:
            assert mine.read() == theirs.read(), path
    assert_all_local(nas, local, ignore_page15=False)


def test_stale_page15_copy_is_reported_then_pruned(nas, local):
    page15 = nas.repo()["page15"]
    snap = local_snapshot(nas, local)
    stage(nas, local)                                    # an earlier run staged page15
    kept = stage(nas, local, ignore_patterns=PAGE15)     # prune off: reported, kept
    stale = sorted(os.path.join(snap, *p.split("/")) for p in page15)
    assert sorted(kept["stale_paths"]) == stale
    assert kept["pruned"] == []
    assert any("prune" in w and "page15" in w for w in kept["warnings"])
    assert all(os.path.isfile(p) for p in stale)
    pruned = stage(nas, local, ignore_patterns=PAGE15, prune=True)
    assert sorted(pruned["pruned"]) == stale
    assert pruned["stale_paths"] == [] and pruned["changed"] is True
    assert not os.path.lexists(os.path.join(snap, "page15"))   # emptied dirs go too
    assert_all_local(nas, local)
    again = stage(nas, local, ignore_patterns=PAGE15, prune=True)
    assert again["changed"] is False and again["pruned"] == [] and again["stale_paths"] == []


def test_space_check_counts_bytes_that_prune_frees(nas, local, monkeypatch):
    files = selected(nas)
    page15_bytes = sum(nas.repo()["files"][p]["size"] for p in nas.repo()["page15"])
    stage(nas, local)                                    # page15 staged as real files
    shard = nas.repo()["shards"][0]
    os.unlink(local_blob(nas, local, files[shard]["etag"]))   # one blob must be copied again
    need = files[shard]["size"]
    assert need > page15_bytes
    plan = plan_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, prune=True, reserve="0"))
    assert plan.freed_bytes == page15_bytes and plan.write_bytes == need
    # free space that fits the copy only once the pruned page15 copy is counted as reclaimable
    free = need - page15_bytes + 1
    monkeypatch.setattr(dgx_space, "disk_space", lambda path: (free, 10 * 1024 ** 3))
    with pytest.raises(StageError, match=r"need %d bytes .*available %d bytes" % (need, free)):
        stage(nas, local, ignore_patterns=PAGE15, reserve="0")
    result = stage(nas, local, ignore_patterns=PAGE15, reserve="0", prune=True)
    assert result["space"]["need"] == need and result["blobs"]["copied"] == 1
    assert result["space"]["reclaimable"] == page15_bytes
    assert_all_local(nas, local)


# ------------------------------------------------------------------------------------------------
# lesson 3: idempotence, no EEXIST, copytree-style snapshots fixed
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("verify", ["sample", "full", "none"])
def test_second_run_rewrites_nothing(nas, local, verify):
    first = stage(nas, local, ignore_patterns=PAGE15, verify=verify)
    assert first["changed"] is True
    before = tree_snapshot(local_repo(nas, local))
    second = stage(nas, local, ignore_patterns=PAGE15, verify=verify)
    assert second["changed"] is False
    assert second["blobs"] == {"copied": 0, "reused": len(unique_blobs(selected(nas))), "repaired": 0}
    assert second["bytes_copied"] == 0 and second["links_written"] == 0 and second["refs_written"] == []
    assert second["diff_text"] == ""
    # same inodes, same mtimes: not one blob, link, ref or listing rewritten
    assert snapshot_diff(before, tree_snapshot(local_repo(nas, local))) == []


def test_copytree_style_snapshot_gets_links_and_blobs(nas, local):
    # generation 2 of the log: shutil.copytree of the NAS snapshot (links followed -> regular files)
    snap = local_snapshot(nas, local)
    shutil.copytree(nas.snapshot_dir(), snap)
    for dirpath, _dirs, names in os.walk(snap):   # copytree keeps the NAS's read-only modes
        os.chmod(dirpath, 0o755)
    files = selected(nas)
    link_entries = [p for p, f in files.items() if f["kind"] == "link"]
    assert all(stat.S_ISREG(os.lstat(os.path.join(snap, *p.split("/"))).st_mode) for p in link_entries)
    result = stage(nas, local, ignore_patterns=PAGE15)   # no EEXIST on the existing files
    assert result["links_written"] == len(link_entries)
    assert result["blobs"]["copied"] == len(unique_blobs(files))
    assert_all_local(nas, local)
    # and the same again with the links now in place: no EEXIST, nothing to do
    assert stage(nas, local, ignore_patterns=PAGE15, prune=True)["links_written"] == 0
    assert stage(nas, local, ignore_patterns=PAGE15, prune=True)["changed"] is False


def test_wrong_link_text_is_rewritten(prestage, nas, local):
    prestage(nas, local)
    snap = local_snapshot(nas, local)
    entry = os.path.join(snap, "extras", "generation_config.json")
    etag = selected(nas)["extras/generation_config.json"]["etag"]
    os.unlink(entry)
    os.symlink(os.path.abspath(local_blob(nas, local, etag)), entry)  # resolves fine, but absolute
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert result["links_written"] == 1 and result["changed"] is True
    assert os.readlink(entry) == "../../../blobs/" + etag


# ------------------------------------------------------------------------------------------------
# lesson 4: NFS mtime staleness - content decides, never size/mtime
# ------------------------------------------------------------------------------------------------

CORRUPTIONS = {
    # kind: {verify mode: detected?}
    "zero-filled": {"none": False, "sample": True, "full": True},
    "flip-in-middle-sample": {"none": False, "sample": True, "full": True},
    "flip-between-samples": {"none": False, "sample": False, "full": True},
}


def _corrupt(path, kind, size):
    ranges = sample_ranges(size)
    assert len(ranges) == 10, "shards must be large enough for real sampling"
    if kind == "zero-filled":
        with open(path, "wb") as handle:
            handle.write(b"\0" * size)
    elif kind == "flip-in-middle-sample":
        offset, length = ranges[4]
        hubgen.flip_byte(path, offset + length // 2)
    else:
        offset, length = ranges[4]
        gap = offset + length + 100
        assert gap < ranges[5][0]
        hubgen.flip_byte(path, gap)


@pytest.mark.parametrize("verify", ["none", "sample", "full"])
@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_same_size_same_mtime_wrong_content(prestage, big_nas, local, kind, verify):
    nas = big_nas
    shard = nas.repo()["shards"][1]
    info = selected(nas)[shard]
    prestage(nas, local)
    blob = local_blob(nas, local, info["etag"])
    _corrupt(blob, kind, info["size"])
    nas_st = os.stat(nas_blob_real(nas, info["etag"]))
    os.utime(blob, ns=(nas_st.st_atime_ns, nas_st.st_mtime_ns))    # NFS: attributes say "same file"
    assert os.stat(blob).st_size == nas_st.st_size and os.stat(blob).st_mtime_ns == nas_st.st_mtime_ns
    ino = os.stat(blob).st_ino
    result = stage(nas, local, ignore_patterns=PAGE15, verify=verify)
    if CORRUPTIONS[kind][verify]:
        assert result["changed"] is True
        assert result["blobs"]["repaired"] == 1 and result["repaired_paths"] == [shard]
        assert result["bytes_copied"] == info["size"]
        assert blob_matches_name(blob, info["etag"]) and os.stat(blob).st_ino != ino
        assert_all_local(nas, local)
    else:  # documents the mode's limit: it trusts what it does not read
        assert result["changed"] is False and result["blobs"]["repaired"] == 0
        assert not blob_matches_name(blob, info["etag"]) and os.stat(blob).st_ino == ino


def test_truncated_local_blob_is_repaired_even_without_verify(prestage, big_nas, local):
    nas = big_nas
    info = selected(nas)[nas.repo()["shards"][0]]
    prestage(nas, local)
    blob = local_blob(nas, local, info["etag"])
    os.truncate(blob, info["size"] // 2)
    result = stage(nas, local, ignore_patterns=PAGE15, verify="none")
    assert result["repaired_paths"] == [nas.repo()["shards"][0]]
    assert blob_matches_name(blob, info["etag"])


# ------------------------------------------------------------------------------------------------
# lesson 5: size-based hardlink dedup bound the wrong shard
# ------------------------------------------------------------------------------------------------

def test_hardlinked_wrong_shard_is_split_and_repaired(prestage, big_nas, local):
    nas = big_nas
    shard_a, shard_b = nas.repo()["same_size_pairs"][0]
    files = selected(nas)
    etag_a, etag_b = files[shard_a]["etag"], files[shard_b]["etag"]
    assert files[shard_a]["size"] == files[shard_b]["size"] and etag_a != etag_b
    prestage(nas, local)
    blob_a, blob_b = local_blob(nas, local, etag_a), local_blob(nas, local, etag_b)
    os.unlink(blob_a)
    os.link(blob_b, blob_a)                              # the log's bad dedup: A is now B's content
    st_b = os.stat(blob_b)
    assert os.stat(blob_a).st_ino == st_b.st_ino and st_b.st_nlink == 2
    result = stage(nas, local, ignore_patterns=PAGE15, verify="sample")
    assert result["blobs"] == {"copied": 0, "reused": len(unique_blobs(files)) - 1, "repaired": 1}
    assert result["repaired_paths"] == [shard_a]
    after_b = os.stat(blob_b)
    assert (after_b.st_ino, after_b.st_mtime_ns) == (st_b.st_ino, st_b.st_mtime_ns)   # B untouched
    assert after_b.st_nlink == 1 and os.stat(blob_a).st_ino != after_b.st_ino
    assert blob_matches_name(blob_a, etag_a) and blob_matches_name(blob_b, etag_b)
    assert_all_local(nas, local)


def test_two_paths_of_one_blob_share_one_verified_copy(fresh_nas, local):
    # dedup by NAME (the content hash) is the right dedup: one blob, one copy, both paths repaired together
    nas = fresh_nas
    etag = nas.repo()["files"]["config.json"]["etag"]
    nas.thaw()
    os.symlink("../../../blobs/" + etag, os.path.join(nas.snapshot_dir(), "extras", "config-copy.json"))
    nas.freeze()
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert result["blobs"]["copied"] == len(unique_blobs(selected(nas)))
    assert result["files"]["local"] == len(selected(nas)) + 1
    snap = local_snapshot(nas, local)
    assert os.readlink(os.path.join(snap, "extras", "config-copy.json")) == "../../../blobs/" + etag
    blob = local_blob(nas, local, etag)
    with open(blob, "r+b") as handle:
        handle.write(b"[")                                  # same size, wrong content
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert result["blobs"]["repaired"] == 1
    assert result["repaired_paths"] == ["config.json", "extras/config-copy.json"]
    assert blob_matches_name(blob, etag)


# ------------------------------------------------------------------------------------------------
# lesson 6: verify=full proves blobs against their names, no NAS read
# ------------------------------------------------------------------------------------------------

def _record_opens(monkeypatch):
    opened = []
    real_open, real_os_open = builtins.open, os.open

    def rec_open(file, *args, **kwargs):
        if not isinstance(file, int):
            opened.append(os.path.realpath(os.fsdecode(file)))
        return real_open(file, *args, **kwargs)

    def rec_os_open(path, *args, **kwargs):
        opened.append(os.path.realpath(os.fsdecode(path)))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", rec_open)
    monkeypatch.setattr(os, "open", rec_os_open)
    return opened


def test_full_verify_reads_no_nas_blob(prestage, nas, local, monkeypatch):
    prestage(nas, local)
    nas_stores = [os.path.realpath(os.path.join(nas.repo_dir(), "blobs")), os.path.realpath(nas["store"])]

    def nas_blob_reads(paths):
        return [p for p in paths if any(p.startswith(s + os.sep) for s in nas_stores)]

    opened = _record_opens(monkeypatch)
    result = stage(nas, local, ignore_patterns=PAGE15, verify="full")
    full_opens = list(opened)
    del opened[:]
    sample = stage(nas, local, ignore_patterns=PAGE15, verify="sample")
    monkeypatch.undo()
    assert result["changed"] is False and result["blobs"]["reused"] == len(unique_blobs(selected(nas)))
    assert nas_blob_reads(full_opens) == []
    # ...yet every local blob was read (hashed against its name), not skipped
    local_blobs = set(os.path.realpath(local_blob(nas, local, e)) for e in unique_blobs(selected(nas)))
    assert local_blobs <= set(full_opens)
    # the recorder does see NAS reads: sample mode compares with the NAS copy
    assert sample["changed"] is False and len(set(nas_blob_reads(opened))) == len(local_blobs)


def test_full_verify_catches_corruption_without_nas(prestage, nas, local):
    info = selected(nas)[nas.repo()["shards"][2]]
    prestage(nas, local)
    blob = local_blob(nas, local, info["etag"])
    hubgen.flip_byte(blob, info["size"] - 1)
    result = run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, verify="full"), check_mode=True)
    assert result["repaired_paths"] == [nas.repo()["shards"][2]]


# ------------------------------------------------------------------------------------------------
# lesson 7: disk-space preflight, size parsing
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check_mode", [False, True])
def test_space_preflight_refuses_before_writing(nas, local, check_mode):
    stats = os.statvfs(str(local))
    reserve = stats.f_bavail * stats.f_frsize + 1024 ** 3       # more than is free, whatever others write
    need = sum(unique_blobs(selected(nas)).values())
    before = tree_snapshot(local)
    with pytest.raises(StageError) as err:
        run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, reserve=str(reserve)), check_mode=check_mode)
    message = str(err.value)
    assert re.search(r"need %d bytes" % need, message), message
    assert re.search(r"available \d+ bytes", message), message
    assert snapshot_diff(before, tree_snapshot(local)) == []
    assert os.listdir(str(local)) == []


def test_space_preflight_with_percent_reserve(nas, local, monkeypatch):
    need = sum(unique_blobs(selected(nas)).values())
    total = 100 * need
    monkeypatch.setattr(dgx_space, "disk_space", lambda path: (need + 10 * need, total))  # 11% free
    with pytest.raises(StageError, match="need %d bytes" % need):
        stage(nas, local, ignore_patterns=PAGE15, reserve="10.5%")       # leaves 0.5% < need
    assert os.listdir(str(local)) == []
    result = stage(nas, local, ignore_patterns=PAGE15, reserve="9%")
    assert result["space"]["reserve"] == 9 * need and result["space"]["need"] == need


@pytest.mark.parametrize("text, expected", [
    (12345, 12345), ("12345", 12345), (" 7 ", 7), ("10G", 10 * 1024 ** 3), ("10g", 10 * 1024 ** 3),
    ("10GiB", 10 * 1024 ** 3), ("10GB", 10 * 1024 ** 3), ("512M", 512 * 1024 ** 2), ("4K", 4096),
    ("1.5T", int(1.5 * 1024 ** 4)), ("0", 0),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "ten", "10X", "-5", "5%", "1e9", "10 G B", "G"])
def test_parse_size_refuses(text):
    with pytest.raises(StageError, match="size"):
        parse_size(text)


@pytest.mark.parametrize("text, total, expected", [
    ("2%", 1000, 20), ("0%", 1000, 0), ("99.5%", 1000, 995), (" 10 % ", 1000, 100), ("2%", 0, 0),
    ("1G", 5, 1024 ** 3), ("4096", 1000, 4096), (4096, 1000, 4096),
])
def test_parse_reserve(text, total, expected):
    assert parse_reserve(text, total) == expected


@pytest.mark.parametrize("text", ["100%", "150%", "-1%", "abc%", "%", "lots"])
def test_parse_reserve_refuses(text):
    with pytest.raises(StageError):
        parse_reserve(text, 1000)


# ------------------------------------------------------------------------------------------------
# lesson 8 (unit part; the SIGKILL test is in tests/integration): crash order and debris
# ------------------------------------------------------------------------------------------------

def interrupt_copy_number(monkeypatch, number):
    """Ctrl-C arrives as copy number `number` starts (the ones before it complete)."""
    real_copy = dgx_mirror_apply.copy_verified
    calls = []

    def interrupted(source, directory, name, size, **kwargs):
        calls.append(name)
        if len(calls) == number:
            raise KeyboardInterrupt("killed mid-copy")
        return real_copy(source, directory, name, size, **kwargs)

    monkeypatch.setattr(dgx_mirror_apply, "copy_verified", interrupted)


def test_interrupted_run_leaves_no_ref_and_no_torn_blob(nas, local, monkeypatch):
    interrupt_copy_number(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        stage(nas, local, ignore_patterns=PAGE15, workers=1)   # one at a time: exactly three finished
    monkeypatch.undo()
    repo = local_repo(nas, local)
    blobs = os.listdir(os.path.join(repo, "blobs"))
    assert len(blobs) == 3 and all(blob_matches_name(os.path.join(repo, "blobs", b), b) for b in blobs)
    # refs and the tree listing come last: no ref may point at an incomplete snapshot
    assert not os.path.exists(os.path.join(repo, "refs")) and not os.path.exists(os.path.join(repo, "trees"))
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert result["blobs"] == {"copied": len(unique_blobs(selected(nas))) - 3, "reused": 3, "repaired": 0}
    assert_all_local(nas, local)


def test_debris_of_killed_small_writes_is_removed(prestage, nas, local):
    # a run killed while writing refs/main or trees/<commit>.json leaves the temp file of that write;
    # huggingface_hub's scan_cache_dir then reports a bogus ref, so the next run must remove it.
    hf = pytest.importorskip("huggingface_hub")
    commit = nas.repo()["commit"]
    prestage(nas, local)
    repo = local_repo(nas, local)
    os.unlink(os.path.join(repo, "refs", "main"))
    os.unlink(os.path.join(repo, "trees", commit + ".json"))
    monkey_kill = []

    def killed_before_rename(src, dst, src_dir_fd=None, **_dst_dir_fd):
        # writes are relative to an open directory: record the temp file's full path
        directory = os.readlink("/proc/self/fd/%d" % src_dir_fd) if src_dir_fd is not None else ""
        monkey_kill.append(os.path.join(directory, src))
        raise SystemExit("SIGKILL stand-in")

    real_replace = os.replace
    os.replace = killed_before_rename
    try:
        # the leftover is whatever the small-file writer had open when the process died
        with pytest.raises(SystemExit):
            dgx_mirror_apply.apply_plan(plan_mirror(mirror_request(nas, local, ignore_patterns=PAGE15)),
                              mirror_request(nas, local, ignore_patterns=PAGE15), dgx_mirror_apply.Outcome())
    finally:
        os.replace = real_replace
    leftovers = [p for p in monkey_kill if os.path.exists(p)]
    for path in list(monkey_kill):
        if not os.path.exists(path):     # writers that clean up after themselves: plant what SIGKILL leaves
            with open(path, "wb") as handle:
                handle.write(b"")
            leftovers.append(path)
    assert leftovers and any("/refs/" in p for p in leftovers)
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert sorted(result["debris_removed"]) == sorted(leftovers)
    assert sorted(os.listdir(os.path.join(repo, "refs"))) == ["main"]
    assert sorted(os.listdir(os.path.join(repo, "trees"))) == [commit + ".json"]
    assert hf.scan_cache_dir(str(local)).warnings == []


# ------------------------------------------------------------------------------------------------
# lesson 9: the repo lock
# ------------------------------------------------------------------------------------------------

HOLDER = """
import os
import sys
import ansible.module_utils
ansible.module_utils.__path__.append(sys.argv[1])
from ansible.module_utils.dgx_localtree import LocalTree
from ansible.module_utils.dgx_repolock import RepoLock
lock_dir = os.path.dirname(sys.argv[2])
root = os.path.dirname(os.path.dirname(lock_dir))
with RepoLock(LocalTree(root), os.path.relpath(lock_dir, root), 30):
    print("locked", flush=True)
    sys.stdin.read()
"""


class LockHolder(object):
    """Another process holding the repo lock (RepoLock, as a concurrent dgx-stage run would)."""

    def __init__(self, lock_path):
        self.lock_path = lock_path

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, MODULE_UTILS, self.lock_path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout.readline().strip() == b"locked"
        return self.proc

    def __exit__(self, *exc_info):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        return False


def lock_path_of(nas, local):
    return os.path.join(str(local), ".locks", nas.repo()["folder"], "dgx-stage.lock")


def test_held_lock_refuses_and_writes_nothing(nas, local):
    lock_path = lock_path_of(nas, local)
    with LockHolder(lock_path) as holder:
        before = tree_snapshot(local)
        started = time.monotonic()
        with pytest.raises(StageError) as err:
            stage(nas, local, ignore_patterns=PAGE15, lock_timeout=1)
        assert 1 <= time.monotonic() - started < 10
        assert "holds" in str(err.value) and "pid %d" % holder.pid in str(err.value)
        assert lock_path in str(err.value)
        # A re-run right after a Ctrl-C meets its own earlier background job, which stops within its lease.
        assert "stage_lock_timeout" in str(err.value) and "within its lease time" in str(err.value)
        assert snapshot_diff(before, tree_snapshot(local)) == []
    assert stage(nas, local, ignore_patterns=PAGE15, lock_timeout=1)["changed"] is True   # released: works


@pytest.mark.parametrize("tamper", ["deleted", "renamed aside", "replaced by a symlink"])
def test_a_lock_file_tampered_with_while_held_still_keeps_a_second_run_out(nas, local, tamper, tmp_path):
    """The lock is the lock directory's, not the file's: a lock file deleted, renamed aside or replaced by a link
    while another process holds the lock lets no second run in, and the link is never followed."""
    from ansible.module_utils.dgx_localtree import LocalTree
    from ansible.module_utils.dgx_repolock import RepoLock

    lock_path = lock_path_of(nas, local)
    target = tmp_path / "elsewhere"
    with LockHolder(lock_path) as holder:
        if tamper == "renamed aside":
            os.rename(lock_path, lock_path + ".bak")
        else:
            os.unlink(lock_path)
        if tamper == "replaced by a symlink":
            os.symlink(str(target), lock_path)
        tree = LocalTree(str(local))
        with pytest.raises(StageError, match="another dgx-stage run, .* holds %s" % re.escape(lock_path)):
            with RepoLock(tree, os.path.relpath(os.path.dirname(lock_path), str(local)), 0.5):
                pass
        assert holder.poll() is None
    with RepoLock(tree, os.path.relpath(os.path.dirname(lock_path), str(local)), 0):
        assert open(lock_path).read().split()[0] == str(os.getpid()) and not os.path.islink(lock_path)
    assert not os.path.lexists(str(target))


def test_run_waits_for_lock_while_the_holder_changes_the_local_copy(prestage, nas, local, monkeypatch):
    # The holder (run A) is copying: its temp file gets its final name at any moment, so a file
    # listed while looking at the local copy can be gone a moment later. Run B must wait for the
    # lock (and time out naming the holder), not crash on the vanished file before taking the lock.
    prestage(nas, local)
    blobs_dir = os.path.join(local_repo(nas, local), "blobs")
    vanished = os.path.join(blobs_dir, TEMP_PREFIX + "e" * 64 + ".4242.0badf00d")
    real_find = dgx_mirror_plan.find_temp_debris
    monkeypatch.setattr(dgx_mirror_plan, "find_temp_debris", lambda top: sorted(real_find(top) + [vanished]))
    with LockHolder(lock_path_of(nas, local)) as holder:
        with pytest.raises(StageError) as err:
            stage(nas, local, ignore_patterns=PAGE15, lock_timeout=1)
        assert "holds" in str(err.value) and "pid %d" % holder.pid in str(err.value)


# ------------------------------------------------------------------------------------------------
# lesson 10: prune keeps other local snapshots
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old_revision", ["v1", "commit"])
def test_prune_removes_debris_stale_and_orphans_but_keeps_other_snapshot(nas, local, old_revision):
    repo = nas.repo()
    old = stage(nas, local, revision=repo["old_commit"] if old_revision == "commit" else old_revision)
    assert old["commit"] == repo["old_commit"]
    old_only = repo["old_only_etags"]
    assert old_only and all(os.path.isfile(local_blob(nas, local, e)) for e in old_only)
    stage(nas, local)                                              # main, page15 included
    blobs_dir = os.path.join(local_repo(nas, local), "blobs")
    orphan = os.path.join(blobs_dir, hashlib.sha256(b"orphan").hexdigest())
    with open(orphan, "wb") as handle:
        handle.write(b"orphan")
    debris = os.path.join(blobs_dir, TEMP_PREFIX + repo["files"][repo["shards"][0]]["etag"] + ".4242.deadbeef")
    with open(debris, "wb") as handle:
        handle.write(b"\0" * 4096)
    snap = local_snapshot(nas, local)
    page15 = sorted(os.path.join(snap, *p.split("/")) for p in repo["page15"])

    result = stage(nas, local, ignore_patterns=PAGE15, prune=True)
    assert result["debris_removed"] == [debris]
    assert sorted(result["pruned"]) == sorted(page15 + [orphan])
    for path in page15 + [orphan, debris]:
        assert not os.path.lexists(path), path
    # the old revision is still complete and local
    old_snap = local_snapshot(nas, local, commit=repo["old_commit"])
    for path, info in repo["old_files"].items():
        entry = os.path.join(old_snap, *path.split("/"))
        assert os.path.realpath(entry) == os.path.realpath(local_blob(nas, local, info["etag"]))
        assert blob_matches_name(entry, info["etag"]), path
    with open(os.path.join(local_repo(nas, local), "refs", "v1")) as handle:
        assert handle.read() == repo["old_commit"]
    assert_all_local(nas, local)
    assert stage(nas, local, ignore_patterns=PAGE15, prune=True)["changed"] is False


def test_without_prune_orphans_are_only_reported(prestage, nas, local):
    prestage(nas, local)
    orphan = os.path.join(local_repo(nas, local), "blobs", hashlib.sha256(b"x").hexdigest())
    with open(orphan, "wb") as handle:
        handle.write(b"x")
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert result["stale_paths"] == [orphan] and result["pruned"] == [] and result["changed"] is False
    assert os.path.isfile(orphan)


# ------------------------------------------------------------------------------------------------
# lesson 11: refusals, with nothing written
# ------------------------------------------------------------------------------------------------

def _plant_dangling(nas, tmp_path):
    nas.thaw()
    link = os.path.join(nas.snapshot_dir(), "extras", "missing.bin")
    os.symlink("../../../blobs/" + "0" * 64, link)
    nas.freeze()
    return {}, [link, "dangling"]


def _plant_escaping_snapshot_link(nas, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"not the hub's")
    nas.thaw()
    link = os.path.join(nas.snapshot_dir(), "leak.bin")
    os.symlink(str(outside / "secret.bin"), link)
    nas.freeze()
    return {}, [link, "outside the source hub root"]


def _plant_escaping_blob_link(nas, tmp_path):
    """The repo-level blob (not the snapshot entry) points outside the hub."""
    outside = tmp_path / "outside"
    outside.mkdir()
    info = nas.repo()["files"]["config.json"]
    (outside / "cfg").write_bytes(b"{}")
    nas.thaw()
    blob = os.path.join(nas.repo_dir(), "blobs", info["etag"])
    os.unlink(blob)
    os.symlink(str(outside / "cfg"), blob)
    nas.freeze()
    return {}, [os.path.join(nas.snapshot_dir(), "config.json"), "outside the source hub root"]


REFUSALS = {
    "missing-src": lambda nas, tmp: ({"src": str(tmp / "no-nas")}, [str(tmp / "no-nas"), "src hub root"]),
    "missing-dest": lambda nas, tmp: ({"dest": str(tmp / "no-local")}, [str(tmp / "no-local"), "dest hub root"]),
    "dest-is-a-file": lambda nas, tmp: (_dest_file(tmp), [str(tmp / "a-file"), "dest hub root"]),
    "dest-inside-src": lambda nas, tmp: ({"dest": nas["hub"]}, ["overlap"]),
    "unknown-repo": lambda nas, tmp: ({"repo_id": "coolbho3k/NoSuchModel"},
                                      ["unknown repo coolbho3k/NoSuchModel", nas.repo(MAIN)["folder"],
                                       nas.repo(DRAFTER)["folder"]]),
    "bad-repo-id": lambda nas, tmp: ({"repo_id": "../etc"}, ["invalid repo_id"]),
    "unknown-revision": lambda nas, tmp: ({"revision": "v9"}, ["'v9'", "main", "v1"]),
    "unknown-commit": lambda nas, tmp: ({"revision": "f" * 40}, ["f" * 40]),
    "dangling-link": _plant_dangling,
    "escaping-snapshot-link": _plant_escaping_snapshot_link,
    "escaping-blob-link": _plant_escaping_blob_link,
    "patterns-select-nothing": lambda nas, tmp: ({"allow_patterns": ["*.gguf"]}, ["*.gguf", "select none"]),
    "ignore-everything": lambda nas, tmp: ({"ignore_patterns": ["*"]}, ["select none"]),
}


def _dest_file(tmp):
    (tmp / "a-file").write_bytes(b"not a directory")
    return {"dest": str(tmp / "a-file")}


PLANTED = ("dangling-link", "escaping-snapshot-link", "escaping-blob-link")   # need a NAS of their own
APPLY_ONLY = ("missing-dest",)   # check mode on a fresh node: the stage play creates the dest later


REFUSAL_RUNS = [(case, check) for case in sorted(REFUSALS) for check in (False, True)
                if not (check and case in APPLY_ONLY)]


@pytest.mark.parametrize("case, check_mode", REFUSAL_RUNS,
                         ids=["%s-%s" % (case, "check" if check else "apply") for case, check in REFUSAL_RUNS])
def test_refusals_name_the_problem_and_write_nothing(request, local, tmp_path, case, check_mode):
    nas = request.getfixturevalue("fresh_nas" if case in PLANTED else "nas")
    overrides, fragments = REFUSALS[case](nas, tmp_path)
    args = dict(src=nas["hub"], dest=str(local), repo_id=MAIN)
    args.update(overrides)
    before = tree_snapshot(local)
    with pytest.raises(StageError) as err:
        run_mirror(MirrorRequest(**args), check_mode=check_mode)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
    assert snapshot_diff(before, tree_snapshot(local)) == []
    assert not os.path.exists(str(tmp_path / "no-local"))


# ------------------------------------------------------------------------------------------------
# lesson 12: check mode
# ------------------------------------------------------------------------------------------------

def test_check_mode_on_empty_local_hub_reports_everything_writes_nothing(nas, local):
    blobs = unique_blobs(selected(nas))
    result = run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15), check_mode=True)
    assert result["changed"] is True
    assert result["blobs"] == {"copied": len(blobs), "reused": 0, "repaired": 0}
    assert result["bytes_copied"] == sum(blobs.values())
    assert result["refs_written"] == ["main"]
    assert result["diff_text"].count("+ copy ") == len(blobs)
    assert os.listdir(str(local)) == []                          # no .locks, no repo folder


def test_check_mode_with_missing_dest_creates_nothing(nas, tmp_path):
    # a fresh node: hub_local_root does not exist yet (the stage play creates it); --check must still
    # report the whole copy, and create nothing
    dest = tmp_path / "fresh-node" / "hub"
    blobs = unique_blobs(selected(nas))
    result = run_mirror(mirror_request(nas, dest, ignore_patterns=PAGE15), check_mode=True)
    assert result["changed"] is True
    assert result["blobs"] == {"copied": len(blobs), "reused": 0, "repaired": 0}
    assert result["bytes_copied"] == sum(blobs.values())
    assert not os.path.exists(str(tmp_path / "fresh-node"))


def test_check_mode_reports_a_corrupt_blob_without_fixing_it(prestage, big_nas, local):
    nas = big_nas
    shard = nas.repo()["shards"][2]
    info = selected(nas)[shard]
    prestage(nas, local)
    blob = local_blob(nas, local, info["etag"])
    hubgen.flip_byte(blob, sample_ranges(info["size"])[3][0] + 7)
    before = tree_snapshot(local)
    result = run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15), check_mode=True)
    assert result["changed"] is True
    assert result["repaired_paths"] == [shard] and result["blobs"]["repaired"] == 1
    assert "repair (content) %s" % blob in result["diff_text"]
    assert snapshot_diff(before, tree_snapshot(local)) == []
    assert not blob_matches_name(blob, info["etag"])


# ------------------------------------------------------------------------------------------------
# lesson 13: the partial local copy loads offline with huggingface_hub
# ------------------------------------------------------------------------------------------------

def test_partial_copy_loads_offline_with_huggingface_hub(nas, local):
    hf = pytest.importorskip("huggingface_hub")
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo = nas.repo()
    stage(nas, local, ignore_patterns=PAGE15)
    local_real = os.path.realpath(str(local))
    for name in ("config.json", repo["shards"][0], "extras/chat/chat_template.jinja"):
        path = hf.hf_hub_download(MAIN, name, cache_dir=str(local), local_files_only=True)
        assert os.path.realpath(path).startswith(local_real + os.sep)
        assert sha256_file(path) == repo["files"][name]["sha256"]
    snap = hf.snapshot_download(MAIN, cache_dir=str(local), local_files_only=True)  # no IncompleteSnapshotError
    assert os.path.realpath(snap) == os.path.realpath(local_snapshot(nas, local))
    with open(os.path.join(local_repo(nas, local), "trees", repo["commit"] + ".json")) as handle:
        assert sorted(json.load(handle)["files"]) == sorted(selected(nas))
    info = hf.scan_cache_dir(str(local))
    assert info.warnings == []
    [cached] = [r for r in info.repos if r.repo_id == MAIN]
    [revision] = cached.revisions
    assert revision.commit_hash == repo["commit"] and revision.refs == frozenset(["main"])
    assert revision.nb_files == len(selected(nas))
    # refs of the old revision are not written when staging main: v1 does not resolve offline
    assert os.listdir(os.path.join(local_repo(nas, local), "refs")) == ["main"]
    with pytest.raises(LocalEntryNotFoundError):
        hf.hf_hub_download(MAIN, "config.json", revision="v1", cache_dir=str(local), local_files_only=True)
    # staging v1 explicitly writes its ref, and both revisions load
    stage(nas, local, revision="v1")
    first = repo["shards"][0]
    path = hf.hf_hub_download(MAIN, first, revision="v1", cache_dir=str(local), local_files_only=True)
    assert sha256_file(path) == repo["old_files"][first]["sha256"] != repo["files"][first]["sha256"]
    assert hf.scan_cache_dir(str(local)).warnings == []


def test_drafter_repo_stages_next_to_main(nas, local):
    stage(nas, local, ignore_patterns=PAGE15)
    result = stage(nas, local, repo_id=DRAFTER)
    assert result["blobs"]["copied"] == len(unique_blobs(selected(nas, DRAFTER)))
    assert_all_local(nas, local, DRAFTER)
    assert_all_local(nas, local, MAIN)


# ------------------------------------------------------------------------------------------------
# hash-verified: no blob ever gets its name unless its bytes hash to that name
# ------------------------------------------------------------------------------------------------

def corrupt_nas_blob(nas, etag, repo_id=MAIN):
    """Bit rot on the NAS: same size, same mtime, one byte of the middle flipped."""
    real = nas_blob_real(nas, etag, repo_id)
    st = os.stat(real)
    nas.thaw()
    hubgen.flip_byte(real, st.st_size // 2)
    os.utime(real, ns=(st.st_atime_ns, st.st_mtime_ns))
    nas.freeze()
    return real


def expect_failure(nas, local, **kwargs):
    with pytest.raises(MirrorFailed) as err:
        stage(nas, local, **kwargs)
    return err.value


@pytest.mark.parametrize("verify", ["none", "sample", "full"])
def test_corrupt_nas_blob_is_never_staged_under_its_name(fresh_nas, local, verify):
    nas = fresh_nas
    shard = nas.repo()["shards"][2]
    info = selected(nas)[shard]
    corrupt_nas_blob(nas, info["etag"])
    failure = expect_failure(nas, local, ignore_patterns=PAGE15, verify=verify)
    message = str(failure)
    assert shard in message and info["etag"] in message and "nothing was staged" in message
    nas_hash = failure.result["nas_corrupt_blobs"][0]["nas_hash"]
    assert nas_hash == sha256_file(nas_blob_real(nas, info["etag"])) and nas_hash in message
    assert failure.result["nas_corrupt"] == [shard]
    assert not os.path.lexists(local_blob(nas, local, info["etag"]))
    assert not os.path.lexists(os.path.join(local_snapshot(nas, local), shard))
    # the other blobs are staged and proven; no ref may point at the incomplete snapshot
    others = [e for e in unique_blobs(selected(nas)) if e != info["etag"]]
    assert all(blob_matches_name(local_blob(nas, local, e), e) for e in others)
    assert not os.path.exists(os.path.join(local_repo(nas, local), "refs"))
    assert failure.result["unstaged_paths"] == [shard] and failure.result["refs_written"] == []


def _good_copy_then_corrupt_nas(nas, local, shard):
    info = selected(nas)[shard]
    stage(nas, local, ignore_patterns=PAGE15, verify="full")
    blob = local_blob(nas, local, info["etag"])
    ino = os.stat(blob).st_ino
    corrupt_nas_blob(nas, info["etag"])
    return info, blob, ino


def test_good_local_blob_is_kept_when_the_nas_copy_rots(fresh_nas, local):
    # Before: verify=sample saw local != NAS and "repaired" the good local blob with the corrupt NAS bytes.
    nas = fresh_nas
    shard = nas.repo()["shards"][0]
    info, blob, ino = _good_copy_then_corrupt_nas(nas, local, shard)
    failure = expect_failure(nas, local, ignore_patterns=PAGE15, verify="sample")
    assert "the local copy was kept" in str(failure) and "Re-download" in str(failure)
    assert failure.result["nas_corrupt"] == [shard]
    assert failure.result["nas_corrupt_blobs"][0]["local"] == "kept"
    assert failure.result["blobs"]["repaired"] == 0 and failure.result["repaired_paths"] == []
    assert os.stat(blob).st_ino == ino and blob_matches_name(blob, info["etag"])
    assert_all_local(nas, local)


@pytest.mark.parametrize("verify", ["none", "full"])
def test_modes_that_do_not_read_the_nas_keep_serving_the_good_local_blob(fresh_nas, local, verify):
    nas = fresh_nas
    info, blob, ino = _good_copy_then_corrupt_nas(nas, local, nas.repo()["shards"][1])
    result = stage(nas, local, ignore_patterns=PAGE15, verify=verify)
    assert result["changed"] is False and result["nas_corrupt"] == []
    assert os.stat(blob).st_ino == ino and blob_matches_name(blob, info["etag"])


def test_wrong_local_blob_with_a_corrupt_nas_copy_is_removed_not_served(fresh_nas, local):
    nas = fresh_nas
    shard = nas.repo()["shards"][1]
    info, blob, _ino = _good_copy_then_corrupt_nas(nas, local, shard)
    hubgen.flip_byte(blob, 0)            # the local copy is wrong too (sampled region: the head)
    failure = expect_failure(nas, local, ignore_patterns=PAGE15, verify="sample")
    assert failure.result["nas_corrupt_blobs"][0]["local"] == "removed"
    assert "was removed" in str(failure)
    assert not os.path.lexists(blob)


def test_verify_full_repair_from_a_corrupt_nas_leaves_nothing_under_the_name(fresh_nas, local):
    nas = fresh_nas
    shard = nas.repo()["shards"][1]
    info, blob, _ino = _good_copy_then_corrupt_nas(nas, local, shard)
    hubgen.flip_byte(blob, info["size"] // 3)
    failure = expect_failure(nas, local, ignore_patterns=PAGE15, verify="full")
    assert failure.result["nas_corrupt"] == [shard] and not os.path.lexists(blob)
    assert find_debris(local) == []


def find_debris(local):
    return [p for p in tree_snapshot(local) if TEMP_PREFIX in p]


# ------------------------------------------------------------------------------------------------
# the local side is a tree the module owns: symlinked directories are refused, never followed
# ------------------------------------------------------------------------------------------------

def _link_local_dir(nas, local, tmp_path, which):
    """Stage once, then replace a local directory by a symlink to a copy of it elsewhere."""
    stage(nas, local)                                   # page15 included: prune has work to do after
    repo = local_repo(nas, local)
    target = {"repo": repo, "blobs": os.path.join(repo, "blobs"),
              "snapshot": local_snapshot(nas, local), "locks": os.path.join(str(local), ".locks")}[which]
    elsewhere = str(tmp_path / ("elsewhere-" + which))
    shutil.copytree(target, elsewhere, symlinks=True)
    with open(os.path.join(elsewhere, "not-ours.bin"), "wb") as handle:
        handle.write(b"another tree's file")
    shutil.rmtree(target)
    os.symlink(elsewhere, target)
    return target, elsewhere


@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
@pytest.mark.parametrize("which", ["repo", "blobs", "snapshot", "locks"])
def test_symlinked_local_directory_is_refused_and_its_target_untouched(nas, local, tmp_path, which, check_mode):
    link, elsewhere = _link_local_dir(nas, local, tmp_path, which)
    before_elsewhere = tree_snapshot(elsewhere)
    before_local = tree_snapshot(local)
    with pytest.raises(StageError) as err:
        run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, prune=True), check_mode=check_mode)
    assert "%s is a symlink to %s" % (link, elsewhere) in str(err.value)
    assert "nothing was written or removed" in str(err.value)
    assert snapshot_diff(before_elsewhere, tree_snapshot(elsewhere)) == []
    assert snapshot_diff(before_local, tree_snapshot(local)) == []


# ------------------------------------------------------------------------------------------------
# legal trees stage: links inside excluded folders, links between snapshot files, long names
# ------------------------------------------------------------------------------------------------

def _plant_in_snapshot(nas, rel, link_text=None, data=None):
    nas.thaw()
    path = os.path.join(nas.snapshot_dir(), *rel.split("/"))
    if not os.path.isdir(os.path.dirname(path)):
        os.makedirs(os.path.dirname(path))
    if link_text is not None:
        os.symlink(link_text, path)
    else:
        with open(path, "wb") as handle:
            handle.write(data)
    nas.freeze()
    return path


def test_link_between_real_files_inside_an_excluded_folder_is_left_to_the_nas(fresh_nas, local):
    nas = fresh_nas
    pack = nas.repo()["page15"][0]
    latest = posixpath_join(os.path.dirname(pack), "latest.bin")
    _plant_in_snapshot(nas, latest, link_text=os.path.basename(pack))
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert latest in result["excluded_paths"]
    assert not os.path.lexists(os.path.join(local_snapshot(nas, local), "page15"))
    assert_all_local(nas, local)
    # staged too (no pattern): the link stays a link to the one local copy of the pack
    result = stage(nas, local)
    local_latest = os.path.join(local_snapshot(nas, local), *latest.split("/"))
    assert os.readlink(local_latest) == os.path.basename(pack)
    with open(local_latest, "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == nas.repo()["files"][pack]["sha256"]


def posixpath_join(*parts):
    return "/".join(p for p in parts if p)


def test_link_to_another_snapshot_file_resolves_to_that_files_blob(fresh_nas, local):
    nas = fresh_nas
    info = nas.repo()["files"]["tokenizer.json"]
    _plant_in_snapshot(nas, "extras/tokenizer-alias.json", link_text="../tokenizer.json")
    result = stage(nas, local, ignore_patterns=PAGE15)
    alias = os.path.join(local_snapshot(nas, local), "extras", "tokenizer-alias.json")
    assert os.readlink(alias) == "../../../blobs/" + info["etag"]
    assert result["files"]["dangling"] == 0
    assert blob_matches_name(os.path.realpath(alias), info["etag"])


def test_a_250_byte_file_name_stages(fresh_nas, local):
    nas = fresh_nas
    info = nas.repo()["files"]["config.json"]
    long_name = "c" * 245 + ".json"
    _plant_in_snapshot(nas, long_name, link_text="../../blobs/" + info["etag"])
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert os.readlink(os.path.join(local_snapshot(nas, local), long_name)) == "../../blobs/" + info["etag"]
    assert result["files"]["dangling"] == 0 and find_debris(local) == []


# ------------------------------------------------------------------------------------------------
# errors that say what to do
# ------------------------------------------------------------------------------------------------

def test_empty_nas_mount_point_suggests_checking_the_mount(tmp_path, local):
    empty = tmp_path / "nas-mount-point"
    empty.mkdir()
    with pytest.raises(StageError, match=r"holds no repo folders at all.*is the NAS mounted there"):
        run_mirror(MirrorRequest(src=str(empty), dest=str(local), repo_id=MAIN))
    assert os.listdir(str(local)) == []


def test_disk_full_mid_copy_names_file_disk_need_and_free(nas, local, monkeypatch):
    from ansible.module_utils import dgx_copy
    real_write = os.write
    written = []

    def fills_up(fd, data):
        if sum(written) > 100 * 1024:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(dgx_copy.os, "write", fills_up)
    with pytest.raises(StageError) as err:
        stage(nas, local, ignore_patterns=PAGE15)
    message = str(err.value)
    assert "the local disk is full while writing %s" % os.path.join(local_repo(nas, local), "blobs") in message
    assert re.search(r"still needs [\d.]+ \w+ \(\d+ bytes\) on %s, which has .* free" % re.escape(str(local)),
                     message)
    assert find_debris(local) == []


def test_snapshot_dirs_are_fsynced_after_their_links_and_before_refs(nas, local, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fd_path(fd):
        return os.readlink("/proc/self/fd/%d" % fd)

    def recording_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            events.append(("fsync", fd_path(fd)))
        return real_fsync(fd)

    def recording_replace(src, dst, src_dir_fd=None, dst_dir_fd=None):
        events.append(("rename", os.path.join(fd_path(dst_dir_fd), dst) if dst_dir_fd is not None else dst))
        return real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    stage(nas, local, ignore_patterns=PAGE15)
    monkeypatch.undo()
    ref = events.index(("rename", os.path.join(local_repo(nas, local), "refs", "main")))
    snap = local_snapshot(nas, local)
    link_dirs = set(os.path.dirname(p) for kind, p in events if kind == "rename" and p.startswith(snap + os.sep))
    assert snap in link_dirs and os.path.join(snap, "extras", "chat") in link_dirs
    for directory in link_dirs:
        last_link = max(i for i, (kind, p) in enumerate(events) if kind == "rename" and os.path.dirname(p) == directory)
        synced = [i for i, e in enumerate(events) if e == ("fsync", directory)]
        assert synced and last_link < synced[-1] < ref, directory


def test_real_enospc_mid_copy_on_a_tmpfs_leaves_no_temp_file(nas, tmp_path, monkeypatch):
    # The space preflight is switched off so the kernel itself says ENOSPC half-way through the copies.
    if os.geteuid() != 0:
        pytest.skip("mounting a size-capped tmpfs needs root (CI runs as root)")
    disk = tmp_path / "tiny-disk"
    disk.mkdir()
    subprocess.check_call(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)])
    try:
        monkeypatch.setattr(dgx_mirror, "check_space", lambda plan, req: {})
        with pytest.raises(StageError) as err:
            stage(nas, disk, ignore_patterns=PAGE15)
        message = str(err.value)
        assert "the local disk is full while writing %s" % os.path.join(local_repo(nas, disk), "blobs") in message
        assert "on %s, which has" % disk in message
        assert find_debris(disk) == []
        blobs_dir = os.path.join(local_repo(nas, disk), "blobs")
        assert all(blob_matches_name(os.path.join(blobs_dir, b), b) for b in os.listdir(blobs_dir))
        assert not os.path.exists(os.path.join(local_repo(nas, disk), "refs"))
    finally:
        subprocess.check_call(["umount", str(disk)])


# ------------------------------------------------------------------------------------------------
# several files in flight: the same guarantees
# ------------------------------------------------------------------------------------------------

def _count_concurrency(monkeypatch, module, name):
    lock = threading.Lock()
    state = {"now": 0, "peak": 0, "calls": 0}
    real = getattr(module, name)

    def counted(*args, **kwargs):
        with lock:
            state["now"] += 1
            state["calls"] += 1
            state["peak"] = max(state["peak"], state["now"])
        try:
            time.sleep(0.02)          # hold the slot long enough for the others to start
            return real(*args, **kwargs)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(module, name, counted)
    return state


@pytest.mark.parametrize("workers", [1, 4])
def test_copies_run_workers_at_once_biggest_first_and_prove_every_blob(nas, local, monkeypatch, workers):
    order = []
    real_copy = dgx_mirror_apply.copy_verified
    monkeypatch.setattr(dgx_mirror_apply, "copy_verified",
                        lambda source, directory, name, size, **kw: order.append(size) or real_copy(
                            source, directory, name, size, **kw))
    state = _count_concurrency(monkeypatch, dgx_mirror_apply, "copy_verified")
    result = stage(nas, local, ignore_patterns=PAGE15, workers=workers)
    assert state["peak"] == workers and state["calls"] == len(unique_blobs(selected(nas)))
    assert result["blobs"]["copied"] == len(unique_blobs(selected(nas)))
    if workers == 1:
        assert order == sorted(order, reverse=True)
    assert_all_local(nas, local)


@pytest.mark.parametrize("verify", ["sample", "full"])
def test_content_checks_run_workers_at_once_and_still_catch_a_wrong_blob(prestage, big_nas, local, monkeypatch,
                                                                           verify):
    nas = big_nas
    prestage(nas, local)
    shard = nas.repo()["shards"][2]
    blob = local_blob(nas, local, selected(nas)[shard]["etag"])
    hubgen.flip_byte(blob, 0)
    state = _count_concurrency(monkeypatch, dgx_mirror_plan, "content_matches")
    result = stage(nas, local, ignore_patterns=PAGE15, verify=verify, workers=3)
    assert state["peak"] == 3
    assert result["repaired_paths"] == [shard]
    assert_all_local(nas, local)


def test_workers_out_of_range_is_refused(nas, local):
    for bad in (0, -1, 33):
        with pytest.raises(StageError, match="workers must be between 1 and 32"):
            stage(nas, local, workers=bad)


# ------------------------------------------------------------------------------------------------
# hostile review of the above: each finding is a test
# ------------------------------------------------------------------------------------------------

def _resize_nas_blob(nas, etag, how):
    real = nas_blob_real(nas, etag)
    nas.thaw()
    if how == "truncated":
        os.truncate(real, os.stat(real).st_size - 100)
    else:
        with open(real, "ab") as handle:
            handle.write(b"!")
    nas.freeze()


@pytest.mark.parametrize("verify", ["none", "sample", "full"])
@pytest.mark.parametrize("how", ["truncated", "padded"])
def test_good_local_blob_survives_a_nas_copy_of_another_size(fresh_nas, local, how, verify):
    nas = fresh_nas
    shard = nas.repo()["shards"][0]
    info, blob, ino = _good_copy_then_corrupt_nas(nas, local, shard)   # flipped, and now resized too
    _resize_nas_blob(nas, info["etag"], how)
    for check_mode in (True, False):          # check mode tells the same story as the real run
        with pytest.raises(MirrorFailed) as err:
            run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, verify=verify), check_mode=check_mode)
        record = err.value.result["nas_corrupt_blobs"][0]
        assert record["local"] == "kept" and "true size (%d)" % info["size"] in record["why"], record
        assert err.value.result["report"]["status"] == "failed"
    assert os.stat(blob).st_ino == ino and blob_matches_name(blob, info["etag"])
    assert_all_local(nas, local)


def test_check_mode_over_a_good_local_copy_with_a_rotten_nas_blob_reports_it_and_writes_nothing(
        prestage, big_nas, local):
    nas = big_nas
    shard = nas.repo()["shards"][1]
    info = selected(nas)[shard]
    prestage(nas, local)
    real = nas_blob_real(nas, info["etag"])
    offset = sample_ranges(info["size"])[4][0]
    nas.thaw()
    hubgen.flip_byte(real, offset)                      # inside a sampled block: sample sees it
    before = tree_snapshot(local)
    try:
        with pytest.raises(MirrorFailed) as err:
            run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15), check_mode=True)
        assert err.value.result["nas_corrupt"] == [shard]
        assert err.value.result["repaired_paths"] == [] and "sampled bytes differ" in str(err.value)
        assert snapshot_diff(before, tree_snapshot(local)) == []
    finally:
        hubgen.flip_byte(real, offset)
        nas.freeze()


@pytest.mark.parametrize("which", ["snapshot", "repo"])
def test_nas_directory_linked_outside_the_hub_is_refused(fresh_nas, local, tmp_path, which):
    # plain files only behind the link: no link chain to trip over, the directory itself escapes
    nas = fresh_nas
    commit = nas.repo()["commit"]
    outside = tmp_path / "outside"
    snap = outside / "snapshots" / commit if which == "repo" else outside
    snap.mkdir(parents=True)
    (snap / "secret.txt").write_bytes(b"not the hub's")
    if which == "repo":
        (outside / "refs").mkdir()
        (outside / "refs" / "main").write_text(commit)
    target = nas.snapshot_dir() if which == "snapshot" else nas.repo_dir()
    nas.thaw()
    shutil.rmtree(target)
    os.symlink(str(outside), target)
    nas.freeze()
    with pytest.raises(StageError, match="outside the source hub root"):
        stage(nas, local)
    assert os.listdir(str(local)) == []


def test_fifo_on_the_nas_is_refused_not_waited_on(fresh_nas, local):
    nas = fresh_nas
    nas.thaw()
    os.mkfifo(os.path.join(nas.snapshot_dir(), "pipe.bin"))
    nas.freeze()
    started = time.monotonic()
    with pytest.raises(StageError, match=r"pipe\.bin is not a regular file"):
        stage(nas, local)
    assert time.monotonic() - started < 10


def test_nas_ref_that_is_not_a_regular_file_is_refused_without_echoing_it(fresh_nas, local, tmp_path):
    nas = fresh_nas
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0 do not print me")
    nas.thaw()
    os.symlink(str(secret), os.path.join(nas.repo_dir(), "refs", "leak"))
    nas.freeze()
    with pytest.raises(StageError) as err:
        stage(nas, local)
    assert "refs/leak is not a regular file" in str(err.value) and "do not print me" not in str(err.value)


def test_hub_names_that_look_like_temp_debris(fresh_nas, local):
    nas = fresh_nas
    etag = nas.repo()["files"]["config.json"]["etag"]
    debris_like = ".dgx-stage-tmp.config.json.4242.0badf00d"
    nas.thaw()
    os.symlink("../../blobs/" + etag, os.path.join(nas.snapshot_dir(), ".dgx-stage-tmp.notes"))
    nas.freeze()
    stage(nas, local, ignore_patterns=PAGE15)
    assert stage(nas, local, ignore_patterns=PAGE15)["changed"] is False      # not taken for debris
    assert os.path.islink(os.path.join(local_snapshot(nas, local), ".dgx-stage-tmp.notes"))
    nas.thaw()
    os.symlink("../../blobs/" + etag, os.path.join(nas.snapshot_dir(), debris_like))
    nas.freeze()
    with pytest.raises(StageError, match="has the form of dgx-stage's temp files"):
        stage(nas, local, ignore_patterns=PAGE15)


def test_dangling_link_in_an_excluded_folder_is_left_to_the_nas_with_a_warning(fresh_nas, local):
    nas = fresh_nas
    pack_dir = os.path.dirname(nas.repo()["page15"][0])
    _plant_in_snapshot(nas, pack_dir + "/gone.bin", link_text="missing-pack.bin")
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert any("gone.bin (excluded by the patterns, left to the NAS)" in w for w in result["warnings"])
    assert_all_local(nas, local)
    with pytest.raises(StageError, match=r"gone\.bin is a dangling link"):
        stage(nas, local)                       # selected: refused, naming it


def test_a_directory_in_the_way_is_refused_before_anything_is_written(nas, local):
    snap = local_snapshot(nas, local)
    os.makedirs(os.path.join(snap, "config.json"))
    before = tree_snapshot(local)
    with pytest.raises(StageError, match=r"config\.json is a directory where the staged revision has a file"):
        stage(nas, local, ignore_patterns=PAGE15)
    assert snapshot_diff(before, tree_snapshot(local)) == []


def test_disk_full_while_writing_links_names_the_disk(nas, local, monkeypatch):
    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dgx_mirror_apply, "symlink_atomic", no_room)
    with pytest.raises(StageError, match=r"the local disk is full while writing the snapshot links, refs and tree "
                                         r"listing of .* which has .* free"):
        stage(nas, local, ignore_patterns=PAGE15)


def test_progress_debris_of_a_killed_run_is_removed(prestage, nas, local):
    prestage(nas, local)
    lock_dir = os.path.join(str(local), ".locks", nas.repo()["folder"])
    os.makedirs(lock_dir, exist_ok=True)
    leftover = os.path.join(lock_dir, ".dgx-stage-tmp.dgx-stage.progress.json.4242.0badf00d")
    open(leftover, "w").close()
    result = stage(nas, local, ignore_patterns=PAGE15)
    assert leftover in result["debris_removed"] and not os.path.exists(leftover)


def test_ctrl_c_mid_copy_with_workers_leaves_no_temp_file_and_no_thread(big_nas, local, tmp_path, monkeypatch):
    import _thread
    from ansible.module_utils import dgx_copy, dgx_workers
    nas = big_nas
    monkeypatch.chdir(str(tmp_path))               # a stray relative write would land here
    monkeypatch.setattr(dgx_workers, "chunk_size", lambda workers: 64 * 1024)
    real_readv = os.readv

    def slow_readv(fd, buffers):
        time.sleep(0.01)                           # 3 MiB blobs in 64 KiB chunks: ~0.5 s each
        return real_readv(fd, buffers)

    monkeypatch.setattr(dgx_copy.os, "readv", slow_readv)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        stage(nas, local, ignore_patterns=PAGE15, workers=3)
    assert find_debris(local) == [] and not os.path.exists(os.path.join(local_repo(nas, local), "refs"))
    assert not workers_still_running()
    time.sleep(0.3)
    assert sorted(os.listdir(str(tmp_path))) == ["local"]
    monkeypatch.undo()
    assert stage(nas, local, ignore_patterns=PAGE15)["changed"] is True
    assert_all_local(nas, local)


def test_disk_failure_in_one_worker_still_reports_the_nas_corruption_another_found(fresh_nas, local, monkeypatch):
    nas = fresh_nas
    # same-size shards are copied in blob-name order with one worker: the corrupt one comes first
    shards = sorted(nas.repo()["shards"][:2], key=lambda p: selected(nas)[p]["etag"])
    corrupt = selected(nas)[shards[0]]
    corrupt_nas_blob(nas, corrupt["etag"])
    real_copy = dgx_mirror_apply.copy_verified
    full_disk_for = selected(nas)[shards[1]]["etag"]

    def copy_or_fill_up(source, directory, name, size, **kwargs):
        if name == full_disk_for:
            raise LocalWriteError("No space left", directory.join(name), 0, errno.ENOSPC)
        return real_copy(source, directory, name, size, **kwargs)

    monkeypatch.setattr(dgx_mirror_apply, "copy_verified", copy_or_fill_up)
    failure = expect_failure(nas, local, ignore_patterns=PAGE15, workers=1)
    assert "the local disk is full" in str(failure) and "also:" in str(failure)
    assert failure.result["nas_corrupt"] == [shards[0]] and failure.result["report"]["status"] == "failed"
    # The finding outlives the failed pass: a roll-back to the NAS refuses that blob.
    suspects, problem = suspects_of(str(local), nas.repo()["folder"])
    assert problem is None and list(suspects) == [corrupt["etag"]]


# ------------------------------------------------------------------------------------------------
# a verify pass says what it proved (copies nothing new, names each repair), every pass says
# what it read, the progress file an operator can watch, a check-mode plan that reads like one
# ------------------------------------------------------------------------------------------------

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def verify_request(nas, local, **kwargs):
    """What the stage role's verify pass asks for: prove, repair, copy nothing new."""
    return mirror_request(nas, local, ignore_patterns=PAGE15, copy_missing=False, phase="verify", **kwargs)


def progress_of(nas, local):
    with open(os.path.join(str(local), ".locks", nas.repo()["folder"], "dgx-stage.progress.json")) as handle:
        return json.load(handle)


def between_samples(size):
    """An offset no sample reads: halfway between the first two middle blocks."""
    ranges = sample_ranges(size)
    return (ranges[1][0] + ranges[1][1] + ranges[2][0]) // 2


def git_blob_sha1(path):
    with open(path, "rb") as handle:
        data = handle.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.parametrize("check_mode", [False, True], ids=["real", "check"])
def test_verify_on_an_empty_local_hub_fails_naming_what_is_not_staged_and_writes_nothing(nas, local, check_mode):
    wanted = sorted(selected(nas))
    before = tree_snapshot(local)
    with pytest.raises(MirrorFailed) as failure:
        run_mirror(verify_request(nas, local), check_mode=check_mode)
    text = str(failure.value)
    assert "%d of the %d selected file(s) of %s" % (len(wanted), len(wanted), MAIN) in text
    assert "(%s and %d more)" % (", ".join(wanted[:5]), len(wanted) - 5) in text
    assert "copies nothing" in text and "`dgx-stage stage`" in text and "nothing was written" in text
    result = failure.value.result
    assert result["unstaged_paths"] == wanted and result["changed"] is False and result["repairs"] == []
    assert result["blobs"] == {"copied": 0, "reused": 0, "repaired": 0} and result["bytes_copied"] == 0
    assert result["report"]["status"] == "failed" and result["report"]["unstaged_paths"] == wanted
    assert result["phase"] == "verify" and result["copy_missing"] is False and result["diff_text"] == ""
    assert snapshot_diff(before, tree_snapshot(local)) == []       # not even the lock or progress file


@pytest.mark.parametrize("how", ["removed", "link-to-the-nas"])
def test_verify_names_the_one_blob_not_staged_and_copies_nothing(prestage, nas, local, how):
    prestage(nas, local)
    shard = nas.repo()["shards"][1]
    blob = local_blob(nas, local, selected(nas)[shard]["etag"])
    os.unlink(blob)
    if how == "link-to-the-nas":     # a generation-1 copy: the content still lives on the NAS
        os.symlink(nas_blob_real(nas, selected(nas)[shard]["etag"]), blob)
    before = tree_snapshot(local)
    with pytest.raises(MirrorFailed, match=r"^1 of the %d selected file\(s\) of .* are not staged on this "
                                                  r"node \(%s\)" % (len(selected(nas)), re.escape(shard))):
        run_mirror(verify_request(nas, local, verify="full"))
    assert snapshot_diff(before, tree_snapshot(local)) == []


def test_a_flip_between_samples_is_missed_by_sample_and_repaired_by_full_with_a_warning(prestage, big_nas, local):
    """The documented limit of verify=sample, and what verify=full reports for it."""
    nas = big_nas
    prestage(nas, local)
    shard = nas.repo()["shards"][0]
    etag, size = selected(nas)[shard]["etag"], selected(nas)[shard]["size"]
    blob = local_blob(nas, local, etag)
    hubgen.flip_byte(blob, between_samples(size))
    flipped = sha256_file(blob)
    sampled = run_mirror(verify_request(nas, local))
    assert sampled["repairs"] == [] and sampled["blobs"]["repaired"] == 0 and sampled["changed"] is False
    assert sampled["warnings"] == []
    assert sha256_file(blob) == flipped                              # still wrong: samples cannot see it
    full = run_mirror(verify_request(nas, local, verify="full"))
    assert full["changed"] is True
    assert full["repairs"] == [{"path": shard, "paths": [shard], "blob": etag, "reason": "content",
                                "local_hash": flipped, "size": size}]
    assert full["report"]["repairs"] == full["repairs"] and full["repaired_paths"] == [shard]
    warnings = [w for w in full["warnings"] if shard in w]
    assert len(warnings) == 1 and etag in warnings[0] and flipped in warnings[0] and "repaired" in warnings[0]
    assert full["blobs"] == {"copied": 0, "reused": len(unique_blobs(selected(nas))) - 1, "repaired": 1}
    assert blob_matches_name(blob, etag)


def test_repairs_name_what_the_local_bytes_hash_to_at_their_own_size_and_as_named(prestage, nas, local):
    prestage(nas, local)
    shard, config = nas.repo()["shards"][2], "config.json"
    shard_blob = local_blob(nas, local, selected(nas)[shard]["etag"])
    config_blob = local_blob(nas, local, selected(nas)[config]["etag"])
    with open(shard_blob, "r+b") as handle:      # truncated: hashed at the local size
        handle.truncate(1000)
    hubgen.flip_byte(config_blob, 3)                    # a git-sha1 named blob: hashed as git names it
    truncated, config_hash = sha256_file(shard_blob), git_blob_sha1(config_blob)
    result = run_mirror(verify_request(nas, local, verify="full"))
    repairs = dict((r["path"], r) for r in result["repairs"])
    assert (repairs[shard]["reason"], repairs[shard]["local_hash"]) == ("size", truncated)
    assert (repairs[config]["reason"], repairs[config]["local_hash"]) == ("content", config_hash)
    assert len(result["warnings"]) == 2 and any(config_hash in w for w in result["warnings"])
    assert_all_local(nas, local)


def test_a_repair_in_check_mode_is_reported_as_would_repair(prestage, big_nas, local):
    nas = big_nas
    prestage(nas, local)
    shard = nas.repo()["shards"][1]
    blob = local_blob(nas, local, selected(nas)[shard]["etag"])
    hubgen.flip_byte(blob, 0)
    flipped = sha256_file(blob)
    result = run_mirror(verify_request(nas, local), check_mode=True)
    assert [(r["path"], r["local_hash"]) for r in result["repairs"]] == [(shard, flipped)]
    assert result["warnings"][0].startswith("would repair %s" % shard)
    assert sha256_file(blob) == flipped


def test_each_pass_says_how_many_bytes_it_read_on_each_side(big_nas, local):
    nas = big_nas
    blobs = unique_blobs(selected(nas))
    staged = stage(nas, local, ignore_patterns=PAGE15)
    assert staged["bytes_read"] == {"local": 0, "nas": sum(blobs.values())} == staged["report"]["bytes_read"]
    sampled = run_mirror(verify_request(nas, local))
    per_side = sum(sum(length for _offset, length in sample_ranges(size)) for size in blobs.values())
    assert per_side < sum(blobs.values()) / 2                  # the big shards really are sampled
    assert sampled["bytes_read"] == {"local": per_side, "nas": per_side}
    full = run_mirror(verify_request(nas, local, verify="full"))
    assert full["bytes_read"] == {"local": sum(blobs.values()), "nas": 0}
    again = stage(nas, local, ignore_patterns=PAGE15, verify="none")
    assert again["bytes_read"] == {"local": 0, "nas": 0}


def test_progress_file_after_a_copy_a_verify_that_keeps_its_figures_and_a_pass_with_nothing_to_do(nas, local):
    staged = stage(nas, local, ignore_patterns=PAGE15)
    count = len(unique_blobs(selected(nas)))
    after_stage = progress_of(nas, local)
    assert after_stage["pass"] == "stage" and after_stage["pid"] == os.getpid()
    assert (after_stage["status"], after_stage["finished"], after_stage["aborted"]) == ("ok", True, False)
    assert (after_stage["files_done"], after_stage["files_total"]) == (count, count)
    assert after_stage["bytes_done"] == after_stage["bytes_total"] == staged["bytes_copied"] > 0
    assert after_stage["copying"] == {"files_done": count, "files_total": count,
                                      "bytes_done": staged["bytes_copied"], "bytes_total": staged["bytes_copied"]}
    assert after_stage["eta_s"] == 0 and after_stage["current"] is None and after_stage["error"] is None
    assert ISO_UTC.match(after_stage["updated_at"]) and ISO_UTC.match(after_stage["started_at"])
    assert after_stage["bytes_read"] == staged["bytes_read"] and after_stage["commit"] == nas.repo()["commit"]
    assert after_stage["passes"] == {"stage": dict((k, v) for k, v in after_stage.items()
                                                   if k not in ("passes", "nas_corrupt"))}
    assert after_stage["nas_corrupt"] == {}

    run_mirror(verify_request(nas, local, verify="full"))
    after_verify = progress_of(nas, local)
    assert after_verify["pass"] == "verify" and after_verify["finished"] is True
    assert after_verify["passes"]["stage"] == after_stage["passes"]["stage"]      # never hidden by verify
    assert after_verify["hashing"]["files_done"] == after_verify["hashing"]["files_total"] == count
    assert after_verify["hashing"]["bytes_done"] == sum(unique_blobs(selected(nas)).values())
    assert after_verify["copying"]["files_total"] == 0 and after_verify["verify"] == "full"

    stage(nas, local, ignore_patterns=PAGE15, verify="none")                       # nothing to do
    idle = progress_of(nas, local)
    assert (idle["pass"], idle["finished"], idle["files_total"], idle["bytes_total"]) == ("stage", True, 0, 0)
    assert idle["passes"]["verify"] == after_verify["passes"]["verify"]


def test_progress_file_of_a_failing_run_says_aborted_with_the_error(fresh_nas, local):
    nas = fresh_nas
    shard = nas.repo()["shards"][0]
    corrupt_nas_blob(nas, selected(nas)[shard]["etag"])
    expect_failure(nas, local, ignore_patterns=PAGE15)
    doc = progress_of(nas, local)
    assert (doc["status"], doc["finished"], doc["aborted"]) == ("failed", False, True)
    assert selected(nas)[shard]["etag"] in doc["error"] and doc["eta_s"] is None


def test_progress_file_of_an_interrupted_run_says_interrupted(nas, local, monkeypatch):
    interrupt_copy_number(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        stage(nas, local, ignore_patterns=PAGE15, workers=1)
    doc = progress_of(nas, local)
    assert (doc["status"], doc["finished"], doc["aborted"]) == ("interrupted", False, True)
    assert doc["files_done"] == 2 and doc["files_total"] == len(unique_blobs(selected(nas)))


def _record_progress(monkeypatch):
    """Every progress document written, with the throttle off."""
    from ansible.module_utils import dgx_progress_file
    docs = []
    real_write = dgx_progress_file.atomic_write_bytes

    def record(name, data, **kwargs):
        if name == dgx_progress_file.PROGRESS_NAME:
            docs.append(json.loads(data.decode("utf-8")))
        return real_write(name, data, **kwargs)

    monkeypatch.setattr(dgx_progress_file, "atomic_write_bytes", record)
    monkeypatch.setattr(dgx_progress_file, "PROGRESS_EVERY_S", 0.0)
    return docs


def test_progress_moves_while_a_stage_copies_and_while_a_full_verify_hashes(big_nas, local, monkeypatch):
    nas = big_nas
    docs = _record_progress(monkeypatch)
    stage(nas, local, ignore_patterns=PAGE15, workers=2)
    copying = [d for d in docs if d["status"] == "running" and d["step"] == "copying"]
    assert any(0 < d["bytes_done"] < d["bytes_total"] for d in copying), copying
    assert set(d["current"] for d in copying if d["current"]) <= set(selected(nas))
    assert [d["bytes_done"] for d in docs] == sorted(d["bytes_done"] for d in docs)
    del docs[:]
    run_mirror(verify_request(nas, local, verify="full", workers=2))
    hashing = [d for d in docs if d["status"] == "running" and d["step"] == "hashing"]
    assert any(0 < d["hashing"]["bytes_done"] < d["hashing"]["bytes_total"] for d in hashing), hashing
    assert all(d["pass"] == "verify" and d["bytes_done"] == d["hashing"]["bytes_done"] for d in hashing)
    assert docs[-1]["finished"] is True and docs[-1]["passes"]["stage"]["finished"] is True


def test_a_run_whose_lock_folder_is_cleared_mid_copy_stops_and_writes_nothing_more(big_nas, local, monkeypatch):
    """`rm -rf .locks` while a stage copies: another run could lock a new folder now, so this one stops at its
    next progress write, its copy's temp file removed, and writes no blob, link, ref or progress file after."""
    nas = big_nas
    _record_progress(monkeypatch)
    real_copy = dgx_mirror_apply.copy_verified
    seen = {}

    def clear_locks_then_copy(source, directory, name, size, **kwargs):
        if not seen:
            shutil.rmtree(os.path.join(str(local), ".locks"))
            seen["before"] = _every_path(local)
        return real_copy(source, directory, name, size, **kwargs)

    monkeypatch.setattr(dgx_mirror_apply, "copy_verified", clear_locks_then_copy)
    with pytest.raises(StageError, match=r"the lock folder %s was removed or renamed while this run held it; "
                       r"another run may be staging this repo now: check with `dgx-stage status`, then re-run"
                       % re.escape(os.path.join(str(local), ".locks", nas.repo()["folder"]))):
        stage(nas, local, ignore_patterns=PAGE15, workers=1)
    assert _every_path(local) == seen["before"]        # the copy's temp file came and went, nothing else
    assert not os.path.exists(os.path.join(str(local), ".locks"))


def _every_path(top):
    return sorted(os.path.relpath(os.path.join(d, n), str(top)) for d, dirs, files in os.walk(str(top))
                  for n in dirs + files)


def test_check_mode_plan_reads_like_a_plan_and_real_runs_say_what_they_did(nas, local):
    blobs = unique_blobs(selected(nas))
    planned = run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15), check_mode=True)
    lines = planned["diff_text"].splitlines()
    assert lines[0] == "would copy %d files, %s; would write %d snapshot links, ref main, the tree listing" % (
        len(blobs), human_bytes(sum(blobs.values())), len(selected(nas)))
    assert not [line for line in lines if line.startswith("+ link ")]     # each link comes with its copy's line
    assert "would copy %d files, %s" % (len(blobs), human_bytes(sum(blobs.values()))) in planned["summary"]
    assert "check mode" in planned["summary"] and "MiB/s" not in planned["summary"]
    done = stage(nas, local, ignore_patterns=PAGE15)
    assert done["diff_text"].startswith("copied %d files, " % len(blobs))
    assert done["summary"].startswith("%s@%s stage pass: copied %d files" % (MAIN, nas.repo()["commit"][:12],
                                                                              len(blobs)))
    assert stage(nas, local, ignore_patterns=PAGE15)["diff_text"] == ""


def test_a_nas_folder_the_node_cannot_list_fails_the_repo_and_nothing_local_is_pruned(tmp_path):
    """NFS root_squash on a folder that is not world-readable: the listing error is an error, never
    "these files are not wanted" (a verify pass once pruned good local copies that way)."""
    for shared in nobody_owned_dir(tmp_path, "dgx-unlistable-"):
        nas = build_nas(shared / "nas")
        nas.thaw()
        local = shared / "local"
        local.mkdir()
        subprocess.check_call(["chown", "-R", "%d:%d" % (NOBODY, NOBODY), str(shared)])
        message = shared / "message"

        def verify_after_the_folder_turns_unlistable():
            stage(nas, local, ignore_patterns=PAGE15)
            before = tree_snapshot(local)
            os.chmod(os.path.join(nas.snapshot_dir(), "extras"), 0)
            try:
                stage(nas, local, ignore_patterns=PAGE15, phase="verify", copy_missing=False, verify="full",
                      prune=True)
            except StageError as exc:
                message.write_text(str(exc))
            assert snapshot_diff(before, tree_snapshot(local)) == []

        assert run_as_nobody(verify_after_the_folder_turns_unlistable) == 0
        said = message.read_text()
        assert "cannot list %s" % os.path.join(nas.snapshot_dir(), "extras") in said and "EACCES" in said
        os.chmod(os.path.join(nas.snapshot_dir(), "extras"), 0o755)


def test_a_snapshot_swapped_for_a_link_before_the_empty_folder_sweep_removes_nothing_outside(nas, local, tmp_path,
                                                                                                monkeypatch):
    """Prune removes the unwanted files, then the folders they leave empty. A snapshots/<commit> swapped for a
    link in between (a whole verify pass can lie between the plan and that sweep) leads the sweep nowhere."""
    stage(nas, local)                                    # page15 staged: prune has something to remove
    snap = local_snapshot(nas, local)
    outside = tmp_path / "outside"
    (outside / "empty" / "folders").mkdir(parents=True)
    plan = plan_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, prune=True))
    removals = len(plan.debris + plan.prune)
    assert removals > 0
    real_remove_local = dgx_mirror_apply._remove_local
    removed = []

    def remove_then_swap(tree, path):
        real_remove_local(tree, path)
        removed.append(path)
        if len(removed) == removals:    # the last removal done, the sweep next
            os.rename(snap, snap + ".moved")
            os.symlink(str(outside), snap)

    monkeypatch.setattr(dgx_mirror_apply, "_remove_local", remove_then_swap)
    with pytest.raises(StageError) as refused:
        stage(nas, local, ignore_patterns=PAGE15, prune=True)
    assert "%s is a symlink" % snap in str(refused.value)
    assert os.path.isdir(str(outside / "empty" / "folders"))


@pytest.mark.parametrize("where", ["blobs", "snapshot folder", "blobs, mounted after the checks"])
def test_a_bind_mount_inside_the_local_repo_is_refused_before_anything_is_written_or_pruned(nas, local, tmp_path,
                                                                                            where, monkeypatch):
    """A folder of the local repo that shows another folder (a bind mount, same filesystem): prune would
    remove that folder's files and staging would write into it; the run refuses, naming the mount point,
    also when the mount is made after the run's checks (every folder is checked again as it is opened)."""
    stage(nas, local)                                    # page15 staged: prune has something to remove
    snap = local_snapshot(nas, local)
    mounted = os.path.join(snap, "page15") if where == "snapshot folder" else \
        os.path.join(os.path.dirname(os.path.dirname(snap)), "blobs")
    if where.endswith("after the checks"):
        monkeypatch.setattr(dgx_mirror_plan, "refuse_unsafe_local_dirs", lambda req, commit: None)
    outside = tmp_path / "outside"
    shutil.copytree(mounted, str(outside), symlinks=True)
    (outside / "not-the-hubs.txt").write_bytes(b"someone else's")
    before = tree_snapshot(str(outside))

    def stage_through_the_mount():
        bind_mount(outside, mounted)
        with pytest.raises(StageError) as refused:
            stage(nas, local, ignore_patterns=PAGE15, prune=True)
        assert "%s is a mount point" % mounted in str(refused.value), str(refused.value)

    assert in_private_mount_namespace(stage_through_the_mount) == 0
    assert snapshot_diff(before, tree_snapshot(str(outside))) == []


def test_a_local_copy_judged_after_a_nas_blob_fails_is_read_where_it_is_kept_or_removed(tmp_path):
    # blobs/ may be moved aside and its name made a link during a long copy: the local copy is judged through the
    # directory the run holds open, the one it is kept in or removed from.
    from ansible.module_utils.dgx_copy import SourceProblem
    from ansible.module_utils.dgx_localtree import LocalDir
    from ansible.module_utils.dgx_mirror_apply import Outcome, _nas_corrupt_record
    from ansible.module_utils.dgx_mirror_request import Work
    good = b"the blob's own bytes\n"
    etag = hashlib.sha256(good).hexdigest()
    held, elsewhere = tmp_path / "blobs.moved", tmp_path / "blobs"
    held.mkdir()
    elsewhere.mkdir()
    (held / etag).write_bytes(b"the blob's 0wn bytes\n")       # wrong bytes under the name
    (elsewhere / etag).write_bytes(good)                        # what the old path leads to now
    work = Work(str(elsewhere / etag), "/nas/blobs/" + etag, len(good), etag, "missing", ["f.bin"])
    outcome = Outcome()
    directory = LocalDir(os.open(str(held), os.O_RDONLY | os.O_DIRECTORY), str(held))
    with directory:
        record = _nas_corrupt_record(directory, work, SourceProblem("corrupt", work.source, etag, "0" * 64), outcome,
                                     ChunkBuffer(), PassMeter("stage", "a/b", "sample"))
    assert record["local"] == "removed"
    assert not os.path.lexists(str(held / etag))
    assert outcome.unavailable == {"f.bin"}
