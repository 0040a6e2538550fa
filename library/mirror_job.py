#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: mirror_job
short_description: Watch a background hf_hub_mirror job - ready its jobs dir, poll its progress, return its result
version_added: "1.0.0"
description:
  - Watches the stage role's async M(hf_hub_mirror) jobs (C(async), C(poll=0)) in three steps, O(mode).
  - V(prepare) creates the jobs dir O(async_dir) (a symlink, or a place inside O(dest) not under its C(.locks), is
    refused) and, inside O(dest), removes the files ended jobs left (job files and leases older than
    O(async_timeout)).
  - V(poll), under C(until), reads the job and the repo's progress file and returns RV(progress), RV(finished) and
    RV(line).
  - V(result), once the job ended, returns the job's own M(hf_hub_mirror) result (a failed job fails the task with
    its message) with RV(progress), RV(finished) and RV(line), and removes the job's file and lease.
author: dgx-stage maintainers
options:
  mode:
    description: The step - V(prepare) the jobs dir, V(poll) a job, or read its V(result).
    type: str
    choices: [prepare, poll, result]
    default: poll
  async_dir: {description: The async task's jobs dir (its C(ansible_async_dir))., type: path, required: true}
  dest: {description: The local hub root (M(hf_hub_mirror)'s C(dest))., type: path, required: true}
  jid: {description: The job id (the async task's C(ansible_job_id)). Required unless O(mode=prepare)., type: str}
  repo_id: {description: "The job's repo id, C(org/name). Required unless O(mode=prepare).", type: str}
  repo_type: {description: Kind of repo., type: str, choices: [model, dataset, space], default: model}
  phase:
    description: The pass the job runs (M(hf_hub_mirror)'s C(phase)), whose figures are read.
    type: str
    choices: [stage, verify]
    default: stage
  first_wait:
    description: O(mode=poll) - while the job is younger than this many seconds, wait for it to end before answering.
    type: float
    default: 0
  async_timeout:
    description: The jobs' async time limit in seconds (their files' age when stale).
    type: int
    default: 86400
  lease_file:
    description:
      - The job's lease (M(hf_hub_mirror)'s C(lease_file)); O(mode=poll) renews it, O(mode=result) removes it. A job
        whose process is gone without a result ends failed.
    type: path
extends_documentation_fragment:
  - dgx_node
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: O(mode=prepare) says what it would create and remove; O(mode=result) leaves the job file; polls only read.
  diff_mode:
    support: full
    details: O(mode=result) returns the job's own diff (hf_hub_mirror's, when its task ran in diff mode).
  idempotent:
    details: Polls change nothing; O(mode=prepare) reports creating or clearing the jobs dir; O(mode=result) the
      job's C(changed).
"""

EXAMPLES = r"""
- name: Stage one repo in the background
  hf_hub_mirror:
    src: /mnt/nas/hf/hub
    dest: /raid/hf-local/hub
    repo_id: coolbho3k/DSpark-drafter
  async: 86400
  poll: 0
  vars:
    ansible_async_dir: /raid/hf-local/hub/.locks/dgx-stage-async
  register: job

- name: Poll it every 5 seconds until it ended
  mirror_job:
    dest: /raid/hf-local/hub
    async_dir: /raid/hf-local/hub/.locks/dgx-stage-async
    jid: "{{ job.ansible_job_id }}"
    repo_id: coolbho3k/DSpark-drafter
  register: watched
  until: watched.finished
  retries: 17280
  delay: 5
"""

RETURN = r"""
progress:
  description: The job's figures from the progress file; null or 0 until the job wrote its first.
  returned: &watched success when O(mode=poll) or O(mode=result); failure when O(mode=result)
  type: dict
  contains:
    repo_id: {description: O(repo_id)., type: str}
    pass: {description: O(phase)., type: str}
    step: {description: "V(planning), V(hashing) (content checks), V(copying) or V(done).", type: str}
    current: {description: The snapshot path in hand (null between files)., type: str}
    files_done: {description: Files whose work this pass is over., type: int}
    files_total: {description: Files this pass works on., type: int}
    bytes_done: {description: Bytes read so far (copies and content checks)., type: int}
    bytes_total: {description: Bytes to read., type: int}
    percent: {description: RV(progress.bytes_done) of RV(progress.bytes_total) (100 only once finished)., type: float}
    mib_per_s: {description: Mean rate so far in MiB/s (null until known)., type: float}
    eta_s: {description: Seconds left at that rate (null until known)., type: float}
    status: {description: "V(running), V(ok), V(failed) or V(interrupted); null before the first figures.", type: str}
    finished: {description: The pass ended well., type: bool}
    aborted: {description: "The pass stopped on an error, Ctrl-C or SIGTERM.", type: bool}
    error: {description: Why it stopped., type: str}
    started_at: {description: When the pass started (ISO 8601 UTC)., type: str}
    updated_at: {description: When the figures were written (ISO 8601 UTC)., type: str}
    waiting:
      description: The other dgx-stage run whose repo lock the job waits for, else null.
      type: dict
      contains:
        pid: {description: The holder's process id., type: int}
        run_id: {description: The holder's lane run id (null when it did not say)., type: str}
        since: {description: When it took the lock (ISO 8601 UTC)., type: str}
    max_mib_s:
      description: "The job's read cap in MiB/s (M(hf_hub_mirror)'s O(hf_hub_mirror#module:max_mib_s)); 0 - none."
      type: int
finished: {description: The job ended., returned: *watched, type: bool}
line:
  description: One line for the operator - the figures; before them V(starting) or the lock it waits for; at the end
    V(done) or V(failed) with the message.
  returned: *watched
  type: str
  sample: "stage org/x: 12.3 GiB of 300.0 GiB (4%), 3/14 files, 812 MiB/s, ETA 6m12s, current: model-00003.safetensors"
jid: {description: O(jid)., returned: success when O(mode=poll), type: str}
async_dir: {description: "The jobs dir, absolute.", returned: success when O(mode=prepare), type: str}
created: {description: The jobs dir was (would be) created., returned: success when O(mode=prepare), type: bool}
removed:
  description: Files of ended jobs removed from the jobs dir (in check mode, that would be).
  returned: success when O(mode=prepare)
  type: list
  elements: str
msg: {description: "What failed; with O(mode=result), the job's own message.", returned: failure, type: str}
"""

import json
import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_jobs import prepare_jobs_dir, prune_jobs_dir, remove_job
from ansible.module_utils.dgx_lease import end_lease, renew_lease
from ansible.module_utils.dgx_mirror_result import unfinished_report
from ansible.module_utils.dgx_job_poll import poll


ARGUMENT_SPEC = dict(
    mode=dict(type="str", default="poll", choices=["prepare", "poll", "result"]),
    async_dir=dict(type="path", required=True),
    dest=dict(type="path", required=True),
    jid=dict(type="str"),
    repo_id=dict(type="str"),
    repo_type=dict(type="str", default="model", choices=["model", "dataset", "space"]),
    phase=dict(type="str", default="stage", choices=["stage", "verify"]),
    first_wait=dict(type="float", default=0),
    async_timeout=dict(type="int", default=86400),
    lease_file=dict(type="path"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           required_if=[("mode", "poll", ["jid", "repo_id"]), ("mode", "result", ["jid", "repo_id"])])
    params = module.params
    if params["mode"] == "prepare":
        try:
            done = prepare_jobs_dir(params["dest"], params["async_dir"], params["async_timeout"],
                                    check_mode=module.check_mode)
        except (StageError, OSError) as exc:
            module.fail_json(msg="mirror_job: %s" % exc)
        module.exit_json(changed=bool(done["created"] or done["removed"]),
                         async_dir=os.path.abspath(params["async_dir"]), **done)
    try:
        if params["lease_file"] and params["mode"] == "poll" and not module.check_mode:
            try:
                renew_lease(params["dest"], params["lease_file"])
            except StageError as exc:
                raise StageError("the lease %s is not renewed: %s" % (params["lease_file"], exc))
        seen = poll(params["async_dir"], params["jid"], params["dest"], params["repo_id"], params["repo_type"],
                    params["phase"], first_wait=params["first_wait"] if params["mode"] == "poll" else 0,
                    async_timeout=params["async_timeout"], lease_file=params["lease_file"])
    except (StageError, OSError) as exc:
        module.fail_json(msg="mirror_job: %s" % exc)
    if params["mode"] == "poll":
        module.exit_json(changed=False, jid=params["jid"], finished=seen["finished"], progress=seen["progress"],
                         line=seen["line"])
    if not seen["finished"]:
        module.fail_json(msg="mirror_job: job %s of %s is still running: poll it until it finished first"
                         % (params["jid"], params["repo_id"]), finished=False, progress=seen["progress"],
                         line=seen["line"])
    result = dict(seen["job"]["result"], finished=True, progress=seen["progress"], line=seen["line"])
    if result.get("failed") and not isinstance(result.get("report"), dict):
        result["report"] = unfinished_report(params["repo_id"], params["repo_type"], phase=params["phase"],
                                             check_mode=module.check_mode)
    for key in ("ansible_job_id", "started", "results_file"):   # the wrapper's keys, not the mirror's
        result.pop(key, None)
    if not module.check_mode:
        try:
            remove_job(params["dest"], params["async_dir"], params["jid"])
            if params["lease_file"]:
                end_lease(params["dest"], params["lease_file"])
        except (StageError, OSError) as exc:
            result.setdefault("warnings", []).append(
                "mirror_job: the job's files were left in %s: %s" % (params["async_dir"], exc))
        prune_jobs_dir(params["dest"], params["async_dir"])
    # The job's own result as it wrote it (its warnings, diff and changed untouched), as async_status does.
    print("\n%s" % json.dumps(result))
    sys.exit(0)


if __name__ == "__main__":
    main()
