"""``cairn verify``, ``cairn restore`` and ``cairn copy``: what each did to every
checkpoint it read, and whether all of it verified."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cairn import CheckpointId
from cairn.cli.copy import Copied
from cairn.cli.output import Col, heading, human_size, make_table, plural
from cairn.cli.restore import Restored
from cairn.cli.verify import Verified
from cairn.cli.views.summary import id_table, plain

__all__ = [
    "copy_doc",
    "copy_table",
    "restore_doc",
    "restore_table",
    "verify_doc",
    "verify_table",
]


def verify_doc(where: dict[str, str], results: list[Verified]) -> dict[str, Any]:
    """``cairn verify --json``: ``ok`` is true only when every checkpoint verified."""
    return {
        **where,
        "ok": all(r.ok for r in results),
        "checkpoints": [
            {
                "id": str(r.checkpoint_id),
                "ok": r.ok,
                "status": r.status,
                "epoch": r.epoch,
                "artifacts": r.artifacts,
                "size_bytes": r.size_bytes,
                "error": r.error,
                "signature": r.signature,
                "key_id": r.key_id,
                "damaged": [
                    {
                        "operator": d.operator,
                        "partition": d.partition,
                        "item": d.item,
                        "file": d.file,
                        "path": d.path,
                        "error": d.error,
                    }
                    for d in r.damaged
                ],
            }
            for r in results
        ],
    }


def verify_table(
    results: list[Verified], *, full_ids: bool = False, wide: bool = False
) -> RenderableType:
    """``cairn verify``: one row per checkpoint, ``ok`` or what is wrong."""
    if not results:
        return Text("no checkpoints to verify")
    names, table = id_table(
        "verification (every SHA-256 of every restore chain)",
        [r.checkpoint_id for r in results],
        Col(">Epoch", 1),
        Col(">Artifacts", 3),
        Col(">Size", 2),
        Col("Signature", 4),
        "Result",
        full_ids=full_ids,
        wide=wide,
    )
    for r in results:
        style = "green" if r.ok else "yellow" if r.newer else "red"
        result = Text("ok" if r.ok else r.error or "failed", style=style)
        table.add_row(
            plain(names[r.checkpoint_id]),
            plain("?" if r.epoch is None else r.epoch),
            plain("" if r.epoch is None else r.artifacts),
            plain("" if r.epoch is None else human_size(r.size_bytes)),
            plain(r.signature or "?"),
            result,
        )
    return table


def restore_doc(where: dict[str, str], restored: Restored) -> dict[str, Any]:
    """``cairn restore --json``."""
    return {
        **where,
        "id": str(restored.checkpoint_id),
        "epoch": restored.epoch,
        "to": str(restored.target),
        "verified": True,
        "size_bytes": restored.size_bytes,
        "files": [
            {"path": path, "size_bytes": size, "action": restored.actions.get(path, "created")}
            for path, size in restored.files
        ],
    }


def restore_table(restored: Restored) -> RenderableType:
    """``cairn restore``: the files written, then a one-line summary."""
    table = make_table("", "File", ">Size", "")
    for path, size in restored.files:
        action = restored.actions.get(path, "created")
        table.add_row(plain(path), plain(human_size(size)), plain(action))
    unchanged = sum(1 for action in restored.actions.values() if action == "unchanged")
    kept = f" ({unchanged} already there)" if unchanged else ""
    summary = Text(
        f"restored checkpoint {restored.checkpoint_id} (epoch {restored.epoch}): "
        f"{plural(len(restored.files), 'file')}{kept}, {human_size(restored.size_bytes)}, "
        "every digest verified on disk"
    )
    return Group(heading(f"files restored under {restored.target}"), table, summary)


def copy_doc(where: dict[str, str], to: dict[str, str], results: list[Copied]) -> dict[str, Any]:
    """``cairn copy --json``: ``ok`` is true only when every checkpoint is in the target."""
    return {
        **where,
        "to": to,
        "ok": all(r.ok for r in results),
        "checkpoints": [
            {
                "id": str(r.checkpoint_id),
                "epoch": r.epoch,
                "status": r.status,
                "requested": r.requested,
                "uploaded_bytes": r.size_bytes,
                "error": r.error,
                "note": r.note,
            }
            for r in results
        ],
    }


_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def copy_table(
    results: list[Copied], to: str, *, full_ids: bool = False, wide: bool = False
) -> RenderableType:
    """``cairn copy``: one row per checkpoint handled, in copy order (oldest first)."""
    if not results:
        return Text("nothing to copy")
    # Ids are as short as they are unique among the rows and the ids their notes name.
    noted = {CheckpointId.parse(m) for r in results for m in _UUID.findall(r.note or "")}
    names, table = id_table(
        "",
        sorted({r.checkpoint_id for r in results} | noted),
        Col(">Epoch", 1),
        "Result",
        Col(">Uploaded", 2),
        "Note",
        full_ids=full_ids,
        wide=wide,
    )
    labels = {
        "copied": "copied",
        "present": "already there",
        "skipped": "skipped",
        "newer": "not copied",
        "failed": "FAILED",
    }
    styles = {"failed": "red", "skipped": "yellow", "newer": "yellow"}
    short = {str(cid): name for cid, name in names.items()}  # a note's ids as the table's
    for r in results:
        style = styles.get(r.status, "green")
        note = r.error or r.note or ("" if r.requested else "its child's manifest needs it")
        note = _UUID.sub(lambda m: short.get(m.group(0), m.group(0)), note)
        table.add_row(
            plain(names[r.checkpoint_id]),
            plain("?" if r.epoch is None else r.epoch),
            Text(labels[r.status], style=style),
            plain(human_size(r.size_bytes) if r.status == "copied" else ""),
            plain(note),
        )
    return Group(heading(f"copy to {to} (oldest first, each verified in the target)"), table)
