"""Where the command line writes, and how it spells sizes, ages and times.

Human output goes through rich to stdout; ``--json`` output is one JSON document on
stdout and nothing else, a failure included; errors, warnings, notes and progress go
to stderr. When stdout is not
a terminal, tables are laid out 160 columns wide, so ids are not wrapped in files and
pipes.

Tables are :class:`FitTable`: laid out for the width they are printed at, each column
at its natural width. Where they do not all fit, the least useful go first, by the rank
each column is given; a column of rank 0 (an id) is never dropped, nor cut. A column
with nothing in any row is not drawn. With ``wide`` every column is kept.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from cairn.cli.errors import SCHEMA_VERSION, error_doc

__all__ = [
    "Col",
    "FitTable",
    "Heading",
    "Output",
    "heading",
    "human_age",
    "human_duration",
    "human_size",
    "iso_time",
    "make_table",
    "no_color",
    "plural",
    "time_text",
]

PIPE_WIDTH = 160
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def no_color() -> bool:
    """True when ``$NO_COLOR`` is set to anything but the empty string (no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


def _console(stderr: bool) -> Console:
    # rich's own NO_COLOR handling drops colours but keeps bold, italic and underline;
    # without a colour system it writes no style escape at all.
    plain: dict[str, Any] = {"color_system": None} if no_color() else {}
    console = Console(stderr=stderr, highlight=False, soft_wrap=False, **plain)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(
            stderr=stderr, highlight=False, soft_wrap=False, width=PIPE_WIDTH, **plain
        )
    return console


@dataclass
class Output:
    """The two streams of a command: results on stdout, diagnostics on stderr.

    In ``--json`` mode the command's document is kept (:meth:`json`) and printed once,
    when the command ends (:meth:`emit`), with the ``error`` of a failure merged in, so
    stdout holds exactly one JSON object whether the command succeeded or not. Tables
    keep every column and whole ids when ``wide``, whole ids when ``full_ids``.
    """

    json_mode: bool = False
    wide: bool = False
    full_ids: bool = False
    out: Console = field(default_factory=lambda: _console(stderr=False))
    err: Console = field(default_factory=lambda: _console(stderr=True))
    document: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    def show(self, *renderables: RenderableType) -> None:
        """Print human output (ignored in ``--json`` mode, which prints one document).

        Not to a terminal, each line ends at its last character: rich pads table lines
        to the table's width, which a pipe or a file would keep as trailing spaces."""
        if self.json_mode:
            return
        parts = [
            part
            for renderable in renderables
            for part in (renderable.renderables if isinstance(renderable, Group) else [renderable])
        ]
        if self.out.is_terminal:
            self._print(parts)
            return
        with self.out.capture() as captured:
            self._print(parts)
        self.out.file.write("".join(f"{line.rstrip()}\n" for line in captured.get().splitlines()))
        self.out.file.flush()

    def _print(self, parts: list[RenderableType]) -> None:
        for part in parts:
            self.out.print(part, soft_wrap=isinstance(part, Heading))

    def line(self, text: str) -> None:
        """Print one line of human output as is: no markup, not wrapped (ignored in JSON)."""
        if not self.json_mode:
            self.out.print(text, markup=False, highlight=False, soft_wrap=True)

    def json(self, document: dict[str, Any]) -> None:
        """Keep ``document`` (led by its ``schema_version``) to print in ``--json`` mode."""
        self.document = {"schema_version": SCHEMA_VERSION, **document}

    def report(self, document: dict[str, Any], *renderables: RenderableType) -> None:
        """A command's result: ``document`` for ``--json``, ``renderables`` for people."""
        self.json(document)
        self.show(*renderables)

    def fail(self, kind: str, message: str, code: int) -> None:
        """Report a failure: ``error: message`` on stderr, and the ``error`` of the JSON."""
        self.error(message)
        if self.failure is None:
            self.failure = error_doc(kind, message, code)

    def emit(self) -> None:
        """Print the JSON document (only in ``--json`` mode, once)."""
        if not self.json_mode:
            return
        document = self.document or {"schema_version": SCHEMA_VERSION}
        if self.failure is not None:
            document = {**document, "error": self.failure}
        self.json_mode = False  # printed once
        sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def error(self, message: str) -> None:
        """``error: message`` on stderr, one line."""
        self.err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)

    def warning(self, message: str) -> None:
        """``warning: message`` on stderr, one line."""
        self.err.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)

    def note(self, message: str) -> None:
        """``note: message`` on stderr, one line: what the command chose for the user."""
        self.err.print(f"note: {message}", markup=False, highlight=False, soft_wrap=True)


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


class Heading(Text):
    """A line above a table that names a path (:func:`heading`)."""


def heading(text: str) -> Heading:
    """A line above a table that names a path: :meth:`Output.show` prints it unwrapped,
    so a path longer than the terminal is not broken inside a name (the terminal folds
    it, and it copies whole)."""
    return Heading(text)


def plural(count: int, noun: str) -> str:
    """``1 file``, ``2 files``, ``0 files``: ``count`` and ``noun``, plural unless one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def human_duration(ms: float) -> str:
    """``358 ms``, ``1.5 s``, ``90 s``, ``12.5 min``, ``3.0 h``, ``2.0 d``: a duration for
    people (``ms`` in milliseconds)."""
    seconds = ms / 1000
    if seconds < 1:
        return f"{ms:,.0f} ms"
    if seconds < 120:
        return f"{seconds:,.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 86400:,.1f} d"


def human_age(timestamp_ms: int, now_ms: int | None = None) -> str:
    """How long ago ``timestamp_ms`` was: ``just now``, ``42 s ago``, ``3 min ago``, ...

    Never raises: a time too far off for a float reads ``in the future`` or ``long ago``.
    """
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    try:
        seconds = (now - timestamp_ms) / 1000
    except OverflowError:
        return "in the future" if timestamp_ms > now else "long ago"
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


def iso_time(timestamp_ms: int) -> str | None:
    """``timestamp_ms`` as an ISO 8601 UTC time with milliseconds; None if it has none.

    Times before year 1 or after year 9999 have no ISO 8601 form (``datetime`` cannot
    hold them); callers show the raw milliseconds instead.
    """
    try:
        moment = _EPOCH + dt.timedelta(milliseconds=timestamp_ms)
    except OverflowError:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def time_text(timestamp_ms: int) -> str:
    """``timestamp_ms`` for people: its ISO 8601 time, or the raw milliseconds if it has none."""
    iso = iso_time(timestamp_ms)
    return iso if iso is not None else f"{timestamp_ms} ms after 1970 (not a date)"


@dataclass(frozen=True)
class Col:
    """A column of a :class:`FitTable`: its header (``>`` first: right-aligned), its
    rank, the order in which it gives way when the table is too wide (highest first;
    0: never), and whether its cells are never wrapped nor cut (``whole``: ids)."""

    header: str
    rank: int = 0
    whole: bool = False


_GAP = 2
_FOLDED = 30
"""Columns between two columns of a :class:`FitTable` (its box draws no vertical lines)."""


def _width(cell: Text) -> int:
    return max((_cells(line) for line in cell.plain.splitlines()), default=0)


def _cells(text: str) -> int:
    """The columns ``text`` takes in a terminal (a wide character takes two)."""
    return Text(text).cell_len


class FitTable:
    """A table that fits the width it is printed at (see the module docstring)."""

    def __init__(self, title: str, columns: list[Col], *, wide: bool = False) -> None:
        self.title = title
        self.columns = columns
        self.wide = wide
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: RenderableType | str) -> None:
        """One row: a cell per column, plain text or :class:`rich.text.Text`."""
        self.rows.append([c if isinstance(c, Text) else Text(str(c)) for c in cells])

    def kept(self, width: int) -> list[int]:
        """The indexes of the columns drawn at ``width`` columns."""
        widths = [
            max([_cells(col.header.removeprefix(">"))] + [_width(r[i]) for r in self.rows])
            for i, col in enumerate(self.columns)
        ]
        # A message column folds over lines: it claims no more than _FOLDED columns.
        widths = [
            w if col.whole or col.rank else min(w, _FOLDED)
            for w, col in zip(widths, self.columns, strict=True)
        ]
        keep = [
            i
            for i in range(len(self.columns))
            if not self.rows or any(r[i].plain for r in self.rows)
        ]
        if self.wide:
            return keep

        def total() -> int:
            return sum(widths[i] for i in keep) + _GAP * max(len(keep) - 1, 0)

        for i in sorted(keep, key=lambda i: (-self.columns[i].rank, -i)):
            if total() <= width or self.columns[i].rank == 0:
                break
            keep.remove(i)
        return keep

    def table(self, width: int) -> Table:
        """The rich table drawn at ``width`` columns."""
        keep = self.kept(width)
        made = Table(
            title=self.title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, _GAP - 1, 0, 0),  # with the box's one-space divider: _GAP columns
        )
        for i in keep:
            col = self.columns[i]
            made.add_column(
                col.header.removeprefix(">"),
                justify="right" if col.header.startswith(">") else "left",
                no_wrap=col.whole,
                overflow="fold",
            )
        for row in self.rows:
            made.add_row(*(row[i] for i in keep))
        return made

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)


def make_table(title: str, *columns: str | Col, wide: bool = False) -> FitTable:
    """A :class:`FitTable` titled ``title``; a column given by name alone is never
    dropped (rank 0)."""
    return FitTable(title, [c if isinstance(c, Col) else Col(c) for c in columns], wide=wide)
