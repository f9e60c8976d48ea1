"""Shared fixtures: one contract suite runs against every backend.

``backend`` is parametrized over memory, a local directory, S3 (moto's server on a
loopback port, started by the test session), Azure Blob (Azurite, likewise) and GCS
(fake-gcs-server behind the tests' XML-API proxy, likewise; skipped with the reason where
its binary cannot run); every test that takes ``raw_store`` or ``ckpt`` runs once per
backend. The tools behind them are in ``support/`` (``backends``: stores and
checkpointers; ``policies``: retry policies; ``cli``: the ``local`` store of the
command-line tests), which tests import directly.

Markers (registered in ``pyproject.toml``, which sets ``--strict-markers``): tests are
marked ``servers``, ``slow``, ``subprocess`` and ``torch`` here, at collection, by the
rules of :mod:`support.markers`, so that ``pytest -m "not servers"`` starts no server.
While a test not marked ``servers`` runs, starting an emulator fails it
(:func:`support.servers.refusing_starts`): a test the rules miss is found in every run.
A module that is slow as a whole carries ``slow`` in its own ``pytestmark``.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import AbstractContextManager, nullcontext
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
from support.markers import markers_of
from support.servers import refusing_starts

from cairn import ObjectStoreCheckpointer

RUN_FIRST = (
    "protocol/test_simulation.py",
    "integrations/test_ray.py",
    "cli/test_cli.py",
    "dcp/test_torch_dist.py",
    "protocol/test_process_kill.py",
    "integrations/test_ray_train.py",
    "integrations/test_training_docs.py",
    "dcp/test_torch_dcpdir.py",
)
"""The longest modules (by ``--durations``), longest first. ``scripts/test.sh`` hands
whole modules to two workers in the order collected (``--no-loadscope-reorder``): these
go first, so that neither worker is left running a long one alone at the end."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the rules of :mod:`support.markers`, and put the modules of
    :data:`RUN_FIRST` first (each module's tests stay together, in their order)."""
    for item in items:
        for name in markers_of(item):
            item.add_marker(name)
    tests = Path(__file__).parent
    first = {module: rank for rank, module in enumerate(RUN_FIRST)}

    def rank(item: pytest.Item) -> int:
        module = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return first.get(module, len(first))

    items.sort(key=rank)  # stable: the rest keep the order they were collected in


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Run a test not marked ``servers`` where no emulator can start (fixtures included)."""
    if item.get_closest_marker("servers") is not None:
        guard: AbstractContextManager[None] = nullcontext()
    else:
        guard = refusing_starts(
            f"{item.nodeid} is not marked `servers`, and a test that needs a server must be "
            "(see tests/support/markers.py)"
        )
    with guard:
        return (yield)


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
