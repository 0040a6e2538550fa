"""What one mirror run is asked (MirrorRequest), what it decided (Plan, Work) and the failures carrying them."""
import os

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_hubcache import repo_folder_name
from ansible.module_utils.dgx_throttle import ReadCap
from ansible.module_utils.dgx_workers import default_workers


# Why a selected file has no local copy at all (copy_missing=false refuses these); a present regular
# file that fails its check ("size", "content") is a repair.
NOT_STAGED = ("missing", "link", "not-a-file")

MAX_WORKERS_PARAM = 32


class MirrorRequest(object):
    """The module's parameters (verify and phase among the module's choices), validated once."""

    def __init__(self, src, dest, repo_id, repo_type="model", revision="main", allow_patterns=None,
                 ignore_patterns=None, verify="sample", reserve="2%", prune=False, lock_timeout=60, workers=None,
                 copy_missing=True, phase="stage", peer_dir=None, require_match=None, other_rank_patterns=None,
                 host=None, run_id=None, on_lock_wait=None, max_mib_s=0,
                 io_priority="normal"):
        self.src, self.dest = os.path.abspath(src), os.path.abspath(dest)
        self.repo_id, self.repo_type, self.revision = repo_id, repo_type, revision or "main"
        self.allow_patterns = list(allow_patterns) if allow_patterns else None
        self.ignore_patterns = list(ignore_patterns) if ignore_patterns else None
        self.verify, self.phase, self.reserve = verify, phase, reserve
        self.prune, self.lock_timeout = prune, lock_timeout
        if workers is not None and not 1 <= int(workers) <= MAX_WORKERS_PARAM:
            raise StageError("workers must be between 1 and %d, not %r" % (MAX_WORKERS_PARAM, workers))
        self.workers = int(workers) if workers else default_workers()
        if max_mib_s is None or max_mib_s < 0:
            raise StageError("max_mib_s must be 0 (no cap) or a positive MiB/s, not %r (stage_max_mib_s)"
                             % (max_mib_s,))
        # One cap for every read of this run, in all its workers and both of its passes' steps.
        self.max_mib_s = max_mib_s
        self.read_cap = ReadCap(max_mib_s) if max_mib_s else None
        self.io_priority = io_priority
        self.folder = repo_folder_name(repo_id, repo_type)
        self.copy_missing = bool(copy_missing)
        self.peer_dir_given = peer_dir    # as given: a relative path or '..' in it is refused
        self.peer_dir = os.path.abspath(peer_dir) if peer_dir else None
        self.require_match = list(require_match) if require_match else []
        self.other_rank_patterns = list(other_rank_patterns) if other_rank_patterns else []
        # The inventory name (the --limit of the fixes messages give), the lane's run id (the lock's holder: whom a
        # second run waits for) and RepoLock's on_wait (the background job tells its polls).
        self.host, self.run_id, self.on_lock_wait = host, run_id, on_lock_wait


class MirrorFailed(StageError):
    """The run could not stage everything; `result` holds what it did and what is wrong (nas_corrupt)."""

    def __init__(self, message, result):
        StageError.__init__(self, message)
        self.result = result


class NotStaged(StageError):
    """copy_missing is off and selected files have no local copy: refused before anything is written."""

    def __init__(self, message, plan, paths):
        StageError.__init__(self, message)
        self.plan, self.paths = plan, paths


class Work(object):
    """One file to write: a blob under blobs/ or a real file inside the snapshot. local_hash: what the
    local bytes hashed to when a check read them all (as the blob is named; sha256 for a real file)."""

    __slots__ = ("final", "source", "size", "etag", "reason", "paths", "local_hash", "checked")

    def __init__(self, final, source, size, etag, reason, paths):
        self.final, self.source, self.size, self.etag, self.reason, self.paths = (
            final, source, size, etag, reason, paths)
        self.local_hash = None
        self.checked = False      # a content check read it (then it already counts in the progress files)

    @property
    def is_repair(self):
        return self.reason != "missing"


class Plan(object):
    def __init__(self):
        self.commit = None
        self.src_repo = self.dest_repo = self.snapshot = None
        self.entries = []          # every file of the source snapshot
        self.selected = []         # the ones the patterns stage
        self.excluded = []
        self.rank_files = 0        # how many selected files this host's rank patterns (require_match) select
        self.writes = []           # Work items: blobs and real files to copy or repair
        self.to_prove = []         # Work items present locally, whose content prove_present decides
        self.nas_corrupt = []      # nas_corrupt_record()s found while planning (the local copy is kept)
        self.blobs_reused = 0
        self.links = []            # (link path, target text) to (re)write
        self.refs = {}             # ref name -> commit to write
        self.tree_listing = None   # bytes of the local trees/<commit>.json, when it must change
        self.prune = []            # local paths to remove (not wanted)
        self.stale = []            # unwanted local paths kept because prune is off
        self.debris = []           # temp files of killed runs
        self.freed_bytes = 0
        self.peer_bytes = 0        # bytes of the writes whose peer_dir candidate counts as on disk (candidate_size)
        self.peer_peak = 0         # the largest counted candidates, one per worker: copies alongside their candidates
        self.warnings = []

    @property
    def write_bytes(self):
        return sum(w.size for w in self.writes)

    @property
    def wanted_blobs(self):
        """Blob names (under blobs/) the plan copies: what a peer may send to peer_dir."""
        return sorted(set(w.etag for w in self.writes if w.etag))

    @property
    def changes(self):
        return bool(self.writes or self.links or self.refs or self.tree_listing or self.prune or self.debris)


def name_some(paths, most=5):
    """'a, b, c' or 'a, b, c and 7 more': a long list named by its first few and a count."""
    shown = ", ".join(paths[:most])
    return shown if len(paths) <= most else "%s and %d more" % (shown, len(paths) - most)


def lock_dir_rel(folder):
    """`.locks/<repo folder>` below the local hub root: the repo lock and the progress file."""
    return ".locks/" + folder
