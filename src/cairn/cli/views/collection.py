"""``cairn delete`` and ``cairn gc``: what was (or would be) deleted, and what was kept
and why."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cairn import GcResult
from cairn.cli.maintain import Deleted
from cairn.cli.output import human_size
from cairn.cli.views.summary import id_table, plain

__all__ = ["FOREIGN_SHOWN", "delete_doc", "delete_text", "gc_doc", "gc_table"]


def delete_doc(where: dict[str, str], deleted: Deleted) -> dict[str, Any]:
    """``cairn delete --json``."""
    return {
        **where,
        "deleted": str(deleted.checkpoint_id),
        "epoch": deleted.epoch,
        "size_bytes": deleted.size_bytes,
        "broken_dependents": [str(d) for d in deleted.dependents],
        "dry_run": deleted.dry_run,
    }


def delete_text(deleted: Deleted) -> RenderableType:
    """``cairn delete``: one line."""
    epoch = "?" if deleted.epoch is None else deleted.epoch
    verb = "would delete" if deleted.dry_run else "deleted"
    text = (
        f"{verb} checkpoint {deleted.checkpoint_id} (epoch {epoch}, "
        f"{human_size(deleted.size_bytes)} of its own artifacts)"
    )
    if deleted.dependents:
        would = "would no longer load" if deleted.dry_run else "no longer load"
        text += f"; {len(deleted.dependents)} checkpoint(s) or save(s) built on it {would}"
    return Text(text)


def gc_doc(where: dict[str, str], result: GcResult) -> dict[str, Any]:
    """``cairn gc --json``."""
    return {
        **where,
        "dry_run": result.dry_run,
        "deleted": [str(c) for c in result.deleted],
        "retained": [str(c) for c in result.retained],
        "reasons": {str(c): list(result.reasons.get(c, [])) for c in result.retained},
        "bytes_reclaimed": result.bytes_reclaimed,
        "orphans_deleted": list(result.orphans_deleted),
        "staging_files_deleted": list(result.staging_files_deleted),
        "failures": [{"path": path, "reason": reason} for path, reason in result.failures],
        "damaged": [
            {"checkpoint_id": str(cid), "reason": reason} for cid, reason in result.damaged.items()
        ],
        "foreign_objects": list(result.foreign_objects),
        "newer_format": [
            {"checkpoint_id": str(cid), "reason": reason}
            for cid, reason in result.newer_format.items()
        ],
        "pack_bytes": result.pack_bytes,
        "pack_range_bytes": result.pack_range_bytes,
    }


FOREIGN_SHOWN = 10
"""The objects cairn did not write that ``cairn gc`` names one by one (``--json`` has all)."""


def gc_table(result: GcResult, *, full_ids: bool = False, wide: bool = False) -> RenderableType:
    """``cairn gc``: what was (or, in a dry run, would be) deleted, and what was kept."""
    verb = "would delete" if result.dry_run else "deleted"
    dry = " (dry run)" if result.dry_run else ""
    names, table = id_table(
        f"garbage collection{dry}",
        [*result.deleted, *result.retained, *result.damaged, *result.newer_format],
        "Decision",
        full_ids=full_ids,
        wide=wide,
    )
    for cid in result.deleted:
        table.add_row(plain(names[cid]), Text(verb, style="yellow"))
    for cid in result.retained:
        why = ", ".join(result.reasons.get(cid, []))
        table.add_row(plain(names[cid]), Text(f"kept: {why}" if why else "kept", style="green"))
    for cid, reason in result.damaged.items():
        table.add_row(plain(names[cid]), Text(f"left alone: damaged: {reason}", style="red"))
    for cid in result.newer_format:
        table.add_row(
            plain(names[cid]), Text("needs a newer cairn: nothing deleted", style="yellow")
        )
    for path, reason in result.failures:
        table.add_row(Text(""), Text(f"could not delete {path}: {reason}", style="red"))
    summary = Text(
        f"{verb} {len(result.deleted)} checkpoint(s) and {len(result.orphans_deleted)} "
        f"orphaned object(s), kept {len(result.retained)}; "
        f"{'would reclaim' if result.dry_run else 'reclaimed'} "
        f"{human_size(result.bytes_reclaimed)}"
    )
    if result.staging_files_deleted:
        summary.append(
            f"; removed {len(result.staging_files_deleted)} file(s) of writes cut mid-way"
        )
    if result.pack_bytes > result.pack_range_bytes:
        summary.append(
            f"; shared objects kept: {human_size(result.pack_bytes)} for "
            f"{human_size(result.pack_range_bytes)} that kept checkpoints still use"
        )
    shown: list[RenderableType] = [summary]
    if (
        result.deleted
        or result.retained
        or result.damaged
        or result.newer_format
        or result.failures
    ):
        shown.insert(0, table)  # an empty table would only wrap its title
    if result.foreign_objects:
        shown.append(_foreign_text(result.foreign_objects))
    return shown[0] if len(shown) == 1 else Group(*shown)


def _foreign_text(paths: list[str]) -> Text:
    """The objects ``cairn gc`` left alone because cairn did not write them."""
    text = Text(
        f"left alone: {len(paths)} object(s) in checkpoint directories that cairn did not write:",
        style="yellow",
    )
    for path in paths[:FOREIGN_SHOWN]:
        text.append(f"\n  {path}")
    if len(paths) > FOREIGN_SHOWN:
        text.append(f"\n  ... and {len(paths) - FOREIGN_SHOWN} more (--json lists them all)")
    return text
