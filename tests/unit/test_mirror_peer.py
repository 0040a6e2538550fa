"""hf_hub_mirror's peer_dir and require_match (module_utils/dgx_mirror.py, dgx_transfer.adopt_candidate):
candidate blobs another host of the lane sent are adopted only after they hash to their names, anything
else is rejected and fetched from the NAS; peer_dir is scratch the run removes; require_match refuses a
rank pattern that matches nothing. Fixtures and helpers are test_mirror's (one synthetic NAS hub each).
"""
import errno
import os
import re
import shutil
import stat

import pytest

import hubgen
from ansible.module_utils import dgx_mirror as mirror
from ansible.module_utils import dgx_transfer
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import TEMP_PREFIX
from ansible.module_utils.dgx_mirror import run_mirror
from test_mirror import (  # noqa: F401  (fixtures are found by name)
    MAIN, PAGE15, _record_opens, _small_nas, _small_template, assert_all_local, corrupt_nas_blob, expect_failure,
    fresh_nas, interrupt_copy_number, local, local_blob, local_repo, mirror_request, nas, nas_blob_real, prestage,
    progress_of, selected, stage, unique_blobs)
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
# adoption: a candidate that hashes to its name is moved into blobs/, no NAS read of it
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
    assert st.st_ino == inode and stat.S_IMODE(st.st_mode) == 0o644 and st.st_nlink == 1
    assert_all_local(nas, local)
    assert result["report"]["bytes_from_peers"] == size and result["report"]["peer_rejected"] == 0
    assert result["report"]["bytes_from_nas"] == total_bytes(nas) - size
    assert "%s from peers" % mirror.human_bytes(size) in result["summary"]
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
    request = mirror_request(nas, local, ignore_patterns=PAGE15, peer_dir=str(local) + "/../peer-outside")
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

def test_space_need_is_reduced_by_candidates_of_the_right_size(nas, local, monkeypatch):
    etag, size = shard_blob(nas, 0)
    put_candidate(nas, local, etag)
    need = total_bytes(nas)
    free = need - size + 1               # holds the copies only once the candidate is counted as on disk
    monkeypatch.setattr(mirror, "disk_space", lambda path: (free, 10 * 1024 ** 3))
    with pytest.raises(StageError, match=r"need %d bytes" % need):
        stage(nas, local, ignore_patterns=PAGE15, reserve="0")              # without peer_dir: refused
    result = peer_stage(nas, local, reserve="0")
    assert result["space"]["need"] == need - size and result["space"]["peers"] == size
    assert result["bytes_from_peers"] == size
    assert_all_local(nas, local)


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
    directory = nas.repo()["page15"][0].split("/")[0] + "/"       # the 'dir/' form matches below it
    result = stage(nas, local, ignore_patterns=PAGE15, require_match=[shard, "*.safetensors", directory])
    assert result["changed"] is True and result["warnings"] == []
    assert_all_local(nas, local)
    assert re.match(r"^[0-9a-f]{40}$", result["commit"])


# ------------------------------------------------------------------------------------------------
# what gets the name is the inode that was hashed; other ways in are copies, still hashed
# ------------------------------------------------------------------------------------------------

def _on_rename_of(monkeypatch, etag, action):
    """Run action() just before the candidate `etag` is renamed (the window after its hash)."""
    real_rename = os.rename

    def rename(src, dst, **kwargs):
        if src == etag:
            action()
        return real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "rename", rename)


def test_candidate_replaced_after_its_hash_is_not_given_the_name(nas, local, monkeypatch):
    etag, size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)

    def swap():          # another writer puts other bytes of the same size under the candidate's name
        os.unlink(candidate)
        with open(candidate, "wb") as handle:
            handle.write(b"\0" * size)

    _on_rename_of(monkeypatch, etag, swap)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    assert [r["blob"] for r in result["peer_rejected"]] == [etag]
    assert "replaced" in result["peer_rejected"][0]["why"] and result["bytes_from_peers"] == 0
    assert_all_local(nas, local)
    assert not [p for p in tree_snapshot(local) if TEMP_PREFIX in p]


def test_candidate_on_another_mount_is_copied_and_hashed_not_moved(nas, local, monkeypatch):
    etag, size = shard_blob(nas, 0)
    inode = os.stat(put_candidate(nas, local, etag)).st_ino

    def cross_device():
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    _on_rename_of(monkeypatch, etag, cross_device)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    assert result["bytes_from_peers"] == size and result["peer_rejected"] == []
    assert os.stat(local_blob(nas, local, etag)).st_ino != inode
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


def test_candidate_changed_while_hashed_is_rejected(nas, local, monkeypatch):
    etag, _size = shard_blob(nas, 0)
    candidate = put_candidate(nas, local, etag)
    real_feed = dgx_transfer.feed_fd

    def feed_then_touch(fd, *args, **kwargs):
        count = real_feed(fd, *args, **kwargs)
        os.utime(candidate, ns=(0, 0))        # a writer still at work: its mtime and ctime move
        return count

    monkeypatch.setattr(dgx_transfer, "feed_fd", feed_then_touch)
    result = peer_stage(nas, local)
    monkeypatch.undo()
    assert [r["blob"] for r in result["peer_rejected"]] == [etag]
    assert "changed while it was hashed" in result["peer_rejected"][0]["why"]
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
