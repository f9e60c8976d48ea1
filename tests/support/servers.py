"""Local object-store servers for tests: moto (S3) and Azurite (Azure Blob), as subprocesses.

Each server binds 127.0.0.1 on a free port, logs into a private temporary directory,
and is ready (answers HTTP) when ``start()`` returns; otherwise ``start()`` raises
``ServerStartError`` with the server's captured output (after retrying twice on a port
lost to a race). ``stop()`` terminates it (kills it after 5 s) and is idempotent. Both
are context managers.

What obstore 0.12.1 gets from these servers (checked against moto 5.2.5 and Azurite
3.35.0; ``tests/test_support.py`` keeps checking it):

* Both: put, get, list, list_with_delimiter, head and delete work path-style over
  plain HTTP. ``put(mode="create")`` (``If-None-Match: *``) raises
  ``AlreadyExistsError`` when the key exists; ``put(mode={"e_tag": ...})``
  (``If-Match``) raises ``PreconditionError`` on a stale etag, and also when the key
  does not exist. A missing key raises the builtin ``FileNotFoundError`` (obstore's
  ``NotFoundError`` is deprecated and never raised).
* Deleting a missing key: a no-op on moto, ``FileNotFoundError`` on Azurite.
* moto: ``conditional_put="etag"`` is obstore's default, so it is not required; the
  options below set it anyway, to say what the tests rely on. Buckets are created
  with an unsigned ``PUT /bucket`` (moto checks no signature; dummy credentials do).
  moto answers every request with ``Connection: close``: each request is a new
  connection. Azurite keeps connections alive (5 s).
* Azurite: obstore's ``use_emulator`` is *not* used: in that mode object_store ignores
  ``endpoint`` and reads the URL from the process-wide ``AZURITE_BLOB_STORAGE_URL``.
  The options give ``endpoint=http://127.0.0.1:PORT/devstoreaccount1`` (path-style
  account URL) and the well-known emulator account and key instead. Azurite rejects
  anonymous requests even with ``--loose``, so containers are created here with a
  request signed by Shared Key (no Azure SDK needed). It runs with
  ``--disableTelemetry``: otherwise it tries to reach an outside telemetry host and
  its shutdown stalls. ``--location`` is not passed (Azurite >= 3.37 refuses it with
  ``--inMemoryPersistence``); its working directory is a temporary one instead.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from email.utils import formatdate
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self, TypedDict
from urllib.parse import quote

if TYPE_CHECKING:
    from obstore.store import ClientConfig

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_BLOB_BIN",
    "AZURITE_KEY",
    "REPO_ROOT",
    "AzureOptions",
    "AzuriteServer",
    "S3Options",
    "S3Server",
    "ServerStartError",
    "azure_store_options",
    "free_port",
    "s3_store_options",
    "unique_name",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE_BLOB_BIN = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"

S3_REGION = "us-east-1"
S3_ACCESS_KEY_ID = "testing"
S3_SECRET_ACCESS_KEY = "testing"

AZURITE_ACCOUNT = "devstoreaccount1"
# The emulator's published, well-known key (not a secret).
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


class ServerStartError(RuntimeError):
    """A test server did not come up; the message carries its output."""


class S3Options(TypedDict):
    """Keyword arguments for ``S3Store(bucket, **opts)`` / ``from_url("s3://b/p", **opts)``."""

    endpoint: str
    access_key_id: str
    secret_access_key: str
    region: str
    virtual_hosted_style_request: bool
    conditional_put: str
    client_options: ClientConfig


class AzureOptions(TypedDict):
    """Keyword arguments for ``AzureStore(container_name, **opts)`` / ``from_url("az://c/p")``."""

    endpoint: str
    account_name: str
    account_key: str
    client_options: ClientConfig


def s3_store_options(endpoint: str | S3Server) -> S3Options:
    """obstore options for a moto server, or a proxy in front of one, at ``http://host:port``."""
    return S3Options(
        endpoint=endpoint if isinstance(endpoint, str) else endpoint.endpoint,
        access_key_id=S3_ACCESS_KEY_ID,
        secret_access_key=S3_SECRET_ACCESS_KEY,
        region=S3_REGION,
        virtual_hosted_style_request=False,
        conditional_put="etag",
        client_options={"allow_http": True},
    )


def azure_store_options(endpoint: str | AzuriteServer) -> AzureOptions:
    """obstore options for Azurite, or a proxy in front of it, at ``http://host:port``.

    The obstore ``endpoint`` is the path-style account URL ``http://host:port/devstoreaccount1``.
    """
    root = endpoint if isinstance(endpoint, str) else endpoint.endpoint
    return AzureOptions(
        endpoint=f"{root.rstrip('/')}/{AZURITE_ACCOUNT}",
        account_name=AZURITE_ACCOUNT,
        account_key=AZURITE_KEY,
        client_options={"allow_http": True},
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unique_name(hint: str = "") -> str:
    """A fresh name valid as both an S3 bucket and an Azure container (3-63 chars)."""
    base = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", hint.lower()))[:40].strip("-")
    return f"{base or 't'}-{uuid.uuid4().hex[:12]}"


def _http(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class _ServerProcess:
    """Start/stop/readiness shared by the servers; subclasses give the command line."""

    name = "server"

    def __init__(self, *, startup_timeout: float = 20.0) -> None:
        self.startup_timeout = startup_timeout
        self.startup_seconds = 0.0
        self._port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._log: IO[bytes] | None = None

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError(f"{self.name} server is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        """What the server printed so far (stdout and stderr, merged)."""
        if self._workdir is None:
            return ""
        path = Path(self._workdir.name) / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> Self:
        if self._proc is not None:
            raise RuntimeError(f"{self.name} server already started")
        began = time.monotonic()
        deadline = began + self.startup_timeout
        for _attempt in range(3):
            port = free_port()
            self._workdir = tempfile.TemporaryDirectory(prefix=f"cairn-{self.name}-")
            self._log = (Path(self._workdir.name) / "server.log").open("wb")
            self._proc = subprocess.Popen(
                self._command(port),
                cwd=self._workdir.name,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            state = self._wait_ready(self._proc, port, deadline)
            if state == "ready":
                self._port = port
                self.startup_seconds = time.monotonic() - began
                return self
            output = self.log_text()
            code = self._proc.poll()
            self.stop()
            if state == "exited" and re.search("EADDRINUSE|Address already in use", output):
                continue  # lost the race for the port: try another one
            what = f"exited with code {code}" if state == "exited" else "did not answer HTTP"
            raise ServerStartError(
                f"{self.name} server on 127.0.0.1:{port} {what} within "
                f"{self.startup_timeout:.0f}s; its output:\n{output[-8000:]}"
            )
        raise ServerStartError(f"{self.name} server: no free port after 3 attempts")

    @staticmethod
    def _wait_ready(proc: subprocess.Popen[bytes], port: int, deadline: float) -> str:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return "exited"
            try:
                _http(port, "GET", "/", timeout=1.0)  # any HTTP answer, even an error, will do
            except OSError:
                time.sleep(0.05)
            else:
                return "ready" if proc.poll() is None else "exited"
        return "timeout"

    def stop(self) -> None:
        """Terminate the server (kill after 5 s) and remove its temporary directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
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


class S3Server(_ServerProcess):
    """moto's standalone server (``python -m moto.server``) from this interpreter's env."""

    name = "moto"

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    def store_options(self) -> S3Options:
        return s3_store_options(self.endpoint)

    def create_bucket(self, name: str) -> None:
        status, body = _http(self.port, "PUT", f"/{quote(name)}", {"Content-Length": "0"})
        if status != 200:
            raise RuntimeError(f"create_bucket({name!r}): HTTP {status}: {body[:500]!r}")

    def reset(self) -> None:
        """Forget every bucket and object (moto's ``POST /moto-api/reset``)."""
        status, body = _http(self.port, "POST", "/moto-api/reset", {"Content-Length": "0"})
        if status != 200:
            raise RuntimeError(f"moto reset: HTTP {status}: {body[:500]!r}")


class AzuriteServer(_ServerProcess):
    """Azurite's blob service, in memory, from ``node_modules/.bin`` under the repo root."""

    name = "azurite"

    def __init__(
        self, *, executable: Path = AZURITE_BLOB_BIN, startup_timeout: float = 20.0
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.executable = executable

    def _command(self, port: int) -> list[str]:
        return [
            str(self.executable),
            "--inMemoryPersistence",
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
            "--disableTelemetry",
            "--disableProductStyleUrl",
        ]

    def start(self) -> Self:
        if not self.executable.exists():
            raise ServerStartError(
                f"{self.executable} is missing: run `npm ci` in {REPO_ROOT} to install Azurite"
            )
        if shutil.which("node") is None:
            raise ServerStartError("Azurite needs Node.js, and `node` is not on PATH")
        return super().start()

    def store_options(self) -> AzureOptions:
        return azure_store_options(self.endpoint)

    def create_container(self, name: str) -> None:
        status, body = self._signed("PUT", f"/{AZURITE_ACCOUNT}/{name}", {"restype": "container"})
        if status != 201:
            raise RuntimeError(f"create_container({name!r}): HTTP {status}: {body[:500]!r}")

    def _signed(self, method: str, path: str, query: dict[str, str]) -> tuple[int, bytes]:
        """A body-less request signed with Shared Key as the emulator account."""
        headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
        canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        canonical_resource = f"/{AZURITE_ACCOUNT}{path}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(query.items())
        )
        # VERB, then the 11 standard headers (all empty here), then x-ms-*, then resource.
        to_sign = method + "\n" * 12 + canonical_headers + canonical_resource
        digest = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256)
        headers["Authorization"] = (
            f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(digest.digest()).decode()}"
        )
        headers["Content-Length"] = "0"
        query_string = "&".join(f"{k}={quote(v)}" for k, v in query.items())
        return _http(self.port, method, f"{path}?{query_string}", headers)
