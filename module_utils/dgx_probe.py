"""Probes of the engine's OpenAI-style API: readiness, the smoke test, the decode probe, the bench.

Stdlib only (modules run on the nodes' system Python). The parsing and arithmetic are pure functions
(unit-tested); the HTTP helpers take the opener and the clock as arguments so tests can drive them.
run_probe() is the whole of library/engine_probe.py's work: the module only parses its options.
"""
from __future__ import absolute_import, division, print_function

import calendar
import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

from http import client as http_client

from urllib.error import HTTPError, URLError
from urllib.request import HTTPHandler, Request, build_opener, urlopen

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_nodestate import listening_inodes, port_holders

MODES = ("wait", "smoke", "decode", "bench")
SMOKE_QUESTION = "What is 127*89? Reply with the number only."
SMOKE_EXPECTED = "11303"
DEFAULT_MAX_TOKENS = {"smoke": 256, "decode": 400, "bench": 512}
# The host report's rows (one per mode), shaped by probe_report().
SMOKE_REPORT_KEYS = ("model", "question", "expected", "answer", "passed", "duration_s")
DECODE_REPORT_KEYS = ("model", "tokens", "token_source", "prompt_tokens", "ttft_s", "decode_s", "decode_tok_s",
                      "e2e_tok_s", "duration_s", "finish_reason", "max_tokens", "complete", "problems")

# The decode probe's fixed prompt: ~487 tokens with the Llama/DeepSeek BPE tokenizers (about 2,050
# characters of English prose). Fixed, so tok/s figures of different runs and lanes compare.
DECODE_PROMPT = (
    "You are helping an operations team write the handbook for a small inference cluster. "
    "The cluster has two nodes, each with eight accelerators, a local NVMe array of several "
    "terabytes, and a shared network file server that holds the model checkpoints. For months the "
    "engine read its weights straight from the network file server on every forward pass, and "
    "decode speed stayed at about thirteen tokens per second. After the team copied the weights to "
    "each node's local disk and bound them into the engine container read-only, the same model "
    "decoded at thirty-five tokens per second. Copying three hundred gigabytes to every node was not "
    "simple: the cache stores files under content hashes, snapshot entries are relative links into "
    "a blob store, some blobs are themselves links into a second store shared by every repository, "
    "and one optional pack of files lives as ordinary files inside the snapshot directory. A copy "
    "script that followed only the first link left fifty-one weight shards on the network; a script "
    "that trusted file sizes linked four shards to the wrong content, and the engine refused to load "
    "with a duplicate checkpoint key. The engine also writes receipts for every run into fixed "
    "directories and refuses to start when a directory from an earlier run is still there, and those "
    "directories belonged to another user. Finally the optional pack had to stay visible to the "
    "loader, so it is bound from the network file server, read-only, while everything else comes "
    "from local disk.\n\n"
    "Write the chapter of the handbook that explains this history to a new operator. Start with a "
    "short overview of how the cache is laid out on disk, then describe each of the failures in the "
    "order they happened, what the symptom looked like, why it happened, and the check that now "
    "prevents it. Then explain how to restart the engine safely after a change of weights: which "
    "directories must be cleared, which mounts must exist, what the smoke test asks, and how the "
    "decode speed is measured and compared with the reference figure. Use plain language, full "
    "sentences and concrete numbers, and do not use lists or tables. Keep writing until the "
    "chapter is complete."
)


# ------------------------------------------------------------------------------------------------
# pure functions
# ------------------------------------------------------------------------------------------------

def api_url(base, path):
    """Join the API base (http://host:port, with or without a trailing / or /v1) and a /v1 path."""
    base = (base or "").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise StageError("engine API url %r must start with http:// or https://" % (base,))
    if base.endswith("/v1") and path.startswith("/v1/"):
        base = base[:-3]
    return base + path


def chat_payload(model, prompt, max_tokens, stream=False):
    """A temperature-0 chat completion request body. The streamed (decode) request asks for usage and
    for ignore_eos (SGLang and vLLM take it): a model that ends its answer early would otherwise make a
    healthy engine fail the max_tokens check."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": int(max_tokens), "temperature": 0, "stream": bool(stream)}
    if stream:
        body.update(stream_options={"include_usage": True}, ignore_eos=True)
    return body


def first_model_id(models_body):
    """The first model id served, from a /v1/models response body."""
    data = (models_body or {}).get("data") or []
    if not data or not isinstance(data[0], dict) or not data[0].get("id"):
        raise StageError("/v1/models lists no model (%s); set engine_served_model"
                         % json.dumps(models_body)[:200])
    return data[0]["id"]


def completion_text(body):
    """The assistant text of a non-stream completion: content plus any reasoning_content."""
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise StageError("chat completion without choices[0].message: %s" % json.dumps(body)[:300])
    parts = [message.get("reasoning_content"), message.get("content")]
    return "".join(p for p in parts if isinstance(p, str))


def contains_expected(text, expected):
    """The bench and smoke pass rule: the answer contains the expected string."""
    return str(expected) in (text or "")


def _first_choice(event, data):
    """The event's choice of index 0 ([] when it has none): the probe asks for one answer, and a server that
    streams more choices must not count them as that answer's tokens."""
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
        raise StageError("stream event has choices that are not a list of objects: %r" % data[:200])
    return [choice for choice in choices if choice.get("index", 0) == 0][:1]


def _delta_text(choice, data):
    delta = choice.get("delta") or {}
    parts = [delta.get(key) or "" for key in ("reasoning_content", "content")] if isinstance(delta, dict) else [0]
    if not all(isinstance(part, str) for part in parts):
        raise StageError("stream event has a delta whose content is not text: %r" % data[:200])
    return "".join(parts)


def parse_sse(timed_lines):
    """Digest a streamed completion: timed_lines yields (arrival time, raw line bytes/str).

    Returns {"chunks": token-bearing chunks, "t_first", "t_last": their arrival times,
    "usage": the usage object if the server sent one, "text", "finish_reason", "done"}.
    A chunk bears tokens when the delta of choice 0 has non-empty content or reasoning_content before that
    choice's finish reason. An event that is not a JSON object, or whose choices or delta are malformed,
    raises StageError quoting it.
    """
    out = {"chunks": 0, "t_first": None, "t_last": None, "usage": None, "text": "",
           "finish_reason": None, "done": False}
    pieces = []
    for when, raw in timed_lines:
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line = line.strip()
        if not line.startswith("data:"):
            continue  # blank separators, ": keep-alive" comments, "event:" lines
        data = line[5:].strip()
        if data == "[DONE]":
            out["done"] = True
            break
        try:
            event = json.loads(data)
        except ValueError:
            raise StageError("stream event is not JSON: %r" % data[:200])
        if not isinstance(event, dict):
            raise StageError("stream event is not a JSON object: %r" % data[:200])
        if event.get("error"):
            raise StageError("the engine reported an error mid-stream: %s" % json.dumps(event["error"])[:300])
        if isinstance(event.get("usage"), dict) and event["usage"]:
            out["usage"] = event["usage"]
        for choice in _first_choice(event, data):
            text = _delta_text(choice, data)
            # The answer ends at its finish reason: text after it is not the answer's.
            if text and out["finish_reason"] is None:
                out["chunks"] += 1
                if out["t_first"] is None:
                    out["t_first"] = when
                out["t_last"] = when
                pieces.append(text)
            if choice.get("finish_reason") and out["finish_reason"] is None:
                out["finish_reason"] = choice["finish_reason"]
    out["text"] = "".join(pieces)
    return out


def decode_rate(tokens, t_first, t_last):
    """Decode tok/s from first to last token: (tokens - 1) / (t_last - t_first)."""
    if tokens is None or tokens < 2 or t_first is None or t_last is None or t_last <= t_first:
        raise StageError("cannot measure decode speed: %s token(s) streamed between t=%s and t=%s; "
                         "the engine must stream at least 2 tokens" % (tokens, t_first, t_last))
    return (tokens - 1) / float(t_last - t_first)


def e2e_rate(tokens, t_sent, t_last):
    """End-to-end tok/s: tokens / (t_last - t_sent), prefill and every stall included; None when no
    token came."""
    if not tokens or t_last is None or t_last <= t_sent:
        return None
    return tokens / float(t_last - t_sent)


def _rounded(value, digits):
    return None if value is None else round(value, digits)


def stream_tokens(stream):
    """(tokens, token_source) of a parse_sse() stream: the server's usage count when it sends one (with
    speculative decoding a chunk may carry several tokens), else the token-bearing chunks that arrived,
    a count that can only be low (never max_tokens on the engine's word: finish_reason length after a
    short answer proves nothing)."""
    completion_tokens = (stream.get("usage") or {}).get("completion_tokens")
    if completion_tokens:
        return int(completion_tokens), "usage"
    return stream["chunks"], "chunks"


def decode_result(stream, t_sent, t_end):
    """The decode probe's numbers from parse_sse() output and the request's send/end times.

    decode_tok_s (first to last token) is None when fewer than 2 tokens came; e2e_tok_s (request sent to
    last token) is None when none came. The rates are not rounded: the verdicts compare them with the
    floor as measured (30.7751 does not reach 30.78); the report rounds them for display. Never raises:
    decode_verdict() judges what is missing.
    """
    usage = stream.get("usage") or {}
    tokens, token_source = stream_tokens(stream)
    t_first, t_last = stream["t_first"], stream["t_last"]
    try:
        rate = decode_rate(tokens, t_first, t_last)
    except StageError:
        rate = None
    return {
        "tokens": tokens,
        "token_source": token_source,
        "chunks": stream["chunks"],
        "prompt_tokens": usage.get("prompt_tokens"),
        "ttft_s": None if t_first is None else round(t_first - t_sent, 4),
        "decode_s": None if t_first is None else round(t_last - t_first, 4),
        "decode_tok_s": rate,
        "e2e_tok_s": e2e_rate(tokens, t_sent, t_last),
        "duration_s": round(t_end - t_sent, 4),
        "finish_reason": stream["finish_reason"],
        "done": bool(stream.get("done")),
        "cut": stream.get("cut"),
    }


def _num(value):
    """30.78 -> '30.78', 100000.0 -> '100000' (floors and rates as an operator wrote them)."""
    return ("%.2f" % float(value)).rstrip("0").rstrip(".")


def _below(rate, floor):
    """A rate under the floor as text: two decimals, or four when two would read as the floor itself."""
    text = _num(rate)
    return ("%.4f" % float(rate)).rstrip("0").rstrip(".") if text == _num(floor) else text


# finish_reason values of a stream that ran to its end (OpenAI, vLLM, SGLang); abort, content_filter,
# error or anything else means the engine gave up on the answer.
FINISHED = ("length", "stop")
# Tokens one chunk may carry: generous for speculative decoding (a few drafted tokens per step).
MAX_TOKENS_PER_CHUNK = 16


def stream_problems(result, max_tokens):
    """Why a decode_result() does not prove max_tokens tokens were streamed: [] when it does."""
    tokens, reason = result["tokens"], result["finish_reason"]
    count = "%d of %d tokens" % (tokens, max_tokens)
    if reason is None:
        how = "the connection broke (%s)" % result["cut"] if result.get("cut") else (
            "[DONE] came" if result.get("done") else "the stream ended")
        return ["the stream stopped after %s without a finish reason: %s" % (count, how)]
    problems = []
    if reason not in FINISHED:
        problems.append("the engine ended the answer with finish_reason %s after %s: only length or stop mean "
                        "the answer ran to its end" % (reason, count))
    elif tokens < max_tokens and reason == "length" and result.get("token_source") == "chunks":
        problems.append("the engine ended with finish_reason length after %d content chunk(s) for max_tokens=%d "
                        "and sent no usage count (asked for with stream_options.include_usage): %d chunks prove "
                        "only %d tokens, too few to measure decode speed" % (tokens, max_tokens, tokens, tokens))
    elif tokens < max_tokens and reason == "length":
        problems.append("the engine ended with finish_reason length but %s counts only %s: it hit another "
                        "length limit (the context window?) or miscounts" % (result.get("token_source"), count))
    elif tokens < max_tokens:
        problems.append("the engine ended the answer after %s (finish_reason %s): too short to measure decode "
                        "speed" % (count, reason))
    if tokens > max_tokens:
        problems.append("the engine streamed %d tokens for max_tokens=%d: it ignored max_tokens"
                        % (tokens, max_tokens))
    chunks = result.get("chunks")
    if result.get("token_source") == "usage" and chunks is not None and tokens > chunks * MAX_TOKENS_PER_CHUNK:
        problems.append("usage claims %d tokens but only %d chunk(s) carried content (at most %d tokens a chunk "
                        "even with speculative decoding): the count cannot be trusted"
                        % (tokens, chunks, MAX_TOKENS_PER_CHUNK))
    return problems


def decode_verdict(result, max_tokens, floor=None):
    """(complete, problems) of a decode_result() plus its max_tokens: the problems an operator must
    read, [] when the probe proves the speed.

    A stream proves nothing unless it ends with finish_reason length or stop after max_tokens tokens, no
    more, counted believably (stream_problems()): a cut stream, a short or abandoned answer and an
    inflated usage count must not pass, nor a stall followed by a burst (a huge first-to-last rate, a tiny
    end-to-end one). With floor, both rates must reach it.
    """
    tokens, max_tokens = result["tokens"], int(max_tokens)
    problems = stream_problems(result, max_tokens)
    complete = not problems
    if result["decode_tok_s"] is None:
        problems.append("decode speed cannot be measured from %d token(s)" % tokens)
    if floor is not None:
        floor_text = _num(floor)
        decode, e2e = result["decode_tok_s"], result["e2e_tok_s"]
        if decode is not None and decode < float(floor):
            problems.append("%s tok/s decode is below engine_decode_floor=%s (%d tokens in %s s from the first "
                            "token)" % (_below(decode, floor), floor_text, tokens, _num(result["decode_s"])))
        if e2e is None or e2e < float(floor):
            stall = ""
            if decode is not None and decode >= float(floor):
                stall = " (%s tok/s decode, but the first token came only after %s s)" % (
                    _num(decode), _num(result["ttft_s"]))
            shown = "no" if e2e is None else _below(e2e, floor)
            problems.append("%s tok/s end to end (%d tokens / (last token - request sent)) is below "
                            "engine_decode_floor=%s%s" % (shown, tokens, floor_text, stall))
    return complete, problems


def decode_message(result, complete, problems):
    """One line: the problems, or the figures that passed."""
    if problems:
        return "; ".join(problems)
    return "%d tokens, %s tok/s decode, %s tok/s end to end, first token after %s s (finish_reason %s)" % (
        result["tokens"], _num(result["decode_tok_s"]), _num(result["e2e_tok_s"]), _num(result["ttft_s"]),
        result["finish_reason"])


def parse_bench_jsonl(text, source="bench file"):
    """[{"prompt", "expected"}] from JSONL text; blank lines and # comments are skipped."""
    items = []
    for number, line in enumerate((text or "").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise StageError("%s line %d is not JSON (%s): %r" % (source, number, exc, line[:120]))
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) \
                or not isinstance(item.get("expected"), (str, int, float)) or item.get("expected") == "":
            raise StageError('%s line %d needs {"prompt": str, "expected": non-empty str}: %r'
                             % (source, number, line[:120]))
        items.append({"prompt": item["prompt"], "expected": str(item["expected"]), "line": number})
    if not items:
        raise StageError("%s holds no items; point engine_bench_file at a JSONL of "
                         '{"prompt", "expected"} lines' % source)
    return items


def bench_summary(outcomes):
    """outcomes: [{"line", "expected", "answer", "passed"}] -> item counts and the failed items.

    (Not `passed`/`failed`: `passed` is the smoke test's bool, and a module result's `failed` key is
    Ansible's task status, so a non-empty list there would fail the task.)
    """
    failed = [{"line": o["line"], "expected": o["expected"], "answer": (o["answer"] or "")[:300]}
              for o in outcomes if not o["passed"]]
    return {"total_items": len(outcomes), "passed_items": len(outcomes) - len(failed), "failed_items": failed}


def floor_verdict(mode, result, floor):
    """Whether a decode (tok/s) or bench (items passed) result reaches floor; None without a floor or
    in the modes that have none."""
    if floor is None or mode not in ("decode", "bench"):
        return None
    if mode == "bench":
        return float(result["passed_items"]) >= float(floor)
    # Both rates: a stall then a burst has a huge first-to-last rate and a tiny end-to-end one.
    rates = (result["decode_tok_s"], result["e2e_tok_s"])
    return all(rate is not None and float(rate) >= float(floor) for rate in rates)


def _floor_value(mode, floor):
    """The floor as the report shows it: tok/s as a float, an item count as an int when whole."""
    floor = float(floor)
    return int(floor) if mode == "bench" and floor.is_integer() else floor


def probe_report(mode, result, floor=None):
    """This probe's row of the host report (the engine role passes it on unchanged).

    wait: {models}, plus the lane's verdict when one was made (wait_report()); smoke: the answer and its
    verdict; decode: the speed figures, whether the stream was complete and its problems, plus floor and
    passed (complete, both rates >= floor) when a floor is given; bench: {model, total_items,
    passed_items, failed_items, duration_s}, plus floor and passed (passed_items >= floor) when a floor is
    given. `passed` is a verdict (a bool) in every row.
    """
    if mode == "wait":
        return wait_report(result)
    if mode == "smoke":
        return dict((key, result[key]) for key in SMOKE_REPORT_KEYS)
    if mode == "decode":
        row = dict((key, result[key]) for key in DECODE_REPORT_KEYS)
        row.update((key, _rounded(row[key], 2)) for key in ("decode_tok_s", "e2e_tok_s"))
        if floor is not None:
            row.update(floor=_floor_value(mode, floor),
                       passed=bool(result["complete"] and floor_verdict(mode, result, floor)))
        return row
    row = dict((key, result[key]) for key in ("model", "total_items", "passed_items", "failed_items", "duration_s"))
    if floor is not None:
        row.update(floor=_floor_value(mode, floor), passed=floor_verdict(mode, result, floor))
    return row


# ------------------------------------------------------------------------------------------------
# readiness of a lane: each rank's container, who serves the API port, the lane's verdict (pure)
# ------------------------------------------------------------------------------------------------

LOG_LINES = 30           # log lines kept of a container that is not running
MESSAGE_LOG_LINES = 15   # of which a failure message quotes the last ones
WAIT_STATES = ("pending", "ready", "dead", "missing", "stranger", "unproven", "timeout")
# Container statuses (docker: created running paused restarting removing exited dead; podman adds
# configured initialized stopping stopped) of a container that is not running and has not exited
# either: its ExitCode is a stale or zero placeholder, not an exit.
NOT_EXITED = ("paused", "created", "configured", "initialized", "stopping")
# How describe_down() words them; exited, stopped, dead, restarting (and anything unknown) show the exit.
_NOT_EXITED_TEXT = {"paused": "is paused (not running)", "stopping": "is stopping (not running)",
                    "created": "was created but never started", "configured": "was created but never started",
                    "initialized": "was created but never started"}
_EXITED_TEXT = {"restarting": "is restarting after an exit (not running), last exit code %s",
                "dead": "is dead (the runtime failed to stop or remove it), exit code %s"}


def missing_container(name, why):
    """A container's facts when the runtime does not know it (or is not there)."""
    return {"name": name, "exists": False, "id": None, "running": False, "status": "missing", "exit_code": None,
            "started_at": None, "finished_at": None, "error": why, "oom_killed": False, "logs": ""}


def unknown_container(name, why):
    """A container's facts when the runtime did not answer in time: running is None - neither up nor down, so
    the lane waits on (and at its deadline names why) instead of judging a slow daemon's rank dead."""
    facts = missing_container(name, why)
    facts.update(exists=None, running=None, status="unknown")
    return facts


def container_facts(inspect_text, name):
    """A container's state from `docker|podman inspect --type container NAME` output (a JSON list).

    running: running and neither paused nor restarting. finished_at: None until it has stopped once.
    """
    try:
        info = json.loads(inspect_text)[0]
        state = info.get("State") or {}
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return missing_container(name, "inspect printed no container: %r" % (inspect_text or "")[:200])
    running = bool(state.get("Running")) and not state.get("Paused") and not state.get("Restarting")
    finished = state.get("FinishedAt") or None
    if finished and finished.startswith("0001-"):  # Go's zero time: never stopped
        finished = None
    status = state.get("Status") or ("running" if running else "stopped")
    if state.get("Paused"):
        status = "paused"
    elif status == "stopped" and not running:
        # Podman's word for a container whose process ended and whose clean-up has not run yet: it exited.
        status = "exited"
    exit_code = None if status in NOT_EXITED else state.get("ExitCode")
    return {"name": name, "exists": True, "id": info.get("Id"), "running": running, "status": status,
            "exit_code": exit_code, "started_at": state.get("StartedAt"), "finished_at": finished,
            "error": state.get("Error") or "", "oom_killed": bool(state.get("OOMKilled")), "logs": ""}


_TIMESTAMP = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(\.\d+)?\s*(Z|[+-]\d\d(?::?\d\d)?)?")


def _epoch(text):
    """Seconds since the epoch of a runtime's timestamp (docker: ...Z, podman: ...+01:00 or ... +0000 UTC),
    so ranks on hosts in other time zones compare as times; infinity when there is none (never stopped)."""
    match = _TIMESTAMP.match(text or "")
    if not match:
        return float("inf")
    year, month, day, hour, minute, second = (int(part) for part in match.group(1, 2, 3, 4, 5, 6))
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) + float(match.group(7) or 0)
    zone = match.group(8) or "Z"
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:] or 0) * 60)
    return seconds


def owner_facts(port, listening, holders, container_id):
    """Who serves the API port. ours: every holder runs in container_id (True), one does not (False),
    or nobody could be seen (None: nothing listens, or the holders' /proc is not readable)."""
    ours = None
    if holders:
        ours = bool(container_id) and all(h.get("container_id") == container_id for h in holders)
    return {"port": int(port), "listening": bool(listening), "holders": list(holders), "ours": ours}


def describe_holder(holder):
    """'pid 4242 (python3 -m http.server 8000) in container 1a2b3c4d5e6f (old-engine)'; this run's own engine
    is named by its container alone."""
    text = "pid %s" % holder.get("pid")
    if holder.get("cmdline"):
        text += " (%s)" % holder["cmdline"]
    if holder.get("container_id"):
        text += " in container %s" % holder["container_id"][:12]
        if holder.get("container_name"):
            text += " (%s)" % holder["container_name"]
    else:
        text += ", not in a container"
    return text


def _log_tail(text, lines=MESSAGE_LOG_LINES):
    tail = [line for line in (text or "").rstrip().splitlines()][-lines:]
    return "\n".join(tail) if tail else "(empty)"


def _down_state(container):
    """What a container that is not running is doing, in words: paused, never started... or its exit."""
    status = container.get("status")
    if status in _NOT_EXITED_TEXT:
        return _NOT_EXITED_TEXT[status]
    if status in _EXITED_TEXT:
        return _EXITED_TEXT[status] % container.get("exit_code")
    return "is not running (%s), exit code %s" % (status, container.get("exit_code"))


def describe_down(rank, host, container):
    """One rank that is not up: its host, container, what state it is in and, when it exited, the exit code
    and when it ended."""
    if not container.get("exists"):
        return "rank %d (host %s): no container %s - %s" % (rank, host, container.get("name"), container.get("error"))
    text = "rank %d (host %s): container %s %s" % (rank, host, container.get("name"), _down_state(container))
    if container.get("oom_killed"):
        text += ", killed out of memory"
    if container.get("error"):
        text += ", error: %s" % container["error"]
    if container.get("finished_at") and container.get("status") not in NOT_EXITED:
        text += ", ended %s" % container["finished_at"]
    return text


def _port_note(host, owner):
    holders = [h for h in owner.get("holders") or []]
    return "port %s on %s is held by %s" % (owner.get("port"), host, "; ".join(describe_holder(h) for h in holders))


def _verdict(state, msg, host=None, rank=None, exit_code=None):
    return {"state": state, "decided": state != "pending", "msg": msg, "host": host, "rank": rank,
            "exit_code": exit_code}


def fresh_rows(rows, wait_id, round_no):
    """The rows of rows (host -> row) made in round round_no - 1 of wait wait_id; a host's row from an
    earlier round or wait (it left the play since: it failed, or became unreachable) is not its report."""
    if wait_id is None:
        return dict((host, row) for host, row in (rows or {}).items() if row)
    return dict((host, row) for host, row in (rows or {}).items()
                if row and row.get("wait_id") == wait_id and row.get("round") == round_no - 1)


def lane_verdict(lane_hosts, rows, url, give_up=False):
    """The lane's state from every rank's last round (rows: host -> the row a wait call returned, fresh_rows()).

    Decided, in this order: a rank that did not report (missing); a rank whose container is not running
    (dead - the first to end, its exit code and log, and who holds the master's port when someone
    else does); the API port on the master held by a process outside this run's container (stranger);
    the API answered but nobody could be seen on the port (unproven); the API answered from the
    master's container with every rank running (ready); give_up (timeout). Else pending.
    """
    master = lane_hosts[0]
    ranked = [(rank, host, rows.get(host)) for rank, host in enumerate(lane_hosts)]
    missing = [(rank, host) for rank, host, row in ranked if not row]
    if missing:
        rank, host = missing[0]
        return _verdict("missing", "Rank %d (host %s) did not report its engine container in the last round (it "
                                   "failed or became unreachable); a lane needs every rank. Missing: %s."
                        % (rank, host, ", ".join("rank %d (%s)" % m for m in missing)), host, rank)
    master_row = rows[master]
    owner = master_row.get("owner")
    stranger = owner is not None and owner.get("ours") is False
    down = [(rank, host, row["container"]) for rank, host, row in ranked
            if row.get("container") and row["container"].get("running") is False]
    if down:
        # The first to end is the cause; the others often die of it (a lost peer, a closed store).
        rank, host, container = min(down, key=lambda d: (_epoch(d[2].get("finished_at")), d[0]))
        msg = "Rank %d of the lane is down - %s. Its log ends:\n%s" % (
            rank, describe_down(rank, host, container), _log_tail(container.get("logs")))
        others = [describe_down(*d) for d in down if d[0] != rank]
        if others:
            msg += "\nAlso down: %s." % "; ".join(others)
        if stranger:
            msg += "\nThe API at %s is answered by someone else: %s." % (url, _port_note(master, owner))
        return _verdict("dead", msg, host, rank, container.get("exit_code"))
    if stranger:
        mine = (master_row.get("container") or {}).get("name")
        return _verdict("stranger", "The API at %s is not served by this run's engine: %s, not by container %s "
                                    "(rank 0). Stop the old engine (engine_stop_strays) or free the port."
                        % (url, _port_note(master, owner), mine), master, 0)
    if master_row.get("api") and owner is not None and owner.get("ours") is None:
        why = ("but nothing on %s listens on port %s (engine_port)" % (master, owner.get("port"))
               if not owner.get("listening") else
               "but the process listening on port %s on %s could not be seen (run with become)"
               % (owner.get("port"), master))
        return _verdict("unproven", "The API at %s answered, %s: cannot prove it is this run's engine."
                        % (url, why), master, 0)
    # A rank whose runtime did not answer in time is neither up nor down: the lane waits for it.
    unknown = ["rank %d (host %s): %s" % (rank, host, row["container"].get("error"))
               for rank, host, row in ranked if row.get("container") and row["container"].get("running") is None]
    if master_row.get("api") and not unknown:
        models = ", ".join(m for m in master_row.get("models") or [] if m)
        ranks = " - all %d ranks running" % len(lane_hosts) if len(lane_hosts) > 1 else ""
        return _verdict("ready", "API ready: %s%s" % (models, ranks))
    last = "API answered" if master_row.get("api") else "API not ready: %s" % master_row.get("status")
    if give_up:
        if unknown:
            return _verdict("timeout", "The lane's state is unknown at the deadline (%s); the container runtime "
                                       "did not answer for %s" % (last, "; ".join(unknown)), master, 0)
        return _verdict("timeout", "The API at %s did not answer in time (every rank's container is running); "
                                   "last poll from %s: %s" % (url, master, master_row.get("status")), master, 0)
    if unknown:
        return _verdict("pending", "%s; the runtime did not answer for %s" % (last, "; ".join(unknown)))
    return _verdict("pending", last)


def wait_report(result):
    """The ready row of the host report: the models served, and with a lane verdict its state, the round
    that decided it, every rank's container (host, rank, status, exit code, id) and who served the API port."""
    row = {"models": list(result.get("models") or [])}
    lane = result.get("lane_rows")
    if lane is None:
        return row
    row["state"] = result["verdict"]["state"]
    row["rounds"] = result["round"]
    row["ranks"] = []
    for rank, host in enumerate(result["lane_hosts"]):
        container = (lane.get(host) or {}).get("container") or {}
        row["ranks"].append({"host": host, "rank": rank, "status": container.get("status"),
                             "exit_code": container.get("exit_code"), "id": (container.get("id") or "")[:12]})
    owner = (lane.get(result["lane_hosts"][0]) or {}).get("owner")
    if owner and owner.get("holders"):
        row["api_served_by"] = "; ".join(describe_holder(h) for h in owner["holders"])
    return row


# ------------------------------------------------------------------------------------------------
# HTTP (stdlib urllib); opener and clock injectable
# ------------------------------------------------------------------------------------------------

def _request(url, payload=None):
    data = None
    headers = {"Accept": "application/json"}
    if payload is not None:
        data = json.dumps(payload).encode("utf-8")
        headers["Content-Type"] = "application/json"
    return Request(url, data=data, headers=headers, method="POST" if payload is not None else "GET")


def _describe(exc):
    if isinstance(exc, HTTPError):
        try:
            detail = exc.read()[:200].decode("utf-8", "replace")
        except Exception:  # pylint: disable=broad-except
            detail = ""
        return "HTTP %d %s" % (exc.code, detail)
    if isinstance(exc, URLError):
        return "unreachable (%s)" % (exc.reason,)
    return "%s: %s" % (type(exc).__name__, exc)


def _too_long(timeout):
    return "the whole request took longer than %s s (engine_request_timeout)" % _num(timeout)


class _Deadline(object):
    """A request's whole time, from connecting to the last byte: at its deadline the connection's socket is
    shut down, which ends a read blocked on a server that trickles a byte at a time - in the status line and
    headers as in the body (a socket timeout only bounds each read). Between reads the clock is looked at
    too (responses without a socket, in tests)."""

    def __init__(self, timeout, clock, started):
        self.timeout, self.clock, self.deadline = timeout, clock, started + timeout
        self.fired = False
        self._socks = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, self.deadline - clock()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock):
        """Shut sock down at the deadline (at once when it has passed)."""
        with self._lock:
            if sock is None or sock in self._socks:
                return
            self._socks.append(sock)
            fired = self.fired
        if fired:
            self._shut(sock)

    def watch_response(self, resp):
        self.watch(getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None))

    def _fire(self):
        with self._lock:
            self.fired = True
            socks = list(self._socks)
        for sock in socks:
            self._shut(sock)

    @staticmethod
    def _shut(sock):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def check(self):
        """socket.timeout once the deadline has passed."""
        if self.fired or self.clock() >= self.deadline:
            self.fired = True
            raise socket.timeout(_too_long(self.timeout))

    def cancel(self):
        self._timer.cancel()


class _WatchedConnection(http_client.HTTPConnection):
    """An HTTP connection whose socket a _Deadline watches from the moment it connects."""

    def __init__(self, *args, **kwargs):
        self._deadline = kwargs.pop("deadline")
        http_client.HTTPConnection.__init__(self, *args, **kwargs)

    def connect(self):
        http_client.HTTPConnection.connect(self)
        self._deadline.watch(self.sock)


class _WatchedHandler(HTTPHandler):
    def __init__(self, deadline):
        HTTPHandler.__init__(self)
        self._deadline = deadline

    def http_open(self, req):
        return self.do_open(functools.partial(_WatchedConnection, deadline=self._deadline), req)


@contextlib.contextmanager
def _open_within(opener, request, timeout, clock):
    """(response, its _Deadline) of request, the deadline counting from now. With urllib's own opener the
    connection is watched from its connect, so a server slow to send its headers is cut too; an opener of
    a test is watched from its response."""
    limit = _Deadline(timeout, clock, clock())
    try:
        try:
            if opener is urlopen:
                resp = build_opener(_WatchedHandler(limit)).open(request, timeout=timeout)
            else:
                resp = opener(request, timeout=timeout)
        except (http_client.HTTPException, OSError) as exc:
            if limit.fired and not isinstance(exc, HTTPError):
                raise socket.timeout(_too_long(timeout))
            raise
        with resp:
            limit.watch_response(resp)
            yield resp, limit
    finally:
        limit.cancel()


def _failed(method, url, exc):
    return StageError("%s %s failed: %s" % (method, url, _describe(exc)))


def http_json(url, payload=None, timeout=300.0, opener=urlopen, clock=time.monotonic):
    """GET (payload None) or POST JSON; return the decoded body or raise StageError. timeout is the whole
    request's, from connecting to the last byte of the answer."""
    method = "POST" if payload is not None else "GET"
    try:
        with _open_within(opener, _request(url, payload), timeout, clock) as (resp, limit):
            parts = []
            read = getattr(resp, "read1", resp.read)     # read1: at most one read of the socket per call
            while True:
                limit.check()
                try:
                    part = read(65536)
                except (http_client.HTTPException, OSError):
                    limit.check()
                    raise
                if not part:
                    limit.check()
                    break
                parts.append(part)
            raw = b"".join(parts)
    except (http_client.HTTPException, OSError) as exc:
        raise _failed(method, url, exc)
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        raise StageError("%s answered with non-JSON: %r" % (url, raw[:200]))


def resolve_model(base, model, timeout=30.0, opener=urlopen):
    """The model name to put in requests: the given one, else the first id of /v1/models."""
    if model:
        return model
    return first_model_id(http_json(api_url(base, "/v1/models"), timeout=timeout, opener=opener))


def poll_round(base, wait_for, container_check=None, owner_check=None, interval=1.0, opener=urlopen,
               clock=time.monotonic, sleep=time.sleep):
    """One host's share of a wait round: for up to wait_for seconds, every poll first looks at this host's
    container (container_check() -> container facts), then asks /v1/models. Stops when the container is
    not running or the API answers. Then owner_check(container facts) (the master only) says who holds
    the API port, when the API answered or the container is down (someone else may hold its port).

    Returns the round's row {"api", "models", "status", "polls", "elapsed_s", "container", "owner"}.
    """
    url = api_url(base, "/v1/models")
    start = clock()
    row = {"api": False, "models": [], "status": "not polled", "polls": 0, "container": None, "owner": None}
    while True:
        row["polls"] += 1
        if container_check is not None:
            row["container"] = container_check()
            if row["container"]["running"] is False:
                row["status"] = "container %s is %s" % (row["container"]["name"], row["container"]["status"])
                break
        try:
            body = http_json(url, timeout=max(1.0, min(5.0, wait_for)), opener=opener)
            row["models"] = [m.get("id") for m in body.get("data") or [] if isinstance(m, dict)]
            row["status"] = "ready"
            row["api"] = True
            break
        except StageError as exc:
            row["status"] = str(exc)
        if clock() - start + interval > wait_for:
            break
        sleep(interval)
    down = row["container"] is not None and row["container"]["running"] is False
    if owner_check is not None and (row["api"] or down):
        row["owner"] = owner_check(row["container"])
    row["elapsed_s"] = round(clock() - start, 3)
    return row


def smoke(base, model, question=SMOKE_QUESTION, expected=SMOKE_EXPECTED, max_tokens=256,
          timeout=300.0, opener=urlopen, clock=time.monotonic):
    """One chat completion; passed when the answer contains expected."""
    t0 = clock()
    body = http_json(api_url(base, "/v1/chat/completions"), chat_payload(model, question, max_tokens),
                     timeout=timeout, opener=opener, clock=clock)
    text = completion_text(body)
    return {"question": question, "expected": expected, "answer": text[:500],
            "passed": contains_expected(text, expected), "duration_s": round(clock() - t0, 4)}


def _timed_lines(resp, clock, cut, limit):
    """(arrival time, line) of a streamed response; a connection that breaks mid-stream (the engine
    died, a proxy cut it, the read timed out) or a stream still going at the request's deadline (limit,
    a _Deadline) ends the lines and is noted in cut["reason"]."""
    while True:
        try:
            limit.check()
            line = resp.readline()
            if limit.fired:
                limit.check()
        except (http_client.HTTPException, OSError) as exc:
            cut["reason"] = _too_long(limit.timeout) if limit.fired else _describe(exc)
            return
        if not line:
            # http.client swallows a chunked body that ends without its last chunk (peek() hides the
            # IncompleteRead); chunk_left is None only after the terminating chunk.
            if getattr(resp, "chunked", False) and getattr(resp, "chunk_left", None) is not None:
                cut["reason"] = "closed before the end of the chunked body"
            return
        yield clock(), line


def decode_probe(base, model, prompt=DECODE_PROMPT, max_tokens=400, timeout=300.0, opener=urlopen,
                 clock=time.monotonic):
    """Stream one temperature-0 completion and measure decode tok/s from first to last token and end to
    end tok/s from the request to the last token."""
    url = api_url(base, "/v1/chat/completions")
    cut = {"reason": None}
    t_sent = clock()
    try:
        with _open_within(opener, _request(url, chat_payload(model, prompt, max_tokens, stream=True)), timeout,
                          clock) as (resp, limit):
            stream = parse_sse(_timed_lines(resp, clock, cut, limit))
    except (http_client.HTTPException, OSError) as exc:
        raise _failed("POST", url + " (stream)", exc)
    stream["cut"] = cut["reason"]
    result = decode_result(stream, t_sent, clock())
    result.update({"max_tokens": int(max_tokens), "prompt_chars": len(prompt)})
    return result


def bench(base, model, items, max_tokens=512, timeout=300.0, opener=urlopen, clock=time.monotonic):
    """Run each item at temperature 0; an item passes when the answer contains its expected string."""
    t0 = clock()
    outcomes = []
    url = api_url(base, "/v1/chat/completions")
    for item in items:
        text = completion_text(http_json(url, chat_payload(model, item["prompt"], max_tokens),
                                         timeout=timeout, opener=opener, clock=clock))
        outcomes.append({"line": item["line"], "expected": item["expected"], "answer": text,
                         "passed": contains_expected(text, item["expected"])})
    summary = bench_summary(outcomes)
    summary["duration_s"] = round(clock() - t0, 3)
    return summary


# ------------------------------------------------------------------------------------------------
# the module's run: engine_probe's options in, its result out
# ------------------------------------------------------------------------------------------------

class RuntimeSlow(StageError):
    """A runtime call that did not end in time: the container's state is unknown, not gone."""


class RuntimeCli(object):
    """The container runtime's CLI as a wait round calls it (inspect, logs, the holder's name): each call
    ends within `timeout` seconds, killed otherwise, so a hung daemon cannot hold a round past its time.
    finder: anything with get_bin_path() (the AnsibleModule)."""

    def __init__(self, finder, timeout):
        self.finder, self.timeout = finder, float(timeout)

    def get_bin_path(self, name):
        return self.finder.get_bin_path(name)

    def run_command(self, argv):
        """(rc, stdout, stderr); RuntimeSlow when the call does not end in time (its process group is killed)."""
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            return 127, "", str(exc)
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.communicate()
            raise RuntimeSlow("%s did not answer within %s s (it was stopped)" % (
                " ".join(os.path.basename(part) if i == 0 else part for i, part in enumerate(argv[:3])),
                _num(self.timeout)))
        return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def runtime_call_timeout(wait_for):
    """Seconds one runtime call of a wait round may take: well inside the round (wait_for), 1 to 10 s."""
    return max(1.0, min(10.0, float(wait_for) / 2.0))


def container_state(runner, runtime, name):
    """This host's engine container (container_facts()), with the tail of its log when it is not running.

    runner: the AnsibleModule (anything with get_bin_path() and run_command()).
    """
    binary = runner.get_bin_path(runtime)
    if not binary:
        return missing_container(name, "%s not found on this host" % runtime)
    try:
        rc, out, err = runner.run_command([binary, "inspect", "--type", "container", name])
    except RuntimeSlow as exc:
        return unknown_container(name, str(exc))
    if rc != 0:
        return missing_container(name, "%s inspect: %s" % (runtime, (err or out).strip()[:300]))
    facts = container_facts(out, name)
    if facts["exists"] and not facts["running"]:
        try:
            rc, out, err = runner.run_command([binary, "logs", "--tail", str(LOG_LINES), name])
            facts["logs"] = (out + err)[-4000:]
        except RuntimeSlow as exc:
            facts["logs"] = "(no log: %s)" % exc
    return facts


def _cmdline(pid, proc="/proc"):
    """A process's command line (first 200 characters), or "" when it is gone or not readable."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            return handle.read().decode("utf-8", "replace").replace("\0", " ").strip()[:200]
    except (IOError, OSError):
        return ""


def container_name(runner, runtime, container_id):
    """The name of a container by id, asking runtime and then the other runtime; None when unknown."""
    for cli in (runtime, "podman" if runtime == "docker" else "docker"):
        binary = runner.get_bin_path(cli)
        if not binary:
            continue
        try:
            rc, out, _err = runner.run_command([binary, "inspect", "--type", "container", "--format", "{{.Name}}",
                                                container_id])
        except RuntimeSlow:
            continue
        if rc == 0 and out.strip():
            return out.strip().lstrip("/")
    return None


def api_owner(runner, runtime, port, container, proc="/proc"):
    """owner_facts() of the API port for this host's container facts: the processes holding a socket
    listening on it (dgx_nodestate reads /proc/net/tcp{,6}, the fds and the cgroups), each with its command
    line - except this run's engine, whose command line holds its secrets (--api-key) and says nothing the
    container's name does not; a holder in another container is named by the runtime."""
    mine = (container or {}).get("id")
    listening = bool(listening_inodes(int(port), proc))
    holders = []
    for found in port_holders(int(port), proc) if listening else []:
        own = bool(mine) and found["container_id"] == mine
        holder = {"pid": found["pid"], "cmdline": None if own else (_cmdline(found["pid"], proc) or found["command"]),
                  "container_id": found["container_id"] or None, "container_name": None}
        if holder["container_id"] and holder["container_id"] != mine and runner is not None:
            holder["container_name"] = container_name(runner, runtime, holder["container_id"])
        holders.append(holder)
    return owner_facts(port, listening, holders, mine)


def wait_probe(base, wait_for, container_check=None, owner_check=None, lane_hosts=None, lane=None, give_up=False,
               wait_id=None, round_no=1, opener=urlopen, clock=time.monotonic, sleep=time.sleep):
    """One call of a wait.

    Alone (no lane_hosts): poll_round(), then judge this host's row as a one-rank lane.
    In a lane's rounds (lane_hosts, the lane in rank order): first judge lane, every rank's row of the
    previous round (none in the first round); when that decides (a rank down or missing, a stranger on
    the port, ready, or give_up) return at once, else poll_round() and return this host's row for the
    next round. Rows carry wait_id and round_no: only the previous round's rows of this wait count.
    """
    verdict = None
    if lane_hosts and lane is not None:
        lane = fresh_rows(lane, wait_id, round_no)
        verdict = lane_verdict(lane_hosts, lane, base, give_up)
    row = None
    if verdict is None or not verdict["decided"]:
        row = poll_round(base, wait_for, container_check, owner_check, opener=opener, clock=clock, sleep=sleep)
        row.update(wait_id=wait_id, round=round_no)
    if not lane_hosts:
        verdict = lane_verdict(["this host"], {"this host": row}, base, give_up=True)
    elif verdict is None:
        verdict = _verdict("pending", "first round: %s" % row["status"])
    result = {"ready": verdict["state"] == "ready", "decided": verdict["decided"], "verdict": verdict,
              "msg": verdict["msg"]}
    if lane_hosts:
        master_row = (lane or {}).get(lane_hosts[0]) or {}
        result["models"] = list(master_row.get("models") or (row or {}).get("models") or [])
        result["lane_hosts"], result["lane_rows"], result["round"] = list(lane_hosts), lane, round_no
    else:
        result["models"] = list(row["models"])
    if row is not None:
        container = row["container"] or {}
        result.update(row=row, status=row["status"], polls=row["polls"], elapsed_s=row["elapsed_s"],
                      running=container.get("running", True) if row["container"] else True,
                      logs=container.get("logs") or "")
    return result


def redacted(value, secrets):
    """value (dicts, lists, strings) with every one of secrets (longest first) in its strings replaced by
    <hidden>."""
    if isinstance(value, dict):
        return dict((key, redacted(item, secrets)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [redacted(item, secrets) for item in value]
    if isinstance(value, str):
        for secret in secrets or []:
            value = value.replace(secret, "<hidden>")
    return value


def request_probe(params, opener=urlopen, clock=time.monotonic):
    """smoke, decode or bench: resolve the model, run the requests, return the result with `model`."""
    mode = params["mode"]
    max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS[mode]
    timeout = params["timeout"]
    items = parse_bench_jsonl(params.get("bench_jsonl")) if mode == "bench" else None
    model = resolve_model(params["url"], params.get("model"), timeout=min(timeout, 30.0), opener=opener)
    http = dict(timeout=timeout, opener=opener, clock=clock)
    if mode == "smoke":
        result = smoke(params["url"], model, params["question"], params["expected"], max_tokens, **http)
    elif mode == "decode":
        result = decode_probe(params["url"], model, params.get("prompt") or DECODE_PROMPT, max_tokens, **http)
    else:
        result = bench(params["url"], model, items, max_tokens, **http)
    result["model"] = model
    return result


def run_probe(params, runner=None, opener=urlopen, clock=time.monotonic, sleep=time.sleep):
    """engine_probe's result for its options (module.params): the probe's figures, `passed_floor` when
    a floor applies, and `report`, the host report's row. Raises StageError when the API cannot be
    reached or answers nonsense; never on a threshold."""
    mode = params["mode"]
    if mode not in MODES:
        raise StageError("mode must be one of %s, not %r" % (", ".join(MODES), mode))
    if mode == "wait":
        runtime = params.get("runtime") or "docker"
        check = owner = None
        if params.get("container"):
            check = functools.partial(container_state, runner, runtime, params["container"])
        if params.get("port"):
            owner = functools.partial(api_owner, runner, runtime, params["port"])
        result = wait_probe(params["url"], params["wait_for"], check, owner, params.get("lane_hosts"),
                            params.get("lane"), bool(params.get("give_up")), params.get("wait_id"),
                            params.get("round") or 1, opener=opener, clock=clock, sleep=sleep)
        result["report"] = probe_report(mode, result)
        # Shaped into the report; the inputs are the caller's own.
        for key in ("lane_hosts", "lane_rows", "round"):
            result.pop(key, None)
        # Engine logs and other processes' command lines may quote a secret (an engine prints its arguments).
        return redacted(result, params.get("redact"))
    result = request_probe(params, opener=opener, clock=clock)
    verdict = floor_verdict(mode, result, params.get("floor"))
    if verdict is not None:
        result["passed_floor"] = verdict
    if mode == "decode":
        result["complete"], result["problems"] = decode_verdict(result, result["max_tokens"], params.get("floor"))
        result["msg"] = decode_message(result, result["complete"], result["problems"])
    result["report"] = probe_report(mode, result, params.get("floor"))
    return result
