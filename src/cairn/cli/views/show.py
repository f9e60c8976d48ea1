"""``cairn show``: one checkpoint, its sources and its restore chains, or their summary.

``show`` of a large checkpoint (over :data:`SHOW_ENTRIES_LIMIT` artifacts) is a
summary by default: one row per operator (partitions, snapshots, deltas, carried
artifacts, bytes), at most :data:`SHOW_ROWS_LIMIT` rows per table. ``--partitions``
lists every artifact and every source. The JSON document follows the same rule, so the
two outputs always hold the same facts: ``operators`` (the per-operator summary) and
``source_offsets`` are always complete, and ``entries`` (one per artifact) is present
exactly when the artifacts are listed (``"listed": true``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cairn import CheckpointId, CheckpointManifest
from cairn.cli.catalog import Latest
from cairn.cli.output import Col, human_age, human_size, make_table, plural, time_text
from cairn.cli.views.summary import artifacts_text, id_texts, manifest_doc, plain, requests_text

__all__ = [
    "SHOW_ENTRIES_LIMIT",
    "SHOW_ROWS_LIMIT",
    "directory_summaries",
    "operator_summaries",
    "show_doc",
    "show_lists_entries",
    "show_table",
    "signature_text",
]

SHOW_ENTRIES_LIMIT = 200
"""``show`` lists every artifact of a checkpoint up to this many; above, it summarises."""

SHOW_ROWS_LIMIT = 50
"""The most operators or sources a summarising ``show`` prints, each in its own table."""


def show_lists_entries(manifest: CheckpointManifest, partitions: bool) -> bool:
    """Whether ``show`` lists every artifact: asked to (``--partitions``), or few enough."""
    count = sum(len(entry.partitions) for entry in manifest.operators.values())
    return partitions or (
        count <= SHOW_ENTRIES_LIMIT and len(manifest.source_offsets) <= SHOW_ROWS_LIMIT
    )


def operator_summaries(manifest: CheckpointManifest) -> list[dict[str, Any]]:
    """Per operator: partitions, snapshots, deltas, carried artifacts and bytes."""
    rows: list[dict[str, Any]] = []
    for operator, entry in sorted(manifest.operators.items()):
        parts = entry.partitions
        deltas = sum(1 for p in parts if p.is_delta)
        rows.append(
            {
                "operator": operator,
                "partitions": len({p.partition_id for p in parts}),
                "artifacts": len(parts),
                "snapshots": len(parts) - deltas,
                "deltas": deltas,
                "carried": sum(1 for p in parts if p.owner is not None),
                "size_bytes": sum(p.size_bytes for p in parts),
            }
        )
    return rows


def directory_summaries(manifest: CheckpointManifest) -> list[dict[str, Any]]:
    """Per directory partition: its files, how many of them are carried, their bytes."""
    return [
        {
            "operator": directory.operator,
            "partition": directory.partition_id,
            "files": len(directory.files),
            "carried_files": sum(1 for f in directory.files if f.owner is not None),
            "size_bytes": sum(f.size_bytes for f in directory.files),
        }
        for directory in sorted(manifest.directories, key=lambda d: (d.operator, d.partition_id))
    ]


def show_doc(
    manifest: CheckpointManifest,
    mark: Latest,
    listed: bool = True,
    *,
    signature: str = "unsigned",
    key_id: str | None = None,
) -> dict[str, Any]:
    """``cairn show --json``: the summary, source offsets, per-operator totals, and (when
    ``listed``) every artifact. ``signature`` is one of
    :data:`cairn.cli.verify.SIGNATURE_STATES` and ``key_id`` the key it names."""
    doc = manifest_doc(manifest)
    doc["latest"] = manifest.checkpoint_id == mark.latest
    doc["newest"] = manifest.checkpoint_id == mark.newest
    doc["signature"] = signature
    doc["key_id"] = key_id
    doc["source_offsets"] = {
        name: {"source_type": e.source_type, "offsets": dict(e.offsets), "epoch": e.epoch}
        for name, e in sorted(manifest.source_offsets.items())
    }
    doc["operators"] = operator_summaries(manifest)
    doc["directories"] = directory_summaries(manifest)
    doc["listed"] = listed
    if listed:
        doc["entries"] = [
            {
                "operator": operator,
                "partition": entry.partition_id,
                "kind": "delta" if entry.is_delta else "snapshot",
                "path": entry.path,
                "offset": entry.offset,
                "owner": str(entry.owner or manifest.checkpoint_id),
                "carried": entry.owner is not None,
                "size_bytes": entry.size_bytes,
                "sha256": entry.sha256,
                "codec": entry.codec,
            }
            for operator, entry in manifest.partition_entries()
        ]
    return doc


def _mark_text(cid: CheckpointId, mark: Latest) -> str:
    """What ``cairn show`` says beside the id of the latest, or of a newest that fails."""
    if cid == mark.latest:
        return "  ◀ latest"
    if cid == mark.newest and not mark.verified:
        return "  ◀ newest (too large to verify here: cairn verify latest)"
    if cid == mark.newest:
        return "  ◀ newest, does not load (the latest is older)"
    return ""


def _more(shown: int, total: int, what: str) -> RenderableType | None:
    if shown >= total:
        return None
    return Text(f"{total - shown} more {what} not shown; --partitions lists every one")


def signature_text(signature: str | None, key_id: str | None) -> str:
    """A signature state (:data:`cairn.cli.verify.SIGNATURE_STATES`) in words."""
    key = f" by key {key_id}" if key_id else ""
    return {
        "verified": f"signed{key}, verified",
        "invalid": f"signed{key}, DOES NOT VERIFY with CAIRN_SIGNING_KEY",
        "unsigned": "unsigned",
        "unchecked": f"signed{key}, not checked (no CAIRN_SIGNING_KEY)",
    }.get(signature or "", "unknown")


def show_table(
    manifest: CheckpointManifest,
    mark: Latest,
    listed: bool = True,
    *,
    signature: str = "unsigned",
    key_id: str | None = None,
    full_ids: bool = False,
    wide: bool = False,
) -> RenderableType:
    """``cairn show``: the checkpoint's facts, its sources, and its restore chains.

    Unless ``listed``, the chains are summarised per operator and each table holds at
    most :data:`SHOW_ROWS_LIMIT` rows.
    """
    doc = manifest_doc(manifest)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    created = f"{time_text(manifest.timestamp_ms)} ({human_age(manifest.timestamp_ms)})"
    for name, value in (
        ("checkpoint", f"{manifest.checkpoint_id}{_mark_text(manifest.checkpoint_id, mark)}"),
        ("name", manifest.name or "—"),
        ("epoch", manifest.epoch),
        ("created", created),
        ("kind", doc["kind"]),
        ("parent", manifest.parent_id or "—"),
        (
            "size",
            f"{human_size(doc['size_bytes'])} in {artifacts_text(manifest)} "
            f"artifact{'' if doc['artifacts'] == 1 else 's'} "
            f"({human_size(doc['uploaded_bytes'])} uploaded by this checkpoint)",
        ),
        (
            "sent",
            f"{human_size(doc['sent_bytes'])} of artifacts by its save, as stored (after "
            "compression)"
            if "sent_bytes" in doc
            else "—",
        ),
        (
            "stored",
            f"{human_size(doc['stored_bytes'])} by its save: its own objects as stored, "
            "its manifest"
            if "stored_bytes" in doc
            else "—",
        ),
        (
            "requests",
            f"{requests_text(doc['requests'])} up to its commit" if "requests" in doc else "—",
        ),
        ("watermark", "—" if manifest.watermark is None else manifest.watermark),
        ("writer generation", doc["writer_generation"]),
        ("signature", signature_text(signature, key_id)),
    ):
        facts.add_row(Text(name), plain(value))
    parts: list[RenderableType] = [facts]
    limit = None if listed else SHOW_ROWS_LIMIT
    if manifest.source_offsets:
        sources = make_table(
            "source offsets", "Source", Col("Type", 3), "Offsets", Col(">Epoch", 2), wide=wide
        )
        chosen = sorted(manifest.source_offsets.items())[:limit]
        for name, offset in chosen:
            offsets = ", ".join(f"{k}={v}" for k, v in sorted(offset.offsets.items()))
            sources.add_row(
                plain(name), plain(offset.source_type), plain(offsets), plain(offset.epoch)
            )
        parts.append(sources)
        more = _more(len(chosen), len(manifest.source_offsets), "sources")
        if more is not None:
            parts.append(more)
    if manifest.directories:
        parts.append(_directories_table(manifest, wide=wide))
    if listed:
        parts.append(_artifacts_table(manifest, full_ids=full_ids or wide, wide=wide))
        return Group(*parts)
    summaries = operator_summaries(manifest)
    table = make_table(
        f"{plural(doc['artifacts'], 'artifact')} in {plural(len(summaries), 'operator')}",
        "Operator",
        ">Partitions",
        Col(">Snapshots", 2),
        Col(">Deltas", 2),
        Col(">Carried", 1),
        ">Size",
        wide=wide,
    )
    for row in summaries[:limit]:
        table.add_row(
            plain(row["operator"]),
            plain(row["partitions"]),
            plain(row["snapshots"]),
            plain(row["deltas"]),
            plain(row["carried"]),
            plain(human_size(row["size_bytes"])),
        )
    parts.append(table)
    hidden = len(summaries) - SHOW_ROWS_LIMIT
    more = f"{plural(hidden, 'more operator')} not shown; " if hidden > 0 else ""
    parts.append(Text(f"{more}--partitions lists every artifact"))
    return Group(*parts)


def _directories_table(manifest: CheckpointManifest, *, wide: bool = False) -> RenderableType:
    table = make_table(
        "directory partitions (files, carried from earlier checkpoints or uploaded)",
        "Operator",
        ">Partition",
        ">Files",
        Col(">Carried", 1),
        ">Size",
        wide=wide,
    )
    for row in directory_summaries(manifest):
        table.add_row(
            plain(row["operator"]),
            plain(row["partition"]),
            plain(row["files"]),
            plain(row["carried_files"]),
            plain(human_size(row["size_bytes"])),
        )
    return table


def _artifacts_table(
    manifest: CheckpointManifest, *, full_ids: bool = False, wide: bool = False
) -> RenderableType:
    artifacts = make_table(
        "artifacts (restore chains: base snapshot, then deltas)",
        "Operator",
        ">Partition",
        Col("Kind", 2),
        Col(">Size", 3),
        Col("Held by", 1, whole=True),
        Col("SHA-256", 4),
        wide=wide,
    )
    entries = manifest.partition_entries()
    owners = {manifest.checkpoint_id} | {e.owner for _, e in entries if e.owner is not None}
    names = id_texts(sorted(owners), full_ids)
    for operator, entry in entries:
        holder = "this checkpoint" if entry.owner is None else names[entry.owner]
        artifacts.add_row(
            plain(operator),
            plain(entry.partition_id),
            plain("delta" if entry.is_delta else "snapshot"),
            plain(human_size(entry.size_bytes)),
            plain(holder),
            plain(entry.sha256[:16] + "…"),
        )
    return artifacts
