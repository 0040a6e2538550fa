"""Reading a hub cache: repo names, refs, link chains, pattern selection."""
import json
import os

import pytest
from huggingface_hub.utils import filter_repo_objects

import processes
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_hubcache as hc

COMMIT = "a" * 40


def make_repo(hub, files, links=None):
    """files: {snapshot path: bytes} stored as real blobs; links: {path: raw link text} as given."""
    repo = hub / "models--org--name"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, (path, data) in enumerate(sorted(files.items())):
        etag = "%064x" % (i + 1)
        (repo / "blobs" / etag).write_bytes(data)
        target = snap / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(hc.blob_link_target(path, etag))
    for path, text in (links or {}).items():
        target = snap / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(text)
    return repo


def test_repo_folder_name_for_each_type():
    assert hc.repo_folder_name("org/name") == "models--org--name"
    assert hc.repo_folder_name("org/data", "dataset") == "datasets--org--data"
    assert hc.repo_folder_name("solo", "space") == "spaces--solo"


@pytest.mark.parametrize("bad", ["", "../x", "a/../b", "a//b", "a/b/c"])
def test_repo_folder_name_refuses_escaping_ids(bad):
    with pytest.raises(StageError):
        hc.repo_folder_name(bad)


def test_resolve_commit_from_ref_and_hash(tmp_path):
    repo = make_repo(tmp_path, {"a.txt": b"x"})
    assert hc.resolve_commit(str(repo), "main") == COMMIT
    assert hc.resolve_commit(str(repo), COMMIT) == COMMIT


def test_resolve_commit_unknown_revision_lists_what_exists(tmp_path):
    repo = make_repo(tmp_path, {"a.txt": b"x"})
    with pytest.raises(StageError, match=r"unknown revision 'dev'.*refs there: main"):
        hc.resolve_commit(str(repo), "dev")


def test_resolve_commit_ref_without_snapshot(tmp_path):
    repo = make_repo(tmp_path, {"a.txt": b"x"})
    (repo / "refs" / "v2").write_text("b" * 40)
    with pytest.raises(StageError, match="snapshots/bbbb"):
        hc.resolve_commit(str(repo), "v2")


def test_scan_follows_chain_through_hub_level_store(tmp_path):
    hub = tmp_path / "hub"
    repo = make_repo(hub, {"config.json": b"{}"})
    store = hub / "blobs" / "ab"
    store.mkdir(parents=True)
    etag = "ab" + "c" * 62
    (store / etag).write_bytes(b"weights")
    (repo / "blobs" / etag).symlink_to("../../blobs/ab/" + etag)
    (repo / "snapshots" / COMMIT / "w.safetensors").symlink_to("../../blobs/" + etag)
    entries = {e.path: e for e in hc.scan_snapshot(str(repo), COMMIT, str(hub))}
    assert entries["w.safetensors"].etag == etag
    assert entries["w.safetensors"].source == str(store / etag)
    assert entries["w.safetensors"].size == 7


def test_scan_reports_real_files_inside_snapshot(tmp_path):
    repo = make_repo(tmp_path, {"config.json": b"{}"})
    page = repo / "snapshots" / COMMIT / "page15" / "a"
    page.mkdir(parents=True)
    (page / "x.bin").write_bytes(b"123")
    entries = {e.path: e for e in hc.scan_snapshot(str(repo), COMMIT, str(tmp_path))}
    assert entries["page15/a/x.bin"].kind == "real"
    assert entries["page15/a/x.bin"].etag is None
    assert entries["config.json"].kind == "link"


def test_scan_refuses_dangling_link_and_names_it(tmp_path):
    repo = make_repo(tmp_path, {"a.txt": b"x"}, links={"gone.bin": "../../blobs/" + "f" * 64})
    with pytest.raises(StageError, match=r"gone\.bin is a dangling link"):
        hc.scan_snapshot(str(repo), COMMIT, str(tmp_path))


def test_scan_refuses_link_escaping_hub_root(tmp_path):
    hub = tmp_path / "hub"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    repo = make_repo(hub, {"a.txt": b"x"})
    (repo / "blobs" / ("e" * 64)).symlink_to(str(outside))
    (repo / "snapshots" / COMMIT / "esc.bin").symlink_to("../../blobs/" + "e" * 64)
    with pytest.raises(StageError, match=r"esc\.bin resolves to .*outside the source hub root"):
        hc.scan_snapshot(str(repo), COMMIT, str(hub))


def test_scan_refuses_link_loop(tmp_path):
    repo = make_repo(tmp_path, {"a.txt": b"x"})
    (repo / "blobs" / ("1" * 64)).symlink_to("1" * 64)
    (repo / "snapshots" / COMMIT / "loop.bin").symlink_to("../../blobs/" + "1" * 64)
    with pytest.raises(StageError, match=r"loop\.bin"):
        hc.scan_snapshot(str(repo), COMMIT, str(tmp_path))


PATHS = ["config.json", "model-00001.safetensors", "page15/a/x.bin", "page15/b/y.bin", "sub/page15.txt",
         "tokenizer.json", "Page15/z.bin"]


@pytest.mark.parametrize("allow,ignore", [
    (None, None), (None, ["page15/"]), (["*.safetensors", "*.json"], None), (["page15/"], ["*y.bin"]),
    (["*.json"], ["tok*"]), (["page15/a"], None), (["nothing*"], None),
])
def test_pattern_selection_matches_huggingface_hub(allow, ignore):
    expected = list(filter_repo_objects(PATHS, allow_patterns=allow, ignore_patterns=ignore))
    assert [p for p in PATHS if hc.path_selected(p, allow, ignore)] == expected


def test_unmatched_patterns_names_the_typo():
    assert hc.unmatched_patterns(PATHS, ["*.json", "*.safetensor"]) == ["*.safetensor"]


def test_blob_link_target_adds_one_level_per_subdir():
    assert hc.blob_link_target("config.json", "abc") == "../../blobs/abc"
    assert hc.blob_link_target("a/b/c.bin", "abc") == "../../../../blobs/abc"


def test_tree_listing_keeps_only_staged_paths(tmp_path):
    listing = {"format_version": 1, "files": {"a": {"size": 1, "blob_id": "x"}, "b": {"size": 2, "blob_id": "y"}}}
    data = json.loads(hc.tree_listing_for(listing, ["a"]))
    assert data == {"format_version": 1, "files": {"a": {"size": 1, "blob_id": "x"}}}


def test_read_tree_listing_rejects_garbage(tmp_path):
    repo = make_repo(tmp_path, {"a.txt": b"x"})
    (repo / "trees").mkdir()
    (repo / "trees" / (COMMIT + ".json")).write_text("{not json")
    with pytest.raises(StageError, match="not a valid tree listing"):
        hc.read_tree_listing(str(repo), COMMIT)
    assert hc.read_tree_listing(str(repo), "b" * 40) is None


def test_a_ref_swapped_for_a_fifo_after_its_check_fails_instead_of_hanging(tmp_path, monkeypatch):
    """list_refs looks at each ref before it reads it; a FIFO put there in between must not block the run
    (the mirror reads refs while it holds the repo lock)."""
    refs = tmp_path / "repo" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    real_lstat = os.lstat

    def lstat_then_swap(path, *args, **kwargs):
        st = real_lstat(path, *args, **kwargs)
        if str(path) == str(refs / "main") and not os.path.exists(str(refs / "swapped")):
            (refs / "swapped").write_text("")
            os.unlink(str(refs / "main"))
            os.mkfifo(str(refs / "main"))
        return st

    monkeypatch.setattr(hc.os, "lstat", lstat_then_swap)
    with processes.fails_if_blocked(5, "list_refs blocked on a FIFO"):
        with pytest.raises(OSError) as failed:
            hc.list_refs(str(tmp_path / "repo"))
    assert "not a regular file" in str(failed.value)
