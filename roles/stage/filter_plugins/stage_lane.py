# -*- coding: utf-8 -*-
"""Stage role filters. Which files of a stage_repos entry this rank stages: rank files (what any rank's
rank_patterns select) partition the repo; a host stages allow_patterns plus its own, and ignores the other ranks'
(bound read-only from the NAS). rank_patterns is a list of templates (`{rank}` required, `{world_size}`, at most
an integer width) or a map rank -> patterns with a key for every rank of the lane (keys past it skipped).
How fast a pass may read (stage_live). The wave (in rank order, at most stage_nas_readers hosts; with fan-out rank 0 alone first) in which each host reads
the NAS, the peer of an earlier wave it takes proven blobs from, a repo's hub folder, and the space all repos of a
host need together on its one local disk (each hf_hub_mirror result measures one repo).
"""
import os
import re
import string
import sys

from ansible.errors import AnsibleFilterError

# This checkout's front-end package, whether or not the Python running Ansible has it installed.
_CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)
from dgx_stage import use_module_utils  # noqa: E402

use_module_utils()   # Ansible puts module_utils/ on the import path of modules only
from ansible.module_utils.dgx_errors import StageError  # noqa: E402
from ansible.module_utils.dgx_hubcache import repo_folder_name  # noqa: E402
from ansible.module_utils.dgx_units import human_bytes  # noqa: E402

PLACEHOLDERS = ("rank", "world_size")
# A placeholder's spec: none, `d`, or a width with an optional zero pad; others name files no rank layout uses.
INTEGER_SPEC = re.compile(r"(0?([0-9]+))?d?\Z")
# The widest pad: any lane's ranks fit, and a huge width would build a pattern that long on every rank.
MAX_WIDTH = 6


def _repo_name(repo):
    return repo.get("repo_id", "<no repo_id>") if isinstance(repo, dict) else repr(repo)


def _pattern_list(value, repo_name, where):
    """A list of text patterns (a single text is refused: it would be read as one pattern per character)."""
    if not isinstance(value, (list, tuple)):
        raise AnsibleFilterError("stage_repos entry %s: %s must be a list of patterns, got %s %r"
                                 % (repo_name, where, type(value).__name__, value))
    for pattern in value:
        if not isinstance(pattern, str):
            raise AnsibleFilterError("stage_repos entry %s: %s holds %r, which is not a text pattern"
                                     % (repo_name, where, pattern))
    return list(value)


def expand_template(template, rank, world_size, repo_name="<repo>"):
    """One rank template with `{rank}` / `{world_size}` replaced; anything else in braces, a spec other than an
    integer width, or no `{rank}` is refused."""
    where = "stage_repos entry %s: rank_patterns template %r" % (repo_name, template)
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise AnsibleFilterError("%s is malformed (%s); use {rank} and {world_size}, each brace in a pair"
                                 % (where, exc))
    out = []
    for literal, field, spec, conversion in fields:
        out.append(literal)
        if field is None:
            continue
        if field not in PLACEHOLDERS or conversion is not None:
            shown = "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            raise AnsibleFilterError("%s has the unknown placeholder %s; only {rank} and {world_size} are known"
                                     % (where, shown))
        integer = INTEGER_SPEC.match(spec)
        if not integer:
            raise AnsibleFilterError("%s has the format spec %r for {%s}; only an integer width is allowed: {%s}, "
                                     "{%s:d}, {%s:02d}" % (where, spec, field, field, field, field))
        if int(integer.group(2) or 0) > MAX_WIDTH:
            raise AnsibleFilterError("%s pads {%s} to a width of %s; at most %d is allowed, e.g. {%s:02d}"
                                     % (where, field, integer.group(2), MAX_WIDTH, field))
        out.append(format({"rank": rank, "world_size": world_size}[field], spec))
    if "rank" not in [field for _literal, field, _spec, _conversion in fields]:
        raise AnsibleFilterError("%s has no {rank}, so every rank would stage the same files; move it to "
                                 "allow_patterns, or add {rank}" % where)
    return "".join(out)


def _map_table(rank_patterns, world_size, repo_name):
    """The map form as {rank: patterns} for this lane's ranks: a forgotten key would leave a rank reading its
    part from the NAS, so every rank needs one; keys past the lane are skipped (one map serves lane sizes)."""
    table = {}
    for key, patterns in rank_patterns.items():
        text = str(key).strip() if isinstance(key, (int, str)) and not isinstance(key, bool) else ""
        if not re.match(r"^[0-9]+$", text):
            raise AnsibleFilterError(
                "stage_repos entry %s: rank_patterns has the key %r, which is not a rank number (0, 1, ...): "
                "a typo here would leave that rank with nothing of its own; a list of templates with {rank} "
                "and {world_size} fits any lane size" % (repo_name, key))
        patterns = _pattern_list(patterns, repo_name, "rank_patterns[%r]" % (key,))
        if int(text) < world_size:
            table.setdefault(int(text), []).extend(patterns)
    missing = [r for r in range(world_size) if r not in table]
    if missing:
        raise AnsibleFilterError(
            "stage_repos entry %s: rank_patterns has no key for rank %s of this lane of %d hosts, so %s would stage "
            "no files of %s own; add the key with its patterns, or an explicit empty list (%s: []) for a rank "
            "that has none" % (repo_name, ", ".join(str(r) for r in missing), world_size,
                               "that rank" if len(missing) == 1 else "those ranks",
                               "its" if len(missing) == 1 else "their", missing[0]))
    return table


def _refuse_shared_patterns(table, repo_name):
    """Rank files partition the repo: one pattern given to two ranks would be ignored on both hosts."""
    owner = {}
    for rank in sorted(table):
        for pattern in table[rank]:
            if owner.setdefault(pattern, rank) != rank:
                raise AnsibleFilterError(
                    "stage_repos entry %s: rank_patterns gives the pattern %r to rank %d and rank %d; rank files "
                    "partition the repo, so neither would stage its files: a file every rank stages belongs in "
                    "allow_patterns" % (repo_name, pattern, owner[pattern], rank))


def _unique(patterns):
    return list(dict.fromkeys(patterns))


def _entry_parts(repo, rank, world_size, caller):
    """(allow_patterns, the rank's own patterns, the other ranks' patterns) of one stage_repos entry, every
    part checked."""
    if not isinstance(repo, dict):
        raise AnsibleFilterError("%s: a stage_repos entry must be a dict, got %r" % (caller, repo))
    repo_name = _repo_name(repo)
    rank, world_size = _lane_rank(rank, world_size, caller + ": ")
    allow = repo.get("allow_patterns")
    allow = [] if allow is None else _pattern_list(allow, repo_name, "allow_patterns")
    rank_patterns = repo.get("rank_patterns")
    if rank_patterns is None:
        return allow, [], []
    if isinstance(rank_patterns, dict):
        table = _map_table(rank_patterns, world_size, repo_name)
    elif isinstance(rank_patterns, (list, tuple)):
        templates = _pattern_list(rank_patterns, repo_name, "rank_patterns")
        table = dict((r, [expand_template(t, r, world_size, repo_name) for t in templates]) for r in range(world_size))
    else:
        raise AnsibleFilterError(
            "stage_repos entry %s: rank_patterns must be a list of templates with {rank} and {world_size} "
            "(engram/rank-{rank}-of-{world_size}/*) or a map rank -> patterns, got %s %r"
            % (repo_name, type(rank_patterns).__name__, rank_patterns))
    table = dict((r, _unique(patterns)) for r, patterns in table.items())
    _refuse_shared_patterns(table, repo_name)
    others = [p for r in range(world_size) if r != rank for p in table[r]]
    return allow, table[rank], others


def stage_allow(repo, rank, world_size):
    """allow_patterns, then the rank's own patterns, duplicates dropped ([] without allow_patterns)."""
    allow, own, _others = _entry_parts(repo, rank, world_size, "dgx_stage_allow")
    return _unique(allow + own) if allow else []


def stage_ignore(repo, rank, world_size):
    """ignore_patterns, then every other rank's patterns, duplicates dropped."""
    _allow, _own, others = _entry_parts(repo, rank, world_size, "dgx_stage_ignore")
    ignore = repo.get("ignore_patterns")
    ignore = [] if ignore is None else _pattern_list(ignore, _repo_name(repo), "ignore_patterns")
    return _unique(ignore + others)


def stage_rank_patterns(repo, rank, world_size):
    """The rank's own patterns, for require_match: a layout the snapshot lacks fails preflight."""
    return _entry_parts(repo, rank, world_size, "dgx_stage_rank_patterns")[1]


def stage_other_rank_patterns(repo, rank, world_size):
    """The other ranks' patterns, for other_rank_patterns: a file both select is refused there."""
    return _entry_parts(repo, rank, world_size, "dgx_stage_other_rank_patterns")[2]


def _whole(value, what, least):
    try:
        number = None if isinstance(value, bool) else int(str(value).strip())
    except (TypeError, ValueError):
        number = None
    if number is None or number < least:
        raise AnsibleFilterError("%s must be a whole number of at least %d, got %r" % (what, least, value))
    return number


def _lane_rank(rank, world_size, prefix=""):
    """(rank, world size) as whole numbers, the rank one of the lane's."""
    rank = _whole(rank, prefix + "the rank (lane_rank)", 0)
    world_size = _whole(world_size, prefix + "the lane's size (lane_world_size)", 1)
    if rank >= world_size:
        raise AnsibleFilterError("%srank %d is not in a lane of %d hosts" % (prefix, rank, world_size))
    return rank, world_size


def readers_of(readers, world_size):
    """stage_nas_readers as a number of hosts: empty, None, 0 or more than the lane mean the whole lane."""
    world_size = _whole(world_size, "the lane's size (lane_world_size)", 1)
    if readers is None or str(readers).strip() == "":
        return world_size
    return min(_whole(readers, "stage_nas_readers (hosts of the lane reading the NAS at once; 0: all)", 0),
               world_size) or world_size


def stage_wave(rank, world_size, readers, fanout):
    rank, world_size = _lane_rank(rank, world_size)
    readers = readers_of(readers, world_size)
    if not fanout:
        return rank // readers
    return 0 if rank == 0 else 1 + (rank - 1) // readers


def stage_wave_count(world_size, readers, fanout):
    world_size = _whole(world_size, "the lane's size (lane_world_size)", 1)
    return stage_wave(world_size - 1, world_size, readers, fanout) + 1


def stage_peer(rank, lane_hosts, live_hosts, readers, fanout):
    """A live host of an earlier wave, a wave's hosts spread over them; '' without fan-out or such a host."""
    if not fanout:
        return ""
    lane_hosts = list(lane_hosts)
    world_size = len(lane_hosts)
    wave = stage_wave(rank, world_size, readers, fanout)
    live = set(live_hosts)
    earlier = [host for index, host in enumerate(lane_hosts)
               if stage_wave(index, world_size, readers, fanout) < wave and host in live]
    if not earlier:
        return ""
    first_of_wave = min(index for index in range(world_size)
                        if stage_wave(index, world_size, readers, fanout) == wave)
    return earlier[(int(rank) - first_of_wave) % len(earlier)]


def stage_peer_sharers(rank, lane_hosts, live_hosts, readers, fanout):
    """How many hosts of this host's wave take blobs from its peer at once (at least 1): the peer's reads for them
    share its read cap."""
    peer = stage_peer(rank, lane_hosts, live_hosts, readers, fanout)
    if not peer:
        return 1
    lane_hosts = list(lane_hosts)
    wave = stage_wave(rank, len(lane_hosts), readers, fanout)
    live = set(live_hosts)
    return max(1, sum(1 for index, host in enumerate(lane_hosts)
                      if host in live and stage_wave(index, len(lane_hosts), readers, fanout) == wave
                      and stage_peer(index, lane_hosts, live_hosts, readers, fanout) == peer))


def stage_repo_folder(repo):
    """The repo's folder: <type>s--org--name; a repo_id that could leave the hub root is refused."""
    repo = repo if isinstance(repo, dict) else {}
    try:
        return repo_folder_name(repo.get("repo_id") or "", repo.get("repo_type") or "model")
    except StageError as exc:
        raise AnsibleFilterError("stage_repos entry %r: %s" % (repo, exc))


def stage_space_total(results):
    """Needs and reclaimable bytes add up; free and reserve are the disk's (the first repo's)."""
    if not isinstance(results, (list, tuple)) or not results:
        raise AnsibleFilterError("dgx_stage_space_total: needs the hf_hub_mirror results of at least one repo, "
                                 "got %r" % (results,))
    spaces = [result.get("space") if isinstance(result, dict) else None for result in results]
    for result, space in zip(results, spaces):
        if not isinstance(space, dict):
            raise AnsibleFilterError("dgx_stage_space_total: a result without its space figures: %r" % (result,))
    total = dict((key, sum(_whole(space.get(key), "dgx_stage_space_total: %r of %r" % (key, space), 0)
                           for space in spaces)) for key in ("need", "reclaimable"))
    for key in ("free", "reserve"):
        total[key] = _whole(spaces[0].get(key), "dgx_stage_space_total: %r of %r" % (key, spaces[0]), 0)
    total["available"] = total["free"] + total["reclaimable"] - total["reserve"]
    total.update(fits=total["need"] <= total["available"], need_text=human_bytes(total["need"]),
                 available_text=human_bytes(total["available"]))
    return total


def stage_read_limits(max_mib_s, io_priority, live=False, live_max_mib_s=0, live_io_priority="idle"):
    """{max_mib_s, io_priority} of this host's stage and verify passes and peer copies: with stage_live
    (dgx-stage --live) the stage_live_* values, and a live stage without a cap is refused."""
    if not live:
        return {"max_mib_s": _whole(max_mib_s, "stage_max_mib_s", 0), "io_priority": str(io_priority)}
    cap = _whole(live_max_mib_s, "stage_live_max_mib_s", 0)
    if not cap:
        raise AnsibleFilterError(
            "stage_live (dgx-stage --live) stages beside a serving engine, but stage_live_max_mib_s is 0, which "
            "would read the NAS and the local disk uncapped: set stage_live_max_mib_s in the inventory (e.g. a "
            "quarter of this node's measured stage rate, `make bench`). Nothing was written")
    return {"max_mib_s": cap, "io_priority": str(live_io_priority)}


class FilterModule(object):
    def filters(self):
        return {"dgx_stage_allow": stage_allow, "dgx_stage_ignore": stage_ignore,
                "dgx_stage_rank_patterns": stage_rank_patterns,
                "dgx_stage_other_rank_patterns": stage_other_rank_patterns, "dgx_stage_wave": stage_wave,
                "dgx_stage_wave_count": stage_wave_count, "dgx_stage_peer": stage_peer,
                "dgx_stage_repo_folder": stage_repo_folder, "dgx_stage_space_total": stage_space_total,
                "dgx_stage_read_limits": stage_read_limits, "dgx_stage_peer_sharers": stage_peer_sharers}
