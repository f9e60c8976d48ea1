"""How many round trips a DCP save through ``CairnWriter`` waits for, one after another.

Counted exactly, as :mod:`support.roundtrips` counts them: ``dcp.save`` runs in one
process (``no_dist``) on the simulated loop, DCP's synchronous storage calls blocking on
cairn's coroutines in a greenlet (:mod:`support.sim.dcp`). A new ``CairnWriter`` per
save, as training loops make them: the layout's listing; the coordinator's intent and
its fence read beside the rank's intent and its upload (the coordinator generated the
id, which no rank looks up, and the save builds on nothing); DCP's metadata beside a
read of ``_latest`` and the fence read before the create; the create; and the swap
beside the check after it and the removal of the intent.

The coordinator hands DCP its own records as soon as its objects are hashed, before
their puts end, so DCP's metadata goes up beside its last puts: a rank whose uploads
take longer than the coordinator's lease does not wait another round trip for the
metadata after them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the DCP backend needs torch (the torch extra)")

import torch
from support.roundtrips import RoundTripStore, simulate
from support.sim.dcp import _blocking_in_greenlets, in_greenlet
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import CheckpointId
from cairn.stores import as_store
from cairn.torch import CairnReader, CairnWriter, _writer

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
        # The coordinator generated the id, a new UUIDv7: no rank looks it up.
        assert "head" not in saved.requests(), saved.trace()

    simulate(store, scenario)


def test_an_id_given_to_the_save_is_looked_up_before_it_commits() -> None:
    store = RoundTripStore(as_store("memory://"))
    given = CheckpointId.now()

    async def scenario() -> None:
        with _blocking_in_greenlets():
            writer = CairnWriter(store, epoch=1, prefix="")
            with store.measure() as saved:
                await in_greenlet(
                    lambda: dcp_save(
                        state(1), storage_writer=writer, checkpoint_id=str(given), no_dist=True
                    )
                )
        assert writer.checkpoint_id == given
        manifest = f"{given}/manifest.json"
        looked_up = [c for c in saved.calls if c.path == manifest and c.at < 1.0]
        # The coordinator's check, then (the id could be committed) the rank's, each
        # before anything of the save is committed.
        assert len(looked_up) == 1 and looked_up[0].operation == "head", saved.trace()
        rank = [c for c in saved.calls if c.path == manifest and c.operation == "head"]
        assert len(rank) == 2, saved.trace()

    simulate(store, scenario)


def test_the_metadata_goes_up_beside_the_coordinators_last_put(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Objects of 16 KiB, one upload at a time: the rank's 4 items of 8 KiB are two
    # objects, put one after the other, the second beside the metadata.
    monkeypatch.setattr(_writer, "OBJECT_BYTES", 16 << 10)
    store = RoundTripStore(as_store("memory://"))

    async def scenario() -> None:
        with _blocking_in_greenlets():
            writer = CairnWriter(store, epoch=1, prefix="", max_concurrent_uploads=1)
            with store.measure() as saved:
                await in_greenlet(lambda: dcp_save(state(1), storage_writer=writer, no_dist=True))
            loaded = {name: torch.empty_like(tensor) for name, tensor in state(0).items()}
            await in_greenlet(
                lambda: dcp_load(loaded, storage_reader=CairnReader(store, prefix=""), no_dist=True)
            )
        assert all(torch.equal(loaded[name], tensor) for name, tensor in state(1).items())
        puts = [call for call in saved.calls if "/operators/" in call.path]
        assert [call.at for call in puts] == [0.0, 1.0, 1.0], saved.trace()
        # Both objects and the metadata, then the create, then the swap.
        assert saved.round_trips == 4, saved.trace()

    simulate(store, scenario)
