"""hf_hub_mirror's peer_dir and require_match (module_utils/dgx_peer.py, dgx_copy.adopt_candidate):
candidate blobs another host of the lane sent are adopted only after they hash to their names, anything
else is rejected and fetched from the NAS; peer_dir is scratch the run removes; require_match refuses a
rank pattern that matches nothing. Fixtures and helpers are test_mirror's (one synthetic NAS hub each).
"""
import errno
import os
import re
import shutil
import subprocess
import stat

import pytest

import hubgen
from ansible.module_utils import dgx_mirror, dgx_mirror_apply, dgx_space
from ansible.module_utils import dgx_copy, dgx_localtree, dgx_mounts
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import TEMP_PREFIX
from ansible.module_utils.dgx_mirror import run_mirror
from ansible.module_utils.dgx_units import human_bytes
from test_mirror import (  # noqa: F401  (fixtures are found by name)
    MAIN, PAGE15, _record_opens, _small_nas, _small_template, assert_all_local, corrupt_nas_blob, expect_failure,
    fresh_nas, interrupt_copy_number, local, local_blob, local_repo, mirror_request, nas, nas_blob_real, prestage,
    progress_of, selected, stage, unique_blobs)
from mountns import bind_mount, in_private_mount_namespace
from treestate import snapshot_diff, tree_snapshot


def peer_dir_of(local):
    """Where the stage role puts a repo's peer_dir (the convention of the contract)."""
    return os.path.join(str(local), ".locks", "dgx-stage-peer", hubgen.repo_folder(MAIN))


def shard_blob(nas, number):
    """(etag, size) of shard `number` of the main repo."""
    info = selected(nas)[nas.repo()["shards"][number]]
    return info["etag"], info["size"]


def put_candidate(nas, local, etag):
    """What rsync from a peer leaves: a regular file named by the blob, holding the NAS copy's bytes."""
    peer = peer_dir_of(local)
    os.makedirs(peer, exist_ok=True)
    path = os.path.join(peer, etag)
    shutil.copyfile(nas_blob_real(nas, etag), path)
    os.chmod(path, 0o600)        # rsync keeps the sender's mode; an adopted blob gets 0644 like a copy
    return path


def total_bytes(nas):
    return sum(unique_blobs(selected(nas)).values())


def peer_stage(nas, local, check_mode=False, **kwargs):
    request = mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=peer_dir_of(local), **kwargs)
    return run_mirror(request, check_mode=check_mode)


# ------------------------------------------------------------------------------------------------
# adoption: a candidate that hashes to its name is copied into blobs/ (a new file), no NAS read of it
# ------------------------------------------------------------------------------------------------

def test_good_candidate_is_adopted_and_its_nas_blob_never_opened(nas, local, monkeypatch):
    etag, size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    inode = os.stat(candidate).st_ino
    opened = _record_opens(monkeypatch)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    assert nas_blob_real(nas, etag) not in opened
    other_etag, _size = shard_blob(nas, 1)
    assert nas_blob_real(nas, other_etag) in opened          # the recorder does see NAS reads
    assert result["bytes_from_peers"] == size
    assert result["bytes_from_nas"] == total_bytes(nas) - size
    assert result["bytes_copied"] == total_bytes(nas)        # every byte written, whatever its source
    assert result["bytes_read"]["nas"] == total_bytes(nas) - size
    assert result["bytes_read"]["local"] == size             # the candidate, hashed
    assert result["peer_rejected"] == []
    blob = local_blob(nas, local, etag)
    st = os.lstat(blob)
    assert st.st_ino != inode and stat.S_IMODE(st.st_mode) == 0o644 and st.st_nlink == 1     # a copy
    assert_all_local(nas, local)
    assert result["report"]["bytes_from_peers"] == size and result["report"]["peer_rejected"] == 0
    assert result["report"]["bytes_from_nas"] == total_bytes(nas) - size
    assert "%s from peers" % human_bytes(size) in result["summary"]
    assert result["wanted_blobs"] == sorted(unique_blobs(selected(nas)))
    assert result["source_snapshot"] == nas.snapshot_dir()
    assert not os.path.lexists(peer_dir_of(local))


def test_every_candidate_adopted_reads_nothing_from_the_nas(nas, local):
    for etag in unique_blobs(selected(nas)):
        put_candidate(nas, local, etag)
    result = peer_stage(nas, local, workers=3)
    assert (result["bytes_from_nas"], result["bytes_from_peers"]) == (0, total_bytes(nas))
    assert result["bytes_read"]["nas"] == 0
    assert_all_local(nas, local)


# ------------------------------------------------------------------------------------------------
# rejection: wrong bytes, wrong size, not a regular file: removed or left, and fetched from the NAS
# ------------------------------------------------------------------------------------------------

def test_candidate_with_one_flipped_byte_is_rejected_and_refetched_from_the_nas(nas, local):
    etag, size = shard_blob(nas, 1)
    candidate = put_candidate(nas, local, etag)
    hubgen.flip_byte(candidate, size // 2)
    result = peer_stage(nas, local)
    assert [(r["blob"], r["paths"]) for r in result["peer_rejected"]] == [(etag, [nas.repo()["shards"][1]])]
    assert "hash to" in result["peer_rejected"][0]["why"]
    assert (result["bytes_from_nas"], result["bytes_from_peers"]) == (total_bytes(nas), 0)
    assert result["report"]["peer_rejected"] == 1
    assert "1 peer blob rejected" in result["summary"]
    assert [w for w in result["warnings"] if etag in w and "fetched from the NAS" in w]
    assert_all_local(nas, local)
    assert not os.path.lexists(peer_dir_of(local))


def test_truncated_candidate_is_rejected_by_its_size_and_refetched(nas, local):
    etag, size = shard_blob(nas, 2)
    candidate = put_candidate(nas, local, etag)
    os.truncate(candidate, size - 100)
    result = peer_stage(nas, local)
    assert [r["blob"] for r in result["peer_rejected"]] == [etag]
    assert "size is %d bytes, the blob's is %d" % (size - 100, size) in result["peer_rejected"][0]["why"]
    assert result["bytes_from_peers"] == 0 and result["bytes_from_nas"] == total_bytes(nas)
    assert_all_local(nas, local)


def test_symlink_named_like_a_blob_is_not_followed(nas, local, tmp_path):
    etag, _size = shard_blob(nas, 0)
    outside = str(tmp_path / "outside-good-copy")
    shutil.copyfile(nas_blob_real(nas, etag), outside)       # the right bytes, but not a file of peer_dir
    os.makedirs(peer_dir_of(local))
    os.symlink(outside, os.path.join(peer_dir_of(local), etag))
    before = tree_snapshot(str(tmp_path / "outside-good-copy"))
    outside_inode = os.stat(outside).st_ino
    result = peer_stage(nas, local)
    assert [r["blob"] for r in result["peer_rejected"]] == [etag]
    assert "symlink" in result["peer_rejected"][0]["why"]
    assert result["bytes_from_peers"] == 0
    blob = local_blob(nas, local, etag)
    assert os.lstat(blob).st_ino != outside_inode and not os.path.islink(blob)
    assert snapshot_diff(before, tree_snapshot(outside)) == []     # the target was neither moved nor changed
    assert_all_local(nas, local)


def test_fifo_and_directory_named_like_blobs_are_rejected_not_read(nas, local):
    fifo_etag, _size = shard_blob(nas, 0)
    dir_etag, _size = shard_blob(nas, 1)
    os.makedirs(os.path.join(peer_dir_of(local), dir_etag))
    os.mkfifo(os.path.join(peer_dir_of(local), fifo_etag))
    result = peer_stage(nas, local)
    why = dict((r["blob"], r["why"]) for r in result["peer_rejected"])
    assert "a FIFO" in why[fifo_etag] and "a directory" in why[dir_etag]
    assert_all_local(nas, local)
    # the directory is not entered: it stays, peer_dir with it, and a warning says so
    assert os.listdir(peer_dir_of(local)) == [dir_etag]
    assert any("does not enter" in w and dir_etag in w for w in result["warnings"])


# ------------------------------------------------------------------------------------------------
# peer_dir must be scratch of its own inside dest, reached through no symlink: refused before writing
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
def test_peer_dir_outside_dest_is_refused_before_anything_is_written(nas, local, tmp_path, check_mode):
    etag, _size = shard_blob(nas, 0)
    outside = tmp_path / "peer-outside"
    outside.mkdir()
    shutil.copyfile(nas_blob_real(nas, etag), str(outside / etag))
    before_local, before_outside = tree_snapshot(local), tree_snapshot(outside)
    request = mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=str(outside))
    with pytest.raises(StageError) as err:
        run_mirror(request, check_mode=check_mode)
    message = str(err.value)
    assert "peer_dir %s is not inside dest %s" % (outside, local) in message
    assert ".locks/dgx-stage-peer/" in message and "nothing was written" in message
    assert snapshot_diff(before_local, tree_snapshot(local)) == []
    assert snapshot_diff(before_outside, tree_snapshot(outside)) == []


@pytest.mark.parametrize("where", ["dest", "blobs", "lock dir"])
def test_peer_dir_that_is_the_hub_or_a_repo_dir_is_refused(nas, local, where):
    peer = {"dest": str(local), "blobs": os.path.join(local_repo(nas, local), "blobs"),
            "lock dir": os.path.join(str(local), ".locks", hubgen.repo_folder(MAIN))}[where]
    with pytest.raises(StageError, match="must be a scratch directory of its own"):
        run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=peer))
    assert os.listdir(str(local)) == []


@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
@pytest.mark.parametrize("linked", ["dgx-stage-peer", ".locks"])
def test_symlinked_peer_dir_is_refused_before_anything_is_written(nas, local, tmp_path, linked, check_mode):
    etag, _size = shard_blob(nas, 0)
    elsewhere = tmp_path / "elsewhere"
    target = elsewhere / "dgx-stage-peer" / hubgen.repo_folder(MAIN) if linked == ".locks" else \
        elsewhere / hubgen.repo_folder(MAIN)
    target.mkdir(parents=True)
    shutil.copyfile(nas_blob_real(nas, etag), str(target / etag))
    link = os.path.join(str(local), ".locks") if linked == ".locks" else \
        os.path.join(str(local), ".locks", "dgx-stage-peer")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(str(elsewhere), link)
    before_local, before_elsewhere = tree_snapshot(local), tree_snapshot(elsewhere)
    with pytest.raises(StageError) as err:
        peer_stage(nas, local, check_mode=check_mode)
    assert "%s is a symlink to %s" % (link, elsewhere) in str(err.value)
    assert snapshot_diff(before_local, tree_snapshot(local)) == []
    assert snapshot_diff(before_elsewhere, tree_snapshot(elsewhere)) == []


# ------------------------------------------------------------------------------------------------
# peer_dir is scratch: removed after a run (ok, failed, interrupted), never touched in check mode
# ------------------------------------------------------------------------------------------------

def test_peer_dir_and_its_leftovers_are_removed_after_a_run(nas, local):
    etag, _size = shard_blob(nas, 0)
    put_candidate(nas, local, etag)
    peer = peer_dir_of(local)
    for name in ("not-a-wanted-blob", ".%s.Xy12ab" % etag):     # a stray file, an rsync temp file
        with open(os.path.join(peer, name), "wb") as handle:
            handle.write(b"left over")
    result = peer_stage(nas, local)
    assert result["bytes_from_peers"] > 0 and not os.path.lexists(peer)
    assert os.path.isdir(os.path.dirname(peer))                 # only peer_dir itself goes
    assert result["warnings"] == []


def test_an_interrupted_rsync_delay_updates_folder_is_removed_with_peer_dir(nas, local):
    etag, _size = shard_blob(nas, 0)
    put_candidate(nas, local, etag)
    delay = os.path.join(peer_dir_of(local), ".~tmp~")     # rsync --delay-updates, killed before its renames
    os.mkdir(delay)
    shutil.copyfile(nas_blob_real(nas, shard_blob(nas, 1)[0]), os.path.join(delay, shard_blob(nas, 1)[0]))
    result = peer_stage(nas, local)
    assert result["bytes_from_peers"] == shard_blob(nas, 0)[1] and result["warnings"] == []
    assert not os.path.lexists(peer_dir_of(local))


def test_a_folder_inside_the_delay_updates_folder_is_not_entered_and_is_named(nas, local):
    etag, _size = shard_blob(nas, 0)
    put_candidate(nas, local, etag)
    nested = os.path.join(peer_dir_of(local), ".~tmp~", "operator-notes")
    os.makedirs(nested)
    with open(os.path.join(nested, "keep.txt"), "w") as handle:
        handle.write("not a candidate")
    result = peer_stage(nas, local)
    assert os.listdir(peer_dir_of(local)) == [".~tmp~"] and os.listdir(nested) == ["keep.txt"]
    assert any("does not enter" in w and ".~tmp~/operator-notes" in w for w in result["warnings"]), \
        result["warnings"]


def test_peer_dir_is_removed_after_a_failed_run(fresh_nas, local):
    nas = fresh_nas
    corrupt_nas_blob(nas, shard_blob(nas, 2)[0])
    put_candidate(nas, local, shard_blob(nas, 0)[0])
    failure = expect_failure(nas, local, ignore_patterns=PAGE15, peer_dir=peer_dir_of(local))
    assert failure.result["bytes_from_peers"] == shard_blob(nas, 0)[1]
    assert not os.path.lexists(peer_dir_of(local))


def test_peer_dir_is_removed_after_an_interrupted_run(nas, local, monkeypatch):
    etag, _size = shard_blob(nas, 0)
    put_candidate(nas, local, etag)
    interrupt_copy_number(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        peer_stage(nas, local, workers=1)
    monkeypatch.undo()
    assert not os.path.lexists(peer_dir_of(local))


def test_check_mode_leaves_peer_dir_untouched_and_reports_wanted_blobs(nas, local):
    good, good_size = shard_blob(nas, 0)
    bad, bad_size = shard_blob(nas, 1)
    put_candidate(nas, local, good)
    hubgen.flip_byte(put_candidate(nas, local, bad), 0)
    before = tree_snapshot(local)
    result = peer_stage(nas, local, check_mode=True)
    assert snapshot_diff(before, tree_snapshot(local)) == []
    assert result["wanted_blobs"] == sorted(unique_blobs(selected(nas)))
    # candidates of the right size stand for peer bytes (a real run hashes them first)
    assert result["bytes_from_peers"] == good_size + bad_size
    assert result["bytes_from_nas"] == total_bytes(nas) - good_size - bad_size
    assert result["peer_rejected"] == [] and result["changed"] is True


def test_wanted_blobs_name_only_what_is_missing_and_a_rerun_is_idle(prestage, nas, local):
    prestage(nas, local)
    etag, size = shard_blob(nas, 3)
    os.unlink(local_blob(nas, local, etag))
    check = peer_stage(nas, local, check_mode=True)
    assert check["wanted_blobs"] == [etag]
    put_candidate(nas, local, etag)
    first = peer_stage(nas, local)
    assert first["wanted_blobs"] == [etag] and first["bytes_from_peers"] == size and first["bytes_from_nas"] == 0
    again = peer_stage(nas, local)
    assert again["changed"] is False and again["wanted_blobs"] == []
    assert (again["bytes_from_nas"], again["bytes_from_peers"], again["peer_rejected"]) == (0, 0, [])
    assert (again["report"]["bytes_from_nas"], again["report"]["bytes_from_peers"]) == (0, 0)
    assert "from peers" not in again["summary"]


# ------------------------------------------------------------------------------------------------
# space: candidates already on the disk do not count twice
# ------------------------------------------------------------------------------------------------

def _fake_device(monkeypatch, path):
    """lstat of `path` says another st_dev (a filesystem mounted there)."""
    real_lstat = os.lstat

    def lstat(name, *args, **kwargs):
        st = real_lstat(name, *args, **kwargs)
        if name == path:
            fields = list(st[:10])
            fields[2] += 1
            return os.stat_result(fields, {"st_blocks": st.st_blocks, "st_blksize": st.st_blksize})
        return st

    monkeypatch.setattr(os, "lstat", lstat)


@pytest.mark.parametrize("workers", [1, 2])
def test_space_need_counts_candidates_freed_after_their_copy_plus_the_peak(nas, local, monkeypatch, workers):
    """A candidate is copied, then removed: the need is the bytes to write minus the candidates' bytes
    plus the largest candidates still there while their copies are in flight (one per worker)."""
    first, first_size = shard_blob(nas, 0)
    second, second_size = shard_blob(nas, 1)
    put_candidate(nas, local, first)
    put_candidate(nas, local, second)
    total = total_bytes(nas)
    need = total - first_size - second_size + sorted([first_size, second_size])[-1] + \
        (min(first_size, second_size) if workers == 2 else 0)
    free = need                           # holds the copies only when the freed candidates are counted
    monkeypatch.setattr(dgx_space, "disk_space", lambda path: (free, 10 * 1024 ** 3))
    if need < total:
        with pytest.raises(StageError, match=r"need %d bytes" % total):
            stage(nas, local, ignore_patterns=PAGE15, reserve="0")          # without peer_dir: refused
    result = peer_stage(nas, local, reserve="0", workers=workers)
    assert result["space"]["need"] == need and result["space"]["peers"] == first_size + second_size
    assert result["space"]["peers_peak"] == need - total + first_size + second_size
    assert result["bytes_from_peers"] == first_size + second_size
    assert_all_local(nas, local)


@pytest.mark.parametrize("kind", ["sparse", "other device", "wrong size"])
def test_candidates_that_free_no_space_on_the_blobs_disk_are_not_counted(nas, local, monkeypatch, kind):
    etag, size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    if kind == "sparse":                          # apparent size only: removing it frees nothing
        os.unlink(candidate)
        with open(candidate, "wb") as handle:
            handle.truncate(size)
    elif kind == "wrong size":
        os.truncate(candidate, size - 1)
    else:
        _fake_device(monkeypatch, candidate)      # a filesystem mounted inside peer_dir
    result = peer_stage(nas, local, check_mode=True)
    monkeypatch.undo()
    assert result["space"]["peers"] == 0 and result["space"]["need"] == total_bytes(nas)
    assert result["bytes_from_peers"] == 0


# ------------------------------------------------------------------------------------------------
# require_match: every rank pattern must match a file of the snapshot
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
def test_require_match_pattern_matching_nothing_is_refused_before_anything_is_written(nas, local, check_mode):
    put_candidate(nas, local, shard_blob(nas, 0)[0])
    before = tree_snapshot(local)
    request = mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=peer_dir_of(local),
                             require_match=["*.safetensors", "engram/rank-5-of-8/*"])
    with pytest.raises(StageError) as err:
        run_mirror(request, check_mode=check_mode)
    message = str(err.value)
    assert "rank pattern 'engram/rank-5-of-8/*' matches no file of %s@%s" % (MAIN, nas.repo()["commit"]) in message
    assert "check rank_patterns and the lane's size" in message
    assert snapshot_diff(before, tree_snapshot(local)) == []


def test_require_match_patterns_that_match_stage_as_usual(nas, local):
    shard = nas.repo()["shards"][0]
    directory = "extras/"                                         # the 'dir/' form matches below it
    result = stage(nas, local, ignore_patterns=PAGE15, require_match=[shard, "*.safetensors", directory])
    assert result["changed"] is True and result["warnings"] == []
    assert_all_local(nas, local)
    assert re.match(r"^[0-9a-f]{40}$", result["commit"])


@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
def test_a_file_two_ranks_patterns_select_is_refused_naming_the_file_and_both_patterns(nas, local, check_mode):
    """Rank files partition the repo: a file this rank's pattern and another rank's both select is ignored on
    both hosts (each ignores the other's), so neither would stage it."""
    shard = nas.repo()["shards"][0]
    before = tree_snapshot(local)
    request = mirror_request(nas, local, ignore_patterns=PAGE15 + ["model-0000*"],
                             require_match=["*.safetensors"], other_rank_patterns=["model-0000*"])
    with pytest.raises(StageError) as err:
        run_mirror(request, check_mode=check_mode)
    message = str(err.value)
    assert "rank patterns overlap: %s of %s@%s" % (shard, MAIN, nas.repo()["commit"]) in message, message
    assert "rank pattern '*.safetensors' and by another rank's pattern 'model-0000*'" in message, message
    assert snapshot_diff(before, tree_snapshot(local)) == []


def test_the_result_counts_this_ranks_files_apart_from_the_shared_ones(nas, local):
    shards = nas.repo()["shards"]
    result = run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15 + shards[1:], require_match=shards[:1],
                                       other_rank_patterns=shards[1:]), check_mode=True)
    local_files = len(nas.repo()["files"]) - len(nas.repo()["page15"]) - len(shards[1:])
    assert result["files"]["local"] == local_files
    assert (result["files"]["rank"], result["files"]["shared"]) == (1, local_files - 1)
    assert "stages %d shared files and 1 rank file (%s)" % (local_files - 1, shards[0]) in result["summary"]


# ------------------------------------------------------------------------------------------------
# a candidate is only ever copied (hashed while written, a new inode): nothing done to it later, through
# a handle, a hard link or a rename, reaches the blob
# ------------------------------------------------------------------------------------------------

def _hash_of(path):
    with open(path, "rb") as handle:
        return hubgen.sha256_hex(handle.read())


def test_writes_through_a_handle_opened_before_the_run_never_reach_the_blob(nas, local):
    etag, size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    with open(candidate, "r+b") as handle:          # a writer that opened the candidate before the run
        result = peer_stage(nas, local)
        handle.seek(100)
        handle.write(b"EVIL")
        handle.flush()
    assert result["bytes_from_peers"] == size
    assert _hash_of(local_blob(nas, local, etag)) == etag
    assert_all_local(nas, local)


def test_candidate_changed_and_linked_just_before_the_blob_is_named_cannot_reach_it(nas, local, tmp_path,
                                                                                    monkeypatch):
    """The window between the last check and the rename: other bytes written into the candidate (its
    mtime put back) and a hard link made to it from outside dest."""
    etag, size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    handle = open(candidate, "r+b")
    outside = str(tmp_path / "outside-link")
    real_replace, real_rename = os.replace, os.rename

    def meddle(dst):
        if dst == etag and not os.path.exists(outside):
            st = os.fstat(handle.fileno())
            os.link(candidate, outside)
            handle.seek(100)
            handle.write(b"EVIL")
            handle.flush()
            os.utime(outside, ns=(st.st_atime_ns, st.st_mtime_ns))

    def replace(src, dst, **kwargs):
        meddle(dst)
        return real_replace(src, dst, **kwargs)

    def rename(src, dst, **kwargs):
        meddle(src)
        return real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    try:
        result = peer_stage(nas, local, workers=1)
    finally:
        monkeypatch.undo()
        handle.close()
    assert os.path.exists(outside)                      # the meddling happened
    blob = local_blob(nas, local, etag)
    assert _hash_of(blob) == etag
    assert os.stat(blob).st_nlink == 1 and os.stat(blob).st_ino != os.stat(outside).st_ino
    assert result["bytes_from_peers"] == size
    assert_all_local(nas, local)


def test_hardlinked_candidate_is_copied_so_the_blob_shares_no_inode(nas, local):
    etag, size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    other_name = os.path.join(str(local), "other-link")
    os.link(candidate, other_name)
    result = peer_stage(nas, local)
    assert result["bytes_from_peers"] == size
    blob = os.stat(local_blob(nas, local, etag))
    assert blob.st_ino != os.stat(other_name).st_ino and blob.st_nlink == 1
    assert_all_local(nas, local)


def test_candidate_changed_while_copied_is_rejected(nas, local, monkeypatch):
    etag, _size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    real_chunks = dgx_copy._copy_chunks

    def copy_then_touch(src_fd, source, *args):
        count = real_chunks(src_fd, source, *args)
        if source == candidate:
            os.utime(candidate, ns=(0, 0))        # a writer still at work: its mtime and ctime move
        return count

    monkeypatch.setattr(dgx_copy, "_copy_chunks", copy_then_touch)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    assert [r["blob"] for r in result["peer_rejected"]] == [etag]
    assert "changed while it was copied" in result["peer_rejected"][0]["why"]
    assert_all_local(nas, local)


def test_candidate_replaced_between_its_lstat_and_its_open_is_not_read(nas, local, monkeypatch):
    etag, size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    real_open = os.open

    def swap_then_open(path, flags, *args, **kwargs):
        if path == etag and "dir_fd" in kwargs:
            shutil.copyfile(nas_blob_real(nas, etag), candidate + ".new")   # another writer's file (same
            os.rename(candidate + ".new", candidate)                          # bytes) takes the name
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swap_then_open)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    assert [r["blob"] for r in result["peer_rejected"]] == [etag]
    assert "replaced between its check and its opening" in result["peer_rejected"][0]["why"]
    assert result["bytes_from_peers"] == 0 and result["bytes_from_nas"] == total_bytes(nas)
    assert_all_local(nas, local)
    assert not os.path.lexists(peer_dir_of(local))


@pytest.mark.parametrize("trouble", ["read", "chmod"])
def test_unreadable_candidate_is_rejected_and_fetched_the_run_goes_on(nas, local, monkeypatch, trouble):
    """A candidate the run cannot read (EIO) is rejected with the errno text; candidates are never
    chmod-ed (one owned by another user cannot be), so a failing chmod changes nothing."""
    etag, size = shard_blob(nas, 0)
    inode = os.stat(put_candidate(nas, local, etag)).st_ino
    real_readv, real_fchmod = os.readv, os.fchmod

    def readv(fd, buffers):
        if trouble == "read" and os.fstat(fd).st_ino == inode:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_readv(fd, buffers)

    def fchmod(fd, mode):          # the candidate belongs to another user
        if os.fstat(fd).st_ino == inode:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        return real_fchmod(fd, mode)

    monkeypatch.setattr(os, "readv", readv)
    monkeypatch.setattr(os, "fchmod", fchmod)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    if trouble == "read":
        assert [r["blob"] for r in result["peer_rejected"]] == [etag]
        assert os.strerror(errno.EIO) in result["peer_rejected"][0]["why"]
        assert result["bytes_from_nas"] == total_bytes(nas)
    else:
        assert result["peer_rejected"] == [] and result["bytes_from_peers"] == size
    assert_all_local(nas, local)


def test_progress_file_counts_candidate_reads_and_ends_consistent(nas, local):
    good, good_size = shard_blob(nas, 0)
    bad, bad_size = shard_blob(nas, 1)
    put_candidate(nas, local, good)
    hubgen.flip_byte(put_candidate(nas, local, bad), 0)
    result = peer_stage(nas, local)
    doc = progress_of(nas, local)
    assert (doc["status"], doc["finished"]) == ("ok", True)
    assert doc["files_done"] == doc["files_total"] == len(unique_blobs(selected(nas)))
    assert doc["bytes_done"] == doc["bytes_total"]
    # both candidates were read (hashed) from the local disk; the rejected one then came from the NAS
    assert doc["bytes_read"] == result["bytes_read"] == {"local": good_size + bad_size,
                                                         "nas": total_bytes(nas) - good_size}


# ------------------------------------------------------------------------------------------------
# mount points, whose candidates, refusals after the lock, messages
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
@pytest.mark.parametrize("how", ["other filesystem at peer_dir", "same-fs bind mount on the way"])
def test_peer_dir_that_is_or_lies_below_a_mount_point_is_refused_before_anything_is_written(
        nas, local, tmp_path, monkeypatch, how, check_mode):
    """A directory bind-mounted at peer_dir (or at dgx-stage-peer) from outside the hub: the clean-up
    would empty it. st_dev catches another filesystem, the mount table a bind of the same one."""
    etag, _size = shard_blob(nas, 0)
    put_candidate(nas, local, etag)

    def refused(mounted):
        before = tree_snapshot(local)
        with pytest.raises(StageError) as err:
            peer_stage(nas, local, check_mode=check_mode)
        assert "%s is a mount point" % mounted in str(err.value) and "nothing was written" in str(err.value)
        assert snapshot_diff(before, tree_snapshot(local)) == []

    mounted = peer_dir_of(local) if how.startswith("other filesystem") else os.path.dirname(peer_dir_of(local))
    (tmp_path / "elsewhere").mkdir()

    def bind_then_stage():
        if how.startswith("other filesystem"):
            subprocess.check_call(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mounted])
        else:
            shutil.copytree(mounted, str(tmp_path / "elsewhere" / "copy"), symlinks=True)
            bind_mount(tmp_path / "elsewhere" / "copy", mounted)
        refused(mounted)

    assert in_private_mount_namespace(bind_then_stage) == 0


def test_mount_points_reads_mountinfo_with_its_escapes(tmp_path, monkeypatch):
    info = tmp_path / "mountinfo"
    info.write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                    "40 22 8:1 /x /raid/hub/.locks/dgx-stage-peer/my\\040dir rw - ext4 /dev/sda1 rw\n")
    monkeypatch.setattr(dgx_mounts, "MOUNTINFO", str(info))
    assert dgx_mounts.mount_points() == {"/", "/raid/hub/.locks/dgx-stage-peer/my dir"}


@pytest.mark.parametrize("where", ["peer_dir", ".~tmp~"])
def test_clean_up_never_empties_a_directory_on_another_mount(nas, local, tmp_path, where):
    """A bind mount made after the run's checks: the clean-up leaves it and what it holds, and says so."""
    etag, _size = shard_blob(nas, 0)
    put_candidate(nas, local, etag)
    delay = os.path.join(peer_dir_of(local), ".~tmp~")
    os.mkdir(delay)
    mounted = peer_dir_of(local) if where == "peer_dir" else delay
    outside = tmp_path / "outside"
    shutil.copytree(mounted, str(outside), symlinks=True)
    (outside / "outside-file").write_bytes(b"not ours")

    def bind_then_clean_up():
        bind_mount(outside, mounted)
        tree = dgx_localtree.LocalTree(str(local))
        problems = dgx_copy.clear_peer_dir(tree, os.path.relpath(peer_dir_of(local), str(local)))
        assert any("%s is a mount point (" % mounted in p for p in problems), problems
        assert os.path.exists(os.path.join(mounted, "outside-file"))
        if where == "peer_dir":
            assert os.path.exists(os.path.join(mounted, etag))

    assert in_private_mount_namespace(bind_then_clean_up) == 0
    assert (outside / "outside-file").read_bytes() == b"not ours"


def test_peer_dir_equal_to_dest_says_it_is_dest(nas, local):
    with pytest.raises(StageError) as err:
        run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=str(local)))
    assert "peer_dir %s is dest:" % local in str(err.value)


@pytest.mark.parametrize("peer", [".locks/dgx-stage-peer/models--other--repo", ".locks/scratch/FOLDER",
                                  ".locks/dgx-stage-peer/FOLDER/sub", "scratch"])
def test_peer_dir_not_this_repos_candidate_folder_is_refused_and_kept(nas, local, peer):
    """Another repo's candidates (or anything else) must never be deleted by this repo's clean-up."""
    path = os.path.join(str(local), *peer.replace("FOLDER", hubgen.repo_folder(MAIN)).split("/"))
    os.makedirs(path)
    with open(os.path.join(path, "someone-elses"), "wb") as handle:
        handle.write(b"kept")
    before = tree_snapshot(local)
    with pytest.raises(StageError) as err:
        run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=path))
    assert "is not this repo's candidate folder: its name must be %s and its parent's dgx-stage-peer" \
        % hubgen.repo_folder(MAIN) in str(err.value)
    assert snapshot_diff(before, tree_snapshot(local)) == []


@pytest.mark.parametrize("given", ["relative", "dotdot"])
def test_peer_dir_relative_or_with_dotdot_is_refused(nas, local, monkeypatch, given):
    folder = hubgen.repo_folder(MAIN)
    if given == "relative":
        monkeypatch.chdir(str(local))
        peer = os.path.join(".locks", "dgx-stage-peer", folder)
    else:                 # resolves inside dest, but says otherwise
        peer = os.path.join(str(local), ".locks", "x", "..", "dgx-stage-peer", folder)
    with pytest.raises(StageError) as err:
        run_mirror(mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=peer))
    assert "peer_dir %s is not an absolute path without '..' components" % peer in str(err.value)
    assert os.listdir(str(local)) == []


@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
def test_require_match_pattern_matching_only_excluded_files_is_refused(nas, local, check_mode):
    before = tree_snapshot(local)
    request = mirror_request(nas, local, ignore_patterns=PAGE15, require_match=["*.safetensors", "page15/a/*"])
    with pytest.raises(StageError) as err:
        run_mirror(request, check_mode=check_mode)
    message = str(err.value)
    assert "rank pattern 'page15/a/*' matches no file of %s@%s that this run selects" % (
        MAIN, nas.repo()["commit"]) in message
    assert "it matches only files that allow_patterns None / ignore_patterns ['page15/'] exclude" in message
    assert snapshot_diff(before, tree_snapshot(local)) == []


def test_repair_served_by_a_peer_candidate_says_so(prestage, nas, local):
    prestage(nas, local)
    etag, size = shard_blob(nas, 2)
    hubgen.flip_byte(local_blob(nas, local, etag), size // 2)
    put_candidate(nas, local, etag)
    result = peer_stage(nas, local, verify="full")
    assert result["bytes_from_peers"] == size and result["repaired_paths"] == [nas.repo()["shards"][2]]
    repaired = [w for w in result["warnings"] if w.startswith("repaired ")]
    assert len(repaired) == 1 and "replaced by a peer copy verified against its name" in repaired[0]
    assert "NAS copy" not in repaired[0]
    assert_all_local(nas, local)


def test_space_refusal_under_the_lock_leaves_peer_dir_and_writes_nothing_of_the_repo(nas, local, monkeypatch):
    """The disk filled up between the check before the lock and the one under it: refused, 'nothing was
    written' - so the candidates stay for the next run."""
    etag, _size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    monkeypatch.setattr(dgx_mirror, "_refuse_before_locking", lambda *args: None)
    monkeypatch.setattr(dgx_space, "disk_space", lambda path: (1024, 10 * 1024 ** 3))
    monkeypatch.setattr(dgx_mirror_apply, "disk_space", lambda path: (1024, 10 * 1024 ** 3))
    with pytest.raises(StageError) as err:
        peer_stage(nas, local, reserve="0")
    monkeypatch.undo()
    assert "not enough space" in str(err.value) and "nothing was written" in str(err.value)
    assert os.path.isfile(candidate)
    assert not os.path.exists(local_repo(nas, local))


def test_disk_full_after_a_rejected_candidate_counts_only_bytes_written_under_a_name(nas, local, monkeypatch):
    """Bytes read from a rejected candidate wrote nothing that stays: the run still needs all of it."""
    writes = sorted((-size, etag) for etag, size in unique_blobs(selected(nas)).items())
    first = writes[0][1]                                  # copied first with one worker
    hubgen.flip_byte(put_candidate(nas, local, first), 0)
    real_copy = dgx_mirror_apply.copy_verified

    def nas_copy_fills_the_disk(source, directory, name, size, **kwargs):
        if name == first:
            raise dgx_copy.LocalWriteError("No space left", directory.join(name), 0, errno.ENOSPC)
        return real_copy(source, directory, name, size, **kwargs)

    monkeypatch.setattr(dgx_mirror_apply, "copy_verified", nas_copy_fills_the_disk)
    failure = expect_failure(nas, local, ignore_patterns=PAGE15, peer_dir=peer_dir_of(local), workers=1)
    monkeypatch.undo()
    assert "the local disk is full" in str(failure)
    assert "still needs %s (%d bytes)" % (human_bytes(total_bytes(nas)), total_bytes(nas)) in str(failure)


def test_fifo_and_device_named_like_blobs_are_never_opened(nas, local, monkeypatch):
    fifo_etag, _size = shard_blob(nas, 0)
    os.makedirs(peer_dir_of(local))
    os.mkfifo(os.path.join(peer_dir_of(local), fifo_etag))
    real_open = os.open
    opened = []

    def recording_open(path, *args, **kwargs):
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    assert fifo_etag not in opened
    assert "a FIFO, not a regular file: not opened" in result["peer_rejected"][0]["why"]
    assert_all_local(nas, local)
