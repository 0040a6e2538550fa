"""The engine role against a real container runtime, Podman and Docker (the default), with engine_double,
a TEST DOUBLE of the inference engine (tests/engine_double), as the image.

One rank on localhost (test_engine_lane.py covers two). The lane is staged from a generated hub without the
optional page15 pack, the manifest written, the double started through the engine role with
engine_runtime=podman, then again with engine_runtime=docker (the same checks on each runtime). The double
reports what it sees from inside the container, which proves: every local bind resolves to the staged bytes,
page15 is visible through a read-only NAS bind (a write there fails), the rank environment is set. Then: smoke
and decode probe results are in the host report, a re-run changes nothing (the container is not recreated), a
config change restarts it, and yesterday's stale receipts make the engine fail when nobody clears them, but
not when the plays do (crash layer 2 of the night-shift log).
"""
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid

import pytest

from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS
from conftest import REPO_ROOT, failures, run_playbook
from treestate import sha256_file
from hubgen import build_nas_hub
import runtimes

# Fully qualified: Docker would look a short name up in a registry.
IMAGE = "localhost/dgx-stage-engine-double:test"
RECEIPT_NAMES = list(RECEIPT_ROOTS)
# engine_double writes (strict-on-exists, like the engine) the receipt roots its environment names.
DOUBLE_RECEIPTS = {"DOUBLE_RECEIPT_ROOTS": ",".join(RECEIPT_NAMES)}
MAIN_REPO = "coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw"
DRAFTER_REPO = "coolbho3k/DSpark-drafter"
TOKENS_PER_S = 400  # the double's decode speed; 400 tokens take ~1 s
OTHER_UID = 4242


def podman_env():
    return runtimes.runtime_env()


def podman(*args, **kwargs):
    return runtimes.cli("podman", *args, **kwargs)


def podman_unusable():
    """Why Podman cannot run containers here, or None."""
    return runtimes.unusable("podman")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def plant_stale_receipts(parent):
    """Yesterday's receipts: root dirs owned by another user, a read-only worker.json in each."""
    for name in RECEIPT_NAMES:
        root = os.path.join(parent, name)
        os.makedirs(root)
        worker = os.path.join(root, "worker.json")
        with open(worker, "w") as handle:
            handle.write('{"from": "yesterday"}')
        os.chmod(worker, 0o444)
        os.lchown(worker, OTHER_UID, OTHER_UID)
        os.lchown(root, OTHER_UID, OTHER_UID)


def changed_tasks(data):
    return [task["task"]["name"] for play in data["plays"] for task in play["tasks"]
            if any(r.get("changed") for r in task["hosts"].values())]


def task_result(data, name_part):
    for play in data["plays"]:
        for task in play["tasks"]:
            if name_part in task["task"]["name"]:
                return list(task["hosts"].values())[0]
    raise AssertionError("no task named like %r ran" % name_part)


def double(lane, path, payload=None):
    """Ask the running engine_double (GET, or POST JSON)."""
    url = "http://127.0.0.1:%d%s" % (lane["port"], path)
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read().decode())


def build_engine_double():
    """The engine_double image (tests/engine_double/build.sh: rebuilt only when its files changed; put into
    Docker too when a Docker daemon answers)."""
    build = subprocess.run(["bash", os.path.join(REPO_ROOT, "tests", "engine_double", "build.sh")],
                           env=podman_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert build.returncode == 0, build.stdout.decode("utf-8", "replace")


def lane_settings(work, hub_nas_root, stage_repos, name, port, runtime="podman", **extra):
    """group_vars of a one-rank lane under work running engine_double as container `name` on port."""
    settings = {
        "lane": "exl3_2x",
        "hub_nas_root": hub_nas_root,
        "hub_local_root": os.path.join(work, "local", "hub"),
        "stage_repos": stage_repos,
        "stage_report_dir": os.path.join(work, "reports"),
        "receipt_parent": os.path.join(work, "cache"),
        "engine_manifest_path": os.path.join(work, "local", "engine-manifest.json"),
        "engine_enabled": True,
        "engine_runtime": runtime,
        "engine_image": IMAGE,
        "engine_name": name,
        "engine_port": port,
        "engine_command": ["python3", "/opt/engine_double/engine_double.py", "--port", str(port)],
        "engine_env": DOUBLE_RECEIPTS,
        "engine_gpu_devices": [],  # no GPU here (podman)
        "engine_gpu_requests": [],  # (docker)
        "engine_ready_timeout": 60,
        "engine_ready_poll": 2,
    }
    settings.update(extra)
    return settings


def write_lane_inventory(work, settings):
    """An inventory under work: localhost, the one rank of exl3_2x, with settings as group_vars/all."""
    inventory = os.path.join(work, "inventory")
    os.makedirs(os.path.join(inventory, "group_vars", "all"))
    with open(os.path.join(inventory, "hosts.yml"), "w") as handle:
        json.dump({"all": {"children": {"exl3_2x": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}, handle)
    with open(os.path.join(inventory, "group_vars", "all", "lane.yml"), "w") as handle:
        json.dump(settings, handle)
    return inventory


@pytest.fixture(scope="module", params=runtimes.params())
def lane(request, tmp_path_factory):
    """Image built, a generated hub, a one-rank lane on one runtime; the whole sequence run once per runtime."""
    runtime = request.param
    build_engine_double()
    work = str(tmp_path_factory.mktemp("engine-" + runtime))
    nas = build_nas_hub(os.path.join(work, "nas"), shard_size=16 * 1024, n_shards=4)
    port = free_port()
    name = "dgx-stage-test-engine-double-%s-%s" % (runtime, uuid.uuid4().hex[:8])
    cache = os.path.join(work, "cache")
    os.makedirs(cache)
    plant_stale_receipts(cache)
    settings = lane_settings(
        work, nas["hub"], [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}, {"repo_id": DRAFTER_REPO}],
        name, port, runtime, engine_env=dict(DOUBLE_RECEIPTS, DOUBLE_TOKENS_PER_S=TOKENS_PER_S, DOUBLE_STARTUP_DELAY_S=2),
        engine_master_port=29511, engine_decode_floor=30.78)
    inventory = write_lane_inventory(work, settings)
    info = {"work": work, "nas": nas, "port": port, "name": name, "cache": cache, "inventory": inventory,
            "settings": settings, "report": os.path.join(work, "reports", "localhost.json"), "runtime": runtime}
    try:
        rc, data = run_playbook(work, inventory, "--tags", "stage,receipts,manifest,engine,smoke")
        info["first_run"] = (rc, data)
        yield info
    finally:
        runtimes.remove(runtime, name)


def on_podman_only(lane):
    """The runtime-independent checks run once, on Podman."""
    if lane["runtime"] != "podman":
        pytest.skip("runtime-independent: checked on podman only")


def test_first_run_starts_the_engine_and_reports_smoke_and_decode(lane):
    rc, data = lane["first_run"]
    assert rc == 0, failures(data)
    # The stale receipts were cleared before the start; the double then wrote this run's receipts.
    assert sorted(os.listdir(lane["cache"])) == RECEIPT_NAMES
    for name in RECEIPT_NAMES:
        with open(os.path.join(lane["cache"], name, "worker.json")) as handle:
            assert json.load(handle)["rank"] == "0"
    with open(lane["report"]) as handle:
        engine = json.load(handle)["engine"]
    assert engine["runtime"] == lane["runtime"] and engine["rank"] == 0 and engine["world_size"] == 1
    assert engine["smoke"]["passed"] is True and "11303" in engine["smoke"]["answer"]
    decode = engine["decode"]
    assert decode["tokens"] == 400 and decode["passed"] is True and decode["floor"] == 30.78
    # The double paces its stream at TOKENS_PER_S; the probe measures it from first to last token.
    assert 0.6 * TOKENS_PER_S <= decode["decode_tok_s"] <= 1.1 * TOKENS_PER_S
    assert engine["manifest"]["counts"]["nas"] == 1


def test_manifest_binds_resolve_inside_the_container_and_nas_binds_are_read_only(lane):
    with open(lane["settings"]["engine_manifest_path"]) as handle:
        manifest = json.load(handle)
    local = [m for m in manifest["mounts"] if m["origin"] == "local"]
    nas_dirs = [m for m in manifest["mounts"] if m["origin"] == "nas"]
    main = [r for r in manifest["repos"] if r["repo_id"] == MAIN_REPO][0]
    page15 = lane["nas"]["repos"][MAIN_REPO]["page15"]
    assert [m["target"] for m in nas_dirs] == [main["target"] + "/page15"]

    paths = [m["target"] for m in local] + [main["target"] + "/" + rel for rel in page15]
    seen = double(lane, "/debug/mounts", {"paths": paths})
    mounts = dict((m["mount_point"], m) for m in seen["mounts"])
    for mount in local + nas_dirs:
        assert mount["target"] in mounts, "%s is not mounted in the container" % mount["target"]
        assert mounts[mount["target"]]["read_only"], mount["target"]
    assert mounts["/cache"]["read_only"] is False  # the engine writes its receipts there

    # Every local bind carries the staged bytes; page15 resolves through the NAS bind.
    for mount in local:
        got = seen["files"][mount["target"]]
        assert got["readable"] and got["sha256"] == sha256_file(mount["source"]), mount["target"]
    for rel in page15:
        got = seen["files"][main["target"] + "/" + rel]
        assert got["readable"], (rel, got["error"])
        assert got["sha256"] == lane["nas"]["repos"][MAIN_REPO]["files"][rel]["sha256"]

    # The NAS is read-only inside the container.
    for target in (nas_dirs[0]["target"], main["target"] + "/" + page15[0]):
        attempt = double(lane, "/debug/try-write", {"path": target})
        assert attempt["ok"] is False and attempt["errno"] == errno.EROFS, attempt

    assert seen["env"] == {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29511",
                           "HF_HUB_OFFLINE": "1", "MODEL_PATH": main["target"]}


def test_rerun_changes_nothing_and_keeps_the_container(lane):
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    assert before
    # The bench (tag bench, not run by default) rides along: the shipped 5-item sample, floor 5.
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "receipts,manifest,engine,smoke,bench",
                            "-e", "engine_bench_floor=5")
    assert rc == 0, failures(data)
    assert data["stats"]["localhost"]["changed"] == 0, changed_tasks(data)
    assert runtimes.container_ids(lane["runtime"], lane["name"]) == before
    # The live run's receipts were left alone.
    assert sorted(os.listdir(lane["cache"])) == RECEIPT_NAMES
    with open(lane["report"]) as handle:
        bench = json.load(handle)["engine"]["bench"]
    assert (bench["total_items"], bench["passed_items"], bench["floor"], bench["failed_items"]) == (5, 5, 5, [])
    assert bench["passed"] is True


def test_a_config_change_restarts_the_container(lane):
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    env = dict(lane["settings"]["engine_env"], DOUBLE_TEST_KNOB="1")
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine", "-e", json.dumps({"engine_env": env}))
    assert rc == 0, failures(data)
    assert "restarts: env changed (DOUBLE_TEST_KNOB)" in task_result(data, "Restart plan")["msg"]
    after = runtimes.container_ids(lane["runtime"], lane["name"])
    assert after and after.split()[0] != before.split()[0]
    inspect = json.loads(runtimes.cli(lane["runtime"], "inspect", "--type", "container", lane["name"]).stdout)[0]
    assert "DOUBLE_TEST_KNOB=1" in inspect["Config"]["Env"]
    # This run's receipts, written after the old ones were cleared.
    with open(os.path.join(lane["cache"], RECEIPT_NAMES[0], "worker.json")) as handle:
        assert json.load(handle)["rank"] == "0"


def test_docker_without_python_requests_on_the_node_fails_naming_the_package(lane, tmp_path):
    if lane["runtime"] != "docker":
        pytest.skip("docker only: community.docker needs requests in the node's Python")
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    bare = tmp_path / "bare-python"   # a node Python without requests (a venv sees no system packages)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "preflight,engine",
                            "-e", "ansible_python_interpreter=%s" % python)
    assert rc != 0
    refused = [f for f in failures(data) if "has no 'requests' package" in f]
    assert refused and "apt-get install python3-requests" in refused[0] and python in refused[0], failures(data)
    assert runtimes.container_ids(lane["runtime"], lane["name"]) == before


def test_decode_below_the_floor_fails_clearly_and_is_still_reported(lane):
    on_podman_only(lane)
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "smoke", "-e", "engine_decode_floor=100000")
    assert rc != 0
    assert any("below engine_decode_floor=100000" in f for f in failures(data)), failures(data)
    with open(lane["report"]) as handle:
        decode = json.load(handle)["engine"]["decode"]
    assert decode["passed"] is False and decode["floor"] == 100000 and decode["decode_tok_s"] > 30.78


def test_stale_receipts_break_a_restart_unless_the_plays_clear_them(lane):
    # Yesterday's run ended; its receipts stay behind, owned by another user.
    runtime = lane["runtime"]
    assert runtimes.cli(runtime, "rm", "--force", lane["name"]).returncode == 0
    shutil.rmtree(lane["cache"])
    os.makedirs(lane["cache"])
    plant_stale_receipts(lane["cache"])

    # Started directly, nobody clears them: the strict-on-exists receipt writer refuses to start.
    direct = runtimes.cli(runtime, "run", "--rm", "--network", "host", "-v", "%s:/cache" % lane["cache"],
                    "-e", "DOUBLE_RECEIPT_ROOTS=" + DOUBLE_RECEIPTS["DOUBLE_RECEIPT_ROOTS"], IMAGE,
                    "python3", "/opt/engine_double/engine_double.py", "--port", str(free_port()))
    assert direct.returncode != 0
    assert ("FileExistsError: /cache/%s" % RECEIPT_NAMES[0]).encode() in direct.stderr

    # Through the plays with cleanup switched off (no receipt roots listed): the engine dies on start,
    # and the wait stops at once with its log instead of waiting out engine_ready_timeout.
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine",
                            "-e", json.dumps({"receipt_roots": []}))
    assert rc != 0
    assert any("FileExistsError" in f and "not running" in f for f in failures(data)), failures(data)
    assert data["elapsed_s"] < lane["settings"]["engine_ready_timeout"]

    # With the receipts play as shipped: cleared, the engine starts and answers.
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "receipts,engine")
    assert rc == 0, failures(data)
    assert sorted(task_result(data, "Remove the receipt roots")["removed"]) == sorted(
        os.path.join(lane["cache"], n) for n in RECEIPT_NAMES)
    with open(os.path.join(lane["cache"], RECEIPT_NAMES[0], "worker.json")) as handle:
        assert "from" not in json.load(handle)  # this run's receipt, not yesterday's
    assert double(lane, "/v1/models")["data"][0]["id"] == "engine-double"
