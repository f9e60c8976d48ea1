"""The keyed demo job: events per user, in key groups, on N workers, restored on M.

The stream has :data:`SPLITS` source splits; event ``o`` of split ``s`` is
:func:`~cairn.demo.job.event_at` of offset ``o * SPLITS + s``, a pure function of the
seed. Worker ``w`` of ``n`` reads the splits ``s`` with ``s % n == w``, and every event
goes to the worker that owns its user's key group (``KEY_GROUPS.owner_of``): the
operator ``user-counts`` counts events per user, its state cut into
:data:`KEY_GROUPS`. The workers run in one process, one after another on each tick (one
event of every split).

Every ``checkpoint_every`` ticks the job saves one :class:`~cairn.KeyedSnapshot` per
worker (every group of its range), with the offset of every split as one source record,
``parent_id`` the previous checkpoint: cairn uploads only the groups that changed.

On start the job restores the latest checkpoint (if any) onto its own number of workers,
whatever number saved it: ``restore_plan`` says which groups each worker gets and where
they are stored, and each worker reads exactly those (``load_assignment``); the job
reports the bytes each one read against the bytes its groups take. The source splits
are dealt again to the new workers, each resuming at its recorded offset.

Run as ``python -m cairn.demo.keyed --store URL --prefix P --seed S --events N
--workers W ...``; it prints one JSON object per line, as :mod:`cairn.demo.job` does.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    KeyedSnapshot,
    KeyGroups,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
    open_store,
)
from cairn.demo.job import event_at
from cairn.stores import ForwardingStore, Store, StoreMethod, as_store

__all__ = [
    "KEY_GROUPS",
    "OPERATOR",
    "SPLITS",
    "KeyedConfig",
    "KeyedState",
    "main",
    "reference_counts",
    "run_keyed_job",
    "splits_of",
]

T = TypeVar("T")

OPERATOR = "user-counts"
SPLITS = 12
KEY_GROUPS = KeyGroups(128)
SOURCE = "events"
SOURCE_TYPE = "cairn-demo-generator"


def split_name(split: int) -> str:
    """The source record's name of a split."""
    return f"{SOURCE}-{split}"


def splits_of(worker: int, workers: int) -> list[int]:
    """The source splits worker ``worker`` of ``workers`` reads: dealt round-robin.

    Args:
        worker: The worker's index.
        workers: How many workers.

    Returns:
        Its splits, ascending.
    """
    return [split for split in range(SPLITS) if split % workers == worker]


def user_of(seed: int, split: int, offset: int) -> str:
    """The user of event ``offset`` of ``split``.

    Args:
        seed: The stream's seed.
        split: The split.
        offset: The event's offset in it.

    Returns:
        The user's name: the event's key.
    """
    return event_at(seed, offset * SPLITS + split).user


@dataclass
class KeyedState:
    """The counts per user, by key group."""

    groups: dict[int, dict[str, int]] = field(default_factory=dict)

    def apply(self, user: str) -> None:
        """Count one event of ``user``, in its key group."""
        counts = self.groups.setdefault(KEY_GROUPS.group_of(user.encode()), {})
        counts[user] = counts.get(user, 0) + 1

    def snapshot(self, worker: int, workers: int) -> KeyedSnapshot:
        """Worker ``worker``'s part: every group of its range, encoded."""
        groups = KEY_GROUPS.groups_of(worker, workers)
        return KeyedSnapshot(KEY_GROUPS, {g: _encode(self.groups.get(g, {})) for g in groups})

    def counts(self) -> dict[str, int]:
        """Every user's count."""
        return {user: n for counts in self.groups.values() for user, n in counts.items()}

    def digest(self) -> str:
        """SHA-256 of the counts in a canonical form."""
        return counts_digest(self.counts())


def counts_digest(counts: Mapping[str, int]) -> str:
    """SHA-256 of ``counts`` in a canonical form.

    Args:
        counts: Counts per user.

    Returns:
        The hex digest.
    """
    return hashlib.sha256(_encode(dict(counts))).hexdigest()


def _encode(values: Mapping[str, int]) -> bytes:
    return json.dumps(values, sort_keys=True, separators=(",", ":")).encode()


def decode_group(data: Any) -> dict[str, int]:
    """One group's counts from the bytes a checkpoint holds.

    Args:
        data: The group's bytes.

    Returns:
        Its counts per user.
    """
    decoded = json.loads(bytes(memoryview(data)))
    if not isinstance(decoded, dict):
        raise ValueError("a key group's state must be a JSON object")
    return {str(k): int(v) for k, v in decoded.items()}


def reference_counts(seed: int, per_split: int) -> dict[str, int]:
    """The counts of an uninterrupted single-worker run over the whole stream.

    Args:
        seed: The stream's seed.
        per_split: Events per split.

    Returns:
        Counts per user.
    """
    counts: dict[str, int] = {}
    for offset in range(per_split):
        for split in range(SPLITS):
            user = user_of(seed, split, offset)
            counts[user] = counts.get(user, 0) + 1
    return counts


@dataclass(frozen=True)
class KeyedConfig:
    """What the keyed job processes, on how many workers, how it checkpoints."""

    seed: int
    per_split: int
    checkpoint_every: int
    workers: int
    stream_seconds: float = 0.0

    @property
    def checkpoints(self) -> int:
        """How many checkpoints an uninterrupted run makes."""
        return math.ceil(self.per_split / self.checkpoint_every)


class CountingStore(ForwardingStore):
    """Adds up the bytes every read returns (what a worker fetched)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.bytes_read = 0

    async def _around(
        self, operation: StoreMethod, path: str, call: Callable[[], Awaitable[T]], **_: object
    ) -> T:
        result = await call()
        if operation == "get":
            self.bytes_read += memoryview(result.data).nbytes  # type: ignore[attr-defined]
        elif operation == "get_range":
            self.bytes_read += memoryview(result).nbytes  # type: ignore[arg-type]
        return result


Emit = Callable[[dict[str, Any]], None]


async def _restore(
    ckpt: ObjectStoreCheckpointer, store: CountingStore, workers: int, emit: Emit
) -> tuple[KeyedState, dict[int, int], int, CheckpointId | None]:
    cid = await ckpt.latest_id()
    if cid is None:
        emit({"type": "start", "restored": None, "workers": workers})
        return KeyedState(), dict.fromkeys(range(SPLITS), 0), 0, None
    before = store.bytes_read
    plan = await ckpt.restore_plan(cid, workers=workers)
    manifest = await ckpt.load_manifest(cid)
    plan_bytes = store.bytes_read - before
    state = KeyedState()
    reads = []
    for part in plan.assignments:
        assignment = part.keyed[OPERATOR]
        before = store.bytes_read
        groups = await ckpt.load_assignment(assignment)
        reads.append(
            {
                "worker": part.worker,
                "groups": [assignment.groups.start, assignment.groups.stop],
                "read_bytes": store.bytes_read - before,
                "group_bytes": assignment.bytes,
            }
        )
        for group, data in groups.items():
            state.groups[group] = decode_group(data)
    recorded = manifest.source_offsets[SOURCE].offsets
    offsets = {split: int(recorded[split_name(split)]) for split in range(SPLITS)}
    restored = {
        "id": str(cid),
        "epoch": manifest.epoch,
        "workers_before": len(
            {e.partition_id for e in manifest.operators[OPERATOR].partitions if e.owner is None}
        ),
        "offsets": [offsets[split] for split in range(SPLITS)],
        "plan_bytes": plan_bytes,
    }
    emit({"type": "start", "restored": restored, "workers": workers, "reads": reads})
    return state, offsets, manifest.epoch, cid


async def run_keyed_job(
    ckpt: ObjectStoreCheckpointer, store: CountingStore, config: KeyedConfig, emit: Emit
) -> KeyedState:
    """Restore the latest checkpoint onto ``config.workers`` workers (if any), then
    process every split to its end, checkpointing as it goes.

    Args:
        ckpt: The checkpointer, over ``store``.
        store: The store ``ckpt`` reads through, counting bytes.
        config: What to run.
        emit: Called with ``start``, each ``checkpoint`` and ``done``.

    Returns:
        The final state.
    """
    state, offsets, epoch, parent = await _restore(ckpt, store, config.workers, emit)
    deals = [splits_of(w, config.workers) for w in range(config.workers)]
    began, first = time.monotonic(), min(offsets.values())
    rate = config.per_split / config.stream_seconds if config.stream_seconds > 0 else 0.0
    while min(offsets.values()) < config.per_split:
        for splits in deals:  # each worker reads its splits; keys go to their owners
            for split in splits:
                if offsets[split] < config.per_split:
                    state.apply(user_of(config.seed, split, offsets[split]))
                    offsets[split] += 1
        tick = min(offsets.values())
        if tick % config.checkpoint_every == 0 or tick == config.per_split:
            epoch += 1
            data = CheckpointData(
                epoch=epoch,
                snapshots={
                    (OPERATOR, w): state.snapshot(w, config.workers) for w in range(config.workers)
                },
                source_offsets={
                    SOURCE: SourceOffsetEntry(
                        SOURCE_TYPE, {split_name(s): str(n) for s, n in offsets.items()}, epoch
                    )
                },
                parent_id=parent,
            )
            manifest = await ckpt.save(data)
            parent = manifest.checkpoint_id
            stats = manifest.stats
            emit(
                {
                    "type": "checkpoint",
                    "id": str(parent),
                    "epoch": epoch,
                    "offset": tick,
                    "workers": config.workers,
                    "uploaded_bytes": stats.uploaded_bytes if stats else 0,
                    "carried_bytes": stats.carried_bytes if stats else 0,
                }
            )
        if rate:
            ahead = began + (tick - first) / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
    emit({"type": "done", "offset": config.per_split, "state_sha256": state.digest()})
    return state


def _print_line(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """The job as a process: ``python -m cairn.demo.keyed --store URL --prefix P ...``.

    Args:
        argv: The command line, without the program (None: ``sys.argv``).

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m cairn.demo.keyed", description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--per-split", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--stream-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    config = KeyedConfig(
        seed=args.seed,
        per_split=args.per_split,
        checkpoint_every=args.checkpoint_every,
        workers=args.workers,
        stream_seconds=args.stream_seconds,
    )
    store = CountingStore(as_store(open_store(args.store)))
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(args.prefix))
    asyncio.run(run_keyed_job(ckpt, store, config, _print_line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
