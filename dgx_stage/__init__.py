"""dgx-stage: the operator front end of the dgx-stage playbooks (ansible-runner, rich)."""
import os
import sys

__version__ = "0.13.0"

# The repo the package lives in: its playbooks, ansible.cfg, callback plugins and modules.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_module_utils():
    """Make module_utils importable as the modules name it; Ansible's configured path first, so it is one code."""
    import ansible.module_utils
    config = sys.modules.get("ansible.constants")
    for path in list(getattr(config, "DEFAULT_MODULE_UTILS_PATH", None) or []) + [os.path.join(REPO, "module_utils")]:
        if path not in ansible.module_utils.__path__:
            ansible.module_utils.__path__.append(path)


# The subcommands that run a playbook: (playbook, its --tags, help).
PLAYBOOK = "stage-deepseek.yml"
SUBCOMMANDS = {
    "stage": (PLAYBOOK, "preflight,stage,verify,manifest", "stage every repo, verify it, write the mount manifest"),
    "verify": (PLAYBOOK, "verify", "verify the staged repos (e.g. -e stage_verify=full)"),
    "clean-receipts": (PLAYBOOK, "receipts", "clear the engine's stale receipt roots"),
    "serve": (PLAYBOOK, "preflight,receipts,manifest,engine,smoke", "start the engine lane and smoke-test it"),
    "status": (os.path.join("playbooks", "status.yml"), None, "what each host holds (changes nothing)"),
}

# Exit codes: all ok; ansible-playbook failed with no host result; a host failed or unreachable; usage; interrupted.
EXIT_OK, EXIT_ANSIBLE, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 64, 99


class UsageError(Exception):
    """Bad arguments: the front end exits 64 naming them."""
