# -*- coding: utf-8 -*-
"""Stage role filters: the wave (in rank order, at most stage_nas_readers hosts; with fan-out rank 0 alone first)
in which each host reads the NAS, the peer of an earlier wave it takes proven blobs from, a repo's hub folder, and
the space all repos of a host need together on its one local disk (each hf_hub_mirror result measures one repo).
"""
import os
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


def _whole(value, what, least):
    try:
        number = None if isinstance(value, bool) else int(str(value).strip())
    except (TypeError, ValueError):
        number = None
    if number is None or number < least:
        raise AnsibleFilterError("%s must be a whole number of at least %d, got %r" % (what, least, value))
    return number


def readers_of(readers, world_size):
    """stage_nas_readers as a number of hosts: empty, None, 0 or more than the lane mean the whole lane."""
    world_size = _whole(world_size, "the lane's size (lane_world_size)", 1)
    if readers is None or str(readers).strip() == "":
        return world_size
    return min(_whole(readers, "stage_nas_readers (hosts of the lane reading the NAS at once; 0: all)", 0),
               world_size) or world_size


def stage_wave(rank, world_size, readers, fanout):
    rank = _whole(rank, "the rank (lane_rank)", 0)
    world_size = _whole(world_size, "the lane's size (lane_world_size)", 1)
    if rank >= world_size:
        raise AnsibleFilterError("rank %d is not in a lane of %d hosts" % (rank, world_size))
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


class FilterModule(object):
    def filters(self):
        return {"dgx_stage_wave": stage_wave, "dgx_stage_wave_count": stage_wave_count,
                "dgx_stage_peer": stage_peer, "dgx_stage_repo_folder": stage_repo_folder,
                "dgx_stage_space_total": stage_space_total}
