"""A loopback TCP proxy that injects network and HTTP faults in front of a test server.

``FaultProxy(host, port)`` listens on 127.0.0.1 (an ephemeral port) and forwards every
connection to ``host:port``. It runs its own asyncio event loop in a daemon thread, so
sync tests, async tests and obstore's own runtime can all use it at once.

Guarantees:

* Pass-through (the default) is byte-exact in both directions.
* Faults are armed from any thread and disarmed by ``reset()``; each armed fault is
  consumed, under a lock, by exactly one connection (``drop_next``, ``cut_after``) or
  one request (``fail_requests_with``). Arming a fault replaces the previous setting
  of the same kind.
* ``throttle()`` is a standing, probabilistic mode (until ``reset()``): each request
  draws once from a ``random.Random(seed)``, under the lock, and is answered with an
  error response (by default S3's ``503 Slow Down`` and its XML body), or has its
  connection reset (RST) right after its head, or is forwarded. The sequence of
  verdicts is a pure function of the seed; which request gets which verdict depends
  only on the order in which request heads arrive. A request armed by
  ``fail_requests_with`` takes that failure and draws nothing.
* Connection faults are decided when a connection is *accepted*: connections a client
  already holds in its pool are not affected. To make each obstore request open a new
  connection, build the store with ``client_options={"pool_max_idle_per_host": "0"}``
  (moto closes every connection after one response anyway; Azurite keeps them alive).
* Counters are exact. ``requests`` counts every HTTP/1.x request head parsed on the
  client->server direction, forwarded or answered with an injected failure, several
  per keep-alive connection. Request bodies are framed per RFC 9112 (Content-Length,
  or ``Transfer-Encoding: chunked`` with trailers), so the next head is found exactly.
  A request is counted before it is forwarded: once a client call has returned, every
  request it sent has been counted. Dropped connections count in ``connections`` and
  ``dropped`` only (their requests are never read). ``failed`` counts requests answered
  with an injected error response (``fail_requests_with`` or ``throttle``), ``resets``
  the requests whose connection ``throttle`` reset; neither kind reaches the server.
* ``request_times()`` holds one ``time.monotonic()`` stamp per counted request, taken
  under the same lock as the count when its head has been parsed (before it is
  forwarded or failed), in the order they were counted: ``len(request_times())`` equals
  ``requests`` in any one snapshot. ``reset_counters()`` clears them with the counters.

* ``shape(bytes_per_second, latency)`` is a standing mode (until ``reset()``) that models
  a link such as S3's, whose every connection carries a bounded rate: each direction of
  each connection accepted after the call is paced to at most ``bytes_per_second`` (the
  bytes of a read are forwarded once the link would have carried them), and each request
  head and each response's first bytes wait ``latency`` seconds (one way) first.
  ``peak_open`` counts the most forwarded connections open at once (with moto, which
  closes every connection after one response, the most requests in flight at once).

Not supported: TLS, HTTP/2, protocol upgrades. A client->server stream that does not
parse as HTTP/1.x is still forwarded, raw, but its requests are no longer counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self
from urllib.parse import urlsplit

__all__ = ["S3_SLOW_DOWN_BODY", "FaultProxy", "ProxyStats"]

S3_SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>4442587FB7D0A2F9</RequestId>"
    b"<HostId>FaultProxy/throttle</HostId></Error>\n"
)
"""The body S3 sends with ``503 Slow Down`` when a prefix exceeds its request rate."""

_HEAD_LIMIT = 1 << 20
_CHUNK = 1 << 16


@dataclass(frozen=True)
class ProxyStats:
    """A consistent snapshot of a proxy's counters."""

    connections: int
    requests: int
    dropped: int
    cut: int
    failed: int
    resets: int = 0
    peak_open: int = field(default=0, compare=False)
    """Connections open at once at most: left out of comparisons (timing decides it)."""


class _NotHttp(Exception):
    """The client->server stream is not parseable HTTP/1.x."""


@dataclass(frozen=True)
class _Shape:
    bytes_per_second: float | None
    latency: float


class _Pacer:
    """One direction of one shaped connection: a link free again at ``free_at``."""

    def __init__(self, shape: _Shape) -> None:
        self.shape = shape
        self.free_at = 0.0

    async def carry(self, nbytes: int) -> None:
        """Wait until the link would have carried ``nbytes`` more bytes."""
        rate = self.shape.bytes_per_second
        if rate is None:
            return
        now = asyncio.get_running_loop().time()
        self.free_at = max(now, self.free_at) + nbytes / rate
        if self.free_at > now:
            await asyncio.sleep(self.free_at - now)

    async def delay(self) -> None:
        """One round trip."""
        if self.shape.latency > 0:
            await asyncio.sleep(self.shape.latency)


async def _paced_write(writer: asyncio.StreamWriter, data: bytes, pacer: _Pacer | None) -> None:
    if pacer is not None:
        await pacer.carry(len(data))
    writer.write(data)
    await writer.drain()


@dataclass(frozen=True)
class _RequestHead:
    chunked: bool
    content_length: int
    expect_continue: bool


def _parse_head(raw: bytes) -> _RequestHead:
    lines = raw.lstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _NotHttp(lines[0][:100])
    content_length = 0
    codings: list[bytes] = []
    expect_continue = False
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise _NotHttp(line[:100])
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            try:
                content_length = int(value)
            except ValueError as exc:
                raise _NotHttp(line[:100]) from exc
        elif name == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.split(b",")]
        elif name == b"expect":
            expect_continue = value.lower() == b"100-continue"
    chunked = bool(codings) and codings[-1] == b"chunked"
    return _RequestHead(chunked, content_length, expect_continue)


async def _relay_exact(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter | None,
    n: int,
    pacer: _Pacer | None = None,
) -> None:
    """Copy exactly ``n`` bytes (or discard them when ``writer`` is None)."""
    while n > 0:
        data = await reader.read(min(n, _CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", n)
        n -= len(data)
        if writer is not None:
            await _paced_write(writer, data, pacer)


async def _relay_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None) -> bytes:
    line = await reader.readuntil(b"\r\n")
    if writer is not None:
        writer.write(line)
    return line


async def _relay_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter | None,
    head: _RequestHead,
    pacer: _Pacer | None = None,
) -> None:
    """Copy (or discard) exactly one request body, framed as ``head`` says."""
    if not head.chunked:
        await _relay_exact(reader, writer, head.content_length, pacer)
        return
    while True:
        size_line = await _relay_line(reader, writer)
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise _NotHttp(size_line[:100]) from exc
        if size == 0:
            break
        await _relay_exact(reader, writer, size + 2, pacer)
    while await _relay_line(reader, writer) != b"\r\n":  # trailer section
        pass
    if writer is not None:
        await writer.drain()


def _error_response(status: int, phrase: str | None = None, body: bytes | None = None) -> bytes:
    if phrase is None:
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = "Injected Fault"
    if body is None:
        code = "".join(phrase.split())
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>injected by FaultProxy</Message></Error>\n"
        ).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


@dataclass(frozen=True)
class _Verdict:
    """What to do with one request: forward it, answer ``response``, or reset."""

    action: Literal["forward", "fail", "reset"]
    response: bytes = b""


_FORWARD = _Verdict("forward")
_RESET = _Verdict("reset")


@dataclass(frozen=True)
class _Throttle:
    fail_fraction: float
    reset_fraction: float
    response: bytes
    rng: random.Random


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), not a FIN: what the client
    sees as "connection reset by peer"."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()  # flushes what was written, then closes
    with contextlib.suppress(Exception):
        await writer.wait_closed()


class FaultProxy:
    """TCP proxy on 127.0.0.1 in front of ``target_host:target_port`` (see module doc)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._port = 0
        self._drop_left = 0
        self._cut_left = 0
        self._cut_bytes = 0
        self._fail_status = 0
        self._fail_left: int | None = 0  # None: every request until reset()
        self._throttle: _Throttle | None = None
        self._connections = self._requests = self._dropped = self._cut = self._failed = 0
        self._resets = 0
        self._request_times: list[float] = []
        self._shape: _Shape | None = None
        self._open = self._peak_open = 0

    @classmethod
    def for_endpoint(cls, endpoint: str) -> FaultProxy:
        """A proxy in front of the host and port of an ``http://host:port`` URL."""
        parts = urlsplit(endpoint)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://host:port, got {endpoint!r}")
        return cls(parts.hostname, parts.port)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("FaultProxy is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``, where clients should connect."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("FaultProxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name=f"FaultProxy->{self.target_port}", daemon=True
        )
        self._thread.start()
        self._port = asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=10)
        return self

    def stop(self) -> None:
        """Close the listener and every live connection; join the loop thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            self._loop = self._thread = None
            self._port = 0

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:  # as asyncio.run() does: finish every task, let transports close
            leftover = asyncio.all_tasks(loop)
            for task in leftover:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, limit=_HEAD_LIMIT)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _shutdown(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- fault control (any thread) -----------------------------------------------------

    def drop_next(self, n: int = 1) -> None:
        """Close the next ``n`` accepted connections at once, forwarding nothing."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self._lock:
            self._drop_left = n

    def cut_after(self, nbytes: int, n: int = 1) -> None:
        """Forward the next ``n`` connections but close both sides once ``nbytes`` bytes
        of response (counted from the connection's start) have reached the client.

        ``nbytes=0`` lets the request reach the server and loses the whole response. A
        connection that ends before ``nbytes`` is not cut, but still uses up its turn.
        """
        if nbytes < 0 or n < 0:
            raise ValueError("nbytes and n must be >= 0")
        with self._lock:
            self._cut_bytes, self._cut_left = nbytes, n

    def fail_requests_with(self, status: int = 503, n: int | None = 1) -> None:
        """Answer the next ``n`` requests (every request if ``n`` is None, until ``reset``)
        with ``status``, a small XML error body and ``Connection: close``, forwarding
        nothing; the request body is read first unless the client expects 100-continue."""
        if not 200 <= status <= 599:
            raise ValueError("status must be in 200..599")
        if n is not None and n < 0:
            raise ValueError("n must be >= 0 or None")
        with self._lock:
            self._fail_status, self._fail_left = status, n

    def throttle(
        self,
        fail_fraction: float = 0.3,
        reset_fraction: float = 0.0,
        *,
        seed: int = 0,
        status: int = 503,
        phrase: str = "Slow Down",
        body: bytes = S3_SLOW_DOWN_BODY,
    ) -> None:
        """Until ``reset()``, answer a ``fail_fraction`` of requests with ``status``,
        ``phrase`` and ``body`` (by default S3's SlowDown), and reset the connection (RST)
        of a ``reset_fraction`` of requests right after their head; forward the rest.

        Each request draws once from ``random.Random(seed)``: a draw below
        ``fail_fraction`` fails it, one below ``fail_fraction + reset_fraction`` resets
        it. A failed request's body is read first (unless the client expects
        100-continue); a reset one's is not. Neither reaches the server.
        """
        if min(fail_fraction, reset_fraction) < 0 or fail_fraction + reset_fraction > 1:
            raise ValueError("fractions must be >= 0 and add up to at most 1")
        if not 200 <= status <= 599:
            raise ValueError("status must be in 200..599")
        response = _error_response(status, phrase, body)
        with self._lock:
            self._throttle = _Throttle(fail_fraction, reset_fraction, response, random.Random(seed))

    def shape(self, bytes_per_second: float | None = None, latency: float = 0.0) -> None:
        """Until ``reset()``, pace each direction of every connection accepted from now on
        to ``bytes_per_second`` (None: unbounded), and delay the connection and each of
        its request heads by ``latency`` seconds (a round trip each)."""
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be > 0 or None")
        if latency < 0:
            raise ValueError("latency must be >= 0")
        with self._lock:
            self._shape = _Shape(bytes_per_second, latency)

    def reset(self) -> None:
        """Disarm every fault and the shaping: back to pass-through. Counters are kept."""
        with self._lock:
            self._drop_left = self._cut_left = 0
            self._fail_left = 0
            self._throttle = None
            self._shape = None

    def reset_counters(self) -> None:
        with self._lock:
            self._connections = self._requests = self._dropped = self._cut = self._failed = 0
            self._resets = 0
            self._request_times.clear()
            self._peak_open = self._open

    # -- counters (any thread) ----------------------------------------------------------

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(
                self._connections,
                self._requests,
                self._dropped,
                self._cut,
                self._failed,
                self._resets,
                self._peak_open,
            )

    def request_times(self) -> list[float]:
        """The ``time.monotonic()`` stamp of every counted request, in order (a copy)."""
        with self._lock:
            return list(self._request_times)

    @property
    def connections(self) -> int:
        """Connections accepted, including dropped ones."""
        return self.stats().connections

    @property
    def requests(self) -> int:
        """HTTP requests seen: forwarded plus answered with an injected failure."""
        return self.stats().requests

    @property
    def dropped(self) -> int:
        return self.stats().dropped

    @property
    def cut(self) -> int:
        """Connections cut by ``cut_after`` (only those that reached the byte limit)."""
        return self.stats().cut

    @property
    def failed(self) -> int:
        """Requests answered with an injected error (``fail_requests_with``, ``throttle``)."""
        return self.stats().failed

    @property
    def peak_open(self) -> int:
        """The most forwarded connections open at once (since the last ``reset_counters``)."""
        return self.stats().peak_open

    @property
    def resets(self) -> int:
        """Requests whose connection ``throttle`` reset after their head."""
        return self.stats().resets

    # -- per-connection work (loop thread) ---------------------------------------------

    def _accept(self) -> tuple[bool, int | None]:
        with self._lock:
            self._connections += 1
            if self._drop_left > 0:
                self._drop_left -= 1
                self._dropped += 1
                return True, None
            if self._cut_left > 0:
                self._cut_left -= 1
                return False, self._cut_bytes
            return False, None

    def _take_request(self) -> _Verdict:
        """Count one request and decide its fate (see ``fail_requests_with``, ``throttle``)."""
        with self._lock:
            self._requests += 1
            self._request_times.append(time.monotonic())
            if self._fail_left is None or self._fail_left > 0:
                if self._fail_left is not None:
                    self._fail_left -= 1
                self._failed += 1
                return _Verdict("fail", _error_response(self._fail_status))
            throttle = self._throttle
            if throttle is None:
                return _FORWARD
            draw = throttle.rng.random()
            if draw < throttle.fail_fraction:
                self._failed += 1
                return _Verdict("fail", throttle.response)
            if draw < throttle.fail_fraction + throttle.reset_fraction:
                self._resets += 1
                return _RESET
            return _FORWARD

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._closing:
                return
            drop, cut_limit = self._accept()
            if not drop:
                await self._forward(creader, cwriter, cut_limit)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, _NotHttp):
            pass
        except asyncio.CancelledError:
            pass  # stop(): end quietly (Python 3.11's streams log a re-raised cancel)
        finally:
            self._tasks.discard(task)
            await _close(cwriter)

    async def _forward(
        self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter, cut_limit: int | None
    ) -> None:
        ureader, uwriter = await asyncio.open_connection(
            self.target_host, self.target_port, limit=_HEAD_LIMIT
        )
        with self._lock:
            shape = self._shape
            self._open += 1
            self._peak_open = max(self._peak_open, self._open)
        up_pacer = None if shape is None else _Pacer(shape)
        down_pacer = None if shape is None else _Pacer(shape)
        up = asyncio.create_task(self._client_to_server(creader, cwriter, uwriter, up_pacer))
        down = asyncio.create_task(self._server_to_client(ureader, cwriter, cut_limit, down_pacer))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            with self._lock:
                self._open -= 1
            # Close both sides before any await, so that a cancellation (stop()) arriving
            # during the awaits below cannot leave a transport open.
            uwriter.close()
            cwriter.close()
            up.cancel()
            down.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            await _close(uwriter)

    async def _client_to_server(
        self,
        creader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        uwriter: asyncio.StreamWriter,
        pacer: _Pacer | None = None,
    ) -> None:
        if pacer is not None:
            await pacer.delay()  # the handshake's round trip
        while True:
            try:
                raw = await creader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:  # client closed (maybe mid-head)
                uwriter.write(exc.partial)
                await uwriter.drain()
                return
            try:
                head = _parse_head(raw)
            except _NotHttp:
                uwriter.write(raw)
                await self._pipe_raw(creader, uwriter)
                return
            verdict = self._take_request()
            if verdict.action == "reset":
                _abort_with_rst(cwriter)
                return
            if verdict.action == "fail":
                if not head.expect_continue:
                    await _relay_body(creader, None, head)
                cwriter.write(verdict.response)
                await cwriter.drain()
                return
            if pacer is not None:
                await pacer.delay()
            await _paced_write(uwriter, raw, pacer)
            await _relay_body(creader, uwriter, head, pacer)
            await uwriter.drain()

    @staticmethod
    async def _pipe_raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()

    async def _server_to_client(
        self,
        ureader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        cut_limit: int | None,
        pacer: _Pacer | None = None,
    ) -> None:
        sent = 0
        while data := await ureader.read(_CHUNK):
            if pacer is not None:
                await pacer.carry(len(data))
            if cut_limit is not None and sent + len(data) >= cut_limit:
                cwriter.write(data[: cut_limit - sent])
                await cwriter.drain()
                with self._lock:
                    self._cut += 1
                return
            sent += len(data)
            cwriter.write(data)
            await cwriter.drain()
