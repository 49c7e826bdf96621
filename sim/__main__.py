"""``python -m readyq_sim``: the simulator's command line (``readyq sim``)."""

import sys

from .cli import main

sys.exit(main())
