#!/usr/bin/env python3
"""`make demo`: build a synthetic NAS hub with every trap of the night-shift log, then run
stage-deepseek.yml on the demo inventory (localhost) with the NAS copy read-only, and print a summary.

The NAS is bound read-only in a private mount namespace when we are root (any write is an error,
and nothing stays mounted afterwards); otherwise its files are made read-only.
"""
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import hubgen  # noqa: E402  (the synthetic hub generator the tests use too)
from project import receipt_roots  # noqa: E402

DEMO_ROOT = os.path.join(REPO, ".cache", "demo")
NAS_PARENT = os.path.join(DEMO_ROOT, "nas")
NAS_HUB = os.path.join(NAS_PARENT, "hub")
REPORT = os.path.join(DEMO_ROOT, "reports", "localhost.json")
SHARD_SIZE = 8 * 1024 * 1024
RECEIPT_PARENT = os.path.join(DEMO_ROOT, "cache")
STALE_RECEIPTS = receipt_roots()   # the engine's receipt roots, as the receipts play clears them


def ensure_nas_hub():
    if os.path.isdir(NAS_HUB):
        return
    os.makedirs(NAS_PARENT, exist_ok=True)
    desc = hubgen.build_nas_hub(NAS_PARENT, shard_size=SHARD_SIZE, n_shards=6)
    print("demo: built a synthetic NAS hub at %s (%d repos) in %.1f s"
          % (desc["hub"], len(desc["repos"]), desc["duration_s"]))
    # Yesterday's receipts, read-only as the root-owned ones of the log: the receipts play clears them.
    for name in STALE_RECEIPTS:
        root = os.path.join(RECEIPT_PARENT, name)
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "worker.json"), "w") as handle:
            handle.write('{"run": "yesterday"}\n')
        os.chmod(os.path.join(root, "worker.json"), 0o444)
        os.chmod(root, 0o555)
    print("demo: planted stale engine receipts under %s" % RECEIPT_PARENT)


def playbook_command(extra_args):
    bin_dir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bin_dir, "ansible-playbook"), "-i", os.path.join(REPO, "inventory", "demo"),
           os.path.join(REPO, "stage-deepseek.yml")] + extra_args
    if os.geteuid() == 0 and shutil.which("unshare"):
        bind = ('mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"')
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, NAS_PARENT] + cmd
    subprocess.check_call(["chmod", "-R", "a-w", NAS_PARENT])
    return cmd


def summary():
    with open(REPORT) as handle:
        report = json.load(handle)
    verify = sorted(set(row["verify"] for row in report["passes"]["verify"]))
    lines = ["", "dgx-stage demo summary (%s, lane %s, verify=%s)" % (report["host"], report["lane"],
                                                                     ",".join(verify))]
    for staged, verified in zip(report["passes"]["stage"], report["passes"]["verify"]):
        mib = staged["bytes_copied"] / 1048576.0
        rate = mib / max(staged["duration_s"], 0.001)
        lines.append("  %s@%s: %d files local, %d excluded (left on the NAS), %.1f MiB copied in %.2f s "
                     "(%.0f MiB/s), %d repaired by verify, %.1f MiB on local disk"
                     % (staged["repo_id"], staged["commit"][:12], staged["files"]["local"],
                        staged["files"]["excluded"], mib, staged["duration_s"], rate,
                        verified["blobs"]["repaired"], staged["bytes_staged"] / 1048576.0))
    for weights in report["weights"]:
        lines.append("  %s: %d shards, %d tensors, index matches headers"
                     % (weights["repo_id"], weights["shards"], weights["tensors"]))
    manifest = report.get("engine", {}).get("manifest")
    if manifest:
        counts = manifest["counts"]
        lines.append("  mount manifest: %d local + %d NAS read-only binds = %d mounts (%s)"
                     % (counts["local"], counts["nas"], counts["total"], os.path.relpath(manifest["path"], REPO)))
    left = [n for n in STALE_RECEIPTS if os.path.lexists(os.path.join(RECEIPT_PARENT, n))]
    lines.append("  stale engine receipts left: %s" % (", ".join(left) if left else "none"))
    changed = any(p["changed"] for p in report["passes"]["stage"])
    lines.append("  staging changed anything: %s" % ("yes" if changed else "no (already staged)"))
    lines.append("  report: %s" % os.path.relpath(REPORT, REPO))
    return "\n".join(lines)


def main():
    ensure_nas_hub()
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    code = subprocess.call(playbook_command(sys.argv[1:]), cwd=REPO, env=env)
    if code != 0:
        print("demo: stage-deepseek.yml failed (exit %d); the play output above names the cause" % code)
        return code
    print(summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
