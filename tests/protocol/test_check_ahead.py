"""A save in two phases may check its earlier uploads, and read the fence, beside its last
upload (``TwoPhaseSave.upload(..., last=True, ahead=...)``, as a DCP save does beside
its metadata): the commit then creates at once. The check is only ahead, not gone: what
it cannot vouch for, the commit checks itself; what goes missing after it, the check
after the create catches; and a takeover after it still wins.
"""

from __future__ import annotations

from typing import Any

import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer

from cairn import (
    BrokenChainError,
    CheckpointAbortedError,
    CheckpointId,
    FencedError,
    ObjectStoreCheckpointer,
)
from cairn.integrations._interface import Entry, TwoPhaseSave, assemble_manifest, begin
from cairn.stores import ForwardingStore, ObstoreStore, Store, StoreMethod


class Calls(ForwardingStore):
    """Records each store call as ``(operation, path)``, in the order they start."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, str]] = []

    async def _around(
        self, operation: StoreMethod, path: str, call: Any, *, mode: Any = None
    ) -> Any:
        self.calls.append((operation, path))
        return await call()


def setup() -> tuple[Calls, ObjectStoreCheckpointer]:
    store = Calls(ObstoreStore(MemoryStore()))
    return store, make_checkpointer(store)


async def upload_last(
    save: TwoPhaseSave, cid: CheckpointId, earlier: list[Entry], ahead: bool = True
) -> list[Entry]:
    """The last upload of ``save`` (its metadata), with the check of ``earlier`` ahead of
    the commit, beside it, or (not ``ahead``) without."""
    checked = assemble_manifest(cid, 1, earlier) if ahead else None
    return await save.upload([("meta", 0, False, b"metadata")], last=True, ahead=checked)


def before_create(store: Calls, ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> list[str]:
    """The operations ``store`` saw before the create of ``cid``'s manifest."""
    create = store.calls.index(("put", ckpt.paths.manifest(cid)))
    return [operation for operation, _ in store.calls[:create]]


@pytest.mark.parametrize("ahead", [False, True])
async def test_the_commit_after_a_check_ahead_creates_at_once(ahead: bool) -> None:
    store, ckpt = setup()
    cid = CheckpointId.now()
    async with await begin(ckpt, cid) as save:
        earlier = await save.upload([("op", 0, False, b"rank zero"), ("op", 1, False, b"one")])
        last = await upload_last(save, cid, earlier, ahead)
        store.calls.clear()
        await save.commit(assemble_manifest(cid, 1, [*earlier, *last]))
    assert before_create(store, ckpt, cid) == ([] if ahead else ["get", "list"])
    loaded = await make_checkpointer(store).load(cid)
    assert bytes(loaded.artifacts[("meta", 0)]) == b"metadata"


async def test_an_artifact_the_check_ahead_did_not_cover_is_checked_before_the_create() -> None:
    store, ckpt = setup()
    cid = CheckpointId.now()
    async with await begin(ckpt, cid) as save:
        first = await save.upload([("op", 0, False, b"checked ahead")])
        last = await upload_last(save, cid, first)
        later = await save.upload([("op", 1, False, b"uploaded after the check")])
        store.calls.clear()
        await save.commit(assemble_manifest(cid, 1, [*first, *last, *later]))
    assert sorted(before_create(store, ckpt, cid)) == ["get", "list"]


@pytest.mark.parametrize("ahead", [False, True])
async def test_an_artifact_gone_before_the_check_ahead_fails_the_commit_as_without_it(
    ahead: bool,
) -> None:
    _, ckpt = setup()
    cid = CheckpointId.now()
    async with await begin(ckpt, cid) as save:
        earlier = await save.upload([("op", 0, False, b"swept")])
        await ckpt.store.delete([ckpt.paths.resolve(cid, earlier[0][1].path)])
        last = await upload_last(save, cid, earlier, ahead)
        with pytest.raises(BrokenChainError, match="missing at commit time"):
            await save.commit(assemble_manifest(cid, 1, [*earlier, *last]))
    assert await ckpt.list_checkpoints() == []


async def test_an_artifact_gone_after_the_check_ahead_is_caught_after_the_create() -> None:
    _, ckpt = setup()
    cid = CheckpointId.now()
    async with await begin(ckpt, cid) as save:
        earlier = await save.upload([("op", 0, False, b"swept later")])
        last = await upload_last(save, cid, earlier)
        await ckpt.store.delete([ckpt.paths.resolve(cid, earlier[0][1].path)])
        with pytest.raises(BrokenChainError):
            await save.commit(assemble_manifest(cid, 1, [*earlier, *last]))
    assert await ckpt.list_checkpoints() == [], "rolled back: no manifest names what is gone"
    assert await ckpt.read_latest() is None


async def test_a_takeover_after_the_check_ahead_still_wins() -> None:
    store, ckpt = setup()
    cid = CheckpointId.now()
    async with await begin(ckpt, cid) as save:
        earlier = await save.upload([("op", 0, False, b"fenced")])
        last = await upload_last(save, cid, earlier)
        await make_checkpointer(store).take_over()  # between the fence read and the create
        with pytest.raises((CheckpointAbortedError, FencedError)):
            await save.commit(assemble_manifest(cid, 1, [*earlier, *last]))
    assert await ckpt.list_checkpoints() == []
