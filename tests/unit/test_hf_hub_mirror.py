"""hf_hub_mirror's module contract: main() in-process (tests/modrun.py) against a read-only synthetic NAS hub,
as `ansible localhost -m hf_hub_mirror` runs it, without an ansible process per run.

What the engine copies, verifies and refuses is test_mirror's and test_mirror_peer's; here is what the module
takes from Ansible (check mode, diff mode, its options) and hands back (the documented keys and their values,
names that are not UTF-8, failures). The NAS fixtures are test_mirror's: a test whose run changed a single
byte or inode attribute of the NAS tree fails.
"""
import os
import time

from modrun import run_main
from test_mirror import (  # noqa: F401  (fixtures are found by name)
    MAIN, PAGE15, _small_nas, fresh_nas, local, local_repo, nas, nas_blob_real, selected, unique_blobs)
from treestate import blob_matches_name, snapshot_diff, tree_snapshot

DOCUMENTED = {"changed", "commit", "snapshot", "files", "blobs", "bytes_copied", "excluded_paths", "duration_s"}


def mirror(args, check_mode=False, diff=False):
    return run_main("hf_hub_mirror", args, check_mode=check_mode, diff=diff)


def main_args(nas, local, **extra):
    args = {"src": nas["hub"], "dest": str(local), "repo_id": MAIN, "ignore_patterns": PAGE15}
    args.update(extra)
    return args


def test_module_run_returns_documented_keys_and_is_idempotent(nas, local):
    repo = nas.repo()
    files = selected(nas)
    blobs = unique_blobs(files)
    started = time.monotonic()
    first = mirror(main_args(nas, local))
    wall = time.monotonic() - started
    assert DOCUMENTED <= set(first), sorted(DOCUMENTED - set(first))
    assert first["changed"] is True and not first.get("failed")
    assert first["commit"] == repo["commit"]
    assert first["snapshot"] == os.path.join(local_repo(nas, local), "snapshots", repo["commit"])
    assert first["files"] == {"total": len(repo["files"]), "local": len(files), "excluded": len(repo["page15"]),
                              "dangling": 0, "rank": 0, "shared": len(files)}
    assert first["blobs"] == {"copied": len(blobs), "reused": 0, "repaired": 0}
    assert first["bytes_copied"] == sum(blobs.values())
    assert sorted(first["excluded_paths"]) == sorted(repo["page15"])
    assert isinstance(first["duration_s"], float) and 0 <= first["duration_s"] < wall
    for path, info in files.items():
        entry = os.path.join(first["snapshot"], *path.split("/"))
        assert os.readlink(entry) == "../" * (path.count("/") + 2) + "blobs/" + info["etag"]
        assert blob_matches_name(entry, info["etag"])
    second = mirror(main_args(nas, local))
    assert second["changed"] is False
    assert second["blobs"] == {"copied": 0, "reused": len(blobs), "repaired": 0}
    assert second["bytes_copied"] == 0


def test_module_check_mode_changes_nothing(nas, local):
    before = tree_snapshot(local)
    result = mirror(main_args(nas, local), check_mode=True)
    blobs = unique_blobs(selected(nas))
    assert result["changed"] is True
    assert result["blobs"] == {"copied": len(blobs), "reused": 0, "repaired": 0}
    assert result["bytes_copied"] == sum(blobs.values())
    assert snapshot_diff(before, tree_snapshot(local)) == []
    assert os.listdir(str(local)) == []
    mirror(main_args(nas, local))
    before = tree_snapshot(local)
    again = mirror(main_args(nas, local), check_mode=True)
    assert again["changed"] is False and again["blobs"]["copied"] == 0
    assert snapshot_diff(before, tree_snapshot(local)) == []


def test_module_diff_lists_every_copied_blob(nas, local):
    blobs = unique_blobs(selected(nas))
    result = mirror(main_args(nas, local), diff=True)
    text = result["diff"]["prepared"]
    blob_dir = os.path.join(local_repo(nas, local), "blobs")
    copies = [line for line in text.splitlines() if line.startswith("+ copy ")]
    assert len(copies) == len(blobs)
    for etag in blobs:
        assert sum(1 for line in copies if line.startswith("+ copy %s " % os.path.join(blob_dir, etag))) == 1, etag
    assert "+ ref main = %s" % nas.repo()["commit"] in text
    nothing = mirror(main_args(nas, local), diff=True)
    assert nothing["changed"] is False and "+ copy " not in nothing.get("diff", {}).get("prepared", "")


def test_module_failure_is_reported_with_message(nas, local):
    before = tree_snapshot(local)
    result = mirror(main_args(nas, local, repo_id="coolbho3k/NoSuchModel"))
    assert result["failed"] is True and result.get("changed", False) is False
    assert "unknown repo coolbho3k/NoSuchModel" in result["msg"]
    for repo in nas["repos"].values():
        assert repo["folder"] in result["msg"]
    assert snapshot_diff(before, tree_snapshot(local)) == []


def test_non_utf8_file_names_do_not_break_the_result(fresh_nas, local):
    # a page15 file whose name is not UTF-8 (an old tool's Latin-1): staged or excluded, the module's
    # result is still valid UTF-8 JSON, the name shown with U+FFFD
    nas = fresh_nas
    page15 = os.path.join(nas.snapshot_dir(), "page15")
    nas.thaw()
    with open(os.path.join(os.fsencode(page15), b"caf\xe9.bin"), "wb") as handle:
        handle.write(b"latin-1 named")
    nas.freeze()
    excluded = mirror(main_args(nas, local))
    assert "page15/caf\ufffd.bin" in excluded["excluded_paths"]
    staged = mirror(main_args(nas, local, ignore_patterns=[]))
    assert staged["changed"] is True and not staged.get("failed")
    assert os.path.isfile(os.path.join(os.fsencode(local_repo(nas, local)), b"snapshots",
                                       nas.repo()["commit"].encode(), b"page15", b"caf\xe9.bin"))


# ------------------------------------------------------------------------------------------------
# peer_dir: blobs another host of the lane sent are copied only when they hash to their names
# ------------------------------------------------------------------------------------------------

def test_module_adopts_a_good_peer_blob_and_refetches_a_corrupt_one_from_the_nas(nas, local):
    repo = nas.repo()
    blobs = unique_blobs(selected(nas))
    good, corrupt = [repo["files"][shard]["etag"] for shard in repo["shards"][:2]]
    peer_dir = os.path.join(str(local), ".locks", "dgx-stage-peer", repo["folder"])
    os.makedirs(peer_dir)
    for etag in (good, corrupt):
        with open(nas_blob_real(nas, etag), "rb") as src:
            data = bytearray(src.read())
        if etag == corrupt:
            data[len(data) // 2] ^= 0xFF          # corrupted in transit: same size, one byte flipped
        with open(os.path.join(peer_dir, etag), "wb") as dst:
            dst.write(data)
    good_inode = os.stat(os.path.join(peer_dir, good)).st_ino
    args = main_args(nas, local, peer_dir=peer_dir)
    check = mirror(args, check_mode=True)
    assert check["wanted_blobs"] == sorted(blobs) and sorted(os.listdir(peer_dir)) == sorted([good, corrupt])
    result = mirror(args)
    assert result["changed"] is True and not result.get("failed")
    assert result["bytes_from_peers"] == blobs[good]
    assert result["bytes_from_nas"] == sum(blobs.values()) - blobs[good]
    assert result["bytes_copied"] == sum(blobs.values())
    assert [(r["blob"], r["paths"]) for r in result["peer_rejected"]] == [(corrupt, [repo["shards"][1]])]
    assert result["report"]["bytes_from_peers"] == blobs[good] and result["report"]["peer_rejected"] == 1
    assert result["source_snapshot"] == nas.snapshot_dir()
    blob_dir = os.path.join(local_repo(nas, local), "blobs")
    blob = os.stat(os.path.join(blob_dir, good))
    assert blob.st_ino != good_inode and blob.st_nlink == 1               # copied (a new file), never moved
    for etag in blobs:
        assert blob_matches_name(os.path.join(blob_dir, etag), etag), etag
    assert not os.path.lexists(peer_dir)
    again = mirror(args)
    assert again["changed"] is False and (again["bytes_from_nas"], again["bytes_from_peers"]) == (0, 0)
