"""The ``_latest`` pointer and the writer-generation record, both moved by compare-and-swap.

``_latest`` is a hint naming the newest committed checkpoint. Readers check it against a
real manifest and fall back to listing, so a lost or stale pointer costs time, never
data. Invariants:

* it only moves forwards: to a checkpoint with a greater ``(epoch, id)`` than the one it
  names (unless a caller forces it), by compare-and-swap, so concurrent writers cannot
  move it backwards;
* it carries the writer generation that last moved it; a writer whose generation is
  older than the pointer's (or than the ``_writer`` record's) is fenced and cannot move it.

Fencing. ``_writer`` holds the current writer generation. :func:`take_over` raises it by
one with a compare-and-swap, then claims ``_latest`` for the new generation (same
checkpoint, newer generation), also by compare-and-swap. From then on an older writer
fails twice over: its pre-commit check of ``_writer`` sees the newer generation, and if
it raced past that check, its compare-and-swap of ``_latest`` finds the newer generation
recorded there. Either way it raises :class:`FencedError`, and its checkpoint never
becomes latest. The two records use the same CAS primitive, so a takeover and an old
writer's commit are ordered by the store: a commit whose pointer swap landed before the
claim happened before the takeover (and is kept); any later one is refused.

Both records accept what the reference implementation wrote (a bare checkpoint id for
``_latest``), and both are JSON.
"""

from __future__ import annotations

import logging
import time

import msgspec

from cairn.errors import (
    CheckpointNotFoundError,
    CorruptManifestError,
    FencedError,
    ObjectExistsError,
    PreconditionFailedError,
    StoreError,
)
from cairn.ids import CheckpointId
from cairn.manifest import dec_hook, enc_hook
from cairn.stores import IfMatch, PutMode, Store

log = logging.getLogger("cairn")

MAX_CAS_ROUNDS = 100


class LatestPointer(msgspec.Struct, frozen=True):
    """Content of ``_latest``."""

    checkpoint_id: CheckpointId | None
    epoch: int = -1
    writer_generation: int = 0

    def order(self) -> tuple[int, int]:
        """The key by which the pointer only moves forwards."""
        return (self.epoch, self.checkpoint_id.uuid.int if self.checkpoint_id else -1)


class WriterRecord(msgspec.Struct, frozen=True):
    """Content of ``_writer``: the generation of the writer that owns the store."""

    generation: int
    acquired_ms: int = 0


_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
_pointer_decoder = msgspec.json.Decoder(LatestPointer, dec_hook=dec_hook)
_writer_decoder = msgspec.json.Decoder(WriterRecord)


def decode_pointer(path: str, data: bytes) -> LatestPointer:
    """Parse ``_latest``: our JSON, or the bare id the reference writes."""
    text = bytes(data).strip()
    if CheckpointId.is_valid(text.decode("utf-8", "replace")):
        return LatestPointer(checkpoint_id=CheckpointId.parse(text.decode()), epoch=-1)
    try:
        return _pointer_decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"unreadable latest pointer: {exc}") from None


async def read_pointer(store: Store, path: str) -> tuple[LatestPointer | None, str | None, bool]:
    """``(pointer, e_tag, exists)``; a corrupt pointer reads as None but still exists."""
    try:
        blob = await store.get(path)
    except CheckpointNotFoundError:
        return None, None, False
    try:
        return decode_pointer(path, bytes(blob.data)), blob.info.e_tag, True
    except CorruptManifestError as exc:
        log.warning("ignoring %s", exc)
        return None, blob.info.e_tag, True


async def read_generation(store: Store, path: str) -> tuple[int, str | None]:
    """The current writer generation (0 when no writer ever took over) and its e-tag."""
    try:
        blob = await store.get(path)
    except CheckpointNotFoundError:
        return 0, None
    try:
        return _writer_decoder.decode(bytes(blob.data)).generation, blob.info.e_tag
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"unreadable writer record: {exc}") from None


async def _swap(store: Store, path: str, data: bytes, e_tag: str | None, exists: bool) -> bool:
    """One compare-and-swap; False when another writer got there first."""
    mode: PutMode = "create"
    if exists:
        if e_tag is None:
            raise StoreError("put", path, "the store returned no e-tag: cannot compare-and-swap")
        mode = IfMatch(e_tag)
    try:
        await store.put(path, data, mode=mode)
    except (ObjectExistsError, PreconditionFailedError):
        return False
    return True


async def advance_latest(
    store: Store,
    path: str,
    checkpoint_id: CheckpointId,
    epoch: int,
    generation: int,
    *,
    force: bool = False,
) -> bool:
    """Point ``_latest`` at ``checkpoint_id`` if that moves it forwards (or ``force``).

    Returns whether it moved. Raises :class:`FencedError` if the pointer records a
    newer writer generation than ``generation``.
    """
    wanted = LatestPointer(checkpoint_id, epoch, generation)
    for _ in range(MAX_CAS_ROUNDS):
        current, e_tag, exists = await read_pointer(store, path)
        if current is not None:
            if current.writer_generation > generation:
                raise FencedError(generation, current.writer_generation)
            if current.checkpoint_id == checkpoint_id and current.writer_generation == generation:
                return False
            if not force and current.order() >= wanted.order():
                return False
        if await _swap(store, path, _encoder.encode(wanted), e_tag, exists):
            return True
    raise StoreError("put", path, f"gave up after {MAX_CAS_ROUNDS} contended compare-and-swaps")


async def take_over(store: Store, writer_path: str, latest_path: str) -> int:
    """Become the store's writer: raise the generation by one and claim ``_latest``.

    Returns the new generation. Every writer of an older generation is fenced from then on.
    """
    for _ in range(MAX_CAS_ROUNDS):
        generation, e_tag = await read_generation(store, writer_path)
        record = WriterRecord(generation + 1, time.time_ns() // 10**6)
        if await _swap(store, writer_path, _encoder.encode(record), e_tag, e_tag is not None):
            break
    else:
        raise StoreError("put", writer_path, "gave up: the writer record is too contended")
    new_generation = generation + 1
    for _ in range(MAX_CAS_ROUNDS):
        current, e_tag, exists = await read_pointer(store, latest_path)
        if current is not None and current.writer_generation >= new_generation:
            raise FencedError(new_generation, current.writer_generation)
        claimed = LatestPointer(
            current.checkpoint_id if current else None,
            current.epoch if current else -1,
            new_generation,
        )
        if await _swap(store, latest_path, _encoder.encode(claimed), e_tag, exists):
            return new_generation
    raise StoreError("put", latest_path, "gave up: the latest pointer is too contended")


async def check_not_fenced(store: Store, writer_path: str, generation: int) -> None:
    """Raise :class:`FencedError` if a newer writer generation has taken over."""
    current, _ = await read_generation(store, writer_path)
    if current > generation:
        raise FencedError(generation, current)
