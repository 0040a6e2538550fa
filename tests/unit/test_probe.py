"""dgx_openai and dgx_decode: the engine API probes (readiness, smoke, decode tok/s, bench) as pure functions."""
import io
import json
import re
import urllib.error

import pytest

from fakeclock import FakeClock
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_decode
from ansible.module_utils.dgx_decode import (DECODE_PROMPT, bench, bench_summary, decode_probe, decode_rate,
                                             decode_result, floor_verdict, parse_bench_jsonl, probe_report, smoke)
from ansible.module_utils.dgx_lane_wait import wait_report
from ansible.module_utils.dgx_openai import (api_url, chat_payload, completion_text, first_model_id,
                                             parse_sse)
from ansible.module_utils.dgx_decode import run_probe


class FakeResponse(io.BytesIO):
    """A response whose readline() advances the clock per line (streamed token arrival)."""

    def __init__(self, raw, clock=None, per_line=0.0):
        io.BytesIO.__init__(self, raw)
        self.clock = clock
        self.per_line = per_line

    def readline(self, *args):
        if self.clock is not None:
            self.clock.now += self.per_line
        return io.BytesIO.readline(self, *args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def sse(events):
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def token_chunk(text):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def finish_chunk(reason):
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


# --- pure helpers -------------------------------------------------------------------------------

def test_api_url_joins_base_and_path_with_or_without_v1():
    assert api_url("http://dgx1:8000", "/v1/models") == "http://dgx1:8000/v1/models"
    assert api_url("http://dgx1:8000/", "/v1/models") == "http://dgx1:8000/v1/models"
    assert api_url("http://dgx1:8000/v1", "/v1/chat/completions") == "http://dgx1:8000/v1/chat/completions"
    with pytest.raises(StageError, match="http://"):
        api_url("dgx1:8000", "/v1/models")


def test_chat_payload_is_temperature_zero_and_streams_with_usage_and_ignore_eos():
    body = chat_payload("m", "hi", 400, stream=True)
    assert body["temperature"] == 0 and body["max_tokens"] == 400 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    # A decode probe must run to max_tokens: the model's own end of answer would fail a healthy engine.
    assert body["ignore_eos"] is True
    plain = chat_payload("m", "hi", 8)
    assert "stream_options" not in plain and "ignore_eos" not in plain


def test_first_model_id_and_a_clear_error_without_models():
    assert first_model_id({"data": [{"id": "a"}, {"id": "b"}]}) == "a"
    with pytest.raises(StageError, match="engine_served_model"):
        first_model_id({"data": []})


def test_completion_text_joins_reasoning_and_content():
    body = {"choices": [{"message": {"reasoning_content": "127*89 is ", "content": "11303"}}]}
    assert completion_text(body) == "127*89 is 11303"
    with pytest.raises(StageError, match="choices"):
        completion_text({"error": "x"})


def test_decode_prompt_is_fixed_and_about_487_tokens():
    # ~4.2 characters per BPE token for English prose: 487 tokens ~ 2,050 characters.
    assert 1900 <= len(DECODE_PROMPT) <= 2200
    assert 330 <= len(DECODE_PROMPT.split()) <= 400


# --- decode tok/s ---------------------------------------------------------------------------------

def test_decode_rate_is_tokens_minus_one_over_first_to_last():
    assert decode_rate(400, 10.0, 20.0) == pytest.approx(39.9)
    assert decode_rate(2, 0.0, 0.5) == pytest.approx(2.0)


@pytest.mark.parametrize("tokens, first, last", [(1, 0.0, 1.0), (0, None, None), (5, 2.0, 2.0), (5, None, 1.0)])
def test_decode_rate_is_none_for_what_cannot_be_measured(tokens, first, last):
    assert decode_rate(tokens, first, last) is None


def test_parse_sse_times_only_token_bearing_chunks_and_reads_usage():
    lines = [(1.0, b": keep-alive\n"),
             (1.1, b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n'), (1.1, b"\n"),
             (2.0, b'data: {"choices": [{"delta": {"content": "a"}}]}\n'),
             (2.5, b'data: {"choices": [{"delta": {"reasoning_content": "b"}}]}\n'),
             (3.0, b'data: {"choices": [{"delta": {"content": ""}}]}\n'),
             (4.0, b'data: {"choices": [{"delta": {"content": "c"}, "finish_reason": "length"}]}\n'),
             (4.2, b'data: {"choices": [], "usage": {"prompt_tokens": 487, "completion_tokens": 3}}\n'),
             (4.3, b"data: [DONE]\n"),
             (9.0, b'data: {"choices": [{"delta": {"content": "after done"}}]}\n')]
    out = parse_sse(lines)
    assert out["chunks"] == 3 and out["t_first"] == 2.0 and out["t_last"] == 4.0
    assert out["text"] == "abc" and out["done"] and out["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 3


def test_parse_sse_counts_one_answer_to_its_finish_reason():
    """A server streaming two choices, or text after the finish reason, does not add to the answer's count."""
    lines = [(1.0, b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}, '
                   b'{"index": 1, "delta": {"content": "x"}}]}\n'),
             (2.0, b'data: {"choices": [{"index": 1, "delta": {"content": "y"}}]}\n'),
             (3.0, b'data: {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "length"}]}\n'),
             (4.0, b'data: {"choices": [{"index": 0, "delta": {"content": "late"}, "finish_reason": "stop"}]}\n')]
    out = parse_sse(lines)
    assert (out["chunks"], out["text"], out["t_last"], out["finish_reason"]) == (2, "ab", 3.0, "length")


def test_parse_sse_surfaces_a_mid_stream_error_and_names_a_malformed_event():
    with pytest.raises(StageError, match="mid-stream"):
        parse_sse([(0, b'data: {"error": {"message": "CUDA OOM"}}\n')])
    with pytest.raises(StageError, match="not JSON"):
        parse_sse([(0, b"data: {oops\n")])
    for data, says in ((b"42", "not a JSON object: '42'"), (b'{"choices": {"0": 1}}', "choices that are not a list"),
                       (b'{"choices": ["a"]}', "choices that are not a list"),
                       (b'{"choices": [{"delta": {"content": ["a"]}}]}', "delta whose content is not text"),
                       (b'{"choices": [{"delta": "a"}]}', "delta whose content is not text")):
        with pytest.raises(StageError, match=re.escape(says)):
            parse_sse([(0, b"data: " + data + b"\n")])


def test_decode_result_prefers_the_servers_token_count():
    # Speculative decoding: 3 chunks carried 7 tokens; the server's usage count is the truth.
    stream = {"chunks": 3, "t_first": 10.0, "t_last": 12.0, "usage": {"completion_tokens": 7, "prompt_tokens": 487},
              "finish_reason": "length"}
    result = decode_result(stream, 9.0, 12.5)
    assert result["tokens"] == 7 and result["token_source"] == "usage"
    assert result["decode_tok_s"] == 3.0 and result["ttft_s"] == 1.0 and result["prompt_tokens"] == 487
    stream["usage"] = None
    result = decode_result(stream, 9.0, 12.5)
    assert result["tokens"] == 3 and result["token_source"] == "chunks" and result["decode_tok_s"] == 1.0


def test_decode_probe_measures_a_stream_at_35_tokens_per_second():
    clock = FakeClock()
    events = [{"choices": [{"delta": {"role": "assistant"}}]}] + [token_chunk("t") for _ in range(400)]
    events += [{"choices": [], "usage": {"prompt_tokens": 487, "completion_tokens": 400}}, b"[DONE]"]
    raw = sse(events)
    sent = []

    def opener(request, timeout):
        sent.append(json.loads(request.data.decode()))
        # two lines per event ("data: ..." and the blank separator): 1/35 s per token event
        return FakeResponse(raw, clock, per_line=1.0 / 70)

    result = decode_probe("http://dgx1:8000", "m", opener=opener, clock=clock)
    assert sent[0]["stream"] is True and sent[0]["temperature"] == 0 and sent[0]["max_tokens"] == 400
    assert sent[0]["messages"][0]["content"] == DECODE_PROMPT
    assert result["tokens"] == 400 and result["decode_tok_s"] == pytest.approx(35.0, rel=1e-3)
    assert result["done"] is True


def test_decode_probe_reports_an_unreachable_engine():
    def opener(request, timeout):
        raise urllib.error.URLError("Connection refused")

    with pytest.raises(StageError, match="unreachable"):
        decode_probe("http://dgx1:8000", "m", opener=opener)


# --- smoke and bench ------------------------------------------------------------------------------

def completion(text):
    return FakeResponse(json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode())


def test_smoke_passes_only_when_the_answer_contains_11303():
    asked = []

    def opener(request, timeout):
        asked.append(json.loads(request.data.decode()))
        return completion("The product is 11303.")

    result = smoke("http://dgx1:8000", "m", opener=opener)
    assert result["passed"] and "127*89" in asked[0]["messages"][0]["content"] and asked[0]["temperature"] == 0
    result = smoke("http://dgx1:8000", "m", opener=lambda request, timeout: completion("11302"))
    assert not result["passed"] and result["answer"] == "11302"
    assert not smoke("http://dgx1:8000", "m", opener=lambda request, timeout: completion("11,303"))["passed"]


def test_parse_bench_jsonl_skips_blanks_and_comments_and_names_bad_lines():
    items = parse_bench_jsonl('# sample\n{"prompt": "p1", "expected": "a"}\n\n{"prompt": "p2", "expected": 42}\n')
    assert items == [{"prompt": "p1", "expected": "a", "line": 2}, {"prompt": "p2", "expected": "42", "line": 4}]
    with pytest.raises(StageError, match="line 2 is not JSON"):
        parse_bench_jsonl('{"prompt": "p", "expected": "a"}\n{nope\n')
    with pytest.raises(StageError, match="line 1 needs"):
        parse_bench_jsonl('{"prompt": "p"}\n')
    with pytest.raises(StageError, match="no items"):
        parse_bench_jsonl("# only a comment\n")


def test_bench_counts_passes_and_lists_failures():
    items = parse_bench_jsonl('{"prompt": "2*3", "expected": "6"}\n{"prompt": "2*4", "expected": "9"}\n')
    answers = {"2*3": "6", "2*4": "8"}

    def opener(request, timeout):
        body = json.loads(request.data.decode())
        assert body["temperature"] == 0 and body["stream"] is False
        return completion(answers[body["messages"][0]["content"]])

    result = bench("http://dgx1:8000", "m", items, opener=opener)
    assert result["total_items"] == 2 and result["passed_items"] == 1
    assert result["failed_items"] == [{"line": 2, "expected": "9", "answer": "8"}]
    # Not `passed` (the smoke test's bool) and not `failed` (Ansible's task status).
    assert not set(result) & {"passed", "failed", "total"}


def test_bench_summary_truncates_long_answers():
    summary = bench_summary([{"line": 1, "expected": "x", "answer": "y" * 1000, "passed": False}])
    assert summary == {"total_items": 1, "passed_items": 0,
                       "failed_items": [{"line": 1, "expected": "x", "answer": "y" * 300}]}


def test_the_shipped_bench_sample_parses():
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "engine", "files", "bench-sample.jsonl")
    with open(path) as handle:
        items = parse_bench_jsonl(handle.read(), path)
    assert len(items) == 5


# --- the host report's rows and the floor ---------------------------------------------------------

DECODE = {"model": "m", "tokens": 400, "token_source": "usage", "chunks": 400, "prompt_tokens": 487, "ttft_s": 0.3,
          "decode_s": 11.4, "decode_tok_s": 35.0, "e2e_tok_s": 34.2, "duration_s": 11.8, "finish_reason": "length",
          "max_tokens": 400, "prompt_chars": 2050, "done": True, "cut": None, "complete": True, "problems": []}
BENCH = {"model": "m", "total_items": 5, "passed_items": 4, "duration_s": 2.5,
         "failed_items": [{"line": 3, "expected": "9", "answer": "8"}]}


def test_floor_verdict_compares_tok_s_or_items_and_is_none_without_a_floor():
    assert floor_verdict("decode", DECODE, 30.78) is True
    assert floor_verdict("decode", DECODE, 34.2) is True       # reaching the floor is enough
    assert floor_verdict("decode", DECODE, 34.21) is False     # end to end is below it
    assert floor_verdict("decode", dict(DECODE, e2e_tok_s=None), 1) is False
    assert floor_verdict("bench", BENCH, 4) is True and floor_verdict("bench", BENCH, 5.0) is False
    assert floor_verdict("decode", DECODE, None) is None
    assert floor_verdict("smoke", {"passed": True}, 1) is None


def test_the_decode_row_is_the_speed_figures_with_the_floor_and_its_verdict():
    row = probe_report("decode", DECODE, 30.78)
    assert row == {"model": "m", "tokens": 400, "token_source": "usage", "prompt_tokens": 487, "ttft_s": 0.3,
                   "decode_s": 11.4, "decode_tok_s": 35.0, "e2e_tok_s": 34.2, "duration_s": 11.8,
                   "finish_reason": "length", "max_tokens": 400, "complete": True, "problems": [],
                   "floor": 30.78, "passed": True}
    # Fast enough but incomplete: not passed.
    assert probe_report("decode", dict(DECODE, complete=False), 30.78)["passed"] is False
    assert probe_report("decode", DECODE, 100000)["passed"] is False
    assert probe_report("decode", DECODE, 100000)["floor"] == 100000.0
    assert "floor" not in probe_report("decode", DECODE) and "passed" not in probe_report("decode", DECODE)


def test_the_bench_row_counts_items_and_passed_is_the_verdict_against_an_integer_floor():
    row = probe_report("bench", BENCH, 5.0)
    assert row == {"model": "m", "total_items": 5, "passed_items": 4, "floor": 5, "passed": False,
                   "duration_s": 2.5, "failed_items": [{"line": 3, "expected": "9", "answer": "8"}]}
    assert isinstance(row["floor"], int) and probe_report("bench", BENCH, 4.5)["floor"] == 4.5
    assert probe_report("bench", BENCH, 4.0)["passed"] is True and "passed" not in probe_report("bench", BENCH)


def test_the_smoke_and_wait_rows():
    smoke_result = {"model": "m", "question": "q", "expected": "11303", "answer": "11303", "passed": True,
                    "duration_s": 0.2}
    assert probe_report("smoke", smoke_result) == smoke_result
    assert wait_report(["ds41"]) == {"models": ["ds41"]}


# --- run_probe: the module's whole run -------------------------------------------------------------

def params(**overrides):
    base = {"mode": "smoke", "url": "http://dgx1:8000", "model": None, "timeout": 300.0,
            "question": dgx_decode.SMOKE_QUESTION, "expected": dgx_decode.SMOKE_EXPECTED, "prompt": None,
            "max_tokens": None, "bench_jsonl": None, "floor": None}
    base.update(overrides)
    return base


def api(answers):
    """An opener serving /v1/models and non-stream completions from answers (prompt -> text)."""
    def opener(request, timeout):
        if request.full_url.endswith("/v1/models"):
            return FakeResponse(json.dumps({"data": [{"id": "ds41"}]}).encode())
        prompt = json.loads(request.data.decode())["messages"][0]["content"]
        return completion(answers.get(prompt, "?"))
    return opener


def test_run_probe_smoke_resolves_the_model_and_returns_the_row():
    result = run_probe(params(), opener=api({dgx_decode.SMOKE_QUESTION: "11303"}))
    assert result["model"] == "ds41" and result["passed"] is True
    assert result["report"]["passed"] is True and result["report"]["model"] == "ds41"
    assert "passed_floor" not in result


def test_run_probe_bench_reports_the_floor_without_failing_below_it():
    bench_jsonl = '{"prompt": "2*3", "expected": "6"}\n{"prompt": "2*4", "expected": "9"}\n'
    result = run_probe(params(mode="bench", bench_jsonl=bench_jsonl, floor=2.0),
                       opener=api({"2*3": "6", "2*4": "8"}))
    assert (result["passed_items"], result["total_items"], result["passed_floor"]) == (1, 2, False)
    assert result["report"]["passed_items"] == 1 and result["report"]["passed"] is False and result["report"]["floor"] == 2


def test_run_probe_decode_with_a_floor():
    clock = FakeClock()
    raw = sse([token_chunk("t") for _ in range(10)] + [finish_chunk("length"), b"[DONE]"])
    prefill = {"s": 0.0}

    def opener(request, timeout):
        if request.full_url.endswith("/v1/models"):
            return FakeResponse(json.dumps({"data": [{"id": "ds41"}]}).encode())
        clock.now += prefill["s"]
        return FakeResponse(raw, clock, per_line=0.05)   # a token every 0.1 s: 10 tok/s

    result = run_probe(params(mode="decode", floor=8.5, max_tokens=10), opener=opener, clock=clock)
    # 10 tokens from t=0.05 to t=0.95 after sending: 9 / 0.9 s decode, 10 / 0.95 s end to end.
    assert result["decode_tok_s"] == pytest.approx(10.0) and result["e2e_tok_s"] == pytest.approx(10.5263, abs=1e-4)
    assert result["passed_floor"] is True and result["complete"] is True and result["problems"] == []
    assert result["report"]["passed"] is True and result["report"]["floor"] == 8.5
    assert result["report"]["e2e_tok_s"] == 10.53          # rounded for display in the report only
    assert result["msg"] == ("10 tokens, 10 tok/s decode, 10.53 tok/s end to end, first token after 0.05 s "
                             "(finish_reason length)")
    # The same stream after a 1 s prefill: the same decode rate, end to end below the floor.
    prefill["s"] = 1.0
    result = run_probe(params(mode="decode", floor=8.5, max_tokens=10), opener=opener, clock=clock)
    assert result["decode_tok_s"] == pytest.approx(10.0) and result["e2e_tok_s"] == pytest.approx(5.128, abs=1e-3)
    assert result["passed_floor"] is False and result["report"]["passed"] is False
    assert result["problems"] == ["5.13 tok/s end to end (10 tokens / (last token - request sent)) is below "
                                  "engine_decode_floor=8.5 (10 tok/s decode, but the first token came only after "
                                  "1.05 s)"]
