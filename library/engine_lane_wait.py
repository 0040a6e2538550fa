#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_lane_wait
short_description: One round of the lane-wide wait for the engine - judge every rank, poll the API, watch the container
version_added: "1.0.0"
description:
  - A lane-wide wait is rounds of calls, one per host per round. A call first judges O(lane), every rank's RV(row)
    of the previous round, and returns when that decides RV(verdict); every host judges the same rows alike.
  - Else it polls C(/v1/models) for up to O(wait_for) seconds, watching O(container), and with O(port) proves that
    whoever holds the port runs in O(container). Without O(lane_hosts) it judges this host alone.
  - Never fails on a verdict; the role asserts on RV(report).
author: dgx-stage maintainers
options:
  url: {description: "API base URL, C(http://host:port) (a trailing C(/v1) is accepted).", type: str, required: true}
  wait_for:
    description: Seconds to poll in this call; each runtime call in it is stopped after half of it (1 to 10 s).
    type: float
    default: 10
  container: {description: Name of this host's engine container; polling stops when it is not running., type: str}
  port: {description: "The API port on the master, whose listeners must run in O(container).", type: int}
  lane_hosts:
    description: The lane's hosts in rank order; the first (the master) serves the API.
    type: list
    elements: str
  lane: {description: "Every rank's RV(row) of the previous round, by host; not in round 1.", type: dict}
  give_up:
    description: With O(lane), the wait's time is up - an undecided lane is judged V(timeout), not polled.
    type: bool
    default: false
  wait_id:
    description: Names this wait on every host; with O(lane), only rows of this wait made in round O(round) - 1 count.
    type: str
  round: {description: "This round's number (1 for the first), echoed in RV(row).", type: int, default: 1}
  runtime: {description: The runtime that runs O(container)., type: str, choices: [docker, podman], default: docker}
  redact:
    description: Strings no part of the result may show (the engine's secret values), each replaced by C(<hidden>).
    type: list
    elements: str
    default: []
    no_log: true
extends_documentation_fragment:
  - dgx_node
  - dgx_node.read_only
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Read-only requests and runtime queries; behaves the same in check mode.
  idempotent:
    details: Only reads the engine's API, the container runtime and C(/proc); it never changes the engine.
"""

EXAMPLES = r"""
- name: One round - judge every rank's last row, then poll the API and watch this host's container
  engine_lane_wait:
    url: http://dgx1:8000
    wait_for: 10
    container: ds41-engine
    port: "{{ 8000 if inventory_hostname == 'dgx1' else omit }}"
    lane_hosts: [dgx1, dgx2]
    lane: "{{ previous_rows if round_no | int > 1 else omit }}"
    wait_id: "{{ wait_until }}"
    round: "{{ round_no }}"
  register: engine_ready
"""

RETURN = r"""
report:
  description: The ready row of the host report; the engine role passes it on unchanged (under C(ready)).
  returned: success
  type: dict
  contains:
    models: {description: RV(models)., type: list, elements: str}
    state: {description: RV(verdict.state)., returned: when O(lane) is set, type: str}
    rounds: {description: O(round) - the round that judged it., returned: when O(lane) is set, type: int}
    ranks:
      description: Every rank's container as the last round saw it.
      returned: when O(lane) is set
      type: list
      elements: dict
      contains:
        host: {description: The rank's host., type: str}
        rank: {description: The rank., type: int}
        status: {description: The container's status (V(running), V(exited), V(missing)...)., type: str}
        exit_code: {description: The container's exit code; null when it has not exited., type: int}
        id: {description: The container id (12 characters); empty when there is none., type: str}
    api_served_by:
      description: Who holds the API port on the master.
      returned: when O(lane) is set and someone holds the port
      type: str
ready:
  description: RV(verdict.state) is V(ready) - every rank's container running, the API answering from the master's.
  returned: success
  type: bool
decided: {description: RV(verdict.decided) - stop the rounds., returned: success, type: bool}
verdict:
  description: What the lane's last round (or, alone, this call) shows.
  returned: success
  type: dict
  contains:
    state:
      description:
        - V(pending) (poll again), V(ready), V(dead) (a rank's container is not running), V(missing) (a rank
          did not report), V(stranger) (the API port is held outside the master's container), V(unproven)
          (the API answered but nobody could be seen on the port) or V(timeout) (O(give_up)).
      type: str
    decided: {description: Anything but V(pending)., type: bool}
    msg: {description: What an operator reads (for V(dead) the first rank to end and its log tail)., type: str}
    host: {description: The host the verdict names (the down rank's or the master's); or null., type: str}
    rank: {description: That host's rank; or null., type: int}
    exit_code: {description: V(dead) - the down container's exit code; else null., type: int}
  sample: {state: dead, decided: true, host: dgx2, rank: 1, exit_code: 3,
           msg: "Rank 1 of the lane is down - rank 1 (host dgx2): container ds41-engine is not running (exited) ..."}
row:
  description: This host's share of the round, for O(lane) in the next round (the role passes it on unchanged).
  returned: success when this call polled
  type: dict
  contains:
    api: {description: The API listed its models., type: bool}
    models: {description: Model ids listed., type: list, elements: str}
    status: {description: RV(status)., type: str}
    polls: {description: RV(polls)., type: int}
    elapsed_s: {description: RV(elapsed_s)., type: float}
    wait_id: {description: O(wait_id)., type: str}
    round: {description: O(round)., type: int}
    container:
      description: O(container) as the runtime shows it, or null without O(container).
      type: dict
      contains:
        name: {description: Container name., type: str}
        exists: {description: The runtime knows it., type: bool}
        id: {description: Container id., type: str}
        running: {description: Running (and neither paused nor restarting)., type: bool}
        status: {description: The runtime's status; V(missing) when it does not exist., type: str}
        exit_code: {description: Exit code; null when it has not exited., type: int}
        started_at: {description: When it started (the runtime's timestamp)., type: str}
        finished_at: {description: When it last ended; or null., type: str}
        error: {description: The runtime's error for it; or why it was not found., type: str}
        oom_killed: {description: Killed out of memory., type: bool}
        logs: {description: The last 30 lines of its log when it is not running; else empty., type: str}
    owner:
      description: Who holds O(port), when O(port) is set and the API answered or O(container) is down; else null.
      type: dict
      contains:
        port: {description: O(port)., type: int}
        listening: {description: A socket listens on it (tcp or tcp6)., type: bool}
        ours: {description: Every holder runs in O(container); null when none could be seen., type: bool}
        holders:
          description: The processes holding a listening socket on it.
          type: list
          elements: dict
          contains:
            pid: {description: Process id., type: int}
            cmdline: {description: Its command line (200 characters)., type: str}
            container_id: {description: The container its cgroup names; or null., type: str}
            container_name: {description: That container's name when another and known; else null., type: str}
running:
  description: False when O(container) was found not running.
  returned: success when this call polled
  type: bool
status:
  description: V(ready), the last poll's error, or the container's status.
  returned: success when this call polled
  type: str
models:
  description: Model ids the API listed (from the master's row in a lane; empty until it is ready).
  returned: success
  type: list
  elements: str
  sample: [coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw]
polls: {description: Requests made in this call., returned: success when this call polled, type: int}
logs:
  description: The tail of O(container)'s log when it is not running.
  returned: success when this call polled
  type: str
elapsed_s: {description: Seconds polled in this call., returned: success when this call polled, type: float}
msg:
  description: RV(verdict.msg); on failure, what went wrong.
  returned: always
  type: str
  sample: "API ready: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw - all 2 ranks running"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_lane_wait, dgx_runtime

ARGUMENT_SPEC = dict(
    url=dict(type="str", required=True),
    wait_for=dict(type="float", default=10.0),
    container=dict(type="str"),
    port=dict(type="int"),
    lane_hosts=dict(type="list", elements="str"),
    lane=dict(type="dict"),
    give_up=dict(type="bool", default=False),
    wait_id=dict(type="str"),
    round=dict(type="int", default=1),
    runtime=dict(type="str", choices=["docker", "podman"], default="docker"),
    redact=dict(type="list", elements="str", default=[], no_log=True),
)
REQUIRED_BY = {"lane": ["lane_hosts"]}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_by=REQUIRED_BY, supports_check_mode=True)
    runner = dgx_runtime.RuntimeCli(module, dgx_runtime.runtime_call_timeout(module.params["wait_for"]))
    try:
        result = dgx_lane_wait.run_wait(module.params, runner=runner)
    except StageError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
