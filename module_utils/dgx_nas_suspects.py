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
from ansible.module_utils.dgx_progress_file import PROGRESS_NAME, repo_document, suspects_in

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


def _names_another_blob(nas_file, nas_snapshot, blob):
    """Whether the NAS snapshot path stands for another blob now (a later revision), or for none: the name of
    its link's first hop into the repo's blobs/ says which (the store file the chain ends at may carry another
    name). A path that cannot be read so stands for `blob`: its bytes decide."""
    snap_dir = os.path.abspath(nas_snapshot)
    repo_dir = os.path.dirname(os.path.dirname(snap_dir))
    try:
        named = resolve_snapshot_link(os.path.abspath(nas_file), repo_dir, snap_dir,
                                      os.path.realpath(os.path.dirname(repo_dir)))[0] \
            if os.path.islink(nas_file) else None
    except (StageError, OSError):
        return False
    return named != blob


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


# The passes whose rows in the host report name NAS blobs found corrupt (preflight is a check-mode plan).
REPORT_PASSES = ("stage", "verify")
_BLOB_NAME = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def _report_findings(report, record):
    """[(pass, row commit, {blob or None, paths, why})] the report's real stage and verify rows of the repo found
    corrupt on the NAS. A row written before rows named blobs gives its paths only (blob None, read at its commit)."""
    found = []
    for name in REPORT_PASSES:
        rows = (report.get("passes") or {}).get(name) if isinstance(report.get("passes"), dict) else None
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict) or row.get("check_mode") or row.get("repo_id") != record["repo_id"] \
                    or row.get("repo_type", "model") != record["repo_type"]:
                continue
            blobs = row.get("nas_corrupt_blobs")
            if isinstance(blobs, list):
                found.extend((name, row.get("commit"), b) for b in blobs if isinstance(b, dict) and b.get("blob"))
            elif isinstance(row.get("nas_corrupt"), list):
                found.extend((name, row.get("commit"), {"blob": None, "paths": [p], "why": None})
                             for p in row["nas_corrupt"] if isinstance(p, str))
    return found


def _report_why(report, report_path, name, finding, still):
    play = ((report.get("plays") or {}) if isinstance(report.get("plays"), dict) else {}).get(name) or {}
    when = "run %s, %s" % (play.get("run_id") or "unknown", play.get("finished") or play.get("started") or "unknown")
    return ("the host report on the controller (%s) records it found corrupt by the %s pass (%s)%s; the local hub "
            "holds no record of it (wiped, swapped, or another hub_local_root), and %s"
            % (report_path, name, when, ": %s" % finding["why"] if finding.get("why") else "", still))


def report_suspects(manifest, report_text, report_path, hub_local_root):
    """The files the manifest binds from the NAS that the host's latest report on the controller (report_text,
    its JSON; empty when there is none) says a real stage or verify pass found corrupt: [{repo_id, path, blob,
    nas_file, why}] as bound_suspects gives. The latest view keeps each pass's last real rows, so a finding lasts
    until that pass runs again without it. A blob the node's own record holds is left to bound_suspects (the
    record knows whether the NAS file changed since); any other is hashed now and dropped when its bytes hash to
    its name (re-downloaded since). A report that cannot be read is a suspect record of every repo."""
    if not report_text:
        return []
    try:
        report = json.loads(report_text)
        problem = None if isinstance(report, dict) else "it holds no JSON object"
    except ValueError as exc:
        report, problem = None, str(exc)
    if problem:
        return [{"repo_id": record["repo_id"], "path": None, "blob": None, "nas_file": None,
                 "why": "the host report on the controller (%s), which records the NAS blobs the stage and verify "
                        "passes found corrupt, cannot be read: %s" % (report_path, problem)}
                for record in manifest.get("repos") or []]
    mounts_by_target = dict((m["target"], m) for m in manifest.get("mounts") or [])
    found, proven, seen = [], {}, set()
    for record in manifest.get("repos") or []:
        known = suspects_of(hub_local_root, record["folder"])[0] if hub_local_root else {}
        for name, commit, finding in _report_findings(report, record):
            for path in finding.get("paths") or []:
                nas_file = os.path.join(record["nas_snapshot"], path)
                real = os.path.realpath(nas_file)
                blob = os.path.basename(real)
                if (record["repo_id"], path) in seen or blob in known or not _BLOB_NAME.match(blob) \
                        or blob != (finding["blob"] or (blob if commit == record["commit"] else None)) \
                        or _nas_origin(mounts_by_target, posixpath.join(record["target"], path)) != "nas":
                    continue
                seen.add((record["repo_id"], path))
                if real not in proven:
                    try:
                        digest, count = hash_as_named(real, blob)
                        proven[real] = None if digest == blob and count == os.stat(real).st_size else (
                            "its bytes still hash to %s" % digest)
                    except OSError as exc:
                        proven[real] = "it cannot be read to prove it (%s)" % (exc.strerror or exc)
                if proven[real] is not None:
                    found.append({"repo_id": record["repo_id"], "path": path, "blob": blob, "nas_file": nas_file,
                                  "why": _report_why(report, report_path, name, finding, proven[real])})
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
