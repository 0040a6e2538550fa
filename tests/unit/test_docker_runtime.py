"""The engine role's Docker path on data captured from a real Docker 20.10 daemon (tests/unit/fixtures/docker/,
trimmed): community.docker 4.8.5's docker_container_info (the engine's inspect data), `docker inspect --type
container` of a running and an exited container, and /proc/<pid>/cgroup of a
container process under cgroup v1 (cgroupfs driver). The playbook-level checks run in
tests/integration/test_engine_one_rank.py and test_engine_lane.py (docker params).

Captured with two containers of the engine double image:
  dgx-stage-capture-1  running, labels dgx-stage.lane=exl3_2x and dgx-stage.rank=0, env RANK=0 and FOO=a=b,
                       a read-only bind of "/nvme/capture/src a,b:c" at "/hub/x:y, z"
  dgx-stage-capture-2  exited with code 3
"""
import json
import os

from ansible.module_utils.dgx_nodestate import python_modules
from ansible.module_utils.dgx_runtime import container_facts
from ansible.module_utils.dgx_receipts import container_of
from pluginfile import load_filter

lane = load_filter("engine", "engine_lane")
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "docker")
RUNNING = "d45c0b38fd1ad600615296ca0e90b32fb2baf82b2e742f88ac1817103d594558"
EXITED = "e5f5ac9e2c816448ece56a73bd8ec2e82c5e9cb1a7b17be013602f66e80fd378"


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read() if name.endswith(".txt") else json.load(handle)


def test_dockers_inspect_data_names_the_changed_environment_variables():
    info = fixture("container_info.json")["container"]
    held = dict((name, value) for name, value in (entry.split("=", 1) for entry in info["Config"]["Env"]))
    wanted = dict(held, FOO="c")
    running = container_facts(info, wanted)
    # The names of the variables that differ, never a value: enough to say why a rank restarts.
    assert held["FOO"] == "a=b" and running["env_changed"] == ["FOO"]
    assert running["labels"]["dgx-stage.lane"] == "exl3_2x" and running["running"] is True
    assert running["image"] == "localhost/dgx-stage-engine-double:test"
    assert container_facts(info)["env_changed"] is None       # nothing to compare with
    # So the restart reasons name the changed variables on Docker as on Podman.
    labels = dict(running["labels"], **{"dgx-stage.env-sha256": "new"})
    assert lane.dgx_restart_reasons(running, labels) == ["env changed (FOO)"]
    running = container_facts(info, dict(wanted, RANK="1"))
    assert "env changed (FOO, RANK)" in lane.dgx_restart_reasons(running, labels)
    assert "a=b" not in repr(running)        # the container's own value is not kept


def test_a_paused_or_crash_looping_docker_rank_is_not_running_and_restarts():
    """Docker keeps State.Running true while a container is paused or restarting under a restart policy: the
    plan must see a rank that does not run (and a policy that restarts it on its own), as for a stopped one."""
    info = fixture("container_info.json")["container"]
    labels = container_facts(info)["labels"]
    for flag, state in (("Paused", "paused"), ("Restarting", "restarting")):
        own = container_facts(dict(info, State=dict(info["State"], **{flag: True, "Running": True})))
        assert (own["running"], own["status"]) == (False, state)
        assert "container %s" % state in lane.dgx_restart_reasons(own, labels)
    own = container_facts(dict(info, HostConfig=dict(info.get("HostConfig") or {}, RestartPolicy={"Name": "always"})))
    assert own["running"] and own["restart_policy"] == "always"
    assert lane.dgx_restart_reasons(own, labels) == [
        "restart policy always (a rank must never restart on its own: the lane restarts as one)"]


def test_image_ids_in_reasons_drop_dockers_sha256_prefix():
    own = container_facts(fixture("container_info.json")["container"])
    labels = dict(own["labels"], **{"dgx-stage.image-id": "sha256:" + "7f47a" * 8})
    reasons = lane.dgx_restart_reasons(own, labels)
    assert any("-> 7f47a7f47a7f)" in r for r in reasons), reasons


def test_the_wait_reads_dockers_inspect_output():
    running = container_facts(fixture("inspect_running.json")[0])
    assert (running["exists"], running["running"], running["id"], running["finished_at"]) == (
        True, True, RUNNING, None)
    exited = container_facts(fixture("inspect_exited.json")[0])
    assert (exited["running"], exited["status"], exited["exit_code"], exited["id"]) == (False, "exited", 3, EXITED)
    assert exited["finished_at"].startswith("2026-") and exited["oom_killed"] is False


def test_container_ids_from_docker_cgroup_paths():
    # cgroup v1 (cgroupfs driver, as captured): every hierarchy names /docker/<id>.
    assert container_of(fixture("cgroup_v1.txt")) == RUNNING
    # cgroup v2 with the systemd driver, and v2 with cgroupfs.
    assert container_of("0::/system.slice/docker-%s.scope\n" % RUNNING) == RUNNING
    assert container_of("0::/docker/%s\n" % RUNNING) == RUNNING
    assert container_of("0::/system.slice/docker.service\n") == ""


def test_docker_mounts_keep_names_with_colons_commas_and_spaces_whole():
    mounts = load_filter("engine", "engine_lane")
    binds = mounts.dgx_binds([{"source": "/nvme/capture/src a,b:c", "target": "/hub/x:y, z", "read_only": True}],
                             [{"source": "/cache dir", "target": "/cache", "read_only": False}])
    assert mounts.dgx_docker_mounts(binds) == [
        {"type": "bind", "source": "/nvme/capture/src a,b:c", "target": "/hub/x:y, z", "read_only": True},
        {"type": "bind", "source": "/cache dir", "target": "/cache", "read_only": False}]
    # What the daemon made of such a mount (docker_container_info of the capture): the same paths, read-only.
    captured = fixture("container_info.json")["container"]["HostConfig"]["Mounts"]
    assert [(m["Source"], m["Target"], m.get("ReadOnly")) for m in captured] == [
        ("/nvme/capture/src a,b:c", "/hub/x:y, z", True)]


def test_python_modules_lists_what_the_node_python_lacks():
    found = python_modules(["json", "dgx_stage_no_such_module", "no.such"])
    assert found["missing"] == ["dgx_stage_no_such_module", "no.such"]
    assert found["version"].count(".") == 2 and found["executable"]


def test_inspect_data_of_an_odd_shape_or_holding_a_secret_gives_facts_without_it():
    info = {"Id": "c1", "Name": "/e", "State": {"Running": False, "Status": "exited", "ExitCode": 1,
                                                "Error": "exec failed: --api-key hf_SECRETVALUE"},
            "Config": {"Labels": ["not", "a", "mapping"]}, "HostConfig": "odd"}
    facts = container_facts(info, secrets=["hf_SECRETVALUE"])
    assert "SECRETVALUE" not in facts["error"] and facts["error"].startswith("exec failed")
    assert facts["labels"] == {} and facts["restart_policy"] == "" and facts["exit_code"] == 1
    assert container_facts({"Id": "c2", "State": "garbage"})["running"] is False


def test_an_inspect_that_prints_no_container_is_said_without_the_secrets():
    from ansible.module_utils.dgx_runtime import container_state

    class Runner(object):
        def get_bin_path(self, name):
            return "/usr/bin/" + name

        def run_command(self, argv):
            return 0, '{"Args": ["--api-key", "hf_SECRETVALUE"]}', ""

    facts = container_state(Runner(), "docker", "e", secrets=["hf_SECRETVALUE"])
    assert not facts["exists"] and "SECRETVALUE" not in json.dumps(facts), facts
