# -*- coding: utf-8 -*-
# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_report on the controller, in the process that runs the task (library/host_report.py documents it).

The reports are files of the controller, written once per host at the end of every play: a module process
for each (a Python start and Ansible's module_utils import, about a third of a second) costs more than the
report itself. The options are validated against the module's own ARGUMENT_SPEC and written by the same
function as the module's main() (module_utils/dgx_report.py), so both give the same result.
"""
from __future__ import annotations

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
import ansible.module_utils


def _use_module_utils():
    """Make the project's module_utils (ansible.cfg's module_utils path) importable here, as Ansible makes
    them importable by the modules it sends."""
    for path in C.config.get_config_value("DEFAULT_MODULE_UTILS_PATH") or []:
        if path not in ansible.module_utils.__path__:
            ansible.module_utils.__path__.append(path)


_use_module_utils()

from ansible.module_utils.dgx_errors import StageError  # noqa: E402  (after the path above)
from ansible.module_utils.dgx_report import ARGUMENT_SPEC, REQUIRED_IF, write_host_report  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        _, options = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF)
        try:
            written = write_host_report(options, bool(self._task.check_mode))
        except StageError as exc:
            raise AnsibleActionFail(str(exc))
        result.update(written)
        # As a module's result has it: the lane summary reads which host a report is of from here.
        result["invocation"] = {"module_args": options}
        return result
