"""playbooks/select-lane.yml's lane_become, rendered by Ansible's own templar: the remote user is the last line
that `id -un` printed, so a login banner before it never turns a root login into a become."""
import os

import pytest
import yaml
from ansible.template import Templar, trust_as_template
from ansible.parsing.dataloader import DataLoader

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lane_become_template():
    with open(os.path.join(REPO_ROOT, "playbooks", "select-lane.yml")) as handle:
        plays = yaml.safe_load(handle)
    found = [task["ansible.builtin.set_fact"]["lane_become"] for play in plays for task in play.get("tasks", [])
             if isinstance(task.get("ansible.builtin.set_fact"), dict) and "lane_become" in task["ansible.builtin.set_fact"]]
    assert len(found) == 1, found
    return trust_as_template(found[0])     # as Ansible trusts a playbook's own text


@pytest.mark.parametrize("lines, become", [
    (["root"], False),
    (["alice"], True),
    (["Welcome to dgx1", "Authorized use only", "root"], False),
    (["root", ""], False),
    (["root is the admin, welcome", "alice"], True),
])
def test_the_remote_user_is_the_last_line_id_printed(lines, become):
    variables = {"_lane_remote_user": {"stdout_lines": lines}}
    assert Templar(loader=DataLoader(), variables=variables).template(lane_become_template()) is become


def test_become_root_set_in_the_inventory_wins():
    variables = {"_lane_remote_user": {"stdout_lines": ["root"]}, "become_root": True}
    assert Templar(loader=DataLoader(), variables=variables).template(lane_become_template()) is True
