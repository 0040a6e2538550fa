"""The stage role's wave filters (roles/stage/filter_plugins/stage_lane.py): which hosts of the lane read the
NAS together (stage_nas_readers, in rank order), rank 0 alone first with fan-out, the peer each later host takes
proven blobs from, and where a repo's candidates go."""
import re

import pytest
from ansible.errors import AnsibleFilterError
from pluginfile import load_filter

HOSTS = ["dgx1", "dgx2", "dgx3", "dgx4"]


waves = load_filter("stage", "stage_lane")


def lane_waves(world_size, readers, fanout):
    return [waves.stage_wave(rank, world_size, readers, fanout) for rank in range(world_size)]


def test_the_filters_are_registered_under_their_names():
    assert set(waves.FilterModule().filters()) >= {
        "dgx_stage_wave", "dgx_stage_wave_count", "dgx_stage_peer", "dgx_stage_repo_folder"}


@pytest.mark.parametrize("readers", [0, "0", "", None, 4, 9])
def test_all_hosts_read_at_once_by_default_and_when_readers_cover_the_lane(readers):
    assert lane_waves(4, readers, False) == [0, 0, 0, 0]
    assert waves.stage_wave_count(4, readers, False) == 1


def test_readers_bound_each_wave_in_rank_order():
    assert lane_waves(4, 2, False) == [0, 0, 1, 1]
    assert lane_waves(5, 2, False) == [0, 0, 1, 1, 2]
    assert lane_waves(4, 1, False) == [0, 1, 2, 3]
    assert waves.stage_wave_count(5, 2, False) == 3


def test_with_fanout_rank_0_reads_alone_first_then_the_others_in_waves_of_readers():
    assert lane_waves(4, 0, True) == [0, 1, 1, 1]
    assert lane_waves(4, 2, True) == [0, 1, 1, 2]
    assert lane_waves(1, 0, True) == [0]
    assert waves.stage_wave_count(4, 2, True) == 3
    assert waves.stage_wave_count(4, 0, True) == 2


@pytest.mark.parametrize("readers", [-1, "two", True, 1.5, [2]])
def test_a_bad_reader_count_is_refused_naming_the_variable_and_the_value(readers):
    with pytest.raises(AnsibleFilterError, match=r"stage_nas_readers .*got %s" % re.escape(repr(readers))):
        waves.stage_wave(0, 4, readers, False)


def test_a_rank_outside_the_lane_is_refused():
    with pytest.raises(AnsibleFilterError, match="rank 4 is not in a lane of 4"):
        waves.stage_wave(4, 4, 0, False)


def test_no_peer_without_fanout_or_in_the_first_wave():
    assert waves.stage_peer(2, HOSTS, HOSTS, 2, False) == ""
    assert waves.stage_peer(0, HOSTS, HOSTS, 2, True) == ""


def test_later_hosts_take_from_hosts_of_earlier_waves_spread_over_them():
    # waves with readers 2 and fan-out: [dgx1], [dgx2, dgx3], [dgx4]
    assert waves.stage_peer(1, HOSTS, HOSTS, 2, True) == "dgx1"
    assert waves.stage_peer(2, HOSTS, HOSTS, 2, True) == "dgx1"
    assert waves.stage_peer(3, HOSTS, HOSTS, 2, True) in ("dgx1", "dgx2", "dgx3")
    peers = set(waves.stage_peer(rank, HOSTS * 1, HOSTS, 0, True) for rank in (1, 2, 3))
    assert peers == {"dgx1"}


def test_a_failed_or_unreachable_peer_is_not_chosen_and_none_left_means_the_nas():
    # dgx1 left the play (failed, unreachable or outside --limit): the wave-2 host takes from a wave-1 host.
    assert waves.stage_peer(3, HOSTS, ["dgx2", "dgx3", "dgx4"], 2, True) in ("dgx2", "dgx3")
    assert waves.stage_peer(1, HOSTS, ["dgx2", "dgx3", "dgx4"], 2, True) == ""


@pytest.mark.parametrize("repo", [{"repo_id": "../x"}, {"repo_id": "a/b/c"}, {"repo_id": ""}, {},
                                  {"repo_id": "org/a", "repo_type": "bucket"}, "org/a"])
def test_a_repo_folder_that_could_leave_the_hub_is_refused(repo):
    with pytest.raises(AnsibleFilterError, match=r"^stage_repos entry .*(expected 'org/name'|unknown repo_type)"):
        waves.stage_repo_folder(repo)
