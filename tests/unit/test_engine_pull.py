"""roles/engine/tasks/plan.yml's podman pull with engine_pull: always, judged by Ansible's own templar: the
module pulls and says changed on every run (force), so only a new image id may count as a change; an
unchanged lane re-run must be changed=0."""
import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def podman_pull_changed_when():
    with open(os.path.join(REPO_ROOT, "roles", "engine", "tasks", "plan.yml")) as handle:
        tasks = yaml.safe_load(handle)
    found = [task["changed_when"] for task in tasks if "containers.podman.podman_image" in task]
    assert len(found) == 1, found
    return trust_as_template("{{ %s }}" % found[0])


@pytest.mark.parametrize("pull, before, after, module_changed, changed", [
    ("always", "sha-a", "sha-a", True, False),           # pulled again, same image: no change
    ("always", "sha-a", "sha-b", True, True),            # a new image behind the tag
    ("always", None, "sha-b", True, True),               # was not on the host
    ("missing", None, "sha-b", True, True),              # pulled because missing
    ("missing", "sha-a", "sha-a", False, False),         # there: not pulled
])
def test_a_podman_pull_is_a_change_only_when_the_image_id_changes(pull, before, after, module_changed, changed):
    variables = {
        "engine_pull": pull,
        "__engine_image_before_pull": {"images": [{"Id": before}] if before else []} if pull == "always" else
        {"skipped": True},
        "__engine_podman_pull": {"changed": module_changed, "image": [{"Id": after}]},
    }
    assert Templar(loader=DataLoader(), variables=variables).template(podman_pull_changed_when()) is changed
