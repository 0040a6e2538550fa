"""The record of each run: <runs dir>/<ident>/run.json (written atomically), next to ansible-runner's artifacts of
the run (stdout: the full log, job_events/, rc, status, command)."""
import datetime
import glob
import json
import os
import re
import secrets
import shutil
import stat

from dgx_stage import UsageError, use_module_utils

use_module_utils()
from ansible.module_utils import dgx_report  # noqa: E402
from ansible.module_utils.dgx_fsutil import atomic_write_bytes  # noqa: E402
from ansible.module_utils.dgx_process import process_alive, process_started  # noqa: E402

# The folder of a run's inline -e values (files ansible-playbook reads; they may hold secrets).
EXTRA_VARS = "extra-vars"
HISTORY_FILE = re.compile(r"^(?P<host>.+)-(?P<run_id>\d{8}T\d{6}Z-[0-9a-f]{4})\.json$")


def new_ident():
    """A run's id, sortable by start time (20261201T100609Z-1a2b): the runner's dir, the lane's run id."""
    return "%s-%s" % (datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ"), secrets.token_hex(2))


def run_identity_env(ident):
    """The environment that makes the playbook's lane_run_id (playbooks/select-lane.yml) this ident."""
    started = datetime.datetime.strptime(ident.split("-")[0], "%Y%m%dT%H%M%SZ")
    return {"DGX_STAGE_RUN_ID": ident, "DGX_STAGE_RUN_STARTED": started.strftime("%Y-%m-%dT%H:%M:%SZ")}


def write_json(path, data, indent=1):
    """A JSON file, replaced atomically; a file replaced keeps its mode (a new one is 0600)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o600
    text = json.dumps(data, indent=indent, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def front_end_alive(record):
    """Whether a run's front end still runs (its pid alive and started when recorded: a reused pid does not count)."""
    if not isinstance(record, dict) or record.get("status") != "running":
        return False
    pid, started = record.get("pid"), record.get("pid_started")
    return (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
            and process_alive(pid, started if isinstance(started, int) else None))


def this_process():
    """The pid and pid_started of a run record for this process (see front_end_alive)."""
    return {"pid": os.getpid(), "pid_started": process_started(os.getpid())}


def sweep_extra_vars(runs_dir):
    """Remove the -e files of every run whose front end is gone (a killed one could not); returns their idents."""
    swept = []
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        folder = os.path.join(runs_dir, name, EXTRA_VARS)
        if not os.path.islink(folder) and os.path.isdir(folder) and \
                not front_end_alive(_read_json(os.path.join(runs_dir, name, "run.json"))):
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(name)
    return swept


def scrub_command(run_dir):
    """Drop `env` (the operator's environment, tokens included) from runner's `command` artifact; True if done."""
    path = os.path.join(run_dir, "command")
    artifact = _read_json(path)
    if not isinstance(artifact, dict) or "env" not in artifact:
        return False
    artifact.pop("env")
    try:
        write_json(path, artifact)
    except OSError:   # left as runner wrote it rather than failing the run over it
        return False
    return True


def settle_unfinished(report_paths, run_id, failures):
    """{host: report} of the reports still `running` rewritten `failed` (a host in failures) or `interrupted`."""
    settled = {}
    for host, path in sorted(report_paths.items()):
        failure = failures.get(host)
        report = dgx_report.settle_unfinished(os.path.dirname(path), host, run_id,
                                              "failed" if failure else "interrupted", failure)
        if report is not None:
            settled[host] = report
    return settled


def runs_dirs_nearby(root, current):
    """Other runs dirs of this work tree that hold runs (the demos record theirs under .cache/<demo>/runs)."""
    found = set(os.path.dirname(os.path.dirname(path)) for pattern in ("*/runs", "runs")
                for path in glob.glob(os.path.join(root, ".cache", pattern, "*", "run.json")))
    return sorted(path for path in found if os.path.abspath(path) != os.path.abspath(current))


def _names(folder, what, option):
    """The names in folder, sorted ([] when it does not exist); UsageError naming the fix when it cannot be listed."""
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UsageError("cannot read the %s %s (%s); pass another with %s" % (what, folder, exc.strerror or exc, option))


def read_records(runs_dir):
    """Every readable run.json, oldest first; a field of another type reads as absent, a dead run as interrupted."""
    records = []
    for name in _names(runs_dir, "runs dir", "--runs-dir DIR or set DGX_STAGE_RUNS_DIR"):
        record = _read_json(os.path.join(runs_dir, name, "run.json"))
        if not isinstance(record, dict):
            continue
        record = dict(record, **dict((key, record[key] if isinstance(record.get(key), str) and record[key] else None)
                                     for key in ("ident", "run_id", "started", "subcommand", "report_dir", "status",
                                                 "inventory")))
        record["ident"] = record["ident"] or name
        if record["status"] == "running" and not front_end_alive(record):
            record["status"] = "interrupted"
        for key, kind in (("reports", str), ("receipts_removed", list)):
            given = record.get(key) if isinstance(record.get(key), dict) else {}
            record[key] = dict((h, p) for h, p in given.items() if isinstance(p, kind))
        failures = record.get("failures") if isinstance(record.get("failures"), list) else []
        record["failures"] = [f for f in failures if isinstance(f, dict) and isinstance(f.get("host"), str)]
        records.append(record)
    return sorted(records, key=lambda r: (r.get("started") or "", r["ident"]))


def history_files(report_dir):
    """{run_id: {host: path}} of the <host>-<run_id>.json files in a report dir."""
    out = {}
    for name in _names(report_dir, "report dir", "--report-dir DIR"):
        match = HISTORY_FILE.match(name)
        if match:
            out.setdefault(match.group("run_id"), {})[match.group("host")] = os.path.join(report_dir, name)
    return out


def run_reports(report_dirs, run_id):
    """({host: report}, {host: path}) of run_id's readable history files in the report dirs."""
    reports, paths = {}, {}
    for directory in report_dirs:
        for host, path in history_files(directory).get(run_id, {}).items():
            report, _warning = dgx_report.read_report(path)
            if report is not None:
                reports[host], paths[host] = report, path
    return reports, paths
