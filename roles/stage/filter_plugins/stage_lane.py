# -*- coding: utf-8 -*-
"""Stage role filters: which files of a stage_repos entry this rank stages. Rank files (what any rank's
rank_patterns select) partition the repo: a host stages allow_patterns plus its own, and ignores the other ranks'
(bound read-only from the NAS). rank_patterns is a list of templates (`{rank}` required, `{world_size}`, at most
an integer width) or a map rank -> patterns with a key for every rank of the lane (keys past it skipped).
"""

import re
import string

from ansible.errors import AnsibleFilterError

PLACEHOLDERS = ("rank", "world_size")
# A placeholder's spec: none, `d`, or a width with an optional zero pad; others name files no rank layout uses.
INTEGER_SPEC = re.compile(r"(0?([0-9]+))?d?\Z")
# The widest pad: any lane's ranks fit, and a huge width would build a pattern that long on every rank.
MAX_WIDTH = 6


def _repo_name(repo):
    return repo.get("repo_id", "<no repo_id>") if isinstance(repo, dict) else repr(repo)


def _as_int(value, what, caller):
    try:
        if not isinstance(value, bool):
            return int(value)
    except (TypeError, ValueError):
        pass
    raise AnsibleFilterError("%s: %s must be an integer, got %r" % (caller, what, value))


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
    values = {"rank": rank, "world_size": world_size}
    out = []
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise AnsibleFilterError("stage_repos entry %s: rank_patterns template %r is malformed (%s); use "
                                 "{rank} and {world_size}, each brace in a pair"
                                 % (repo_name, template, exc))
    has_rank = False
    for literal, field, spec, conversion in fields:
        out.append(literal)
        if field is None:
            continue
        if field not in PLACEHOLDERS or conversion is not None:
            shown = "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            raise AnsibleFilterError("stage_repos entry %s: rank_patterns template %r has the unknown "
                                     "placeholder %s; only {rank} and {world_size} are known"
                                     % (repo_name, template, shown))
        integer = INTEGER_SPEC.match(spec)
        if not integer:
            raise AnsibleFilterError("stage_repos entry %s: rank_patterns template %r has the format spec %r "
                                     "for {%s}; only an integer width is allowed: {%s}, {%s:d}, {%s:02d}"
                                     % (repo_name, template, spec, field, field, field, field))
        if int(integer.group(2) or 0) > MAX_WIDTH:
            raise AnsibleFilterError("stage_repos entry %s: rank_patterns template %r pads {%s} to a width of %s; "
                                     "at most %d is allowed, e.g. {%s:02d}"
                                     % (repo_name, template, field, integer.group(2), MAX_WIDTH, field))
        has_rank = has_rank or field == "rank"
        out.append(format(values[field], spec))
    if not has_rank:
        raise AnsibleFilterError("stage_repos entry %s: rank_patterns template %r has no {rank}, so every rank "
                                 "would stage the same files; move it to allow_patterns, or add {rank}"
                                 % (repo_name, template))
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
    rank = _as_int(rank, "the rank (lane_rank)", caller)
    world_size = _as_int(world_size, "the world size (lane_world_size)", caller)
    if world_size < 1 or not 0 <= rank < world_size:
        raise AnsibleFilterError("%s: rank %d is not in a lane of %d hosts" % (caller, rank, world_size))
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


class FilterModule(object):
    def filters(self):
        return {"dgx_stage_allow": stage_allow, "dgx_stage_ignore": stage_ignore,
                "dgx_stage_rank_patterns": stage_rank_patterns,
                "dgx_stage_other_rank_patterns": stage_other_rank_patterns}
