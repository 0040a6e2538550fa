# -*- coding: utf-8 -*-
"""Engine role filters: the lane-wide decisions (one engine per rank, restarted together: labels, each rank's
survey of its host, restart reasons, the lane's plan), the secrets no message may show, and the container's binds
and environment. Labels never carry a secret: env and command are stored as digests.
"""
import hashlib
import json
import os
import sys

from ansible.errors import AnsibleFilterError

# This checkout's front-end package, whether or not the Python running Ansible has it installed.
_CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)
from dgx_stage import use_module_utils  # noqa: E402

use_module_utils()   # Ansible puts module_utils/ on the import path of modules only
from ansible.module_utils.dgx_errors import StageError  # noqa: E402
from ansible.module_utils.dgx_mountspec import mount_path_problem  # noqa: E402
from ansible.module_utils.dgx_secrets import redacted, secret_values  # noqa: E402

# One label per aspect of what a rank runs, in the order restart reasons are given: (spec key, label, reason).
# The run id gives no reason: it names the run that started the container and changes every run.
LABELS = (
    ("lane", "dgx-stage.lane", "lane %s -> %s"),
    ("lane_hosts", "dgx-stage.lane-hosts", "lane hosts %s -> %s"),
    ("rank", "dgx-stage.rank", "rank %s -> %s"),
    ("world_size", "dgx-stage.world-size", "world size %s -> %s"),
    ("port", "dgx-stage.port", "port %s -> %s"),
    ("run_id", "dgx-stage.run-id", None),
    ("image", "dgx-stage.image", "image %s -> %s"),
    ("image_id", "dgx-stage.image-id", "image rebuilt or re-pulled (id %s -> %s)"),
    ("command", "dgx-stage.command-sha256", "command changed"),
    ("env", "dgx-stage.env-sha256", "env changed"),
    ("mounts", "dgx-stage.mounts-sha256", "mounts changed"),
    ("files", "dgx-stage.files-sha256",
     "bound files changed (a verify repair, re-stage or prune: new or missing inodes)"),
    ("devices", "dgx-stage.devices-sha256", "GPU devices changed"),
)
_LABEL = dict((key, label) for key, label, _say in LABELS)
LANE, LANE_HOSTS, RANK, RUN_ID = _LABEL["lane"], _LABEL["lane_hosts"], _LABEL["rank"], _LABEL["run_id"]
IMAGE, IMAGE_ID, ENV, MOUNTS = _LABEL["image"], _LABEL["image_id"], _LABEL["env"], _LABEL["mounts"]


def _digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


# How a spec value becomes its label (str otherwise); the command and env are digests, never their values.
_ENCODE = {"lane_hosts": lambda hosts: ",".join(str(h) for h in hosts),
           "command": lambda argv: _digest([str(a) for a in argv]),
           "env": lambda env: _digest(dict((str(k), str(v)) for k, v in env.items())),
           "devices": _digest}


def dgx_engine_labels(spec):
    """The engine container's labels, one per aspect of what it runs, from the values the role computed."""
    missing = sorted(set(_LABEL) - set(spec))
    if missing:
        raise AnsibleFilterError("dgx_engine_labels: missing %s" % ", ".join(missing))
    return dict((label, _ENCODE.get(key, str)(spec[key])) for key, label, _say in LABELS)


def _state_text(container):
    if container.get("exit_code") is not None and container.get("status") in ("exited", "stopped", "dead"):
        return "container %s (exit code %s)" % (container["status"], container["exit_code"])
    return "container %s" % (container.get("status") or "not running")


def dgx_restart_reasons(own, labels, image_present=True, pull="never", dry_run_changed=False, strays=None):
    """Why this rank must (re)start, [] when own (this lane's container, None when there is none) already is what
    labels (dgx_engine_labels) describe; strays: this host's strays, stopped first."""
    reasons = ["%s: it is stopped first" % s["why"] for s in strays or []]
    if not image_present:
        reasons.append("image %s is not on this host (engine_pull=%s)" % (labels.get(IMAGE), pull))
    if own is None:
        return reasons + ["container missing"]
    if not own.get("running"):
        reasons.append(_state_text(own))
    if own.get("restart_policy") not in (None, "", "no"):
        reasons.append("restart policy %s (a rank must never restart on its own: the lane restarts as one)"
                       % own["restart_policy"])
    current = own.get("labels") or {}
    if LANE not in current:
        return reasons + ["the container predates the lane labels (started by an earlier dgx-stage)"]
    for _key, key, say in (aspect for aspect in LABELS if aspect[2]):
        old, new = current.get(key), labels.get(key)
        if old == new or (key == IMAGE_ID and (not image_present or current.get(IMAGE) != labels.get(IMAGE))):
            continue
        if key == ENV and own.get("env_changed") is not None:
            names = own["env_changed"]
            reasons.append("env changed (%s)" % ", ".join(names) if names else "env changed (a variable removed)")
            continue
        if key == IMAGE_ID:     # 12 hex digits, without Docker's sha256: prefix
            old, new = ((image_id or "?").split(":")[-1][:12] for image_id in (old, new))
        reasons.append(say % (old, new) if "%s" in say else say)
    if dry_run_changed and not reasons:
        reasons.append("the runtime would recreate it (a container setting changed)")
    return reasons


def _describe(container):
    labels = container.get("labels") or {}
    if LANE in labels:
        return "an engine of lane %s, rank %s of %s" % (labels[LANE], labels.get(RANK, "?"),
                                                         labels.get(LANE_HOSTS, "?"))
    if MOUNTS in labels:
        return "a dgx-stage engine without lane labels"
    return "not started by dgx-stage"


def _rank_host(container):
    """The host a dgx-stage engine container is the rank of (its rank's place in its lane hosts), or None."""
    labels = container.get("labels") or {}
    hosts = (labels.get(LANE_HOSTS) or "").split(",")
    try:
        return hosts[int(labels.get(RANK, ""))] or None
    except (ValueError, IndexError):
        return None


def dgx_lane_survey(containers, engine_name, lane, lane_hosts, lane_engines, host, port=None, port_holders=None):
    """{own, run_id, strays, worlds} on one rank's host. own: the container named engine_name when it is this
    lane's; run_id: the run that started it. strays ({host, id, name, why, stoppable}): what holds engine_name
    or port outside the lane, and running engines labelled as this host's rank of another lane. worlds: the
    earlier worlds ({lane, lane_hosts}) of own and the strays, whose ranks may run on hosts that left the lane."""
    by_id = dict((c["id"], c) for c in containers)

    def ours(c):
        labels = c.get("labels") or {}
        if LANE in labels:
            return labels[LANE] == lane and c["name"] in lane_engines
        return c["name"] == engine_name and MOUNTS in labels

    def stray(key, cid, name, why, stoppable=True):
        return strays.setdefault(key, {"host": host, "id": cid, "name": name, "stoppable": stoppable, "why": why})

    own, strays = None, {}
    for c in containers:
        if c["name"] == engine_name and ours(c):
            own = c
        elif c["name"] == engine_name:
            stray(c["id"], c["id"], c["name"],
                  "%s holds the engine name %s (%s)" % (c["name"], engine_name, _describe(c)))
    for c in containers:
        if c["running"] and c is not own and c["name"] not in lane_engines and _rank_host(c) == host:
            stray(c["id"], c["id"], c["name"],
                  "%s is still running as this host's engine (%s)" % (c["name"], _describe(c)))
    for holder in port_holders or []:
        cid = holder.get("container_id") or ""
        c = by_id.get(cid)
        if c is not None and not ours(c):
            stray(cid, cid, c["name"], "%s (%s)" % (c["name"], _describe(c)))["why"] += " listens on port %s" % port
        elif c is None and cid:
            stray(cid, cid, "container %s" % cid[:12], "container %s of another runtime listens on port %s"
                  % (cid[:12], port), stoppable=False)
        elif c is None:
            key, command = "pid %s" % holder.get("pid"), holder.get("command")
            stray(key, "", "%s (%s)" % (key, command), "host process %s (%s) listens on port %s" % (key, command, port),
                  stoppable=False)
    current = {"lane": lane, "lane_hosts": ",".join(lane_hosts)}
    worlds = []
    for c in ([own] if own else []) + [by_id[s["id"]] for s in strays.values() if s["id"] in by_id]:
        labels = c.get("labels") or {}
        world = {"lane": labels.get(LANE), "lane_hosts": labels.get(LANE_HOSTS)}
        if LANE in labels and LANE_HOSTS in labels and world != current and world not in worlds:
            worlds.append(world)
    return {"own": own, "run_id": (own or {}).get("labels", {}).get(RUN_ID, ""),
            "strays": [strays[k] for k in sorted(strays)], "worlds": worlds}


def dgx_left_hosts(surveys, lane_hosts, inventory_hosts):
    """[{host, lane, lane_hosts}]: the hosts of the surveys' earlier worlds that are not in the lane and are
    in the inventory (a host the inventory no longer has cannot be reached), sorted by host."""
    out = {}
    for survey in surveys:
        for world in (survey or {}).get("worlds") or []:
            for host in world["lane_hosts"].split(","):
                if host and host not in lane_hosts and host in inventory_hosts:
                    out.setdefault((host, world["lane"], world["lane_hosts"]),
                                   {"host": host, "lane": world["lane"], "lane_hosts": world["lane_hosts"]})
    return [out[k] for k in sorted(out)]


def dgx_left_strays(results):
    """{strays, unchecked} from the looped engine_containers results over dgx_left_hosts: the running engines
    labelled as that host's rank of that earlier world, and the hosts that could not be asked."""
    strays, unchecked, seen = [], [], set()
    for result in (results or {}).get("results") or []:
        if result.get("skipped"):
            continue
        item = result["item"]
        if result.get("unreachable") or result.get("failed"):
            unchecked.append(item["host"])
            continue
        for c in result.get("containers") or []:
            labels = c["labels"]
            if not c["running"] or labels.get(LANE) != item["lane"] or labels.get(LANE_HOSTS) != item["lane_hosts"]:
                continue
            if _rank_host(c) == item["host"] and (item["host"], c["id"]) not in seen:
                seen.add((item["host"], c["id"]))
                strays.append({"host": item["host"], "id": c["id"], "name": c["name"], "stoppable": True,
                               "runtime": result.get("runtime"),
                               "why": "%s on %s, no longer in the lane, is rank %s of lane %s (%s): a dead world"
                               % (c["name"], item["host"], labels.get(RANK), item["lane"], item["lane_hosts"])})
    return {"strays": strays, "unchecked": sorted(set(unchecked))}


def dgx_secret_values(env, command=None):
    """dgx_secrets.secret_values, its refusal a filter error."""
    try:
        return secret_values(env, command)
    except StageError as exc:
        raise AnsibleFilterError(str(exc))


def dgx_redact(text, values):
    """text without any of values (dgx_secret_values): a runtime's error message may quote what it was given."""
    return redacted("" if text is None else str(text), values)


def dgx_bind_problem_lines(states, hosts):
    """'host: problem' for each bind problem of each host's engine_node_state result (states, in hosts' order)."""
    return ["%s: %s" % (host, problem) for state, host in zip(states, hosts)
            for problem in (state or {}).get("bind_problems") or []]


def dgx_stop_outcomes(results, lane_hosts=()):
    """{failed, unreached}: one line per stray the looped stop tasks' registered results could not stop. A lane
    host that could not be reached fails: its stray would run beside the engine the lane restarts."""
    failed, unreached = [], []
    for registered in results or []:
        for result in (registered or {}).get("results") or []:
            item = result.get("item") or {}
            where = "%s on %s" % (item.get("name"), item.get("host")) if item.get("host") else str(item.get("name"))
            if result.get("unreachable") and item.get("host") in lane_hosts:
                failed.append("could not stop %s: %s could not be reached (%s)"
                              % (where, item.get("host"), result.get("msg") or "unreachable"))
            elif result.get("unreachable"):
                unreached.append("%s was not stopped: %s could not be reached (%s); stop it there when it is back"
                                 % (where, item.get("host"), result.get("msg") or "unreachable"))
            elif result.get("failed"):
                failed.append("could not stop %s: %s" % (where, result.get("msg") or "(no message)"))
    return {"failed": failed, "unreached": unreached}


def dgx_stray_lines(strays):
    """'host: why' per stray, with '(not a container: stop it yourself)' for what the role cannot stop."""
    return ["%s: %s%s" % (s["host"], s["why"], "" if s.get("stoppable") else " (not ours to stop: stop it yourself)")
            for s in strays]


def dgx_lane_plan(plans, restart_only=""):
    """{restart: hosts in rank order, reasons: {host: [why]}, held: {host: [why]}} from every rank's
    {host, rank, reasons}. A lane restarts as one; restart_only restarts that host alone, and held names the
    other ranks with reasons of their own, left running."""
    plans = sorted(plans, key=lambda p: int(p["rank"]))
    if restart_only:
        mine = [p for p in plans if p["host"] == restart_only]
        if not mine:
            raise AnsibleFilterError("dgx_lane_plan: engine_restart_only=%s is not a rank in play" % restart_only)
        return {"restart": [restart_only],
                "reasons": {restart_only: list(mine[0]["reasons"]) + ["forced by engine_restart_only"]},
                "held": dict((p["host"], list(p["reasons"])) for p in plans
                             if p["reasons"] and p["host"] != restart_only)}
    changed = [p for p in plans if p["reasons"]]
    if not changed:
        return {"restart": [], "reasons": {}, "held": {}}
    why = "; ".join("%s: %s" % (p["host"], ", ".join(p["reasons"])) for p in changed)
    return {"restart": [p["host"] for p in plans], "held": {},
            "reasons": dict((p["host"], list(p["reasons"]) or ["the lane restarts as one (%s)" % why]) for p in plans)}


def _checked(binds, what):
    """The binds as plain {source, target, read_only} dicts; AnsibleFilterError on the first bad one."""
    if not isinstance(binds, (list, tuple)):
        raise AnsibleFilterError("%s: expected a list of binds, got %s" % (what, type(binds).__name__))
    out = []
    for index, bind in enumerate(binds):
        if not isinstance(bind, dict):
            raise AnsibleFilterError("%s: bind %d is a %s, not a dict" % (what, index, type(bind).__name__))
        for key in ("source", "target"):
            problem = mount_path_problem(bind.get(key))
            if problem is not None:
                raise AnsibleFilterError("%s: bind %d refused, its %s %s" % (what, index, key, problem))
        read_only = bind.get("read_only", True)
        if not isinstance(read_only, bool):
            raise AnsibleFilterError("%s: bind %r has read_only %r, not a boolean"
                                     % (what, bind["target"], read_only))
        out.append({"source": str(bind["source"]), "target": str(bind["target"]), "read_only": read_only})
    return out


def dgx_binds(manifest_mounts, extra_binds=None):
    """The manifest's binds (read-only, whatever else the entries carry) followed by extra_binds."""
    manifest = _checked(manifest_mounts, "dgx_binds (manifest mounts)")
    for bind in manifest:
        bind["read_only"] = True
    return manifest + _checked(list(extra_binds or []), "dgx_binds (extra binds)")


def dgx_docker_mounts(binds):
    """community.docker docker_container `mounts` entries (API fields: no quoting needed)."""
    return [{"type": "bind", "source": b["source"], "target": b["target"], "read_only": b["read_only"]}
            for b in _checked(binds, "dgx_docker_mounts")]


def _csv_field(field):
    """One field of a --mount spec as Podman's Go encoding/csv reads it back unchanged (a comma, a quote or edge
    whitespace needs quoting)."""
    if any(c in field for c in ',"\r\n') or field != field.strip():
        return '"' + field.replace('"', '""') + '"'
    return field


def dgx_podman_mount_specs(binds):
    """containers.podman podman_container `mount` entries, one --mount spec per bind (CSV-quoted)."""
    return [",".join(_csv_field(field) for field in ("type=bind", "source=" + b["source"], "destination=" + b["target"],
                                                     "ro=true" if b["read_only"] else "ro=false"))
            for b in _checked(binds, "dgx_podman_mount_specs")]


def dgx_mounts_digest(specs):
    """sha256 hex of the specs in their order, NUL-separated: case-sensitive (podman_container compares `mount`
    lowercased)."""
    return hashlib.sha256("\0".join(str(s) for s in specs).encode("utf-8")).hexdigest()


def dgx_container_env(extra_env, rank_env):
    """The container environment: every value a string, the rank environment winning over engine_env."""
    env = dict((str(key), str(value)) for key, value in (extra_env or {}).items())
    env.update((str(key), str(value)) for key, value in rank_env.items())
    return env


class FilterModule(object):
    """Engine role filters (see the module docstring)."""

    def filters(self):
        return dict((f.__name__, f) for f in (
            dgx_bind_problem_lines, dgx_redact, dgx_secret_values, dgx_engine_labels, dgx_lane_survey, dgx_left_hosts,
            dgx_left_strays, dgx_restart_reasons, dgx_lane_plan, dgx_stray_lines, dgx_stop_outcomes, dgx_binds,
            dgx_docker_mounts, dgx_podman_mount_specs, dgx_mounts_digest, dgx_container_env))
