"""Receipts in use, judged as the host sees them, and no engine image pulls unless asked - on real Podman.

Through ansible-playbook stage-deepseek.yml:
- a container under a name unrelated to the engine, with the receipt parent bound at /cache (another
  path than on the host), holds /cache/<root>/worker.json open: the receipts play refuses, naming the
  root, the holder (pid, command, container) and the fix; receipt_force removes them; once the
  container is gone the play removes them with no force;
- a file held open through a bind of an ancestor of the parent (no mount of the parent at all) is found
  by its device and inode; a container that only binds the parent counts as in use too;
- this host's running engine (engine_name) keeps its own receipts, but a stranger still refuses;
- with engine_pull never (the default), a missing engine image fails preflight on both hosts of a
  two-host lane, in --check too, naming the image and the host, and nothing is written on a host.
Containers run the test-double engine image (tests/engine_double) with `sh` and `sleep` as holders.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS
from conftest import REPO_ROOT, failures, run_playbook
from hubgen import build_nas_hub

IMAGE = "localhost/dgx-stage-engine-double:test"
NAMES = list(RECEIPT_ROOTS)


def podman_env():
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", os.path.join(REPO_ROOT, "molecule", "containers.conf"))
    return env


def podman(*args, **kwargs):
    return subprocess.run(["podman"] + list(args), env=podman_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=kwargs.pop("timeout", 120), **kwargs)


def podman_unusable():
    if not shutil.which("podman"):
        return "podman is not installed (make system-packages installs it)"
    try:
        info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "podman info failed: %s" % exc
    return None if info.returncode == 0 else "podman is not usable: %s" % info.stderr.decode()[:300]


pytestmark = pytest.mark.skipif(podman_unusable() is not None, reason=str(podman_unusable()))


@pytest.fixture(scope="module")
def image():
    build = subprocess.run(["bash", os.path.join(REPO_ROOT, "tests", "engine_double", "build.sh")], env=podman_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert build.returncode == 0, build.stdout.decode("utf-8", "replace")
    return IMAGE


@pytest.fixture
def containers():
    """start(name_prefix, binds, script) -> (name, id): a holder container, removed at teardown."""
    started = []

    def start(prefix, binds, script):
        name = "dgx-stage-test-%s-%s" % (prefix, uuid.uuid4().hex[:8])
        args = ["run", "-d", "--init", "--name", name]
        for source, target in binds:
            args += ["-v", "%s:%s" % (source, target)]
        run = podman(*(args + [IMAGE, "sh", "-c", script + "; echo ready; exec sleep 600"]))
        assert run.returncode == 0, run.stderr.decode()
        started.append(name)
        deadline = time.monotonic() + 30
        while b"ready" not in podman("logs", name).stdout:
            assert time.monotonic() < deadline, "holder container %s did not get ready" % name
            time.sleep(0.2)
        return name, run.stdout.decode().strip()

    yield start
    for name in started:
        podman("rm", "--force", "--time", "0", "--ignore", name)


def write_inventory(work, hosts, **group_vars):
    inventory = os.path.join(work, "inventory")
    os.makedirs(os.path.join(inventory, "group_vars", "all"))
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    with open(os.path.join(inventory, "hosts.yml"), "w") as handle:
        json.dump({"all": {"children": {"exl3_2x": {"hosts": dict(
            (host, dict(local, **host_vars)) for host, host_vars in hosts.items())}}}}, handle)
    with open(os.path.join(inventory, "group_vars", "all", "lane.yml"), "w") as handle:
        json.dump(dict({"lane": "exl3_2x", "engine_enabled": True, "engine_runtime": "podman",
                        "stage_report_dir": os.path.join(work, "reports")}, **group_vars), handle)
    return inventory


def plant(parent):
    for name in NAMES:
        os.makedirs(os.path.join(parent, name), exist_ok=True)
        with open(os.path.join(parent, name, "worker.json"), "w") as handle:
            handle.write('{"from": "an earlier run"}')


@pytest.fixture
def lane(tmp_path, image):
    """One localhost rank; its receipt parent <work>/srv/cache holds the three roots."""
    work = str(tmp_path)
    parent = os.path.join(work, "srv", "cache")
    plant(parent)
    engine_name = "dgx-stage-test-engine-%s" % uuid.uuid4().hex[:8]
    # (The hub settings only satisfy the argument specs checked in every play; nothing is staged.)
    inventory = write_inventory(work, {"localhost": {}}, receipt_parent=parent, engine_name=engine_name,
                                engine_image=image, hub_nas_root=os.path.join(work, "nas"),
                                hub_local_root=os.path.join(work, "local", "hub"),
                                stage_repos=[{"repo_id": "coolbho3k/DSpark-drafter"}])
    return {"work": work, "parent": parent, "inventory": inventory, "engine_name": engine_name,
            "roots": [os.path.join(parent, n) for n in NAMES]}


def receipts_play(lane, *extra):
    return run_playbook(lane["work"], lane["inventory"], "--tags", "receipts", *extra)


def receipt_result(data):
    for play in data["plays"]:
        for task in play["tasks"]:
            if "Receipt | Remove" in task["task"]["name"]:
                return task["hosts"]["localhost"]
    raise AssertionError("the receipt task did not run: %s" % failures(data))


def refusal(data):
    result = receipt_result(data)
    assert result.get("failed"), result
    return result["msg"]


def test_a_file_held_through_the_containers_own_path_refuses_until_forced_or_gone(lane, containers):
    started = time.monotonic()
    held = "/cache/%s/worker.json" % NAMES[1]
    name, cid = containers("holder", [(lane["parent"], "/cache")], "exec 3<%s" % held)

    rc, data = receipts_play(lane)
    assert rc != 0
    msg = refusal(data)
    # The root, the holder (its command, container and the path it uses) and the fix.
    assert "refusing to remove receipt roots in use: %s." % ", ".join(lane["roots"]) in msg
    assert "(sleep, container %s) has %s/worker.json open (as %s)" % (cid[:12], lane["roots"][1], held) in msg
    assert "binds %s, the receipt parent, at /cache" % lane["parent"] in msg
    assert "Stop container %s first" % cid[:12] in msg
    assert "`dgx-stage clean-receipts --limit localhost -e receipt_force=true`" in msg
    assert all(os.path.isfile(os.path.join(r, "worker.json")) for r in lane["roots"]), "refused: nothing removed"
    # The play's rescue fails the host with the play and the task named.
    assert any("receipts" in f for f in failures(data)), failures(data)

    rc, data = receipts_play(lane, "-e", "receipt_force=true")
    assert rc == 0, failures(data)
    forced = receipt_result(data)
    assert sorted(forced["removed"]) == sorted(lane["roots"]) and not os.listdir(lane["parent"])
    assert any(h["container"] == cid and h["how"] == "open" and h["seen_as"] == held for h in forced["holders"])
    assert any("removed receipt roots while in use" in w for w in forced.get("warnings", [])), forced

    # Gone: the next run removes a new set with no force.
    plant(lane["parent"])
    podman("rm", "--force", "--time", "0", name)
    rc, data = receipts_play(lane)
    assert rc == 0, failures(data)
    assert sorted(receipt_result(data)["removed"]) == sorted(lane["roots"])
    assert time.monotonic() - started < 60


def test_an_open_file_is_found_by_inode_through_a_bind_of_an_ancestor(lane, containers):
    # The container binds <work>/srv at /data read-write: it can reach every root (a holder of them all),
    # and its open file /data/cache/<root>/worker.json is the host's <parent>/<root>/worker.json.
    held = "/data/cache/%s/worker.json" % NAMES[2]
    ancestor = os.path.dirname(lane["parent"])
    _name, cid = containers("ancestor", [(ancestor, "/data")], "exec 3<%s" % held)
    rc, data = receipts_play(lane)
    assert rc != 0
    msg = refusal(data)
    assert "in use: %s." % ", ".join(lane["roots"]) in msg
    assert "mounts %s which contains %s" % (ancestor, lane["parent"]) in msg, msg
    assert "has %s/worker.json open (as %s)" % (lane["roots"][2], held) in msg
    assert "receipt parent" not in msg and cid[:12] in msg
    assert sorted(os.listdir(lane["parent"])) == NAMES


def test_a_container_binding_the_parent_under_any_name_is_in_use_and_the_engine_keeps_its_own(lane, containers):
    _name, stranger = containers("stranger", [(lane["parent"], "/receipts")], "true")
    rc, data = receipts_play(lane)
    assert rc != 0
    msg = refusal(data)
    assert "binds %s, the receipt parent, at /receipts" % lane["parent"] in msg and stranger[:12] in msg
    podman("rm", "--force", "--time", "0", _name)

    # A container under engine_name binding the parent is this host's running engine: its receipts
    # belong to the live run and stay; the play passes.
    engine, engine_id = containers("engine", [(lane["parent"], "/cache")], "true")
    podman("rename", engine, lane["engine_name"])
    try:
        rc, data = receipts_play(lane)
        assert rc == 0, failures(data)
        result = receipt_result(data)
        assert (result["kept"], result["removed"], result["changed"]) == (lane["roots"], [], False)
        assert sorted(os.listdir(lane["parent"])) == NAMES

        # The engine's name is no licence for anyone else: a stranger holding a root still refuses.
        containers("second", [(lane["roots"][0], "/x")], "true")
        rc, data = receipts_play(lane)
        assert rc != 0
        msg = refusal(data)
        assert "in use: %s." % lane["roots"][0] in msg and engine_id[:12] not in msg
    finally:
        podman("rm", "--force", "--time", "0", "--ignore", lane["engine_name"])


def test_a_missing_image_fails_preflight_on_every_host_and_nothing_is_written(tmp_path, image):
    work = str(tmp_path)
    nas = build_nas_hub(os.path.join(work, "nas"), shard_size=16 * 1024, n_shards=2)
    missing = "localhost/dgx-stage-test-missing-%s:never" % uuid.uuid4().hex[:8]
    hosts = {}
    for host in ("rank0", "rank1"):
        base = os.path.join(work, host)
        os.makedirs(os.path.join(base, "local", "hub"))
        plant(os.path.join(base, "cache"))
        hosts[host] = {"hub_local_root": os.path.join(base, "local", "hub"),
                       "receipt_parent": os.path.join(base, "cache"),
                       "engine_manifest_path": os.path.join(base, "engine-manifest.json"),
                       "engine_name": "dgx-stage-test-never-%s-%s" % (host, uuid.uuid4().hex[:8])}
    inventory = write_inventory(work, hosts, hub_nas_root=nas["hub"], engine_image=missing,
                                stage_repos=[{"repo_id": "coolbho3k/DSpark-drafter"}])
    image_task = "Image | The engine image is on the host, or engine_pull allows a pull"

    def host_failures(data):
        return dict((host, result["msg"]) for play in data["plays"] for task in play["tasks"]
                    if task["task"]["name"].endswith(image_task) for host, result in task["hosts"].items()
                    if result.get("failed"))

    for mode in ([], ["--check"]):
        rc, data = run_playbook(work, inventory, *mode)
        assert rc != 0
        found = host_failures(data)
        assert sorted(found) == ["rank0", "rank1"], failures(data)
        for host, msg in found.items():
            assert "Engine image %s is not on %s (podman)" % (missing, host) in msg
            assert "engine_pull is never" in msg and "`dgx-stage serve -e engine_pull=missing`" in msg
        # Nothing after preflight ran: no staging, receipts, manifest or container.
        for host, host_vars in hosts.items():
            assert os.listdir(host_vars["hub_local_root"]) == []
            assert sorted(os.listdir(host_vars["receipt_parent"])) == NAMES
            assert not os.path.exists(host_vars["engine_manifest_path"])
            assert podman("container", "exists", host_vars["engine_name"]).returncode == 1
        assert podman("image", "exists", missing).returncode == 1, "nothing may be pulled"

    def image_checked(data):
        """host -> whether the image task ran (not skipped) and passed there."""
        return dict((host, not result.get("failed") and not result.get("skipped"))
                    for play in data["plays"] for task in play["tasks"]
                    if task["task"]["name"].endswith(image_task) for host, result in task["hosts"].items())

    # engine_pull: missing lets preflight pass (the engine play would pull: --check pulls nothing), through the
    # whole playbook, so the image task really ran on both hosts. (An image that is there passes it in every
    # engine test's first run: test_engine_one_rank's runs the whole playbook.)
    rc, data = run_playbook(work, inventory, "--check", "-e", "engine_pull=missing")
    assert rc == 0, failures(data)
    assert image_checked(data) == {"rank0": True, "rank1": True}
    assert podman("image", "exists", missing).returncode == 1, "nothing may be pulled"
    # A run that does not reach the engine play needs no image: staging goes ahead of the image's arrival.
    rc, data = run_playbook(work, inventory, "--tags", "preflight,stage")
    assert rc == 0, failures(data)
    assert image_checked(data) == {"rank0": False, "rank1": False}
