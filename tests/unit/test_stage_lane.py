"""The stage role's rank filter (roles/stage/filter_plugins/stage_lane.py): the allow patterns of a
stage_repos entry on one rank of the lane - rank templates with {rank} / {world_size}, the older map
rank -> patterns, and the errors that name the repo and the pattern."""

import pytest
from ansible.errors import AnsibleFilterError
from pluginfile import load_filter

lane = load_filter("stage", "stage_lane")
REPO = "deepseek-ai/DeepSeek-V4-Flash"
TEMPLATES = ["engram/rank-{rank}-of-{world_size}/*", "engram/meta-{rank}-{world_size}.json"]


def entry(**extra):
    return dict({"repo_id": REPO, "allow_patterns": ["*.json", "*.py"]}, **extra)


def test_the_filters_are_registered_under_their_documented_names():
    filters = lane.FilterModule().filters()
    assert filters["dgx_stage_allow"] is lane.stage_allow
    assert filters["dgx_stage_rank_patterns"] is lane.stage_rank_patterns


@pytest.mark.parametrize("rank,world_size", [(0, 2), (1, 2), (3, 4)])
def test_templates_expand_both_placeholders_per_rank_after_the_common_patterns(rank, world_size):
    assert lane.stage_allow(entry(rank_patterns=TEMPLATES), rank, world_size) == [
        "*.json", "*.py", "engram/rank-%d-of-%d/*" % (rank, world_size), "engram/meta-%d-%d.json" % (rank, world_size)]


def test_rank_and_world_size_as_text_as_set_fact_may_leave_them():
    assert lane.stage_allow(entry(rank_patterns=TEMPLATES), "1", "4")[2] == "engram/rank-1-of-4/*"


def test_a_format_spec_pads_the_rank():
    assert lane.stage_allow(entry(rank_patterns=["part-{rank:02d}-{world_size:03d}/*"]), 3, 4)[-1] == \
        "part-03-004/*"


def test_no_rank_patterns_gives_the_common_patterns_and_none_at_all_the_whole_repo():
    assert lane.stage_allow(entry(), 0, 4) == ["*.json", "*.py"]
    assert lane.stage_allow(entry(rank_patterns=None), 0, 4) == ["*.json", "*.py"]
    assert lane.stage_allow({"repo_id": REPO}, 2, 4) == []


def test_rank_files_partition_the_repo_without_allow_patterns():
    """Written the natural way (no allow_patterns): the whole repo, less the other ranks' files - never only
    this rank's files (the shared config, index and dense shard would then come from the NAS)."""
    repo = {"repo_id": REPO, "ignore_patterns": ["page15/"], "rank_patterns": TEMPLATES[:1]}
    assert lane.stage_allow(repo, 1, 4) == []
    assert lane.stage_ignore(repo, 1, 4) == ["page15/", "engram/rank-0-of-4/*", "engram/rank-2-of-4/*",
                                             "engram/rank-3-of-4/*"]
    assert lane.stage_rank_patterns(repo, 1, 4) == ["engram/rank-1-of-4/*"]
    # With allow_patterns the other ranks' files are ignored too: the same partition.
    assert lane.stage_ignore(dict(repo, allow_patterns=["engram/*"]), 0, 2) == ["page15/", "engram/rank-1-of-2/*"]
    # The map form: every other key within the lane.
    assert lane.stage_ignore({"repo_id": REPO, "rank_patterns": {0: ["a/*"], 1: ["b/*"], 7: ["z/*"]}}, 0, 2) == \
        ["b/*"]
    assert lane.stage_ignore({"repo_id": REPO}, 0, 2) == []


def test_rank_files_chosen_by_the_filters_are_what_huggingface_hub_selects():
    from huggingface_hub.utils import filter_repo_objects

    files = ["config.json", "model.safetensors.index.json", "model-00001.safetensors", "engram/shared/s.bin",
             "page15/a.bin"] + ["engram/rank-%d-of-4/t.bin" % r for r in range(4)]
    repo = {"repo_id": REPO, "ignore_patterns": ["page15/"], "rank_patterns": TEMPLATES[:1]}
    for rank in range(4):
        allow = lane.stage_allow(repo, rank, 4) or None
        chosen = list(filter_repo_objects(files, allow_patterns=allow, ignore_patterns=lane.stage_ignore(repo, rank, 4)))
        assert chosen == files[:4] + ["engram/rank-%d-of-4/t.bin" % rank]


def test_duplicates_are_dropped_keeping_the_first_place():
    assert lane.stage_allow(entry(rank_patterns=["*.json{rank}", "r{rank}/*"]), 0, 1) == \
        ["*.json", "*.py", "*.json0", "r0/*"]
    assert lane.stage_allow(entry(rank_patterns={0: ["*.json", "r0/*"]}), 0, 1) == ["*.json", "*.py", "r0/*"]


@pytest.mark.parametrize("key0,key1", [(0, 1), ("0", "1")])
def test_the_map_form_keyed_by_rank_number_or_its_text_picks_the_rank_entry(key0, key1):
    repo = entry(rank_patterns={key0: ["model-00001.safetensors"], key1: ["model-00002.safetensors"]})
    assert lane.stage_allow(repo, 0, 2) == ["*.json", "*.py", "model-00001.safetensors"]
    assert lane.stage_allow(repo, 1, 2) == ["*.json", "*.py", "model-00002.safetensors"]


def test_the_map_form_is_taken_literally_not_expanded():
    repo = entry(rank_patterns={0: ["odd{name}.bin"], 1: []})
    assert lane.stage_allow(repo, 0, 2)[-1] == "odd{name}.bin"


def test_a_rank_the_map_gives_an_empty_list_gets_only_the_common_patterns():
    assert lane.stage_allow(entry(rank_patterns={0: ["a"], 1: []}), 1, 2) == ["*.json", "*.py"]


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_map_without_a_key_for_a_rank_of_the_lane_is_refused_naming_the_missing_ranks(rank):
    """A forgotten key would leave that rank serving its part from the NAS; an explicit [] says it has none."""
    message = _error(entry(rank_patterns={0: ["a"], 3: ["d"]}), rank, 3)
    assert REPO in message and "no key for rank 1, 2 of this lane of 3 hosts" in message, message
    assert "(1: [])" in message, message


def test_one_pattern_given_to_two_ranks_is_refused_naming_both():
    """Rank files partition the repo: each rank ignores the other's pattern, so neither would stage its files."""
    message = _error(entry(rank_patterns={0: ["engram/t.bin", "a"], 1: ["b", "engram/t.bin"]}), 1, 2)
    assert REPO in message and "'engram/t.bin' to rank 0 and rank 1" in message, message
    assert "allow_patterns" in message, message


def test_the_other_ranks_patterns_filter_gives_every_other_rank_s_patterns():
    assert lane.FilterModule().filters()["dgx_stage_other_rank_patterns"] is lane.stage_other_rank_patterns
    assert lane.stage_other_rank_patterns(entry(rank_patterns=TEMPLATES[:1]), 1, 3) == [
        "engram/rank-0-of-3/*", "engram/rank-2-of-3/*"]
    assert lane.stage_other_rank_patterns(entry(rank_patterns={0: ["a"], 1: [], 2: ["c"], 9: ["z"]}), 0, 3) == ["c"]
    assert lane.stage_other_rank_patterns(entry(), 0, 2) == []


def _error(repo, rank=0, world_size=2):
    with pytest.raises(AnsibleFilterError) as info:
        lane.stage_allow(repo, rank, world_size)
    return str(info.value)


@pytest.mark.parametrize("template,shown", [
    ("engram/rank-{foo}/*", "{foo}"),
    ("engram/rank-{}/*", "{}"),
    ("engram/rank-{0}/*", "{0}"),
    ("engram/rank-{rank!r}/*", "{rank!r}"),
    ("engram/rank-{rank.real}/*", "{rank.real}"),
])
def test_an_unknown_placeholder_is_refused_naming_repo_pattern_and_placeholder(template, shown):
    message = _error(entry(rank_patterns=["ok-{rank}", template]))
    assert REPO in message and repr(template) in message and shown in message and "unknown placeholder" in message


@pytest.mark.parametrize("template", ["engram/rank-{rank/*", "engram/rank-rank}/*", "engram/{rank}}/*"])
def test_an_unbalanced_brace_is_refused_naming_repo_and_pattern(template):
    message = _error(entry(rank_patterns=[template]))
    assert REPO in message and repr(template) in message and "malformed" in message


@pytest.mark.parametrize("template,expanded", [
    ("r{rank}/*", "r3/*"), ("r{rank:d}/*", "r3/*"), ("r{rank:02d}/*", "r03/*"), ("r{rank:3}/*", "r  3/*"),
    ("r{rank:03}-{world_size:d}/*", "r003-4/*"), ("r{rank:06d}/*", "r000003/*"),
])
def test_integer_format_specs_are_allowed(template, expanded):
    assert lane.stage_allow(entry(rank_patterns=[template]), 3, 4)[-1] == expanded


@pytest.mark.parametrize("spec", ["99999999d", "7", "010d", "0000000000000000000009"])
def test_a_width_past_six_is_refused_naming_the_template_before_anything_is_formatted(spec):
    """A width of millions would build a pattern of that many characters on every rank (or exhaust memory)."""
    template = "r{rank:%s}/*" % spec
    message = _error(entry(rank_patterns=[template]), 1, 2)
    assert REPO in message and repr(template) in message and "at most 6" in message, message


@pytest.mark.parametrize("spec", ["s", "x", "b", "o", "f", ".1f", "e", "%", ",d", "_d", "+d", " d", "<3d", ">03",
                                  "^3", "#x", "n", "c", "d{world_size}"])
def test_a_format_spec_other_than_an_integer_width_is_refused_on_every_rank(spec):
    """Some of these would format an int (hex, a sign, a fill): refused all the same, as only a width names a
    file layout, and a spec an int does not take must not fail on one rank only."""
    template = "r{rank:%s}/*" % spec
    for rank in (0, 1):
        message = _error(entry(rank_patterns=[template]), rank, 2)
        assert REPO in message and repr(template) in message and "format spec" in message, message
        assert "{rank:02d}" in message, message


@pytest.mark.parametrize("template", ["engram/shared/*", "engram/meta-{world_size}.json", "{{rank}}/*"])
def test_a_template_without_rank_is_refused_pointing_to_allow_patterns(template):
    """It would give every rank the same files: those are allow_patterns ({{rank}} is a literal brace)."""
    for rank in (0, 1):
        message = _error(entry(rank_patterns=["engram/rank-{rank}/*", template]), rank, 2)
        assert REPO in message and repr(template) in message and "allow_patterns" in message, message
        assert "no {rank}" in message, message


def test_the_map_form_needs_no_rank_placeholder():
    """The map's patterns are each rank's own already: taken literally, no placeholder required."""
    assert lane.stage_allow(entry(rank_patterns={0: [], 1: ["engram/shared-b.bin"]}), 1, 2)[-1] == \
        "engram/shared-b.bin"


@pytest.mark.parametrize("rank,world_size", [(0, 2), (1, 2), (3, 4)])
def test_rank_patterns_filter_gives_only_the_expanded_templates_of_the_rank(rank, world_size):
    assert lane.stage_rank_patterns(entry(rank_patterns=TEMPLATES), rank, world_size) == [
        "engram/rank-%d-of-%d/*" % (rank, world_size), "engram/meta-%d-%d.json" % (rank, world_size)]


def test_rank_patterns_filter_gives_the_map_entry_of_the_rank_deduplicated():
    repo = entry(rank_patterns={"0": ["a", "b", "a"], 1: ["c"], 5: ["d"]})
    assert lane.stage_rank_patterns(repo, 0, 2) == ["a", "b"]
    assert lane.stage_rank_patterns(repo, 1, 2) == ["c"]


def test_rank_patterns_filter_is_empty_without_a_rank_part():
    assert lane.stage_rank_patterns(entry(), 0, 2) == []
    assert lane.stage_rank_patterns(entry(rank_patterns=None), 1, 2) == []
    assert lane.stage_rank_patterns(entry(rank_patterns={0: ["a"], 1: []}), 1, 2) == []
    assert lane.stage_rank_patterns(entry(rank_patterns=[]), 1, 2) == []


def test_rank_patterns_filter_keeps_a_pattern_allow_patterns_also_has():
    """require_match still wants it matched: the rank's part is checked whatever else selects the files."""
    assert lane.stage_rank_patterns(entry(rank_patterns={0: ["*.json"]}), 0, 1) == ["*.json"]


@pytest.mark.parametrize("repo,named", [
    (entry(rank_patterns=["r{rank}/*", "shared/*"]), "no {rank}"),
    (entry(rank_patterns=["r{rank:x}/*"]), "format spec"),
    (entry(rank_patterns=["r{ranks}/*"]), "unknown placeholder"),
    (entry(rank_patterns={"one": ["a"]}), "not a rank number"),
    (entry(rank_patterns="r{rank}/*"), "list of templates"),
    ({"repo_id": REPO, "allow_patterns": "*.json"}, "allow_patterns"),
])
def test_rank_patterns_filter_refuses_what_the_allow_filter_refuses(repo, named):
    with pytest.raises(AnsibleFilterError) as info:
        lane.stage_rank_patterns(repo, 0, 2)
    assert REPO in str(info.value) and named in str(info.value)


@pytest.mark.parametrize("rank,world_size", [(2, 2), (-1, 2), (0, 0), ("x", 2), (True, 2)])
def test_rank_patterns_filter_refuses_a_rank_outside_its_lane_naming_itself(rank, world_size):
    with pytest.raises(AnsibleFilterError) as info:
        lane.stage_rank_patterns(entry(rank_patterns=TEMPLATES), rank, world_size)
    assert "dgx_stage_rank_patterns" in str(info.value)


@pytest.mark.parametrize("value", ["engram/rank-{rank}/*", 3, True])
def test_rank_patterns_neither_list_nor_map_is_refused(value):
    message = _error(entry(rank_patterns=value))
    assert REPO in message and "list of templates" in message and "map" in message and repr(value) in message


def test_a_non_text_template_is_refused():
    message = _error(entry(rank_patterns=["a", 7]))
    assert REPO in message and "7" in message


@pytest.mark.parametrize("key", [-1, "-1", "one", True, "\u00b2", "\u0661"])
def test_a_map_key_that_is_not_a_rank_number_is_refused_on_every_rank(key):
    repo = entry(rank_patterns={0: ["a"], key: ["b"]})
    for rank in (0, 1):
        message = _error(repo, rank, 2)
        assert REPO in message and repr(key) in message and "not a rank number" in message


@pytest.mark.parametrize("key", [2, "3"])
def test_a_map_written_for_a_larger_lane_serves_a_smaller_one(key):
    """The map form as it always worked: one stage_repos for the 4x and the 2x lane of the same nodes."""
    repo = entry(rank_patterns={0: ["a"], 1: ["b"], key: ["c"]})
    assert [lane.stage_allow(repo, rank, 2)[-1:] for rank in (0, 1)] == [["a"], ["b"]]
    assert "c" not in lane.stage_allow(repo, 0, 2) + lane.stage_allow(repo, 1, 2)


def test_a_map_value_that_is_not_a_list_is_refused():
    message = _error(entry(rank_patterns={0: "model-00001.safetensors"}))
    assert REPO in message and "rank_patterns[0]" in message


def test_allow_patterns_as_text_is_refused():
    assert "allow_patterns" in _error({"repo_id": REPO, "allow_patterns": "*.json"})


@pytest.mark.parametrize("rank,world_size", [(2, 2), (-1, 2), (0, 0), ("x", 2)])
def test_a_rank_outside_its_lane_is_refused(rank, world_size):
    with pytest.raises(AnsibleFilterError):
        lane.stage_allow(entry(rank_patterns=TEMPLATES), rank, world_size)


def test_a_live_stage_takes_the_live_values_and_is_refused_without_a_cap():
    assert lane.stage_read_limits(0, "normal") == {"max_mib_s": 0, "io_priority": "normal"}
    assert lane.stage_read_limits("250", "idle") == {"max_mib_s": 250, "io_priority": "idle"}
    assert lane.stage_read_limits(0, "normal", True, 400, "idle") == {"max_mib_s": 400, "io_priority": "idle"}
    with pytest.raises(AnsibleFilterError, match="stage_live_max_mib_s is 0.*set stage_live_max_mib_s in the "
                                                 "inventory.*Nothing was written"):
        lane.stage_read_limits(100, "normal", True, 0, "idle")
    for bad in (-1, 1.5, "fast", True):
        with pytest.raises(AnsibleFilterError, match="stage_max_mib_s must be a whole number of at least 0"):
            lane.stage_read_limits(bad, "normal")
    assert lane.FilterModule().filters()["dgx_stage_read_limits"] is lane.stage_read_limits


def test_the_hosts_a_peer_sends_to_at_once_share_its_read_cap():
    hosts = ["h%d" % i for i in range(8)]
    sharers = [lane.stage_peer_sharers(rank, hosts, hosts, 4, True) for rank in range(8)]
    assert sharers == [1, 4, 4, 4, 4, 1, 1, 1]       # the first wave after rank 0 all take from rank 0
    assert [lane.stage_peer_sharers(rank, hosts, hosts, 4, False) for rank in range(8)] == [1] * 8
    assert lane.stage_peer_sharers(1, hosts, [h for h in hosts if h != "h2"], 4, True) == 3   # h2 left the play
    assert lane.FilterModule().filters()["dgx_stage_peer_sharers"] is lane.stage_peer_sharers
