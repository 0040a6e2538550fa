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


NO_NODE_WORK = {"meta", "ansible.builtin.meta", "ansible.builtin.set_fact", "ansible.builtin.assert",
                "ansible.builtin.fail", "ansible.builtin.debug", "ansible.builtin.validate_argument_spec",
                "ansible.builtin.include_tasks", "ansible.builtin.include_role", "ansible.builtin.add_host"}


def compiled_tasks(playbook):
    """Every task of every play as Ansible compiles it (static imports expanded), with its play."""
    from ansible.inventory.manager import InventoryManager
    from ansible.playbook import Playbook
    from ansible.playbook.block import Block
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager
    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader()
    loader = DataLoader()
    manager = VariableManager(loader=loader, inventory=InventoryManager(loader=loader, sources=[]))

    def walk(block):
        for task in block.block + block.rescue + block.always:
            yield from walk(task) if isinstance(task, Block) else [task]

    for play in Playbook.load(os.path.join(REPO_ROOT, playbook), variable_manager=manager, loader=loader).get_plays():
        for block in play.compile():
            for task in walk(block):
                yield play, task


@pytest.mark.parametrize("playbook", ["stage-deepseek.yml", "playbooks/status.yml"])
def test_every_task_on_a_node_after_the_lane_facts_becomes_by_lane_become(playbook):
    """The play says `become` once; every node task inherits it, so none can forget it (the lane's paths
    and the runtime are root's on a DGX where the operator logs in as themself)."""
    node_tasks = [(play.get_name(), task) for play, task in compiled_tasks(playbook)
                  if task.action not in NO_NODE_WORK and not play.get_name().startswith(("Select", "Lane facts"))]
    assert node_tasks
    wrong = [(play, task.get_name(), task.become) for play, task in node_tasks if task.become != "{{ lane_become }}"]
    assert wrong == []


def test_become_is_said_by_the_plays_and_the_controller_tasks_only():
    """No task repeats the play's become; a task delegated to the controller turns it off."""
    said, controller = [], []
    for folder in ("roles", "playbooks"):
        for root, _dirs, files in os.walk(os.path.join(REPO_ROOT, folder)):
            for name in files:
                if not name.endswith(".yml") or os.path.basename(root) == "meta":
                    continue
                path = os.path.join(root, name)
                with open(path) as handle:
                    documents = yaml.safe_load(handle) or []
                for item in documents:
                    if isinstance(item, dict) and "hosts" not in item:
                        if "become" in item and "delegate_to" not in item:
                            said.append((os.path.relpath(path, REPO_ROOT), item.get("name")))
                        if item.get("delegate_to") == "localhost":
                            controller.append(item.get("become"))
    assert said == []
    assert all(value is False for value in controller), controller
