"""What a run's ansible-runner events say, gathered as they arrive (event dicts in, state out): the `mirror_job`
polls, the lane facts, the `engine_receipts` and `stage_status` results, failures, unreachable hosts, the stats."""
import os

PROGRESS_EVENTS = ("runner_retry", "runner_on_ok", "runner_on_failed", "runner_item_on_ok", "runner_item_on_failed")
RESULT_EVENTS = ("runner_on_ok", "runner_item_on_ok")


def short_action(action):
    """A task's action without its collection (ns.coll.name -> name)."""
    return str(action or "").rsplit(".", 1)[-1]


def result_message(res):
    """A failed result's message: its failed items' (a loop's own msg only says items failed), else msg or stderr."""
    res = res or {}
    if res.get("censored"):     # no_log: its exception may hold the hidden message
        return str(res["censored"])
    items = ["%s: %s" % (item.get("_ansible_item_label", item.get("item")), result_message(item))
             for item in _results(res) if item is not res and (item.get("failed") or item.get("unreachable"))]
    if items:
        return "; ".join(items)
    if res.get("msg"):
        return str(res["msg"]).strip()
    said = [str(res[key]).strip().splitlines()[-1] for key in ("stderr", "reason", "exception") if res.get(key)]
    return said[0] if said else "(no message)"


def _results(res):
    if isinstance(res.get("results"), list):
        return [item for item in res["results"] if isinstance(item, dict)]
    return [res]


class RunState(object):
    """Everything the front end shows, from the events seen so far."""

    def __init__(self):
        self.pid = None              # ansible-playbook's pid (every event carries it)
        self.play = None
        self.progress = {}           # host -> {"progress": {...}, "line": str, "finished": bool}
        self.failures = {}           # host -> {"host", "play", "task", "msg"}, the last one seen
        self.unreachable = {}        # host -> {"host", "play", "task", "msg"}
        self.report_dirs = []        # where the dgx_report callback writes the host reports (lane_report_dir)
        self.reports = {}            # host -> this run's report, as read from its file
        self.history_paths = {}      # host -> <report dir>/<host>-<run_id>.json
        self.receipts_removed = {}   # host -> [paths]
        self.status_lines = {}       # host -> [lines] of stage_status
        self.lanes = {}              # host -> {"lane", "rank"}: its lane facts, for the status lines
        self.stats = None            # playbook_on_stats event_data

    @property
    def run_id(self):
        return max([r["run_id"] for r in self.reports.values() if r.get("run_id")] or [None])

    @property
    def report_dir(self):
        return min([os.path.dirname(p) for p in self.history_paths.values() if p] or [None])

    def handle(self, event):
        """Take one event; returns the updates to show: [("progress", host, entry)] or [("output", text)]."""
        name, data = event.get("event"), event.get("event_data") or {}
        self.pid = self.pid or event.get("pid")
        updates = [("output", event["stdout"])] if event.get("stdout") else []
        if name == "playbook_on_play_start":
            self.play = data.get("play") or data.get("name")
        elif name == "playbook_on_stats":
            self.stats = data
        action, host = short_action(data.get("task_action")), data.get("host")
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if action == "mirror_job" and name in PROGRESS_EVENTS and host:
            for item in _results(res):
                if item.get("progress") is not None or item.get("line"):
                    self.progress[host] = {"progress": item.get("progress") or {}, "line": item.get("line") or "",
                                           "finished": bool(item.get("finished"))}
                    updates.append(("progress", host, self.progress[host]))
        if name in RESULT_EVENTS:
            self._result(action, host, res)
        seen = {"runner_on_unreachable": self.unreachable,
                "runner_on_failed": None if data.get("ignore_errors") else self.failures}.get(name)
        if seen is not None and host:
            seen[host] = {"host": host, "play": data.get("play") or self.play, "task": data.get("task"),
                          "msg": result_message(res)}
        return updates

    def _result(self, action, host, res):
        for item in _results(res):
            facts = item.get("ansible_facts") if isinstance(item.get("ansible_facts"), dict) else {}
            if facts.get("lane_report_dir") and facts["lane_report_dir"] not in self.report_dirs:
                self.report_dirs.append(str(facts["lane_report_dir"]))
            if host and "lane_name" in facts:   # the lane facts come in more than one result
                self.lanes.setdefault(host, {})["lane"] = facts["lane_name"]
            if host and str(facts.get("lane_rank")).isdigit():
                self.lanes.setdefault(host, {})["rank"] = int(facts["lane_rank"])
            if action == "engine_receipts" and host and isinstance(item.get("removed"), list):
                removed = self.receipts_removed.setdefault(host, [])
                removed += [p for p in item["removed"] if p not in removed]
            elif action == "stage_status" and host and isinstance(item.get("lines"), list):
                self.status_lines[host] = list(item["lines"])

    def failed_hosts(self):
        """[{"host", "play", "task", "msg", "unreachable"}] of each host failed or unreachable, its report preferred."""
        if self.stats is None:
            failed, dark = set(self.failures), set(self.unreachable)
        else:
            failed, dark = (set(h for h, n in (self.stats.get(key) or {}).items() if n) for key in ("failures", "dark"))
        out = []
        for host in sorted(failed | dark):
            seen = self.unreachable.get(host) if host in dark else self.failures.get(host)
            seen = dict(seen or {"host": host, "play": None, "task": None, "msg": "(no failure event)"})
            # An unreachable host's event says why (ssh); its report, written by another host, cannot.
            report = {} if host in dark and host in self.unreachable else self.reports.get(host) or {}
            if report.get("status") == "failed" and report.get("failed_task"):
                seen.update(play=report.get("failed_play") or seen["play"], task=report["failed_task"],
                            msg=report.get("failed_msg") or seen["msg"])
            out.append(dict(seen, unreachable=host in dark))
        return out
