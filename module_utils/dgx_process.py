# -*- coding: utf-8 -*-
"""Whether a process is still there, the one way the dgx-stage code asks.
Runs on the nodes' system Python: stdlib only, Python 3.8 syntax.
"""
from __future__ import absolute_import, division, print_function

import os


def process_alive(pid):
    """Whether process `pid` exists: one of another user's (EPERM) counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
