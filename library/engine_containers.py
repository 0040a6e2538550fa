#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_containers
short_description: Say what the container runtime holds on the node - its containers, the engine's, the engine image
version_added: "1.0.0"
description:
  - Lists every container on the node, running or not, as the same facts whichever runtime (O(runtime), through
    its command line) listed it (RV(containers)); the one named O(name) is RV(own). The engine role's plan, its
    status and the hosts that left the lane read this.
  - Optionally the id of O(image), pulled first as O(pull) allows; the listeners of O(port); the
    O(python_modules) the node's Python cannot import (C(requests), which community.docker needs).
author: dgx-stage maintainers
options:
  runtime: {description: The container runtime., type: str, required: true, choices: [docker, podman]}
  name: {description: The engine container's name (RV(own))., type: str}
  containers:
    description: List the containers (V(false) - only the image, the port or the Python modules).
    type: bool
    default: true
  image: {description: An image to look up (RV(image_id))., type: str}
  pull:
    description: Whether O(image) may be pulled first - V(never), V(missing) (only when absent), V(always).
    type: str
    default: never
    choices: [never, missing, always]
  env:
    description:
      - The environment the engine container would get; each container's C(env_changed) names the variables it
        does not hold, never a value (a container's command and environment are not returned).
    type: dict
  port: {description: TCP port whose listeners to list in RV(port_holders)., type: int}
  python_modules:
    description: Top-level Python modules to look for in the node's Python; RV(python) lists the missing ones.
    type: list
    elements: str
    default: []
  redact:
    description: Values no message may show (the engine's secrets), hidden in the runtime's error messages.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - dgx_node
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Check mode pulls nothing; it reads the same.
  diff_mode:
    support: none
    details: A pull is the only change; it has no diff.
  idempotent:
    details: A pull that brings no new image id is no change.
notes:
  - Needs the runtime's command line on the node. Listing the holders of a port reads every process's
    C(/proc/<pid>/fd), which needs root for other users' processes.
  - O(env) and O(redact) are not no_log (Ansible would mask every equal string of the result, a label such as a
    port or a lane name among them); a task that passes them sets C(no_log) and says a failure itself, redacted.
"""

EXAMPLES = r"""
- name: The containers on this host, and the engine image pulled when missing
  engine_containers:
    runtime: docker
    name: ds41-engine
    image: localhost/engine:1
    pull: missing
    port: 8000
    env: "{{ engine_env }}"
  register: __engine_containers
"""

RETURN = r"""
containers:
  description: Every container on the node (with O(containers)).
  returned: success when O(containers)
  type: list
  elements: dict
  contains: &container
    id: {description: The container id., type: str}
    name: {description: Its name., type: str}
    exists: {description: Always true for a listed container., type: bool}
    running: {description: Running, and neither paused nor restarting., type: bool}
    status: {description: The runtime's word for its state (exited for Podman's stopped)., type: str}
    exit_code: {description: Its exit code; null when it has not exited., type: int}
    started_at: {description: When it started (the runtime's timestamp)., type: str}
    finished_at: {description: When it last stopped; null when it never has., type: str}
    error: {description: The runtime's error for it., type: str}
    oom_killed: {description: Killed out of memory., type: bool}
    logs: {description: Empty (the wait reads logs)., type: str}
    labels: {description: Its labels., type: dict}
    env_changed: {description: The names of O(env)'s variables it does not hold; null without O(env)., type: list,
                  elements: str}
    image: {description: The image it was created from., type: str}
    restart_policy: {description: Its restart policy ("" for none)., type: str}
own:
  description: The container named O(name), as in RV(containers); null when there is none.
  returned: success when O(containers)
  type: dict
  contains: *container
running: {description: Whether RV(own) runs., returned: success when O(containers), type: bool}
container_id: {description: The id of RV(own) when it runs., returned: success when O(containers), type: str}
image_id:
  description: The id of O(image) on the node, or empty.
  returned: success when O(image) is set
  type: str
image_present: {description: Whether O(image) is on the node., returned: success when O(image) is set, type: bool}
port_holders:
  description: The processes listening on O(port).
  returned: success when O(port) is set
  type: list
  elements: dict
  contains:
    pid: {description: The process id., type: int}
    command: {description: Its command name., type: str}
    container_id: {description: The container it runs in ("" for none)., type: str}
python:
  description: The node's Python and the modules of O(python_modules) it cannot import.
  returned: success when python_modules names a module
  type: dict
  contains:
    executable: {description: The interpreter., type: str}
    version: {description: Its version., type: str}
    missing: {description: The modules it cannot import., type: list, elements: str}
runtime: {description: "O(runtime), the runtime that was asked.", returned: success, type: str}
changed: {description: Whether a pull brought a new image id., returned: success, type: bool}
msg: {description: Why the runtime could not be asked (no secret shown)., returned: failure, type: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_nodestate import port_holders, python_modules
from ansible.module_utils.dgx_runtime import PULL, RUNTIMES, host_containers


ARGUMENT_SPEC = dict(
    runtime=dict(type="str", required=True, choices=list(RUNTIMES)),
    name=dict(type="str"),
    containers=dict(type="bool", default=True),
    image=dict(type="str"),
    pull=dict(type="str", default="never", choices=list(PULL)),
    env=dict(type="dict"),
    port=dict(type="int"),
    python_modules=dict(type="list", elements="str", default=[]),
    redact=dict(type="list", elements="str", default=[]),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    if params["port"] is not None and not 0 < params["port"] < 65536:
        module.fail_json(msg="port must be 1-65535, got %d" % params["port"])
    try:
        result = host_containers(module, params, check_mode=module.check_mode)
    except StageError as exc:
        module.fail_json(msg=str(exc))
    if params["port"] is not None:
        result["port_holders"] = port_holders(params["port"])
    if params["python_modules"]:
        result["python"] = python_modules(params["python_modules"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
