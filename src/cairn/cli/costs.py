"""``cairn history --cost``: what each checkpoint cost in dollars, and what a day costs.

Per checkpoint: the store requests its save made, by kind, priced by a table of
:mod:`cairn.cli.pricing` (``request_usd``), and what keeping the bytes it left in the
store costs a month (``storage_usd_per_month``). A checkpoint whose save recorded no
request counts (saved before cairn counted them, not committed, or unreadable) is
``unknown``, never 0.

Per day, at the observed interval: the interval is the median of the gaps between the
commit times (the times their manifests record) of consecutive committed checkpoints
in the window ``history`` shows; a day holds ``86400 s / interval`` checkpoints, each
costing the mean of the known checkpoints' costs. The storage a day of checkpoints
adds is priced per month, for as long as it is kept (retention decides that).
"""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cairn.cli.history import Point
from cairn.cli.output import Col, human_duration, human_size, iso_time
from cairn.cli.pricing import (
    DAY_MS,
    PriceTable,
    dollars,
    interval_ms,
    request_usd,
    storage_usd_per_month,
)
from cairn.cli.views.summary import REQUEST_KINDS, id_table, manifest_doc, plain

__all__ = ["cost_summary", "cost_table", "row_costs"]


def row_costs(point: Point, table: PriceTable | None) -> dict[str, Any]:
    """The dollars of one checkpoint: ``request_usd`` and ``storage_usd_per_month``,
    each None when unknown (no counts, or no price).

    Args:
        point: The checkpoint.
        table: The prices, or None.

    Returns:
        The two fields, as ``history --cost --json`` prints them in a row.
    """
    doc = manifest_doc(point.manifest) if point.manifest is not None else {}
    requests = doc.get("requests")
    stored = doc.get("stored_bytes")
    return {
        "request_usd": None if table is None or requests is None else request_usd(requests, table),
        "storage_usd_per_month": None
        if table is None or stored is None
        else storage_usd_per_month(stored, table),
    }


def cost_summary(
    points: list[Point], table: PriceTable | None, no_price: str | None
) -> dict[str, Any]:
    """``history --cost --json``'s ``cost``: the prices, the interval, and a day's cost.

    Args:
        points: The checkpoints in the window, oldest first.
        table: The prices, or None when none applies.
        no_price: Why none applies (when ``table`` is None).

    Returns:
        The document (see the module docstring for how each figure is computed).
    """
    committed = [p for p in points if p.status == "committed" and p.manifest is not None]
    interval, gaps = interval_ms([p.manifest.timestamp_ms for p in committed if p.manifest])
    per_day = DAY_MS / interval if interval else None
    docs = [manifest_doc(p.manifest) for p in committed if p.manifest is not None]
    known = [d for d in docs if "requests" in d]
    stored = [d["stored_bytes"] for d in docs if "stored_bytes" in d]
    request_costs = [request_usd(d["requests"], table) for d in known] if table else []
    mean_usd = statistics.fmean(request_costs) if request_costs else None
    stored_per_day = statistics.fmean(stored) * per_day if stored and per_day else None
    doc: dict[str, Any] = {
        "prices": table.doc() if table is not None else None,
        "interval_ms": interval,
        "interval_gaps": gaps,
        "checkpoints_per_day": per_day,
        "known": len(known),
        "request_usd_per_checkpoint": mean_usd,
        "request_usd_per_day": mean_usd * per_day if mean_usd is not None and per_day else None,
        "stored_bytes_per_day": round(stored_per_day) if stored_per_day is not None else None,
        "storage_usd_per_month_per_day": storage_usd_per_month(round(stored_per_day), table)
        if stored_per_day is not None and table is not None
        else None,
    }
    if table is None:
        doc["no_price"] = no_price
    return doc


def cost_table(
    points: list[Point],
    summary: dict[str, Any],
    table: PriceTable | None,
    *,
    full_ids: bool = False,
    wide: bool = False,
) -> RenderableType:
    """``history --cost`` for people: a row per checkpoint (its requests by kind, the
    bytes it sent and stored, their dollars), then the prices and a day's cost.

    Args:
        points: The checkpoints in the window, oldest first.
        summary: :func:`cost_summary` of them.
        table: The prices, or None.
        full_ids: Whole ids.
        wide: Every column, however wide the terminal.

    Returns:
        The renderable.
    """
    if not points:
        return Text("no checkpoints")
    names, rows = id_table(
        f"{len(points)} checkpoint(s), oldest first: requests of each save up to its commit",
        [p.checkpoint_id for p in points],
        Col(">Created", 5),
        *(Col(f">{kind.upper()}", 3) for kind in REQUEST_KINDS),
        Col(">Sent", 4),
        Col(">Stored", 2),
        Col(">Requests $", 0),
        Col(">Storage $/month", 1),
        full_ids=full_ids,
        wide=wide,
    )
    for point in points:
        doc = manifest_doc(point.manifest) if point.manifest is not None else {}
        counts = doc.get("requests")
        costs = row_costs(point, table)
        when = (iso_time(point.time_ms) or str(point.time_ms))[:16].replace("T", " ")
        unknown = "unknown" if point.status == "committed" else f"unknown ({point.status})"
        rows.add_row(
            plain(names[point.checkpoint_id]),
            plain(when),
            *(plain("—" if counts is None else counts[kind]) for kind in REQUEST_KINDS),
            plain(human_size(doc["sent_bytes"]) if "sent_bytes" in doc else "—"),
            plain(human_size(doc["stored_bytes"]) if "stored_bytes" in doc else "—"),
            plain(
                ""
                if table is None
                else unknown
                if counts is None
                else dollars(costs["request_usd"])
            ),
            plain(
                ""
                if table is None or table.gb_month is None
                else dollars(costs["storage_usd_per_month"])
            ),
        )
    return Group(rows, *(Text(line) for line in summary_lines(summary, table)))


def summary_lines(summary: dict[str, Any], table: PriceTable | None) -> list[str]:
    """The lines under the table: the prices (or why there are none), the interval and
    what a day costs.

    Args:
        summary: :func:`cost_summary`'s document.
        table: The prices, or None.

    Returns:
        The lines.
    """
    lines = [table.text() if table is not None else str(summary["no_price"]) + _PRICE_HINT]
    interval, gaps = summary["interval_ms"], summary["interval_gaps"]
    if interval is None:
        lines.append("interval: unknown (needs two committed checkpoints at different times)")
        return lines
    lines.append(
        f"interval: {human_duration(interval)}, the median of {gaps} gap(s) between the commit "
        "times of consecutive checkpoints"
    )
    if table is None:
        return lines
    per_day = summary["checkpoints_per_day"]
    count = f"{per_day:,.0f}" if per_day >= 100 else f"{per_day:,.1f}"
    day = f"per day at that interval: {count} checkpoints, "
    if summary["request_usd_per_day"] is None:
        day += "requests unknown (no checkpoint here recorded its requests)"
    else:
        day += (
            f"{dollars(summary['request_usd_per_day'])} in requests "
            f"({dollars(summary['request_usd_per_checkpoint'])} each, the mean of "
            f"{summary['known']})"
        )
    if summary["stored_bytes_per_day"] is not None:
        day += f"; they store {human_size(summary['stored_bytes_per_day'])}"
        if summary["storage_usd_per_month_per_day"] is not None:
            day += f", {dollars(summary['storage_usd_per_month_per_day'])} a month while kept"
    lines.append(day)
    return lines


_PRICE_HINT = (
    " put=…,get=…,head=…,list=…,delete=…[,gb_month=…] (USD per 1,000 requests; "
    "gb_month: USD per GiB-month)"
)
