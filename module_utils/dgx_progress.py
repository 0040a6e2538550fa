# -*- coding: utf-8 -*-
"""Watching a background hf_hub_mirror job: its Ansible job file, its repo's progress file, one human line.

The stage role runs each repo's stage and verify pass as an Ansible async job (`async`, `poll: 0`) and polls
it with the stage_progress module, which is a thin wrapper around these functions:
- prepare_jobs_dir: the jobs directory (refused when it or `.locks` is a symlink), cleared of the job
  files that ended jobs of earlier runs left (only names Ansible's async_wrapper gives its files);
- read_job: the state of one job from its job file (running, ended with its result, or missing);
- pass_figures / shape_progress: the repo's progress file (dgx_progress_file), read whatever state it is
  in, reduced to the figures of the pass this job runs;
- progress_line: one line for the operator, binary units, rate and ETA.

Runs on the nodes' system Python: stdlib only, Python 3.8 syntax.
"""
from __future__ import absolute_import, division, print_function

import errno
import json
import os
import re
import signal
import stat
import threading
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import open_own_file
from ansible.module_utils.dgx_hubcache import repo_folder_name
from ansible.module_utils.dgx_localtree import LocalDir, LocalTree, linked_dir_problem
from ansible.module_utils.dgx_progress_file import repo_document
from ansible.module_utils.dgx_repolock import holder_text
from ansible.module_utils.dgx_units import human_bytes, utc_epoch

# What Ansible's async_wrapper names its files: j<random>.<pid>, and <that>.tmp while it writes one.
JOB_FILE = re.compile(r"^j\d+\.\d+(\.tmp)?$")
# The stage role's job leases, next to the job files: dgx-lease.<run id>.<pass>.<repo type>.<repo>.
LEASE_FILE = re.compile(r"^dgx-lease\.[A-Za-z0-9_.-]+$")
# A job file or its temp that is older than this and still says "running" was left by a killed wrapper
# (a wrapper writes its .tmp in milliseconds, and kills its job at the async time limit).
TMP_STALE_S = 60
# Seconds a poll waits for the result of a job whose process it saw gone (its wrapper writes it right after).
DEAD_JOB_GRACE_S = 5
# The keys every `progress` dict has (null or 0 before the job wrote its first figures).
PROGRESS_KEYS = ("repo_id", "pass", "step", "current", "files_done", "files_total", "bytes_done", "bytes_total",
                 "percent", "mib_per_s", "eta_s", "status", "finished", "aborted", "error", "started_at",
                 "updated_at", "waiting")
READ_LIMIT = 1024 * 1024


# ---- files ----------------------------------------------------------------------------------------------

def read_json_file(path):
    """The JSON object in `path` (never through a final symlink), or None when the file is missing, not
    a regular file, empty, half-written or not a JSON object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, READ_LIMIT).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


# ---- the job file ---------------------------------------------------------------------------------------

def job_state(data):
    """`running` or `ended` from a job file's JSON (None: empty or unreadable, as while it is first written).
    async_wrapper writes {started, finished: false} when the job starts and the module's result at the end."""
    if data is None:
        return "running"
    if "started" in data and not data.get("finished"):
        return "running"
    return "ended"


def read_job(async_dir, jid):
    """The job's state: {state: running|ended|missing, result: the module's result once ended, started:
    epoch seconds the job file was written at (the job's start while it runs), path}."""
    path = os.path.join(async_dir, jid)
    try:
        st = os.lstat(path)
    except OSError:
        return {"state": "missing", "result": None, "started": None, "path": path}
    data = read_json_file(path)
    state = job_state(data)
    return {"state": state, "result": data if state == "ended" else None, "started": st.st_mtime, "path": path}


def remove_job(dest, async_dir, jid):
    """Remove this job's file (and a temp its wrapper left) through the jobs dir's handle; the names removed."""
    removed = []
    try:
        jobs = open_jobs_dir(dest, async_dir)
    except FileNotFoundError:
        return removed
    with jobs:
        for name in (jid, jid + ".tmp"):
            if JOB_FILE.match(name) and _unlink_if_there(name, jobs.fd):
                removed.append(name)
    return removed


def _unlink_if_there(name, dir_fd):
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def prune_jobs_dir(dest, async_dir):
    """Remove the jobs dir when it is empty, and `.locks` above it when that is empty too (a pass that wrote
    nothing else leaves the local hub as it found it); the dirs removed. rmdir only, each relative to its
    parent opened without following a link: never anything that holds a file, never the local hub root, never
    a jobs dir outside the local hub (the operator's). Ansible's async_wrapper creates it again for a job."""
    dest, async_dir = os.path.abspath(dest), os.path.abspath(async_dir)
    locks = os.path.join(dest, ".locks")
    if os.path.dirname(async_dir) != locks and async_dir != locks:
        return []
    removed = []
    try:
        with LocalTree(dest).open_dir("") as hub, LocalTree(dest).open_dir(".locks") as held:
            if async_dir != locks:
                os.rmdir(os.path.basename(async_dir), dir_fd=held.fd)
                removed.append(async_dir)
            os.rmdir(".locks", dir_fd=hub.fd)
            removed.append(locks)
    except (OSError, StageError):
        pass
    return removed


def ended_job_file(name, data, age_s, async_timeout):
    """Whether a file of the jobs dir is a job file of an ended job, safe to remove.

    Only async_wrapper's names count, and only once older than the async time limit (plus TMP_STALE_S). One
    still saying running (or not readable yet) is that old only when its wrapper was killed (a live wrapper
    kills its job at the limit and writes a result). One holding a result is kept as long: another run on
    this hub may still be at work on its next repos and collect it at the end of its pass (its result step
    reads it then), so a fresh result is never taken from it. A temp file ended after TMP_STALE_S.
    """
    if LEASE_FILE.match(name):      # a lease nobody renewed for that long: its job stopped, or ended
        return age_s > max(int(async_timeout or 0), 0) + TMP_STALE_S
    match = JOB_FILE.match(name)
    if not match:
        return False
    if match.group(1):
        return age_s > TMP_STALE_S
    return age_s > max(int(async_timeout or 0), 0) + TMP_STALE_S


def jobs_dir_problem(dest, async_dir):
    """Why the jobs dir cannot be used (it or a directory on its way inside the local hub is a symlink, or
    not a directory), or None. Outside the local hub only the jobs dir itself is checked."""
    dest, async_dir = os.path.abspath(dest), os.path.abspath(async_dir)
    if async_dir == dest:
        return ("the async jobs dir cannot be the local hub root %s itself: set stage_async_dir to a directory of its "
                "own, or leave it empty for <hub_local_root>/.locks/dgx-stage-async" % dest)
    if async_dir.startswith(dest.rstrip(os.sep) + os.sep):
        rel = os.path.relpath(async_dir, dest)
        if rel.split(os.sep)[0] != ".locks":
            # The rest of the hub is the mirror's: its repo folders are pruned of files it does not know.
            return ("the async jobs dir %s is inside the local hub %s but not under its .locks: set stage_async_dir "
                    "to a directory under %s, or outside the hub, or leave it empty for "
                    "<hub_local_root>/.locks/dgx-stage-async" % (async_dir, dest, os.path.join(dest, ".locks")))
        problem = linked_dir_problem(dest, rel)
    else:
        problem = linked_dir_problem(os.path.dirname(async_dir), os.path.basename(async_dir))
    if problem:
        return ("the async jobs dir %s cannot be used: %s. Set stage_async_dir to a real directory, or leave it "
                "empty for <hub_local_root>/.locks/dgx-stage-async" % (async_dir, problem))
    return None


def open_jobs_dir(dest, async_dir, create=False):
    """The jobs dir as a LocalDir: inside the local hub opened component by component from it (no link, no mount
    point: LocalTree), outside it (the operator's folder, a mount point itself maybe) opened without following
    a link; StageError for a link or a folder the jobs dir cannot be (jobs_dir_problem)."""
    problem = jobs_dir_problem(dest, async_dir)
    if problem:
        raise StageError(problem)
    root, rel = _jobs_dir_root(dest, async_dir)
    if root == os.path.abspath(dest):
        return LocalTree(root).open_dir(rel, create=create)
    if create and not os.path.lexists(async_dir):
        try:
            os.mkdir(async_dir, 0o755)
        except FileExistsError:
            pass
    try:
        return LocalDir(os.open(async_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), async_dir)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StageError(jobs_dir_problem(dest, async_dir) or "%s is not a directory" % async_dir)
        raise


def _jobs_dir_root(dest, async_dir):
    """(root, rel) of the jobs dir: the local hub and the path below it, or outside it its parent and its name."""
    dest, async_dir = os.path.abspath(dest), os.path.abspath(async_dir)
    if async_dir.startswith(dest.rstrip(os.sep) + os.sep):
        return dest, os.path.relpath(async_dir, dest)
    return os.path.dirname(async_dir), os.path.basename(async_dir)


def prepare_jobs_dir(dest, async_dir, async_timeout, check_mode=False, now=None):
    """Refuse a symlinked jobs dir (or `.locks` on its way), create it, and remove the job files ended jobs
    of earlier runs left there. Returns {created, removed (names)}; any other file is left alone."""
    problem = jobs_dir_problem(dest, async_dir)
    if problem:
        raise StageError(problem)
    created = not os.path.isdir(async_dir)
    inside = _jobs_dir_root(dest, async_dir)[0] == os.path.abspath(dest)
    if check_mode:
        ended = [] if created or not inside else _ended_jobs(async_dir, None, async_timeout, now)
        return {"created": created, "removed": [name for name, _st in ended]}
    with open_jobs_dir(dest, async_dir, create=True) as jobs:
        # Outside the local hub (stage_async_dir) the jobs dir is never cleared: its other files (Ansible's own
        # async jobs among them) are not this run's to remove. The result step removes this run's files.
        removed = [name for name, _st in (_ended_jobs(jobs.path, jobs.fd, async_timeout, now) if inside else [])
                   if _unlink_if_there(name, jobs.fd)]
    return {"created": created, "removed": removed}


def _ended_jobs(path, dir_fd, async_timeout, now):
    """(name, lstat) of the regular files in the jobs dir that are job files of ended jobs."""
    now = time.time() if now is None else now
    try:
        names = sorted(os.listdir(dir_fd if dir_fd is not None else path))
    except FileNotFoundError:
        return []
    ended = []
    for name in names:
        if not (JOB_FILE.match(name) or LEASE_FILE.match(name)):
            continue
        try:
            st = os.lstat(name, dir_fd=dir_fd) if dir_fd is not None else os.lstat(os.path.join(path, name))
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        data = read_json_file(os.path.join(path, name)) if JOB_FILE.match(name) and not name.endswith(".tmp") \
            else None
        if ended_job_file(name, data, now - st.st_mtime, async_timeout):
            ended.append((name, st))
    return ended


# ---- the progress figures -------------------------------------------------------------------------------

def pass_figures(doc, phase, not_before=None):
    """The figures of pass `phase` in a progress document: its `passes` entry (else the top level when it is
    that pass), or None. not_before: epoch seconds the job started; figures of an earlier run are not this
    job's (the file keeps the last run's figures until the job writes its own)."""
    if not isinstance(doc, dict):
        return None
    passes = doc.get("passes")
    figures = passes.get(phase) if isinstance(passes, dict) else None
    if not isinstance(figures, dict):
        figures = doc if doc.get("pass") == phase else None
    if figures is None:
        return None
    if not_before is not None:
        started = utc_epoch(figures.get("started_at"))
        if started is None or started < int(not_before):
            return None
    return figures


def _number(value, kind=int):
    try:
        return kind(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def shape_progress(figures, repo_id, phase):
    """The `progress` dict of a poll: the PROGRESS_KEYS, null or 0 when there are no figures yet."""
    figures = figures if isinstance(figures, dict) else {}
    done = _number(figures.get("bytes_done")) or 0
    total = _number(figures.get("bytes_total")) or 0
    files_done = _number(figures.get("files_done")) or 0
    files_total = _number(figures.get("files_total")) or 0
    status = figures.get("status") if isinstance(figures.get("status"), str) else None
    finished = figures.get("finished") is True
    if total > 0:
        percent = 100.0 if finished else min(99.9, 100.0 * done / total)
    elif files_total > 0:
        percent = 100.0 * files_done / files_total
    else:
        percent = 100.0 if finished else 0.0
    current = figures.get("current")
    return {
        "repo_id": repo_id, "pass": phase,
        "step": figures.get("step") if isinstance(figures.get("step"), str) else None,
        "current": current if isinstance(current, str) else None,
        "files_done": files_done, "files_total": files_total, "bytes_done": done, "bytes_total": total,
        "percent": round(percent, 1), "mib_per_s": _number(figures.get("mib_per_s"), float),
        "eta_s": _number(figures.get("eta_s"), float), "status": status, "finished": finished,
        "aborted": figures.get("aborted") is True,
        "error": figures.get("error") if isinstance(figures.get("error"), str) else None,
        "started_at": figures.get("started_at") if isinstance(figures.get("started_at"), str) else None,
        "updated_at": figures.get("updated_at") if isinstance(figures.get("updated_at"), str) else None,
        "waiting": None,
    }


# ---- the line -------------------------------------------------------------------------------------------

def human_rate(mib_per_s):
    """812 MiB/s, 9.5 MiB/s."""
    return ("%.0f MiB/s" if mib_per_s >= 10 else "%.1f MiB/s") % mib_per_s


def human_eta(seconds):
    """ETA text: 45s, 6m12s, 1h02m."""
    seconds = int(round(max(0.0, float(seconds))))
    if seconds < 60:
        return "%ds" % seconds
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return "%dm%02ds" % (minutes, secs)
    hours, minutes = divmod(minutes, 60)
    return "%dh%02dm" % (hours, minutes)


def progress_line(progress, finished=False, job_result=None):
    """One line for the operator: `stage org/x: 12.3 GiB of 300.0 GiB (4%), 812 MiB/s, ETA 6m12s, current:
    model-00003.safetensors`; before the first figures, `starting`; once the job ended, how it ended."""
    head = "%s %s" % (progress.get("pass") or "stage", progress.get("repo_id") or "?")
    failed = isinstance(job_result, dict) and bool(job_result.get("failed"))
    has_figures = progress.get("updated_at") is not None
    if not has_figures:
        if finished:
            return "%s: %s" % (head, _ended_text(job_result, failed))
        if progress.get("waiting"):
            return "%s: waiting for another dgx-stage run on this repo to finish: %s" % (
                head, holder_text(progress["waiting"]))
        return "%s: starting (no figures yet)" % head
    parts = ["%s of %s (%d%%)" % (human_bytes(progress["bytes_done"]), human_bytes(progress["bytes_total"]),
                                  int(progress["percent"]))]
    if progress.get("files_total"):
        parts.append("%d/%d files" % (progress["files_done"], progress["files_total"]))
    if progress.get("mib_per_s") is not None:
        parts.append(human_rate(progress["mib_per_s"]))
    if finished or progress.get("finished") or progress.get("aborted"):
        return "%s: %s, %s" % (head, _ended_text(job_result, failed or progress.get("aborted"), progress),
                               ", ".join(parts))
    if progress.get("eta_s") is not None:
        parts.append("ETA %s" % human_eta(progress["eta_s"]))
    if progress.get("current"):
        parts.append("current: %s" % progress["current"])
    return "%s: %s" % (head, ", ".join(parts))


def _ended_text(job_result, failed, progress=None):
    if failed:
        msg = (job_result or {}).get("msg") or (progress or {}).get("error") or (progress or {}).get("status")
        first = " ".join(str(msg or "").split())
        return "failed" + (": " + (first if len(first) <= 160 else first[:157] + "...") if first else "")
    return "done"


def job_figures(doc, phase, job, own_pid=None):
    """This job's figures of pass `phase` from the progress document, or None (none yet, or another run's).
    own_pid (the job's process, from its lease): figures another process wrote are never its own - a run
    waiting for the repo lock, or one that took it after this job ended, writes the same file. Besides, while
    the job runs its file's time is its start: figures started since then are its own. Once it ended the
    file's time is its end: figures that started within the module's own run time before it (its result's
    duration_s), else that were last written by then, are its own."""
    if job["started"] is None:
        return None
    if own_pid is not None and isinstance(doc, dict):
        figures = pass_figures(doc, phase)
        if figures is not None and figures.get("pid") != own_pid:
            return None
    if job["state"] == "running":
        return pass_figures(doc, phase, not_before=job["started"])
    figures = pass_figures(doc, phase)
    if figures is None:
        return None
    duration = _number((job["result"] or {}).get("duration_s"), float)
    if duration is not None:
        started = utc_epoch(figures.get("started_at"))
        return figures if started is not None and started >= int(job["started"] - duration) - 2 else None
    updated = utc_epoch(figures.get("updated_at"))
    return figures if updated is not None and updated >= int(job["started"]) - 2 else None


def wait_while_young(async_dir, jid, first_wait, clock=time.time, sleep=time.sleep):
    """read_job, after waiting for the job to end while it is younger than first_wait seconds (its job file's
    time is its start): a job shorter than that ends within its first poll, with no retry and no delay."""
    pause = 0.05
    while True:
        job = read_job(async_dir, jid)
        if job["state"] != "running":
            return job
        left = job["started"] + float(first_wait or 0) - clock()
        if left <= 0:
            return job
        sleep(min(pause, left))
        pause = min(pause * 2, 0.25)


def explain_wrapper_result(result, repo_id, phase, async_timeout=None):
    """The result of a job that ended without the mirror's own result, worded for the operator; any other result
    unchanged. Ansible's async_wrapper writes one of its own when it killed the job at the async time limit
    ("Timeout exceeded"), or when the module's process died without printing a result (SIGKILL, the OOM
    killer: a Python traceback of its JSON parsing)."""
    if not isinstance(result, dict) or not result.get("failed"):
        return result
    head = "hf_hub_mirror %s: the background %s job" % (repo_id, phase)
    tail = ("a copy in flight may have left its temp file, which the next run removes; no ref was written for an "
            "incomplete snapshot")
    if result.get("msg") == "Timeout exceeded" and "child_pid" in result:
        limit = ("stage_async_timeout, %s s" % async_timeout) if async_timeout else "stage_async_timeout"
        msg = ("%s ran past its time limit (%s) and was killed by Ansible's async wrapper: %s. Raise "
               "stage_async_timeout (seconds) and re-run to finish" % (head, limit, tail))
    elif "cmd" in result and ("data" in result or "outdata" in result) and "invocation" not in result:
        stderr = " ".join(str(result.get("stderr") or "").split())
        msg = ("%s ended without a result: its process was killed (SIGKILL, or the out-of-memory killer: see the "
               "node's kernel log) or died%s: %s. Re-run to finish"
               % (head, (" (stderr: %s)" % stderr[-300:]) if stderr else "", tail))
    else:
        return result
    return dict(result, msg=msg)


def poll(async_dir, jid, dest, repo_id, repo_type="model", phase="stage", first_wait=0, clock=time.time,
         sleep=time.sleep, async_timeout=None, lease_file=None):
    """One poll of a job: {finished, progress, line, job} (job: read_job's dict, with the module's result
    once it ended; a missing job file is an ended job whose result says so; a result of the async wrapper's own
    is worded by explain_wrapper_result). first_wait: see wait_while_young. lease_file: the job's lease, which
    names its process: a job still "running" whose process is gone (its async wrapper was killed with it, or
    could not write its result) ends here, failed, instead of being polled until the async time limit."""
    job = wait_while_young(async_dir, jid, first_wait, clock, sleep)
    if job["state"] == "running" and lease_file and lease_process_gone(lease_file):
        job = wait_for_a_dead_jobs_result(async_dir, jid, DEAD_JOB_GRACE_S, clock, sleep)
        if job["state"] == "running":
            job["state"] = "ended"
            job["result"] = {"failed": True, "msg": (
                "hf_hub_mirror %s: the background %s job's process (named in %s) is gone and its async wrapper "
                "wrote no result to %s: they were killed (SIGKILL, or the out-of-memory killer: see the node's "
                "kernel log), or the wrapper could not write its job file (a full disk?). A copy in flight may have "
                "left its temp file, which the next run removes; no ref was written for an incomplete snapshot. "
                "Re-run to finish.%s" % (repo_id, phase, lease_file, job["path"], full_disk_note(async_dir)))}
    job["result"] = explain_wrapper_result(job["result"], repo_id, phase, async_timeout)
    if job["state"] == "missing":
        job["result"] = {"failed": True, "msg": "no job file %s: the background job did not start, or its file "
                                                "was removed.%s" % (job["path"], full_disk_note(async_dir))}
    own_pid, waiting = read_lease(lease_file) if lease_file else (None, None)
    figures = job_figures(repo_document(dest, repo_folder_name(repo_id, repo_type))[0], phase, job, own_pid)
    progress = shape_progress(figures, repo_id, phase)
    finished = job["state"] != "running"
    if not finished and figures is None and waiting:
        progress["waiting"] = dict((key, waiting.get(key)) for key in ("pid", "run_id", "since"))
    return {"finished": finished, "progress": progress, "line": progress_line(progress, finished, job["result"]),
            "job": job}


# ---- the lease: a background job whose controller is gone stops itself -------------------------------------


def renew_lease(dest, path, pid=None, waiting=None):
    """Touch the lease file in the jobs dir (opened as open_jobs_dir does; the file created when missing, never
    through a symlink or a hard link: open_own_file): its mtime is the last renewal.
    pid: the job's own process id, written as the file's first line when the job starts (polls keep it);
    with it, waiting: the lock holder the job waits for (RepoLock's), its second line as JSON."""
    with open_jobs_dir(dest, os.path.dirname(os.path.abspath(path))) as jobs:
        fd = open_own_file(_lease_name(path), jobs.fd)
    try:
        if pid:
            os.ftruncate(fd, 0)
            os.write(fd, ("%d\n%s" % (pid, json.dumps(waiting, sort_keys=True) + "\n" if waiting else "")).encode("ascii"))
        os.utime(fd)
    finally:
        os.close(fd)


def read_lease(path):
    """(pid, waiting) from the lease file (see renew_lease): None for what it does not say (no file yet, garbage)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None, None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, None
        lines = os.read(fd, 4096).decode("ascii", "replace").split("\n")
    except OSError:
        return None, None
    finally:
        os.close(fd)
    first = lines[0].strip()
    pid = int(first) if first.isdigit() and int(first) > 1 else None
    try:
        waiting = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else None
    except ValueError:
        waiting = None
    return pid, waiting if isinstance(waiting, dict) else None


def lease_process_gone(path):
    """Whether the job process named in the lease file (its content, see renew_lease) is gone: no such process,
    or one whose command line no longer names hf_hub_mirror (its pid was reused). False when the lease names no
    process (the job has not started yet) or the process cannot be seen."""
    pid = read_lease(path)[0]
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:             # EPERM: someone else's process, alive
        pass
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"hf_hub_mirror" not in handle.read()
    except OSError:             # no /proc, or it ended just now: the next poll looks again
        return False


# Free bytes under which the jobs dir's disk counts as full: the async wrapper cannot write its job file there.
FULL_DISK_BYTES = 1024 * 1024


def full_disk_note(async_dir):
    """' The disk of the jobs dir is full ...' when the filesystem holding async_dir has (almost) no free space
    left for the async wrapper's job file (which then holds no result, and no mirror message), else ''."""
    try:
        st = os.statvfs(async_dir)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= FULL_DISK_BYTES and (st.f_files == 0 or st.f_favail > 0):
        return ""
    return (" The disk of %s is full (%d bytes free): Ansible's async wrapper could not write the job's file, so the "
            "mirror's own message is lost. Free space on that disk and re-run (or set stage_async_dir to a directory "
            "on another disk)." % (async_dir, free))


def wait_for_a_dead_jobs_result(async_dir, jid, grace_s, clock=time.time, sleep=time.sleep):
    """read_job for a job whose process is gone, after waiting up to grace_s for its wrapper to write the result
    (it does so right after the module's process ended): still running then, its wrapper died with it."""
    deadline = clock() + grace_s
    while True:
        job = read_job(async_dir, jid)
        if job["state"] != "running" or clock() >= deadline:
            return job
        sleep(0.25)


def lease_age(path, now=None):
    """Seconds since the lease was last renewed; None when there is no lease file (it was ended)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (time.time() if now is None else now) - st.st_mtime


def end_lease(dest, path):
    """Remove the lease file through the jobs dir's handle; True when it was there."""
    try:
        jobs = open_jobs_dir(dest, os.path.dirname(os.path.abspath(path)))
    except FileNotFoundError:
        return False
    with jobs:
        return _unlink_if_there(_lease_name(path), jobs.fd)


def _lease_name(path):
    """The lease file's name: one of the lease names (LEASE_FILE), whatever lease_file the play passed."""
    name = os.path.basename(path)
    if not LEASE_FILE.match(name):
        raise StageError("lease_file %s is not a lease file (its name must start with dgx-lease.): nothing was "
                         "written or removed" % path)
    return name


class LeaseWatch(object):
    """Stop this process the way Ctrl-C or SIGTERM does when its lease is not renewed for `timeout` seconds
    (or its file is gone): a background job whose controller was killed stops within about a lease time,
    through its own interrupted path (workers stopped within a chunk, temp files removed, the repo lock
    released), instead of running on to the end holding the repo lock."""

    def __init__(self, dest, path, timeout, every=None, stop_process=None, clock=time.time, time_limit=None):
        self.dest, self.path, self.timeout = dest, path, float(timeout)
        self.every = every if every is not None else max(0.2, min(5.0, self.timeout / 4.0))
        self.fired = None
        # time_limit: seconds after which the run stops itself the same way, before Ansible's async wrapper
        # would SIGKILL it at its own limit (leaving temp files and the mirror's message unsaid).
        self.time_limit = float(time_limit) if time_limit else None
        self.deadline = clock() + self.time_limit if self.time_limit else None
        if self.time_limit and every is None:       # a short limit is looked at often enough to beat the wrapper
            self.every = min(self.every, max(0.2, self.time_limit / 4.0))
        self.timed_out = False
        self._clock = clock
        self._stop_process = stop_process or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self._done = threading.Event()
        self._thread = None

    def expired(self):
        """None while the lease holds, else why it does not."""
        if self.deadline is not None and self._clock() >= self.deadline:
            self.timed_out = True
            return "its time limit of %d s was reached" % self.time_limit
        age = lease_age(self.path, self._clock())
        if age is None:
            return "its lease file %s is gone" % self.path
        if age > self.timeout:
            return "its lease %s was not renewed for %d s (lease_timeout %d s)" % (self.path, age, self.timeout)
        return None

    def check(self):
        """One look at the lease: stops the process (once) when it expired; True then."""
        why = self.expired()
        if why and self.fired is None:
            self.fired = why
            self._stop_process()
        return bool(why)

    def note_waiting(self, holder):
        """RepoLock's on_wait: say in the lease file whom the job waits for (None: no one now), keeping its
        mtime - the job's own write is no renewal."""
        try:
            before = os.lstat(self.path)
            renew_lease(self.dest, self.path, os.getpid(), holder)
            os.utime(self.path, ns=(before.st_atime_ns, before.st_mtime_ns), follow_symlinks=False)
        except (OSError, StageError):
            pass    # the note is for the operator's eyes; the lock wait goes on

    def start(self):
        renew_lease(self.dest, self.path, os.getpid())   # the job's start is a renewal; its pid lets polls see it die
        self._thread = threading.Thread(target=self._watch, name="dgx-stage-lease")
        self._thread.daemon = True
        self._thread.start()
        return self

    def _watch(self):
        while not self._done.wait(self.every):
            if self.check():
                return

    def stop(self):
        self._done.set()

    def message(self):
        if self.timed_out:
            return ("stopped: %s (the background job's time limit, stage_async_timeout less a margin): raise "
                    "stage_async_timeout (seconds) for a pass this long" % self.fired)
        return ("stopped: %s - the controller that started this background job is gone (killed or "
                "interrupted) or stopped polling it" % self.fired)
