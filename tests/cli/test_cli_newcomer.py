"""A newcomer's first hour, step by step, each as real ``cairn`` processes.

``python -m cairn``; a malformed store URL (exit 2, the library's own message); arguments
checked before the store is touched; plain paths wherever a store is named; ``cairn
demo`` followed by bare ``list``/``show``/``verify``/``restore`` in the same directory;
naming the prefixes that do hold checkpoints; the S3 mistakes a newcomer makes (plain
HTTP, a missing bucket); ``restore`` into a directory that holds files; ``gc`` errors
that name the flag.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from support.cli import PREFIX, Filled, cairn, cairn_many, fill, flip_byte, store_root
from support.servers import S3_ACCESS_KEY_ID, S3_REGION, S3_SECRET_ACCESS_KEY, S3Server

from cairn import (
    CheckpointData,
    CheckpointPaths,
    InvalidStoreUrlError,
    ObjectStoreCheckpointer,
    SyncCheckpointer,
    open_store,
)
from cairn.cli.errors import ExitCode
from cairn.cli.progress import Transfer
from cairn.cli.restore import STAGING_PREFIX, restore

UNKNOWN = "01a20000-0000-7000-8000-000000000000"


# -- python -m cairn, and store locations ----------------------------------------------------


def test_python_dash_m_cairn_is_the_cairn_command(local: Filled) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cairn", "list", "--store", local.url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [c["id"] for c in json.loads(proc.stdout)["checkpoints"]] == local.ids


def test_a_malformed_url_is_bad_usage_with_the_librarys_message(tmp_path: Path) -> None:
    with pytest.raises(InvalidStoreUrlError) as library:
        open_store("s3:/x")
    with pytest.raises(InvalidStoreUrlError) as sync:
        SyncCheckpointer("s3:/x")
    assert str(sync.value) == str(library.value)
    assert "malformed URL: s3: must be followed by // (s3://bucket/prefix)" in str(library.value)
    run = cairn("list", "--store", "s3:/x", cwd=tmp_path)
    assert run.code == ExitCode.USAGE, run.explain()
    assert run.error_line() == f"error: {library.value}"
    assert not (tmp_path / "s3:").exists(), "taken for a local directory"


def test_a_plain_path_is_a_local_directory_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    saved = SyncCheckpointer("./relative").save(
        CheckpointData(epoch=1, snapshots={("op", 0): b"relative"})
    )
    manifest = tmp_path / "relative" / PREFIX / str(saved.checkpoint_id) / "manifest.json"
    assert manifest.is_file()
    absolute = tmp_path / "absolute"

    async def save_and_load() -> bytes:
        ckpt = ObjectStoreCheckpointer(str(absolute))
        await ckpt.save(CheckpointData(epoch=2, snapshots={("op", 0): b"absolute"}))
        loaded = await ObjectStoreCheckpointer(str(absolute)).load_latest()
        assert loaded is not None
        return bytes(loaded.artifacts[("op", 0)])

    assert asyncio.run(save_and_load()) == b"absolute"
    run = cairn("list", "--store", "relative", "--json", cwd=tmp_path)
    assert run.code == 0, run.explain()
    assert run.json()["store"] == (tmp_path / "relative").as_uri()
    assert [c["id"] for c in run.json()["checkpoints"]] == [str(saved.checkpoint_id)]


def test_arguments_are_checked_before_the_store_is_touched(tmp_path: Path) -> None:
    # An S3 endpoint nobody listens on: any request would fail with exit 3, slowly.
    dead = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_REGION": "us-east-1",
    }
    cases = [
        (["show", "not-an-id"], "not a checkpoint id: 'not-an-id'"),
        (["show", "not-an-id", "--store", "s3://bucket"], "not a checkpoint id"),
        (["verify", "latest", "nope", "--store", "s3://bucket"], "not a checkpoint id: 'nope'"),
        (["verify", "latest", "--all"], "give checkpoint ids or --all, not both"),
        (["restore", "nope", "--to", str(tmp_path / "out")], "not a checkpoint id"),
        (["restore", "latest", "--to", str(tmp_path / "f" / "x")], "is a file"),
        (["delete", "nope", "--store", "s3://bucket"], "not a checkpoint id: 'nope'"),
        (["copy", "nope", "--to", str(tmp_path / "copy")], "not a checkpoint id"),
        (["copy", "--all", "--to", "s3:/x", "--store", "s3://bucket"], "malformed URL"),
        (["gc", "--keep-last", "1", "--pin", "nope"], "--pin: not a checkpoint id"),
        (["gc", "--keep-last", "1", "--keep-within", "0s"], "--keep-within must be longer"),
        (["gc", "--keep-last", "-1"], "Invalid value for '--keep-last'"),
        (["gc", "--keep-last", "1", "--keep-every-n-epochs", "0"], "'--keep-every-n-epochs'"),
    ]
    (tmp_path / "f").write_text("a file")
    runs = cairn_many([args for args, _ in cases], env=dead, cwd=tmp_path)
    for (_, needle), run in zip(cases, runs, strict=True):
        assert run.code == ExitCode.USAGE, run.explain()
        line = run.error_line()
        assert needle in line, run.explain()
        assert "RetentionPolicy" not in line and "keep_last" not in line, run.explain()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"], "something was created"


# -- after `cairn demo`, in the same directory -------------------------------------------------


def demo(cwd: Path) -> dict[str, object]:
    run = cairn("demo", "--events", "600", "--stream-seconds", "0.5", "--json", cwd=cwd)
    assert run.code == 0, run.explain()
    report: dict[str, object] = run.json()
    return report


def test_bare_commands_after_demo_act_on_its_newest_run(tmp_path: Path) -> None:
    older, newer = demo(tmp_path), demo(tmp_path)
    assert older["prefix"] != newer["prefix"]
    assert newer["inspect"] == "cairn list"
    rows = newer["checkpoints"]
    assert isinstance(rows, list)
    final = newer["final"]
    assert isinstance(final, dict)
    target = tmp_path / "restored"
    listed, shown, verified, restored, table = cairn_many(
        [
            ["list", "--json"],
            ["show", "latest", "--json"],
            ["verify", "--all", "--json"],
            ["restore", "latest", "--to", str(target), "--json"],
            ["list"],
        ],
        cwd=tmp_path,
    )
    for run in (listed, shown, verified, restored, table):
        assert run.code == 0, run.explain()
        assert run.stderr.startswith("note: nothing under prefix ''; using the ")
        assert f"prefix {newer['prefix']!r}" in run.stderr, run.explain()
    assert listed.json()["prefix"] == newer["prefix"]
    assert [c["id"] for c in listed.json()["checkpoints"]] == [row["id"] for row in rows]
    assert shown.json()["id"] == final["id"] == restored.json()["id"]
    assert [c["id"] for c in verified.json()["checkpoints"]] == [row["id"] for row in rows]
    assert all(c["ok"] for c in verified.json()["checkpoints"])
    assert (target / str(final["id"]) / "manifest.json").is_file()
    assert str(final["id"])[:8] in table.stdout and "◀ latest" in table.stdout
    # An explicit prefix is obeyed: the older run is still there.
    old = cairn("list", "--prefix", str(older["prefix"]), "--json", cwd=tmp_path)
    assert old.code == 0 and old.stderr == "", old.explain()
    assert old.json()["count"] == len(older["checkpoints"])  # type: ignore[arg-type]


def test_an_empty_prefix_names_the_prefixes_that_hold_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    filled = asyncio.run(
        fill(ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths("jobs/a/")), root.as_uri())
    )
    backup = tmp_path / "backup"
    store = ["--store", str(root)]
    listed, as_json, shown, copied = cairn_many(
        [
            ["list", *store],
            ["list", *store, "--json"],
            ["show", "latest", *store],
            ["copy", "--all", *store, "--prefix", "jobs/a/", "--to", str(backup)],
        ]
    )
    assert listed.code == 0 and listed.stderr == "", listed.explain()
    assert "no checkpoints under prefix ''" in listed.stdout
    assert "the store holds checkpoints under prefix 'jobs/a/'" in listed.stdout
    assert "pass --prefix jobs/a/" in listed.stdout
    assert as_json.json()["other_prefixes"] == ["jobs/a/"] and as_json.json()["count"] == 0
    assert shown.code == ExitCode.USAGE, shown.explain()
    assert "no checkpoints in" in shown.error_line() and "'jobs/a/'" in shown.error_line()
    assert copied.code == 0, copied.explain()
    # The copy keeps the source prefix: the backup says where its checkpoints are.
    after = cairn("list", "--store", str(backup), "--json")
    assert after.json()["count"] == 0 and after.json()["other_prefixes"] == ["jobs/a/"]
    again = cairn("list", "--store", str(backup), "--prefix", "jobs/a/", "--json")
    assert [c["id"] for c in again.json()["checkpoints"]] == filled.ids


# -- S3 mistakes -------------------------------------------------------------------------------


def test_s3_plain_http_and_missing_bucket_each_say_what_to_set(
    s3_server: S3Server, s3_bucket: str
) -> None:
    env = {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
        "AWS_REGION": S3_REGION,
    }
    plain = cairn("list", "--store", f"s3://{s3_bucket}", env={**env, "AWS_ALLOW_HTTP": "false"})
    assert plain.code == ExitCode.USAGE, plain.explain()
    line = plain.error_line()
    assert f"the S3 endpoint {s3_server.endpoint} is plain HTTP" in line
    assert "set AWS_ALLOW_HTTP=true" in line and "builder error" not in line
    with pytest.raises(InvalidStoreUrlError, match="set AWS_ALLOW_HTTP=true"):
        open_store(f"s3://{s3_bucket}", endpoint=s3_server.endpoint)
    assert isinstance(
        open_store(
            f"s3://{s3_bucket}",
            endpoint=s3_server.endpoint,
            client_options={"allow_http": True},
        ),
        object,
    )
    missing = cairn("list", "--store", "s3://no-such-bucket", env={**env, "AWS_ALLOW_HTTP": "true"})
    assert missing.code == ExitCode.STORE, missing.explain()
    assert missing.error_line() == (
        "error: store failure: the bucket 'no-such-bucket' does not exist (the store "
        "answered 404 NoSuchBucket to list ''): create it, or correct the bucket "
        "name in the store URL"
    )


# -- restore into a directory that holds files -------------------------------------------------


def test_restore_never_silently_replaces_a_file(local: Filled, tmp_path: Path) -> None:
    store = ["--store", local.url]
    target = tmp_path / "restored"
    first = cairn("restore", str(local.delta), "--to", str(target), *store, "--json")
    assert first.code == 0, first.explain()
    changed = target / local.delta_artifact
    changed.write_bytes(b"edited by hand")
    (target / "notes.txt").write_text("mine")

    refused = cairn("restore", str(local.delta), "--to", str(target), *store)
    assert refused.code == ExitCode.USAGE, refused.explain()
    assert f"{changed} already exist(s) with other content" in refused.error_line()
    assert "--overwrite" in refused.error_line()
    assert changed.read_bytes() == b"edited by hand"

    again = cairn("restore", str(local.delta), "--to", str(target), *store, "--json", "--overwrite")
    assert again.code == 0, again.explain()
    actions = {f["path"]: f["action"] for f in again.json()["files"]}
    relative = str(changed.relative_to(target))
    assert actions.pop(relative) == "replaced" and set(actions.values()) == {"unchanged"}
    assert changed.read_bytes() == b"agg-0 delta"
    assert (target / "notes.txt").read_text() == "mine"
    assert not [p for p in target.iterdir() if p.name.startswith(STAGING_PREFIX)]
    # The same restore once more changes nothing and needs no --overwrite.
    same = cairn("restore", str(local.delta), "--to", str(target), *store, "--json")
    assert same.code == 0 and {f["action"] for f in same.json()["files"]} == {"unchanged"}


def test_a_failed_restore_leaves_every_restored_name_as_it_was(
    local: Filled, tmp_path: Path
) -> None:
    """With --overwrite too: nothing is renamed into place before everything verified."""
    target = tmp_path / "restored"
    ckpt = ObjectStoreCheckpointer(local.url, CheckpointPaths(PREFIX))

    async def run(overwrite: bool) -> None:
        async with Transfer(_quiet(), "restoring", None) as bar:
            await restore(ckpt, local.delta, target, bar, overwrite=overwrite)

    asyncio.run(run(False))
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    for path in before:
        path.write_bytes(b"old " + path.read_bytes())  # every name holds other bytes now
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}

    # Damage in the store: found while reading, before anything is written.
    flip_byte(store_root(local) / PREFIX / local.base_snapshot)
    with pytest.raises(Exception, match="sha256 mismatch"):
        asyncio.run(run(True))
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    flip_byte(store_root(local) / PREFIX / local.base_snapshot)

    # A staged file that does not verify on disk: nothing is renamed either.
    import cairn.cli.restore as restore_module

    real_stage = restore_module._stage

    def stage_then_damage(
        staging: Path, files: list[tuple[str, bytes | memoryview]], bar: Transfer
    ) -> None:
        real_stage(staging, files, bar)
        flip_byte(staging / local.base_snapshot)

    restore_module._stage = stage_then_damage
    try:
        with pytest.raises(Exception, match="do not verify") as info:
            asyncio.run(run(True))
    finally:
        restore_module._stage = real_stage
    assert getattr(info.value, "code", None) == ExitCode.INTEGRITY
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    assert not [p for p in target.iterdir() if p.name.startswith(STAGING_PREFIX)]

    asyncio.run(run(True))
    assert (target / local.delta_artifact).read_bytes() == (b"agg-0 delta")


def _quiet() -> Console:
    return Console(file=io.StringIO())


def test_gc_errors_name_the_flag_not_the_python_name(local: Filled) -> None:
    store = ["--store", local.url]
    runs = cairn_many(
        [
            ["gc", "--keep-last", "-1", *store],
            ["gc", "--keep-last", "1", "--keep-every-n-epochs", "0", *store],
            ["gc", "--keep-last", "1", "--keep-within", "0s", *store],
            ["gc", "--keep-last", "1", "--pin", UNKNOWN, *store],
        ]
    )
    for run, flag in zip(
        runs, ["--keep-last", "--keep-every-n-epochs", "--keep-within", "--pin"], strict=True
    ):
        assert run.code == ExitCode.USAGE, run.explain()
        assert flag in run.error_line() and "RetentionPolicy" not in run.error_line()
    assert cairn("list", *store, "--json").json()["count"] == 3
