"""``python -m readyq_sim``: the simulator's command line (``readyq sim``)."""

import sys

from .cli import main

if __name__ == "__main__":  # spawned stress children import this module too
    sys.exit(main())
