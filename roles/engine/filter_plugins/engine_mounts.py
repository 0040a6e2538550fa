# -*- coding: utf-8 -*-
"""Engine role filters: the container's binds (the manifest's, read-only, then the receipt bind), checked by
dgx_mountspec.mount_path_problem and shaped for community.docker `mounts` and containers.podman `mount`; the
container's environment; a case-sensitive digest of the mount specs (podman_container compares them lowercased).
"""
import hashlib
import os
import sys

from ansible.errors import AnsibleFilterError

# This checkout's front-end package, whether or not the Python running Ansible has it installed.
_CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)
from dgx_stage import use_module_utils  # noqa: E402

use_module_utils()   # Ansible puts module_utils/ on the import path of modules only
from ansible.module_utils.dgx_mountspec import mount_path_problem  # noqa: E402


def _checked(binds, what):
    """The binds as plain {source, target, read_only} dicts; AnsibleFilterError on the first bad one."""
    if not isinstance(binds, (list, tuple)):
        raise AnsibleFilterError("%s: expected a list of binds, got %s" % (what, type(binds).__name__))
    out = []
    for index, bind in enumerate(binds):
        if not isinstance(bind, dict):
            raise AnsibleFilterError("%s: bind %d is a %s, not a dict" % (what, index, type(bind).__name__))
        for key in ("source", "target"):
            problem = mount_path_problem(bind.get(key))
            if problem is not None:
                raise AnsibleFilterError("%s: bind %d refused, its %s %s" % (what, index, key, problem))
        read_only = bind.get("read_only", True)
        if not isinstance(read_only, bool):
            raise AnsibleFilterError("%s: bind %r has read_only %r, not a boolean"
                                     % (what, bind["target"], read_only))
        out.append({"source": str(bind["source"]), "target": str(bind["target"]), "read_only": read_only})
    return out


def dgx_binds(manifest_mounts, extra_binds=None):
    """The manifest's binds (read-only, whatever else the entries carry) followed by extra_binds."""
    manifest = _checked(manifest_mounts, "dgx_binds (manifest mounts)")
    for bind in manifest:
        bind["read_only"] = True
    return manifest + _checked(list(extra_binds or []), "dgx_binds (extra binds)")


def dgx_docker_mounts(binds):
    """community.docker docker_container `mounts` entries (API fields: no quoting needed)."""
    return [{"type": "bind", "source": b["source"], "target": b["target"], "read_only": b["read_only"]}
            for b in _checked(binds, "dgx_docker_mounts")]


def _csv_field(field):
    """One field of a --mount spec as Podman's Go encoding/csv reads it back unchanged (a comma, a quote or edge
    whitespace needs quoting)."""
    if any(c in field for c in ',"\r\n') or field != field.strip():
        return '"' + field.replace('"', '""') + '"'
    return field


def dgx_podman_mount_specs(binds):
    """containers.podman podman_container `mount` entries, one --mount spec per bind."""
    return [",".join(_csv_field(field) for field in ("type=bind", "source=" + b["source"], "destination=" + b["target"],
                                                     "ro=true" if b["read_only"] else "ro=false"))
            for b in _checked(binds, "dgx_podman_mount_specs")]


def dgx_mounts_digest(specs):
    """sha256 hex of the specs in their order, NUL-separated."""
    if not isinstance(specs, (list, tuple)):
        raise AnsibleFilterError("dgx_mounts_digest: expected a list of strings, got %s" % type(specs).__name__)
    return hashlib.sha256("\0".join(str(s) for s in specs).encode("utf-8")).hexdigest()


def dgx_container_env(extra_env, rank_env):
    """The container environment: every value a string, the rank environment winning over engine_env."""
    env = dict((str(key), str(value)) for key, value in (extra_env or {}).items())
    env.update((str(key), str(value)) for key, value in rank_env.items())
    return env


class FilterModule(object):
    """Engine role filters (see the module docstring)."""

    def filters(self):
        return {
            "dgx_binds": dgx_binds,
            "dgx_docker_mounts": dgx_docker_mounts,
            "dgx_podman_mount_specs": dgx_podman_mount_specs,
            "dgx_mounts_digest": dgx_mounts_digest,
            "dgx_container_env": dgx_container_env,
        }
