"""dgx_nas_suspects and engine_manifest's refusal: a NAS blob a pass found failing its name stays suspect (a
green full verify reads no NAS byte) until a copy from the NAS proves it, and a roll-back never binds it from
the NAS unless told to, with a warning."""
import json
import os

import pytest

import hubgen
from nashub import build_nas
from ansible.module_utils import dgx_mirror, dgx_mirror_plan
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_localtree import LocalTree
from ansible.module_utils.dgx_manifest import build_manifest
from ansible.module_utils.dgx_mirror_request import NotStaged
from ansible.module_utils.dgx_nas_suspects import bound_suspects, remembered, suspect_text, suspects_of
from ansible.module_utils.dgx_progress_file import PassMeter
from modrun import run_main
from test_mirror import (MAIN, PAGE15, corrupt_nas_blob, expect_failure, fresh_nas, local,  # noqa: F401 (fixtures)
                         local_blob, nas_blob_real, selected, stage)
from test_module_docs import check_result


def rotted_nas(nas, local, index=0):
    """Staged and proven, then one NAS blob rots and a sample verify finds it: (shard, etag)."""
    shard = nas.repo()["shards"][index]
    etag = selected(nas)[shard]["etag"]
    stage(nas, local, ignore_patterns=PAGE15, verify="full")
    corrupt_nas_blob(nas, etag)
    expect_failure(nas, local, ignore_patterns=PAGE15, verify="sample")
    return shard, etag


def folder(nas):
    return nas.repo()["folder"]


def restore_nas_blob(nas, etag):
    """The storage team re-downloads the blob: the right bytes, a new ctime."""
    real = nas_blob_real(nas, etag)
    nas.thaw()
    hubgen.flip_byte(real, os.stat(real).st_size // 2)
    nas.freeze()


def manifest_args(nas, local, **kwargs):
    return dict({"hub_local_root": str(local), "hub_nas_root": nas["hub"],
                 "repos": [{"repo_id": MAIN, "ignore_patterns": PAGE15}], "bind_from": "nas"}, **kwargs)


def test_a_found_blob_stays_suspect_through_a_full_verify_until_a_copy_from_the_nas_proves_it(fresh_nas, local):
    nas = fresh_nas
    shard, etag = rotted_nas(nas, local)
    suspects, problem = suspects_of(str(local), folder(nas))
    assert problem is None and list(suspects) == [etag] and suspects[etag]["paths"] == [shard]
    st = os.stat(nas_blob_real(nas, etag))
    assert suspects[etag]["identity"][:3] == [st.st_dev, st.st_ino, st.st_size]
    stage(nas, local, ignore_patterns=PAGE15, verify="full")        # green: it reads no NAS byte
    assert list(suspects_of(str(local), folder(nas))[0]) == [etag]
    restore_nas_blob(nas, etag)
    os.unlink(local_blob(nas, local, etag))                          # the next stage copies it from the NAS
    stage(nas, local, ignore_patterns=PAGE15)
    assert suspects_of(str(local), folder(nas)) == ({}, None)


def test_a_roll_back_refuses_a_suspect_it_would_bind_and_names_file_blob_and_fix(fresh_nas, local):
    nas = fresh_nas
    shard, etag = rotted_nas(nas, local)
    args = manifest_args(nas, local)
    result = check_result("engine_manifest", args, run_main("engine_manifest", args), expect_failure=True)
    [found] = result["nas_corrupt"]
    assert (found["path"], found["blob"]) == (shard, etag) and "unchanged since" in found["why"]
    assert shard in result["msg"] and etag in result["msg"] and "Nothing was written or stopped" in result["msg"]
    assert "`dgx-stage serve -e engine_bind_from=nas -e engine_allow_corrupt_nas=true`" in result["msg"]
    # Told to, it binds them, returns them for the host report and warns in the words of suspect_text.
    args["allow_corrupt_nas"] = True
    result = check_result("engine_manifest", args, run_main("engine_manifest", args))
    assert [f["blob"] for f in result["nas_corrupt"]] == [etag]
    warning = suspect_text(result["nas_corrupt"], True, "nas")
    assert warning.startswith("engine_allow_corrupt_nas is set: binding from the NAS 1 file(s)") and etag in warning


def test_binding_from_the_local_disk_a_suspect_with_no_local_copy_asks_for_a_stage_never_a_roll_back(fresh_nas,
                                                                                                       local):
    # A roll-back (engine_bind_from=nas) would bind every file from the NAS that holds the wrong bytes.
    nas = fresh_nas
    shard, etag = rotted_nas(nas, local)
    os.unlink(local_blob(nas, local, etag))
    args = manifest_args(nas, local, bind_from="local")
    result = check_result("engine_manifest", args, run_main("engine_manifest", args), expect_failure=True)
    assert [(f["path"], f["blob"]) for f in result["nas_corrupt"]] == [(shard, etag)]
    assert "engine_bind_from=nas" not in result["msg"], result["msg"]
    assert "re-download them on the NAS, then `dgx-stage stage` copies them" in result["msg"]
    assert "to bind them anyway: `dgx-stage serve -e engine_allow_corrupt_nas=true`" in result["msg"]


@pytest.mark.parametrize("stop", ["space", "not staged"])
@pytest.mark.parametrize("rot", ["truncated", "flipped"])
def test_a_suspect_planning_found_is_kept_when_the_run_stops_before_writing(fresh_nas, local, monkeypatch, rot,
                                                                            stop):
    """A plan finds the NAS blob rotten, then the run stops before writing: no room (check_space), or a file gone
    while the others were proven (the second not-staged refusal). A NAS blob of the wrong size is found by the
    quick plan before the lock (verify none), one of the right size only by the locked plan's sample check."""
    nas = fresh_nas
    shard = nas.repo()["shards"][0]
    etag = selected(nas)[shard]["etag"]
    stage(nas, local, ignore_patterns=PAGE15, verify="full")
    if rot == "truncated":
        real = nas_blob_real(nas, etag)
        nas.thaw()
        os.truncate(real, os.path.getsize(real) - 100)
        nas.freeze()
    else:
        corrupt_nas_blob(nas, etag)
    plans = []

    def plan_mirror(req, *args, **kwargs):
        plans.append(req.verify)
        return real_plan_mirror(req, *args, **kwargs)
    real_plan_mirror = dgx_mirror.plan_mirror
    monkeypatch.setattr(dgx_mirror, "plan_mirror", plan_mirror)
    if stop == "space":
        def check_space(plan, req):
            if plan.nas_corrupt:              # after a plan found it
                raise StageError("no room for it (a test)")
            return real_check_space(plan, req)
        real_check_space = dgx_mirror.check_space
        monkeypatch.setattr(dgx_mirror, "check_space", check_space)
    else:
        def refuse_not_staged(plan, req):
            if plan.nas_corrupt:              # after a plan's checks found it
                raise NotStaged("a file went (a test)", plan, [shard])
        monkeypatch.setattr(dgx_mirror_plan, "refuse_not_staged", refuse_not_staged)
    with pytest.raises(StageError):
        stage(nas, local, ignore_patterns=PAGE15, verify="sample", copy_missing=stop == "space",
              phase="stage" if stop == "space" else "verify")
    assert plans == (["none"] if rot == "truncated" else ["none", "sample"])
    suspects, problem = suspects_of(str(local), folder(nas))
    assert problem is None and list(suspects) == [etag] and suspects[etag]["paths"] == [shard]
    assert ("its NAS size" in suspects[etag]["why"]) == (rot == "truncated")


def test_binding_the_good_local_copy_is_no_refusal(fresh_nas, local):
    nas = fresh_nas
    rotted_nas(nas, local)
    args = manifest_args(nas, local, bind_from="local")
    assert check_result("engine_manifest", args, run_main("engine_manifest", args))["nas_corrupt"] == []


def test_a_nas_file_changed_since_is_hashed_again_bound_when_right_refused_when_still_wrong(fresh_nas, local):
    nas = fresh_nas
    shard, etag = rotted_nas(nas, local)
    real = nas_blob_real(nas, etag)
    nas.thaw()
    hubgen.flip_byte(real, 0)                    # changed, and still wrong
    nas.freeze()
    manifest = build_manifest(str(local), nas["hub"], [{"repo_id": MAIN}], bind_from="nas")[0]
    [found] = bound_suspects(manifest, str(local))
    assert "changed since it was found corrupt, and its bytes still hash to" in found["why"]
    nas.thaw()
    hubgen.flip_byte(real, 0)
    nas.freeze()
    restore_nas_blob(nas, etag)                  # right again
    assert bound_suspects(manifest, str(local)) == []


def test_a_suspect_in_a_store_named_by_another_hash_stays_suspect_until_the_nas_file_changes(tmp_path, local):
    # The newer hub store names its files by another hash: the file found corrupt is known by its identity.
    nas = build_nas(tmp_path / "nas", hf_native=True)
    files = selected(nas)
    index = next(i for i, s in enumerate(nas.repo()["shards"]) if files[s]["store_path"])
    shard, etag = rotted_nas(nas, local, index)
    assert os.path.basename(nas_blob_real(nas, etag)) != etag
    args = manifest_args(nas, local)
    result = check_result("engine_manifest", args, run_main("engine_manifest", args), expect_failure=True)
    [found] = result["nas_corrupt"]
    assert (found["path"], found["blob"]) == (shard, etag) and "unchanged since" in found["why"]
    restore_nas_blob(nas, etag)
    assert check_result("engine_manifest", args, run_main("engine_manifest", args))["nas_corrupt"] == []
    nas.thaw()


def test_a_suspect_recorded_without_st_dev_is_hashed_before_it_is_bound(fresh_nas, local):
    # Its four numbers match no file: only the NAS file's bytes can clear it.
    nas = fresh_nas
    shard, etag = rotted_nas(nas, local)
    progress = os.path.join(str(local), ".locks", folder(nas), "dgx-stage.progress.json")
    with open(progress) as handle:
        document = json.load(handle)
    document["nas_corrupt"][etag]["identity"] = document["nas_corrupt"][etag]["identity"][1:]
    with open(progress, "w") as handle:
        json.dump(document, handle)
    manifest = build_manifest(str(local), nas["hub"], [{"repo_id": MAIN}], bind_from="nas")[0]
    [found] = bound_suspects(manifest, str(local))
    assert found["path"] == shard and "its bytes still hash to" in found["why"]
    restore_nas_blob(nas, etag)
    assert bound_suspects(manifest, str(local)) == []


def suspect_hub(tmp_path, entry, blob="a" * 64):
    """A local hub whose record holds one suspect `entry` for `blob`, and a manifest binding the NAS snapshot
    path a.safetensors, which links to the NAS's blobs/<b...> (another blob): (hub, manifest, NAS file)."""
    repo = tmp_path / "nas" / "hub" / "models--org--m"
    snap = repo / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / ("b" * 64)).write_bytes(b"x")
    nas_file = snap / "a.safetensors"
    nas_file.symlink_to("../../blobs/" + "b" * 64)
    hub = tmp_path / "local"
    lock = hub / ".locks" / "models--org--m"
    lock.mkdir(parents=True)
    (lock / "dgx-stage.progress.json").write_text(json.dumps({"nas_corrupt": {blob: entry}}))
    manifest = {"repos": [{"repo_id": "org/m", "folder": "models--org--m", "target": "/hub/s",
                           "nas_snapshot": str(snap)}],
                "mounts": [{"target": "/hub/s/a.safetensors", "source": str(nas_file), "origin": "nas"}]}
    return str(hub), manifest, nas_file


def test_a_snapshot_path_that_names_another_blob_now_is_not_the_suspect(tmp_path):
    hub, manifest, _nas_file = suspect_hub(tmp_path, {"paths": ["a.safetensors"], "identity": None})
    assert bound_suspects(manifest, hub) == []


A_PATH = ["a.safetensors"]


@pytest.mark.parametrize("blob, entry", [
    ("a" * 64, {"paths": "a.safetensors"}), ("a" * 64, {"paths": 5}), ("a" * 64, {"paths": [5]}),
    ("a" * 64, {"paths": [None]}), ("a" * 64, {"paths": []}), ("a" * 64, {"why": "no paths"}),
    ("a" * 64, {"paths": ["../a.safetensors"]}), ("a" * 64, {"paths": ["/a.safetensors"]}),
    ("a" * 64, {"paths": A_PATH, "identity": "abc"}), ("a" * 64, {"paths": A_PATH, "identity": [True]}),
    ("a" * 64, {"paths": A_PATH, "nas_source": 5}), ("a" * 64, {"paths": A_PATH, "found_at": []}),
    ("a" * 64, {"paths": A_PATH, "why": {}}), ("a" * 64, "a.safetensors"), ("not-a-blob", {"paths": A_PATH})],
    ids=["paths-str", "paths-int", "paths-of-int", "paths-of-null", "paths-empty", "no-paths", "paths-up",
         "paths-absolute", "identity-str", "identity-of-bool", "nas-source-int", "found-at-list", "why-mapping",
         "entry-str", "key-not-a-blob"])
def test_a_suspect_entry_of_another_shape_leaves_the_record_unreadable_to_manifest_and_pass(tmp_path, blob, entry):
    # Which NAS files it means cannot be known: ignoring it could bind a corrupt blob, writing it back keeps it.
    hub, manifest, _nas_file = suspect_hub(tmp_path, entry, blob)
    progress = os.path.join(hub, ".locks", "models--org--m", "dgx-stage.progress.json")
    suspects, problem = suspects_of(hub, "models--org--m")
    assert suspects == {} and progress in problem and "its nas_corrupt entry %r" % blob in problem
    [found] = bound_suspects(manifest, hub)
    assert found["path"] is None and progress in found["why"]
    before = os.lstat(progress)
    with LocalTree(hub).open_dir(".locks/models--org--m") as lock_dir:
        with pytest.raises(StageError) as refused:
            PassMeter("stage", "org/m", "none").attach(lock_dir)
    assert progress in str(refused.value) and "nothing was written" in str(refused.value)
    after = os.lstat(progress)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("plant, words", [
    ("link", "is a symlink"), ("fifo", "is not a regular file"), ("garbage", "is not JSON"),
    ("not-a-mapping", "is not a mapping of blobs")])
def test_a_record_that_cannot_be_read_refuses_rather_than_binding_blind(tmp_path, plant, words):
    lock = tmp_path / ".locks" / "models--org--m"
    lock.mkdir(parents=True)
    progress = lock / "dgx-stage.progress.json"
    if plant == "link":
        os.rmdir(str(lock))
        (tmp_path / "elsewhere").mkdir()
        lock.symlink_to(tmp_path / "elsewhere")
    elif plant == "fifo":
        os.mkfifo(str(progress))                 # must not block
    else:
        progress.write_text("{" if plant == "garbage" else '{"nas_corrupt": []}')
    suspects, problem = suspects_of(str(tmp_path), "models--org--m")
    assert suspects == {} and words in problem
    manifest = {"repos": [{"repo_id": "org/m", "folder": "models--org--m", "target": "/hub/s", "nas_snapshot": "/n"}],
                "mounts": []}
    [found] = bound_suspects(manifest, str(tmp_path))
    assert found["path"] is None and words in found["why"]
    # No count of files it cannot know, and the way out names the record.
    for bind_from in ("nas", "local"):
        refusal = suspect_text([found], False, bind_from)
        assert "file(s)" not in refusal and "which files there hold wrong bytes is not known" in refusal
        assert "Inspect that record" in refusal and "re-download" not in refusal
        assert "file(s)" not in suspect_text([found], True, bind_from)


def test_no_record_no_local_hub_is_no_suspect(tmp_path):
    assert suspects_of(str(tmp_path / "swapped-disk"), "models--org--m") == ({}, None)
    assert suspects_of(str(tmp_path), "../escape")[1]


def test_remembered_drops_what_was_proven_and_keeps_the_latest_finding():
    previous = {"a" * 64: {"paths": ["x"]}, "b" * 64: {"paths": ["y"]}}
    found = [{"blob": "c" * 64, "paths": ["z"], "nas_source": None, "why": "its bytes hash to d"}]
    kept = remembered(previous, found, ["a" * 64], "2026-12-01T00:00:00Z")
    assert sorted(kept) == ["b" * 64, "c" * 64]
    assert kept["c" * 64] == {"paths": ["z"], "nas_source": None, "identity": None,
                              "found_at": "2026-12-01T00:00:00Z", "why": "its bytes hash to d"}
