# -*- coding: utf-8 -*-
"""Stage role filter: the space all repos of a host need together on its one local disk (preflight).

hf_hub_mirror measures each repo alone, and repos that each fit may not fit together: needs and reclaimable bytes
add up, free and reserve are the disk's (the first repo's).
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
from ansible.module_utils.dgx_units import human_bytes  # noqa: E402


def _whole(space, key):
    try:
        return int(space[key])
    except (KeyError, TypeError, ValueError):
        raise AnsibleFilterError("dgx_stage_space_total: a repo's space figures lack a whole %r: %r" % (key, space))


def stage_space_total(results):
    if not isinstance(results, (list, tuple)) or not results:
        raise AnsibleFilterError("dgx_stage_space_total: needs the hf_hub_mirror results of at least one repo, "
                                 "got %r" % (results,))
    spaces = [result.get("space") if isinstance(result, dict) else None for result in results]
    for result, space in zip(results, spaces):
        if not isinstance(space, dict):
            raise AnsibleFilterError("dgx_stage_space_total: a result without its space figures: %r" % (result,))
    need = sum(_whole(space, "need") for space in spaces)
    reclaimable = sum(_whole(space, "reclaimable") for space in spaces)
    free, reserve = _whole(spaces[0], "free"), _whole(spaces[0], "reserve")
    available = free + reclaimable - reserve
    return {"need": need, "reclaimable": reclaimable, "free": free, "reserve": reserve, "available": available,
            "fits": need <= available, "need_text": human_bytes(need), "available_text": human_bytes(available)}


class FilterModule(object):
    def filters(self):
        return {"dgx_stage_space_total": stage_space_total}
