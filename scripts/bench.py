#!/usr/bin/env python3
"""`make bench`: staging and verification speed and memory, as ratios against the standard tools
measured in the same run on the same data (cp -rL, rsync -aL, sha256sum).

Each contender runs as its own process on a cold page cache (when root can drop caches), so
ratios compare like with like. Sizes: BENCH_SHARDS x BENCH_SHARD_MIB (default 4 x 512 MiB).
"""
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import hubgen  # noqa: E402

ROOT = os.path.join(REPO, ".cache", "bench")
SHARDS = int(os.environ.get("BENCH_SHARDS", "4"))
SHARD_MIB = int(os.environ.get("BENCH_SHARD_MIB", "512"))
REPO_ID = hubgen.MAIN_REPO

MIRROR_RUNNER = r"""
import json, sys
import ansible.module_utils
ansible.module_utils.__path__.append(sys.argv[1])
from ansible.module_utils.dgx_mirror import MirrorRequest, run_mirror
req = MirrorRequest(sys.argv[2], sys.argv[3], sys.argv[4], verify=sys.argv[5], ignore_patterns=["page15/"])
result = run_mirror(req)
print(json.dumps({"blobs": result["blobs"], "bytes": result["bytes_copied"]}))
"""


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False


def peak_rss_kib(pid):
    """VmHWM of the running process: its own high-water mark since exec (rusage would report the
    forking Python's memory for a child spawned by vfork)."""
    try:
        with open("/proc/%d/status" % pid) as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


REPEAT = int(os.environ.get("BENCH_REPEAT", "2"))


def best_of(label, argv, prepare=None):
    """The fastest of REPEAT runs: a VM disk is noisy, the best run is the tool's real speed."""
    runs = []
    for _ in range(REPEAT):
        if prepare:
            prepare()
        runs.append(measure(label, argv))
    return min(runs, key=lambda r: r["seconds"])


def measure(label, argv):
    """Wall time (including the final sync: durability is part of the job) and peak RSS of one
    command run as a child on a cold cache."""
    cold = drop_caches()
    start = time.monotonic()
    with open(os.devnull, "wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, peak_rss_kib(proc.pid))
            time.sleep(0.01)
    os.sync()
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit("%s failed: %s" % (label, proc.stderr.read().decode()[-800:]))
    return {"label": label, "seconds": elapsed, "max_rss_mib": peak / 1024.0, "cold": cold}


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def main():
    nas_parent = os.path.join(ROOT, "nas")
    marker = os.path.join(ROOT, "size.json")
    wanted = {"shards": SHARDS, "shard_mib": SHARD_MIB}
    if not (os.path.isfile(marker) and json.load(open(marker)) == wanted):
        fresh(nas_parent)
        hubgen.build_nas_hub(nas_parent, shard_size=SHARD_MIB * 1048576, n_shards=SHARDS)
        with open(marker, "w") as handle:
            json.dump(wanted, handle)
    nas_hub = os.path.join(nas_parent, "hub")
    folder = hubgen.repo_folder(REPO_ID)
    commit = open(os.path.join(nas_hub, folder, "refs", "main")).read().strip()
    snapshot = os.path.join(nas_hub, folder, "snapshots", commit)
    py = sys.executable
    mutils = os.path.join(REPO, "module_utils")
    data_mib = SHARDS * SHARD_MIB

    rows = []
    cp_dir, rsync_dir, local = (os.path.join(ROOT, d) for d in ("cp", "rsync", "local"))
    rows.append(best_of("cp -rL (snapshot, page15 included)", ["cp", "-rL", snapshot, cp_dir],
                        prepare=lambda: fresh(cp_dir)))
    if shutil.which("rsync"):
        rows.append(best_of("rsync -aL --exclude page15/", ["rsync", "-aL", "--exclude", "page15/", snapshot + "/",
                                                            rsync_dir], prepare=lambda: fresh(rsync_dir)))
    rows.append(best_of("hf_hub_mirror stage (verify=none)", [py, "-c", MIRROR_RUNNER, mutils, nas_hub, local,
                                                             REPO_ID, "none"], prepare=lambda: fresh(local)))
    rows.append(best_of("hf_hub_mirror stage (verify=full)", [py, "-c", MIRROR_RUNNER, mutils, nas_hub, local,
                                                             REPO_ID, "full"], prepare=lambda: fresh(local)))
    blobs = [os.path.join(local, folder, "blobs", b) for b in sorted(os.listdir(os.path.join(local, folder, "blobs")))]
    rows.append(best_of("sha256sum local blobs", ["sha256sum"] + blobs))
    rows.append(best_of("hf_hub_mirror re-verify (verify=full)", [py, "-c", MIRROR_RUNNER, mutils, nas_hub, local,
                                                                 REPO_ID, "full"]))
    rows.append(best_of("hf_hub_mirror re-verify (verify=sample)", [py, "-c", MIRROR_RUNNER, mutils, nas_hub, local,
                                                                   REPO_ID, "sample"]))

    by = dict((r["label"], r) for r in rows)
    print("dgx-stage bench: %d x %d MiB shards (%d MiB of weights), cold cache: %s"
          % (SHARDS, SHARD_MIB, data_mib, "yes" if rows[0]["cold"] else "no (not root)"))
    print("%-42s %9s %9s %10s" % ("contender", "seconds", "MiB/s", "peak RSS"))
    for r in rows:
        print("%-42s %9.2f %9.0f %7.1f MiB" % (r["label"], r["seconds"], data_mib / r["seconds"], r["max_rss_mib"]))
    cp = by["cp -rL (snapshot, page15 included)"]["seconds"]
    stage = by["hf_hub_mirror stage (verify=none)"]["seconds"]
    stage_full = by["hf_hub_mirror stage (verify=full)"]["seconds"]
    sha = by["sha256sum local blobs"]["seconds"]
    print("ratios (lower is better, 1.00 = as fast as the standard tool):")
    print("  stage (verify=none) / cp -rL          = %.2f" % (stage / cp))
    if "rsync -aL --exclude page15/" in by:
        print("  stage (verify=none) / rsync -aL       = %.2f" % (stage / by["rsync -aL --exclude page15/"]["seconds"]))
    print("  stage (verify=full) / (cp + sha256sum) = %.2f" % (stage_full / (cp + sha)))
    print("  re-verify full / sha256sum            = %.2f" % (by["hf_hub_mirror re-verify (verify=full)"]["seconds"] / sha))
    print("  re-verify sample / sha256sum          = %.3f" % (by["hf_hub_mirror re-verify (verify=sample)"]["seconds"] / sha))
    if "rsync -aL --exclude page15/" in by:
        print("  peak RSS stage / rsync                = %.2f" % (
            by["hf_hub_mirror stage (verify=full)"]["max_rss_mib"] / by["rsync -aL --exclude page15/"]["max_rss_mib"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
