"""cairn: crash-safe, verified checkpoints of stream processors on any object store.

Start with :class:`ObjectStoreCheckpointer` (async) or :class:`SyncCheckpointer`
(blocking), :class:`CheckpointData` to describe what to save, and :func:`open_store` to
name a store by URL.
"""

from __future__ import annotations

from cairn import _shutdown
from cairn.checkpointer import Checkpointer, ObjectStoreCheckpointer, PartitionUpload
from cairn.data import ArtifactKey, ChainLink, CheckpointData, LoadedCheckpoint
from cairn.distributed import WorkerReport, commit_distributed, upload_partitions
from cairn.errors import (
    ArtifactExistsError,
    BrokenChainError,
    CheckpointAbortedError,
    CheckpointerError,
    CheckpointExistsError,
    CheckpointInUseError,
    CheckpointLocationError,
    CheckpointNotFoundError,
    CodecError,
    CorruptManifestError,
    FencedError,
    IncompleteCheckpointError,
    IntegrityError,
    IntegrityMismatchError,
    InvalidCheckpointDataError,
    InvalidInputError,
    InvalidNameError,
    InvalidStoreUrlError,
    MissingArtifactError,
    NotDurableError,
    ObjectExistsError,
    ObjectNotFoundError,
    OversizedArtifactError,
    PreconditionFailedError,
    SignatureError,
    StoreError,
    SyncInAsyncContextError,
    TransientStoreError,
    UndecodableArtifactError,
    UnsupportedManifestVersionError,
)
from cairn.ids import CheckpointId
from cairn.integrity import sha256_hex, verify_integrity
from cairn.layout import CheckpointPaths
from cairn.manifest import (
    CheckpointManifest,
    CheckpointManifestV2,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SourceOffsetEntry,
)
from cairn.retention import GcResult, RetentionPolicy
from cairn.retry import RetryPolicy
from cairn.signing import HmacSigner, ManifestSigner
from cairn.stores import Store, open_store
from cairn.sync import SyncCheckpointer

_shutdown.install()  # a clean exit right after a store call: see cairn/_shutdown.py

__version__ = "0.1.0"

__all__ = [
    "ArtifactExistsError",
    "ArtifactKey",
    "BrokenChainError",
    "ChainLink",
    "CheckpointAbortedError",
    "CheckpointData",
    "CheckpointExistsError",
    "CheckpointId",
    "CheckpointInUseError",
    "CheckpointLocationError",
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
    "HmacSigner",
    "IncompleteCheckpointError",
    "IntegrityError",
    "IntegrityMismatchError",
    "InvalidCheckpointDataError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidStoreUrlError",
    "LoadedCheckpoint",
    "ManifestSigner",
    "MissingArtifactError",
    "NotDurableError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "ObjectStoreCheckpointer",
    "OperatorSnapshotEntry",
    "OversizedArtifactError",
    "PartitionSnapshotEntry",
    "PartitionUpload",
    "PreconditionFailedError",
    "RetentionPolicy",
    "RetryPolicy",
    "SignatureError",
    "SourceOffsetEntry",
    "Store",
    "StoreError",
    "SyncCheckpointer",
    "SyncInAsyncContextError",
    "TransientStoreError",
    "UndecodableArtifactError",
    "UnsupportedManifestVersionError",
    "WorkerReport",
    "__version__",
    "commit_distributed",
    "open_store",
    "sha256_hex",
    "upload_partitions",
    "verify_integrity",
]
