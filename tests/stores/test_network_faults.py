"""Real network faults between cairn and a real S3 endpoint: a loopback proxy in front of
moto's server answers 503s, drops connections and cuts responses mid-body.

These pin down how cairn's retry and obstore's HTTP retry combine: a persistent fault
costs exactly ``(max_retries + 1) * RetryPolicy.attempts`` requests, and a passing one
is invisible to the caller.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from obstore.store import S3Store
from support.proxy import FaultProxy
from support.servers import s3_store_options

from cairn import (
    CheckpointData,
    CheckpointPaths,
    ObjectStoreCheckpointer,
    RetryPolicy,
    TransientStoreError,
    open_store,
)
from cairn.stores import DEFAULT_CLIENT_RETRY

POLICY = RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.01)
CLIENT_RETRIES = 2


def proxied_options(proxy: FaultProxy) -> dict[str, Any]:
    options: dict[str, Any] = dict(s3_store_options(proxy.endpoint))
    options["retry_config"] = {
        "max_retries": CLIENT_RETRIES,
        "backoff": {
            "init_backoff": dt.timedelta(milliseconds=5),
            "max_backoff": dt.timedelta(milliseconds=20),
            "base": 2,
        },
        "retry_timeout": dt.timedelta(seconds=20),
    }
    # One connection per request, so that connection faults hit the next request.
    options["client_options"] = {"allow_http": True, "pool_max_idle_per_host": "0"}
    return options


def checkpointer(proxy: FaultProxy, bucket: str) -> ObjectStoreCheckpointer:
    return ObjectStoreCheckpointer(
        S3Store(bucket, **proxied_options(proxy)), CheckpointPaths(""), retry=POLICY
    )


def sample(epoch: int) -> CheckpointData:
    return CheckpointData(
        epoch=epoch, snapshots={("op", p): bytes([p]) * 300_000 for p in range(3)}
    )


async def test_a_persistent_5xx_costs_a_bounded_number_of_requests(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    ckpt = checkpointer(s3_proxy, s3_bucket)
    s3_proxy.fail_requests_with(503, n=None)
    s3_proxy.reset_counters()
    with pytest.raises(TransientStoreError) as info:
        await ckpt.read_latest()
    assert info.value.operation == "get"
    assert s3_proxy.requests == (CLIENT_RETRIES + 1) * POLICY.attempts


async def test_the_default_client_retry_bounds_requests_too(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    options = dict(s3_store_options(s3_proxy.endpoint))
    store = open_store(f"s3://{s3_bucket}", **options)
    # Paths given: one listing (choosing a layout would list twice).
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(""), retry=POLICY)
    s3_proxy.fail_requests_with(503, n=None)
    s3_proxy.reset_counters()
    with pytest.raises(TransientStoreError):
        await ckpt.list_checkpoints()
    assert s3_proxy.requests == (DEFAULT_CLIENT_RETRY["max_retries"] + 1) * POLICY.attempts


async def test_a_passing_5xx_burst_is_invisible(s3_proxy: FaultProxy, s3_bucket: str) -> None:
    ckpt = checkpointer(s3_proxy, s3_bucket)
    first = await ckpt.save(sample(1))
    s3_proxy.fail_requests_with(503, n=5)
    second = await ckpt.save(sample(2))
    loaded = await ckpt.load_latest()
    assert loaded is not None
    assert loaded.checkpoint_id == second.checkpoint_id != first.checkpoint_id
    assert bytes(loaded.artifacts[("op", 2)]) == bytes([2]) * 300_000


async def test_dropped_connections_are_retried(s3_proxy: FaultProxy, s3_bucket: str) -> None:
    ckpt = checkpointer(s3_proxy, s3_bucket)
    s3_proxy.drop_next(4)
    manifest = await ckpt.save(sample(1))
    assert s3_proxy.dropped == 4
    s3_proxy.drop_next(4)
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert loaded.manifest == manifest


async def test_a_response_cut_mid_body_is_retried_and_verified(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    ckpt = checkpointer(s3_proxy, s3_bucket)
    manifest = await ckpt.save(sample(1))
    s3_proxy.cut_after(100_000, n=3)
    loaded = await ckpt.load(manifest.checkpoint_id)
    assert {k: bytes(v) for k, v in loaded.artifacts.items()} == {
        ("op", p): bytes([p]) * 300_000 for p in range(3)
    }


async def test_an_outage_fails_the_save_and_commits_nothing(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    ckpt = checkpointer(s3_proxy, s3_bucket)
    kept = await ckpt.save(sample(1))
    s3_proxy.fail_requests_with(500, n=None)
    with pytest.raises(TransientStoreError):
        await ckpt.save(sample(2))
    s3_proxy.reset()
    assert await ckpt.list_checkpoints() == [kept.checkpoint_id]
    loaded = await ckpt.load_latest()
    assert loaded is not None
    assert loaded.checkpoint_id == kept.checkpoint_id
