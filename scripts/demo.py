#!/usr/bin/env python3
"""`make demo`: build a synthetic NAS hub with every trap of the night-shift log, then stage it on the
demo inventory (localhost) through the operator front end with the NAS copy read-only
(`dgx-stage stage -i inventory/demo`, then `dgx-stage clean-receipts` for yesterday's receipts), and print
the playbook's recap and lane summary (callback_plugins/dgx_summary.py), what they do not say (shard
headers, mounts, receipts) and the run's Markdown report (`dgx-stage report RUN_ID --markdown`).
The front end records its runs under .cache/demo/runs.

Root is never needed: every demo path is under .cache/demo and belongs to whoever runs it (the demo
inventory sets become_root: false). The NAS is kept read-only without root too: as root it is bound
read-only in a private mount namespace (any write is an error, nothing stays mounted afterwards); as
any other user its tree is made read-only by permissions (`make clean` gives the write bits back).
Ansible's temp files go under .cache/demo as well, so the demo writes nothing outside its dirs.
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
ANSIBLE_TMP = os.path.join(DEMO_ROOT, "ansible-tmp")
RUNS_DIR = os.path.join(DEMO_ROOT, "runs")
SHARD_SIZE = 8 * 1024 * 1024
RECEIPT_PARENT = os.path.join(DEMO_ROOT, "cache")
STALE_RECEIPTS = receipt_roots()   # the engine's receipt roots, as the receipts play clears them


def plant_stale_receipts(parent):
    """Yesterday's receipt roots under parent, read-only as the root-owned ones of the log: the receipts
    play clears them."""
    for name in STALE_RECEIPTS:
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


def frontend_command(subcommand, extra_args):
    """`dgx-stage SUBCOMMAND -i inventory/demo ...` as this work tree's package (python -m dgx_stage from the
    repo: the copy being demonstrated, whichever venv runs it), under the NAS read-only wrapper."""
    cmd = [sys.executable, "-m", "dgx_stage", subcommand, "-i", os.path.join(REPO, "inventory", "demo")] + extra_args
    if os.geteuid() == 0 and shutil.which("unshare"):
        bind = ('mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"')
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, NAS_PARENT] + cmd
    subprocess.check_call(["chmod", "-R", "a-w", NAS_PARENT])
    if os.access(NAS_PARENT, os.W_OK):   # root without unshare: permissions do not stop root
        print("demo: warning: the NAS copy stays writable for root without unshare(1)", file=sys.stderr)
    return cmd


def playbook_env():
    """The repo's ansible.cfg; Ansible's home (which ansible-core creates at start) and temp dirs under
    .cache/demo unless the caller chose others (the demo needs only the collections bundled in the venv)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), PYTHONDONTWRITEBYTECODE="1",
               DGX_STAGE_RUNS_DIR=RUNS_DIR)
    env.setdefault("ANSIBLE_HOME", os.path.join(DEMO_ROOT, "ansible-home"))
    env.setdefault("ANSIBLE_LOCAL_TEMP", os.path.join(ANSIBLE_TMP, "local"))
    env.setdefault("ANSIBLE_REMOTE_TMP", os.path.join(ANSIBLE_TMP, "remote"))
    return env


def summary(check=False):
    """What the lane summary above does not say (it has the per-repo copy figures)."""
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
    left = [n for n in STALE_RECEIPTS if os.path.lexists(os.path.join(RECEIPT_PARENT, n))]
    lines.append("  stale engine receipts left: %s" % (", ".join(left) if left else "none"))
    lines.append("  host report: %s (history: %s-<run_id>.json)" % (os.path.relpath(REPORT, REPO),
                                                                    os.path.relpath(REPORT[:-5], REPO)))
    return "\n".join(lines)


def latest_run():
    """The run.json of the front end's latest run in the demo's runs dir."""
    names = sorted(os.listdir(RUNS_DIR))
    with open(os.path.join(RUNS_DIR, names[-1], "run.json")) as handle:
        return json.load(handle)


def recap(run):
    """The end of the run's full log: ansible-playbook's recap and the lane summary table."""
    with open(run["log"], errors="replace") as handle:
        text = handle.read().replace("\r\n", "\n")
    start = text.rfind("PLAY RECAP")
    return text[start:].rstrip() if start >= 0 else ""


def main():
    ensure_nas_hub()
    extra = sys.argv[1:]
    sys.stdout.flush()   # our lines before the front end's, also through a pipe
    code = subprocess.call(frontend_command("stage", extra), cwd=REPO, env=playbook_env())
    if code != 0:   # before reading a run: a usage error (64) recorded none, and the latest is another's
        print("demo: dgx-stage stage failed (exit %d); the lines above name the host and task" % code)
        return code
    staged = latest_run()
    print(recap(staged))
    sys.stdout.flush()
    code = subprocess.call(frontend_command("clean-receipts", extra), cwd=REPO, env=playbook_env())
    if code != 0:
        print("demo: dgx-stage clean-receipts failed (exit %d); the lines above name the host and task" % code)
        return code
    print(summary(check="--check" in extra or "-C" in extra))
    sys.stdout.flush()
    return subprocess.call([sys.executable, "-m", "dgx_stage", "report", staged["run_id"], "--markdown"], cwd=REPO,
                           env=playbook_env())


if __name__ == "__main__":
    sys.exit(main())
