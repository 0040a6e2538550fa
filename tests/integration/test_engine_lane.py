"""The engine lane as one unit, on real Podman and Docker with engine_double (a TEST DOUBLE of the inference engine).

dgx1..dgx4 are local-connection aliases of this machine, each with its own container name, port, receipt
directory and manifest; they share one staged local hub (staged once). exl3_2x is dgx1, dgx2;
sglang_4x is dgx1..dgx4. The tests run in file order on one lane and each leaves it running:

- a first start labels every rank (lane, rank, run id, one digest per aspect) and starts them in rank order;
- --check --diff says which ranks would restart and why (env of one rank changed) and changes nothing;
- that one-rank change then restarts the whole lane, rank 0 first; a re-run changes nothing;
- a blob repaired by verify (a new inode, the same manifest) restarts the lane;
- --limit to one rank is refused, and allowed with engine_restart_only naming it (that rank alone restarts);
  the rank left out is still judged: a dead rank 0 with a stranger on its port fails the run;
- a lane restart refused before anything stops when one rank's receipts are held;
- an earlier engine of a rank still running under another name is a stray;
- engine_enabled false on one host is refused on every host, naming it;
- a missing image with engine_pull=never fails at once on every host, naming it, and stops nothing;
- switching the hosts to sglang_4x (its engines there hold the names: stopped with engine_stop_strays) and
  back, with a stranger on dgx1's port: the stranger, sglang_4x's rank on dgx2 and its engines left on
  dgx3/dgx4 (no longer in the lane) are reported, and stopped only with engine_stop_strays.

The lane runs on Podman: what is decided here is decided in the plan's filters, over the container listing
either runtime gives, or in the receipt module. What Docker reports its own way (a paused or self-restarting
container called running, a missing image) is checked on Docker's one-rank lane in test_engine_one_rank.py.
"""
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

import processes
from conftest import failures, run_playbook
from hubgen import build_nas_hub
from test_engine_one_rank import DOUBLE_RECEIPTS, IMAGE, MAIN_REPO, build_engine_double, free_port
import runtimes

HOSTS = ["dgx1", "dgx2", "dgx3", "dgx4"]
LANES = {"exl3_2x": HOSTS[:2], "sglang_4x": HOSTS}
RECEIPT_NAMES = DOUBLE_RECEIPTS["DOUBLE_RECEIPT_ROOTS"].split(",")


def inspect(runtime, name):
    """{id, started, created, labels, env} of a container, or None when there is none."""
    proc = runtimes.cli(runtime, "container", "inspect", name)
    if proc.returncode != 0:
        return None
    info = json.loads(proc.stdout.decode())[0]
    return {"id": info["Id"], "started": info["State"]["StartedAt"], "running": info["State"]["Running"],
            "created": info["Created"], "labels": info["Config"]["Labels"] or {},
            "env": dict(e.split("=", 1) for e in info["Config"]["Env"]), "network": info["HostConfig"]["NetworkMode"]}


def msgs(data, name_part):
    """{host: msg} of the results of the tasks whose name contains name_part."""
    out = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            if name_part in task["task"]["name"]:
                for host, result in task["hosts"].items():
                    if "msg" in result and not result.get("skipped"):
                        out[host] = result["msg"]
    return out


def refusals(data, name_part):
    """{host: msg} of the failed results of the tasks whose name contains name_part."""
    return dict((host, result["msg"]) for play in data["plays"] for task in play["tasks"]
                if name_part in task["task"]["name"]
                for host, result in task["hosts"].items() if result.get("failed"))


def failed_hosts(data):
    return sorted(h for h, s in data["stats"].items() if s.get("failures"))


class Lane(object):
    """The test lane: its inventory, containers and runs."""

    def __init__(self, runtime, work, nas, names, ports):
        self.runtime, self.work, self.nas, self.names, self.ports = runtime, work, nas, names, ports
        self.inventory = os.path.join(work, "inventory")
        self.host_vars = dict((h, {}) for h in HOSTS)

    def cache(self, host):
        return os.path.join(self.work, host, "cache")

    def write_inventory(self):
        """hosts.yml with both lanes; group_vars shared; host_vars per host (self.host_vars adds to them)."""
        hosts = {}
        for host in HOSTS:
            hosts[host] = dict({
                # No ansible_host: MASTER_ADDR is then rank 0's inventory name (the API is asked on the loopback).
                "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                "engine_name": self.names[host], "engine_port": self.ports[host],
                "receipt_parent": self.cache(host),
                "engine_manifest_path": os.path.join(self.work, host, "engine-manifest.json"),
            }, **self.host_vars[host])
        children = dict((lane, {"hosts": dict((h, hosts[h]) for h in members)}) for lane, members in LANES.items())
        os.makedirs(os.path.join(self.inventory, "group_vars", "all"), exist_ok=True)
        with open(os.path.join(self.inventory, "hosts.yml"), "w") as handle:
            json.dump({"all": {"children": children}}, handle)
        settings = {
            "lane": "exl3_2x",
            "hub_nas_root": self.nas["hub"],
            "hub_local_root": os.path.join(self.work, "local", "hub"),
            "stage_repos": [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}],
            "stage_report_dir": os.path.join(self.work, "reports"),
            "engine_enabled": True,
            "engine_runtime": self.runtime,
            "engine_image": IMAGE,
            "engine_command": ["python3", "/opt/engine_double/engine_double.py", "--port", "{{ engine_port }}"],
            "engine_env": dict(DOUBLE_RECEIPTS, DOUBLE_TOKENS_PER_S=400, DOUBLE_STARTUP_DELAY_S=0),
            "engine_gpu_devices": [],
            "engine_gpu_requests": [],
            # engine_master_port left at its default: MASTER_PORT is only passed on, nothing listens on it here.
            # Rank 0's API, on the loopback address (every rank has its own port here).
            "engine_api_url": "http://127.0.0.1:{{ hostvars[groups[lane][0]]['engine_port'] }}",
            "engine_ready_timeout": 60,
            "engine_ready_poll": 1,
        }
        with open(os.path.join(self.inventory, "group_vars", "all", "lane.yml"), "w") as handle:
            json.dump(settings, handle)

    def run(self, *args):
        self.write_inventory()
        return run_playbook(self.work, self.inventory, *args)

    def containers(self, hosts=None):
        return dict((h, inspect(self.runtime, self.names[h])) for h in (hosts or LANES["exl3_2x"]))

    def cli(self, *args):
        return runtimes.cli(self.runtime, *args)

    def stranger_on_port(self, host, label):
        """host's engine removed, and an engine_double started by hand on its port under another name (a
        stray, removed when the lane is); its name."""
        self.cli("rm", "--force", self.names[host])
        name = "dgx-stage-test-%s-%s" % (label, uuid.uuid4().hex[:8])
        self.strays.append(name)
        run = self.cli("run", "-d", "--name", name, "--network", "host", IMAGE, "python3",
                       "/opt/engine_double/engine_double.py", "--port", str(self.ports[host]))
        assert run.returncode == 0, run.stderr
        return name

    def ids(self, hosts=None):
        return dict((h, (c or {}).get("id")) for h, c in self.containers(hosts).items())

    def receipts_state(self, hosts=None):
        """(inode, mtime_ns) of every receipt file, by path."""
        out = {}
        for host in hosts or LANES["exl3_2x"]:
            for name in RECEIPT_NAMES:
                path = os.path.join(self.cache(host), name, "worker.json")
                st = os.stat(path)
                out[path] = (st.st_ino, st.st_mtime_ns)
        return out


@pytest.fixture(scope="module", params=runtimes.params(("podman",)))
def lane(request, tmp_path_factory):
    """A staged local hub shared by four hosts; exl3_2x started once."""
    runtime = request.param
    build_engine_double()
    work = str(tmp_path_factory.mktemp("lane-" + runtime))
    nas = build_nas_hub(os.path.join(work, "nas"), shard_size=16 * 1024, n_shards=2)
    tag = uuid.uuid4().hex[:8]
    names = dict((h, "dgx-stage-test-lane-%s-%s-%s" % (runtime, tag, h)) for h in HOSTS)
    ports = dict((h, free_port()) for h in HOSTS)
    the_lane = Lane(runtime, work, nas, names, ports)
    strays = []
    the_lane.strays = strays
    try:
        rc, data = the_lane.run("--tags", "stage", "--limit", "dgx1")
        assert rc == 0, failures(data)
        started = time.monotonic()
        the_lane.first_run = the_lane.run("--tags", "manifest,engine")
        the_lane.first_run_s = time.monotonic() - started
        yield the_lane
    finally:
        runtimes.remove(runtime, *(list(names.values()) + strays))


def assert_rank_order(containers, hosts):
    """Every rank started after the previous one had started (throttle 1, rank order)."""
    for before, after in zip(hosts, hosts[1:]):
        assert containers[before]["started"] < containers[after]["created"], (before, after, containers)


def test_first_start_labels_every_rank_and_starts_them_in_rank_order(lane):
    rc, data = lane.first_run
    assert rc == 0, failures(data)
    containers = lane.containers()
    for rank, host in enumerate(LANES["exl3_2x"]):
        labels = containers[host]["labels"]
        assert labels["dgx-stage.lane"] == "exl3_2x" and labels["dgx-stage.rank"] == str(rank)
        assert labels["dgx-stage.lane-hosts"] == "dgx1,dgx2" and labels["dgx-stage.world-size"] == "2"
        assert labels["dgx-stage.port"] == str(lane.ports[host]) and labels["dgx-stage.image"] == IMAGE
        for aspect in ("image-id", "command-sha256", "env-sha256", "mounts-sha256", "files-sha256"):
            assert labels["dgx-stage." + aspect], aspect
        with open(os.path.join(lane.work, host, "engine-manifest.json")) as handle:
            model_path = json.load(handle)["repos"][0]["target"]
        # Each rank its own container on the host network, its rank in a world of two around rank 0's host.
        env = dict((k, containers[host]["env"].get(k)) for k in (
            "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HF_HUB_OFFLINE", "MODEL_PATH"))
        assert env == {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "dgx1", "MASTER_PORT": "29500",
                       "HF_HUB_OFFLINE": "1", "MODEL_PATH": model_path}, (host, env)
        assert containers[host]["running"] and containers[host]["network"] == "host", (host, containers[host])
    assert containers["dgx1"]["id"] != containers["dgx2"]["id"]
    assert containers["dgx1"]["labels"]["dgx-stage.run-id"] == containers["dgx2"]["labels"]["dgx-stage.run-id"]
    assert_rank_order(containers, LANES["exl3_2x"])
    reasons = msgs(data, "Restart plan")
    assert sorted(reasons) == ["dgx1", "dgx2"] and "container missing" in reasons["dgx1"], reasons


def change_one_ranks_env(lane):
    """dgx2's engine_env gains DOUBLE_TEST_KNOB=2 (kept for the tests after)."""
    lane.host_vars["dgx2"] = {"engine_env": dict(DOUBLE_RECEIPTS, DOUBLE_TOKENS_PER_S=400, DOUBLE_STARTUP_DELAY_S=0,
                                                 DOUBLE_TEST_KNOB="2")}


def test_check_mode_shows_which_ranks_would_restart_and_why_and_changes_nothing(lane):
    ids, receipts = lane.ids(), lane.receipts_state()
    change_one_ranks_env(lane)
    rc, data = lane.run("--check", "--diff", "--tags", "manifest,engine")
    assert rc == 0, failures(data)
    plan = msgs(data, "Restart plan")
    assert plan["dgx2"].startswith("rank 1 (dgx2) would restart: env changed (DOUBLE_TEST_KNOB)"), plan
    assert plan["dgx1"].startswith("rank 0 (dgx1) would restart: the lane restarts as one (dgx2: env changed"), plan
    assert data["stats"]["dgx1"]["changed"] >= 1 and data["stats"]["dgx2"]["changed"] >= 1
    # Nothing removed, started or cleared.
    assert lane.ids() == ids and lane.receipts_state() == receipts
    assert not msgs(data, "Clear the receipts")
    assert not msgs(data, "Container | Plan, remove or start with %s - start" % lane.runtime)


def test_a_one_rank_change_restarts_the_whole_lane_in_rank_order(lane):
    ids = lane.ids()
    change_one_ranks_env(lane)      # as the check-mode test left it
    rc, data = lane.run("--tags", "manifest,engine")
    assert rc == 0, failures(data)
    plan = msgs(data, "Restart plan")
    assert plan["dgx2"].startswith("rank 1 (dgx2) restarts: env changed (DOUBLE_TEST_KNOB)"), plan
    assert plan["dgx1"].startswith("rank 0 (dgx1) restarts: the lane restarts as one (dgx2: env changed"), plan
    containers = lane.containers()
    for host in LANES["exl3_2x"]:
        assert containers[host]["id"] != ids[host], host
    assert containers["dgx2"]["env"]["DOUBLE_TEST_KNOB"] == "2" and "DOUBLE_TEST_KNOB" not in containers["dgx1"]["env"]
    assert_rank_order(containers, LANES["exl3_2x"])
    # The receipts of every rank were cleared and written anew by this run's engines.
    for host in LANES["exl3_2x"]:
        with open(os.path.join(lane.cache(host), RECEIPT_NAMES[0], "worker.json")) as handle:
            assert json.load(handle)["rank"] == str(LANES["exl3_2x"].index(host))
    # Unchanged, a re-run leaves the lane alone.
    rc, data = lane.run("--tags", "manifest,engine")
    assert rc == 0, failures(data)
    assert lane.ids() == dict((h, c["id"]) for h, c in containers.items()), msgs(data, "Restart plan")
    assert all(data["stats"][h]["changed"] == 0 for h in LANES["exl3_2x"]), data["stats"]


def flip_a_byte_in_a_staged_blob(lane):
    files = lane.nas["repos"][MAIN_REPO]["files"]
    shard = lane.nas["repos"][MAIN_REPO]["shards"][0]
    blob = os.path.join(lane.work, "local", "hub", lane.nas["repos"][MAIN_REPO]["folder"], "blobs",
                        files[shard]["etag"])
    with open(blob, "r+b") as handle:
        handle.seek(7)
        byte = handle.read(1)
        handle.seek(7)
        handle.write(bytes([byte[0] ^ 0xFF]))
    return blob


def test_a_paused_rank_restarts_the_lane_which_then_settles(lane):
    """A paused rank runs nothing: it restarts the lane like a stopped one, and the engine play run again
    after that restart changes nothing. (Docker's own paused and self-restarting states:
    test_engine_one_rank.py.)"""
    ids = lane.ids()
    assert lane.cli("pause", lane.names["dgx2"]).returncode == 0
    rc, data = lane.run("--tags", "engine")
    assert rc == 0, failures(data)
    assert "container paused" in msgs(data, "Restart plan")["dgx2"], msgs(data, "Restart plan")
    new = lane.ids()
    assert all(new[h] != ids[h] for h in ids) and all(c["running"] for c in lane.containers().values())
    rc, data = lane.run("--tags", "engine")
    assert rc == 0, failures(data)
    assert all(data["stats"][h]["changed"] == 0 for h in LANES["exl3_2x"]), data["stats"]
    assert lane.ids() == new


def test_a_repaired_blob_restarts_the_lane(lane):
    ids = lane.ids()
    blob = flip_a_byte_in_a_staged_blob(lane)
    inode = os.stat(blob).st_ino
    rc, data = lane.run("--tags", "verify", "-e", "stage_verify=full", "--limit", "dgx1")
    assert rc == 0, failures(data)
    assert os.stat(blob).st_ino != inode   # repaired: a new file under the same name
    rc, data = lane.run("--tags", "manifest,engine")
    assert rc == 0, failures(data)
    reasons = msgs(data, "Restart plan")
    assert "bound files changed" in reasons["dgx1"] and "bound files changed" in reasons["dgx2"], reasons
    new = lane.ids()
    assert all(new[h] != ids[h] for h in ids), (ids, new)


def test_limit_to_one_rank_is_refused_unless_that_rank_is_restarted_by_name(lane):
    ids = lane.ids()
    rc, data = lane.run("--tags", "engine", "--limit", "dgx2")
    assert rc != 0
    assert any("--limit leaves out dgx1 of lane exl3_2x" in f for f in failures(data)), failures(data)
    assert lane.ids() == ids
    rc, data = lane.run("--tags", "engine", "--limit", "dgx2", "-e", "engine_restart_only=dgx2")
    assert rc == 0, failures(data)
    new = lane.ids()
    assert new["dgx1"] == ids["dgx1"] and new["dgx2"] != ids["dgx2"]
    assert "forced by engine_restart_only" in msgs(data, "Restart plan")["dgx2"]


def test_a_rank_restarted_alone_is_judged_with_the_whole_lane(lane):
    """engine_restart_only with --limit: the ranks left out are still asked (delegated) every round, so a
    dead rank 0 with a stranger answering on its port fails the run, named as rank 0 on dgx1."""
    ids = lane.ids()
    stranger = lane.stranger_on_port("dgx1", "only-stranger")
    try:
        rc, data = lane.run("--tags", "engine,smoke", "--limit", "dgx2", "-e", "engine_restart_only=dgx2")
        assert rc != 0, "a stranger answered for a lane whose rank 0 has no container"
        down = refusals(data, "Every rank is up")
        assert list(down) == ["dgx2"], failures(data)
        assert "Rank 0 of the lane is down - rank 0 (host dgx1)" in down["dgx2"], down
        assert "held by" in down["dgx2"] and stranger in down["dgx2"], down
        assert not msgs(data, "Smoke | Ask")
    finally:
        lane.cli("rm", "--force", stranger)
    rc, data = lane.run("--tags", "engine")
    assert rc == 0, failures(data)
    assert lane.ids()["dgx1"] not in (None, ids["dgx1"])


def test_a_rank_left_out_that_cannot_be_reached_is_named_not_turned_into_an_unreachable_host(lane):
    """engine_restart_only=dgx2 with --limit while dgx1 (rank 0, outside the play) cannot be reached: the wait's
    delegated look at it gives no row, so the verdict names rank 0 on dgx1, and dgx2 fails (its rescue and
    report run) instead of being marked UNREACHABLE for a rank it does not run."""
    lane.host_vars["dgx1"].update(ansible_connection="ssh", ansible_host="127.0.0.1", ansible_port=free_port(),
                                  ansible_ssh_common_args="-o ConnectTimeout=3")
    try:
        rc, data = lane.run("--tags", "engine", "--limit", "dgx2", "-e", "engine_restart_only=dgx2")
    finally:
        for key in ("ansible_connection", "ansible_host", "ansible_port", "ansible_ssh_common_args"):
            del lane.host_vars["dgx1"][key]
    assert rc != 0
    assert data["stats"]["dgx2"]["unreachable"] == 0 and data["stats"]["dgx2"]["failures"] >= 1, data["stats"]
    assert any("Rank 0 (host dgx1) did not report its engine container" in f for f in failures(data)), [
        (t["task"]["name"], h, r.get("msg"), r.get("unreachable")) for p in data["plays"] for t in p["tasks"]
        for h, r in t["hosts"].items() if r.get("failed") or r.get("unreachable")]
    rc, data = lane.run("--tags", "engine")
    assert rc == 0, failures(data)


def test_nothing_is_stopped_when_one_rank_cannot_clear_its_receipts(lane):
    """A lane restart with dgx2's receipt held by a stranger process: refused before any rank is stopped
    (no rank starts alone into a world of two), naming the holder; the lane keeps running as it was."""
    ids = lane.ids()
    held = os.path.join(lane.cache("dgx2"), RECEIPT_NAMES[0], "worker.json")
    lane.host_vars["dgx2"]["engine_env"] = dict(DOUBLE_RECEIPTS, DOUBLE_TOKENS_PER_S=400, DOUBLE_TEST_KNOB="held")
    with open(held) as handle:
        holder = subprocess.Popen(["sleep", "300"], stdin=handle)
    try:
        rc, data = lane.run("--tags", "engine")
    finally:
        processes.kill_tree(holder)
        del lane.host_vars["dgx2"]["engine_env"]
    assert rc != 0
    assert failed_hosts(data) == ["dgx1", "dgx2"], failures(data)
    refused = refusals(data, "Remove the receipt roots")
    assert list(refused) == ["dgx2"] and "pid %d" % holder.pid in refused["dgx2"], failures(data)
    assert any("The check that every rank can be restarted did not pass on dgx2 of lane" in f
               and "Nothing was stopped or started" in f for f in failures(data)), failures(data)
    assert lane.ids() == ids and all(c["running"] for c in lane.containers().values())


def test_an_earlier_engine_of_a_rank_under_another_name_is_a_stray(lane):
    """dgx2's engine_name changes on a running lane: its old container (labels: rank 1 of this lane) would
    keep the GPUs; it is reported, and stopped only with engine_stop_strays."""
    old, new = lane.names["dgx2"], "dgx-stage-test-renamed-%s" % uuid.uuid4().hex[:8]
    lane.strays.append(new)
    lane.host_vars["dgx2"]["engine_name"] = new
    try:
        rc, data = lane.run("--tags", "engine")
        assert rc != 0
        refused = refusals(data, "No stray holds")
        assert sorted(refused) == ["dgx1", "dgx2"], failures(data)
        assert "dgx2: %s is still running as this host's engine (an engine of lane exl3_2x, rank 1" % old \
            in refused["dgx1"], refused
        assert inspect(lane.runtime, old)["running"] and inspect(lane.runtime, new) is None
        rc, data = lane.run("--tags", "engine", "-e", "engine_stop_strays=true")
        assert rc == 0, failures(data)
        assert not inspect(lane.runtime, old)["running"] and inspect(lane.runtime, new)["running"]
    finally:
        del lane.host_vars["dgx2"]["engine_name"]
    # Back to the old name: the renamed one is now the stray.
    rc, data = lane.run("--tags", "engine", "-e", "engine_stop_strays=true")
    assert rc == 0, failures(data)
    assert inspect(lane.runtime, old)["running"] and not inspect(lane.runtime, new)["running"]


def test_engine_enabled_false_on_one_host_is_refused_on_every_host(lane):
    ids = lane.ids()
    lane.host_vars["dgx2"]["engine_enabled"] = False
    try:
        rc, data = lane.run("--tags", "engine")
    finally:
        del lane.host_vars["dgx2"]["engine_enabled"]
    assert rc != 0
    assert failed_hosts(data) == ["dgx1", "dgx2"]
    for fail in failures(data):
        assert "engine_enabled: false on dgx2 and true on dgx1" in fail, fail
    assert lane.ids() == ids


def test_a_missing_image_with_engine_pull_never_fails_fast_and_stops_nothing(lane):
    ids = lane.ids()
    image = "registry.invalid/dgx-stage/missing-%s:1" % uuid.uuid4().hex[:8]
    started = time.monotonic()
    rc, data = lane.run("--tags", "engine", "-e", "engine_image=%s" % image)
    elapsed = time.monotonic() - started
    assert rc != 0
    refused = refusals(data, "The image is on every host")
    assert sorted(refused) == failed_hosts(data) == ["dgx1", "dgx2"], failures(data)
    for msg in refused.values():
        assert "image %s is not on dgx1, dgx2 and engine_pull=never" % image in msg, msg
    # No task pulled or tried to: the plan's look at the image changed nothing, and no container task ran.
    looks = [r for play in data["plays"] for t in play["tasks"] if "Plan | The engine image" in t["task"]["name"]
             for r in t["hosts"].values()]
    assert looks and not any(r.get("changed") for r in looks)
    assert not any("Container |" in t["task"]["name"] and not r.get("skipped")
                   for play in data["plays"] for t in play["tasks"] for r in t["hosts"].values())
    assert lane.ids() == ids
    assert lane.cli("image", "inspect", image).returncode != 0
    assert elapsed < 60, elapsed


def test_strays_and_engines_left_on_hosts_that_left_the_lane_are_reported_and_stopped_only_when_asked(lane):
    # Switching the hosts to sglang_4x: exl3_2x's engines hold the names on dgx1/dgx2, strays of another lane.
    rc, data = lane.run("--tags", "manifest,engine", "-e", "lane=sglang_4x", "-e", "engine_stop_strays=true")
    assert rc == 0, failures(data)
    four = lane.containers(HOSTS)
    assert [four[h]["labels"]["dgx-stage.rank"] for h in HOSTS] == ["0", "1", "2", "3"]
    assert_rank_order(four, HOSTS)

    # Someone starts an engine by hand on dgx1's port (sglang_4x's rank 0 there is gone).
    port_stray = lane.stranger_on_port("dgx1", "stray")
    time.sleep(1)   # its API binds the port

    # Back to exl3_2x: refused on both hosts, naming the stranger on dgx1's port, sglang_4x's rank 1 holding
    # dgx2's name, and its ranks 2 and 3 still running on dgx3 and dgx4, which are no longer in the lane.
    rc, data = lane.run("--tags", "manifest,engine")
    assert rc != 0
    refused = refusals(data, "No stray holds")
    assert sorted(refused) == failed_hosts(data) == ["dgx1", "dgx2"], failures(data)
    msg = refused["dgx1"]
    assert "dgx1: %s (not started by dgx-stage) listens on port %d" % (port_stray, lane.ports["dgx1"]) in msg, msg
    assert ("dgx2: %s holds the engine name %s (an engine of lane sglang_4x, rank 1 of dgx1,dgx2,dgx3,dgx4)"
            % (lane.names["dgx2"], lane.names["dgx2"])) in msg, msg
    for host, rank in (("dgx3", 2), ("dgx4", 3)):
        assert ("%s: %s on %s, no longer in the lane, is rank %d of lane sglang_4x"
                % (host, lane.names[host], host, rank)) in msg, msg
    assert "Set engine_stop_strays=true to stop them" in msg
    assert inspect(lane.runtime, port_stray)["running"]
    assert lane.ids(HOSTS[1:]) == dict((h, four[h]["id"]) for h in HOSTS[1:])

    # Asked to: every stray is stopped, then exl3_2x starts.
    rc, data = lane.run("--tags", "manifest,engine", "-e", "engine_stop_strays=true")
    assert rc == 0, failures(data)
    # Stopped, not removed: their logs stay to read.
    assert not any(inspect(lane.runtime, name)["running"] for name in (port_stray, lane.names["dgx3"], lane.names["dgx4"]))
    two = lane.containers()
    assert all(two[h]["running"] and two[h]["labels"]["dgx-stage.lane"] == "exl3_2x" for h in two)
