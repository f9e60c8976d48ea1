"""The command line against GCS (fake-gcs-server behind the tests' XML-API proxy):
``gs://bucket`` URLs, with the credentials and endpoint in the ``GOOGLE_*`` environment
as a user sets them, and the GCS mistakes a newcomer makes: a missing bucket, missing
credentials."""

from __future__ import annotations

from pathlib import Path

import obstore
from obstore.store import GCSStore
from support.cli import PREFIX, cairn, cairn_many, fill_store
from support.servers import GcsServer, free_port, gcs_env, gcs_store_options

from cairn.cli.errors import ExitCode


def test_every_command_on_gcs(gcs_server: GcsServer, gcs_bucket: str, tmp_path: Path) -> None:
    raw = GCSStore(gcs_bucket, **gcs_store_options(gcs_server))
    url = f"gs://{gcs_bucket}"
    filled = fill_store(raw, url)
    env = gcs_env(gcs_server)
    store = ["--store", url]
    target = tmp_path / "restored"
    listed, shown, verified, restored, copied, local_copy = cairn_many(
        [
            ["list", *store, "--json"],
            ["show", "latest", *store],
            ["verify", "--all", *store, "--json"],
            ["restore", "latest", "--to", str(target), *store, "--json"],
            ["copy", "--all", "--to", f"{url}/mirror", *store, "--json"],
            ["copy", "--all", "--to", (tmp_path / "copy").as_uri(), *store, "--json"],
        ],
        env=env,
    )
    for run in (listed, shown, verified, restored, copied, local_copy):
        assert run.code == 0, run.explain()
    assert [c["id"] for c in listed.json()["checkpoints"]] == filled.ids
    assert str(filled.newest) in shown.stdout and "◀ latest" in shown.stdout
    assert verified.json()["ok"] is True
    assert restored.json()["id"] == str(filled.newest)
    assert (target / str(filled.newest) / "manifest.json").is_file()
    assert [c["status"] for c in copied.json()["checkpoints"]] == ["copied"] * 3
    assert [c["status"] for c in local_copy.json()["checkpoints"]] == ["copied"] * 3

    # Back from the local copy into another prefix of the bucket; then damage, delete, gc.
    back = cairn(
        "copy", "latest", "--store", (tmp_path / "copy").as_uri(), "--to", url,
        "--to-prefix", "back/", "--json",
        env=env,
    )  # fmt: skip
    assert back.code == 0 and back.json()["ok"] is True, back.explain()
    assert obstore.head(raw, f"back/{filled.newest}/manifest.json")["size"] > 0
    damaged = f"{PREFIX}{filled.base_snapshot}"
    obstore.put(raw, damaged, b"tampered bytes")
    corrupt = cairn("verify", str(filled.base), *store, env=env)
    assert corrupt.code == ExitCode.INTEGRITY and damaged in corrupt.error_line(), corrupt.explain()
    mirror = cairn("verify", "--all", "--store", f"{url}/mirror", "--json", env=env)
    assert mirror.code == 0 and mirror.json()["ok"] is True, mirror.explain()
    deleted = cairn("delete", str(filled.newest), *store, "--json", env=env)
    assert deleted.code == 0, deleted.explain()
    gc = cairn("gc", "--keep-last", "1", "--min-age", "0s", *store, "--json", env=env)
    assert gc.code == 0, gc.explain()
    after = cairn("list", *store, "--json", env=env).json()
    assert after["count"] == 1


def test_a_missing_bucket_says_so(gcs_server: GcsServer) -> None:
    missing = cairn("list", "--store", "gs://no-such-bucket-cairn", env=gcs_env(gcs_server))
    assert missing.code == ExitCode.STORE, missing.explain()
    assert missing.error_line() == (
        "error: store failure: the bucket 'no-such-bucket-cairn' does not exist (the "
        "store answered 404 NoSuchBucket to list ''): create it, or correct the "
        "bucket name in the store URL"
    )


def test_missing_credentials_name_what_to_set(
    gcs_server: GcsServer, gcs_bucket: str, tmp_path: Path
) -> None:
    """No GOOGLE_* credentials, no gcloud default credentials (an empty HOME), and no
    metadata server (GCE_METADATA_HOST on a port nobody listens on): off Google Cloud."""
    dead = f"127.0.0.1:{free_port()}"
    env = {
        "GOOGLE_BASE_URL": gcs_server.endpoint,
        "HOME": str(tmp_path),
        "GCE_METADATA_HOST": dead,
        "GCE_METADATA_IP": dead,
    }
    run = cairn("list", "--store", f"gs://{gcs_bucket}", "--json", env=env)
    assert run.code == ExitCode.STORE, run.explain()
    line = run.error_line()
    assert line.startswith(
        f"error: store failure: no GCS credentials are configured, and the GCE metadata "
        f"server ({dead}, only on Google Cloud) gave "
        "no token: no answer (connect failed) to list ''; set "
        "GOOGLE_SERVICE_ACCOUNT to the path of a service-account key file"
    ), line
    assert run.json()["error"]["type"] == "StoreCredentialsError"
    # With the key in the environment, the same command works.
    ok = cairn(
        "list", "--store", f"gs://{gcs_bucket}", "--json", env={**env, **gcs_env(gcs_server)}
    )
    assert ok.code == 0 and ok.json()["count"] == 0, ok.explain()
