"""The store contract (:mod:`cairn.testing`) run against every backend and every wrapper.

One class per store: memory, a local directory (with and without obstore's automatic
cleanup), S3 (moto's server), Azure Blob (Azurite), GCS (fake-gcs-server, its writes
through the tests' XML-to-JSON proxy), and the wrappers over a store:
:class:`RetryingStore`, :class:`BudgetedStore` (paced by a request budget), the tests'
:class:`FaultyStore` and :class:`RecordingStore`, and a retrying store over a faulty one
that fails the first try of every operation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store
from support.faults import FaultPlan, FaultyStore
from support.recording import RecordingStore
from support.servers import (
    AzuriteServer,
    GcsServer,
    S3Server,
    azure_store_options,
    gcs_store_options,
    s3_store_options,
)

from cairn import RequestBudget, RetryPolicy, TransientStoreError
from cairn.stores import ObstoreStore, Store
from cairn.stores._budgeted import BudgetedStore
from cairn.stores.budget import SharedBudget
from cairn.stores.retry import RetryingStore
from cairn.testing import StoreContract

NO_WAIT = RetryPolicy(attempts=2, initial_delay=0, max_delay=0)


def local_store(tmp_path: Path, **options: Any) -> ObstoreStore:
    root = tmp_path / "store"
    root.mkdir()
    return ObstoreStore(LocalStore(root, **options))


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> Store:
        return ObstoreStore(MemoryStore())


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return local_store(tmp_path)


class TestLocalStoreWithAutomaticCleanup(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return local_store(tmp_path, automatic_cleanup=True)


class TestS3Store(StoreContract):
    @pytest.fixture
    def store(self, s3_server: S3Server, s3_bucket: str) -> Store:
        return ObstoreStore(S3Store(s3_bucket, **s3_store_options(s3_server.endpoint)))


class TestAzureStore(StoreContract):
    @pytest.fixture
    def store(self, azurite_server: AzuriteServer, azure_container: str) -> Store:
        return ObstoreStore(AzureStore(azure_container, **azure_store_options(azurite_server)))


class TestGCSStore(StoreContract):
    @pytest.fixture
    def store(self, gcs_server: GcsServer, gcs_bucket: str) -> Store:
        return ObstoreStore(GCSStore(gcs_bucket, **gcs_store_options(gcs_server)))


class TestRetryingStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return RetryingStore(local_store(tmp_path), NO_WAIT)


class TestBudgetedStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        budget = RequestBudget(max_requests_per_s=2000, max_bytes_per_s=1e9)
        return BudgetedStore(local_store(tmp_path), SharedBudget(budget))


class TestFaultyStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return FaultyStore(local_store(tmp_path))


class TestRecordingStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return RecordingStore(local_store(tmp_path), keep_puts=True)


class TestRetryingStoreThroughTransientFaults(StoreContract):
    """Every odd-numbered call fails before reaching the store; one retry absorbs it.

    With concurrent calls an operation may draw odd numbers twice in a row, so the
    policy allows more attempts than sequential calls need.
    """

    @pytest.fixture
    def store(self) -> Store:
        plan = FaultPlan(
            fail_calls={
                n: TransientStoreError("call", str(n), "injected") for n in range(1, 2000, 2)
            }
        )
        faulty = FaultyStore(ObstoreStore(MemoryStore()), plan)
        return RetryingStore(faulty, RetryPolicy(attempts=12, initial_delay=0, max_delay=0))
