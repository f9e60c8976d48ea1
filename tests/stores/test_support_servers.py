"""Tests of the test support itself: the servers, the option helpers and FaultProxy.

Faults are observed the way the suite will use them: through real obstore calls against
moto (and Azurite) through the proxy, with obstore's own retries off or on, and with
exact request counts.
"""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import (
    AlreadyExistsError,
    GenericError,
    PreconditionError,
)
from obstore.store import AzureStore, ObjectStore, S3Store, from_url
from support import servers
from support.proxy import S3_SLOW_DOWN_BODY, FaultProxy, ProxyStats
from support.servers import (
    AzuriteServer,
    S3Server,
    ServerStartError,
    _ServerProcess,
    azure_store_options,
    s3_store_options,
    unique_name,
)

DATA = bytes(range(256)) * 4096  # 1 MiB holding every byte value


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def _read(store: ObjectStore, path: str) -> bytes:
    return obstore.get(store, path).bytes().to_bytes()


# -- servers and options: what the suite relies on from moto and Azurite ------------------


def _check_operations_and_conditional_writes(store: ObjectStore) -> None:
    first = obstore.put(store, "dir/a.bin", DATA)
    obstore.put(store, "top.txt", b"t")
    assert _read(store, "dir/a.bin") == DATA
    meta = obstore.head(store, "dir/a.bin")
    assert meta["size"] == len(DATA) and meta["e_tag"] == first["e_tag"]
    assert sorted(m["path"] for batch in obstore.list(store) for m in batch) == [
        "dir/a.bin",
        "top.txt",
    ]
    listing = obstore.list_with_delimiter(store)
    assert listing["common_prefixes"] == ["dir"]
    assert [m["path"] for m in listing["objects"]] == ["top.txt"]

    obstore.put(store, "once", b"1", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "once", b"2", mode="create")
    assert _read(store, "once") == b"1"

    second = obstore.put(store, "dir/a.bin", b"v2", mode={"e_tag": first["e_tag"]})
    with pytest.raises(PreconditionError):
        obstore.put(store, "dir/a.bin", b"v3", mode={"e_tag": first["e_tag"]})
    with pytest.raises(PreconditionError):
        obstore.put(store, "absent", b"x", mode={"e_tag": second["e_tag"]})
    assert _read(store, "dir/a.bin") == b"v2"

    obstore.delete(store, "top.txt")
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "top.txt")


def test_s3_operations_and_conditional_writes(s3_server: S3Server, s3_bucket: str) -> None:
    _check_operations_and_conditional_writes(S3Store(s3_bucket, **s3_store_options(s3_server)))


def test_azurite_operations_and_conditional_writes(
    azurite_server: AzuriteServer, azure_container: str
) -> None:
    store = AzureStore(azure_container, **azure_store_options(azurite_server))
    _check_operations_and_conditional_writes(store)


def test_deleting_a_missing_key_differs_between_backends(
    s3_server: S3Server, s3_bucket: str, azurite_server: AzuriteServer, azure_container: str
) -> None:
    obstore.delete(S3Store(s3_bucket, **s3_store_options(s3_server)), "absent")
    with pytest.raises(FileNotFoundError):
        obstore.delete(AzureStore(azure_container, **azure_store_options(azurite_server)), "absent")


def test_from_url_with_prefix(
    s3_server: S3Server, s3_bucket: str, azurite_server: AzuriteServer, azure_container: str
) -> None:
    s3 = from_url(f"s3://{s3_bucket}/pre", **s3_store_options(s3_server.endpoint))
    az = from_url(f"az://{azure_container}/pre", **azure_store_options(azurite_server.endpoint))
    pairs: list[tuple[ObjectStore, ObjectStore]] = [
        (s3, S3Store(s3_bucket, **s3_store_options(s3_server))),
        (az, AzureStore(azure_container, **azure_store_options(azurite_server))),
    ]
    for store, root in pairs:
        obstore.put(store, "k", b"v")
        assert _read(root, "pre/k") == b"v"


def test_fixtures_give_fresh_names(s3_bucket: str, azure_container: str) -> None:
    assert s3_bucket != azure_container
    assert s3_bucket.startswith("test-fixtures-give-fresh-names-")
    name = unique_name("Test_X[s3]--ä" * 10)
    assert 3 <= len(name) <= 63 and "--" not in name and name == name.lower()


def test_s3_server_lifecycle_and_reset() -> None:
    server = S3Server()
    with server:
        port = server.port
        assert server.endpoint == f"http://127.0.0.1:{port}"
        assert server.startup_seconds > 0
        server.create_bucket("lifecycle")
        store = S3Store("lifecycle", **s3_store_options(server))
        obstore.put(store, "k", b"v")
        server.reset()
        with pytest.raises(FileNotFoundError):
            obstore.head(store, "k")
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.endpoint
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


class _CommandServer(_ServerProcess):
    name = "fake"

    def __init__(self, code: str, startup_timeout: float) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.code = code

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-c", self.code, str(port)]


def test_start_retries_on_a_taken_port_and_waits_for_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serve = (
        "import sys, http.server as h; "
        "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), h.BaseHTTPRequestHandler).serve_forever()"
    )
    with socket.socket() as taken:  # bound, not listening: binding it again fails
        taken.bind(("127.0.0.1", 0))
        ports = iter([taken.getsockname()[1]])
        real_free_port = servers.free_port
        monkeypatch.setattr(servers, "free_port", lambda: next(ports, None) or real_free_port())
        with _CommandServer(serve, startup_timeout=20) as server:
            assert server.port != taken.getsockname()[1]
            assert servers._http(server.port, "GET", "/")[0] == 501


def test_start_failure_reports_output_and_exit_code() -> None:
    server = _CommandServer("import sys; sys.exit('boom: cannot serve')", startup_timeout=20)
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 1.*boom: cannot serve"):
        server.start()


def test_start_timeout_reports_output_and_stops_the_process() -> None:
    code = "import time; print('still warming up', flush=True); time.sleep(60)"
    server = _CommandServer(code, startup_timeout=1.0)
    began = time.monotonic()
    with pytest.raises(ServerStartError, match=r"(?s)did not answer HTTP.*still warming up"):
        server.start()
    assert time.monotonic() - began < 10


def test_missing_azurite_says_to_run_npm_ci(tmp_path: Path) -> None:
    server = AzuriteServer(executable=tmp_path / "azurite-blob")
    with pytest.raises(ServerStartError, match="npm ci"):
        server.start()


# -- FaultProxy observed through obstore against moto ---------------------------------------


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy.for_endpoint(s3_server.endpoint) as fault_proxy:
        yield fault_proxy


def _via(proxy: FaultProxy, bucket: str, retries: int) -> S3Store:
    """An S3Store through ``proxy``: one new connection per request, fast backoff."""
    options = s3_store_options(proxy.endpoint)
    options["client_options"] = {"allow_http": True, "pool_max_idle_per_host": "0"}
    return S3Store(
        bucket,
        retry_config={
            "max_retries": retries,
            "backoff": {
                "init_backoff": timedelta(milliseconds=5),
                "max_backoff": timedelta(milliseconds=20),
            },
        },
        **options,
    )


def test_pass_through_counts_every_request(proxy: FaultProxy, s3_bucket: str) -> None:
    store = _via(proxy, s3_bucket, retries=0)
    obstore.put(store, "k", DATA)
    assert _read(store, "k") == DATA
    obstore.head(store, "k")
    obstore.list_with_delimiter(store)
    assert proxy.stats() == ProxyStats(connections=4, requests=4, dropped=0, cut=0, failed=0)


@pytest.mark.parametrize(("retries", "requests"), [(0, 1), (2, 3)])
def test_persistent_failure_costs_one_request_plus_retries(
    proxy: FaultProxy, s3_bucket: str, retries: int, requests: int
) -> None:
    store = _via(proxy, s3_bucket, retries)
    obstore.put(store, "k", b"v")
    proxy.reset_counters()
    proxy.fail_requests_with(503, n=None)
    with pytest.raises(GenericError, match="503"):
        obstore.get(store, "k")
    assert proxy.requests == proxy.failed == requests
    proxy.reset()
    assert _read(store, "k") == b"v"
    assert proxy.requests == requests + 1 and proxy.failed == requests


def test_failed_requests_are_not_forwarded_and_are_retried(
    proxy: FaultProxy, s3_server: S3Server, s3_bucket: str
) -> None:
    direct = S3Store(s3_bucket, **s3_store_options(s3_server))
    proxy.fail_requests_with(500, n=1)
    with pytest.raises(GenericError, match="500"):
        obstore.put(_via(proxy, s3_bucket, retries=0), "k", DATA)
    with pytest.raises(FileNotFoundError):
        obstore.head(direct, "k")
    proxy.fail_requests_with(503, n=2)
    obstore.put(_via(proxy, s3_bucket, retries=3), "k", DATA)
    assert _read(direct, "k") == DATA
    assert proxy.stats() == ProxyStats(connections=4, requests=4, dropped=0, cut=0, failed=3)


def test_dropped_connections(proxy: FaultProxy, s3_server: S3Server, s3_bucket: str) -> None:
    direct = S3Store(s3_bucket, **s3_store_options(s3_server))
    proxy.drop_next(1)
    with pytest.raises(GenericError):
        obstore.put(_via(proxy, s3_bucket, retries=0), "k", b"v")
    assert proxy.stats() == ProxyStats(connections=1, requests=0, dropped=1, cut=0, failed=0)
    with pytest.raises(FileNotFoundError):
        obstore.head(direct, "k")
    proxy.drop_next(2)
    obstore.put(_via(proxy, s3_bucket, retries=2), "k", b"v")
    assert proxy.stats() == ProxyStats(connections=4, requests=1, dropped=3, cut=0, failed=0)
    assert _read(direct, "k") == b"v"


@pytest.mark.parametrize("cut_at", [0, 40, 300_000])
def test_cut_response_fails_without_retries_and_is_retried_with_intact_data(
    proxy: FaultProxy, s3_bucket: str, cut_at: int
) -> None:
    obstore.put(_via(proxy, s3_bucket, retries=0), "k", DATA)
    proxy.reset_counters()
    proxy.cut_after(cut_at)
    with pytest.raises(GenericError):
        _read(_via(proxy, s3_bucket, retries=0), "k")
    assert proxy.stats() == ProxyStats(connections=1, requests=1, dropped=0, cut=1, failed=0)
    proxy.cut_after(cut_at)
    assert _read(_via(proxy, s3_bucket, retries=2), "k") == DATA
    assert proxy.stats() == ProxyStats(connections=3, requests=3, dropped=0, cut=2, failed=0)


def test_cut_before_the_response_loses_the_answer_not_the_write(
    proxy: FaultProxy, s3_server: S3Server, s3_bucket: str
) -> None:
    direct = S3Store(s3_bucket, **s3_store_options(s3_server))
    proxy.cut_after(0)
    with pytest.raises(GenericError):
        obstore.put(_via(proxy, s3_bucket, retries=0), "a", b"1", mode="create")
    assert _read(direct, "a") == b"1"
    # obstore retries the create, which then meets its own write: an ambiguous outcome.
    proxy.cut_after(0)
    with pytest.raises(AlreadyExistsError):
        obstore.put(_via(proxy, s3_bucket, retries=2), "b", b"1", mode="create")
    assert _read(direct, "b") == b"1"
    assert proxy.stats() == ProxyStats(connections=3, requests=3, dropped=0, cut=2, failed=0)


async def test_proxy_serves_async_clients(proxy: FaultProxy, s3_bucket: str) -> None:
    store = _via(proxy, s3_bucket, retries=2)
    proxy.fail_requests_with(503, n=1)
    await obstore.put_async(store, "k", DATA)
    result = await obstore.get_async(store, "k")
    assert (await result.bytes_async()).to_bytes() == DATA
    assert proxy.stats() == ProxyStats(connections=3, requests=3, dropped=0, cut=0, failed=1)


def _head_bucket(proxy: FaultProxy, bucket: str) -> str:
    """One HEAD of the bucket on a new connection: ``"200 OK"``, ``"503 Slow Down"`` or
    ``"reset"`` (the connection was reset, not closed: a FIN would be RemoteDisconnected)."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    try:
        conn.request("HEAD", f"/{bucket}")
        response = conn.getresponse()
    except ConnectionResetError:
        return "reset"
    finally:
        conn.close()
    return f"{response.status} {response.reason}"


def test_throttle_answers_a_seeded_fraction_and_resets_another(
    proxy: FaultProxy, s3_bucket: str
) -> None:
    proxy.throttle(0.3, 0.1, seed=7)
    first = [_head_bucket(proxy, s3_bucket) for _ in range(60)]
    assert set(first) == {"200 OK", "503 Slow Down", "reset"}
    throttled, resets = first.count("503 Slow Down"), first.count("reset")
    assert 10 <= throttled <= 28 and 2 <= resets <= 12, (throttled, resets)
    assert proxy.stats() == ProxyStats(
        connections=60, requests=60, dropped=0, cut=0, failed=throttled, resets=resets
    )
    proxy.throttle(0.3, 0.1, seed=7)  # re-arming restarts the seeded sequence
    assert [_head_bucket(proxy, s3_bucket) for _ in range(60)] == first
    proxy.throttle(0.3, 0.1, seed=8)
    assert [_head_bucket(proxy, s3_bucket) for _ in range(60)] != first
    proxy.reset()
    assert {_head_bucket(proxy, s3_bucket) for _ in range(10)} == {"200 OK"}


def test_throttled_requests_fail_through_obstore_and_are_retried(
    proxy: FaultProxy, s3_bucket: str
) -> None:
    obstore.put(_via(proxy, s3_bucket, retries=0), "k", DATA)
    proxy.throttle(1.0)
    with pytest.raises(GenericError, match="503"):
        _read(_via(proxy, s3_bucket, retries=0), "k")
    proxy.throttle(0.0, 1.0)
    with pytest.raises(GenericError, match="error sending request"):
        _read(_via(proxy, s3_bucket, retries=0), "k")
    proxy.reset_counters()
    proxy.throttle(0.3, 0.1, seed=3)
    for _ in range(10):
        assert _read(_via(proxy, s3_bucket, retries=10), "k") == DATA
    stats = proxy.stats()
    assert stats.requests == 10 + stats.failed + stats.resets
    assert stats.failed > 0 and stats.resets > 0, stats


def test_requests_are_counted_on_keep_alive_connections(
    azurite_server: AzuriteServer, azure_container: str
) -> None:
    with FaultProxy.for_endpoint(azurite_server.endpoint) as proxy:
        store = AzureStore(azure_container, **azure_store_options(proxy.endpoint))
        obstore.put(store, "k", DATA)
        for _ in range(5):
            obstore.head(store, "k")
        assert _read(store, "k") == DATA
        stats = proxy.stats()
    assert stats.requests == 7 and stats.connections < stats.requests


# -- FaultProxy's HTTP framing, on raw sockets ------------------------------------------------


class _Recorder:
    """An upstream that records every byte it receives and never answers."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._received = bytearray()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def received(self) -> bytes:
        with self._lock:
            return bytes(self._received)

    def _run(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                while data := conn.recv(65536):
                    with self._lock:
                        self._received += data

    def close(self) -> None:
        self._stopping = True
        self._thread.join(timeout=10)
        self._sock.close()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    upstream = _Recorder()
    yield upstream
    upstream.close()


CHUNKED = (
    b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"8;ext=1\r\nab\r\n\r\ncd\r\n"  # the data holds a blank line: not the end of a head
    b"3\r\nefg\r\n0\r\nX-Trailer: t\r\n\r\n"
)
SIZED = b"POST /b/k?x HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nGET / x\r\n"


def test_chunked_and_sized_bodies_are_framed_and_forwarded_exactly(
    recorder: _Recorder,
) -> None:
    head_only = b"HEAD /b/k HTTP/1.1\r\nHost: x\r\n\r\n"
    stream = CHUNKED + SIZED + head_only
    with FaultProxy("127.0.0.1", recorder.port) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            client.sendall(stream)
            _wait_for(lambda: len(recorder.received()) >= len(stream))
        assert recorder.received() == stream
        assert proxy.stats() == ProxyStats(connections=1, requests=3, dropped=0, cut=0, failed=0)


def test_injected_failure_reads_the_whole_body_first(recorder: _Recorder) -> None:
    with FaultProxy("127.0.0.1", recorder.port) as proxy:
        proxy.fail_requests_with(503, n=1)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=0.3) as client:
            client.sendall(CHUNKED[:-12])
            with pytest.raises(TimeoutError):
                client.recv(1)  # no answer while the body is incomplete
            client.settimeout(5)
            client.sendall(CHUNKED[-12:])
            response = b""
            while data := client.recv(65536):
                response += data
        assert response.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert b"Connection: close\r\n" in response
        assert response.endswith(b"</Error>\n")
        assert proxy.stats() == ProxyStats(connections=1, requests=1, dropped=0, cut=0, failed=1)
    assert recorder.received() == b""


def test_throttle_fails_with_the_s3_slow_down_response_after_the_body(
    recorder: _Recorder,
) -> None:
    with FaultProxy("127.0.0.1", recorder.port) as proxy:
        proxy.throttle(1.0)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            client.sendall(SIZED)
            response = b""
            while data := client.recv(65536):
                response += data
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 Slow Down\r\n")
        assert f"Content-Length: {len(S3_SLOW_DOWN_BODY)}".encode() in head
        assert body == S3_SLOW_DOWN_BODY
        assert b"<Code>SlowDown</Code>" in body
        assert proxy.stats() == ProxyStats(
            connections=1, requests=1, dropped=0, cut=0, failed=1, resets=0
        )
    assert recorder.received() == b""


def test_throttle_resets_the_connection_after_the_head(recorder: _Recorder) -> None:
    with FaultProxy("127.0.0.1", recorder.port) as proxy:
        proxy.throttle(0.0, 1.0)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            client.sendall(SIZED[: SIZED.index(b"\r\n\r\n") + 4])  # the head, no body
            with pytest.raises(ConnectionResetError):
                client.recv(1)
        assert proxy.stats() == ProxyStats(
            connections=1, requests=1, dropped=0, cut=0, failed=0, resets=1
        )
    assert recorder.received() == b""


@pytest.mark.parametrize(
    ("fail", "reset", "status"), [(-0.1, 0.0, 503), (0.7, 0.4, 503), (0.3, 0.0, 100)]
)
def test_throttle_rejects_bad_settings(fail: float, reset: float, status: int) -> None:
    proxy = FaultProxy("127.0.0.1", 1)
    with pytest.raises(ValueError, match="fraction|status"):
        proxy.throttle(fail, reset, status=status)


def test_stop_closes_live_connections(recorder: _Recorder) -> None:
    proxy = FaultProxy("127.0.0.1", recorder.port).start()
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    with client:
        _wait_for(lambda: proxy.connections == 1)
        proxy.stop()
        proxy.stop()  # idempotent
        assert client.recv(1) == b""
    with pytest.raises(RuntimeError, match="not started"):
        _ = proxy.endpoint
