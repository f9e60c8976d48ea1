"""The pages of the API reference (``docs/api``) and the modules they render."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .paths import REPO

API_PAGES = REPO / "docs" / "api"
"""The API reference's pages: one ``::: dotted.name`` line per module or object shown."""


def rendered_modules(pages: Path = API_PAGES) -> list[str]:
    """The modules whose names the API reference's pages render: each ``::: module``,
    and the module of each ``::: module.NAME`` (the ``cairn`` page renders its names
    one by one, grouped by role), once each."""
    modules: list[str] = []
    for page in sorted(pages.glob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith("::: "):
                dotted = line.removeprefix("::: ").strip()
                module = dotted if _is_module(dotted) else dotted.rpartition(".")[0]
                if module not in modules:
                    modules.append(module)
    return modules


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:
        return False
