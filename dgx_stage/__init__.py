"""dgx-stage: the operator front end of the dgx-stage playbooks (ansible-runner, rich)."""
import os

__version__ = "0.13.0"

# The repo the package lives in: its playbooks, ansible.cfg, callback plugins and modules.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class UsageError(Exception):
    """Bad arguments: the front end exits 64 naming them."""
