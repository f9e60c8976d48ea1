"""Shared fixtures: one contract suite runs against every backend.

``backend`` is parametrized over memory, a local directory, S3 (moto's server on a
loopback port, started by the test session), Azure Blob (Azurite, likewise) and GCS
(fake-gcs-server behind the tests' XML-API proxy, likewise; skipped with the reason where
its binary cannot run); every test that takes ``raw_store`` or ``ckpt`` runs once per
backend. The tools behind them are in ``support/`` (``backends``: stores and
checkpointers; ``policies``: retry policies; ``cli``: the ``local`` store of the
command-line tests), which tests import directly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from obstore.store import ObjectStore
from support.backends import BACKENDS, make_checkpointer, make_store
from support.cli import local  # noqa: F401
from support.fixtures import (  # noqa: F401
    azure_container,
    azurite_server,
    gcs_bucket,
    gcs_server,
    s3_bucket,
    s3_proxy,
    s3_server,
)

from cairn import ObjectStoreCheckpointer


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test."""
    return str(request.param)


@pytest.fixture
def raw_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> ObjectStore:
    """A fresh, empty obstore store of the backend under test."""
    return make_store(backend, tmp_path, request)


@pytest.fixture
def ckpt(raw_store: ObjectStore) -> ObjectStoreCheckpointer:
    """A checkpointer over the backend under test, with a fast retry policy."""
    return make_checkpointer(raw_store)


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    """An empty directory for file:// stores."""
    root = tmp_path / "local-store"
    root.mkdir()
    return root
