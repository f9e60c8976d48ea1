"""A bucket or container that does not exist, and credentials that are missing, raise
one typed error each from every operation, against real servers on loopback: moto (S3),
Azurite (Azure Blob) and fake-gcs-server (GCS)."""

from __future__ import annotations

import datetime as dt
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obstore.exceptions import GenericError
from obstore.store import AzureStore, GCSStore, ObjectStore, S3Store
from support.servers import (
    AzuriteServer,
    GcsServer,
    S3Server,
    azure_store_options,
    free_port,
    gcs_store_options,
    s3_store_options,
    unique_name,
)

from cairn import (
    CheckpointData,
    CheckpointNotFoundError,
    IntegrityMismatchError,
    ObjectNotFoundError,
    ObjectStoreCheckpointer,
    RetryPolicy,
    StoreCredentialsError,
    StoreError,
    StoreNotFoundError,
    TransientStoreError,
    open_store,
)
from cairn.stores import explain_store_error, translate_error

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

DATA = CheckpointData(epoch=1, snapshots={("op", 0): b"state"})

FAST = RetryPolicy(attempts=1)

NO_RETRY: RetryConfig = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=2)}

QUICK: ClientConfig = {
    "allow_http": True,
    "connect_timeout": dt.timedelta(milliseconds=300),
    "timeout": dt.timedelta(seconds=2),
}


@pytest.fixture(params=["s3", "azure", "gcs"])
def missing(request: pytest.FixtureRequest) -> tuple[ObjectStore, str, str]:
    """A store on a real server whose bucket (or container) does not exist, what the
    service calls it, and its name."""
    name = unique_name("missing")
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return S3Store(name, **s3_store_options(server)), "bucket", name
    if request.param == "azure":
        azurite: AzuriteServer = request.getfixturevalue("azurite_server")
        return AzureStore(name, **azure_store_options(azurite)), "container", name
    gcs: GcsServer = request.getfixturevalue("gcs_server")
    return GCSStore(name, **gcs_store_options(gcs)), "bucket", name


def check_missing(error: StoreNotFoundError, kind: str, name: str) -> None:
    assert type(error) is StoreNotFoundError
    assert not isinstance(error, CheckpointNotFoundError | TransientStoreError)
    assert (error.kind, error.name, error.status) == (kind, name, 404)
    assert error.code in ("NoSuchBucket", "ContainerNotFound")
    text = str(error)
    assert text.startswith(f"the {kind} {name!r} does not exist (the store answered 404 ")
    assert text.endswith(f"create it, or correct the {kind} name in the store URL")
    assert "<?xml" not in text and "\n" not in text
    assert explain_store_error(error) == text
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is StoreNotFoundError and str(again) == text and again.name == name


async def test_save_into_a_missing_bucket_names_it(missing: tuple[ObjectStore, str, str]) -> None:
    store, kind, name = missing
    ckpt = ObjectStoreCheckpointer(store, retry=FAST)
    with pytest.raises(StoreNotFoundError) as info:
        await ckpt.save(DATA)
    check_missing(info.value, kind, name)


async def test_load_latest_from_a_missing_bucket_names_it(
    missing: tuple[ObjectStore, str, str],
) -> None:
    store, kind, name = missing
    ckpt = ObjectStoreCheckpointer(store, retry=FAST)
    with pytest.raises(StoreNotFoundError) as info:
        await ckpt.load_latest()
    check_missing(info.value, kind, name)
    with pytest.raises(StoreNotFoundError) as listed:
        await ckpt.list_checkpoints()
    check_missing(listed.value, kind, name)


async def test_a_missing_bucket_behind_a_url_prefix_is_named(s3_server: S3Server) -> None:
    name = unique_name("missing")
    options = s3_store_options(s3_server)
    store = open_store(f"s3://{name}/jobs/wordcount", **options)
    with pytest.raises(StoreNotFoundError) as info:
        await ObjectStoreCheckpointer(store, retry=FAST).save(DATA)
    check_missing(info.value, "bucket", name)


async def test_an_existing_bucket_still_reports_absent_objects_as_absent(
    s3_server: S3Server, s3_bucket: str
) -> None:
    ckpt = ObjectStoreCheckpointer(S3Store(s3_bucket, **s3_store_options(s3_server)))
    assert await ckpt.load_latest() is None
    with pytest.raises(CheckpointNotFoundError) as info:
        await ckpt.load_artifact("checkpoints/nothing-here")
    assert not isinstance(info.value, StoreNotFoundError)


def test_an_azure_url_without_an_account_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_ACCOUNT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    for url in ("az://container", "az://container/prefix"):
        with pytest.raises(StoreCredentialsError) as info:
            open_store(url)
        error = info.value
        assert error.store == "Azure" and "AZURE_STORAGE_ACCOUNT_NAME" in error.remedy
        assert str(error).startswith("no Azure storage account is configured; set ")
        assert "Account must be specified" not in str(error)
        with pytest.raises(StoreCredentialsError):
            ObjectStoreCheckpointer(url)


@pytest.fixture
def off_google_cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """No GCS credentials anywhere, and a metadata server that refuses at once."""
    for name in (
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud default credentials
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("GCE_METADATA_HOST", dead)
    monkeypatch.setenv("GCE_METADATA_IP", dead)
    return dead


@pytest.mark.timeout(60)
async def test_missing_gcs_credentials_say_what_to_set_on_save_and_load(
    off_google_cloud: str, gcs_server: GcsServer, gcs_bucket: str
) -> None:
    store = GCSStore(
        gcs_bucket, base_url=gcs_server.endpoint, retry_config=NO_RETRY, client_options=QUICK
    )
    ckpt = ObjectStoreCheckpointer(store, retry=FAST)
    for operation in (ckpt.save(DATA), ckpt.load_latest()):
        with pytest.raises(StoreCredentialsError) as info:
            await operation
        error = info.value
        assert isinstance(error, StoreError) and not isinstance(error, TransientStoreError)
        assert error.store == "GCS" and "GOOGLE_SERVICE_ACCOUNT" in error.remedy
        text = str(error)
        assert text.startswith(
            f"no GCS credentials are configured, and the GCE metadata server "
            f"({off_google_cloud}, only on Google Cloud) gave no token: no answer (connect "
            "failed) to "
        ), text
        assert "169.254.169.254" not in text and "Error performing" not in text
        assert str(pickle.loads(pickle.dumps(error))) == text


@pytest.mark.timeout(60)
async def test_a_non_routable_metadata_server_fails_fast(
    monkeypatch: pytest.MonkeyPatch, off_google_cloud: str
) -> None:
    """A metadata address nobody answers (TEST-NET-1): tiny timeouts and no retries
    bound the wait; the error is still the typed one."""
    del off_google_cloud
    monkeypatch.setenv("GCE_METADATA_HOST", "192.0.2.1:80")
    monkeypatch.setenv("GCE_METADATA_IP", "192.0.2.1:80")
    store = GCSStore(
        "bucket", base_url="http://127.0.0.1:9", retry_config=NO_RETRY, client_options=QUICK
    )
    with pytest.raises(StoreCredentialsError) as info:
        await ObjectStoreCheckpointer(store, retry=FAST).load_latest()
    assert info.value.store == "GCS"
    assert "192.0.2.1:80" in str(info.value)


@pytest.fixture
def off_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """No AWS credentials anywhere, and an instance metadata service (which object_store
    asks when none are configured) that refuses at once, on loopback: the default one,
    169.254.169.254, is never asked."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://{dead}")
    return dead


@pytest.mark.timeout(60)
async def test_missing_s3_credentials_say_what_to_set_on_save_and_load(
    off_aws: str, s3_server: S3Server, s3_bucket: str
) -> None:
    store = S3Store(
        s3_bucket,
        endpoint=s3_server.endpoint,
        region="us-east-1",
        metadata_endpoint=f"http://{off_aws}",
        retry_config=NO_RETRY,
        client_options=QUICK,
    )
    ckpt = ObjectStoreCheckpointer(store, retry=FAST)
    for operation in (ckpt.save(DATA), ckpt.load_latest()):
        with pytest.raises(StoreCredentialsError) as info:
            await operation
        error = info.value
        assert isinstance(error, StoreError) and not isinstance(error, TransientStoreError)
        assert error.store == "S3" and "AWS_ACCESS_KEY_ID" in error.remedy
        text = str(error)
        assert text.startswith(
            f"no S3 credentials are configured, and the EC2 instance metadata service "
            f"({off_aws}, only on AWS) gave no token: no answer (connect failed) to "
        ), text
        assert text.endswith(
            "; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
            "access_key_id= and secret_access_key= to open_store"
        ), text
        assert "169.254.169.254" not in text and "Error performing" not in text
        assert str(pickle.loads(pickle.dumps(error))) == text


def test_s3_refused_by_the_metadata_service_says_what_to_set() -> None:
    """The failure users meet on a machine off AWS whose network answers for
    169.254.169.254: IMDSv2's token request refused with 403 (the Debug form as seen)."""
    debug = (
        "Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token in "
        "1.2ms, after 0 retries - Server returned non-2xx status code: 403 Forbidden\n\n"
        'Debug source:\nGeneric {\n    store: "S3",\n    source: RetryError(\n'
        "        RetryErrorImpl {\n            method: PUT,\n            uri: Some(\n"
        "                http://169.254.169.254/latest/api/token,\n            ),\n"
        "            inner: Status {\n                status: 403,\n"
        "                body: None,\n"
    )
    error = translate_error("put", "ckpt/x", GenericError(debug))
    assert type(error) is StoreCredentialsError and error.store == "S3"
    assert error.status == 403
    assert str(error).startswith(
        "no S3 credentials are configured, and the EC2 instance metadata service "
        "(169.254.169.254, only on AWS) gave no token: HTTP 403 to put 'ckpt/x'; set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    )
    # A request of the store itself that fails is not about credentials.
    other = debug.replace("http://169.254.169.254/latest/api/token", "http://h/bucket/ckpt/x")
    assert type(translate_error("put", "ckpt/x", GenericError(other))) is StoreError


@pytest.mark.timeout(60)
async def test_missing_azure_credentials_say_what_to_set_on_save_and_load(
    monkeypatch: pytest.MonkeyPatch, azurite_server: AzuriteServer, azure_container: str
) -> None:
    """An account but no key: object_store asks the instance metadata service for a
    managed identity's token, here on a loopback port nobody listens on."""
    for name in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_CLIENT_ID"):
        monkeypatch.delenv(name, raising=False)
    dead = f"127.0.0.1:{free_port()}"
    options = azure_store_options(azurite_server)
    store = AzureStore(
        azure_container,
        endpoint=options["endpoint"],
        account_name=options["account_name"],
        msi_endpoint=f"http://{dead}/metadata/identity/oauth2/token",
        retry_config=NO_RETRY,
        client_options=QUICK,
    )
    ckpt = ObjectStoreCheckpointer(store, retry=FAST)
    for operation in (ckpt.save(DATA), ckpt.load_latest()):
        with pytest.raises(StoreCredentialsError) as info:
            await operation
        error = info.value
        assert error.store == "Azure" and "AZURE_STORAGE_ACCOUNT_KEY" in error.remedy
        text = str(error)
        assert text.startswith(
            f"no Azure credentials are configured, and the Azure instance metadata service "
            f"({dead}, only on Azure) gave no token: no answer (connect failed) to "
        ), text
        assert "Error performing" not in text


def test_azure_without_credentials_names_the_metadata_service_and_what_to_set() -> None:
    """An account but no key: object_store asks Azure's instance metadata service for a
    managed identity's token, which answers only on Azure (the Debug form as seen)."""
    debug = (
        "Generic MicrosoftAzure error: Error performing token request: ...\n\nDebug source:\n"
        'Generic {\n    store: "MicrosoftAzure",\n    source: TokenRequest {\n'
        "        source: RetryError(\n            RetryErrorImpl {\n"
        "                method: GET,\n                uri: Some(\n"
        "                    http://169.254.169.254/metadata/identity/oauth2/token?api-"
        "version=2019-08-01&resource=https%3A%2F%2Fstorage.azure.com,\n"
        "                ),\n                inner: Status {\n"
        "                    status: 403,\n                    body: None,\n"
    )
    error = translate_error("list", "checkpoints/", GenericError(debug))
    assert type(error) is StoreCredentialsError and error.store == "Azure"
    assert error.status == 403
    assert str(error) == (
        "no Azure credentials are configured, and the Azure instance metadata service "
        "(169.254.169.254, only on Azure) gave no token: HTTP 403 to list 'checkpoints/'; "
        "set AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY, or AZURE_CLIENT_ID, "
        "AZURE_CLIENT_SECRET and AZURE_TENANT_ID), or pass account_key= to open_store"
    )


def test_a_404_without_a_bucket_code_is_an_absent_object() -> None:
    debug = (
        "Object at location p/x not found: ...\n\nDebug source:\nNotFound {\n"
        '    path: "p/x",\n    source: RetryError(\n        RetryErrorImpl {\n'
        "            uri: Some(\n                http://h/bucket/p/x,\n            ),\n"
        "            inner: Status {\n                status: 404,\n"
        '                body: Some(\n                    "<Error><Code>NoSuchKey</Code>",\n'
    )
    error = translate_error("get", "p/x", FileNotFoundError(debug))
    assert type(error) is ObjectNotFoundError


# An IntegrityMismatchError pickled (protocol 2) by cairn when cairn.errors was one module.
OLD_PICKLE = (
    b"\x80\x02ccairn.errors\n_rebuild\nq\x00ccairn.errors\nIntegrityMismatchError\nq\x01X"
    b"\xb1\x00\x00\x00sha256 mismatch at 'ckpt/a.snap': expected "
    + b"0" * 64
    + b", got "
    + b"f" * 64
    + b"q\x02\x85q\x03}q\x04(X\x04\x00\x00\x00pathq\x05X\x0b\x00\x00\x00ckpt/a.snapq\x06"
    b"X\x08\x00\x00\x00expectedq\x07X@\x00\x00\x00"
    + b"0" * 64
    + b"q\x08X\x06\x00\x00\x00actualq\tX@\x00\x00\x00"
    + b"f" * 64
    + b"q\nu\x87q\x0bRq\x0c."
)


def test_errors_pickle_by_their_public_module_and_old_pickles_still_load() -> None:
    error = IntegrityMismatchError("ckpt/a.snap", "0" * 64, "f" * 64)
    assert b"ccairn.errors\n_rebuild\n" in pickle.dumps(error, protocol=2)
    old = pickle.loads(OLD_PICKLE)
    assert type(old) is IntegrityMismatchError and str(old) == str(error)
    assert (old.path, old.expected, old.actual) == ("ckpt/a.snap", "0" * 64, "f" * 64)
    assert old.operator is None and old.partition is None
