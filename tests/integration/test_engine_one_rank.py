"""The engine role against a real container runtime, Podman and Docker (the default), with engine_double,
a TEST DOUBLE of the inference engine (tests/engine_double), as the image.

One rank on localhost (test_engine_lane.py covers lanes of two and four). One hub, one staging run and one
running container per runtime serve every test here: the generated hub (staged without the optional page15
pack) plus a hand-built repo whose file names carry `:`, `,`, spaces, `=` and a double quote - exactly what
`--volume src:dst:ro` strings broke - with a NAS-only directory of such names (real files, never staged,
bound read-only from the NAS like page15). The operators' whole playbook runs once per runtime with
engine_runtime=podman, then =docker. The double reports what it sees from inside the container, which proves,
once per runtime: every manifest bind sits at its exact target, read-only, and every file of every NAS
snapshot reads back its bytes there (local binds the staged bytes, page15 and the odd directory through
their NAS binds), a write to a NAS or local bind fails, odd names stay whole, the rank environment is set.
How each runtime was asked is checked once each: Docker's API mount objects, Podman's CSV-quoted --mount
specs. Then: smoke and decode probe results are in the host report, a re-run changes nothing (the container
is not recreated; Podman re-runs the whole playbook, Docker the plays that ask the runtime), Docker's paused and self-restarting containers are restarted and a
missing image is refused on Docker (Docker reports these its own way), a bind path no runtime binds exactly stops the play before the
container is touched, and yesterday's stale receipts make the engine fail when nobody clears them, but not
when the plays do (crash layer 2 of the night-shift log).
"""
import errno
import hashlib
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
from conftest import BIN_DIR, REPO_ROOT, ansible_env, failures, run_playbook
from treestate import sha256_file
from hubgen import build_nas_hub, git_blob_sha1, repo_folder, sha256_hex
from nashub import NasHub
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

# The repo of odd names: snapshot links (git-sha1 and sha256 named blobs) and a NAS-only directory of real files.
ODD_REPO = "org/odd-names"
ODD_COMMIT = hashlib.sha1(b"odd-names").hexdigest()
NAS_DIR = "nas, dir:v2"           # a real-file directory left on the NAS (like page15/)
TRICKY = ["tok:v2.json", "a,b.json", "my file.json", "k=v \"q\".json"]
# snapshot-relative path -> (bytes, LFS?)
LINKED = dict([("config.json", (b'{"model_type": "double"}\n', False))]
              + [(name, (("content of %s\n" % name).encode(), False)) for name in TRICKY]
              + [("sub dir/x:y,z.json", (b'{"nested": true}\n', False)),
                 ("weights:v2, part 1.bin", (bytes(range(256)) * 64, True))])
NAS_FILES = dict(("%s/%s" % (NAS_DIR, name), ("nas bytes of %s\n" % name).encode()) for name in TRICKY)


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


def build_odd_repo(hub):
    """hub/models--org--odd-names: refs/main, blobs named by their hash, snapshot links, NAS-only real files."""
    repo = os.path.join(hub, repo_folder(ODD_REPO))
    os.makedirs(os.path.join(repo, "refs"))
    os.makedirs(os.path.join(repo, "blobs"))
    with open(os.path.join(repo, "refs", "main"), "w") as handle:
        handle.write(ODD_COMMIT)
    snapshot = os.path.join(repo, "snapshots", ODD_COMMIT)
    for rel, (data, lfs) in LINKED.items():
        name = sha256_hex(data) if lfs else git_blob_sha1(data)
        with open(os.path.join(repo, "blobs", name), "wb") as handle:
            handle.write(data)
        path = os.path.join(snapshot, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink("../" * (rel.count("/") + 2) + "blobs/" + name, path)
    for rel, data in NAS_FILES.items():
        path = os.path.join(snapshot, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)


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


def wait_seconds(data, play="Engine"):
    """Seconds from the wait's first task (its clock starting) to its verdict, in the play named like play."""
    from datetime import datetime

    def at(stamp):
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")

    for each in data["plays"]:
        if each["play"]["name"].startswith(play):
            tasks = each["tasks"]
            first = [t for t in tasks if "Wait | Start the clock" in t["task"]["name"]][0]
            last = [t for t in tasks if "Every rank is up and this run's" in t["task"]["name"]][-1]
            return (at(last["task"]["duration"]["end"]) - at(first["task"]["duration"]["start"])).total_seconds()
    raise AssertionError("no play named like %r" % play)


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
    """Image built, one read-only NAS hub (generated repos and the odd-names repo), a one-rank lane on one
    runtime, the operators' whole playbook run once per runtime; the NAS is checked unchanged at the end."""
    runtime = request.param
    build_engine_double()
    work = str(tmp_path_factory.mktemp("engine-" + runtime))
    root = os.path.join(work, "nas")
    nas = NasHub(build_nas_hub(root, shard_size=16 * 1024, n_shards=4))
    nas["root"] = root
    build_odd_repo(nas["hub"])
    nas.freeze()
    port = free_port()
    name = "dgx-stage-test-engine-double-%s-%s" % (runtime, uuid.uuid4().hex[:8])
    cache = os.path.join(work, "cache")
    os.makedirs(cache)
    plant_stale_receipts(cache)
    settings = lane_settings(
        work, nas["hub"], [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}, {"repo_id": DRAFTER_REPO},
                           {"repo_id": ODD_REPO, "ignore_patterns": [NAS_DIR + "/"]}],
        name, port, runtime, engine_env=dict(DOUBLE_RECEIPTS, DOUBLE_TOKENS_PER_S=TOKENS_PER_S, DOUBLE_STARTUP_DELAY_S=2),
        engine_master_port=29511)   # engine_decode_floor left at its default, the EXL3 2x reference
    inventory = write_lane_inventory(work, settings)
    info = {"work": work, "nas": nas, "port": port, "name": name, "cache": cache, "inventory": inventory,
            "settings": settings, "report": os.path.join(work, "reports", "localhost.json"), "runtime": runtime}
    try:
        info["first_run"] = run_playbook(work, inventory)      # every default play, as operators run it
        yield info
    finally:
        runtimes.remove(runtime, name)
        try:
            nas.assert_unchanged()
        finally:
            nas.thaw()


def on_podman_only(lane):
    """The runtime-independent checks run once, on Podman."""
    if lane["runtime"] != "podman":
        pytest.skip("runtime-independent: checked on podman only")


def manifest_of(lane):
    with open(lane["settings"]["engine_manifest_path"]) as handle:
        return json.load(handle)


def inspect_of(lane):
    return json.loads(runtimes.cli(lane["runtime"], "inspect", "--type", "container", lane["name"]).stdout.decode())[0]


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
    assert engine["master_addr"] == "localhost" and engine["name"] == lane["name"]
    assert engine["smoke"]["passed"] is True and "11303" in engine["smoke"]["answer"]
    decode = engine["decode"]
    assert decode["tokens"] == 400 and decode["passed"] is True and decode["floor"] == 30.78
    # The double paces its stream at TOKENS_PER_S; the probe measures it from first to last token.
    assert 0.6 * TOKENS_PER_S <= decode["decode_tok_s"] <= 1.1 * TOKENS_PER_S
    assert engine["manifest"]["counts"]["nas"] == 2     # page15 and the odd repo's NAS-only directory


def test_every_bind_resolves_inside_the_container_to_the_staged_bytes_read_only_with_odd_names_whole(lane):
    manifest = manifest_of(lane)
    target = dict((r["repo_id"], r["target"]) for r in manifest["repos"])
    local = [m for m in manifest["mounts"] if m["origin"] == "local"]
    nas_dirs = [m for m in manifest["mounts"] if m["origin"] == "nas"]
    odd = target[ODD_REPO]
    assert [m["target"] for m in nas_dirs] == [target[MAIN_REPO] + "/page15", odd + "/" + NAS_DIR]
    assert sorted(m["target"][len(odd) + 1:] for m in local if m["target"].startswith(odd + "/")) == sorted(LINKED)

    # Every file of every NAS snapshot, at its path under the repo's target, with the bytes it was published with.
    expected = {}
    for repo_id in (MAIN_REPO, DRAFTER_REPO):
        for rel, info in lane["nas"]["repos"][repo_id]["files"].items():
            expected[target[repo_id] + "/" + rel] = info["sha256"]
    for rel, (content, _) in LINKED.items():
        expected[odd + "/" + rel] = sha256_hex(content)
    for rel, content in NAS_FILES.items():
        expected[odd + "/" + rel] = sha256_hex(content)
    assert [p for p in expected if "/page15/" in p], "set-up: no page15 files in the NAS snapshot"
    seen = double(lane, "/debug/mounts", {"paths": sorted(set(expected) | set(m["target"] for m in local)),
                                          "dirs": [odd + "/" + NAS_DIR]})

    # Each bind sits at exactly its target (nothing split at a ':' or ','), read-only.
    mounts = dict((m["mount_point"], m) for m in seen["mounts"])
    for mount in manifest["mounts"]:
        assert mount["target"] in mounts, "%r is not mounted; mount points: %r" % (mount["target"], sorted(mounts))
        assert mounts[mount["target"]]["read_only"], mount["target"]
    assert mounts["/cache"]["read_only"] is False  # the engine writes its receipts there

    # Every local bind carries the staged bytes; every NAS file reads back, the NAS-only ones through the NAS binds.
    for mount in local:
        got = seen["files"][mount["target"]]
        assert got["readable"] and got["sha256"] == sha256_file(mount["source"]), (mount["target"], got)
    for path, sha in sorted(expected.items()):
        got = seen["files"][path]
        assert got["readable"] and got["sha256"] == sha, (path, got)
    assert seen["dirs"][odd + "/" + NAS_DIR] == sorted(TRICKY)

    # The NAS (directories and files) and the local binds are read-only inside the container.
    page15 = lane["nas"]["repos"][MAIN_REPO]["page15"]
    for path in ([m["target"] for m in nas_dirs] + [target[MAIN_REPO] + "/" + page15[0], odd + "/" + sorted(NAS_FILES)[0],
                                                     local[0]["target"]]):
        attempt = double(lane, "/debug/try-write", {"path": path})
        assert attempt["ok"] is False and attempt["errno"] == errno.EROFS, (path, attempt)

    assert seen["env"] == {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29511",
                           "HF_HUB_OFFLINE": "1", "MODEL_PATH": target[MAIN_REPO]}


def test_docker_got_api_mounts_with_the_names_intact(lane):
    if lane["runtime"] != "docker":
        pytest.skip("docker only (podman: the CSV-quoted --mount specs below)")
    inspect = inspect_of(lane)
    # The API's mount objects (HostConfig.Mounts, no string to split): the exact paths, read-only as asked.
    asked = dict((m["Target"], m) for m in inspect["HostConfig"]["Mounts"])
    manifest = manifest_of(lane)
    assert len(asked) == len(manifest["mounts"]) + 1  # + the receipt bind
    for mount in manifest["mounts"]:
        got = asked[mount["target"]]
        assert (got["Type"], got["Source"], got.get("ReadOnly")) == ("bind", mount["source"], True), got
    assert asked["/cache"]["Source"] == lane["cache"] and not asked["/cache"].get("ReadOnly")
    assert inspect["HostConfig"]["Binds"] in (None, [])   # never "src:dst:ro" strings
    # What the daemon bound (Mounts) agrees.
    bound = dict((m["Destination"], (m["Source"], m["RW"])) for m in inspect["Mounts"])
    assert all(bound[m["target"]] == (m["source"], False) for m in manifest["mounts"]), bound


def test_podman_got_csv_quoted_mount_specs_not_volume_strings(lane):
    if lane["runtime"] != "podman":
        pytest.skip("podman only (docker: the API mounts above)")
    inspect = inspect_of(lane)
    command = inspect["Config"]["CreateCommand"]
    assert "--volume" not in command and "-v" not in command
    specs = [command[i + 1] for i, arg in enumerate(command) if arg == "--mount"]
    manifest = manifest_of(lane)
    assert len(specs) == len(manifest["mounts"]) + 1  # + the receipt bind
    # A local file is bound from its blob (a hash name), so only its destination needs quoting;
    # the NAS directory has the comma on both sides.
    comma = [m for m in manifest["mounts"] if m["target"].endswith("/a,b.json")][0]
    assert 'type=bind,source=%s,"destination=%s",ro=true' % (comma["source"], comma["target"]) in specs
    nas = [m for m in manifest["mounts"] if m["origin"] == "nas" and m["target"].endswith("/" + NAS_DIR)][0]
    assert 'type=bind,"source=%s","destination=%s",ro=true' % (nas["source"], nas["target"]) in specs
    colon = [m for m in manifest["mounts"] if m["target"].endswith("/tok:v2.json")][0]
    assert "type=bind,source=%s,destination=%s,ro=true" % (colon["source"], colon["target"]) in specs
    assert "type=bind,source=%s,destination=/cache,ro=false" % lane["cache"] in specs
    assert len(inspect["Config"]["Labels"]["dgx-stage.mounts-sha256"]) == 64


def test_rerun_changes_nothing_and_keeps_the_container(lane):
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    assert before
    # On Podman the whole playbook again (stage included: the odd names are staged once), and the bench (tag
    # bench, not run by default) rides along: the shipped 5-item sample, floor 5. On Docker the plays that ask
    # the runtime (the stage and verify passes and the bench's HTTP calls do not).
    podman = lane["runtime"] == "podman"
    tags = ("all,bench", "-e", "engine_bench_floor=5") if podman else ("preflight,receipts,manifest,engine,smoke",)
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", *tags)
    assert rc == 0, failures(data)
    assert data["stats"]["localhost"]["changed"] == 0, changed_tasks(data)
    assert runtimes.container_ids(lane["runtime"], lane["name"]) == before
    # The live run's receipts were left alone.
    assert sorted(os.listdir(lane["cache"])) == RECEIPT_NAMES
    if not podman:
        return
    with open(lane["report"]) as handle:
        bench = json.load(handle)["engine"]["bench"]
    assert (bench["total_items"], bench["passed_items"], bench["floor"], bench["failed_items"]) == (5, 5, 5, [])
    assert bench["passed"] is True


def test_a_bind_path_no_runtime_binds_exactly_stops_the_play_before_the_container_is_touched(lane):
    on_podman_only(lane)   # the bind check runs before any runtime task
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    cache = lane["cache"].rstrip("/")
    odd_parent = os.path.join(os.path.dirname(cache), ".", os.path.basename(cache))  # Podman binds it cleaned
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine",
                            "-e", json.dumps({"receipt_parent": odd_parent}))
    assert rc != 0
    assert any("its source %r" % odd_parent in f and "normal form" in f for f in failures(data)), failures(data)
    assert runtimes.container_ids(lane["runtime"], lane["name"]) == before


def test_a_bound_file_gone_since_the_manifest_stops_the_play_before_any_rank_is_stopped(lane):
    """--tags engine after a prune: the manifest binds a local file that is gone. The runtime would fail the
    start after the rank was stopped; the play refuses first, naming the file, and the engine keeps running.
    (A copy of the manifest names the gone file: moving a staged blob away and back would change its ctime,
    and with it the lane's bound files.)"""
    on_podman_only(lane)   # read on the node before any runtime task
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    with open(lane["settings"]["engine_manifest_path"]) as handle:
        manifest = json.load(handle)
    bound = [m for m in manifest["mounts"] if m["origin"] == "local"][0]
    bound["source"] = os.path.join(os.path.dirname(bound["source"]), "0" * 64)      # pruned since
    stale = os.path.join(lane["work"], "stale-manifest.json")
    with open(stale, "w") as handle:
        json.dump(manifest, handle)
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine",
                            "-e", json.dumps({"engine_manifest_path": stale}))
    assert rc != 0
    assert any("the mount manifest is stale" in f and "%s is missing" % bound["source"] in f
               and "Nothing was stopped" in f for f in failures(data)), failures(data)
    assert runtimes.container_ids(lane["runtime"], lane["name"]) == before


def test_a_missing_manifest_stops_the_play_naming_it_before_the_container_is_touched(lane):
    on_podman_only(lane)   # read on the node before any runtime task
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    gone = lane["settings"]["engine_manifest_path"] + ".gone"
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine",
                            "-e", json.dumps({"engine_manifest_path": gone}))
    assert rc != 0
    said = "No mount manifest at %s (cannot read it: No such file or directory): its manifest play writes it " \
        "first - `dgx-stage serve`" % gone
    assert any(said in f for f in failures(data)), failures(data)
    assert runtimes.container_ids(lane["runtime"], lane["name"]) == before


def test_a_trailing_slash_on_receipt_parent_is_the_same_bind(lane):
    before = runtimes.container_ids(lane["runtime"], lane["name"])
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine",
                            "-e", json.dumps({"receipt_parent": lane["cache"].rstrip("/") + "/"}))
    assert rc == 0, failures(data)
    assert runtimes.container_ids(lane["runtime"], lane["name"]) == before


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


def test_docker_restarts_a_paused_or_self_restarting_engine_and_refuses_a_missing_image(lane):
    """Docker says Running for a paused container and for one its restart policy keeps restarting: neither is an
    engine that runs (Podman's states, on a whole lane: test_engine_lane.py). Each is restarted, and a re-run then
    changes nothing. An image Docker does not hold, with engine_pull=never, is refused before the container is
    touched and never pulled."""
    if lane["runtime"] != "docker":
        pytest.skip("docker only: Docker's own container states and image lookup")
    name, before = lane["name"], runtimes.container_ids("docker", lane["name"])
    for change, reason in ((("pause", name), "container paused"),
                           (("update", "--restart", "always", name), "restart policy always")):
        assert runtimes.cli("docker", *change).returncode == 0
        rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine")
        assert rc == 0, failures(data)
        assert reason in task_result(data, "Restart plan")["msg"], task_result(data, "Restart plan")
        after = runtimes.container_ids("docker", name)
        assert after and after != before and json.loads(runtimes.cli(
            "docker", "inspect", "--format", "{{json .State}}", name).stdout.decode())["Status"] == "running"
        before = after
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine")
    assert rc == 0 and data["stats"]["localhost"]["changed"] == 0, changed_tasks(data)
    assert runtimes.container_ids("docker", name) == before

    image = "registry.invalid/dgx-stage/missing-%s:1" % uuid.uuid4().hex[:8]
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine", "-e", "engine_image=%s" % image)
    assert rc != 0
    assert any("image %s is not on localhost and engine_pull=never" % image in f for f in failures(data)), \
        failures(data)
    assert not any("Container |" in t["task"]["name"] and not r.get("skipped")
                   for play in data["plays"] for t in play["tasks"] for r in t["hosts"].values())
    assert runtimes.container_ids("docker", name) == before
    assert runtimes.cli("docker", "image", "inspect", image).returncode != 0


def test_decode_below_the_floor_fails_clearly_and_is_still_reported(lane):
    on_podman_only(lane)
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "smoke", "-e", "engine_decode_floor=100000")
    assert rc != 0
    assert any("below engine_decode_floor=100000" in f for f in failures(data)), failures(data)
    with open(lane["report"]) as handle:
        decode = json.load(handle)["engine"]["decode"]
    assert decode["passed"] is False and decode["floor"] == 100000 and decode["decode_tok_s"] > 30.78


def test_stale_receipts_break_a_restart_unless_the_plays_clear_them(lane):
    on_podman_only(lane)   # the receipts play and the wait's verdict on a dead rank decide alike on Docker
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
    assert wait_seconds(data) < lane["settings"]["engine_ready_timeout"], (wait_seconds(data), data["elapsed_s"])

    # With the receipts play as shipped: cleared, the engine starts and answers.
    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "receipts,engine")
    assert rc == 0, failures(data)
    assert sorted(task_result(data, "Remove the receipt roots")["removed"]) == sorted(
        os.path.join(lane["cache"], n) for n in RECEIPT_NAMES)
    with open(os.path.join(lane["cache"], RECEIPT_NAMES[0], "worker.json")) as handle:
        assert "from" not in json.load(handle)  # this run's receipt, not yesterday's
    assert double(lane, "/v1/models")["data"][0]["id"] == "engine-double"


def test_a_secret_in_engine_env_appears_in_no_output_of_a_check_diff_or_a_real_run(lane):
    """HF_TOKEN in engine_env and a token in the engine command, new to the lane (so the dry run differs and
    the lane restarts): neither `--check --diff -vv` with the default callback, nor `dgx-stage serve --check -v`
    (its output, run.json, ansible-runner's artifacts), nor a real run (its JSON results), the host reports or
    the container's labels show the value; the restart plan names the variable. Last in this file: it leaves
    the lane running with the token."""
    on_podman_only(lane)
    secret = "hf_dgxSTAGEplantedSECRET%d" % os.getpid()
    extra = json.dumps({"engine_env": {"HF_TOKEN": secret}, "engine_command": [
        "python3", "/opt/engine_double/engine_double.py", "--api-key-" + secret]})
    env = dict(ansible_env(lane["work"]), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               CONTAINERS_CONF=os.path.join(REPO_ROOT, "molecule", "containers.conf"))
    check = subprocess.run([os.path.join(BIN_DIR, "ansible-playbook"), "-i", lane["inventory"],
                            os.path.join(REPO_ROOT, "stage-deepseek.yml"), "--tags", "manifest,engine", "--check",
                            "--diff", "-vv", "-e", extra],
                           cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    shown = check.stdout.decode("utf-8", "replace")
    assert "env changed (HF_TOKEN)" in shown, shown[-3000:]
    assert secret not in shown

    # The front end as the operator types it: its output, run.json and ansible-runner's artifacts.
    runs_dir = os.path.join(str(lane["work"]), "runs")
    frontend = subprocess.run([sys.executable, "-m", "dgx_stage", "serve", "--check", "-v", "-i", lane["inventory"],
                               "-e", extra, "--runs-dir", runs_dir],
                              cwd=REPO_ROOT, env=dict((k, v) for k, v in env.items() if k != "ANSIBLE_STDOUT_CALLBACK"),
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=600)
    said = frontend.stdout.decode("utf-8", "replace")
    assert frontend.returncode == 0 and "env changed (HF_TOKEN)" in said, said[-3000:]
    assert secret not in said
    recorded = [os.path.join(folder, name) for folder, _dirs, names in os.walk(runs_dir) for name in names]
    assert any(path.endswith("run.json") for path in recorded) and any("job_events" in path for path in recorded)
    for path in recorded:
        with open(path, "rb") as handle:
            assert secret.encode() not in handle.read(), path

    rc, data = run_playbook(lane["work"], lane["inventory"], "--tags", "engine", "-e", json.dumps(
        {"engine_env": {"HF_TOKEN": secret}}))
    assert rc == 0, failures(data)
    assert secret not in json.dumps(data)
    for folder, _dirs, names in os.walk(lane["settings"]["stage_report_dir"]):
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                assert secret.encode() not in handle.read(), os.path.join(folder, name)
    labels = inspect_of(lane)["Config"]["Labels"]
    assert secret not in json.dumps(labels)
