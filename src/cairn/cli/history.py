"""``cairn history``: the checkpoints of a store over time, drawn in the terminal.

One row per checkpoint directory, oldest first: its short id (the fewest characters,
8 or more, that tell the rows apart; ``--ids`` the whole id), its time and epoch, ``F`` (full) or
``I`` (incremental), a bar of its size — uploaded (``█``) and carried over from earlier
checkpoints (``░``), on one scale for the whole chart — what its save put in the store
(``stored``) and how many store requests it made (``req``), and how long it took.
What went wrong shows at a glance: a directory with no committed manifest (a save that
failed, was killed, or is still running: ``✗``), a manifest that does not read (``?``),
and a pause between two checkpoints much longer than usual (a ``gap`` line). ``--json``
gives the same series as data.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.text import Text

from cairn import CheckpointId, CheckpointManifest
from cairn.cli.output import human_duration, human_size, iso_time
from cairn.cli.views.summary import id_texts, kind, manifest_doc

__all__ = ["Point", "history_chart", "history_doc"]

BAR_WIDTH = 40
GAP_FACTOR = 3
"""A pause between checkpoints longer than this many times the median one is a gap."""


@dataclass(frozen=True)
class Point:
    """One checkpoint directory: ``status`` is ``committed``, ``unreadable``, ``newer``
    (committed by a newer cairn, whose manifest this one cannot read) or
    ``uncommitted`` (no manifest: a failed, killed or running save)."""

    checkpoint_id: CheckpointId
    status: str
    manifest: CheckpointManifest | None = None

    @property
    def time_ms(self) -> int:
        """When it was made: its manifest's time, or the time in its id."""
        if self.manifest is not None:
            return self.manifest.timestamp_ms
        return self.checkpoint_id.timestamp_ms


_UNREAD = {"uncommitted": "not committed", "newer": "needs a newer cairn"}
"""How a row without a manifest reads, by status (else: an unreadable manifest)."""


def _gaps(points: list[Point]) -> set[int]:
    """Indexes of points that come after an unusually long pause (between the times in
    their ids: those rise with the order of the rows, whatever a manifest says)."""
    times = [p.checkpoint_id.timestamp_ms for p in points]
    pauses = [b - a for a, b in itertools.pairwise(times)]
    if len(pauses) < 3:
        return set()
    usual = statistics.median(pauses)
    return {i + 1 for i, pause in enumerate(pauses) if usual > 0 and pause > GAP_FACTOR * usual}


def history_doc(where: dict[str, str], points: list[Point]) -> dict[str, Any]:
    """``cairn history --json``: the series, oldest first."""
    gaps = _gaps(points)
    series: list[dict[str, Any]] = []
    for index, point in enumerate(points):
        row: dict[str, Any] = {
            "id": str(point.checkpoint_id),
            "status": point.status,
            "time_ms": point.time_ms,
            "created": iso_time(point.time_ms),
            "after_gap": index in gaps,
        }
        if point.manifest is not None:
            doc = manifest_doc(point.manifest)
            row.update(
                epoch=doc["epoch"],
                kind=doc["kind"],
                uploaded_bytes=doc["uploaded_bytes"],
                carried_bytes=doc["carried_bytes"],
            )
            for key in ("duration_ms", "sent_bytes", "stored_bytes", "requests"):
                if key in doc:
                    row[key] = doc[key]
        series.append(row)
    committed = [p for p in points if p.status == "committed"]
    return {
        **where,
        "count": len(committed),
        "failures": sum(1 for p in points if p.status != "committed"),
        "series": series,
    }


_WHEN = 16  # "2026-12-01 13:45"
_MIN_BAR = 8


def history_chart(
    points: list[Point], *, full_ids: bool = False, wide: bool = False
) -> RenderableType:
    """The chart (see the module docstring), laid out for the width it is printed at."""
    if not points:
        return Text("no checkpoints")
    return _Chart(points, full_ids or wide, wide)


class _Chart:
    """One line per point: short id, time, kind, epoch, bar, sizes, requests, duration.
    Below about 120 columns the bar narrows, then the carried size, the stored size, the
    duration, the requests and the time give way, in that order (at 80 columns, short
    ids keep the time, the requests and the duration); the id is always whole. ``wide``
    keeps every part. A checkpoint saved before cairn counted what it stored or asked
    shows ``—`` there."""

    def __init__(self, points: list[Point], full_ids: bool, wide: bool) -> None:
        self.points = points
        self.wide = wide
        self.names = id_texts([p.checkpoint_id for p in points], full_ids)
        self.docs = {
            p.checkpoint_id: manifest_doc(p.manifest) for p in points if p.manifest is not None
        }

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.lines(options.max_width)

    def lines(self, width: int) -> list[Text]:
        """The chart drawn in ``width`` columns."""
        id_width = max(len(name) for name in self.names.values())
        epoch_width = max([5] + [len(str(d["epoch"])) for d in self.docs.values()])
        # id, time, "F", epoch, "  new", then the parts that give way, in this order.
        requests = {
            cid: sum(doc["requests"].values())
            for cid, doc in self.docs.items()
            if "requests" in doc
        }
        req_width = max([3] + [len(str(n)) for n in requests.values()])
        parts = {"when": _WHEN + 1, "carried": 19, "stored": 18, "took": 10}
        if requests:
            parts["requests"] = 2 + req_width + 4
        if not any("stored_bytes" in doc for doc in self.docs.values()):
            del parts["stored"]
        fixed = id_width + 1 + 2 + epoch_width + 2 + 2 + 13
        shown = set(parts)
        if not self.wide:
            for name in ("carried", "stored", "took", "requests", "when"):
                if fixed + sum(parts[p] for p in shown) + _MIN_BAR <= width:
                    break
                shown.discard(name)
        room = width - fixed - sum(parts[p] for p in shown)
        bar = BAR_WIDTH if self.wide else max(_MIN_BAR, min(BAR_WIDTH, room))
        largest = max(
            (d["uploaded_bytes"] + d["carried_bytes"] for d in self.docs.values()), default=0
        )
        gaps = _gaps(self.points)
        lines: list[Text] = []
        for index, point in enumerate(self.points):
            if index in gaps:
                pause = human_duration(
                    point.checkpoint_id.timestamp_ms
                    - self.points[index - 1].checkpoint_id.timestamp_ms
                )
                lines.append(
                    Text(f"{'':>{id_width}} ┆ gap: {pause} without a checkpoint", "yellow")
                )
            line = Text(f"{self.names[point.checkpoint_id]:<{id_width}} ")
            if "when" in shown:
                when = (iso_time(point.time_ms) or str(point.time_ms))[:_WHEN].replace("T", " ")
                line.append(f"{when:<{_WHEN}} ")
            if point.manifest is None:
                mark, style = ("✗", "red") if point.status == "uncommitted" else ("?", "red")
                what = _UNREAD.get(point.status, "unreadable manifest")
                line.append(f"{mark} {'':>{epoch_width}}  ", style)
                line.append(what, style)
                lines.append(line)
                continue
            doc = self.docs[point.checkpoint_id]
            uploaded, carried = doc["uploaded_bytes"], doc["carried_bytes"]
            scale = bar / largest if largest else 0
            new_cells = max(1 if uploaded else 0, round(uploaded * scale))
            old_cells = min(round(carried * scale), bar - new_cells)
            letter = "F" if kind(point.manifest) == "full" else "I"
            line.append(f"{letter} ", "bold" if letter == "F" else "")
            line.append(f"{point.manifest.epoch:>{epoch_width}}  ")
            line.append("█" * new_cells, "green")
            line.append("░" * old_cells, "blue")
            line.append(" " * max(0, bar - new_cells - old_cells))
            line.append(f"  {human_size(uploaded):>9} new")
            if "carried" in shown:
                line.append(f"  {human_size(carried):>9} carried")
            if "stored" in shown:
                stored = human_size(doc["stored_bytes"]) if "stored_bytes" in doc else "—"
                line.append(f"  {stored:>9} stored")
            if "requests" in shown:
                count = requests.get(point.checkpoint_id)
                line.append(f"  {'—' if count is None else count:>{req_width}} req")
            if "took" in shown:
                took = f"{doc['duration_ms'] / 1000:6.2f} s" if "duration_ms" in doc else "      —"
                line.append(f"  {took}")
            lines.append(line)
        legend = "█ uploaded  ░ carried over  F full  I incremental  ✗ not committed"
        if len(legend) > width and not self.wide:
            legend = "█ new  ░ carried  F full  I incremental  ✗ not committed"
        lines.append(Text(legend, "dim"))
        return lines
