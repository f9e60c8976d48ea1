"""``-o/--output``: one option naming the output format, as kubectl spells it.

Every command with a table takes ``-o table`` (the default table, fitted to the
terminal), ``-o wide`` (every column and whole ids: ``--wide``), ``-o ids`` (whole ids:
``--ids``) or ``-o json`` (one JSON document: ``--json``). The flags keep working; an
``-o`` and a flag that ask for different output are a usage error naming both.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Annotated

import typer

from cairn.cli.errors import CliError, ExitCode

__all__ = ["OutputFormat", "OutputOption", "Shown", "apply_output"]


class OutputFormat(enum.StrEnum):
    """What ``-o`` takes."""

    TABLE = "table"
    WIDE = "wide"
    IDS = "ids"
    JSON = "json"


OutputOption = Annotated[
    OutputFormat | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FORMAT",
        case_sensitive=False,
        show_default=False,
        help="table, wide, ids or json: the same as no flag, --wide, --ids or --json.",
    ),
]

_FLAG_OF = {OutputFormat.WIDE: "--wide", OutputFormat.IDS: "--ids", OutputFormat.JSON: "--json"}
_AGREES = {OutputFormat.WIDE: {"--wide", "--ids"}}  # wide tables show whole ids already


@dataclass(frozen=True)
class Shown:
    """What a command prints: one JSON document (``json_mode``), or tables with every
    column and whole ids (``wide``) or with whole ids (``full_ids``)."""

    json_mode: bool = False
    wide: bool = False
    full_ids: bool = False


def apply_output(output: OutputFormat | None, flags: Shown) -> Shown:
    """What ``-o output`` (None: not given) and the flags given (``--json``, ``--wide``,
    ``--ids``, as ``flags``) ask for together; a usage error naming both when a flag asks
    for other output than ``-o``."""
    if output is None:
        return flags
    given = {"--json": flags.json_mode, "--wide": flags.wide, "--ids": flags.full_ids}
    allowed = _AGREES.get(output, {_FLAG_OF.get(output)})
    clash = [flag for flag, on in given.items() if on and flag not in allowed]
    if clash:
        raise CliError(
            f"-o {output.value} and {clash[0]} ask for different output: give one", ExitCode.USAGE
        )
    return dataclasses.replace(
        flags,
        json_mode=flags.json_mode or output is OutputFormat.JSON,
        wide=flags.wide or output is OutputFormat.WIDE,
        full_ids=flags.full_ids or output is OutputFormat.IDS,
    )
