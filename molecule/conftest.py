"""pytest set-up for every scenario's testinfra tests (base.yml sets rootdir to molecule/, so this
file applies to all of them): the shared checks in molecule/shared/ become importable."""
import os
import sys

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shared")
if SHARED not in sys.path:
    sys.path.insert(0, SHARED)
