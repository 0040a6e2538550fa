"""stage-deepseek.yml's preflight, stage and verify plays on a generated NAS hub, run on localhost
through ansible-playbook with a throwaway inventory that sets the design card's variables."""
import json
import os
import pwd

import pytest
from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download

from conftest import run_playbook
from treestate import snapshot_diff, tree_snapshot
from hubgen import DRAFTER_REPO, MAIN_REPO

STAGE_TAGS = "preflight,stage,verify"


def write_inventory(tmp_path, nas, local, **extra):
    group_vars = {
        "lane": "exl3_2x",
        "hub_nas_root": nas,
        "hub_local_root": local,
        "stage_repos": [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}, {"repo_id": DRAFTER_REPO}],
        "stage_report_dir": str(tmp_path / "reports"),
        "engine_enabled": False,
    }
    group_vars.update(extra)
    inventory = {"all": {"children": {"exl3_2x": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}}},
        "vars": group_vars}}
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory))
    return str(path)


def staged_localhost(work, nas):
    """staged_hub's lane of write_inventory: localhost, its local hub <dir>/local (as the local_hub fixture)."""
    (work / "local").mkdir()
    return write_inventory(work, nas["hub"], str(work / "local"))


def localhost_tasks(data):
    """{task name: [localhost results]} of a run_playbook() output."""
    tasks = {}
    for each in data["plays"]:
        for task in each["tasks"]:
            # The json callback names role tasks "role : name", templated per include.
            name = task["task"]["name"].split(" : ", 1)[-1]
            tasks.setdefault(name, []).append(task["hosts"].get("localhost", {}))
    return tasks


def play(tmp_path, inventory, *args, **kwargs):
    """Run the playbook; returns (exit code, {task name: [host results]}, stats of localhost)."""
    code, data = run_playbook(tmp_path, inventory, "--tags", kwargs.get("tags", STAGE_TAGS), *args)
    return code, localhost_tasks(data), data["stats"].get("localhost", {})


def mirror_results(tasks, stage_pass):
    name = "Mirror | Each repo from the NAS hub to the local hub, pass %s" % stage_pass
    return [r for run in tasks[name] for r in run["results"]]


def test_stage_verify_then_idempotent_and_loadable_offline(staged_hub):
    # The first run: staged_hub's (once a session; its output and files restored for this test).
    lane = staged_hub("localhost", staged_localhost)
    tmp_path, nas_hub, inventory, local_hub = lane["dir"], lane["nas"], lane["inventory"], lane["dir"] / "local"
    code, tasks = lane["code"], localhost_tasks(lane["data"])
    assert code == 0, tasks
    staged = {r["item"]["repo_id"]: r for r in mirror_results(tasks, "stage")}
    main = staged[MAIN_REPO]
    assert main["files"]["excluded"] == len(nas_hub["repos"][MAIN_REPO]["page15"])
    assert main["files"]["dangling"] == 0 and main["blobs"]["copied"] > 0
    report = json.loads((tmp_path / "reports" / "localhost.json").read_text())
    assert [r["repo_id"] for r in report["passes"]["verify"]] == [MAIN_REPO, DRAFTER_REPO]
    assert report["weights"][0]["shards"] == nas_hub["n_shards"]

    # Second run: nothing to do anywhere.
    code, tasks, stats = play(tmp_path, inventory)
    assert code == 0 and stats["changed"] == 0, stats
    # become_root unset: the lane becomes root only when the remote user (asked with one shell command) is not.
    user = pwd.getpwuid(os.geteuid()).pw_name
    [remote] = tasks["The remote user, for the become switch (when the inventory does not set become_root)"]
    assert remote["stdout"].strip() == user and not remote.get("changed"), remote
    [facts] = tasks["Compute the lane facts once for every later play"]
    assert facts["ansible_facts"]["lane_become"] is (user != "root"), facts

    # The local copy is a hub cache huggingface_hub loads with no network.
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        path = snapshot_download(MAIN_REPO, cache_dir=str(local_hub), local_files_only=True)
        assert os.path.realpath(path).startswith(os.path.realpath(str(local_hub)))
        config = hf_hub_download(MAIN_REPO, "config.json", cache_dir=str(local_hub), local_files_only=True)
        assert os.path.isfile(config)
    finally:
        del os.environ["HF_HUB_OFFLINE"]
    assert scan_cache_dir(str(local_hub)).warnings == []


# One refusal of hf_hub_mirror's own stops the play with nothing written; each of its refusals (missing NAS
# root, unknown repo or revision, patterns selecting nothing...) is tests/unit/test_mirror.py's
# test_refusals_name_the_problem_and_write_nothing, in check mode as preflight runs it. The lane's is the
# lane-selection play's.
@pytest.mark.parametrize("bad", [
    {"hub_nas_root": "/nonexistent/nas/hub"},
    {"lane": "no_such_lane"},
], ids=["mirror-refusal", "unknown-lane"])
def test_bad_input_fails_in_preflight_with_nothing_written(tmp_path, nas_hub, local_hub, bad):
    inventory = write_inventory(tmp_path, nas_hub["hub"], str(local_hub), **bad)
    before = tree_snapshot(local_hub)
    code, tasks, stats = play(tmp_path, inventory, tags="preflight,stage")
    assert code != 0
    assert "Stage | Look for the local hub root" not in tasks
    assert snapshot_diff(before, tree_snapshot(local_hub)) == []


def test_wrong_shard_is_caught_by_verify_before_serve_even_without_content_checks(staged_hub):
    """Crash layer 1 of the log: a weight blob bound to the wrong same-size shard. With content
    checks off (stage_verify none) the header check is the last line: it fails the verify play,
    naming the duplicate key, and no later play (receipts, manifest, engine) runs."""
    lane = staged_hub("localhost", staged_localhost)  # staged by a good run
    tmp_path, nas_hub, local_hub = lane["dir"], lane["nas"], lane["dir"] / "local"
    inventory = write_inventory(tmp_path, nas_hub["hub"], str(local_hub), stage_verify="none")
    repo = nas_hub["repos"][MAIN_REPO]
    path_a, path_b = repo["same_size_pairs"][0]
    blobs = local_hub / repo["folder"] / "blobs"
    blob_a = blobs / repo["files"][path_a]["etag"]
    blob_a.unlink()
    os.link(str(blobs / repo["files"][path_b]["etag"]), str(blob_a))      # the log's size-based dedup
    code, tasks, stats = play(tmp_path, inventory, tags="all")
    assert code != 0
    checks = [r for run in tasks["Verify | Check each snapshot's safetensors index against the shard headers"]
              for r in run["results"]]
    failed = [r for r in checks if r.get("failed")]
    assert failed and "Duplicate mapped checkpoint key" in failed[0]["msg"], checks
    later = ("Receipt |", "Manifest |", "Main |", "Status |", "Container |", "Smoke |")
    assert not any(name.startswith(later) for name in tasks), sorted(tasks)


def _corrupt_nas_shard(nas_hub, shard):
    """Bit rot on the read-only NAS: same size and mtime, one byte flipped; the fixture re-freezes."""
    info = nas_hub["repos"][MAIN_REPO]["files"][shard]
    real = os.path.realpath(os.path.join(nas_hub["hub"], nas_hub["repos"][MAIN_REPO]["folder"], "blobs",
                                         info["etag"]))
    st = os.stat(real)
    os.chmod(real, 0o644)
    with open(real, "r+b") as handle:
        handle.seek(st.st_size // 2)
        byte = handle.read(1)
        handle.seek(st.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.chmod(real, st.st_mode)
    os.utime(real, ns=(st.st_atime_ns, st.st_mtime_ns))
    nas_hub.freeze()
    return info


def test_corrupt_nas_blob_fails_the_stage_play_and_is_named_in_the_host_report(tmp_path, nas_hub, local_hub):
    shard = nas_hub["repos"][MAIN_REPO]["shards"][1]
    info = _corrupt_nas_shard(nas_hub, shard)
    inventory = write_inventory(tmp_path, nas_hub["hub"], str(local_hub))
    code, tasks, stats = play(tmp_path, inventory)
    assert code != 0 and stats["failures"] == 1
    failed = [r for r in mirror_results(tasks, "stage") if r.get("failed")]
    assert [r["item"]["repo_id"] for r in failed] == [MAIN_REPO]
    assert shard in failed[0]["msg"] and info["etag"] in failed[0]["msg"]
    assert failed[0]["nas_corrupt"] == [shard]
    report = json.loads((tmp_path / "reports" / "localhost.json").read_text())
    rows = {row["repo_id"]: row for row in report["passes"]["stage"]}
    assert rows[MAIN_REPO]["status"] == "failed" and rows[MAIN_REPO]["nas_corrupt"] == [shard]
    assert rows[DRAFTER_REPO]["status"] == "ok" and rows[DRAFTER_REPO]["nas_corrupt"] == []
    blob = os.path.join(str(local_hub), nas_hub["repos"][MAIN_REPO]["folder"], "blobs", info["etag"])
    assert not os.path.lexists(blob)
    assert "verify" not in report["passes"]     # the host failed in stage: later plays did not run for it


def test_symlinked_local_blobs_dir_is_refused_in_preflight_and_its_target_untouched(staged_hub):
    lane = staged_hub("localhost", staged_localhost)  # staged by a good run
    tmp_path, nas_hub, local_hub = lane["dir"], lane["nas"], lane["dir"] / "local"
    inventory = write_inventory(tmp_path, nas_hub["hub"], str(local_hub), stage_prune=True)
    blobs = os.path.join(str(local_hub), nas_hub["repos"][MAIN_REPO]["folder"], "blobs")
    shared = tmp_path / "shared-blobs"
    os.rename(blobs, str(shared))
    (shared / ("0" * 64)).write_bytes(b"another repo's blob")     # prune would delete it through the link
    os.symlink(str(shared), blobs)
    before = tree_snapshot(str(shared))
    code, tasks, _stats = play(tmp_path, inventory)
    assert code != 0
    preflight = mirror_results(tasks, "preflight")
    assert any("%s is a symlink to %s" % (blobs, shared) in r.get("msg", "") for r in preflight), preflight
    assert "Mirror | Each repo from the NAS hub to the local hub, pass stage" not in tasks
    assert snapshot_diff(before, tree_snapshot(str(shared))) == []
