#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: stage_metrics
short_description: Write the host's node_exporter textfile dgx_stage.prom from its report view
version_added: "1.0.0"
description:
  - Runs on the node at the end of a run (and from a failed play's rescue) with the host's latest report
    view (C(host_report)'s RV(latest)) and writes C(<dir>/dgx_stage.prom) for node_exporter's textfile
    collector - atomically (a temp file in O(dir), then a rename), mode 0644.
  - Gauges - C(dgx_stage_last_run_success) (1 ok, 0 failed), C(dgx_stage_last_success_timestamp_seconds)
    (kept from the previous file when the run failed), C(dgx_stage_repo_staged_bytes{repo,repo_type,commit}),
    C(dgx_stage_last_verify_timestamp_seconds{repo,mode}) (a repo whose verify did not end ok keeps its
    previous sample; one no longer in the view's stage and verify passes, dropped from stage_repos, loses it), C(dgx_stage_blobs_repaired) and C(dgx_stage_nas_corrupt_blobs) (the last stage and
    verify passes), C(dgx_stage_decode_tokens_per_second) (when a decode probe ran).
  - The file's first line is a comment naming the host (the report's C(host)). O(dir) is the node's own
    directory - a file of another host there (a directory shared between hosts, e.g. on NFS) is refused,
    naming both hosts, rather than overwritten (each host would take the other's last success as its own).
  - O(dir) must be an existing, writable directory; a symlink to one is followed (node_exporter setups link
    their textfile directory), the file itself never is (a link named C(dgx_stage.prom) is replaced, not
    written through).
author: dgx-stage maintainers
options:
  dir:
    description: The textfile collector's directory (C(stage_metrics_dir)).
    type: path
    required: true
  report:
    description: The host's latest report view (C(host_report)'s RV(latest)).
    type: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Renders the file and writes nothing; RV(content) is what would be written.
  diff_mode:
    support: full
    details: The old and the new file.
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: partial
    details: >-
      Identical content is not rewritten. A file whose only difference is the run's timestamps (a re-run that
      changed nothing on the node still succeeded, later) is rewritten, so freshness alerts see it, but
      reported C(changed=false): the node's state did not change (RV(change) says V(timestamps)).
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
"""

EXAMPLES = r"""
- name: Write the node_exporter textfile
  stage_metrics:
    dir: /var/lib/prometheus/node-exporter
    report: "{{ __report_end_host.latest }}"
  become: true
"""

RETURN = r"""
textfile:
  description: The textfile, C(<dir>/dgx_stage.prom).
  returned: success
  type: str
  sample: /var/lib/prometheus/node-exporter/dgx_stage.prom
content:
  description: The file's content as rendered (what was, or in check mode would be, written).
  returned: success
  type: str
change:
  description:
    - V(none) (the file already holds it; not rewritten), V(timestamps) (only the run's timestamps moved;
      rewritten, not a change) or V(content).
  returned: success
  type: str
written:
  description: The file was written in this call.
  returned: success
  type: bool
debris:
  description:
    - Temp files of dgx_stage.prom a killed run left in O(dir) (their writing process is gone) - removed
      in this call, or in check mode would be. Only this module's own temp names.
  returned: success
  type: list
  elements: str
diff:
  description: The old and the new content.
  returned: success when in diff mode
  type: dict
  contains:
    before:
      description: The previous file ('' when there was none).
      type: str
    after:
      description: RV(content).
      type: str
    before_header:
      description: The file.
      type: str
    after_header:
      description: The file.
      type: str
msg:
  description: Why nothing could be written (the directory, and the fix).
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_metrics import write_metrics

ARGUMENT_SPEC = dict(
    dir=dict(type="path", required=True),
    report=dict(type="dict", required=True),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = write_metrics(module.params["dir"], module.params["report"], write=not module.check_mode)
    except StageError as exc:
        module.fail_json(msg=str(exc))
    previous = result.pop("previous")
    # Not `path`: Ansible would add the file's attributes to the result.
    result["textfile"] = result.pop("path")
    if module._diff:
        result["diff"] = {"before": previous or "", "after": result["content"], "before_header": result["textfile"],
                          "after_header": result["textfile"]}
    module.exit_json(changed=result["change"] == "content" or bool(result["debris"]), **result)


if __name__ == "__main__":
    main()
