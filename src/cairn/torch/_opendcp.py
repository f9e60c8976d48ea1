"""Opening a DCP checkpoint for a load: the checkpoint chosen, its metadata verified.

:func:`open_dcp` picks the checkpoint (an id, the newest with a name, or the latest),
reads its manifest and its DCP metadata, and :func:`load_records` the item records a load
needs (with a chunk table, only the blocks holding them: :mod:`cairn.torch._tableread`).
The layout read here is specified in docs/format.md, section "DCP checkpoints".

Invariants:

* the metadata is unpickled only after its bytes match the digest the manifest records
  (range 0 of an object of ranges, or the whole object), and only with the globals
  DCP's metadata is made of (:func:`cairn.torch._format.load_metadata`);
* a block of records is used only after it matches the digest its range records, and
  every record only once it names an artifact of the manifest and lies within that
  artifact's data: a load never reads a byte range no entry covers;
* choosing by name or as the latest passes over, with a warning, a checkpoint that is not
  a DCP save or whose manifest or metadata is damaged; when none is left, the
  :class:`~cairn.CheckpointNotFoundError` says what was searched and what was found.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable

from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    CorruptManifestError,
    IntegrityError,
    IntegrityMismatchError,
    NewerFormatError,
    UndecodableArtifactError,
)
from cairn.format.ids import CheckpointId
from cairn.format.integrity import verify_integrity, verify_integrity_async
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.format.ranges import StoredRange, decode_index
from cairn.integrations._interface import (
    DAMAGE,
    Buffer,
    bounded_gather,
    checkpoint_names,
    latest_candidates,
    load_manifest,
    named_candidates,
    read_entry,
    read_sized,
)
from cairn.torch._format import METADATA_OPERATOR, ItemRecord, load_metadata, parse_record
from cairn.torch._tableread import ItemTable, decode_block, decode_table, has_table
from cairn.torch._target import Target, store_location

__all__ = [
    "WHOLE_METADATA_BYTES",
    "Blocks",
    "ExportChoice",
    "Opened",
    "fetch_whole",
    "load_records",
    "open_dcp",
]

log = logging.getLogger("cairn")


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Where the item records of metadata stored as a chunk table are
    (:mod:`cairn.torch._tableread`): block ``b`` is range ``ranges[b + 1]`` of the
    metadata object at ``path``; ``loaded`` the blocks read so far."""

    path: str
    table: ItemTable
    ranges: list[StoredRange]
    whole: Buffer | None = None  # the object's bytes, when it was read whole
    loaded: set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class Opened:
    """A checkpoint chosen for loading: its manifest, entries by path, DCP metadata and
    item records (with a chunk table, only those of the blocks read so far: see
    :func:`load_records`)."""

    checkpoint_id: CheckpointId
    manifest: CheckpointManifest
    entries: dict[str, PartitionSnapshotEntry]
    metadata: Metadata
    records: dict[MetadataIndex, ItemRecord]
    blocks: Blocks | None = None


class _NotDcp(Exception):
    """A committed checkpoint that holds no DCP metadata (saved by something else)."""


async def open_dcp(
    ckpt: ObjectStoreCheckpointer,
    target: Target | None,
    skip: frozenset[CheckpointId] = frozenset(),
    store: object = None,
    skip_newer_format: bool = False,
) -> Opened:
    """The DCP checkpoint ``target`` names in ``ckpt``, opened: its manifest checked, its
    metadata verified and unpickled, its item records checked against the manifest.

    ``target`` is a checkpoint id (that one, or :class:`CheckpointNotFoundError`), a
    name (the newest committed checkpoint with it that opens) or None (the latest that
    opens, passing over ``skip``). Choosing by name or as the latest passes over, with a
    warning, a checkpoint that is not a DCP save or whose manifest or metadata is
    damaged; when none is left, :class:`CheckpointNotFoundError` says what was searched
    (``store`` names it) and what was found instead. One a newer cairn wrote is not
    passed over: :class:`NewerFormatError`, as in
    :meth:`~cairn.ObjectStoreCheckpointer.load_latest`, unless ``skip_newer_format``
    (then with a warning naming it).
    """
    await ckpt.resolve_paths()
    if isinstance(target, CheckpointId):
        try:
            return await _open_one(ckpt, target)
        except _NotDcp as exc:
            raise CheckpointNotFoundError(
                str(exc), "DCP metadata", f"checkpoint {target} was not saved by DCP"
            ) from None
    candidates = latest_candidates(ckpt) if target is None else named_candidates(ckpt, target)
    search = _Search(target)
    async for cid in candidates:
        if cid in skip:
            search.skipped.append(cid)
            continue
        try:
            return await _open_one(ckpt, cid)
        except _NotDcp:
            log.info("checkpoint %s holds no DCP state: trying the next one", cid)
            search.not_dcp.append(cid)
        except DAMAGE as exc:
            log.warning("checkpoint %s does not load (%s): trying the next one", cid, exc)
            search.damaged.append((cid, str(exc)))
        except NewerFormatError as exc:
            if not skip_newer_format:
                raise
            log.warning(
                "passing over checkpoint %s, which this cairn cannot read (%s): "
                "loading an older one",
                cid,
                exc,
            )
            search.damaged.append((cid, str(exc)))
    raise await search.not_found(ckpt, store)


class ExportChoice:
    """The checkpoint an export writes: ``target`` (as :func:`open_dcp` takes it), and,
    for the latest or a name, the next older one each time the one opened turns out
    damaged while its items are read (as :func:`~cairn.torch.load_latest` falls back).

    When none is left after passing over a damaged one, :meth:`open` raises that
    damage (the newest's): it says more than that no checkpoint is left.
    """

    def __init__(
        self,
        ckpt: ObjectStoreCheckpointer,
        target: Target | None,
        skip: frozenset[CheckpointId],
        store: object,
    ) -> None:
        self._ckpt, self._target, self._skip, self._store = ckpt, target, skip, store
        self._damage: list[tuple[CheckpointId, Exception]] = []

    async def open(self) -> Opened:
        """The next checkpoint to export, opened."""
        passed = self._skip | {cid for cid, _ in self._damage}
        try:
            return await open_dcp(self._ckpt, self._target, passed, self._store)
        except CheckpointNotFoundError:
            if self._damage:
                raise self._damage[0][1] from None
            raise

    def passes_over(self, opened: Opened, damage: Exception) -> bool:
        """Whether to try the next older checkpoint, ``opened`` having failed with
        ``damage`` while its items were read: never for a checkpoint asked for by id."""
        if isinstance(self._target, CheckpointId):
            return False
        cid = opened.checkpoint_id
        log.warning("checkpoint %s does not export (%s): trying the next one", cid, damage)
        self._damage.append((cid, damage))
        return True

    @property
    def passed_over(self) -> tuple[tuple[CheckpointId, str], ...]:
        """The checkpoints passed over so far, newest first, each with why."""
        return tuple((cid, str(damage)) for cid, damage in self._damage)


@dataclasses.dataclass
class _Search:
    """What a search for a DCP checkpoint passed over, to say so when it finds none."""

    name: str | None
    skipped: list[CheckpointId] = dataclasses.field(default_factory=list)
    not_dcp: list[CheckpointId] = dataclasses.field(default_factory=list)
    damaged: list[tuple[CheckpointId, str]] = dataclasses.field(default_factory=list)

    async def not_found(self, ckpt: ObjectStoreCheckpointer, store: object) -> Exception:
        base = ckpt.paths.base_prefix
        location = store_location(store) if store is not None else None
        where = f"prefix {base!r}" + (f" of {location.shown}" if location else "")
        what = "committed DCP checkpoint" + ("" if self.name is None else f" named {self.name!r}")
        tried = len(self.skipped) + len(self.not_dcp) + len(self.damaged)
        found: list[str] = []
        if self.not_dcp:
            found.append(
                f"{len(self.not_dcp)} not saved by DCP (no {METADATA_OPERATOR!r} operator)"
            )
        if self.damaged:
            cid, reason = self.damaged[0]
            found.append(f"{len(self.damaged)} that do not load ({cid}: {reason})")
        if self.skipped:
            found.append(f"{len(self.skipped)} passed over as asked (damaged shards)")
        if tried:
            detail = f"searched {where}: {tried} committed checkpoint(s)"
            detail += " named so" if self.name is not None else ""
            detail += ", " + "; ".join(found)
        elif self.name is None:
            detail = f"searched {where}: it holds no committed checkpoint"
        else:
            names = await checkpoint_names(ckpt)
            shown = ", ".join(repr(n) for n in names[:5]) + (
                f" and {len(names) - 5} more" if len(names) > 5 else ""
            )
            count = len(await ckpt.list_checkpoints())
            detail = f"searched {where}: no committed checkpoint has that name"
            if names:
                detail += f"; the names there are {shown}"
            else:
                detail += f"; none of its {count} committed checkpoint(s) has a name"
        return CheckpointNotFoundError(base or "/", what, detail)


async def _open_one(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> Opened:
    paths = ckpt.paths
    manifest = await load_manifest(ckpt, cid)
    entries = {entry.path: entry for _, entry in manifest.partition_entries()}
    if len(entries) != sum(1 for _ in manifest.partition_entries()):
        # Item records name artifacts by path alone: one path must mean one object.
        raise CorruptManifestError(
            paths.manifest(cid), "two entries (of different owners) share a path"
        )
    meta_entries = manifest.operators.get(METADATA_OPERATOR)
    if meta_entries is None or len(meta_entries.partitions) != 1:
        raise _NotDcp(paths.checkpoint_dir(cid) + "operators/" + METADATA_OPERATOR)
    entry = meta_entries.partitions[0]
    path = paths.resolve(entry.owner or cid, entry.path)
    try:
        if entry.index_size_bytes is not None:
            metadata, blocks = await _open_table(ckpt, path, entry)
            return Opened(cid, manifest, entries, metadata, {}, blocks)
        body = await fetch_whole(ckpt, path, entry)
        metadata = await asyncio.to_thread(load_metadata, path, body)
        records = _check_records(path, metadata, entries)
    except IntegrityError as exc:
        exc.located(METADATA_OPERATOR, entry.partition_id)
        raise
    return Opened(cid, manifest, entries, metadata, records)


async def _open_table(
    ckpt: ObjectStoreCheckpointer, path: str, entry: PartitionSnapshotEntry
) -> tuple[Metadata, Blocks]:
    """The DCP metadata stored as a chunk table at ``path`` (an object of ranges), its
    index and range 0 read and verified; the blocks are left for :func:`load_records`."""
    index_bytes = entry.index_size_bytes or 0
    if entry.codec is not None or not 0 < index_bytes <= entry.size_bytes:
        raise CorruptManifestError(path, "a DCP metadata object of ranges must be stored as is")
    split = entry.size_bytes - index_bytes
    start = 0 if entry.size_bytes <= WHOLE_METADATA_BYTES else split  # whole, or the index
    tail = await read_sized(ckpt, path, entry.size_bytes, start)
    whole = tail if start == 0 else None
    index = memoryview(tail).cast("B")[split - start :]
    verify_integrity(path, index, entry.sha256, "sha256 of its range index")
    ranges = decode_index(path, index, split)
    if not ranges:
        raise CorruptManifestError(path, "a DCP metadata object of ranges holds no metadata")
    head = ranges[0]
    data = await _bytes_of(ckpt, path, whole, head.offset, head.offset + head.length)
    await verify_integrity_async(path, data, head.sha256, what="sha256 of range 0")
    metadata = await asyncio.to_thread(load_metadata, path, data)
    if not has_table(metadata):
        raise CorruptManifestError(path, "a DCP metadata object of ranges without a chunk table")
    table = await asyncio.to_thread(decode_table, path, metadata, len(ranges) - 1)
    return metadata, Blocks(path, table, ranges, whole)


async def load_records(
    ckpt: ObjectStoreCheckpointer, opened: Opened, indices: Iterable[MetadataIndex] | None
) -> None:
    """Read into ``opened.records`` the blocks holding the records of ``indices`` (None:
    every block), each verified against its digest and checked against the table and
    the manifest. Nothing to do for metadata stored whole (all records are there)."""
    blocks = opened.blocks
    if blocks is None:
        return
    table = blocks.table
    if indices is None:
        wanted = set(range(table.blocks))
    else:
        wanted = {b for b in map(table.block_of, indices) if b is not None}
    wanted -= blocks.loaded

    def job(block: int) -> Callable[[], Awaitable[None]]:
        async def read() -> None:
            where = blocks.ranges[block + 1]
            end = where.offset + where.length
            try:
                data = await _bytes_of(ckpt, blocks.path, blocks.whole, where.offset, end)
                what = f"sha256 of block {block} of item records"
                await verify_integrity_async(blocks.path, data, where.sha256, what=what)
                records = decode_block(blocks.path, table, block, bytes(data))
                for index, value in records.items():
                    opened.records[index] = _checked_record(
                        blocks.path, index, value, opened.entries
                    )
            except IntegrityError as exc:
                [meta] = opened.manifest.operators[METADATA_OPERATOR].partitions
                exc.located(METADATA_OPERATOR, meta.partition_id)
                raise
            blocks.loaded.add(block)

        return read

    await bounded_gather(ckpt.max_concurrent_downloads, [job(b) for b in sorted(wanted)])


WHOLE_METADATA_BYTES = 8 << 20
"""A DCP metadata object of ranges up to this size is read in one request, its blocks
with it; a larger one as its index, its range 0, then the blocks a load needs."""


async def _bytes_of(
    ckpt: ObjectStoreCheckpointer, path: str, whole: Buffer | None, start: int, end: int
) -> Buffer:
    """Bytes ``start`` to ``end`` of ``path``: from ``whole`` if it was read, else read."""
    if whole is not None:
        return memoryview(whole).cast("B")[start:end]
    return await _read_exactly(ckpt, path, start, end)


async def _read_exactly(ckpt: ObjectStoreCheckpointer, path: str, start: int, end: int) -> Buffer:
    """Bytes ``start`` to ``end`` of ``path``, which must all be there."""
    try:
        data = await ckpt.store.get_range(path, start, end)
    except CheckpointNotFoundError:
        raise BrokenChainError(path, "the DCP metadata object is gone") from None
    got = memoryview(data).nbytes
    if got != end - start:
        raise IntegrityMismatchError(
            path, str(end - start), str(got), what=f"size of bytes {start}..{end}"
        )
    return data


async def fetch_whole(
    ckpt: ObjectStoreCheckpointer, path: str, entry: PartitionSnapshotEntry, *, verify: bool = True
) -> Buffer:
    """The artifact's bytes, decompressed, verified against the entry when ``verify``; read
    and decoded in memory bounded by its recorded sizes (see :mod:`cairn.protocol._download`)."""
    try:
        return await read_entry(ckpt, path, entry, verify)
    except UndecodableArtifactError as exc:  # a mismatch here, as for any damaged item
        raise IntegrityMismatchError(
            path, entry.sha256, f"undecodable {entry.codec} data ({exc.reason})"
        ) from None


def _check_records(
    path: str, metadata: Metadata, entries: dict[str, PartitionSnapshotEntry]
) -> dict[MetadataIndex, ItemRecord]:
    """The item records of ``metadata``, each naming an artifact of the manifest and
    lying within it; :class:`CorruptManifestError` naming ``path`` otherwise."""
    stored = metadata.storage_data
    if not isinstance(stored, dict):
        raise CorruptManifestError(path, "DCP metadata holds no item records")
    records: dict[MetadataIndex, ItemRecord] = {}
    for index, value in stored.items():
        if not isinstance(index, MetadataIndex):
            raise CorruptManifestError(path, f"an item record is keyed by {index!r:.100}")
        records[index] = _checked_record(path, index, value, entries)
    return records


def _checked_record(
    path: str, index: MetadataIndex, value: object, entries: dict[str, PartitionSnapshotEntry]
) -> ItemRecord:
    """The record ``value`` of item ``index``, naming an artifact of the manifest and
    lying within it; :class:`CorruptManifestError` naming ``path`` otherwise."""
    record = parse_record(path, value)
    entry = entries.get(record.artifact)
    if entry is None:
        raise CorruptManifestError(
            path, f"item {index.fqn!r} is in {record.artifact!r}, which the manifest lacks"
        )
    if record.stored_length is not None and entry.index_size_bytes is None:
        raise CorruptManifestError(
            path,
            f"item {index.fqn!r} is recorded as a compressed range of {record.artifact!r}, "
            "which is not an object of ranges",
        )
    data_bytes = entry.size_bytes - (entry.index_size_bytes or 0)  # not into an index
    end = sum(record.extent)  # for a compressed range, its frame (in an object of ranges)
    if end > data_bytes:
        raise CorruptManifestError(
            path,
            f"item {index.fqn!r} ends at byte {end} of "
            f"{record.artifact!r}, which has {data_bytes} bytes of items",
        )
    return record
