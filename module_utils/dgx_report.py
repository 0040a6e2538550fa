"""The host reports (DESIGN "Host reports"), written atomically by the dgx_report callback: `<host>-<run_id>.json`,
what this run did, and `<host>.json`, the latest complete view (this run over every play's last real result). A
--check run never replaces real results; a failed play fails both at once; `nas_suspects` only grows.
"""
import contextlib
import fcntl
import json
import os
import re

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import atomic_write_bytes
from ansible.module_utils.dgx_units import utc_text

# The plays of stage-deepseek.yml, in run order (their tags); PASSES are the stage role's passes.
PLAYS = ("preflight", "stage", "verify", "receipts", "manifest", "engine", "smoke", "bench")
PASSES = ("preflight", "stage", "verify")
# The passes whose real rows name NAS blobs found failing their names (preflight is a check-mode plan).
NAS_FINDING_PASSES = ("stage", "verify")
# The host's identity in the lane, recorded as given (select-lane.yml's facts and the hub roots).
IDENTITY = ("lane", "rank", "world_size", "hub_nas_root", "hub_local_root")

_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_inputs(host, run, play=None):
    """Refuse what would make a wrong file name or an unreadable timestamp, naming the input (play: the
    play being recorded, None for the end of the run)."""
    if not host or "/" in host or "\0" in host or host.startswith(".") or len(host.encode("utf-8")) > 200:
        raise StageError("host report: host %r cannot name a report file (empty, a '/', a leading '.', "
                         "or longer than 200 bytes)" % (host,))
    if not _RUN_ID.match(run["id"] or "") or len(run["id"]) > 64:
        raise StageError("host report: run_id %r is not a run id (letters, digits, '.', '_', '-'; at most "
                         "64): it is made once per run in playbooks/select-lane.yml" % (run["id"],))
    stamps = [("run_started", run["started"])] + ([("play_started", play["started"])] if play else []) + (
        [("play_finished", play["finished"])] if play and play.get("finished") else [])
    for what, value in stamps:
        if not _ISO.match(value or ""):
            raise StageError("host report: %s %r is not ISO 8601 UTC (like 2026-11-30T20:45:12Z)" % (what, value))
    if play and play["name"] not in PLAYS:
        raise StageError("host report: play %r is not one of %s" % (play["name"], ", ".join(PLAYS)))


def stage_bytes(rows):
    """(bytes_from_nas, bytes_from_peers) of a stage pass, all repos; a row that does not say copied from the NAS."""
    from_nas = from_peers = 0
    for row in rows or []:
        peers = int(row.get("bytes_from_peers") or 0)
        from_peers += peers
        from_nas += int(row.get("bytes_from_nas", int(row.get("bytes_copied") or 0) - peers))
    return from_nas, from_peers


def failure_message(result):
    """The message of a failed task's result: its msg, and for a loop, each failed item's label and msg."""
    result = result if isinstance(result, dict) else {}
    msg = result.get("msg")
    msg = msg if isinstance(msg, str) else (json.dumps(msg, sort_keys=True) if msg is not None else "")
    items = []
    for item in result.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            label = item.get("_ansible_item_label", item.get("item"))
            label = label if isinstance(label, str) else json.dumps(label, sort_keys=True)
            items.append("%s: %s" % (label, item.get("msg", "failed")))
    if not items:
        return msg
    return "%s: %s" % (msg or "failed items", " | ".join(items))


def play_record(run, play, passes, finished):
    """How one play of this run went: run_id, started, finished, status (and for stage, its bytes)."""
    status = "failed" if play["failed"] else ("check" if run["check"] else "ok")
    record = {"run_id": run["id"], "started": play["started"], "finished": finished, "status": status}
    if play["name"] == "stage":
        # A --check run copies nothing: its rows are the plan (status check), not bytes read.
        record["bytes_from_nas"], record["bytes_from_peers"] = (
            (0, 0) if run["check"] else stage_bytes(passes.get("stage")))
    if play["failed"]:
        record["failed_task"] = play["failed_task"] or "(unnamed task)"
        record["failed_msg"] = failure_message(play["failed_result"])
    return record


def _in_play_order(plays):
    return dict((name, plays[name]) for name in PLAYS if name in plays)


def _stage_fields(plays):
    """The stage pass's top-level fields from its play record (null and 0 when it has not run)."""
    stage = plays.get("stage") or {}
    return {"stage_started": stage.get("started"), "stage_finished": stage.get("finished"),
            "bytes_from_nas": int(stage.get("bytes_from_nas") or 0),
            "bytes_from_peers": int(stage.get("bytes_from_peers") or 0)}


def _failure(plays):
    """failed_play, failed_task, failed_msg of the first failed play, or {}."""
    for name, record in plays.items():
        if record.get("status") == "failed":
            return {"failed_play": name, "failed_task": record.get("failed_task"),
                    "failed_msg": record.get("failed_msg", "")}
    return {}


def _run_header(host, run):
    """The keys every view of this run starts with."""
    return {"host": host, "run_id": run["id"], "started": run["started"], "check_mode": bool(run["check"]),
            "tags": sorted(run["tags"]), "skip_tags": sorted(run["skip_tags"])}


def run_status(failure, run, ended):
    """A run killed before its end is recorded stays `running`, never `ok`."""
    if failure:
        return "failed"
    if not ended:
        return "running"
    return "check" if run["check"] else "ok"


def end_view(previous, host, run, reached_end, last_play, finished, identity):
    """This run's view of the host once the run is over (`previous`: what this run wrote, or None). A host that
    did not reach the end (reached_end) and names no failed play became unreachable during last_play: a failure."""
    same_run = previous if isinstance(previous, dict) and previous.get("run_id") == run["id"] else None
    view = dict(same_run) if same_run else dict(_run_header(host, run), plays={}, passes={}, weights=[], engine={})
    for key in IDENTITY:
        if view.get(key) is None:
            view[key] = identity.get(key)
    view.update((key, value) for key, value in _stage_fields(view["plays"]).items() if key not in view)
    failure = _failure(view["plays"])
    if not failure and not reached_end:
        failure = {"failed_play": last_play if last_play in PLAYS else None, "failed_task": "(host unreachable)",
                   "failed_msg": "%s did not reach the end of the run: it became unreachable, or the run was "
                                 "stopped, during %s" % (host, "play " + last_play if last_play else "lane selection")}
    view.update(failure)
    view.update(status=run_status(failure, run, ended=True), finished=finished)
    return view


def run_view(previous, host, run, play, data, finished):
    """This run's view of the host after `play` (`previous`: what this run wrote before, or None). data: the host's
    results so far in this run, {"identity": {lane, rank, ...}, "passes": {pass: [rows]}, "weights", "engine"}."""
    same_run = previous if isinstance(previous, dict) and previous.get("run_id") == run["id"] else {}
    plays = _in_play_order(dict(same_run.get("plays") or {}, **{play["name"]: play_record(run, play, data["passes"],
                                                                                          finished)}))
    passes = dict(same_run.get("passes") or {}, **data["passes"])
    engine = dict(same_run.get("engine") or {}, **data["engine"])
    failure = _failure(plays)
    status = run_status(failure, run, ended=False)
    view = dict(_run_header(host, run), finished=None if status == "running" else finished, status=status)
    view.update(failure)
    view.update((key, data["identity"].get(key)) for key in IDENTITY)
    view.update(_stage_fields(plays))
    view.update(plays=plays, passes=_in_pass_order(passes),
                weights=list(data["weights"] or same_run.get("weights") or []), engine=engine)
    return view


def _in_pass_order(passes):
    ordered = dict((name, passes[name]) for name in PASSES if name in passes)
    ordered.update((name, rows) for name, rows in passes.items() if name not in ordered)
    return ordered


def real_results(previous):
    """The real (not --check) results a latest view holds: plays, passes, weights, engine, last_real_run (a view
    without run_id holds them at the top, real unless a --check run wrote it)."""
    if not isinstance(previous, dict):
        return {"plays": {}, "passes": {}, "weights": [], "engine": {}, "last_real_run": None, "nas_suspects": {}}
    if "run_id" not in previous and previous.get("check_mode"):
        return real_results(None)
    return {"plays": dict(previous.get("plays") or {}), "passes": dict(previous.get("passes") or {}),
            "weights": list(previous.get("weights") or []), "engine": dict(previous.get("engine") or {}),
            "last_real_run": previous.get("last_real_run"), "nas_suspects": previous.get("nas_suspects") or {}}


def nas_suspects(previous, view):
    """The previous `nas_suspects` plus every blob this real run's stage and verify rows found failing its name (a
    record that is no object stays as it is, so engine_manifest refuses it as unreadable rather than losing it)."""
    if not isinstance(previous, dict):
        return previous
    kept = dict(previous)
    for name in NAS_FINDING_PASSES:
        play = (view.get("plays") or {}).get(name) or {}
        for row in (view.get("passes") or {}).get(name) or []:
            if not isinstance(row, dict) or row.get("check_mode"):
                continue
            for record in row.get("nas_corrupt_blobs") or []:
                if isinstance(record, dict) and isinstance(record.get("blob"), str):
                    kept[record["blob"]] = {
                        "repo_id": row.get("repo_id"), "repo_type": row.get("repo_type", "model"),
                        "paths": list(record.get("paths") or []), "nas_file": record.get("nas_source"),
                        "why": record.get("why"), "found_at": play.get("finished") or view.get("started"),
                        "run_id": view.get("run_id"), "pass": name}
    return kept


_RUN_KEYS = ("run_id", "started", "finished", "status", "tags", "failed_play", "failed_task", "failed_msg")
_LATEST_KEYS = ("host", "check_mode", "skip_tags") + _RUN_KEYS + IDENTITY


def latest_view(previous, view):
    """The latest complete view after this run's `view`, over the previous latest view (or None)."""
    latest = dict((key, view[key]) for key in _LATEST_KEYS if key in view)
    real = real_results(previous)
    if view["check_mode"]:
        latest.update(real, check=dict((key, view[key]) for key in _RUN_KEYS + ("plays", "passes", "weights", "engine")
                                       if key in view))
    else:
        latest.update(plays=_in_play_order(dict(real["plays"], **view["plays"])),
                      passes=_in_pass_order(dict(real["passes"], **view["passes"])),
                      # The weights come with the verify play: a run that verified replaces them, even with none.
                      weights=view["weights"] if "verify" in view["plays"] else real["weights"],
                      engine=dict(real["engine"], **view["engine"]),
                      last_real_run=dict((key, view[key]) for key in _RUN_KEYS if key in view),
                      nas_suspects=nas_suspects(real["nas_suspects"], view))
    latest.update(_stage_fields(latest["plays"]))
    return latest


def report_paths(directory, host, run_id):
    """(history path, latest path) of a host's reports."""
    return (os.path.join(directory, "%s-%s.json" % (host, run_id)), os.path.join(directory, host + ".json"))


def read_report(path):
    """(the JSON object at path or None, a warning or None): a missing file is no warning."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, "%s is unreadable (%s): it is replaced by this run's report" % (path, exc)
    if not isinstance(data, dict):
        return None, "%s holds no JSON object: it is replaced by this run's report" % path
    return data, None


def settle_unfinished(directory, host, run_id, status, failure=None):
    """Settle a run whose end the host did not record (interrupted, or failed where no rescue wrote it): its
    `running` history file and latest view (with last_real_run or check) take `status` and `failure`
    ({"play", "task", "msg"}) as failed_*. Returns the settled history report, else None."""
    failed = dict(("failed_" + key, str(value)) for key, value in (failure or {}).items()
                  if key in ("play", "task", "msg") and value is not None)

    def settle(report):
        if isinstance(report, dict) and report.get("run_id") == run_id and report.get("status") == "running":
            report.update(failed, status=status)
            return True
        return False

    settled = None
    history_path, latest_path = report_paths(directory, host, run_id)
    with _one_writer(directory):
        for path in (history_path, latest_path):
            report, _warning = read_report(path)
            if report is None or not settle(report):
                continue
            for key in ("last_real_run", "check"):
                settle(report.get(key))
            atomic_write_bytes(path, dumps(report))
            if path == history_path:
                settled = report
    return settled


def dumps(report):
    return (json.dumps(report, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


@contextlib.contextmanager
def _one_writer(directory):
    """The report dir locked while a view is read, merged and written: two runs at once must not each write the
    latest view over a copy read before the other's write (its plays and NAS suspects would be lost)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:   # no such dir: nothing in it to read or settle
        yield
        return
    try:
        with contextlib.suppress(OSError):   # a file system without flock: unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _record(directory, host, run, make_view, write):
    """Make this run's view from its history file (make_view(previous)), merge it into the latest view, and write
    both unless write=False."""
    directory = os.path.abspath(directory)
    history_path, latest_path = report_paths(directory, host, run["id"])
    try:
        if write:
            os.makedirs(directory, 0o755, exist_ok=True)
        with _one_writer(directory):
            previous_run, warn_run = read_report(history_path)
            previous_latest, warn_latest = read_report(latest_path)
            view = make_view(previous_run)
            latest = latest_view(previous_latest, view)
            if write:
                atomic_write_bytes(history_path, dumps(view))
                atomic_write_bytes(latest_path, dumps(latest))
    except OSError as exc:
        raise StageError("host report: cannot write the reports of %s in %s: %s; check stage_report_dir"
                         % (host, directory, exc))
    return {"report": view, "latest": latest, "history_path": history_path, "latest_path": latest_path,
            "warnings": [w for w in (warn_run, warn_latest) if w]}


def end_reports(directory, host, run, reached_end, last_play=None, identity=None, finished=None, write=True):
    """Record the end of the run in the host's history file of this run and its latest view (end_view)."""
    check_inputs(host, run)
    finished = finished or utc_text()
    return _record(directory, host, run, lambda previous: end_view(
        previous, host, run, reached_end, last_play, finished, identity or {}), write)


def update_reports(directory, host, run, play, data, finished=None, write=True):
    """Merge this play into the host's history file of this run and its latest view, and write both (unless
    write=False). run: {"id", "started", "tags", "skip_tags", "check"}; play: {"name", "started", "failed",
    "failed_task", "failed_result"}; data: see run_view. Returns {"report", "latest", "history_path",
    "latest_path", "warnings"}."""
    check_inputs(host, run, play)
    finished = finished or utc_text()
    return _record(directory, host, run, lambda previous: run_view(previous, host, run, play, data, finished), write)
