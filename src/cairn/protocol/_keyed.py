"""Reading keyed state by key group: range indexes, verified ranged reads, restore plans.

A keyed partition (:class:`~cairn.data.keyed.KeyedSnapshot`) is an object of ranges, one
range per key group. A restore at another parallelism reads, for each partition that
holds one of its groups, the partition's range index (one ranged read of its last
bytes, checked against the entry's digest), then exactly the ranges of its groups,
adjacent ones together in spans of at most :data:`~cairn.protocol._download.SPAN_BYTES`.

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
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

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
from cairn.format.keygroups import KeyGroups
from cairn.format.manifest import CheckpointManifest, PartitionSnapshotEntry
from cairn.format.ranges import StoredRange, decode_index, decode_range, group_spans
from cairn.format.rescale import (
    GroupRead,
    KeyedAssignment,
    NonKeyedMode,
    RestorePlan,
    group_reads,
    keyed_operators,
    keyed_partitions,
    plan_restore,
)
from cairn.protocol import _catalog, _read
from cairn.protocol._concurrency import bounded_gather
from cairn.protocol._context import Context
from cairn.protocol._download import SPAN_BYTES

__all__ = ["load_assignment", "load_key_groups", "read_groups", "read_index", "restore_plan"]


async def read_index(
    ctx: Context, manifest: CheckpointManifest, operator: str, entry: PartitionSnapshotEntry
) -> list[StoredRange]:
    """The range index of one keyed partition, read with one ranged request and checked
    against its entry's digest; damage names the operator and partition."""
    assert entry.index_size_bytes is not None
    path = ctx.paths.resolve(entry.owner or manifest.checkpoint_id, entry.path)
    data_size = entry.size_bytes - entry.index_size_bytes
    try:
        index = await _read.read_range(ctx.store, path, data_size, entry.index_size_bytes)
        actual = await asyncio.to_thread(lambda: hashlib.sha256(index).hexdigest())
        if actual != entry.sha256:
            raise IntegrityMismatchError(
                path, entry.sha256, actual, what="sha256 of its range index"
            )
        return decode_index(path, index, data_size)
    except CheckpointNotFoundError:
        owner = entry.owner or manifest.checkpoint_id
        gone = BrokenChainError(path, f"artifact of checkpoint {owner} is gone")
        raise gone.located(operator, entry.partition_id) from None
    except IntegrityError as exc:
        raise exc.located(operator, entry.partition_id) from None


async def _indexes(
    ctx: Context, manifest: CheckpointManifest, operator: str, partitions: Iterable[int]
) -> dict[int, list[StoredRange]]:
    held = keyed_partitions(manifest, operator)
    wanted = sorted(set(partitions))
    jobs: list[Callable[[], Awaitable[list[StoredRange]]]] = [
        lambda entry=held[p][0]: read_index(ctx, manifest, operator, entry)  # type: ignore[misc]
        for p in wanted
    ]
    found = await bounded_gather(ctx.max_concurrent_downloads, jobs)
    return dict(zip(wanted, found, strict=True))


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
    held = keyed_partitions(manifest, operator)
    needed = [p for p, (_, gs) in held.items() if not set(gs).isdisjoint(wanted)]
    indexes = await _indexes(ctx, manifest, operator, needed)
    reads = group_reads(manifest, ctx.paths, operator, indexes, wanted)
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
    indexes: dict[tuple[str, int], list[StoredRange]] = {}
    for operator in sorted(keyed_operators(manifest)):
        held = keyed_partitions(manifest, operator)
        for partition, index in (await _indexes(ctx, manifest, operator, held)).items():
            indexes[(operator, partition)] = index
    return plan_restore(manifest, ctx.paths, indexes, workers, non_keyed)


async def load_assignment(
    ctx: Context, assignment: KeyedAssignment, verify: bool = True
) -> dict[int, Buffer]:
    """The state of the groups of one worker's :class:`KeyedAssignment`, read as its plan
    says (no manifest or index read), verified when ``verify``."""
    if not isinstance(assignment, KeyedAssignment):
        raise InvalidInputError(f"expected a KeyedAssignment, got {assignment!r:.80}")
    return await read_groups(ctx, assignment.operator, assignment.reads, verify)
