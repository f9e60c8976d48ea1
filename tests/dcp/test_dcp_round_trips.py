"""How many round trips a DCP save through ``CairnWriter`` waits for, one after another.

Counted exactly, as :mod:`support.roundtrips` counts them: ``dcp.save`` runs in one
process (``no_dist``) on the simulated loop, DCP's synchronous storage calls blocking on
cairn's coroutines in a greenlet (:mod:`support.sim.dcp`). A new ``CairnWriter`` per
save, as training loops make them: the layout's listing; the coordinator's intent and
its fence read beside the rank's intent, its check of the id and its upload (the
coordinator generated the id, and the save builds on nothing); DCP's metadata beside a
read of ``_latest``, the fence read and the check of the rank's upload before the
create; the create; and the swap beside the check after it and the removal of the
intent.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the DCP backend needs torch (the torch extra)")

import torch
from support.roundtrips import RoundTripStore, simulate
from support.sim.dcp import _blocking_in_greenlets, in_greenlet
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn.stores import as_store
from cairn.torch import CairnReader, CairnWriter

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:.*torch.distributed is disabled:UserWarning"),
]


def state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {f"layer{i}": torch.randn(64, 32, generator=generator) for i in range(4)}


def test_a_dcp_save_takes_five_round_trips_and_a_load_five() -> None:
    store = RoundTripStore(as_store("memory://"))

    async def scenario() -> None:
        with _blocking_in_greenlets():
            first = CairnWriter(store, epoch=1)
            await in_greenlet(lambda: dcp_save(state(1), storage_writer=first, no_dist=True))
            later = CairnWriter(store, epoch=2)
            with store.measure() as saved:
                await in_greenlet(lambda: dcp_save(state(2), storage_writer=later, no_dist=True))
            loaded = {name: torch.empty_like(tensor) for name, tensor in state(0).items()}
            with store.measure() as read:
                await in_greenlet(
                    lambda: dcp_load(loaded, storage_reader=CairnReader(store), no_dist=True)
                )
        assert all(torch.equal(loaded[name], tensor) for name, tensor in state(2).items())
        assert saved.round_trips == 5, saved.trace()
        assert read.round_trips == 5, read.trace()

    simulate(store, scenario)
