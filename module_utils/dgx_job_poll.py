"""One poll of a background hf_hub_mirror job: its figures from the progress file, and one human line.
"""
import time

from ansible.module_utils.dgx_hubcache import repo_folder_name
from ansible.module_utils.dgx_jobs import DEAD_JOB_GRACE_S, explain_wrapper_result, full_disk_note, wait_for_job
from ansible.module_utils.dgx_lease import lease_process_gone, read_lease
from ansible.module_utils.dgx_progress_file import passes_of, repo_document
from ansible.module_utils.dgx_repolock import holder_text
from ansible.module_utils.dgx_units import human_bytes, utc_epoch


# The keys every `progress` dict has (null or 0 before the job wrote its first figures).
PROGRESS_KEYS = ("repo_id", "pass", "step", "current", "files_done", "files_total", "bytes_done", "bytes_total",
                 "percent", "mib_per_s", "eta_s", "status", "finished", "aborted", "error", "started_at",
                 "updated_at", "waiting", "max_mib_s")


def pass_figures(doc, phase):
    """The figures of pass `phase` in a progress document, or None."""
    return passes_of(doc)[0].get(phase)


def _number(value, kind=int):
    try:
        return kind(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):     # int(Infinity) of a hand-edited progress file
        return None


def shape_progress(figures, repo_id, phase):
    """The `progress` dict of a poll: the PROGRESS_KEYS, null or 0 when there are no figures yet."""
    figures = figures if isinstance(figures, dict) else {}

    def text(key):
        return figures.get(key) if isinstance(figures.get(key), str) else None

    done = _number(figures.get("bytes_done")) or 0
    total = _number(figures.get("bytes_total")) or 0
    files_done = _number(figures.get("files_done")) or 0
    files_total = _number(figures.get("files_total")) or 0
    finished = figures.get("finished") is True
    if total > 0:
        percent = 100.0 if finished else min(99.9, 100.0 * done / total)
    elif files_total > 0:
        percent = 100.0 * files_done / files_total
    else:
        percent = 100.0 if finished else 0.0
    return {
        "repo_id": repo_id, "pass": phase, "step": text("step"), "current": text("current"),
        "files_done": files_done, "files_total": files_total, "bytes_done": done, "bytes_total": total,
        "percent": round(percent, 1), "mib_per_s": _number(figures.get("mib_per_s"), float),
        "eta_s": _number(figures.get("eta_s"), float), "status": text("status"), "finished": finished,
        "aborted": figures.get("aborted") is True, "error": text("error"), "started_at": text("started_at"),
        "updated_at": text("updated_at"), "waiting": None, "max_mib_s": _number(figures.get("max_mib_s")) or 0,
    }


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
        parts.append(human_rate(progress["mib_per_s"]) + (" (cap %d)" % progress["max_mib_s"]
                                                          if progress.get("max_mib_s") else ""))
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
    """This job's figures of pass `phase`, or None (none yet, or another run's: another process wrote them, or
    they started before the job - its file's time is its start while it runs, its end, less duration_s, after)."""
    figures = pass_figures(doc, phase)
    if job["started"] is None or figures is None or (own_pid is not None and figures.get("pid") != own_pid):
        return None
    duration = _number((job["result"] or {}).get("duration_s"), float)
    if job["state"] == "running":
        key, since = "started_at", int(job["started"])
    elif duration is not None:
        key, since = "started_at", int(job["started"] - duration) - 2
    else:
        key, since = "updated_at", int(job["started"]) - 2
    stamp = utc_epoch(figures.get(key))
    return figures if stamp is not None and stamp >= since else None


def poll(async_dir, jid, dest, repo_id, repo_type="model", phase="stage", first_wait=0, clock=time.time,
         sleep=time.sleep, async_timeout=None, lease_file=None):
    """One poll of a job: {finished, progress, line, job (read_job's, with the result once it ended)}. A missing
    job file, or a running job whose process (named in lease_file) is gone, ends failed, saying why."""
    # A job younger than first_wait is waited for: a short one ends within its first poll.
    job = wait_for_job(async_dir, jid, lambda job: job["started"] + float(first_wait or 0), clock, sleep)
    if job["state"] == "running" and lease_file and lease_process_gone(lease_file):
        # Its wrapper writes the result right after the process ended; none by then: it died with it.
        grace_end = clock() + DEAD_JOB_GRACE_S
        job = wait_for_job(async_dir, jid, lambda _job: grace_end, clock, sleep)
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
