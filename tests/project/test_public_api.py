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
    "KeyGroupError",
    "KeyGroups",
    "KeySpaceMismatchError",
    "KeyedSnapshot",
    "MissingArtifactError",
    "MissingExtraError",
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
    "RequestBudget",
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


ERROR_SAMPLES: list[Exception] = [
    errors.AmbiguousCheckpointIdError("0190", ["0190-a", "0190-b"]),
    errors.ArtifactExistsError("id", "id/operators/op/partition-0.snap"),
    errors.BrokenChainError("parent id", "its manifest is missing"),
    errors.CheckpointAbortedError("id", "id/manifest.json", "the save before it failed"),
    errors.CheckpointExistsError("id", "id/manifest.json"),
    errors.CheckpointInUseError("id", ["child-1", "child-2"], override="pass --force"),
    errors.CheckpointLocationError("s3://other/x", "memory://", "names another store"),
    errors.CheckpointNotFoundError("id", "checkpoint", "no manifest under the base"),
    errors.CheckpointerError("the root"),
    errors.CodecError("id/a.zst", "zstd", "the zstandard package is not installed"),
    errors.CorruptManifestError("id/manifest.json", "not JSON"),
    errors.FencedError(3, 4),
    errors.IncompleteCheckpointError("partition 2 is missing"),
    errors.IntegrityError("stored bytes differ"),
    errors.IntegrityMismatchError("id/a", "10", "9", what="size"),
    errors.InvalidCheckpointDataError("duplicate operator 'op'"),
    errors.InvalidInputError("bad value"),
    errors.InvalidNameError("partition", -1, "must be in 0..4294967295"),
    errors.InvalidStoreUrlError("ftp://x", "unknown scheme"),
    errors.KeyGroupError("key group", 300, "0..255"),
    errors.KeySpaceMismatchError("counts", "partitions 0 and 1 both hold key group 7"),
    errors.MissingArtifactError("id/a", "operator 'op', partition 0"),
    errors.MissingExtraError("cairn.torch", "torch", ("numpy",)),
    errors.NewerFormatError("id/manifest.json", None, ("x", "y"), None),
    errors.NotDurableError("put", "id/a", "fsync failed: EIO"),
    errors.ObjectExistsError("put", "id/manifest.json", "already exists"),
    errors.ObjectNotFoundError("get", "id/a", "manifest"),
    errors.OversizedArtifactError("id/a", "zstd", 1200),
    errors.PathsUnresolvedError("await resolve_paths() first"),
    errors.PreconditionFailedError("put", "_latest", "e-tag changed", status=412),
    errors.SignatureError("id/manifest.json", "unsigned"),
    errors.SpecialFileError("/data/link", "symbolic link"),
    errors.StoreCredentialsError("get", "a", "GCS", "no token", "set GOOGLE_X", status=401),
    errors.StoreError("list", "a/", "connection reset", status=None),
    errors.StoreNotFoundError("get", "a", "bucket", "b", "NoSuchBucket", status=404),
    errors.SyncInAsyncContextError("inside a running loop"),
    errors.TransientStoreError("put", "a/b", "503", status=503),
    errors.UndecodableArtifactError("id/a", "zstd", "bad frame"),
    errors.UnsupportedManifestVersionError("id/manifest.json", 99, (1, 2)),
]
"""One instance of every error class in ``cairn.errors.__all__``, each built with the
arguments it is raised with."""


ERROR_MESSAGES = {
    "AmbiguousCheckpointIdError": (
        (
            "short checkpoint id '0190' is ambiguous: it matches 2 checkpoints (0190-a, "
            "0190-b); give more characters"
        ),
        ("candidates", "prefix"),
    ),
    "ArtifactExistsError": (
        (
            "artifact 'id/operators/op/partition-0.snap' of checkpoint id already holds other "
            "bytes (another save of this id wrote it first); it is left as it was"
        ),
        ("checkpoint_id", "path"),
    ),
    "BrokenChainError": (
        "broken checkpoint chain at parent id: its manifest is missing",
        ("link", "reason"),
    ),
    "CheckpointAbortedError": (
        (
            "checkpoint id was aborted before it committed: the save before it failed; nothing "
            "was committed"
        ),
        ("checkpoint_id", "path", "why"),
    ),
    "CheckpointExistsError": (
        "checkpoint id is already committed at 'id/manifest.json'",
        ("checkpoint_id", "path"),
    ),
    "CheckpointInUseError": (
        (
            "checkpoint id holds state that other checkpoints or saves build on (child-1 and 1 "
            "more); deleting it would break them. Delete those first, or pass --force"
        ),
        ("checkpoint_id", "dependents"),
    ),
    "CheckpointLocationError": (
        (
            "checkpoint_id 's3://other/x' names another store (the store is memory://): cairn "
            "saves into and loads from its own store only; give a name such as 'step-100', or a "
            "location inside the store"
        ),
        ("checkpoint_id", "reason", "store"),
    ),
    "CheckpointNotFoundError": (
        "checkpoint not found: 'id': no manifest under the base",
        ("detail", "path", "what"),
    ),
    "CheckpointerError": ("the root", ()),
    "CodecError": (
        "cannot decode 'id/a.zst' (codec 'zstd'): the zstandard package is not installed",
        ("codec", "path"),
    ),
    "CorruptManifestError": (
        "corrupt manifest at 'id/manifest.json': not JSON",
        ("path", "reason"),
    ),
    "FencedError": (
        "writer generation 3 is fenced: generation 4 has taken over the store",
        ("current_generation", "own_generation"),
    ),
    "IncompleteCheckpointError": ("partition 2 is missing", ()),
    "IntegrityError": ("stored bytes differ", ()),
    "IntegrityMismatchError": (
        "size mismatch at 'id/a': expected 10, got 9",
        ("actual", "expected", "path"),
    ),
    "InvalidCheckpointDataError": ("duplicate operator 'op'", ()),
    "InvalidInputError": ("bad value", ()),
    "InvalidNameError": (
        "invalid partition -1: must be in 0..4294967295",
        ("kind", "reason", "value"),
    ),
    "InvalidStoreUrlError": ("cannot open store URL 'ftp://x': unknown scheme", ("reason", "url")),
    "KeyGroupError": (
        "key group 300 is out of range: expected 0..255",
        ("allowed", "value", "what"),
    ),
    "KeySpaceMismatchError": (
        "operator 'counts': partitions 0 and 1 both hold key group 7",
        ("operator", "reason"),
    ),
    "MissingArtifactError": (
        "artifact of operator 'op', partition 0 is missing: 'id/a'",
        ("path", "whose"),
    ),
    "NewerFormatError": (
        (
            "a checkpoint needs a newer cairn: 'id/manifest.json' uses format feature(s) x, y, "
            "which this cairn does not know; it was written by a cairn that did not say"
        ),
        ("checkpoint_id", "features", "path", "written_by"),
    ),
    "MissingExtraError": (
        (
            "cairn.torch needs numpy, which is not installed: install cairn with its 'torch' "
            "extra (pip install '.[torch]' in cairn's directory, or 'cairn-checkpoint[torch]' "
            "from a package index), or pip install numpy"
        ),
        ("extra", "feature", "missing"),
    ),
    "NotDurableError": (
        "store put failed for 'id/a': fsync failed: EIO",
        ("operation", "path", "reason", "status"),
    ),
    "ObjectExistsError": (
        "store put failed for 'id/manifest.json': already exists",
        ("operation", "path", "reason", "status"),
    ),
    "ObjectNotFoundError": (
        "manifest not found: 'id/a'",
        ("operation", "path", "reason", "status", "what"),
    ),
    "OversizedArtifactError": (
        (
            "artifact 'id/a' decodes as zstd to more than the 1200 bytes its entry records: "
            "decoding stopped there"
        ),
        ("codec", "path", "size_bytes"),
    ),
    "PathsUnresolvedError": ("await resolve_paths() first", ()),
    "PreconditionFailedError": (
        "store put failed for '_latest': e-tag changed",
        ("operation", "path", "reason", "status"),
    ),
    "SignatureError": ("untrusted manifest at 'id/manifest.json': unsigned", ("path", "reason")),
    "SpecialFileError": (
        "'/data/link' is a symbolic link: a directory partition holds regular files only",
        ("kind", "path"),
    ),
    "StoreCredentialsError": (
        "no token; set GOOGLE_X",
        ("operation", "path", "reason", "remedy", "status", "store"),
    ),
    "StoreError": (
        "store list failed for 'a/': connection reset",
        ("operation", "path", "reason", "status"),
    ),
    "StoreNotFoundError": (
        (
            "the bucket 'b' does not exist (the store answered 404 NoSuchBucket to get 'a'): "
            "create it, or correct the bucket name in the store URL"
        ),
        ("code", "kind", "name", "operation", "path", "reason", "status"),
    ),
    "SyncInAsyncContextError": ("inside a running loop", ()),
    "TransientStoreError": (
        "store put failed for 'a/b': 503",
        ("operation", "path", "reason", "status"),
    ),
    "UndecodableArtifactError": (
        "artifact 'id/a' does not decode as zstd: bad frame",
        ("codec", "path", "reason"),
    ),
    "UnsupportedManifestVersionError": (
        (
            "corrupt manifest at 'id/manifest.json': unsupported manifest version 99 "
            "(supported: (1, 2))"
        ),
        ("path", "reason", "supported", "version"),
    ),
}
"""The message and the attribute names of each error of :data:`ERROR_SAMPLES`."""


def test_every_error_keeps_its_message_and_attributes() -> None:
    for error in ERROR_SAMPLES:
        message, attributes = ERROR_MESSAGES[type(error).__name__]
        assert str(error) == message
        assert tuple(sorted(vars(error))) == attributes


def test_every_error_class_pickles_as_itself_with_its_attributes_and_message() -> None:
    """Every error class, not a sample of them: errors cross processes (DCP ranks,
    multiprocessing workers), and a class that did not rebuild would fail only there."""
    import pickle

    assert sorted(type(error).__name__ for error in ERROR_SAMPLES) == sorted(errors.__all__)
    for error in ERROR_SAMPLES:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) is getattr(errors, type(error).__name__)
        assert type(error).__module__ == "cairn.errors"  # what tracebacks and pickles name
        assert (str(copy), copy.args, vars(copy)) == (str(error), error.args, vars(error))


def test_a_located_integrity_error_pickles_with_its_location() -> None:
    import pickle

    error = errors.MissingArtifactError("id/a", "the manifest").located("op", 2, item="w")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.operator, copy.partition, copy.item, copy.file) == ("op", 2, "w", None)
    assert (
        str(copy)
        == str(error)
        == "operator 'op', partition 2, item 'w': artifact of the manifest is missing: 'id/a'"
    )


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
