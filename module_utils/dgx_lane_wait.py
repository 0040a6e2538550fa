"""engine_lane_wait's work: the lane's verdict from every rank's last round, one host's polling of a round.
"""
import calendar
import functools
import re
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_openai import api_url, http_json
from ansible.module_utils.dgx_runtime import NOT_EXITED, api_owner, container_state
from ansible.module_utils.dgx_secrets import redacted
from urllib.request import urlopen


MESSAGE_LOG_LINES = 15   # of which a failure message quotes the last ones

# describe_down()'s words for a container that is not running ({} its exit code); another status shows it plainly.
_NEVER_STARTED = "was created but never started"
_DOWN_TEXT = {"paused": "is paused (not running)", "stopping": "is stopping (not running)",
              "created": _NEVER_STARTED, "configured": _NEVER_STARTED, "initialized": _NEVER_STARTED,
              "restarting": "is restarting after an exit (not running), last exit code {}",
              "dead": "is dead (the runtime failed to stop or remove it), exit code {}"}

_TIMESTAMP = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(\.\d+)?\s*(Z|[+-]\d\d(?::?\d\d)?)?")


def _epoch(text):
    """Seconds since the epoch of docker's or podman's timestamp, so ranks in other time zones compare; infinity
    when there is none (never stopped)."""
    match = _TIMESTAMP.match(text or "")
    if not match:
        return float("inf")
    year, month, day, hour, minute, second = (int(part) for part in match.group(1, 2, 3, 4, 5, 6))
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) + float(match.group(7) or 0)
    zone = match.group(8) or "Z"
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:] or 0) * 60)
    return seconds


def describe_holder(holder):
    """'pid 4242 (python3 -m http.server 8000) in container 1a2b3c4d5e6f (old-engine)'."""
    text = "pid %s" % holder.get("pid")
    if holder.get("cmdline"):
        text += " (%s)" % holder["cmdline"]
    if holder.get("container_id"):
        text += " in container %s" % holder["container_id"][:12]
        if holder.get("container_name"):
            text += " (%s)" % holder["container_name"]
    else:
        text += ", not in a container"
    return text


def describe_down(rank, host, container):
    """One rank that is not up: host, container, state and, when it exited, the exit code and when."""
    if not container.get("exists"):
        return "rank %d (host %s): no container %s - %s" % (rank, host, container.get("name"), container.get("error"))
    status, code = container.get("status"), container.get("exit_code")
    state = _DOWN_TEXT[status].format(code) if status in _DOWN_TEXT else "is not running (%s), exit code %s" % (
        status, code)
    text = "rank %d (host %s): container %s %s" % (rank, host, container.get("name"), state)
    if container.get("oom_killed"):
        text += ", killed out of memory"
    if container.get("error"):
        text += ", error: %s" % container["error"]
    if container.get("finished_at") and container.get("status") not in NOT_EXITED:
        text += ", ended %s" % container["finished_at"]
    return text


def _verdict(state, msg, host=None, rank=None, exit_code=None):
    return {"state": state, "decided": state != "pending", "msg": msg, "host": host, "rank": rank,
            "exit_code": exit_code}


def fresh_rows(rows, wait_id, round_no):
    """The rows (host -> row) made in round round_no - 1 of wait wait_id: an older row (its host left the play
    since) is no report."""
    return dict((host, row) for host, row in (rows or {}).items() if row and (
        wait_id is None or (row.get("wait_id"), row.get("round")) == (wait_id, round_no - 1)))


def lane_verdict(lane_hosts, rows, url, give_up=False):
    """The lane's verdict from every rank's last row (host -> row, fresh_rows()), the same on every host: missing,
    dead (the first to end), stranger, unproven, ready, timeout (give_up), in that order; else pending."""
    master = lane_hosts[0]
    ranked = [(rank, host, rows.get(host)) for rank, host in enumerate(lane_hosts)]
    missing = [(rank, host) for rank, host, row in ranked if not row]
    if missing:
        rank, host = missing[0]
        return _verdict("missing", "Rank %d (host %s) did not report its engine container in the last round (it "
                                   "failed or became unreachable); a lane needs every rank. Missing: %s."
                        % (rank, host, ", ".join("rank %d (%s)" % m for m in missing)), host, rank)
    master_row = rows[master]
    owner = master_row.get("owner")
    stranger = owner is not None and owner.get("ours") is False
    port_note = stranger and "port %s on %s is held by %s" % (
        owner.get("port"), master, "; ".join(describe_holder(h) for h in owner.get("holders") or []))
    down = [(rank, host, row["container"]) for rank, host, row in ranked
            if row.get("container") and row["container"].get("running") is False]
    if down:
        # The first to end is the cause; the others often die of it (a lost peer, a closed store).
        rank, host, container = min(down, key=lambda d: (_epoch(d[2].get("finished_at")), d[0]))
        tail = (container.get("logs") or "").rstrip().splitlines()[-MESSAGE_LOG_LINES:]
        msg = "Rank %d of the lane is down - %s. Its log ends:\n%s" % (
            rank, describe_down(rank, host, container), "\n".join(tail) or "(empty)")
        others = [describe_down(*d) for d in down if d[0] != rank]
        if others:
            msg += "\nAlso down: %s." % "; ".join(others)
        if stranger:
            msg += "\nThe API at %s is answered by someone else: %s." % (url, port_note)
        return _verdict("dead", msg, host, rank, container.get("exit_code"))
    if stranger:
        mine = (master_row.get("container") or {}).get("name")
        return _verdict("stranger", "The API at %s is not served by this run's engine: %s, not by container %s "
                                    "(rank 0). Stop the old engine (engine_stop_strays) or free the port."
                        % (url, port_note, mine), master, 0)
    if master_row.get("api") and owner is not None and owner.get("ours") is None:
        why = ("but nothing on %s listens on port %s (engine_port)" % (master, owner.get("port"))
               if not owner.get("listening") else
               "but the process listening on port %s on %s could not be seen (run with become)"
               % (owner.get("port"), master))
        return _verdict("unproven", "The API at %s answered, %s: cannot prove it is this run's engine."
                        % (url, why), master, 0)
    # A rank whose runtime did not answer in time is neither up nor down: the lane waits for it.
    unknown = ["rank %d (host %s): %s" % (rank, host, row["container"].get("error"))
               for rank, host, row in ranked if row.get("container") and row["container"].get("running") is None]
    if master_row.get("api") and not unknown:
        models = ", ".join(m for m in master_row.get("models") or [] if m)
        ranks = " - all %d ranks running" % len(lane_hosts) if len(lane_hosts) > 1 else ""
        return _verdict("ready", "API ready: %s%s" % (models, ranks))
    last = "API answered" if master_row.get("api") else "API not ready: %s" % master_row.get("status")
    if give_up:
        if unknown:
            return _verdict("timeout", "The lane's state is unknown at the deadline (%s); the container runtime "
                                       "did not answer for %s" % (last, "; ".join(unknown)), master, 0)
        return _verdict("timeout", "The API at %s did not answer in time (every rank's container is running); "
                                   "last poll from %s: %s" % (url, master, master_row.get("status")), master, 0)
    if unknown:
        return _verdict("pending", "%s; the runtime did not answer for %s" % (last, "; ".join(unknown)))
    return _verdict("pending", last)


def wait_report(models, verdict=None, lane_hosts=None, lane=None, round_no=None):
    """The ready row of the host report (with a lane's rows: state, round, ranks, who holds the API port)."""
    row = {"models": list(models)}
    if lane is None:
        return row
    row.update(state=verdict["state"], rounds=round_no, ranks=[])
    for rank, host in enumerate(lane_hosts):
        container = (lane.get(host) or {}).get("container") or {}
        row["ranks"].append({"host": host, "rank": rank, "status": container.get("status"),
                             "exit_code": container.get("exit_code"), "id": (container.get("id") or "")[:12]})
    owner = (lane.get(lane_hosts[0]) or {}).get("owner")
    if owner and owner.get("holders"):
        row["api_served_by"] = "; ".join(describe_holder(h) for h in owner["holders"])
    return row


def poll_round(base, wait_for, container_check=None, owner_check=None, interval=1.0, opener=urlopen,
               clock=time.monotonic, sleep=time.sleep):
    """One host's row of a wait round: for up to wait_for seconds, the container then /v1/models until the
    container is down or the API answers; then who holds the API port (someone else may, when it is down)."""
    url = api_url(base, "/v1/models")
    start = clock()
    row = {"api": False, "models": [], "status": "not polled", "polls": 0, "container": None, "owner": None}
    while True:
        row["polls"] += 1
        if container_check is not None:
            row["container"] = container_check()
            if row["container"]["running"] is False:
                row["status"] = "container %s is %s" % (row["container"]["name"], row["container"]["status"])
                break
        try:
            body = http_json(url, timeout=max(1.0, min(5.0, wait_for)), opener=opener)
            row["models"] = [m.get("id") for m in body.get("data") or [] if isinstance(m, dict)]
            row["status"] = "ready"
            row["api"] = True
            break
        except StageError as exc:
            row["status"] = str(exc)
        if clock() - start + interval > wait_for:
            break
        sleep(interval)
    down = row["container"] is not None and row["container"]["running"] is False
    if owner_check is not None and (row["api"] or down):
        row["owner"] = owner_check(row["container"])
    row["elapsed_s"] = round(clock() - start, 3)
    return row


def wait_probe(base, wait_for, container_check=None, owner_check=None, lane_hosts=None, lane=None, give_up=False,
               wait_id=None, round_no=1, opener=urlopen, clock=time.monotonic, sleep=time.sleep):
    """One call of a wait: in a lane, the previous round's rows are judged first and this host polls only when
    that does not decide; alone, this host is judged as a one-rank lane."""
    verdict = row = None
    if lane_hosts and lane is not None:
        lane = fresh_rows(lane, wait_id, round_no)
        verdict = lane_verdict(lane_hosts, lane, base, give_up)
    if verdict is None or not verdict["decided"]:
        row = poll_round(base, wait_for, container_check, owner_check, opener=opener, clock=clock, sleep=sleep)
        row.update(wait_id=wait_id, round=round_no)
    if not lane_hosts:
        verdict = lane_verdict(["this host"], {"this host": row}, base, give_up=True)
    elif verdict is None:
        verdict = _verdict("pending", "first round: %s" % row["status"])
    result = {"ready": verdict["state"] == "ready", "decided": verdict["decided"], "verdict": verdict,
              "msg": verdict["msg"]}
    if lane_hosts:
        master_row = (lane or {}).get(lane_hosts[0]) or {}
        result["models"] = list(master_row.get("models") or (row or {}).get("models") or [])
        result["report"] = wait_report(result["models"], verdict, lane_hosts, lane, round_no)
    else:
        result["models"] = list(row["models"])
        result["report"] = wait_report(result["models"])
    if row is not None:
        container = row["container"] or {}
        result.update(row=row, status=row["status"], polls=row["polls"], elapsed_s=row["elapsed_s"],
                      running=container.get("running", True), logs=container.get("logs") or "")
    return result


def run_wait(params, runner=None, opener=urlopen, clock=time.monotonic, sleep=time.sleep):
    """engine_lane_wait's result for its options, every params["redact"] value hidden."""
    runtime = params.get("runtime") or "docker"
    check = owner = None
    if params.get("container"):
        check = functools.partial(container_state, runner, runtime, params["container"], secrets=params.get("redact"))
    if params.get("port"):
        owner = functools.partial(api_owner, runner, runtime, params["port"], secrets=params.get("redact"))
    result = wait_probe(params["url"], params["wait_for"], check, owner, params.get("lane_hosts"), params.get("lane"),
                        bool(params.get("give_up")), params.get("wait_id"), params.get("round") or 1,
                        opener=opener, clock=clock, sleep=sleep)
    # Engine logs and other processes' command lines may quote a secret (an engine prints its arguments).
    return redacted(result, params.get("redact"))
