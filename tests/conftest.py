"""Shared fixtures: one contract suite runs against every backend.

``backend`` is parametrized over memory, a local directory, S3 (moto's server on a
loopback port, started by the test session), Azure Blob (Azurite, likewise) and GCS
(fake-gcs-server behind the tests' XML-API proxy, likewise; skipped with the reason where
its binary cannot run); every test that takes ``raw_store`` or ``ckpt`` runs once per
backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from obstore.store import LocalStore, MemoryStore, ObjectStore
from support.fixtures import (  # noqa: F401
    azure_container,
    azurite_server,
    gcs_bucket,
    gcs_server,
    s3_bucket,
    s3_proxy,
    s3_server,
)
from support.servers import azure_store_options, gcs_store_options, s3_store_options

from cairn import ObjectStoreCheckpointer, RetryPolicy

BACKENDS = ["memory", "local", "s3", "azure", "gcs"]

FAST_RETRY = RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.01)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test."""
    return str(request.param)


@pytest.fixture
def raw_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> ObjectStore:
    """A fresh, empty obstore store of the backend under test."""
    return make_store(backend, tmp_path, request)


def make_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> ObjectStore:
    """A fresh obstore store of ``backend`` (a new bucket or container for remote ones)."""
    from obstore.store import AzureStore, GCSStore, S3Store

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


@pytest.fixture
def ckpt(raw_store: ObjectStore) -> ObjectStoreCheckpointer:
    """A checkpointer over the backend under test, with a fast retry policy."""
    return ObjectStoreCheckpointer(raw_store, retry=FAST_RETRY)


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    """An empty directory for file:// stores."""
    root = tmp_path / "local-store"
    root.mkdir()
    return root
