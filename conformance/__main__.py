"""``python -m readyq_conformance --url URL``: the same as ``readyq conformance``."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
