"""``python -m readyq`` runs the ``readyq`` command."""

from .cli import main

raise SystemExit(main())
