"""``cairn verify``: load checkpoints the way a restore would, and check every byte.

Each checkpoint is loaded with :meth:`ObjectStoreCheckpointer.load`, which checks the
manifest's own checksum and the SHA-256 of every artifact of every partition's restore
chain (including artifacts held by the parent checkpoints it builds on); then every file
of its directory partitions is streamed and checked against its SHA-256 (carried files
included). Checkpoints are verified one after the other, so memory holds one checkpoint
at a time.

Each result also says whether the checkpoint is signed (:mod:`cairn.signing`), by
which key, and, when the command has keys (``$CAIRN_SIGNING_KEY``), whether the
signature verifies: with keys, a checkpoint not signed by one of them fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from cairn import (
    CheckpointId,
    CheckpointManifest,
    CheckpointNotFoundError,
    CodecError,
    CorruptManifestError,
    IntegrityError,
    LoadedCheckpoint,
    ObjectStoreCheckpointer,
    SignatureError,
)
from cairn.cli.errors import describe
from cairn.cli.progress import Transfer, chain_bytes
from cairn.discover import checkpoint_counts
from cairn.signing import ManifestSignature, read_signature

__all__ = ["SIGNATURE_STATES", "Verified", "signature_of", "signature_state", "verify"]

SIGNATURE_STATES = ("verified", "invalid", "unsigned", "unchecked")
"""What a checkpoint's signature is: ``verified`` (by one of the command's keys),
``invalid`` (the command has keys and it is not signed by one of them: another key, or
a signature that does not verify), ``unsigned`` (it carries none), ``unchecked`` (it is
signed, and the command has no key to check it with)."""


async def signature_of(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId
) -> ManifestSignature | None:
    """The signature ``cid``'s manifest carries, unverified; None if none (or no manifest)."""
    try:
        blob = await ckpt.store.get(ckpt.paths.manifest(cid))
    except CheckpointNotFoundError:
        return None
    return read_signature(blob.data)


def signature_state(
    ckpt: ObjectStoreCheckpointer, signature: ManifestSignature | None, verified: bool
) -> str:
    """One of :data:`SIGNATURE_STATES`; ``verified``: the checkpointer accepted its manifest."""
    if ckpt.signing_keys is None:
        return "unsigned" if signature is None else "unchecked"
    if verified:
        return "verified"
    return "unsigned" if signature is None else "invalid"


@dataclass(frozen=True)
class Verified:
    """The outcome for one checkpoint: ``error`` is None when every digest matched.

    ``epoch``, ``artifacts`` and ``size_bytes`` are what its manifest says
    (:func:`cairn.discover.checkpoint_counts`, as ``cairn list`` shows them), for a
    damaged checkpoint too; ``epoch`` is None (and the counts 0) only when its manifest
    does not read.
    """

    checkpoint_id: CheckpointId
    epoch: int | None
    artifacts: int
    size_bytes: int
    error: str | None
    signature: str | None = None
    key_id: str | None = None

    @property
    def ok(self) -> bool:
        """True when the checkpoint loaded and verified."""
        return self.error is None


async def verify_one(
    ckpt: ObjectStoreCheckpointer,
    cid: CheckpointId,
    progress: Callable[[int], None] | None = None,
) -> Verified:
    """Load ``cid`` with every digest checked; integrity failures are returned, not raised.

    Store failures (:class:`cairn.StoreError`) are raised: they say nothing about the
    checkpoint. ``signature`` is one of :data:`SIGNATURE_STATES`, or None when its
    manifest could not be read.
    """
    signature = await signature_of(ckpt, cid)
    key_id = signature.key_id if signature is not None else None
    try:
        loaded = await ckpt.load(cid, verify=True, progress=progress)
    except (IntegrityError, CodecError, CheckpointNotFoundError) as exc:
        own = getattr(exc, "path", None) == ckpt.paths.manifest(cid)
        state: str | None
        if isinstance(exc, SignatureError) and own:
            state = signature_state(ckpt, signature, verified=False)
        elif isinstance(exc, CorruptManifestError | CheckpointNotFoundError) and own:
            state = None  # its manifest does not read: nothing to say of its signature
        else:  # its own manifest was accepted; an artifact or a parent failed
            state = signature_state(ckpt, signature, verified=True)
            manifest = await _manifest_or_none(ckpt, cid)
            if manifest is not None:
                counts = checkpoint_counts(manifest)
                return Verified(
                    cid,
                    manifest.epoch,
                    counts.artifacts,
                    counts.size_bytes,
                    describe(exc),
                    state,
                    key_id,
                )
        return Verified(cid, None, 0, 0, describe(exc), state, key_id)
    state = signature_state(ckpt, signature, verified=True)
    damaged = await first_damaged_file(ckpt, loaded, progress)
    counts = checkpoint_counts(loaded.manifest)
    return Verified(cid, loaded.epoch, counts.artifacts, counts.size_bytes, damaged, state, key_id)


async def first_damaged_file(
    ckpt: ObjectStoreCheckpointer,
    loaded: LoadedCheckpoint,
    progress: Callable[[int], None] | None = None,
) -> str | None:
    """Read every file of ``loaded``'s directory partitions (which ``load`` lists without
    reading), streamed in bounded memory and checked against its SHA-256; the first
    failure, described with the file it hit, or None when all match."""
    with open(os.devnull, "wb") as discard:  # noqa: ASYNC230 (the null device never blocks)
        for (operator, partition), files in loaded.directories.items():
            for file in files:
                path = ckpt.paths.resolve(file.owner or loaded.checkpoint_id, file.path)
                try:
                    await ckpt.load_artifact_to(
                        path, discard, expected_sha256=file.sha256, progress=progress
                    )
                except (IntegrityError, CodecError, CheckpointNotFoundError) as exc:
                    where = f"file {file.relative_path!r} of {operator}/{partition}"
                    return f"{where}: {describe(exc)}"
    return None


async def _manifest_or_none(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId
) -> CheckpointManifest | None:
    """``cid``'s manifest, or None if it does not load either."""
    try:
        return await ckpt.load_manifest(cid)
    except (IntegrityError, CodecError, CheckpointNotFoundError):
        return None


async def verify(
    ckpt: ObjectStoreCheckpointer, ids: list[CheckpointId], progress: Transfer
) -> list[Verified]:
    """Verify each of ``ids`` in turn, advancing ``progress`` by the bytes of each
    artifact verified (its total: what the manifests list)."""
    progress.set_total(chain_bytes(await ckpt.load_manifests(ids)))
    results: list[Verified] = []
    for cid in ids:
        progress.describe(f"verifying {cid}")
        results.append(await verify_one(ckpt, cid, progress.advance))
    return results
