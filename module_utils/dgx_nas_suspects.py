# -*- coding: utf-8 -*-
"""NAS blobs found failing their names, remembered per repo until the NAS proves them good again.

A stage or verify pass that finds a NAS blob whose bytes do not hash to its name keeps the good local copy
and fails. Such a blob stays suspect after the run: a full verify hashes only the local copies, so a later
green verify says nothing about the NAS. The repo's progress file keeps the suspects under `nas_corrupt`
(PassMeter writes it); a pass that copies the blob from the NAS and proves its name drops it. Binding a
suspect from the NAS (a roll-back, engine_bind_from nas) is refused before the lane is stopped.

remembered(previous, found, proven, now) -> the suspects to keep: {blob: {paths, nas_source, identity, found_at, why}}
nas_identity(path)                       -> what must hold still for a suspect to stay suspect, or None
suspects_of(hub_local_root, folder)      -> (the repo's suspects, why they cannot be read or None)
bound_suspects(manifest, hub_local_root) -> [{repo_id, path, blob, nas_file, why}]: the suspects the manifest
                                            binds from the NAS; one whose NAS file changed since it was found is
                                            hashed again and dropped when it now holds its name's bytes
report_suspects(manifest, report_text, report_path, hub_local_root)
                                         -> the same, from the host's latest report on the controller: what its
                                            stage and verify rows found corrupt and the node's record does not
                                            hold (a wiped or swapped local hub lost it); hashed, dropped when the
                                            NAS file now holds its name's bytes
suspect_text(suspects, allowed, bind_from) -> the refusal (or, allowed, the warning) naming each file and blob

Stdlib only; runs on the nodes' system Python.
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
    """[st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns] of the file at path (links followed), or None: a
    re-download on the NAS, even one that restores the mtime, moves one of them. A record written before st_dev
    was part of it holds four numbers, which match no file: such a suspect is hashed again before it is bound."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def remembered(previous, found, proven, now):
    """The suspects after a pass: the previous ones less the blobs the pass `proven` (copied from the NAS,
    their names checked), plus the nas_corrupt_blobs records `found` (the latest finding of a blob wins)."""
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
    """(suspects, problem) from the progress file in <hub_local_root>/.locks/<folder>, read without following a
    link; no file (nothing staged there yet, a swapped disk) is no suspect and no problem."""
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


def _named_blob(nas_file, nas_snapshot):
    """The blob the NAS snapshot path stands for now: the name of its link's first hop into the repo's blobs/ (the
    store file the chain ends at may carry another name); None for a real file or a chain with no blob hop. Raises
    StageError or OSError when the link cannot be followed."""
    if not os.path.islink(nas_file):
        return None
    snap_dir = os.path.abspath(nas_snapshot)
    repo_dir = os.path.dirname(os.path.dirname(snap_dir))
    return resolve_snapshot_link(os.path.abspath(nas_file), repo_dir, snap_dir,
                                 os.path.realpath(os.path.dirname(repo_dir)))[0]


def _names_another_blob(nas_file, nas_snapshot, blob):
    """Whether the NAS snapshot path stands for another blob now (a later revision), or for none. A path that
    cannot be read so stands for `blob`: its bytes decide."""
    try:
        return _named_blob(nas_file, nas_snapshot) != blob
    except (StageError, OSError):
        return False


def _still_suspect(nas_file, nas_snapshot, blob, entry):
    """Why the NAS file behind a suspect still cannot be bound, or None when the path stands for another blob
    now, or the file it resolves to changed since it was found corrupt and now hashes to the blob's name.
    The file found corrupt is known by its identity (nas_identity), never by its name: a store file may be
    named by another hash."""
    real = os.path.realpath(nas_file)
    identity = nas_identity(real)
    if identity is None:
        return None          # gone: the manifest's coverage check names a missing NAS file
    if entry.get("identity") is not None and list(entry["identity"]) == identity:
        return "found corrupt %s (%s) and unchanged since" % (entry.get("found_at") or "earlier", entry.get("why"))
    if _names_another_blob(nas_file, nas_snapshot, blob):
        return None
    try:
        digest, count = hash_as_named(real, blob)
    except OSError as exc:
        return "changed since it was found corrupt, and cannot be read to prove it (%s)" % (exc.strerror or exc)
    if count == identity[2] and digest == blob:
        return None
    return "changed since it was found corrupt, and its bytes still hash to %s" % digest


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
    """Refuse a report part of the wrong shape: a report edited or truncated by hand is unreadable, never a
    traceback, never a finding skipped."""
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
    """[{repo_id, repo_type, blob or None, commit, paths, why, pass, run_id, when}]: the NAS blobs the report says
    were found corrupt: its accumulated `nas_suspects` (dgx_report) and its real stage and verify rows (a report
    written before it kept them). A row written before rows named blobs gives its paths only (blob None, read at
    its commit). Raises ValueError naming the first part of the wrong shape."""
    found = []
    for blob, entry in sorted(_object(report.get("nas_suspects"), "nas_suspects").items()):
        where = "nas_suspects.%s" % blob
        _need(_BLOB_NAME.match(blob) and isinstance(entry, dict), where, "a blob name with an object")
        _need(isinstance(entry.get("repo_id"), str), where + ".repo_id", "a string")
        found.append({"repo_id": entry["repo_id"], "repo_type": _text(entry.get("repo_type"), where + ".repo_type")
                      or "model", "blob": blob, "commit": None,
                      "paths": _snapshot_paths(entry.get("paths"), where + ".paths"),
                      "why": _text(entry.get("why"), where + ".why"), "pass": _text(entry.get("pass"), where + ".pass"),
                      "run_id": _text(entry.get("run_id"), where + ".run_id"),
                      "when": _text(entry.get("found_at"), where + ".found_at")})
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


def _report_why(report_path, finding, still):
    return ("the host report on the controller (%s) records it found corrupt by the %s pass (run %s, %s)%s; the "
            "local hub holds no record of it (wiped, swapped, or another hub_local_root), and %s"
            % (report_path, finding["pass"] or "stage or verify", finding["run_id"] or "unknown",
               finding["when"] or "unknown", ": %s" % finding["why"] if finding["why"] else "", still))


def _proof(real, blob):
    """None when the NAS file `real` holds the bytes `blob` names, else why it is still suspect."""
    try:
        digest, count = hash_as_named(real, blob)
        return None if digest == blob and count == os.stat(real).st_size else "its bytes still hash to %s" % digest
    except OSError as exc:
        return "it cannot be read to prove it (%s)" % (exc.strerror or exc)


def report_suspects(manifest, report_text, report_path, hub_local_root):
    """The files the manifest binds from the NAS that the host's latest report on the controller (report_text,
    its JSON; empty when there is none) says a real stage or verify pass found corrupt: [{repo_id, path, blob,
    nas_file, why}] as bound_suspects gives. The report's `nas_suspects` keeps every such finding whatever passes
    ran since (a green full verify reads no NAS byte). A blob the node's own record holds is left to bound_suspects
    (the record knows whether the NAS file changed since); any other is hashed now and dropped when its bytes hash
    to its name (re-downloaded since). Which blob a path names is its link's first hop into the repo's blobs/,
    never the store file's name. A report that cannot be read, or of the wrong shape, is a suspect record of every
    repo."""
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
                try:
                    named, unresolved = _named_blob(nas_file, record["nas_snapshot"]), False
                except (StageError, OSError):
                    named, unresolved = None, True      # its bytes decide
                blob = finding["blob"] or (named if finding["commit"] == record["commit"] else None)
                if not blob or blob in known or (named != blob and not unresolved):
                    continue
                seen.add((record["repo_id"], path))
                real = os.path.realpath(nas_file)
                if (real, blob) not in proven:
                    proven[(real, blob)] = _proof(real, blob)
                if proven[(real, blob)] is not None:
                    found.append({"repo_id": record["repo_id"], "path": path, "blob": blob, "nas_file": nas_file,
                                  "why": _report_why(report_path, finding, proven[(real, blob)])})
    return found


def suspect_text(suspects, allowed, bind_from):
    """What the operator reads when the manifest would bind suspects from the NAS: each file, its blob, the NAS
    file and why, and each repo whose record of them cannot be read (no count of files: it is not known); then
    how to go on, which depends on bind_from: a roll-back (nas) can serve the local copies instead, while binding
    from the local disk (local) binds from the NAS only files with no usable local copy, which a stage copies once
    the NAS holds their right bytes."""
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
