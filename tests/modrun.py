"""A module of library/ run in-process: its main() with module args, as Ansible would hand them over.

One runner for every suite. The args go through patch_module_args (Ansible's own controller-to-module
encoding), the result is main()'s stdout parsed as JSON (what exit_json/fail_json serialise), so a test
sees exactly the result a playbook would register, without the cost of an `ansible` process per run.
"""
import contextlib
import importlib.util
import io
import json
import os
import signal
from unittest import mock

import pytest

from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.path.join(REPO_ROOT, "library")


def load(name):
    """library/<name>.py as a fresh Python module (its own globals, so a test may patch them)."""
    spec = importlib.util.spec_from_file_location("dgx_module_" + name, os.path.join(LIBRARY, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(name, args, check_mode=False, diff=False):
    """main() of library/<name>.py in-process with these module args: its JSON result.

    check_mode / diff are Ansible's --check / --diff (the `_ansible_check_mode` / `_ansible_diff` args the
    controller adds). Also proves main() passes ARGUMENT_SPEC itself to AnsibleModule, so test_module_docs'
    options check covers what runs."""
    args = dict(args)
    if check_mode:
        args["_ansible_check_mode"] = True
    if diff:
        args["_ansible_diff"] = True
    module = load(name)
    seen = {}
    real = module.AnsibleModule

    class Recording(real):
        def __init__(self, *a, **kw):
            seen.update(kw)
            real.__init__(self, *a, **kw)

    module.AnsibleModule = Recording
    out = io.StringIO()
    sigterm = signal.getsignal(signal.SIGTERM)   # hf_hub_mirror turns SIGTERM into an interrupt
    # Module warnings are process-global: keep each run's to itself (and out of later tests' results).
    try:
        with patch_module_args(args), contextlib.redirect_stdout(out), \
                mock.patch.dict(ansible_warnings._global_warnings, clear=True), \
                mock.patch.dict(ansible_warnings._global_deprecations, clear=True):
            with pytest.raises(SystemExit):
                module.main()
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert seen["argument_spec"] is module.ARGUMENT_SPEC, "%s main() must use ARGUMENT_SPEC" % name
    return json.loads(out.getvalue())
