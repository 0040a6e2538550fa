"""The background jobs of the stage and verify passes: Ansible's async job files in the jobs directory (read
without following a link, cleared of what ended jobs of earlier runs left), and what a job that died said.
"""
import errno
import json
import os
import re
import stat
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import read_small
from ansible.module_utils.dgx_localtree import LocalDir, LocalTree, linked_dir_problem

# What Ansible's async_wrapper names its files: j<random>.<pid>, and <that>.tmp while it writes one.
JOB_FILE = re.compile(r"^j\d+\.\d+(\.tmp)?$")

# The stage role's job leases, next to the job files: dgx-lease.<run id>.<pass>.<repo type>.<repo>.
LEASE_FILE = re.compile(r"^dgx-lease\.[A-Za-z0-9_.-]+$")

# A job file or its temp that is older than this and still says "running" was left by a killed wrapper
# (a wrapper writes its .tmp in milliseconds, and kills its job at the async time limit).
TMP_STALE_S = 60

# Seconds a poll waits for the result of a job whose process it saw gone (its wrapper writes it right after).
DEAD_JOB_GRACE_S = 5

READ_LIMIT = 1024 * 1024


def read_json_file(path):
    """The JSON object in the regular file `path` (never through a final symlink), or None."""
    try:
        data = json.loads((read_small(path, READ_LIMIT) or b"").decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_job(async_dir, jid):
    """{state: running|ended|missing, result (once ended), started (the job file's mtime), path}."""
    path = os.path.join(async_dir, jid)
    try:
        st = os.lstat(path)
    except OSError:
        return {"state": "missing", "result": None, "started": None, "path": path}
    data = read_json_file(path)
    # Unreadable JSON: as while the wrapper first writes it.
    ended = data is not None and not ("started" in data and not data.get("finished"))
    return {"state": "ended" if ended else "running", "result": data if ended else None, "started": st.st_mtime,
            "path": path}


def remove_job(dest, async_dir, jid):
    """Remove this job's file (and a temp its wrapper left); the names removed."""
    return remove_files(dest, async_dir, [name for name in (jid, jid + ".tmp") if JOB_FILE.match(name)])


def remove_files(dest, async_dir, names):
    """Remove these files of the jobs dir through its handle; the names removed."""
    try:
        jobs = open_jobs_dir(dest, async_dir)
    except FileNotFoundError:
        return []
    with jobs:
        return [name for name in names if unlink_if_there(name, jobs.fd)]


def unlink_if_there(name, dir_fd):
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def prune_jobs_dir(dest, async_dir):
    """rmdir the jobs dir, then `.locks` above it, when empty (a pass leaves the local hub as it found it); the
    dirs removed. Never the hub root, never a jobs dir outside the local hub (the operator's)."""
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


def ended_job_file(name, age_s, async_timeout):
    """Whether a file of the jobs dir is a job file (or lease) of an ended job, safe to remove: async_wrapper's
    names only, once older than the async time limit plus TMP_STALE_S - a running one that old had its wrapper
    killed, and a fresher result may be another run's on this hub, not collected yet. A temp after TMP_STALE_S."""
    match = JOB_FILE.match(name)
    if match and match.group(1):
        return age_s > TMP_STALE_S
    return bool(match or LEASE_FILE.match(name)) and age_s > max(int(async_timeout or 0), 0) + TMP_STALE_S


def _jobs_dir(dest, async_dir):
    """(root, rel, inside the local hub) of a jobs dir that can be used; StageError for a symlink or no directory
    (on its way too, inside the local hub)."""
    dest, async_dir = os.path.abspath(dest), os.path.abspath(async_dir)
    if async_dir == dest:
        raise StageError("the async jobs dir cannot be the local hub root %s itself: set stage_async_dir to a "
                         "directory of its own, or leave it empty for <hub_local_root>/.locks/dgx-stage-async" % dest)
    inside = async_dir.startswith(dest.rstrip(os.sep) + os.sep)
    root, rel = (dest, os.path.relpath(async_dir, dest)) if inside else os.path.split(async_dir)
    if inside and rel.split(os.sep)[0] != ".locks":
        # The rest of the hub is the mirror's: its repo folders are pruned of files it does not know.
        raise StageError("the async jobs dir %s is inside the local hub %s but not under its .locks: set "
                         "stage_async_dir to a directory under %s, or outside the hub, or leave it empty for "
                         "<hub_local_root>/.locks/dgx-stage-async" % (async_dir, dest, os.path.join(dest, ".locks")))
    problem = linked_dir_problem(root, rel)
    if problem:
        raise StageError("the async jobs dir %s cannot be used: %s. Set stage_async_dir to a real directory, or "
                         "leave it empty for <hub_local_root>/.locks/dgx-stage-async" % (async_dir, problem))
    return root, rel, inside


def open_jobs_dir(dest, async_dir, create=False):
    """The jobs dir as a LocalDir, never through a link (inside the local hub: LocalTree, no mount point either)."""
    root, rel, inside = _jobs_dir(dest, async_dir)
    if inside:
        return LocalTree(root).open_dir(rel, create=create)
    try:
        if create:
            os.mkdir(async_dir, 0o755)
    except FileExistsError:
        pass
    try:
        return LocalDir(os.open(async_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), async_dir)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):     # replaced since _jobs_dir looked
            _jobs_dir(dest, async_dir)
            raise StageError("%s is not a directory" % async_dir)
        raise


def prepare_jobs_dir(dest, async_dir, async_timeout, check_mode=False, now=None):
    """Refuse a symlinked jobs dir, create it, and remove the files ended jobs of earlier runs left: {created, removed}."""
    inside = _jobs_dir(dest, async_dir)[2]
    created = not os.path.isdir(async_dir)
    if check_mode and created:
        return {"created": True, "removed": []}
    # Outside the local hub the jobs dir is never cleared: its other files are not this run's.
    with open_jobs_dir(dest, async_dir, create=not check_mode) as jobs:
        ended = _ended_jobs(jobs.fd, async_timeout, now) if inside else []
        removed = ended if check_mode else [name for name in ended if unlink_if_there(name, jobs.fd)]
    return {"created": created, "removed": removed}


def _ended_jobs(dir_fd, async_timeout, now):
    """The names of the regular files in the jobs dir that are job files of ended jobs."""
    now = time.time() if now is None else now
    ended = []
    for name in sorted(os.listdir(dir_fd)):
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and ended_job_file(name, now - st.st_mtime, async_timeout):
            ended.append(name)
    return ended


def wait_for_job(async_dir, jid, deadline, clock=time.time, sleep=time.sleep):
    """read_job once the job ended or at deadline(job) (epoch seconds), whichever comes first."""
    pause = 0.05
    while True:
        job = read_job(async_dir, jid)
        left = deadline(job) - clock() if job["state"] == "running" else 0
        if left <= 0:
            return job
        sleep(min(pause, left))
        pause = min(pause * 2, 0.25)


def explain_wrapper_result(result, repo_id, phase, async_timeout=None):
    """A result async_wrapper wrote itself (a job killed at the time limit, or a process that died without a
    result) worded for the operator; any other result unchanged."""
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


# Free bytes under which the jobs dir's disk counts as full: the async wrapper cannot write its job file there.
FULL_DISK_BYTES = 1024 * 1024


def full_disk_note(async_dir):
    """A sentence saying the jobs dir's disk is full (so the wrapper's job file lost the result), else ''."""
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

