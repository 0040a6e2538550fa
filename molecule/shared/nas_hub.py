#!/usr/bin/env python3
"""The synthetic NAS for the Molecule scenarios: build it once, fingerprint it, prove it unchanged.

The scenarios bind ``ROOT`` read-only into every container at the same absolute path (hubgen's
absolute store links tie a hub to the path it was generated at). ``ROOT`` holds one hub per size:

    ROOT/small/hub   fits every host's local disk (dgx_2x)
    ROOT/large/hub   the full checkpoint does not fit the local disk; half of its shards do (faults)
    ROOT/hubs.json   how they were built and their fingerprints at build time

Commands:
    nas_hub.py build ROOT              build what is missing; rebuild a hub whose bytes changed since
                                       it was built (a test that wrote to the NAS must not poison the next)
    nas_hub.py fingerprint ROOT OUT    write ROOT's fingerprint (every path, lstat, link text, sha256) to OUT
    nas_hub.py compare ROOT BEFORE     exit 1, listing the differences, when ROOT no longer matches BEFORE

Stdlib only (plus tools/hubgen.py and tests/treestate.py).
"""
import json
import os
import shutil
import sys

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(PROJECT, "tools"), os.path.join(PROJECT, "tests")]  # hubgen, treestate

import hubgen  # noqa: E402
from treestate import snapshot_diff, tree_snapshot  # noqa: E402

MIB = 1024 * 1024

#: name -> hubgen parameters. The scenarios' local disk (a tmpfs capped at 44 MiB in molecule/base.yml)
#: holds all of "small" (6 MiB); of "large" (48 MiB of shards) it holds three shards, but not all six.
HUBS = {
    "small": {"shard_size": 1 * MIB, "n_shards": 6, "seed": 0},
    "large": {"shard_size": 8 * MIB, "n_shards": 6, "seed": 1},
}
STAMP = "hubs.json"


def fingerprint(root):
    """{relative path: [mode, inode, size, mtime_ns, link text, sha256]} (JSON-ready); links are never followed."""
    return dict((rel, list(state)) for rel, state in tree_snapshot(os.path.abspath(root)).items() if rel != STAMP)


def differences(before, after, limit=20):
    """Human lines for what changed between two fingerprints (empty when identical)."""
    lines = snapshot_diff(before, after)
    if len(lines) > limit:
        lines = lines[:limit] + ["... and %d more" % (len(lines) - limit)]
    return lines


def _load(path):
    with open(path) as handle:
        return json.load(handle)


def _dump(obj, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(obj, handle, sort_keys=True)
    os.replace(tmp, path)


def build(root):
    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    stamp_path = os.path.join(root, STAMP)
    stamp = _load(stamp_path) if os.path.isfile(stamp_path) else {}
    for name, params in sorted(HUBS.items()):
        parent = os.path.join(root, name)
        have = stamp.get(name)
        if have and have.get("params") == params and os.path.isdir(os.path.join(parent, "hub")):
            diff = differences(have["fingerprint"], fingerprint(parent))
            if not diff:
                print("nas_hub: %s/hub is up to date" % parent)
                continue
            print("nas_hub: %s/hub changed since it was built, rebuilding: %s" % (parent, "; ".join(diff[:3])))
        if os.path.lexists(parent):
            shutil.rmtree(parent)
        desc = hubgen.build_nas_hub(parent, **params)
        stamp[name] = {"params": params, "fingerprint": fingerprint(parent)}
        _dump(stamp, stamp_path)
        print("nas_hub: built %s (%d x %d MiB shards) in %.1f s"
              % (desc["hub"], params["n_shards"], params["shard_size"] // MIB, desc["duration_s"]))
    return 0


def main(argv):
    if len(argv) == 2 and argv[0] == "build":
        return build(argv[1])
    if len(argv) == 3 and argv[0] == "fingerprint":
        _dump(fingerprint(argv[1]), argv[2])
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        diff = differences(_load(argv[2]), fingerprint(argv[1]))
        for line in diff:
            print(line)
        return 1 if diff else 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
