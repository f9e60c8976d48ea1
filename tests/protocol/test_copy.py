"""The library's copy (``cairn.protocol.copy``), called without the command line: the
target holds the source's objects byte for byte, a chain's other owners included, and
the copy loads there, verified; damage is a failed result worded by ``describe_error``."""

from __future__ import annotations

from obstore.store import MemoryStore
from support.backends import make_checkpointer

from cairn import CheckpointData, CheckpointPaths, IntegrityMismatchError
from cairn.protocol.copy import copy_checkpoints
from cairn.stores import ObstoreStore


class Bar:
    """A progress that keeps what it was told."""

    def __init__(self) -> None:
        self.total = 0.0
        self.done = 0.0
        self.said: list[str] = []

    def set_total(self, total: float) -> None:
        self.total = total

    def describe(self, description: str) -> None:
        self.said.append(description)

    def advance(self, amount: float = 1) -> None:
        self.done += amount


async def listing(store: ObstoreStore) -> dict[str, bytes]:
    return {info.path: bytes((await store.get(info.path)).data) for info in await store.list("")}


async def test_a_copy_holds_the_sources_objects_byte_for_byte() -> None:
    source_store, target_store = ObstoreStore(MemoryStore()), ObstoreStore(MemoryStore())
    source = make_checkpointer(source_store, CheckpointPaths(""), compression="zstd")
    target = make_checkpointer(target_store, CheckpointPaths(""))
    small = {("agg", p): f"partition {p} ".encode() * 50 for p in range(5)}  # one pack
    base = await source.save(CheckpointData(epoch=1, snapshots=small))
    delta = await source.save(
        CheckpointData(epoch=2, deltas={("agg", 0): b"delta " * 500}, parent_id=base.checkpoint_id)
    )
    bar = Bar()
    [copied] = await copy_checkpoints(source, target, [delta.checkpoint_id], progress=bar)
    assert (copied.status, copied.requested, copied.error) == ("copied", True, None)
    assert copied.note == f"carries artifacts of {base.checkpoint_id}"
    assert bar.said == [f"copying {delta.checkpoint_id}"] and bar.done == bar.total > 0
    loaded = await target.load(delta.checkpoint_id)
    assert {key: bytes(data) for key, data in loaded.artifacts.items()} == {
        **small,
        ("agg", 0): b"delta " * 500,
    }
    ours, theirs = await listing(source_store), await listing(target_store)
    assert any(CheckpointPaths.is_pack(relative) for _, relative, _ in delta.stored_objects())
    for owner, relative, _ in delta.stored_objects():
        path = CheckpointPaths("").resolve(owner or delta.checkpoint_id, relative)
        assert theirs[path] == ours[path]  # compressed ones and the pack as stored


async def test_damage_fails_the_copy_and_writes_nothing() -> None:
    source_store, target_store = ObstoreStore(MemoryStore()), ObstoreStore(MemoryStore())
    source = make_checkpointer(source_store, CheckpointPaths(""))
    target = make_checkpointer(target_store, CheckpointPaths(""))
    saved = await source.save(CheckpointData(epoch=1, snapshots={("op", 0): b"state" * 100}))
    [(_, entry)] = saved.partition_entries()
    path = source.paths.resolve(saved.checkpoint_id, entry.path)
    await source_store.put(path, b"STATE" * 100)
    worded: list[BaseException] = []

    def describe(exc: BaseException) -> str:
        worded.append(exc)
        return f"damaged: {type(exc).__name__}"

    [failed] = await copy_checkpoints(
        source, target, [saved.checkpoint_id], describe_error=describe
    )
    assert (failed.status, failed.ok) == ("failed", False)
    assert failed.error == "damaged: IntegrityMismatchError"
    [damage] = worded
    assert isinstance(damage, IntegrityMismatchError) and damage.path == path
    assert await listing(target_store) == {}
