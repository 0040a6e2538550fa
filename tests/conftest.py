"""Shared pytest set-up: tools/ (the synthetic hub generator) and tests/ (the helpers every suite
shares) importable, and the repo's module_utils under the names the modules import them by."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(REPO_ROOT, "tools"), os.path.join(REPO_ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from project import use_module_utils  # noqa: E402

use_module_utils()
