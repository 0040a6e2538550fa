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
    table after the recap - host, rank, per repo the blobs copied / reused / repaired, GiB copied, time,
    MiB/s, the verify mode and the status (ok / failed / check / unreachable, with the failed task) - then
    the wall time, in C(--check) what the run would copy, and a C(next step) line for each failed host.
  - With C(display_ok_hosts = false) the default stdout callback drops the warnings of unchanged results
    together with the results; this callback prints those warnings.
  - Silent for ad-hoc commands, for machine-readable stdout callbacks (json, jsonl) and for runs that
    staged nothing.
  - Enabled by the repo's ansible.cfg (C(callbacks_enabled = dgx_summary)).
requirements:
  - enable it in callbacks_enabled
"""

import os
import shlex
import time

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase

PASSES = ("preflight", "stage", "verify")
GIB = 1024.0 ** 3
MIB = 1024.0 ** 2
# Machine-readable stdout callbacks: a table would corrupt their output.
QUIET_STDOUT = ("json", "jsonl")


# ---- pure functions: plain data in, lines out ----------------------------------------------------------

def human_bytes(size):
    """Binary units: 0 B, 1.5 KiB, 48.0 MiB, 2.31 GiB, 1.20 TiB."""
    size = float(size or 0)
    if size < 1024:
        return "%d B" % size
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024.0
        if size < 1024 or unit == "TiB":
            return ("%.1f %s" if unit in ("KiB", "MiB") else "%.2f %s") % (size, unit)


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


def merge_repo(passes):
    """One repo's figures from its rows by pass ({pass: row}): what this run did to it (or would do).

    The stage row (else the preflight plan, else the verify row) gives copied and reused. In a real run
    repairs, bytes and time add up over stage and verify; a plan (check mode) is the base row's alone, with
    no rate. The verify column is the verify pass's mode; any failed row fails the repo.
    """
    base = passes.get("stage") or passes.get("preflight") or passes.get("verify")
    plan = bool(base.get("check_mode"))
    done = [base] if plan else ([passes[name] for name in ("stage", "verify") if passes.get(name)] or [base])
    nbytes = sum(int(row.get("bytes_copied", 0)) for row in done)
    duration = sum(float(row.get("duration_s", 0.0)) for row in done)
    statuses = [row.get("status") for row in passes.values()]
    return {
        "repo_id": base.get("repo_id", "?"),
        "copied": files_copied(base),
        "reused": int(base.get("blobs", {}).get("reused", 0)),
        "repaired": sum(int(row.get("blobs", {}).get("repaired", 0)) for row in done),
        "bytes": nbytes,
        "duration_s": duration,
        "mib_per_s": nbytes / MIB / duration if nbytes and duration > 0 and not plan else None,
        "verify": passes["verify"].get("verify", "?") if passes.get("verify") else "-",
        "status": "failed" if "failed" in statuses else ("check" if plan else "ok"),
    }


def host_status(failed, unreachable, check_mode):
    if unreachable:
        return "unreachable"
    if failed:
        return "failed"
    return "check" if check_mode else "ok"


def host_rows(host, rank, repos, status, failure=None):
    """The table rows of one host: one per repo ({repo: {pass: row}}, in the order seen), each with its own
    status; a failed host's failed task goes on its failed repo's row, else on a row of its own (repo -)."""
    rows = [dict(merge_repo(passes), host=host, rank=rank) for passes in repos.values()]
    if status not in ("failed", "unreachable"):
        for row in rows:
            if row["status"] == "failed":   # a repo failed but the host went on (ignored or rescued)
                row["status"] = "failed (host went on)"
        return rows or [{"host": host, "rank": rank, "repo_id": "-", "status": status}]
    where = ": %s: %s" % ((failure or {}).get("play") or "?", (failure or {}).get("task") or "?")
    failed = [row for row in rows if row["status"] == "failed"]
    for row in failed:
        row["status"] += where
    if not failed:
        rows.append({"host": host, "rank": rank, "repo_id": "-", "status": status + where})
    return rows


def _cell(row, key):
    value = row.get(key)
    if value is None or (key != "repo_id" and row.get("repo_id") == "-"):
        return "-" if key not in ("host", "rank", "repo_id", "status") else str(value if value is not None else "-")
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


def rerun_command(inventory, playbook, host, play):
    """What to run once the cause is fixed: the whole playbook for that host (staged blobs are reused)."""
    cmd = ["ansible-playbook"]
    if inventory:
        cmd += ["-i", inventory]
    cmd += [playbook or "stage-deepseek.yml", "--limit", host]
    text = " ".join(shlex.quote(part) for part in cmd)
    if play:
        text += "  (or only that play: --tags %s)" % play
    return text


def next_step_lines(host, status, failure, report_path, inventory, playbook):
    """For a failed host: what failed, why (first line of its message), where its report is, what to run."""
    failure = failure or {}
    what = "unreachable" if status == "unreachable" else "failed"
    msg = " ".join(str(failure.get("msg") or "").split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    lines = ["%s %s in play %s, task %r%s" % (host, what, failure.get("play") or "?", failure.get("task") or "?",
                                              ": " + msg if msg else "")]
    if status == "unreachable":
        step = "check that %s answers (ssh, its Python), then re-run: %s" % (
            host, rerun_command(inventory, playbook, host, None))
    else:
        step = "read the error above and the host report %s; fix the cause, then re-run: %s" % (
            report_path or "reports/%s.json" % host, rerun_command(inventory, playbook, host, failure.get("tag")))
    lines.append("next step: " + step)
    return lines


def summary_lines(state):
    """The whole summary from the collected state (plain data; see CallbackModule.state)."""
    hosts = state.get("hosts", {})
    lane_hosts = [h for h, info in hosts.items() if info.get("repos") or info.get("rank") is not None
                  or info.get("failed") or info.get("unreachable")]
    if not lane_hosts:
        return []
    check_mode = bool(state.get("check_mode"))

    def order(host):
        rank = hosts[host].get("rank")
        return (0, int(rank), host) if str(rank).isdigit() else (1, 0, host)

    rows, statuses, steps = [], {}, []
    for host in sorted(lane_hosts, key=order):
        info = hosts[host]
        status = host_status(info.get("failed"), info.get("unreachable"), check_mode)
        statuses[host] = status
        rows += host_rows(host, info.get("rank"), info.get("repos", {}), status, info.get("failure"))
        if status in ("failed", "unreachable"):
            steps += next_step_lines(host, status, info.get("failure"), info.get("report_path"),
                                     state.get("inventory"), state.get("playbook"))
    lanes = sorted(set(str(hosts[h]["lane"]) for h in lane_hosts if hosts[h].get("lane")))
    run = ", run " + state["run_id"] if state.get("run_id") else ""
    head = "DGX-STAGE LANE SUMMARY: lane %s, %s%s%s" % (",".join(lanes) or "?", plural(len(lane_hosts), "host"), run,
                                                         ", CHECK MODE (nothing was written)" if check_mode else "")
    lines = [head] + render_table(rows, check_mode)
    bad = [h for h in lane_hosts if statuses[h] in ("failed", "unreachable")]
    total = "wall time %s; %d/%d hosts %s" % (human_seconds(state.get("wall_s")), len(lane_hosts) - len(bad),
                                               len(lane_hosts), "checked" if check_mode else "ok")
    merged = [r for r in rows if "bytes" in r]
    nfiles, nbytes = sum(r["copied"] for r in merged), sum(r["bytes"] for r in merged)
    if check_mode:
        total += "; would copy %s, %.2f GiB (%s)" % (plural(nfiles, "file"), nbytes / GIB, human_bytes(nbytes))
    elif merged:
        total += "; copied %s, %s; repaired %d" % (plural(nfiles, "file"), human_bytes(nbytes),
                                                    sum(r["repaired"] for r in merged))
    if bad:
        total += "; FAILED: %s" % ", ".join(bad)
    idle = [h for h in lane_hosts if hosts[h].get("engine_runs") is False]
    if idle and not check_mode:
        total += "; engine not started%s (engine_enabled is false)" % (
            "" if len(idle) == len(lane_hosts) else " on " + ", ".join(idle))
    return lines + [total] + steps


# ---- the callback: collects plain data, prints summary_lines() ---------------------------------------

def _truthy(value):
    return str(value).strip().lower() in ("true", "1", "yes")


def _task_name(task):
    try:
        return task.get_name().strip()
    except Exception:  # pragma: no cover - a task without a name still has an action
        return getattr(task, "action", "?")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dgx_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super(CallbackModule, self).__init__(display=display)
        self.state = {"hosts": {}, "check_mode": False, "inventory": None, "playbook": None}
        self._started = None
        self._play_tags = ()
        self._play_name = ""
        self._hides_ok = None

    def _host(self, name):
        return self.state["hosts"].setdefault(name, {"repos": {}})

    def _quiet(self):
        stdout = str(C.config.get_config_value("DEFAULT_STDOUT_CALLBACK") or "")
        return stdout.split(".")[-1] in QUIET_STDOUT or "module_name" in context.CLIARGS

    def v2_playbook_on_start(self, playbook):
        self._started = time.monotonic()
        args = context.CLIARGS
        self.state["check_mode"] = bool(args.get("check"))
        inventories = [i for i in (args.get("inventory") or ()) if i]
        cwd = os.getcwd()
        self.state["inventory"] = ",".join(self._rel(i, cwd) for i in inventories) or None
        self.state["playbook"] = self._rel(getattr(playbook, "_file_name", None) or "", cwd) or None

    @staticmethod
    def _rel(path, cwd):
        if path and os.path.isabs(path) and os.path.commonpath([path, cwd]) == cwd:
            return os.path.relpath(path, cwd)
        return path

    def v2_playbook_on_play_start(self, play):
        self._play_tags = tuple(play.tags or ())
        self._play_name = play.get_name().strip()

    def _tag(self):
        """The play's tag: what --tags takes to run it again."""
        for tag in self._play_tags:
            if tag not in ("always", "never"):
                return tag
        return None

    def _collect(self, result):
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
        action = str(getattr(result.task, "action", "") or "")
        row = data.get("report")
        if action.endswith("hf_hub_mirror") and isinstance(row, dict) and "results" not in data:
            name = pass_of(self._play_tags, row.get("phase"))
            key = "%s@%s" % (row.get("repo_id"), row.get("revision", "main"))
            host["repos"].setdefault(key, {})[name] = row
        if action.endswith("host_report") and data.get("latest_path"):
            host["report_path"] = self._rel(str(data["latest_path"]), os.getcwd())

    def _fail(self, result, ignore_errors=False):
        if ignore_errors:
            return
        host = self._host(result.host.get_name())
        tag = self._tag()
        host.setdefault("failure", {"play": tag or self._play_name.split(" - ")[0] or None, "tag": tag,
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

    def v2_runner_on_ok(self, result):
        self._collect(result)
        # The default callback drops an unchanged result's warnings with the result: say them here (a loop's
        # result carries its items' warnings).
        if not result.result.get("changed") and self._stdout_hides_ok():
            self._handle_warnings_and_exception(result)

    def v2_runner_item_on_ok(self, result):
        self._collect(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._collect(result)
        self._fail(result, ignore_errors)

    def v2_runner_item_on_failed(self, result):
        self._collect(result)   # a loop's first failed item says more than its "One or more items failed"
        self._fail(result, bool(getattr(result.task, "ignore_errors", False)))

    def v2_runner_on_unreachable(self, result):
        self._fail(result)

    def v2_playbook_on_stats(self, stats):
        if self._quiet() or self._started is None:
            return
        self.state["wall_s"] = time.monotonic() - self._started
        for name, info in self.state["hosts"].items():
            info["failed"] = bool(stats.failures.get(name))
            info["unreachable"] = bool(stats.dark.get(name))
        lines = summary_lines(self.state)
        if lines:
            self._display.display("\n".join(lines))
            self._display.display("")
