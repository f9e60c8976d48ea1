"""cairn: crash-safe, verified checkpoints of stream processors on any object store.

Start with :class:`ObjectStoreCheckpointer` (async) or :class:`SyncCheckpointer`
(blocking), :class:`CheckpointData` to describe what to save, and :func:`open_store` to
name a store by URL.

The package is grouped by what each part holds: :mod:`cairn.format` (what is written
to a store), :mod:`cairn.data` (what callers hand in and get back), :mod:`cairn.observe`,
:mod:`cairn.stores`, :mod:`cairn.protocol` (the commit protocol, retention, discovery),
:mod:`cairn.integrations`, :mod:`cairn.torch`, the command line and the demo.

Names that left the top level, and modules that moved into a subpackage, still import
from their old place for a while, with a :class:`DeprecationWarning` saying where they
live now (the changelog lists them).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

from cairn import errors
from cairn.checkpointer import Checkpointer, ObjectStoreCheckpointer, PartitionUpload
from cairn.data import ArtifactKey, ChainLink, CheckpointData, LoadedCheckpoint
from cairn.data.keyed import KeyedSnapshot
from cairn.errors import *  # noqa: F403 - the whole error tree, as errors.__all__ lists it
from cairn.format.features import VERSION
from cairn.format.ids import CheckpointId
from cairn.format.integrity import sha256_hex, verify_integrity
from cairn.format.keygroups import KeyGroups
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import (
    CheckpointManifest,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SourceOffsetEntry,
)
from cairn.format.signing import HmacSigner, ManifestSigner
from cairn.integrations.distributed import WorkerReport, commit_distributed, upload_partitions
from cairn.protocol.retention import GcResult, RetentionPolicy
from cairn.stores import Store, _shutdown, open_store
from cairn.stores.budget import RequestBudget
from cairn.stores.retry import RetryPolicy
from cairn.sync import SyncCheckpointer

_shutdown.install()  # a clean exit right after a store call: see cairn/stores/_shutdown.py

__version__ = VERSION

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
    "KeyGroups",
    "KeyedSnapshot",
    "LoadedCheckpoint",
    "ManifestSigner",
    "ObjectStoreCheckpointer",
    "OperatorSnapshotEntry",
    "PartitionSnapshotEntry",
    "PartitionUpload",
    "RequestBudget",
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
    "CheckpointManifestV2": "cairn.format.manifest",  # the reference's alias of CheckpointManifest
}
"""Names removed from the top level, and the module that still has each."""


_MOVED_MODULES = {
    "cairn.ids": "cairn.format.ids",
    "cairn.layout": "cairn.format.layout",
    "cairn.manifest": "cairn.format.manifest",
    "cairn.codecs": "cairn.format.codecs",
    "cairn.integrity": "cairn.format.integrity",
    "cairn.ranges": "cairn.format.ranges",
    "cairn.signing": "cairn.format.signing",
    "cairn.inputs": "cairn.data.inputs",
    "cairn.metrics": "cairn.observe.metrics",
    "cairn.tracing": "cairn.observe.tracing",
    "cairn.retry": "cairn.stores.retry",
    "cairn.localfs": "cairn.stores._localfs",
    "cairn.retention": "cairn.protocol.retention",
    "cairn.discover": "cairn.protocol.discover",
    "cairn.distributed": "cairn.integrations.distributed",
}
"""Public modules that moved into a subpackage: the old name, and where it lives now."""

_REPLACED_MODULES = {
    "cairn.localfs": "cairn.stores.localfiles",
}
"""Moved modules that became private, and the public module to use instead."""


def _warn_moved(old: str) -> str:
    new = _MOVED_MODULES[old]
    replacement = _REPLACED_MODULES.get(old)
    if replacement is None:
        advice = f"{old} moved to {new}; import it from there"
    else:
        advice = f"{old} is no longer public; use {replacement}"
    warnings.warn(advice, DeprecationWarning, stacklevel=3)
    return new


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module by its old name as the very module of its new one (one
    module object: state, classes and ``isinstance`` are shared)."""

    def find_spec(
        self,
        fullname: str,
        path: Any = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_warn_moved(spec.name))

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran when its new name was imported."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str) -> Any:
    """A removed name, or a moved module, from where it lives now, with a
    :class:`DeprecationWarning`."""
    if f"cairn.{name}" in _MOVED_MODULES:
        return importlib.import_module(_warn_moved(f"cairn.{name}"))
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'cairn' has no attribute {name!r}")
    warnings.warn(
        f"cairn.{name} is no longer part of the top-level API; import it from {module}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)
