"""Forged manifests, written as anyone who can write the store could write them.

:func:`with_checksum` recomputes a manifest's ``manifest_sha256`` (no key needed);
:func:`forge` rewrites an artifact and its manifest consistently, optionally splicing the
original signature back in, so only a signature check can tell.
"""

from __future__ import annotations

import hashlib
import re

import msgspec

from cairn import CheckpointId, ObjectStoreCheckpointer
from cairn.format.manifest import decode_manifest, encode_manifest

CHECKSUM = re.compile(rb'"manifest_sha256": "[0-9a-f]{64}"')
"""A manifest's checksum member."""
ZEROED = b'"manifest_sha256": "' + b"0" * 64 + b'"'
"""The checksum member as the checksum is computed over it."""
SIGNATURE = re.compile(rb'\n  "signature": \{[^}]*\}')
"""A manifest's signature member, with the newline before it."""


def with_checksum(body: bytes) -> bytes:
    """``body`` with its manifest_sha256 recomputed, as anyone can (no key needed)."""
    zeroed = CHECKSUM.sub(ZEROED, body)
    digest = hashlib.sha256(zeroed).hexdigest().encode()
    return zeroed.replace(ZEROED, b'"manifest_sha256": "' + digest + b'"')


async def forge(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId, payload: bytes, *, keep_signature: bool
) -> None:
    """Rewrite ``("agg", 0)`` of ``cid`` and its manifest consistently, without the key.

    The artifact gets ``payload`` (an artifact in a pack becomes an object of its own, at
    its partition's path); the manifest, its new size and digest and a checksum
    recomputed by ``encode_manifest``. With ``keep_signature`` the original signature
    member is spliced back in (checksum recomputed again), so the manifest is signed,
    by the right key id, over other bytes.
    """
    path = ckpt.paths.manifest(cid)
    original = bytes((await ckpt.store.get(path)).data)
    manifest = decode_manifest(path, original)
    agg = manifest.operators["agg"]
    [entry] = [p for p in agg.partitions if p.partition_id == 0]
    forged_entry = msgspec.structs.replace(
        entry,
        path=entry.path if entry.offset is None else ckpt.paths.relative_artifact("agg", 0, False),
        offset=None,
        size_bytes=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )
    partitions = tuple(forged_entry if p is entry else p for p in agg.partitions)
    operators = {**manifest.operators, "agg": msgspec.structs.replace(agg, partitions=partitions)}
    body = encode_manifest(msgspec.structs.replace(manifest, operators=operators))
    if keep_signature:
        match = SIGNATURE.search(original)
        assert match is not None
        at = body.index(b'\n  "manifest_sha256"')
        body = with_checksum(body[:at] + match.group(0) + b"," + body[at:])
    await ckpt.store.put(ckpt.paths.resolve(cid, forged_entry.path), payload)
    await ckpt.store.put(path, body)
