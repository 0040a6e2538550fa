"""The production inventory (inventory/dgx) as Ansible reads it: what each lane stages. dgx1 and dgx2 are in
both lane groups, so the lane chosen with -e lane=... must pick the repos, not group membership."""
import os

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible.vars.manager import VariableManager
from pluginfile import load_filter

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = os.path.join(REPO_ROOT, "inventory", "dgx")


def rendered(host, name, extra_vars):
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[INVENTORY])
    manager = VariableManager(loader=loader, inventory=inventory)
    manager._extra_vars = dict(extra_vars)          # as -e sets them
    variables = manager.get_vars(host=inventory.get_host(host))
    return Templar(loader=loader, variables=variables).template(variables[name])


def test_the_default_lane_stages_the_exl3_checkpoint_without_page15_on_both_hosts():
    for host in ("dgx1", "dgx2"):
        repos = rendered(host, "stage_repos", {})
        assert [r["repo_id"] for r in repos] == ["coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw", "coolbho3k/DSpark-drafter"]
        assert repos[0]["ignore_patterns"] == ["page15/"]
        assert not any("rank_patterns" in r for r in repos)


@pytest.mark.parametrize("host,rank", [("dgx1", 0), ("dgx2", 1), ("dgx3", 2), ("dgx4", 3)])
def test_the_4x_lane_stages_its_rank_templated_repo_on_every_host_even_those_in_both_groups(host, rank):
    lane = load_filter("stage", "stage_lane")
    repos = rendered(host, "stage_repos", {"lane": "sglang_4x"})
    assert len(repos) == 1 and repos[0]["rank_patterns"] == ["engram/rank-{rank}-of-{world_size}/*"]
    # The natural form: the whole repo less page15 and the other ranks' tables, plus this rank's own.
    assert lane.stage_allow(repos[0], rank, 4) == []
    assert lane.stage_rank_patterns(repos[0], rank, 4) == ["engram/rank-%d-of-4/*" % rank]
    assert lane.stage_ignore(repos[0], rank, 4) == ["page15/"] + [
        "engram/rank-%d-of-4/*" % r for r in range(4) if r != rank]
