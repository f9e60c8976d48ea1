"""``cairn history``: the checkpoints of a store over time, drawn in the terminal.

One row per checkpoint directory, oldest first: its time and epoch, ``F`` (full) or
``I`` (incremental), a bar of its size — uploaded (``█``) and carried over from earlier
checkpoints (``░``), on one scale for the whole chart — and how long its save took.
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

from rich.console import Group, RenderableType
from rich.text import Text

from cairn import CheckpointId, CheckpointManifest
from cairn.cli.output import human_size, iso_time
from cairn.cli.views import kind, manifest_doc

__all__ = ["Point", "history_chart", "history_doc"]

BAR_WIDTH = 40
GAP_FACTOR = 3
"""A pause between checkpoints longer than this many times the median one is a gap."""


@dataclass(frozen=True)
class Point:
    """One checkpoint directory: ``status`` is ``committed``, ``unreadable`` or
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
            if "duration_ms" in doc:
                row["duration_ms"] = doc["duration_ms"]
        series.append(row)
    committed = [p for p in points if p.status == "committed"]
    return {
        **where,
        "count": len(committed),
        "failures": sum(1 for p in points if p.status != "committed"),
        "series": series,
    }


def history_chart(points: list[Point]) -> RenderableType:
    """The chart (see the module docstring)."""
    if not points:
        return Text("no checkpoints")
    docs = {p.checkpoint_id: manifest_doc(p.manifest) for p in points if p.manifest is not None}
    largest = max((d["uploaded_bytes"] + d["carried_bytes"] for d in docs.values()), default=0)
    gaps = _gaps(points)
    lines: list[Text] = []
    for index, point in enumerate(points):
        if index in gaps:
            pause = (
                point.checkpoint_id.timestamp_ms - points[index - 1].checkpoint_id.timestamp_ms
            ) / 1000
            lines.append(Text(f"{'':>20} ┆ gap: {pause:,.0f} s without a checkpoint", "yellow"))
        when = (iso_time(point.time_ms) or str(point.time_ms))[:19].replace("T", " ")
        line = Text(f"{when:>20} ")
        if point.manifest is None:
            mark, style = ("✗", "red") if point.status == "uncommitted" else ("?", "red")
            what = "not committed" if point.status == "uncommitted" else "unreadable manifest"
            line.append(f"{mark} {'':>8}  ", style)
            line.append(what, style)
            lines.append(line)
            continue
        doc = docs[point.checkpoint_id]
        uploaded, carried = doc["uploaded_bytes"], doc["carried_bytes"]
        scale = BAR_WIDTH / largest if largest else 0
        new_cells = max(1 if uploaded else 0, round(uploaded * scale))
        old_cells = round(carried * scale)
        letter = "F" if kind(point.manifest) == "full" else "I"
        line.append(f"{letter} ", "bold" if letter == "F" else "")
        line.append(f"{point.manifest.epoch:>8}  ")
        line.append("█" * new_cells, "green")
        line.append("░" * old_cells, "blue")
        line.append(" " * max(0, BAR_WIDTH - new_cells - old_cells))
        took = f"{doc['duration_ms'] / 1000:6.2f} s" if "duration_ms" in doc else "      —"
        line.append(f"  {human_size(uploaded):>9} new  {human_size(carried):>9} carried  {took}")
        lines.append(line)
    legend = Text("█ uploaded  ░ carried over  F full  I incremental  ✗ not committed  ", "dim")
    return Group(*lines, legend)
