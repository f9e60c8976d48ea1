"""Exporting a DCP checkpoint as Hugging Face safetensors shards, streamed to any store.

:func:`export_hf_async` writes ``model-{k:05d}-of-{n:05d}.safetensors`` files of at most
``max_shard_bytes`` of tensor data each, then ``model.safetensors.index.json``
(:mod:`cairn.torch._safetensors`), into any cairn store. Each shard is one streamed upload
(:meth:`~cairn.stores.Store.put_stream`: a multipart upload on S3, GCS and Azure, a staged
file renamed into place on a local disk): its header first, then its tensors' bytes read
by ranged requests from the checkpoint's rank objects. No file is staged locally and no
tensor is held whole: a tensor saved as one chunk, or sharded along its first dimension
only, travels in pieces of :data:`PIECE_BYTES`; one sharded along another dimension is
put together in slabs of about :data:`PIECE_BYTES` (at least one row of it). Ranges of
one object that follow each other are read together, up to :data:`PIECE_BYTES`, with
:data:`READ_AHEAD` reads ahead of the piece being sent. What is read, and in which
pieces, is planned by :mod:`cairn.torch._hfplan`; this module streams it.

Invariants:

* every byte written comes from an item whose SHA-256, over all its bytes, matched its
  record before the shard's upload ends: an item's pieces are hashed in order as they
  are sent, and a mismatch (or a short read) fails the stream, so the upload is
  abandoned and the shard never appears; the error is the
  :class:`~cairn.IntegrityMismatchError` naming the artifact, its operator and
  partition, and the item;
* a compressed item (``compression="zstd"``) is read as its one frame, decoded in memory
  bounded by its length and checked whole before any of its bytes are sent: it is held
  decoded while its bytes are written;
* the index is written last, create-only, and only after every shard's upload returned:
  a destination without ``model.safetensors.index.json`` holds no complete export. A
  destination that already holds an index is refused before anything is written. A
  failed export deletes the shards it had completed; a shard being written when it failed
  never appears. Two exports into one destination at once are not kept apart (the
  layout has fixed names): the first to write its index wins, the other fails and
  deletes nothing;
* the latest (or the newest of a name) is the newest DCP checkpoint that exports whole:
  one whose items do not read back verified (an :class:`~cairn.IntegrityError`) is
  passed over, its shards deleted, for the next older one, as
  :func:`~cairn.torch.load_latest` passes over it; the result names it
  (:attr:`ExportedHf.passed_over`). A checkpoint asked for by id is exported or fails;
* the bytes written are the saved tensors' bytes (little-endian, C order), except with
  ``dtype``, which casts floating-point tensors (and only those) to it as they are
  written: the digests cover the saved bytes, which are hashed before the cast.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import math
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import torch

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.errors import (
    CheckpointNotFoundError,
    IntegrityError,
    InvalidInputError,
    ObjectExistsError,
    StoreError,
)
from cairn.format.ids import CheckpointId
from cairn.format.integrity import INLINE_HASH_LIMIT
from cairn.stores import Store
from cairn.torch._format import dtype_name, tensor_bytes, tensor_from_bytes
from cairn.torch._hfplan import (
    PIECE_BYTES,
    FqnMap,
    PlannedTensor,
    Read,
    Step,
    mismatch,
    plan_steps,
    tensors_to_write,
)
from cairn.torch._opendcp import ExportChoice, Opened, load_records
from cairn.torch._safetensors import (
    INDEX_FILE,
    encode_header,
    index_document,
    lay_out,
    plan_shards,
    shard_name,
)
from cairn.torch._target import Target

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "PIECE_BYTES",
    "READ_AHEAD",
    "ExportedHf",
    "FqnMap",
    "export_hf_async",
    "under_prefix",
]

log = logging.getLogger("cairn")

READ_AHEAD = 4
"""Reads in flight ahead of the piece being sent, at most."""

DEFAULT_SHARD_BYTES = 5_000_000_000
"""The tensor bytes of one shard at most, by default (``transformers``' "5GB")."""


def under_prefix(prefix: str) -> FqnMap:
    """An :data:`FqnMap` keeping the tensors under ``prefix`` (``"model."``), without it.

    Args:
        prefix: The FQN prefix to keep and strip.

    Returns:
        The map: ``"model.layer.weight"`` -> ``"layer.weight"``, anything else -> None.
    """

    def mapped(fqn: str) -> str | None:
        return fqn[len(prefix) :] if fqn.startswith(prefix) and len(fqn) > len(prefix) else None

    return mapped


@dataclasses.dataclass(frozen=True)
class ExportedHf:
    """What :func:`export_hf` wrote: the checkpoint, where, and the files.

    Attributes:
        checkpoint_id: The checkpoint exported.
        name: Its name, or None.
        epoch: Its epoch.
        target: The destination, as given (a URL or path, or the store's repr).
        tensors: The tensors written.
        left_out: The FQNs of the checkpoint not written (byte items, and tensors the
            FQN map left out), in the checkpoint's order.
        total_size: The tensor bytes written (the index's ``total_size``).
        files: Each file written with its size in bytes (the index last).
        passed_over: The newer checkpoints chosen first and passed over because their
            items did not read back verified from the store, newest first, each with
            why. Only an export of the latest or of a name passes over one.
    """

    checkpoint_id: CheckpointId
    name: str | None
    epoch: int
    target: str
    tensors: int
    left_out: tuple[str, ...]
    total_size: int
    files: tuple[tuple[str, int], ...]
    passed_over: tuple[tuple[CheckpointId, str], ...] = ()

    @property
    def size_bytes(self) -> int:
        """The bytes of all the files written."""
        return sum(size for _, size in self.files)


class _Body:
    """One attempt at a shard's bytes: the header, then each step's bytes, every chunk
    hashed in order as its reads are used and checked once it is whole."""

    def __init__(self, store: Store, header: bytes, steps: Sequence[Step]) -> None:
        self._store, self._header, self._steps = store, header, steps
        self._hashers: dict[int, Any] = {}
        self.sent = 0

    async def chunks(self) -> AsyncIterator[memoryview]:
        fetches = list(dict.fromkeys(r.fetch for s in self._steps for r in s.reads))
        for fetch in fetches:  # a fresh attempt reads everything again
            fetch.task = None
        uses = {id(f): f.users for f in fetches}
        position = {id(f): n for n, f in enumerate(fetches)}
        ahead = 0
        yield memoryview(self._header)
        try:
            for step in self._steps:
                last = position[id(step.reads[-1].fetch)] if step.reads else ahead - 1
                while ahead < len(fetches) and ahead <= last + READ_AHEAD:
                    fetches[ahead].begin(self._store)
                    ahead += 1
                pieces = [await r.fetch.begin(self._store) for r in step.reads]
                out = await self._step(step, pieces)
                for r in step.reads:
                    uses[id(r.fetch)] -= 1
                    if uses[id(r.fetch)] == 0:
                        r.fetch.task = None  # let its bytes go
                if out.nbytes:
                    self.sent += out.nbytes
                    yield out
        finally:
            for fetch in fetches:
                task, fetch.task = fetch.task, None
                if task is None:
                    continue
                task.cancel()
                if task.done() and not task.cancelled():
                    task.exception()  # read ahead and failed: the failure that ended us is reported

    async def _step(self, step: Step, fetched: list[memoryview]) -> memoryview:
        pieces = [f[r.at : r.at + r.hi - r.lo] for r, f in zip(step.reads, fetched, strict=True)]
        size = sum(p.nbytes for p in pieces)
        if size > INLINE_HASH_LIMIT:
            return await asyncio.to_thread(self._build, step, pieces)
        return self._build(step, pieces)

    def _build(self, step: Step, pieces: list[memoryview]) -> memoryview:
        for read, piece in zip(step.reads, pieces, strict=True):
            self._hash(read, piece)
        tensor = step.tensor
        if step.rows is None:
            [piece] = pieces
            if tensor.target == tensor.source:
                return piece
            count = piece.nbytes // tensor.source.itemsize
            values = tensor_from_bytes(piece, dtype_name(tensor.source), (count,))
            return tensor_bytes(values.to(tensor.target), tensor.fqn)[0]
        r0, r1 = step.rows
        slab = torch.empty((r1 - r0, *tensor.shape[1:]), dtype=tensor.source)
        for read, piece in zip(step.reads, pieces, strict=True):
            chunk = read.chunk
            local = math.prod(chunk.sizes[1:]) * tensor.source.itemsize
            rows = (read.hi - read.lo) // local
            first = chunk.offsets[0] + read.lo // local - r0
            values = tensor_from_bytes(piece, dtype_name(tensor.source), (rows, *chunk.sizes[1:]))
            region = slab[first : first + rows]
            for dim, (o, s) in enumerate(zip(chunk.offsets[1:], chunk.sizes[1:], strict=True)):
                region = region.narrow(dim + 1, o, s)
            region.copy_(values)
        return tensor_bytes(slab.to(tensor.target), tensor.fqn)[0]

    def _hash(self, read: Read, piece: memoryview) -> None:
        chunk = read.chunk
        if chunk.stored_length is not None:
            return  # its frame was checked whole when it was decoded
        hasher = self._hashers.setdefault(id(chunk), hashlib.sha256())
        hasher.update(piece)
        if read.hi == chunk.length:
            del self._hashers[id(chunk)]
            actual = hasher.hexdigest()
            if actual != chunk.sha256:
                raise mismatch(chunk, actual)


async def _write_shard(
    source: Store,
    dest: Store,
    path: str,
    tensors: Sequence[PlannedTensor],
    progress: Callable[[int], None],
) -> int:
    """Stream one shard of ``tensors``, read from ``source``, to ``path`` of ``dest``; its
    size in bytes."""
    by_name = {t.entry.name: t for t in tensors}
    order = lay_out([t.entry for t in tensors], lambda e: _position(by_name[e.name]))
    laid = [by_name[e.name] for e in order]
    header = encode_header(order)
    steps = plan_steps(laid)
    failures: list[BaseException] = []
    size = len(header) + sum(t.entry.nbytes for t in laid)

    async def open_chunks() -> AsyncIterator[memoryview]:
        body = _Body(source, header, steps)
        try:
            async for chunk in body.chunks():
                yield chunk
                progress(chunk.nbytes)
        except BaseException as exc:
            failures.append(exc)
            raise
        if body.sent + len(header) != size:  # a step that wrote the wrong size: a bug here
            raise AssertionError(f"{path}: wrote {body.sent + len(header)} bytes, not {size}")

    try:
        await dest.put_stream(path, open_chunks)
    except Exception:
        cause = next((f for f in reversed(failures) if isinstance(f, Exception)), None)
        if cause is not None and not isinstance(cause, asyncio.CancelledError):
            raise cause from None  # the store reports a stream that failed in its own words
        raise
    return size


def _position(tensor: PlannedTensor) -> tuple[object, ...]:
    first = min(tensor.chunks, key=lambda c: c.offsets, default=None)
    return ("", 0) if first is None else (first.path, first.offset)


async def export_hf_async(
    ckpt: ObjectStoreCheckpointer,
    target: Target | None,
    dest: Store,
    *,
    shown: str,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    dtype: torch.dtype | None = None,
    fqn_map: FqnMap | None = None,
    skip: frozenset[CheckpointId] = frozenset(),
    store: object = None,
    progress: Callable[[int], None] = lambda n: None,
) -> ExportedHf:
    """:func:`~cairn.torch.export_hf` on ``ckpt``, into ``dest`` (async).

    Args:
        ckpt: The checkpointer to read from.
        target: The checkpoint, as :func:`~cairn.torch._opendcp.open_dcp` takes it
            (None: the latest DCP checkpoint).
        dest: The store to write the files into, at its root.
        shown: How the result names the destination.
        max_shard_bytes: The tensor bytes of one shard at most (a larger tensor is a
            shard of its own), >= 1.
        dtype: Cast floating-point tensors to this dtype; None keeps every dtype.
        fqn_map: Each DCP FQN to its name in the files, or None to leave it out; None
            keeps every tensor under its FQN.
        skip: Checkpoints the latest is not chosen among.
        store: What error messages name as the store searched.
        progress: Told the bytes of each piece once it is handed to the upload.

    Returns:
        The checkpoint exported, and the files written.

    Raises:
        CheckpointNotFoundError: No such checkpoint, or no DCP checkpoint at all.
        IntegrityError: An item is damaged: of the checkpoint asked for by id, or of
            every candidate for the latest or a name (the newest's damage). No index is
            written, and the shards this export completed are deleted.
        InvalidInputError: An unusable argument or FQN map result, a dtype safetensors
            lacks, or nothing to export.
        ObjectExistsError: ``dest`` already holds ``model.safetensors.index.json``.
    """
    if type(max_shard_bytes) is not int or max_shard_bytes < 1:
        raise InvalidInputError(f"max_shard_bytes must be an int >= 1, got {max_shard_bytes!r}")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise InvalidInputError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if sys.byteorder != "little":
        raise InvalidInputError("safetensors files are little-endian: export on such a machine")
    await _refuse_existing(dest)
    choice = ExportChoice(ckpt, target, skip, store)
    while True:
        opened = await choice.open()
        try:
            await load_records(ckpt, opened, None)
            exported = await _export_opened(
                ckpt, opened, dest, shown, max_shard_bytes, dtype, fqn_map, progress
            )
        except IntegrityError as exc:  # what was read does not verify: it is no store error
            if choice.passes_over(opened, exc):
                continue
            raise
        return dataclasses.replace(exported, passed_over=choice.passed_over)


async def _export_opened(
    ckpt: ObjectStoreCheckpointer,
    opened: Opened,
    dest: Store,
    shown: str,
    max_shard_bytes: int,
    dtype: torch.dtype | None,
    fqn_map: FqnMap | None,
    progress: Callable[[int], None],
) -> ExportedHf:
    """Write the tensors of ``opened`` (its records loaded) into ``dest``: the shards,
    then the index; on any failure, the shards written are deleted."""
    tensors, left_out = tensors_to_write(ckpt, opened, fqn_map or (lambda fqn: fqn), dtype)
    if not tensors:
        raise InvalidInputError(
            f"checkpoint {opened.checkpoint_id} has no tensor to export"
            + (" (the FQN map left out every one)" if fqn_map is not None else "")
        )
    shards = plan_shards([t.entry for t in tensors], max_shard_bytes)
    by_name = {t.entry.name: t for t in tensors}
    written: list[tuple[str, int]] = []
    weight_map: dict[str, str] = {}
    try:
        for number, shard in enumerate(shards, 1):
            path = shard_name(number, len(shards))
            members = [by_name[e.name] for e in shard]
            size = await _write_shard(ckpt.store, dest, path, members, progress)
            written.append((path, size))
            weight_map.update((e.name, path) for e in shard)
        total = sum(t.entry.nbytes for t in tensors)
        document = index_document(total, weight_map, str(opened.checkpoint_id))
        await dest.put(INDEX_FILE, document, mode="create")
    except ObjectExistsError:
        # Another export finished here meanwhile: the shards now there may be its own.
        raise
    except BaseException:
        await _remove(dest, [path for path, _ in written])
        raise
    written.append((INDEX_FILE, len(document)))
    manifest = opened.manifest
    return ExportedHf(
        opened.checkpoint_id,
        manifest.name,
        manifest.epoch,
        shown,
        len(tensors),
        tuple(left_out),
        total,
        tuple(written),
    )


async def _refuse_existing(dest: Store) -> None:
    try:
        await dest.head(INDEX_FILE)
    except CheckpointNotFoundError:
        return
    raise ObjectExistsError(
        "put", INDEX_FILE, "the destination already holds an export: choose another, or delete it"
    )


async def _remove(dest: Store, paths: list[str]) -> None:
    """Delete the shards of a failed export, as far as the store lets us."""
    if not paths:
        return
    try:
        await asyncio.shield(dest.delete(paths))
    except (StoreError, IntegrityError, asyncio.CancelledError) as exc:
        log.warning("a failed export left %d shard(s) it could not delete: %s", len(paths), exc)
