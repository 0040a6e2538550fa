"""The record of each run: <runs dir>/<ident>/run.json (written atomically), next to ansible-runner's
artifacts of the run (stdout: the full log, job_events/, rc, status, command)."""
import datetime
import json
import os
import secrets
import tempfile


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_ident(subcommand):
    """A runner ident: sortable by start time, unique: 20261201T100609Z-stage-1a2b."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return "%s-%s-%s" % (stamp, subcommand, secrets.token_hex(2))


def write_record(run_dir, record):
    """run.json, replaced atomically (temp file in the same dir, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(prefix=".run.json.", dir=run_dir)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, os.path.join(run_dir, "run.json"))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_records(runs_dir):
    """Every readable run.json under runs_dir, oldest first."""
    records = []
    try:
        names = sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        return []
    for name in names:
        path = os.path.join(runs_dir, name, "run.json")
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(normal_record(record, name))
    return sorted(records, key=lambda r: (r.get("started") or "", r["ident"]))


def normal_record(record, name):
    """A run.json as `report` reads it: the fields it uses of the types it expects (a hand-edited or foreign
    file must not crash report: a wrong field reads as absent; the ident falls back to the dir's name)."""
    record = dict(record)
    for key in ("ident", "run_id", "started", "subcommand", "report_dir"):
        if not isinstance(record.get(key), str) or not record[key]:
            record[key] = None
    record["ident"] = record["ident"] or name
    reports = record.get("reports")
    record["reports"] = dict((h, p) for h, p in reports.items() if isinstance(p, str)) \
        if isinstance(reports, dict) else {}
    receipts = record.get("receipts_removed")
    record["receipts_removed"] = dict((h, p) for h, p in receipts.items() if isinstance(p, list)) \
        if isinstance(receipts, dict) else {}
    return record


def find_record(records, wanted):
    """The record whose ident or lane run_id is `wanted` (the latest such), else None."""
    found = [r for r in records if wanted in (r.get("ident"), r.get("run_id"))]
    return found[-1] if found else None


def report_records(records):
    """The records of runs that wrote host reports (status runs write none)."""
    return [r for r in records if r.get("run_id")]


def history_files(report_dir):
    """{run_id: {host: path}} of the <host>-<run_id>.json files in a report dir (run ids end -xxxx)."""
    import re
    pattern = re.compile(r"^(?P<host>.+)-(?P<run_id>\d{8}T\d{6}Z-[0-9a-f]{4})\.json$")
    out = {}
    try:
        names = sorted(os.listdir(report_dir))
    except FileNotFoundError:
        return out
    for name in names:
        match = pattern.match(name)
        if match:
            out.setdefault(match.group("run_id"), {})[match.group("host")] = os.path.join(report_dir, name)
    return out
