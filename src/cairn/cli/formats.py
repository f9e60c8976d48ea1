"""``-o/--output``: one option naming the output format, as kubectl spells it.

Every command with a table takes ``-o table`` (the default table, fitted to the
terminal), ``-o wide`` (every column and whole ids: ``--wide``), ``-o ids`` (whole ids:
``--ids``) or ``-o json`` (one JSON document: ``--json``). The flags keep working; an
``-o`` and a flag that ask for different output are a usage error naming both.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

import typer

__all__ = ["OutputFormat", "OutputOption", "apply_output"]


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


def apply_output(
    output: OutputFormat, json_mode: bool, given: dict[str, Any]
) -> tuple[bool, str | None]:
    """Apply ``-o output`` to a command's ``--json`` (``json_mode``) and its ``wide`` and
    ``full_ids`` parameters (in ``given``, changed in place): the ``--json`` to use, and
    the usage error to report when a flag given asks for other output (else None)."""
    flags = {"--json": json_mode, "--wide": given.get("wide"), "--ids": given.get("full_ids")}
    allowed = _AGREES.get(output, {_FLAG_OF.get(output)})
    clash = [flag for flag, on in flags.items() if on and flag not in allowed]
    if clash:
        return json_mode, f"-o {output.value} and {clash[0]} ask for different output: give one"
    if output is OutputFormat.WIDE:
        given["wide"] = True
    elif output is OutputFormat.IDS:
        given["full_ids"] = True
    return json_mode or output is OutputFormat.JSON, None
