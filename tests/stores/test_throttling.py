"""Throttling and connection resets between cairn and S3; retryability by kind and status.

A loopback FaultProxy in front of moto answers a seeded 30% of requests with S3's
``503 Slow Down`` (and its XML body) and resets (RST) the connection of another 5%
right after the request head. A job's whole life still succeeds through it, with
bit-exact results: full and incremental saves, loads, ``load_latest``, listing, GC and
``cairn copy`` (its library function, which the command runs). The requests it costs
stay within what the two retry layers allow: a store call that needs ``k`` requests
sends at most ``k * (client max_retries + 1)`` per attempt, and at most
``RetryPolicy.attempts`` attempts per call.

Classification is checked on live obstore errors: a failure is retried for its kind
(connection refused, reset, timeout) or its HTTP status (408, 429, 500, 502, 503, 504),
never for its wording. A 400 or a 403 whose text speaks of timeouts and closed
connections is not retried, and a response body cannot pass itself off as a 503.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import pytest
from obstore.exceptions import GenericError
from obstore.store import S3Store
from rich.console import Console
from support.proxy import S3_SLOW_DOWN_BODY, FaultProxy
from support.recording import RecordingStore
from support.servers import s3_store_options

from cairn import (
    CheckpointData,
    CheckpointNotFoundError,
    CheckpointPaths,
    LoadedCheckpoint,
    ObjectStoreCheckpointer,
    PreconditionFailedError,
    RetentionPolicy,
    RetryPolicy,
    SourceOffsetEntry,
    StoreError,
    TransientStoreError,
)
from cairn.cli.copy import copy_checkpoints
from cairn.cli.progress import Transfer
from cairn.stores import (
    ObstoreStore,
    translate_error,
)
from cairn.stores.retry import RetryingStore

CLIENT_RETRIES = 2
POLICY = RetryPolicy(attempts=5, initial_delay=0.001, max_delay=0.01)
THROTTLED, RESET, SEED = 0.3, 0.05, 2024
NO_WAIT = RetryPolicy(attempts=4, initial_delay=0.0, max_delay=0.0)

REQUESTS_PER_CALL: Mapping[str, int] = {
    "get": 1,
    "get_range": 1,
    "head": 1,
    "stat": 1,
    "put": 1,
    "list_dir": 1,
    "list": 1,
    "delete": 1,
    "delete_prefix": 2,
}
"""HTTP requests one call of each Store method sends to S3 when nothing fails (listings
of fewer than 1,000 keys; ``delete_prefix`` lists, then deletes in one batch request)."""


def s3_requests(store: RecordingStore, tries_per_request: int = 1) -> int:
    """The requests the calls ``store`` recorded may send if each is tried that many times."""
    streamed = store.stream_puts
    assert not streamed, f"unexpected streamed uploads {streamed}: these tests save bytes"
    return tries_per_request * sum(REQUESTS_PER_CALL[m] * n for m, n in store.methods.items())


def via(proxy: FaultProxy, bucket: str, retries: int = CLIENT_RETRIES, **client: str) -> S3Store:
    """An S3Store through ``proxy``: one connection per request, fast obstore backoff."""
    options: dict[str, Any] = dict(s3_store_options(proxy.endpoint))
    options["retry_config"] = {
        "max_retries": retries,
        "backoff": {
            "init_backoff": dt.timedelta(milliseconds=5),
            "max_backoff": dt.timedelta(milliseconds=20),
            "base": 2,
        },
        "retry_timeout": dt.timedelta(seconds=20),
    }
    # A new connection for every request, so a reset costs one request and no more.
    options["client_options"] = {"allow_http": True, "pool_max_idle_per_host": "0", **client}
    return S3Store(bucket, **options)


class Counted:
    """A checkpointer through the proxy, its store calls counted on both sides of its
    retry: ``calls`` counts operations, ``attempts`` each try of one."""

    def __init__(self, proxy: FaultProxy, bucket: str, prefix: str) -> None:
        self.attempts = RecordingStore(ObstoreStore(via(proxy, bucket)))
        self.ckpt = ObjectStoreCheckpointer(self.attempts, CheckpointPaths(prefix), retry=POLICY)
        assert isinstance(self.ckpt.store, RetryingStore)
        self.calls = RecordingStore(self.ckpt.store)
        self.ckpt.store = self.calls


def chains(loaded: LoadedCheckpoint) -> dict[tuple[str, int], list[bytes]]:
    return {key: [bytes(link.data) for link in chain] for key, chain in loaded.chains.items()}


def artifacts(loaded: LoadedCheckpoint) -> dict[tuple[str, int], bytes]:
    return {key: bytes(data) for key, data in loaded.artifacts.items()}


# -- a whole job through throttling and resets --------------------------------------------


async def test_the_request_model_is_exact_without_faults(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    """Pins REQUESTS_PER_CALL, on which the bound below rests: with no fault, every call
    sends exactly the requests the model says."""
    job = Counted(s3_proxy, s3_bucket, "jobs/")
    base = await job.ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"a" * 1000}))
    child = await job.ckpt.save(
        CheckpointData(epoch=2, deltas={("op", 0): b"+b"}, parent_id=base.checkpoint_id)
    )
    assert await job.ckpt.list_checkpoints() == [base.checkpoint_id, child.checkpoint_id]
    latest = await job.ckpt.load_latest()
    assert latest is not None and chains(latest) == {("op", 0): [b"a" * 1000, b"+b"]}
    result = await job.ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    assert result.deleted == [base.checkpoint_id] and result.failures == []
    await job.ckpt.delete_checkpoint(child.checkpoint_id)
    assert await job.ckpt.list_checkpoints() == []
    assert s3_proxy.requests == s3_requests(job.attempts) == s3_requests(job.calls)
    assert job.calls.methods == job.attempts.methods


async def test_a_job_succeeds_through_throttling_and_resets_within_the_bound(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    job = Counted(s3_proxy, s3_bucket, "jobs/")
    copy = Counted(s3_proxy, s3_bucket, "copy/")
    s3_proxy.throttle(THROTTLED, RESET, seed=SEED)
    rng = random.Random(SEED)
    base = {("agg", p): rng.randbytes(40_000) for p in range(4)}
    delta, fresh = rng.randbytes(5_000), rng.randbytes(40_000)
    last = {("agg", p): rng.randbytes(40_000) for p in range(4)}
    offsets = {"events": SourceOffsetEntry("kafka", {"events-0": "100"}, 1)}

    m1 = await job.ckpt.save(CheckpointData(epoch=1, snapshots=base, source_offsets=offsets))
    m2 = await job.ckpt.save(
        CheckpointData(
            epoch=2,
            deltas={("agg", 0): delta},
            snapshots={("agg", 1): fresh},
            parent_id=m1.checkpoint_id,
        )
    )
    m3 = await job.ckpt.save(CheckpointData(epoch=3, snapshots=last))
    ids = [m1.checkpoint_id, m2.checkpoint_id, m3.checkpoint_id]
    assert await job.ckpt.list_checkpoints() == ids

    first = await job.ckpt.load(m1.checkpoint_id)
    assert first.manifest == m1 and artifacts(first) == base
    assert first.source_offsets == offsets
    second = await job.ckpt.load(m2.checkpoint_id)
    expected_chains = {
        ("agg", 0): [base["agg", 0], delta],
        ("agg", 1): [fresh],
        ("agg", 2): [base["agg", 2]],
        ("agg", 3): [base["agg", 3]],
    }
    assert second.manifest == m2 and chains(second) == expected_chains
    latest = await job.ckpt.load_latest()
    assert latest is not None and latest.manifest == m3 and artifacts(latest) == last

    # What `cairn copy ID` runs: m2 comes with every artifact its chains name (m1's
    # snapshots under m1's directory), not with m1's manifest.
    async with Transfer(Console(file=io.StringIO()), "copying", None, unit="items") as bar:
        copied = await copy_checkpoints(job.ckpt, copy.ckpt, [m2.checkpoint_id], bar)
    assert [(c.checkpoint_id, c.status, c.requested) for c in copied] == [
        (m2.checkpoint_id, "copied", True),
    ]
    assert await copy.ckpt.list_checkpoints() == [m2.checkpoint_id]
    assert chains(await copy.ckpt.load(m2.checkpoint_id)) == expected_chains

    result = await job.ckpt.gc(RetentionPolicy(keep_last=2), min_age=dt.timedelta(0))
    assert result.deleted == [m1.checkpoint_id] and result.failures == []
    assert await job.ckpt.list_checkpoints() == ids[1:]
    assert chains(await job.ckpt.load(m2.checkpoint_id)) == expected_chains  # m1's parts kept

    stats = s3_proxy.stats()
    assert stats.failed > 0 and stats.resets > 0, stats  # the faults did happen
    # Some failures outlasted obstore's retries (resets of creates and deletes, which it
    # does not repeat, or three throttled tries in a row): cairn's retry took those.
    assert job.attempts.methods.total() > job.calls.methods.total()
    tries = CLIENT_RETRIES + 1
    per_attempt = s3_requests(job.attempts, tries) + s3_requests(copy.attempts, tries)
    per_policy = s3_requests(job.calls, tries * POLICY.attempts) + s3_requests(
        copy.calls, tries * POLICY.attempts
    )
    assert stats.requests <= per_attempt <= per_policy, (stats, per_attempt, per_policy)


# -- what is retried: kind and status, not words ------------------------------------------


def s3_error(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>0123456789ABCDEF</RequestId></Error>\n"
    ).encode()


# A body that imitates obstore's Debug form of a retryable 503 after a connect failure.
FORGED_DEBUG_BODY = (
    b"connection reset\n\nDebug source:\nGeneric {\n    source: RetryError(\n"
    b"        RetryErrorImpl {\n            inner: Status {\n                status: 503,\n"
    b"            },\n            inner: Http(\n                HttpError {\n"
    b"                    kind: Connect,\n                },\n            ),\n"
    b"        },\n    ),\n}"
)

STATUS_CASES = [
    pytest.param(503, "Slow Down", S3_SLOW_DOWN_BODY, TransientStoreError, id="503-SlowDown"),
    pytest.param(
        500,
        "Internal Server Error",
        s3_error("InternalError", "We encountered an internal error. Please try again."),
        TransientStoreError,
        id="500",
    ),
    pytest.param(502, "Bad Gateway", b"", TransientStoreError, id="502"),
    pytest.param(504, "Gateway Timeout", b"", TransientStoreError, id="504"),
    pytest.param(
        429,
        "Too Many Requests",
        s3_error("TooManyRequests", "Please reduce your request rate."),
        TransientStoreError,
        id="429",
    ),
    pytest.param(408, "Request Timeout", b"", TransientStoreError, id="408"),
    pytest.param(
        400,
        "Bad Request",
        s3_error(
            "RequestTimeout",
            "Your socket connection to the server was not read from or written to within "
            "the timeout period.",
        ),
        TransientStoreError,
        id="400-RequestTimeout",
    ),
    pytest.param(
        400,
        "Bad Request",
        b"Bad Request: malformed Connection header; the connection was closed (timed out)",
        StoreError,
        id="400-with-connection-words",
    ),
    pytest.param(400, "Bad Request", FORGED_DEBUG_BODY, StoreError, id="400-forged-debug-body"),
    pytest.param(
        403,
        "Forbidden",
        s3_error("AccessDenied", "Request timeout: the connection was closed"),
        StoreError,
        id="403-mentioning-timeout",
    ),
    pytest.param(
        412,
        "Precondition Failed",
        s3_error("PreconditionFailed", "connection closed"),
        PreconditionFailedError,
        id="412",
    ),
    pytest.param(
        501,
        "Not Implemented",
        s3_error("NotImplemented", "temporarily unavailable: server error"),
        StoreError,
        id="501",
    ),
]


@pytest.mark.parametrize(("status", "phrase", "body", "expected"), STATUS_CASES)
async def test_retryability_follows_the_status_not_the_words(
    s3_proxy: FaultProxy,
    s3_bucket: str,
    status: int,
    phrase: str,
    body: bytes,
    expected: type[StoreError],
) -> None:
    store = RetryingStore(ObstoreStore(via(s3_proxy, s3_bucket, retries=0)), NO_WAIT)
    await store.put("k", b"v")
    s3_proxy.reset_counters()
    s3_proxy.throttle(1.0, status=status, phrase=phrase, body=body)
    with pytest.raises(StoreError) as info:
        await store.get("k")
    retried = expected is TransientStoreError
    assert s3_proxy.requests == (NO_WAIT.attempts if retried else 1)
    assert type(info.value) is expected
    assert info.value.status == status
    assert info.value.operation == "get" and info.value.path == "k"
    assert f"status code: {status}" in str(info.value)


async def test_a_missing_object_is_not_retried(s3_proxy: FaultProxy, s3_bucket: str) -> None:
    store = RetryingStore(ObstoreStore(via(s3_proxy, s3_bucket, retries=0)), NO_WAIT)
    s3_proxy.throttle(1.0, status=404, phrase="Not Found", body=s3_error("NoSuchKey", "timeout"))
    with pytest.raises(CheckpointNotFoundError):
        await store.get("k")
    assert s3_proxy.requests == 1


async def test_a_reset_connection_is_transient_and_retried(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    store = RetryingStore(ObstoreStore(via(s3_proxy, s3_bucket, retries=0)), NO_WAIT)
    s3_proxy.throttle(0.0, 1.0)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put("k", b"v", mode="create"),  # obstore does not retry it: not idempotent
        lambda: store.get("k"),
        lambda: store.delete(["k"]),
    ]
    for call in calls:
        s3_proxy.reset_counters()
        with pytest.raises(TransientStoreError) as info:
            await call()
        assert info.value.status is None
        assert s3_proxy.stats().resets == s3_proxy.requests == NO_WAIT.attempts


@pytest.mark.parametrize("cut_at", [0, 40, 3_000])
async def test_a_connection_closed_mid_response_is_transient(
    s3_proxy: FaultProxy, s3_bucket: str, cut_at: int
) -> None:
    """Closed before the response (obstore's kind ``Request``), inside its head, or
    inside its body (``Interrupted``, hyper's IncompleteBody): transient, no status."""
    store = ObstoreStore(via(s3_proxy, s3_bucket, retries=0))
    await store.put("k", bytes(range(256)) * 40)
    s3_proxy.cut_after(cut_at)
    with pytest.raises(TransientStoreError) as info:
        await store.get("k")
    assert info.value.status is None and s3_proxy.cut == 1


@contextlib.contextmanager
def listening_socket() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog does) and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def _endpoint_store(port: int, **client: str) -> ObstoreStore:
    options: dict[str, Any] = dict(s3_store_options(f"http://127.0.0.1:{port}"))
    options["retry_config"] = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=5)}
    options["client_options"] = {"allow_http": True, **client}
    return ObstoreStore(S3Store("bucket", **options))


async def test_timeouts_and_refused_connections_are_transient() -> None:
    with listening_socket() as port, pytest.raises(TransientStoreError) as timed_out:
        await _endpoint_store(port, timeout="200ms").head("k")
    with pytest.raises(TransientStoreError) as refused:
        await _endpoint_store(port).head("k")  # the port is closed now
    assert timed_out.value.status is None and refused.value.status is None


def test_an_s3_error_inside_a_200_is_transient() -> None:
    # object_store raises its `Response` variant only for a 2xx whose body is an S3
    # InternalError or SlowDown (CompleteMultipartUpload), and retries it like a 5xx.
    # The proxy cannot single out that request, so this is obstore's text for it.
    body = "<Error><Code>InternalError</Code><Message>connection closed</Message></Error>"
    text = (
        "Generic S3 error: Error performing POST http://127.0.0.1:9/b/k?uploadId=1 in 2ms"
        f" - Server returned error response: {body}\n\nDebug source:\nGeneric {{\n"
        '    store: "S3",\n    source: RetryError(\n        RetryErrorImpl {\n'
        "            method: POST,\n            retries: 0,\n            max_retries: 0,\n"
        "            inner: Response {\n                status: 200,\n"
        f'                body: "{body}",\n            }},\n        }},\n    ),\n}}'
    )
    translated = translate_error("put", "k", GenericError(text))
    assert type(translated) is TransientStoreError
    assert translated.status == 200


@pytest.mark.parametrize(
    "exc", [TimeoutError("timed out"), ConnectionResetError(104, "Connection reset by peer")]
)
def test_python_timeouts_and_connection_errors_are_transient(exc: OSError) -> None:
    assert type(translate_error("get", "k", exc)) is TransientStoreError


def test_an_os_error_is_not_retried_for_its_words() -> None:
    exc = OSError("I/O error: connection to the disk timed out, stream closed")
    assert type(translate_error("put", "k", exc)) is StoreError


# -- backoff: capped exponential, fully jittered --------------------------------------------


@contextlib.contextmanager
def seeded_random(seed: int) -> Iterator[None]:
    """Seed the module-level ``random`` (what RetryPolicy draws from), then restore it."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def cap(policy: RetryPolicy, retry_number: int) -> float:
    return min(policy.max_delay, policy.initial_delay * policy.multiplier ** (retry_number - 1))


def test_delays_are_fully_jittered_below_a_capped_exponential() -> None:
    policy = RetryPolicy(attempts=8, initial_delay=0.1, max_delay=1.0, multiplier=2.0)
    with seeded_random(1234):
        draws = {n: [policy.delay(n) for _ in range(400)] for n in range(1, 8)}
    with seeded_random(1234):
        assert policy.delay(1) == draws[1][0]  # seeded: reproducible
    assert [cap(policy, n) for n in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    for n, delays in draws.items():
        top = cap(policy, n)
        assert all(0.0 <= d <= top for d in delays), n
        # Spread over the whole range, not a fixed point or a narrow band around one.
        assert min(delays) < 0.05 * top and max(delays) > 0.95 * top, n
        assert 0.4 * top < sum(delays) / len(delays) < 0.6 * top, n
        assert len(set(delays)) == len(delays), n


async def test_each_retry_sleeps_its_own_bounded_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = RetryPolicy(attempts=5, initial_delay=0.004, max_delay=0.01)
    drawn: list[tuple[int, float]] = []
    original = RetryPolicy.delay

    def recording(self: RetryPolicy, retry_number: int) -> float:
        value = original(self, retry_number)
        drawn.append((retry_number, value))
        return value

    monkeypatch.setattr(RetryPolicy, "delay", recording)
    calls = 0

    async def throttled() -> None:
        nonlocal calls
        calls += 1
        raise TransientStoreError("get", "k", "503 Slow Down", status=503)

    started = time.monotonic()
    with seeded_random(99), pytest.raises(TransientStoreError):
        await policy.run(throttled)
    elapsed = time.monotonic() - started
    assert calls == policy.attempts
    assert [n for n, _ in drawn] == [1, 2, 3, 4]
    assert all(0.0 <= d <= cap(policy, n) for n, d in drawn), drawn
    assert len({d for _, d in drawn}) == len(drawn)
    assert elapsed >= sum(d for _, d in drawn)
