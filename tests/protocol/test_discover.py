"""Finding checkpoints for tools (cairn.protocol.discover), and the command line relying on it.

The library answers what the command line needs: which directories
are checkpoints, which prefixes of a store hold some, which run is the newest, many
manifests at once with damage in its place, the stored bytes of an entry, and (through
``delete_checkpoint``) whether a checkpoint may be deleted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.policies import FAST_RETRY

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointInUseError,
    CheckpointManifest,
    CheckpointNotFoundError,
    CheckpointPaths,
    IntegrityError,
    ObjectStoreCheckpointer,
    SyncCheckpointer,
)
from cairn.cli.errors import CliError
from cairn.cli.maintain import delete
from cairn.protocol._read import read_stored
from cairn.protocol.discover import checkpoint_dirs, checkpoint_prefixes, newest_checkpoint_prefix
from cairn.stores import ObstoreStore


def checkpointer(store: ObstoreStore, prefix: str = "checkpoints/") -> ObjectStoreCheckpointer:
    return make_checkpointer(store, CheckpointPaths(prefix))


async def save(ckpt: ObjectStoreCheckpointer, epoch: int = 0) -> CheckpointId:
    data = CheckpointData(epoch=epoch, snapshots={("op", 0): b"state"})
    return (await ckpt.save(data)).checkpoint_id


async def test_checkpoint_dirs_include_saves_that_did_not_commit() -> None:
    store = ObstoreStore(MemoryStore())
    ckpt = checkpointer(store)
    committed = await save(ckpt)
    stopped = CheckpointId.now()
    await store.put(ckpt.paths.snapshot(stopped, "op", 0), b"left")
    await store.put("checkpoints/not-an-id/x", b"")
    assert await ckpt.list_checkpoint_dirs() == [committed, stopped]
    assert await checkpoint_dirs(store, ckpt.paths) == [committed, stopped]
    assert await ckpt.list_checkpoints() == [committed]


async def test_checkpoint_prefixes_finds_the_usual_layouts_and_stops_descending() -> None:
    store = ObstoreStore(MemoryStore())
    for prefix in ("checkpoints/", "jobs/a/", "demo/run-1/"):
        await save(checkpointer(store, prefix))
    await save(checkpointer(store, "jobs/a/checkpoints/"))  # below a prefix that holds some
    await store.put("other/deep/er/still/x", b"")
    assert await checkpoint_prefixes(store) == ["checkpoints/", "demo/run-1/", "jobs/a/"]
    assert await checkpoint_prefixes(store, max_listings=1) == []


async def test_newest_checkpoint_prefix_is_the_run_with_the_newest_id() -> None:
    store = ObstoreStore(MemoryStore())
    assert await newest_checkpoint_prefix(store, "demo/") is None
    await save(checkpointer(store, "demo/b/"))
    await save(checkpointer(store, "demo/a/"))  # named first, saved last
    assert await newest_checkpoint_prefix(store, "demo/") == "demo/a/"


async def test_load_manifests_reports_damage_in_place() -> None:
    store = ObstoreStore(MemoryStore())
    ckpt = checkpointer(store)
    good, damaged = await save(ckpt, 0), await save(ckpt, 1)
    await store.put(ckpt.paths.manifest(damaged), b"{not json")
    gone = CheckpointId.now()
    got = await ckpt.load_manifests([damaged, gone, good])
    assert isinstance(got[0], IntegrityError)
    assert isinstance(got[1], CheckpointNotFoundError)
    assert isinstance(got[2], CheckpointManifest) and got[2].checkpoint_id == good


def test_the_blocking_facade_finds_them_too(tmp_path: Path) -> None:
    ckpt = SyncCheckpointer(tmp_path.as_uri(), retry=FAST_RETRY)
    cid = ckpt.save(CheckpointData(epoch=0, snapshots={("op", 0): b"state"})).checkpoint_id
    assert ckpt.list_checkpoint_dirs() == [cid]
    [manifest] = ckpt.load_manifests([cid])
    assert isinstance(manifest, CheckpointManifest) and manifest.checkpoint_id == cid
    ckpt.close()


async def test_read_stored_returns_the_bytes_as_stored() -> None:
    store = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(store, compression="zstd")
    state = b"state " * 10_000
    manifest = await ckpt.save(CheckpointData(epoch=0, snapshots={("op", 0): state}))
    [(_, entry)] = list(manifest.partition_entries())
    path = ckpt.paths.resolve(manifest.checkpoint_id, entry.path)
    stored = bytes(await read_stored(ckpt.store, path, entry))
    assert stored == bytes((await store.get(path)).data)
    assert entry.stored_size_bytes is not None
    assert len(stored) == entry.stored_size_bytes < len(state)


async def test_in_use_error_names_the_callers_override() -> None:
    default = CheckpointInUseError("a", ["b", "c"])
    assert str(default).endswith("or pass force=True") and "(b and 1 more)" in str(default)
    assert str(CheckpointInUseError("a", ["b"], override="pass --force")).endswith(
        "or pass --force"
    )


class _RuleInTheLibrary(ObjectStoreCheckpointer):
    """A checkpointer whose deletion refuses while nothing was found before: the
    command must let delete_checkpoint decide, not judge the dependents itself."""

    async def dependents(self, checkpoint_id: CheckpointId | str) -> list[CheckpointId]:
        raise AssertionError("a plain delete asks delete_checkpoint, not dependents")

    async def delete_checkpoint(
        self, checkpoint_id: CheckpointId | str, *, force: bool = False
    ) -> None:
        if not force:
            raise CheckpointInUseError(str(checkpoint_id), ["a-dependent"])
        await super().delete_checkpoint(checkpoint_id, force=force)


async def test_cli_delete_applies_the_librarys_rule() -> None:
    store = ObstoreStore(MemoryStore())
    cid = await save(checkpointer(store))
    ckpt = _RuleInTheLibrary(store, retry=FAST_RETRY)
    with pytest.raises(CliError) as refused:
        await delete(ckpt, cid, False, "memory", dry_run=False)
    assert refused.value.code == 2 and refused.value.message.endswith("or pass --force")
    assert await ckpt.exists(cid)
