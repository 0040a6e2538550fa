"""Probes of the engine's OpenAI-style API: readiness, the smoke test, the decode probe, the bench.

Stdlib only (modules run on the nodes' system Python). The parsing and arithmetic are pure functions
(unit-tested); the HTTP helpers take the opener and the clock as arguments so tests can drive them.
run_probe() is the whole of library/engine_probe.py's work: the module only parses its options.
"""
from __future__ import absolute_import, division, print_function

import functools
import json
import socket
import time

from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from ansible.module_utils.dgx_errors import StageError

MODES = ("wait", "smoke", "decode", "bench")
SMOKE_QUESTION = "What is 127*89? Reply with the number only."
SMOKE_EXPECTED = "11303"
DEFAULT_MAX_TOKENS = {"smoke": 256, "decode": 400, "bench": 512}
# The host report's rows (one per mode), shaped by probe_report().
SMOKE_REPORT_KEYS = ("model", "question", "expected", "answer", "passed", "duration_s")
DECODE_REPORT_KEYS = ("model", "tokens", "token_source", "prompt_tokens", "ttft_s", "decode_s", "decode_tok_s",
                      "duration_s", "finish_reason", "max_tokens")

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
    """A temperature-0 chat completion request body."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": int(max_tokens), "temperature": 0, "stream": bool(stream)}
    if stream:
        body["stream_options"] = {"include_usage": True}
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


def parse_sse(timed_lines):
    """Digest a streamed completion: timed_lines yields (arrival time, raw line bytes/str).

    Returns {"chunks": token-bearing chunks, "t_first", "t_last": their arrival times,
    "usage": the usage object if the server sent one, "text", "finish_reason", "done"}.
    A chunk bears tokens when its delta has non-empty content or reasoning_content.
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
        if event.get("error"):
            raise StageError("the engine reported an error mid-stream: %s" % json.dumps(event["error"])[:300])
        if event.get("usage"):
            out["usage"] = event["usage"]
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text = "".join(delta.get(k) or "" for k in ("reasoning_content", "content"))
            if text:
                out["chunks"] += 1
                if out["t_first"] is None:
                    out["t_first"] = when
                out["t_last"] = when
                pieces.append(text)
            if choice.get("finish_reason"):
                out["finish_reason"] = choice["finish_reason"]
    out["text"] = "".join(pieces)
    return out


def decode_rate(tokens, t_first, t_last):
    """Decode tok/s from first to last token: (tokens - 1) / (t_last - t_first)."""
    if tokens is None or tokens < 2 or t_first is None or t_last is None or t_last <= t_first:
        raise StageError("cannot measure decode speed: %s token(s) streamed between t=%s and t=%s; "
                         "the engine must stream at least 2 tokens" % (tokens, t_first, t_last))
    return (tokens - 1) / float(t_last - t_first)


def decode_result(stream, t_sent, t_end):
    """The decode probe's numbers from parse_sse() output and the request's send/end times."""
    usage = stream.get("usage") or {}
    completion_tokens = usage.get("completion_tokens")
    # With speculative decoding (the DSpark drafter) a chunk may carry several tokens: trust the
    # server's count when it sends one.
    tokens = int(completion_tokens) if completion_tokens else stream["chunks"]
    rate = decode_rate(tokens, stream["t_first"], stream["t_last"])
    return {
        "tokens": tokens,
        "token_source": "usage" if completion_tokens else "chunks",
        "chunks": stream["chunks"],
        "prompt_tokens": usage.get("prompt_tokens"),
        "ttft_s": round(stream["t_first"] - t_sent, 4),
        "decode_s": round(stream["t_last"] - stream["t_first"], 4),
        "decode_tok_s": round(rate, 2),
        "duration_s": round(t_end - t_sent, 4),
        "finish_reason": stream["finish_reason"],
    }


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
    value = result["decode_tok_s"] if mode == "decode" else result["passed_items"]
    return float(value) >= float(floor)


def _floor_value(mode, floor):
    """The floor as the report shows it: tok/s as a float, an item count as an int when whole."""
    floor = float(floor)
    return int(floor) if mode == "bench" and floor.is_integer() else floor


def probe_report(mode, result, floor=None):
    """This probe's row of the host report (the engine role passes it on unchanged).

    wait: {models}; smoke: the answer and its verdict; decode: the speed figures, plus floor and
    passed (tok/s >= floor) when a floor is given; bench: {model, total_items, passed_items, failed_items,
    duration_s}, plus floor and passed (passed_items >= floor) when a floor is given. `passed` is a
    verdict (a bool) in every row.
    """
    if mode == "wait":
        return {"models": list(result["models"])}
    if mode == "smoke":
        return dict((key, result[key]) for key in SMOKE_REPORT_KEYS)
    if mode == "decode":
        row = dict((key, result[key]) for key in DECODE_REPORT_KEYS)
        if floor is not None:
            row.update(floor=_floor_value(mode, floor), passed=floor_verdict(mode, result, floor))
        return row
    row = dict((key, result[key]) for key in ("model", "total_items", "passed_items", "failed_items", "duration_s"))
    if floor is not None:
        row.update(floor=_floor_value(mode, floor), passed=floor_verdict(mode, result, floor))
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


def http_json(url, payload=None, timeout=300.0, opener=urlopen):
    """GET (payload None) or POST JSON; return the decoded body or raise StageError."""
    try:
        with opener(_request(url, payload), timeout=timeout) as resp:
            raw = resp.read()
    except (HTTPError, URLError, socket.timeout, OSError) as exc:
        raise StageError("%s %s failed: %s" % ("POST" if payload is not None else "GET", url, _describe(exc)))
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        raise StageError("%s answered with non-JSON: %r" % (url, raw[:200]))


def resolve_model(base, model, timeout=30.0, opener=urlopen):
    """The model name to put in requests: the given one, else the first id of /v1/models."""
    if model:
        return model
    return first_model_id(http_json(api_url(base, "/v1/models"), timeout=timeout, opener=opener))


def poll_ready(base, wait_for, interval=1.0, is_running=None, opener=urlopen, clock=time.monotonic,
               sleep=time.sleep):
    """Poll /v1/models for up to wait_for seconds. Stops early when the API answers with a model
    list, or when is_running() (if given) says the engine container is gone.

    Returns {"ready", "running", "status", "models", "polls", "elapsed_s"}.
    """
    url = api_url(base, "/v1/models")
    start = clock()
    result = {"ready": False, "running": None, "status": "not polled", "models": [], "polls": 0}
    while True:
        result["polls"] += 1
        try:
            body = http_json(url, timeout=max(1.0, min(5.0, wait_for)), opener=opener)
            result["models"] = [m.get("id") for m in body.get("data") or [] if isinstance(m, dict)]
            result["status"] = "ready"
            result["ready"] = True
        except StageError as exc:
            result["status"] = str(exc)
        if not result["ready"] and is_running is not None:
            result["running"] = bool(is_running())
            if not result["running"]:
                break
        if result["ready"] or clock() - start + interval > wait_for:
            break
        sleep(interval)
    result["elapsed_s"] = round(clock() - start, 3)
    return result


def smoke(base, model, question=SMOKE_QUESTION, expected=SMOKE_EXPECTED, max_tokens=256,
          timeout=300.0, opener=urlopen, clock=time.monotonic):
    """One chat completion; passed when the answer contains expected."""
    t0 = clock()
    body = http_json(api_url(base, "/v1/chat/completions"), chat_payload(model, question, max_tokens),
                     timeout=timeout, opener=opener)
    text = completion_text(body)
    return {"question": question, "expected": expected, "answer": text[:500],
            "passed": contains_expected(text, expected), "duration_s": round(clock() - t0, 4)}


def _timed_lines(resp, clock):
    while True:
        line = resp.readline()
        if not line:
            return
        yield clock(), line


def decode_probe(base, model, prompt=DECODE_PROMPT, max_tokens=400, timeout=300.0, opener=urlopen,
                 clock=time.monotonic):
    """Stream one temperature-0 completion and measure decode tok/s from first to last token."""
    url = api_url(base, "/v1/chat/completions")
    t_sent = clock()
    try:
        with opener(_request(url, chat_payload(model, prompt, max_tokens, stream=True)), timeout=timeout) as resp:
            stream = parse_sse(_timed_lines(resp, clock))
    except (HTTPError, URLError, socket.timeout, OSError) as exc:
        raise StageError("POST %s (stream) failed: %s" % (url, _describe(exc)))
    result = decode_result(stream, t_sent, clock())
    result.update({"max_tokens": int(max_tokens), "prompt_chars": len(prompt), "done": stream["done"]})
    return result


def bench(base, model, items, max_tokens=512, timeout=300.0, opener=urlopen, clock=time.monotonic):
    """Run each item at temperature 0; an item passes when the answer contains its expected string."""
    t0 = clock()
    outcomes = []
    url = api_url(base, "/v1/chat/completions")
    for item in items:
        text = completion_text(http_json(url, chat_payload(model, item["prompt"], max_tokens),
                                         timeout=timeout, opener=opener))
        outcomes.append({"line": item["line"], "expected": item["expected"], "answer": text,
                         "passed": contains_expected(text, item["expected"])})
    summary = bench_summary(outcomes)
    summary["duration_s"] = round(clock() - t0, 3)
    return summary


# ------------------------------------------------------------------------------------------------
# the module's run: engine_probe's options in, its result out
# ------------------------------------------------------------------------------------------------

def container_state(runner, runtime, name):
    """(running, log tail) of one container through the runtime CLI.

    runner: the AnsibleModule (anything with get_bin_path() and run_command()).
    """
    binary = runner.get_bin_path(runtime)
    if not binary:
        return False, "%s not found on this host" % runtime
    rc, out, err = runner.run_command([binary, "inspect", "--format", "{{.State.Running}}", name])
    if rc == 0 and out.strip().lower() == "true":
        return True, ""
    if rc != 0:
        return False, "container %s does not exist: %s" % (name, err.strip()[:300])
    rc, out, err = runner.run_command([binary, "logs", "--tail", "30", name])
    return False, (out + err)[-4000:]


def wait_probe(base, wait_for, container_check=None, opener=urlopen, clock=time.monotonic, sleep=time.sleep):
    """One bounded wait for the API (an `until` loop repeats it).

    container_check: None, or a function returning (running, log tail) of this host's engine container;
    polling stops at once when it is not running. `running` in the result is false only then.
    """
    logs = {"text": ""}

    def is_running():
        running, logs["text"] = container_check()
        return running

    result = poll_ready(base, wait_for, is_running=is_running if container_check else None, opener=opener,
                        clock=clock, sleep=sleep)
    result["logs"] = logs["text"]
    result["running"] = result["running"] is not False
    result["msg"] = ("API ready: %s" % ", ".join(result["models"]) if result["ready"] else
                     "API not ready after %.0f s: %s" % (result["elapsed_s"], result["status"]))
    return result


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
        check = None
        if params.get("container"):
            check = functools.partial(container_state, runner, params.get("runtime") or "docker", params["container"])
        result = wait_probe(params["url"], params["wait_for"], check, opener=opener, clock=clock, sleep=sleep)
    else:
        result = request_probe(params, opener=opener, clock=clock)
    verdict = floor_verdict(mode, result, params.get("floor"))
    if verdict is not None:
        result["passed_floor"] = verdict
    result["report"] = probe_report(mode, result, params.get("floor"))
    return result
