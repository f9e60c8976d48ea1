"""An HTTP proxy that lets obstore's GCS client write to fake-gcs-server.

obstore (object_store 0.14) speaks GCS's XML API: reads are ``GET``/``HEAD
/bucket/object`` and ``GET /bucket?list-type=2``, which fake-gcs-server 1.54 serves;
writes are ``PUT /bucket/object`` (multipart: ``POST ?uploads``, ``PUT
?partNumber&uploadId``, ``POST ?uploadId``, ``DELETE ?uploadId``), which it answers
``400 invalid uploadType``. ``GcsXmlProxy(upstream)`` listens on 127.0.0.1 (an ephemeral
port) and in front of the server at ``upstream``:

* reads each request whole before acting on it: a request cut short (a client killed
  mid-upload) is dropped, never forwarded, so a write is all or nothing, as on GCS;
* passes every read and every ``DELETE /bucket/object`` through unchanged: method, path,
  query, headers (but ``Host`` and the hop-by-hop ones), status, headers and body back;
* turns ``PUT /bucket/object`` into the JSON API's upload (``POST
  /upload/storage/v1/b/BUCKET/o?uploadType=multipart``) with the same bytes, content
  type and ``x-goog-meta-*`` metadata, and the write's precondition as the server's own:
  ``x-goog-if-generation-match: N`` becomes ``ifGenerationMatch=N`` (``0`` for obstore's
  create-only put, the object's generation for its compare-and-swap). The server decides
  it, atomically under its lock; the proxy never compares anything. The reply is the XML
  API's: ``200`` with ``ETag`` (the server's e-tag, quoted as its ``HEAD`` quotes it) and
  ``x-goog-generation``; a refused upload keeps the server's status, with its reason as
  the XML API's ``<Error><Code>`` document (``412 PreconditionFailed``, ``404
  NoSuchBucket``: the upload's only 404);
* refuses, with ``501 NotImplemented`` and nothing forwarded, any request it does not
  translate, so nothing is half-done: a copy (``x-goog-copy-source``, which cairn never
  sends), and a write carrying any other precondition header (``If-Match``,
  ``x-goog-if-metageneration-match``...), which would otherwise be dropped unchecked.

Where it does more than translate, what is tested is obstore's client against this proxy,
not against the server:

* **Multipart uploads are assembled here.** The server has no XML multipart API, so the
  proxy keeps each upload's parts in memory, checks the completion's part list against
  the parts it stored (``400 InvalidPart`` otherwise), and uploads the concatenation as
  one object when obstore completes it (without precondition: obstore's multipart
  writes have none). Until then the object does not exist, as on GCS.
* **A listing of a missing bucket** is ``500`` from fake-gcs-server; GCS answers ``404``
  with ``<Code>NoSuchBucket</Code>``. When a listing fails, the proxy asks the server
  whether the bucket exists (``GET /storage/v1/b/BUCKET``) and, if the server says no,
  answers as GCS does. Any other failure passes through.

Counters (:meth:`GcsXmlProxy.stats`) say how many uploads the server received with each
precondition, so tests can check that the condition reached it.

Not supported: TLS, chunked request bodies larger than memory, copies, resumable uploads.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

__all__ = ["GcsProxyStats", "GcsXmlProxy"]

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

# Object attributes the XML API takes as request headers, by their JSON API names.
_ATTRIBUTE_HEADERS = {
    "content-type": "contentType",
    "cache-control": "cacheControl",
    "content-disposition": "contentDisposition",
    "content-encoding": "contentEncoding",
    "content-language": "contentLanguage",
    "x-goog-storage-class": "storageClass",
}
_META_PREFIX = "x-goog-meta-"
_GENERATION_MATCH = "x-goog-if-generation-match"
_UNTRANSLATED_CONDITIONS = (
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "x-goog-if-generation-not-match",
    "x-goog-if-metageneration-match",
    "x-goog-if-metageneration-not-match",
)

_ERROR_CODES = {400: "InvalidArgument", 404: "NoSuchBucket", 412: "PreconditionFailed"}


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    body = (
        "<?xml version='1.0' encoding='UTF-8'?>"
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
    ).encode()
    return status, {"Content-Type": "application/xml; charset=UTF-8"}, body


@dataclass
class GcsProxyStats:
    """What the proxy did: uploads sent to the server, by precondition, and passed reads."""

    uploads: int = 0
    create_only: int = 0  # with ifGenerationMatch=0
    generation_match: int = 0  # with ifGenerationMatch=N, N > 0
    refused: int = 0  # uploads the server refused (any 4xx/5xx)
    multipart_completed: int = 0
    passed_through: int = 0
    not_implemented: int = 0


@dataclass
class _Upload:
    bucket: str
    name: str
    attributes: dict[str, str]
    parts: dict[int, tuple[str, bytes]] = field(default_factory=dict)  # number -> (etag, data)


class GcsXmlProxy:
    """XML-API-to-JSON-API proxy on 127.0.0.1 in front of fake-gcs-server (module doc)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://host:port, got {upstream!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port
        self._lock = threading.Lock()
        self._uploads: dict[str, _Upload] = {}
        self._stats = GcsProxyStats()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("GcsXmlProxy is not started")
        port: int = self._server.server_address[1]
        return port

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: the ``gcs_base_url`` for obstore."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("GcsXmlProxy already started")
        server = _Server(("127.0.0.1", 0), _Handler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name=f"GcsXmlProxy->{self.upstream_port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and join the serving thread (idempotent)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stats(self) -> GcsProxyStats:
        """A snapshot of the counters."""
        with self._lock:
            return GcsProxyStats(**vars(self._stats))

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self._stats, name, getattr(self._stats, name) + 1)

    # -- talking to the server ---------------------------------------------------------

    def upstream(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """One request to the server on a new connection: status, headers, whole body."""
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        try:
            conn.request(method, target, body=body, headers=dict(headers))
            response = conn.getresponse()
            data = b"" if method == "HEAD" else response.read()
            return response.status, response.getheaders(), data
        finally:
            conn.close()

    def upload(
        self, bucket: str, name: str, attributes: Mapping[str, str], data: bytes, generation: str
    ) -> tuple[int, dict[str, str], bytes]:
        """Upload ``data`` through the JSON API, with ``ifGenerationMatch=generation``
        unless it is empty; the XML API's reply to a ``PUT``."""
        metadata: dict[str, object] = {"name": name}
        user = {}
        for header, value in attributes.items():
            if header.startswith(_META_PREFIX):
                user[header.removeprefix(_META_PREFIX)] = value
            elif header in _ATTRIBUTE_HEADERS:
                metadata[_ATTRIBUTE_HEADERS[header]] = value
        if user:
            metadata["metadata"] = user
        boundary = uuid.uuid4().hex
        while boundary.encode() in data:
            boundary = uuid.uuid4().hex
        content_type = attributes.get("content-type", "application/octet-stream")
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                json.dumps(metadata).encode(),
                f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        query = f"uploadType=multipart&name={quote(name, safe='')}"
        if generation:
            query += f"&ifGenerationMatch={quote(generation, safe='')}"
        self._count("uploads")
        if generation == "0":
            self._count("create_only")
        elif generation:
            self._count("generation_match")
        status, _, reply = self.upstream(
            "POST",
            f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?{query}",
            {"Content-Type": f"multipart/related; boundary={boundary}"},
            body,
        )
        if status >= 300:
            self._count("refused")
            try:
                message = str(json.loads(reply)["error"]["message"])
            except (ValueError, KeyError, TypeError):
                message = reply.decode(errors="replace")[:500]
            return _error(status, _ERROR_CODES.get(status, "InternalError"), message)
        resource = json.loads(reply)
        headers = {
            "ETag": f'"{resource["etag"]}"',
            "x-goog-generation": str(resource["generation"]),
            "x-goog-metageneration": str(resource.get("metageneration", "1")),
        }
        return 200, headers, b""

    # -- multipart uploads, assembled here --------------------------------------------

    def initiate(self, bucket: str, name: str, attributes: dict[str, str]) -> bytes:
        upload_id = uuid.uuid4().hex
        with self._lock:
            self._uploads[upload_id] = _Upload(bucket, name, attributes)
        return (
            "<?xml version='1.0' encoding='UTF-8'?><InitiateMultipartUploadResult>"
            f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(name)}</Key>"
            f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>"
        ).encode()

    def put_part(self, upload_id: str, number: int, data: bytes) -> str | None:
        """Store one part; its e-tag, or None for an unknown upload."""
        etag = f'"{uuid.uuid4().hex}"'
        with self._lock:
            upload = self._uploads.get(upload_id)
            if upload is None:
                return None
            upload.parts[number] = (etag, data)
        return etag

    def complete(self, upload_id: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        try:
            listed = [
                (int(part.findtext("PartNumber") or ""), part.findtext("ETag") or "")
                for part in ET.fromstring(body).iter("Part")
            ]
        except (ET.ParseError, ValueError):
            return _error(400, "MalformedXML", "the part list is not valid XML")
        with self._lock:
            upload = self._uploads.get(upload_id)
            if upload is None:
                return _error(404, "NoSuchUpload", f"no upload {upload_id}")
            chunks = []
            for number, etag in listed:
                stored = upload.parts.get(number)
                if stored is None or stored[0] != etag:
                    return _error(400, "InvalidPart", f"part {number} ({etag}) was not uploaded")
                chunks.append(stored[1])
        status, headers, reply = self.upload(
            upload.bucket, upload.name, upload.attributes, b"".join(chunks), ""
        )
        if status != 200:
            return status, headers, reply
        with self._lock:
            self._uploads.pop(upload_id, None)
            self._stats.multipart_completed += 1
        document = (
            "<?xml version='1.0' encoding='UTF-8'?><CompleteMultipartUploadResult>"
            f"<Bucket>{escape(upload.bucket)}</Bucket><Key>{escape(upload.name)}</Key>"
            f"<ETag>{escape(headers['ETag'])}</ETag></CompleteMultipartUploadResult>"
        ).encode()
        return 200, {"x-goog-generation": headers["x-goog-generation"]}, document

    def abort(self, upload_id: str) -> bool:
        with self._lock:
            return self._uploads.pop(upload_id, None) is not None

    def bucket_exists(self, bucket: str) -> bool | None:
        """Whether the server has ``bucket`` (None if its answer says neither)."""
        status, _, _ = self.upstream("GET", f"/storage/v1/b/{quote(bucket, safe='')}", {}, None)
        return True if status == 200 else False if status == 404 else None


class _Truncated(Exception):
    """The client closed its connection before the end of the request body."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: GcsXmlProxy

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away (killed, reset): nothing to report
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    """One client connection (keep-alive): each request translated or passed through."""

    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a reply in two segments would wait for a delayed ACK

    @property
    def owner(self) -> GcsXmlProxy:
        return self.server.proxy

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the tests report what matters

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _body(self) -> bytes:
        """The whole request body; :class:`_Truncated` if the client stopped sending."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                line = self.rfile.readline()
                if not line:
                    raise _Truncated
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    break
                chunks.append(self._exactly(size))
                self._exactly(2)  # the chunk's CRLF
            while (line := self.rfile.readline()) not in (b"\r\n", b"\n"):
                if not line:
                    raise _Truncated  # trailers cut short
            return b"".join(chunks)
        return self._exactly(int(self.headers.get("Content-Length") or 0))

    def _exactly(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) != n:
            raise _Truncated
        return data

    def _reply(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _dispatch(self) -> None:
        owner = self.owner
        try:
            body = self._body() if self.command in ("PUT", "POST", "DELETE") else b""
        except _Truncated:
            # A client that died mid-request: forward nothing (a PUT is all or nothing).
            self.close_connection = True
            return
        split = urlsplit(self.path)
        query = parse_qs(split.query, keep_blank_values=True)
        bucket, _, encoded_name = split.path.lstrip("/").partition("/")
        bucket, name = unquote(bucket), unquote(encoded_name)
        headers = {key.lower(): value for key, value in self.headers.items()}
        method = self.command
        if method in ("GET", "HEAD") or (method == "DELETE" and "uploadId" not in query):
            self._pass_through(body, bucket, listing=method == "GET" and not name)
            return
        if not bucket or not name or "x-goog-copy-source" in headers:
            owner._count("not_implemented")
            self._reply(*_error(501, "NotImplemented", f"{method} {split.path} is not translated"))
            return
        if method == "PUT" and not query:
            present = [h for h in _UNTRANSLATED_CONDITIONS if h in headers]
            if present:
                owner._count("not_implemented")
                self._reply(*_error(501, "NotImplemented", f"untranslated condition {present}"))
                return
            generation = headers.get(_GENERATION_MATCH, "")
            self._reply(*owner.upload(bucket, name, _attributes(headers), body, generation))
        elif method == "POST" and "uploads" in query:
            document = owner.initiate(bucket, name, _attributes(headers))
            self._reply(200, {"Content-Type": "application/xml"}, document)
        elif method == "PUT" and "uploadId" in query and "partNumber" in query:
            etag = owner.put_part(query["uploadId"][0], int(query["partNumber"][0]), body)
            if etag is None:
                self._reply(*_error(404, "NoSuchUpload", "no such upload"))
            else:
                self._reply(200, {"ETag": etag}, b"")
        elif method == "POST" and "uploadId" in query:
            self._reply(*owner.complete(query["uploadId"][0], body))
        elif method == "DELETE":
            found = owner.abort(query["uploadId"][0])
            self._reply(*((204, {}, b"") if found else _error(404, "NoSuchUpload", "no upload")))
        else:
            owner._count("not_implemented")
            self._reply(*_error(501, "NotImplemented", f"{method} {self.path} is not translated"))

    def _pass_through(self, body: bytes, bucket: str, *, listing: bool) -> None:
        owner = self.owner
        forwarded = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        status, headers, data = owner.upstream(self.command, self.path, forwarded, body or None)
        owner._count("passed_through")
        if listing and status >= 500 and owner.bucket_exists(bucket) is False:
            message = "The specified bucket does not exist."
            self._reply(*_error(404, "NoSuchBucket", message))
            return
        self.send_response(status)
        length = None
        for name, value in headers:
            if name.lower() == "content-length":
                length = value
            elif name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        # A HEAD's Content-Length is the object's size, not the (empty) body's.
        self.send_header(
            "Content-Length", length if self.command == "HEAD" and length else str(len(data))
        )
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _attributes(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a write that become the object's attributes."""
    return {
        name: value
        for name, value in headers.items()
        if name in _ATTRIBUTE_HEADERS or name.startswith(_META_PREFIX)
    }
