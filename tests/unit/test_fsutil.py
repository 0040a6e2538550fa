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


def test_walk_tree_yields_nothing_for_a_missing_top_and_refuses_a_folder_it_cannot_list(shared_dir):
    assert list(dgx_fsutil.walk_tree(str(shared_dir / "missing"))) == []
    (shared_dir / "top" / "closed").mkdir(parents=True)
    (shared_dir / "top" / "closed" / "weights.bin").write_bytes(b"x")
    os.chown(str(shared_dir / "top"), 65534, 65534)
    os.chown(str(shared_dir / "top" / "closed"), 65534, 65534)
    os.chmod(str(shared_dir / "top" / "closed"), 0)

    def walk():
        with pytest.raises(dgx_fsutil.StageError) as refused:
            list(dgx_fsutil.walk_tree(str(shared_dir / "top")))
        assert "cannot list %s: Permission denied (EACCES)" % (shared_dir / "top" / "closed") in str(refused.value)

    assert run_as_nobody(walk) == 0
    os.chmod(str(shared_dir / "top" / "closed"), 0o755)


def test_a_folder_swapped_for_a_link_while_a_tree_is_removed_changes_nothing_the_link_points_to(
        tmp_path, monkeypatch):
    """Between listing a read-only folder and giving it u+rwx, another process puts a link to a file outside in
    its place: the mode change reaches the folder that was listed or nothing, never the file."""
    root = tmp_path / "receipts" / "ds41-combined-ready"
    (root / "kv").mkdir(parents=True)
    (root / "kv" / "r.json").write_text("{}")
    os.chmod(str(root / "kv"), 0o555)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not a receipt")
    os.chmod(str(outside), 0o644)
    real_scandir = os.scandir

    class Listed(object):
        def __init__(self, entries):
            self.entries = entries

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *_exc_info):
            return False

    def scandir_then_swap(fd):
        with real_scandir(fd) as listing:
            entries = list(listing)
        for entry in entries:
            entry.stat(follow_symlinks=False)   # what the removal saw
        if [e.name for e in entries] == ["kv"]:
            shutil.move(str(root / "kv"), str(tmp_path / "kv-moved"))
            os.symlink(str(outside), str(root / "kv"))
        return Listed(entries)

    monkeypatch.setattr(dgx_fsutil.os, "scandir", scandir_then_swap)
    with pytest.raises(dgx_fsutil.StageError) as refused:
        remove_path(str(root))
    monkeypatch.undo()
    assert "%s was replaced while it was being removed" % (root / "kv") in str(refused.value)
    assert stat.S_IMODE(os.stat(str(outside)).st_mode) == 0o644 and outside.read_bytes() == b"not a receipt"
    assert os.path.islink(str(root / "kv"))


def _deep_tree(top, depth):
    """top/d/d/.../d (depth levels) with a file at the bottom, made through handles: its path is longer
    than PATH_MAX, as a tree written by a runaway process can be."""
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _level in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("receipt.json", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)


def test_a_tree_deeper_than_the_recursion_and_fd_limits_is_removed(tmp_path):
    """300 levels against a recursion limit of 200 and 64 open files: a walk that recursed, or held a
    handle per level, fails here."""
    import resource
    import sys

    top = str(tmp_path / "ds41-combined-ready")
    _deep_tree(top, 300)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    depth = sys.getrecursionlimit()
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    sys.setrecursionlimit(200)
    try:
        assert remove_path(top) is True
    finally:
        sys.setrecursionlimit(depth)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert os.listdir(str(tmp_path)) == []


def test_a_folder_moved_out_while_its_tree_is_removed_is_not_removed_where_it_went(tmp_path, monkeypatch):
    """The walk climbs back through "..": a folder moved elsewhere mid-walk is detected there, and the
    folder that now holds it (outside) loses nothing of its own."""
    root = tmp_path / "receipts" / "ds41-combined-ready"
    (root / "kv" / "rank-0").mkdir(parents=True)
    (root / "kv" / "rank-0" / "r.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not a receipt")
    real_scandir = os.scandir

    def scandir_then_move(fd):
        listing = real_scandir(fd)
        if os.path.exists(str(root / "kv" / "rank-0" / "r.json")) and \
                os.path.samestat(os.fstat(fd), os.stat(str(root / "kv" / "rank-0"))):
            shutil.move(str(root / "kv"), str(elsewhere / "kv"))
        return listing

    monkeypatch.setattr(dgx_fsutil.os, "scandir", scandir_then_move)
    with pytest.raises(dgx_fsutil.StageError) as refused:
        remove_path(str(root))
    monkeypatch.undo()
    assert "%s was moved while it was being removed" % (root / "kv") in str(refused.value)
    assert sorted(os.listdir(str(elsewhere))) == ["keep.txt", "kv"]
    assert os.path.isdir(str(root))


def test_the_empty_folder_sweep_keeps_folders_holding_files_and_removes_deep_empty_ones(tmp_path):
    (tmp_path / "snap" / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "snap" / "keep" / "empty").mkdir(parents=True)
    (tmp_path / "snap" / "keep" / "config.json").write_text("{}")
    fd = os.open(str(tmp_path / "snap"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        dgx_fsutil.remove_empty_dirs(fd, str(tmp_path / "snap"))
    finally:
        os.close(fd)
    assert sorted(os.listdir(str(tmp_path / "snap"))) == ["keep"]
    assert os.listdir(str(tmp_path / "snap" / "keep")) == ["config.json"]


def test_walk_tree_walks_deeper_than_the_recursion_limit(tmp_path):
    import sys

    top = str(tmp_path / "snapshot")
    _deep_tree(top, 300)
    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        walked = list(dgx_fsutil.walk_tree(top))
    finally:
        sys.setrecursionlimit(depth)
    assert len(walked) == 301 and walked[-1][1] == "d/" * 300 + "receipt.json" and walked[-1][2] is False


def test_a_mount_inside_a_tree_keeps_its_mode_and_its_handle_is_closed(tmp_path):
    """The refusal comes before any mode change (a read-only folder mounted there stays read-only), and no
    handle of the mount is left open (it would keep the mount busy)."""
    from mountns import bind_mount, in_private_mount_namespace

    root = tmp_path / "receipts" / "ds41-display-kv"
    (root / "inner").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not a receipt")
    os.chmod(str(outside), 0o555)

    def remove_around_the_mount():
        bind_mount(outside, root / "inner")
        open_before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(dgx_fsutil.StageError) as refused:
            remove_path(str(root))
        assert "%s is a mount point" % (root / "inner") in str(refused.value)
        assert set(os.listdir("/proc/self/fd")) <= open_before | {"3"}
        assert stat.S_IMODE(os.stat(str(root / "inner")).st_mode) == 0o555
        assert remove_path(str(root), around_mounts=True) == [(str(root / "inner"), refused.value.args[0])]

    assert in_private_mount_namespace(remove_around_the_mount) == 0
    assert stat.S_IMODE(os.stat(str(outside)).st_mode) == 0o555
    assert (outside / "keep.txt").read_text() == "not a receipt"
    os.chmod(str(outside), 0o755)


def test_the_mount_table_keeps_a_mount_point_whose_name_is_not_utf8(tmp_path):
    from mountns import bind_mount, in_private_mount_namespace
    from ansible.module_utils import dgx_mounts

    odd = os.path.join(os.fsencode(str(tmp_path)), b"odd\xff-name")
    os.mkdir(odd)

    def read_with_the_odd_mount():
        bind_mount(str(tmp_path), os.fsdecode(odd))
        assert os.fsdecode(odd) in dgx_mounts.mount_points()

    assert in_private_mount_namespace(read_with_the_odd_mount) == 0


def test_read_small_reads_only_a_regular_file_up_to_its_limit(tmp_path):
    (tmp_path / "file").write_bytes(b"0123456789")
    os.symlink("file", str(tmp_path / "link"))
    os.mkfifo(str(tmp_path / "fifo"))
    assert dgx_fsutil.read_small(str(tmp_path / "file"), 4) == b"0123"
    dir_fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        assert dgx_fsutil.read_small("file", 100, dir_fd=dir_fd) == b"0123456789"
    finally:
        os.close(dir_fd)
    assert dgx_fsutil.read_small(str(tmp_path / "link"), 100) is None
    assert dgx_fsutil.read_small(str(tmp_path / "fifo"), 100) is None
    assert dgx_fsutil.read_small(str(tmp_path / "missing"), 100) is None
