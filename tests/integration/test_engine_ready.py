"""Ready means every rank is up, and probes that cannot be fooled - on real Podman with engine_double (a
TEST DOUBLE of the inference engine, tests/engine_double), ranks as local-connection hosts of this machine.

ready1..ready4 each run their own container on their own port, with their own receipt directory and
manifest; they share one staged local hub (staged once). exl3_2x is ready1, ready2; sglang_4x is ready1..ready4.
Every failure below must fail every host of the lane (each shows it in its recap) and name what broke:

- a stream from rank 0 cut after 50 of 400 tokens fails the smoke play, naming the probed host, the API URL
  and rank 0; a healthy stream passes the same floor (the probe's other verdicts: tests/unit/test_probe_ready.py);
- the API answered by a stranger (another container on the port the wait is pointed at), and rank 0's
  container dead with 'Address already in use' while an old engine holds its port: both name the holder;
- a rank that exits while rank 0 loads fails the engine play, and later, with rank 0's API answering, the
  smoke play, naming that rank, its exit code and its log;
- with rank 0 crashing during its model load, ranks 1-3 fail well inside engine_ready_timeout.
"""
import json
import os
import sys
import time
import urllib.request
import uuid

import pytest

from conftest import failures, run_playbook
from hubgen import build_nas_hub
from test_engine_one_rank import (IMAGE, MAIN_REPO, build_engine_double, free_port, podman, podman_unusable,
                                  wait_seconds)

pytestmark = pytest.mark.skipif(podman_unusable() is not None, reason=str(podman_unusable()))

HOSTS = ["ready1", "ready2", "ready3", "ready4"]
LANES = {"exl3_2x": HOSTS[:2], "sglang_4x": HOSTS}
TOKENS_PER_S = 1000          # the double's pace: 400 tokens in 0.4 s
FLOOR = 200                  # engine_decode_floor here: a healthy stream makes it, decode and end to end
BASE_ENV = {"DOUBLE_TOKENS_PER_S": TOKENS_PER_S}
DOUBLE_CMD = ["python3", "/opt/engine_double/engine_double.py", "--port"]


class Lane(object):
    """Four local hosts, their containers and runs; host_env adds to one host's engine_env."""

    def __init__(self, work, nas):
        self.work, self.nas = work, nas
        tag = uuid.uuid4().hex[:8]
        self.names = dict((h, "dgx-stage-test-ready-%s-%s" % (tag, h)) for h in HOSTS)
        self.ports = dict((h, free_port()) for h in HOSTS)
        self.strangers = []
        self.inventory = os.path.join(work, "inventory")
        self.host_env = dict((h, {}) for h in HOSTS)

    def write_inventory(self):
        hosts = {}
        for host in HOSTS:
            hosts[host] = {
                "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                "ansible_host": "127.0.0.1",
                "engine_name": self.names[host], "engine_port": self.ports[host],
                "engine_env": dict(BASE_ENV, **self.host_env[host]),
                "receipt_parent": os.path.join(self.work, host, "cache"),
                "engine_manifest_path": os.path.join(self.work, host, "engine-manifest.json"),
            }
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
            "engine_runtime": "podman",
            "engine_image": IMAGE,
            "engine_command": DOUBLE_CMD + ["{{ engine_port }}"],
            "engine_gpu_devices": [],
            "engine_master_port": 29544,
            # Rank 0's API on the loopback address (every rank has its own port here).
            "engine_api_url": "http://127.0.0.1:{{ hostvars[groups[lane][0]]['engine_port'] }}",
            "engine_ready_timeout": 60,
            "engine_ready_poll": 2,
            "engine_decode_floor": FLOOR,
        }
        with open(os.path.join(self.inventory, "group_vars", "all", "lane.yml"), "w") as handle:
            json.dump(settings, handle)

    def run(self, *args):
        self.write_inventory()
        return run_playbook(self.work, self.inventory, *args)

    def url(self, host="ready1"):
        return "http://127.0.0.1:%d" % self.ports[host]

    def stranger(self, port):
        """Another engine_double container, not of this lane, serving on port (host network)."""
        name = "dgx-stage-test-stranger-%s" % uuid.uuid4().hex[:8]
        self.strangers.append(name)
        run = podman("run", "-d", "--init", "--name", name, "--network", "host", IMAGE, *(DOUBLE_CMD + [str(port)]))
        assert run.returncode == 0, run.stderr
        wait_for_api("http://127.0.0.1:%d" % port)
        return name


def wait_for_api(url, seconds=30):
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                return json.loads(resp.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def switch(url, **switches):
    """Flip the running double's stream switches (POST /debug/switches)."""
    request = urllib.request.Request(url + "/debug/switches", data=json.dumps(switches).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read().decode())


def failed_hosts(data):
    return sorted(h for h, s in data["stats"].items() if s.get("failures"))


def messages(data, name_part):
    """{host: msg} of the failed results of the tasks whose name contains name_part."""
    out = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            if name_part in task["task"]["name"]:
                for host, result in task["hosts"].items():
                    if result.get("failed"):
                        out[host] = result.get("msg")
    return out


def assert_every_host_fails(data, hosts, task_part, *needles):
    """Every host of the lane failed at task_part with a message holding every needle; returns the messages."""
    assert failed_hosts(data) == sorted(hosts), "\n".join(failures(data))
    got = messages(data, task_part)
    assert sorted(got) == sorted(hosts), "\n".join(failures(data))
    for host, msg in got.items():
        for needle in needles:
            assert needle in msg, (host, needle, msg)
    return got


@pytest.fixture(scope="module")
def lane(tmp_path_factory):
    """A staged local hub shared by four hosts, a manifest for each; containers removed at the end."""
    build_engine_double()
    work = str(tmp_path_factory.mktemp("ready"))
    nas = build_nas_hub(os.path.join(work, "nas"), shard_size=16 * 1024, n_shards=2)
    the_lane = Lane(work, nas)
    try:
        rc, data = the_lane.run("--tags", "stage", "--limit", "ready1")
        assert rc == 0, failures(data)
        rc, data = the_lane.run("--tags", "manifest", "-e", "lane=sglang_4x")
        assert rc == 0, failures(data)
        yield the_lane
    finally:
        for name in list(the_lane.names.values()) + the_lane.strangers:
            podman("rm", "--force", "--ignore", name)


def healthy(lane):
    """The exl3_2x lane up and unbroken (the engine play restarts it when a test left it otherwise)."""
    for host in HOSTS:
        lane.host_env[host] = {}
    rc, data = lane.run("--tags", "engine")
    assert rc == 0, failures(data)
    return data


def test_broken_streams_fail_the_smoke_play_on_every_host(lane):
    rc, data = lane.run("--tags", "engine,smoke")
    assert rc == 0, failures(data)          # a healthy stream makes the floor, decode and end to end
    # Every rank's report holds its own place in the lane and the probes of rank 0's API.
    for rank, host in enumerate(LANES["exl3_2x"]):
        with open(os.path.join(lane.work, "reports", "%s.json" % host)) as handle:
            engine = json.load(handle)["engine"]
        assert (engine["runtime"], engine["rank"], engine["world_size"], engine["master_addr"], engine["name"]) == \
            ("podman", rank, 2, "127.0.0.1", lane.names[host]), engine     # MASTER_ADDR: ready1's ansible_host
        assert engine["smoke"]["passed"] is True and "11303" in engine["smoke"]["answer"], engine["smoke"]
        decode = engine["decode"]
        assert decode["tokens"] == 400 and decode["floor"] == FLOOR, decode
        assert decode["complete"] and decode["passed"] and decode["e2e_tok_s"] >= FLOOR, decode

    # A stream that breaks mid-answer fails the smoke play on every host, naming rank 0's probe. The probe's other
    # verdicts (too short, a burst after a stall) are the same failure path: tests/unit/test_probe_ready.py.
    where = "Decode probe on ready1 (rank 0) at %s failed: " % lane.url()
    try:
        switch(lane.url(), cut_after=50)
        rc, data = lane.run("--tags", "smoke")
        assert rc != 0
        assert_every_host_fails(data, LANES["exl3_2x"], "The decode probe streamed", where,
                                "the stream stopped after 50 of 400 tokens without a finish reason: the connection "
                                "broke (closed before the end of the chunked body)")
    finally:
        switch(lane.url(), stall_s=None, cut_after=None, short_after=None)


def test_an_api_served_by_a_stranger_fails_every_host_naming_the_holder(lane):
    healthy(lane)
    # The wait pointed at a port another engine (not of this lane) serves: the API answers, but not ours.
    port = free_port()
    stranger = lane.stranger(port)
    rc, data = lane.run("--tags", "smoke", "-e", "engine_port=%d" % port)
    assert rc != 0
    assert_every_host_fails(
        data, LANES["exl3_2x"], "Every rank is up and this run's container serves the API",
        "The API at http://127.0.0.1:%d is not served by this run's engine: port %d on ready1 is held by pid "
        % (port, port),
        "(python3 /opt/engine_double/engine_double.py --port %d) in container " % port, "(%s)" % stranger,
        "not by container %s (rank 0)" % lane.names["ready1"])

    # An old engine holds rank 0's port; rank 0's container, started again, dies with 'Address already in use'.
    assert podman("stop", "--time", "5", lane.names["ready1"]).returncode == 0
    old = lane.stranger(lane.ports["ready1"])
    assert podman("start", lane.names["ready1"]).returncode == 0
    deadline = time.monotonic() + 30
    while podman("inspect", "--format", "{{.State.Running}}", lane.names["ready1"]).stdout.strip() == b"true":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    rc, data = lane.run("--tags", "smoke")
    assert rc != 0
    assert_every_host_fails(
        data, LANES["exl3_2x"], "Every rank is up and this run's container serves the API",
        "Rank 0 of the lane is down - rank 0 (host ready1): container %s is not running (exited), exit code 1"
        % lane.names["ready1"],
        "Address already in use",
        "The API at %s is answered by someone else: port %d on ready1 is held by pid " % (lane.url(), lane.ports["ready1"]),
        "(%s)" % old)
    for name in (stranger, old):
        podman("rm", "--force", name)


def test_a_rank_that_exits_while_rank_0_answers_fails_every_host_with_its_exit_code_and_log(lane):
    # Rank 1 crashes (exit 3) a second after it starts serving; rank 0 loads for 3 s, then answers.
    for host in HOSTS:
        lane.host_env[host] = {}
    lane.host_env["ready1"] = {"DOUBLE_STARTUP_DELAY_S": 3}
    lane.host_env["ready2"] = {"DOUBLE_EXIT_AFTER_S": 1, "DOUBLE_EXIT_CODE": 3}
    needles = ("Rank 1 of the lane is down - rank 1 (host ready2): container %s is not running (exited), exit code 3"
               % lane.names["ready2"], "Its log ends:",
               "RuntimeError: simulated crash after 1 s (DOUBLE_EXIT_AFTER_S), exit code 3")
    rc, data = lane.run("--tags", "engine")
    assert rc != 0
    assert_every_host_fails(data, LANES["exl3_2x"], "Every rank is up and this run's container serves the API",
                            *needles)
    print("rank 1 exit: the engine play's wait failed every host after %.1f s" % wait_seconds(data))
    assert wait_seconds(data) < 20

    # Later, rank 0's API answering all along: the smoke play's wait still fails every host.
    assert wait_for_api(lane.url())["data"][0]["id"] == "engine-double"
    rc, data = lane.run("--tags", "smoke")
    assert rc != 0
    assert_every_host_fails(data, LANES["exl3_2x"], "Every rank is up and this run's container serves the API",
                            *needles)


def test_rank_0_crashing_fails_ranks_1_to_3_well_inside_engine_ready_timeout(lane):
    # Rank 0 dies (exit 7) 2 s into a model load that would take 10 minutes; the others keep loading.
    # A fresh lane: the exl3_2x engines left by the tests above would be strays of sglang_4x.
    for name in lane.names.values():
        podman("rm", "--force", "--ignore", name)
    for host in HOSTS:
        lane.host_env[host] = {"DOUBLE_STARTUP_DELAY_S": 600}
    lane.host_env["ready1"] = {"DOUBLE_STARTUP_DELAY_S": 600, "DOUBLE_EXIT_AFTER_S": 2, "DOUBLE_EXIT_CODE": 7}
    rc, data = lane.run("--tags", "engine", "-e", "lane=sglang_4x", "-e", "engine_ready_timeout=300",
                        "-e", "engine_ready_poll=5")
    assert rc != 0
    assert_every_host_fails(
        data, LANES["sglang_4x"], "Every rank is up and this run's container serves the API",
        "Rank 0 of the lane is down - rank 0 (host ready1): container %s is not running (exited), exit code 7"
        % lane.names["ready1"],
        "RuntimeError: simulated crash after 2 s (DOUBLE_EXIT_AFTER_S), exit code 7")
    # The whole run (lane selection, plan, four starts in rank order, the wait) ends well inside the 300 s,
    # within half of it on a loaded 2-core machine; the wait itself within a few 5 s rounds of rank 0's crash.
    waited = wait_seconds(data)
    print("rank 0 crash, 4 ranks: the wait failed every host after %.1f s, the run after %.1f s "
          "(engine_ready_timeout=300, engine_ready_poll=5)" % (waited, data["elapsed_s"]))
    assert data["elapsed_s"] < 150 and waited < 20, (waited, data["elapsed_s"])
