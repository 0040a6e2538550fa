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
  - Writes C(<dir>/dgx_stage.prom) for node_exporter's textfile collector from the host's latest report view,
    atomically, mode 0644; the file itself is never written through a link.
  - Gauges - C(dgx_stage_last_run_success), C(dgx_stage_last_success_timestamp_seconds) (kept from the previous
    file when the run failed), C(dgx_stage_repo_staged_bytes{repo,repo_type,commit}),
    C(dgx_stage_last_verify_timestamp_seconds{repo,mode}) (kept while the repo is staged),
    C(dgx_stage_blobs_repaired), C(dgx_stage_nas_corrupt_blobs), C(dgx_stage_decode_tokens_per_second).
  - The first line names the host; another host's file in O(dir) (a shared directory) is refused, not overwritten.
author: dgx-stage maintainers
options:
  dir:
    description: The textfile collector's existing, writable directory (C(stage_metrics_dir)).
    type: path
    required: true
  report: {description: The host's latest report view (C(host_report)'s RV(latest))., type: dict, required: true}
extends_documentation_fragment:
  - dgx_node
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    details: Renders the file and writes nothing; RV(content) is what would be written.
  diff_mode:
    support: full
    details: The old and the new file.
  idempotent:
    support: partial
    details: A file whose only difference is the run's timestamps is rewritten (for freshness alerts) but not a change.
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
content: {description: "The file's content, as written (in check mode, would be).", returned: success, type: str}
change:
  description: V(none) (not rewritten), V(timestamps) (only the run's timestamps moved) or V(content).
  returned: success
  type: str
written: {description: The file was written in this call., returned: success, type: bool}
debris:
  description: Temp files of dgx_stage.prom a killed run left in O(dir), removed (in check mode, would be).
  returned: success
  type: list
  elements: str
diff:
  description: The old and the new content.
  returned: success when in diff mode
  type: dict
  contains:
    before: {description: The previous file ('' when there was none)., type: str}
    after: {description: RV(content)., type: str}
    before_header: {description: The file., type: str}
    after_header: {description: The file., type: str}
msg: {description: "Why nothing could be written (the directory, and the fix).", returned: failure, type: str}
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
