"""Objects of ranges: which ranges to copy together before they are sent.

    python bench/bench_range_chunks.py [--quick] [--json out.json] [--reps N]

An object of ranges (:mod:`cairn.format.ranges`: a DCP rank's tensors, a save's DCP metadata
blocks) is sent as one streamed upload, chunk by chunk. A chunk costs a round trip
between Python and obstore (about 0.1 ms here), so ranges smaller than
``cairn.protocol._upload.COALESCE_BELOW`` are first copied together into chunks of up to 8 MiB,
and larger ones are sent from their own memory. The bench saves one 256 MiB object of
equal ranges (32 KiB to 1 MiB each) through ``save_partitions_concurrent`` on a
MemoryStore with each range sent as its own chunk (``direct``) and with every range
copied (``copied``); the threshold belongs where the two cross. Interleaved rounds after
a discarded warm-up (see bench/harness.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from obstore.store import MemoryStore

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_range_chunks.py``
    sys.path.insert(0, str(REPO))

from bench.harness import MiB, Run, Scenario, Variant, emit_json, measure, print_report, report  # noqa: E402
from cairn import ObjectStoreCheckpointer  # noqa: E402
from cairn.format.ids import CheckpointId  # noqa: E402
from cairn.format.integrity import sha256_hex  # noqa: E402
from cairn.format.ranges import Range, RangeSource  # noqa: E402
from cairn.protocol import _upload  # noqa: E402

OBJECT_BYTES = 256 * MiB
SIZES_KIB = (32, 64, 128, 256, 1024)


class EqualRanges(RangeSource):
    """``count`` ranges, each the same ``data`` (hashed once)."""

    def __init__(self, data: bytes, count: int) -> None:
        self._range, self._count = Range(data, sha256_hex(data)), count

    async def _each(self) -> AsyncIterator[Range]:
        for _ in range(self._count):
            yield self._range

    def open(self) -> AsyncIterator[Range]:
        return self._each()


def saving(size: int, coalesce_below: int) -> Variant:
    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        ckpt = ObjectStoreCheckpointer(MemoryStore())
        source = EqualRanges(os.urandom(size), OBJECT_BYTES // size)
        cid = CheckpointId.now()
        kept = _upload.COALESCE_BELOW
        _upload.COALESCE_BELOW = coalesce_below
        try:
            yield lambda: ckpt.save_partitions_concurrent(cid, [("op", 0, False, source)])
        finally:
            _upload.COALESCE_BELOW = kept

    return variant


async def run_all(reps: int) -> list[Scenario]:
    done = []
    for kib in SIZES_KIB:
        size = kib * 1024
        sc = Scenario(
            name=f"{OBJECT_BYTES // size:,} ranges of {kib} KiB",
            store="memory",
            amount=OBJECT_BYTES / MiB,
            unit="MiB",
            variants={"direct": saving(size, 0), "copied": saving(size, size + 1)},
            ratios=[("direct", "copied", None)],
        )
        print(f"running {sc.name}...", file=sys.stderr, flush=True)
        await measure(sc, reps)
        done.append(sc)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 7, 3 with --quick)")
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 7)
    out = report(asyncio.run(run_all(reps)), reps)
    print_report(out)
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
