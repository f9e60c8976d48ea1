"""What each command prints: a rich table for people, one JSON document for scripts.

Every ``*_doc`` function returns the JSON document of a command (plain dicts and lists,
ids as strings, times as ISO 8601 and milliseconds); every ``*_table`` function the rich
renderable for the same facts, with sizes and ages in human units. The printed document
also carries ``schema_version`` and, on failure, ``error`` (:class:`cairn.cli.output.Output`);
:func:`json_schema` is each command's JSON Schema. Names that come
from the store (operators, sources) are always printed as plain text, never as markup.
A time with no date (beyond year 9999) is never an error: ``created`` is null in JSON
and the raw milliseconds for people.

``show`` of a large checkpoint (over :data:`SHOW_ENTRIES_LIMIT` artifacts) is a
summary by default: one row per operator (partitions, snapshots, deltas, carried
artifacts, bytes), at most :data:`SHOW_ROWS_LIMIT` rows per table. ``--partitions``
lists every artifact and every source. The JSON document follows the same rule, so the
two outputs always hold the same facts: ``operators`` (the per-operator summary) and
``source_offsets`` are always complete, and ``entries`` (one per artifact) is present
exactly when the artifacts are listed (``"listed": true``).
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cairn import CheckpointId, CheckpointManifest, GcResult
from cairn.cli.catalog import Listed
from cairn.cli.copy import Copied
from cairn.cli.maintain import Deleted
from cairn.cli.output import Col, FitTable, human_age, human_size, iso_time, make_table, time_text
from cairn.cli.restore import Restored
from cairn.cli.verify import Verified
from cairn.format.manifest import SaveStats, StoreRequests
from cairn.protocol.discover import checkpoint_counts, short_ids

__all__ = [
    "COMMANDS_WITH_SCHEMAS",
    "copy_doc",
    "copy_table",
    "cost_doc",
    "delete_doc",
    "delete_text",
    "gc_doc",
    "gc_table",
    "id_texts",
    "json_schema",
    "list_doc",
    "list_table",
    "manifest_doc",
    "requests_text",
    "restore_doc",
    "restore_table",
    "show_doc",
    "show_lists_entries",
    "show_table",
    "signature_text",
    "verify_doc",
    "verify_table",
]


COMMANDS_WITH_SCHEMAS = (
    "list",
    "history",
    "show",
    "verify",
    "restore",
    "delete",
    "gc",
    "copy",
    "demo",
    "export-dcp",
    "import-dcp",
)
"""The commands whose ``--json`` document has a JSON Schema in ``cairn/cli/schemas/``."""


def json_schema(command: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``cairn COMMAND --json``'s document.

    Each document carries ``schema_version`` (1); a failed command's document is either
    the result with an ``error`` member, or ``{"schema_version", "error"}`` alone.
    """
    if command not in COMMANDS_WITH_SCHEMAS:
        raise ValueError(f"no JSON schema for command {command!r}")
    resource = importlib.resources.files("cairn.cli") / "schemas" / f"{command}.schema.json"
    schema: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return schema


SHOW_ENTRIES_LIMIT = 200
"""``show`` lists every artifact of a checkpoint up to this many; above, it summarises."""

SHOW_ROWS_LIMIT = 50
"""The most operators or sources a summarising ``show`` prints, each in its own table."""


def _plain(value: object) -> Text:
    return Text("" if value is None else str(value))


def _id(cid: CheckpointId | None) -> str | None:
    return None if cid is None else str(cid)


def id_texts(ids: list[CheckpointId], full: bool = False) -> dict[CheckpointId, str]:
    """How a table names each of ``ids``: the shortest prefix that is unique among them
    (at least 8 characters, :func:`cairn.protocol.discover.short_ids`; every command takes it back),
    or the whole id with ``full`` (``--ids``, ``--wide``)."""
    return {cid: str(cid) for cid in ids} if full else short_ids(ids)


FULL = "full"
INCREMENTAL = "incremental"


def id_table(
    title: str,
    ids: list[CheckpointId],
    *columns: str | Col,
    full_ids: bool = False,
    wide: bool = False,
) -> tuple[dict[CheckpointId, str], FitTable]:
    """A table whose first column is the checkpoint id, never dropped nor cut, and the
    text of each of ``ids`` in it: short unless ``full_ids`` or ``wide``."""
    names = id_texts(ids, full_ids or wide)
    return names, make_table(title, Col("ID", whole=True), *columns, wide=wide)


def kind(manifest: CheckpointManifest) -> str:
    """The kind of a checkpoint, the one word for it in every output (``cairn demo``'s
    too): ``full`` when it holds every partition's state itself, else ``incremental``
    (it carries state of earlier checkpoints, artifacts or directory files, or holds
    deltas). An artifact's kind is
    ``snapshot`` or ``delta``."""
    entries = [entry for _, entry in manifest.partition_entries()]
    files = [file for _, file in manifest.file_entries()]
    if all(e.owner is None and not e.is_delta for e in entries) and all(
        f.owner is None for f in files
    ):
        return FULL
    return INCREMENTAL


def manifest_doc(manifest: CheckpointManifest) -> dict[str, Any]:
    """The summary of one manifest: what ``list`` shows per checkpoint.

    ``name`` is the name it was saved under besides its id (a DCP save's
    ``checkpoint_id``, see :mod:`cairn.torch`), or None.
    The counts are :func:`cairn.protocol.discover.checkpoint_counts`, the same numbers every
    output shows: ``artifacts`` are the entries of its restore chains, ``uploaded_*`` the
    checkpoint's own, ``carried_*`` those it references from earlier checkpoints (the
    whole chain; bytes as handed to ``save``); ``duration_ms``, ``upload_ms``,
    ``commit_ms``, ``retries``, ``stored_bytes`` (what the save left in the store: its
    objects as stored, its manifest and parts) and ``requests`` (the store requests it
    made up to its commit, by kind) come from the save's statistics, each absent for
    checkpoints saved before cairn recorded it.
    """
    counts = checkpoint_counts(manifest)
    doc = {
        "id": str(manifest.checkpoint_id),
        "epoch": manifest.epoch,
        "name": manifest.name,
        "created": iso_time(manifest.timestamp_ms),
        "timestamp_ms": manifest.timestamp_ms,
        "kind": kind(manifest),
        "parent_id": _id(manifest.parent_id),
        "partitions": counts.partitions,
        "artifacts": counts.artifacts,
        "uploaded_artifacts": counts.uploaded_artifacts,
        "size_bytes": counts.size_bytes,
        "uploaded_bytes": counts.uploaded_bytes,
        "carried_artifacts": counts.carried_artifacts,
        "carried_bytes": counts.carried_bytes,
        "watermark": manifest.watermark,
        "writer_generation": counts.writer_generation,
    }
    stats = manifest.stats
    if stats is not None:  # manifests written before statistics existed have none
        doc.update(
            duration_ms=stats.duration_ms,
            upload_ms=stats.upload_ms,
            commit_ms=stats.commit_ms,
            retries=stats.retries,
        )
        doc.update(cost_doc(stats))
    return doc


REQUEST_KINDS = ("put", "get", "head", "list", "delete")
"""The kinds of store request a save's statistics count, in the order they are shown."""


def cost_doc(stats: SaveStats) -> dict[str, Any]:
    """``stored_bytes`` and ``requests`` (by kind) of a save's statistics, those it has."""
    doc: dict[str, Any] = {}
    if isinstance(stats.stored_bytes, int):
        doc["stored_bytes"] = stats.stored_bytes
    if isinstance(stats.requests, StoreRequests):
        doc["requests"] = {kind: getattr(stats.requests, kind) for kind in REQUEST_KINDS}
    return doc


def requests_text(requests: dict[str, int]) -> str:
    """``12 (5 PUT, 3 GET, 2 HEAD, 2 LIST, 0 DELETE)``: a save's requests, for people."""
    kinds = ", ".join(f"{requests[kind]} {kind.upper()}" for kind in REQUEST_KINDS)
    return f"{sum(requests.values())} ({kinds})"


# -- list ----------------------------------------------------------------------------------


def list_doc(
    where: dict[str, str],
    listed: list[Listed],
    latest: CheckpointId | None,
    other_prefixes: list[str] | None = None,
) -> dict[str, Any]:
    """``cairn list --json``: ``other_prefixes`` names where else checkpoints are, when
    there are none under the prefix."""
    rows: list[dict[str, Any]] = []
    for item in listed:
        if item.manifest is not None:
            row = manifest_doc(item.manifest)
        else:
            row = {"id": str(item.checkpoint_id), "error": item.error}
        row["latest"] = item.checkpoint_id == latest
        rows.append(row)
    return {
        **where,
        "latest": _id(latest),
        "count": len(rows),
        "checkpoints": rows,
        "other_prefixes": list(other_prefixes or []),
    }


def artifacts_text(manifest: CheckpointManifest) -> str:
    """A checkpoint's artifacts in the words of every table: ``22 (10 new)``, or ``12``
    when all are its own (:func:`cairn.protocol.discover.checkpoint_counts`)."""
    counts = checkpoint_counts(manifest)
    new = counts.uploaded_artifacts
    return str(counts.artifacts) + (f" ({new} new)" if new != counts.artifacts else "")


def list_table(
    listed: list[Listed], latest: CheckpointId | None, *, full_ids: bool = False, wide: bool = False
) -> RenderableType:
    """``cairn list``: one row per committed checkpoint, oldest first (with a Name column
    when any of them has a name). Ids are short unless ``full_ids``; columns give way
    to the width, the least useful first, unless ``wide``."""
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
        if item.checkpoint_id == latest:
            marks.append(Text("◀ latest", style="bold"))
        manifest = item.manifest
        if manifest is None:
            marks.append(Text("unreadable", style="red"))
            table.add_row(
                _plain(names[item.checkpoint_id]),
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
            _plain(names[item.checkpoint_id]),
            _plain(manifest.name or ""),
            _plain(manifest.epoch),
            _plain(human_age(manifest.timestamp_ms)),
            _plain(doc["kind"]),
            _plain(artifacts_text(manifest)),
            _plain(human_size(doc["size_bytes"])),
            _plain(human_size(doc["uploaded_bytes"])),
            _plain(f"{doc['duration_ms'] / 1000:.2f} s" if "duration_ms" in doc else "—"),
            Text(" ").join(marks),
        )
    return table


# -- show ----------------------------------------------------------------------------------


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
    latest: bool,
    listed: bool = True,
    *,
    signature: str = "unsigned",
    key_id: str | None = None,
) -> dict[str, Any]:
    """``cairn show --json``: the summary, source offsets, per-operator totals, and (when
    ``listed``) every artifact. ``signature`` is one of
    :data:`cairn.cli.verify.SIGNATURE_STATES` and ``key_id`` the key it names."""
    doc = manifest_doc(manifest)
    doc["latest"] = latest
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
    latest: bool,
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
        ("checkpoint", f"{manifest.checkpoint_id}" + ("  ◀ latest" if latest else "")),
        ("name", manifest.name or "—"),
        ("epoch", manifest.epoch),
        ("created", created),
        ("kind", doc["kind"]),
        ("parent", manifest.parent_id or "—"),
        (
            "size",
            f"{human_size(doc['size_bytes'])} in {artifacts_text(manifest)} artifacts "
            f"({human_size(doc['uploaded_bytes'])} uploaded by this checkpoint)",
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
        facts.add_row(Text(name), _plain(value))
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
                _plain(name), _plain(offset.source_type), _plain(offsets), _plain(offset.epoch)
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
        f"{doc['artifacts']} artifacts in {len(summaries)} operators",
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
            _plain(row["operator"]),
            _plain(row["partitions"]),
            _plain(row["snapshots"]),
            _plain(row["deltas"]),
            _plain(row["carried"]),
            _plain(human_size(row["size_bytes"])),
        )
    parts.append(table)
    hidden = len(summaries) - SHOW_ROWS_LIMIT
    more = f"{hidden} more operators not shown; " if hidden > 0 else ""
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
            _plain(row["operator"]),
            _plain(row["partition"]),
            _plain(row["files"]),
            _plain(row["carried_files"]),
            _plain(human_size(row["size_bytes"])),
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
            _plain(operator),
            _plain(entry.partition_id),
            _plain("delta" if entry.is_delta else "snapshot"),
            _plain(human_size(entry.size_bytes)),
            _plain(holder),
            _plain(entry.sha256[:16] + "…"),
        )
    return artifacts


# -- verify --------------------------------------------------------------------------------


def verify_doc(where: dict[str, str], results: list[Verified]) -> dict[str, Any]:
    """``cairn verify --json``: ``ok`` is true only when every checkpoint verified."""
    return {
        **where,
        "ok": all(r.ok for r in results),
        "checkpoints": [
            {
                "id": str(r.checkpoint_id),
                "ok": r.ok,
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
        result = Text("ok", style="green") if r.ok else Text(r.error or "failed", style="red")
        table.add_row(
            _plain(names[r.checkpoint_id]),
            _plain("?" if r.epoch is None else r.epoch),
            _plain("" if r.epoch is None else r.artifacts),
            _plain("" if r.epoch is None else human_size(r.size_bytes)),
            _plain(r.signature or "?"),
            result,
        )
    return table


# -- restore -------------------------------------------------------------------------------


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
    table = make_table(f"files restored under {restored.target}", "File", ">Size", "")
    for path, size in restored.files:
        action = restored.actions.get(path, "created")
        table.add_row(_plain(path), _plain(human_size(size)), _plain(action))
    unchanged = sum(1 for action in restored.actions.values() if action == "unchanged")
    kept = f" ({unchanged} already there)" if unchanged else ""
    summary = Text(
        f"restored checkpoint {restored.checkpoint_id} (epoch {restored.epoch}): "
        f"{len(restored.files)} files{kept}, {human_size(restored.size_bytes)}, "
        "every digest verified on disk"
    )
    return Group(table, summary)


# -- copy ----------------------------------------------------------------------------------


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


def copy_table(
    results: list[Copied], to: str, *, full_ids: bool = False, wide: bool = False
) -> RenderableType:
    """``cairn copy``: one row per checkpoint handled, in copy order (oldest first)."""
    if not results:
        return Text("nothing to copy")
    names, table = id_table(
        f"copy to {to} (oldest first, each verified in the target)",
        [r.checkpoint_id for r in results],
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
        "failed": "FAILED",
    }
    styles = {"failed": "red", "skipped": "yellow"}
    for r in results:
        style = styles.get(r.status, "green")
        note = r.error or r.note or ("" if r.requested else "its child's manifest needs it")
        table.add_row(
            _plain(names[r.checkpoint_id]),
            _plain("?" if r.epoch is None else r.epoch),
            Text(labels[r.status], style=style),
            _plain(human_size(r.size_bytes) if r.status == "copied" else ""),
            _plain(note),
        )
    return table


# -- delete, gc ----------------------------------------------------------------------------


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
        "failures": [{"path": path, "reason": reason} for path, reason in result.failures],
        "damaged": [
            {"checkpoint_id": str(cid), "reason": reason} for cid, reason in result.damaged.items()
        ],
        "foreign_objects": list(result.foreign_objects),
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
        [*result.deleted, *result.retained, *result.damaged],
        "Decision",
        full_ids=full_ids,
        wide=wide,
    )
    for cid in result.deleted:
        table.add_row(_plain(names[cid]), Text(verb, style="yellow"))
    for cid in result.retained:
        why = ", ".join(result.reasons.get(cid, []))
        table.add_row(_plain(names[cid]), Text(f"kept: {why}" if why else "kept", style="green"))
    for cid, reason in result.damaged.items():
        table.add_row(_plain(names[cid]), Text(f"left alone: damaged: {reason}", style="red"))
    for path, reason in result.failures:
        table.add_row(Text(""), Text(f"could not delete {path}: {reason}", style="red"))
    summary = Text(
        f"{verb} {len(result.deleted)} checkpoint(s) and {len(result.orphans_deleted)} "
        f"orphaned object(s), kept {len(result.retained)}; "
        f"{'would reclaim' if result.dry_run else 'reclaimed'} "
        f"{human_size(result.bytes_reclaimed)}"
    )
    if result.pack_bytes > result.pack_range_bytes:
        summary.append(
            f"; shared objects kept: {human_size(result.pack_bytes)} for "
            f"{human_size(result.pack_range_bytes)} that kept checkpoints still use"
        )
    shown: list[RenderableType] = [summary]
    if result.deleted or result.retained or result.damaged or result.failures:
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
