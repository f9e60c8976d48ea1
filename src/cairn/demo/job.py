"""The demo streaming job: keyed counts and windowed sums, checkpointed with cairn.

A generated event stream feeds three operators, each with four partitions:

* ``user-counts``: events per user (partition: CRC-32 of the user, mod 4);
* ``window-sums``: the amount summed per one-minute event-time window (partition:
  window number mod 4, so between two checkpoints only the partitions of the current
  windows change);
* ``region-window-sums``: the amount per region and window (partition: CRC-32 of the
  region, mod 4).

The stream is a pure function of ``(seed, offset)`` (:func:`event_at`), so a restarted
job that resumes at a restored source offset sees exactly the events it had not yet
accounted for. Every ``checkpoint_every`` events the job checkpoints through cairn,
and only through cairn: every ``full_every``-th checkpoint holds full snapshots of all
twelve partitions; the ones between hold, with ``parent_id`` set to the previous
checkpoint, a delta for each partition that changed (the new values of the keys that
changed) — cairn carries the unchanged partitions over by reference. The job reports
each checkpoint's kind in the words of every cairn output: ``full`` or ``incremental``.
A restore applies each partition's chain in order (:func:`restore_pipeline`): the base
snapshot, then every delta on top. Each checkpoint records the source offset to resume
from.

Run as ``python -m cairn.demo.job --store URL --prefix P --seed S --events N ...``, the job
restores from ``load_latest`` (if any), replays from the restored offset, checkpoints
to the end of the stream, and prints one JSON object per line as it goes
(:func:`main`), so the parent of ``cairn demo`` can follow it, kill it, and restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cairn import (
    ArtifactKey,
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    LoadedCheckpoint,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
    open_store,
)
from cairn.protocol.discover import checkpoint_counts

__all__ = [
    "OPERATORS",
    "PARTITIONS",
    "Event",
    "JobConfig",
    "Pipeline",
    "event_at",
    "main",
    "reference_pipeline",
    "restore_pipeline",
    "run_job",
]

OPERATORS = ("user-counts", "window-sums", "region-window-sums")
PARTITIONS = 4
SOURCE = "events"
SOURCE_TYPE = "cairn-demo-generator"
SPLIT = "events-0"
USERS = 10_000
REGIONS = ("eu-west", "eu-north", "us-east", "us-west", "sa-east", "me-central")
START_MS = 1_700_000_000_000
EVENT_SPACING_MS = 50
WINDOW_MS = 60_000
_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Event:
    """One event of the generated stream."""

    offset: int
    time_ms: int
    user: str
    region: str
    amount: int


def _mix(value: int) -> int:
    """SplitMix64's finalizer: a fast, well-spread 64-bit hash of an int."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def event_at(seed: int, offset: int) -> Event:
    """The event at ``offset`` of the stream of ``seed``: the same on every call."""
    h = _mix(_mix(seed) ^ offset)
    return Event(
        offset=offset,
        time_ms=START_MS + offset * EVENT_SPACING_MS + (h >> 48) % 40,
        user=f"user-{h % USERS:04d}",
        region=REGIONS[(h >> 20) % len(REGIONS)],
        amount=1 + (h >> 32) % 100,
    )


def _bucket(text: str) -> int:
    return zlib.crc32(text.encode()) % PARTITIONS


def _encode(values: dict[str, int]) -> bytes:
    return json.dumps(values, sort_keys=True, separators=(",", ":")).encode()


def _decode(data: Any) -> dict[str, int]:
    decoded = json.loads(bytes(memoryview(data)))
    if not isinstance(decoded, dict):
        raise ValueError("partition state must be a JSON object")
    return {str(k): int(v) for k, v in decoded.items()}


@dataclass
class Pipeline:
    """The state of the three operators (four partitions each), and what changed since
    the last checkpoint."""

    state: dict[ArtifactKey, dict[str, int]] = field(
        default_factory=lambda: {(op, p): {} for op in OPERATORS for p in range(PARTITIONS)}
    )
    dirty: dict[ArtifactKey, set[str]] = field(default_factory=dict)

    def _add(self, operator: str, partition: int, key: str, amount: int) -> None:
        part = self.state[(operator, partition)]
        part[key] = part.get(key, 0) + amount
        self.dirty.setdefault((operator, partition), set()).add(key)

    def apply(self, event: Event) -> None:
        """Account for one event in every operator."""
        window = event.time_ms // WINDOW_MS
        self._add("user-counts", _bucket(event.user), event.user, 1)
        self._add("window-sums", window % PARTITIONS, str(window), event.amount)
        self._add(
            "region-window-sums", _bucket(event.region), f"{event.region}@{window}", event.amount
        )

    def snapshots(self) -> dict[ArtifactKey, bytes]:
        """The full state of every partition."""
        return {key: _encode(values) for key, values in sorted(self.state.items())}

    def deltas(self) -> dict[ArtifactKey, bytes]:
        """For each partition that changed: the new values of the keys that changed."""
        return {
            key: _encode({k: self.state[key][k] for k in keys})
            for key, keys in sorted(self.dirty.items())
            if keys
        }

    def checkpointed(self) -> None:
        """Forget what changed: the state is now in a checkpoint."""
        self.dirty.clear()

    def keys(self) -> int:
        """How many keys the state holds in all."""
        return sum(len(values) for values in self.state.values())

    def digest(self) -> str:
        """SHA-256 over the whole state, in a canonical order."""
        hasher = hashlib.sha256()
        for (operator, partition), data in self.snapshots().items():
            hasher.update(f"{operator}/{partition}:".encode() + data + b"\n")
        return hasher.hexdigest()


def restore_pipeline(loaded: LoadedCheckpoint) -> Pipeline:
    """Rebuild the state from a loaded checkpoint: per partition, its base snapshot
    and then each delta on top, in chain order."""
    pipeline = Pipeline()
    for key, chain in loaded.chains.items():
        if not chain or chain[0].entry.is_delta:
            raise ValueError(f"the chain of {key!r} does not start with a snapshot")
        values: dict[str, int] = {}
        for link in chain:
            if link.entry.is_delta:
                values.update(_decode(link.data))
            else:
                values = _decode(link.data)
        pipeline.state[key] = values
    return pipeline


def reference_pipeline(seed: int, events: int) -> Pipeline:
    """The state after an uninterrupted run over the whole stream, without checkpoints."""
    pipeline = Pipeline()
    for offset in range(events):
        pipeline.apply(event_at(seed, offset))
    return pipeline


def restored_offset(loaded: LoadedCheckpoint) -> int:
    """The source offset a loaded checkpoint says to resume from."""
    return int(loaded.source_offsets[SOURCE].offsets[SPLIT])


@dataclass(frozen=True)
class JobConfig:
    """What the job processes and how it checkpoints.

    ``stream_seconds`` paces the stream as if the events arrived over that long
    (0: as fast as possible, as when a restarted job catches up on its backlog).
    """

    seed: int
    events: int
    checkpoint_every: int
    full_every: int = 4
    stream_seconds: float = 0.0


Emit = Callable[[dict[str, Any]], None]


async def _checkpoint(
    ckpt: ObjectStoreCheckpointer,
    pipeline: Pipeline,
    epoch: int,
    offset: int,
    parent: CheckpointId | None,
    config: JobConfig,
) -> tuple[CheckpointId, dict[str, Any]]:
    full = parent is None or epoch % config.full_every == 1 % config.full_every
    artifacts = pipeline.snapshots() if full else pipeline.deltas()
    data = CheckpointData(
        epoch=epoch,
        snapshots=artifacts if full else {},
        deltas={} if full else artifacts,
        parent_id=None if full else parent,
        source_offsets={
            SOURCE: SourceOffsetEntry(SOURCE_TYPE, {SPLIT: str(offset)}, epoch),
        },
        watermark=event_at(config.seed, offset - 1).time_ms,
    )
    manifest = await ckpt.save(data)
    counts = checkpoint_counts(manifest)
    pipeline.checkpointed()
    report = {
        "type": "checkpoint",
        "id": str(manifest.checkpoint_id),
        "epoch": epoch,
        "offset": offset,
        "kind": "full" if full else "incremental",  # the CLI's words (cairn.cli.views.kind)
        # The library's counts (cairn.protocol.discover.checkpoint_counts), as every output shows
        # them: one new artifact per partition with new state; the rest carried unchanged.
        "uploaded": counts.uploaded_artifacts,
        "carried": counts.unchanged_partitions,
        "uploaded_bytes": counts.uploaded_bytes,
    }
    return manifest.checkpoint_id, report


async def run_job(ckpt: ObjectStoreCheckpointer, config: JobConfig, emit: Emit) -> Pipeline:
    """Restore from the newest valid checkpoint (if any), then process to the end.

    Calls ``emit`` with ``start`` (what was restored), each ``checkpoint``, and
    ``done`` (the final state's digest).
    """
    loaded = await ckpt.load_latest()
    if loaded is None:
        pipeline, offset, epoch, parent = Pipeline(), 0, 0, None
        emit({"type": "start", "restored": None, "offset": 0})
    else:
        pipeline = restore_pipeline(loaded)
        offset, epoch, parent = restored_offset(loaded), loaded.epoch, loaded.checkpoint_id
        restored = {"id": str(parent), "epoch": epoch, "offset": offset}
        emit({"type": "start", "restored": restored, "offset": offset})
    first, began = offset, time.monotonic()
    rate = config.events / config.stream_seconds if config.stream_seconds > 0 else 0.0
    for position in range(offset, config.events):
        pipeline.apply(event_at(config.seed, position))
        done = position + 1
        if done % config.checkpoint_every == 0 or done == config.events:
            epoch += 1
            parent, report = await _checkpoint(ckpt, pipeline, epoch, done, parent, config)
            emit(report)
        if rate and done % 50 == 0:
            ahead = began + (done - first) / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
    emit({"type": "done", "offset": config.events, "state_sha256": pipeline.digest()})
    return pipeline


def _print_line(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """The job as a process: ``python -m cairn.demo.job --store URL --prefix P ...``."""
    parser = argparse.ArgumentParser(prog="python -m cairn.demo.job", description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, required=True)
    parser.add_argument("--full-every", type=int, default=4)
    parser.add_argument("--stream-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    config = JobConfig(
        seed=args.seed,
        events=args.events,
        checkpoint_every=args.checkpoint_every,
        full_every=args.full_every,
        stream_seconds=args.stream_seconds,
    )
    ckpt = ObjectStoreCheckpointer(open_store(args.store), CheckpointPaths(args.prefix))
    asyncio.run(run_job(ckpt, config, _print_line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
