"""Every error cairn raises, under one root.

```
CheckpointerError
├── CheckpointNotFoundError        (also FileNotFoundError) no such checkpoint or object
├── CheckpointExistsError          a checkpoint with that id is already committed
│   └── ArtifactExistsError        a write-once artifact path already holds other bytes
├── CheckpointInUseError           deleting it would break checkpoints or saves built on it
├── IntegrityError                 stored bytes are not what was written
│   ├── IntegrityMismatchError     SHA-256 (or size) of an artifact differs from the manifest
│   ├── MissingArtifactError       an artifact a manifest or report names is not in the store
│   ├── OversizedArtifactError     stored bytes decode past the size their entry records
│   ├── UndecodableArtifactError   stored bytes do not decode with the codec their entry names
│   ├── CorruptManifestError       bytes at a manifest path are not a valid manifest
│   │   └── UnsupportedManifestVersionError
│   ├── SignatureError             a reader with signing keys met a manifest that is not
│   │                              signed by one of them (unsigned, unknown key, forged)
│   └── BrokenChainError           an incremental chain misses a link (parent, base, artifact)
├── FencedError                    a newer writer has taken over the store
├── CheckpointAbortedError         a save ended before its commit point (its id claimed,
│                                  or the save before it in a pipeline failed)
├── InvalidInputError              (also ValueError) the caller's arguments are wrong
│   ├── AmbiguousCheckpointIdError a short checkpoint id names more than one checkpoint
│   ├── InvalidNameError           operator / source name or partition number
│   ├── InvalidStoreUrlError       URL that open_store cannot open
│   ├── CheckpointLocationError    a DCP checkpoint_id names a place outside the store
│   ├── IncompleteCheckpointError  a distributed commit misses or repeats a partition
│   ├── KeyGroupError              a key-group count, group or worker index out of range
│   ├── KeySpaceMismatchError      keyed partitions overlap in groups or disagree on
│   │                              the key-group count
│   └── InvalidCheckpointDataError inconsistent CheckpointData (duplicates, deltas
│       │                          without parent, negative epoch, ...)
│       └── SpecialFileError       a directory to save holds a link or special file
├── CodecError                     an artifact needs a codec this reader lacks
├── MissingExtraError              (also ImportError) a module of cairn needs packages of
│                                  an optional extra that are not installed
├── NewerFormatError               a manifest needs format features this cairn does not
│                                  know: a newer cairn wrote it (not damage)
├── SyncInAsyncContextError        (also RuntimeError) a blocking call inside an event loop
├── PathsUnresolvedError           (also RuntimeError) a checkpointer's default prefix is
│                                  read before it was resolved against its store
└── StoreError                     the object store failed (path and operation attached)
    ├── TransientStoreError        a failure worth retrying (timeout, connection, 5xx)
    ├── ObjectNotFoundError        (also CheckpointNotFoundError) no object at that path
    ├── ObjectExistsError          a create-only write met an existing object
    ├── NotDurableError            a write landed but could not be made durable (fsync)
    ├── StoreNotFoundError         the bucket or container itself does not exist
    ├── StoreCredentialsError      the store's credentials are missing or refused
    └── PreconditionFailedError    a compare-and-swap write met another version
```

Invariants: no exception raised by obstore reaches a caller of cairn's public API;
each error carries the context needed to act on it (path, checkpoint id, value; for
damaged bytes of a partition, its operator and partition number); every
error pickles as itself, attributes included (errors cross processes).

The classes are defined in private modules of this package, one per family; this module
is their one public path, and each class names it as its ``__module__``, so tracebacks
and pickles say ``cairn.errors.FencedError`` wherever the class is defined.
"""

from __future__ import annotations

# Family by family, root first: the API reference lists the errors in this order.
# isort: off
from cairn.errors._root import (
    CheckpointerError,
    _rebuild,  # noqa: F401 (what pickled errors name: see _root)
)
from cairn.errors._checkpoints import (
    CheckpointNotFoundError,
    CheckpointExistsError,
    ArtifactExistsError,
    CheckpointInUseError,
    FencedError,
    CheckpointAbortedError,
    CodecError,
    NewerFormatError,
    MissingExtraError,
)
from cairn.errors._integrity import (
    IntegrityError,
    IntegrityMismatchError,
    MissingArtifactError,
    OversizedArtifactError,
    UndecodableArtifactError,
    CorruptManifestError,
    UnsupportedManifestVersionError,
    SignatureError,
    BrokenChainError,
)
from cairn.errors._usage import (
    InvalidInputError,
    AmbiguousCheckpointIdError,
    InvalidNameError,
    InvalidStoreUrlError,
    CheckpointLocationError,
    InvalidCheckpointDataError,
    SpecialFileError,
    IncompleteCheckpointError,
    KeyGroupError,
    KeySpaceMismatchError,
    SyncInAsyncContextError,
    PathsUnresolvedError,
)
from cairn.errors._store import (
    StoreError,
    ObjectNotFoundError,
    TransientStoreError,
    ObjectExistsError,
    NotDurableError,
    PreconditionFailedError,
    StoreNotFoundError,
    StoreCredentialsError,
)
# isort: on

__all__ = [
    "AmbiguousCheckpointIdError",
    "ArtifactExistsError",
    "BrokenChainError",
    "CheckpointAbortedError",
    "CheckpointExistsError",
    "CheckpointInUseError",
    "CheckpointLocationError",
    "CheckpointNotFoundError",
    "CheckpointerError",
    "CodecError",
    "CorruptManifestError",
    "FencedError",
    "IncompleteCheckpointError",
    "IntegrityError",
    "IntegrityMismatchError",
    "InvalidCheckpointDataError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidStoreUrlError",
    "KeyGroupError",
    "KeySpaceMismatchError",
    "MissingArtifactError",
    "MissingExtraError",
    "NewerFormatError",
    "NotDurableError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "OversizedArtifactError",
    "PathsUnresolvedError",
    "PreconditionFailedError",
    "SignatureError",
    "SpecialFileError",
    "StoreCredentialsError",
    "StoreError",
    "StoreNotFoundError",
    "SyncInAsyncContextError",
    "TransientStoreError",
    "UndecodableArtifactError",
    "UnsupportedManifestVersionError",
]


def _name_the_public_path() -> None:
    """Make ``cairn.errors`` the ``__module__`` of every error it exports."""
    for name in __all__:
        globals()[name].__module__ = __name__


_name_the_public_path()
