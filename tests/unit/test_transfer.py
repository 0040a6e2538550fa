"""Atomic, name-checked placement inside the local tree, debris and locking."""
import errno
import hashlib
import json
import os
import re
import signal
import threading
import traceback
import time

import pytest

from fakeclock import FakeClock
from treestate import workers_still_running

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_copy, dgx_fsutil, dgx_hashing, dgx_localtree, dgx_progress_file, dgx_repolock, dgx_workers
from ansible.module_utils.dgx_mounts import mount_point_problem
from ansible.module_utils.dgx_fsutil import NAME_MAX, is_temp_name, temp_name_for
from ansible.module_utils.dgx_hashing import READ_CHUNK


def sha256_name(data):
    return hashlib.sha256(data).hexdigest()


def git_name(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def open_tmp(tmp_path, rel="."):
    return dgx_localtree.LocalTree(str(tmp_path)).open_dir(rel, create=True)


def test_copy_verified_hashes_and_writes_from_one_read(tmp_path, monkeypatch):
    data = os.urandom(3 * READ_CHUNK // 2 + 7)
    src = tmp_path / "src"
    src.write_bytes(data)
    reads = []
    real_readv = os.readv
    monkeypatch.setattr(dgx_copy.os, "readv", lambda fd, bufs: reads.append(fd) or real_readv(fd, bufs))
    seen = []
    with open_tmp(tmp_path, "blobs") as blobs:
        name = sha256_name(data)
        assert dgx_copy.copy_verified(str(src), blobs, name, len(data), blob_name=name, progress=seen.append) == len(data)
    dst = tmp_path / "blobs" / name
    assert dst.read_bytes() == data
    assert sum(seen) == len(data)
    assert len(reads) == 3          # two chunks and the end of file: the source is read once
    assert oct(dst.stat().st_mode & 0o777) == "0o644"
    assert dgx_localtree.find_temp_debris(str(tmp_path)) == []


@pytest.mark.parametrize("namer", [sha256_name, git_name], ids=["sha256", "git-sha1"])
def test_copy_verified_refuses_bytes_that_do_not_hash_to_the_name(tmp_path, namer):
    src = tmp_path / "src"
    src.write_bytes(b"corrupt on the NAS")
    name = namer(b"the real content!!")   # same size, other bytes
    with open_tmp(tmp_path, "blobs") as blobs:
        with pytest.raises(dgx_copy.SourceProblem, match="does not hash to its own name") as err:
            dgx_copy.copy_verified(str(src), blobs, name, src.stat().st_size, blob_name=name)
    assert err.value.got == namer(b"corrupt on the NAS") and err.value.blob_name == name
    assert os.listdir(str(tmp_path / "blobs")) == []


def test_copy_verified_keeps_the_old_file_when_the_new_bytes_fail(tmp_path):
    good = b"good local copy"
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / sha256_name(good)).write_bytes(good)
    src = tmp_path / "src"
    src.write_bytes(b"bad nas content")
    with open_tmp(tmp_path, "blobs") as blobs:
        with pytest.raises(dgx_copy.SourceProblem):
            dgx_copy.copy_verified(str(src), blobs, sha256_name(good), len(good), blob_name=sha256_name(good))
    assert (tmp_path / "blobs" / sha256_name(good)).read_bytes() == good
    assert dgx_localtree.find_temp_debris(str(tmp_path)) == []


def test_copy_verified_replaces_hardlink_without_writing_through(tmp_path):
    other = tmp_path / "other-shard"
    other.write_bytes(b"B" * 100)
    os.link(str(other), str(tmp_path / "blob"))
    src = tmp_path / "src"
    src.write_bytes(b"A" * 100)
    with open_tmp(tmp_path) as top:
        dgx_copy.copy_verified(str(src), top, "blob", 100, blob_name=sha256_name(b"A" * 100))
    assert (tmp_path / "blob").read_bytes() == b"A" * 100
    assert other.read_bytes() == b"B" * 100


def test_copy_verified_refuses_short_source(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"12345")
    with open_tmp(tmp_path) as top:
        with pytest.raises(dgx_copy.SourceProblem, match="changed while it was copied"):
            dgx_copy.copy_verified(str(src), top, "dst", 10)
    assert not (tmp_path / "dst").exists()
    assert dgx_localtree.find_temp_debris(str(tmp_path)) == []


def test_copy_verified_refuses_a_source_rewritten_during_the_copy(tmp_path):
    # a real file inside a snapshot has no name to check: size and mtime must hold still
    data = b"x" * (2 * READ_CHUNK)
    src = tmp_path / "src"
    src.write_bytes(data)

    def rewrite_source(_count):
        os.utime(str(src), ns=(1, 1))

    with open_tmp(tmp_path) as top:
        with pytest.raises(dgx_copy.SourceProblem, match="changed while it was copied"):
            dgx_copy.copy_verified(str(src), top, "page", len(data), progress=rewrite_source)
    assert not (tmp_path / "page").exists()
    assert dgx_localtree.find_temp_debris(str(tmp_path)) == []


def test_copy_verified_disk_error_names_the_file_and_leaves_no_temp(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.write_bytes(b"y" * 4096)

    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dgx_copy.os, "write", disk_full)
    with open_tmp(tmp_path, "blobs") as blobs:
        with pytest.raises(dgx_copy.LocalWriteError) as err:
            dgx_copy.copy_verified(str(src), blobs, "f" * 64, 4096)
    assert err.value.errno == errno.ENOSPC and err.value.path == str(tmp_path / "blobs" / ("f" * 64))
    assert os.listdir(str(tmp_path / "blobs")) == []


def test_copy_verified_temp_name_fits_name_max(tmp_path):
    name = "n" * 250 + ".json"
    src = tmp_path / "src"
    src.write_bytes(b"{}")
    with open_tmp(tmp_path, "snap") as snap:
        dgx_copy.copy_verified(str(src), snap, name, 2)
    assert (tmp_path / "snap" / name).read_bytes() == b"{}"


def test_temp_names_fit_name_max_and_stay_recognisable():
    for name in ["a", "n" * 255, "\u00e9" * 127, "x" * 200 + "\u00e9" * 20]:
        temp = temp_name_for(name)
        assert len(os.fsencode(temp)) <= NAME_MAX and is_temp_name(temp), name
    assert temp_name_for("n" * 255) != temp_name_for("n" * 254 + "m")


def test_symlink_atomic_replaces_file_and_link(tmp_path):
    path = tmp_path / "entry"
    path.write_bytes(b"copied content instead of a link")
    with open_tmp(tmp_path) as top:
        dgx_localtree.symlink_atomic(top, "entry", "../../blobs/x")
        assert os.readlink(str(path)) == "../../blobs/x"
        dgx_localtree.symlink_atomic(top, "entry", "../../blobs/y")
    assert os.readlink(str(path)) == "../../blobs/y"
    assert sorted(os.listdir(str(tmp_path))) == ["entry"]


def test_debris_is_recognised(tmp_path):
    temp = str(tmp_path / temp_name_for("blob"))
    open(temp, "w").close()
    (tmp_path / "blob").write_text("x")
    assert dgx_localtree.find_temp_debris(str(tmp_path)) == [temp]


@pytest.mark.parametrize("linked", ["models--o--n", "models--o--n/blobs", "models--o--n/snapshots/c"])
def test_local_tree_never_writes_through_a_symlinked_directory(tmp_path, linked):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "hub"
    parent = root / os.path.dirname(linked)
    parent.mkdir(parents=True)
    os.symlink(str(elsewhere), str(root / linked))
    tree = dgx_localtree.LocalTree(str(root))
    for rel in (linked, linked + "/deeper"):
        with pytest.raises(StageError, match=r"%s is a symlink to %s" % (re.escape(str(root / linked)),
                                                                         re.escape(str(elsewhere)))):
            tree.open_dir(rel, create=True)
        with pytest.raises(StageError, match="is a symlink"):
            tree.refuse_unsafe_dirs([rel])
    assert os.listdir(str(elsewhere)) == []


def test_local_tree_creates_real_directories_and_finds_links_below(tmp_path):
    tree = dgx_localtree.LocalTree(str(tmp_path))
    with tree.open_dir("a/b/c", create=True) as opened:
        assert opened.path == str(tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    tree.refuse_unsafe_dirs_below("a")
    os.symlink("/", str(tmp_path / "a" / "b" / "root-link"))
    with pytest.raises(StageError, match="root-link is a symlink to /"):
        tree.refuse_unsafe_dirs_below("a")


def test_repo_lock_excludes_a_second_holder_and_names_its_run(tmp_path):
    tree = dgx_localtree.LocalTree(str(tmp_path))
    with dgx_repolock.RepoLock(tree, "locks", timeout=5, run_id="20261201T101648Z-d3b7"):
        errors, noted = [], []

        def contender():
            try:
                with dgx_repolock.RepoLock(tree, "locks", timeout=0.3, on_wait=noted.append):
                    pass
            except StageError as exc:
                errors.append(str(exc))

        thread = threading.Thread(target=contender)
        thread.start()
        thread.join()
        assert errors and ("another dgx-stage run, run 20261201T101648Z-d3b7 (pid %d, since " % os.getpid()) in errors[0]
        # The waiter said once whom it waits for, and never that it got the lock.
        assert [(h["pid"], h["run_id"]) for h in noted] == [(os.getpid(), "20261201T101648Z-d3b7")]
    with dgx_repolock.RepoLock(tree, "locks", timeout=0):
        pass


def test_a_waiter_is_told_when_it_holds_the_lock_and_writes_its_own_run(tmp_path):
    tree = dgx_localtree.LocalTree(str(tmp_path))
    noted = []
    first = dgx_repolock.RepoLock(tree, "locks", timeout=5, run_id="first-run").__enter__()
    threading.Timer(0.5, first.__exit__, (None, None, None)).start()
    with dgx_repolock.RepoLock(tree, "locks", timeout=5, run_id="second-run", on_wait=noted.append) as second:
        held = dgx_repolock.lock_holder(open(second.path).read())
    assert [n and n["run_id"] for n in noted] == ["first-run", None]
    assert (held["pid"], held["run_id"]) == (os.getpid(), "second-run") and held["since"].endswith("Z")


@pytest.mark.parametrize("text, holder", [
    ("4242", {"pid": 4242, "run_id": None, "since": None}),             # an older release's lock file
    ("4242 - 2026-12-01T10:16:50Z\n", {"pid": 4242, "run_id": None, "since": "2026-12-01T10:16:50Z"}),
    ("", {"pid": None, "run_id": None, "since": None}), ("garbage", {"pid": None, "run_id": None, "since": None}),
    # Whoever can write the file: a terminal escape or a control character is never quoted.
    ("4242 \x1b]0;pwned\x07 2026-12-01T10:16:50Z", {"pid": 4242, "run_id": None, "since": "2026-12-01T10:16:50Z"}),
    ("4242 run-1 \x1b[2J\x08", {"pid": 4242, "run_id": "run-1", "since": None}),
    ("\u0664\u0662 run-1", {"pid": None, "run_id": "run-1", "since": None})])
def test_lock_holder_reads_what_any_release_wrote(text, holder):
    assert dgx_repolock.lock_holder(text) == holder
    said = dgx_repolock.holder_text(dgx_repolock.lock_holder(text))
    assert said.startswith("run ") and said.isprintable() and said.isascii()


def test_a_run_id_that_is_not_one_word_of_ascii_is_not_written(tmp_path):
    with dgx_repolock.RepoLock(dgx_localtree.LocalTree(str(tmp_path)), "locks", timeout=0, run_id="two words\u00e9") as lock:
        assert dgx_repolock.lock_holder(open(lock.path).read())["run_id"] is None


# ------------------------------------------------------------------------------------------------
# the worker pool: several files in flight, biggest first, constant memory, first fatal error raised
# ------------------------------------------------------------------------------------------------

def test_run_workers_runs_every_item_at_most_workers_at_once_in_order_handed_out():
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}
    started, buffers = [], set()
    gate = threading.Barrier(3)

    def task(item, buf):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            started.append(item)
            buffers.add(id(buf))
        if item < 3:
            gate.wait(timeout=5)     # the first three really run at the same time
        with lock:
            state["now"] -= 1

    dgx_workers.run_workers(list(range(10)), task, workers=3)
    assert sorted(started) == list(range(10)) and started[:3] == sorted(started[:3])
    assert state["peak"] == 3 and len(buffers) == 3


def test_run_workers_stops_handing_out_after_a_fatal_error_and_raises_it():
    done = []

    def task(item, buf):
        if item == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        done.append(item)

    with pytest.raises(OSError, match="No space"):
        dgx_workers.run_workers(list(range(100)), task, workers=2)
    assert len(done) < 10


def test_run_workers_with_one_worker_runs_in_the_callers_thread():
    threads = set()
    dgx_workers.run_workers([1, 2, 3], lambda item, buf: threads.add(threading.current_thread()), workers=1)
    assert threads == {threading.current_thread()}


def test_default_workers_is_the_cpu_count_within_bounds(monkeypatch):
    for cpus, expected in ((None, 2), (1, 2), (2, 2), (6, 6), (64, dgx_workers.MAX_WORKERS)):
        monkeypatch.setattr(dgx_copy.os, "cpu_count", lambda cpus=cpus: cpus)
        assert dgx_workers.default_workers() == expected


def test_copy_verified_refuses_a_rewrite_that_restores_the_mtime(tmp_path):
    data = b"x" * (2 * READ_CHUNK)
    src = tmp_path / "src"
    src.write_bytes(data)
    st = os.stat(str(src))

    def rewrite_and_hide_it(_count):
        with open(str(src), "r+b") as handle:
            handle.write(b"y")
        os.utime(str(src), ns=(st.st_atime_ns, st.st_mtime_ns))   # size and mtime as before; ctime moves

    with open_tmp(tmp_path) as top:
        with pytest.raises(dgx_copy.SourceProblem, match="changed while it was copied"):
            dgx_copy.copy_verified(str(src), top, "page", len(data), progress=rewrite_and_hide_it)
    assert not (tmp_path / "page").exists()


def test_copy_verified_flushes_as_it_goes_and_a_failed_flush_is_a_local_write_error(tmp_path, monkeypatch):
    # written data is flushed every FLUSH_EVERY bytes (no pile of dirty pages, a short final fsync)
    monkeypatch.setattr(dgx_copy, "FLUSH_EVERY", READ_CHUNK)
    data = os.urandom(3 * READ_CHUNK + 5)
    src = tmp_path / "src"
    src.write_bytes(data)
    flushes = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(dgx_copy.os, "fdatasync", lambda fd: flushes.append(fd) or real_fdatasync(fd))
    with open_tmp(tmp_path) as top:
        dgx_copy.copy_verified(str(src), top, "blob", len(data), blob_name=sha256_name(data))
    assert len(flushes) == 3 and (tmp_path / "blob").read_bytes() == data

    def disk_gone(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(dgx_copy.os, "fdatasync", disk_gone)
    with open_tmp(tmp_path) as top:
        with pytest.raises(dgx_copy.LocalWriteError) as err:
            dgx_copy.copy_verified(str(src), top, "blob2", len(data), blob_name=sha256_name(data))
    assert err.value.errno == errno.EIO and not (tmp_path / "blob2").exists()
    assert dgx_localtree.find_temp_debris(str(tmp_path)) == []


def test_ctrl_c_stops_every_worker_before_it_propagates(tmp_path):
    cleaned, running = [], []
    lock = threading.Lock()
    # A real SIGINT to the process, as Ctrl-C sends it: the workers (and the timer a worker starts) hold it
    # blocked, so the kernel gives it to the caller's thread. Python's own handler for the test, and a bound
    # on every worker, so that a Ctrl-C that never arrives fails the test instead of hanging the suite (once
    # seen in a fresh clone with _thread.interrupt_main, cause not found).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    deadline = time.monotonic() + 30

    def long_task(item, buf):
        with lock:
            running.append(item)
            if len(running) == 4:     # every worker is busy: now the operator presses Ctrl-C
                threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            while time.monotonic() < deadline:
                buf.check()              # where copy_verified and feed_file look between chunks
                time.sleep(0.01)
        except dgx_hashing.Cancelled:
            cleaned.append(item)         # copy_verified removes its temp file here
            raise

    try:
        with pytest.raises(KeyboardInterrupt):
            dgx_workers.run_workers(list(range(4)), long_task, workers=4)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(cleaned) == [0, 1, 2, 3]
    assert not workers_still_running()


def test_a_fatal_error_in_one_worker_stops_the_others_within_a_chunk():
    stopped = []

    def task(item, buf):
        if item == 0:
            time.sleep(0.05)
            raise OSError(errno.ENOSPC, "No space left on device")
        try:
            for _ in range(1000):
                buf.check()
                time.sleep(0.01)
        except dgx_hashing.Cancelled:
            stopped.append(item)
            raise

    started = time.monotonic()
    with pytest.raises(OSError, match="No space"):
        dgx_workers.run_workers(list(range(3)), task, workers=3)
    assert sorted(stopped) == [1, 2] and time.monotonic() - started < 5


def test_buffers_stay_within_the_budget_and_are_taken_on_first_use():
    for workers in (1, 2, 8, 32):
        assert workers * dgx_workers.chunk_size(workers) <= max(dgx_workers.BUFFER_BUDGET, workers * dgx_workers.MIN_CHUNK)
        assert dgx_workers.chunk_size(workers) >= dgx_workers.MIN_CHUNK
    assert 32 * dgx_workers.chunk_size(32) <= dgx_workers.BUFFER_BUDGET
    buf = dgx_hashing.ChunkBuffer(READ_CHUNK)
    assert buf._data is None and len(buf.data) == READ_CHUNK


# ------------------------------------------------------------------------------------------------
# PassMeter: the figures of a pass and its progress file
# ------------------------------------------------------------------------------------------------


def read_progress(tmp_path):
    with open(str(tmp_path / ".locks" / dgx_progress_file.PROGRESS_NAME)) as handle:
        return json.load(handle)


def test_meter_gives_no_rate_or_eta_until_known_and_writes_at_most_once_per_interval(tmp_path):
    clock = FakeClock()
    meter = dgx_progress_file.PassMeter("stage", "org/name", "none", clock=clock, wall=lambda: 1790000000.0, interval=1.0)
    with open_tmp(tmp_path, ".locks") as lock_dir:
        meter.attach(lock_dir)
        meter.plan("copying", 2, 4 * 1048576)
        meter.begin("copying")
        meter.working_on("model-00001.safetensors")
        clock.now += 0.5
        meter.count("copying", nas=1048576)              # a rate after half a second would be a guess
        first = read_progress(tmp_path)
        assert (first["bytes_done"], first["mib_per_s"], first["eta_s"]) == (0, None, None)
        assert (first["status"], first["finished"], first["aborted"]) == ("running", False, False)
        clock.now += 1.5
        meter.count("copying", nas=1048576)              # 2 MiB in 2 s: 1 MiB/s, 2 MiB to go
        second = read_progress(tmp_path)
        assert (second["bytes_done"], second["bytes_total"], second["mib_per_s"], second["eta_s"]) == (
            2 * 1048576, 4 * 1048576, 1.0, 2.0)
        assert second["current"] == "model-00001.safetensors" and second["step"] == "copying"
        assert second["updated_at"] == "2026-09-21T14:13:22Z" and second["started_at"] == "2026-09-21T14:13:20Z"
        clock.now += 0.2
        meter.count("copying", nas=1048576)              # within the interval: not written
        assert read_progress(tmp_path)["bytes_done"] == 2 * 1048576
        meter.count("copying", nas=1048576)
        meter.item_done("copying")
        meter.item_done("copying")
        meter.close("ok")
        done = read_progress(tmp_path)
    assert (done["status"], done["finished"], done["aborted"], done["eta_s"], done["current"]) == (
        "ok", True, False, 0.0, None)
    assert (done["files_done"], done["files_total"], done["bytes_done"]) == (2, 2, 4 * 1048576)
    assert done["bytes_read"] == {"local": 0, "nas": 4 * 1048576} and done["pid"] == os.getpid()


def test_meter_keeps_the_other_passes_of_the_file_and_says_how_a_pass_ended(tmp_path):
    lock = tmp_path / ".locks"
    lock.mkdir()
    stage_figures = {"pass": "stage", "finished": True, "bytes_done": 7}
    (lock / dgx_progress_file.PROGRESS_NAME).write_text(json.dumps({"pass": "stage", "passes": {"stage": stage_figures}}))
    meter = dgx_progress_file.PassMeter("verify", "org/name", "full")
    with open_tmp(tmp_path, ".locks") as lock_dir:
        meter.attach(lock_dir)
        meter.plan("hashing", 1, 10)
        meter.count("hashing", local=25)                 # read more than planned: the total follows
        assert meter.figures()["bytes_total"] == 25
        meter.close("interrupted", "interrupted (Ctrl-C)")
    doc = read_progress(tmp_path)
    assert doc["pass"] == "verify" and doc["passes"]["stage"] == stage_figures
    assert (doc["status"], doc["finished"], doc["aborted"], doc["eta_s"]) == ("interrupted", False, True, None)
    assert doc["error"] == "interrupted (Ctrl-C)" and doc["passes"]["verify"]["aborted"] is True
    assert doc["hashing"] == {"files_done": 0, "files_total": 1, "bytes_done": 25, "bytes_total": 25}


@pytest.mark.parametrize("plant, words", [
    ("garbage", "is not JSON"), ("huge", "is larger than"), ("link", "cannot be read"),
    ("not-a-mapping", "is not a mapping of blobs")])
def test_a_pass_refuses_a_progress_file_it_cannot_read_rather_than_forget_the_nas_suspects(tmp_path, plant, words):
    """The file may hold the NAS blobs found corrupt: written over, they would be forgotten and a roll-back
    would bind one. The pass stops naming the file and what to do, and leaves it as it is."""
    lock = tmp_path / ".locks"
    lock.mkdir()
    progress = lock / dgx_progress_file.PROGRESS_NAME
    if plant == "link":
        (tmp_path / "record.json").write_text(json.dumps({"nas_corrupt": {"a" * 64: {"paths": ["x"]}}}))
        progress.symlink_to(tmp_path / "record.json")
    elif plant == "huge":
        progress.write_text(json.dumps({"nas_corrupt": {"a" * 64: {"why": "x" * dgx_progress_file.MAX_BYTES}}}))
    else:
        progress.write_text('{"nas_corrupt": {"%s": {"paths": ["x"]}' % ("a" * 64) if plant == "garbage"
                            else '{"nas_corrupt": []}')
    before = os.lstat(str(progress))
    with open_tmp(tmp_path, ".locks") as lock_dir:
        with pytest.raises(StageError) as raised:
            dgx_progress_file.PassMeter("stage", "org/name", "none").attach(lock_dir)
    assert str(progress) in str(raised.value) and words in str(raised.value)
    assert "nothing was written" in str(raised.value) and "move this one aside" in str(raised.value)
    after = os.lstat(str(progress))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(os.listdir(str(lock))) == [dgx_progress_file.PROGRESS_NAME]


def test_meter_keeps_a_suspects_record_larger_than_a_mebibyte(tmp_path):
    lock = tmp_path / ".locks"
    lock.mkdir()
    suspects = dict(("%064x" % n, {"paths": ["engram/table-%05d.safetensors" % n], "nas_source": "/nas/x" * 20,
                                   "identity": [n, n, n, n], "found_at": "2026-12-01T10:00:00Z", "why": "x" * 100})
                    for n in range(6000))
    (lock / dgx_progress_file.PROGRESS_NAME).write_text(json.dumps({"nas_corrupt": suspects}))
    assert (lock / dgx_progress_file.PROGRESS_NAME).stat().st_size > 2 * 1024 * 1024
    with open_tmp(tmp_path, ".locks") as lock_dir:
        meter = dgx_progress_file.PassMeter("stage", "org/name", "none")
        meter.attach(lock_dir)
        meter.close("ok")
    assert read_progress(tmp_path)["nas_corrupt"] == suspects


def test_meter_counts_every_byte_from_many_workers(tmp_path):
    meter = dgx_progress_file.PassMeter("stage", "org/name", "none", interval=0.0)
    meter.plan("copying", 8, 800)

    def work():
        for _ in range(100):
            meter.count("copying", nas=1)
        meter.item_done("copying")

    with open_tmp(tmp_path, ".locks") as lock_dir:
        meter.attach(lock_dir)                            # every count may write: the file stays whole JSON
        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        meter.close("ok")
    doc = read_progress(tmp_path)
    assert doc["bytes_read"] == {"local": 0, "nas": 800} and (doc["files_done"], doc["files_total"]) == (8, 8)
    assert dgx_localtree.find_temp_debris(str(tmp_path)) == []


def test_signals_held_delays_a_signal_until_the_block_ends_and_threads_started_inside_never_take_it():
    """run_workers starts its threads inside signals_held: a Ctrl-C or SIGTERM then cannot land between a
    thread's start and its listing (which left a worker unwaited-for and its temp file behind).

    Runs in a forked child, which has this thread only: a test runner's own threads (pytest-xdist's) do not
    block the signal, and the kernel would hand it to one of them during the block."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _signals_held_in_this_process()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the forked check failed (its traceback is above)"


def _signals_held_in_this_process():
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: seen.append(signum))
    try:
        masks = []
        with dgx_workers.signals_held(signal.SIGUSR1):
            thread = threading.Thread(target=lambda: masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
            thread.start()
            thread.join()
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)
            assert seen == []
        time.sleep(0.05)
        assert seen == [signal.SIGUSR1]
        assert signal.SIGUSR1 in masks[0]
        assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_lock_file_planted_as_a_hard_link_gets_the_pid_in_a_new_file(tmp_path):
    (tmp_path / ".locks" / "models--org--name").mkdir(parents=True)
    outside = tmp_path / "outside.conf"
    outside.write_text("keep me")
    planted = tmp_path / ".locks" / "models--org--name" / dgx_repolock.RepoLock.NAME
    os.link(str(outside), str(planted))
    tree = dgx_localtree.LocalTree(str(tmp_path))
    with dgx_repolock.RepoLock(tree, ".locks/models--org--name", 5):
        assert outside.read_text() == "keep me"
        assert planted.read_text().split()[0] == str(os.getpid()) and os.stat(str(planted)).st_nlink == 1
        with pytest.raises(StageError, match="pid %d" % os.getpid()):
            with dgx_repolock.RepoLock(tree, ".locks/models--org--name", 0):
                pass
    assert outside.read_text() == "keep me"


def test_a_run_waiting_on_a_lock_directory_renamed_aside_waits_on_the_one_named_now(tmp_path):
    """The holder's lock directory renamed aside and a new one made: a run that waited on the old one must wait
    on the new one once the old is free, as a run starting now locks that one: never two runs holding the lock."""
    tree = dgx_localtree.LocalTree(str(tmp_path))
    first = dgx_repolock.RepoLock(tree, "locks", timeout=0, run_id="first").__enter__()
    waiting, holds, done = threading.Event(), threading.Event(), threading.Event()

    def waiter():
        with dgx_repolock.RepoLock(tree, "locks", timeout=10, on_wait=lambda h: h and waiting.set()):
            holds.set()
            done.wait(10)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        assert waiting.wait(5)                             # it opened the old directory and waits on it
        os.rename(str(tmp_path / "locks"), str(tmp_path / "locks.aside"))
        third = dgx_repolock.RepoLock(tree, "locks", timeout=0, run_id="third").__enter__()   # a new directory
        first.__exit__(None, None, None)                   # the old directory is free, the new one held
        assert not holds.wait(1.0)
        third.__exit__(None, None, None)
        assert holds.wait(5)
    finally:
        done.set()
        thread.join()


def test_a_lock_file_bind_mounted_over_a_file_outside_is_never_written(tmp_path):
    """A bind mount has one link, so the hard-link check alone would truncate the file outside and write the
    pid into it: the lock refuses (a mount cannot be renamed over) and the file outside keeps its bytes."""
    from mountns import bind_mount, in_private_mount_namespace

    (tmp_path / ".locks" / "models--org--name").mkdir(parents=True)
    outside = tmp_path / "outside.conf"
    outside.write_text("keep me")
    planted = tmp_path / ".locks" / "models--org--name" / dgx_repolock.RepoLock.NAME
    planted.write_text("")

    def lock_through_the_mount():
        bind_mount(outside, planted)
        with pytest.raises(StageError) as refused:
            with dgx_repolock.RepoLock(dgx_localtree.LocalTree(str(tmp_path)), ".locks/models--org--name", 5):
                pass
        assert "it is a mount point" in str(refused.value), str(refused.value)

    assert in_private_mount_namespace(lock_through_the_mount) == 0
    assert outside.read_text() == "keep me"


def test_a_fifo_planted_as_the_lock_file_is_replaced_without_being_opened(tmp_path):
    (tmp_path / ".locks" / "models--org--name").mkdir(parents=True)
    planted = tmp_path / ".locks" / "models--org--name" / dgx_repolock.RepoLock.NAME
    os.mkfifo(str(planted))
    with dgx_repolock.RepoLock(dgx_localtree.LocalTree(str(tmp_path)), ".locks/models--org--name", 5):
        assert planted.read_text().split()[0] == str(os.getpid())


def _mount_tmpfs(path):
    import subprocess

    subprocess.check_call(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)])


def test_without_proc_nothing_is_written_below_the_hub_root(tmp_path):
    """Without /proc a bind mount of the same filesystem cannot be told apart: the run refuses, naming /proc,
    instead of taking every folder for a plain one."""
    from mountns import in_private_mount_namespace

    (tmp_path / "hub" / "models--org--name").mkdir(parents=True)

    def open_without_proc():
        _mount_tmpfs("/proc")
        with pytest.raises(StageError) as refused:
            dgx_localtree.LocalTree(str(tmp_path / "hub")).open_dir("models--org--name/blobs", create=True)
        assert "/proc" in str(refused.value), str(refused.value)
        assert not os.path.exists(str(tmp_path / "hub" / "models--org--name" / "blobs"))

    assert in_private_mount_namespace(open_without_proc) == 0


def test_mount_checks_accept_a_hub_root_reached_through_a_link_and_ignore_hidden_mounts(tmp_path):
    """The hub root may be a link to another filesystem, or a mount point itself; a mount hidden under a later
    mount is not met by the run and does not count."""
    from mountns import in_private_mount_namespace

    (tmp_path / "fast").mkdir()
    (tmp_path / "hub").mkdir()

    def check_the_setups():
        _mount_tmpfs(tmp_path / "fast")
        os.makedirs(str(tmp_path / "fast" / "hub" / "models--org--name"))
        os.symlink(str(tmp_path / "fast" / "hub"), str(tmp_path / "hub-link"))
        tree = dgx_localtree.LocalTree(str(tmp_path / "hub-link"))
        assert mount_point_problem(tree.root, "models--org--name/blobs") is None
        tree.refuse_unsafe_dirs(["models--org--name/blobs"])
        with tree.open_dir("models--org--name/blobs", create=True):
            pass
        os.makedirs(str(tmp_path / "hub" / "models--org--name"))
        _mount_tmpfs(tmp_path / "hub" / "models--org--name")      # then hidden by a volume over the hub
        _mount_tmpfs(tmp_path / "hub")
        os.makedirs(str(tmp_path / "hub" / "models--org--name"))
        assert mount_point_problem(str(tmp_path / "hub"), "models--org--name/blobs") is None
        with dgx_localtree.LocalTree(str(tmp_path / "hub")).open_dir("models--org--name/blobs", create=True):
            pass

    assert in_private_mount_namespace(check_the_setups) == 0


def test_a_lock_is_taken_on_an_overlay_whose_layers_lie_on_two_filesystems(tmp_path):
    """overlayfs gives a file the st_dev of its layer, not its folder's: the lock file is still its own."""
    import subprocess
    from mountns import in_private_mount_namespace

    with open("/proc/filesystems") as filesystems:
        if "overlay" not in filesystems.read():
            pytest.skip("this kernel has no overlayfs")
    for name in ("lower", "upper", "merged"):
        (tmp_path / name).mkdir()

    def lock_on_the_overlay():
        _mount_tmpfs(tmp_path / "lower")
        _mount_tmpfs(tmp_path / "upper")
        os.makedirs(str(tmp_path / "lower" / "hub" / ".locks" / "models--org--name"))
        with open(str(tmp_path / "lower" / "hub" / ".locks" / "models--org--name" / dgx_repolock.RepoLock.NAME), "w"):
            pass
        os.makedirs(str(tmp_path / "upper" / "data"))
        os.makedirs(str(tmp_path / "upper" / "work"))
        options = "lowerdir=%s,upperdir=%s,workdir=%s" % (tmp_path / "lower", tmp_path / "upper" / "data",
                                                          tmp_path / "upper" / "work")
        subprocess.check_call(["mount", "-t", "overlay", "overlay", "-o", options, str(tmp_path / "merged")])
        hub = str(tmp_path / "merged" / "hub")
        with dgx_repolock.RepoLock(dgx_localtree.LocalTree(hub), ".locks/models--org--name", 5) as lock:
            assert open(lock.path).read().split()[0] == str(os.getpid())

    assert in_private_mount_namespace(lock_on_the_overlay) == 0


@pytest.mark.parametrize("how", ["folder renamed aside", "folder removed", ".locks renamed aside"])
def test_a_holder_whose_lock_folder_is_removed_or_renamed_stops_at_its_next_progress_write(tmp_path, how):
    """Clearing "stale" locks while a run holds one lets the next run lock a new folder at once: the holder
    must stop at its next progress write and write nothing more, neither to the folder it still has open nor
    to the one named now."""
    tree = dgx_localtree.LocalTree(str(tmp_path))
    rel = ".locks/models--org--name"
    folder = tmp_path / ".locks" / "models--org--name"
    meter = dgx_progress_file.PassMeter("stage", "org/name", "size", interval=0.0)
    with dgx_repolock.RepoLock(tree, rel, 5, run_id="run-a") as lock_a:
        meter.attach(lock_a.directory, held=lock_a.check_held)
        meter.plan("copying", 1, 100)
        meter.count("copying", nas=10)
        if how == "folder renamed aside":
            os.rename(str(folder), str(tmp_path / ".locks" / "aside"))
            aside = tmp_path / ".locks" / "aside"
        elif how == "folder removed":
            dgx_fsutil.remove_path(str(folder))
            aside = None
        else:
            os.rename(str(tmp_path / ".locks"), str(tmp_path / ".locks.old"))
            aside = tmp_path / ".locks.old" / "models--org--name"
        before = (aside / dgx_progress_file.PROGRESS_NAME).read_bytes() if aside else None
        with dgx_repolock.RepoLock(tree, rel, 0, run_id="run-b"):      # the next run is not kept waiting
            with pytest.raises(StageError) as raised:
                meter.count("copying", nas=10)
            assert str(raised.value) == (
                "the lock folder %s was removed or renamed while this run held it; another run may be staging "
                "this repo now: check with `dgx-stage status`, then re-run" % folder)
            meter.count("copying", nas=10)
            meter.close("failed", str(raised.value))
            assert sorted(os.listdir(str(folder))) == [dgx_repolock.RepoLock.NAME]   # run B's, nothing of A's
            if aside:
                assert (aside / dgx_progress_file.PROGRESS_NAME).read_bytes() == before
