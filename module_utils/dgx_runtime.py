"""What state each container on a node is in, through docker's or podman's common command line: a host's
containers, the engine image and its pull, who owns the API port."""
import json
import os
import signal
import subprocess

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_nodestate import listening_inodes, port_holders
from ansible.module_utils.dgx_secrets import command_secrets, redacted
from ansible.module_utils.dgx_units import plain_number

RUNTIMES = ("docker", "podman")

PULL = ("never", "missing", "always")

LOG_LINES = 30           # log lines kept of a container that is not running

LIST_TIMEOUT_S = 120     # a runtime call outside the wait (list, inspect) that takes longer fails the task

# Statuses (docker's and podman's) of a container neither running nor exited: its ExitCode is a placeholder.
NOT_EXITED = ("paused", "created", "configured", "initialized", "stopping")


def missing_container(name, why):
    return {"name": name, "exists": False, "id": None, "running": False, "status": "missing", "exit_code": None,
            "started_at": None, "finished_at": None, "error": why, "oom_killed": False, "logs": ""}


def _env_changed(entries, env):
    """The sorted names of env's variables whose value the container's K=V entries do not hold (None when either
    is unknown): only names, never a value or anything derived from one, leave."""
    if entries is None or env is None:
        return None
    held = dict(entry.split("=", 1) if "=" in entry else (entry, "") for entry in entries)
    return sorted(str(name) for name, value in env.items() if held.get(str(name)) != str(value))


def _mapping(value):
    return value if isinstance(value, dict) else {}


def container_facts(info, env=None, secrets=None):
    """A container's facts from one `inspect --type container` entry, both runtimes alike (Docker's State.Running
    is true when paused or restarting); its command and environment are not kept, its error text redacted."""
    state = _mapping(info.get("State"))
    config = _mapping(info.get("Config"))
    running = bool(state.get("Running")) and not state.get("Paused") and not state.get("Restarting")
    finished = state.get("FinishedAt") or None
    if finished and finished.startswith("0001-"):  # Go's zero time: never stopped
        finished = None
    status = state.get("Status") or ("running" if running else "stopped")
    if state.get("Paused"):
        status = "paused"
    elif state.get("Restarting"):
        status = "restarting"
    elif status == "stopped" and not running:
        # Podman's word for a container whose process ended and whose clean-up has not run yet: it exited.
        status = "exited"
    return {"name": (info.get("Name") or "").lstrip("/"), "exists": True, "id": info.get("Id") or "",
            "running": running, "status": status,
            "exit_code": None if status in NOT_EXITED else state.get("ExitCode"),
            "started_at": state.get("StartedAt"), "finished_at": finished, "error": redacted(str(state.get("Error") or ""), secrets),
            "oom_killed": bool(state.get("OOMKilled")), "logs": "",
            "labels": dict(_mapping(config.get("Labels"))), "env_changed": _env_changed(config.get("Env"), env),
            "image": info.get("ImageName") or config.get("Image") or "",
            "restart_policy": _mapping(_mapping(info.get("HostConfig")).get("RestartPolicy")).get("Name") or ""}


class RuntimeSlow(StageError):
    """A runtime call that did not end in time: the container's state is unknown, not gone."""


class RuntimeCli(object):
    """The runtime's CLI whose every call ends within `timeout` seconds, its process group killed otherwise, so a
    hung daemon cannot hold a wait round past its time."""

    def __init__(self, finder, timeout):
        self.get_bin_path, self.timeout = finder.get_bin_path, float(timeout)

    def run_command(self, argv):
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            return 127, "", str(exc)
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.communicate()
            raise RuntimeSlow("%s did not answer within %s s (it was stopped)" % (
                " ".join(os.path.basename(part) if i == 0 else part for i, part in enumerate(argv[:3])),
                plain_number(self.timeout)))
        return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def runtime_call_timeout(wait_for):
    """Seconds one runtime call of a wait round may take: well inside the round (wait_for), 1 to 10 s."""
    return max(1.0, min(10.0, float(wait_for) / 2.0))


def container_state(runner, runtime, name, secrets=None):
    """This host's engine container (container_facts()), with its log's tail when it is not running."""
    binary = runner.get_bin_path(runtime)
    if not binary:
        return missing_container(name, "%s not found on this host" % runtime)
    try:
        rc, out, err = runner.run_command([binary, "inspect", "--type", "container", name])
    except RuntimeSlow as exc:
        # running None: neither up nor down, so a slow daemon's rank is waited on, not judged dead.
        return dict(missing_container(name, str(exc)), exists=None, running=None, status="unknown")
    if rc != 0:
        return missing_container(name, "%s inspect: %s" % (runtime, redacted((err or out).strip(), secrets)[:300]))
    try:
        facts = container_facts(json.loads(out)[0], secrets=secrets)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return missing_container(name, "inspect printed no container: %r" % redacted(out or "", secrets)[:200])
    facts["name"] = name
    if facts["exists"] and not facts["running"]:
        try:
            rc, out, err = runner.run_command([binary, "logs", "--tail", str(LOG_LINES), name])
            facts["logs"] = redacted(out + err, secrets)[-4000:]
        except RuntimeSlow as exc:
            facts["logs"] = "(no log: %s)" % exc
    return facts


def _cmdline(pid, proc="/proc", secrets=None):
    """A process's command line (200 characters, secrets hidden first: ours and its own secret flags' values, as a
    stray engine's key may be one this run does not know), "" when it is gone or not readable."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            argv = handle.read().decode("utf-8", "replace").rstrip("\0").split("\0")
    except (IOError, OSError):
        return ""
    return redacted(" ".join(argv).strip(), list(secrets or []) + command_secrets(argv))[:200]


def container_name(runner, runtime, container_id):
    """The name of a container by id, from either runtime; None when unknown."""
    for cli in (runtime, "podman" if runtime == "docker" else "docker"):
        binary = runner.get_bin_path(cli)
        if not binary:
            continue
        try:
            rc, out, _err = runner.run_command([binary, "inspect", "--type", "container", "--format", "{{.Name}}",
                                                container_id])
        except RuntimeSlow:
            continue
        if rc == 0 and out.strip():
            return out.strip().lstrip("/")
    return None


def owner_facts(port, listening, holders, container_id):
    """Who serves the API port. ours: every holder runs in container_id (True), one does not (False),
    or nobody could be seen (None: nothing listens, or the holders' /proc is not readable)."""
    ours = bool(container_id) and all(h.get("container_id") == container_id for h in holders) if holders else None
    return {"port": int(port), "listening": bool(listening), "holders": list(holders), "ours": ours}


def api_owner(runner, runtime, port, container, proc="/proc", secrets=None):
    """owner_facts() of the API port. This run's engine's command line is left out: it holds its secrets and says
    nothing its container's name does not."""
    mine = (container or {}).get("id")
    listening = bool(listening_inodes(int(port), proc))
    holders = []
    for found in port_holders(int(port), proc) if listening else []:
        own = bool(mine) and found["container_id"] == mine
        holder = {"pid": found["pid"], "cmdline": None if own else (_cmdline(found["pid"], proc, secrets) or found["command"]),
                  "container_id": found["container_id"] or None, "container_name": None}
        if holder["container_id"] and holder["container_id"] != mine and runner is not None:
            holder["container_name"] = container_name(runner, runtime, holder["container_id"])
        holders.append(holder)
    return owner_facts(port, listening, holders, mine)


def _binary(runner, runtime):
    binary = runner.get_bin_path(runtime)
    if not binary:
        raise StageError("%s not found on this host (engine_runtime is %s)" % (runtime, runtime))
    return binary


def _said(runtime, what, err, out, secrets):
    return "%s %s: %s" % (runtime, what, redacted((err or out or "(no message)").strip(), secrets)[:500])


def list_containers(runner, runtime, env=None, secrets=None):
    """Every container on this host (container_facts()); one removed between the list and its inspect is left
    out."""
    binary = _binary(runner, runtime)
    rc, out, err = runner.run_command([binary, "ps", "--all", "--quiet", "--no-trunc"])
    if rc != 0:
        raise StageError(_said(runtime, "ps", err, out, secrets))
    ids = out.split()
    if not ids:
        return []
    rc, out, err = runner.run_command([binary, "inspect", "--type", "container"] + ids)
    try:
        infos = json.loads(out or "[]")
    except ValueError:
        infos = None
    if not isinstance(infos, list) or (rc != 0 and not infos):
        raise StageError(_said(runtime, "inspect", err, out, secrets))
    return [container_facts(info, env, secrets) for info in infos if isinstance(info, dict)]


def image_id(runner, runtime, image):
    """The id of image on this host, "" when the runtime does not have it (never pulls)."""
    rc, out, _err = runner.run_command([_binary(runner, runtime), "image", "inspect", "--format", "{{.Id}}", image])
    return out.strip().splitlines()[0] if rc == 0 and out.strip() else ""


def pull_image(runner, runtime, image, pull, secrets=None):
    """(pulled, image id) after a pull as pull (PULL) allows; pulled only when the id changed."""
    before = image_id(runner, runtime, image)
    if pull == "never" or (pull == "missing" and before):
        return False, before
    rc, out, err = runner.run_command([_binary(runner, runtime), "pull", image])
    if rc != 0:
        raise StageError(_said(runtime, "pull %s" % image, err, out, secrets))
    after = image_id(runner, runtime, image)
    return after != before, after


def host_containers(runner, params, check_mode=False):
    """engine_containers' result for its options (the image is not pulled in check mode)."""
    runtime, secrets = params["runtime"], params.get("redact")
    result = {"changed": False, "runtime": runtime}
    if params.get("image"):
        if check_mode:
            pulled, found = False, image_id(runner, runtime, params["image"])
        else:
            pulled, found = pull_image(runner, runtime, params["image"], params.get("pull") or "never", secrets)
        result.update(changed=pulled, image_id=found, image_present=bool(found))
    if params.get("containers", True):
        containers = list_containers(RuntimeCli(runner, LIST_TIMEOUT_S), runtime, params.get("env"), secrets)
        own = [c for c in containers if params.get("name") and c["name"] == params["name"]]
        result.update(containers=containers, own=own[0] if own else None,
                      running=bool(own and own[0]["running"]),
                      container_id=own[0]["id"] if own and own[0]["running"] else "")
    return result
