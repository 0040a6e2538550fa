"""The progress file, `<dest>/.locks/<repo folder>/dgx-stage.progress.json`: its name, what it holds and who
writes it (PassMeter, from every copy worker at once). Readers import its name and reader from here.
"""
import json
import os
import posixpath
import stat
import threading
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import atomic_write_bytes, read_up_to
from ansible.module_utils.dgx_hashing import name_is_hash
from ansible.module_utils.dgx_localtree import linked_dir_problem
from ansible.module_utils.dgx_units import utc_text

PROGRESS_NAME = "dgx-stage.progress.json"
# The most a progress file is read: a few passes' figures and the NAS suspects of a whole checkpoint fit many
# times over; anything larger was not written by dgx-stage.
MAX_BYTES = 4 * 1024 * 1024
# Its key for the NAS blobs found failing their names and not proven good since (dgx_nas_suspects).
SUSPECTS_KEY = "nas_corrupt"
# The steps of a pass whose bytes are counted: content checks of local files, then copies and repairs.
STEPS = ("hashing", "copying")
# A rate (and so an ETA) is given only once the pass has worked this long and read something.
RATE_AFTER_S = 1.0
# The progress file is rewritten at most this often while bytes move (and at every step and the end).
PROGRESS_EVERY_S = 1.0


def read_document(name, dir_fd=None):
    """(document, problem) of the progress file `name` (relative to dir_fd), never read through a final link:
    (None, None) when there is none; (None, why) when it is not a regular file holding one JSON object."""
    fd = None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "%s is not a regular file" % name
        raw = read_up_to(fd, MAX_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, "%s cannot be read (%s)" % (name, exc.strerror or exc)
    finally:
        if fd is not None:
            os.close(fd)
    if len(raw) > MAX_BYTES:
        return None, "%s is larger than %d bytes: not a progress file dgx-stage wrote" % (name, MAX_BYTES)
    try:
        document = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None, "%s is not JSON: not a progress file dgx-stage wrote" % name
    if not isinstance(document, dict):
        return None, "%s holds no JSON object: not a progress file dgx-stage wrote" % name
    return document, None


def repo_document(hub_root, folder):
    """(document, problem) of the progress file of the repo folder `folder` in the hub at hub_root, reached
    without following a link (.locks and the folder included)."""
    if not folder or "/" in folder or folder in (".", ".."):
        return None, "%r is no repo folder name" % (folder,)
    problem = linked_dir_problem(hub_root, posixpath.join(".locks", folder))
    if problem:
        return None, problem
    return read_document(os.path.join(hub_root, ".locks", folder, PROGRESS_NAME))


def passes_of(document):
    """(passes, problem) of a progress document: {phase: figures} of the entries that are mappings, and why
    some could not be read (`passes` not a mapping, an entry that is not one), else None."""
    if document is None:
        return {}, None
    passes = document.get("passes")
    if passes is None:
        # Written before `passes` existed: its top level is the last pass run.
        phase = document.get("pass")
        return ({phase: document} if phase in ("stage", "verify") else {}), None
    if not isinstance(passes, dict):
        return {}, "the progress file's passes is not a mapping (%s)" % type(passes).__name__
    good = dict((k, v) for k, v in passes.items() if isinstance(v, dict))
    problem = None if len(good) == len(passes) else "the progress file's passes %s are not mappings" % (
        ", ".join(sorted(str(k) for k in passes if k not in good)))
    return good, problem


def suspects_in(document):
    """(the NAS blobs found corrupt, problem) under SUSPECTS_KEY: {blob: {paths (required), nas_source, identity,
    found_at, why}}. Any other shape is not dgx-stage's: the problem names the entry and no suspect is returned."""
    suspects = (document or {}).get(SUSPECTS_KEY, {})
    if not isinstance(suspects, dict):
        return {}, "its %s is not a mapping of blobs" % SUSPECTS_KEY
    for blob, entry in sorted(suspects.items()):
        problem = _suspect_problem(blob, entry)
        if problem:
            return {}, "its %s entry %r %s" % (SUSPECTS_KEY, blob, problem)
    return suspects, None


def _suspect_problem(blob, entry):
    """Why one suspects entry is not the shape suspects_in documents, or None."""
    if not name_is_hash(blob):
        return "is not named by a blob hash"
    if not isinstance(entry, dict):
        return "is not a mapping"
    paths = entry.get("paths")
    if not isinstance(paths, list) or not paths or not all(is_snapshot_path(p) for p in paths):
        return "has paths %r, not a list of relative snapshot paths" % (paths,)
    for key in ("nas_source", "found_at", "why"):
        if not isinstance(entry.get(key), (str, type(None))):
            return "has %s %r, not a string or null" % (key, entry[key])
    identity = entry.get("identity")
    if identity is not None and not (isinstance(identity, list) and identity and all(
            isinstance(n, int) and not isinstance(n, bool) for n in identity)):
        return "has identity %r, not a list of integers or null" % (identity,)
    return None


def is_snapshot_path(path):
    """A path inside a snapshot: relative, each part a name (no empty part, no . or .., no NUL)."""
    return isinstance(path, str) and "\0" not in path and not path.startswith("/") and all(
        part not in ("", ".", "..") for part in path.split("/"))


class PassMeter(object):
    """The figures of one pass of one repo, kept by every worker at once (thread-safe), per step (STEPS); a file
    counts once, when all its work is over. Once attached, each write goes to the progress file: every pass's
    latest under `passes`, this one also at the top level, `suspects` under SUSPECTS_KEY. It measures the read rate
    its read cap (max_mib_s, 0: none) bounds from the first step that reads to the last byte read: achieved_mib_s."""

    def __init__(self, phase, repo_id, verify, clock=time.monotonic, wall=time.time, interval=None, max_mib_s=0):
        self.phase, self.repo_id, self.verify, self.max_mib_s = phase, repo_id, verify, max_mib_s
        self.io_priority = None     # dgx_throttle.set_io_priority's report, once applied
        self.commit = None
        self._clock, self._wall = clock, wall
        self.interval = PROGRESS_EVERY_S if interval is None else interval
        self._lock = threading.Lock()
        self._started, self._started_at = clock(), wall()
        self._read = {"local": 0, "nas": 0}
        self._reading_since = self._last_read = None
        self._steps = dict((step, {"files_done": 0, "files_total": 0, "bytes_done": 0, "bytes_total": 0})
                           for step in STEPS)
        self._files = {"done": 0, "total": 0}
        self.step, self.current, self.status, self.error = "planning", None, "running", None
        self._dir_fd = None
        self._held = None
        self._passes = {}
        self.suspects = {}
        self._last_write = None

    def plan(self, step, files, nbytes, new_files=True):
        """Add work to `step`: `files` files of `nbytes` bytes; new_files=False for a file already
        counted (a repair found by its check)."""
        with self._lock:
            figures = self._steps[step]
            figures["files_total"] += files
            figures["bytes_total"] += nbytes
            if new_files:
                self._files["total"] += files

    def begin(self, step):
        with self._lock:
            self.step = step
            if self._reading_since is None:
                self._reading_since = self._clock()
            self._write_locked()

    def working_on(self, path):
        with self._lock:
            self.current = path

    def count(self, step, local=0, nas=0):
        """Bytes just read by `step`, on the local disk and on the NAS."""
        with self._lock:
            self._read["local"] += local
            self._read["nas"] += nas
            figures = self._steps[step]
            figures["bytes_done"] += local + nas
            figures["bytes_total"] = max(figures["bytes_total"], figures["bytes_done"])
            self._last_read = self._clock()
            if self._dir_fd is not None and self._last_read - self._last_write >= self.interval:
                self._write_locked()

    def reader(self, step, side):
        """A callback counting `side` (local or nas) bytes read by `step`: for feed_file, copy_verified."""
        return lambda count: self.count(step, **{side: count})

    def item_done(self, step, file_done=True):
        """One file's work in `step` is over (file_done: and all its work this pass)."""
        with self._lock:
            self._steps[step]["files_done"] += 1
            if file_done:
                self._files["done"] += 1

    def bytes_read(self):
        with self._lock:
            return dict(self._read)

    def read_rate(self):
        """(seconds spent reading, achieved MiB/s or None): from the first reading step's start to the last read."""
        with self._lock:
            return self._read_rate_locked()

    def _read_rate_locked(self):
        if self._reading_since is None or self._last_read is None:
            return 0.0, None
        seconds = max(self._last_read - self._reading_since, 0.0)
        nbytes = self._read["local"] + self._read["nas"]
        return round(seconds, 3), (round(nbytes / 1048576.0 / seconds, 1) if seconds >= RATE_AFTER_S else None)

    def add_reads(self, other):
        """Count the bytes another meter read (a pre-check before the lock) in this one's tally."""
        theirs = other.bytes_read()
        with self._lock:
            for side, count in theirs.items():
                self._read[side] += count

    def attach(self, lock_dir, held=None):
        """Write the progress file in lock_dir from now on, each write after held() (a StageError from it stops
        the pass, so nothing goes to a lock directory no other run waits on). A file there that is not one is a
        StageError, nothing written: writing over it would forget its NAS suspects."""
        with self._lock:
            if held is not None:
                held()
            document, problem = read_document(PROGRESS_NAME, lock_dir.fd)
            if not problem:
                problem = suspects_in(document)[1]
            if problem:
                raise StageError(
                    "%s: %s. It keeps the NAS blobs found corrupt (%s), which this pass must not write over; "
                    "nothing was written. Inspect it: put the progress file dgx-stage wrote back in its place, "
                    "or move this one aside to start a new record (the NAS blobs it named are then trusted "
                    "again), then re-run" % (lock_dir.join(PROGRESS_NAME), problem, SUSPECTS_KEY))
            self._passes = passes_of(document)[0] if document and "passes" in document else {}
            self.suspects = suspects_in(document)[0]
            self._dir_fd, self._held = lock_dir.fd, held
            self._write_locked()

    def close(self, status, error=None):
        """The pass is over: ok, failed or interrupted (Ctrl-C, SIGTERM); its last write."""
        with self._lock:
            self.status, self.error = status, error
            self.step, self.current = "done", None
            if status == "ok":     # a check that stopped at its first differing sample read less than planned
                for figures in self._steps.values():
                    figures["bytes_total"] = figures["bytes_done"]
            self._write_locked()
            self._dir_fd = None

    def figures(self):
        with self._lock:
            return self._figures_locked()

    def _figures_locked(self):
        now = self._clock()
        elapsed = max(now - self._started, 0.0)
        done = sum(f["bytes_done"] for f in self._steps.values())
        total = sum(f["bytes_total"] for f in self._steps.values())
        # While running, a rate (and an ETA) once there is a second of work to judge by; at the end, the mean.
        measured = elapsed >= RATE_AFTER_S or (self.status != "running" and elapsed > 0)
        rate = done / elapsed if measured and done else None
        if self.status == "ok":
            eta = 0.0
        elif self.status == "running" and rate:
            eta = round((total - done) / rate, 1)
        else:
            eta = None
        return {
            "pass": self.phase, "repo_id": self.repo_id, "commit": self.commit, "verify": self.verify,
            "pid": os.getpid(), "started_at": utc_text(self._started_at),
            "updated_at": utc_text(self._started_at + elapsed), "elapsed_s": round(elapsed, 1),
            "step": self.step, "current": self.current,
            "files_done": self._files["done"], "files_total": self._files["total"],
            "bytes_done": done, "bytes_total": total,
            "mib_per_s": round(rate / 1048576, 1) if rate is not None else None, "eta_s": eta,
            "bytes_read": dict(self._read),
            "max_mib_s": self.max_mib_s, "achieved_mib_s": self._read_rate_locked()[1], "io_priority": self.io_priority,
            "hashing": dict(self._steps["hashing"]), "copying": dict(self._steps["copying"]),
            "status": self.status, "finished": self.status == "ok", "aborted": self.status not in ("ok", "running"),
            "error": self.error,
        }

    def check_held(self):
        """attach's held(), for a step that writes to the local hub without a progress write just before it."""
        with self._lock:
            self._check_held_locked()

    def _check_held_locked(self):
        if self._held is None:
            return
        try:
            self._held()
        except StageError:
            self._dir_fd = self._held = None     # nothing more goes to a directory another run may not see
            raise

    def _write_locked(self):
        if self._dir_fd is None:
            return
        self._check_held_locked()
        self._last_write = self._clock()
        figures = self._figures_locked()
        passes = dict(self._passes)
        passes[self.phase] = figures
        document = dict(figures, passes=passes)
        document[SUSPECTS_KEY] = self.suspects
        try:
            atomic_write_bytes(PROGRESS_NAME, json.dumps(document, indent=1, sort_keys=True).encode("utf-8"),
                               dir_fd=self._dir_fd)
        except OSError:
            pass   # the progress file is for watching; a full or failing disk is reported by the copy itself
