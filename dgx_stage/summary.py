"""The lane summary of a run of the playbooks without the front end, and the status play's lines (pure
functions, no I/O): the dgx_report callback prints the summary, dgx_stdout and the front end the status lines."""
import os
import re
import shlex

from dgx_stage import SUBCOMMANDS, UsageError, extravars, runs, table, use_module_utils

use_module_utils()
from ansible.module_utils.dgx_job_poll import human_eta  # noqa: E402
from ansible.module_utils.dgx_report import PLAYS  # noqa: E402
from ansible.module_utils.dgx_status import one_line  # noqa: E402

# Machine-readable stdout callbacks: a summary would corrupt their output.
QUIET_STDOUT = ("json", "jsonl")
# Set by the front end (runs.run_identity_env) for the playbook runs it drives: its table is the run's one.
FRONT_END_RUN = "DGX_STAGE_RUN_ID"
ENGINE_PLAYS = ("engine", "smoke", "bench")


def summary_wanted(stdout_callback, environ=os.environ):
    """Whether a run prints a summary: not under the front end, not into a machine-readable stdout."""
    return str(stdout_callback or "").split(".")[-1] not in QUIET_STDOUT and not environ.get(FRONT_END_RUN)


def plural(count, word):
    return "%d %s%s" % (count, word, "" if count == 1 else "s")


def in_play_order(tags):
    """--tags in the order stage-deepseek.yml runs the plays (Ansible keeps them as a set)."""
    return sorted(tags, key=lambda tag: (PLAYS.index(tag), "") if tag in PLAYS else (len(PLAYS), tag))


def command(run, hosts, extra=()):
    """`ansible-playbook -i INVENTORY PLAYBOOK --limit HOSTS ...`, shell-quoted."""
    cmd = ["ansible-playbook"] + (["-i", run["inventory"]] if run.get("inventory") else [])
    cmd += [run.get("playbook") or "stage-deepseek.yml", "--limit", ",".join(hosts)] + list(extra)
    return " ".join(shlex.quote(part) for part in cmd)


def tags_asked(msg):
    """The tags a failure message asks to run, in order (`--tags X`, or a `dgx-stage SUBCOMMAND`'s plays)."""
    tags = []
    for flag, subcommand in re.findall(r"--tags[ =]+([\w,-]+)|dgx-stage ([a-z-]+)", str(msg or "")):
        group = flag or (SUBCOMMANDS.get(subcommand) or (None, ""))[1] or ""
        tags += [tag for tag in group.split(",") if tag and tag not in tags]
    return tags


def rerun_command(run, host, play, msg=None, lane=None):
    """The re-run: the playbook for the host (or its whole `lane`, the engine restarts as one), or the plays asked."""
    whole = list(lane or [host])
    text = command(run, whole)
    if play:
        tags = tags_asked(msg)
        tags += [play] if play not in tags else []
        what = "that play" if len(tags) == 1 else "those plays"
        if whole == [host] or set(tags) & set(ENGINE_PLAYS):
            text += "  (or only %s: --tags %s)" % (what, ",".join(tags))
        else:
            text += "  (or only %s on %s: %s)" % (what, host, command(run, [host], ["--tags", ",".join(tags)]))
    if whole != [host]:
        text += "; the whole lane %s, as its engine restarts as one" % ",".join(whole)
    return text


def rerun_extra_vars(values):
    """The -e values of a re-run: an @file by its path, an inline value (or its run's file) as NAME=... only."""
    out = []
    for value in values:
        if value.startswith("@") and os.path.basename(os.path.dirname(value[1:])) != runs.EXTRA_VARS:
            out.append("-e " + shlex.quote(value))
            continue
        try:
            names = sorted(str(name) for name in extravars.variables_of(value))
        except UsageError:
            names = ["..."]
        out += ["-e %s=..." % name for name in names]
    return out


def extra_var_warnings(values, inventories):
    """What dgx-stage would refuse in the -e values, as warnings for a run without the front end."""
    if not values:
        return []
    try:
        return extravars.problems(list(values), extravars.Inventory(list(inventories)))
    except UsageError as exc:
        return [str(exc)]


def engine_lane(reports, host, engine_runs):
    """The hosts of host's lane in rank order when its engine runs (a re-run of the engine names them all)."""
    lane = reports[host].get("lane")
    if engine_runs.get(host) is not True or not lane:
        return None
    hosts = sorted((h for h, report in reports.items() if report.get("lane") == lane), key=table.rank_order(reports))
    return hosts if len(hosts) > 1 else None


def failure_steps(report, path, run, lane=None):
    """A failed host's failure line, then what to read (its latest report, beside `path`) and what to run."""
    host = report.get("host")
    unreachable = report.get("failed_task") == "(host unreachable)"
    msg = " ".join(str(report.get("failed_msg") or "").split())
    lines = [table.failure_line({"host": host, "unreachable": unreachable, "play": report.get("failed_play"),
                                 "task": report.get("failed_task"),
                                 "msg": msg if len(msg) <= 300 else msg[:297] + "..."})]
    if unreachable:
        step = "check that %s answers (ssh, its Python), then re-run: %s" % (host, rerun_command(run, host, None,
                                                                                                lane=lane))
    else:
        latest = os.path.join(os.path.dirname(path), "%s.json" % host)
        step = "read the error above and the host report %s; fix the cause, then re-run: %s" % (
            relative(latest), rerun_command(run, host, report.get("failed_play"), msg, lane))
    return lines + [one_line("next step: " + step)]


def relative(path, cwd=None):
    """path relative to the working dir when under it (as the operator typed it), else as it is."""
    cwd = cwd or os.getcwd()
    if path and os.path.isabs(path) and os.path.commonpath([path, cwd]) == cwd:
        return os.path.relpath(path, cwd)
    return path


def lane_summary(reports, paths, run, stopped=None, engine_runs=None):
    """The summary lines of a run (run_of's with id and wall_s; stopped: INTERRUPTED or STOPPED before the recap)."""
    if not reports:
        return []
    engine_runs = engine_runs or {}
    order = sorted(reports, key=table.rank_order(reports))
    shown = dict((h, dict(r, status="interrupted") if stopped and r.get("status") == "running" else r)
                 for h, r in reports.items())
    check = bool(run.get("check"))
    lanes = sorted(set(str(r["lane"]) for r in reports.values() if r.get("lane")))
    title = "DGX-STAGE LANE SUMMARY: lane %s, %s, run %s%s%s" % (
        ",".join(lanes) or "?", plural(len(reports), "host"), run.get("id") or "?",
        ", CHECK MODE (nothing was written)" if check else "", ", " + stopped if stopped else "")
    lines = [one_line(title), table.render_plain(table.table_rows(shown))]
    failed = [h for h in order if shown[h].get("status") == "failed"]
    unfinished = [h for h in order if shown[h].get("status") == "interrupted"]
    total = "wall time %s; %d/%d hosts %s" % (human_eta(run.get("wall_s") or 0), len(order) - len(failed)
                                               - len(unfinished), len(order), "checked" if check else "ok")
    if failed:
        total += "; FAILED: %s" % ", ".join(failed)
    if unfinished:
        total += "; %s: %s" % (stopped or "INTERRUPTED", ", ".join(unfinished))
    idle = [h for h in order if engine_runs.get(h) is False]
    if idle and not check and not stopped:
        total += "; engine not started%s (engine_enabled is false)" % (
            "" if len(idle) == len(order) else " on " + ", ".join(idle))
    lines.append(one_line(total))
    for host in failed:
        lines += failure_steps(shown[host], paths[host], run, engine_lane(reports, host, engine_runs))
    if unfinished:
        text = command(run, unfinished, run.get("rerun_args") or ())
        if run.get("extra_vars"):
            text += "  (again with %s)" % " ".join(run["extra_vars"])
        lines.append(one_line("next step: the run was %s before %s finished; what is staged is kept and reused, so "
                              "re-run: %s" % ("interrupted" if stopped == "INTERRUPTED" else "stopped",
                                              ", ".join(unfinished), text)))
    return lines


def run_of(args, playbook, cwd=None):
    """The run as the summary's re-run commands name it, from ansible's CLI arguments (context.CLIARGS)."""
    inventories = [i for i in (args.get("inventory") or ()) if i]
    tags = in_play_order(t for t in (args.get("tags") or ()) if t and t != "all")
    rerun = (["--tags", ",".join(tags)] if tags else []) + (
        ["--skip-tags", ",".join(args["skip_tags"])] if args.get("skip_tags") else []) + (
        ["--check"] if args.get("check") else [])
    return {"inventory": ",".join(relative(i, cwd) for i in inventories) or None,
            "playbook": relative(playbook or "", cwd) or None, "check": bool(args.get("check")),
            "rerun_args": rerun, "extra_vars": rerun_extra_vars(args.get("extra_vars") or ())}


def status_lines(hosts, run):
    """The status play's summary: each host's stage_status lines or why it has none, the count, the next steps."""
    if not hosts:
        return []
    order = sorted(hosts, key=table.rank_order(hosts))
    lanes = sorted(set(str(info["lane"]) for info in hosts.values() if info.get("lane")))
    lines = ["DGX-STAGE STATUS: lane %s, %s" % (",".join(lanes) or "?", plural(len(order), "host"))]
    bad, steps = [], []
    for host in order:
        info = hosts[host]
        title = host + (" (rank %s)" % info["rank"] if info.get("rank") is not None else "")
        failure = info.get("failure") or {}
        msg = str(failure.get("msg") or "")
        if info.get("lines") is not None and not info.get("unreachable"):
            lines += [title + ":"] + ["  " + str(text) for text in info["lines"]]
            continue
        bad.append(host)
        if info.get("unreachable"):
            why = "unreachable" + (": " + msg if msg else "")
            steps.append("next step: check that %s answers (ssh, its Python), then re-run: %s"
                         % (host, command(run, [host])))
        elif failure:
            why = "failed: %s: %s%s" % (failure.get("play") or "?", failure.get("task") or "?",
                                        ": " + msg if msg else "")
        else:
            why = "not read (no status)"
        lines.append("%s: %s" % (title, why))
    total = "%d/%d hosts read" % (len(order) - len(bad), len(order))
    return [one_line(line) for line in lines + [total + ("; NOT READ: %s" % ", ".join(bad) if bad else "")] + steps]

