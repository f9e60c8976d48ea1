"""One version story: ``cairn --version``, the package, the CHANGELOG and the storage
format's compatibility table agree.

The package is a development build of the next release (``0.2.0.dev0`` of 0.2.0) until
that release: the CHANGELOG's ``[Unreleased]`` section says which release it becomes
and which version the package reports meanwhile; the newest release under it is the one
the format's compatibility table compares with, and the one the table says comes first.
"""

from __future__ import annotations

import re
import tomllib

from support.cli import cairn as run_cairn
from support.paths import REPO

import cairn

CHANGELOG = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
FORMAT = (REPO / "docs" / "format.md").read_text(encoding="utf-8")
DEV = re.compile(r"(\d+\.\d+\.\d+)\.dev\d+")


def next_release() -> str:
    """The release the package is a development build of."""
    match = DEV.fullmatch(cairn.__version__)
    assert match is not None, f"{cairn.__version__} is not a development build"
    return match.group(1)


def released() -> list[str]:
    """The CHANGELOG's released versions, newest first."""
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\]", CHANGELOG, re.MULTILINE)


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(number) for number in version.split("."))


def test_the_command_prints_the_package_version() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == cairn.__version__
    run = run_cairn("--version")
    assert run.code == 0, run.explain()
    assert run.stdout.strip() == f"cairn {cairn.__version__}", run.explain()


def test_the_changelog_says_which_release_is_unreleased_and_what_the_package_reports() -> None:
    unreleased = CHANGELOG.split("## [Unreleased]", 1)[1].split("\n### ", 1)[0]
    prose = " ".join(unreleased.split())
    assert f"To be released as **{next_release()}**" in prose, prose
    assert f"`{cairn.__version__}`" in prose, prose
    newest, *older = released()
    assert as_tuple(newest) < as_tuple(next_release())
    assert older == sorted(older, key=as_tuple, reverse=True)


def test_the_format_compares_with_the_newest_release_and_names_the_next() -> None:
    newest = released()[0]
    compatibility = FORMAT.split("## Compatibility", 1)[1]
    assert f"| change | since | feature | what cairn {newest} does with it |" in compatibility
    prose = " ".join(compatibility.split())
    assert f"cairn {newest} is the first release; what follows it ships as {next_release()}." in (
        prose
    )
    since = set(re.findall(r"^\| [^|]+ \| (\d+\.\d+\.\d+) \|", compatibility, re.MULTILINE))
    assert since <= {newest, next_release()}, since
