"""``cairn list``: the committed checkpoints of a store, one row (one object) each."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from cairn.cli.catalog import Latest, Listed
from cairn.cli.output import Col, human_age, human_size
from cairn.cli.views.summary import artifacts_text, id_table, id_text, manifest_doc, plain

__all__ = ["list_doc", "list_table"]


def list_doc(
    where: dict[str, str],
    listed: list[Listed],
    mark: Latest,
    other_prefixes: list[str] | None = None,
) -> dict[str, Any]:
    """``cairn list --json``: ``mark`` says which checkpoint is the latest and which the
    newest; ``other_prefixes`` names where else checkpoints are, when there are none
    under the prefix."""
    rows: list[dict[str, Any]] = []
    for item in listed:
        if item.manifest is not None:
            row = manifest_doc(item.manifest)
        else:
            row = {"id": str(item.checkpoint_id), "error": item.error, "status": item.status}
        row["latest"] = item.checkpoint_id == mark.latest
        row["newest"] = item.checkpoint_id == mark.newest
        rows.append(row)
    return {
        **where,
        "latest": id_text(mark.latest),
        "newest": id_text(mark.newest),
        "latest_verified": mark.verified,
        "count": len(rows),
        "checkpoints": rows,
        "other_prefixes": list(other_prefixes or []),
    }


def list_table(
    listed: list[Listed], mark: Latest, *, full_ids: bool = False, wide: bool = False
) -> RenderableType:
    """``cairn list``: one row per committed checkpoint, oldest first (with a Name column
    when any of them has a name), the latest marked, and the newest too when it does
    not load. Ids are short unless ``full_ids``; columns give way to the width, the
    least useful first, unless ``wide``."""
    if not listed:
        return Text("no checkpoints")
    names, table = id_table(
        f"{len(listed)} checkpoint(s), oldest first",
        [item.checkpoint_id for item in listed],
        Col("Name", 5),
        Col(">Epoch", 1),
        Col(">Created", 2),
        Col("Kind", 3),
        Col(">Artifacts", 4),
        Col(">Size", 2),
        Col(">Uploaded", 6),
        Col(">Took", 7),
        Col("", 1),
        full_ids=full_ids,
        wide=wide,
    )
    for item in listed:
        marks = []
        if item.checkpoint_id == mark.latest:
            marks.append(Text("◀ latest", style="bold"))
        elif item.checkpoint_id == mark.newest and not mark.verified:
            marks.append(Text("◀ newest (too large to verify here)", style="yellow"))
        elif item.checkpoint_id == mark.newest and item.manifest is not None:
            marks.append(Text("newest, does not load", style="red"))
        manifest = item.manifest
        if manifest is None:
            if item.newer:
                marks.append(Text(str(item.error), style="yellow"))
            else:
                marks.append(Text("unreadable", style="red"))
            table.add_row(
                plain(names[item.checkpoint_id]),
                "",
                "?",
                "",
                "",
                "",
                "",
                "",
                "",
                Text(" ").join(marks),
            )
            continue
        doc = manifest_doc(manifest)
        table.add_row(
            plain(names[item.checkpoint_id]),
            plain(manifest.name or ""),
            plain(manifest.epoch),
            plain(human_age(manifest.timestamp_ms)),
            plain(doc["kind"]),
            plain(artifacts_text(manifest)),
            plain(human_size(doc["size_bytes"])),
            plain(human_size(doc["uploaded_bytes"])),
            plain(f"{doc['duration_ms'] / 1000:.2f} s" if "duration_ms" in doc else "—"),
            Text(" ").join(marks),
        )
    return table
