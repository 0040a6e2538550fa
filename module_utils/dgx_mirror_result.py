"""What a mirror run says: the plan's headline and diff, the summary, the warnings, the result and report row.
"""
import os
import time

from ansible.module_utils.dgx_mirror_request import lock_dir_rel, name_some
from ansible.module_utils.dgx_progress_file import PROGRESS_NAME
from ansible.module_utils.dgx_units import human_bytes


def _count(number, what):
    return "%d %s%s" % (number, what, "" if number == 1 else "s")


def plan_headline(plan, check_mode):
    """The plan in one line: 'would copy 13 files, 47.9 GiB; ...' (check mode) or 'copied ...'; '' for nothing."""
    def verb(now, past):
        return "would " + now if check_mode else past

    parts = ["%s %s, %s" % (verb(now, past), _count(len(works), "file"), human_bytes(sum(w.size for w in works)))
             for now, past, works in (("copy", "copied", [w for w in plan.writes if not w.is_repair]),
                                      ("repair", "repaired", [w for w in plan.writes if w.is_repair])) if works]
    if plan.prune:
        parts.append("%s %s (%s freed)" % (verb("prune", "pruned"), _count(len(plan.prune), "path"),
                                           human_bytes(plan.freed_bytes)))
    if plan.debris:
        parts.append("%s %s of killed runs" % (verb("remove", "removed"), _count(len(plan.debris), "temp file")))
    metadata = ([_count(len(plan.links), "snapshot link")] if plan.links else []) + (
        ["ref%s %s" % ("" if len(plan.refs) == 1 else "s", ", ".join(sorted(plan.refs)))] if plan.refs else []) + (
        ["the tree listing"] if plan.tree_listing is not None else [])
    if metadata:
        parts.append("%s %s" % (verb("write", "wrote"), ", ".join(metadata)))
    return "; ".join(parts)


def describe_plan(plan, check_mode=False):
    """What --diff shows: the headline, then a line per copy, repair, prune, ref and link not said by a copy."""
    headline = plan_headline(plan, check_mode)
    if not headline:
        return ""
    lines = [headline]
    for path in plan.debris:
        lines.append("- remove temp debris %s" % path)
    for path in plan.prune:
        lines.append("- prune %s" % path)
    with_copies = set()
    for work in plan.writes:
        verb = "repair (%s)" % work.reason if work.is_repair else "copy"
        lines.append("+ %s %s (%s) for %s" % (verb, work.final, human_bytes(work.size), ", ".join(work.paths)))
        with_copies.update(os.path.join(plan.snapshot, *p.split("/")) for p in work.paths)
    for link, target in plan.links:
        if link not in with_copies:
            lines.append("+ link %s -> %s" % (link, target))
    for name, commit in sorted(plan.refs.items()):
        lines.append("+ ref %s = %s" % (name, commit))
    if plan.tree_listing is not None:
        lines.append("+ tree listing trees/%s.json" % plan.commit)
    return "\n".join(lines) + "\n"


REPORT_KEYS = ("commit", "snapshot", "files", "blobs", "bytes_copied", "bytes_staged", "bytes_read", "duration_s",
               "verify", "phase", "changed", "repaired_paths", "repairs", "pruned", "excluded_paths", "nas_corrupt",
               "nas_corrupt_blobs", "unstaged_paths", "bytes_from_nas", "bytes_from_peers", "read_s", "max_mib_s",
               "achieved_mib_s", "io_priority")


def with_report(result, req, check_mode=False, failed=False):
    """Add `report`: this repo's row of the host report, shaped here so the role only passes it on."""
    row = dict((key, result[key]) for key in REPORT_KEYS)
    row.update(repo_id=req.repo_id, repo_type=req.repo_type, revision=req.revision, check_mode=check_mode,
               status="failed" if failed else ("check" if check_mode else "ok"),
               peer_rejected=len(result["peer_rejected"]))
    result["report"] = row
    result["summary"] = summary_line(result, req, check_mode, failed)
    return result


def unfinished_report(repo_id, repo_type="model", revision=None, phase=None, verify=None, check_mode=False):
    """The host-report row of a run that ended without figures: failed, no `files` (the pass did not finish)."""
    row = {"repo_id": repo_id, "repo_type": repo_type or "model", "status": "failed", "check_mode": bool(check_mode)}
    row.update((key, value) for key, value in (("revision", revision), ("phase", phase), ("verify", verify))
               if value is not None)
    return row


def summary_line(result, req, check_mode, failed):
    """One line for the operator: what the pass did or would do, what it found right, what it read, how long."""
    blobs, real = result["blobs"], result["real_files"]
    copied, repaired = blobs["copied"] + real["copied"], blobs["repaired"] + real["repaired"]
    repaired_bytes = sum(r["size"] for r in result["repairs"])
    would = "would " if check_mode else ""
    parts = []
    if copied or req.phase == "stage":
        parts.append("%s%s %s, %s" % (would, "copy" if check_mode else "copied", _count(copied, "file"),
                                      human_bytes(result["bytes_copied"] - repaired_bytes)))
    peers = (["%s from peers" % human_bytes(result["bytes_from_peers"])] if result["bytes_from_peers"] else []) + (
        ["%s rejected" % _count(len(result["peer_rejected"]), "peer blob")] if result["peer_rejected"] else [])
    if peers:
        parts[-1:] = [", ".join(parts[-1:] + peers)]
    if repaired or req.phase == "verify":
        parts.append("%s%s %s, %s" % (would, "repair" if check_mode else "repaired", _count(repaired, "file"),
                                      human_bytes(repaired_bytes)))
    if blobs["reused"]:
        parts.append("%d blob(s) %s" % (blobs["reused"], "already local (sizes checked)" if req.verify == "none"
                                        else "proven by content (verify=%s) and kept" % req.verify))
    if req.require_match:
        parts.append("stages %s and %s (%s)" % (_count(result["files"]["shared"], "shared file"),
                                                _count(result["files"]["rank"], "rank file"),
                                                ", ".join(req.require_match)))
    if result["files"]["excluded"]:
        parts.append("%d file(s) left on the NAS" % result["files"]["excluded"])
    read = result["bytes_read"]
    text = "%s@%s %s pass%s: %s; read %s local + %s NAS in %.1f s" % (
        req.repo_id, (result["commit"] or "")[:12], req.phase, " (check mode)" if check_mode else "",
        "; ".join(parts), human_bytes(read["local"]), human_bytes(read["nas"]), result["duration_s"])
    if not check_mode and result["duration_s"] >= 0.1 and read["local"] + read["nas"]:
        text += " (%.1f MiB/s)" % ((read["local"] + read["nas"]) / 1048576.0 / result["duration_s"])
    if req.max_mib_s and not check_mode:
        achieved = result["achieved_mib_s"]
        text += "; read cap %d MiB/s, achieved %s" % (
            req.max_mib_s, "not measured (under a second of reading)" if achieved is None else "%.1f" % achieved)
    if req.io_priority != "normal":
        text += "; I/O class %s" % ((result["io_priority"] or {}).get("applied") or "unknown")
    return text + ("; FAILED" if failed else "")


def io_priority_warnings(report, repo_id):
    """The warnings of set_io_priority's report: a kernel that refused the class, a scheduler that ignores it."""
    report = report or {}
    return ["%s: %s" % (repo_id, text) for text in (report.get("problem"), report.get("note")) if text]


def failure_text(req, plan, outcome):
    local_words = {"kept": "the local copy was kept: it hashes to its name",
                   "removed": "the local copy did not hash to its name either and was removed",
                   "absent": "nothing was staged under that name"}
    parts = ["%s (blobs/%s): %s on the NAS (%s); %s"
             % (r["path"], r["blob"], r["why"], r["nas_source"], local_words[r["local"]])
             for r in outcome.nas_corrupt]
    text = ("%d NAS blob(s) of %s@%s do not hold the bytes their names say: %s. Re-download them on the NAS, then "
            "re-run" % (len(parts), req.repo_id, plan.commit[:12], "; ".join(parts))) if parts else ""
    if outcome.source_errors:
        text += ("; " if text else "") + "; ".join(outcome.source_errors)
    if outcome.unavailable:
        text += ("; %d snapshot path(s) are not staged, so refs/ and trees/ were left as they were"
                 % len(outcome.unavailable))
    return text


REPAIR_WORDS = {"size": "its size differs from the NAS copy's", "content": "it failed its content check",
                "link": "it was a symlink, not a local copy", "not-a-file": "it was not a regular file"}


def repair_warning(record, req, check_mode, from_peer=False):
    """The module warning of one repair: snapshot path, blob name, what the local bytes hashed to."""
    what = "blobs/%s" % record["blob"] if record["blob"] else "a real snapshot file, compared by sha256"
    hashed = "; the local bytes hashed to %s%s" % ("" if record["blob"] else "sha256 ", record["local_hash"]) \
        if record["local_hash"] else ""
    return "%s %s (%s) of %s: %s (%s pass, verify=%s)%s; %s" % (
        "would repair" if check_mode else "repaired", record["path"], what, req.repo_id,
        REPAIR_WORDS.get(record["reason"], record["reason"]), req.phase, req.verify, hashed,
        "a real run replaces it with a verified NAS copy" if check_mode
        else "replaced by a peer copy verified against its name" if from_peer
        else "replaced by a NAS copy verified against its name" if record["blob"] else "replaced by the NAS copy")


def _done(plan, outcome):
    """(written, links, refs, prune, debris, listing): what the plan would do, did, or nothing (refused)."""
    if outcome is None:
        return plan.writes, plan.links, sorted(plan.refs), plan.prune, plan.debris, plan.tree_listing is not None
    if not outcome.applied:
        return [], [], [], [], [], False
    complete = not outcome.unavailable
    return (outcome.written, plan.links, sorted(plan.refs) if complete else [], plan.prune, plan.debris,
            plan.tree_listing is not None and complete)


def mirror_result(plan, req, outcome, space, dangling, started, meter):
    """The module result; in check mode (outcome None) what the plan would do."""
    done, links, refs_written, pruned, debris, listing = _done(plan, outcome)
    nas_corrupt = plan.nas_corrupt if outcome is None else outcome.nas_corrupt
    repairs = [{"path": w.paths[0], "paths": list(w.paths), "blob": w.etag, "reason": w.reason,
                "local_hash": w.local_hash, "size": w.size} for w in done if w.is_repair]
    check_mode = outcome is None
    # In check mode the candidates of the right size stand for what would come from peers (not hashed).
    from_peers = plan.peer_bytes if check_mode else sum(w.size for w in outcome.from_peers)
    peer_blobs = set() if check_mode else set(w.etag for w in outcome.from_peers)
    bytes_copied = sum(w.size for w in done)
    read_s, achieved = meter.read_rate()
    return {
        "changed": bool(done or links or refs_written or pruned or debris or listing
                        or any(r["local"] == "removed" for r in nas_corrupt)),
        "commit": plan.commit,
        "snapshot": plan.snapshot,
        "files": {"total": len(plan.entries), "local": len(plan.selected), "excluded": len(plan.excluded),
                  "dangling": len(dangling), "rank": plan.rank_files, "shared": len(plan.selected) - plan.rank_files},
        "blobs": {"copied": len([w for w in done if w.etag and not w.is_repair]), "reused": plan.blobs_reused,
                  "repaired": len([w for w in done if w.etag and w.is_repair])},
        "real_files": {"copied": len([w for w in done if not w.etag and not w.is_repair]),
                       "repaired": len([w for w in done if not w.etag and w.is_repair])},
        "repaired_paths": sorted(p for w in done if w.is_repair for p in w.paths),
        "repairs": repairs,
        "links_written": len(links),
        "refs_written": refs_written,
        "bytes_copied": bytes_copied,
        "bytes_from_nas": bytes_copied - from_peers,
        "bytes_from_peers": from_peers,
        "peer_rejected": [] if check_mode else list(outcome.peer_rejected),
        "wanted_blobs": plan.wanted_blobs,
        "source_snapshot": os.path.join(plan.src_repo, "snapshots", plan.commit) if plan.commit else None,
        "bytes_staged": sum(e.size for e in plan.selected),
        "bytes_read": meter.bytes_read(),
        "read_s": read_s,
        "max_mib_s": req.max_mib_s,
        "achieved_mib_s": achieved,
        "io_priority": meter.io_priority,
        "excluded_paths": [e.path for e in plan.excluded],
        "pruned": pruned,
        "stale_paths": plan.stale,
        "debris_removed": debris,
        "nas_corrupt": sorted(p for r in nas_corrupt for p in r["paths"]),
        "nas_corrupt_blobs": nas_corrupt,
        "unstaged_paths": [] if outcome is None else sorted(outcome.unavailable),
        "verify": req.verify,
        "phase": req.phase,
        "copy_missing": req.copy_missing,
        "progress_file": os.path.join(req.dest, lock_dir_rel(req.folder), PROGRESS_NAME),
        "space": space,
        "duration_s": round(time.monotonic() - started, 3),
        "warnings": plan.warnings + io_priority_warnings(meter.io_priority, req.repo_id)
        + [repair_warning(r, req, check_mode, r["blob"] in peer_blobs) for r in repairs]
        + ["peer_dir candidate blobs/%s of %s (%s) was not adopted: %s; it was fetched from the NAS instead"
           % (r["blob"], req.repo_id, name_some(r["paths"]), r["why"])
           for r in ([] if check_mode else outcome.peer_rejected)],
        "diff_text": describe_plan(plan, check_mode) if outcome is None or outcome.applied else "",
    }
