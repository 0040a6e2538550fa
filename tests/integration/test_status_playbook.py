"""playbooks/status.yml on a generated hub (`dgx-stage status`): per host the staged commit of each repo,
when it was last verified and how (after `--tags verify -e stage_verify=full`), receipts present, the engine
"disabled" with engine_enabled false, "snapshot missing" for a ref to a missing snapshot; changed=0 and not
a byte written anywhere, in --check too."""
import json
import os
import subprocess
import time
import uuid

import pytest

import runtimes
from conftest import BIN_DIR, REPO_ROOT, ansible_env, failures
from hubgen import DRAFTER_REPO, MAIN_REPO
from test_engine_one_rank import IMAGE, build_engine_double
from test_reports import run, staged_dgx1, write_lane
from treestate import snapshot_diff, tree_snapshot

MAIN_FOLDER = "models--" + MAIN_REPO.replace("/", "--")
DRAFTER_FOLDER = "models--" + DRAFTER_REPO.replace("/", "--")


def run_status(tmp_path, inventory, *args):
    """ansible-playbook playbooks/status.yml with the json callback: (exit code, output, {host: status result})."""
    cmd = [os.path.join(BIN_DIR, "ansible-playbook"), "-i", inventory,
           os.path.join(REPO_ROOT, "playbooks", "status.yml")] + list(args)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=ansible_env(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=300)
    try:
        data = json.loads(proc.stdout.decode("utf-8", "replace"))
    except ValueError:
        raise AssertionError("rc=%d\n%s\n%s" % (proc.returncode, proc.stdout[-4000:], proc.stderr[-3000:]))
    results = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == "What this host holds":
                results.update(task["hosts"])
    return proc.returncode, data, results


def state(tmp_path):
    """Everything the run could write: the node's local hub and receipts, the controller's reports."""
    return dict((name, tree_snapshot(str(tmp_path / name))) for name in ("dgx1", "reports", "cache")
                if (tmp_path / name).exists())


def assert_nothing_changed(data, before, after):
    assert all(stats["changed"] == 0 for stats in data["stats"].values()), data["stats"]
    for name in before:
        assert snapshot_diff(before[name], after[name]) == [], name
    assert sorted(before) == sorted(after)


def test_status_after_a_full_verify_shows_commit_verify_time_and_mode_receipts_and_engine(staged_hub):
    lane = staged_hub("dgx1", staged_dgx1)            # a good stage run of the lane (its receipts play not run)
    tmp_path, nas_hub = lane["dir"], lane["nas"]
    (tmp_path / "cache" / "ds41-combined-ready").mkdir(parents=True)
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], receipt_parent=str(tmp_path / "cache"))
    before_verify = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    code, data, _times = run(tmp_path, inventory, "-e", "stage_verify=full", tags="verify")
    assert code == 0, failures(data)
    after_verify = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    hub = tmp_path / "dgx1" / "hub"
    commit = (hub / MAIN_FOLDER / "refs" / "main").read_text().strip()

    before = state(tmp_path)
    code, data, results = run_status(tmp_path, inventory)
    assert code == 0, failures(data)
    assert_nothing_changed(data, before, state(tmp_path))
    status, lines = results["dgx1"]["status"], results["dgx1"]["lines"]
    main = status["repos"][0]
    assert (main["repo_id"], main["state"], main["commit"]) == (MAIN_REPO, "staged", commit)
    assert main["verify_mode"] == "full" and main["last_verify_status"] == "ok"
    assert before_verify <= main["last_verified"] <= after_verify and main["last_staged"] < main["last_verified"]
    assert main["files_local"] > 0 and main["bytes_local"] > 0
    assert lines[0].startswith("%s@main: commit %s, %d files" % (MAIN_REPO, commit[:12], main["files_local"]))
    assert "verified %s (full)" % main["last_verified"] in lines[0]
    assert status["receipts"]["present"] == ["ds41-combined-ready"]
    assert "receipts under %s: ds41-combined-ready" % (tmp_path / "cache") in lines
    assert status["engine"]["state"] == "disabled" and lines[-1] == "engine ds41-engine: disabled"
    # The play prints the lines with one debug task.
    printed = [task["hosts"]["dgx1"]["msg"] for play in data["plays"] for task in play["tasks"]
               if task["task"]["name"] == "Status of the host"]
    assert printed == [lines]

    # A ref pointing at a snapshot that is not there; and --check reads the same, writes nothing.
    (hub / DRAFTER_FOLDER / "refs" / "main").write_text("f" * 40)
    before = state(tmp_path)
    code, data, results = run_status(tmp_path, inventory, "--check", "--diff")
    assert code == 0, failures(data)
    assert_nothing_changed(data, before, state(tmp_path))
    drafter = results["dgx1"]["status"]["repos"][1]
    assert (drafter["state"], drafter["commit"]) == ("snapshot missing", "f" * 40)
    assert results["dgx1"]["lines"][1].startswith("%s@main: snapshot missing" % DRAFTER_REPO)


def test_status_of_a_host_with_nothing_staged(tmp_path, nas_hub):
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], receipt_parent=str(tmp_path / "cache"))
    code, data, results = run_status(tmp_path, inventory)
    assert code == 0, failures(data)
    assert [r["state"] for r in results["dgx1"]["status"]["repos"]] == ["not staged", "not staged"]
    assert results["dgx1"]["lines"][0] == "%s@main: not staged" % MAIN_REPO
    assert not (tmp_path / "dgx1").exists() and not (tmp_path / "reports").exists()


def test_a_plain_ansible_playbook_run_prints_each_hosts_status_lines(tmp_path, nas_hub):
    """ansible.cfg hides ok results (the play's debug task of the lines): its stdout callback prints them."""
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], receipt_parent=str(tmp_path / "cache"))
    env = ansible_env(tmp_path)
    env.pop("ANSIBLE_STDOUT_CALLBACK")    # the repo's ansible.cfg: dgx_stdout
    proc = subprocess.run([os.path.join(BIN_DIR, "ansible-playbook"), "-i", inventory,
                           os.path.join(REPO_ROOT, "playbooks", "status.yml")], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, out
    tail = out[out.index("DGX-STAGE STATUS: lane exl3_2x, 1 host"):].splitlines()
    assert tail[:3] == ["DGX-STAGE STATUS: lane exl3_2x, 1 host", "dgx1 (rank 0):", "  %s@main: not staged" % MAIN_REPO]
    assert "  engine ds41-engine: disabled" in tail and "1/1 hosts read" in tail
    assert "HOST " not in out                       # no empty lane table


@pytest.mark.parametrize("runtime", runtimes.params(("podman",)))
def test_the_log_of_an_exited_engine_is_read_without_its_secrets(tmp_path, nas_hub, runtime):
    """An engine that printed its arguments (vLLM logs its api_key) and exited: the status probe reads the end of
    its log, which reaches the play's results (a runs dir's job events, a JSON callback) without the secrets."""
    build_engine_double()
    key, token = "sk-statusKEY%d" % os.getpid(), "hf_statusTOKEN%d" % os.getpid()
    name = "dgx-stage-test-status-%s" % uuid.uuid4().hex[:8]
    command = ["sh", "-c", 'echo "args: key $2 token $HF_TOKEN"; exit 3', "engine", "--api-key", key]
    inventory = write_lane(tmp_path, nas_hub["hub"], ["dgx1"], receipt_parent=str(tmp_path / "cache"),
                           engine_enabled=True, engine_runtime=runtime, engine_name=name, engine_image=IMAGE,
                           engine_env={"HF_TOKEN": token}, engine_command=command)
    try:
        started = runtimes.cli(runtime, "run", "--name", name, "-e", "HF_TOKEN=" + token, IMAGE, *command)
        assert started.returncode == 3, started.stderr
        code, data, results = run_status(tmp_path, inventory)
        assert code == 0, failures(data)
        assert "exited (exit code 3)" in results["dgx1"]["lines"][-1]
        shown = json.dumps(data)
        assert "args: key " in shown and key not in shown and token not in shown
    finally:
        runtimes.remove(runtime, name)
