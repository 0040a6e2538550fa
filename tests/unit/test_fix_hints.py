"""Every command a message gives as the fix is one the operator can paste: a front-end subcommand that exists,
the host's --limit, -e values the plays read, all accepted by dgx-stage's own checks against the demo
inventory (the engine role's messages rendered as Ansible renders them, the node-side ones from the code that
builds them)."""
import glob
import os
import re
import shlex
import sys

import jinja2
import pytest
import yaml

from ansible.module_utils.dgx_errors import fix_command
from ansible.module_utils.dgx_receipts import refusal_message

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from dgx_stage import cli, extravars  # noqa: E402

DEMO = os.path.join(REPO_ROOT, "inventory", "demo")
HOST = "localhost"
COMMAND = re.compile(r"`(dgx-stage [^`]+)`")
TASK_VARS = {"inventory_hostname": HOST, "ansible_check_mode": False, "lane_name": "exl3_2x",
             "engine_restart_only": "", "_engine_image_hint": "", "_engine_limited_out": ["dgx1"]}


def _strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def task_hints():
    """The commands the roles' and playbooks' messages give, rendered (check mode too) with this host's vars."""
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    found = []
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "roles", "*", "tasks", "*.yml"))
                       + glob.glob(os.path.join(REPO_ROOT, "playbooks", "**", "*.yml"), recursive=True)):
        with open(path) as handle:
            tasks = yaml.safe_load(handle)
        for text in _strings(tasks):
            if "dgx-stage " not in text:
                continue
            for check_mode in (False, True):
                rendered = env.from_string(text).render(dict(TASK_VARS, ansible_check_mode=check_mode))
                found += [(os.path.relpath(path, REPO_ROOT), c) for c in COMMAND.findall(rendered)]
    return sorted(set(found))


def code_hints():
    """The commands the node-side messages give: each fix_command call in module_utils, built for this host."""
    found = []
    call = re.compile(r"fix_command\(\"([a-z-]+)\", (?:(?:req\.)?host|None)((?:, \"[^\"]+\")*)\)")
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "module_utils", "*.py"))):
        with open(path) as handle:
            for subcommand, values in call.findall(handle.read()):
                found.append((os.path.relpath(path, REPO_ROOT),
                              COMMAND.search(fix_command(subcommand, HOST, *re.findall(r'"([^"]+)"', values)))
                              .group(1)))
    holder = {"pid": 7, "name": "sleep", "container": None, "how": "cwd", "path": "/c/r", "roots": ["/c/r"],
              "seen_as": "/c/r"}
    found += [("module_utils/dgx_receipts.py", c) for c in COMMAND.findall(refusal_message([holder], ["/c/r"], HOST))]
    return found


HINTS = sorted(set(task_hints() + code_hints()))


def test_the_hints_are_found_where_the_messages_are():
    places = set(path for path, _command in HINTS)
    assert {"roles/engine/tasks/main.yml", "roles/engine/tasks/image.yml", "module_utils/dgx_mirror_plan.py",
            "module_utils/dgx_receipts.py"} <= places, places
    assert len(HINTS) >= 8, HINTS


@pytest.mark.parametrize("where,command", HINTS, ids=["%s: %s" % hint for hint in HINTS])
def test_each_hint_is_a_command_dgx_stage_accepts(where, command):
    words = shlex.split(command)
    assert words[0] == "dgx-stage" and words[1] in cli.SUBCOMMANDS, (where, command)
    args = cli.build_parser().parse_args(words[1:] + ["-i", DEMO])
    inventory = cli.load_inventory(DEMO, args.limit)
    extravars.check(extravars.resolve(args.extra_vars), inventory)
