"""`python -m dgx_stage` runs the front end (what scripts/demo.py uses: the work tree's own copy)."""
import sys

from dgx_stage.cli import main

sys.exit(main())
