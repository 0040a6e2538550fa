"""engine_probe's work: the smoke test, the decode probe and the bench, their verdicts against the floors
(unrounded rates compared, rounded only for display) and the host report's rows.
"""
import json
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_openai import (api_url, chat_payload, completion_text, first_model_id, http_json,
                                             open_within, parse_sse, request_failed, stream_tokens, timed_lines)
from ansible.module_utils.dgx_units import plain_number
from http import client as http_client
from urllib.request import urlopen


MODES = ("smoke", "decode", "bench")
SMOKE_QUESTION = "What is 127*89? Reply with the number only."
SMOKE_EXPECTED = "11303"
DEFAULT_MAX_TOKENS = {"smoke": 256, "decode": 400, "bench": 512}

SMOKE_REPORT_KEYS = ("model", "question", "expected", "answer", "passed", "duration_s")
DECODE_REPORT_KEYS = ("model", "tokens", "token_source", "prompt_tokens", "ttft_s", "decode_s", "decode_tok_s",
                      "e2e_tok_s", "duration_s", "finish_reason", "max_tokens", "complete", "problems")
BENCH_REPORT_KEYS = ("model", "total_items", "passed_items", "failed_items", "duration_s")

# finish_reason values of a stream that ran to its end; abort, content_filter, error... mean the engine gave up.
FINISHED = ("length", "stop")

# Tokens one chunk may carry: generous for speculative decoding (a few drafted tokens per step).
MAX_TOKENS_PER_CHUNK = 16

# ~487 tokens with the Llama/DeepSeek BPE tokenizers; fixed, so tok/s of different runs and lanes compare.
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


def decode_rate(tokens, t_first, t_last):
    """Decode tok/s from first to last token, (tokens - 1) / (t_last - t_first); None below 2 tokens."""
    if not tokens or tokens < 2 or t_first is None or t_last is None or t_last <= t_first:
        return None
    return (tokens - 1) / float(t_last - t_first)


def count_untrusted(tokens, token_source, chunks):
    """Whether a usage count claims more tokens than its content chunks can have carried."""
    return token_source == "usage" and chunks is not None and tokens > chunks * MAX_TOKENS_PER_CHUNK


def decode_result(stream, t_sent, t_end):
    """The decode probe's figures from parse_sse() output. Rates stay unrounded (30.7751 does not reach 30.78)
    and are None when an untrusted usage count would make them up. Never raises: decode_verdict() judges."""
    tokens, token_source = stream_tokens(stream)
    t_first, t_last = stream["t_first"], stream["t_last"]
    trusted = not count_untrusted(tokens, token_source, stream["chunks"])
    return {
        "tokens": tokens,
        "token_source": token_source,
        "chunks": stream["chunks"],
        "prompt_tokens": (stream.get("usage") or {}).get("prompt_tokens"),
        "ttft_s": None if t_first is None else round(t_first - t_sent, 4),
        "decode_s": None if t_first is None else round(t_last - t_first, 4),
        "decode_tok_s": decode_rate(tokens, t_first, t_last) if trusted else None,
        # End to end: prefill and every stall included.
        "e2e_tok_s": tokens / float(t_last - t_sent) if trusted and tokens and t_last is not None
        and t_last > t_sent else None,
        "duration_s": round(t_end - t_sent, 4),
        "finish_reason": stream["finish_reason"],
        "done": bool(stream.get("done")),
        "cut": stream.get("cut"),
    }


def _below(rate, floor):
    """A rate under the floor as text: two decimals, or four when two would read as the floor itself."""
    text = plain_number(rate)
    return ("%.4f" % float(rate)).rstrip("0").rstrip(".") if text == plain_number(floor) else text


def stream_problems(result, max_tokens):
    """Why a decode_result() does not prove max_tokens tokens were streamed: [] when it does."""
    tokens, reason, source = result["tokens"], result["finish_reason"], result.get("token_source")
    count = "%d of %d tokens" % (tokens, max_tokens)
    if reason is None:
        how = "the connection broke (%s)" % result["cut"] if result.get("cut") else (
            "[DONE] came" if result.get("done") else "the stream ended")
        return ["the stream stopped after %s without a finish reason: %s" % (count, how)]
    problems = []
    if reason not in FINISHED:
        problems.append("the engine ended the answer with finish_reason %s after %s: only length or stop mean "
                        "the answer ran to its end" % (reason, count))
    elif tokens < max_tokens and reason == "length" and source == "chunks":
        problems.append("the engine ended with finish_reason length after %d content chunk(s) for max_tokens=%d "
                        "and sent no usage count (asked for with stream_options.include_usage): %d chunks prove "
                        "only %d tokens, too few to measure decode speed" % (tokens, max_tokens, tokens, tokens))
    elif tokens < max_tokens and reason == "length":
        problems.append("the engine ended with finish_reason length but %s counts only %s: it hit another "
                        "length limit (the context window?) or miscounts" % (source, count))
    elif tokens < max_tokens:
        problems.append("the engine ended the answer after %s (finish_reason %s): too short to measure decode "
                        "speed" % (count, reason))
    if tokens > max_tokens:
        problems.append("the engine streamed %d tokens for max_tokens=%d: it ignored max_tokens"
                        % (tokens, max_tokens))
    if count_untrusted(tokens, source, result.get("chunks")):
        problems.append("usage claims %d tokens but only %d chunk(s) carried content (at most %d tokens a chunk "
                        "even with speculative decoding): the count cannot be trusted"
                        % (tokens, result["chunks"], MAX_TOKENS_PER_CHUNK))
    return problems


def decode_verdict(result, max_tokens, floor=None):
    """(complete, problems): complete when the stream proves max_tokens tokens (stream_problems()); problems,
    [] when the probe proves the speed. With floor both rates must reach it: a stall then a burst has a huge
    first-to-last rate and a tiny end-to-end one."""
    tokens = result["tokens"]
    problems = stream_problems(result, int(max_tokens))
    complete = not problems
    decode, e2e = result["decode_tok_s"], result["e2e_tok_s"]
    if decode is None and not count_untrusted(tokens, result.get("token_source"), result.get("chunks")):
        problems.append("decode speed cannot be measured from %d token(s)" % tokens)
    if floor is None:
        return complete, problems
    floor_text = plain_number(floor)
    if decode is not None and decode < float(floor):
        problems.append("%s tok/s decode is below engine_decode_floor=%s (%d tokens in %s s from the first token)"
                        % (_below(decode, floor), floor_text, tokens, plain_number(result["decode_s"])))
    if e2e is None or e2e < float(floor):
        stall = ""
        if decode is not None and decode >= float(floor):
            stall = " (%s tok/s decode, but the first token came only after %s s)" % (
                plain_number(decode), plain_number(result["ttft_s"]))
        problems.append("%s tok/s end to end (%d tokens / (last token - request sent)) is below "
                        "engine_decode_floor=%s%s" % ("no" if e2e is None else _below(e2e, floor), tokens,
                                                      floor_text, stall))
    return complete, problems


def decode_message(result, problems):
    """One line: the problems, or the figures that passed."""
    if problems:
        return "; ".join(problems)
    return "%d tokens, %s tok/s decode, %s tok/s end to end, first token after %s s (finish_reason %s)" % (
        result["tokens"], plain_number(result["decode_tok_s"]), plain_number(result["e2e_tok_s"]),
        plain_number(result["ttft_s"]), result["finish_reason"])


def parse_bench_jsonl(text, source="bench file"):
    """[{"prompt", "expected", "line"}] from JSONL text; blank lines and # comments are skipped."""
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
    """Item counts and the failed items of [{"line", "expected", "answer", "passed"}]. (Not passed/failed:
    `passed` is the smoke test's bool, and a non-empty `failed` in a module result fails the task.)"""
    failed = [{"line": o["line"], "expected": o["expected"], "answer": (o["answer"] or "")[:300]}
              for o in outcomes if not o["passed"]]
    return {"total_items": len(outcomes), "passed_items": len(outcomes) - len(failed), "failed_items": failed}


def floor_verdict(mode, result, floor):
    """Whether a decode (both rates) or bench (items passed) result reaches floor; None without one."""
    if floor is None or mode not in ("decode", "bench"):
        return None
    if mode == "bench":
        return float(result["passed_items"]) >= float(floor)
    rates = (result["decode_tok_s"], result["e2e_tok_s"])
    return all(rate is not None and float(rate) >= float(floor) for rate in rates)


def probe_report(mode, result, floor=None):
    """This probe's row of the host report; with a floor (decode, bench) also floor and passed, a bool."""
    if mode == "smoke":
        return dict((key, result[key]) for key in SMOKE_REPORT_KEYS)
    row = dict((key, result[key]) for key in (DECODE_REPORT_KEYS if mode == "decode" else BENCH_REPORT_KEYS))
    if mode == "decode":
        row.update((key, None if row[key] is None else round(row[key], 2)) for key in ("decode_tok_s", "e2e_tok_s"))
    if floor is not None:
        passed = floor_verdict(mode, result, floor)
        row.update(floor=int(floor) if mode == "bench" and float(floor).is_integer() else float(floor),
                   passed=bool(result["complete"] and passed) if mode == "decode" else passed)
    return row


def _ask(base, model, prompt, expected, max_tokens, timeout, opener, clock):
    """(the answer, whether it contains expected): the smoke test's and the bench's pass rule."""
    text = completion_text(http_json(api_url(base, "/v1/chat/completions"), chat_payload(model, prompt, max_tokens),
                                     timeout=timeout, opener=opener, clock=clock))
    return text, str(expected) in text


def smoke(base, model, question=SMOKE_QUESTION, expected=SMOKE_EXPECTED, max_tokens=256,
          timeout=300.0, opener=urlopen, clock=time.monotonic):
    """One chat completion; passed when the answer contains expected."""
    t0 = clock()
    text, passed = _ask(base, model, question, expected, max_tokens, timeout, opener, clock)
    return {"question": question, "expected": expected, "answer": text[:500], "passed": passed,
            "duration_s": round(clock() - t0, 4)}


def decode_probe(base, model, prompt=DECODE_PROMPT, max_tokens=400, timeout=300.0, opener=urlopen,
                 clock=time.monotonic):
    """Stream one temperature-0 completion and measure it (decode_result())."""
    url = api_url(base, "/v1/chat/completions")
    cut = {"reason": None}
    t_sent = clock()
    try:
        with open_within(opener, url, chat_payload(model, prompt, max_tokens, stream=True), timeout, clock) \
                as (resp, limit):
            stream = parse_sse(timed_lines(resp, clock, cut, limit))
    except (http_client.HTTPException, OSError) as exc:
        raise request_failed("POST", url + " (stream)", exc)
    stream["cut"] = cut["reason"]
    result = decode_result(stream, t_sent, clock())
    result.update({"max_tokens": int(max_tokens), "prompt_chars": len(prompt)})
    return result


def bench(base, model, items, max_tokens=512, timeout=300.0, opener=urlopen, clock=time.monotonic):
    """Run each item at temperature 0; an item passes when the answer contains its expected string."""
    t0 = clock()
    outcomes = []
    for item in items:
        text, passed = _ask(base, model, item["prompt"], item["expected"], max_tokens, timeout, opener, clock)
        outcomes.append({"line": item["line"], "expected": item["expected"], "answer": text, "passed": passed})
    summary = bench_summary(outcomes)
    summary["duration_s"] = round(clock() - t0, 3)
    return summary


def run_probe(params, opener=urlopen, clock=time.monotonic):
    """engine_probe's result for its options: the probe's figures, `passed_floor` when a floor applies and
    `report`. Raises StageError when the API cannot be reached or answers nonsense; never on a threshold."""
    mode, url, floor = params["mode"], params["url"], params.get("floor")
    max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS[mode]
    items = parse_bench_jsonl(params.get("bench_jsonl")) if mode == "bench" else None
    model = params.get("model") or first_model_id(
        http_json(api_url(url, "/v1/models"), timeout=min(params["timeout"], 30.0), opener=opener))
    http = dict(timeout=params["timeout"], opener=opener, clock=clock)
    if mode == "smoke":
        result = smoke(url, model, params["question"], params["expected"], max_tokens, **http)
    elif mode == "decode":
        result = decode_probe(url, model, params.get("prompt") or DECODE_PROMPT, max_tokens, **http)
        result["complete"], result["problems"] = decode_verdict(result, max_tokens, floor)
        result["msg"] = decode_message(result, result["problems"])
    else:
        result = bench(url, model, items, max_tokens, **http)
    result["model"] = model
    verdict = floor_verdict(mode, result, floor)
    if verdict is not None:
        result["passed_floor"] = verdict
    result["report"] = probe_report(mode, result, floor)
    return result
