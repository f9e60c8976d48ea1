"""``python -m cairn``: the ``cairn`` command, for when the script is not on ``PATH``."""

from cairn.cli import main

raise SystemExit(main())
