"""Reading a Hugging Face hub cache: repo folders, refs, snapshot entries and their link chains.
"""
import errno
import fnmatch
import json
import os
import re
import stat

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import is_within, open_to_read, walk_tree

REPO_TYPE_PREFIX = {"model": "models", "dataset": "datasets", "space": "spaces"}
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
REF_MAX_BYTES = 128       # a commit hash and a newline; more is not a ref


class SnapshotEntry(object):
    """One file of a snapshot: a link into the repo's blobs/ or a real file inside the snapshot."""

    __slots__ = ("path", "kind", "etag", "source", "size", "alias_of", "problem")

    def __init__(self, path, kind, etag, source, size, alias_of=None, problem=None):
        self.path = path            # snapshot-relative, '/'-separated
        self.kind = kind            # "link" (content is blobs/<etag>) or "real" (content lives in the snapshot)
        self.etag = etag            # blob name for links, None for real files
        self.source = source        # real path of the content on the hub
        self.size = size
        self.alias_of = alias_of    # real files only: the snapshot path a link chain led to (else None)
        self.problem = problem      # kind "bad": why this entry can be neither staged nor bound


def repo_folder_name(repo_id, repo_type="model"):
    """`org/name` -> `models--org--name`, refusing ids that could leave the hub root."""
    if repo_type not in REPO_TYPE_PREFIX:
        raise StageError("unknown repo_type %r: use one of %s" % (repo_type, ", ".join(sorted(REPO_TYPE_PREFIX))))
    parts = (repo_id or "").split("/")
    if not repo_id or any(p in ("", ".", "..") for p in parts) or len(parts) > 2:
        raise StageError("invalid repo_id %r: expected 'org/name'" % (repo_id,))
    return "--".join([REPO_TYPE_PREFIX[repo_type]] + parts)


def list_refs(repo_dir):
    """All refs of a repo folder as {name: commit}; names may contain '/' (refs/pr/1)."""
    refs = {}
    for full, rel, is_dir in walk_tree(os.path.join(repo_dir, "refs")):
        if is_dir:
            continue
        if not stat.S_ISREG(os.lstat(full).st_mode):
            # huggingface_hub writes refs as small regular files; a link or a FIFO is not one
            raise StageError("%s is not a regular file: a ref holds a commit hash as text; remove it or "
                             "restore it from the hub" % full)
        with open_to_read(full, follow=False) as handle:
            refs[rel] = handle.read(REF_MAX_BYTES).decode("utf-8", "replace").strip()
    return refs


def resolve_commit(repo_dir, revision):
    """The commit a branch, tag or commit hash names, or a StageError listing what exists."""
    if not revision or revision.startswith("/") or ".." in revision.split("/"):
        raise StageError("invalid revision %r" % (revision,))
    refs = list_refs(repo_dir)
    snap_dir = os.path.join(repo_dir, "snapshots")
    snapshots = sorted(os.listdir(snap_dir)) if os.path.isdir(snap_dir) else []
    if revision in refs:
        commit = refs[revision]
        if not COMMIT_RE.match(commit):
            raise StageError("%s holds %r, not a 40-hex commit hash: fix or remove that ref file"
                             % (os.path.join(repo_dir, "refs", revision), commit))
    elif COMMIT_RE.match(revision) and revision in snapshots:
        commit = revision
    else:
        raise StageError("unknown revision %r in %s: refs there: %s; snapshots there: %s"
                         % (revision, repo_dir, ", ".join(sorted(refs)) or "none", ", ".join(snapshots) or "none"))
    if commit not in snapshots:
        raise StageError("refs/%s in %s points at commit %s but snapshots/%s is missing"
                         % (revision, repo_dir, commit, commit))
    return commit


# A snapshot link may point at another snapshot file that links on; a chain longer than this is a loop.
MAX_LINK_HOPS = 40


def resolve_snapshot_link(link_path, repo_dir, snap_dir, hub_real):
    """(etag, alias_of, source) of a snapshot link followed hop by hop: etag names its first hop into blobs/,
    alias_of the snapshot file a chain with no blob hop ends at. StageError for dangling, looping or escaping chains."""
    source = content_of(link_path, hub_real)
    blobs_dir = os.path.join(repo_dir, "blobs")
    current = link_path
    for _hop in range(MAX_LINK_HOPS):
        hop = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
        if os.path.dirname(hop) == blobs_dir:
            return (os.path.basename(hop), None, source)
        if not is_within(hop, snap_dir) or hop == snap_dir:
            raise StageError("%s links to %s, not into the repo's blobs/ dir or its own snapshot: not a hub cache "
                             "snapshot link" % (link_path, os.readlink(current)))
        if not os.path.islink(hop):
            return (None, os.path.relpath(hop, snap_dir).replace(os.sep, "/"), source)
        current = hop
    raise StageError("%s is a link loop (more than %d hops): repair the source hub" % (link_path, MAX_LINK_HOPS))


def content_of(link_path, hub_real):
    """The real path of the regular file a path (or its link chain) ends at inside `hub_real`, else StageError."""
    real = os.path.realpath(link_path)
    if not is_within(real, hub_real):
        raise StageError("%s resolves to %s, outside the source hub root %s: refusing to follow it"
                         % (link_path, real, hub_real))
    try:
        st = os.stat(link_path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StageError("%s is a link loop: repair the source hub" % link_path)
        raise StageError("%s is a dangling link (chain ends at missing %s): repair the source hub"
                         % (link_path, real))
    if not stat.S_ISREG(st.st_mode):
        raise StageError("%s ends at %s, which is not a regular file: repair the source hub" % (link_path, real))
    return real


def scan_snapshot(repo_dir, commit, hub_root, strict=True):
    """Every file of `snapshots/<commit>` as SnapshotEntry, link chains followed; an entry that escapes hub_root or
    is no regular file at its end is a StageError naming it (strict=False: kind "bad", left to the caller)."""
    hub_real = os.path.realpath(hub_root)
    repo_dir = os.path.abspath(repo_dir)
    snap_dir = os.path.join(repo_dir, "snapshots", commit)
    snap_real = os.path.realpath(snap_dir)
    if not is_within(snap_real, hub_real):
        raise StageError("%s resolves to %s, outside the source hub root %s: refusing to read it"
                         % (snap_dir, snap_real, hub_real))
    entries = []
    for full, rel, is_dir in walk_tree(snap_dir):
        if is_dir:
            if os.path.islink(full):
                raise StageError("%s is a symlinked directory; snapshot directories must be real" % full)
            continue
        try:
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                etag, alias_of, source = resolve_snapshot_link(full, repo_dir, snap_dir, hub_real)
                entries.append(SnapshotEntry(rel, "real" if etag is None else "link", etag, source,
                                             os.stat(source).st_size, alias_of))
            elif stat.S_ISREG(st.st_mode):
                entries.append(SnapshotEntry(rel, "real", None, full, st.st_size))
            else:
                raise StageError("%s is not a regular file (a FIFO, socket or device): repair the source hub" % full)
        except StageError as exc:
            if strict:
                raise
            entries.append(SnapshotEntry(rel, "bad", None, full, 0, problem=str(exc)))
    return entries


def first_match(path, patterns):
    """The first pattern selecting path (fnmatchcase, `*` crosses '/', 'dir/' means below dir), or None."""
    for pattern in patterns or []:
        glob = pattern.replace("\\", "/")
        if fnmatch.fnmatchcase(path, glob + "*" if glob.endswith("/") else glob):
            return pattern
    return None


def path_selected(path, allow_patterns, ignore_patterns):
    """huggingface_hub's rule: allow_patterns (when given) select the path, ignore_patterns do not."""
    if allow_patterns and first_match(path, allow_patterns) is None:
        return False
    return first_match(path, ignore_patterns) is None


def unmatched_patterns(paths, patterns):
    """Patterns that match none of the paths (worth a warning: usually a typo)."""
    return [p for p in patterns or [] if all(first_match(x, [p]) is None for x in paths)]


def blob_link_target(path, etag):
    """Relative link text from `snapshots/<commit>/<path>` to `blobs/<etag>`, as huggingface_hub writes it."""
    depth = path.count("/")
    return "../" * (depth + 2) + "blobs/" + etag


def read_tree_listing(repo_dir, commit):
    """The `trees/<commit>.json` listing as a dict, or None when the source has none."""
    path = os.path.join(repo_dir, "trees", commit + ".json")
    if not os.path.isfile(path):
        return None
    try:
        with open_to_read(path) as handle:
            data = json.loads(handle.read().decode("utf-8"))
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StageError("%s is not a valid tree listing (%s): remove it or restore it from the hub" % (path, exc))
    if not isinstance(files, dict):
        raise StageError("%s: 'files' is not a mapping" % path)
    return data


def tree_listing_for(listing, paths):
    """The listing restricted to the staged paths, so an offline load of the partial copy is complete."""
    wanted = set(paths)
    data = dict(listing)
    data["files"] = dict((p, info) for p, info in listing["files"].items() if p in wanted)
    return json.dumps(data, indent=2, sort_keys=True).encode("utf-8") + b"\n"
