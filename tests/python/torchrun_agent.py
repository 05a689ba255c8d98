#!/usr/bin/env python3
"""torchrun itself, for tests/tests/torchrun.rs: what the `torchrun` console
script runs (`torch.distributed.run.main`), as a script of tests/python so
the harness starts it with the torch venv's Python like any other.

    torchrun_agent.py TORCHRUN_ARGS...

Its workers (torchrun_worker.py) die with it (PR_SET_PDEATHSIG), so killing
this process ends the whole node.
"""

import sys
import warnings

# torch 2.15 warns at import when numpy is missing (the venv has none).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
