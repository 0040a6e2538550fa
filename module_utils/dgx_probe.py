# -*- coding: utf-8 -*-
"""engine_probe's work: run_probe() takes the module's options and returns its result (the module only parses
them): a smoke, decode or bench request with its verdict.
Stdlib only (modules run on the nodes' system Python).
"""
from __future__ import absolute_import, division, print_function

import time

from ansible.module_utils.dgx_decode import (DECODE_PROMPT, DEFAULT_MAX_TOKENS, MODES, bench, decode_message,
                                             decode_probe, decode_verdict, floor_verdict, parse_bench_jsonl,
                                             probe_report, smoke)
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_openai import resolve_model
from urllib.request import urlopen


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


def run_probe(params, opener=urlopen, clock=time.monotonic):
    """engine_probe's result for its options (module.params): the probe's figures, `passed_floor` when
    a floor applies, and `report`, the host report's row. Raises StageError when the API cannot be
    reached or answers nonsense; never on a threshold."""
    mode = params["mode"]
    if mode not in MODES:
        raise StageError("mode must be one of %s, not %r" % (", ".join(MODES), mode))
    result = request_probe(params, opener=opener, clock=clock)
    verdict = floor_verdict(mode, result, params.get("floor"))
    if verdict is not None:
        result["passed_floor"] = verdict
    if mode == "decode":
        result["complete"], result["problems"] = decode_verdict(result, result["max_tokens"], params.get("floor"))
        result["msg"] = decode_message(result, result["complete"], result["problems"])
    result["report"] = probe_report(mode, result, params.get("floor"))
    return result
