"""What every dgx-stage module's documentation shares: it runs on the node and supports check mode."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
  idempotent:
    description: A second run with the same options and the same state reports C(changed=false).
    support: full
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the node with the system Python; stdlib only.
"""

    # The modules that only read.
    READ_ONLY = r"""
attributes:
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
  idempotent:
    details: The module never writes.
"""
