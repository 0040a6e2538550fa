"""Watching a background hf_hub_mirror job (module_utils/dgx_job_poll.py, dgx_jobs.py, dgx_lease.py,
library/mirror_job.py): the job file, the progress file in whatever state it is found, the figures of this job
only, the human line, and the jobs dir (symlinks refused, only ended jobs' files removed)."""
import json
import os
import threading
import time

import pytest

import processes
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_job_poll, dgx_jobs, dgx_lease
from ansible.module_utils.dgx_jobs import ended_job_file, prepare_jobs_dir, read_job, read_json_file
from ansible.module_utils.dgx_job_poll import human_eta, job_figures, pass_figures, poll, progress_line, shape_progress
from test_module_docs import check_result, run_main

MIB = 1024 * 1024
GIB = 1024 * MIB
REPO = "org/model"
FOLDER = "models--org--model"


def utc(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def figures(phase="stage", started=None, **kw):
    started = time.time() if started is None else started
    doc = {"pass": phase, "repo_id": REPO, "started_at": utc(started), "updated_at": utc(started + 2),
           "step": "copying", "current": "model-00003.safetensors", "files_done": 2, "files_total": 14,
           "bytes_done": 12 * GIB + 300 * MIB, "bytes_total": 300 * GIB, "mib_per_s": 812.4, "eta_s": 372.0,
           "status": "running", "finished": False, "aborted": False, "error": None}
    doc.update(kw)
    return doc


def write_progress(dest, doc):
    lock_dir = os.path.join(str(dest), ".locks", FOLDER)
    os.makedirs(lock_dir, exist_ok=True)
    path = os.path.join(lock_dir, "dgx-stage.progress.json")
    with open(path, "w") as handle:
        handle.write(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def write_job(jobs, jid, data, mtime=None):
    os.makedirs(str(jobs), exist_ok=True)
    path = os.path.join(str(jobs), jid)
    with open(path, "w") as handle:
        handle.write(data if isinstance(data, str) else json.dumps(data))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


RUNNING = {"started": True, "finished": False, "ansible_job_id": "j1.2"}


# ---- reading files in whatever state ------------------------------------------------------------------

@pytest.mark.parametrize("content", ["", "{\"pass\": \"sta", "garbage", "[1, 2]", "\x00\x01"])
def test_a_half_written_or_garbled_file_reads_as_none(tmp_path, content):
    path = tmp_path / "f.json"
    path.write_text(content)
    assert read_json_file(str(path)) is None


def test_a_missing_file_or_a_link_reads_as_none(tmp_path):
    assert read_json_file(str(tmp_path / "absent.json")) is None
    real = tmp_path / "real.json"
    real.write_text('{"a": 1}')
    os.symlink(str(real), str(tmp_path / "link.json"))
    assert read_json_file(str(real)) == {"a": 1}
    assert read_json_file(str(tmp_path / "link.json")) is None


def test_the_job_file_says_running_ended_or_missing(tmp_path):
    jobs = tmp_path / "jobs"
    write_job(jobs, "j1.2", RUNNING)
    assert read_job(str(jobs), "j1.2")["state"] == "running"
    write_job(jobs, "j1.3", "")                                     # not written yet: still starting
    assert read_job(str(jobs), "j1.3")["state"] == "running"
    write_job(jobs, "j1.4", {"changed": True, "report": {}, "ansible_job_id": "j1.4"})
    ended = read_job(str(jobs), "j1.4")
    assert ended["state"] == "ended" and ended["result"]["changed"] is True
    assert read_job(str(jobs), "j9.9") == {"state": "missing", "result": None, "started": None,
                                          "path": str(jobs / "j9.9")}


# ---- the figures of this job's pass ------------------------------------------------------------------

def test_the_pass_is_read_from_passes_else_from_the_top_level():
    stage, verify = figures("stage"), figures("verify", bytes_done=5)
    doc = dict(verify, passes={"stage": stage, "verify": verify})
    assert pass_figures(doc, "stage") == stage and pass_figures(doc, "verify") == verify
    assert pass_figures(stage, "stage") == stage and pass_figures(stage, "verify") is None
    assert pass_figures(None, "stage") is None and pass_figures({"passes": "x"}, "stage") is None


def test_figures_of_an_earlier_run_are_not_this_jobs():
    now = 1800000000
    old = figures("verify", started=now - 3600, status="ok", finished=True)
    running = {"state": "running", "started": now, "result": None}
    assert job_figures(old, "verify", running) is None
    fresh = figures("verify", started=now + 1)
    assert job_figures(fresh, "verify", running) == fresh
    # Ended: the job file's time is its end; figures started within the module's run time are its own.
    ended = {"state": "ended", "started": now + 30, "result": {"duration_s": 29.5}}
    assert job_figures(fresh, "verify", ended) == fresh and job_figures(old, "verify", ended) is None
    # A job that failed with no run time (lock held): only figures written right at its end count.
    refused = {"state": "ended", "started": now, "result": {"failed": True, "msg": "lock"}}
    assert job_figures(old, "verify", refused) is None
    assert job_figures(figures("verify", started=now - 2), "verify", refused) is not None


def test_progress_has_every_key_null_or_zero_before_the_first_figures():
    shaped = shape_progress(None, REPO, "verify")
    assert sorted(shaped) == sorted(dgx_job_poll.PROGRESS_KEYS)
    assert shaped["repo_id"] == REPO and shaped["pass"] == "verify"
    assert (shaped["bytes_done"], shaped["bytes_total"], shaped["files_done"], shaped["files_total"]) == (0, 0, 0, 0)
    assert shaped["updated_at"] is None and shaped["mib_per_s"] is None and shaped["eta_s"] is None
    assert shaped["finished"] is False and shaped["aborted"] is False


def test_progress_keeps_the_figures_and_tolerates_wrong_types():
    shaped = shape_progress(figures(), REPO, "stage")
    assert shaped["bytes_done"] == 12 * GIB + 300 * MIB and shaped["files_total"] == 14
    assert shaped["percent"] == pytest.approx(4.1, abs=0.05) and shaped["current"] == "model-00003.safetensors"
    odd = shape_progress(figures(bytes_done="many", mib_per_s=True, current=7, eta_s="x"), REPO, "stage")
    assert odd["bytes_done"] == 0 and odd["mib_per_s"] is None and odd["current"] is None and odd["eta_s"] is None
    # 100% only once finished; a pass with no bytes to read counts by files.
    assert shape_progress(figures(bytes_done=10, bytes_total=10), REPO, "stage")["percent"] == 99.9
    assert shape_progress(figures(bytes_done=10, bytes_total=10, finished=True), REPO, "stage")["percent"] == 100
    assert shape_progress(figures(bytes_done=0, bytes_total=0, files_done=1, files_total=4), REPO,
                          "verify")["percent"] == 25


# ---- the line ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (44.6, "45s"), (372, "6m12s"), (3720, "1h02m"),
                                           (-3, "0s")])
def test_eta_text(seconds, text):
    assert human_eta(seconds) == text


def test_the_line_of_a_running_copy():
    line = progress_line(shape_progress(figures(), REPO, "stage"))
    assert line == ("stage org/model: 12.3 GiB of 300.0 GiB (4%), 2/14 files, 812 MiB/s, ETA 6m12s, "
                    "current: model-00003.safetensors")


def test_figures_a_hand_edit_made_infinite_read_as_unknown():
    shaped = shape_progress(figures(bytes_done=float("inf"), max_mib_s=float("inf")), REPO, "stage")
    assert (shaped["bytes_done"], shaped["max_mib_s"]) == (0, 0)
    assert progress_line(shaped).startswith("stage org/model: 0 B of 300.0 GiB")


def test_the_line_of_a_capped_copy_names_its_cap():
    line = progress_line(shape_progress(figures(mib_per_s=47.6, max_mib_s=48), REPO, "stage"))
    assert ", 48 MiB/s (cap 48), ETA" in line
    assert shape_progress(figures(), REPO, "stage")["max_mib_s"] == 0


def test_the_line_before_figures_without_a_rate_and_at_the_end():
    assert progress_line(shape_progress(None, REPO, "verify")) == "verify org/model: starting (no figures yet)"
    early = progress_line(shape_progress(figures(mib_per_s=None, eta_s=None, current=None), REPO, "stage"))
    assert early == "stage org/model: 12.3 GiB of 300.0 GiB (4%), 2/14 files"
    done = shape_progress(figures(bytes_done=300 * GIB, files_done=14, status="ok", finished=True, eta_s=0.0,
                                  current=None), REPO, "stage")
    assert progress_line(done, True, {"changed": True}) == \
        "stage org/model: done, 300.0 GiB of 300.0 GiB (100%), 14/14 files, 812 MiB/s"
    failed = progress_line(shape_progress(None, REPO, "stage"), True, {"failed": True, "msg": "hf_hub_mirror org/model:"
                                                                       "  1 NAS blob(s)\n do not hold"})
    assert failed == "stage org/model: failed: hf_hub_mirror org/model: 1 NAS blob(s) do not hold"


# ---- one poll ------------------------------------------------------------------------------------------

def test_a_poll_of_a_running_job_shows_its_figures_and_a_short_job_ends_within_the_first_poll(tmp_path):
    dest, jobs = tmp_path / "hub", tmp_path / "hub" / ".locks" / "jobs"
    now = time.time()
    write_job(jobs, "j1.2", RUNNING, mtime=now - 10)
    write_progress(dest, figures(started=now - 5))
    seen = poll(str(jobs), "j1.2", str(dest), REPO)
    assert seen["finished"] is False and seen["progress"]["bytes_total"] == 300 * GIB
    assert seen["line"].startswith("stage org/model: 12.3 GiB of 300.0 GiB")
    # A young job: the poll waits for it (here it ends during the first wait) instead of answering at once.
    write_job(jobs, "j1.3", RUNNING, mtime=now)
    clock = [now]

    def sleep(seconds):
        clock[0] += seconds
        write_job(jobs, "j1.3", {"changed": False, "duration_s": 0.2})

    seen = poll(str(jobs), "j1.3", str(dest), REPO, first_wait=5, clock=lambda: clock[0], sleep=sleep)
    assert seen["finished"] is True and clock[0] - now < 0.1


def test_a_job_waiting_for_another_runs_lock_says_whom_and_never_shows_that_runs_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(dgx_job_poll, "lease_process_gone", lambda path: False)    # the test's pid runs no mirror
    dest, jobs = tmp_path / "hub", tmp_path / "hub" / ".locks" / "jobs"
    now = time.time()
    write_job(jobs, "j1.2", RUNNING, mtime=now - 10)
    lease = str(jobs / "dgx-lease.second.stage.model.org--model")
    dgx_lease.renew_lease(str(dest), lease, os.getpid())          # this job's process, as LeaseWatch.start writes it
    os.utime(lease, (now - 3, now - 3))
    # The first run holds the repo: its figures (pid 4242) started after this job did.
    write_progress(dest, figures(started=now - 5, pid=4242))
    holder = {"pid": 4242, "run_id": "20261201T101648Z-d3b7", "since": "2026-12-01T10:16:50Z"}
    watch = dgx_lease.LeaseWatch(str(dest), lease, 30)
    watch.note_waiting(holder)
    assert int(os.stat(lease).st_mtime) == int(now - 3)         # the job's own note is no renewal
    seen = poll(str(jobs), "j1.2", str(dest), REPO, lease_file=lease)
    assert seen["progress"]["waiting"] == holder and seen["progress"]["bytes_total"] == 0
    assert seen["line"] == ("stage org/model: waiting for another dgx-stage run on this repo to finish: "
                            "run 20261201T101648Z-d3b7 (pid 4242, since 2026-12-01T10:16:50Z)")
    # It holds the lock now: the note is gone and only its own figures are shown.
    watch.note_waiting(None)
    write_progress(dest, figures(started=now - 1, pid=os.getpid()))
    seen = poll(str(jobs), "j1.2", str(dest), REPO, lease_file=lease)
    assert seen["progress"]["waiting"] is None and seen["line"].startswith("stage org/model: 12.3 GiB of 300.0 GiB")


def test_a_renewal_while_the_job_notes_whom_it_waits_for_is_kept(tmp_path, monkeypatch):
    """The job's note puts the lease's mtime back (it is no renewal); a poll renewing the lease meanwhile must not
    be rolled back with it, or the job would stop itself for a lease its controller did renew."""
    dest, jobs = tmp_path / "hub", tmp_path / "hub" / ".locks" / "jobs"
    jobs.mkdir(parents=True)
    lease = str(jobs / "dgx-lease.second.stage.model.org--model")
    dgx_lease.renew_lease(str(dest), lease, os.getpid())
    os.utime(lease, (time.time() - 100, time.time() - 100))
    polls = []

    class NoteThenPoll(object):
        """os for dgx_lease: once the note is written, a poll renews the lease from another thread."""

        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def write(fd, data):
            written = os.write(fd, data)
            if not polls:
                polls.append(threading.Thread(target=dgx_lease.renew_lease, args=(str(dest), lease)))
                polls[0].start()
                polls[0].join(0.5)
            return written

    monkeypatch.setattr(dgx_lease, "os", NoteThenPoll())
    dgx_lease.LeaseWatch(str(dest), lease, 30).note_waiting({"pid": 4242, "run_id": "r", "since": "s"})
    polls[0].join(10)
    assert dgx_lease.lease_age(lease) < 30 and dgx_lease.read_lease(lease)[1] == {"pid": 4242, "run_id": "r",
                                                                                    "since": "s"}


def test_an_ended_job_never_claims_the_figures_of_the_run_that_took_the_lock_after_it(tmp_path):
    now = time.time()
    job = {"state": "ended", "started": now - 60, "result": {"changed": True, "duration_s": 50.0}}
    later_run = {"passes": {"stage": figures(started=now - 2, pid=4242)}}
    assert job_figures(later_run, "stage", job) is not None          # time alone cannot tell them apart
    assert job_figures(later_run, "stage", job, own_pid=os.getpid()) is None
    own = {"passes": {"stage": figures(started=now - 55, pid=os.getpid())}}
    assert job_figures(own, "stage", job, own_pid=os.getpid()) is not None


def test_a_lease_reads_back_its_pid_and_note_and_tolerates_garbage(tmp_path):
    lease = str(tmp_path / "jobs" / "dgx-lease.r.stage.model.org--model")
    os.mkdir(str(tmp_path / "jobs"))
    dgx_lease.renew_lease(str(tmp_path / "hub"), lease, 4242, {"pid": 7, "run_id": "r", "since": "s"})
    assert dgx_lease.read_lease(lease) == (4242, {"pid": 7, "run_id": "r", "since": "s"})
    dgx_lease.renew_lease(str(tmp_path / "hub"), lease, 4242)
    assert dgx_lease.read_lease(lease) == (4242, None)
    with open(lease, "w") as handle:
        handle.write("4242\n{not json\n")
    assert dgx_lease.read_lease(lease) == (4242, None)
    assert dgx_lease.read_lease(str(tmp_path / "absent")) == (None, None)


def test_a_poll_of_a_missing_job_ends_it_with_the_reason(tmp_path):
    seen = poll(str(tmp_path / "jobs"), "j5.6", str(tmp_path), REPO)
    assert seen["finished"] is True and seen["job"]["result"]["failed"] is True
    assert "no job file" in seen["line"] and "j5.6" in seen["line"]


# ---- the jobs dir --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, age, ended", [
    ("j123.456", 100, False),              # a result another run has yet to collect, or a running job
    ("j123.456", 86400 + 61, True),        # a result nobody collected, or a wrapper killed long ago
    ("j123.456.tmp", 5, False),            # a write in progress
    ("j123.456.tmp", 61, True),
    ("dgx-lease.r.stage.model.org--m", 100, False),
    ("dgx-lease.r.stage.model.org--m", 86400 + 61, True),
    ("notes.txt", 10 ** 6, False),         # not a job file name
    ("j123", 10 ** 6, False),
    ("j12.34.bak", 10 ** 6, False),
])
def test_only_job_files_of_ended_jobs_are_removable(name, age, ended):
    assert ended_job_file(name, age, 86400) is ended


def test_prepare_removes_ended_jobs_files_only_and_keeps_a_decoy(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "j1.1", {"changed": False}, mtime=time.time() - 86400 - 120)
    write_job(jobs, "j1.2", RUNNING)
    write_job(jobs, "j1.3.tmp", "", mtime=time.time() - 120)
    write_job(jobs, "decoy", {"changed": False})
    (jobs / "j7.7").mkdir()                                    # a directory with a job's name is not a job file
    os.symlink(str(jobs / "decoy"), str(jobs / "j8.8"))        # nor a link
    assert prepare_jobs_dir(str(dest), str(jobs), 86400, check_mode=True) == {"created": False,
                                                                               "removed": ["j1.1", "j1.3.tmp"]}
    assert len(os.listdir(str(jobs))) == 6
    assert prepare_jobs_dir(str(dest), str(jobs), 86400) == {"created": False, "removed": ["j1.1", "j1.3.tmp"]}
    assert sorted(os.listdir(str(jobs))) == ["decoy", "j1.2", "j7.7", "j8.8"]


def test_prepare_keeps_the_fresh_result_of_a_run_still_at_work_on_its_next_repo(tmp_path):
    # Run A's first repo ended (its result waits in its job file for A's result step, after A's last repo);
    # run B starts on the same hub meanwhile: B's prepare must not take A's result away.
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "j1.1", {"changed": True, "summary": "copied 3 files"}, mtime=time.time() - 3600)
    assert prepare_jobs_dir(str(dest), str(jobs), 86400)["removed"] == []
    got = run_main("mirror_job", {"mode": "result", "dest": str(dest), "async_dir": str(jobs), "jid": "j1.1",
                                      "repo_id": REPO})
    assert got.get("failed") is not True and got["summary"] == "copied 3 files"


def test_a_jobs_dir_outside_the_hub_is_never_cleared_nor_removed(tmp_path):
    # stage_async_dir pointed at a shared dir (Ansible's own ~/.ansible_async, /tmp): its files are not ours.
    dest = tmp_path / "hub"
    dest.mkdir()
    shared = tmp_path / "ansible_async"
    old = time.time() - 2 * 86400
    write_job(shared, "j5.5", {"changed": False}, mtime=old)         # another playbook's job, long ended
    write_job(shared, "j5.6.tmp", "", mtime=old)
    write_job(shared, "dgx-lease.other", "", mtime=old)
    assert prepare_jobs_dir(str(dest), str(shared), 600, check_mode=True) == {"created": False, "removed": []}
    assert prepare_jobs_dir(str(dest), str(shared), 600) == {"created": False, "removed": []}
    assert sorted(os.listdir(str(shared))) == ["dgx-lease.other", "j5.5", "j5.6.tmp"]
    empty = tmp_path / "jobs"
    assert prepare_jobs_dir(str(dest), str(empty), 600, check_mode=True)["created"] is True and not empty.exists()
    assert prepare_jobs_dir(str(dest), str(empty), 600)["created"] is True and empty.is_dir()
    assert dgx_jobs.prune_jobs_dir(str(dest), str(empty)) == [] and empty.is_dir()    # the operator's dir
    assert dgx_jobs.prune_jobs_dir(str(dest), str(tmp_path)) == [] and tmp_path.is_dir()


@pytest.mark.parametrize("inside", ["models--org--model", "jobs", os.path.join("models--org--model", "blobs")])
def test_a_jobs_dir_inside_the_hub_but_not_under_locks_is_refused(tmp_path, inside):
    dest = tmp_path / "hub"
    (dest / "models--org--model" / "blobs").mkdir(parents=True)
    write_job(dest / "models--org--model", "j5.5", {"changed": False}, mtime=time.time() - 2 * 86400)
    with pytest.raises(StageError) as refused:
        prepare_jobs_dir(str(dest), str(dest / inside), 600)
    assert "not under its .locks" in str(refused.value) and "stage_async_dir" in str(refused.value)
    assert (dest / "models--org--model" / "j5.5").exists() and not (dest / "jobs").exists()


def test_prepare_creates_the_dir_and_refuses_a_symlinked_locks_or_jobs_dir(tmp_path):
    dest = tmp_path / "hub"
    dest.mkdir()
    assert prepare_jobs_dir(str(dest), str(dest / ".locks" / "jobs"), 60, check_mode=True)["created"] is True
    assert not (dest / ".locks").exists()
    assert prepare_jobs_dir(str(dest), str(dest / ".locks" / "jobs"), 60)["created"] is True
    assert (dest / ".locks" / "jobs").is_dir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = tmp_path / "hub2"
    other.mkdir()
    os.symlink(str(elsewhere), str(other / ".locks"))
    with pytest.raises(StageError) as refused:
        prepare_jobs_dir(str(other), str(other / ".locks" / "jobs"), 60)
    assert str(other / ".locks") in str(refused.value) and "stage_async_dir" in str(refused.value)
    assert os.listdir(str(elsewhere)) == []
    os.symlink(str(elsewhere), str(tmp_path / "jobs-link"))
    with pytest.raises(StageError):                            # outside the hub: the dir itself is checked
        prepare_jobs_dir(str(dest), str(tmp_path / "jobs-link"), 60)
    assert os.listdir(str(elsewhere)) == []


# ---- the module ----------------------------------------------------------------------------------------

def test_module_results_match_their_docs(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    dest.mkdir()
    args = {"mode": "prepare", "dest": str(dest), "async_dir": str(jobs)}
    check_result("mirror_job", args, run_main("mirror_job", dict(args, _ansible_check_mode=True)))
    prepared = check_result("mirror_job", args, run_main("mirror_job", args))
    assert prepared["created"] is True and prepared["changed"] is True
    write_job(jobs, "j1.2", RUNNING)
    args = {"dest": str(dest), "async_dir": str(jobs), "jid": "j1.2", "repo_id": REPO}
    polled = check_result("mirror_job", args, run_main("mirror_job", args))
    assert polled["finished"] is False and polled["changed"] is False and polled["line"].endswith("starting "
                                                                                                 "(no figures yet)")
    (dest / ".locks").mkdir(exist_ok=True)
    os.symlink(str(tmp_path), str(dest / ".locks" / "jobs-link"))
    args = {"mode": "prepare", "dest": str(dest), "async_dir": str(dest / ".locks" / "jobs-link")}
    refused = check_result("mirror_job", args, run_main("mirror_job", args), expect_failure=True)
    assert str(dest / ".locks" / "jobs-link") in refused["msg"] and "is a symlink" in refused["msg"]


def test_the_result_step_returns_the_jobs_own_result_and_removes_its_file(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    mirror = {"changed": True, "summary": "copied 3 files", "report": {"status": "ok"}, "duration_s": 1.0,
              "warnings": ["a repair"], "invocation": {"module_args": {"repo_id": REPO}}}
    write_job(jobs, "j1.2", dict(mirror, ansible_job_id="j1.2"))
    write_progress(dest, figures(status="ok", finished=True, started=time.time() - 1))
    args = {"mode": "result", "dest": str(dest), "async_dir": str(jobs), "jid": "j1.2", "repo_id": REPO}
    got = run_main("mirror_job", args)
    assert {k: got[k] for k in mirror} == mirror and "ansible_job_id" not in got
    assert got["finished"] is True and got["progress"]["finished"] is True and got["line"].startswith(
        "stage org/model: done, ")
    assert not (jobs / "j1.2").exists()
    write_job(jobs, "j1.3", {"failed": True, "msg": "hf_hub_mirror org/model: 1 NAS blob(s) do not hold"})
    failed = run_main("mirror_job", dict(args, jid="j1.3"))
    assert failed["failed"] is True and failed["msg"] == "hf_hub_mirror org/model: 1 NAS blob(s) do not hold"
    assert not (jobs / "j1.3").exists()
    write_job(jobs, "j1.4", RUNNING)
    early = run_main("mirror_job", dict(args, jid="j1.4"))
    assert early["failed"] is True and "still running" in early["msg"] and (jobs / "j1.4").exists()


def test_a_job_the_async_wrapper_killed_or_that_died_fails_with_words_not_a_traceback(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    # What async_wrapper writes when it killed the job at the time limit, and when the module printed nothing.
    write_job(jobs, "j1.5", {"msg": "Timeout exceeded", "failed": True, "child_pid": 4242})
    write_job(jobs, "j1.6", {"failed": True, "cmd": "/usr/bin/python3 /root/.ansible/tmp/x/AnsiballZ_hf_hub_mirror.py",
                             "data": "", "stderr": "", "msg": "Traceback (most recent call last):\n  File ...\n"
                             "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n",
                             "ansible_job_id": "j1.6"})
    args = {"mode": "result", "dest": str(dest), "async_dir": str(jobs), "jid": "j1.5", "repo_id": REPO,
            "async_timeout": 600}
    timed_out = run_main("mirror_job", args)
    assert timed_out["failed"] is True
    assert timed_out["msg"].startswith("hf_hub_mirror org/model: the background stage job ran past")
    assert "stage_async_timeout, 600 s" in timed_out["msg"] and "Raise stage_async_timeout" in timed_out["msg"]
    assert "stage_async_timeout" in timed_out["line"]
    died = run_main("mirror_job", dict(args, jid="j1.6", phase="verify"))
    assert died["failed"] is True and "Traceback" not in died["msg"] and "Traceback" not in died["line"]
    assert died["msg"].startswith("hf_hub_mirror org/model: the background verify job ended without a result: "
                                  "its process was killed") and "Re-run" in died["msg"]
    mirror_own = {"failed": True, "msg": "hf_hub_mirror org/model: 1 NAS blob(s) do not hold",
                  "invocation": {"module_args": {}}}
    assert dgx_jobs.explain_wrapper_result(mirror_own, REPO, "stage") == mirror_own


def dead_pid():
    import subprocess
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_job_whose_process_died_with_its_wrapper_ends_at_the_next_poll_not_at_the_time_limit(tmp_path,
                                                                                                 monkeypatch):
    # kill -9 of the whole async_wrapper tree (or a wrapper that could not write its result) leaves the job file
    # saying running: without a look at the job's process the polls went on until stage_async_timeout (a day).
    monkeypatch.setattr(dgx_jobs, "DEAD_JOB_GRACE_S", 0.3)
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "j2.1", RUNNING, mtime=time.time() - 600)
    lease = str(jobs / "dgx-lease.run.stage.model.org--model")
    args = {"dest": str(dest), "async_dir": str(jobs), "jid": "j2.1", "repo_id": REPO, "lease_file": lease}
    import subprocess
    import sys
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "AnsiballZ_hf_hub_mirror.py"])
    try:
        deadline = time.time() + 10         # the interpreter's launcher may exec again before it runs
        while b"hf_hub_mirror" not in open("/proc/%d/cmdline" % job.pid, "rb").read() and time.time() < deadline:
            time.sleep(0.05)
        dgx_lease.renew_lease(str(dest), lease, job.pid)     # a live job: still running
        alive = run_main("mirror_job", args)
        assert alive["finished"] is False, alive["line"]
        dgx_lease.renew_lease(str(dest), lease, os.getpid())     # a live process that is not the job (a reused pid)
        assert run_main("mirror_job", args)["finished"] is True
    finally:
        processes.kill_tree(job)
    dgx_lease.renew_lease(str(dest), lease, dead_pid())
    dgx_lease.renew_lease(str(dest), lease)      # a poll's renewal keeps the pid
    gone = run_main("mirror_job", args)
    assert gone["finished"] is True
    assert "failed: hf_hub_mirror org/model: the background stage job's process" in gone["line"]
    result = run_main("mirror_job", dict(args, mode="result"))
    assert result["failed"] is True and "Re-run to finish" in result["msg"] and str(jobs / "j2.1") in result["msg"]
    assert not (jobs / "j2.1").exists() and not os.path.exists(lease)
    assert dgx_lease.lease_process_gone(str(tmp_path / "no-lease")) is False


def test_a_job_that_ended_on_a_full_disk_says_the_disk_is_full_and_the_fix(tmp_path, monkeypatch):
    # Seen on an 8 MiB tmpfs filled mid-copy: the wrapper could write neither the mirror's result nor (for the
    # next repo) its start file; the mirror's own ENOSPC message is lost, so the poll names the disk instead.
    monkeypatch.setattr(dgx_jobs, "DEAD_JOB_GRACE_S", 0.1)
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "j3.1", RUNNING, mtime=time.time() - 600)
    lease = str(jobs / "dgx-lease.z")
    dgx_lease.renew_lease(str(dest), lease, dead_pid())
    real = os.statvfs(str(jobs))
    full = os.statvfs_result((real.f_bsize, real.f_frsize, real.f_blocks, 0, 0, real.f_files, real.f_ffree,
                              real.f_favail, real.f_flag, real.f_namemax))
    monkeypatch.setattr(dgx_jobs.os, "statvfs", lambda path: full)
    dead = poll(str(jobs), "j3.1", str(dest), REPO, lease_file=lease)["job"]["result"]["msg"]
    missing = poll(str(jobs), "j3.2", str(dest), REPO)["job"]["result"]["msg"]
    for msg in (dead, missing):
        assert "The disk of %s is full (0 bytes free)" % jobs in msg and "Free space on that disk" in msg
    monkeypatch.setattr(dgx_jobs.os, "statvfs", lambda path: real)
    assert "is full" not in poll(str(jobs), "j3.2", str(dest), REPO)["job"]["result"]["msg"]


def test_a_job_whose_process_just_ended_is_read_with_its_result_not_declared_dead(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "j2.2", {"changed": False, "summary": "nothing to copy"})
    lease = str(jobs / "dgx-lease.x")
    dgx_lease.renew_lease(str(dest), lease, dead_pid())
    got = poll(str(jobs), "j2.2", str(dest), REPO, lease_file=lease)
    assert got["finished"] is True and got["job"]["result"]["summary"] == "nothing to copy"


# ---- the lease -----------------------------------------------------------------------------------------

def test_a_lease_holds_while_renewed_and_stops_the_process_once_when_not(tmp_path):
    path = str(tmp_path / "dgx-lease.run.stage.model.org--model")
    stopped = []
    now = [time.time()]
    watch = dgx_lease.LeaseWatch(str(tmp_path / "hub"), path, 30, stop_process=lambda: stopped.append(True), clock=lambda: now[0])
    assert watch.expired() == "its lease file %s is gone" % path
    dgx_lease.renew_lease(str(tmp_path / "hub"), path)
    assert watch.check() is False and stopped == []
    now[0] = time.time() + 31.5               # from the renewal's own time: 31 s whatever the clock did meanwhile
    assert watch.check() is True and watch.check() is True and stopped == [True]      # stopped once
    assert "not renewed for 31 s" in watch.fired and "controller" in watch.message()
    dgx_lease.renew_lease(str(tmp_path / "hub"), path)                  # a poll renews it (mtime is now)
    now[0] = time.time()
    assert watch.expired() is None
    dgx_lease.end_lease(str(tmp_path / "hub"), path)
    assert dgx_lease.lease_age(path) is None


def test_a_renewed_lease_still_stops_the_job_at_its_time_limit_with_the_setting_to_raise(tmp_path):
    # At stage_async_timeout the async wrapper SIGKILLs the job (temp files left, "Timeout exceeded"): the job
    # stops itself first, through the interrupted path, saying which setting to raise.
    path = str(tmp_path / "dgx-lease.t")
    stopped = []
    now = [time.time()]
    watch = dgx_lease.LeaseWatch(str(tmp_path / "hub"), path, 120, stop_process=lambda: stopped.append(True), clock=lambda: now[0],
                                time_limit=600)
    dgx_lease.renew_lease(str(tmp_path / "hub"), path)
    now[0] += 599
    dgx_lease.renew_lease(str(tmp_path / "hub"), path)
    os.utime(path, (now[0], now[0]))
    assert watch.check() is False and stopped == []
    now[0] += 1
    assert watch.check() is True and stopped == [True]
    assert "time limit of 600 s was reached" in watch.message() and "raise stage_async_timeout" in watch.message()
    assert dgx_lease.LeaseWatch(str(tmp_path / "hub"), path, 120).deadline is None          # no time limit by default
    assert dgx_lease.LeaseWatch(str(tmp_path / "hub"), path, 120, time_limit=4).every == 1.0   # looked at before the wrapper's kill


def test_a_started_lease_watch_fires_from_its_thread(tmp_path):
    path = str(tmp_path / "dgx-lease.x")
    fired = []
    watch = dgx_lease.LeaseWatch(str(tmp_path / "hub"), path, 0.3, every=0.05, stop_process=lambda: fired.append(time.time())).start()
    try:
        assert os.path.exists(path)                 # the start is a renewal
        deadline = time.time() + 5
        while not fired and time.time() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    assert len(fired) == 1 and watch.fired


def test_a_lease_is_not_written_once_locks_was_replaced_by_a_symlink_after_prepare(tmp_path):
    # prepare checked .locks; by the job's start (or a later poll) it points elsewhere: neither the job nor a
    # poll writes its lease there, and the job refuses to run.
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    dest.mkdir()
    prepare_jobs_dir(str(dest), str(jobs), 600)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "dgx-stage-async").mkdir(parents=True)
    os.rename(str(dest / ".locks"), str(tmp_path / "old-locks"))
    os.symlink(str(elsewhere), str(dest / ".locks"))
    lease = str(jobs / "dgx-lease.run.stage.model.org--model")
    job = run_main("hf_hub_mirror", {"src": str(tmp_path / "nas"), "dest": str(dest), "repo_id": REPO,
                                     "lease_file": lease})
    assert job["failed"] is True and "lease_file" in job["msg"] and "symlink" in job["msg"]
    write_job(elsewhere / "dgx-stage-async", "j4.1", RUNNING)
    polled = run_main("mirror_job", {"dest": str(dest), "async_dir": str(jobs), "jid": "j4.1", "repo_id": REPO,
                                         "lease_file": lease})
    assert polled["failed"] is True and "is not renewed" in polled["msg"] and "symlink" in polled["msg"]
    assert os.listdir(str(elsewhere / "dgx-stage-async")) == ["j4.1"]       # no lease written through the link


def test_a_lease_file_is_never_followed_through_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    os.symlink(str(target), str(tmp_path / "dgx-lease.y"))
    dgx_lease.renew_lease(str(tmp_path / "hub"), str(tmp_path / "dgx-lease.y"), 4242)
    assert target.read_text() == "keep"
    assert not os.path.islink(str(tmp_path / "dgx-lease.y"))      # replaced by a file of its own
    assert (tmp_path / "dgx-lease.y").read_text() == "4242\n"


def test_prepare_removes_only_leases_older_than_the_time_limit(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "dgx-lease.old", "", mtime=time.time() - 700)
    write_job(jobs, "dgx-lease.fresh", "")
    write_job(jobs, "lease.other", "", mtime=time.time() - 700)
    assert prepare_jobs_dir(str(dest), str(jobs), 600)["removed"] == ["dgx-lease.old"]
    assert sorted(os.listdir(str(jobs))) == ["dgx-lease.fresh", "lease.other"]


def test_an_emptied_jobs_dir_is_removed_with_an_empty_locks_but_never_the_hub_root(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    jobs.mkdir(parents=True)
    (dest / ".locks" / "models--org--model").mkdir()
    assert dgx_jobs.prune_jobs_dir(str(dest), str(jobs)) == [str(jobs)]          # .locks holds a repo's lock dir
    jobs.mkdir()
    write_job(jobs, "decoy", "")
    assert dgx_jobs.prune_jobs_dir(str(dest), str(jobs)) == []                   # holds a file: kept
    os.unlink(str(jobs / "decoy"))
    os.rmdir(str(dest / ".locks" / "models--org--model"))
    assert dgx_jobs.prune_jobs_dir(str(dest), str(jobs)) == [str(jobs), str(dest / ".locks")]
    assert os.listdir(str(dest)) == []
    assert dgx_jobs.prune_jobs_dir(str(dest), str(dest)) == [] and dest.is_dir()
    with pytest.raises(StageError):
        prepare_jobs_dir(str(dest), str(dest), 60)


def test_a_lease_planted_as_a_hard_link_is_replaced_and_its_other_name_never_written(tmp_path):
    outside = tmp_path / "outside.conf"
    outside.write_text("keep me")
    os.utime(str(outside), (1000000000, 1000000000))
    lease = tmp_path / "dgx-lease.run.stage.model.org--name"
    os.link(str(outside), str(lease))
    dgx_lease.renew_lease(str(tmp_path / "hub"), str(lease), 4242)
    dgx_lease.renew_lease(str(tmp_path / "hub"), str(lease))
    assert outside.read_text() == "keep me" and os.stat(str(outside)).st_mtime == 1000000000
    assert lease.read_text() == "4242\n" and os.stat(str(lease)).st_nlink == 1


def test_the_result_step_removes_nothing_through_a_locks_folder_swapped_for_a_link(tmp_path):
    # .locks replaced by a link to another folder between the job's start and its result step: the job file,
    # the lease and the emptied jobs dir there are not this run's, and stay.
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    jobs.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    write_job(elsewhere / "dgx-stage-async", "j5.1", {"changed": False})
    write_job(elsewhere / "dgx-stage-async", "dgx-lease.z", "")
    (elsewhere / "empty" / "dgx-stage-async").mkdir(parents=True)
    os.rename(str(dest / ".locks"), str(tmp_path / "old-locks"))
    os.symlink(str(elsewhere), str(dest / ".locks"))
    with pytest.raises(StageError):
        dgx_jobs.remove_job(str(dest), str(jobs), "j5.1")
    with pytest.raises(StageError):
        dgx_lease.end_lease(str(dest), str(jobs / "dgx-lease.z"))
    assert sorted(os.listdir(str(elsewhere / "dgx-stage-async"))) == ["dgx-lease.z", "j5.1"]
    os.unlink(str(dest / ".locks"))
    os.symlink(str(elsewhere / "empty"), str(dest / ".locks"))
    assert dgx_jobs.prune_jobs_dir(str(dest), str(jobs)) == []
    assert os.path.isdir(str(elsewhere / "empty" / "dgx-stage-async"))


def test_the_result_step_removes_the_job_file_the_lease_and_the_emptied_folders(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "j6.1", {"changed": False})
    write_job(jobs, "j6.1.tmp", "")
    dgx_lease.renew_lease(str(dest), str(jobs / "dgx-lease.q"))
    assert dgx_jobs.remove_job(str(dest), str(jobs), "j6.1") == ["j6.1", "j6.1.tmp"]
    assert dgx_lease.end_lease(str(dest), str(jobs / "dgx-lease.q")) is True
    assert dgx_lease.end_lease(str(dest), str(jobs / "dgx-lease.q")) is False
    assert dgx_jobs.prune_jobs_dir(str(dest), str(jobs)) == [str(jobs), str(dest / ".locks")]
    assert dgx_jobs.remove_job(str(dest), str(jobs), "j6.1") == []


def test_a_lease_file_not_named_as_a_lease_is_refused_and_nothing_is_written_or_removed(tmp_path):
    dest = tmp_path / "hub"
    jobs = dest / ".locks" / "dgx-stage-async"
    write_job(jobs, "settings.conf", "keep")
    for act in (lambda: dgx_lease.renew_lease(str(dest), str(jobs / "settings.conf"), 4242),
                lambda: dgx_lease.end_lease(str(dest), str(jobs / "settings.conf"))):
        with pytest.raises(StageError) as refused:
            act()
        assert "is not a lease file" in str(refused.value)
    assert (jobs / "settings.conf").read_text() == "keep"
