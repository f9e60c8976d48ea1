"""``cairn verify``: load checkpoints the way a restore would, and check every byte.

Each checkpoint is loaded with :meth:`ObjectStoreCheckpointer.load`, which checks the
manifest's own checksum and the SHA-256 of every artifact of every partition's restore
chain (including artifacts held by the parent checkpoints it builds on); then every file
of its directory partitions is streamed and checked against its SHA-256 (carried files
included). Checkpoints are verified one after the other, so memory holds one checkpoint
at a time.

Damage does not stop a checkpoint's check: every damaged partition is reported
(:class:`Damage`: its operator and partition, the DCP item or directory file when known,
the object, the failure), not only the first.

Each result also says whether the checkpoint is signed (:mod:`cairn.format.signing`), by
which key, and, when the command has keys (``$CAIRN_SIGNING_KEY``), whether the
signature verifies: with keys, a checkpoint not signed by one of them fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from cairn import (
    BrokenChainError,
    CheckpointId,
    CheckpointManifest,
    CheckpointNotFoundError,
    CodecError,
    CorruptManifestError,
    IntegrityError,
    NewerFormatError,
    ObjectStoreCheckpointer,
    SignatureError,
)
from cairn.cli.errors import describe, needs_newer_text
from cairn.cli.progress import Transfer, chain_bytes
from cairn.format.manifest import FileEntry
from cairn.format.signing import ManifestSignature, read_signature
from cairn.protocol.discover import checkpoint_counts

__all__ = [
    "SIGNATURE_STATES",
    "Damage",
    "Verified",
    "damaged_files",
    "signature_of",
    "signature_state",
    "verify",
    "verify_one",
]

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
class Damage:
    """One damaged partition of a checkpoint: ``operator`` and ``partition``; ``item``
    (a DCP item's FQN) or ``file`` (a directory partition's file, its relative path)
    when the damage is known to lie there; ``path``, the object whose bytes are wrong;
    ``error``, the failure in one line."""

    operator: str
    partition: int
    item: str | None
    file: str | None
    path: str | None
    error: str


@dataclass(frozen=True)
class Verified:
    """The outcome for one checkpoint: ``error`` is None when every digest matched.

    ``epoch``, ``artifacts`` and ``size_bytes`` are what its manifest says
    (:func:`cairn.protocol.discover.checkpoint_counts`, as ``cairn list`` shows them), for a
    damaged checkpoint too; ``epoch`` is None (and the counts 0) only when its manifest
    does not read. ``damaged`` lists every damaged partition found, in the manifest's
    order (artifacts, then directory files); ``error`` names each of them.
    """

    checkpoint_id: CheckpointId
    epoch: int | None
    artifacts: int
    size_bytes: int
    error: str | None
    signature: str | None = None
    key_id: str | None = None
    damaged: tuple[Damage, ...] = ()
    newer: bool = False
    """True when it was not verified because a newer cairn wrote it (``error`` says
    which features this cairn lacks): not damage."""

    @property
    def ok(self) -> bool:
        """True when the checkpoint loaded and verified."""
        return self.error is None

    @property
    def status(self) -> str:
        """``ok``, ``damaged``, or ``newer`` (it needs a newer cairn: not damage)."""
        if self.newer:
            return "newer"
        return "ok" if self.ok else "damaged"


async def verify_one(
    ckpt: ObjectStoreCheckpointer,
    cid: CheckpointId,
    progress: Callable[[int], None] | None = None,
) -> Verified:
    """Load ``cid`` with every digest checked; integrity failures are returned, not raised.

    Every damaged partition is reported, not only the first: the load reads and checks
    every artifact of every chain whatever it meets, and every file of the directory
    partitions is checked whenever the manifest reads. Store failures
    (:class:`cairn.StoreError`) are raised: they say nothing about the checkpoint.
    ``signature`` is one of :data:`SIGNATURE_STATES`, or None when its manifest could
    not be read.
    """
    signature = await signature_of(ckpt, cid)
    key_id = signature.key_id if signature is not None else None
    try:
        loaded = await ckpt.load(cid, verify=True, progress=progress)
    except NewerFormatError as exc:
        return Verified(cid, None, 0, 0, needs_newer_text(exc), None, key_id, newer=True)
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
                files = await damaged_files(ckpt, cid, _directories(manifest), progress)
                failures = [*_every_failure(exc), *files]
                return Verified(
                    cid,
                    manifest.epoch,
                    counts.artifacts,
                    counts.size_bytes,
                    _error_text(failures),
                    state,
                    key_id,
                    _damage(failures),
                )
        return Verified(cid, None, 0, 0, describe(exc), state, key_id, _damage([exc]))
    state = signature_state(ckpt, signature, verified=True)
    files = await damaged_files(ckpt, cid, loaded.directories, progress)
    counts = checkpoint_counts(loaded.manifest)
    error = _error_text(files) if files else None
    return Verified(
        cid, loaded.epoch, counts.artifacts, counts.size_bytes, error, state, key_id, _damage(files)
    )


async def damaged_files(
    ckpt: ObjectStoreCheckpointer,
    cid: CheckpointId,
    directories: Mapping[tuple[str, int], Sequence[FileEntry]],
    progress: Callable[[int], None] | None = None,
) -> list[IntegrityError]:
    """Read every file of ``cid``'s directory partitions (``directories``: which files
    each holds), streamed in bounded memory and checked against its SHA-256; the
    failure of each file that does not match, naming its partition and file, in order."""
    failures: list[IntegrityError] = []
    with open(os.devnull, "wb") as discard:  # noqa: ASYNC230 (the null device never blocks)
        for (operator, partition), files in directories.items():
            for file in files:
                path = ckpt.paths.resolve(file.owner or cid, file.path)
                try:
                    await ckpt.load_artifact_to(
                        path, discard, expected_sha256=file.sha256, progress=progress
                    )
                except CheckpointNotFoundError:
                    gone = BrokenChainError(path, f"file of checkpoint {file.owner or cid} is gone")
                    failures.append(gone.located(operator, partition, file=file.relative_path))
                except IntegrityError as exc:
                    failures.append(exc.located(operator, partition, file=file.relative_path))
    return failures


def _directories(manifest: CheckpointManifest) -> dict[tuple[str, int], list[FileEntry]]:
    """The files of each directory partition of ``manifest``."""
    return {(d.operator, d.partition_id): list(d.files) for d in manifest.directories}


def _every_failure(
    exc: IntegrityError | CodecError | CheckpointNotFoundError,
) -> list[IntegrityError | CodecError | CheckpointNotFoundError]:
    """``exc`` and the failures of the other damaged partitions the same load found."""
    others = exc.others if isinstance(exc, IntegrityError) else ()
    return [exc, *others]


DESCRIBED_IN_FULL = 10
"""A checkpoint's first damaged partitions described in full in its ``error``; any
after them are named only (every one is in full in ``damaged``)."""


def _error_text(failures: Sequence[BaseException]) -> str:
    """The failures in one line: the first :data:`DESCRIBED_IN_FULL` described, the
    partitions of the rest named."""
    text = "; ".join(describe(failure) for failure in failures[:DESCRIBED_IN_FULL])
    rest = [_location(failure) for failure in failures[DESCRIBED_IN_FULL:]]
    if rest:
        text += f"; and {len(rest)} more damaged: " + "; ".join(rest)
    return text


def _location(failure: BaseException) -> str:
    """The partition ``failure`` names, or its description when it names none."""
    if isinstance(failure, IntegrityError) and failure.location:
        return failure.location
    return describe(failure)


def _damage(failures: Iterable[BaseException]) -> tuple[Damage, ...]:
    """The damaged partitions ``failures`` name (a failure that names none is left out)."""
    return tuple(
        Damage(
            failure.operator,
            failure.partition,
            failure.item,
            failure.file,
            getattr(failure, "path", None),
            describe(failure),
        )
        for failure in failures
        if isinstance(failure, IntegrityError)
        and failure.operator is not None
        and failure.partition is not None
    )


async def _manifest_or_none(
    ckpt: ObjectStoreCheckpointer, cid: CheckpointId
) -> CheckpointManifest | None:
    """``cid``'s manifest, or None if it does not load either."""
    try:
        return await ckpt.load_manifest(cid)
    except (IntegrityError, CodecError, CheckpointNotFoundError, NewerFormatError):
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
