# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_report on the controller, in the process that runs the task (library/host_report.py documents it).

The reports are files of the controller, written once per host at the end of every play: a module process
for each (a Python start and Ansible's module_utils import, about a third of a second) costs more than the
report itself. The options are validated against the module's own ARGUMENT_SPEC and written by the same
function as the module's main() (module_utils/dgx_report.py), so both give the same result.
"""
from __future__ import annotations

import os

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
import ansible.module_utils

# The project's module_utils, beside its roles: where Ansible also finds them for the modules when ansible.cfg
# names no module_utils path (it looks beside the playbook).
PROJECT_MODULE_UTILS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "module_utils")


def report_functions():
    """(ARGUMENT_SPEC, REQUIRED_IF, write_host_report, StageError) of module_utils/dgx_report.py, importable here
    from Ansible's module_utils path (ansible.cfg's module_utils, ANSIBLE_MODULE_UTILS) or the project's own."""
    for path in list(C.config.get_config_value("DEFAULT_MODULE_UTILS_PATH") or []) + [
            os.path.normpath(PROJECT_MODULE_UTILS)]:
        if path not in ansible.module_utils.__path__:
            ansible.module_utils.__path__.append(path)
    try:
        from ansible.module_utils.dgx_errors import StageError
        from ansible.module_utils.dgx_report import ARGUMENT_SPEC, REQUIRED_IF, write_host_report
    except ImportError as exc:
        raise AnsibleActionFail("host_report cannot import the project's module_utils (%s): run from the repo root "
                                "(ansible.cfg sets module_utils = ./module_utils) or set ANSIBLE_MODULE_UTILS to "
                                "the repo's module_utils/ directory" % exc)
    return ARGUMENT_SPEC, REQUIRED_IF, write_host_report, StageError


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        argument_spec, required_if, write_host_report, stage_error = report_functions()
        _, options = self.validate_argument_spec(argument_spec=argument_spec, required_if=required_if)
        try:
            written = write_host_report(options, bool(self._task.check_mode))
        except stage_error as exc:
            raise AnsibleActionFail(str(exc))
        result.update(written)
        # As a module's result has it (the lane summary reads which host a report is of from here), without the
        # failed task's whole result: it may hold what that task kept out of the output (no_log); the report
        # itself keeps only its message.
        result["invocation"] = {"module_args": dict((key, value) for key, value in options.items()
                                                    if key != "failed_result")}
        return result
