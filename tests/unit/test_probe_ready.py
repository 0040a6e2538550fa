"""dgx_lane_wait, dgx_decode, dgx_runtime: probes that cannot be fooled - the lane-wide readiness wait (every rank's container, who
serves the API port, the round verdict) and the decode probe's verdict on broken streams."""
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error

import pytest

from ansible.module_utils import dgx_decode, dgx_errors, dgx_lane_wait, dgx_openai, dgx_runtime, dgx_units
from ansible.module_utils.dgx_decode import decode_probe, decode_result, decode_verdict
from ansible.module_utils.dgx_lane_wait import lane_verdict, poll_round, run_wait, wait_probe
from ansible.module_utils.dgx_openai import parse_sse
from ansible.module_utils.dgx_decode import run_probe
from ansible.module_utils.dgx_runtime import api_owner, container_facts, container_state, owner_facts
from test_module_docs import engine  # noqa: F401,F811 (the fixture: the engine double on 127.0.0.1)
from test_probe import FakeClock, FakeResponse, api, finish_chunk, params, token_chunk

OURS = "728f7444814f95ac767beb8141ed81e541dc037353ebb2cb8b08d128c5e9566f"
THEIRS = "1a2b3c4d5e6f" + "0" * 52


# --- the three bad streams ------------------------------------------------------------------------

class ScriptedResponse(object):
    """A streamed response: (seconds before the line arrives, line) pairs, then EOF or a broken connection."""

    def __init__(self, script, clock, then=None):
        self.script = list(script)
        self.clock = clock
        self.then = then

    def readline(self, *args):
        if not self.script:
            if self.then is not None:
                raise self.then
            return b""
        delay, line = self.script.pop(0)
        self.clock.now += delay
        return line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def events(items, gap):
    """Script lines for SSE events, each event's data line after gap seconds."""
    script = []
    for item in items:
        raw = item if isinstance(item, bytes) else json.dumps(item).encode()
        script += [(gap, b"data: " + raw + b"\n"), (0.0, b"\n")]
    return script


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}


def usage(tokens):
    return {"choices": [], "usage": {"prompt_tokens": 487, "completion_tokens": tokens}}


def probe(script, then=None, floor=30.78, max_tokens=400):
    """decode_probe() on a scripted stream, then its verdict as run_probe() makes it."""
    clock = FakeClock()
    result = decode_probe("http://dgx1:8000", "m", max_tokens=max_tokens, clock=clock,
                          opener=lambda request, timeout: ScriptedResponse(script, clock, then))
    complete, problems = decode_verdict(result, max_tokens, floor)
    return result, complete, problems


def test_a_good_stream_passes():
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 400, 1 / 35.0) + events(
        [finish_chunk("length"), usage(400), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert complete and problems == [] and result["tokens"] == 400
    assert result["decode_tok_s"] == pytest.approx(35.0) and result["e2e_tok_s"] == pytest.approx(34.1, abs=0.05)


def test_a_stream_cut_after_50_of_400_tokens_fails():
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 50, 1 / 35.0)
    result, complete, problems = probe(script, then=http.client.IncompleteRead(b""))
    # Fast, and no rate is below the floor: only the missing finish reason gives it away.
    assert result["decode_tok_s"] == pytest.approx(35.0) and result["tokens"] == 50
    assert result["finish_reason"] is None and result["cut"].startswith("IncompleteRead")
    assert not complete
    assert problems[0] == ("the stream stopped after 50 of 400 tokens without a finish reason: the connection "
                           "broke (%s)" % result["cut"])
    # Closed cleanly, but still without a finish reason (no [DONE] either).
    result, complete, problems = probe(script[:])
    assert not complete and problems[0].endswith("without a finish reason: the stream ended")


def test_a_3_token_answer_fails():
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 3, 1 / 35.0) + events(
        [finish_chunk("stop"), usage(3), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert result["tokens"] == 3 and result["finish_reason"] == "stop" and result["decode_tok_s"] == pytest.approx(35)
    assert not complete
    assert problems[0] == ("the engine ended the answer after 3 of 400 tokens (finish_reason stop): too short to "
                           "measure decode speed")


def test_a_20_s_stall_then_a_burst_fails_on_the_end_to_end_rate():
    # The role chunk at once, then nothing for 20 s, then all 400 tokens within 5 ms.
    script = events([ROLE], 0.05) + [(20.0, b": keep-alive\n")] + events([token_chunk("t")] * 400, 0.005 / 400)
    script += events([finish_chunk("length"), usage(400), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert complete and result["tokens"] == 400
    assert result["decode_tok_s"] > 50000 and result["e2e_tok_s"] == pytest.approx(19.95, abs=0.05)
    assert problems == ["19.95 tok/s end to end (400 tokens / (last token - request sent)) is below "
                        "engine_decode_floor=30.78 (%s tok/s decode, but the first token came only after 20.05 s)"
                        % dgx_units.plain_number(result["decode_tok_s"])]


def test_a_stream_without_tokens_measures_nothing():
    result = decode_result(parse_sse([(1.0, b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n')]),
                           0.0, 1.0)
    assert result["decode_tok_s"] is None and result["e2e_tok_s"] is None and result["ttft_s"] is None
    complete, problems = decode_verdict(result, 400, 30.78)
    assert not complete and problems == [
        "the engine ended the answer after 0 of 400 tokens (finish_reason stop): too short to measure decode speed",
        "decode speed cannot be measured from 0 token(s)",
        "no tok/s end to end (0 tokens / (last token - request sent)) is below engine_decode_floor=30.78"]


@pytest.mark.parametrize("chunks, gap", [(50, 0.1), (2, 1.0), (100, 4 / 35.0)],
                         ids=["50 chunks at 10 tok/s", "two chunks a second apart", "speculative, 4 tokens a chunk"])
def test_a_length_finish_without_usage_counts_the_chunks_that_came_and_fails_a_short_answer(chunks, gap):
    """Without usage, finish_reason length is the engine's word, not a count: only the chunks that arrived
    count (a low bound), and an answer shorter than max_tokens fails, naming both counts."""
    script = events([ROLE], 0.3) + events([token_chunk("abcd")] * chunks, gap) + events(
        [finish_chunk("length"), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert (result["tokens"], result["token_source"], result["chunks"]) == (chunks, "chunks", chunks)
    assert not complete
    assert problems[0] == ("the engine ended with finish_reason length after %d content chunk(s) for max_tokens=400 "
                           "and sent no usage count (asked for with stream_options.include_usage): %d chunks prove "
                           "only %d tokens, too few to measure decode speed" % (chunks, chunks, chunks))


@pytest.mark.parametrize("count", ["400", "many", [400], {"n": 400}, True, 400.5, -400])
def test_a_usage_count_that_is_not_a_whole_number_is_no_count(count):
    """The engine's word is read, never trusted to be a number: a string, a list, a flag or a fraction counts as no
    usage, and the chunks that came count instead."""
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 400, 1 / 35.0) + events(
        [finish_chunk("length"), {"choices": [], "usage": {"completion_tokens": count}}, b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert (result["tokens"], result["token_source"]) == (400, "chunks")
    assert complete and problems == []


@pytest.mark.parametrize("count", [10 ** 30, 10 ** 400])
def test_a_usage_count_the_chunks_cannot_have_carried_fails_and_gives_no_rate(count):
    """A count past what the chunks can carry fails the gate, and no figure is made of it: no 10**28 tok/s in
    the report or the metrics, no float overflow."""
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 25, 1 / 35.0) + events(
        [finish_chunk("length"), usage(count), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert (result["token_source"], result["decode_tok_s"], result["e2e_tok_s"]) == ("usage", None, None)
    assert not complete and any("the count cannot be trusted" in problem for problem in problems), problems


def test_a_whole_answer_without_usage_passes_on_its_chunks():
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 400, 1 / 35.0) + events(
        [finish_chunk("length"), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert (result["tokens"], result["token_source"]) == (400, "chunks")
    assert complete and problems == []


def test_a_rate_just_under_the_floor_fails_however_it_rounds():
    """30.7751 tok/s would show as 30.78, and is still under engine_decode_floor=30.78."""
    script = events([ROLE], 0.0) + events([token_chunk("t")] * 400, 1 / 30.7751) + events(
        [finish_chunk("length"), usage(400), b"[DONE]"], 0.0)
    result, complete, problems = probe(script, floor=30.78)
    assert complete and result["decode_tok_s"] == pytest.approx(30.7751, abs=1e-6)
    assert problems[0].startswith("30.7751 tok/s decode is below engine_decode_floor=30.78 (400 tokens in ")
    assert problems[1].startswith("30.7751 tok/s end to end (400 tokens / (last token - request sent)) is below")
    assert dgx_decode.floor_verdict("decode", result, 30.78) is False


@pytest.mark.parametrize("reason", ["abort", "content_filter", "error", "tool_calls"])
def test_only_length_or_stop_is_a_finished_stream(reason):
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 400, 1 / 35.0) + events(
        [finish_chunk(reason), usage(400), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert not complete
    assert problems == ["the engine ended the answer with finish_reason %s after 400 of 400 tokens: only length "
                        "or stop mean the answer ran to its end" % reason]


def test_a_length_finish_with_fewer_tokens_by_usage_is_a_contradiction_not_a_short_answer():
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 100, 1 / 35.0) + events(
        [finish_chunk("length"), usage(100), b"[DONE]"], 0.0)
    _result, complete, problems = probe(script)
    assert not complete and problems == [
        "the engine ended with finish_reason length but usage counts only 100 of 400 tokens: it hit another "
        "length limit (the context window?) or miscounts"]


def test_more_tokens_than_max_tokens_fails():
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 450, 1 / 35.0) + events(
        [finish_chunk("length"), b"[DONE]"], 0.0)
    result, complete, problems = probe(script)
    assert result["tokens"] == 450 and not complete
    assert problems == ["the engine streamed 450 tokens for max_tokens=400: it ignored max_tokens"]
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 400, 1 / 35.0) + events(
        [finish_chunk("length"), usage(401), b"[DONE]"], 0.0)
    _result, complete, problems = probe(script)
    assert not complete and problems == ["the engine streamed 401 tokens for max_tokens=400: it ignored max_tokens"]


def test_usage_far_beyond_the_content_streamed_is_not_believed():
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 3, 1.0) + events(
        [finish_chunk("length"), usage(400), b"[DONE]"], 0.0)
    _result, complete, problems = probe(script, floor=None)
    assert not complete and problems == [
        "usage claims 400 tokens but only 3 chunk(s) carried content (at most 16 tokens a chunk even with "
        "speculative decoding): the count cannot be trusted"]
    # 25 chunks of 16 drafted tokens each is believable.
    script = events([ROLE], 0.3) + events([token_chunk("t" * 16)] * 25, 16 / 35.0) + events(
        [finish_chunk("length"), usage(400), b"[DONE]"], 0.0)
    assert probe(script)[1:] == (True, [])


def test_run_probe_reports_a_cut_stream_as_a_verdict_not_a_crash():
    clock = FakeClock()
    script = events([ROLE], 0.1) + events([token_chunk("t")] * 50, 0.01)

    def opener(request, timeout):
        if request.full_url.endswith("/v1/models"):
            return FakeResponse(json.dumps({"data": [{"id": "ds41"}]}).encode())
        return ScriptedResponse(script, clock, ConnectionResetError(104, "Connection reset by peer"))

    result = run_probe(params(mode="decode", floor=30.78), opener=opener, clock=clock)
    assert result["complete"] is False and result["passed_floor"] is True and result["report"]["passed"] is False
    assert result["msg"].startswith("the stream stopped after 50 of 400 tokens without a finish reason: the "
                                    "connection broke (ConnectionResetError")
    assert result["report"]["problems"] == result["problems"] and result["report"]["complete"] is False


# --- containers -----------------------------------------------------------------------------------

def inspect_json(running=True, exit_code=0, status=None, finished="0001-01-01T00:00:00Z", **state):
    state = dict({"Status": status or ("running" if running else "exited"), "Running": running, "Paused": False,
                  "Restarting": False, "OOMKilled": False, "Pid": 4242 if running else 0, "ExitCode": exit_code,
                  "Error": "", "StartedAt": "2026-11-30T20:45:12.1Z", "FinishedAt": finished}, **state)
    return json.dumps([{"Id": OURS, "Name": "/ds41-engine", "State": state}])


def inspected(text):
    return container_facts(json.loads(text)[0])


def test_container_facts_of_a_running_and_an_exited_container():
    facts = inspected(inspect_json())
    assert facts["running"] and facts["id"] == OURS and facts["finished_at"] is None and facts["exists"]
    facts = inspected(inspect_json(False, 3, finished="2026-11-30T20:46:00.5Z", OOMKilled=True))
    assert (facts["running"], facts["status"], facts["exit_code"], facts["finished_at"], facts["oom_killed"]) == (
        False, "exited", 3, "2026-11-30T20:46:00.5Z", True)
    assert inspected(inspect_json(Paused=True))["running"] is False


def test_a_podman_container_stopped_before_its_clean_up_is_an_exited_one_with_its_exit_code():
    # Podman says "stopped" for a moment between the process's end and its clean-up ("exited"): the same rank
    # must not be described two ways depending on when the probe looked.
    facts = inspected(inspect_json(False, 3, status="stopped", finished="2026-11-30T20:46:00Z"))
    assert (facts["status"], facts["exit_code"]) == ("exited", 3)


class FakeRunner(object):
    """Stands in for the AnsibleModule: a runtime CLI with one container in a given state, and others by id."""

    def __init__(self, inspect=None, logs="", binary="/usr/bin/docker", names=None):
        self.inspect, self.logs, self.binary = inspect, logs, binary
        self.names = names or {}
        self.commands = []

    def get_bin_path(self, name):
        return self.binary

    def run_command(self, argv):
        self.commands.append(argv)
        if argv[1] == "inspect" and "--format" in argv:
            name = self.names.get(argv[-1])
            return (0, name + "\n", "") if name else (125, "", "no such container")
        if argv[1] == "inspect":
            return (0, self.inspect, "") if self.inspect else (125, "", "Error: no such container " + argv[-1])
        return 0, self.logs, ""


def test_container_state_reads_the_log_of_a_container_that_is_not_running():
    runner = FakeRunner(inspect_json(False, 3), logs="line 1\nRuntimeError: NCCL timeout\n")
    facts = container_state(runner, "docker", "ds41-engine")
    assert facts["exit_code"] == 3 and "NCCL timeout" in facts["logs"]
    assert runner.commands == [["/usr/bin/docker", "inspect", "--type", "container", "ds41-engine"],
                               ["/usr/bin/docker", "logs", "--tail", "30", "ds41-engine"]]
    assert container_state(FakeRunner(inspect_json()), "docker", "x")["logs"] == ""
    missing = container_state(FakeRunner(), "docker", "x")
    assert missing["exists"] is False and "no such container" in missing["error"]
    assert container_state(FakeRunner(binary=None), "podman", "x")["error"] == "podman not found on this host"


# --- who serves the API port ----------------------------------------------------------------------

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31337 1 0000 100 0 0 10 0
   1: 0100007F:1F40 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 40001 1 0000 20 4 30 10 -1
   2: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31338 1 0000 100 0 0 10 0
"""
TCP6 = "".join([  # the real lines are wider than this file
    "  sl  local_address                         remote_address                        st tx_queue rx_queue",
    " tr tm->when retrnsmt   uid  timeout inode\n",
    "   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000",
    " 00:00000000 00000000     0        0 31339 1 0000 100 0 0 10 0\n"])


def fake_proc(root, holders):
    """A /proc with TCP and TCP6 and processes {pid: (cmdline, cgroup, [socket inodes])}."""
    os.makedirs(os.path.join(root, "net"))
    with open(os.path.join(root, "net", "tcp"), "w") as handle:
        handle.write(TCP)
    with open(os.path.join(root, "net", "tcp6"), "w") as handle:
        handle.write(TCP6)
    for pid, (cmdline, cgroup, inodes) in holders.items():
        os.makedirs(os.path.join(root, str(pid), "fd"))
        with open(os.path.join(root, str(pid), "cmdline"), "w") as handle:
            handle.write("\0".join(cmdline) + "\0")
        with open(os.path.join(root, str(pid), "cgroup"), "w") as handle:
            handle.write(cgroup)
        os.symlink("/dev/null", os.path.join(root, str(pid), "fd", "0"))
        for fd, inode in enumerate(inodes, 3):
            os.symlink("socket:[%d]" % inode, os.path.join(root, str(pid), "fd", str(fd)))
    os.makedirs(os.path.join(root, "self"))
    return str(root)


def test_api_owner_reads_the_listening_sockets_of_the_port_from_proc_net_tcp_and_tcp6(tmp_path):
    proc = fake_proc(tmp_path, {
        10: (["python3", "/opt/engine_double/engine_double.py"], "0::/libpod_parent/libpod-%s\n" % OURS, [31337]),
        11: (["python3", "-m", "http.server", "8001"], "0::/user.slice\n", [31338]),
        12: (["sshd"], "0::/system.slice/ssh.service\n", [40001]),     # an established connection on 8000
        13: (["nginx"], "0::/system.slice/docker-%s.scope\n" % THEIRS, [31339])})   # tcp6, in another container
    runner = FakeRunner(names={THEIRS: "/old-engine"})
    owner = api_owner(runner, "docker", 8000, {"id": OURS}, proc)
    assert owner == {"port": 8000, "listening": True, "ours": False, "holders": [
        # This run's engine by its container alone: its command line holds its secrets (--api-key).
        {"pid": 10, "cmdline": None, "container_id": OURS, "container_name": None},
        {"pid": 13, "cmdline": "nginx", "container_id": THEIRS, "container_name": "old-engine"}]}
    owner = api_owner(runner, "docker", 8001, {"id": OURS}, proc)
    assert owner["holders"] == [{"pid": 11, "cmdline": "python3 -m http.server 8001", "container_id": None,
                                 "container_name": None}]
    assert dgx_lane_wait.describe_holder(owner["holders"][0]) == "pid 11 (python3 -m http.server 8001), not in a container"


def test_api_owner_proves_our_container_or_names_the_stranger(tmp_path):
    proc = fake_proc(tmp_path, {
        20: (["python3", "old_engine.py"], "0::/libpod_parent/libpod-%s\n" % THEIRS, [31337])})
    runner = FakeRunner(names={THEIRS: "/old-engine"})
    owner = api_owner(runner, "docker", 8000, {"id": OURS}, proc)
    assert owner["ours"] is False and owner["listening"] is True
    assert owner["holders"] == [{"pid": 20, "cmdline": "python3 old_engine.py", "container_id": THEIRS,
                                 "container_name": "old-engine"}]
    assert dgx_lane_wait.describe_holder(owner["holders"][0]) == (
        "pid 20 (python3 old_engine.py) in container 1a2b3c4d5e6f (old-engine)")
    assert api_owner(runner, "docker", 8000, {"id": THEIRS}, proc)["holders"][0]["container_name"] is None  # ours
    assert api_owner(runner, "docker", 8000, {"id": THEIRS}, proc)["ours"] is True
    assert api_owner(runner, "docker", 8000, None, proc)["ours"] is False      # our container does not exist
    assert api_owner(runner, "docker", 9000, {"id": OURS}, proc) == {"port": 9000, "listening": False,
                                                                      "holders": [], "ours": None}


def test_a_strangers_command_line_is_shown_without_its_own_secret_flags_values(tmp_path):
    # An earlier engine still on the port was started with a key this run does not know (rotated since).
    proc = fake_proc(tmp_path, {
        20: (["vllm", "serve", "--api-key", "sk-oldKEY123", "--hf-token=hf_oldTOKEN", "--tp", "8"],
             "0::/libpod_parent/libpod-%s\n" % THEIRS, [31337])})
    owner = api_owner(FakeRunner(names={THEIRS: "/old-engine"}), "docker", 8000, {"id": OURS}, proc, ["sk-newKEY"])
    assert owner["holders"][0]["cmdline"] == "vllm serve --api-key <hidden> --hf-token=<hidden> --tp 8"


def test_api_owner_on_the_real_proc_finds_this_process():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        owner = api_owner(None, "docker", port, None)
    assert owner["listening"] and [h["pid"] for h in owner["holders"]] == [os.getpid()] and owner["ours"] is False


def test_owner_facts_needs_every_holder_in_our_container():
    ours = {"pid": 1, "container_id": OURS}
    theirs = {"pid": 2, "container_id": THEIRS}
    assert owner_facts(8000, True, [ours], OURS)["ours"] is True
    assert owner_facts(8000, True, [ours, theirs], OURS)["ours"] is False      # SO_REUSEPORT: a stranger shares it
    assert owner_facts(8000, True, [], OURS)["ours"] is None                   # listening, holders not visible


# --- the round's verdict --------------------------------------------------------------------------

def container(running=True, exit_code=0, finished=None, name="ds41-engine", logs=""):
    return {"name": name, "exists": True, "id": OURS, "running": running, "status": "running" if running else "exited",
            "exit_code": exit_code, "started_at": "2026-11-30T20:45:12Z", "finished_at": finished, "error": "",
            "oom_killed": False, "logs": logs}


def row(api=False, running=True, owner=None, **kwargs):
    return {"api": api, "models": ["ds41"] if api else [], "status": "ready" if api else "GET failed: unreachable",
            "polls": 1, "elapsed_s": 0.1, "container": container(running, **kwargs), "owner": owner}


HOSTS = ["dgx1", "dgx2", "dgx3", "dgx4"]
URL = "http://dgx1:8000"
OURS_OWNER = {"port": 8000, "listening": True, "ours": True, "holders": [{"pid": 7, "container_id": OURS}]}


def test_ready_needs_the_api_from_our_container_and_every_rank_running():
    rows = {"dgx1": row(True, owner=OURS_OWNER), "dgx2": row(True), "dgx3": row(), "dgx4": row()}
    verdict = lane_verdict(HOSTS, rows, URL)
    assert verdict == {"state": "ready", "decided": True, "msg": "API ready: ds41 - all 4 ranks running",
                       "host": None, "rank": None, "exit_code": None}
    # The API is not up yet: pending, or timeout when the time is up.
    rows["dgx1"] = row()
    assert lane_verdict(HOSTS, rows, URL)["state"] == "pending"
    verdict = lane_verdict(HOSTS, rows, URL, give_up=True)
    assert verdict["state"] == "timeout" and "did not answer in time" in verdict["msg"] and verdict["rank"] == 0


def test_a_dead_rank_fails_the_lane_even_when_the_api_answers():
    rows = {"dgx1": row(True, owner=OURS_OWNER), "dgx2": row(False, False, exit_code=3,
                                                               finished="2026-11-30T20:46:00Z",
                                                               logs="loading\nRuntimeError: rank 1 lost its GPU\n"),
            "dgx3": row(), "dgx4": row()}
    verdict = lane_verdict(HOSTS, rows, URL)
    assert (verdict["state"], verdict["host"], verdict["rank"], verdict["exit_code"]) == ("dead", "dgx2", 1, 3)
    assert verdict["msg"] == ("Rank 1 of the lane is down - rank 1 (host dgx2): container ds41-engine is not "
                              "running (exited), exit code 3, ended 2026-11-30T20:46:00Z. Its log ends:\n"
                              "loading\nRuntimeError: rank 1 lost its GPU")


def test_a_paused_rank_is_named_paused_without_an_exit_code():
    # docker: Running and Paused both true; podman: Running false, Status paused. ExitCode 0 is no exit.
    for state in ({"Running": True, "Paused": True, "Status": "paused"}, {"Running": False, "Paused": True}):
        facts = inspected(inspect_json(finished="2026-11-30T20:40:00Z", **state))
        assert (facts["running"], facts["status"], facts["exit_code"]) == (False, "paused", None)
    rows = {"dgx1": row(True, owner=OURS_OWNER), "dgx2": {"container": facts}, "dgx3": row(), "dgx4": row()}
    verdict = lane_verdict(HOSTS, rows, URL)
    assert (verdict["state"], verdict["rank"], verdict["exit_code"]) == ("dead", 1, None)
    assert verdict["msg"].startswith("Rank 1 of the lane is down - rank 1 (host dgx2): container ds41-engine is "
                                     "paused (not running). Its log ends:")


@pytest.mark.parametrize("state, text", [
    ({"Status": "exited", "ExitCode": 3}, "is not running (exited), exit code 3, ended 2026-11-30T20:46:00Z"),
    ({"Status": "stopped", "ExitCode": 0}, "is not running (exited), exit code 0, ended 2026-11-30T20:46:00Z"),
    ({"Status": "created"}, "was created but never started"),
    ({"Status": "configured"}, "was created but never started"),
    ({"Status": "initialized"}, "was created but never started"),
    ({"Status": "stopping"}, "is stopping (not running)"),
    ({"Status": "dead", "ExitCode": 137}, "is dead (the runtime failed to stop or remove it), exit code 137, "
                                          "ended 2026-11-30T20:46:00Z"),
    ({"Status": "restarting", "Running": True, "Restarting": True, "ExitCode": 1},
     "is restarting after an exit (not running), last exit code 1, ended 2026-11-30T20:46:00Z"),
])
def test_each_container_state_is_worded_as_it_is(state, text):
    state = dict({"Running": False, "ExitCode": 0}, **state)
    facts = inspected(inspect_json(finished="2026-11-30T20:46:00Z", **state))
    assert not facts["running"]
    assert dgx_lane_wait.describe_down(2, "dgx3", facts) == "rank 2 (host dgx3): container ds41-engine " + text


def test_the_first_rank_to_end_is_named_and_the_others_listed():
    rows = {"dgx1": row(False, False, exit_code=1, finished="2026-11-30T20:46:00Z", logs="NCCL error"),
            "dgx2": row(), "dgx3": row(False, False, exit_code=137, finished="2026-11-30T20:45:59Z", logs="Killed"),
            "dgx4": row()}
    verdict = lane_verdict(HOSTS, rows, URL)
    assert (verdict["host"], verdict["rank"], verdict["exit_code"]) == ("dgx3", 2, 137)
    assert verdict["msg"].endswith("Killed\nAlso down: rank 0 (host dgx1): container ds41-engine is not running "
                                   "(exited), exit code 1, ended 2026-11-30T20:46:00Z.")


def test_a_rank_that_did_not_report_fails_the_lane():
    verdict = lane_verdict(HOSTS, {"dgx1": row(True, owner=OURS_OWNER), "dgx2": row()}, URL)
    assert (verdict["state"], verdict["host"], verdict["rank"]) == ("missing", "dgx3", 2)
    assert "Missing: rank 2 (dgx3), rank 3 (dgx4)." in verdict["msg"]


STRANGER = {"port": 8000, "listening": True, "ours": False,
            "holders": [{"pid": 20, "cmdline": "python3 old_engine.py", "container_id": THEIRS,
                         "container_name": "old-engine"}]}


def test_an_api_served_by_a_stranger_fails_naming_it():
    rows = {"dgx1": row(True, owner=STRANGER), "dgx2": row(True)}
    verdict = lane_verdict(HOSTS[:2], rows, URL)
    assert (verdict["state"], verdict["host"], verdict["rank"]) == ("stranger", "dgx1", 0)
    assert verdict["msg"] == (
        "The API at http://dgx1:8000 is not served by this run's engine: port 8000 on dgx1 is held by pid 20 "
        "(python3 old_engine.py) in container 1a2b3c4d5e6f (old-engine), not by container ds41-engine (rank 0). "
        "Stop the old engine (engine_stop_strays) or free the port.")


def test_our_dead_master_and_the_stranger_on_its_port_are_both_named():
    rows = {"dgx1": row(False, False, exit_code=1, owner=STRANGER,
                        logs="OSError: [Errno 98] Address already in use"), "dgx2": row(True)}
    verdict = lane_verdict(HOSTS[:2], rows, URL)
    assert (verdict["state"], verdict["rank"], verdict["exit_code"]) == ("dead", 0, 1)
    assert "Address already in use" in verdict["msg"]
    assert verdict["msg"].endswith("The API at http://dgx1:8000 is answered by someone else: port 8000 on dgx1 is "
                                   "held by pid 20 (python3 old_engine.py) in container 1a2b3c4d5e6f (old-engine).")


def test_an_api_nobody_can_be_seen_serving_is_not_ready():
    nobody = {"port": 8000, "listening": False, "ours": None, "holders": []}
    verdict = lane_verdict(HOSTS[:1], {"dgx1": row(True, owner=nobody)}, URL)
    assert verdict["state"] == "unproven" and "nothing on dgx1 listens on port 8000" in verdict["msg"]
    hidden = dict(nobody, listening=True)
    verdict = lane_verdict(HOSTS[:1], {"dgx1": row(True, owner=hidden)}, URL)
    assert verdict["state"] == "unproven" and "could not be seen (run with become)" in verdict["msg"]


# --- rounds ---------------------------------------------------------------------------------------

def refused(request, timeout):
    raise urllib.error.URLError("refused")


def test_poll_round_looks_at_the_container_before_every_poll_and_stops_when_it_is_down():
    clock = FakeClock()
    states = [container(), container(), container(False, 3)]
    seen = []
    row_ = poll_round("http://dgx1:8000", 600, container_check=lambda: states.pop(0),
                      owner_check=lambda facts: seen.append(facts) or {"ours": None}, opener=refused, clock=clock,
                      sleep=clock.sleep)
    assert row_["polls"] == 3 and row_["container"]["exit_code"] == 3 and row_["api"] is False
    assert row_["status"] == "container ds41-engine is exited" and row_["elapsed_s"] == 2.0
    assert seen == [row_["container"]]      # the master's port is looked at once its container is down


def test_poll_round_returns_once_the_api_answers_and_checks_the_owner():
    clock = FakeClock()
    answers = [urllib.error.URLError("refused"), FakeResponse(json.dumps({"data": [{"id": "ds41"}]}).encode())]

    def opener(request, timeout):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    row_ = poll_round("http://dgx1:8000", 10, container_check=lambda: container(),
                      owner_check=lambda facts: OURS_OWNER, opener=opener, clock=clock, sleep=clock.sleep)
    assert row_["api"] and row_["models"] == ["ds41"] and row_["polls"] == 2 and row_["owner"] == OURS_OWNER
    row_ = poll_round("http://dgx1:8000", 5, opener=refused, clock=clock, sleep=clock.sleep)
    assert not row_["api"] and "refused" in row_["status"] and row_["elapsed_s"] <= 5 and row_["owner"] is None


def test_a_round_that_the_last_round_decides_returns_without_polling():
    def no_poll(request, timeout):
        raise AssertionError("polled")

    lane = {"dgx1": row(True, owner=OURS_OWNER), "dgx2": row(False, False, exit_code=3)}
    result = wait_probe(URL, 10, container_check=lambda: container(), lane_hosts=HOSTS[:2], lane=lane,
                        opener=no_poll)
    assert result["decided"] and not result["ready"] and result["verdict"]["rank"] == 1
    assert "row" not in result and "polls" not in result and result["models"] == ["ds41"]
    # The first round has no lane to judge: it polls and is pending.
    clock = FakeClock()
    result = wait_probe(URL, 3, container_check=lambda: container(), lane_hosts=HOSTS[:2], opener=refused,
                        clock=clock, sleep=clock.sleep)
    assert result["verdict"]["state"] == "pending" and not result["decided"] and result["row"]["polls"] == 4
    # Time is up: an undecided lane is a timeout, not polled again.
    lane = {"dgx1": row(), "dgx2": row()}
    result = wait_probe(URL, 10, lane_hosts=HOSTS[:2], lane=lane, give_up=True, opener=no_poll)
    assert result["verdict"]["state"] == "timeout" and result["decided"]


def wait_params(**overrides):
    """engine_lane_wait's options as the module parses them, with overrides."""
    base = {"url": "http://dgx1:8000", "wait_for": 10.0, "container": None, "runtime": "docker", "port": None,
            "lane_hosts": None, "lane": None, "give_up": False, "wait_id": None, "round": 1, "redact": []}
    base.update(overrides)
    return base


def test_run_wait_in_a_lane_reports_every_rank():
    runner = FakeRunner(inspect_json())
    lane = {"dgx1": row(True, owner=OURS_OWNER), "dgx2": row(True)}
    result = run_wait(wait_params(container="ds41-engine", lane_hosts=HOSTS[:2], lane=lane, round=2),
                      runner=runner, opener=refused)
    assert result["ready"] and result["msg"] == "API ready: ds41 - all 2 ranks running"
    assert result["report"] == {"models": ["ds41"], "state": "ready", "rounds": 2, "ranks": [
        {"host": "dgx1", "rank": 0, "status": "running", "exit_code": 0, "id": OURS[:12]},
        {"host": "dgx2", "rank": 1, "status": "running", "exit_code": 0, "id": OURS[:12]}],
        "api_served_by": "pid 7 in container 728f7444814f"}
    assert "lane_rows" not in result and runner.commands == []


def test_run_wait_alone_stops_when_the_container_is_not_running():
    runner = FakeRunner(inspect_json(False, 3), logs="CUDA error: out of memory\n")
    clock = FakeClock()
    result = run_wait(wait_params(container="ds41-engine", wait_for=600.0), runner=runner,
                      opener=refused, clock=clock, sleep=clock.sleep)
    assert result["running"] is False and result["ready"] is False and "out of memory" in result["logs"]
    assert result["verdict"]["state"] == "dead" and result["verdict"]["exit_code"] == 3 and result["polls"] == 1
    assert result["report"] == {"models": []} and "out of memory" in result["msg"]


def test_run_wait_shows_no_secret_from_an_engine_log_a_verdict_or_a_strangers_command_line():
    """An engine prints its arguments when it dies (sglang: server_args=... api_key='sk-...'), and an old engine
    on the port runs with its own --api-key: the row, the verdict and the report hide both; the next round's
    verdict, built from the previous rows, has nothing left to hide."""
    secrets = ["sk-live-4f9a", "hf_TOKENVALUE123"]
    runner = FakeRunner(inspect_json(False, 1), logs="server_args=ServerArgs(api_key='sk-live-4f9a', "
                                                     "hf_token='hf_TOKENVALUE123')\nRuntimeError: boom\n")
    stranger = {"port": 8000, "listening": True, "ours": False, "holders": [
        {"pid": 9, "cmdline": "python3 old.py --api-key sk-live-4f9a", "container_id": None}]}
    first = run_wait(wait_params(container="ds41-engine", lane_hosts=HOSTS[:2], redact=secrets),
                     runner=runner, opener=refused)
    lane = {"dgx1": dict(first["row"], owner=stranger), "dgx2": row(True)}
    second = run_wait(wait_params(container="ds41-engine", lane_hosts=HOSTS[:2], lane=lane, round=2,
                                  redact=secrets), runner=runner, opener=refused)
    assert second["verdict"]["state"] == "dead" and "RuntimeError: boom" in second["msg"]
    assert "api_key='<hidden>'" in second["msg"] and "--api-key <hidden>" in second["msg"]
    for result in (first, second):
        shown = json.dumps(result)
        assert not [secret for secret in secrets if secret in shown], shown


def test_a_secret_straddling_the_cut_of_a_log_tail_or_a_command_line_is_hidden_whole():
    """The log tail keeps its last 4,000 characters and a holder's command line its first 200: a secret
    across either edge is hidden before the cut, so no piece of it is shown."""
    secret = "sk_live_" + "ABCDEFGHJKMNPQRS" * 2
    half = len(secret) // 2
    log = "api_key=%s\n%s" % (secret, "y" * (4000 - half - 1))
    runner = FakeRunner(inspect_json(False, 1), logs=log)
    script = "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); " \
             "print(s.getsockname()[1], flush=True); sys.stdin.read()"
    head = " ".join(["python3", "-c", script, ""])
    pad = "p" * (200 - half - len(head) - len(" --api-key "))
    holder = subprocess.Popen(["python3", "-c", script, pad, "--api-key", secret], executable=sys.executable,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        port = int(holder.stdout.readline())
        result = run_wait(wait_params(container="ds41-engine", port=port, redact=[secret]),
                          runner=runner, opener=refused)
    finally:
        holder.kill()
        holder.wait()
    assert [h["cmdline"] for h in result["row"]["owner"]["holders"]] == [(head + pad + " --api-key <hidden>")[:200]]
    assert result["row"]["container"]["logs"].endswith("y" * 100)
    shown = json.dumps(result)
    assert secret[:8] not in shown and secret[-8:] not in shown


def test_run_wait_alone_without_a_container():
    clock = FakeClock()
    result = run_wait(wait_params(), opener=api({}), clock=clock, sleep=clock.sleep)
    assert result["ready"] is True and result["running"] is True and result["logs"] == ""
    assert result["report"] == {"models": ["ds41"]} and result["msg"] == "API ready: ds41"


# --- the module's documented results in a lane's rounds (test_module_docs' checker) ------------------

def test_engine_lane_wait_rounds_return_what_they_document(engine):
    from test_module_docs import check_result, run_main
    port = int(engine.rsplit(":", 1)[1])
    # The master's first round: the API (this test process) answers; who holds the port is looked up.
    first = dict(url=engine, wait_for=2, port=port, lane_hosts=["dgx1"])
    result = check_result("engine_lane_wait", first, run_main("engine_lane_wait", first))
    assert result["verdict"]["state"] == "pending" and result["row"]["api"] is True
    assert [h["pid"] for h in result["row"]["owner"]["holders"]] == [os.getpid()]
    # The next round judges it: a process outside the engine's container serves the API.
    second = dict(first, lane={"dgx1": result["row"]})
    result = check_result("engine_lane_wait", second, run_main("engine_lane_wait", second))
    assert result["verdict"]["state"] == "stranger" and "not in a container" in result["msg"]
    assert result["report"]["state"] == "stranger" and "api_served_by" in result["report"]
    # A container the runtime does not know (or no runtime at all): down at once.
    gone = dict(url=engine, wait_for=2, container="dgx-stage-no-such-container-%d" % os.getpid(),
                runtime="podman", lane_hosts=["dgx1"])
    result = check_result("engine_lane_wait", gone, run_main("engine_lane_wait", gone))
    assert result["row"]["container"]["exists"] is False and result["running"] is False
    gone["lane"] = {"dgx1": result["row"]}
    result = check_result("engine_lane_wait", gone, run_main("engine_lane_wait", gone))
    assert result["verdict"]["state"] == "dead" and "no container dgx-stage-no-such-container" in result["msg"]


# --- the engine double's switches, through the real probe -----------------------------------------

def switch(url, **switches):
    import urllib.request
    request = urllib.request.Request(url + "/debug/switches", data=json.dumps(switches).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read().decode())


@pytest.mark.parametrize("switches, check", [
    ({}, lambda r, c, p: c and p == [] and r["finish_reason"] == "length" and r["done"]),
    ({"cut_after": 5}, lambda r, c, p: not c and r["tokens"] == 5 and r["cut"] and not r["done"]
     and p[0].startswith("the stream stopped after 5 of 40 tokens without a finish reason: the connection broke")),
    ({"short_after": 3}, lambda r, c, p: not c and r["tokens"] == 3 and r["finish_reason"] == "stop"
     and p[0].startswith("the engine ended the answer after 3 of 40 tokens (finish_reason stop)")),
    ({"stall_s": 0.5}, lambda r, c, p: c and r["decode_tok_s"] > 1000 and r["e2e_tok_s"] < 100
     and len(p) == 1 and "tok/s end to end" in p[0] and "first token came only after" in p[0]),
    ({"no_usage": True}, lambda r, c, p: c and p == [] and (r["tokens"], r["token_source"]) == (40, "chunks")),
    ({"no_usage": True, "length_after": 5}, lambda r, c, p: not c and r["tokens"] == 5
     and p[0].startswith("the engine ended with finish_reason length after 5 content chunk(s) for max_tokens=40 "
                         "and sent no usage count")),
], ids=["complete", "cut", "short", "stall-then-burst", "no usage", "no usage, short with length"])
def test_the_engine_doubles_broken_streams_fail_the_decode_verdict(engine, switches, check):
    assert switch(engine, **switches) == switches
    try:
        result = decode_probe(engine, "engine-double", max_tokens=40, timeout=30)
        complete, problems = decode_verdict(result, 40, floor=100.0)
        assert check(result, complete, problems), (result, problems)
    finally:
        switch(engine, **dict((name, None) for name in switches))


def test_the_engine_double_reads_its_switches_from_the_environment():
    from test_module_docs import load_engine_double
    double = load_engine_double()
    assert double.switches_from({"DOUBLE_STALL_S": "20", "DOUBLE_STALL_AFTER": "", "DOUBLE_CUT_AFTER": "50",
                                 "DOUBLE_SHORT_AFTER": "3", "DOUBLE_NO_USAGE": "1", "OTHER": "1"}) == {
        "stall_s": 20.0, "cut_after": 50, "short_after": 3, "no_usage": True}
    assert double.switches_from({}) == {}


def test_only_this_waits_rows_of_the_previous_round_count():
    lane = {"dgx1": dict(row(True, owner=OURS_OWNER), wait_id="w2", round=3),
            "dgx2": dict(row(True), wait_id="w2", round=2),      # left the play after round 2
            "dgx3": dict(row(True), wait_id="w1", round=3),      # a row of an earlier wait
            "dgx4": {}}                                         # never reported
    assert sorted(dgx_lane_wait.fresh_rows(lane, "w2", 4)) == ["dgx1"]
    result = wait_probe(URL, 10, lane_hosts=HOSTS, lane=lane, wait_id="w2", round_no=4,
                        opener=lambda request, timeout: None)
    assert result["verdict"]["state"] == "missing" and result["verdict"]["host"] == "dgx2"
    assert "Missing: rank 1 (dgx2), rank 2 (dgx3), rank 3 (dgx4)." in result["msg"]
    # A row this call makes carries the wait and the round for the next one.
    clock = FakeClock()
    result = wait_probe(URL, 1, lane_hosts=HOSTS[:1], wait_id="w2", round_no=1, opener=refused, clock=clock,
                        sleep=clock.sleep)
    assert (result["row"]["wait_id"], result["row"]["round"]) == ("w2", 1)


# --- whole-request deadlines ------------------------------------------------------------------------

def test_a_stream_trickling_a_token_every_299_s_ends_at_the_request_deadline():
    """engine_request_timeout is the whole request's: each read may wait only what is left of it."""
    script = events([ROLE], 0.3) + events([token_chunk("t")] * 400, 299.0) + events(
        [finish_chunk("length"), usage(400), b"[DONE]"], 0.0)
    clock = FakeClock()
    result = decode_probe("http://dgx1:8000", "m", max_tokens=400, timeout=300.0, clock=clock,
                          opener=lambda request, timeout: ScriptedResponse(script, clock))
    # The scripted clock moves inside a read: the line that crossed the deadline still arrives, the next is not read.
    assert result["tokens"] == 2 and not result["done"]
    assert result["cut"] == "the whole request took longer than 300 s (engine_request_timeout)"


def test_a_json_answer_trickled_over_a_real_socket_fails_at_the_deadline():
    import socketserver
    import threading

    class Trickle(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.recv(65536)
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n")
            for _byte in range(40):
                time.sleep(0.2)          # every read is well within a 1 s socket timeout
                try:
                    self.request.sendall(b" ")
                except OSError:
                    return

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(dgx_errors.StageError) as failed:
            dgx_openai.http_json("http://127.0.0.1:%d/v1/models" % server.server_address[1], timeout=1.0)
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - started < 3.0
    assert "the whole request took longer than 1 s (engine_request_timeout)" in str(failed.value), str(failed.value)


def test_a_stream_still_going_at_the_deadline_is_cut_there_over_a_real_socket(engine):
    """The engine double streams 4000 tokens at 2000 tok/s (2 s), a token every 0.5 ms: no single read waits
    long, and the whole request still ends at its 1 s deadline."""
    started = time.monotonic()
    result = decode_probe(engine, "engine-double", max_tokens=4000, timeout=1.0)
    assert time.monotonic() - started < 1.8
    assert 0 < result["tokens"] < 4000 and not result["done"]
    assert result["cut"] == "the whole request took longer than 1 s (engine_request_timeout)"


def test_a_runtime_call_that_hangs_is_stopped_within_the_round_and_the_rank_is_unknown_not_dead(tmp_path):
    """A hung docker/podman daemon: inspect never answers. The wait round's call is stopped at its timeout, with
    the processes it started, and the container's state is unknown: the lane waits on, and at its deadline the
    verdict says the runtime did not answer - a slow daemon never makes a running rank dead."""
    hung = tmp_path / "docker"
    child = tmp_path / "child.pid"
    hung.write_text("#!/bin/sh\nsleep 30 &\necho $! > %s\nwait\n" % child)
    hung.chmod(0o755)

    class Finder(object):
        def get_bin_path(self, name):
            return str(hung)

    started = time.monotonic()
    facts = dgx_runtime.container_state(dgx_runtime.RuntimeCli(Finder(), 0.5), "docker", "dgx-stage-engine")
    assert time.monotonic() - started < 5
    assert facts["running"] is None and facts["status"] == "unknown" and facts["exists"] is None
    assert "docker inspect --type did not answer within 0.5 s" in facts["error"]
    with pytest.raises(OSError):               # the runtime's own children are gone too
        for _ in range(50):
            os.kill(int(child.read_text()), 0)
            time.sleep(0.05)
    assert dgx_runtime.runtime_call_timeout(10) == 5.0 and dgx_runtime.runtime_call_timeout(600) == 10.0

    rows = {"dgx1": dict(row(True), container=dict(facts, name="e")), "dgx2": row(False)}
    pending = dgx_lane_wait.lane_verdict(["dgx1", "dgx2"], rows, "http://dgx1:8000")
    assert pending["state"] == "pending" and "the runtime did not answer for rank 0 (host dgx1)" in pending["msg"]
    timeout = dgx_lane_wait.lane_verdict(["dgx1", "dgx2"], rows, "http://dgx1:8000", give_up=True)
    assert timeout["state"] == "timeout" and "did not answer within 0.5 s" in timeout["msg"], timeout


def test_the_first_rank_to_go_down_is_told_by_time_across_time_zones():
    """Rank 1 (podman, +01:00) ended at 08:00:05 UTC, rank 0 (docker, Z) at 08:00:09 UTC: as strings rank 1's
    "09:00:05+01:00" sorts after rank 0's "08:00:09Z"; as times it is first. A paused rank never ended."""
    def down(finished, status="exited"):
        return dict(row(False), container={"name": "e", "exists": True, "running": False, "status": status,
                                           "exit_code": 1, "finished_at": finished, "logs": "boom"})

    lane_hosts = ["dgx1", "dgx2", "dgx3"]
    rows = {"dgx1": down("2026-12-03T08:00:09.5Z"), "dgx2": down("2026-12-03T09:00:05.1+01:00"),
            "dgx3": down(None, status="paused")}
    verdict = dgx_lane_wait.lane_verdict(lane_hosts, rows, "http://dgx1:8000")
    assert verdict["msg"].startswith("Rank 1 of the lane is down"), verdict["msg"]
    assert dgx_lane_wait._epoch("2026-12-03 09:00:05.1 +0100 UTC") == dgx_lane_wait._epoch("2026-12-03T08:00:05.1Z")
    assert dgx_lane_wait._epoch("2026-12-03T09:00:05.1+01") == dgx_lane_wait._epoch("2026-12-03T08:00:05.1Z")


# --- a request's whole time, headers included; a port that does not speak HTTP -------------------

def serve_once(reply):
    """A listening socket on 127.0.0.1 whose first connection gets reply(conn); returns (url, thread)."""
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def run():
        conn, _ = listener.accept()
        try:
            conn.recv(65536)
            reply(conn)
        except OSError:
            pass
        finally:
            conn.close()
            listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return "http://127.0.0.1:%d" % listener.getsockname()[1], thread


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_server_that_trickles_its_headers_is_cut_at_the_whole_requests_deadline(monkeypatch, scheme):
    """One header byte every 0.3 s never trips a 1 s socket timeout; the request's 1.5 s deadline cuts it. Over
    https too: its connection is watched as well (here its TLS is left out, the exchange after it is the same)."""
    def trickle(conn):
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
            conn.sendall(bytes([byte]))
            time.sleep(0.3)

    def connect_without_tls(self):
        self.sock = socket.create_connection((self.host, self.port), self.timeout)

    monkeypatch.setattr(http.client.HTTPSConnection, "connect", connect_without_tls)
    url, thread = serve_once(trickle)
    url = url.replace("http:", scheme + ":")
    started = time.monotonic()
    with pytest.raises(dgx_errors.StageError, match="took longer than 1.5 s"):
        dgx_openai.http_json(url + "/v1/models", timeout=1.5)
    assert time.monotonic() - started < 4
    thread.join(10)


def test_a_program_on_the_port_that_does_not_speak_http_is_a_failed_poll_not_a_crash():
    url, thread = serve_once(lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n"))
    with pytest.raises(dgx_errors.StageError, match="GET %s/v1/models failed: BadStatusLine" % url):
        dgx_openai.http_json(url + "/v1/models", timeout=5)
    thread.join(10)
    url, thread = serve_once(lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n"))
    polled = dgx_lane_wait.poll_round(url, 0.5)
    assert polled["api"] is False and "BadStatusLine" in polled["status"]
    thread.join(10)
