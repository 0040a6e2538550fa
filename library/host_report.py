#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: host_report
short_description: Write a host's JSON report of this run and update its latest view, on the controller
version_added: "1.0.0"
description:
  - Called at the end of every play of C(stage-deepseek.yml) (on failure too, from the play's rescue) with the
    run's identity, the play that ended and the host's results so far in this run; run it on the controller
    (C(delegate_to=localhost), C(check_mode=false)).
  - Writes C(<dir>/<host>-<run_id>.json), this run's view (only what this run did, play after play), and
    C(<dir>/<host>.json), the latest complete view (this run's identity and status over the last real
    results of every play; a play not run keeps its last values with its own run id and timestamps).
  - Status is V(failed) when a play of the run failed (with C(failed_play), C(failed_task), C(failed_msg)),
    else V(running) until the run's end is recorded (O(run_end=true), the playbook's last play), then V(check)
    for a C(--check) run, else V(ok). A run killed or interrupted before its end stays V(running), never
    V(ok); a host that did not reach the end (unreachable) is marked V(failed) then. A C(--check) run never replaces real results in the
    latest view; its plan is kept under C(check).
  - Both files are written atomically (temp file, fsync, rename); timestamps are ISO 8601 UTC.
author: dgx-stage maintainers
options:
  dir:
    description:
      - Controller directory of the reports; created when missing.
    type: path
    required: true
  host:
    description:
      - The host the report is about (its inventory name); names the files.
    type: str
    required: true
  run_id:
    description:
      - This run's id, the same for every host (made once per run in C(playbooks/select-lane.yml)),
        like C(20261130T204512Z-3fa2).
    type: str
    required: true
  run_started:
    description:
      - When this run started, ISO 8601 UTC (C(2026-11-30T20:45:12Z)).
    type: str
    required: true
  tags:
    description:
      - The tags the run was started with (C(ansible_run_tags)).
    type: list
    elements: str
    default: []
  skip_tags:
    description:
      - The tags the run skips (C(ansible_skip_tags)).
    type: list
    elements: str
    default: []
  check_run:
    description:
      - This run is a C(--check) run (C(ansible_check_mode)); its results are a plan, not real results.
    type: bool
    default: false
  play:
    description:
      - The play that just ended (its tag); with O(run_end=true), the last play the host started (it names
        the play a host that did not reach the end was lost in; omit it when the host started none).
      - Required unless O(run_end=true).
    type: str
    choices: [preflight, stage, verify, receipts, manifest, engine, smoke, bench]
  play_started:
    description:
      - When that play started, ISO 8601 UTC. Required unless O(run_end=true).
      - For the stage play, when this host's own stage work started (its wave, in a lane staged in waves).
    type: str
  play_finished:
    description:
      - When that play ended on this host, ISO 8601 UTC; omitted, now. The stage play passes when the host's own
        stage work ended (its wave), so the reports show when each host read the NAS.
    type: str
  run_end:
    description:
      - Record the end of the run instead of a play - the status becomes final (V(ok), V(check) or V(failed)).
    type: bool
    default: false
  reached_end:
    description:
      - With O(run_end=true) - the host was still in the run at its last play. V(false) for a host whose
        report names no failed play means it became unreachable (or the run stopped), a failure.
    type: bool
    default: true
  play_failed:
    description:
      - The play failed on this host (the report is written from the play's rescue).
    type: bool
    default: false
  failed_task:
    description:
      - The name of the task that failed (C(ansible_failed_task.name)), when O(play_failed=true).
    type: str
    default: ""
  failed_result:
    description:
      - Its result (C(ansible_failed_result)), when O(play_failed=true); the report keeps its message (for a
        loop, each failed item's label and message).
    type: dict
    default: {}
  passes:
    description:
      - Per pass (preflight, stage, verify), the per-repo rows hf_hub_mirror returned in this run (C(stage_passes)).
    type: dict
    default: {}
  weights:
    description:
      - Per repo, the safetensors_check row of this run's verify play (C(stage_header_checks)).
    type: list
    elements: dict
    default: []
  engine:
    description:
      - The engine role's results in this run (C(engine_report)); merged key by key into the latest view.
    type: dict
    default: {}
  lane:
    description:
      - The lane (inventory group) the run targets.
    type: str
  rank:
    description:
      - The host's rank in the lane.
    type: int
  world_size:
    description:
      - Hosts in the lane.
    type: int
  hub_nas_root:
    description:
      - The NAS hub cache root, as configured.
    type: str
  hub_local_root:
    description:
      - The node-local hub cache root, as configured.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: >-
      Computes both views and writes nothing. The plays run it with C(check_mode=false) and pass C(--check)
      as O(check_run).
  diff_mode:
    support: none
    details: The reports are artifacts of the controller; no diff is shown.
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: none
    details: Every call records a new finish time, so it always writes (the plays set C(changed_when=false)).
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the controller; stdlib only.
  - The reports of earlier runs (C(<host>-<run_id>.json)) are kept; C(make clean) removes the default C(reports/).
"""

EXAMPLES = r"""
- name: Write the host report of the stage play
  host_report:
    dir: "{{ playbook_dir }}/reports"
    host: "{{ inventory_hostname }}"
    run_id: "{{ lane_run_id }}"
    run_started: "{{ lane_run_started }}"
    tags: "{{ ansible_run_tags }}"
    check_run: "{{ ansible_check_mode }}"
    play: stage
    play_started: "{{ dgx_play_started }}"
    passes: "{{ stage_passes | default({}) }}"
    lane: "{{ lane_name }}"
    rank: "{{ lane_rank }}"
    world_size: "{{ lane_world_size }}"
  delegate_to: localhost
  become: false
  check_mode: false
  changed_when: false
"""

RETURN = r"""
report:
  description: This run's view of the host, as written to RV(history_path).
  returned: success
  type: dict
  contains: &view
    host:
      description: O(host).
      type: str
    run_id:
      description: O(run_id) (in the latest view, the last run, C(--check) runs included).
      type: str
    started:
      description: O(run_started).
      type: str
    finished:
      description: When the run ended for the host (its end, or the play that failed), ISO 8601 UTC; null while V(running).
      type: str
    status:
      description:
        - V(failed) when a play of the run failed or the host did not reach its end, else V(running) until the
          run's end is recorded, then V(check) for a C(--check) run, else V(ok).
      type: str
    check_mode:
      description: O(check_run).
      type: bool
    tags:
      description: O(tags), sorted.
      type: list
      elements: str
    skip_tags:
      description: O(skip_tags), sorted.
      type: list
      elements: str
    failed_play:
      description: The play that failed.
      returned: when the run failed
      type: str
    failed_task:
      description: The task that failed.
      returned: when the run failed
      type: str
    failed_msg:
      description: Its message (for a loop, each failed item's label and message).
      returned: when the run failed
      type: str
    lane:
      description: O(lane).
      type: str
    rank:
      description: O(rank).
      type: int
    world_size:
      description: O(world_size).
      type: int
    hub_nas_root:
      description: O(hub_nas_root).
      type: str
    hub_local_root:
      description: O(hub_local_root).
      type: str
    stage_started:
      description: When the stage play started, ISO 8601 UTC; null when it has not run.
      type: str
    stage_finished:
      description: When the stage play ended, ISO 8601 UTC; null when it has not run.
      type: str
    bytes_from_nas:
      description: Bytes the stage play copied from the NAS, all repos (0 in a C(--check) run).
      type: int
    bytes_from_peers:
      description: Bytes the stage play copied from other hosts of the lane, all repos.
      type: int
    plays:
      description:
        - Per play (its tag), how it went - C(run_id), C(started), C(finished), C(status), for the stage play
          C(bytes_from_nas) and C(bytes_from_peers), when failed C(failed_task) and C(failed_msg).
      type: dict
    passes:
      description: O(passes), per pass the per-repo hf_hub_mirror rows.
      type: dict
    weights:
      description: O(weights).
      type: list
      elements: dict
    engine:
      description: O(engine).
      type: dict
latest:
  description: The latest complete view, as written to RV(latest_path).
  returned: success
  type: dict
  contains:
    <<: *view
    nas_suspects:
      description:
        - Every NAS blob a real stage or verify pass found failing its name (its row's C(nas_corrupt_blobs)), by
          blob name - C(repo_id), C(repo_type), C(paths), C(nas_file), C(why), C(found_at), C(run_id), C(pass);
          the latest finding of a blob wins. A later pass never drops one (a green full verify reads no NAS
          byte); engine_manifest refuses to bind such a blob from the NAS until its NAS file hashes to its name.
      type: dict
    last_real_run:
      description:
        - The last run that was not a C(--check) run (C(run_id), C(started), C(finished), C(status), C(tags),
          and C(failed_*) when it failed); the real results come from it and the runs before it. Null before any.
      type: dict
    check:
      description:
        - The plan of the C(--check) run this view is from, shaped like a run's view (identity, C(status),
          C(plays), C(passes), C(weights), C(engine)); the real results above are left as they were.
      returned: when the run is a check run
      type: dict
history_path:
  description: The file of this run's view, C(<dir>/<host>-<run_id>.json).
  returned: success
  type: str
  sample: /srv/dgx-stage/reports/dgx1-20261130T204512Z-3fa2.json
latest_path:
  description: The file of the latest view, C(<dir>/<host>.json).
  returned: success
  type: str
  sample: /srv/dgx-stage/reports/dgx1.json
status:
  description: The run's status as reported (RV(report.status)).
  returned: success
  type: str
  sample: ok
msg:
  description: >-
    Why nothing was written (an input that cannot name a file or is not a timestamp, a directory that cannot
    be written).
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_report import ARGUMENT_SPEC, REQUIRED_IF, write_host_report


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True, required_if=REQUIRED_IF)
    try:
        result = write_host_report(module.params, module.check_mode)
    except StageError as exc:
        module.fail_json(msg=str(exc))
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
