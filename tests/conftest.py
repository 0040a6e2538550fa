"""Shared pytest set-up: make the repo's module_utils importable the way modules import them."""
import os
import sys

import ansible.module_utils

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(REPO_ROOT, "module_utils")

# Modules import `ansible.module_utils.dgx_*`; ansible resolves that from ansible.cfg's
# module_utils path. Outside ansible, extending the package path gives the same import names.
if MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(MODULE_UTILS)
if os.path.join(REPO_ROOT, "tests") not in sys.path:
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
