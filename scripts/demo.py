#!/usr/bin/env python3
"""`make demo`: build a synthetic NAS hub with every trap of the night-shift log and stage it on localhost
through the front end with the NAS read-only (`dgx-stage stage -i inventory/demo`, then `clean-receipts`);
then print what the run's table does not say. Runs are recorded under .cache/demo/runs.

No root needed: every path is under .cache/demo (Ansible's temp files too). As root the NAS is bound
read-only in a private mount namespace; as any other user it is made read-only by permissions.

`make demo-4x` (`demo.py --4x`): the SGLang lane of four local-connection hosts (inventory/demo-4x) on
hubgen's engram layout for four ranks, two NAS readers at once and peer fan-out (rsync) of the shared
files; it prints the lane's NAS bytes against one copy of the shared files plus each rank's part.
"""
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tools")]

import hubgen  # noqa: E402  (the synthetic hub generator the tests use too)
from dgx_stage import use_module_utils  # noqa: E402

use_module_utils()
from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS  # noqa: E402

DEMO_ROOT = os.path.join(REPO, ".cache", "demo")
NAS_PARENT = os.path.join(DEMO_ROOT, "nas")
NAS_HUB = os.path.join(NAS_PARENT, "hub")
REPORT = os.path.join(DEMO_ROOT, "reports", "localhost.json")
RUNS_DIR = os.path.join(DEMO_ROOT, "runs")
SHARD_SIZE = 8 * 1024 * 1024
RECEIPT_PARENT = os.path.join(DEMO_ROOT, "cache")

# `make demo-4x`: the four-host lane (inventory/demo-4x) and its engram NAS hub.
DEMO_4X_ROOT = os.path.join(REPO, ".cache", "demo-4x")
NAS_4X_PARENT = os.path.join(DEMO_4X_ROOT, "nas")
RUNS_4X_DIR = os.path.join(DEMO_4X_ROOT, "runs")
REPORTS_4X_DIR = os.path.join(DEMO_4X_ROOT, "reports")
LAYOUT_4X = os.path.join(DEMO_4X_ROOT, "engram-layout.json")   # hubgen's description, outside the read-only NAS
WORLD_SIZE_4X = 4
TABLE_SIZE_4X = 4 * 1024 * 1024    # each rank: two tables of this size
DENSE_SIZE_4X = 16 * 1024 * 1024   # the dense shard every rank shares


def plant_stale_receipts(parent):
    """Yesterday's receipt roots under parent, read-only like the log's root-owned ones, for the receipts play."""
    for name in RECEIPT_ROOTS:
        root = os.path.join(parent, name)
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "worker.json"), "w") as handle:
            handle.write('{"run": "yesterday"}\n')
        os.chmod(os.path.join(root, "worker.json"), 0o444)
        os.chmod(root, 0o555)


def ensure_nas_hub():
    if os.path.isdir(NAS_HUB):
        return
    os.makedirs(NAS_PARENT, exist_ok=True)
    desc = hubgen.build_nas_hub(NAS_PARENT, shard_size=SHARD_SIZE, n_shards=6)
    print("demo: built a synthetic NAS hub at %s (%d repos) in %.1f s"
          % (desc["hub"], len(desc["repos"]), desc["duration_s"]))
    plant_stale_receipts(RECEIPT_PARENT)
    print("demo: planted stale engine receipts under %s" % RECEIPT_PARENT)


def playbook_env(demo_root=DEMO_ROOT, runs_dir=RUNS_DIR):
    """The repo's ansible.cfg; Ansible's home and temp dirs under demo_root unless the caller chose others."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), PYTHONDONTWRITEBYTECODE="1",
               DGX_STAGE_RUNS_DIR=runs_dir)
    env.setdefault("ANSIBLE_HOME", os.path.join(demo_root, "ansible-home"))
    env.setdefault("ANSIBLE_LOCAL_TEMP", os.path.join(demo_root, "ansible-tmp", "local"))
    env.setdefault("ANSIBLE_REMOTE_TMP", os.path.join(demo_root, "ansible-tmp", "remote"))
    return env


def summary(check=False):
    """What the run's table above does not say (shard headers, mounts, receipts)."""
    with open(REPORT) as handle:
        report = json.load(handle)
    lines = ["dgx-stage demo (%s, lane %s, run %s, %s)" % (report.get("host"), report.get("lane"),
                                                         report.get("run_id"), report.get("status"))]
    if check:   # the latest view keeps the last real results; the plan is under its "check" key
        lines.append("  --check: nothing was written; the plan is under \"check\" in %s"
                     % os.path.relpath(REPORT, REPO))
        return "\n".join(lines)
    for weights in report.get("weights") or []:
        lines.append("  %s: %d shards, %d tensors, index matches headers"
                     % (weights["repo_id"], weights["shards"], weights["tensors"]))
    manifest = (report.get("engine") or {}).get("manifest")
    if manifest:
        counts = manifest["counts"]
        lines.append("  mount manifest: %d local + %d NAS read-only binds = %d mounts (%s)"
                     % (counts["local"], counts["nas"], counts["total"], os.path.relpath(manifest["path"], REPO)))
    left = [n for n in RECEIPT_ROOTS if os.path.lexists(os.path.join(RECEIPT_PARENT, n))]
    lines.append("  stale engine receipts left: %s" % (", ".join(left) if left else "none"))
    lines.append("  host report: %s (history: %s-<run_id>.json)" % (os.path.relpath(REPORT, REPO),
                                                                    os.path.relpath(REPORT[:-5], REPO)))
    lines.append("  its runs: .venv/bin/dgx-stage report --runs-dir %s" % os.path.relpath(RUNS_DIR, REPO))
    return "\n".join(lines)


def ensure_engram_hub():
    """The 4x demo's NAS: hubgen's engram layout for four ranks, and its description beside (not in) the NAS."""
    if os.path.isdir(os.path.join(NAS_4X_PARENT, "hub")) and os.path.isfile(LAYOUT_4X):
        return
    if os.path.lexists(NAS_4X_PARENT):   # half-built: start again (give the write bits back first)
        subprocess.check_call(["chmod", "-R", "u+w", NAS_4X_PARENT])
        shutil.rmtree(NAS_4X_PARENT)
    os.makedirs(NAS_4X_PARENT)
    desc = hubgen.build_engram_hub(NAS_4X_PARENT, WORLD_SIZE_4X, table_size=TABLE_SIZE_4X, dense_size=DENSE_SIZE_4X)
    [repo] = desc["repos"].values()
    with open(LAYOUT_4X + ".tmp", "w") as handle:   # JSON makes the rank keys strings
        json.dump({k: repo[k] for k in ("repo_id", "shared_bytes", "rank_bytes")}, handle, indent=1, sort_keys=True)
    os.replace(LAYOUT_4X + ".tmp", LAYOUT_4X)
    print("demo-4x: built a synthetic NAS hub with the engram layout for %d ranks at %s in %.1f s"
          % (WORLD_SIZE_4X, desc["hub"], desc["duration_s"]))


def _mib(size):
    return "%.1f MiB" % (size / 1048576.0)


def summary_4x(run_id):
    """What the front end's tables do not say: each host's verify pass, the lane's NAS bytes against the layout's."""
    with open(LAYOUT_4X) as handle:
        layout = json.load(handle)
    reports = []
    for name in sorted(os.listdir(REPORTS_4X_DIR)):
        if name.endswith(".json") and not name.endswith("-%s.json" % run_id):   # <host>.json, the latest view
            with open(os.path.join(REPORTS_4X_DIR, name)) as handle:
                report = json.load(handle)
            if report.get("run_id") == run_id:
                reports.append(report)
    proven = [r["host"] for r in reports
              if r.get("passes", {}).get("verify") and all(p.get("status") == "ok" for p in r["passes"]["verify"])]
    once = layout["shared_bytes"] + sum(layout["rank_bytes"].values())
    parts = " + ".join(_mib(layout["rank_bytes"][k]) for k in sorted(layout["rank_bytes"], key=int))
    return "\n".join([
        "dgx-stage demo-4x (lane %s, run %s)" % (reports[0].get("lane") if reports else "?", run_id),
        "  verify pass ok on %d of %d hosts: %s" % (len(proven), len(reports), ", ".join(proven) or "none"),
        "  the lane read %s from the NAS; one copy of the shared files (%s) plus each rank's part (%s) is %s"
        % (_mib(sum(r.get("bytes_from_nas") or 0 for r in reports)), _mib(layout["shared_bytes"]), parts, _mib(once)),
        "  host reports: %s/<host>.json" % os.path.relpath(REPORTS_4X_DIR, REPO)])


def frontend(label, subcommand, extra, env, inventory="demo", nas_parent=NAS_PARENT):
    """`dgx-stage SUBCOMMAND -i inventory/INVENTORY` from this work tree (python -m dgx_stage: the copy being
    demonstrated), the NAS read-only, run to its end: its exit code, and a line saying so when it failed."""
    cmd = [sys.executable, "-m", "dgx_stage", subcommand, "-i", os.path.join(REPO, "inventory", inventory)] + extra
    if os.geteuid() == 0 and shutil.which("unshare"):
        bind = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, nas_parent] + cmd
    else:
        subprocess.check_call(["chmod", "-R", "a-w", nas_parent])
        if os.access(nas_parent, os.W_OK):   # root without unshare: permissions do not stop root
            print("demo: warning: the NAS copy stays writable for root without unshare(1)", file=sys.stderr)
    sys.stdout.flush()   # our lines before the front end's, also through a pipe
    code = subprocess.call(cmd, cwd=REPO, env=env)
    if code != 0:   # then no run to read: a usage error (64) recorded none, and the latest is another's
        print("%s: dgx-stage %s failed (exit %d); the lines above name the host and task" % (label, subcommand, code))
    return code


def main_4x(extra):
    """`make demo-4x`: the four-host lane with rank templates, the NAS reader limit and fan-out."""
    ensure_engram_hub()
    if not shutil.which("rsync"):
        print("demo-4x: rsync is needed (stage_peer_fanout copies blobs host to host with it): install the rsync "
              "package, or run with -e stage_peer_fanout=false")
        if not any("stage_peer_fanout" in arg for arg in extra):
            return 69
    code = frontend("demo-4x", "stage", extra, playbook_env(DEMO_4X_ROOT, RUNS_4X_DIR), inventory="demo-4x",
                    nas_parent=NAS_4X_PARENT)
    if code == 0 and "--check" not in extra:
        with open(os.path.join(RUNS_4X_DIR, sorted(os.listdir(RUNS_4X_DIR))[-1], "run.json")) as handle:
            print(summary_4x(json.load(handle)["run_id"]))
    return code


def main():
    if sys.argv[1:2] == ["--4x"]:
        return main_4x(sys.argv[2:])
    ensure_nas_hub()
    extra = sys.argv[1:]
    code = frontend("demo", "stage", extra, playbook_env()) or frontend("demo", "clean-receipts", extra, playbook_env())
    if code == 0:
        print(summary(check="--check" in extra or "-C" in extra))
    return code


if __name__ == "__main__":
    sys.exit(main())
