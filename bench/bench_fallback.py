"""load_latest with no ``_latest`` pointer over 5,000 checkpoints: the fallback's cost.

    python bench/bench_fallback.py [--quick] [--json out.json] [--reps N] [--checkpoints 5000]

Commits ``--checkpoints`` checkpoints of 5 artifacts (1 KiB each) with cairn's ``save``
(untimed) to a MemoryStore and to a local directory, deletes ``_latest``, damages the
newest manifest (so the fallback must skip one), and measures per store:

* ``cairn``: ``load_latest()`` — reads every manifest, decodes only the ranking fields,
  fully checks and loads the first candidate that verifies;
* ``read-all``: what the fallback did before — ``load_manifest`` (full decode and checks)
  of every checkpoint, rank, then ``load`` of the best; it must choose the same id;
* ``raw get``: raw obstore ``get_async`` + ``bytes_async`` of every ``manifest.json`` at
  the same concurrency (8), nothing decoded: the floor of reading each manifest once.

Target: cairn under 1 s for 5,000 checkpoints on memory and local, with the same choice
as read-all. Measured as in bench_save.py (interleaved rounds, warm-up discarded, medians).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import obstore
from obstore.store import LocalStore, MemoryStore, ObjectStore

from cairn import CheckpointData, CheckpointId, ObjectStoreCheckpointer

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_fallback.py``
    sys.path.insert(0, str(REPO))

from bench.harness import (  # noqa: E402
    Scenario,
    bounded,
    emit_json,
    fixed,
    measure,
    print_report,
    report,
)

ARTIFACTS = 5
CONCURRENCY = 8


async def populate(ckpt: ObjectStoreCheckpointer, count: int) -> list[CheckpointId]:
    payloads = [os.urandom(1024) for _ in range(ARTIFACTS)]
    ids = []
    for epoch in range(count):
        snapshots = {("op", p): payloads[p] for p in range(ARTIFACTS)}
        ids.append(
            (await ckpt.save(CheckpointData(epoch=epoch, snapshots=snapshots))).checkpoint_id
        )
    await ckpt.store.delete([ckpt.paths.latest_pointer()])
    # Damage the newest manifest after its header: the fallback must skip it.
    newest = ckpt.paths.manifest(ids[-1])
    body = bytearray((await ckpt.store.get(newest)).data)
    body[-10] ^= 0x01
    await ckpt.store.delete([newest])
    await ckpt.store.put(newest, bytes(body))
    return ids


async def read_all(ckpt: ObjectStoreCheckpointer) -> CheckpointId:
    """The old fallback: decode and check every manifest in full, then load the best."""
    ids = await ckpt.list_checkpoints()

    async def manifest(i: int) -> object:
        try:
            return await ckpt.load_manifest(ids[i])
        except Exception:
            return None

    manifests = [m for m in await bounded(CONCURRENCY, len(ids), manifest) if m is not None]
    best = max(manifests, key=lambda m: (m.writer_generation or 0, m.epoch, m.checkpoint_id))  # type: ignore[attr-defined]
    loaded = await ckpt.load(best.checkpoint_id)  # type: ignore[attr-defined]
    return loaded.manifest.checkpoint_id


async def raw_get_all(store: ObjectStore, base: str, ids: list[CheckpointId]) -> int:
    async def get(i: int) -> int:
        try:
            result = await obstore.get_async(store, f"{base}{ids[i]}/manifest.json")
        except FileNotFoundError:
            return 0
        return len(await result.bytes_async())

    return sum(await bounded(CONCURRENCY, len(ids), get))


async def run_store(name: str, store: ObjectStore, reps: int, count: int) -> Scenario:
    ckpt = ObjectStoreCheckpointer(store, max_concurrent_downloads=CONCURRENCY)
    began = time.perf_counter()
    print(f"{name}: committing {count} checkpoints...", file=sys.stderr, flush=True)
    ids = await populate(ckpt, count)
    print(f"  took {time.perf_counter() - began:.1f}s", file=sys.stderr, flush=True)
    expected = ids[-2]
    chosen: dict[str, CheckpointId] = {}

    async def cairn() -> None:
        loaded = await ckpt.load_latest()
        assert loaded is not None
        chosen["cairn"] = loaded.manifest.checkpoint_id

    async def old() -> None:
        chosen["read-all"] = await read_all(ckpt)

    async def raw() -> None:
        await raw_get_all(store, ckpt.paths.base_prefix, ids)

    sc = Scenario(
        name=f"load_latest without _latest, {count} checkpoints x{ARTIFACTS} c={CONCURRENCY}",
        store=name,
        amount=count,
        unit="ckpt",
        variants={"cairn": fixed(cairn), "read-all": fixed(old), "raw get": fixed(raw)},
        ratios=[("cairn", "raw get", None), ("cairn", "read-all", None)],
    )
    print(f"running {sc.name} on {name}...", file=sys.stderr, flush=True)
    await measure(sc, reps)
    if not chosen["cairn"] == chosen["read-all"] == expected:
        raise RuntimeError(f"different choices: {chosen}, expected {expected}")
    return sc


async def run_all(reps: int, count: int) -> list[Scenario]:
    scenarios = [await run_store("memory", MemoryStore(), reps, count)]
    with tempfile.TemporaryDirectory(prefix="cairn-bench-fallback-") as tmp:
        scenarios.append(await run_store("local", LocalStore(tmp), reps, count))
    return scenarios


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    parser.add_argument("--reps", type=int, help="repetitions (default 7, 3 with --quick)")
    parser.add_argument("--checkpoints", type=int, default=5000, help="default 5000")
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 7)
    out = report(asyncio.run(run_all(reps, args.checkpoints)), reps)
    out["checkpoints"] = args.checkpoints
    print_report(out)
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
