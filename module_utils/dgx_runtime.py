# -*- coding: utf-8 -*-
"""The container runtime's command line (docker or podman), each call under a timeout shorter than the wait
round: a container's state, its name, and which container owns the API port.
Stdlib only (modules run on the nodes' system Python).
"""
from __future__ import absolute_import, division, print_function

import os
import signal
import subprocess

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_lane_wait import (LOG_LINES, container_facts, missing_container, owner_facts,
                                                unknown_container)
from ansible.module_utils.dgx_nodestate import listening_inodes, port_holders
from ansible.module_utils.dgx_secrets import redacted
from ansible.module_utils.dgx_units import plain_number


class RuntimeSlow(StageError):
    """A runtime call that did not end in time: the container's state is unknown, not gone."""


class RuntimeCli(object):
    """The container runtime's CLI as a wait round calls it (inspect, logs, the holder's name): each call
    ends within `timeout` seconds, killed otherwise, so a hung daemon cannot hold a round past its time.
    finder: anything with get_bin_path() (the AnsibleModule)."""

    def __init__(self, finder, timeout):
        self.finder, self.timeout = finder, float(timeout)

    def get_bin_path(self, name):
        return self.finder.get_bin_path(name)

    def run_command(self, argv):
        """(rc, stdout, stderr); RuntimeSlow when the call does not end in time (its process group is killed)."""
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
    """This host's engine container (container_facts()), with the tail of its log when it is not running;
    secrets are hidden in the runtime's texts before they are cut.

    runner: the AnsibleModule (anything with get_bin_path() and run_command()).
    """
    binary = runner.get_bin_path(runtime)
    if not binary:
        return missing_container(name, "%s not found on this host" % runtime)
    try:
        rc, out, err = runner.run_command([binary, "inspect", "--type", "container", name])
    except RuntimeSlow as exc:
        return unknown_container(name, str(exc))
    if rc != 0:
        return missing_container(name, "%s inspect: %s" % (runtime, redacted((err or out).strip(), secrets)[:300]))
    facts = container_facts(out, name)
    if facts["exists"] and not facts["running"]:
        try:
            rc, out, err = runner.run_command([binary, "logs", "--tail", str(LOG_LINES), name])
            facts["logs"] = redacted(out + err, secrets)[-4000:]
        except RuntimeSlow as exc:
            facts["logs"] = "(no log: %s)" % exc
    return facts


def _cmdline(pid, proc="/proc", secrets=None):
    """A process's command line (its first 200 characters, secrets hidden first), or "" when it is gone or
    not readable."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            text = handle.read().decode("utf-8", "replace").replace("\0", " ").strip()
            return redacted(text, secrets)[:200]
    except (IOError, OSError):
        return ""


def container_name(runner, runtime, container_id):
    """The name of a container by id, asking runtime and then the other runtime; None when unknown."""
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


def api_owner(runner, runtime, port, container, proc="/proc", secrets=None):
    """owner_facts() of the API port for this host's container facts: the processes holding a socket
    listening on it (dgx_nodestate reads /proc/net/tcp{,6}, the fds and the cgroups), each with its command
    line - except this run's engine, whose command line holds its secrets (--api-key) and says nothing the
    container's name does not; a holder in another container is named by the runtime. secrets are hidden in
    the command lines before they are cut."""
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
