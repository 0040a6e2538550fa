"""NAS blobs found failing their names, kept in the repo's progress file (`nas_corrupt`: a later full verify
hashes only local copies) until a pass copies the blob from the NAS and proves its name. Binding a suspect from
the NAS (a roll-back, or a file with no local copy) is refused before the lane is stopped.
"""

import json
import os
import posixpath
import re

from ansible.module_utils.dgx_errors import StageError, fix_command
from ansible.module_utils.dgx_hashing import hash_as_named
from ansible.module_utils.dgx_hubcache import resolve_snapshot_link
from ansible.module_utils.dgx_progress_file import PROGRESS_NAME, is_snapshot_path, repo_document, suspects_in
from ansible.module_utils.dgx_report import NAS_FINDING_PASSES

def nas_identity(path):
    """What a re-download on the NAS moves (even one restoring the mtime), links followed; None when unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def remembered(previous, found, proven, now):
    """The suspects after a pass: the previous ones less the `proven` blobs, plus the records `found`."""
    keep = dict((blob, entry) for blob, entry in (previous or {}).items()
                if isinstance(entry, dict) and blob not in set(proven))
    for record in found:
        if not record.get("blob"):
            continue
        keep[record["blob"]] = {"paths": list(record.get("paths") or []), "nas_source": record.get("nas_source"),
                                "identity": nas_identity(record["nas_source"]) if record.get("nas_source") else None,
                                "found_at": now, "why": record.get("why")}
    return keep


def suspects_of(hub_local_root, folder):
    """(suspects, problem) from the repo's progress file; no file is no suspect and no problem."""
    document, problem = repo_document(hub_local_root, folder)
    if problem:
        return {}, problem
    suspects, problem = suspects_in(document)
    if problem:
        return {}, "%s: %s" % (os.path.join(hub_local_root, ".locks", folder, PROGRESS_NAME), problem)
    return suspects, None


def _nas_origin(mounts_by_target, target):
    """The origin of the mount that shows `target` in the container (itself or its nearest bound folder)."""
    while target not in ("", "/"):
        mount = mounts_by_target.get(target)
        if mount is not None:
            return mount.get("origin")
        target = posixpath.dirname(target)
    return None


# A NAS snapshot link that cannot be followed: whatever blob it stands for, its bytes decide.
UNRESOLVED = object()


def _named_blob(nas_file, nas_snapshot):
    """The blob the NAS snapshot path stands for now: the name of its link's first hop into the repo's blobs/ (the
    store file the chain ends at may carry another name); None for a real file or a chain with no blob hop."""
    if not os.path.islink(nas_file):
        return None
    snap_dir = os.path.abspath(nas_snapshot)
    repo_dir = os.path.dirname(os.path.dirname(snap_dir))
    try:
        return resolve_snapshot_link(os.path.abspath(nas_file), repo_dir, snap_dir,
                                     os.path.realpath(os.path.dirname(repo_dir)))[0]
    except (StageError, OSError):
        return UNRESOLVED


def _still_suspect(nas_file, nas_snapshot, blob, entry):
    """Why the NAS file behind a suspect still cannot be bound, or None when the path stands for another blob
    now, or its file changed (nas_identity: a store file may carry another hash's name) and hashes to the blob."""
    real = os.path.realpath(nas_file)
    identity = nas_identity(real)
    if identity is None:
        return None          # gone: the manifest's coverage check names a missing NAS file
    if entry.get("identity") is not None and list(entry["identity"]) == identity:
        return "found corrupt %s (%s) and unchanged since" % (entry.get("found_at") or "earlier", entry.get("why"))
    if _named_blob(nas_file, nas_snapshot) not in (blob, UNRESOLVED):     # another revision's now, or none
        return None
    why = _proof(real, blob)
    return why and "changed since it was found corrupt, and %s" % why


def bound_suspects(manifest, hub_local_root):
    """The suspects the manifest binds from the NAS, each with why it is still suspect."""
    mounts_by_target = dict((m["target"], m) for m in manifest.get("mounts") or [])
    found = []
    for record in manifest.get("repos") or []:
        suspects, problem = suspects_of(hub_local_root, record["folder"]) if hub_local_root else ({}, None)
        if problem:
            found.append({"repo_id": record["repo_id"], "path": None, "blob": None, "nas_file": None,
                          "why": "its record of NAS blobs found corrupt cannot be read: %s" % problem})
        for blob, entry in sorted(suspects.items()):
            for path in entry.get("paths") or []:
                target = posixpath.join(record["target"], path)
                if _nas_origin(mounts_by_target, target) != "nas":
                    continue
                nas_file = os.path.join(record["nas_snapshot"], path)
                why = _still_suspect(nas_file, record["nas_snapshot"], blob, entry)
                if why:
                    found.append({"repo_id": record["repo_id"], "path": path, "blob": blob, "nas_file": nas_file,
                                  "why": why})
    return found


_BLOB_NAME = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def _need(ok, where, what):
    """Refuse a report part of the wrong shape (unreadable, never a traceback, never a finding skipped)."""
    if not ok:
        raise ValueError("%s is not %s" % (where, what))


def _text(value, where):
    _need(value is None or (isinstance(value, str) and "\0" not in value), where, "a string")
    return value


def _snapshot_paths(value, where):
    """A list of snapshot paths (dgx_progress_file.is_snapshot_path: they are joined to the NAS snapshot)."""
    _need(isinstance(value, list) and all(is_snapshot_path(p) for p in value), where, "a list of snapshot paths")
    return value


def _object(value, where):
    _need(value is None or isinstance(value, dict), where, "an object")
    return value or {}


def _report_findings(report):
    """The NAS blobs the report's `nas_suspects` and real stage and verify rows found corrupt (blob None: a row naming
    paths only); ValueError names the first part of the wrong shape."""
    found = []
    for blob, entry in sorted(_object(report.get("nas_suspects"), "nas_suspects").items()):
        where = "nas_suspects.%s" % blob
        _need(_BLOB_NAME.match(blob) and isinstance(entry, dict), where, "a blob name with an object")
        _need(isinstance(entry.get("repo_id"), str), where + ".repo_id", "a string")
        text = dict((key, _text(entry.get(key), "%s.%s" % (where, key)))
                    for key in ("repo_type", "why", "pass", "run_id", "found_at"))
        found.append({"repo_id": entry["repo_id"], "repo_type": text["repo_type"] or "model", "blob": blob,
                      "commit": None, "paths": _snapshot_paths(entry.get("paths"), where + ".paths"),
                      "why": text["why"], "pass": text["pass"], "run_id": text["run_id"], "when": text["found_at"]})
    passes, plays = _object(report.get("passes"), "passes"), _object(report.get("plays"), "plays")
    for name in NAS_FINDING_PASSES:
        play = _object(plays.get(name), "plays.%s" % name)
        run_id = _text(play.get("run_id"), "plays.%s.run_id" % name)
        when = _text(play.get("finished"), "plays.%s.finished" % name) or \
            _text(play.get("started"), "plays.%s.started" % name)
        rows = passes.get(name)
        _need(rows is None or isinstance(rows, list), "passes.%s" % name, "a list")
        for i, row in enumerate(rows or []):
            where = "passes.%s[%d]" % (name, i)
            _need(isinstance(row, dict), where, "an object")
            if row.get("check_mode"):
                continue
            _need(isinstance(row.get("repo_id"), str), where + ".repo_id", "a string")
            common = {"repo_id": row["repo_id"], "repo_type": _text(row.get("repo_type"), where + ".repo_type")
                      or "model", "commit": _text(row.get("commit"), where + ".commit"), "pass": name,
                      "run_id": run_id, "when": when}
            blobs, paths = row.get("nas_corrupt_blobs"), row.get("nas_corrupt")
            _need(blobs is None or isinstance(blobs, list), where + ".nas_corrupt_blobs", "a list")
            for j, record in enumerate(blobs or []):
                at = "%s.nas_corrupt_blobs[%d]" % (where, j)
                _need(isinstance(record, dict), at, "an object")
                blob = _text(record.get("blob"), at + ".blob")
                _need(blob is None or _BLOB_NAME.match(blob), at + ".blob", "a blob name")
                if blob:
                    found.append(dict(common, blob=blob, paths=_snapshot_paths(record.get("paths"), at + ".paths"),
                                      why=_text(record.get("why"), at + ".why")))
            if blobs is None and paths is not None:
                found.extend(dict(common, blob=None, paths=[p], why=None)
                             for p in _snapshot_paths(paths, where + ".nas_corrupt"))
    return found


def _proof(real, blob):
    """None when the NAS file `real` holds the bytes `blob` names, else why it is still suspect."""
    try:
        digest, count = hash_as_named(real, blob)
        return None if digest == blob and count == os.stat(real).st_size else "its bytes still hash to %s" % digest
    except OSError as exc:
        return "it cannot be read to prove it (%s)" % (exc.strerror or exc)


def report_suspects(manifest, report_text, report_path, hub_local_root):
    """As bound_suspects, from the host report on the controller: what the node's record lost (a wiped or swapped
    hub), each hashed now and dropped when it proves its name; an unreadable report is a suspect of every repo."""
    if not report_text:
        return []
    try:
        report = json.loads(report_text)
        _need(isinstance(report, dict), "it", "a JSON object")
        findings = _report_findings(report)
    except ValueError as exc:
        return [{"repo_id": record["repo_id"], "path": None, "blob": None, "nas_file": None,
                 "why": "the host report on the controller (%s), which records the NAS blobs the stage and verify "
                        "passes found corrupt, cannot be read: %s" % (report_path, exc)}
                for record in manifest.get("repos") or []]
    mounts_by_target = dict((m["target"], m) for m in manifest.get("mounts") or [])
    found, proven, seen = [], {}, set()
    for record in manifest.get("repos") or []:
        known = suspects_of(hub_local_root, record["folder"])[0] if hub_local_root else {}
        for finding in findings:
            if (finding["repo_id"], finding["repo_type"]) != (record["repo_id"], record["repo_type"]):
                continue
            for path in finding["paths"]:
                if (record["repo_id"], path) in seen \
                        or _nas_origin(mounts_by_target, posixpath.join(record["target"], path)) != "nas":
                    continue
                nas_file = os.path.join(record["nas_snapshot"], path)
                named = _named_blob(nas_file, record["nas_snapshot"])
                blob = finding["blob"] or (named if finding["commit"] == record["commit"] else None)
                if blob in (None, UNRESOLVED) or blob in known or named not in (blob, UNRESOLVED):
                    continue
                seen.add((record["repo_id"], path))
                real = os.path.realpath(nas_file)
                if (real, blob) not in proven:
                    proven[(real, blob)] = _proof(real, blob)
                if proven[(real, blob)] is not None:
                    found.append({"repo_id": record["repo_id"], "path": path, "blob": blob, "nas_file": nas_file,
                                  "why": "the host report on the controller (%s) records it found corrupt by the %s "
                                         "pass (run %s, %s)%s; the local hub holds no record of it (wiped, swapped, "
                                         "or another hub_local_root), and %s" % (
                                             report_path, finding["pass"] or "stage or verify",
                                             finding["run_id"] or "unknown", finding["when"] or "unknown",
                                             ": %s" % finding["why"] if finding["why"] else "", proven[(real, blob)])})
    return found


def suspect_text(suspects, allowed, bind_from):
    """The refusal (or, allowed, the warning) naming each suspect file, its blob, NAS file and why, and each repo
    whose record cannot be read; then the fix for bind_from (nas can serve the local copies; local has none)."""
    files = [s for s in suspects if s["path"]]
    shown = ["%s %s (blob %s, NAS file %s): %s" % (s["repo_id"], s["path"], s["blob"], s["nas_file"], s["why"])
             for s in files[:10]]
    more = "; and %d more" % (len(files) - 10) if len(files) > 10 else ""
    unread = "; ".join("%s: %s" % (s["repo_id"], s["why"]) for s in suspects if not s["path"])
    if allowed:
        parts = ["binding from the NAS %d file(s) it holds with wrong bytes: %s%s" % (len(files), "; ".join(shown),
                                                                                       more)] if files else []
        if unread:
            parts.append("binding from the NAS without knowing which files there hold wrong bytes (%s)" % unread)
        return "engine_allow_corrupt_nas is set: %s" % "; ".join(parts)
    found = ["a stage or verify pass found %d file(s) there whose bytes do not hash to their blob's name, and "
             "nothing proved them good since: %s%s" % (len(files), "; ".join(shown), more)] if files else []
    fixes = []
    if files and bind_from == "nas":
        fixes.append("re-download them on the NAS (the next run hashes a changed NAS file before binding it), or "
                     "serve the local copies (%s)" % fix_command("serve", None))
    elif files:
        fixes.append("they have no usable local copy: re-download them on the NAS, then %s copies them to the local "
                     "disk with their names proven (a file the patterns leave on the NAS is hashed again before it "
                     "is bound)" % fix_command("stage", None))
    if unread:
        found.append("which files there hold wrong bytes is not known: %s" % unread)
        fixes.append("inspect that record: put back the one dgx-stage wrote, or move it aside to start a new one "
                     "(the NAS blobs it named are then trusted again)")
    fix = "; or ".join(fixes)
    anyway = fix_command("serve", None, *(["engine_bind_from=nas"] if bind_from == "nas" else [])
                         + ["engine_allow_corrupt_nas=true"])
    return ("Not binding from the NAS: %s. Nothing was written or stopped. %s; to bind them anyway: %s"
            % ("; also, ".join(found), fix[:1].upper() + fix[1:], anyway))
