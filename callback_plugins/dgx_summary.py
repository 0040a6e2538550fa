# -*- coding: utf-8 -*-
"""The lane summary: one table at the end of every stage-deepseek.yml run (see DOCUMENTATION).

The callback only collects plain data (the hf_hub_mirror `report` rows per host and pass, the lane facts,
the first failure per host, the host report paths); the table is shaped by the pure functions below,
which tests/unit/test_dgx_summary.py tests without Ansible.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: dgx_summary
type: aggregate
short_description: One lane summary table at the end of a dgx-stage run
description:
  - Collects the C(report) row of every hf_hub_mirror result (per host, per pass - preflight, stage,
    verify), the lane facts of playbooks/select-lane.yml and each host's first failure, and prints one
    table after the recap - host, rank, per repo (its type shown when not a model) the blobs copied /
    reused / repaired, GiB copied, time, MiB/s, the verify mode and the status (ok / failed / check /
    preflight only / interrupted / unreachable, with the failed task) - then the wall time, in C(--check)
    what the run would copy, and a C(next step) line for each failed host.
  - Below the table, for a lane of more than one host that staged (or when a host took or rejected blobs
    from a peer), a C(Stage pass (UTC)) block - one line per host with its own stage window (the
    C(stage_window) fact the stage role sets when the host's wave starts and ends), the bytes its stage pass
    read from the NAS and took from peers (the hf_hub_mirror rows' C(bytes_from_nas) and C(bytes_from_peers)),
    the peer blobs it rejected when any host rejected one - and the lane's total. A single host staging from
    the NAS alone gets no block.
  - In a real run the figures are what the stage and verify passes did; the preflight pass's plan is
    never counted as copied (a repo only the preflight went over shows C(preflight only)). In C(--check)
    the plan is what the table shows.
  - Ansible sends no stats when a run is interrupted (Ctrl-C); the table is then printed at exit, once,
    marked INTERRUPTED, with the hosts that did not finish and the command that finishes them.
  - With C(display_ok_hosts = false) the default stdout callback drops the warnings of unchanged results
    together with the results; this callback prints those warnings.
  - The stage and verify passes run each repo as a background job polled by C(mirror_job); with the
    default stdout callback, each poll that retries prints C([host] <its line>) (repo, bytes done of total,
    rate, ETA, the file in hand) instead of Ansible's C(FAILED - RETRYING) line. Other stdout callbacks
    (json, ansible-runner's) are left as they are.
  - For C(playbooks/status.yml) (a C(stage_status) result, or the playbook's name) it prints, in place of the
    table, each host's status lines (the result's C(lines), shown nowhere else since C(display_ok_hosts =
    false) hides the play's debug task), in rank order, or why a host has none (unreachable, failed), with
    a next step for a host that did not answer.
  - Silent for ad-hoc commands, for machine-readable stdout callbacks (json, jsonl) and for runs that
    staged nothing.
  - At the start, a warning for each C(-e) value that C(dgx-stage) would refuse - a name no play or role reads
    (with the closest one), a name without a value, a value outside the variable's choices or type, a name
    the playbooks set themselves.
  - Enabled by the repo's ansible.cfg (C(callbacks_enabled = dgx_summary)).
requirements:
  - enable it in callbacks_enabled
"""

import atexit
import datetime
import os
import re
import shlex
import signal
import sys
import time

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase

from dgx_stage import use_module_utils

use_module_utils()
from ansible.module_utils.dgx_report import PASSES, PLAYS  # noqa: E402
from ansible.module_utils.dgx_units import human_bytes  # noqa: E402

# The actions whose results carry a repo's row: the mirror itself (preflight, --check), and mirror_job
# returning a background stage or verify job's own result.
MIRROR_ACTIONS = ("hf_hub_mirror", "mirror_job")
# The status playbook's task: its result's `lines` are what the summary prints for the host.
STATUS_ACTION = "stage_status"
STATUS_PLAYBOOK = "status.yml"
GIB = 1024.0 ** 3
MIB = 1024.0 ** 2
# Machine-readable stdout callbacks: a table would corrupt their output.
QUIET_STDOUT = ("json", "jsonl")
# Set by the front end (dgx_stage.runs.run_identity_env) for the playbook runs it drives.
FRONT_END_RUN = "DGX_STAGE_RUN_ID"


# ---- pure functions: plain data in, lines out ----------------------------------------------------------

def plural(count, word):
    return "%d %s%s" % (count, word, "" if count == 1 else "s")


def human_seconds(seconds):
    """8.4 s, 3 min 05 s, 1 h 02 min."""
    seconds = max(0.0, float(seconds or 0))
    if seconds < 60:
        return "%.1f s" % seconds
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return "%d min %02d s" % (minutes, secs)
    hours, minutes = divmod(minutes, 60)
    return "%d h %02d min" % (hours, minutes)


def pass_of(play_tags, phase=None):
    """The pass a mirror result belongs to: its play's tag, else the module's phase, else stage."""
    for name in PASSES:
        if name in (play_tags or ()):
            return name
    return phase if phase in PASSES else "stage"


def files_copied(row):
    """Files a row copied (or, in check mode, would copy): blobs plus real files (page15-style)."""
    return int(row.get("blobs", {}).get("copied", 0)) + int((row.get("real_files") or {}).get("copied", 0))


def repo_key(row):
    """A repo's key in the table: type, id and revision (a model and a dataset may share an id)."""
    return "%s:%s@%s" % (row.get("repo_type") or "model", row.get("repo_id"), row.get("revision") or "main")


def repo_label(repo_id, repo_type=None):
    """The REPO cell: the repo id, with its type when it is not a model."""
    return repo_id if (repo_type or "model") == "model" else "%s (%s)" % (repo_id, repo_type)


def _reported(row):
    """A row the module reported (not one the callback made for a failed call that returned none)."""
    return bool(row) and not row.get("no_report")


def merge_repo(passes, check_mode=None):
    """One repo's figures from its rows by pass ({pass: row}): what this run did to it (or would do).

    In a real run a plan (the preflight pass's check-mode row) is never counted as done: copied and reused
    come from the stage row, else the verify row; repairs, bytes and time add up over both. A repo with
    neither (only the preflight ran over it, or its pass failed before the module could report) has no
    figures (None). In --check the plan is the figures: the stage row, else the preflight, else the verify
    row, with no rate. check_mode: the run's; None reads it off the stage and verify rows. The verify
    column is the verify pass's mode; any failed row fails the repo.
    """
    if check_mode is None:
        check_mode = any(row.get("check_mode") for name, row in passes.items() if name != "preflight")
    if check_mode:
        plan = [passes[name] for name in ("stage", "preflight", "verify") if _reported(passes.get(name))]
        done = plan[:1]
    else:
        done = [passes[name] for name in ("stage", "verify")
                if _reported(passes.get(name)) and not passes[name].get("check_mode")]
    base = done[0] if done else {}
    first = next(iter(passes.values()), {})
    statuses = [row.get("status") for row in passes.values()]
    merged = {"repo_id": first.get("repo_id", "?"), "repo_type": first.get("repo_type") or "model",
              "copied": None, "reused": None, "repaired": None, "bytes": None, "repaired_bytes": None,
              "duration_s": None, "mib_per_s": None,
              "verify": passes["verify"].get("verify", "?") if _reported(passes.get("verify")) else "-"}
    if done:
        nbytes = sum(int(row.get("bytes_copied", 0)) for row in done)
        duration = sum(float(row.get("duration_s", 0.0)) for row in done)
        merged.update(copied=files_copied(base), reused=int(base.get("blobs", {}).get("reused", 0)),
                      repaired=sum(int(row.get("blobs", {}).get("repaired", 0)) for row in done),
                      repaired_bytes=sum(int(fix.get("size", 0)) for row in done for fix in row.get("repairs") or ()
                                         if isinstance(fix, dict)),
                      bytes=nbytes, duration_s=duration,
                      mib_per_s=nbytes / MIB / duration if nbytes and duration > 0 and not check_mode else None)
    if "failed" in statuses:
        merged["status"] = "failed"
    elif check_mode:
        merged["status"] = "check"
    else:
        merged["status"] = "ok" if done else "preflight only"
    return merged


def host_status(failed, unreachable, check_mode, interrupted=False):
    if unreachable:
        return "unreachable"
    if failed:
        return "failed"
    if interrupted:
        return "interrupted"
    return "check" if check_mode else "ok"


def _where(info):
    """': play: task' of a failure or of the task a host was running."""
    info = info or {}
    return ": %s: %s" % (info.get("play") or "?", info.get("task") or "?")


def host_rows(host, rank, repos, status, failure=None, check_mode=None, running=None):
    """The table rows of one host: one per repo ({repo: {pass: row}}, in the order seen), each with its own
    status; a failed host's failed task goes on its failed repo's row, else on a row of its own (repo -).
    An interrupted host: the repos its mirror pass in flight (running: {play, task, pass}) had not
    reported yet show interrupted, with that task; else the task in flight gets a row of its own."""
    merged = [merge_repo(passes, check_mode) for passes in repos.values()]
    rows = [dict(row, host=host, rank=rank) for row in merged]
    if status == "interrupted":
        cut = (running or {}).get("pass")
        where = _where(running) if running else ""
        hit = False
        for row, passes in zip(rows, repos.values()):
            if cut and not _reported(passes.get(cut)):
                row["status"], hit = "interrupted" + where, True
        if not hit:
            rows.append({"host": host, "rank": rank, "repo_id": "-", "status": "interrupted" + where})
        return rows
    if status not in ("failed", "unreachable"):
        for row in rows:
            if row["status"] == "failed":   # a repo failed but the host went on (ignored or rescued)
                row["status"] = "failed (host went on)"
        return rows or [{"host": host, "rank": rank, "repo_id": "-", "status": status}]
    where = _where(failure)
    failed = [row for row in rows if row["status"] == "failed"]
    for row in failed:
        row["status"] += where
    if not failed:
        rows.append({"host": host, "rank": rank, "repo_id": "-", "status": status + where})
    return rows


def _cell(row, key):
    value = row.get(key)
    if key == "repo_id":
        return repo_label(str(value if value is not None else "-"), row.get("repo_type"))
    if value is None or row.get("repo_id") == "-":
        return "-" if key not in ("host", "rank", "status") else str(value if value is not None else "-")
    if key == "bytes":
        return "%.2f" % (value / GIB)
    if key == "duration_s":
        return "%.1f" % value
    if key == "mib_per_s":
        return "%.0f" % value
    return str(value)


def render_table(rows, check_mode=False):
    """Aligned text lines: header, then one line per row (numbers right-aligned)."""
    columns = [("host", "HOST"), ("rank", "RANK"), ("repo_id", "REPO"),
               ("copied", "TO COPY" if check_mode else "COPIED"), ("reused", "REUSED"),
               ("repaired", "TO REPAIR" if check_mode else "REPAIRED"), ("bytes", "GiB"),
               ("duration_s", "TIME s"), ("mib_per_s", "MiB/s"), ("verify", "VERIFY"), ("status", "STATUS")]
    left = ("host", "repo_id", "verify", "status")
    cells = [[title for _, title in columns]] + [[_cell(row, key) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        parts = [text.ljust(width) if key in left else text.rjust(width)
                 for (key, _), text, width in zip(columns, line, widths)]
        lines.append("  ".join(parts).rstrip())
    return lines


def _command(inventory, playbook, hosts, extra=()):
    cmd = ["ansible-playbook"]
    if inventory:
        cmd += ["-i", inventory]
    cmd += [playbook or "stage-deepseek.yml", "--limit", ",".join(hosts)] + list(extra)
    return " ".join(shlex.quote(part) for part in cmd)


def tags_asked(msg):
    """The tags a failure message asks to run, in its order: `--tags stage`, `--tags=stage,verify`, or a front end
    command (`dgx-stage stage --limit dgx2`: the plays that subcommand runs)."""
    subcommands = _front_end_subcommands()
    tags = []
    for flag, subcommand in re.findall(r"--tags[ =]+([\w,-]+)|dgx-stage ([a-z-]+)", str(msg or "")):
        group = flag or (subcommands.get(subcommand) or (None, ""))[1] or ""
        tags += [tag for tag in group.split(",") if tag and tag not in tags]
    return tags


def _front_end_subcommands():
    """dgx_stage.cli.SUBCOMMANDS (subcommand -> (playbook, tags, help)), {} without the front end."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if repo not in sys.path:
        sys.path.insert(0, repo)
    try:
        from dgx_stage.cli import SUBCOMMANDS
    except ImportError:      # the playbooks run from a Python without the front end's dependencies
        return {}
    return SUBCOMMANDS


ENGINE_PLAYS = ("engine", "smoke", "bench")


def rerun_command(inventory, playbook, host, play, msg=None, lane=None):
    """What to run once the cause is fixed: the whole playbook for that host (staged blobs are reused), or
    only the failed play - with the plays its message asks for first (verify refused for files not
    staged asks for the stage play: --tags stage,verify). lane: the hosts of a lane whose engine runs; the
    engine play refuses part of a lane, so a run that reaches it names them all."""
    whole = list(lane or [host])
    text = _command(inventory, playbook, whole)
    if play:
        tags = tags_asked(msg)
        tags += [play] if play not in tags else []
        what = "that play" if len(tags) == 1 else "those plays"
        if whole == [host] or set(tags) & set(ENGINE_PLAYS):
            text += "  (or only %s: --tags %s)" % (what, ",".join(tags))
        else:
            text += "  (or only %s on %s: %s)" % (what, host, _command(inventory, playbook, [host],
                                                                        ["--tags", ",".join(tags)]))
    if whole != [host]:
        text += "; the whole lane %s, as its engine restarts as one" % ",".join(whole)
    return text


def report_hint(host, report_path, report_file=None, report_seen=False):
    """What to read: the error and the report this run wrote (report_path); else the host's report under
    its report directory (report_file) when an earlier run left one; else no file is named."""
    if report_path:
        return "the error above and the host report %s" % report_path
    if report_file and report_seen:
        return "the error above and the host report %s (from an earlier run: this run wrote none)" % report_file
    return "the error above (this run wrote no host report for %s)" % host


def next_step_lines(host, status, failure, report_path, inventory, playbook, report_file=None, report_seen=False,
                    lane=None):
    """For a failed host: what failed, why (first line of its message), where its report is, what to run.
    report_path: the report this run wrote; report_file: else where the host's report is kept (named only
    when report_seen: an earlier run left it); lane: the hosts of its lane when the engine runs there."""
    failure = failure or {}
    what = "unreachable" if status == "unreachable" else "failed"
    full = " ".join(str(failure.get("msg") or "").split())
    msg = full if len(full) <= 300 else full[:297] + "..."
    lines = ["%s %s in play %s, task %r%s" % (host, what, failure.get("play") or "?", failure.get("task") or "?",
                                              ": " + msg if msg else "")]
    if status == "unreachable":
        step = "check that %s answers (ssh, its Python), then re-run: %s" % (
            host, rerun_command(inventory, playbook, host, None, lane=lane))
    else:
        step = "read %s; fix the cause, then re-run: %s" % (
            report_hint(host, report_path, report_file, report_seen),
            rerun_command(inventory, playbook, host, failure.get("tag"), full, lane))
    lines.append("next step: " + step)
    return lines


def interrupted_step(hosts, state):
    """One next step for the hosts an interrupted run left unfinished: run it again for them."""
    how = "interrupted" if state.get("stopped") == "INTERRUPTED" else "stopped"
    extra = list(state.get("rerun_args") or ())
    text = _command(state.get("inventory"), state.get("playbook"), hosts, extra)
    if state.get("extra_vars"):
        text += "  (again with %s)" % " ".join(state["extra_vars"])
    return ["next step: the run was %s before %s finished; what is staged is kept and reused, so re-run: %s"
            % (how, ", ".join(hosts), text)]


def engine_lane(hosts, host, order):
    """The hosts of host's lane in rank order when its engine runs in this run (None otherwise): a re-run
    that reaches the engine play must name them all."""
    info = hosts[host]
    if info.get("engine_runs") is not True or not info.get("lane"):
        return None
    lane = sorted((h for h, other in hosts.items() if other.get("lane") == info["lane"]), key=order)
    return lane if len(lane) > 1 else None


def _rank_order(hosts):
    """A sort key of host names: by lane rank, hosts without one last, then by name."""
    def order(host):
        rank = hosts[host].get("rank")
        return (0, int(rank), host) if str(rank).isdigit() else (1, 0, host)
    return order


def one_line(text):
    """A status line printed as one line: a newline or other control character in a name or message would
    otherwise start a line that reads as another host's."""
    return "".join(ch if ch >= " " and ch != "\x7f" else repr(ch)[1:-1] for ch in str(text))


def status_summary_lines(state):
    """The status playbook's summary (in place of the lane table, which it has no figures for): per host in
    rank order its stage_status lines, or why it has none (unreachable, failed, the run stopped); then the
    count and a next step for each host that could not be read."""
    hosts = state.get("hosts", {})
    names = [h for h, info in hosts.items() if info.get("status_lines") is not None or info.get("rank") is not None
             or info.get("failed") or info.get("unreachable")]
    if not names:
        return []
    stopped = state.get("stopped")
    lanes = sorted(set(str(hosts[h]["lane"]) for h in names if hosts[h].get("lane")))
    lines = ["DGX-STAGE STATUS: lane %s, %s%s" % (",".join(lanes) or "?", plural(len(names), "host"),
                                                ", " + stopped if stopped else "")]
    bad, steps = [], []
    for host in sorted(names, key=_rank_order(hosts)):
        info = hosts[host]
        title = host + (" (rank %s)" % info["rank"] if info.get("rank") is not None else "")
        failure = info.get("failure") or {}
        msg = one_line(failure.get("msg") or "")
        if info.get("status_lines") is not None and not info.get("unreachable"):
            lines.append(title + ":")
            lines += ["  " + one_line(text) for text in info["status_lines"]]
            continue
        bad.append(host)
        if info.get("unreachable"):
            why = "unreachable" + (": " + msg if msg else "")
            steps.append("next step: check that %s answers (ssh, its Python), then re-run: %s"
                         % (host, _command(state.get("inventory"), state.get("playbook"), [host])))
        elif info.get("failed"):
            why = "failed%s%s" % (_where(failure), ": " + msg if msg else "")
        else:
            why = "not read (%s)" % (stopped.lower() if stopped else "no status")
        lines.append("%s: %s" % (title, why))
    total = "%d/%d hosts read" % (len(names) - len(bad), len(names))
    if bad:
        total += "; NOT READ: %s" % ", ".join(bad)
    return lines + [total] + steps


def _utc(value):
    """An ISO 8601 UTC timestamp (2026-12-01T10:17:43Z) as a datetime, else None."""
    try:
        return datetime.datetime.strptime(str(value).split(".")[0].rstrip("Z"), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None


def stage_window(window, run_started=None):
    """'10:17:43-10:17:52' (UTC) of a stage_window fact ({started, finished}); a date only on an end whose day
    is not the run's (then ' - ' between the ends); '-' when the host did not stage, '?' for an end not reached."""
    window = window if isinstance(window, dict) else {}
    start, end = _utc(window.get("started")), _utc(window.get("finished"))
    if start is None and end is None:
        return "-"
    run = _utc(run_started)
    day = run.date() if run else (start or end).date()
    ends = ["?" if t is None else t.strftime("%H:%M:%S") if t.date() == day else t.strftime("%Y-%m-%d %H:%M:%S")
            for t in (start, end)]
    return (" - " if " " in ends[0] + ends[1] else "-").join(ends)


def _peer_rejected(value):
    """A row's peer_rejected: the count of the report row, or the module's list of rejected blobs."""
    if isinstance(value, list):
        return len(value)
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def stage_figures(info):
    """(bytes from the NAS, bytes from peers, peer blobs rejected, staged) of a host's stage pass: its repos'
    stage rows as dgx_report sums them into the host report (a row without bytes_from_nas read its copies from
    the NAS); staged: it has a stage row or a stage window."""
    rows = [passes["stage"] for passes in (info.get("repos") or {}).values()
            if _reported(passes.get("stage")) and not passes["stage"].get("check_mode")]
    nas = peers = rejected = 0
    for row in rows:
        from_peers = int(row.get("bytes_from_peers") or 0)
        peers += from_peers
        nas += int(row["bytes_from_nas"]) if row.get("bytes_from_nas") is not None \
            else int(row.get("bytes_copied") or 0) - from_peers
        rejected += _peer_rejected(row.get("peer_rejected"))
    return nas, peers, rejected, bool(rows) or bool(info.get("stage_window"))


def stage_pass_lines(hosts, names, check_mode=False, run_started=None):
    """The "Stage pass (UTC)" block under the table for the hosts `names` (in rank order): host, its stage
    window, bytes from the NAS and from peers (- in --check: nothing was read), peer blobs rejected (a column
    only when a host rejected one), then the lane's total. [] unless more than one host staged or a host took
    or rejected peer blobs: a single host staging from the NAS alone prints what it always did."""
    figures = dict((name, stage_figures(hosts[name])) for name in names)
    peered = any(peers or rejected for _nas, peers, rejected, _staged in figures.values())
    if not (peered or (len(names) > 1 and any(staged for *_rest, staged in figures.values()))):
        return []
    with_rejected = any(rejected for _nas, _peers, rejected, _staged in figures.values())
    cells = [["HOST", "STAGE WINDOW", "FROM NAS", "FROM PEERS"] + (["PEER REJECTED"] if with_rejected else [])]
    for name in names:
        nas, peers, rejected, staged = figures[name]
        shown = staged and not check_mode
        cells.append([name, stage_window(hosts[name].get("stage_window"), run_started),
                      human_bytes(nas) if shown else "-", human_bytes(peers) if shown else "-"]
                     + ([str(rejected)] if with_rejected else []))
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    lines = ["Stage pass (UTC)"] + ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip()
                                    for line in cells]
    if len(names) > 1 and not check_mode:
        lines.append("lane: %s from the NAS, %s from peers" % (
            human_bytes(sum(f[0] for f in figures.values())), human_bytes(sum(f[1] for f in figures.values()))))
    # A host-to-host copy that failed is no error, only NAS reads: the stdout callback hides the ok result
    # that says so (display_ok_hosts = false), so it is said here.
    lines += ["%s: %s" % (name, note) for name in names for note in hosts[name].get("peer_copy_failed", [])]
    return lines


def summary_lines(state):
    """The whole summary from the collected state (plain data; see CallbackModule.state). state["stopped"]
    (INTERRUPTED, STOPPED) says the run ended before its recap: the hosts not failed are then interrupted.
    A status run (state["status"]) prints each host's status lines instead (status_summary_lines)."""
    if state.get("status"):
        return status_summary_lines(state)
    hosts = state.get("hosts", {})
    lane_hosts = [h for h, info in hosts.items() if info.get("repos") or info.get("rank") is not None
                  or info.get("failed") or info.get("unreachable")]
    if not lane_hosts:
        return []
    check_mode = bool(state.get("check_mode"))
    stopped = state.get("stopped")
    order = _rank_order(hosts)

    rows, statuses, steps = [], {}, []
    for host in sorted(lane_hosts, key=order):
        info = hosts[host]
        status = host_status(info.get("failed"), info.get("unreachable"), check_mode, bool(stopped))
        statuses[host] = status
        rows += host_rows(host, info.get("rank"), info.get("repos", {}), status, info.get("failure"), check_mode,
                          info.get("running"))
        if status in ("failed", "unreachable"):
            steps += next_step_lines(host, status, info.get("failure"), info.get("report_path"),
                                     state.get("inventory"), state.get("playbook"), info.get("report_file"),
                                     info.get("report_seen"), engine_lane(hosts, host, order))
    unfinished = [h for h in sorted(lane_hosts, key=order) if statuses[h] == "interrupted"]
    if unfinished:
        steps += interrupted_step(unfinished, state)
    lanes = sorted(set(str(hosts[h]["lane"]) for h in lane_hosts if hosts[h].get("lane")))
    run = ", run " + state["run_id"] if state.get("run_id") else ""
    head = "DGX-STAGE LANE SUMMARY: lane %s, %s%s%s%s" % (
        ",".join(lanes) or "?", plural(len(lane_hosts), "host"), run,
        ", CHECK MODE (nothing was written)" if check_mode else "", ", " + stopped if stopped else "")
    lines = [head] + render_table(rows, check_mode)
    lines += stage_pass_lines(hosts, sorted(lane_hosts, key=order), check_mode, state.get("run_started"))
    bad = [h for h in lane_hosts if statuses[h] in ("failed", "unreachable")]
    total = "wall time %s; %d/%d hosts %s" % (human_seconds(state.get("wall_s")),
                                               len(lane_hosts) - len(bad) - len(unfinished), len(lane_hosts),
                                               "checked" if check_mode else "ok")
    merged = [r for r in rows if r.get("bytes") is not None]
    nfiles, nbytes = sum(r["copied"] for r in merged), sum(r["bytes"] for r in merged)
    if check_mode:
        total += "; would copy %s, %.2f GiB (%s)" % (plural(nfiles, "file"), nbytes / GIB, human_bytes(nbytes))
    elif merged:
        fixed = sum(r.get("repaired_bytes") or 0 for r in merged)
        total += "; copied %s, %s; repaired %d%s" % (
            plural(nfiles, "file"), human_bytes(max(0, nbytes - fixed)), sum(r["repaired"] for r in merged),
            " (%s)" % human_bytes(fixed) if fixed else "")
    if bad:
        total += "; FAILED: %s" % ", ".join(bad)
    if unfinished:
        total += "; %s: %s" % (stopped, ", ".join(unfinished))
    idle = [h for h in lane_hosts if hosts[h].get("engine_runs") is False]
    if idle and not check_mode and not stopped:
        total += "; engine not started%s (engine_enabled is false)" % (
            "" if len(idle) == len(lane_hosts) else " on " + ", ".join(idle))
    return lines + [total] + steps


# ---- the callback: collects plain data, prints summary_lines() ---------------------------------------


def _play_order(tag):
    """--tags in the order stage-deepseek.yml runs the plays (Ansible keeps them as a set)."""
    return (PLAYS.index(tag), "") if tag in PLAYS else (len(PLAYS), tag)


def _truthy(value):
    return str(value).strip().lower() in ("true", "1", "yes")


# The stage role's task (roles/stage/tasks/peer.yml) that says a host-to-host copy failed and its blobs come
# from the NAS.
PEER_COPY_FAILED = "Peer | A copy that failed is fetched from the NAS instead"


def _task_name(task):
    try:
        return task.get_name().strip()
    except Exception:  # pragma: no cover - a task without a name still has an action
        return getattr(task, "action", "?")


def is_progress_poll(task):
    return str(getattr(task, "action", "") or "").endswith("mirror_job")


def take_over_retry_lines(callback):
    """Make the default stdout callback leave a mirror_job poll's retry to `callback` (which prints its
    progress line); True when done. Ansible hands a callback no reference to the others: the task queue
    manager that calls this one (callback in its _callback_plugins) is found up the stack. Any other stdout
    callback (json, ansible-runner's awx_display, whose retry is an event) is left alone: False."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        plugins = getattr(owner, "_callback_plugins", None)
        if isinstance(plugins, list) and callback in plugins:
            break
        frame = frame.f_back
    else:
        return False
    stdout = plugins[0] if plugins and plugins[0] is not callback else None
    if getattr(stdout, "CALLBACK_NAME", None) != "default" or getattr(stdout, "_dgx_retry_taken", False):
        return bool(getattr(stdout, "_dgx_retry_taken", False))
    original = stdout.v2_runner_retry

    def retry(result):
        if not is_progress_poll(result.task):
            original(result)

    stdout.v2_runner_retry = retry
    stdout._dgx_retry_taken = True
    return True


def rerun_extra_vars(values):
    """The run's -e values as its re-run step names them: an @file by its path, but an inline value, and the
    file the front end writes for one (removed when its run ends), by the names it sets, as NAME=... (the
    value may be a secret: never shown)."""
    if not _front_end_subcommands():
        return ["the same -e options"] if values else []
    from dgx_stage import UsageError, extravars, runs
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
    """What dgx-stage refuses in -e values (a name no play or role reads, a name without a value, a value
    outside its choices or type), as warnings for a run of the playbooks without the front end. Without -e
    there is nothing to check, and the inventory is not read again."""
    if not values or not _front_end_subcommands():
        return []
    from dgx_stage import UsageError, extravars
    try:
        return extravars.problems(list(values), list(inventories))
    except UsageError as exc:
        return [str(exc)]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dgx_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super(CallbackModule, self).__init__(display=display)
        self.state = {"hosts": {}, "check_mode": False, "inventory": None, "playbook": None}
        self._started = None
        self._play = None
        self._play_tags = ()
        self._play_name = ""
        self._task = None
        self._hides_ok = None
        self._printed = False
        self._interrupted = False
        self._watching = False
        self._retry_lines = False
        self._pid = os.getpid()

    def _host(self, name):
        return self.state["hosts"].setdefault(name, {"repos": {}})

    def _quiet(self):
        """No table: a machine-readable stdout, an ad-hoc command, or a run of the front end, whose own table
        (from the same host reports) is the run's one table."""
        stdout = str(C.config.get_config_value("DEFAULT_STDOUT_CALLBACK") or "")
        return (stdout.split(".")[-1] in QUIET_STDOUT or "module_name" in context.CLIARGS
                or bool(os.environ.get(FRONT_END_RUN)))

    def v2_playbook_on_start(self, playbook):
        self._started = time.monotonic()
        self.state["run_started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())   # the stage windows' day
        args = context.CLIARGS
        self.state["check_mode"] = bool(args.get("check"))
        inventories = [i for i in (args.get("inventory") or ()) if i]
        cwd = os.getcwd()
        self.state["inventory"] = ",".join(self._rel(i, cwd) for i in inventories) or None
        self.state["playbook"] = self._rel(getattr(playbook, "_file_name", None) or "", cwd) or None
        # playbooks/status.yml: its summary is the hosts' status lines (also when no host could be read).
        self.state["status"] = os.path.basename(self.state["playbook"] or "") == STATUS_PLAYBOOK
        # What an interrupted run is re-run with: its own tags and mode (the hosts are named by --limit).
        rerun = []
        tags = sorted((t for t in (args.get("tags") or ()) if t and t != "all"), key=_play_order)
        if tags:
            rerun += ["--tags", ",".join(tags)]
        if args.get("skip_tags"):
            rerun += ["--skip-tags", ",".join(args["skip_tags"])]
        if args.get("check"):
            rerun += ["--check"]
        self.state["rerun_args"] = rerun
        self.state["extra_vars"] = rerun_extra_vars(args.get("extra_vars") or ())
        for line in extra_var_warnings(args.get("extra_vars") or (), inventories):
            self._display.warning(line)
        if not self._watching:
            self._watching = True
            self._watch_interrupts()
        self._retry_lines = take_over_retry_lines(self)

    def v2_runner_retry(self, result):
        """A background job's poll: its progress line, where the default callback said FAILED - RETRYING."""
        if self._retry_lines and is_progress_poll(result.task) and result.result.get("line"):
            self._display.display("[%s] %s" % (result.host.get_name(), result.result["line"]))

    def _watch_interrupts(self):
        """Ansible sends no v2_playbook_on_stats when the run is interrupted (Ctrl-C raises KeyboardInterrupt
        through the play loop): note a SIGINT, then pass it on to Ansible's own handler; the table is printed
        at interpreter exit when the stats never came (once: _printed)."""
        atexit.register(self._at_exit)
        try:
            previous = signal.getsignal(signal.SIGINT)

            def note_sigint(signum, frame):
                if previous == signal.SIG_IGN:
                    return None
                self._interrupted = True
                if callable(previous):
                    return previous(signum, frame)
                raise KeyboardInterrupt()

            signal.signal(signal.SIGINT, note_sigint)
        except (ValueError, OSError, TypeError):    # not the main thread: the exit hook still prints
            pass

    @staticmethod
    def _rel(path, cwd):
        if path and os.path.isabs(path) and os.path.commonpath([path, cwd]) == cwd:
            return os.path.relpath(path, cwd)
        return path

    def v2_playbook_on_play_start(self, play):
        self._play = play
        self._play_tags = tuple(play.tags or ())
        self._play_name = play.get_name().strip()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task = task

    def _tag(self):
        """The play's tag: what --tags takes to run it again."""
        for tag in self._play_tags:
            if tag not in ("always", "never"):
                return tag
        return None

    def _play_label(self):
        tag = self._tag()
        return tag or self._play_name.split(" - ")[0] or None

    def _collect(self, result, failed=False):
        data = result.result
        host = self._host(result.host.get_name())
        facts = data.get("ansible_facts") or {}
        if "lane_name" in facts:
            host["lane"] = facts["lane_name"]
        if "lane_rank" in facts:
            host["rank"] = facts["lane_rank"]
        if "lane_engine_runs" in facts:
            host["engine_runs"] = _truthy(facts["lane_engine_runs"])
        if facts.get("lane_run_id"):
            self.state["run_id"] = str(facts["lane_run_id"])
        if facts.get("lane_report_dir"):   # where the dgx_report callback writes the host's reports
            host["report_dir"] = self.state["report_dir"] = str(facts["lane_report_dir"])
        if isinstance(facts.get("stage_window"), dict):   # the stage role's: when this host's wave ran
            host["stage_window"] = dict(facts["stage_window"])
        if PEER_COPY_FAILED in _task_name(result.task) and data.get("msg"):
            host.setdefault("peer_copy_failed", []).append(one_line(" ".join(str(data["msg"]).split())))
        action = str(getattr(result.task, "action", "") or "")
        row = data.get("report")
        if action.endswith(MIRROR_ACTIONS) and "results" not in data:
            if isinstance(row, dict):
                name = pass_of(self._play_tags, row.get("phase"))
                host["repos"].setdefault(repo_key(row), {})[name] = row
            elif failed and isinstance(data.get("item"), dict):
                # Refused before it had a result (another run held the lock, a bad input): the repo failed.
                item = data["item"]
                name = pass_of(self._play_tags)
                made = {"repo_id": item.get("repo_id", "?"), "repo_type": item.get("repo_type") or "model",
                        "revision": item.get("revision") or "main", "status": "failed", "no_report": True,
                        "check_mode": name == "preflight" or self.state["check_mode"]}
                host["repos"].setdefault(repo_key(made), {}).setdefault(name, made)
        if action.endswith(STATUS_ACTION) and isinstance(data.get("lines"), list):
            host["status_lines"] = [str(text) for text in data["lines"]]
            self.state["status"] = True

    def _fail(self, result, ignore_errors=False):
        if ignore_errors:
            return
        host = self._host(result.host.get_name())
        tag = self._tag()
        host.setdefault("failure", {"play": self._play_label(), "tag": tag,
                                    "task": _task_name(result.task), "msg": result.result.get("msg", "")})

    def _stdout_hides_ok(self):
        """Whether the stdout callback hides ok results (display_ok_hosts = false), warnings and all."""
        if self._hides_ok is None:
            name = str(C.config.get_config_value("DEFAULT_STDOUT_CALLBACK") or "").split(".")[-1]
            try:
                shown = C.config.get_config_value("display_ok_hosts", plugin_type="callback", plugin_name=name)
            except Exception:   # a stdout callback without that option shows its results its own way
                shown = True
            self._hides_ok = not shown and not self._quiet()
        return self._hides_ok

    # What each host is doing, for a run that ends before its recap: the task in flight, the last outcome.
    def v2_runner_on_start(self, host, task):
        action = str(getattr(task, "action", "") or "")
        self._host(host.get_name())["running"] = {
            "play": self._play_label(), "task": _task_name(task),
            "pass": pass_of(self._play_tags) if action.endswith(MIRROR_ACTIONS) else None}

    def _ended(self, result, failed=False, unreachable=False):
        host = self._host(result.host.get_name())
        host.pop("running", None)
        host["last_failed"] = failed
        if unreachable:
            host["unreachable_seen"] = True

    def v2_runner_on_ok(self, result):
        self._collect(result)
        self._ended(result)
        # The default callback drops an unchanged result's warnings with the result: say them here (a loop's
        # result carries its items' warnings).
        if not result.result.get("changed") and self._stdout_hides_ok():
            self._handle_warnings_and_exception(result)

    def v2_runner_on_skipped(self, result):
        self._ended(result)

    def v2_runner_item_on_ok(self, result):
        self._collect(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._collect(result, failed=True)
        self._fail(result, ignore_errors)
        self._ended(result, failed=not ignore_errors)

    def v2_runner_item_on_failed(self, result):
        # A loop's first failed item says more than its "One or more items failed".
        self._collect(result, failed=True)
        self._fail(result, bool(getattr(result.task, "ignore_errors", False)))

    def v2_runner_on_unreachable(self, result):
        self._fail(result)
        self._ended(result, unreachable=True)

    def _report_files(self):
        """For a failed host: its latest report when this run wrote one (report_path), else the one an earlier
        run left in its report dir (report_file, report_seen); a host without the lane facts has the lane's dir."""
        run_id = self.state.get("run_id")
        for name, info in self.state["hosts"].items():
            directory = info.get("report_dir") or self.state.get("report_dir")
            if not info.get("failed") or not directory:
                continue
            latest = os.path.join(directory, "%s.json" % name)
            if run_id and os.path.isfile(os.path.join(directory, "%s-%s.json" % (name, run_id))):
                info["report_path"] = self._rel(latest, os.getcwd())
            else:
                info["report_file"], info["report_seen"] = self._rel(latest, os.getcwd()), os.path.isfile(latest)

    def _print(self):
        self._printed = True
        self._report_files()
        lines = summary_lines(self.state)
        if lines:
            self._display.display("\n".join(lines))
            self._display.display("")

    def v2_playbook_on_stats(self, stats):
        if self._quiet() or self._started is None or self._printed:
            return
        self.state["wall_s"] = time.monotonic() - self._started
        for name, info in self.state["hosts"].items():
            info["failed"] = bool(stats.failures.get(name))
            info["unreachable"] = bool(stats.dark.get(name))
        self._print()

    def _at_exit(self):
        """The run ended without its stats (Ctrl-C, or an error that stopped it): the table as far as it
        got. A host whose last task failed (none in flight) failed; the others did not finish."""
        if self._printed or self._started is None or os.getpid() != self._pid or self._quiet():
            return
        self.state["wall_s"] = time.monotonic() - self._started
        self.state["stopped"] = "INTERRUPTED" if self._interrupted else "STOPPED"
        for info in self.state["hosts"].values():
            info["unreachable"] = bool(info.get("unreachable_seen")) and not info.get("running")
            info["failed"] = bool(info.get("last_failed")) and not info.get("running")
            if not info.get("running") and self._task is not None and not (info["failed"] or info["unreachable"]):
                info["running"] = {"play": self._play_label(), "task": _task_name(self._task), "pass": None}
        try:
            self._print()
        except Exception:   # pragma: no cover - a closed stdout at exit: nothing more to say
            pass
