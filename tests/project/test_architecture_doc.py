"""ARCHITECTURE.md's table "Where each invariant lives" names, for every invariant, the
test modules that check it, and each of them exists."""

from __future__ import annotations

import re

from support.paths import REPO

SECTION = "## Where each invariant lives"
TEST_MODULE = re.compile(r"^tests/[a-z_]+/test_[a-z0-9_]+\.py$")


def invariant_rows() -> list[dict[str, str]]:
    """The table's rows, each a mapping of its header's names to its cells."""
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert SECTION in text, f"ARCHITECTURE.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header, _rule, *body = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines)
    return [dict(zip(header, row, strict=True)) for row in body]


def test_every_invariant_names_test_modules_that_exist() -> None:
    rows = invariant_rows()
    assert len(rows) >= 20, "the table of invariants lost its rows"
    for row in rows:
        named = re.findall(r"`([^`]*)`", row["tested by"])
        assert named, f"no test module named for: {row['invariant']}"
        for path in named:
            assert TEST_MODULE.match(path), f"{path!r} is not a test module's path"
            assert (REPO / path).is_file(), f"{path} (for: {row['invariant']}) does not exist"


def test_every_invariant_names_modules_that_exist() -> None:
    """Module names are paths under src/cairn (not the deprecated aliases of moved modules)."""
    source = REPO / "src" / "cairn"
    for row in invariant_rows():
        named = re.findall(r"`([^`]*)`", row["module"])
        assert named, f"no module named for: {row['invariant']}"
        for name in named:
            path = source.joinpath(*name.split("."))
            exists = path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
            assert exists, f"module {name!r} (for: {row['invariant']}) is not under src/cairn"
