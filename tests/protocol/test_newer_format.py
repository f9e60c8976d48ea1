"""Checkpoints a newer cairn wrote: readers say so and touch nothing.

A manifest whose ``requires`` names a format feature this cairn does not know is not
damage: the search for the latest stops there (unless told to pass over it), loading it
says it needs a newer cairn, and no deletion (GC, ``delete_checkpoint``) deletes or
claims anything while one is in the store, since what it names cannot be known.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re

import pytest
from obstore.store import MemoryStore
from support.backends import make_checkpointer
from support.newer import FEATURE, NEWER_VERSION, contents, newer_cairn

import cairn.format.manifest as manifest_module
from cairn import (
    CheckpointData,
    NewerFormatError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
)
from cairn.format.manifest import CheckpointManifest

NOW = dt.timedelta(0)


async def save(ckpt: ObjectStoreCheckpointer, epoch: int, **fields: object) -> CheckpointManifest:
    data = CheckpointData(epoch=epoch, snapshots={("op", 0): b"state %d" % epoch}, **fields)  # type: ignore[arg-type]
    return await ckpt.save(data)


async def older_then_newer(
    ckpt: ObjectStoreCheckpointer,
) -> tuple[CheckpointManifest, CheckpointManifest]:
    """An epoch today's cairn wrote, then one a newer cairn wrote on it."""
    older = await save(ckpt, 1)
    with newer_cairn():
        newer = await save(ckpt, 2, parent_id=older.checkpoint_id)
    return older, newer


def assert_names(error: NewerFormatError, manifest: CheckpointManifest) -> None:
    assert error.checkpoint_id == str(manifest.checkpoint_id)
    assert error.features == (FEATURE,)
    assert error.written_by == NEWER_VERSION
    assert error.path.endswith(f"{manifest.checkpoint_id}/manifest.json")


# -- the search for the latest --------------------------------------------------------------


async def test_load_latest_stops_at_a_checkpoint_a_newer_cairn_wrote(
    ckpt: ObjectStoreCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    older, newer = await older_then_newer(ckpt)
    with pytest.raises(NewerFormatError) as raised:
        await ckpt.load_latest()
    assert_names(raised.value, newer)
    with pytest.raises(NewerFormatError):
        await ckpt.latest_id()

    with caplog.at_level(logging.WARNING, logger="cairn"):
        loaded = await ckpt.load_latest(skip_newer_format=True)
    assert loaded is not None and loaded.manifest.checkpoint_id == older.checkpoint_id
    assert bytes(loaded.artifacts[("op", 0)]) == b"state 1"
    passed = [r.getMessage() for r in caplog.records if "passing over" in r.getMessage()]
    assert len(passed) == 1 and str(newer.checkpoint_id) in passed[0]
    assert await ckpt.latest_id(skip_newer_format=True) == older.checkpoint_id


async def test_a_newer_checkpoint_older_than_one_that_loads_does_not_matter() -> None:
    ckpt = make_checkpointer(MemoryStore())
    with newer_cairn():
        await save(ckpt, 1)
    newest = await save(ckpt, 2)
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.manifest.checkpoint_id == newest.checkpoint_id
    assert await ckpt.latest_id() == newest.checkpoint_id


async def test_without_the_pointer_a_newer_checkpoint_still_ranks_first() -> None:
    ckpt = make_checkpointer(MemoryStore())
    _, newer = await older_then_newer(ckpt)
    await ckpt.store.delete([ckpt.paths.latest_pointer()])
    with pytest.raises(NewerFormatError) as raised:
        await ckpt.load_latest()
    assert_names(raised.value, newer)


def with_epoch(body: bytes, epoch: bytes) -> bytes:
    """``body`` with its epoch member holding ``epoch``, its checksum made right again:
    what a newer cairn that changed the member's type would write."""
    changed = re.sub(rb'"epoch": \d+', b'"epoch": ' + epoch, body, count=1)
    zeroed = re.sub(
        rb'"manifest_sha256": "[0-9a-f]{64}"', b'"manifest_sha256": "' + b"0" * 64 + b'"', changed
    )
    digest = hashlib.sha256(zeroed).hexdigest().encode()
    return zeroed.replace(b"0" * 64, digest)


async def test_a_newer_header_this_cairn_cannot_rank_ranks_first() -> None:
    """Its epoch is not a number this cairn reads: it is still where the search stops."""
    ckpt = make_checkpointer(MemoryStore())
    _, newer = await older_then_newer(ckpt)
    path = ckpt.paths.manifest(newer.checkpoint_id)
    body = with_epoch(bytes((await ckpt.store.get(path)).data), b'{"major": 2}')
    await ckpt.store.delete([path])
    await ckpt.store.put(path, body)
    await ckpt.store.delete([ckpt.paths.latest_pointer()])
    with pytest.raises(NewerFormatError) as raised:
        await ckpt.load_latest()
    assert raised.value.checkpoint_id == str(newer.checkpoint_id)
    # Damage is not taken for a newer format: the same bytes with a wrong checksum are
    # passed over, and the older checkpoint loads.
    await ckpt.store.delete([path])
    await ckpt.store.put(path, body.replace(b'"major": 2', b'"major": 3'))
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.manifest.epoch == 1


# -- reading one checkpoint ----------------------------------------------------------------


async def test_reading_a_newer_checkpoint_by_id_says_it_needs_a_newer_cairn() -> None:
    ckpt = make_checkpointer(MemoryStore())
    _, newer = await older_then_newer(ckpt)
    cid = newer.checkpoint_id
    for read in (ckpt.load, ckpt.load_manifest):
        with pytest.raises(NewerFormatError) as raised:
            await read(cid)
        assert_names(raised.value, newer)
    with pytest.raises(NewerFormatError):
        await ckpt.load_chain(cid, "op", 0)
    assert await ckpt.exists(cid)  # committed: a newer cairn loads it
    [answer] = await ckpt.load_manifests([cid])
    assert isinstance(answer, NewerFormatError)


# -- deleting ------------------------------------------------------------------------------


async def test_gc_meets_a_manifest_requiring_an_unknown_feature_and_deletes_nothing(
    ckpt: ObjectStoreCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    """Today's GC, which would delete the older checkpoints, deletes and claims nothing:
    the newer manifest may name any of their objects."""
    first = await save(ckpt, 1)
    with newer_cairn():
        newer = await save(ckpt, 2, parent_id=first.checkpoint_id)
    await save(ckpt, 3)
    await save(ckpt, 4)
    before = await contents(ckpt.store)
    for dry_run in (True, False):
        with caplog.at_level(logging.WARNING, logger="cairn.gc"):
            result = await ckpt.gc(RetentionPolicy(keep_last=1), dry_run=dry_run, min_age=NOW)
        assert await contents(ckpt.store) == before
        assert result.deleted == [] and result.objects_deleted == 0
        assert result.orphans_deleted == [] and result.bytes_reclaimed == 0
        assert list(result.newer_format) == [newer.checkpoint_id]
        assert "needs a newer cairn" in result.newer_format[newer.checkpoint_id]
        assert any("needs a newer cairn: nothing deleted" in r.getMessage() for r in caplog.records)


async def test_gc_meets_a_part_requiring_an_unknown_feature_and_deletes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(manifest_module, "PART_ENTRIES", 8)
    monkeypatch.setattr(manifest_module, "INLINE_BELOW", 2)
    ckpt = make_checkpointer(MemoryStore())
    await save(ckpt, 1)
    with newer_cairn(in_parts=True):
        big = await ckpt.save(
            CheckpointData(epoch=2, snapshots={("wide", p): b"%d" % p for p in range(20)})
        )
    assert big.parts
    await save(ckpt, 3)
    await save(ckpt, 4)
    before = await contents(ckpt.store)
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert await contents(ckpt.store) == before
    assert result.deleted == [] and list(result.newer_format) == [big.checkpoint_id]
    assert "parts/" in result.newer_format[big.checkpoint_id]


async def test_gc_that_does_not_meet_one_still_collects() -> None:
    """The same store once the newer checkpoint is gone: GC collects as before."""
    ckpt = make_checkpointer(MemoryStore())
    await older_then_newer(ckpt)
    await save(ckpt, 3)
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert result.deleted == []
    for info in await ckpt.store.list(""):
        if info.path.endswith("manifest.json") and b"teleport" in bytes(
            (await ckpt.store.get(info.path)).data
        ):
            await ckpt.store.delete([info.path])
    result = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=NOW)
    assert len(result.deleted) == 1 and result.newer_format == {}


async def test_retention_after_commit_deletes_nothing_past_a_newer_checkpoint() -> None:
    store = MemoryStore()
    writer = make_checkpointer(store)
    await older_then_newer(writer)
    before = await contents(writer.store)
    async with ObjectStoreCheckpointer(store, retention=RetentionPolicy(keep_last=1)) as ckpt:
        saved = await save(ckpt, 3)
    after = await contents(writer.store)
    for path, body in before.items():
        if path != writer.paths.latest_pointer():
            assert after[path] == body, path
    assert ckpt.background_gc.last_error is None
    assert any(str(saved.checkpoint_id) in p for p in after)


async def test_delete_checkpoint_refuses_a_newer_checkpoint_even_forced(
    ckpt: ObjectStoreCheckpointer,
) -> None:
    older, newer = await older_then_newer(ckpt)
    await save(ckpt, 3)
    before = await contents(ckpt.store)
    for cid in (newer.checkpoint_id, older.checkpoint_id):
        for force in (False, True):
            with pytest.raises(NewerFormatError) as raised:
                await ckpt.delete_checkpoint(cid, force=force)
            assert_names(raised.value, newer)
            assert await contents(ckpt.store) == before
