"""``python -m cairn.cli``: the same as the ``cairn`` script."""

from cairn.cli import main

raise SystemExit(main())
