"""Sequential round trips and requests of a small save and of ``load_latest``, exactly.

    python bench/bench_round_trips.py

A save of 64 partitions of 4 KiB plus one source offset (one pack), as a stream job
checkpointing every second makes, on a memory store wrapped by the test suite's
:class:`support.roundtrips.RoundTripStore`: the operation runs on an event loop whose
clock is virtual, and every store call takes one unit of it, so the time an operation
takes is the length of its longest chain of calls each waiting for the one before.
The counts do not depend on the machine. Multiply by a store's latency (20-100 ms for a
PUT to S3) for the wall time the round trips alone cost.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.roundtrips import Counted, RoundTripStore, simulate

from cairn import CheckpointData, ObjectStoreCheckpointer, SourceOffsetEntry
from cairn.format.ids import CheckpointId
from cairn.stores import as_store


def small(epoch: int, parent: CheckpointId | None = None) -> CheckpointData:
    offsets = {"events": SourceOffsetEntry("kafka", {"0": str(epoch)}, epoch)}
    if parent is not None:  # incremental: one partition in ten changes
        deltas = {(f"op{p // 8}", p % 8): b"+" * 400 for p in range(0, 64, 10)}
        return CheckpointData(epoch=epoch, deltas=deltas, parent_id=parent, source_offsets=offsets)
    snapshots = {(f"op{p // 8}", p % 8): bytes([epoch]) * 4096 for p in range(64)}
    return CheckpointData(epoch=epoch, snapshots=snapshots, source_offsets=offsets)


async def dcp_rows(store: RoundTripStore) -> list[tuple[str, Counted]]:
    """A DCP save and load of 4 tensors of 8 KiB, a new CairnWriter per save (when torch
    is installed): DCP's synchronous storage calls run in a greenlet on the simulated loop."""
    try:
        import torch
        from support.sim.dcp import _blocking_in_greenlets, in_greenlet
        from torch.distributed.checkpoint.state_dict_loader import load
        from torch.distributed.checkpoint.state_dict_saver import save

        from cairn.torch import CairnReader, CairnWriter
    except ImportError:
        return []
    import warnings

    warnings.filterwarnings("ignore", ".*torch.distributed is disabled")
    tensors = {f"layer{i}": torch.randn(64, 32) for i in range(4)}
    rows: list[tuple[str, Counted]] = []
    with _blocking_in_greenlets():
        for epoch in (1, 2):
            writer = CairnWriter(store, prefix="dcp/", epoch=epoch)
            with store.measure() as counted:
                await in_greenlet(
                    lambda w=writer: save(tensors, storage_writer=w, no_dist=True)  # type: ignore[misc]
                )
        rows.append(("DCP save (`dcp.save`, a new `CairnWriter`)", counted))
        into = {name: torch.empty_like(tensor) for name, tensor in tensors.items()}
        reader = CairnReader(store, prefix="dcp/")
        with store.measure() as counted:
            await in_greenlet(lambda: load(into, storage_reader=reader, no_dist=True))
        rows.append(("DCP load (`dcp.load`, a new `CairnReader`)", counted))
    return rows


def main() -> None:
    store = RoundTripStore(as_store("memory://"))
    rows: list[tuple[str, Counted]] = []

    async def scenario() -> None:
        ckpt = ObjectStoreCheckpointer(store)
        with store.measure() as counted:
            first = await ckpt.save(small(1))
        rows.append(("first save (a new checkpointer)", counted))
        with store.measure() as counted:
            later = await ckpt.save(small(2))
        rows.append(("later save", counted))
        with store.measure() as counted:
            await ckpt.save(small(3, parent=later.checkpoint_id))
        rows.append(("later save, incremental", counted))
        with store.measure() as counted:
            await ckpt.load_latest()
        rows.append(("load_latest", counted))
        with store.measure() as counted:
            await ObjectStoreCheckpointer(store).load_latest()
        rows.append(("load_latest, new process", counted))
        assert first.epoch == 1
        pipeline = ObjectStoreCheckpointer(store, max_saves_in_flight=2)
        parent = (await pipeline.save(small(5))).checkpoint_id
        with store.measure() as counted:
            for epoch in range(6, 10):
                data = small(epoch, parent=parent)
                await pipeline.save_async(data)
                parent = data.id
            await pipeline.wait_for_saves()
        rows.append(("4 incremental saves handed to `save_async` at once (2 in flight)", counted))
        rows.extend(await dcp_rows(store))
        with store.measure() as counted:
            await ObjectStoreCheckpointer(store).take_over()
        rows.append(("take_over", counted))

    simulate(store, scenario)
    print("| operation | sequential round trips | requests |")
    print("|---|---|---|")
    for name, counted in rows:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(counted.requests().items()))
        print(f"| {name} | {counted.round_trips:.0f} | {kinds} |")


if __name__ == "__main__":
    main()
