"""Stores and checkpointers for tests: one fresh store per backend, one checkpointer
with the suite's defaults.

:func:`make_store` opens a new, empty store of a backend (a new bucket or container on
the session's server for remote ones). :func:`make_checkpointer` builds an
:class:`~cairn.ObjectStoreCheckpointer` with :data:`~support.policies.FAST_RETRY` unless
told otherwise; a test that is about the constructor's own arguments builds it itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, ObjectStore, S3Store

from cairn import CheckpointPaths, ObjectStoreCheckpointer, Store

from .policies import FAST_RETRY
from .servers import azure_store_options, gcs_store_options, s3_store_options

BACKENDS = ["memory", "local", "s3", "azure", "gcs"]
"""Every backend the contract tests run against."""


def make_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> ObjectStore:
    """A fresh obstore store of ``backend`` (a new bucket or container for remote ones)."""
    if backend == "memory":
        return MemoryStore()
    if backend == "local":
        root = tmp_path / "store"
        root.mkdir(exist_ok=True)
        return LocalStore(root)
    if backend == "s3":
        server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        return S3Store(bucket, **s3_store_options(server.endpoint))
    if backend == "azure":
        server = request.getfixturevalue("azurite_server")
        container = request.getfixturevalue("azure_container")
        return AzureStore(container, **azure_store_options(server))
    if backend == "gcs":
        server = request.getfixturevalue("gcs_server")
        bucket = request.getfixturevalue("gcs_bucket")
        return GCSStore(bucket, **gcs_store_options(server))
    raise AssertionError(backend)


def make_checkpointer(
    store: Store | ObjectStore | str,
    paths: CheckpointPaths | None = None,
    **overrides: Any,
) -> ObjectStoreCheckpointer:
    """A checkpointer over ``store`` with the suite's defaults (``retry=FAST_RETRY``);
    ``overrides`` are constructor keywords that replace or add to them."""
    options: dict[str, Any] = {"retry": FAST_RETRY, **overrides}
    return ObjectStoreCheckpointer(store, paths, **options)
