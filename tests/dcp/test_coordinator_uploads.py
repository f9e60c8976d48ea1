"""The coordinator hands DCP its own records before its last puts end.

``CairnWriter.write_data`` on the coordinator returns once each of its objects is
hashed and joined, with the puts still running, so that DCP's metadata goes up beside
them (``test_dcp_round_trips.py`` counts the round trip this saves). These tests hold
it to what that must not cost: a put that fails after the records were handed in fails
the save, with nothing committed and nothing of it left; a save DCP gives up between
``write_data`` and ``finish`` stops the puts still running and removes what they wrote.
"""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("torch", reason="the DCP backend needs torch (the torch extra)")

import torch
from support.dcp import PREFIX, save
from support.faults import FaultPlan, FaultyStore
from support.gates import GatedStore
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from cairn import CheckpointPaths, SyncCheckpointer
from cairn.stores import Store, as_store
from cairn.torch import CairnWriter
from cairn.torch._runtime import run

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:.*torch.distributed is disabled:UserWarning"),
]


def state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return {f"layer{i}": torch.randn(256, 64, generator=generator) for i in range(3)}


def stored(store: Store) -> list[str]:
    return sorted(info.path for info in run(store.list(PREFIX), "stored"))


def test_a_put_that_fails_after_the_records_were_handed_in_fails_the_save() -> None:
    inner = as_store("memory://")

    async def metadata_slower(op: str, path: str) -> None:
        # The metadata's put still runs when the rank's fails: what the failed save
        # removes must be removed after it lands, not before.
        if op == "put" and "/dcp-metadata/" in path:
            await asyncio.sleep(0.2)

    plan = FaultPlan(fail_puts_matching="/operators/rank-0/", before_call=metadata_slower)
    store = FaultyStore(inner, plan)
    with pytest.raises(CheckpointException, match="injected permanent fault"):
        save(store, state())
    time.sleep(0.5)  # a put of the save still running when it raised lands by now
    assert SyncCheckpointer(inner, CheckpointPaths(PREFIX)).list_checkpoints() == []
    # Nothing of the save is left: its objects, its metadata and its intents removed.
    assert stored(inner) == [], stored(inner)
    # The write that failed came after the metadata's was sent: the records were handed
    # in first, which is what the failure must not get past.
    puts = [path for op, path in store.log if op == "put" and "/operators/" in path]
    assert any("/dcp-metadata/" in path for path in puts), store.log


def test_a_save_given_up_before_its_commit_stops_the_coordinators_puts() -> None:
    inner = as_store("memory://")
    store = GatedStore(inner, lambda op, path, mode: op == "put" and "/operators/rank-0/" in path)
    writer = CairnWriter(store, epoch=1, prefix=PREFIX)
    planner = DefaultSavePlanner()
    planner.set_up_planner(state(), writer.storage_meta(), True)
    writer.set_up_storage_writer(True, rank=0, use_collectives=True)
    local = writer.prepare_local_plan(planner.create_local_plan())
    plans, _ = planner.create_global_plan([local])
    plans = writer.prepare_global_plan(plans)
    results = writer.write_data(planner.finish_plan(plans[0]), planner).wait()
    assert results  # handed in while the put is held
    assert run(_reached(store), "reached")
    # DCP gives the save up (another rank failed, say) and starts the next one.
    writer.reset()
    store.release()
    # What the held put and the rank's upload wrote is gone; the coordinator's own
    # intent stays until it lapses, as for any save given up before its commit.
    leftover = [p for p in stored(inner) if "/operators/" in p or p.endswith("/intent.json")]
    assert leftover == [], leftover
    assert SyncCheckpointer(inner, CheckpointPaths(PREFIX)).list_checkpoints() == []


async def _reached(store: GatedStore) -> bool:
    await asyncio.wait_for(store.reached.wait(), 10)
    return True
