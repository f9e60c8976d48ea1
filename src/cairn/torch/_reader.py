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

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    CorruptManifestError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidInputError,
    UndecodableArtifactError,
)
from cairn.format.ids import CheckpointId
from cairn.format.integrity import (
    INLINE_HASH_LIMIT,
    off_loop_if_large,
    verify_integrity_async,
)
from cairn.format.manifest import PartitionSnapshotEntry
from cairn.format.ranges import StoredRange, decode_range, group_spans
from cairn.format.signing import SigningKey
from cairn.integrations._interface import (
    Buffer,
    bounded_gather,
)
from cairn.stores import PartsInFlight
from cairn.torch._format import (
    ItemRecord,
    copy_bytes_into,
    tensor_from_bytes,
)
from cairn.torch._opendcp import Opened, fetch_whole, load_records, open_dcp
from cairn.torch._planner import check_byte_item, unpickles_safely
from cairn.torch._runtime import StoreArg, known_paths, make_checkpointer, run
from cairn.torch._target import Target, interpret, well_formed

__all__ = ["CairnReader", "load_records", "verified_pieces"]

log = logging.getLogger("cairn")


class CairnReader(StorageReader):
    """A DCP ``StorageReader`` that loads a checkpoint :class:`CairnWriter` saved, verified.

    Without a checkpoint id, the reader takes the checkpoint ``load_latest`` would
    choose among those DCP saved. Choosing by name or as the latest skips (with a
    warning) any checkpoint whose manifest or DCP metadata is damaged or gone. Every
    item is checked against its SHA-256 before DCP sees a byte of it; a mismatch raises
    :class:`~cairn.IntegrityMismatchError` naming the artifact, its operator and
    partition (``rank-{r}``, ``n``) and the item (its FQN). A checkpoint a newer cairn
    wrote (format features this cairn does not know) is never passed over in silence:
    choosing the latest (or by name) raises :class:`~cairn.NewerFormatError` there.

    Byte items (DCP's pickled non-tensor values) reach the planner only if they unpickle
    with ``weights_only=True``: use :class:`~cairn.torch.SafeLoadPlanner`, which then
    unpickles them that way once; any other planner gets them after cairn has checked
    them so.

    Args:
        store: Anything :class:`~cairn.ObjectStoreCheckpointer` accepts (a URL, a plain
            path, an obstore store).
        checkpoint_id: The checkpoint (or ``dcp.load(..., checkpoint_id=...)``): a
            checkpoint id, or a name (``step-100``, or a path or URL inside the store;
            see :meth:`reset`), which loads the newest committed checkpoint with that
            name; None (the default) is the latest.
        prefix: The checkpoints' prefix; None (the default) is the store's root, or
            ``checkpoints/`` where only that holds checkpoints.
        max_concurrent_downloads: Reads in flight per rank at most.
        skip: Checkpoints the choice of the latest passes over (see
            :func:`cairn.torch.load_latest`).
        signing_key: The key, or keys (see :mod:`cairn.format.signing`): a checkpoint
            whose manifest is not signed by one of them is refused
            (:class:`~cairn.SignatureError`), and passed over when choosing the latest.
        skip_newer_format: Pass over, with a warning, a checkpoint a newer cairn wrote
            when choosing the latest or by name, instead of raising.
        parts_in_flight: Pieces of one large ranged read in flight at once (a
            :class:`~cairn.stores.PartsInFlight`, an int, or None: adaptive from 8,
            between 2 and 16); for a store cairn opens, not a
            :class:`~cairn.stores.Store` (see :class:`~cairn.ObjectStoreCheckpointer`).

    Raises:
        InvalidInputError: An argument is out of range, ``checkpoint_id`` names
            nothing, or ``parts_in_flight`` is given with a :class:`~cairn.stores.Store`.
        CheckpointLocationError: ``checkpoint_id`` is a location outside the store.
    """

    def __init__(
        self,
        store: StoreArg,
        *,
        checkpoint_id: CheckpointId | str | os.PathLike[str] | None = None,
        prefix: str | None = None,
        max_concurrent_downloads: int = 8,
        skip: Iterable[CheckpointId] = (),
        signing_key: SigningKey | Sequence[SigningKey] | None = None,
        skip_newer_format: bool = False,
        parts_in_flight: PartsInFlight | int | None = None,
    ) -> None:
        self._ckpt = make_checkpointer(
            store,
            prefix,
            max_concurrent_downloads=max_concurrent_downloads,
            signing_key=signing_key,
            parts_in_flight=parts_in_flight,
        )
        self._store = store
        self._skip = frozenset(skip)
        self._skip_newer_format = skip_newer_format
        self._default: Target | None = (
            None if checkpoint_id is None else self._interpret(checkpoint_id, "checkpoint_id")
        )
        self._requested = self._default
        self._opened: Opened | None = None
        self._load_id = str(uuid.uuid4())

    @property
    def checkpointer(self) -> ObjectStoreCheckpointer:
        """The checkpointer this reader loads through."""
        return self._ckpt

    @property
    def checkpoint_id(self) -> CheckpointId | None:
        """The checkpoint being loaded: the one asked for, or the one chosen; None before
        a checkpoint asked for by name (or as the latest) is chosen."""
        if self._opened is not None:
            return self._opened.checkpoint_id
        return self._requested if isinstance(self._requested, CheckpointId) else None

    @property
    def name(self) -> str | None:
        """The name of the checkpoint being loaded: the one asked for, or the chosen
        checkpoint's (None if it has none)."""
        if self._opened is not None:
            return self._opened.manifest.name
        return self._requested if isinstance(self._requested, str) else None

    def _interpret(self, checkpoint_id: object, what: str) -> Target:
        return interpret(checkpoint_id, self._store, known_paths(self._ckpt, what), what)

    # -- StorageReader -------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load; DCP passes the ``checkpoint_id`` given to ``dcp.load``.

        Read as :meth:`CairnWriter.reset <cairn.torch.CairnWriter.reset>` reads it: a
        checkpoint id loads that checkpoint; a name (or a
        path or URL inside the store) the newest committed checkpoint with that name; a
        location outside the store raises :class:`~cairn.CheckpointLocationError`.
        """
        self._requested = (
            self._default
            if checkpoint_id is None
            else self._interpret(checkpoint_id, "dcp.load's checkpoint_id")
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

    async def _open(self) -> Opened:
        return await open_dcp(
            self._ckpt, self._requested, self._skip, self._store, self._skip_newer_format
        )

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

        Items are grouped by artifact, then into spans of nearby items of at most
        :data:`READ_SPAN_BYTES` (an item larger than that is a span of its own): one
        ranged read per span, at most ``max_concurrent_downloads`` at a time, so a rank
        holds a bounded number of bytes however large the objects it reads from are. A
        compressed artifact is read whole and decompressed, once.
        """
        opened = self._require_opened()
        wanted = [item.storage_index for item in plan.items]
        run(load_records(self._ckpt, opened, wanted), "CairnReader.read_data")
        per_artifact: dict[str, list[tuple[ItemRecord, ReadItem]]] = {}
        for item in plan.items:
            record = opened.records.get(item.storage_index)
            if record is None:
                raise CorruptManifestError(
                    self._ckpt.paths.checkpoint_dir(opened.checkpoint_id),
                    f"the DCP metadata has no record of item {item.storage_index}",
                )
            per_artifact.setdefault(record.artifact, []).append((record, item))
        jobs = [
            self._read_artifact(opened, relative, span, planner)
            for relative, items in per_artifact.items()
            for span in _spans(items, opened.entries[relative].codec is None)
        ]
        run(
            bounded_gather(self._ckpt.max_concurrent_downloads, jobs),
            "CairnReader.read_data",
        )
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_artifact(
        self, opened: Opened, relative: str, items: list[ReadItem], planner: LoadPlanner
    ) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            indices = [item.storage_index for item in items]
            pieces = await verified_pieces(self._ckpt, opened, relative, indices)
            for item, piece in zip(items, pieces, strict=True):
                await _deliver(planner, item, opened.records[item.storage_index], piece)

        return job

    def _require_opened(self) -> Opened:
        if self._opened is None:
            raise InvalidInputError("CairnReader: read_metadata must come first")
        return self._opened

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """True when :meth:`reset` accepts ``checkpoint_id``'s form: a checkpoint id, a
        name, or a well-formed URL or absolute path (which ``reset`` still refuses when
        it lies outside the reader's store, a thing a class method cannot know)."""
        return well_formed(checkpoint_id)


READ_SPAN_BYTES = 16 << 20
"""The most bytes one ranged read of a DCP load covers (unless one item is larger)."""

READ_GAP_BYTES = 1 << 20
"""Items of one object this close together are read in one span, the bytes between
them read and dropped; farther apart, they are read apart."""


def _spans(items: list[tuple[ItemRecord, ReadItem]], ranged: bool) -> list[list[ReadItem]]:
    """``items`` of one artifact cut into spans for one ranged read each (all of them in
    one when the artifact is not ``ranged``: it is read whole)."""
    if not ranged:
        return [[item for _, item in items]]
    spans = group_spans(items, _record_extent, READ_SPAN_BYTES, READ_GAP_BYTES)
    return [[item for _, item in span] for span in spans]


def _record_extent(pair: tuple[ItemRecord, ReadItem]) -> tuple[int, int]:
    return pair[0].extent


async def verified_pieces(
    ckpt: ObjectStoreCheckpointer,
    opened: Opened,
    relative: str,
    indices: Sequence[MetadataIndex],
) -> list[memoryview]:
    """The bytes of the items ``indices`` of artifact ``relative`` of ``opened``, in
    order, each checked against its record's SHA-256.

    One ranged read covers them (a compressed artifact is read whole and decoded; an
    item that is a compressed range is decoded alone, in memory bounded by its length).
    Raises :class:`IntegrityMismatchError` naming the artifact, its operator and
    partition, and the item (``item``: its FQN), or :class:`BrokenChainError` when the
    artifact is gone. Only the items asked for are checked: damage to another item of
    the same object does not fail them.
    """
    entry = opened.entries[relative]
    path = ckpt.paths.resolve(entry.owner or opened.checkpoint_id, relative)
    records = [opened.records[index] for index in indices]
    try:
        start, data = await _read_items(ckpt, opened, path, entry, records)
    except IntegrityError as exc:
        exc.located(*_partition_of(opened, relative))
        raise
    view = memoryview(data).cast("B")
    pieces: list[memoryview] = []
    verified: dict[MetadataIndex, memoryview] = {}
    for index, record in zip(indices, records, strict=True):
        if index not in verified:
            try:
                verified[index] = await _verified_item(path, index, record, view, start)
            except IntegrityError as exc:
                exc.located(*_partition_of(opened, relative), item=index.fqn)
                raise
        pieces.append(verified[index])
    return pieces


async def _read_items(
    ckpt: ObjectStoreCheckpointer,
    opened: Opened,
    path: str,
    entry: PartitionSnapshotEntry,
    records: Sequence[ItemRecord],
) -> tuple[int, Buffer]:
    """Where the bytes read start in the artifact at ``path``, and the bytes: one ranged
    read covering ``records``' items, or the whole artifact decoded when compressed."""
    if entry.codec is not None:
        return 0, await fetch_whole(ckpt, path, entry, verify=False)
    start = min((r.offset for r in records), default=0)
    end = max((sum(r.extent) for r in records), default=0)
    try:
        return start, await ckpt.store.get_range(path, start, end)
    except CheckpointNotFoundError:
        raise BrokenChainError(
            path, f"artifact of checkpoint {opened.checkpoint_id} is gone"
        ) from None


async def _verified_item(
    path: str, index: MetadataIndex, record: ItemRecord, view: memoryview, start: int
) -> memoryview:
    """Item ``index``'s bytes, out of ``view`` (the bytes of the artifact at ``path`` from
    ``start`` on), decoded and checked against its record."""
    offset, length = record.extent
    stored = view[offset - start : offset - start + length]
    if stored.nbytes != length:
        raise IntegrityMismatchError(
            path, str(length), str(stored.nbytes), what=f"size of {index.fqn!r}"
        )
    what = f"sha256 of item {index.fqn!r} (bytes {offset}..{offset + length})"
    piece = await _decoded_item(path, record, stored, what)
    await verify_integrity_async(path, piece, record.sha256, what=what)
    return piece


def _partition_of(opened: Opened, relative: str) -> tuple[str, int]:
    """The operator and partition whose artifact is at ``relative`` in ``opened``."""
    return next(
        (operator, entry.partition_id)
        for operator, entry in opened.manifest.partition_entries()
        if entry.path == relative
    )


async def _decoded_item(path: str, record: ItemRecord, stored: memoryview, what: str) -> memoryview:
    """An item's bytes from its ``stored`` bytes: as they are, or a compressed range
    decoded to exactly its ``length``, in memory bounded by it.

    A frame that does not decode is an :class:`UndecodableArtifactError` naming the
    item, one that ends short an :class:`IntegrityMismatchError` on its size, and one
    that inflates past it an :class:`OversizedArtifactError`: never a larger buffer."""
    if record.stored_length is None:
        return stored
    where = StoredRange(record.offset, record.stored_length, record.sha256, record.length)
    try:
        if record.length > INLINE_HASH_LIMIT:  # by what it decodes to: a frame may be tiny
            decoded = await asyncio.to_thread(decode_range, path, stored, where)
        else:
            decoded = decode_range(path, stored, where)
    except UndecodableArtifactError as exc:
        raise UndecodableArtifactError(path, exc.codec, f"{what}: {exc.reason}") from None
    except IntegrityMismatchError as exc:  # decoded short of its length
        size = what.replace("sha256", "decoded size", 1)
        raise IntegrityMismatchError(path, exc.expected, exc.actual, what=size) from None
    return memoryview(decoded).cast("B")


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
    await off_loop_if_large(piece, _copy_into, target, item, record, piece)
    planner.commit_tensor(item, target)


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
