"""Checkpoint ids a user can paste: the full text, or a unique short prefix, everywhere."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from obstore.store import MemoryStore

from cairn import (
    AmbiguousCheckpointIdError,
    CheckpointData,
    CheckpointId,
    CheckpointNotFoundError,
    InvalidInputError,
    ObjectStoreCheckpointer,
    SyncCheckpointer,
)
from cairn.protocol.discover import is_short_id, matching_ids, short_ids
from cairn.stores import ObstoreStore


def test_a_checkpoint_id_is_made_from_its_text_or_its_uuid() -> None:
    cid = CheckpointId.now()
    assert CheckpointId(str(cid)) == cid == CheckpointId(cid.uuid)
    assert CheckpointId(str(cid).upper()) == cid
    with pytest.raises(InvalidInputError, match="36-char"):
        CheckpointId(str(cid)[:8])
    with pytest.raises(InvalidInputError, match="UUIDv7"):
        CheckpointId(str(uuid.uuid4()))
    with pytest.raises(InvalidInputError, match="uuid.UUID or its 36-character text"):
        CheckpointId(7)  # type: ignore[arg-type]


def test_short_ids_are_prefixes_of_the_hyphenated_form() -> None:
    cid = str(CheckpointId.now())
    assert is_short_id(cid[:8]) and is_short_id(cid[:13]) and is_short_id(cid[:9].upper())
    assert not is_short_id(cid[:7]) and not is_short_id(cid)
    assert not is_short_id("latest!!") and not is_short_id(cid[:8] + "x")
    assert not is_short_id(cid[:8] + cid[9:13])  # the hyphen belongs where the form has it


def test_short_ids_are_unique_among_the_ids_given_like_git() -> None:
    a = CheckpointId(uuid.UUID("01a230b8-7c1f-7000-8000-000000000001"))
    b = CheckpointId(uuid.UUID("01a230b8-7c1f-7000-8000-000000000002"))
    c = CheckpointId(uuid.UUID("01a230b8-7d00-7000-8000-000000000000"))
    d = CheckpointId(uuid.UUID("01b00000-0000-7000-8000-000000000000"))
    short = short_ids([a, b, c, d])
    assert short[d] == "01b00000"
    assert short[c] == "01a230b8-7d" and not short[c].endswith("-")
    assert short[a] == str(a) and short[b] == str(b)  # they differ only in the last digit
    for cid, text in short.items():
        assert matching_ids(text, [a, b, c, d]) == [cid]
    assert short_ids([a]) == {a: "01a230b8"}


async def _two_saves() -> tuple[ObjectStoreCheckpointer, list[CheckpointId]]:
    ckpt = ObjectStoreCheckpointer(ObstoreStore(MemoryStore()))
    ids = []
    for epoch in (1, 2):
        data = CheckpointData(epoch=epoch, snapshots={("op", 0): b"s%d" % epoch})
        ids.append((await ckpt.save(data)).checkpoint_id)
    return ckpt, ids


async def test_every_id_parameter_takes_the_text_or_a_unique_prefix() -> None:
    ckpt, (first, second) = await _two_saves()
    full, short = str(second), short_ids([first, second])[second]
    assert len(short) >= 8
    assert (await ckpt.load(full)).manifest.checkpoint_id == second
    assert (await ckpt.load(short)).manifest.checkpoint_id == second
    assert (await ckpt.load_manifest(short)).epoch == 2
    assert [link.owner for link in await ckpt.load_chain(short, "op", 0)] == [second]
    assert await ckpt.exists(short) and await ckpt.exists(full)
    assert await ckpt.dependents(short) == []
    [got] = await ckpt.load_manifests([short])
    assert not isinstance(got, Exception) and got.checkpoint_id == second
    assert await ckpt.update_latest(short_ids([first, second])[first], force=True)
    assert await ckpt.read_latest() == first
    await ckpt.delete_checkpoint(short)
    assert await ckpt.list_checkpoints() == [first]


async def test_an_ambiguous_prefix_names_its_candidates_and_a_missing_one_its_text() -> None:
    ckpt, (first, second) = await _two_saves()
    common = str(first)[:8]
    assert str(second).startswith(common)  # made within a minute: the first group agrees
    with pytest.raises(AmbiguousCheckpointIdError) as caught:
        await ckpt.load(common)
    assert caught.value.prefix == common
    assert caught.value.candidates == [str(first), str(second)]
    assert common in str(caught.value) and str(first) in str(caught.value)
    assert isinstance(caught.value, InvalidInputError)
    with pytest.raises(AmbiguousCheckpointIdError):
        await ckpt.exists(common)
    missing = "ffffffff-ff"
    with pytest.raises(CheckpointNotFoundError, match=missing):
        await ckpt.load(missing)
    assert not await ckpt.exists(missing)
    with pytest.raises(InvalidInputError, match="at least the first 8"):
        await ckpt.load("01a2")


async def test_a_prefix_names_only_committed_checkpoints() -> None:
    ckpt, (first, second) = await _two_saves()
    pending = CheckpointId.now()
    await ckpt.save_snapshot(str(pending), "op", 0, b"pending")  # a directory, no manifest
    text = short_ids([first, second, pending])[second]
    assert (await ckpt.load_manifest(text)).checkpoint_id == second


def test_the_blocking_facade_takes_them_too(tmp_path: Path) -> None:
    ckpt = SyncCheckpointer(tmp_path.as_uri())
    saved = ckpt.save(CheckpointData(epoch=3, snapshots={("op", 0): b"x"})).checkpoint_id
    assert ckpt.load(str(saved)[:13]).manifest.epoch == 3
    assert ckpt.exists(str(saved))
