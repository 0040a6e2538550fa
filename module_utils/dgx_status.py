"""What a node holds, read without changing anything (module stage_status). No symlink in the local hub is
followed; garbage is reported, never raised.
"""
import json
import os
import stat

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import read_small, walk_tree
from ansible.module_utils.dgx_hubcache import COMMIT_RE, REF_MAX_BYTES, repo_folder_name
from ansible.module_utils.dgx_localtree import linked_dir_problem
from ansible.module_utils.dgx_nodestate import checked_manifest
from ansible.module_utils.dgx_progress_file import passes_of, repo_document, suspects_in
from ansible.module_utils.dgx_units import human_bytes, utc_text

MANIFEST_MAX_BYTES = 64 * 1024 * 1024
# Container statuses that mean the engine stopped (docker and podman words).
EXITED = ("exited", "stopped", "dead")
# What docker and podman (and engine_lane_wait, for a missing runtime) say of a container that is not there.
ABSENT_WORDS = ("no such container", "no such object", "not found on this host")


def _text(value):
    return value if isinstance(value, str) and value else None


def pass_summary(figures):
    """{when, status, verify, commit} of one pass's figures (passes_of's: a mapping, or None)."""
    figures = figures or {}
    status = _text(figures.get("status"))
    if status is None and "finished" in figures:
        status = "ok" if figures.get("finished") is True else ("failed" if figures.get("aborted") else "running")
    return {"when": _text(figures.get("updated_at")), "status": status, "verify": _text(figures.get("verify")),
            "commit": _text(figures.get("commit"))}


def _lstat(path):
    try:
        return os.lstat(path)
    except OSError:
        return None


def snapshot_content(repo_dir, snap_dir):
    """(files, bytes, dangling) of a local snapshot: files with content in the repo, the bytes of their distinct
    contents, links whose content is missing or outside the repo folder."""
    repo_real = os.path.realpath(repo_dir)
    files, dangling, seen, total = 0, 0, set(), 0
    for path, _rel, is_dir in walk_tree(snap_dir):
        st = None if is_dir else _lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode):
            real = os.path.realpath(path)
            st = _lstat(real)
            if st is None or not stat.S_ISREG(st.st_mode) or not real.startswith(repo_real + os.sep):
                dangling += 1
                continue
        if st is None or not stat.S_ISREG(st.st_mode):
            continue
        key = (st.st_dev, st.st_ino)
        files += 1
        if key not in seen:
            seen.add(key)
            total += st.st_size
    return files, total, dangling


def staged_commit(repo_dir, revision, hub="the local hub"):
    """(commit, problem): the commit refs/<revision> names (or a commit hash revision itself), or None and why."""
    if not revision or revision.startswith("/") or ".." in revision.split("/"):
        return None, "revision %r cannot name a ref" % (revision,)
    ref_path = os.path.join(repo_dir, "refs", revision)
    # refs/ and any folder of a revision like release/v1: never read through a link out of the repo.
    problem = linked_dir_problem(repo_dir, "/".join(["refs"] + revision.split("/")[:-1]))
    if problem:
        return None, problem
    st = _lstat(ref_path)
    if st is None:
        if COMMIT_RE.match(revision):
            return revision, None
        return None, "no refs/%s in %s" % (revision, hub)
    if not stat.S_ISREG(st.st_mode):
        return None, "refs/%s is not a regular file" % revision
    raw = read_small(ref_path, REF_MAX_BYTES) or b""
    commit = raw.decode("utf-8", "replace").strip()
    if not COMMIT_RE.match(commit):
        return None, "refs/%s holds %r, not a commit hash" % (revision, commit[:60])
    return commit, None


def repo_status(hub_root, repo):
    """One repo's status (see stage_status's RETURN: status.repos[])."""
    repo_id = repo.get("repo_id")
    repo_type = repo.get("repo_type") or "model"
    revision = repo.get("revision") or "main"
    row = {"repo_id": repo_id, "repo_type": repo_type, "revision": revision, "folder": None, "state": "error",
           "problem": None, "commit": None, "snapshot": None, "files_local": 0, "bytes_local": 0, "dangling": 0,
           "last_staged": None, "last_stage_status": None, "last_verified": None, "verify_mode": None,
           "last_verify_status": None, "verified_commit": None, "progress_problem": None, "nas_corrupt": []}
    try:
        folder = repo_folder_name(repo_id, repo_type)
    except StageError as exc:
        row["problem"] = str(exc)
        return row
    row["folder"] = folder
    repo_dir = os.path.join(hub_root, folder)
    problem = linked_dir_problem(hub_root, folder)
    if problem:
        row.update(state="refused", problem=problem)
        return row
    row.update(progress_of(hub_root, folder))
    if _lstat(repo_dir) is None:
        row["state"] = "not staged"
        return row
    commit, problem = staged_commit(repo_dir, revision)
    if commit is None:
        row.update(state="not staged", problem=problem)
        return row
    row["commit"] = commit
    snap_dir = os.path.join(repo_dir, "snapshots", commit)
    row["snapshot"] = snap_dir
    problem = linked_dir_problem(repo_dir, "snapshots/" + commit)
    if problem:
        row.update(state="refused", problem=problem)
        return row
    if _lstat(snap_dir) is None:
        row.update(state="snapshot missing",
                   problem="refs/%s points at %s but snapshots/%s is missing" % (revision, commit, commit))
        return row
    try:
        row["files_local"], row["bytes_local"], row["dangling"] = snapshot_content(repo_dir, snap_dir)
    except (StageError, OSError) as exc:    # a pass changing it under this read, or a folder no one may list
        row["problem"] = "%s; run status again" % exc
        return row
    row["state"] = "staged"
    return row


def progress_of(hub_root, folder):
    """The last-pass and nas_corrupt fields of a repo from its progress file."""
    document, problem = repo_document(hub_root, folder)
    passes, shape_problem = passes_of(document)
    suspects, suspects_problem = suspects_in(document)
    stage, verify = pass_summary(passes.get("stage")), pass_summary(passes.get("verify"))
    return {"progress_problem": problem or shape_problem or suspects_problem,
            "last_staged": stage["when"], "last_stage_status": stage["status"], "last_verified": verify["when"],
            "verify_mode": verify["verify"], "last_verify_status": verify["status"], "verified_commit": verify["commit"],
            "nas_corrupt": [{"blob": blob, "paths": sorted(entry["paths"]), "found_at": entry.get("found_at")}
                            for blob, entry in sorted(suspects.items())]}


def receipts_status(parent, names):
    """{parent, present, problem}: the receipt roots (bare names) present under parent."""
    if not parent:
        return {"parent": parent, "present": [], "problem": "receipt_parent is not set"}
    present = [name for name in names or [] if name and "/" not in name and name not in (".", "..")
               and _lstat(os.path.join(parent, name)) is not None]
    return {"parent": parent, "present": present, "problem": None}


def engine_status(enabled, name, probe):
    """status.engine (stage_status's RETURN) from engine_lane_wait's result."""
    status = {"enabled": bool(enabled), "name": name, "state": "disabled", "exit_code": None, "container_id": None,
              "health": "not checked", "models": [], "problem": None}
    if not enabled:
        return status
    row = probe.get("row") if isinstance(probe.get("row"), dict) else {}
    container = row.get("container") if isinstance(row.get("container"), dict) else None
    if container is None:
        status.update(state="unknown", problem=probe.get("msg") or "the engine container was not looked up")
        return status
    if not container.get("exists"):
        # A runtime that could not answer (its daemon down) leaves the state unknown.
        error = container.get("error") or ""
        state = "absent" if not error or any(w in error.lower() for w in ABSENT_WORDS) else "unknown"
        status["problem"] = error or None
    elif container.get("running"):
        state = "running"
    else:
        state = "exited" if container.get("status") in EXITED else container.get("status") or "unknown"
    status.update(state=state, exit_code=container.get("exit_code") if state != "running" else None,
                  container_id=(container.get("id") or None))
    if state == "running":
        status["models"] = [m for m in row.get("models") or [] if isinstance(m, str)]
        status["health"] = "ok" if row.get("api") else "unhealthy: %s" % (row.get("status") or "no answer")
    return status


def manifest_status(manifest_path, hub_nas_root):
    """status.manifest (stage_status's RETURN); None without a path."""
    if not manifest_path:
        return None
    out = {"path": manifest_path, "problem": None, "written": None, "bind_from": None, "repos": []}
    st = _lstat(manifest_path)
    if st is None:
        out["problem"] = "not written yet"
        return out
    raw = read_small(manifest_path, MANIFEST_MAX_BYTES + 1)
    if raw is None:
        out["problem"] = "not a regular file"
        return out
    out["written"] = utc_text(st.st_mtime)
    try:
        manifest, problem = checked_manifest(json.loads(raw.decode("utf-8"))) if len(raw) <= MANIFEST_MAX_BYTES \
            else (None, "larger than %d bytes" % MANIFEST_MAX_BYTES)
    except ValueError as exc:
        manifest, problem = None, "not JSON: %s" % exc
    if problem:
        out["problem"] = problem
        return out
    # A field of the wrong type (a hand edit, another tool's file) is named and left out; the rest is read.
    out["field_problems"] = fields = []
    if "bind_from" in manifest and manifest["bind_from"] not in ("local", "nas"):
        fields.append("bind_from is %s, neither local nor nas" % _shown(manifest["bind_from"]))
    else:
        out["bind_from"] = manifest.get("bind_from")
    for index, record in enumerate(manifest["repos"]):
        if not isinstance(record, dict):
            fields.append("repos[%d] is %s, not an object" % (index, _shown(record)))
            continue
        texts = {}
        for key in ("repo_id", "revision", "commit", "folder"):
            if record.get(key) is None or isinstance(record[key], str):
                texts[key] = record.get(key)
            else:
                fields.append("repos[%d].%s is %s, not text" % (index, key, _shown(record[key])))
        row = {"repo_id": texts.get("repo_id", "repos[%d]" % index),
               "revision": (texts["revision"] or "main") if "revision" in texts else None,
               "commit": texts.get("commit"), "nas_commit": None, "moved": None, "problem": None}
        folder = texts.get("folder")
        if hub_nas_root and "revision" in texts and folder and "/" not in folder and folder not in (".", ".."):
            row["nas_commit"], row["problem"] = staged_commit(os.path.join(hub_nas_root, folder), row["revision"],
                                                              "the NAS hub")
            if row["nas_commit"] and row["commit"]:
                row["moved"] = row["nas_commit"] != row["commit"]
        out["repos"].append(row)
    return out


def _shown(value):
    """A manifest value as a problem names it: its JSON, cut short."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def manifest_lines(manifest):
    if manifest is None:
        return []
    if manifest["problem"]:
        return ["manifest %s: %s" % (manifest["path"], manifest["problem"])]
    fields = manifest.get("field_problems") or []
    unknown = "an unknown source" if any(f.startswith("bind_from ") for f in fields) else \
        "an unknown source (written before the mode was recorded)"
    lines = ["manifest %s: binds from %s (written %s)" % (manifest["path"], manifest["bind_from"] or unknown,
                                                         manifest["written"])]
    lines += ["  manifest field %s: not read" % field for field in fields]
    for row in manifest["repos"]:
        if row["moved"]:
            lines.append("  %s: the NAS refs/%s moved past the bound commit %s to %s (not served yet: stage it)"
                         % (row["repo_id"], row["revision"], _short(row["commit"]), _short(row["nas_commit"])))
        elif row["problem"]:
            lines.append("  %s: NAS refs/%s: %s" % (row["repo_id"], row["revision"], row["problem"]))
    return lines


def host_status(hub_root, repos, receipt_parent, receipt_roots, engine_enabled, engine_name, engine_probe,
                manifest_path=None, hub_nas_root=None):
    """The status dict of stage_status (its RETURN documents every key)."""
    problem = None if hub_root else "hub_local_root is not set"
    if hub_root and os.path.lexists(hub_root) and not os.path.isdir(hub_root):   # a link to one is the operator's
        problem = "hub_local_root %s is not a directory" % hub_root
    rows = [] if problem else [repo_status(hub_root, repo) for repo in repos]
    return {"hub_local_root": hub_root, "problem": problem, "repos": rows,
            "receipts": receipts_status(receipt_parent, receipt_roots),
            "engine": engine_status(engine_enabled, engine_name, engine_probe),
            "manifest": manifest_status(manifest_path, hub_nas_root)}


def _short(commit):
    return commit[:12] if commit else "?"


def repo_line(row):
    head = "%s@%s" % (row["repo_id"], row["revision"])
    if row["state"] == "staged":
        text = "%s: commit %s, %d files, %s local" % (head, _short(row["commit"]), row["files_local"],
                                                     human_bytes(row["bytes_local"]))
        if row["dangling"]:
            text += ", %d link(s) without local content" % row["dangling"]
    elif row["state"] in ("not staged", "snapshot missing"):
        text = "%s: %s" % (head, row["state"]) + (" (%s)" % row["problem"] if row["problem"] else "")
    else:
        text = "%s: %s - %s" % (head, row["state"], row["problem"])
    if row["state"] in ("refused", "error"):
        return text
    if not (row["last_staged"] or row["last_verified"]):
        # An unreadable progress file says nothing of either pass: not "never verified", not "staged" at all.
        if row["progress_problem"]:
            text += "; last stage and verify unknown: %s" % row["progress_problem"]
        return text
    text += "; staged %s" % (row["last_staged"] or "at an unknown time (no stage pass in the progress file)")
    if row["last_stage_status"] not in (None, "ok"):
        text += " (%s)" % row["last_stage_status"]
    if row["last_verified"]:
        text += "; verified %s (%s)" % (row["last_verified"], row["verify_mode"] or "mode unknown")
        if row["last_verify_status"] not in (None, "ok"):
            text += " - %s" % row["last_verify_status"]
        if row["verified_commit"] and row["commit"] and row["verified_commit"] != row["commit"]:
            text += ", of commit %s, not the staged one" % _short(row["verified_commit"])
    else:
        text += "; never verified"
    if row["progress_problem"]:
        text += "; %s" % row["progress_problem"]
    return text + _suspects_text(row["nas_corrupt"])


def _suspects_text(suspects):
    """The NAS blobs found corrupt and not proven since, as the repo line's last part."""
    if not suspects:
        return ""
    shown = ["%s (blob %s, found %s)" % (", ".join(s["paths"]) or "?", s["blob"][:12], s["found_at"] or "earlier")
             for s in suspects[:5]]
    return "; NAS blobs found corrupt, not proven since (a roll-back refuses them): %s%s" % (
        "; ".join(shown), " and %d more" % (len(suspects) - 5) if len(suspects) > 5 else "")


def one_line(text):
    """text with its control characters escaped, so it cannot pass for another line or recolour the terminal."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def status_lines(status):
    """Human lines for one host, each one line."""
    if status["problem"]:
        lines = ["local hub %s: %s" % (status["hub_local_root"], status["problem"])]
    else:
        lines = [repo_line(row) for row in status["repos"]] or ["no repos in stage_repos"]
    receipts = status["receipts"]
    if receipts["problem"]:
        lines.append("receipts: %s" % receipts["problem"])
    else:
        lines.append("receipts under %s: %s" % (receipts["parent"], ", ".join(receipts["present"]) or "none"))
    lines.extend(manifest_lines(status.get("manifest")))
    engine = status["engine"]
    text = "engine %s: %s" % (engine["name"], engine["state"])
    if engine["state"] == "exited" and engine["exit_code"] is not None:
        text += " (exit code %s)" % engine["exit_code"]
    if engine["enabled"]:
        text += ", API health: %s" % engine["health"]
        if engine["models"]:
            text += " (%s)" % ", ".join(engine["models"])
        if engine["problem"] and engine["state"] in ("unknown", "absent"):
            text += " - %s" % engine["problem"]
    return [one_line(line) for line in lines + [text]]
