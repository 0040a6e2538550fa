"""Atomic placement, debris and locking."""
import hashlib
import os
import threading

import pytest

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_hashing as hs
from ansible.module_utils import dgx_transfer as tr


def test_copy_atomic_kernel_path(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    dst = tmp_path / "dst"
    seen = []
    assert tr.copy_atomic(str(src), str(dst), src.stat().st_size, progress=seen.append) == src.stat().st_size
    assert dst.read_bytes() == src.read_bytes()
    assert sum(seen) == src.stat().st_size
    assert oct(dst.stat().st_mode & 0o777) == "0o644"
    assert tr.find_temp_debris(str(tmp_path)) == []


def test_copy_atomic_hash_mismatch_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"corrupt on the NAS")
    dst = tmp_path / "dst"
    hasher = hs.NameHasher(hashlib.sha256(b"the real content").hexdigest(), src.stat().st_size)
    with pytest.raises(StageError, match="does not hash to its own name"):
        tr.copy_atomic(str(src), str(dst), src.stat().st_size, hasher=hasher)
    assert not dst.exists()
    assert tr.find_temp_debris(str(tmp_path)) == []


def test_copy_atomic_failing_check_keeps_old_file(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"new")
    dst = tmp_path / "dst"
    dst.write_bytes(b"old")
    with pytest.raises(StageError, match="reads back"):
        tr.copy_atomic(str(src), str(dst), 3, check=lambda temp: "reads back different")
    assert dst.read_bytes() == b"old"
    assert tr.find_temp_debris(str(tmp_path)) == []


def test_copy_atomic_replaces_hardlink_without_writing_through(tmp_path):
    other = tmp_path / "other-shard"
    other.write_bytes(b"B" * 100)
    dst = tmp_path / "blob"
    os.link(str(other), str(dst))
    src = tmp_path / "src"
    src.write_bytes(b"A" * 100)
    tr.copy_atomic(str(src), str(dst), 100)
    assert dst.read_bytes() == b"A" * 100
    assert other.read_bytes() == b"B" * 100


def test_copy_atomic_refuses_short_source(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"12345")
    with pytest.raises(StageError, match="changed while it was copied"):
        tr.copy_atomic(str(src), str(tmp_path / "dst"), 10)
    assert not (tmp_path / "dst").exists()


def test_symlink_atomic_replaces_file_and_link(tmp_path):
    path = tmp_path / "entry"
    path.write_bytes(b"copied content instead of a link")
    tr.symlink_atomic("../../blobs/x", str(path))
    assert os.readlink(str(path)) == "../../blobs/x"
    tr.symlink_atomic("../../blobs/y", str(path))
    assert os.readlink(str(path)) == "../../blobs/y"


def test_debris_is_recognised(tmp_path):
    temp = tr.temp_path_for(str(tmp_path / "blob"))
    open(temp, "w").close()
    (tmp_path / "blob").write_text("x")
    assert tr.find_temp_debris(str(tmp_path)) == [temp]


def test_repo_lock_excludes_a_second_holder(tmp_path):
    path = str(tmp_path / "locks" / "repo.lock")
    with tr.RepoLock(path, timeout=5):
        errors = []

        def contender():
            try:
                with tr.RepoLock(path, timeout=0.3):
                    pass
            except StageError as exc:
                errors.append(str(exc))

        thread = threading.Thread(target=contender)
        thread.start()
        thread.join()
        assert errors and "holds" in errors[0] and str(os.getpid()) in errors[0]
    with tr.RepoLock(path, timeout=0):
        pass
