"""The public names are a contract: this pins them."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

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
    "CheckpointNotFoundError",
    "CheckpointPaths",
    "Checkpointer",
    "CheckpointerError",
    "CodecError",
    "CorruptManifestError",
    "FencedError",
    "GcResult",
    "HmacSigner",
    "ManifestSigner",
    "SignatureError",
    "SpecialFileError",
    "RetentionPolicy",
    "IncompleteCheckpointError",
    "IntegrityError",
    "IntegrityMismatchError",
    "InvalidCheckpointDataError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidStoreUrlError",
    "MissingArtifactError",
    "NewerFormatError",
    "NotDurableError",
    "ObjectNotFoundError",
    "LoadedCheckpoint",
    "ObjectExistsError",
    "ObjectStoreCheckpointer",
    "OperatorSnapshotEntry",
    "OversizedArtifactError",
    "PathsUnresolvedError",
    "PartitionSnapshotEntry",
    "PartitionUpload",
    "PreconditionFailedError",
    "RetryPolicy",
    "SourceOffsetEntry",
    "Store",
    "StoreCredentialsError",
    "StoreError",
    "StoreNotFoundError",
    "SyncCheckpointer",
    "SyncInAsyncContextError",
    "TransientStoreError",
    "UndecodableArtifactError",
    "UnsupportedManifestVersionError",
    "WorkerReport",
    "__version__",
    "AmbiguousCheckpointIdError",
    "ArtifactExistsError",
    "CheckpointInUseError",
    "CheckpointLocationError",
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


COPY = {
    "DELETED_NOTE",
    "Copied",
    "CopyProgress",
    "copy_checkpoints",
    "directory_bytes",
    "stored_bytes",
}


def test_the_public_copy_module_is_pinned() -> None:
    from cairn.protocol import copy

    assert set(copy.__all__) == COPY
    for name in copy.__all__:
        assert hasattr(copy, name), name
        if callable(getattr(copy, name)):
            assert (getattr(copy, name).__doc__ or "").strip(), name


def test_bytes_as_stored_are_read_by_the_copy_module_not_the_checkpointers() -> None:
    for checkpointer in (cairn.ObjectStoreCheckpointer, cairn.SyncCheckpointer):
        for removed in ("load_stored", "load_pack"):
            assert not hasattr(checkpointer, removed), (checkpointer, removed)


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


def test_a_missing_object_is_a_store_error_and_a_not_found_error() -> None:
    assert issubclass(cairn.ObjectNotFoundError, cairn.StoreError)
    assert issubclass(cairn.ObjectNotFoundError, cairn.CheckpointNotFoundError)
    error = cairn.ObjectNotFoundError("get", "a/b")
    assert (error.operation, error.path, str(error)) == ("get", "a/b", "object not found: 'a/b'")
    for prose_free in (
        cairn.MissingArtifactError,
        cairn.UndecodableArtifactError,
        cairn.OversizedArtifactError,
    ):
        assert issubclass(prose_free, cairn.IntegrityError)
        assert not issubclass(prose_free, cairn.IntegrityMismatchError)


def test_every_error_pickles_as_itself() -> None:
    """Errors cross processes (DCP ranks, multiprocessing workers) with their attributes."""
    import pickle

    samples = [
        cairn.IntegrityMismatchError("a/b", "0" * 64, "f" * 64),
        cairn.FencedError(1, 2),
        cairn.ObjectNotFoundError("get", "a/b"),
        cairn.NotDurableError("put", "a/b", "written, but not made durable: EIO"),
        cairn.CheckpointAbortedError("id", "a/manifest.json"),
        cairn.InvalidNameError("operator", "x/y", "contains '/'"),
        cairn.TransientStoreError("put", "a/b", "503", status=503),
        cairn.OversizedArtifactError("a/b", "zstd", 1200),
        cairn.NewerFormatError("a/manifest.json", "id", ("x",), "9.0.0"),
    ]
    for error in samples:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert vars(copy) == vars(error)


def test_a_removed_name_still_imports_with_a_warning() -> None:
    from cairn.format.manifest import CheckpointManifest, CheckpointManifestV2

    with pytest.warns(DeprecationWarning, match="import it from cairn.format.manifest"):
        assert cairn.CheckpointManifestV2 is CheckpointManifestV2 is CheckpointManifest
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        cairn.NoSuchName  # noqa: B018


@pytest.mark.parametrize("old", sorted(cairn._MOVED_MODULES))
def test_a_moved_module_imports_by_its_old_name_as_the_same_module(old: str) -> None:
    """``import cairn.retention`` (and every other moved module) still works, warns, and
    gives the very module object of the new path: classes and state are shared."""
    new = cairn._MOVED_MODULES[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=re.escape(old)):
        by_old_name = importlib.import_module(old)
    assert by_old_name is importlib.import_module(new)
    vars(cairn).pop(old.removeprefix("cairn."), None)  # set by the import just above
    with pytest.warns(DeprecationWarning, match=re.escape(old)):
        assert getattr(cairn, old.removeprefix("cairn.")) is by_old_name


def test_a_module_made_private_names_its_public_replacement() -> None:
    sys.modules.pop("cairn.localfs", None)
    with pytest.warns(DeprecationWarning, match="use cairn.stores.localfiles"):
        importlib.import_module("cairn.localfs")
