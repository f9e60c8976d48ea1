"""The coordinator's commit of a DCP save: DCP's metadata stored, then the manifest.

:func:`commit_dcp` stores DCP's metadata with every item's record as the artifact of
operator ``dcp-metadata``, then commits one manifest naming it and every rank's
artifacts (those carried from a parent included). A save's ranks hand in their records
as one block each (:class:`~cairn.torch._itemtable.RankItems`): the metadata becomes a
chunk table and the blocks, one object of ranges; an import hands in a record per item:
the metadata is pickled whole with them. Both layouts are specified in docs/format.md,
section "DCP checkpoints".

Invariants:

* nothing is committed unless every rank's results are one kind (blocks, or a record
  per item), every item is written once, and every artifact is reported with one entry
  (a carried artifact reported several times gets the sum of the bytes each report
  uses): anything else is :class:`~cairn.IncompleteCheckpointError` before the commit;
* the manifest is written only after the metadata's upload returned, and the
  coordinator's own rank objects' (which it may hand in before they end), through the
  save's own commit (create-only: the commit point).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import msgspec
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.storage import WriteResult

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import CheckpointerError, IncompleteCheckpointError
from cairn.format.ids import CheckpointId
from cairn.format.integrity import sha256_hex
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.format.ranges import Range, RangeSource
from cairn.integrations._interface import (
    InFlight,
    SaveMeter,
    TwoPhaseSave,
    assemble_manifest,
    discard_refused,
)
from cairn.torch._format import METADATA_OPERATOR, ItemRecord, dump_metadata
from cairn.torch._itemtable import RankItems, StoredTable, build_table, carries_ranges
from cairn.torch._rankobject import Written

__all__ = ["commit_dcp", "discard_uploads", "distinct_entries"]

log = logging.getLogger("cairn")


async def commit_dcp(
    ckpt: ObjectStoreCheckpointer,
    save: TwoPhaseSave,
    epoch: int,
    metadata: Metadata,
    results: list[list[WriteResult]],
    save_id: str,
    name: str | None,
    parent_id: CheckpointId | None = None,
    meter: SaveMeter | None = None,
    beside: InFlight | None = None,
) -> CheckpointManifest:
    """Store DCP's ``metadata`` (with every rank's item records) as an artifact of
    ``save``, then commit its manifest naming it and every rank's artifacts (those
    carried from ``parent_id``, the checkpoint an incremental save built on, included).

    Ranks that handed in :class:`RankItems` (a save) get the chunk table and their
    blocks (:mod:`cairn.torch._itemtable`); results with a record each (an import, or a
    save whose ranks handed in records) get the metadata pickled whole with those records. With
    ``meter`` (the save's, which counted the caller's requests), the manifest records
    the save's statistics, with the requests and retries each rank handed in.
    ``beside``: the coordinator's own rank objects, still uploading in this process
    (their entries final): the metadata goes up beside them, the create waits for them,
    and the check after the create covers them."""
    cid = save.checkpoint_id
    metadata.version = CURRENT_DCP_VERSION
    metadata.storage_meta = StorageMeta(checkpoint_id=str(cid), save_id=save_id)
    per_rank = _handed_in(results)
    body: bytes | RangeSource
    if per_rank is not None:
        if meter is not None:
            for rank in per_rank:
                if rank.requests is not None:
                    meter.add(rank.requests, rank.retries)
        stored = await asyncio.to_thread(build_table, metadata, per_rank)
        entries = distinct_entries(pair for rank in per_rank for pair in rank.entries)
        body = await asyncio.to_thread(_MetadataRanges.of, stored)
    else:
        records, entries = _collect(results)
        metadata.storage_data = records
        body = dump_metadata(metadata)

    def manifest_of(named: Sequence[tuple[str, PartitionSnapshotEntry]]) -> CheckpointManifest:
        return assemble_manifest(
            cid,
            epoch,
            named,
            writer_generation=ckpt.writer_generation,
            name=name,
            parent_id=parent_id,
        )

    # The ranks' artifacts are checked, and the fence read, beside the metadata's upload
    # and the end of the coordinator's own uploads, which the check after the create covers.
    flying = {(operator, entry.path) for operator, entry in beside.entries} if beside else set()
    before = [(op, entry) for op, entry in entries if (op, entry.path) not in flying]
    uploaded = await save.upload(
        [(METADATA_OPERATOR, 0, False, body)],
        last=True,
        ahead=manifest_of(before) if entries else None,
        beside=beside,
    )
    if meter is not None:
        meter.uploaded = time.perf_counter()
    manifest = manifest_of([*entries, *uploaded])
    committed = await save.commit(manifest, meter)
    named = f" named {name!r}" if name is not None else ""
    log.info("DCP checkpoint %s%s committed (epoch %d)", cid, named, epoch)
    return committed


async def discard_uploads(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId, results: list[list[WriteResult]]
) -> None:
    """Best effort: remove what every rank uploaded for the save of ``cid`` (``results``:
    theirs), refused before its commit, and their intent; a carried artifact stays."""
    try:
        per_rank = _handed_in(results)
        if per_rank is not None:
            entries = distinct_entries(pair for rank in per_rank for pair in rank.entries)
        else:
            entries = _collect(results)[1]
    except CheckpointerError as exc:  # results that name nothing certain: GC's job
        log.info("what the ranks uploaded for %s is left to GC: %s", cid, exc)
        return
    await discard_refused(ckpt, assemble_manifest(cid, 0, entries))


class _MetadataRanges(RangeSource):
    """The metadata object of a save with a chunk table: range 0 the pickled metadata,
    then each rank's block, with the digest its rank computed."""

    def __init__(self, ranges: list[Range]) -> None:
        self._ranges = ranges

    @classmethod
    def of(cls, stored: StoredTable) -> _MetadataRanges:
        """The ranges of ``stored`` (the metadata pickled and hashed here)."""
        head = dump_metadata(stored.metadata)
        blocks = [Range(block, digest) for block, digest in stored.blocks]
        return cls([Range(head, sha256_hex(head)), *blocks])

    async def _each(self) -> AsyncIterator[Range]:
        for each in self._ranges:
            yield each

    def open(self) -> AsyncIterator[Range]:
        """The same ranges on every attempt."""
        return self._each()


def _handed_in(results: Sequence[Sequence[WriteResult]]) -> list[RankItems] | None:
    """The :class:`RankItems` of each rank that wrote items, in rank order, when their
    results carry them; None when they carry a record each (an import)."""
    per_rank: list[RankItems] = []
    per_item = False
    for rank_results in results:
        if not rank_results:
            continue
        first = rank_results[0].storage_data
        if not isinstance(first, RankItems):
            per_item = True
            continue
        # Not every result is looked at, which would take a second per million items:
        # the rank made them all alike, and the table is checked against DCP's metadata.
        last = rank_results[-1].storage_data
        if not isinstance(last, RankItems) or last.block_sha256 != first.block_sha256:
            raise IncompleteCheckpointError(
                f"the write results of {first.operator} carry another rank's items"
            )
        per_rank.append(first)
    if per_rank and per_item:
        raise IncompleteCheckpointError(
            "some ranks' write results carry a rank's block of records, others a record "
            "per item: the ranks ran different CairnWriter settings or versions"
        )
    return per_rank or None


def _collect(
    results: Iterable[Iterable[WriteResult]],
) -> tuple[dict[Any, tuple[Any, ...]], list[tuple[str, PartitionSnapshotEntry]]]:
    """Every rank's item records, and the entries of the artifacts they name (once each)."""
    records: dict[Any, tuple[Any, ...]] = {}
    named: list[tuple[str, PartitionSnapshotEntry]] = []
    for rank_results in results:
        for result in rank_results:
            written = result.storage_data
            if not isinstance(written, Written):
                raise IncompleteCheckpointError(
                    f"a write result for {result.index.fqn!r} did not come from CairnWriter"
                )
            if result.index in records:
                raise IncompleteCheckpointError(f"item {result.index} was written twice")
            records[result.index] = written.record
            entry = written.entry
            if carries_ranges(entry):
                used = ItemRecord(*written.record).extent[1]
                entry = msgspec.structs.replace(entry, used_bytes=used)
            named.append((written.operator, entry))
    return records, distinct_entries(named)


def distinct_entries(
    named: Iterable[tuple[str, PartitionSnapshotEntry]],
) -> list[tuple[str, PartitionSnapshotEntry]]:
    """The artifacts ``named`` (operator and entry), each once, in order; an artifact
    reported with two different entries is :class:`IncompleteCheckpointError`. A carried
    artifact reported several times (by several ranks, or once per item) gets the sum of
    their ``used_bytes``: each names other ranges of it."""
    entries: dict[tuple[str, int], PartitionSnapshotEntry] = {}
    for operator, entry in named:
        key = (operator, entry.partition_id)
        known = entries.setdefault(key, entry)
        if known is entry:
            continue
        if known.used_bytes is not None and entry.used_bytes is not None:
            unused = msgspec.structs.replace(entry, used_bytes=known.used_bytes)
            if unused == known:
                # Distinct items are distinct ranges; capped in case two share one.
                used = min(known.used_bytes + entry.used_bytes, known.size_bytes)
                entries[key] = msgspec.structs.replace(known, used_bytes=used)
                continue
        if known != entry:
            raise IncompleteCheckpointError(
                f"artifact {entry.path!r} of {operator!r} was reported with two different entries"
            )
    return [(operator, entry) for (operator, _), entry in entries.items()]
