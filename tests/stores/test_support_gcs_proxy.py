"""Tests of the GCS test support: fake-gcs-server, and the proxy that translates writes.

Checked through obstore's own GCS client (what cairn sends) and through raw HTTP to the
proxy and to the server: the preconditions reach the server and are decided there; what
the proxy cannot translate is refused, never dropped; multipart uploads are assembled
whole or not at all; reads come back as the server sent them.
"""

from __future__ import annotations

import http.client
import json
import platform
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, GenericError, PreconditionError
from obstore.store import GCSStore
from support.servers import (
    GcsServer,
    ServerUnavailableError,
    fake_gcs_binary,
    gcs_store_options,
)

DATA = bytes(range(256)) * 4096  # 1 MiB holding every byte value


def _store(server: GcsServer, bucket: str) -> GCSStore:
    return GCSStore(bucket, **gcs_store_options(server))


def _request(
    endpoint: str,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, dict[str, str], bytes]:
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, target, body=body or None, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_obstore_reads_writes_and_conditional_writes(
    gcs_server: GcsServer, gcs_bucket: str
) -> None:
    store = _store(gcs_server, gcs_bucket)
    before = gcs_server.proxy.stats()
    first = obstore.put(store, "dir/a b.bin", DATA, attributes={"sha256": "x"})
    got = obstore.get(store, "dir/a b.bin")
    assert got.bytes().to_bytes() == DATA
    assert got.attributes.get("sha256") == "x"
    meta = obstore.head(store, "dir/a b.bin")
    assert (meta["e_tag"], meta["version"]) == (first["e_tag"], first["version"])
    assert str(meta["e_tag"]).startswith('"') and meta["size"] == len(DATA)
    assert obstore.get_range(store, "dir/a b.bin", start=10, end=20).to_bytes() == DATA[10:20]

    obstore.put(store, "once", b"1", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "once", b"2", mode="create")
    second = obstore.put(store, "dir/a b.bin", b"v2", mode=_swap(first))
    with pytest.raises(PreconditionError):
        obstore.put(store, "dir/a b.bin", b"v3", mode=_swap(first))
    with pytest.raises(PreconditionError):
        obstore.put(store, "absent", b"x", mode=_swap(second))
    assert obstore.get(store, "dir/a b.bin").bytes().to_bytes() == b"v2"
    assert obstore.get(store, "once").bytes().to_bytes() == b"1"
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "absent")

    after = gcs_server.proxy.stats()
    assert after.create_only - before.create_only == 2
    assert after.generation_match - before.generation_match == 3
    assert after.refused - before.refused == 3
    obstore.delete(store, "once")
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "once")


def _swap(result: Any) -> Any:
    return {"e_tag": result["e_tag"], "version": result["version"]}


def test_listings_are_the_servers_with_unquoted_e_tags(
    gcs_server: GcsServer, gcs_bucket: str
) -> None:
    """fake-gcs-server lists e-tags without the quotes of its HEAD (GCS lists them quoted;
    cairn's adapter quotes them): the proxy passes the listing through as it is."""
    store = _store(gcs_server, gcs_bucket)
    obstore.put(store, "p/a", b"1")
    obstore.put(store, "p/q/b", b"22")
    obstore.put(store, "top", b"333")
    listed = {m["path"]: m for batch in obstore.list(store) for m in batch}
    assert sorted(listed) == ["p/a", "p/q/b", "top"]
    head = obstore.head(store, "p/a")
    assert f'"{listed["p/a"]["e_tag"]}"' == head["e_tag"]
    assert listed["p/a"]["version"] is None  # object_store reads no generation from a listing
    level = obstore.list_with_delimiter(store, "p")
    assert level["common_prefixes"] == ["p/q"]
    assert [m["path"] for m in level["objects"]] == ["p/a"]


def test_the_server_decides_every_precondition(gcs_server: GcsServer, gcs_bucket: str) -> None:
    """A stale generation sent straight to the proxy is refused by the server (its JSON
    upload alone enforces it), with the XML API's error document; nothing changes."""
    store = _store(gcs_server, gcs_bucket)
    v1 = obstore.put(store, "k", b"v1")
    v2 = obstore.put(store, "k", b"v2")
    target = f"/{gcs_bucket}/k"
    stale = {"x-goog-if-generation-match": str(v1["version"]), "Content-Type": "text/plain"}
    status, _, body = _request(gcs_server.endpoint, "PUT", target, stale, b"v3")
    assert status == 412 and b"<Code>PreconditionFailed</Code>" in body
    # The same upload straight to the server, bypassing the proxy: the same refusal.
    upload = f"/upload/storage/v1/b/{gcs_bucket}/o?uploadType=media&name=k"
    status, _, _ = _request(gcs_server.server_endpoint, "POST", upload, {}, b"media ignores it")
    assert status == 200, "uploadType=media does not check preconditions: the proxy avoids it"
    current = obstore.head(store, "k")
    status, headers, _ = _request(
        gcs_server.endpoint,
        "PUT",
        target,
        {"x-goog-if-generation-match": str(current["version"])},
        b"v4",
    )
    assert status == 200
    assert headers["x-goog-generation"] == obstore.head(store, "k")["version"] != v2["version"]
    assert headers["etag"] == obstore.head(store, "k")["e_tag"]
    assert obstore.get(store, "k").bytes().to_bytes() == b"v4"


@pytest.mark.parametrize(
    "headers",
    [
        {"If-Match": '"abc"'},
        {"If-None-Match": "*"},
        {"x-goog-if-metageneration-match": "1"},
        {"x-goog-if-generation-not-match": "0"},
        {"x-goog-copy-source": "bucket/other"},
    ],
)
def test_what_is_not_translated_is_refused_and_writes_nothing(
    gcs_server: GcsServer, gcs_bucket: str, headers: dict[str, str]
) -> None:
    status, _, body = _request(gcs_server.endpoint, "PUT", f"/{gcs_bucket}/k", headers, b"x")
    assert status == 501 and b"<Code>NotImplemented</Code>" in body
    with pytest.raises(FileNotFoundError):
        obstore.head(_store(gcs_server, gcs_bucket), "k")


async def test_multipart_uploads_are_assembled_whole(
    gcs_server: GcsServer, gcs_bucket: str
) -> None:
    store = _store(gcs_server, gcs_bucket)
    parts = [DATA * 6, DATA * 3, b"tail"]  # 6 MiB, 3 MiB, 4 bytes

    async def chunks() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    before = gcs_server.proxy.stats().multipart_completed
    await obstore.put_async(
        store, "big", chunks(), chunk_size=5 * 2**20, attributes={"sha256": "y"}
    )
    got = await obstore.get_async(store, "big")
    assert (await got.bytes_async()).to_bytes() == b"".join(parts)
    assert got.attributes.get("sha256") == "y"
    assert gcs_server.proxy.stats().multipart_completed == before + 1

    # An empty stream: object_store aborts the upload and puts an empty object.
    async def nothing() -> AsyncIterator[bytes]:
        empty: list[bytes] = []
        for part in empty:
            yield part

    await obstore.put_async(store, "empty", nothing(), chunk_size=5 * 2**20)
    assert (await obstore.head_async(store, "empty"))["size"] == 0


def test_multipart_completion_checks_the_parts(gcs_server: GcsServer, gcs_bucket: str) -> None:
    endpoint, target = gcs_server.endpoint, f"/{gcs_bucket}/mp"
    status, _, body = _request(endpoint, "POST", f"{target}?uploads")
    assert status == 200
    upload_id = body.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
    status, headers, _ = _request(
        endpoint, "PUT", f"{target}?partNumber=1&uploadId={upload_id}", {}, b"part one"
    )
    assert status == 200
    etag = headers["etag"]
    store = _store(gcs_server, gcs_bucket)
    with pytest.raises(FileNotFoundError):  # nothing exists before completion
        obstore.head(store, "mp")
    wrong = (
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>"
        '<ETag>"x"</ETag></Part></CompleteMultipartUpload>'
    )
    status, _, body = _request(
        endpoint, "POST", f"{target}?uploadId={upload_id}", {}, wrong.encode()
    )
    assert status == 400 and b"InvalidPart" in body
    right = wrong.replace('"x"', etag)
    status, headers, body = _request(
        endpoint, "POST", f"{target}?uploadId={upload_id}", {}, right.encode()
    )
    assert status == 200 and b"<ETag>" in body and headers["x-goog-generation"]
    assert obstore.get(store, "mp").bytes().to_bytes() == b"part one"
    # Completed uploads are gone; aborting an unknown one is 404.
    status, _, _ = _request(endpoint, "POST", f"{target}?uploadId={upload_id}", {}, right.encode())
    assert status == 404
    assert _request(endpoint, "DELETE", f"{target}?uploadId={upload_id}")[0] == 404


def test_a_missing_bucket_is_no_such_bucket(gcs_server: GcsServer) -> None:
    """The server answers a listing of a missing bucket with 500; GCS (and so the proxy,
    once the server confirmed the bucket is missing) with 404 NoSuchBucket."""
    status, _, body = _request(gcs_server.server_endpoint, "GET", "/no-such-bucket?list-type=2")
    assert status == 500, "fake-gcs-server's own answer changed: revisit the proxy"
    status, _, body = _request(gcs_server.endpoint, "GET", "/no-such-bucket?list-type=2")
    assert status == 404 and b"<Code>NoSuchBucket</Code>" in body
    status, _, body = _request(gcs_server.endpoint, "PUT", "/no-such-bucket/k", {}, b"x")
    assert status == 404 and b"<Code>NoSuchBucket</Code>" in body
    store = GCSStore("no-such-bucket", **gcs_store_options(gcs_server), retry_config=_NO_RETRY)
    with pytest.raises(GenericError, match="NoSuchBucket"):
        list(obstore.list(store))


_NO_RETRY: Any = {"max_retries": 0}


def test_requests_share_keep_alive_connections(gcs_server: GcsServer, gcs_bucket: str) -> None:
    host, port = gcs_server.endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        for i in range(5):
            conn.request("PUT", f"/{gcs_bucket}/k{i}", body=f"v{i}".encode())
            response = conn.getresponse()
            assert response.status == 200 and response.read() == b""
            conn.request("HEAD", f"/{gcs_bucket}/k{i}")
            response = conn.getresponse()
            response.read()
            assert response.getheader("Content-Length") == "2"
    finally:
        conn.close()


def test_bucket_creation_and_json_api(gcs_server: GcsServer, gcs_bucket: str) -> None:
    status, _, body = _request(gcs_server.server_endpoint, "GET", f"/storage/v1/b/{gcs_bucket}")
    assert status == 200 and json.loads(body)["name"] == gcs_bucket
    with pytest.raises(RuntimeError, match="create_bucket"):
        gcs_server.create_bucket(gcs_bucket)  # it exists


# -- finding and starting the binary ----------------------------------------------------


def test_no_binary_for_this_platform_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "sparc64")
    with pytest.raises(ServerUnavailableError, match="no binary for linux/sparc64|sparc64"):
        fake_gcs_binary()


def test_a_binary_this_os_cannot_run_is_unavailable(tmp_path: Path) -> None:
    binary = tmp_path / "fake-gcs-server"
    binary.write_bytes(b"\x00not an executable format\x00")
    binary.chmod(0o755)
    with pytest.raises(ServerUnavailableError, match="cannot run on this machine"):
        GcsServer(executable=binary).start()


def test_the_installed_binary_serves(gcs_server: GcsServer) -> None:
    assert fake_gcs_binary().is_file()
    assert gcs_server.endpoint != gcs_server.server_endpoint
    status, _, _ = _request(gcs_server.server_endpoint, "GET", "/storage/v1/b")
    assert status == 200


def test_stop_is_idempotent_and_closes_the_proxy(gcs_server: GcsServer) -> None:
    """A second server beside the session's (which, where it cannot run, skips this)."""
    server = GcsServer().start()
    endpoint = server.endpoint
    server.stop()
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        _request(endpoint, "GET", "/")


def test_a_write_cut_short_is_never_forwarded(gcs_server: GcsServer, gcs_bucket: str) -> None:
    host, port = gcs_server.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = f"PUT /{gcs_bucket}/cut HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        sock.sendall(head.encode() + b"only part of the body")
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100) == b""  # closed without an answer
    with pytest.raises(FileNotFoundError):
        obstore.head(_store(gcs_server, gcs_bucket), "cut")
