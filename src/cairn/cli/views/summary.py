"""One checkpoint in the words every output uses: its id, kind, summary and costs.

Ids are shown short (the fewest characters, 8 or more, that tell a table's ids apart)
unless whole ones are asked for; a checkpoint is ``full`` or ``incremental``; the counts
are :func:`cairn.protocol.discover.checkpoint_counts`, the same numbers in every table
and document. Names that come from the store are plain text, never markup.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from cairn import CheckpointId, CheckpointManifest
from cairn.cli.output import Col, FitTable, iso_time, make_table
from cairn.format.manifest import SaveStats, StoreRequests
from cairn.protocol.discover import checkpoint_counts, short_ids

__all__ = [
    "FULL",
    "INCREMENTAL",
    "REQUEST_KINDS",
    "artifacts_text",
    "cost_doc",
    "id_table",
    "id_text",
    "id_texts",
    "kind",
    "manifest_doc",
    "plain",
    "requests_text",
]


def plain(value: object) -> Text:
    """``value`` as plain text (never markup); None as nothing."""
    return Text("" if value is None else str(value))


def id_text(cid: CheckpointId | None) -> str | None:
    """A checkpoint id as JSON holds it: a string, or None."""
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
    ``commit_ms``, ``retries``, ``sent_bytes`` (the bytes of the artifacts it sent, as
    stored: after compression), ``stored_bytes`` (what the save left in the store: its
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
        "parent_id": id_text(manifest.parent_id),
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
    """``sent_bytes`` (the bytes of the artifacts the save sent, as stored: after
    compression), ``stored_bytes`` and ``requests`` (by kind) of a save's statistics,
    those it has."""
    doc: dict[str, Any] = {"sent_bytes": stats.uploaded_bytes}
    if isinstance(stats.stored_bytes, int):
        doc["stored_bytes"] = stats.stored_bytes
    if isinstance(stats.requests, StoreRequests):
        doc["requests"] = {kind: getattr(stats.requests, kind) for kind in REQUEST_KINDS}
    return doc


def requests_text(requests: dict[str, int]) -> str:
    """``12 (5 PUT, 3 GET, 2 HEAD, 2 LIST, 0 DELETE)``: a save's requests, for people."""
    kinds = ", ".join(f"{requests[kind]} {kind.upper()}" for kind in REQUEST_KINDS)
    return f"{sum(requests.values())} ({kinds})"


def artifacts_text(manifest: CheckpointManifest) -> str:
    """A checkpoint's artifacts in the words of every table: ``22 (10 new)``, or ``12``
    when all are its own (:func:`cairn.protocol.discover.checkpoint_counts`)."""
    counts = checkpoint_counts(manifest)
    new = counts.uploaded_artifacts
    return str(counts.artifacts) + (f" ({new} new)" if new != counts.artifacts else "")
