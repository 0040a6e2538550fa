"""Staging beside a serving engine (module_utils/dgx_throttle.py): the read cap's arithmetic on a virtual clock, its
use by every read of a pass, and the idle I/O class as the kernel reports it."""
import ctypes
import errno
import hashlib
import heapq
import os
import subprocess
import sys
import threading

import pytest

from ansible.module_utils import dgx_throttle
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_copy import _copy_chunks
from ansible.module_utils.dgx_hashing import ChunkBuffer, feed_file, sampled_bytes, samples_match
from ansible.module_utils.dgx_mirror import run_mirror
from ansible.module_utils.dgx_mirror_request import MirrorFailed, MirrorRequest
from ansible.module_utils.dgx_progress_file import PassMeter
from ansible.module_utils.dgx_throttle import MIB, WINDOW_S, ReadCap, disk_scheduler, set_io_priority
from fakeclock import FakeClock
from nashub import build_nas
from treestate import snapshot_diff, tree_snapshot
import hubgen

MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "module_utils")


def worst_window(reads):
    """The most bytes read in any closed WINDOW_S window of (time, bytes) reads (the worst starts at a read)."""
    reads = sorted(reads)
    return max(sum(n for t, n in reads if start <= t <= start + WINDOW_S) for start, _n in reads)


def test_one_reader_keeps_any_5_s_window_at_or_under_the_cap_and_gets_close_to_it():
    clock = FakeClock()
    cap = ReadCap(100, clock=clock, sleep=clock.sleep)
    reads, began = [], clock.now
    while clock.now - began < 60:
        size = cap.read_size(16 * MIB)
        cap.reserve(size)
        reads.append((clock.now, size))
    assert size == 10 * MIB        # a read is at most a tenth of a second of the cap
    assert worst_window(reads) <= 100 * MIB * WINDOW_S
    total = sum(n for _t, n in reads)
    assert 0.96 * 100 <= total / MIB / (clock.now - began) <= 100


def test_workers_together_stay_under_the_cap_however_their_reads_interleave():
    clock = FakeClock()
    cap = ReadCap(40, clock=clock, sleep=clock.sleep)
    # Four workers; each computes (hashes, writes) for a while after a read before it asks for the next, and now
    # and then a busy machine starts a read up to LATE_S after its turn.
    began = clock.now
    pending = [(began + 0.01 * worker, worker) for worker in range(4)]
    reads = []
    while pending:
        at, worker = heapq.heappop(pending)
        if at > clock.now:
            clock.now = at
        size = cap.read_size(4 * MIB) if worker % 2 else 300 * 1024
        read_at = at + cap.delay_for(size) + (dgx_throttle.LATE_S if len(reads) % 50 == 0 else 0)
        reads.append((read_at, size))
        if read_at < began + 30:
            heapq.heappush(pending, (read_at + 0.003 * (worker + 1), worker))
    assert worst_window(reads) <= 40 * MIB * WINDOW_S
    assert sum(n for _t, n in reads) / MIB / 30 >= 0.95 * 40


def test_idle_time_earns_no_burst_and_a_short_read_gives_its_rest_back():
    clock = FakeClock()
    cap = ReadCap(10, clock=clock, sleep=clock.sleep)
    size = cap.read_size(8 * MIB)
    assert cap.delay_for(size) == 0
    clock.now += 60                                   # a minute with nothing read
    assert cap.delay_for(size) == 0
    assert cap.delay_for(size) == pytest.approx(size / cap.pace)     # no credit for the idle minute
    cap.give_back(size)                               # that read found the end of its file at once
    assert cap.delay_for(size) == pytest.approx(size / cap.pace)


def test_a_turn_given_back_after_another_worker_reserved_is_not_given_twice():
    clock = FakeClock()
    cap = ReadCap(10, clock=clock, sleep=clock.sleep)
    size = cap.read_size(8 * MIB)
    turns = []

    def worker(*steps):
        thread = threading.Thread(target=lambda: [step() for step in steps])
        thread.start()
        thread.join()

    worker(lambda: turns.append(cap.delay_for(size)))            # A: its read finds the end of its file...
    worker(lambda: turns.append(cap.delay_for(size)), lambda: turns.append(cap.delay_for(size)))   # B, C queue
    worker(lambda: cap.give_back(size))                           # ...A's rest comes back: B and C keep their turns
    turns.append(cap.delay_for(size))                             # D: after C, not beside it
    assert turns == pytest.approx([0, size / cap.pace, 2 * size / cap.pace, 3 * size / cap.pace])


def test_read_sizes_and_a_cap_that_is_no_cap():
    cap = ReadCap(1)
    assert cap.read_size(8 * MIB) == int(0.1 * MIB) and cap.read_size(4096) == 4096
    assert ReadCap(0.1).read_size(8 * MIB) == 64 * 1024          # never smaller than 64 KiB a read
    for bad in (0, -5, None):
        with pytest.raises(ValueError):
            ReadCap(bad)
    with pytest.raises(StageError, match="stage_max_mib_s"):
        MirrorRequest(src="/", dest="/", repo_id="a/b", max_mib_s=-1)


def test_a_buffer_under_a_cap_reads_in_slices_and_the_cap_counts_every_byte(tmp_path):
    clock = FakeClock()
    began = clock.now
    cap = ReadCap(1, clock=clock, sleep=clock.sleep)
    data = os.urandom(MIB + 10)
    path = tmp_path / "blob"
    path.write_bytes(data)
    buf, got = ChunkBuffer(8 * MIB, cap=cap), []
    fd = os.open(str(path), os.O_RDONLY)
    try:
        while True:
            count = buf.read_from(fd)
            if not count:
                break
            got.append(bytes(buf.view[:count]))
    finally:
        os.close(fd)
    assert b"".join(got) == data and max(len(chunk) for chunk in got) == cap.largest_read
    # The timeline holds what was read, not what was asked for: the short reads at the end gave their rest back.
    assert cap.delay_for(0) == pytest.approx(len(data) / cap.pace - (clock.now - began), abs=1e-6)


def test_the_read_that_finds_the_end_of_a_file_holds_one_byte_of_the_cap(tmp_path):
    class Recording(ReadCap):
        def __init__(self, mib_s):
            ReadCap.__init__(self, mib_s)
            self.asked = []

        def reserve(self, nbytes, stop=None):
            self.asked.append(nbytes)

    cap = Recording(1)
    size = 2 * cap.largest_read                  # ends on a whole read: the last read finds nothing
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(size))
    assert feed_file(str(path), hashlib.sha256(), ChunkBuffer(cap=cap)) == size
    assert cap.asked == [cap.largest_read, cap.largest_read, 1]
    del cap.asked[:]
    src, dst = os.open(str(path), os.O_RDONLY), os.open(str(tmp_path / "copy"), os.O_WRONLY | os.O_CREAT)
    try:
        assert _copy_chunks(src, str(path), dst, "copy", size, ChunkBuffer(cap=cap), None, None) == size
    finally:
        os.close(src)
        os.close(dst)
    assert cap.asked == [cap.largest_read, cap.largest_read, 1]


def test_sampled_checks_read_their_pairs_in_slices_the_cap_allows(tmp_path):
    class Recording(ReadCap):
        asked = []

        def reserve(self, nbytes, stop=None):
            self.asked.append(nbytes)

    size = 3 * MIB
    data = os.urandom(size)
    for name in ("local", "nas"):
        (tmp_path / name).write_bytes(data)
    cap = Recording(1)
    buf = ChunkBuffer(cap=cap)
    assert samples_match(str(tmp_path / "local"), str(tmp_path / "nas"), size, buf=buf)
    assert sum(cap.asked) == 2 * sampled_bytes(size) and max(cap.asked) <= cap.largest_read


def test_the_meter_measures_the_rate_from_the_first_reading_step_to_the_last_read():
    clock = FakeClock()
    meter = PassMeter("stage", "org/model", "none", clock=clock, wall=lambda: 0.0, max_mib_s=8)
    clock.now += 5                               # planning reads nothing
    meter.begin("copying")
    clock.now += 0.5
    meter.count("copying", nas=4 * MIB)
    assert meter.read_rate() == (0.5, None)      # under a second: no rate yet
    clock.now += 1.5
    meter.count("copying", nas=12 * MIB)
    figures = meter.figures()
    assert meter.read_rate() == (2.0, 8.0)
    assert (figures["max_mib_s"], figures["achieved_mib_s"]) == (8, 8.0)


@pytest.fixture(scope="module")
def nas(tmp_path_factory):
    hub = build_nas(tmp_path_factory.mktemp("throttle") / "nas", shard_size=3 * MIB, n_shards=3)
    yield hub
    hub.thaw()


@pytest.mark.parametrize("verify", ["sample", "full"])
def test_every_read_of_a_stage_and_a_verify_pass_waits_its_turn_under_the_cap(nas, tmp_path, verify):
    asked = []

    def request(**kwargs):
        req = MirrorRequest(src=nas["hub"], dest=str(tmp_path), repo_id=hubgen.MAIN_REPO, max_mib_s=100000,
                            **kwargs)
        delay_for = req.read_cap.delay_for
        req.read_cap.delay_for = lambda nbytes: asked.append(nbytes) or delay_for(nbytes)
        return req

    staged = run_mirror(request())
    read = staged["bytes_read"]["local"] + staged["bytes_read"]["nas"]
    assert staged["bytes_copied"] > 0 and sum(asked) >= read > 0
    assert staged["max_mib_s"] == staged["report"]["max_mib_s"] == 100000
    assert staged["report"]["io_priority"]["requested"] == "normal" and "read cap 100000 MiB/s" in staged["summary"]
    del asked[:]
    verified = run_mirror(request(verify=verify, phase="verify", copy_missing=False))
    read = verified["bytes_read"]["local"] + verified["bytes_read"]["nas"]
    assert read > 0 and sum(asked) >= read
    # A cap changes how fast, never what: a re-run changes nothing, check mode writes nothing.
    before = tree_snapshot(str(tmp_path))
    assert run_mirror(request(verify=verify), check_mode=True)["changed"] is False
    assert snapshot_diff(before, tree_snapshot(str(tmp_path))) == []
    assert run_mirror(request(verify=verify))["changed"] is False


def test_idle_reaches_every_thread_of_the_process_those_started_later_too():
    # In a child process: the test process keeps its own class.
    code = r"""
import json, os, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from dgx_throttle import set_io_priority
hold = threading.Event()
before = threading.Thread(target=hold.wait)
before.start()
report = set_io_priority("idle")
after = threading.Thread(target=hold.wait)
after.start()
classes = [subprocess.run(["ionice", "-p", tid], capture_output=True, text=True).stdout.split(":")[0].strip()
           for tid in os.listdir("/proc/self/task")]
hold.set()
print(json.dumps({"report": report, "classes": classes}))
"""
    shown = subprocess.run([sys.executable, "-c", code, MODULE_UTILS], capture_output=True, text=True, check=True)
    seen = __import__("json").loads(shown.stdout)
    assert seen["report"]["applied"] == "idle" and seen["report"]["problem"] is None
    assert seen["classes"] == ["idle"] * 3


def test_a_kernel_that_refuses_the_idle_class_is_named_and_nothing_raises(tmp_path):
    def refusing(number, who, which, prio=None):
        if prio is not None:
            ctypes.set_errno(errno.EPERM)
            return -1
        return 0                                   # ioprio_get: class none

    report = set_io_priority("idle", machine="x86_64", syscall=refusing, threads=[0])
    assert report["applied"] == "none" and "refused the idle I/O class" in report["problem"]
    assert "EPERM" in report["problem"]
    assert "not known on this architecture (mips)" in set_io_priority("idle", machine="mips")["problem"]
    untouched = set_io_priority("normal", machine="x86_64", syscall=lambda *args: (2 << 13) | 4)
    assert (untouched["applied"], untouched["problem"]) == ("best-effort", None)


def test_no_syscall_is_made_off_linux_where_the_numbers_mean_other_calls(monkeypatch):
    # macOS on arm64: syscall 30 is accept(2) there, not ioprio_set.
    monkeypatch.setattr(dgx_throttle.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(dgx_throttle.platform, "machine", lambda: "arm64")
    calls = []
    report = set_io_priority("idle", syscall=lambda *args: calls.append(args) or 0, threads=[0])
    assert calls == [] and report["applied"] is None and "Linux only, not Darwin" in report["problem"]


def test_the_disk_scheduler_is_read_for_the_disk_or_its_partition_and_noted_when_it_ignores_classes(tmp_path):
    device = os.stat(str(tmp_path)).st_dev
    sysfs = tmp_path / "sys"
    disk = sysfs / ("%d:%d" % (os.major(device), os.minor(device)))
    disk.mkdir(parents=True)
    (sysfs / "queue").mkdir()                     # a partition: its disk's queue, one level up
    (sysfs / "queue" / "scheduler").write_text("mq-deadline kyber [none]\n")
    assert disk_scheduler(str(tmp_path), sysfs=str(sysfs)) == "none"
    (disk / "queue").mkdir()
    (disk / "queue" / "scheduler").write_text("[bfq] none\n")
    assert disk_scheduler(str(tmp_path), sysfs=str(sysfs)) == "bfq"
    assert disk_scheduler(str(tmp_path / "absent"), sysfs=str(sysfs)) is None

    def idle(number, who, which, prio=None):
        return 0 if prio is not None else 3 << 13

    (disk / "queue" / "scheduler").write_text("mq-deadline [none]\n")
    original = dgx_throttle.disk_scheduler
    dgx_throttle.disk_scheduler = lambda path: original(path, sysfs=str(sysfs))
    try:
        noted = set_io_priority("idle", str(tmp_path), machine="aarch64", syscall=idle, threads=[0])
    finally:
        dgx_throttle.disk_scheduler = original
    assert noted["applied"] == "idle" and noted["scheduler"] == "none"
    assert "does not order requests by I/O class" in noted["note"] and "stage_max_mib_s" in noted["note"]


def test_under_a_cap_a_nas_blob_that_fails_its_name_is_never_staged_under_it(tmp_path):
    # The capped read path (slices, reads sized to what is left) feeds the same hash that names the blob.
    from test_mirror import corrupt_nas_blob, selected
    nas = build_nas(tmp_path / "nas", shard_size=3 * MIB, n_shards=2)
    try:
        shard = nas.repo()["shards"][0]
        etag = selected(nas)[shard]["etag"]
        corrupt_nas_blob(nas, etag)
        local = tmp_path / "local"
        local.mkdir()
        with pytest.raises(MirrorFailed, match="do not hold the bytes their names say.*nothing was staged under that"):
            run_mirror(MirrorRequest(src=nas["hub"], dest=str(local), repo_id=hubgen.MAIN_REPO, max_mib_s=100000,
                                     ignore_patterns=["page15/"]))
        assert not os.path.lexists(os.path.join(str(local), nas.repo()["folder"], "blobs", etag))
    finally:
        nas.thaw()

