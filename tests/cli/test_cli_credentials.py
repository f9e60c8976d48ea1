"""Missing cloud credentials on the command line: one line naming what to set, exit 3.

Without credentials object_store asks the cloud's instance metadata service for them,
which answers only on that cloud's machines. Here that service is a loopback port
nobody listens on (``AWS_METADATA_ENDPOINT``, ``AZURE_MSI_ENDPOINT``), so the commands
never reach for 169.254.169.254 and fail at once, as they would off the cloud."""

from __future__ import annotations

from pathlib import Path

from support.cli import cairn, s3_env
from support.servers import AZURITE_ACCOUNT, AzuriteServer, S3Server, free_port

from cairn.cli.errors import ExitCode


def test_missing_s3_credentials_name_what_to_set(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    env = {
        **{k: v for k, v in s3_env(s3_server).items() if "ACCESS_KEY" not in k},
        "HOME": str(tmp_path),  # no ~/.aws
        "AWS_METADATA_ENDPOINT": f"http://{dead}",
    }
    run = cairn("list", "--store", f"s3://{s3_bucket}", "--json", env=env)
    assert run.code == ExitCode.STORE, run.explain()
    line = run.error_line()
    assert line.startswith(
        f"error: store failure: no S3 credentials are configured, and the EC2 instance "
        f"metadata service ({dead}, only on AWS) gave no token: no answer (connect "
        "failed) to list ''; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    ), line
    assert "169.254.169.254" not in run.stderr
    assert run.json()["error"]["type"] == "StoreCredentialsError"
    ok = cairn("list", "--store", f"s3://{s3_bucket}", "--json", env=s3_env(s3_server))
    assert ok.code == 0 and ok.json()["count"] == 0, ok.explain()


def test_missing_azure_credentials_name_what_to_set(
    azurite_server: AzuriteServer, azure_container: str, tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    env = {
        "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
        "AZURE_STORAGE_ENDPOINT": f"{azurite_server.endpoint}/{AZURITE_ACCOUNT}",
        "AZURE_ALLOW_HTTP": "true",
        "AZURE_MSI_ENDPOINT": f"http://{dead}/metadata/identity/oauth2/token",
        "HOME": str(tmp_path),
    }
    run = cairn("list", "--store", f"az://{azure_container}", "--json", env=env)
    assert run.code == ExitCode.STORE, run.explain()
    line = run.error_line()
    assert line.startswith(
        f"error: store failure: no Azure credentials are configured, and the Azure "
        f"instance metadata service ({dead}, only on Azure) gave no token: no answer "
        "(connect failed) to list ''; set AZURE_STORAGE_ACCOUNT_KEY"
    ), line
    assert run.json()["error"]["type"] == "StoreCredentialsError"
