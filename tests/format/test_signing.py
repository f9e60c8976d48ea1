"""Signed checkpoints: a writer with a key signs every manifest, a reader with keys
refuses what someone without the key wrote (see ``cairn/format/signing.py``).

The threat: whoever can write the store can rewrite an artifact and its manifest
consistently, checksum recomputed with ``encode_manifest``; digests alone cannot tell.
Each forgery below is first shown to load for a reader without keys (the threat is
real), then refused with :class:`SignatureError` by one with keys.
"""

from __future__ import annotations

import hmac
import os
import pickle
from pathlib import Path

import msgspec
import pytest
from obstore.store import MemoryStore, ObjectStore
from support.backends import make_checkpointer
from support.forgery import SIGNATURE, forge, with_checksum
from support.policies import FAST_RETRY

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    HmacSigner,
    IntegrityError,
    InvalidInputError,
    ManifestSigner,
    ObjectStoreCheckpointer,
    OperatorSnapshotEntry,
    SignatureError,
    SourceOffsetEntry,
    SyncCheckpointer,
    commit_distributed,
    upload_partitions,
)
from cairn.format.manifest import CheckpointManifest, decode_manifest, encode_manifest
from cairn.format.signing import read_signature, signing_keys
from cairn.protocol._catalog import DAMAGE

KEY = bytes.fromhex("6b" * 32)
OLD_KEY = bytes.fromhex("a1" * 32)
OTHER_KEY = bytes.fromhex("c3" * 32)

SNAPSHOTS = {("agg", 0): b"agg state " * 20, ("join", 1): b"join state"}

TODAY = b"""\
{
  "version": 2,
  "checkpoint_id": "01900000-0000-7000-8000-000000000002",
  "epoch": 7,
  "timestamp_ms": 1718000000000,
  "operators": {
    "agg": {
      "partitions": [
        {
          "partition_id": 0,
          "is_delta": false,
          "path": "operators/agg/partition-0.snap",
          "size_bytes": 10,
          "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
          "owner": "01900000-0000-7000-8000-000000000001"
        },
        {
          "partition_id": 0,
          "is_delta": true,
          "path": "operators/agg/partition-0.delta",
          "size_bytes": 5,
          "sha256": "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
          "codec": "zstd",
          "stored_size_bytes": 14
        }
      ],
      "total_bytes": 15
    }
  },
  "source_offsets": {
    "events": {
      "source_type": "kafka",
      "offsets": {
        "events-0": "200"
      },
      "epoch": 7
    }
  },
  "parent_id": "01900000-0000-7000-8000-000000000001",
  "watermark": -3,
  "total_size_bytes": 15,
  "writer_generation": 2,
  "stats": {
    "duration_ms": 12,
    "upload_ms": 8,
    "commit_ms": 2,
    "uploaded_bytes": 14,
    "uploaded_artifacts": 1,
    "carried_bytes": 10,
    "carried_artifacts": 1,
    "retries": 1
  },
  "manifest_sha256": "713487ed54df6a5d3fc9803f7fc58c4e232ad657a7ae91c7c9723f1a3e7627cc"
}
"""
"""An unsigned manifest (every optional field set): the bytes a save without keys writes."""


def keyed(store: ObjectStore, key: object = KEY) -> ObjectStoreCheckpointer:
    return ObjectStoreCheckpointer(store, retry=FAST_RETRY, signing_key=key)  # type: ignore[arg-type]


def unkeyed(store: ObjectStore) -> ObjectStoreCheckpointer:
    return make_checkpointer(store)


# -- round trips, every backend ---------------------------------------------------------


async def test_signed_checkpoints_round_trip(raw_store: ObjectStore) -> None:
    """A keyed writer signs; a keyed reader loads (full and incremental); a reader
    without keys loads them too, ignoring the signature."""
    ckpt = keyed(raw_store)
    base = await ckpt.save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    child = await ckpt.save(
        CheckpointData(epoch=2, deltas={("agg", 0): b"delta"}, parent_id=base.checkpoint_id)
    )
    body = (await ckpt.store.get(ckpt.paths.manifest(child.checkpoint_id))).data
    signature = read_signature(body)
    assert signature is not None and signature.alg == "hmac-sha256"
    assert signature.key_id == HmacSigner(KEY).key_id and len(signature.value) == 64
    loaded = await ckpt.load(child.checkpoint_id)
    assert [bytes(link.data) for link in loaded.chains[("agg", 0)]] == [
        SNAPSHOTS[("agg", 0)],
        b"delta",
    ]
    latest = await keyed(raw_store).load_latest()
    assert latest is not None and latest.checkpoint_id == child.checkpoint_id
    assert await keyed(raw_store).latest_id() == child.checkpoint_id
    plain = await unkeyed(raw_store).load(base.checkpoint_id)
    assert bytes(plain.artifacts[("join", 1)]) == SNAPSHOTS[("join", 1)]


# -- forgeries ---------------------------------------------------------------------------


@pytest.mark.parametrize("keep_signature", [False, True], ids=["unsigned", "bad-signature"])
async def test_a_forged_checkpoint_is_refused_naming_its_manifest(keep_signature: bool) -> None:
    store = MemoryStore()
    ckpt = keyed(store)
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    cid = saved.checkpoint_id
    await forge(ckpt, cid, b"attacker's state", keep_signature=keep_signature)
    # Digests alone do not tell: a reader without keys loads the forgery, verified.
    forged = await unkeyed(store).load(cid)
    assert bytes(forged.artifacts[("agg", 0)]) == b"attacker's state"
    path = ckpt.paths.manifest(cid)
    reason = "does not verify" if keep_signature else "not signed"
    with pytest.raises(SignatureError, match=reason) as info:
        await ckpt.load(cid)
    assert info.value.path == path and path in str(info.value)
    assert isinstance(info.value, IntegrityError) and isinstance(info.value, DAMAGE)
    for call in (ckpt.load_manifest(cid), ckpt.load_chain(cid, "agg", 0)):
        with pytest.raises(SignatureError):
            await call


async def test_load_latest_falls_back_past_forgeries_to_the_older_signed_one() -> None:
    """The newest checkpoint rewritten, and a new forged one named by ``_latest``: a
    keyed ``load_latest`` (and ``latest_id``) passes over both."""
    store = MemoryStore()
    ckpt = keyed(store)
    older = await ckpt.save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    newest = await ckpt.save(CheckpointData(epoch=2, snapshots={("agg", 0): b"v2"}))
    await forge(ckpt, newest.checkpoint_id, b"evil", keep_signature=True)
    attacker = unkeyed(store)
    planted = await attacker.save(CheckpointData(epoch=99, snapshots={("agg", 0): b"evil"}))
    assert await attacker.read_latest() == planted.checkpoint_id
    found = await unkeyed(store).load_latest()
    assert found is not None and found.checkpoint_id == planted.checkpoint_id  # the threat
    loaded = await keyed(store).load_latest()
    assert loaded is not None and loaded.checkpoint_id == older.checkpoint_id
    assert bytes(loaded.artifacts[("agg", 0)]) == SNAPSHOTS[("agg", 0)]
    assert await keyed(store).latest_id() == older.checkpoint_id


async def test_a_keyed_reader_refuses_an_unsigned_checkpoint() -> None:
    store = MemoryStore()
    cid = (await unkeyed(store).save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))).checkpoint_id
    with pytest.raises(SignatureError, match="not signed") as info:
        await keyed(store).load(cid)
    assert info.value.path == CheckpointPaths().manifest(cid)
    assert await keyed(store).load_latest() is None
    assert await keyed(store).latest_id() is None
    assert (await unkeyed(store).load(cid)).checkpoint_id == cid


async def test_an_incremental_save_refuses_a_parent_not_signed_by_its_keys() -> None:
    """The chain a child carries comes from its parent's manifest: a keyed writer does
    not build on one it cannot trust, and commits nothing."""
    store = MemoryStore()
    parent = await unkeyed(store).save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    child = CheckpointData(epoch=2, deltas={("agg", 0): b"d"}, parent_id=parent.checkpoint_id)
    ckpt = keyed(store)
    with pytest.raises(SignatureError, match="not signed"):
        await ckpt.save(child)
    assert not await ckpt.exists(child.id)
    signed = await keyed(store).save(CheckpointData(epoch=3, snapshots=SNAPSHOTS))
    await forge(ckpt, signed.checkpoint_id, b"evil", keep_signature=True)
    grandchild = CheckpointData(epoch=4, deltas={("agg", 0): b"d"}, parent_id=signed.checkpoint_id)
    with pytest.raises(SignatureError, match="does not verify"):
        await ckpt.save(grandchild)
    assert not await ckpt.exists(grandchild.id)


async def test_any_changed_byte_of_a_signed_manifest_is_refused_even_with_its_checksum() -> None:
    ckpt = keyed(MemoryStore())
    manifest = await ckpt.save(
        CheckpointData(
            epoch=5,
            snapshots=SNAPSHOTS,
            source_offsets={"events": SourceOffsetEntry("kafka", {"p0": "17"}, 5)},
        )
    )
    keys = signing_keys(KEY)
    body = encode_manifest(manifest, keys)
    assert decode_manifest("m", body, keys) == manifest
    for old, new in [
        (b'"epoch": 5', b'"epoch": 6'),
        (b'"p0": "17"', b'"p0": "18"'),
        (b'"size_bytes": 10,', b'"size_bytes": 11,'),
        (b'"alg": "hmac-sha256"', b'"alg": "hmac-sha512"'),
    ]:
        assert old in body, old
        changed = with_checksum(body.replace(old, new, 1))
        decode_manifest("m", changed)  # valid for anyone without the key
        with pytest.raises(SignatureError, match="'m'"):
            decode_manifest("m", changed, keys)
    # The signature member where cairn does not write it: after the checksum, or a second
    # copy in an object whose unknown members the decoder skips.
    member = SIGNATURE.search(body)
    assert member is not None
    field = member.group(0)
    after = body.replace(field + b",", b"").replace(b'"\n}', b'",' + field + b"\n}")
    twice = body.replace(b'"agg": {', b'"agg": {' + field + b",", 1)
    for damaged in (with_checksum(after), with_checksum(twice)):
        assert decode_manifest("m", damaged) == manifest
        with pytest.raises(SignatureError, match="not one cairn writes"):
            decode_manifest("m", damaged, keys)


# -- keys ----------------------------------------------------------------------------------


async def test_rotation_the_new_key_signs_and_the_old_one_still_verifies() -> None:
    store = MemoryStore()
    before = await keyed(store, OLD_KEY).save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    rotated = keyed(store, [KEY, OLD_KEY])
    assert (await rotated.load(before.checkpoint_id)).checkpoint_id == before.checkpoint_id
    after = await rotated.save(CheckpointData(epoch=2, snapshots=SNAPSHOTS))
    body = (await rotated.store.get(rotated.paths.manifest(after.checkpoint_id))).data
    signature = read_signature(body)
    assert signature is not None and signature.key_id == HmacSigner(KEY).key_id
    assert (await keyed(store, KEY).load(after.checkpoint_id)).checkpoint_id == after.checkpoint_id
    with pytest.raises(SignatureError, match="not one of this reader's"):
        await keyed(store, KEY).load(before.checkpoint_id)  # the old key retired
    with pytest.raises(SignatureError, match=HmacSigner(KEY).key_id):
        await keyed(store, OLD_KEY).load(after.checkpoint_id)
    latest = await keyed(store, [OLD_KEY]).load_latest()
    assert latest is not None and latest.checkpoint_id == before.checkpoint_id


class NoncedSigner:
    """A signer of another algorithm whose signatures are randomised (like ECDSA's)."""

    alg = "test-nonced-hmac"
    key_id = "kms:test/key-1"

    def __init__(self, key: bytes) -> None:
        self._key = key

    def sign(self, data: bytes) -> bytes:
        nonce = os.urandom(16)
        return nonce + hmac.digest(self._key, nonce + data, "sha256")

    def verify(self, data: bytes, signature: bytes) -> bool:
        nonce, mac = signature[:16], signature[16:]
        return hmac.compare_digest(hmac.digest(self._key, nonce + data, "sha256"), mac)


async def test_a_signer_can_be_plugged_in_and_signs_the_same_bytes_the_same_way() -> None:
    signer = NoncedSigner(OTHER_KEY)
    assert isinstance(signer, ManifestSigner)
    store = MemoryStore()
    ckpt = keyed(store, signer)
    saved = await ckpt.save(CheckpointData(epoch=1, snapshots=SNAPSHOTS))
    assert (await keyed(store, [KEY, signer]).load(saved.checkpoint_id)).epoch == 1
    with pytest.raises(SignatureError):
        await keyed(store, KEY).load(saved.checkpoint_id)
    # A commit whose reply was lost is recognised by its bytes: they must not change.
    keys = signing_keys(signer)
    assert keys is not None
    assert encode_manifest(saved, keys) == encode_manifest(saved, keys)
    # Its own, and a repeated commit of the same manifest, is not a conflict.
    await ckpt.save_manifest(saved)


def test_keys_that_are_not_keys_are_refused() -> None:
    for bad, match in [
        ("6b" * 32, "not str"),
        (b"short", "at least 16 bytes"),
        ([], "empty"),
        ([KEY, KEY], "twice"),
        (42, "must be bytes"),
        ([KEY, 42], "must be bytes"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            ObjectStoreCheckpointer(MemoryStore(), signing_key=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=match):
            SyncCheckpointer(MemoryStore(), signing_key=bad)  # type: ignore[arg-type]
    assert "6b6b" not in repr(HmacSigner(KEY)) and "6b6b" not in repr(signing_keys(KEY))


def test_signature_errors_pickle_as_themselves() -> None:
    error = SignatureError("c/manifest.json", "it is not signed")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is SignatureError and vars(copy) == vars(error)
    assert str(copy) == "untrusted manifest at 'c/manifest.json': it is not signed"


# -- unsigned manifests are unchanged -------------------------------------------------------


def test_manifests_written_before_signatures_decode_and_encode_exactly_as_before() -> None:
    manifest = decode_manifest("old/manifest.json", TODAY)
    assert manifest.epoch == 7 and manifest.stats is not None and manifest.watermark == -3
    assert encode_manifest(manifest) == TODAY  # unsigned: byte for byte what cairn wrote
    assert read_signature(TODAY) is None
    with pytest.raises(SignatureError, match="not signed"):
        decode_manifest("old/manifest.json", TODAY, signing_keys(KEY))
    signed = encode_manifest(manifest, signing_keys(KEY))
    assert decode_manifest("new/manifest.json", signed) == manifest
    # Signed, it is the same one object with one member more, before the checksum.
    member = SIGNATURE.search(signed)
    assert member is not None
    assert signed.index(member.group(0)) < signed.index(b'"manifest_sha256"')
    assert with_checksum(signed.replace(member.group(0) + b",", b"")) == TODAY


# -- every writer signs ------------------------------------------------------------------


async def signed_by(ckpt: ObjectStoreCheckpointer, cid: CheckpointId) -> str | None:
    body = (await ckpt.store.get(ckpt.paths.manifest(cid))).data
    signature = read_signature(body)
    return None if signature is None else signature.key_id


async def test_commit_save_manifest_and_the_distributed_coordinator_sign() -> None:
    store = MemoryStore()
    ckpt = keyed(store)
    reader = keyed(store)

    cid = CheckpointId.now()
    report = await upload_partitions(ckpt, cid, [("agg", 0, False, b"x" * 10)], worker="w0")
    committed = await commit_distributed(ckpt, cid, 3, [("agg", 0)], [report])
    assert await signed_by(ckpt, cid) == HmacSigner(KEY).key_id
    assert (await reader.load(committed.checkpoint_id)).epoch == 3

    cid = CheckpointId.now()
    [(operator, entry)] = await ckpt.save_partitions_concurrent(cid, [("agg", 0, False, b"y")])
    manifest = msgspec.structs.replace(
        CheckpointManifest.new(cid, 4),
        operators={operator: OperatorSnapshotEntry.from_partitions([entry])},
        total_size_bytes=entry.size_bytes,
    )
    await ckpt.save_manifest(manifest)
    assert await signed_by(ckpt, cid) == HmacSigner(KEY).key_id
    assert (await reader.load(cid)).epoch == 4


def test_the_sync_checkpointer_signs_and_verifies(tmp_path: Path) -> None:
    sync = SyncCheckpointer(str(tmp_path), signing_key=KEY)
    saved = sync.save(CheckpointData(epoch=5, snapshots=SNAPSHOTS))
    with pytest.raises(SignatureError):
        SyncCheckpointer(str(tmp_path), signing_key=OTHER_KEY).load(saved.checkpoint_id)
    assert SyncCheckpointer(str(tmp_path), signing_key=KEY).load(saved.checkpoint_id).epoch == 5
