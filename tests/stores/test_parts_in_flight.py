"""Parts of one object in flight at once: the setting, the controller, and the bound.

The setting (:class:`PartsInFlight`, an int, None) is checked wherever it is accepted,
with typed errors naming the value. The controller is driven by scripted sequences of
part completions and failures (it reads no clock), so its limits are exact. A large
ranged read is cut into pieces whose bytes in flight are counted by the piece reader
itself; against moto's S3 server, a loopback proxy counts the connections open at once
(moto answers one request per connection), which bounds the parts in flight of an
upload and of a read, and every byte read or written is compared.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from obstore.store import MemoryStore, S3Store
from support.proxy import FaultProxy
from support.servers import S3Server, s3_store_options

from cairn import InvalidInputError, ObjectStoreCheckpointer, StoreError, TransientStoreError
from cairn.format._buffer import Buffer
from cairn.stores import PART_SIZE, ObstoreStore, PartsInFlight, as_store
from cairn.stores._parts import HOLD, SETTLE_ROUNDS, PartsController, parts_setting
from cairn.stores._pieces import read_in_pieces, split_range

MiB = 1024 * 1024


# -- the setting ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"initial": 0}, "initial must be an int >= 1, got 0"),
        ({"minimum": -1}, "minimum must be an int >= 1, got -1"),
        ({"maximum": True}, "maximum must be an int >= 1, got True"),
        ({"initial": 2.0}, "initial must be an int >= 1, got 2.0"),
        ({"initial": 4, "minimum": 8}, "minimum=8, initial=4, maximum=16"),
        ({"initial": 32}, "minimum=2, initial=32, maximum=16"),
    ],
)
def test_a_setting_out_of_range_is_refused_naming_the_value(
    kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidInputError, match=named.replace(".", r"\.")):
        PartsInFlight(**kwargs)


@pytest.mark.parametrize("value", [0, -3, "8", 2.5, True, [4]])
def test_parts_in_flight_accepts_an_int_a_setting_or_none_only(value: object) -> None:
    with pytest.raises(InvalidInputError, match="parts_in_flight must be an int >= 1") as caught:
        parts_setting(value)
    assert repr(value) in str(caught.value)
    with pytest.raises(InvalidInputError, match="parts_in_flight"):
        ObstoreStore(MemoryStore(), value)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="parts_in_flight"):
        ObjectStoreCheckpointer(MemoryStore(), parts_in_flight=value)  # type: ignore[arg-type]


def test_an_int_is_fixed_and_none_is_the_adaptive_default() -> None:
    assert parts_setting(5) == PartsInFlight(5, 5, 5) == PartsInFlight.fixed(5)
    assert not parts_setting(5).adaptive
    assert parts_setting(None) == PartsInFlight(initial=8, minimum=2, maximum=16)
    assert parts_setting(None).adaptive
    store = ObstoreStore(MemoryStore(), 3)
    assert (store.parts_in_flight, store.upload_parts, store.download_parts) == (
        PartsInFlight.fixed(3),
        3,
        3,
    )


def test_a_ready_store_carries_its_own_setting() -> None:
    ready = ObstoreStore(MemoryStore(), 3)
    with pytest.raises(InvalidInputError, match="carries its own") as caught:
        ObjectStoreCheckpointer(ready, parts_in_flight=4)
    assert "parts_in_flight=4" in str(caught.value)
    assert as_store(ready) is ready
    opened = as_store(MemoryStore(), PartsInFlight(4, 2, 8))
    assert isinstance(opened, ObstoreStore)
    assert opened.parts_in_flight == PartsInFlight(4, 2, 8)


def test_the_checkpointer_passes_the_setting_to_the_store_it_opens() -> None:
    ckpt = ObjectStoreCheckpointer(MemoryStore(), parts_in_flight=PartsInFlight(4, 2, 32))
    found: list[Any] = []
    store: Any = ckpt.store
    while store is not None:  # the retrying store, the observed store, the adapter
        found.append(store)
        store = getattr(store, "inner", None)
    adapter = found[-1]
    assert isinstance(adapter, ObstoreStore)
    assert adapter.parts_in_flight == PartsInFlight(4, 2, 32)


# -- the controller, on scripted completions ------------------------------------------


def run_round(controller: PartsController, rate: float) -> int:
    """One round of parts at ``rate`` bytes per second each; the limit after it."""
    for _ in range(controller.limit):
        controller.completed(int(rate), 1.0)
    return controller.limit


def test_the_limit_doubles_while_each_part_keeps_its_rate() -> None:
    controller = PartsController(PartsInFlight(initial=2, minimum=1, maximum=16))
    limits = [controller.limit]
    for _ in range(5):
        limits.append(run_round(controller, 50e6))
    assert limits == [2, 4, 8, 16, 16, 16]


def test_a_part_rate_that_falls_goes_back_to_the_level_that_held_and_settles() -> None:
    controller = PartsController(PartsInFlight(initial=4, minimum=1, maximum=64))
    assert run_round(controller, 50e6) == 8  # 4 held: no lower level to compare with
    assert run_round(controller, 48e6) == 16  # 8 held (96% of 4's rate)
    # 16 parts at once each move much less: the link is shared, back to 8.
    assert run_round(controller, 50e6 * (HOLD - 0.05)) == 8
    # 8 holds, but the controller stays there for SETTLE_ROUNDS rounds before probing.
    for _ in range(SETTLE_ROUNDS):
        assert run_round(controller, 48e6) == 8
    assert run_round(controller, 48e6) == 16


def test_a_rate_just_at_the_hold_fraction_still_grows() -> None:
    controller = PartsController(PartsInFlight(initial=2, minimum=1, maximum=8))
    run_round(controller, 100e6)
    assert run_round(controller, 100e6 * HOLD) == 8


def test_a_failure_halves_down_to_the_minimum_and_starts_a_new_round() -> None:
    controller = PartsController(PartsInFlight(initial=16, minimum=3, maximum=16))
    for _ in range(10):  # a partial round: not counted after a failure
        controller.completed(8 * MiB, 0.1)
    controller.failed()
    assert controller.limit == 8
    controller.failed()
    assert controller.limit == 4
    controller.failed()
    assert controller.limit == 3
    controller.failed()
    assert controller.limit == 3
    # It settles before it probes upwards again.
    for _ in range(SETTLE_ROUNDS):
        assert run_round(controller, 50e6) == 3
    assert run_round(controller, 50e6) == 6


def test_a_fixed_setting_never_moves() -> None:
    controller = PartsController(PartsInFlight.fixed(5))
    for rate in (1e6, 1e9, 1e3):
        assert run_round(controller, rate) == 5
    controller.failed()
    assert controller.limit == 5


def test_a_transfer_of_many_parts_counts_each_part_at_its_share_of_the_time() -> None:
    controller = PartsController(PartsInFlight(initial=4, minimum=1, maximum=16))
    # 8 parts of 8 MiB, 4 at a time, in 2 s: each part took 1 s (2 s x 4 / 8).
    controller.completed_together(8, 64 * MiB, 2.0, 4)
    assert controller.limit == 8
    # The same bytes at 8 at a time in 2 s: each part took 2 s, half the rate: back to 4.
    controller.completed_together(8, 64 * MiB, 2.0, 8)
    assert controller.limit == 4


# -- a large ranged read, in pieces ----------------------------------------------------


class CountingPieces:
    """Serves pieces of ``data``, counting the bytes asked for and not yet returned.

    With ``fail_at``, the piece starting there fails and every other piece waits until
    it is cancelled, so no piece completes around the failure.
    """

    def __init__(self, data: bytes, fail_at: int | None = None) -> None:
        self.data = data
        self.fail_at = fail_at
        self.in_flight = 0
        self.peak = 0
        self.calls = 0

    async def __call__(self, start: int, end: int) -> Buffer:
        self.calls += 1
        self.in_flight += end - start
        self.peak = max(self.peak, self.in_flight)
        try:
            if start == self.fail_at:
                raise TransientStoreError("get_range", "obj", "503 Slow Down")
            if self.fail_at is not None:
                await asyncio.Event().wait()
            await asyncio.sleep(0.001 * (start % 3))  # out of order
            return self.data[start:end]
        finally:
            self.in_flight -= end - start


@pytest.mark.parametrize("limit", [1, 3, 8])
async def test_a_read_in_pieces_holds_at_most_limit_pieces_in_flight(limit: int) -> None:
    data = os.urandom(1_000_003)
    pieces = CountingPieces(data)
    controller = PartsController(PartsInFlight.fixed(limit))
    got = await read_in_pieces(pieces, 10, len(data), controller, piece=50_000)
    assert bytes(got) == data[10:]
    assert pieces.calls == len(split_range(10, len(data), 50_000)) == 20
    assert pieces.in_flight == 0
    assert 0 < pieces.peak <= limit * 50_000


async def test_a_read_past_the_end_of_the_object_ends_where_it_ends() -> None:
    data = os.urandom(123_456)
    got = await read_in_pieces(
        CountingPieces(data), 1000, 500_000, PartsController(PartsInFlight.fixed(4)), 10_000
    )
    assert bytes(got) == data[1000:]


async def test_a_failed_piece_fails_the_read_stops_the_rest_and_shrinks_the_limit() -> None:
    data = os.urandom(400_000)
    pieces = CountingPieces(data, fail_at=60_000)  # the 4th of the first 4 pieces
    controller = PartsController(PartsInFlight(initial=4, minimum=1, maximum=8))
    with pytest.raises(TransientStoreError, match="Slow Down"):
        await read_in_pieces(pieces, 0, len(data), controller, piece=20_000)
    assert pieces.calls == 4  # no piece started after the failure
    assert pieces.in_flight == 0  # the 3 still waiting were cancelled
    assert controller.limit == 2


# -- against S3 (moto), through a proxy that counts connections open at once ------------


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy.for_endpoint(s3_server.endpoint) as p:
        yield p


def s3_via(proxy: FaultProxy, bucket: str, parts: PartsInFlight | int) -> ObstoreStore:
    options: dict[str, Any] = dict(s3_store_options(proxy.endpoint))
    options["client_options"] = {"allow_http": True, "pool_max_idle_per_host": "0"}
    options["retry_config"] = {
        "max_retries": 0,
        "backoff": {
            "init_backoff": dt.timedelta(milliseconds=1),
            "max_backoff": dt.timedelta(milliseconds=2),
            "base": 2,
        },
        "retry_timeout": dt.timedelta(seconds=5),
    }
    return ObstoreStore(S3Store(bucket, **options), parts)


def chunks_of(data: bytes, size: int) -> AsyncIterator[Buffer]:
    async def gen() -> AsyncIterator[Buffer]:
        view = memoryview(data)
        for i in range(0, len(data), size):
            yield view[i : i + size]

    return gen()


@pytest.mark.parametrize("parts", [2, 5])
async def test_an_upload_to_s3_has_at_most_its_parts_in_flight(
    proxy: FaultProxy, s3_bucket: str, parts: int
) -> None:
    data = os.urandom(6 * PART_SIZE + 12345)  # 7 parts
    store = s3_via(proxy, s3_bucket, parts)
    proxy.shape(bytes_per_second=200 * MiB)  # parts overlap, each taking a while
    proxy.reset_counters()
    await store.put_stream("big.bin", lambda: chunks_of(data, 3 * MiB + 1))
    proxy.reset()
    # One request per connection: a part is one request; create and complete are alone.
    assert 2 <= proxy.peak_open <= parts
    assert bytes((await store.get("big.bin")).data) == data


async def test_a_large_read_from_s3_is_exact_and_bounded(proxy: FaultProxy, s3_bucket: str) -> None:
    data = os.urandom(5 * PART_SIZE + 777)
    store = s3_via(proxy, s3_bucket, 3)
    await store.put("big.bin", data)
    proxy.shape(bytes_per_second=200 * MiB)
    for start, end in [
        (0, len(data)),
        (1, len(data) + 10 * MiB),  # past the end: to the end
        (PART_SIZE, 4 * PART_SIZE),  # piece boundaries
        (123, 3 * PART_SIZE - 5),
    ]:
        proxy.reset_counters()
        got = await store.get_range("big.bin", start, end)
        assert bytes(got) == data[start:end], (start, end)
        assert 2 <= proxy.peak_open <= 3
    proxy.reset()
    with pytest.raises(StoreError):  # a range that starts past the end, as before
        await store.get_range("big.bin", len(data) + 1, len(data) + 3 * PART_SIZE)


async def test_an_upload_that_s3_throttles_halves_the_parts_for_the_next(
    proxy: FaultProxy, s3_bucket: str
) -> None:
    store = s3_via(proxy, s3_bucket, PartsInFlight(initial=8, minimum=2, maximum=16))
    data = os.urandom(2 * PART_SIZE + 1)
    proxy.fail_requests_with(503, n=None)
    with pytest.raises(TransientStoreError):
        await store.put_stream("t.bin", lambda: chunks_of(data, PART_SIZE))
    assert store.upload_parts == 4
    with pytest.raises(TransientStoreError):
        await store.get_range("t.bin", 0, 3 * PART_SIZE)
    assert store.download_parts == 4
    proxy.reset()
    await store.put_stream("t.bin", lambda: chunks_of(data, PART_SIZE))
    assert bytes(await store.get_range("t.bin", 0, 3 * PART_SIZE)) == data
