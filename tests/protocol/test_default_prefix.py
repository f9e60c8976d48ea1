"""The default base prefix: the store's root, except for a store written with the old
default ``checkpoints/``, which a checkpointer given no ``paths`` keeps using (with one
warning), so that an upgraded job never silently starts again from nothing."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest
from obstore.store import MemoryStore
from support.cli import cairn
from support.paths import DATA

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    ObjectStoreCheckpointer,
    PathsUnresolvedError,
    SyncCheckpointer,
)
from cairn.stores import as_store

OLD = CheckpointPaths("checkpoints/")
UNPACKED = DATA / "store-unpacked"


def data(
    epoch: int, payload: bytes = b"state", parent: CheckpointId | None = None
) -> CheckpointData:
    return CheckpointData(
        epoch=epoch,
        snapshots={("agg", 0): payload + str(epoch).encode()},
        parent_id=parent,
    )


async def old_default_store(count: int = 2) -> tuple[MemoryStore, list[CheckpointId]]:
    """A store written as cairn wrote it when ``checkpoints/`` was the default."""
    store = MemoryStore()
    old = ObjectStoreCheckpointer(store, OLD)
    ids = [(await old.save(data(epoch))).checkpoint_id for epoch in range(1, count + 1)]
    return store, ids


async def names(store: MemoryStore) -> list[str]:
    return sorted(info.path for info in await as_store(store).list(""))


async def test_a_store_of_the_old_default_keeps_loading_and_growing_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, ids = await old_default_store()
    ckpt = ObjectStoreCheckpointer(store)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        loaded = await ckpt.load_latest()
        assert loaded is not None and loaded.checkpoint_id == ids[-1]
        assert await ckpt.list_checkpoints() == ids
        saved = await ckpt.save(data(3, parent=loaded.checkpoint_id))
    assert ckpt.paths == OLD
    assert saved.parent_id == ids[-1]
    assert await ObjectStoreCheckpointer(store, OLD).list_checkpoints() == [
        *ids,
        saved.checkpoint_id,
    ]
    assert all(path.startswith("checkpoints/") for path in await names(store))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "CheckpointPaths('checkpoints/')" in warnings[0].getMessage()


async def test_records_alone_under_the_old_default_count() -> None:
    store = MemoryStore()
    await ObjectStoreCheckpointer(store, OLD).take_over()  # writes _writer and _latest only
    ckpt = ObjectStoreCheckpointer(store)
    assert await ckpt.resolve_paths() == OLD


async def test_a_fresh_store_gets_the_root_layout() -> None:
    store = MemoryStore()
    ckpt = ObjectStoreCheckpointer(store)
    saved = await ckpt.save(data(1))
    cid = saved.checkpoint_id
    assert ckpt.paths == CheckpointPaths("")
    assert f"{cid}/manifest.json" in await names(store)
    assert "_latest" in await names(store)
    assert not any(path.startswith("checkpoints/") for path in await names(store))
    # a new checkpointer over the same store agrees
    assert await ObjectStoreCheckpointer(store).read_latest() == cid


async def test_the_root_wins_over_the_old_default(caplog: pytest.LogCaptureFixture) -> None:
    store, _ = await old_default_store(1)
    root = await ObjectStoreCheckpointer(store, CheckpointPaths("")).save(data(5))
    ckpt = ObjectStoreCheckpointer(store)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        assert await ckpt.list_checkpoints() == [root.checkpoint_id]
    assert ckpt.paths == CheckpointPaths("")
    assert not caplog.records


async def test_other_folders_at_the_root_are_not_checkpoints() -> None:
    store = MemoryStore()
    await as_store(store).put("logs/run.txt", b"x")
    await ObjectStoreCheckpointer(store, CheckpointPaths("demo/run-1/")).save(data(1))
    ckpt = ObjectStoreCheckpointer(store)
    assert await ckpt.list_checkpoints() == []
    assert ckpt.paths == CheckpointPaths("")


async def test_explicit_paths_are_never_second_guessed() -> None:
    store, _ = await old_default_store(1)
    root = ObjectStoreCheckpointer(store, CheckpointPaths(""))
    assert root.paths == CheckpointPaths("")  # known at once, no I/O
    assert await root.list_checkpoints() == []
    assert root.paths == CheckpointPaths("")
    fresh = ObjectStoreCheckpointer(MemoryStore(), OLD)
    await fresh.save(data(1))
    assert fresh.paths == OLD


async def test_paths_before_resolution_say_how_to_resolve() -> None:
    store, _ = await old_default_store(1)
    ckpt = ObjectStoreCheckpointer(store)
    with pytest.raises(PathsUnresolvedError, match="resolve_paths"):
        _ = ckpt.paths
    assert "checkpoints" not in repr(ckpt)  # repr works before resolution
    assert await ckpt.resolve_paths() == OLD
    assert ckpt.paths == OLD
    assert repr(OLD) in repr(ckpt)


async def test_concurrent_first_calls_resolve_once(caplog: pytest.LogCaptureFixture) -> None:
    store, ids = await old_default_store(2)
    ckpt = ObjectStoreCheckpointer(store)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        results = await asyncio.gather(
            ckpt.list_checkpoints(), ckpt.read_latest(), ckpt.resolve_paths(), ckpt.latest_id()
        )
    assert list(results) == [ids, ids[-1], OLD, ids[-1]]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_the_blocking_checkpointer_resolves_too() -> None:
    store, ids = asyncio.run(old_default_store(1))
    with SyncCheckpointer(store) as ckpt:
        assert ckpt.paths == OLD
        assert ckpt.list_checkpoints() == ids


async def test_the_unpacked_fixture_loads_with_no_paths(tmp_path: Path) -> None:
    root = tmp_path / "old"
    shutil.copytree(UNPACKED, root)
    ckpt = ObjectStoreCheckpointer(root.as_uri())
    ids = await ckpt.list_checkpoints()
    assert ids
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == ids[-1]
    assert ckpt.paths == OLD


def test_the_cli_lists_and_loads_a_store_of_the_old_default(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()
    ids = asyncio.run(_fill_old(url))
    listed = cairn("list", "--store", url, "--json")
    assert listed.code == 0, listed.explain()
    assert [c["id"] for c in listed.json()["checkpoints"]] == [str(cid) for cid in ids]
    assert listed.json()["prefix"] == "checkpoints/"
    assert "--prefix checkpoints/" in listed.stderr
    shown = cairn("show", "latest", "--store", url, "--json")
    assert shown.code == 0, shown.explain()
    assert shown.json()["id"] == str(ids[-1])
    restored = cairn("verify", "latest", "--store", url)
    assert restored.code == 0, restored.explain()


async def _fill_old(url: str) -> list[CheckpointId]:
    old = ObjectStoreCheckpointer(url, OLD)
    return [(await old.save(data(epoch))).checkpoint_id for epoch in (1, 2)]
