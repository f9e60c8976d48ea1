"""The public names are a contract: this pins them."""

from __future__ import annotations

import cairn
from cairn import errors

EXPECTED = {
    "ArtifactKey",
    "BrokenChainError",
    "CheckpointAbortedError",
    "ChainLink",
    "CheckpointData",
    "CheckpointExistsError",
    "CheckpointId",
    "CheckpointManifest",
    "CheckpointManifestV2",
    "CheckpointNotFoundError",
    "CheckpointPaths",
    "Checkpointer",
    "CheckpointerError",
    "CodecError",
    "CorruptManifestError",
    "FencedError",
    "GcResult",
    "RetentionPolicy",
    "IncompleteCheckpointError",
    "IntegrityError",
    "IntegrityMismatchError",
    "InvalidCheckpointDataError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidStoreUrlError",
    "LoadedCheckpoint",
    "ObjectExistsError",
    "ObjectStoreCheckpointer",
    "OperatorSnapshotEntry",
    "PartitionSnapshotEntry",
    "PartitionUpload",
    "PreconditionFailedError",
    "RetryPolicy",
    "SourceOffsetEntry",
    "Store",
    "StoreError",
    "SyncCheckpointer",
    "SyncInAsyncContextError",
    "TransientStoreError",
    "UnsupportedManifestVersionError",
    "WorkerReport",
    "__version__",
    "commit_distributed",
    "upload_partitions",
    "open_store",
    "sha256_hex",
    "verify_integrity",
}


def test_all_is_pinned() -> None:
    assert set(cairn.__all__) == EXPECTED
    for name in cairn.__all__:
        assert hasattr(cairn, name), name


def test_every_error_has_one_root() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), cairn.CheckpointerError), name
    assert issubclass(cairn.CheckpointNotFoundError, FileNotFoundError)
    assert issubclass(cairn.InvalidNameError, ValueError)


def test_every_public_thing_has_a_docstring() -> None:
    for name in cairn.__all__:
        obj = getattr(cairn, name)
        if (callable(obj) and not name[0].islower()) or name in ("open_store", "verify_integrity"):
            assert (obj.__doc__ or "").strip(), name
