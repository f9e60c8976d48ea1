"""What attaching observers costs a save: Prometheus metrics and OpenTelemetry traces.

    python bench/bench_observers.py [--quick] [--json out.json] [--reps N]

The same save, on a MemoryStore (so the store does not hide cairn's own costs), with no
observer and with both shipped ones attached (``PrometheusMetrics`` on a private
registry, ``OpenTelemetryTracer`` on an SDK ``TracerProvider`` recording every span):
64 x 8 MiB, and 10,000 x 1 KiB (where per-call costs dominate). Targets: observers cost
under 3% of throughput for the first and under 10% for the second. Interleaved rounds
after a discarded warm-up (see bench/harness.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import prometheus_client
from obstore.store import MemoryStore
from opentelemetry.sdk.trace import TracerProvider

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_observers.py``
    sys.path.insert(0, str(REPO))

from bench.harness import MiB, Run, Scenario, Variant, emit_json, measure, print_report, report  # noqa: E402
from cairn import CheckpointData, ObjectStoreCheckpointer  # noqa: E402
from cairn.observe import Observer  # noqa: E402
from cairn.observe.metrics import PrometheusMetrics  # noqa: E402
from cairn.observe.tracing import OpenTelemetryTracer  # noqa: E402


def saving(parts: list[bytes], observed: bool) -> Variant:
    @asynccontextmanager
    async def variant() -> AsyncIterator[Run]:
        observers: list[Observer] = []
        if observed:
            registry = prometheus_client.CollectorRegistry()
            observers = [PrometheusMetrics(registry), OpenTelemetryTracer(TracerProvider())]
        ckpt = ObjectStoreCheckpointer(MemoryStore(), observers=observers)
        data = CheckpointData(epoch=1, snapshots={("op", i): p for i, p in enumerate(parts)})
        yield lambda: ckpt.save(data)

    return variant


async def run_all(reps: int) -> list[Scenario]:
    shapes = {"64 x 8 MiB": [os.urandom(8 * MiB) for _ in range(64)]}
    one_kib = os.urandom(1024)
    shapes["10,000 x 1 KiB"] = [one_kib] * 10_000
    done = []
    for name, parts in shapes.items():
        size = sum(map(len, parts)) / MiB
        sc = Scenario(
            name=f"save {name}",
            store="memory",
            amount=size,
            unit="MiB",
            variants={"plain": saving(parts, False), "observed": saving(parts, True)},
            ratios=[("observed", "plain", 0.97 if "MiB" in name.split()[-1] else 0.90)],
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
