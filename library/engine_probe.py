#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: engine_probe
short_description: Probe the engine's OpenAI-style API - readiness, smoke test, decode speed, quality bench
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
    answer contains its C(expected) string.
  - Never fails on a threshold (the role compares with C(engine_decode_floor) and
    C(engine_bench_floor) after writing the host report); fails when the API cannot be reached or
    answers nonsense.
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
    description: V(bench) only. JSONL text, one C({"prompt", "expected"}) object a line.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Read-only requests; behaves the same in check mode.
  diff_mode:
    support: none
  idempotent:
    description: Only reads from the engine's API; it never changes the engine.
    support: full
  platform:
    support: full
    platforms: posix
author: dgx-stage
"""

EXAMPLES = r"""
- name: Decode probe on rank 0
  engine_probe:
    mode: decode
    url: http://dgx1:8000
    max_tokens: 400
  register: engine_decode
"""

RETURN = r"""
model:
  description: Model name used (V(smoke), V(decode), V(bench)).
  returned: success and mode != wait
  type: str
  sample: coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw
ready:
  description: V(wait) - the API listed its models.
  returned: mode == wait
  type: bool
running:
  description: V(wait) - false when O(container) was found not running (stop waiting), else true.
  returned: mode == wait
  type: bool
status:
  description: V(wait) - V(ready), or the last poll's error.
  returned: mode == wait
  type: str
logs:
  description: V(wait) - last lines of the container's log when it is not running.
  returned: mode == wait
  type: str
elapsed_s:
  description: V(wait) - seconds polled in this call.
  returned: mode == wait
  type: float
passed:
  description: V(smoke) - the answer contains O(expected); V(bench) - number of items passed.
  returned: mode in (smoke, bench)
  type: raw
answer:
  description: V(smoke) - the answer text (first 500 characters).
  returned: mode == smoke
  type: str
decode_tok_s:
  description: V(decode) - (tokens - 1) / (t_last - t_first).
  returned: mode == decode
  type: float
  sample: 35.0
tokens:
  description: V(decode) - tokens generated.
  returned: mode == decode
  type: int
ttft_s:
  description: V(decode) - seconds from sending the request to the first token (prefill).
  returned: mode == decode
  type: float
total:
  description: V(bench) - number of items.
  returned: mode == bench
  type: int
failed:
  description: V(bench) - the failed items, C({line, expected, answer}).
  returned: mode == bench
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils import dgx_probe

DEFAULT_MAX_TOKENS = {"smoke": 256, "decode": 400, "bench": 512}


def container_state(module, runtime, name):
    """(running, log tail) of one container through the runtime CLI."""
    binary = module.get_bin_path(runtime)
    if not binary:
        return False, "%s not found on this host" % runtime
    rc, out, err = module.run_command([binary, "inspect", "--format", "{{.State.Running}}", name])
    if rc == 0 and out.strip().lower() == "true":
        return True, ""
    if rc != 0:
        return False, "container %s does not exist: %s" % (name, err.strip()[:300])
    rc, out, err = module.run_command([binary, "logs", "--tail", "30", name])
    return False, (out + err)[-4000:]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", required=True, choices=["wait", "smoke", "decode", "bench"]),
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
        ),
        required_if=[("mode", "bench", ["bench_jsonl"])],
        supports_check_mode=True,
    )
    p = module.params
    mode = p["mode"]
    max_tokens = p["max_tokens"] or DEFAULT_MAX_TOKENS.get(mode)
    try:
        if mode == "wait":
            logs = {"text": ""}

            def is_running():
                running, logs["text"] = container_state(module, p["runtime"], p["container"])
                return running

            result = dgx_probe.poll_ready(p["url"], p["wait_for"],
                                          is_running=is_running if p["container"] else None)
            result["logs"] = logs["text"]
            # false only when the container was seen not running: the until loop stops on it.
            result["running"] = result["running"] is not False
            result["msg"] = ("API ready: %s" % ", ".join(result["models"]) if result["ready"] else
                             "API not ready after %.0f s: %s" % (result["elapsed_s"], result["status"]))
            module.exit_json(changed=False, **result)
        items = dgx_probe.parse_bench_jsonl(p["bench_jsonl"]) if mode == "bench" else None
        model = dgx_probe.resolve_model(p["url"], p["model"], timeout=min(p["timeout"], 30.0))
        if mode == "smoke":
            result = dgx_probe.smoke(p["url"], model, p["question"], p["expected"], max_tokens, p["timeout"])
        elif mode == "decode":
            result = dgx_probe.decode_probe(p["url"], model, p["prompt"] or dgx_probe.DECODE_PROMPT,
                                            max_tokens, p["timeout"])
        else:
            result = dgx_probe.bench(p["url"], model, items, max_tokens, p["timeout"])
    except StageError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, model=model, **result)


if __name__ == "__main__":
    main()
