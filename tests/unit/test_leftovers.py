"""tests/leftovers.py: the processes part on real processes; mounts and containers on recorded text (the check must
not depend on what other runs on the machine mount or start meanwhile)."""
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

import leftovers
import processes

TOOL = leftovers.__file__

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
25 24 0:23 / /dev/shm rw,relatime shared:3 master:1 - tmpfs tmpfs rw,size=24683584k
45 27 254:0 /var/lib/docker /var/lib/docker rw,relatime shared:1 - ext4 /dev/vda rw,discard
"""
# After the run: a test's tmpfs left mounted (its point has a space), a bind mount, and id 45 unmounted and
# reused by a new mount elsewhere.
MOUNTINFO_AFTER = MOUNTINFO.replace("45 27 254:0 /var/lib/docker /var/lib/docker rw,relatime shared:1 - ext4 "
                                    "/dev/vda rw,discard\n", "") + """\
45 27 0:58 / /tmp/pytest-of-root/pytest-3/test_full0/disk rw,relatime - tmpfs tmpfs rw,size=256k
61 27 0:59 / /tmp/pytest-of-root/pytest-3/nas\\040copy rw,relatime shared:40 - tmpfs tmpfs rw,size=16384k
62 27 254:0 /srv/hub /mnt/ro-nas ro,relatime - ext4 /dev/vda rw
"""

# `podman ps -a --no-trunc --format leftovers.PS_FORMAT`, as Podman 4 prints it.
PODMAN_PS = (
    "56cff0e53af70b3ffc8708edb57ab919a0ea1b6a671c300e1cce3a555c41e81f\tdgx-stage-test-lane-podman-bb73fac2-dgx1"
    "\tUp 3 seconds ago\n"
    "5faabc8d3cfad812dab767b691d9d1f90ca29a79d8d9e8d931860c5cc73b8b25\tdgx-stage-test-lane-podman-bb73fac2-dgx2"
    "\tUp 1 second ago\n")
DOCKER_PS = ("9b1f0c3e2d4a5b6c7d8e9f00112233445566778899aabbccddeeff0011223344\tds41-engine"
             "\tExited (137) 2 minutes ago\n")


def test_mountinfo_fields_and_escapes():
    mounts = leftovers.parse_mountinfo(MOUNTINFO_AFTER)
    assert [m["point"] for m in mounts] == ["/proc", "/", "/dev/shm", "/tmp/pytest-of-root/pytest-3/test_full0/disk",
                                            "/tmp/pytest-of-root/pytest-3/nas copy", "/mnt/ro-nas"]
    shm = mounts[2]
    assert (shm["id"], shm["parent"], shm["device"], shm["fstype"], shm["source"]) == (25, 24, "0:23", "tmpfs", "tmpfs")
    assert mounts[-1]["root"] == "/srv/hub" and mounts[-1]["source"] == "/dev/vda"
    assert leftovers.parse_mountinfo("") == []


def test_new_mounts_are_those_not_there_before_even_under_a_reused_id():
    before, after = leftovers.parse_mountinfo(MOUNTINFO), leftovers.parse_mountinfo(MOUNTINFO_AFTER)
    new = leftovers.new_mounts(before, after)
    assert [(m["id"], m["point"]) for m in new] == [(45, "/tmp/pytest-of-root/pytest-3/test_full0/disk"),
                                                   (61, "/tmp/pytest-of-root/pytest-3/nas copy"), (62, "/mnt/ro-nas")]
    assert leftovers.new_mounts(after, after) == [] and leftovers.new_mounts(before, before[:2]) == []  # gone: fine


def test_containers_of_podman_and_docker_ps_and_the_new_ones():
    podman = leftovers.parse_ps(PODMAN_PS)
    assert [(c["id"][:12], c["name"], c["status"]) for c in podman] == [
        ("56cff0e53af7", "dgx-stage-test-lane-podman-bb73fac2-dgx1", "Up 3 seconds ago"),
        ("5faabc8d3cfa", "dgx-stage-test-lane-podman-bb73fac2-dgx2", "Up 1 second ago")]
    docker = leftovers.parse_ps(DOCKER_PS)
    assert docker == [{"id": "9b1f0c3e2d4a5b6c7d8e9f00112233445566778899aabbccddeeff0011223344",
                       "name": "ds41-engine", "status": "Exited (137) 2 minutes ago"}]
    assert leftovers.parse_ps("") == []
    assert leftovers.new_containers(podman[:1], podman) == podman[1:]
    assert leftovers.new_containers(podman, podman[:1]) == []


def test_the_report_names_each_leftover():
    proc = {"pid": 4242, "ppid": 1, "sid": 4242, "pgid": 4242, "state": "S", "age_s": 3712, "comm": "dockerd",
            "cmdline": "dockerd --iptables=false --bridge=none"}
    mount = leftovers.new_mounts([], leftovers.parse_mountinfo(MOUNTINFO_AFTER))[3]
    container = dict(leftovers.parse_ps(DOCKER_PS)[0], engine="docker", answered_before=False)
    payload = "/tmp/ansible_hf_hub_mirror_payload_k2j4"
    lines = leftovers.describe([proc], [mount], [container], [payload], "cafe")
    assert lines == [
        "leftovers: 4 thing(s) the test run cafe started are still there:",
        "  process 4242 (parent 1, session 4242, group 4242, state S, 3712 s old): dockerd --iptables=false "
        "--bridge=none",
        "    a Docker daemon the tests started and did not stop (scripts/docker-daemon.sh stop stops the one it "
        "started)",
        "  mount /tmp/pytest-of-root/pytest-3/test_full0/disk (tmpfs from tmpfs), not there at the start",
        "  container docker 9b1f0c3e2d4a (name ds41-engine, Exited (137) 2 minutes ago), docker did not answer at "
        "the start",
        "  module payload /tmp/ansible_hf_hub_mirror_payload_k2j4, not there at the start (its module was killed: "
        "give the test's playbook runs a TMPDIR of their own)"]


def test_the_mark_is_the_exact_variable_and_value():
    marker = "0123abcd"
    assert leftovers.carries(b"PATH=/bin\0DGX_STAGE_TEST_RUN=0123abcd\0HOME=/root\0", marker)
    assert leftovers.carries(b"DGX_STAGE_TEST_RUN=0123abcd", marker)
    assert not leftovers.carries(b"DGX_STAGE_TEST_RUN=0123abcdef\0", marker)
    assert not leftovers.carries(b"OTHER_DGX_STAGE_TEST_RUN=0123abcd\0", marker)
    assert not leftovers.carries(b"", marker)


@pytest.fixture
def run_env(monkeypatch, tmp_path):
    """A fresh run id in this process's os.environ (what main() reads), and the machine's mounts and container
    engines held still, and a temp dir of the test's own: only the processes are real."""
    marker = uuid.uuid4().hex[:16]
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv(leftovers.MARKER, marker)
    monkeypatch.setenv("LEFTOVERS_GRACE", "0")
    mounts = leftovers.parse_mountinfo(MOUNTINFO)
    monkeypatch.setattr(leftovers, "read_mounts", lambda: list(mounts))
    monkeypatch.setattr(leftovers, "list_containers", lambda engine: None)
    return marker, str(tmp_path / "leftovers.json")


def test_check_names_a_process_carrying_the_run_id_and_passes_once_it_is_gone(run_env, capsys):
    marker, snapshot = run_env
    assert leftovers.main(["snapshot", snapshot]) == 0
    assert json.load(open(snapshot))["marker"] == marker
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "left-behind"],
                               env=dict(os.environ), start_new_session=True)
    try:
        # Until its exec the child is a copy of this process, under this process's command line.
        deadline = time.monotonic() + 30
        while b"left-behind" not in open("/proc/%d/cmdline" % sleeper.pid, "rb").read():
            assert time.monotonic() < deadline, "the sleeper never started"
            time.sleep(0.01)
        assert leftovers.main(["check", snapshot]) == 1
        out = capsys.readouterr().out.splitlines()
        assert out[0] == "leftovers: 1 thing(s) the test run %s started are still there:" % marker
        assert out[1].startswith("  process %d (parent %d, session %d, group %d, state "
                                 % (sleeper.pid, os.getpid(), sleeper.pid, sleeper.pid))
        assert out[1].endswith("): %s -c import time; time.sleep(120) left-behind" % sys.executable)
        assert len(out) == 2
    finally:
        processes.kill_tree(sleeper)
    assert leftovers.main(["check", snapshot]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "leftovers: none (no process of test run %s, no new mount, container or module payload)" % marker]


def test_a_module_payload_left_in_the_temp_dir_is_named_and_one_there_before_or_of_another_user_is_not(
        run_env, capsys):
    marker, snapshot = run_env
    temp = tempfile.gettempdir()
    os.mkdir(os.path.join(temp, "ansible_engine_node_state_payload_old1"))
    assert leftovers.main(["snapshot", snapshot]) == 0
    left = os.path.join(temp, "ansible_hf_hub_mirror_payload_x7y8")
    os.mkdir(left)
    os.mkdir(os.path.join(temp, "ansible-local-1234"))     # not a module payload
    if os.geteuid() == 0:   # CI: another user's module is not this run's
        os.mkdir(os.path.join(temp, "ansible_command_payload_q1w2"))
        os.chown(os.path.join(temp, "ansible_command_payload_q1w2"), 65534, -1)
    assert leftovers.main(["check", snapshot]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "leftovers: 1 thing(s) the test run %s started are still there:" % marker
    assert out[1].startswith("  module payload %s, not there at the start" % left) and len(out) == 2
    os.rmdir(left)
    assert leftovers.main(["check", snapshot]) == 0


def test_another_runs_processes_and_the_checks_own_ancestors_do_not_count(run_env):
    marker, _snapshot = run_env
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env=dict(os.environ, DGX_STAGE_TEST_RUN=marker + "0"))
    # The check runs under a shell (make's recipe) that carries the run id, as it does itself.
    code = ("import json, os, sys; sys.path.insert(0, %r); import leftovers\n"
            "print(json.dumps([p['pid'] for p in leftovers.marked_processes(%r, leftovers._ancestors(os.getpid()))]))\n"
            "print(json.dumps([p['pid'] for p in leftovers.marked_processes(%r)]))\n"
            % (os.path.dirname(TOOL), marker, marker))
    try:
        out = subprocess.check_output(["sh", "-c", '"$0" -c "$1"; :', sys.executable, code], env=dict(os.environ),
                                      timeout=60).decode().splitlines()
    finally:
        processes.kill_tree(other)
    assert json.loads(out[0]) == []
    assert len(json.loads(out[1])) == 2 and other.pid not in json.loads(out[1])     # the shell and the check


def test_the_command_refuses_without_a_run_id_or_a_snapshot_of_this_run(tmp_path):
    env = dict(os.environ)
    env.pop(leftovers.MARKER, None)
    snapshot = str(tmp_path / "s.json")
    proc = subprocess.run([sys.executable, TOOL, "check", snapshot], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    assert proc.returncode == 2 and b"DGX_STAGE_TEST_RUN is not set" in proc.stderr
    env[leftovers.MARKER] = "one"
    assert subprocess.run([sys.executable, TOOL, "check", snapshot], env=env, stderr=subprocess.PIPE).returncode == 2
    with open(snapshot, "w") as handle:
        json.dump({"marker": "another", "mounts": [], "containers": {}}, handle)
    proc = subprocess.run([sys.executable, TOOL, "check", snapshot], env=env, stderr=subprocess.PIPE)
    assert proc.returncode == 2 and b"from another run" in proc.stderr
    assert subprocess.run([sys.executable, TOOL, "look"], env=env, stderr=subprocess.PIPE).returncode == 2


def test_the_runtimes_own_state_mounts_are_not_leftovers_but_a_tmpfs_beside_them_is():
    """Podman and dockerd mount their storage and network namespaces on first use and keep them: a fresh
    machine's first test run creates them, and they are no test's leftover."""
    before = leftovers.parse_mountinfo(MOUNTINFO)
    after = leftovers.parse_mountinfo(MOUNTINFO + """\
70 27 254:0 /var/lib/containers/storage/overlay /var/lib/containers/storage/overlay rw - ext4 /dev/vda rw
71 27 0:4 net:[4026532] /run/netns/netns-8fe9986f rw - nsfs nsfs rw
72 27 0:4 net:[4026533] /run/docker/netns/default rw - nsfs nsfs rw
73 27 254:0 /var/lib/docker /var/lib/docker rw - ext4 /dev/vda rw
74 27 0:60 / /var/lib/dockerish rw - tmpfs tmpfs rw
75 27 0:61 / /run/netnsx rw - tmpfs tmpfs rw
""")
    assert [m["point"] for m in leftovers.new_mounts(before, after)] == ["/var/lib/dockerish", "/run/netnsx"]
