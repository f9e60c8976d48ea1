"""Keyed word counts on Ray, checkpointed by cairn, exactly-once through kills and a rescale.

A deterministic stream of words in 16 source partitions is counted per word by
``--workers`` partition actors (cairn.ray), each holding a range of 128 key groups. The
coordinator checkpoints every ``--interval`` seconds to ``--store``. While the job runs,
``--kill`` random partition actors are killed at random moments (Ray restarts them; cairn
restores every actor from the latest checkpoint and the source replays from its
offsets); halfway, the job is rescaled to ``--rescale-to`` actors. At the end the counts
in the latest checkpoint are compared with an uninterrupted single-process count of the
same stream.

    python examples/ray_wordcount.py --workers 4 --events 200000 --kill 2 \\
        --rescale-to 6 --seed 7 --store ./checkpoints --json

It starts a local Ray (``ray.init(num_cpus=2)``), or joins the cluster at ``--address``.
Needs the ray extra: ``pip install '.[ray]'`` from a clone of cairn.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shlex
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cairn import CheckpointPaths, KeyGroups, SyncCheckpointer
from cairn.ray import JobStatus, PartitionActor, Source, StreamJob

PARTITIONS = 16
KEY_GROUPS = KeyGroups(128)
OPERATOR = "word-counts"
VOCABULARY = 5000
MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finalizer: a well-spread 64-bit hash of ``value``."""
    value = (value + 0x9E3779B97F4A7C15) & MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK
    return value ^ (value >> 31)


def word_at(seed: int, partition: int, offset: int) -> str:
    """The word at ``offset`` of ``partition``: skewed, as words are (a few are common)."""
    h = _mix(_mix(seed * PARTITIONS + partition) ^ offset)
    share = (h >> 11) / (1 << 53)
    return f"word-{int(share * share * VOCABULARY):04d}"


def events_in(events: int, partition: int) -> int:
    """How many of ``events`` the partition holds (they are dealt round-robin)."""
    return events // PARTITIONS + (1 if partition < events % PARTITIONS else 0)


class WordSource(Source):
    """The stream: ``events`` words in 16 partitions, a pure function of the seed."""

    def __init__(self, seed: int, events: int) -> None:
        super().__init__("words", PARTITIONS, "ray-wordcount-generator")
        self.seed, self.events = seed, events

    def read(self, partition: int, offset: int, limit: int) -> Sequence[str]:
        end = min(offset + limit, events_in(self.events, partition))
        return [word_at(self.seed, partition, o) for o in range(offset, end)]


class WordCount(PartitionActor):
    """Counts per word, kept by key group, one JSON object per group."""

    def __init__(self) -> None:
        self.counts: dict[int, dict[str, int]] = {}

    def key_of(self, record: Any) -> bytes:
        return str(record).encode()

    def process(self, record: Any) -> None:
        counts = self.counts.setdefault(self.key_groups.group_of(self.key_of(record)), {})
        counts[record] = counts.get(record, 0) + 1

    def snapshot(self) -> Mapping[int, bytes]:
        return {g: encode(counts) for g, counts in self.counts.items()}

    def restore(self, groups: Mapping[int, Any]) -> None:
        self.counts = {g: decode(data) for g, data in groups.items()}


def encode(counts: Mapping[str, int]) -> bytes:
    """Counts as canonical JSON."""
    return json.dumps(dict(counts), sort_keys=True, separators=(",", ":")).encode()


def decode(data: Any) -> dict[str, int]:
    """Counts from JSON bytes."""
    return {str(k): int(v) for k, v in json.loads(bytes(memoryview(data))).items()}


def digest(counts: Mapping[str, int]) -> str:
    """SHA-256 of the counts in canonical form."""
    return hashlib.sha256(encode(counts)).hexdigest()


def reference_counts(seed: int, events: int) -> dict[str, int]:
    """The counts of an uninterrupted single-process run over the whole stream."""
    counts: dict[str, int] = {}
    for partition in range(PARTITIONS):
        for offset in range(events_in(events, partition)):
            word = word_at(seed, partition, offset)
            counts[word] = counts.get(word, 0) + 1
    return counts


class Killer:
    """Kills random partition actors at random moments while a phase of the job runs."""

    def __init__(self, job: StreamJob, rng: random.Random) -> None:
        self.job, self.rng = job, rng
        self.kills: list[dict[str, Any]] = []
        self.began = time.monotonic()

    def during(self, count: int, run: Any) -> JobStatus:
        """Run ``run()`` while ``count`` kills happen at random moments of it."""
        import ray

        delays = sorted(self.rng.uniform(0.05, 0.6) for _ in range(count))
        done = threading.Event()

        def kill() -> None:
            start = time.monotonic()
            for delay in delays:
                if done.wait(max(0.0, start + delay - time.monotonic())):
                    return
                actors = self.job.actors()
                worker = self.rng.randrange(len(actors))
                ray.kill(actors[worker], no_restart=False)
                at = round(time.monotonic() - self.began, 3)
                self.kills.append({"worker": worker, "at_seconds": at})

        thread = threading.Thread(target=kill, daemon=True)
        thread.start()
        try:
            status: JobStatus = run()
        finally:
            done.set()
            thread.join()
        return status


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ray_wordcount.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--workers", type=int, default=4, help="partition actors at start")
    parser.add_argument("--events", type=int, default=200_000, help="words in the stream")
    parser.add_argument("--kill", type=int, default=2, help="partition actors to kill")
    parser.add_argument("--rescale-to", type=int, default=None, help="actors after halfway")
    parser.add_argument("--seed", type=int, default=7, help="the stream's and the kills' seed")
    parser.add_argument("--store", default="./checkpoints", help="a directory or store URL")
    parser.add_argument("--prefix", default="", help="where in the store ('' for the store's root)")
    parser.add_argument("--batch", type=int, default=500, help="words per partition per round")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between checkpoints")
    parser.add_argument("--address", default=None, help="join this Ray cluster")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import datetime as dt

    import ray

    began = time.monotonic()
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rng = random.Random(args.seed)
    job = StreamJob(
        args.store,
        WordCount,
        WordSource(args.seed, args.events),
        workers=args.workers,
        key_groups=KEY_GROUPS,
        operator=OPERATOR,
        prefix=args.prefix,
        batch=args.batch,
        interval=dt.timedelta(seconds=args.interval),
    )
    killer = Killer(job, rng)
    half = events_in(args.events, 0) // 2 if args.rescale_to else None
    first_kills = (args.kill + 1) // 2 if args.rescale_to else args.kill
    try:
        job.start()
        status = killer.during(first_kills, lambda: job.run(until=half))
        rescaled = None
        if args.rescale_to:
            status = job.rescale(args.rescale_to)
            rescaled = status.restored
            status = killer.during(args.kill - first_kills, job.run)
        committed, restarts, failures = list(status.committed), status.restarts, status.failures
    finally:
        job.stop()
    with SyncCheckpointer(args.store, CheckpointPaths(args.prefix)) as ckpt:
        latest = ckpt.latest_id()
        assert latest is not None, "the job committed no checkpoint"
        manifest = ckpt.load_manifest(latest)
        groups = ckpt.load_key_groups(latest, OPERATOR, range(KEY_GROUPS.count))
    final: dict[str, int] = {}
    for data in groups.values():
        final.update(decode(data))
    reference = reference_counts(args.seed, args.events)
    offsets = manifest.source_offsets["words"].offsets
    at_end = all(int(offsets[str(p)]) == events_in(args.events, p) for p in range(PARTITIONS))
    return {
        "exactly_once": final == reference and at_end,
        "store": args.store,
        "prefix": args.prefix,
        "seed": args.seed,
        "events": args.events,
        "source_partitions": PARTITIONS,
        "key_groups": KEY_GROUPS.count,
        "workers": args.workers,
        "rescale_to": args.rescale_to,
        "kills": killer.kills,
        "restarts": restarts,
        "failures": list(failures),
        "epochs_committed": committed,
        "restored": [
            {k: r[k] for k in ("worker", "groups", "restored_groups", "bytes_read")}
            for r in rescaled or ()
        ],
        "final": {
            "id": str(latest),
            "epoch": manifest.epoch,
            "keys": len(final),
            "state_sha256": digest(final),
        },
        "reference_state_sha256": digest(reference),
        "elapsed_seconds": round(time.monotonic() - began, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        final = report["final"]
        print(f"store   {args.store}, prefix {args.prefix!r}")
        print(
            f"counted {args.events:,} words on {args.workers} actors"
            + (f", rescaled to {args.rescale_to} halfway" if args.rescale_to else "")
            + f"; {len(report['kills'])} killed, {report['restarts']} restarts"
        )
        print(f"epochs  {len(report['epochs_committed'])} committed, last {final['epoch']}")
        for restored in report["restored"]:
            print(
                f"actor {restored['worker']} restored groups {restored['groups'][0]}.."
                f"{restored['groups'][1] - 1}: {restored['bytes_read']:,} bytes"
            )
        print(f"counts  {final['keys']:,} words, sha256 {final['state_sha256'][:16]}…")
        print(f"exactly-once: {'YES' if report['exactly_once'] else 'NO'}")
        listing = shlex.join(["cairn", "list", "--store", args.store, "--prefix", args.prefix])
        print(f"inspect {listing}")
    return 0 if report["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
