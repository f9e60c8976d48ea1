"""cairn: crash-safe, verified checkpoints of stream processors on any object store.

Start with :class:`ObjectStoreCheckpointer` (async) or :class:`SyncCheckpointer`
(blocking), :class:`CheckpointData` to describe what to save, and :func:`open_store` to
name a store by URL.

Names that left the top level still import from here for a while, with a
:class:`DeprecationWarning` saying where they live now (see ``_MOVED``).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from cairn import _shutdown, errors
from cairn.checkpointer import Checkpointer, ObjectStoreCheckpointer, PartitionUpload
from cairn.data import ArtifactKey, ChainLink, CheckpointData, LoadedCheckpoint
from cairn.distributed import WorkerReport, commit_distributed, upload_partitions
from cairn.errors import *  # noqa: F403 - the whole error tree, as errors.__all__ lists it
from cairn.ids import CheckpointId
from cairn.integrity import sha256_hex, verify_integrity
from cairn.layout import CheckpointPaths
from cairn.manifest import (
    CheckpointManifest,
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
    "ArtifactKey",
    "ChainLink",
    "CheckpointData",
    "CheckpointId",
    "CheckpointManifest",
    "CheckpointPaths",
    "Checkpointer",
    "GcResult",
    "HmacSigner",
    "LoadedCheckpoint",
    "ManifestSigner",
    "ObjectStoreCheckpointer",
    "OperatorSnapshotEntry",
    "PartitionSnapshotEntry",
    "PartitionUpload",
    "RetentionPolicy",
    "RetryPolicy",
    "SourceOffsetEntry",
    "Store",
    "SyncCheckpointer",
    "WorkerReport",
    "__version__",
    "commit_distributed",
    "open_store",
    "sha256_hex",
    "upload_partitions",
    "verify_integrity",
]
__all__ += errors.__all__  # every error of the one tree

_MOVED = {
    "CheckpointManifestV2": "cairn.manifest",  # the reference's alias of CheckpointManifest
}
"""Names removed from the top level, and the module that still has each."""


def __getattr__(name: str) -> Any:
    """A removed name, from where it lives now, with a :class:`DeprecationWarning`."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'cairn' has no attribute {name!r}")
    warnings.warn(
        f"cairn.{name} is no longer part of the top-level API; import it from {module}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)
