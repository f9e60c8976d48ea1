"""The request budget: its token buckets on a fake clock, what each store call counts,
its place beneath the retries, how checkpointers of one store share it, and its limit as
an S3 server behind the throttling proxy sees it.

The buckets are tested by their schedule alone: :meth:`SharedBudget.reserve` returns the
wait it grants against a clock the test moves, so nothing here sleeps to assert a time.
Only the end-to-end test runs in real time, and it judges by the proxy's own stamps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore, S3Store
from support.faults import FaultPlan, FaultyStore
from support.proxy import FaultProxy
from support.servers import s3_store_options

from cairn import (
    CheckpointData,
    InvalidInputError,
    ObjectStoreCheckpointer,
    RequestBudget,
    RetryPolicy,
    SyncCheckpointer,
)
from cairn.format._buffer import Buffer
from cairn.stores import PART_SIZE, ForwardingStore, ObstoreStore
from cairn.stores._budgeted import BudgetedStore
from cairn.stores._observed import ObservedStore
from cairn.stores.budget import BURST_SECONDS, SharedBudget, store_key
from cairn.stores.retry import RetryingStore


class FakeClock:
    """Seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Tally(SharedBudget):
    """A shared budget too large to make anyone wait, that adds up what it was asked for."""

    def __init__(self) -> None:
        super().__init__(RequestBudget(max_requests_per_s=1e9, max_bytes_per_s=1e15))
        self.requests = self.nbytes = 0
        self.charged_requests = self.charged_bytes = 0

    def reserve(self, requests: int, nbytes: int) -> float:
        self.requests += requests
        self.nbytes += nbytes
        return super().reserve(requests, nbytes)

    def charge(self, requests: int, nbytes: int) -> None:
        self.charged_requests += requests
        self.charged_bytes += nbytes
        super().charge(requests, nbytes)


# -- RequestBudget's arguments ------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, -0.5, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", ["max_requests_per_s", "max_bytes_per_s"])
def test_a_limit_that_is_not_finite_and_positive_is_refused_by_name(
    name: str, value: float
) -> None:
    with pytest.raises(InvalidInputError, match=rf"RequestBudget\.{name} .*{value!r}"):
        RequestBudget(**{name: value})


@pytest.mark.parametrize("value", [True, "10", b"1", [1]])
def test_a_limit_that_is_not_a_number_is_refused_by_name(value: object) -> None:
    with pytest.raises(InvalidInputError, match=r"max_requests_per_s must be a number"):
        RequestBudget(max_requests_per_s=value)  # type: ignore[arg-type]


def test_a_budget_with_no_limit_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="needs max_requests_per_s or max_bytes_per_s"):
        RequestBudget()


def test_a_checkpointer_refuses_a_budget_of_another_type_before_opening_anything(
    tmp_path: Any,
) -> None:
    where = tmp_path / "not-made"
    with pytest.raises(InvalidInputError, match=r"budget must be a RequestBudget, got 5"):
        ObjectStoreCheckpointer(str(where), budget=5)  # type: ignore[arg-type]
    assert not where.exists()


# -- the buckets, on a fake clock ---------------------------------------------------------


def test_a_burst_goes_at_once_then_requests_are_spaced_by_the_rate() -> None:
    clock = FakeClock()
    budget = SharedBudget(RequestBudget(max_requests_per_s=50), clock)
    burst = int(50 * BURST_SECONDS)
    waits = [budget.reserve(1, 0) for _ in range(burst + 4)]
    assert waits[:burst] == [0.0] * burst
    assert waits[burst:] == pytest.approx([0.02, 0.04, 0.06, 0.08])
    clock.now += 1.0  # a second idle refills the bucket to its burst, no further
    assert [budget.reserve(1, 0) for _ in range(burst + 1)] == pytest.approx([0.0] * burst + [0.02])


def test_a_slow_rate_still_lets_one_request_through() -> None:
    budget = SharedBudget(RequestBudget(max_requests_per_s=0.5), FakeClock())
    assert budget.reserve(1, 0) == 0.0
    assert budget.reserve(1, 0) == pytest.approx(2.0)


def test_waiting_callers_are_served_in_the_order_they_came() -> None:
    clock = FakeClock()
    budget = SharedBudget(RequestBudget(max_requests_per_s=10, max_bytes_per_s=1000), clock)
    granted = []
    for requests, nbytes in [(1, 0), (1, 5000), (1, 0), (0, 10), (2, 0), (1, 1)]:
        granted.append(clock.now + budget.reserve(requests, nbytes))
        clock.now += 0.001
    assert granted == sorted(granted)
    # The 5,000 bytes went once a request was free (0.1 s on) and left the byte bucket 5 s
    # in debt: the next caller, which needs no bytes, waits only for its request token,
    # and the one after it, which needs 10 bytes, waits for those.
    assert granted[1] - granted[0] == pytest.approx(0.1)
    assert granted[2] - granted[1] == pytest.approx(0.1)
    assert granted[3] - granted[1] == pytest.approx(5.0 - 0.09)


def test_bytes_that_arrived_are_waited_out_by_the_next_caller() -> None:
    clock = FakeClock()
    budget = SharedBudget(RequestBudget(max_bytes_per_s=1000), clock)
    assert budget.reserve(1, 0) == 0.0  # no request limit: a request alone costs nothing
    budget.charge(0, 3100)  # a get's body, counted when it came
    assert budget.reserve(0, 100) == pytest.approx(3.1)  # a full bucket's worth: 3.1 s on


def test_the_requests_and_bytes_of_one_call_are_granted_together() -> None:
    clock = FakeClock()
    budget = SharedBudget(RequestBudget(max_requests_per_s=100, max_bytes_per_s=100), clock)
    assert budget.reserve(1, 110) == 0.0  # the byte bucket is 1.1 s from full again
    # Requests are plentiful, but this call's bytes wait for a full bucket: it goes in
    # 1.1 s, and its request is counted then, not now.
    assert budget.reserve(1, 10) == pytest.approx(1.1)
    # This one's request could go at once, but it waits its turn behind the last.
    assert budget.reserve(1, 0) == pytest.approx(1.1)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.sampled_from([0.5, 3.0, 10.0, 37.0]),
    byte_rate=st.sampled_from([100.0, 5000.0]),
    calls=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=0.5),
            st.integers(min_value=0, max_value=3),
            st.integers(min_value=0, max_value=2000),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_no_window_holds_more_than_the_burst_and_the_rate_allow(
    rate: float, byte_rate: float, calls: list[tuple[float, int, int]]
) -> None:
    """In any window [a, b] of granted times, the tokens granted are at most the burst,
    plus the rate times b - a, plus what one call needed beyond a full bucket."""
    clock = FakeClock()
    budget = SharedBudget(RequestBudget(max_requests_per_s=rate, max_bytes_per_s=byte_rate), clock)
    granted: list[tuple[float, int, int]] = []
    for gap, requests, nbytes in calls:
        clock.now += gap
        granted.append((clock.now + budget.reserve(requests, nbytes), requests, nbytes))
    times = [at for at, _, _ in granted]
    assert times == sorted(times), "a later call overtook an earlier one"
    for limit, index in ((rate, 1), (byte_rate, 2)):
        burst = max(1.0, limit * BURST_SECONDS)
        excess = max(0.0, max(call[index] for call in granted) - burst)
        for i, (start, *_) in enumerate(granted):
            for j in range(i, len(granted)):
                taken = sum(call[index] for call in granted[i : j + 1])
                allowed = burst + limit * (granted[j][0] - start) + excess
                assert taken <= allowed + 1e-6 * max(1.0, allowed)


# -- what each call counts ----------------------------------------------------------------


async def test_each_call_counts_what_the_budget_documents() -> None:
    tally = Tally()
    store = BudgetedStore(ObstoreStore(MemoryStore()), tally)
    await store.put("a", b"x" * 300)
    assert (tally.requests, tally.nbytes) == (1, 300)
    blob = await store.get("a")
    assert bytes(blob.data) == b"x" * 300
    assert (tally.requests, tally.nbytes, tally.charged_bytes) == (2, 300, 300)
    assert bytes(await store.get_range("a", 10, 60)) == b"x" * 50
    assert (tally.requests, tally.nbytes) == (3, 350)
    await store.head("a")
    await store.stat("a")
    await store.list_dir("")
    assert tally.requests == 6 and tally.nbytes == 350

    for i in range(2500):  # a listing of 2,501 entries is three pages: two charged after
        await store.inner.put(f"many/{i:05}", b"")
    assert len(await store.list("")) == 2501
    assert (tally.requests, tally.charged_requests) == (7, 2)
    await store.delete([f"many/{i:05}" for i in range(2001)])  # three batches
    await store.delete([])  # sends nothing
    await store.delete_prefix("many/")  # a listing and a batch
    assert tally.requests == 7 + 3 + 2
    assert await store.inner.list("many/") == []


async def test_a_streamed_upload_counts_its_start_each_part_and_its_completion() -> None:
    tally = Tally()
    store = BudgetedStore(ObstoreStore(MemoryStore()), tally)
    chunk = b"z" * (3 * 1024 * 1024)
    chunks = 7  # 21 MiB: parts of 8, 8 and 5 MiB

    async def open_chunks() -> AsyncIterator[Buffer]:
        for _ in range(chunks):
            yield chunk

    await store.put_stream("big", open_chunks)
    parts = -(-chunks * len(chunk) // PART_SIZE)
    assert parts == 3
    assert (tally.requests, tally.nbytes) == (parts + 2, chunks * len(chunk))
    assert (await store.inner.head("big")).size == chunks * len(chunk)


async def test_every_retry_takes_its_tokens_again() -> None:
    tally = Tally()
    faulty = FaultyStore(ObstoreStore(MemoryStore()), FaultPlan(transient_burst=2))
    store = RetryingStore(
        BudgetedStore(faulty, tally), RetryPolicy(attempts=3, initial_delay=0.0, max_delay=0.0)
    )
    await store.put("a", b"abc")
    assert faulty.methods["put"] == 3
    assert (tally.requests, tally.nbytes) == (3, 9)


# -- one budget per store -----------------------------------------------------------------


def s3_store(
    bucket: str, prefix: str | None = None, endpoint: str = "http://127.0.0.1:1"
) -> S3Store:
    """An S3 store no test sends a request to (nothing listens at the endpoint)."""
    return S3Store(bucket, prefix=prefix, **s3_store_options(endpoint))


def test_a_store_is_known_by_its_bucket_and_endpoint_not_its_prefix() -> None:
    assert store_key(s3_store("b", "jobs/a")) == store_key(s3_store("b", "jobs/b"))
    assert store_key(ObstoreStore(s3_store("b"))) == store_key(s3_store("b", "x"))
    assert store_key(ForwardingStore(ObstoreStore(s3_store("b")))) == store_key(s3_store("b"))
    assert store_key(s3_store("b")) != store_key(s3_store("c"))
    assert store_key(s3_store("b")) != store_key(s3_store("b", endpoint="http://127.0.0.1:2"))
    one, two = MemoryStore(), MemoryStore()
    assert store_key(one) == store_key(ObstoreStore(one)) != store_key(two)


def test_checkpointers_of_one_bucket_share_one_budget_and_must_agree_on_it() -> None:
    budget = RequestBudget(max_requests_per_s=5)
    first = ObjectStoreCheckpointer(s3_store("shared", "jobs/a"), budget=budget)
    second = SyncCheckpointer(s3_store("shared", "jobs/b"), budget=RequestBudget(5.0))
    assert first.budget is not None and first.budget is second.async_checkpointer.budget
    other = ObjectStoreCheckpointer(s3_store("other"), budget=budget)
    assert other.budget is not first.budget
    with pytest.raises(InvalidInputError, match=r"already has RequestBudget\(max_requests_per_s=5"):
        ObjectStoreCheckpointer(s3_store("shared"), budget=RequestBudget(max_requests_per_s=6))
    unlimited = ObjectStoreCheckpointer(s3_store("shared"))  # a checkpointer may opt out
    assert unlimited.budget is None


def test_the_budget_sits_beneath_the_retries_and_above_the_observers() -> None:
    ckpt = ObjectStoreCheckpointer(s3_store("layers"), budget=RequestBudget(max_bytes_per_s=1e6))
    assert isinstance(ckpt.store, RetryingStore)
    assert isinstance(ckpt.store.inner, BudgetedStore)
    assert isinstance(ckpt.store.inner.inner, ObservedStore)
    assert ckpt.retry == RetryPolicy()  # an obstore store given: its retry is its own


def test_without_a_budget_nothing_is_added() -> None:
    ckpt = ObjectStoreCheckpointer(s3_store("plain"))
    assert ckpt.budget is None
    assert isinstance(ckpt.store, RetryingStore) and isinstance(ckpt.store.inner, ObservedStore)


def test_a_url_with_a_budget_is_opened_without_obstore_retries() -> None:
    budget = RequestBudget(max_requests_per_s=5)
    ckpt = ObjectStoreCheckpointer("s3://by-url/jobs", budget=budget)
    inner = ckpt.store
    while isinstance(inner, ForwardingStore):
        inner = inner.inner
    assert isinstance(inner, ObstoreStore) and isinstance(inner.obstore, S3Store)
    assert (inner.obstore.retry_config or {}).get("max_retries") == 0
    assert ckpt.retry.attempts == 12  # the requests obstore and cairn tried before, in all


# -- end to end: what the server sees -----------------------------------------------------

LIMIT = 20
"""Requests per second in the end-to-end test; its burst is LIMIT * BURST_SECONDS."""


def most_in_one_second(stamps: list[float]) -> int:
    """The most stamps in any one-second window [t, t + 1 s) (the worst starts at a stamp).

    The budget's schedule allows ``burst + rate`` requests in a closed window [t, t + 1 s]
    (the property test above checks it exactly, on granted times), one fewer in a half-open
    one; the proxy stamps a request when it has crossed the loopback, up to some
    milliseconds after the budget granted it, so this window keeps that one request of
    room for the jitter of the loopback and of a loaded event loop.
    """
    stamps = sorted(stamps)
    most, j = 0, 0
    for i, start in enumerate(stamps):
        while j < len(stamps) and stamps[j] < start + 1.0:
            j += 1
        most = max(most, j - i)
    return most


async def save_for(ckpt: ObjectStoreCheckpointer, seconds: float, tag: bytes) -> list[int]:
    """Save one small checkpoint after another for ``seconds``; the epochs committed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    epochs: list[int] = []
    while loop.time() < end:
        epoch = len(epochs) + 1
        await ckpt.save(CheckpointData(epoch=epoch, snapshots={("op", 0): tag * epoch}))
        epochs.append(epoch)
    return epochs


def via(proxy: FaultProxy, bucket: str, prefix: str) -> S3Store:
    options: dict[str, Any] = dict(s3_store_options(proxy.endpoint))
    options["retry_config"] = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=20)}
    return S3Store(bucket, prefix=prefix, **options)


async def test_s3_receives_the_requests_a_streamed_upload_counts(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    """The model above, against S3's multipart upload as obstore sends it: the start,
    one request per part, the completion."""
    tally = Tally()
    store = BudgetedStore(ObstoreStore(via(s3_proxy, s3_bucket, "streams")), tally)
    chunk = b"s" * (3 * 1024 * 1024)

    async def open_chunks() -> AsyncIterator[Buffer]:
        for _ in range(6):  # 18 MiB: parts of 8, 8 and 2 MiB
            yield chunk

    await store.put_stream("big", open_chunks)
    assert tally.requests == s3_proxy.requests == 5
    assert (await store.inner.head("big")).size == 6 * len(chunk)


async def test_the_server_never_sees_more_than_the_limit_while_it_throttles(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    """Two checkpointers on one bucket save for 10 s through a proxy that answers 30% of
    requests with 503 Slow Down. By the proxy's own clock, no second holds more than the
    limit and the burst; every save commits and loads back."""
    # Control: the same two writers without a budget exceed the limit (so the check
    # below can fail), with throttling off so that they run at full speed.
    fast = RetryPolicy(attempts=8, initial_delay=0.01, max_delay=0.05)
    free = [
        ObjectStoreCheckpointer(via(s3_proxy, s3_bucket, f"free/{n}"), retry=fast) for n in "ab"
    ]
    await asyncio.gather(*(save_for(ckpt, 1.5, b"f") for ckpt in free))
    assert most_in_one_second(s3_proxy.request_times()) > LIMIT + LIMIT * BURST_SECONDS

    s3_proxy.reset_counters()
    s3_proxy.throttle(fail_fraction=0.3, seed=7)
    budget = RequestBudget(max_requests_per_s=LIMIT)
    writers = [
        ObjectStoreCheckpointer(via(s3_proxy, s3_bucket, f"jobs/{n}"), retry=fast, budget=budget)
        for n in "ab"
    ]
    assert writers[0].budget is writers[1].budget
    done = await asyncio.gather(save_for(writers[0], 10.0, b"a"), save_for(writers[1], 10.0, b"b"))
    stamps = s3_proxy.request_times()
    s3_proxy.reset()
    stats = s3_proxy.stats()
    assert len(stamps) == stats.requests and stats.failed > 0
    assert most_in_one_second(stamps) <= LIMIT + LIMIT * BURST_SECONDS
    assert len(stamps) >= LIMIT * 10 * 0.7, "the budget was barely used: the check is weak"
    for ckpt, epochs, tag in zip(writers, done, (b"a", b"b"), strict=True):
        assert epochs, "no save finished"
        latest = await ckpt.load_latest()
        assert latest is not None and latest.manifest.epoch == epochs[-1]
        assert bytes(latest.artifacts[("op", 0)]) == tag * epochs[-1]
