#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_probe
short_description: Probe the engine's OpenAI-style API - smoke test, decode speed, quality bench
version_added: "1.0.0"
description:
  - V(smoke) asks O(question) at temperature 0; RV(passed) when the answer contains O(expected).
  - V(decode) streams a fixed ~487-token prompt for O(max_tokens) tokens and measures decode and end-to-end
    tok/s (RV(decode_tok_s), RV(e2e_tok_s)); the stream must be RV(complete) to prove anything.
  - V(bench) runs each JSONL item of O(bench_jsonl) at temperature 0; an item passes when the answer contains its
    C(expected) string.
  - Never fails on a verdict (the role asserts on RV(report)); fails when the API cannot be reached or answers
    nonsense.
author: dgx-stage maintainers
options:
  mode: {description: Which probe to run., type: str, required: true, choices: [smoke, decode, bench]}
  url: {description: "API base URL, C(http://host:port) (a trailing C(/v1) is accepted).", type: str, required: true}
  model: {description: Model name for requests; default the first id listed by C(/v1/models)., type: str}
  timeout: {description: "Seconds one HTTP request may take, to its last byte.", type: float, default: 300}
  question: {description: The V(smoke) question., type: str, default: "What is 127*89? Reply with the number only."}
  expected: {description: V(smoke) only. The string the answer must contain., type: str, default: "11303"}
  prompt: {description: V(decode) only. Prompt to stream; default the fixed ~487-token prompt., type: str}
  max_tokens: {description: "Tokens to generate; default V(smoke) 256, V(decode) 400, V(bench) 512.", type: int}
  bench_jsonl:
    description: V(bench) only, and required there. JSONL text, one C({"prompt", "expected"}) object a line.
    type: str
  floor:
    description: V(decode) and V(bench) only. Decode tok/s or bench items passed to reach, reported in RV(passed_floor).
    type: float
extends_documentation_fragment:
  - dgx_node
  - dgx_node.read_only
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Read-only requests; behaves the same in check mode.
  idempotent:
    details: Only reads from the engine's API; it never changes the engine.
"""

EXAMPLES = r"""
- name: Decode probe on rank 0, against the lane's floor
  engine_probe:
    mode: decode
    url: http://dgx1:8000
    max_tokens: 400
    floor: 30.78
  register: engine_decode

- name: Fail on an incomplete stream or below the floor (after the report is written)
  ansible.builtin.assert:
    that: engine_decode.report.passed
    fail_msg: "{{ engine_decode.msg }}"
"""

RETURN = r"""
model: {description: Model name used for the requests., returned: success, type: str}
duration_s: {description: Seconds the probe's requests took., returned: success, type: float}
report:
  description: This probe's row of the host report; each key but RV(report.passed) and RV(report.floor) is the result of
    the same name (rates rounded to two decimals).
  returned: success
  type: dict
  contains:
    model: {description: RV(model)., type: str}
    duration_s: {description: RV(duration_s)., type: float}
    question: {description: RV(question)., returned: when O(mode=smoke), type: str}
    expected: {description: RV(expected)., returned: when O(mode=smoke), type: str}
    answer: {description: RV(answer)., returned: when O(mode=smoke), type: str}
    passed:
      description:
        - The row's verdict - V(smoke) RV(passed); V(decode) RV(complete) and RV(passed_floor); V(bench)
          RV(passed_floor).
      returned: when O(mode=smoke); when O(mode=decode) or O(mode=bench) and O(floor) is set
      type: bool
    tokens: {description: RV(tokens)., returned: when O(mode=decode), type: int}
    token_source: {description: RV(token_source)., returned: when O(mode=decode), type: str}
    prompt_tokens: {description: RV(prompt_tokens)., returned: when O(mode=decode), type: int}
    ttft_s: {description: RV(ttft_s)., returned: when O(mode=decode), type: float}
    decode_s: {description: RV(decode_s)., returned: when O(mode=decode), type: float}
    decode_tok_s: {description: RV(decode_tok_s)., returned: when O(mode=decode), type: float}
    e2e_tok_s: {description: RV(e2e_tok_s)., returned: when O(mode=decode), type: float}
    complete: {description: RV(complete)., returned: when O(mode=decode), type: bool}
    problems: {description: RV(problems)., returned: when O(mode=decode), type: list, elements: str}
    finish_reason: {description: RV(finish_reason)., returned: when O(mode=decode), type: str}
    max_tokens: {description: RV(max_tokens)., returned: when O(mode=decode), type: int}
    floor:
      description: O(floor) - a float for V(decode), an int when whole for V(bench).
      returned: when O(mode=decode) or O(mode=bench) and O(floor) is set
      type: raw
    total_items: {description: RV(total_items)., returned: when O(mode=bench), type: int}
    passed_items: {description: RV(passed_items)., returned: when O(mode=bench), type: int}
    failed_items: {description: RV(failed_items)., returned: when O(mode=bench), type: list, elements: dict}
  sample: {model: ds41, tokens: 400, token_source: usage, prompt_tokens: 487, ttft_s: 0.3, decode_s: 11.4,
           decode_tok_s: 35.0, e2e_tok_s: 34.2, duration_s: 11.8, finish_reason: length, max_tokens: 400,
           complete: true, problems: [], floor: 30.78, passed: true}
passed_floor:
  description: Decode and end-to-end tok/s both reached O(floor), or bench items passed did.
  returned: success when O(mode=decode) or O(mode=bench) and O(floor) is set
  type: bool
msg:
  description: V(decode) - the RV(problems), or the figures that passed, on one line; on failure, what went wrong.
  returned: success when O(mode=decode); failure
  type: str
  sample: "400 tokens, 35.0 tok/s decode, 34.2 tok/s end to end, first token after 0.3 s (finish_reason length)"
question: {description: The question asked., returned: success when O(mode=smoke), type: str}
expected: {description: The string the answer must contain., returned: success when O(mode=smoke), type: str}
answer:
  description: The answer, reasoning then content (500 characters).
  returned: success when O(mode=smoke)
  type: str
passed: {description: The answer contains O(expected)., returned: success when O(mode=smoke), type: bool}
tokens:
  description: Tokens generated - the server's C(usage.completion_tokens), else the token-bearing chunks.
  returned: success when O(mode=decode)
  type: int
token_source: {description: V(usage) or V(chunks)., returned: success when O(mode=decode), type: str}
chunks: {description: Token-bearing chunks streamed., returned: success when O(mode=decode), type: int}
prompt_tokens:
  description: Prompt tokens as the server counted them, or null when it sent no usage.
  returned: success when O(mode=decode)
  type: int
ttft_s:
  description: Seconds from sending the request to the first token (prefill), or null when none came.
  returned: success when O(mode=decode)
  type: float
decode_s:
  description: Seconds from the first to the last token-bearing chunk, or null when none came.
  returned: success when O(mode=decode)
  type: float
decode_tok_s:
  description: (tokens - 1) / (t_last - t_first), unrounded; null when fewer than 2 tokens came.
  returned: success when O(mode=decode)
  type: float
e2e_tok_s:
  description: tokens / (t_last - t_sent) - prefill and every stall included; null when no token came.
  returned: success when O(mode=decode)
  type: float
complete:
  description: The stream ended with finish reason C(length) or C(stop) after exactly O(max_tokens) tokens, a usage
    count at most 16 tokens per token-bearing chunk.
  returned: success when O(mode=decode)
  type: bool
problems:
  description: Why the probe proves nothing or fails (an incomplete stream, a rate below O(floor)); empty on a pass.
  returned: success when O(mode=decode)
  type: list
  elements: str
  sample: ["the stream stopped after 50 of 400 tokens without a finish reason: the connection broke (IncompleteRead)"]
cut: {description: "How the connection broke mid-stream, or null.", returned: success when O(mode=decode), type: str}
finish_reason: {description: "The stream's finish reason, or null.", returned: success when O(mode=decode), type: str}
max_tokens: {description: Tokens asked for., returned: success when O(mode=decode), type: int}
prompt_chars: {description: Characters of the prompt streamed., returned: success when O(mode=decode), type: int}
done: {description: "The stream ended with C(data: [DONE]).", returned: success when O(mode=decode), type: bool}
total_items: {description: Number of bench items., returned: success when O(mode=bench), type: int}
passed_items: {description: Bench items passed., returned: success when O(mode=bench), type: int}
failed_items:
  description: The bench items that did not pass.
  returned: success when O(mode=bench)
  type: list
  elements: dict
  contains:
    line: {description: Line number in O(bench_jsonl)., type: int}
    expected: {description: The string the answer had to contain., type: str}
    answer: {description: The answer (first 300 characters)., type: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_decode

ARGUMENT_SPEC = dict(
    mode=dict(type="str", required=True, choices=list(dgx_decode.MODES)),
    url=dict(type="str", required=True),
    model=dict(type="str"),
    timeout=dict(type="float", default=300.0),
    question=dict(type="str", default=dgx_decode.SMOKE_QUESTION),
    expected=dict(type="str", default=dgx_decode.SMOKE_EXPECTED),
    prompt=dict(type="str"),
    max_tokens=dict(type="int"),
    bench_jsonl=dict(type="str"),
    floor=dict(type="float"),
)
REQUIRED_IF = [("mode", "bench", ["bench_jsonl"])]


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True)
    try:
        result = dgx_decode.run_probe(module.params)
    except StageError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
