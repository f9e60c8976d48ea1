"""Where the command line writes, and how it spells sizes, ages and times.

Human output goes through rich to stdout; ``--json`` output is one JSON document on
stdout and nothing else; errors, warnings and progress go to stderr. When stdout is not
a terminal, tables are laid out 160 columns wide, so ids are not wrapped in files and
pipes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table

__all__ = ["Output", "human_age", "human_size", "iso_time", "make_table"]

PIPE_WIDTH = 160


def _console(stderr: bool) -> Console:
    console = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, highlight=False, soft_wrap=False, width=PIPE_WIDTH)
    return console


@dataclass
class Output:
    """The two streams of a command: results on stdout, diagnostics on stderr."""

    json_mode: bool = False
    out: Console = field(default_factory=lambda: _console(stderr=False))
    err: Console = field(default_factory=lambda: _console(stderr=True))

    def show(self, *renderables: RenderableType) -> None:
        """Print human output (ignored in ``--json`` mode, which prints one document)."""
        if not self.json_mode:
            self.out.print(*renderables)

    def json(self, document: Any) -> None:
        """Print ``document`` as JSON on stdout (only in ``--json`` mode)."""
        if self.json_mode:
            sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
            sys.stdout.flush()

    def error(self, message: str) -> None:
        """``error: message`` on stderr, one line."""
        self.err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)

    def warning(self, message: str) -> None:
        """``warning: message`` on stderr, one line."""
        self.err.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_size(size: int) -> str:
    """``1536`` → ``1.5 KiB``: binary units, three significant digits."""
    value = float(size)
    for unit in _SIZE_UNITS:
        if abs(value) < 1024 or unit == _SIZE_UNITS[-1]:
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_age(timestamp_ms: int, now_ms: int | None = None) -> str:
    """How long ago ``timestamp_ms`` was: ``just now``, ``42 s ago``, ``3 min ago``, ..."""
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    seconds = (now - timestamp_ms) / 1000
    if seconds < 0:
        return "in the future"
    if seconds < 1:
        return "just now"
    for limit, div, unit in (
        (60, 1, "s"),
        (3600, 60, "min"),
        (86400, 3600, "h"),
        (86400 * 60, 86400, "d"),
    ):
        if seconds < limit:
            return f"{int(seconds // div)} {unit} ago"
    return f"{int(seconds // (86400 * 30))} months ago"


def iso_time(timestamp_ms: int) -> str:
    """``timestamp_ms`` as an ISO 8601 UTC time with milliseconds."""
    moment = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_table(title: str, *columns: str, no_wrap: bool = False) -> Table:
    """A rich table titled ``title``; a column name starting with ``>`` is right-aligned."""
    made = Table(title=title, title_justify="left")
    for column in columns:
        right = column.startswith(">")
        made.add_column(
            column.removeprefix(">"), justify="right" if right else "left", no_wrap=no_wrap
        )
    return made
