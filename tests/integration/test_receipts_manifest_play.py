"""The receipts and manifest plays of stage-deepseek.yml on a generated hub, through ansible-playbook.

A temporary inventory puts localhost in the exl3_2x lane with the engine disabled. The receipt parent
holds yesterday's receipt roots the way the night-shift log found them: owned by another user, with
read-only files, one root a symlink whose target must survive. Checks: receipts gone (and only they),
manifest counts as the staged tree implies, every NAS file reachable exactly once, NAS binds read-only,
local binds resolving to the right bytes, re-run changed=0, --check changes nothing, and the engine plays
skip cleanly when engine_enabled is false. --check on a fresh lane predicting the manifest the real run writes
is tests/integration/test_output.py's.
"""
import json
import os
import sys

import pytest

from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS
from conftest import failures, run_playbook
from treestate import sha256_file
RECEIPT_NAMES = list(RECEIPT_ROOTS)
OTHER_UID = 4242  # "yesterday's" receipts belong to someone else
MAIN_REPO = "coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw"
DRAFTER_REPO = "coolbho3k/DSpark-drafter"


def plant_stale_receipts(parent, link_target):
    """Yesterday's receipt roots: another owner, read-only files and dirs; one root is a symlink."""
    os.makedirs(parent, exist_ok=True)
    for name in (RECEIPT_NAMES[0], RECEIPT_NAMES[2]):
        run_dir = os.path.join(parent, name, "run")
        os.makedirs(run_dir)
        worker = os.path.join(run_dir, "worker.json")
        with open(worker, "w") as handle:
            handle.write('{"rank": 0, "from": "yesterday"}')
        os.chmod(worker, 0o444)
        os.chmod(run_dir, 0o555)
        for path in (worker, run_dir, os.path.join(parent, name)):
            os.lchown(path, OTHER_UID, OTHER_UID)
    os.makedirs(link_target, exist_ok=True)
    with open(os.path.join(link_target, "keep.json"), "w") as handle:
        handle.write('{"not": "a receipt"}')
    os.symlink(link_target, os.path.join(parent, RECEIPT_NAMES[1]))


def write_inventory(tmp_path, nas_hub):
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(json.dumps({"all": {"children": {"exl3_2x": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    settings = {
        "lane": "exl3_2x",
        "hub_nas_root": nas_hub,
        "hub_local_root": str(tmp_path / "local" / "hub"),
        "stage_repos": [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}, {"repo_id": DRAFTER_REPO}],
        "stage_verify": "sample",
        "stage_report_dir": str(tmp_path / "reports"),
        "receipt_parent": str(tmp_path / "cache"),
        "engine_enabled": False,
        "engine_manifest_path": str(tmp_path / "local" / "engine-manifest.json"),
    }
    (inv / "group_vars" / "all" / "lane.yml").write_text(json.dumps(settings))
    return inv


def task_results(data, name_part):
    return [(task["task"]["name"], result) for play in data["plays"] for task in play["tasks"]
            if name_part in task["task"]["name"] for result in task["hosts"].values()]


def covering_mounts(manifest, target):
    """Mounts whose target is the file's target or a directory above it."""
    return [m for m in manifest["mounts"] if target == m["target"] or target.startswith(m["target"] + "/")]


@pytest.fixture
def lane(tmp_path, nas_hub):
    inventory = write_inventory(tmp_path, nas_hub["hub"])
    cache = str(tmp_path / "cache")
    link_target = str(tmp_path / "elsewhere" / "real-dir")
    plant_stale_receipts(cache, link_target)
    os.makedirs(os.path.join(cache, "ds41-other"))  # not a listed root: must survive
    return {"inventory": inventory, "cache": cache, "link_target": link_target, "nas": nas_hub,
            "manifest": str(tmp_path / "local" / "engine-manifest.json"),
            "report": str(tmp_path / "reports" / "localhost.json"), "local": str(tmp_path / "local" / "hub")}


def test_receipts_and_manifest_plays_run_idempotent_and_check_safe(tmp_path, lane):
    nas = lane["nas"]

    # 1. Stage, then the before-serve plays; the engine is disabled, so its plays skip cleanly.
    rc, data = run_playbook(tmp_path, lane["inventory"], "--tags", "stage,receipts,manifest,engine,smoke")
    assert rc == 0, failures(data)
    assert data["stats"]["localhost"]["failures"] == 0

    # Receipts: the three roots are gone whoever owned them; the symlinked root was unlinked, its target kept.
    assert sorted(os.listdir(lane["cache"])) == ["ds41-other"]
    assert os.listdir(lane["link_target"]) == ["keep.json"]
    assert json.load(open(os.path.join(lane["link_target"], "keep.json"))) == {"not": "a receipt"}
    removed = task_results(data, "Remove the receipt roots")[0][1]["removed"]
    assert sorted(removed) == sorted(os.path.join(lane["cache"], n) for n in RECEIPT_NAMES)

    # The engine, smoke and bench plays started nothing.
    assert not task_results(data, "Container |") and not task_results(data, "Smoke |")
    assert task_results(data, "Nothing to start")[0][1]["msg"].endswith("engine_enabled is false")

    # Manifest: counts as the staged tree implies (every non-page15 file local, page15 one NAS dir).
    with open(lane["manifest"]) as handle:
        manifest = json.load(handle)
    assert set(manifest) == {"repos", "mounts", "counts", "bind_from"} and manifest["bind_from"] == "local"
    staged = sum(1 for r in nas["repos"].values() for p in r["files"] if not p.startswith("page15/"))
    page15_repos = [r for r in nas["repos"].values() if r["page15"]]
    assert manifest["counts"] == {"local": staged, "nas": len(page15_repos), "total": staged + len(page15_repos)}
    assert len(manifest["mounts"]) == manifest["counts"]["total"]
    targets = [m["target"] for m in manifest["mounts"]]
    assert len(targets) == len(set(targets))
    assert all(m["target"].startswith("/hub/") for m in manifest["mounts"])
    for mount in manifest["mounts"]:
        assert mount["read_only"] is True
        assert os.path.exists(mount["source"])
        if mount["origin"] == "nas":
            assert mount["source"].startswith(nas["hub"] + "/") and mount["target"].endswith("/page15")
        else:
            assert mount["source"].startswith(lane["local"] + "/")

    # Every NAS snapshot file is reachable exactly once, and local binds carry the NAS file's bytes.
    by_repo = {r["repo_id"]: r for r in manifest["repos"]}
    for repo_id, repo in nas["repos"].items():
        record = by_repo[repo_id]
        assert record["commit"] == repo["commit"]
        for rel, info in repo["files"].items():
            target = record["target"] + "/" + rel
            covering = covering_mounts(manifest, target)
            assert len(covering) == 1, (rel, covering)
            mount = covering[0]
            if rel.startswith("page15/"):
                assert mount["origin"] == "nas"
                path = os.path.join(mount["source"], os.path.relpath(target, mount["target"]))
            else:
                assert mount["origin"] == "local" and mount["target"] == target
                path = mount["source"]
            assert sha256_file(path) == info["sha256"], rel

    # The host report carries the manifest counts.
    with open(lane["report"]) as handle:
        report = json.load(handle)
    assert report["engine"]["manifest"]["counts"] == manifest["counts"]
    assert report["engine"]["manifest"]["path"] == lane["manifest"]

    # 2. Re-run the plays of the before-serve sequence: nothing changes.
    before = os.stat(lane["manifest"])
    rc, data = run_playbook(tmp_path, lane["inventory"], "--tags", "receipts,manifest,engine,smoke")
    assert rc == 0, failures(data)
    assert data["stats"]["localhost"]["changed"] == 0, [
        task["task"]["name"] for play in data["plays"] for task in play["tasks"]
        if any(r.get("changed") for r in task["hosts"].values())]
    after = os.stat(lane["manifest"])
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    # 3. --check with new stale receipts and no manifest: reports what it would do, does none of it.
    plant_stale_receipts(lane["cache"], lane["link_target"])
    os.unlink(lane["manifest"])
    listing = sorted(os.listdir(lane["cache"]))
    rc, data = run_playbook(tmp_path, lane["inventory"], "--check", "--tags", "receipts,manifest")
    assert rc == 0, failures(data)
    would = task_results(data, "Remove the receipt roots")[0][1]
    assert would["changed"] and sorted(would["removed"]) == sorted(
        os.path.join(lane["cache"], n) for n in RECEIPT_NAMES)
    assert task_results(data, "Write the manifest")[0][1]["changed"]
    assert sorted(os.listdir(lane["cache"])) == listing
    assert os.path.islink(os.path.join(lane["cache"], RECEIPT_NAMES[1]))
    assert not os.path.exists(lane["manifest"])


def test_bind_from_nas_serves_the_nas_weights_and_leaves_the_local_hub_alone(tmp_path, lane, tree_state):
    """The roll-back runbook: -e engine_bind_from=nas binds every file from the NAS (counts.local 0), the
    local hub untouched; without it the manifest binds the staged copies again, as it did before."""
    nas = lane["nas"]
    rc, data = run_playbook(tmp_path, lane["inventory"], "--tags", "stage,manifest")
    assert rc == 0, failures(data)
    with open(lane["manifest"]) as handle:
        staged = json.load(handle)
    assert staged["counts"]["local"] > 0
    local_before = tree_state(lane["local"])

    rc, data = run_playbook(tmp_path, lane["inventory"], "--tags", "manifest", "-e", "engine_bind_from=nas")
    assert rc == 0, failures(data)
    with open(lane["manifest"]) as handle:
        manifest = json.load(handle)
    assert manifest["counts"]["local"] == 0 and manifest["counts"]["nas"] == manifest["counts"]["total"] > 0
    assert manifest["repos"] == staged["repos"] and manifest["bind_from"] == "nas"
    for mount in manifest["mounts"]:
        assert mount["origin"] == "nas" and mount["read_only"] is True
        assert mount["source"].startswith(nas["hub"] + "/"), mount
    by_repo = {r["repo_id"]: r for r in manifest["repos"]}
    for repo_id, repo in nas["repos"].items():
        for rel, info in repo["files"].items():
            target = by_repo[repo_id]["target"] + "/" + rel
            [mount] = covering_mounts(manifest, target)
            assert sha256_file(os.path.join(mount["source"], os.path.relpath(target, mount["target"]))
                               if mount["target"] != target else mount["source"]) == info["sha256"], rel
    assert tree_state.diff(local_before, tree_state(lane["local"])) == []
    [(_name, summary)] = task_results(data, "Manifest | Summary")
    assert summary["msg"].startswith("engine_bind_from nas - every file from the NAS")
    with open(lane["report"]) as handle:
        report = json.load(handle)
    assert report["engine"]["manifest"]["bind_from"] == "nas"
    assert report["engine"]["manifest"]["counts"]["local"] == 0

    # Back to the staged copies: the manifest is the one the stage run wrote.
    rc, data = run_playbook(tmp_path, lane["inventory"], "--tags", "manifest")
    assert rc == 0, failures(data)
    with open(lane["manifest"]) as handle:
        assert json.load(handle) == staged
