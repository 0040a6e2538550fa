"""The stage role's space filter (roles/stage/filter_plugins/stage_lane.py): what all repos of a host need
together on its one local disk, from the preflight pass's hf_hub_mirror results (each repo measured alone,
tests/unit/test_mirror.py's space tests)."""

import pytest
from ansible.errors import AnsibleFilterError
from pluginfile import load_filter

MIB = 1024 * 1024
GIB = 1024 * MIB
space = load_filter("stage", "stage_lane")


def result(need, free, reserve=0, reclaimable=0):
    """One repo's preflight result, as hf_hub_mirror measures it alone against the disk."""
    return {"item": {"repo_id": "org/x"}, "changed": False,
            "space": {"need": need, "free": free, "reserve": reserve, "reclaimable": reclaimable, "peers": 0}}


def test_the_filter_is_registered_under_its_name():
    assert space.FilterModule().filters()["dgx_stage_space_total"] is space.stage_space_total


def test_repos_that_each_fit_alone_do_not_fit_together():
    """The disk has room for the bigger repo and half the smaller one, beyond the reserve: each fits alone."""
    big, small, reserve = 48 * MIB, 8 * MIB, 2 * MIB
    free = reserve + big + small // 2
    results = [result(big, free, reserve), result(small, free, reserve)]
    assert all(r["space"]["need"] <= free - reserve for r in results)
    total = space.stage_space_total(results)
    assert total == {"need": big + small, "reclaimable": 0, "free": free, "reserve": reserve,
                     "available": big + small // 2, "fits": False, "need_text": "56.0 MiB",
                     "available_text": "52.0 MiB"}


def test_what_pruning_frees_counts_for_every_repo_and_an_exact_fit_fits():
    need, reserve = [30 * MIB, 20 * MIB], 1 * MIB
    reclaimable = [4 * MIB, 6 * MIB]
    free = reserve + sum(need) - sum(reclaimable)          # exactly enough, with what pruning frees
    total = space.stage_space_total([result(n, free, reserve, r) for n, r in zip(need, reclaimable)])
    assert (total["need"], total["reclaimable"], total["available"], total["fits"]) == (
        50 * MIB, 10 * MIB, 50 * MIB, True)
    one_byte_short = space.stage_space_total([result(n, free - 1, reserve, r) for n, r in zip(need, reclaimable)])
    assert (one_byte_short["available"], one_byte_short["fits"]) == (50 * MIB - 1, False)


def test_free_and_reserve_are_the_disks_once_not_per_repo():
    total = space.stage_space_total([result(1, 100, 10), result(1, 90, 10), result(1, 80, 10)])
    assert (total["free"], total["reserve"], total["available"], total["need"]) == (100, 10, 90, 3)


def test_a_reserve_past_the_free_space_leaves_a_negative_room():
    total = space.stage_space_total([result(0, 10 * MIB, 12 * MIB)])
    assert (total["available"], total["fits"]) == (-2 * MIB, False)


@pytest.mark.parametrize("results", [[], None, [{"item": {}}], [{"space": {"need": 1, "free": 2}}],
                                     [{"space": {"need": "x", "free": 2, "reserve": 0, "reclaimable": 0}}]])
def test_results_without_their_space_figures_are_refused(results):
    with pytest.raises(AnsibleFilterError, match="dgx_stage_space_total"):
        space.stage_space_total(results)
