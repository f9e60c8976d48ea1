"""``CairnReader``: DCP's ``StorageReader`` on cairn. See :mod:`cairn.torch` for the design."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from cairn import _catalog
from cairn._buffer import Buffer
from cairn._concurrency import bounded_gather
from cairn._download import read_entry
from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidInputError,
    UndecodableArtifactError,
)
from cairn.ids import CheckpointId
from cairn.integrity import INLINE_HASH_LIMIT, sha256_hex
from cairn.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.signing import SigningKey
from cairn.torch._format import (
    ItemRecord,
    copy_bytes_into,
    load_metadata,
    parse_record,
    tensor_from_bytes,
)
from cairn.torch._planner import check_byte_item, unpickles_safely
from cairn.torch._runtime import StoreArg, make_checkpointer, parse_checkpoint_id, run
from cairn.torch._writer import METADATA_OPERATOR

__all__ = ["CairnReader"]

log = logging.getLogger("cairn")


@dataclasses.dataclass(frozen=True)
class _Opened:
    """A checkpoint chosen for loading: its manifest, entries by path, and DCP metadata."""

    checkpoint_id: CheckpointId
    manifest: CheckpointManifest
    entries: dict[str, PartitionSnapshotEntry]
    metadata: Metadata
    records: dict[MetadataIndex, ItemRecord]


class _NotDcp(Exception):
    """A committed checkpoint that holds no DCP metadata (saved by something else)."""


class CairnReader(StorageReader):
    """A DCP ``StorageReader`` that loads a checkpoint :class:`CairnWriter` saved, verified.

    ``checkpoint_id`` picks the checkpoint (or ``dcp.load(..., checkpoint_id=...)``);
    without one, the reader takes the checkpoint ``load_latest`` would choose among those
    DCP saved, skipping (with a warning) any whose manifest or DCP metadata is damaged or
    gone. Every item is checked against its SHA-256 before DCP sees a byte of it; a
    mismatch raises :class:`~cairn.IntegrityMismatchError` naming the artifact. At most
    ``max_concurrent_downloads`` reads are in flight per rank. ``skip`` names checkpoints
    the choice of the latest passes over (see :func:`cairn.torch.load_latest`). With
    ``signing_key`` (see :mod:`cairn.signing`), a checkpoint whose manifest is not signed
    by one of the keys is refused (:class:`~cairn.SignatureError`), and passed over when
    choosing the latest.

    Byte items (DCP's pickled non-tensor values) reach the planner only if they unpickle
    with ``weights_only=True``: use :class:`~cairn.torch.SafeLoadPlanner`, which then
    unpickles them that way once; any other planner gets them after cairn has checked
    them so (see :mod:`cairn.torch._planner`).
    """

    def __init__(
        self,
        store: StoreArg,
        *,
        checkpoint_id: CheckpointId | str | None = None,
        prefix: str = "checkpoints/",
        max_concurrent_downloads: int = 8,
        skip: Iterable[CheckpointId] = (),
        signing_key: SigningKey | Sequence[SigningKey] | None = None,
    ) -> None:
        self._ckpt = make_checkpointer(
            store,
            prefix,
            max_concurrent_downloads=max_concurrent_downloads,
            signing_key=signing_key,
        )
        self._skip = frozenset(skip)
        self._default_id = (
            None if checkpoint_id is None else parse_checkpoint_id(checkpoint_id, "checkpoint_id")
        )
        self._requested_id = self._default_id
        self._opened: _Opened | None = None
        self._load_id = str(uuid.uuid4())

    @property
    def checkpointer(self) -> ObjectStoreCheckpointer:
        """The checkpointer this reader loads through."""
        return self._ckpt

    @property
    def checkpoint_id(self) -> CheckpointId | None:
        """The checkpoint being loaded: the one asked for, or the one chosen; None before."""
        if self._opened is not None:
            return self._opened.checkpoint_id
        return self._requested_id

    # -- StorageReader -------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load; a ``checkpoint_id`` (a cairn id's text) chooses the checkpoint."""
        self._requested_id = (
            self._default_id
            if checkpoint_id is None
            else parse_checkpoint_id(checkpoint_id, "dcp.load's checkpoint_id")
        )
        self._opened = None
        self._load_id = str(uuid.uuid4())

    def read_metadata(self, *args: Any, **options: Any) -> Metadata:
        """The DCP metadata of the checkpoint, verified against its manifest, then unpickled.

        (The keyword parameter is deliberately not named ``kwargs``: DCP then does not
        retry a failed read as a "rank-local metadata" read, which cairn has no use for.)
        """
        opened = run(self._open(), "CairnReader.read_metadata")
        self._opened = opened
        metadata = opened.metadata
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self._load_id
        return metadata

    async def _open(self) -> _Opened:
        ctx = self._ckpt.context
        if self._requested_id is not None:
            try:
                return await self._open_one(self._requested_id)
            except _NotDcp as exc:
                raise CheckpointNotFoundError(str(exc), "DCP metadata") from None
        async for cid in _catalog.latest_candidates(ctx):
            if cid in self._skip:
                continue
            try:
                return await self._open_one(cid)
            except _NotDcp:
                log.info("checkpoint %s holds no DCP state: trying the next one", cid)
            except _catalog.DAMAGE as exc:
                log.warning("checkpoint %s does not load (%s): trying the next one", cid, exc)
        raise CheckpointNotFoundError(
            ctx.paths.base_prefix or "/", "committed DCP checkpoint under"
        )

    async def _open_one(self, cid: CheckpointId) -> _Opened:
        ctx = self._ckpt.context
        manifest = await _catalog.load_manifest(ctx, cid)
        entries = {entry.path: entry for _, entry in manifest.partition_entries()}
        meta_entries = manifest.operators.get(METADATA_OPERATOR)
        if meta_entries is None or len(meta_entries.partitions) != 1:
            raise _NotDcp(ctx.paths.checkpoint_dir(cid) + "operators/" + METADATA_OPERATOR)
        entry = meta_entries.partitions[0]
        path = ctx.paths.resolve(entry.owner or cid, entry.path)
        body = await _fetch_whole(self._ckpt, path, entry)
        metadata = await asyncio.to_thread(load_metadata, path, body)
        records = _check_records(path, metadata, entries)
        return _Opened(cid, manifest, entries, metadata, records)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Check that ``metadata`` is the one this reader read (DCP hands it back)."""
        if self._opened is None or metadata is not self._opened.metadata:
            raise InvalidInputError(
                "CairnReader.set_up_storage_reader needs the metadata its read_metadata returned"
            )

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Tag the plan with the checkpoint this rank opened, for the coordinator to compare."""
        opened = self._require_opened()
        return dataclasses.replace(plan, storage_data=str(opened.checkpoint_id))

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Coordinator: refuse a load whose ranks opened different checkpoints.

        Without a ``checkpoint_id``, each rank chooses the latest by itself; a save that
        commits in between would otherwise make ranks load different checkpoints.
        """
        chosen = sorted({str(plan.storage_data) for plan in plans})
        if len(chosen) > 1:
            raise InvalidInputError(
                f"the ranks opened different checkpoints ({', '.join(chosen)}): one was "
                "committed while they chose the latest; load again, or pass checkpoint_id"
            )
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read this rank's items, each verified against its SHA-256, into the planner.

        Items are grouped by artifact: one ranged read per artifact covers the items
        this rank needs from it (a compressed artifact is read whole and decompressed).
        """
        opened = self._require_opened()
        per_artifact: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            record = opened.records.get(item.storage_index)
            if record is None:
                raise CorruptManifestError(
                    self._ckpt.paths.checkpoint_dir(opened.checkpoint_id),
                    f"the DCP metadata has no record of item {item.storage_index}",
                )
            per_artifact.setdefault(record.artifact, []).append(item)
        jobs = [
            self._read_artifact(opened, relative, items, planner)
            for relative, items in per_artifact.items()
        ]
        run(
            bounded_gather(self._ckpt.max_concurrent_downloads, jobs),
            "CairnReader.read_data",
        )
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_artifact(
        self, opened: _Opened, relative: str, items: list[ReadItem], planner: LoadPlanner
    ) -> Callable[[], Awaitable[None]]:
        entry = opened.entries[relative]
        path = self._ckpt.paths.resolve(entry.owner or opened.checkpoint_id, relative)
        records = [opened.records[item.storage_index] for item in items]

        async def job() -> None:
            if entry.codec is not None:
                start, data = 0, await _fetch_whole(self._ckpt, path, entry, verify=False)
            else:
                start = min(r.offset for r in records)
                end = max(r.offset + r.length for r in records)
                try:
                    data = await self._ckpt.store.get_range(path, start, end)
                except CheckpointNotFoundError:
                    raise BrokenChainError(
                        path, f"artifact of checkpoint {opened.checkpoint_id} is gone"
                    ) from None
            view = memoryview(data).cast("B")
            verified: set[MetadataIndex] = set()
            for item, record in zip(items, records, strict=True):
                piece = view[record.offset - start : record.offset - start + record.length]
                if piece.nbytes != record.length:
                    raise IntegrityMismatchError(
                        path,
                        str(record.length),
                        str(piece.nbytes),
                        what=f"size of {item.storage_index.fqn!r}",
                    )
                if item.storage_index not in verified:
                    await _off_loop(piece, _verify_item, path, item, record, piece)
                    verified.add(item.storage_index)
                await _deliver(planner, item, record, piece)

        return job

    def _require_opened(self) -> _Opened:
        if self._opened is None:
            raise InvalidInputError("CairnReader: read_metadata must come first")
        return self._opened

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """True when ``checkpoint_id`` is a cairn checkpoint id's text."""
        return isinstance(checkpoint_id, str) and CheckpointId.is_valid(checkpoint_id)


async def _fetch_whole(
    ckpt: ObjectStoreCheckpointer, path: str, entry: PartitionSnapshotEntry, *, verify: bool = True
) -> Buffer:
    """The artifact's bytes, decompressed, verified against the entry when ``verify``; read
    and decoded in memory bounded by its recorded sizes (see :mod:`cairn._download`)."""
    try:
        return await read_entry(ckpt.context, path, entry, verify)
    except UndecodableArtifactError as exc:  # a mismatch here, as for any damaged item
        raise IntegrityMismatchError(
            path, entry.sha256, f"undecodable {entry.codec} data ({exc.reason})"
        ) from None


def _verify_item(path: str, item: ReadItem, record: ItemRecord, piece: memoryview) -> None:
    actual = sha256_hex(piece)
    if actual != record.sha256:
        raise IntegrityMismatchError(
            path,
            record.sha256,
            actual,
            what=f"sha256 of item {item.storage_index.fqn!r} (bytes {record.offset}.."
            f"{record.offset + record.length})",
        )


async def _deliver(
    planner: LoadPlanner, item: ReadItem, record: ItemRecord, piece: memoryview
) -> None:
    """Hand one verified item to the planner (tensor copies run off the event loop)."""
    if item.type == LoadItemType.BYTE_IO:
        data = piece.tobytes()
        if not unpickles_safely(planner):
            check_byte_item(item, data)  # DCP's default planner would unpickle anything
        planner.load_bytes(item, io.BytesIO(data))
        return
    target = planner.resolve_tensor(item).detach()
    await _off_loop(piece, _copy_into, target, item, record, piece)
    planner.commit_tensor(item, target)


async def _off_loop(piece: memoryview, work: Callable[..., None], *args: Any) -> None:
    """``work(*args)`` in a worker thread for a large ``piece`` (hashlib and torch release
    the GIL there); inline for a small one, where the thread hop would cost more."""
    if piece.nbytes > INLINE_HASH_LIMIT:
        await asyncio.to_thread(work, *args)
    else:
        work(*args)


def _copy_into(target: torch.Tensor, item: ReadItem, record: ItemRecord, piece: memoryview) -> None:
    whole = all(o == 0 for o in item.storage_offsets) and tuple(item.lengths) == record.shape
    direct = (
        whole
        and target.device.type == "cpu"
        and target.is_contiguous()
        and tuple(target.shape) == record.shape
        and str(target.dtype).removeprefix("torch.") == record.dtype
    )
    if direct:  # the common case: one copy, from the store's buffer into the tensor
        copy_bytes_into(target, piece)
        return
    saved = tensor_from_bytes(piece, record.dtype, record.shape)
    source = narrow_tensor_by_index(saved, item.storage_offsets, item.lengths)
    if target.size() != source.size():
        raise InvalidInputError(
            f"item {item.storage_index.fqn!r}: the checkpoint holds {list(source.size())}, "
            f"the state_dict wants {list(target.size())}"
        )
    target.copy_(source)


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
        record = parse_record(path, value)
        entry = entries.get(record.artifact)
        if entry is None:
            raise CorruptManifestError(
                path, f"item {index.fqn!r} is in {record.artifact!r}, which the manifest lacks"
            )
        if record.offset + record.length > entry.size_bytes:
            raise CorruptManifestError(
                path,
                f"item {index.fqn!r} ends at byte {record.offset + record.length} of "
                f"{record.artifact!r}, which has {entry.size_bytes}",
            )
        records[index] = record
    return records
