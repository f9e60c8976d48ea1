"""The command line against Azure Blob (Azurite): ``az://container`` URLs, credentials
and endpoint from the ``AZURE_*`` environment, as a user would configure them."""

from __future__ import annotations

from pathlib import Path

import obstore
from obstore.store import AzureStore
from support.cli import PREFIX, cairn, cairn_many, fill_store
from support.servers import AZURITE_ACCOUNT, AZURITE_KEY, AzuriteServer, azure_store_options


def azure_env(server: AzuriteServer) -> dict[str, str]:
    """What a process needs to reach Azurite through ``az://container`` URLs."""
    return {
        "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        "AZURE_STORAGE_ENDPOINT": f"{server.endpoint}/{AZURITE_ACCOUNT}",
        "AZURE_ALLOW_HTTP": "true",
    }


def test_every_command_on_azure(
    azurite_server: AzuriteServer, azure_container: str, tmp_path: Path
) -> None:
    raw = AzureStore(azure_container, **azure_store_options(azurite_server))
    url = f"az://{azure_container}"
    filled = fill_store(raw, url)
    env = azure_env(azurite_server)
    store = ["--store", url]
    target = tmp_path / "restored"
    listed, verified, restored, copied, no_container, bad_url = cairn_many(
        [
            ["list", *store, "--json"],
            ["verify", "--all", *store, "--json"],
            ["restore", "latest", "--to", str(target), *store, "--json"],
            ["copy", "--all", "--to", f"{url}/mirror", *store, "--json"],
            ["list", "--store", "az://no-such-container", "--json"],
            ["list", "--store", "az://", "--json"],
        ],
        env=env,
    )
    for run in (listed, verified, restored, copied):
        assert run.code == 0, run.explain()
    assert [c["id"] for c in listed.json()["checkpoints"]] == filled.ids
    assert verified.json()["ok"] is True
    assert (target / str(filled.newest) / "manifest.json").is_file()
    assert [c["status"] for c in copied.json()["checkpoints"]] == ["copied"] * 3
    assert no_container.code == 3, no_container.explain()
    assert no_container.json()["error"]["type"] == "StoreNotFoundError"
    assert no_container.error_line() == (
        "error: store failure: the container 'no-such-container' does not exist (the store "
        "answered 404 ContainerNotFound to list ''): create it, or correct the "
        "container name in the store URL"
    ), no_container.explain()
    assert bad_url.code == 2 and "az://" in bad_url.error_line(), bad_url.explain()

    damaged = f"{PREFIX}{filled.base_snapshot}"
    obstore.put(raw, damaged, b"tampered bytes")
    corrupt = cairn("verify", str(filled.base), *store, env=env)
    assert corrupt.code == 1 and damaged in corrupt.error_line(), corrupt.explain()
    mirror = cairn("verify", "--all", "--store", f"{url}/mirror", "--json", env=env)
    assert mirror.code == 0 and mirror.json()["ok"] is True, mirror.explain()
    gc = cairn("gc", "--keep-last", "1", "--min-age", "0s", *store, "--json", env=env)
    assert gc.code == 0, gc.explain()
    assert cairn("list", *store, "--json", env=env).json()["count"] == 1


def test_a_missing_account_says_what_to_set() -> None:
    """No AZURE_* variable at all: object_store refuses to build the store."""
    run = cairn("list", "--store", "az://container", "--json")
    assert run.code == 3, run.explain()
    assert run.json()["error"]["type"] == "StoreCredentialsError"
    assert run.error_line().startswith(
        "error: store failure: no Azure storage account is configured; set "
        "AZURE_STORAGE_ACCOUNT_NAME"
    ), run.explain()
