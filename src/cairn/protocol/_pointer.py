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

Where a fenced generation ends. A writer that passed its check of ``_writer`` just
before a takeover can still write its manifest after it (and die before its pointer swap
would have failed). Such a checkpoint is committed, but it never happened for the new
writer. So :func:`take_over`, once it has claimed ``_latest``, records in ``_writer`` a
:class:`Fence`: the generations it fenced, and the checkpoint ``_latest`` named at the
claim. The rule every reader applies (:func:`admits`): **a checkpoint of a generation
older than the current one counts only if its ``(epoch, id)`` is at most that of the
checkpoint ``_latest`` named when the next generation took over**; any other was
committed by a fenced writer after the takeover, and is never returned by
``load_latest``, named as the latest, or built upon. A takeover that died between its
claim and its fence is completed by the next takeover (``_latest`` still names what the
claim left there, since only the dead writer could have moved it); generations older
than every recorded fence (a ``_writer`` record without fences) are bounded by nothing
but ``_latest`` itself.

``_latest`` moves forwards only, with one exception: deleting the checkpoint it names
moves it, by compare-and-swap and only while it still names that one, back to the newest
checkpoint that remains (:func:`retreat_latest`), keeping its writer generation.

Both records accept what the reference implementation wrote (a bare checkpoint id for
``_latest``), and both are JSON.

Compare-and-swap. Each swap replaces exactly the version it read: it is conditioned on
what the read returned as :class:`~cairn.stores.ObjectInfo`, the e-tag and, where the
store keeps one, the version (GCS compares the generation alone: its e-tag is the MD5
of the bytes, so it cannot tell two writes of the same record apart, and object_store
refuses a GCS swap without the generation). A record that does not exist is created
with a create-only put.

Damaged records. Decoding either record raises nothing but :class:`CorruptManifestError`
naming it: not JSON, JSON nested too deeply, a value of the wrong type (a number where
an id belongs), a negative generation, or one over :data:`MAX_GENERATION`. What each
operation does then:

* a damaged ``_latest`` reads as no pointer (with a warning): readers fall back to
  listing, and the next pointer swap or takeover replaces it by compare-and-swap;
* a damaged ``_writer`` is a fence whose height is unknown, so it stops every writer:
  ``save`` (and :func:`check_not_fenced`) raises :class:`CorruptManifestError` instead of
  guessing, because guessing low could let a fenced writer commit beside its successor.
  Nothing is written; :func:`take_over` is the repair;
* :func:`take_over` raises the generation above every generation visible in the store:
  ``max(_writer, _latest's writer_generation) + 1``. When ``_writer`` is damaged, that
  is ``_latest``'s generation + 1, which fences every live writer: a writer holds a
  generation only once its own takeover claimed ``_latest`` for it, and the pointer's
  generation never goes down, so no live writer is above it. If ``_latest`` is missing
  or damaged as well, nothing bounds the live generations, so the repair uses the
  current time in milliseconds: generations grow by one per takeover, so they stay far
  below the clock (unless a repair on a clock running ahead set one, and more
  takeovers followed than milliseconds have passed since). A repair logs a warning.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from cairn.errors import (
    CheckpointNotFoundError,
    CorruptManifestError,
    FencedError,
    ObjectExistsError,
    PreconditionFailedError,
    StoreError,
)
from cairn.format.ids import CheckpointId
from cairn.format.manifest import MAX_INT64, CheckpointManifest, dec_hook, decode_record, enc_hook
from cairn.stores import IfMatch, ObjectInfo, PutMode, Store

log = logging.getLogger("cairn")
T = TypeVar("T")
R = TypeVar("R")

MAX_CAS_ROUNDS = 100
"""Compare-and-swap rounds lost to other writers before an update gives up."""

MAX_RECORD_BYTES = 64 * 1024
"""The largest ``_latest`` or ``_writer`` record that is read (they are under 200 bytes)."""

MAX_GENERATION = 2**62
"""The highest writer generation. One takeover adds one, and a repair starts from the
clock (about 2**41 ms), so a record above this is damage, and the headroom leaves room
for every takeover that follows without leaving the 64 bits of JSON integers."""


class LatestPointer(msgspec.Struct, frozen=True):
    """Content of ``_latest``."""

    checkpoint_id: CheckpointId | None
    epoch: int = -1
    writer_generation: int = 0

    def order(self) -> tuple[int, int]:
        """The key by which the pointer only moves forwards."""
        return (self.epoch, self.checkpoint_id.uuid.int if self.checkpoint_id else -1)


@dataclass
class PointerHint:
    """What one checkpointer last read or wrote of ``_latest``: the pointer and the
    version (:class:`ObjectInfo`) it was, for its next swap to try first.

    A swap on a hint needs no read when nothing else moved the pointer since: the
    compare-and-swap is conditioned on that very version, so a hint that went stale
    costs one failed swap, then a read, never a wrong write. ``known`` is False until
    something was read or written (a pointer that did not exist is known too).
    """

    pointer: LatestPointer | None = None
    version: ObjectInfo | None = None
    known: bool = False

    def remember(self, pointer: LatestPointer | None, version: ObjectInfo | None) -> None:
        """Hold ``pointer`` at ``version`` (None: the record does not exist)."""
        self.pointer, self.version, self.known = pointer, version, True

    def forget(self) -> None:
        """Hold nothing: the next swap reads first."""
        self.pointer, self.version, self.known = None, None, False


class Fence(msgspec.Struct, frozen=True):
    """Generations up to ``generation`` ended where ``_latest`` stood at the next takeover.

    ``checkpoint_id`` and ``epoch`` are what ``_latest`` named when the takeover claimed
    it (None and -1 when it named nothing).
    """

    generation: int
    checkpoint_id: CheckpointId | None = None
    epoch: int = -1

    def order(self) -> tuple[int, int]:
        """The greatest ``(epoch, id)`` a checkpoint of a fenced generation may have."""
        return (self.epoch, self.checkpoint_id.uuid.int if self.checkpoint_id else -1)


MAX_FENCES = 1000
"""Fences kept in ``_writer``; the oldest go first (their generations then fall under the
next fence kept, a looser bound)."""


class WriterRecord(msgspec.Struct, frozen=True):
    """Content of ``_writer``: the generation of the writer that owns the store, and
    where each fenced generation ended."""

    generation: int
    acquired_ms: int = 0
    fences: tuple[Fence, ...] = ()

    def admits(self, generation: int, order: tuple[int, int]) -> bool:
        """Whether a checkpoint of ``generation`` at ``(epoch, id)`` ``order`` counts.

        See the module docstring: a checkpoint of a fenced generation counts only up to
        where its generation ended.
        """
        if generation >= self.generation:
            return True
        bounds = [fence for fence in self.fences if fence.generation >= generation]
        if not bounds:
            return True  # no fence records where it ended
        return order <= min(bounds, key=lambda fence: fence.generation).order()


_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
_pointer_decoder = msgspec.json.Decoder(LatestPointer, dec_hook=dec_hook)
_writer_decoder = msgspec.json.Decoder(WriterRecord, dec_hook=dec_hook)


def _in_range(value: int, low: int, high: int) -> bool:
    return low <= value <= high


def decode_pointer(path: str, data: bytes) -> LatestPointer:
    """Parse ``_latest``: our JSON, or the bare id the reference writes.

    Raises :class:`CorruptManifestError` naming ``path`` for anything else.
    """
    text = bytes(data).strip()
    if CheckpointId.is_valid(text.decode("utf-8", "replace")):
        return LatestPointer(checkpoint_id=CheckpointId.parse(text.decode()), epoch=-1)
    pointer = decode_record(_pointer_decoder, path, text, "latest pointer", MAX_RECORD_BYTES)
    if not _in_range(pointer.epoch, -1, MAX_INT64):
        raise CorruptManifestError(path, f"latest pointer has epoch {pointer.epoch}")
    if not _in_range(pointer.writer_generation, 0, MAX_GENERATION):
        raise CorruptManifestError(
            path, f"latest pointer has writer generation {pointer.writer_generation}"
        )
    return pointer


def decode_writer(path: str, data: bytes) -> WriterRecord:
    """Parse ``_writer``; raises :class:`CorruptManifestError` naming ``path`` if damaged."""
    record = decode_record(_writer_decoder, path, data, "writer record", MAX_RECORD_BYTES)
    if not _in_range(record.generation, 0, MAX_GENERATION):
        raise CorruptManifestError(
            path, f"writer record has generation {record.generation}, not in 0..{MAX_GENERATION}"
        )
    if not _in_range(record.acquired_ms, 0, MAX_INT64):
        raise CorruptManifestError(path, f"writer record has acquired_ms {record.acquired_ms}")
    for fence in record.fences:
        if not _in_range(fence.generation, 0, MAX_GENERATION) or not _in_range(
            fence.epoch, -1, MAX_INT64
        ):
            raise CorruptManifestError(path, f"writer record has a damaged fence: {fence}")
    return record


async def read_pointer(
    store: Store, path: str
) -> tuple[LatestPointer | None, ObjectInfo | None, bool]:
    """``(pointer, version, exists)``: ``version`` is the :class:`ObjectInfo` of what was
    read (None when nothing exists), for a swap of it; a corrupt pointer reads as None
    but still exists."""
    try:
        blob = await store.get(path)
    except CheckpointNotFoundError:
        return None, None, False
    try:
        return decode_pointer(path, bytes(blob.data)), blob.info, True
    except CorruptManifestError as exc:
        log.warning("ignoring %s", exc)
        return None, blob.info, True


async def read_writer(
    store: Store, path: str
) -> tuple[WriterRecord | None, ObjectInfo | None, bool]:
    """``(record, version, exists)`` as :func:`read_pointer` returns them; a damaged
    record reads as None (with a warning)."""
    try:
        blob = await store.get(path)
    except CheckpointNotFoundError:
        return WriterRecord(0), None, False
    try:
        return decode_writer(path, bytes(blob.data)), blob.info, True
    except CorruptManifestError as exc:
        log.warning("%s: take_over() replaces it", exc)
        return None, blob.info, True


Read = Callable[[], Awaitable[tuple[T, ObjectInfo | None]]]
"""Reads a record: its value, and the :class:`ObjectInfo` of the version read (None when
there is none: the write creates it)."""

Change = Callable[[T], tuple[msgspec.Struct | None, R]]
"""Decides from the value read what to write (None: nothing) and what to return; may raise
to stop (a fenced writer)."""


async def update_record(
    store: Store,
    path: str,
    read: Read[T],
    change: Change[T, R],
    first: tuple[T, ObjectInfo | None] | None = None,
    wrote: Callable[[msgspec.Struct | None, ObjectInfo | None], None] | None = None,
) -> R:
    """The one read-modify-write of a record, by compare-and-swap, retried on conflict.

    Each round reads the record and the version it read, asks ``change`` for the new
    value, and writes it conditioned on that version (:func:`_swap`); when another writer
    got there first, it reads again. ``first`` is a value and version believed current
    (a :class:`PointerHint`): the first round uses it instead of reading, and a write
    it decides on is still conditioned on that version. ``wrote`` is told the value
    written and the version the store returned (None when nothing was written: the
    value read is then current). Returns what ``change`` returned with the value it
    wrote, or with its decision to write nothing. Raises :class:`StoreError` after
    :data:`MAX_CAS_ROUNDS` lost rounds.
    """
    for round_ in range(MAX_CAS_ROUNDS):
        current, version = first if first is not None and round_ == 0 else await read()
        wanted, result = change(current)
        if wanted is None and first is not None and round_ == 0:
            # Decided on a hint alone: read, so that the decision is on what is there.
            continue
        if wanted is None:
            if wrote is not None:
                wrote(None, version)
            return result
        written = await _swap(store, path, _encoder.encode(wanted), version)
        if written is not None:
            if wrote is not None:
                wrote(wanted, written)
            return result
    raise StoreError("put", path, f"gave up after {MAX_CAS_ROUNDS} contended compare-and-swaps")


async def _swap(
    store: Store, path: str, data: bytes, current: ObjectInfo | None
) -> ObjectInfo | None:
    """One compare-and-swap of ``current`` (the version read; None: create the record);
    the new version, or None when another writer got there first."""
    mode: PutMode = "create"
    if current is not None:
        if current.e_tag is None:
            raise StoreError("put", path, "the store returned no e-tag: cannot compare-and-swap")
        mode = IfMatch(current.e_tag, current.version)
    try:
        return await store.put(path, data, mode=mode)
    except (ObjectExistsError, PreconditionFailedError):
        return None


def _reading_pointer(
    store: Store, path: str, hint: PointerHint | None = None
) -> Read[LatestPointer | None]:
    async def read() -> tuple[LatestPointer | None, ObjectInfo | None]:
        pointer, version, exists = await read_pointer(store, path)
        if hint is not None:
            if exists and (pointer is None or version is None or version.e_tag is None):
                hint.forget()  # damaged, or no version to swap on: read each time
            else:
                hint.remember(pointer, version)
        return pointer, version

    return read


async def read_latest(store: Store, path: str, hint: PointerHint) -> LatestPointer | None:
    """``_latest`` (None when missing or damaged), read into ``hint`` too, so that the
    next swap of it needs no read of its own."""
    pointer, _ = await _reading_pointer(store, path, hint)()
    return pointer


def _reading_writer(store: Store, path: str) -> Read[WriterRecord | None]:
    async def read() -> tuple[WriterRecord | None, ObjectInfo | None]:
        record, version, _ = await read_writer(store, path)
        return record, version

    return read


async def advance_latest(
    store: Store,
    path: str,
    checkpoint_id: CheckpointId,
    epoch: int,
    generation: int,
    *,
    force: bool = False,
    hint: PointerHint | None = None,
) -> bool:
    """Point ``_latest`` at ``checkpoint_id`` if that moves it forwards (or ``force``).

    With a ``hint`` that holds a version, the first swap is tried on it without a read
    (:func:`update_record`), and the hint is left holding what was written, or read.
    Returns whether it moved. Raises :class:`FencedError` if the pointer records a
    newer writer generation than ``generation``.
    """
    wanted = LatestPointer(checkpoint_id, epoch, generation)

    def change(current: LatestPointer | None) -> tuple[LatestPointer | None, bool]:
        if current is not None:
            if current.writer_generation > generation:
                raise FencedError(generation, current.writer_generation)
            if current.checkpoint_id == checkpoint_id and current.writer_generation == generation:
                return None, False
            if not force and current.order() >= wanted.order():
                return None, False
        return wanted, True

    return await update_record(
        store, path, _reading_pointer(store, path, hint), change, *_hinted(hint)
    )


def _hinted(
    hint: PointerHint | None,
) -> tuple[
    tuple[LatestPointer | None, ObjectInfo | None] | None,
    Callable[[msgspec.Struct | None, ObjectInfo | None], None] | None,
]:
    """The first guess :func:`update_record` takes from ``hint``, and how it tells the
    hint what it wrote."""
    if hint is None:
        return None, None

    def wrote(value: msgspec.Struct | None, version: ObjectInfo | None) -> None:
        if value is None:
            return  # the read already told the hint
        if version is None or version.e_tag is None:
            hint.forget()  # a version no swap can be conditioned on
        else:
            assert isinstance(value, LatestPointer)
            hint.remember(value, version)

    first = (hint.pointer, hint.version) if hint.known else None
    return first, wrote


async def retreat_latest(
    store: Store, path: str, deleted: CheckpointId, target: CheckpointManifest | None
) -> bool:
    """Move ``_latest`` off ``deleted`` (a checkpoint being deleted) to ``target``.

    Only while the pointer still names ``deleted``: a writer that moved it meanwhile
    wins. The pointer keeps its writer generation (the fence it records); with no
    ``target`` it names nothing. Returns whether it moved.
    """

    def change(current: LatestPointer | None) -> tuple[LatestPointer | None, bool]:
        if current is None or current.checkpoint_id != deleted:
            return None, False
        if target is None:
            return LatestPointer(None, -1, current.writer_generation), True
        return LatestPointer(target.checkpoint_id, target.epoch, current.writer_generation), True

    return await update_record(store, path, _reading_pointer(store, path), change)


async def withdraw_latest(
    store: Store, path: str, withdrawn: CheckpointId, before: LatestPointer | None
) -> bool:
    """Move ``_latest`` off ``withdrawn`` (a commit rolled back after a swap named it)
    back to ``before``, what it named until then; None: to nothing.

    Only while the pointer still names ``withdrawn``, and it keeps its writer generation.
    Returns whether it moved.
    """

    def change(current: LatestPointer | None) -> tuple[LatestPointer | None, bool]:
        if current is None or current.checkpoint_id != withdrawn:
            return None, False
        if before is None or before.checkpoint_id == withdrawn:
            return LatestPointer(None, -1, current.writer_generation), True
        return LatestPointer(before.checkpoint_id, before.epoch, current.writer_generation), True

    return await update_record(store, path, _reading_pointer(store, path), change)


async def take_over(
    store: Store,
    writer_path: str,
    latest_path: str,
    before_claim: Callable[[int], Awaitable[None]] | None = None,
) -> int:
    """Become the store's writer: raise the generation, then claim ``_latest``.

    The new generation is one above every generation visible in the store, ``_writer``'s
    and ``_latest``'s, so a lost or rewound ``_writer`` cannot leave it below the
    pointer; a damaged ``_writer`` is replaced (see the module docstring for why the
    repaired generation fences every earlier writer). ``before_claim`` is awaited with
    the new generation between the two: a checkpointer aborts there the saves in flight
    of older generations (see :func:`cairn.protocol.retention.abort_saves_in_flight`). Returns the
    new generation. Every writer of an older generation is fenced from then on.
    """
    new_generation, repair = await update_record(
        store, writer_path, _reading_both(store, writer_path, latest_path), _raised(writer_path)
    )
    if repair is not None:
        log.warning(
            "replaced the damaged writer record %s with generation %d (%s)",
            writer_path,
            new_generation,
            repair,
        )

    if before_claim is not None:
        await before_claim(new_generation)

    def claim(current: LatestPointer | None) -> tuple[LatestPointer, LatestPointer]:
        if current is not None and current.writer_generation >= new_generation:
            raise FencedError(new_generation, current.writer_generation)
        claimed = LatestPointer(
            current.checkpoint_id if current else None,
            current.epoch if current else -1,
            new_generation,
        )
        return claimed, claimed

    claimed = await update_record(store, latest_path, _reading_pointer(store, latest_path), claim)
    fence = Fence(new_generation - 1, claimed.checkpoint_id, claimed.epoch)
    await _record_fence(store, writer_path, new_generation, fence)
    return new_generation


_Seen = tuple[WriterRecord | None, LatestPointer | None, bool]
"""What a takeover reads: ``_writer`` (None: damaged), ``_latest``, whether it exists."""


def _reading_both(store: Store, writer_path: str, latest_path: str) -> Read[_Seen]:
    """Read ``_writer`` (the record swapped) and, beside it, ``_latest``."""

    async def read() -> tuple[_Seen, ObjectInfo | None]:
        writer, latest = await asyncio.gather(
            read_writer(store, writer_path),
            read_pointer(store, latest_path),
            return_exceptions=True,
        )
        if isinstance(writer, BaseException):  # the same error whichever answers first
            raise writer
        if isinstance(latest, BaseException):
            raise latest
        (record, version, _), (pointer, _, pointer_exists) = writer, latest
        return (record, pointer, pointer_exists), version

    return read


def _raised(writer_path: str) -> Change[_Seen, tuple[int, str | None]]:
    """The takeover's change of ``_writer``: a generation above every one visible; returns
    it, and why it was chosen when it replaces a damaged record."""

    def change(seen: _Seen) -> tuple[WriterRecord, tuple[int, str | None]]:
        record, pointer, pointer_exists = seen
        visible = [r.generation for r in (record,) if r is not None]
        visible += [p.writer_generation for p in (pointer,) if p is not None]
        if not visible:  # nothing readable bounds the live generations: the clock does
            visible.append(time.time_ns() // 10**6)
        new_generation = max(visible) + 1
        if new_generation > MAX_GENERATION:
            raise CorruptManifestError(
                writer_path, f"writer generation {max(visible)} leaves no room for a takeover"
            )
        repair = None
        if record is None and pointer is not None:
            repair = f"the latest pointer names generation {pointer.writer_generation}"
        elif record is None:
            repair = f"the latest pointer is {'damaged' if pointer_exists else 'missing'}"
        fences = _completed_fences(record, pointer)
        replaced = WriterRecord(new_generation, time.time_ns() // 10**6, fences)
        return replaced, (new_generation, repair)

    return change


def _completed_fences(
    record: WriterRecord | None, pointer: LatestPointer | None
) -> tuple[Fence, ...]:
    """``record``'s fences, plus the one a takeover that died after its claim never wrote.

    That takeover's claim is still what ``_latest`` names (its generation is the
    pointer's): only the dead writer could have moved it on.
    """
    if record is None:
        return ()  # a damaged record: where earlier generations ended is lost
    fences = record.fences
    recorded = max((fence.generation for fence in fences), default=-1)
    if (
        record.generation > 0
        and recorded < record.generation - 1
        and pointer is not None
        and pointer.writer_generation == record.generation
    ):
        fences += (Fence(record.generation - 1, pointer.checkpoint_id, pointer.epoch),)
    return fences


async def _record_fence(store: Store, writer_path: str, generation: int, fence: Fence) -> None:
    """Add ``fence`` to ``_writer`` by compare-and-swap, while it still holds ``generation``."""

    def change(record: WriterRecord | None) -> tuple[WriterRecord, None]:
        if record is None or record.generation != generation:
            current = record.generation if record is not None else -1
            raise FencedError(generation, current)  # a newer takeover completes our fence
        return msgspec.structs.replace(record, fences=(*record.fences, fence)[-MAX_FENCES:]), None

    await update_record(store, writer_path, _reading_writer(store, writer_path), change)


async def check_not_fenced(store: Store, writer_path: str, generation: int) -> WriterRecord:
    """Raise :class:`FencedError` if a newer writer generation has taken over.

    Returns the record read (a generation-0 one when there is none). A damaged
    ``_writer`` raises :class:`CorruptManifestError`: a fence of unknown height stops every
    writer until :func:`take_over` repairs it.
    """
    try:
        blob = await store.get(writer_path)
    except CheckpointNotFoundError:
        record = WriterRecord(0)
    else:
        record = decode_writer(writer_path, bytes(blob.data))
    if record.generation > generation:
        raise FencedError(generation, record.generation)
    return record
