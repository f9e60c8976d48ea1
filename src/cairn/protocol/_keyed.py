"""Reading keyed state by key group: range indexes, verified ranged reads, restore plans.

A keyed partition (:class:`~cairn.data.keyed.KeyedSnapshot`) is an object of ranges, one
range per key group. A restore at another parallelism reads, for each partition that
holds one of its groups, the partition's range index (one ranged read of its last
bytes, checked against the entry's digest), then exactly the ranges of its groups,
adjacent ones together in spans of at most :data:`SPAN_BYTES`.

Invariants:

* no byte outside a wanted group's range is read, but the indexes: the bytes a worker
  fetches are its groups' bytes plus one index per partition it reads from;
* every group handed out is verified against its own SHA-256 (after decoding, for a
  compressed range), unless the caller asks not to; damage to one group fails that
  group alone, as an :class:`~cairn.errors.IntegrityError` naming the operator, the
  partition and the group; the others of the same read are named in its ``others``;
* a group asked for outside the key space, or with another key-group count than the
  checkpoint's, is refused before any artifact is read.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import msgspec

from cairn.data import ArtifactKey, CheckpointData
from cairn.data.keyed import KeyedSnapshot
from cairn.errors import (
    BrokenChainError,
    CheckpointNotFoundError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidInputError,
    KeySpaceMismatchError,
)
from cairn.format._buffer import Buffer
from cairn.format.ids import CheckpointId
from cairn.format.keygroups import KeyGroups, from_runs, to_runs
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.format.ranges import StoredRange, decode_index, decode_range, group_spans
from cairn.format.rescale import (
    GroupRead,
    KeyedAssignment,
    KeyedObject,
    NonKeyedMode,
    RestorePlan,
    group_reads,
    keyed_objects,
    keyed_operators,
    plan_restore,
)
from cairn.protocol import _catalog, _read
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context

__all__ = [
    "SPAN_BYTES",
    "load_assignment",
    "load_key_groups",
    "read_groups",
    "read_index",
    "read_indexes",
    "restore_plan",
    "unchanged_groups",
]

SPAN_BYTES = 64 * 1024 * 1024
"""The most bytes of adjacent groups of one object read with one request: 64 MiB.
Every byte of a span is handed out (spans never cover a gap), so a larger span costs no
memory, only fewer, longer requests: on moto's S3, a worker reading 340 MiB of groups
took about a third of the time with 64 MiB spans than with 8 MiB ones
(``python bench/bench_rescale.py``)."""


async def read_index(ctx: Context, operator: str, held: KeyedObject) -> list[StoredRange]:
    """The range index of one keyed object, read with one ranged request and checked
    against its entry's digest; damage names the operator and partition."""
    entry = held.entry
    assert entry.index_size_bytes is not None
    data_size = entry.size_bytes - entry.index_size_bytes
    try:
        index = await _read.read_range(ctx.store, held.path, data_size, entry.index_size_bytes)
        actual = await asyncio.to_thread(lambda: hashlib.sha256(index).hexdigest())
        if actual != entry.sha256:
            raise IntegrityMismatchError(
                held.path, entry.sha256, actual, what="sha256 of its range index"
            )
        return decode_index(held.path, index, data_size)
    except CheckpointNotFoundError:
        gone = BrokenChainError(held.path, "the object holding its key groups is gone")
        raise gone.located(operator, held.partition) from None
    except IntegrityError as exc:
        raise exc.located(operator, held.partition) from None


async def read_indexes(
    ctx: Context, operator: str, objects: Iterable[KeyedObject]
) -> dict[str, list[StoredRange]]:
    """The range index of each of ``objects`` (each object once), by store path, at
    most ``max_concurrent_downloads`` reads at a time."""
    unique = {held.path: held for held in objects}
    jobs: list[Callable[[], Awaitable[list[StoredRange]]]] = [
        functools.partial(read_index, ctx, operator, held) for held in unique.values()
    ]
    found = await bounded_gather(ctx.max_concurrent_downloads, jobs)
    return dict(zip(unique, found, strict=True))


def _space(manifest: CheckpointManifest, operator: str, key_groups: KeyGroups | None) -> KeyGroups:
    spaces = keyed_operators(manifest)
    space = spaces.get(operator)
    if space is None:
        raise KeySpaceMismatchError(
            operator, f"checkpoint {manifest.checkpoint_id} holds no keyed state of it"
        )
    if key_groups is not None:
        if not isinstance(key_groups, KeyGroups):
            raise InvalidInputError(
                f"key_groups must be a KeyGroups, got {type(key_groups).__name__}"
            )
        if key_groups.count != space.count:
            raise KeySpaceMismatchError(
                operator,
                f"checkpoint {manifest.checkpoint_id} has {space.count} key groups, the "
                f"reader expects {key_groups.count}: the count is fixed for the life of the state",
            )
    return space


async def load_key_groups(
    ctx: Context,
    checkpoint_id: CheckpointId,
    operator: str,
    groups: Iterable[int],
    key_groups: KeyGroups | None = None,
    verify: bool = True,
) -> dict[int, Buffer]:
    """The state of ``groups`` of keyed ``operator`` in ``checkpoint_id`` (see the
    module docstring): group to its bytes, for each group some partition holds."""
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    space = _space(manifest, operator, key_groups)
    if isinstance(groups, str | bytes) or not isinstance(groups, Iterable):
        raise InvalidInputError(f"groups must be an iterable of ints, got {groups!r:.80}")
    wanted = sorted({space.check_group(group) for group in groups})
    objects = keyed_objects(manifest, ctx.paths, operator)
    needed = [held for held in objects if not held.held.isdisjoint(wanted)]
    indexes = await read_indexes(ctx, operator, needed)
    reads = group_reads(objects, indexes, wanted)
    return await read_groups(ctx, operator, reads, verify)


async def read_groups(
    ctx: Context, operator: str, reads: Sequence[GroupRead], verify: bool = True
) -> dict[int, Buffer]:
    """The bytes of each of ``reads`` of ``operator`` (of one plan, or of
    :func:`load_key_groups`), verified when ``verify``: adjacent ranges of one object
    read together, at most ``max_concurrent_downloads`` requests at a time."""
    per_path: dict[str, list[GroupRead]] = {}
    for read in reads:
        if not isinstance(read, GroupRead):
            raise InvalidInputError(f"expected a GroupRead, got {read!r:.80}")
        per_path.setdefault(read.path, []).append(read)
    damage: list[tuple[int, IntegrityError]] = []
    jobs = [
        _span_job(ctx, operator, path, span, verify, damage)
        for path, members in per_path.items()
        for span in group_spans(members, _extent, SPAN_BYTES, 0)
    ]
    found: dict[int, Buffer] = {}
    for results in await bounded_gather(ctx.max_concurrent_downloads, jobs):
        found.update(results)
    if damage:
        damage.sort(key=lambda failure: failure[0])
        first = damage[0][1]
        first.others = tuple(error for _, error in damage[1:])
        raise first
    return dict(sorted(found.items()))


def _extent(read: GroupRead) -> tuple[int, int]:
    return read.offset, read.length


def _span_job(
    ctx: Context,
    operator: str,
    path: str,
    span: list[GroupRead],
    verify: bool,
    damage: list[tuple[int, IntegrityError]],
) -> Callable[[], Awaitable[dict[int, Buffer]]]:
    start = span[0].offset
    end = max(read.offset + read.length for read in span)

    async def job() -> dict[int, Buffer]:
        try:
            data = await _read.read_range(ctx.store, path, start, end - start)
        except CheckpointNotFoundError:
            for read in span:
                gone = BrokenChainError(path, "the object holding the key group is gone")
                damage.append(
                    (read.group, gone.located(operator, read.partition, group=read.group))
                )
            return {}
        except IntegrityError as exc:  # the object ends before the span
            for read in span:
                damage.append(
                    (read.group, _copy(exc).located(operator, read.partition, group=read.group))
                )
            return {}
        found, damaged = await asyncio.to_thread(
            _check_span, path, memoryview(data), start, span, verify
        )
        damage.extend(
            (read.group, exc.located(operator, read.partition, group=read.group))
            for read, exc in damaged
        )
        return found

    return job


def _copy(error: IntegrityError) -> IntegrityError:
    """A fresh copy of ``error`` (one per group it is about: each names its own)."""
    clone = type(error).__new__(type(error))
    clone.args = error.args
    clone.__dict__.update(error.__dict__)
    return clone


def _check_span(
    path: str, view: memoryview, start: int, span: list[GroupRead], verify: bool
) -> tuple[dict[int, Buffer], list[tuple[GroupRead, IntegrityError]]]:
    found: dict[int, Buffer] = {}
    damaged: list[tuple[GroupRead, IntegrityError]] = []
    for read in span:
        stored = StoredRange(read.offset, read.length, read.sha256, read.decoded_size)
        piece = view[read.offset - start : read.offset - start + read.length]
        try:
            data = decode_range(path, piece, stored)
            if verify:
                actual = hashlib.sha256(data).hexdigest()
                if actual != read.sha256:
                    end = read.offset + read.length
                    where = f"sha256 of key group {read.group} (bytes {read.offset}..{end})"
                    raise IntegrityMismatchError(path, read.sha256, actual, what=where)
        except IntegrityError as exc:
            damaged.append((read, exc))
            continue
        found[read.group] = data
    return found, damaged


async def restore_plan(
    ctx: Context,
    checkpoint_id: CheckpointId,
    workers: int,
    non_keyed: NonKeyedMode | Mapping[str, NonKeyedMode] = "split",
) -> RestorePlan:
    """The plan of :func:`cairn.format.rescale.plan_restore` for ``checkpoint_id`` onto
    ``workers`` workers: its manifest and every keyed partition's range index read."""
    manifest = await _catalog.load_manifest(ctx, checkpoint_id)
    indexes: dict[str, list[StoredRange]] = {}
    for operator in sorted(keyed_operators(manifest)):
        objects = keyed_objects(manifest, ctx.paths, operator)
        indexes.update(await read_indexes(ctx, operator, objects))
    return plan_restore(manifest, ctx.paths, indexes, workers, non_keyed)


async def load_assignment(
    ctx: Context, assignment: KeyedAssignment, verify: bool = True
) -> dict[int, Buffer]:
    """The state of the groups of one worker's :class:`KeyedAssignment`, read as its plan
    says (no manifest or index read), verified when ``verify``."""
    if not isinstance(assignment, KeyedAssignment):
        raise InvalidInputError(f"expected a KeyedAssignment, got {assignment!r:.80}")
    return await read_groups(ctx, assignment.operator, assignment.reads, verify)


async def unchanged_groups(
    ctx: Context,
    data: CheckpointData,
    parent_links: Mapping[ArtifactKey, Sequence[tuple[CheckpointId, PartitionSnapshotEntry]]],
) -> dict[ArtifactKey, list[tuple[str, PartitionSnapshotEntry]]]:
    """The groups of ``data``'s keyed snapshots whose bytes equal the parent's (the same
    SHA-256, computed now, over the caller's bytes), carried by reference: per new
    partition, an entry for each object of the parent's chains (``parent_links``) that
    holds some of them, ``used`` naming those, and each snapshot told to leave them out
    of its upload (:meth:`~cairn.data.keyed.KeyedSnapshot.carry`).

    The parent's digests are in its objects' range indexes: one ranged read per object,
    concurrent, before the uploads start; it is what lets an unchanged group cost no
    upload. Only an uncompressed range of the same length is carried."""
    per_operator: dict[str, list[tuple[int, KeyedSnapshot]]] = {}
    for (operator, partition), snapshot in data.snapshots.items():
        if isinstance(snapshot, KeyedSnapshot):
            per_operator.setdefault(operator, []).append((partition, snapshot))
    carried: dict[ArtifactKey, list[tuple[str, PartitionSnapshotEntry]]] = {}
    for operator, snapshots in per_operator.items():
        objects = [
            KeyedObject(
                key[1],
                ctx.paths.resolve(owner, entry.path),
                msgspec.structs.replace(entry, owner=owner),
                tuple(from_runs(entry.key_groups.groups)),
                frozenset(from_runs(entry.key_groups.held)),
            )
            for key, links in parent_links.items()
            if key[0] == operator
            for owner, entry in links
            if entry.key_groups is not None
        ]
        if not objects:
            continue
        indexes = await read_indexes(ctx, operator, objects)
        where: dict[int, tuple[KeyedObject, StoredRange]] = {}
        for held in objects:
            for group, stored in zip(held.groups, indexes[held.path], strict=True):
                if group in held.held:
                    where[group] = (held, stored)
        for partition, snapshot in snapshots:
            digests = await snapshot.digests()
            same: dict[str, list[tuple[int, StoredRange]]] = {}
            for group, digest in digests.items():
                found = where.get(group)
                if found is None:
                    continue
                held, stored = found
                if (
                    stored.sha256 == digest
                    and stored.decoded_size is None
                    and stored.length == snapshot.size_of(group)
                ):
                    same.setdefault(held.path, []).append((group, stored))
            snapshot.carry(data.id, [g for groups in same.values() for g, _ in groups])
            entries = []
            for path, groups in same.items():
                entry = next(held.entry for held in objects if held.path == path)
                assert entry.key_groups is not None
                record = msgspec.structs.replace(
                    entry.key_groups, used=to_runs(g for g, _ in groups)
                )
                used_bytes = sum(stored.length for _, stored in groups)
                entries.append(
                    (
                        operator,
                        msgspec.structs.replace(
                            entry, partition_id=partition, key_groups=record, used_bytes=used_bytes
                        ),
                    )
                )
            if entries:
                carried[(operator, partition)] = entries
    return carried
