#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_probe
short_description: Probe the engine's OpenAI-style API - readiness, smoke test, decode speed, quality bench
version_added: "1.0.0"
description:
  - V(wait) polls C(/v1/models) for up to O(wait_for) seconds and returns early when the API answers.
    With O(container), it also stops early (RV(running=false)) when that engine container is not
    running, returning the tail of its log, so a crashed engine is not waited for. Meant for an
    C(until) loop bounded by the role's C(engine_ready_timeout).
  - V(smoke) asks O(question) at temperature 0; RV(passed) when the answer contains O(expected).
  - V(decode) streams a fixed ~487-token prompt at temperature 0 for O(max_tokens) tokens and
    measures decode tok/s from the stream as (tokens - 1) / (t_last - t_first), where t_first and
    t_last are the arrival times of the first and last token-bearing chunks. The token count is the
    server's C(usage.completion_tokens) when it sends one, else the number of token-bearing chunks.
  - V(bench) runs each JSONL item of O(bench_jsonl) at temperature 0; an item passes when the
    answer contains its C(expected) string. RV(passed_items) counts them.
  - Every mode returns RV(report), this probe's row of the host report, shaped by the module.
  - Never fails on a threshold. With O(floor), V(decode) and V(bench) return RV(passed_floor) and
    put the floor and the verdict in RV(report); the role asserts on it after writing the host report.
    Fails when the API cannot be reached or answers nonsense.
author: dgx-stage maintainers
options:
  mode:
    description: Which probe to run.
    type: str
    required: true
    choices: [wait, smoke, decode, bench]
  url:
    description: API base URL, C(http://host:port) (a trailing C(/v1) is accepted).
    type: str
    required: true
  model:
    description: Model name for requests; default the first id listed by C(/v1/models).
    type: str
  timeout:
    description: Seconds one HTTP request may take.
    type: float
    default: 300
  wait_for:
    description: V(wait) only. Seconds to poll in this call.
    type: float
    default: 10
  container:
    description: V(wait) only. Name of this host's engine container; polling stops when it is not running.
    type: str
  runtime:
    description: V(wait) only. Container runtime CLI used to inspect O(container).
    type: str
    choices: [docker, podman]
    default: docker
  question:
    description: V(smoke) only. The question.
    type: str
    default: What is 127*89? Reply with the number only.
  expected:
    description: V(smoke) only. The string the answer must contain.
    type: str
    default: "11303"
  prompt:
    description: V(decode) only. Prompt to stream; default the fixed ~487-token prompt.
    type: str
  max_tokens:
    description: Tokens to generate (defaults per mode - V(smoke) 256, V(decode) 400, V(bench) 512).
    type: int
  bench_jsonl:
    description: V(bench) only, and required there. JSONL text, one C({"prompt", "expected"}) object a line.
    type: str
  floor:
    description:
      - V(decode) and V(bench) only. The figure the result must reach - decode tok/s (the role's
        C(engine_decode_floor)) or the number of bench items passed (C(engine_bench_floor)).
      - Only reported (RV(passed_floor), RV(report)); the module does not fail below it.
    type: float
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only requests; behaves the same in check mode.
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: full
    details: Only reads from the engine's API; it never changes the engine.
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
"""

EXAMPLES = r"""
- name: Decode probe on rank 0, against the lane's floor
  engine_probe:
    mode: decode
    url: http://dgx1:8000
    max_tokens: 400
    floor: 30.78
  register: engine_decode

- name: Fail below the floor (after the report is written)
  ansible.builtin.assert:
    that: engine_decode.passed_floor
"""

RETURN = r"""
model:
  description: Model name used for the requests.
  returned: success when O(mode=smoke) or O(mode=decode) or O(mode=bench)
  type: str
  sample: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw
duration_s:
  description: Seconds the probe's requests took.
  returned: success when O(mode=smoke) or O(mode=decode) or O(mode=bench)
  type: float
  sample: 12.41
report:
  description:
    - This probe's row of the host report; the engine role passes it on unchanged (under C(ready),
      C(smoke), C(decode) or C(bench)).
    - The keys are the module's own results of the same name, except where said below.
  returned: success
  type: dict
  contains:
    models:
      description: Model ids the API listed.
      returned: when O(mode=wait)
      type: list
      elements: str
    model:
      description: Model name used.
      returned: when O(mode=smoke) or O(mode=decode) or O(mode=bench)
      type: str
    question:
      description: The question asked.
      returned: when O(mode=smoke)
      type: str
    expected:
      description: The string the answer must contain.
      returned: when O(mode=smoke)
      type: str
    answer:
      description: The answer (first 500 characters).
      returned: when O(mode=smoke)
      type: str
    passed:
      description:
        - The row's verdict. V(smoke) - the answer contains the expected string.
        - V(decode) - tok/s reached O(floor); V(bench) - items passed reached O(floor) (RV(passed_floor)).
      returned: when O(mode=smoke); when O(mode=decode) or O(mode=bench) and O(floor) is set
      type: bool
    duration_s:
      description: Seconds the probe's requests took.
      returned: when O(mode=smoke) or O(mode=decode) or O(mode=bench)
      type: float
    tokens:
      description: Tokens generated.
      returned: when O(mode=decode)
      type: int
    token_source:
      description: Where RV(tokens) came from.
      returned: when O(mode=decode)
      type: str
    prompt_tokens:
      description: Prompt tokens as the server counted them, or null.
      returned: when O(mode=decode)
      type: int
    ttft_s:
      description: Seconds to the first token.
      returned: when O(mode=decode)
      type: float
    decode_s:
      description: Seconds from the first to the last token.
      returned: when O(mode=decode)
      type: float
    decode_tok_s:
      description: Decode tok/s.
      returned: when O(mode=decode)
      type: float
    finish_reason:
      description: The stream's finish reason.
      returned: when O(mode=decode)
      type: str
    max_tokens:
      description: Tokens asked for.
      returned: when O(mode=decode)
      type: int
    floor:
      description: O(floor) - a float for V(decode), an int when whole for V(bench).
      returned: when O(mode=decode) or O(mode=bench) and O(floor) is set
      type: raw
    total_items:
      description: Number of bench items (RV(total_items)).
      returned: when O(mode=bench)
      type: int
    passed_items:
      description: Number of bench items passed (RV(passed_items)).
      returned: when O(mode=bench)
      type: int
    failed_items:
      description: The failed bench items (RV(failed_items)), C({line, expected, answer}).
      returned: when O(mode=bench)
      type: list
      elements: dict
  sample: {model: ds41, tokens: 400, token_source: usage, prompt_tokens: 487, ttft_s: 1.92, decode_s: 11.4,
           decode_tok_s: 35.0, duration_s: 13.4, finish_reason: length, max_tokens: 400, floor: 30.78,
           passed: true}
passed_floor:
  description: The result reached O(floor) - decode tok/s >= O(floor), or bench items passed >= O(floor).
  returned: success when O(mode=decode) or O(mode=bench) and O(floor) is set
  type: bool
ready:
  description: The API listed its models.
  returned: success when O(mode=wait)
  type: bool
running:
  description: False when O(container) was found not running (stop waiting), else true.
  returned: success when O(mode=wait)
  type: bool
status:
  description: V(ready), or the last poll's error.
  returned: success when O(mode=wait)
  type: str
models:
  description: Model ids the API listed (empty until it is ready).
  returned: success when O(mode=wait)
  type: list
  elements: str
  sample: [coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw]
polls:
  description: Requests made in this call.
  returned: success when O(mode=wait)
  type: int
logs:
  description: Last lines of the container's log when it is not running, else empty.
  returned: success when O(mode=wait)
  type: str
elapsed_s:
  description: Seconds polled in this call.
  returned: success when O(mode=wait)
  type: float
msg:
  description:
    - V(wait) - one line, the models served or why the API is not ready.
    - On failure, what could not be reached or what the API answered.
  returned: success when O(mode=wait); failure
  type: str
  sample: "API ready: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw"
question:
  description: The question asked.
  returned: success when O(mode=smoke)
  type: str
expected:
  description: The string the answer must contain.
  returned: success when O(mode=smoke)
  type: str
answer:
  description: The answer text (reasoning then content, first 500 characters).
  returned: success when O(mode=smoke)
  type: str
passed:
  description: The answer contains O(expected).
  returned: success when O(mode=smoke)
  type: bool
tokens:
  description: Tokens generated - the server's C(usage.completion_tokens), else token-bearing chunks.
  returned: success when O(mode=decode)
  type: int
  sample: 400
token_source:
  description: Where RV(tokens) came from - V(usage) or V(chunks).
  returned: success when O(mode=decode)
  type: str
chunks:
  description: Token-bearing chunks streamed (fewer than RV(tokens) with speculative decoding).
  returned: success when O(mode=decode)
  type: int
prompt_tokens:
  description: Prompt tokens as the server counted them, or null when it sent no usage.
  returned: success when O(mode=decode)
  type: int
  sample: 487
ttft_s:
  description: Seconds from sending the request to the first token (prefill).
  returned: success when O(mode=decode)
  type: float
decode_s:
  description: Seconds from the first to the last token-bearing chunk.
  returned: success when O(mode=decode)
  type: float
decode_tok_s:
  description: (tokens - 1) / (t_last - t_first).
  returned: success when O(mode=decode)
  type: float
  sample: 35.0
finish_reason:
  description: The stream's finish reason (V(length) when O(max_tokens) was reached), or null.
  returned: success when O(mode=decode)
  type: str
max_tokens:
  description: Tokens asked for.
  returned: success when O(mode=decode)
  type: int
prompt_chars:
  description: Characters of the prompt streamed.
  returned: success when O(mode=decode)
  type: int
done:
  description: "The stream ended with C(data: [DONE])."
  returned: success when O(mode=decode)
  type: bool
total_items:
  description: Number of bench items.
  returned: success when O(mode=bench)
  type: int
  sample: 176
passed_items:
  description: Number of bench items whose answer contains their expected string.
  returned: success when O(mode=bench)
  type: int
  sample: 170
failed_items:
  description: The bench items that did not pass.
  returned: success when O(mode=bench)
  type: list
  elements: dict
  contains:
    line:
      description: Line number in O(bench_jsonl).
      type: int
    expected:
      description: The string the answer had to contain.
      type: str
    answer:
      description: The answer (first 300 characters).
      type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_probe

ARGUMENT_SPEC = dict(
    mode=dict(type="str", required=True, choices=list(dgx_probe.MODES)),
    url=dict(type="str", required=True),
    model=dict(type="str"),
    timeout=dict(type="float", default=300.0),
    wait_for=dict(type="float", default=10.0),
    container=dict(type="str"),
    runtime=dict(type="str", choices=["docker", "podman"], default="docker"),
    question=dict(type="str", default=dgx_probe.SMOKE_QUESTION),
    expected=dict(type="str", default=dgx_probe.SMOKE_EXPECTED),
    prompt=dict(type="str"),
    max_tokens=dict(type="int"),
    bench_jsonl=dict(type="str"),
    floor=dict(type="float"),
)
REQUIRED_IF = [("mode", "bench", ["bench_jsonl"])]


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True)
    try:
        result = dgx_probe.run_probe(module.params, runner=module)
    except StageError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
