"""Where the project is, and its module_utils for code that runs outside Ansible.

The modules import ``ansible.module_utils.dgx_*``, which Ansible resolves through ansible.cfg's
module_utils path. The tests, scripts/ and the Molecule checks call use_module_utils() to import
them under the same names (the ``ansible`` package must be importable: run them with the venv's
Python).

As a command it prints what callers outside Python need:

    python tools/project.py receipt-roots    the engine's receipt root names, comma-separated
"""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(REPO_ROOT, "module_utils")


def use_module_utils():
    """Make `ansible.module_utils.dgx_*` importable from the repo's module_utils/ (idempotent)."""
    import ansible.module_utils
    if MODULE_UTILS not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(MODULE_UTILS)


def receipt_roots():
    """The engine's receipt root names, from their one home in dgx_receipts."""
    use_module_utils()
    from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS
    return list(RECEIPT_ROOTS)


def main(argv):
    if argv == ["receipt-roots"]:
        print(",".join(receipt_roots()))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
