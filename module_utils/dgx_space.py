"""Disk space: size texts, the reserve to keep, and the refusal of a plan the local disk cannot hold.
"""
import os
import re

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_units import human_bytes


SIZE_SUFFIXES = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def parse_size(value):
    """Bytes from 12345, '12345', '10G', '1.5T' (binary units)."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", str(value), re.IGNORECASE)
    if not match:
        raise StageError("cannot read %r as a size: use bytes, a K/M/G/T suffix, or N%%" % (value,))
    return int(float(match.group(1)) * SIZE_SUFFIXES[match.group(2).upper()])


def parse_reserve(value, disk_total):
    """The free space to keep, from bytes/size text or 'N%' of the disk."""
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise StageError("cannot read reserve %r: use bytes or N%%" % (value,))
        if not 0 <= percent < 100:
            raise StageError("reserve %r must be between 0%% and 100%%" % (value,))
        return int(disk_total * percent / 100)
    return parse_size(text)


def disk_space(path):
    """(free bytes for unprivileged writers, total bytes) of the filesystem holding path."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def existing_ancestor(path):
    """path itself or its nearest existing parent: where free space is measured."""
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def space_figures(plan, req):
    """The free-space figures of a plan (the module's `space`): free, reserve, need, reclaimable."""
    free, total = disk_space(existing_ancestor(req.dest))
    # need: file bytes; block rounding and metadata are what stage_reserve is for
    # Candidates in peer_dir are already on this disk and removed once copied (or rejected): see count_candidates.
    return {"free": free, "reserve": parse_reserve(req.reserve, total),
            "need": plan.write_bytes - plan.peer_bytes + plan.peer_peak,
            "reclaimable": plan.freed_bytes, "peers": plan.peer_bytes, "peers_peak": plan.peer_peak}


def check_space(plan, req):
    """Refuse, before anything is written, a plan that would leave less than `reserve` free."""
    space = space_figures(plan, req)
    free, reserve, need = space["free"], space["reserve"], space["need"]
    available = free + plan.freed_bytes - reserve
    if need > available:
        raise StageError(
            "not enough space on %s to stage %s@%s: need %d bytes (%s) to copy, available %d bytes (%s) "
            "= free %s + reclaimable %s - reserve %s. Free space on the disk, narrow allow_patterns/"
            "ignore_patterns, or lower stage_reserve; nothing was written"
            % (req.dest, req.repo_id, plan.commit[:12], need, human_bytes(need), max(available, 0),
               human_bytes(max(available, 0)), human_bytes(free), human_bytes(plan.freed_bytes),
               human_bytes(reserve)))
    return space
