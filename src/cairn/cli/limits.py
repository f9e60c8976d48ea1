"""The limits of ``cairn``'s numeric and duration options.

A value past its option's limit is a usage error (exit 2): one line naming the option
and the limit, never an ``OverflowError`` from deep inside a command. Integers are
bounded by 64 bits, as cairn's epochs are; durations, and ``cairn demo``'s
``--stream-seconds``, by 999999999 days (the most a :class:`datetime.timedelta`
holds). Each bound is checked as the option's value is parsed, before any store is
opened.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import typer

__all__ = [
    "MAX_DURATION_DAYS",
    "MAX_DURATION_SECONDS",
    "MAX_INT",
    "MIN_INT",
    "at_least",
    "check_seconds",
    "duration_of",
    "integer",
]

MAX_INT = 2**63 - 1
"""The largest integer any option takes."""
MIN_INT = -(2**63)
"""The smallest integer any option takes (only ``--seed`` takes negative ones)."""
_INT_REASON = "a 64-bit integer's limit"

MAX_DURATION_DAYS = dt.timedelta.max.days
"""The longest duration an option takes, in days: 999999999, timedelta's limit."""
MAX_DURATION_SECONDS = MAX_DURATION_DAYS * 86400
_DURATION_REASON = "timedelta's limit"

_INTEGER = re.compile(r"[+-]?[0-9]+")


def duration_of(seconds: float) -> dt.timedelta:
    """A timedelta of ``seconds``; :class:`ValueError` past :data:`MAX_DURATION_DAYS`
    (where ``timedelta`` itself raises ``OverflowError``), also for inf and nan."""
    if not seconds <= MAX_DURATION_SECONDS:
        raise ValueError(f"at most {MAX_DURATION_DAYS} days ({_DURATION_REASON})")
    return dt.timedelta(seconds=seconds)


def integer(low: int = MIN_INT, high: int = MAX_INT) -> Callable[[str | int], int]:
    """An integer option's ``parser``: the value, if ``low <= value <= high``; otherwise
    a usage error naming the bound, however many digits the value has (typer's own
    parsing stops at 4300 digits with an error that names no bound).

    typer checks no ``min=`` of an option that has a parser: give ``low`` here (and
    ``min=`` too, for ``--help`` to show the range).
    """
    digits = len(str(max(abs(low), abs(high))))

    def parse(text: str | int) -> int:
        if isinstance(text, int):  # typer hands defaults through the parser too
            return text
        spec = text.strip()
        if not _INTEGER.fullmatch(spec):
            raise typer.BadParameter(f"not an integer: {text!r}")
        negative = spec.startswith("-")
        if len(spec.lstrip("+-").lstrip("0")) > digits:  # past both bounds: no int needed
            raise typer.BadParameter(_past(low) if negative else _past(high, "at most"))
        value = int(spec)
        if value > high:
            raise typer.BadParameter(_past(high, "at most"))
        if value < low:
            raise typer.BadParameter(_past(low))
        return value

    return parse


def at_least(flag: str, low: int, help: str) -> Any:
    """The ``typer.Option`` of an integer option ``flag`` (metavar ``N``) of ``low`` or more:
    checked by :func:`integer`, with ``min=`` for ``--help`` to show the range."""
    return typer.Option(flag, metavar="N", min=low, parser=integer(low), help=help)


def _past(bound: int, side: str = "at least") -> str:
    why = f" ({_INT_REASON})" if bound in (MAX_INT, MIN_INT) else ""
    return f"{side} {bound}{why}"


def check_seconds(value: float | None) -> float | None:
    """A ``callback`` for an option of seconds (a float): the value, or a usage error past
    :data:`MAX_DURATION_SECONDS` (the bound of every duration), inf included."""
    if value is not None and not value <= MAX_DURATION_SECONDS:
        raise typer.BadParameter(
            f"at most {MAX_DURATION_SECONDS} seconds ({MAX_DURATION_DAYS} days, {_DURATION_REASON})"
        )
    return value
