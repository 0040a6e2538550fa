"""dgx-stage: the operator front end of the dgx-stage playbooks (ansible-runner, rich)."""
import os

__version__ = "0.13.0"

# The repo the package lives in: its playbooks, ansible.cfg, callback plugins and modules.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_module_utils():
    """Make the repo's module_utils importable as `ansible.module_utils.dgx_*`, the names the modules use
    (Ansible adds that folder for modules only)."""
    import ansible.module_utils
    path = os.path.join(REPO, "module_utils")
    if path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(path)


class UsageError(Exception):
    """Bad arguments: the front end exits 64 naming them."""
