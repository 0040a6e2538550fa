"""dgx_fsutil: atomic writes and tree removal that copes with read-only entries."""
import os
import shutil
import stat

import pytest

from ansible.module_utils import dgx_fsutil
from ansible.module_utils.dgx_fsutil import atomic_write_bytes, remove_path
from privilege import nobody_owned_dir, run_as_nobody

@pytest.fixture
def shared_dir(tmp_path):
    yield from nobody_owned_dir(tmp_path, "dgx-fsutil-")


def test_atomic_write_creates_file_with_content_and_mode(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_bytes(str(target), b"hello", mode=0o600)
    assert target.read_bytes() == b"hello"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_atomic_write_default_mode_is_0644(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_bytes(str(target), b"x")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "out.json"
    target.write_bytes(b"old")
    atomic_write_bytes(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_atomic_write_failure_keeps_old_file_and_cleans_temp(tmp_path, monkeypatch):
    target = tmp_path / "out.json"
    target.write_bytes(b"old")

    def broken_replace(src, dst, **_dir_fds):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(dgx_fsutil.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_bytes(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_atomic_write_fsyncs_file_and_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(dgx_fsutil.os, "fsync", recording_fsync)
    atomic_write_bytes(str(tmp_path / "out"), b"data")
    assert synced == [False, True]


def test_remove_path_missing_returns_false(tmp_path):
    assert remove_path(str(tmp_path / "nope")) is False


def test_remove_path_symlink_leaves_target(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    (target / "keep").write_text("k")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert remove_path(str(link)) is True
    assert not os.path.lexists(str(link))
    assert (target / "keep").read_text() == "k"


def test_remove_path_tree_does_not_chmod_through_inner_symlinks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o555)
    os.chmod(str(outside), 0o555)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "to-outside").symlink_to(outside)
    remove_path(str(tree))
    assert not tree.exists()
    assert outside.is_dir()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o555


def _read_only_tree(base):
    root = os.path.join(str(base), "receipt")
    os.makedirs(os.path.join(root, "sub", "deeper"))
    for path in (os.path.join(root, "worker.json"), os.path.join(root, "sub", "deeper", "r.json")):
        with open(path, "w") as handle:
            handle.write("{}")
        os.chmod(path, 0o444)
    os.chmod(os.path.join(root, "sub", "deeper"), 0o555)
    os.chmod(os.path.join(root, "sub"), 0o000)  # unreadable too
    os.chmod(root, 0o555)
    return root


def test_remove_path_removes_read_only_tree_as_its_owner(shared_dir):
    if os.geteuid() == 0:
        assert run_as_nobody(lambda: remove_path(_read_only_tree(shared_dir))) == 0
    else:
        remove_path(_read_only_tree(shared_dir))
    assert os.listdir(str(shared_dir)) == []


def test_plain_rmtree_fails_on_the_same_tree_without_privilege(shared_dir):
    """Guards the test above: without the chmod pass an unprivileged owner cannot remove it."""
    if os.geteuid() != 0:
        root = _read_only_tree(shared_dir)
        with pytest.raises(OSError):
            shutil.rmtree(root)
        return
    rc = run_as_nobody(lambda: shutil.rmtree(_read_only_tree(shared_dir)))
    assert rc != 0
