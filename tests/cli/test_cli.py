"""The ``cairn`` command line, run as a user runs it: each command is a real subprocess.

Stores are filled in-process with the public API (fast), then every command runs as
``python -m cairn.cli ...`` against a local directory and against moto's S3 server,
whose endpoint and credentials reach the subprocess only through the ``AWS_*``
environment that obstore reads. Independent invocations run a few at a time (a
subprocess costs ~0.3-0.5 s to start), and each test groups the assertions on one
store. Checked for every command: exit code (0 ok, 1 integrity, 2 usage or input,
3 store), the JSON document of ``--json``, that errors are one ``error: ...`` line on
stderr with no traceback, and that human output is a table in human units.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import re
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store
from rich.console import Console
from support.cli import (
    PREFIX,
    Filled,
    Run,
    cairn,
    cairn_many,
    fill_store,
    flip_byte,
    s3_env,
    s3_store,
    store_root,
)
from support.killed import killed_save, staging_files
from support.servers import S3Server

from cairn import CheckpointData, CheckpointId, CheckpointPaths, ObjectStoreCheckpointer
from cairn.cli.maintain import parse_duration
from cairn.cli.output import human_age, human_size
from cairn.cli.progress import Transfer
from cairn.protocol.discover import short_ids

CLEAN_EXIT_RUNS = 40


@pytest.fixture
def s3(s3_server: S3Server, s3_bucket: str) -> tuple[Filled, dict[str, str], S3Store]:
    """A moto bucket with the checkpoints of :class:`Filled`, and the env to reach it."""
    store = s3_store(s3_server, s3_bucket)
    url = f"s3://{s3_bucket}"
    filled = fill_store(store, url)
    return filled, s3_env(s3_server), store


# -- tests: usage --------------------------------------------------------------------------


def test_usage_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    runs = cairn_many(
        [
            ["--help"],
            ["list", "--bogus"],
            ["frobnicate"],
            ["restore", "latest"],
            ["gc", "--keep-last", "2", "--keep-within", "7x"],
            ["gc", "--keep-last", "0", "--store", str(tmp_path)],
            ["copy", "latest"],
            ["--version"],
        ]
    )
    help_, bogus, unknown, no_to, bad_age, zero, no_target, version = runs
    assert help_.code == 0, help_.explain()
    for command in ("list", "show", "verify", "restore", "delete", "gc", "copy", "demo"):
        assert command in help_.stdout
    assert version.code == 0 and version.stdout.startswith("cairn "), version.explain()
    for run, needle in (
        (bogus, "No such option: --bogus"),
        (unknown, "No such command 'frobnicate'"),
        (no_to, "Missing option '--to'"),
        (bad_age, "not a duration: '7x'"),
        (zero, "Invalid value for '--keep-last'"),
        (no_target, "Missing option '--to'"),
    ):
        assert run.code == 2, run.explain()
        assert needle in run.error_line(), run.explain()


INT64 = "9223372036854775807 (a 64-bit integer's limit)"
DAYS = "999999999 days (timedelta's limit)"
HUGE = "9" * 100
TWENTY = "9" * 20


PAST_LIMITS: list[tuple[list[str], str, str]] = [
    *(
        (["gc", "--keep-last", "1", option, value], option, DAYS)
        for option in ("--keep-within", "--min-age")
        for value in ("99999999999d", f"{HUGE}w", TWENTY, f"{TWENTY}d", "1000000000d")
    ),
    *(
        (["gc", *before, option, value], option, INT64)
        for before, option in (
            ([], "--keep-last"),
            (["--keep-last", "1"], "--keep-every-n-epochs"),
        )
        for value in (HUGE, TWENTY, "9223372036854775808", "9" * 5000)
    ),
    *(
        (["demo", option, value], option, INT64)
        for option in ("--events", "--seed", "--checkpoint-every", "--full-every")
        for value in (HUGE, TWENTY)
    ),
    (["demo", "--seed", f"-{TWENTY}"], "--seed", "at least -9223372036854775808"),
    *(
        (["demo", "--stream-seconds", value], "--stream-seconds", "86399999913600 seconds")
        for value in (HUGE, TWENTY, "1e400", "inf")
    ),
]
"""Every numeric and duration option of every command, each with values past its limit:
huge, twenty digits, and (where it has one) the first value past the limit."""


@pytest.mark.parametrize(
    ("args", "option", "limit"),
    PAST_LIMITS,
    ids=[" ".join(args)[:48] for args, _, _ in PAST_LIMITS],
)
def test_numbers_past_their_limits_are_usage_errors(
    args: list[str],
    option: str,
    limit: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In-process (a subprocess each would take minutes): main() is what the console
    # script runs. Each used to be accepted, then crash with an OverflowError (exit 1) or
    # run without end.
    import cairn.cli

    monkeypatch.chdir(tmp_path)
    code = cairn.cli.main([*args, "--store", str(tmp_path / "store")])
    err = capsys.readouterr().err
    run = Run(tuple(args), code, "", err)
    assert run.code == 2, run.explain()
    line = run.error_line()  # one line, no traceback
    assert f"'{option}'" in line and limit in line, run.explain()
    assert "at most" in line or "at least" in line, run.explain()
    assert list(tmp_path.iterdir()) == [], "checked before anything was opened or run"


def test_a_huge_duration_or_number_is_a_usage_error_in_a_real_process(tmp_path: Path) -> None:
    cases = [
        ["gc", "--keep-last", "1", "--keep-within", "99999999999d"],
        ["gc", "--keep-last", "1", "--min-age", "99999999999d"],
        ["gc", "--keep-last", "1", "--min-age", TWENTY],
        ["gc", "--keep-last", TWENTY],
        ["demo", "--stream-seconds", "inf"],
    ]
    runs = cairn_many(cases, env={"CAIRN_STORE": str(tmp_path / "store")}, cwd=tmp_path)
    for run in runs:
        assert run.code == 2, run.explain()
        assert "at most" in run.error_line(), run.explain()
    assert list(tmp_path.iterdir()) == []


def test_numbers_at_their_limits_are_taken(local: Filled) -> None:
    top = "9223372036854775807"
    run = cairn(
        *("gc", "--keep-last", top, "--keep-every-n-epochs", top),
        *("--keep-within", "999999999d", "--min-age", "999999999d"),
        *("--dry-run", "--store", local.url, "--json"),
    )
    assert run.code == 0, run.explain()
    assert run.json()["deleted"] == []


# -- tests: a local store ------------------------------------------------------------------


def test_list_show_verify_restore_on_a_local_store(local: Filled, tmp_path: Path) -> None:
    store = ["--store", local.url]
    target = tmp_path / "restored"
    runs = cairn_many(
        [
            ["list", "--json"],  # the store comes from $CAIRN_STORE
            ["list", *store],
            ["show", "latest", *store, "--json"],
            ["show", str(local.delta), *store],
            ["verify", "--all", *store, "--json"],
            ["restore", str(local.delta), "--to", str(target), *store, "--json"],
        ],
        env={"CAIRN_STORE": local.url},
    )
    listed, table, shown, show_table, verified, restored = runs
    for run in runs:
        assert run.code == 0, run.explain()
        assert run.stderr == "", run.explain()

    doc = listed.json()
    assert [c["id"] for c in doc["checkpoints"]] == local.ids
    assert doc["latest"] == str(local.newest) and doc["store"] == local.url
    assert [c["kind"] for c in doc["checkpoints"]] == ["full", "incremental", "full"]
    assert [c["latest"] for c in doc["checkpoints"]] == [False, False, True]
    assert doc["checkpoints"][1]["parent_id"] == str(local.base)
    assert doc["checkpoints"][1]["uploaded_artifacts"] == 1
    for cid, short in short_ids([CheckpointId.parse(c) for c in local.ids]).items():
        assert re.search(rf"(^|\s){short}\s", table.stdout) and str(cid).startswith(short)
    assert "◀ latest" in table.stdout and " B " in table.stdout
    assert "ago" in table.stdout or "just now" in table.stdout  # ages in human units

    doc = shown.json()
    assert doc["id"] == str(local.newest) and doc["epoch"] == 3 and doc["latest"] is True
    assert doc["source_offsets"]["events"]["offsets"] == {"events-0": "300"}
    assert doc["watermark"] == 1234 and len(doc["entries"]) == 3
    assert "incremental" in show_table.stdout and str(local.base) in show_table.stdout
    assert "delta" in show_table.stdout and "events-0=200" in show_table.stdout

    doc = verified.json()
    assert doc["ok"] is True
    assert [c["id"] for c in doc["checkpoints"]] == local.ids
    assert [c["artifacts"] for c in doc["checkpoints"]] == [3, 4, 3]

    # restore: every link of every chain, byte for byte, under its owner; no temp files.
    doc = restored.json()
    assert doc["id"] == str(local.delta) and doc["verified"] is True
    written = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert written == sorted(f["path"] for f in doc["files"])
    assert not [p for p in written if p.endswith(".tmp") or "/." in p]
    assert f"{local.delta}/manifest.json" in written
    assert f"{local.delta}/offsets/events.json" in written
    for relative, data in local.artifacts.items():
        assert (target / relative).read_bytes() == data
    # The restored directory is itself a store holding that checkpoint, and verifies.
    again = cairn("verify", "latest", "--store", str(target), "--prefix", "", "--json")
    assert again.code == 0, again.explain()
    assert [c["id"] for c in again.json()["checkpoints"]] == [str(local.delta)]


def test_bad_inputs_on_a_local_store(local: Filled, tmp_path: Path) -> None:
    store = ["--store", local.url]
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    unknown = "01a20000-0000-7000-8000-000000000000"
    runs = cairn_many(
        [
            ["show", unknown, *store],
            ["show", "not-an-id", *store],
            ["list", "--store", "ftp://example.com/x"],
            ["list", "--store", "s3://"],
            ["list", "--store", "file://host/abs"],
            ["show", "latest", "--store", str(tmp_path / "missing")],
            ["restore", "latest", "--to", str(a_file), *store],
            ["restore", "latest", "--to", str(a_file / "sub"), *store],
            ["delete", unknown, *store],
            ["delete", str(local.base), *store],
            ["verify", *store],
            ["verify", "latest"],  # the default store, ./checkpoints, does not exist in the cwd
            ["show", "not-an-id", *store, "--debug"],
        ],
        cwd=tmp_path,
    )
    expected = [
        (2, f"no checkpoint {unknown} in {local.url}"),
        (2, "not a checkpoint id: 'not-an-id'"),
        (2, "cannot open store URL 'ftp://example.com/x': unknown scheme 'ftp'"),
        (2, "cannot open store URL 's3://': missing bucket"),
        (2, "cannot open store URL 'file://host/abs'"),
        (3, f"store unreachable: local directory {tmp_path / 'missing'} does not exist"),
        (2, f"cannot restore into {a_file}: it is a file"),
        (2, f"{a_file} is a file"),
        (2, f"no checkpoint {unknown}"),
        (2, f"checkpoint {local.base} holds state that other checkpoints or saves build on"),
        (2, "name a checkpoint"),
        (3, f"local directory {tmp_path / 'checkpoints'} does not exist (the default store"),
    ]
    for run, (code, needle) in zip(runs, expected, strict=False):
        assert run.code == code, run.explain()
        assert needle in run.error_line(), run.explain()
    debug = runs[-1]
    assert debug.code == 2 and "Traceback" in debug.stderr, debug.explain()
    assert not (tmp_path / "missing").exists(), "a read-only command created the store"
    assert a_file.read_text() == "not a directory"


def test_verify_finds_corruption_and_restore_refuses_it(local: Filled, tmp_path: Path) -> None:
    root = store_root(local) / PREFIX
    damaged = local.base_snapshot
    flip_byte(root / damaged)
    manifest = root / str(local.newest) / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"epoch": 3', '"epoch": 4'))
    store = ["--store", local.url]
    target = tmp_path / "restored"
    every, newest, restore, listed = cairn_many(
        [
            ["verify", "--all", *store, "--json"],
            ["verify", "newest", *store],
            ["restore", str(local.delta), "--to", str(target), *store],
            ["list", *store, "--json"],
        ]
    )
    assert every.code == 1, every.explain()
    doc = every.json()
    assert doc["ok"] is False
    assert [c["ok"] for c in doc["checkpoints"]] == [False, False, False]
    # The delta carries the damaged snapshot of its parent: both fail, naming it.
    for result in doc["checkpoints"][:2]:
        assert damaged in result["error"] and "is damaged" in result["error"]
    assert "corrupt manifest" in doc["checkpoints"][2]["error"]
    line = every.error_line()
    assert "3 of 3 checkpoint(s) failed verification" in line and damaged in line

    # 'newest' is the newest checkpoint whose manifest reads (none loads, so there is no
    # 'latest'): the delta, whose chain holds the damaged snapshot; the unreadable newest
    # is warned about.
    assert newest.code == 1, newest.explain()
    warning, error = [line for line in newest.stderr.splitlines() if line.strip()]
    assert warning.startswith(f"warning: checkpoint {local.newest} has no readable manifest")
    assert "checksum mismatch" in warning, newest.explain()
    assert error.startswith("error: 1 of 1 checkpoint(s) failed verification; ")
    assert f"{local.delta}: integrity failure" in error and damaged in error

    assert restore.code == 1, restore.explain()
    assert damaged in restore.error_line() and "integrity failure" in restore.error_line()
    assert not target.exists() or not any(target.rglob("*.snap")), "restored damaged data"

    assert listed.code == 0, listed.explain()
    assert listed.json()["checkpoints"][2]["error"].startswith("corrupt manifest")
    assert "warning: checkpoint" in listed.stderr


def test_delete_and_gc_on_a_local_store(local: Filled) -> None:
    store = ["--store", local.url]
    dry = cairn("gc", "--keep-last", "1", "--min-age", "0s", "--dry-run", *store, "--json")
    assert dry.code == 0, dry.explain()
    assert dry.json()["dry_run"] is True
    assert dry.json()["deleted"] == [str(local.base), str(local.delta)]
    assert dry.json()["bytes_reclaimed"] > 0

    refused, forced_list = cairn_many(
        [["delete", str(local.base), *store], ["list", *store, "--json"]]
    )
    assert refused.code == 2 and "--force" in refused.error_line(), refused.explain()
    assert forced_list.json()["count"] == 3, "the dry run or the refused delete deleted"

    leaf = cairn("delete", str(local.delta), *store, "--json")
    assert leaf.code == 0, leaf.explain()
    assert leaf.json()["deleted"] == str(local.delta) and leaf.json()["broken_dependents"] == []

    collected = cairn("gc", "--keep-last", "1", "--min-age", "0s", *store)
    assert collected.code == 0, collected.explain()
    assert "deleted 1 checkpoint(s)" in collected.stdout and "kept 1" in collected.stdout

    remaining, gone = cairn_many([["list", *store, "--json"], ["show", str(local.base), *store]])
    assert [c["id"] for c in remaining.json()["checkpoints"]] == [str(local.newest)]
    assert gone.code == 2 and f"no checkpoint {local.base}" in gone.error_line()


def test_gc_reports_the_cut_writes_it_removed_on_a_local_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    ckpt = ObjectStoreCheckpointer(str(root), CheckpointPaths(PREFIX))
    asyncio.run(ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"kept"})))
    _, cut = asyncio.run(killed_save(ckpt, root))
    store = ["--store", root.as_uri(), "--keep-last", "1", "--min-age", "0s"]

    dry = cairn("gc", *store, "--dry-run", "--json")
    assert dry.code == 0 and dry.json()["staging_files_deleted"] == [], dry.explain()
    assert staging_files(root) == cut, "a dry run removes nothing"
    swept = cairn("gc", *store, "--json")
    assert swept.code == 0, swept.explain()
    assert sorted(swept.json()["staging_files_deleted"]) == [str(p.relative_to(root)) for p in cut]
    assert staging_files(root) == []

    _, cut = asyncio.run(killed_save(ckpt, root))
    shown = cairn("gc", *store)
    assert shown.code == 0, shown.explain()
    assert "removed 2 file(s) of writes cut mid-way" in shown.stdout


def test_delete_latest_dry_run_and_the_pointer_on_a_local_store(local: Filled) -> None:
    store = ["--store", local.url]
    dry = cairn("delete", "latest", "--dry-run", *store, "--json")
    assert dry.code == 0, dry.explain()
    assert dry.json()["deleted"] == str(local.newest) and dry.json()["dry_run"] is True
    refused_dry = cairn("delete", str(local.base), "--dry-run", *store)
    assert refused_dry.code == 2 and str(local.delta) in refused_dry.error_line()
    listed = cairn("list", *store, "--json")
    assert listed.json()["count"] == 3, "a dry run deletes nothing"

    gone = cairn("delete", "latest", *store)
    assert gone.code == 0, gone.explain()
    assert f"deleted checkpoint {local.newest}" in gone.stdout
    # _latest moved to the newest that remains: nothing warns of a missing manifest.
    after, verified = cairn_many([["list", *store, "--json"], ["verify", "latest", *store]])
    assert after.json()["latest"] == str(local.delta), after.explain()
    assert "no readable manifest" not in after.stderr + verified.stderr
    assert verified.code == 0 and str(local.delta)[:8] in verified.stdout, verified.explain()


def test_copy_between_prefixes_keeps_chains_verified(local: Filled) -> None:
    store = ["--store", local.url]
    one = cairn(
        "copy", str(local.delta), "--to", local.url, "--to-prefix", "copy/", *store, "--json"
    )
    assert one.code == 0, one.explain()
    doc = one.json()
    # The delta alone is copied, with the artifacts of its parent that its chains use.
    assert [(c["id"], c["status"], c["requested"]) for c in doc["checkpoints"]] == [
        (str(local.delta), "copied", True),
    ]
    copied_root = store_root(local) / "copy"
    for relative, data in local.artifacts.items():
        assert (copied_root / relative).read_bytes() == data
    assert not (copied_root / str(local.base) / "manifest.json").exists()
    again, same = cairn_many(
        [
            ["copy", "--all", "--to", local.url, "--to-prefix", "copy/", *store, "--json"],
            ["copy", "--all", "--to", local.url, *store],
        ]
    )
    assert again.code == 0, again.explain()
    assert [c["status"] for c in again.json()["checkpoints"]] == ["copied", "present", "copied"]
    assert same.code == 2 and "the target is the source" in same.error_line()
    verified = cairn("verify", "--all", "--store", local.url, "--prefix", "copy/", "--json")
    assert verified.code == 0, verified.explain()
    assert [c["artifacts"] for c in verified.json()["checkpoints"]] == [3, 4, 3]


# -- tests: S3 (moto) ----------------------------------------------------------------------


def test_every_command_on_s3(
    s3: tuple[Filled, dict[str, str], S3Store], tmp_path: Path, s3_server: S3Server
) -> None:
    filled, env, raw = s3
    store = ["--store", filled.url]
    target = tmp_path / "restored"
    local_copy = (tmp_path / "copy").as_uri()
    unknown = "01a20000-0000-7000-8000-000000000000"
    runs = cairn_many(
        [
            ["list", *store, "--json"],
            ["show", "latest", *store],
            ["verify", "--all", *store, "--json"],
            ["restore", "latest", "--to", str(target), *store, "--json"],
            ["copy", "--all", "--to", local_copy, *store, "--json"],
            ["show", unknown, *store],
            ["list", "--store", "s3://no-such-bucket-cairn", "--json"],
        ],
        env=env,
    )
    listed, shown, verified, restored, copied, missing, no_bucket = runs
    for run in runs[:5]:
        assert run.code == 0, run.explain()
    assert [c["id"] for c in listed.json()["checkpoints"]] == filled.ids
    assert str(filled.newest) in shown.stdout and "◀ latest" in shown.stdout
    assert verified.json()["ok"] is True
    assert restored.json()["id"] == str(filled.newest)
    assert (target / str(filled.newest) / "manifest.json").is_file()
    assert [c["status"] for c in copied.json()["checkpoints"]] == ["copied"] * 3
    assert missing.code == 2 and f"no checkpoint {unknown}" in missing.error_line()
    assert no_bucket.code == 3, no_bucket.explain()
    line = no_bucket.error_line()
    assert line.startswith("error: store failure: the bucket 'no-such-bucket-cairn' does not")
    assert "NoSuchBucket" in line and "create it" in line and "<?xml" not in line
    assert no_bucket.json() == {
        "schema_version": 1,
        "error": {
            "type": "StoreNotFoundError",
            "message": line.removeprefix("error: "),
            "exit_code": 3,
        },
    }

    # Back from the local copy into another prefix of the bucket; then damage, delete, gc.
    back = cairn(
        "copy",
        "latest",
        "--store",
        local_copy,
        "--to",
        filled.url,
        "--to-prefix",
        "back/",
        "--json",
        env=env,
    )
    assert back.code == 0 and back.json()["ok"] is True, back.explain()
    damaged = f"{PREFIX}{filled.base_snapshot}"
    obstore.put(raw, damaged, b"tampered bytes")
    corrupt, back_ok, refused = cairn_many(
        [
            ["verify", str(filled.base), *store],
            ["verify", "--all", "--store", filled.url, "--prefix", "back/", "--json"],
            ["delete", str(filled.base), *store],
        ],
        env=env,
    )
    assert corrupt.code == 1 and damaged in corrupt.error_line(), corrupt.explain()
    assert back_ok.code == 0 and back_ok.json()["ok"] is True, back_ok.explain()
    assert refused.code == 2 and "--force" in refused.error_line(), refused.explain()
    gc = cairn("gc", "--keep-last", "1", "--min-age", "0s", *store, "--json", env=env)
    assert gc.code == 0, gc.explain()
    assert gc.json()["deleted"] == [str(filled.base), str(filled.delta)]
    assert cairn("list", *store, "--json", env=env).json()["count"] == 1


# -- tests: process exit -------------------------------------------------------------------


def test_the_process_exits_cleanly_every_time(local: Filled) -> None:
    """obstore's runtime threads must not abort the interpreter at exit (SIGABRT, 134)."""
    runs = cairn_many([["list", "--store", local.url, "--json"]] * CLEAN_EXIT_RUNS)
    codes = [run.code for run in runs]
    failures = [run for run in runs if run.code != 0]
    assert not failures, f"exit codes: {codes}; first failure:\n{failures[0].explain()}"
    assert all(run.json()["count"] == 3 and run.stderr == "" for run in runs)


# -- tests: helpers, in-process ------------------------------------------------------------


def test_units_and_durations() -> None:
    assert human_size(0) == "0 B" and human_size(1536) == "1.5 KiB"
    assert human_size(5 * 1024**3) == "5.0 GiB" and human_size(300 * 1024**2) == "300 MiB"
    assert human_age(1_000, now_ms=1_500) == "just now"
    assert human_age(0, now_ms=42_000) == "42 s ago" and human_age(0, now_ms=7_200_000) == "2 h ago"
    assert parse_duration("7d").total_seconds() == 7 * 86400
    assert parse_duration("1h30m").total_seconds() == 5400
    assert parse_duration("0s").total_seconds() == 0 and parse_duration("90").total_seconds() == 90
    for bad in ("7x", "", "d", "1h 30", "-1d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    assert parse_duration("999999999d") == dt.timedelta(days=999999999)
    for past in ("1000000000d", "999999999d1s", "86399999913601", "9" * 400):
        with pytest.raises(ValueError, match="at most 999999999 days"):
            parse_duration(past)


def test_progress_shows_only_on_a_terminal_after_a_delay() -> None:
    async def work(console: Console, seconds: float) -> None:
        async with Transfer(console, "copying", 10, unit="items", delay=0.05) as bar:
            for _ in range(10):
                bar.advance(1)
                await asyncio.sleep(seconds / 10)

    screen = io.StringIO()
    asyncio.run(work(Console(file=screen, force_terminal=True, width=80), 0.3))
    assert "copying" in screen.getvalue()  # drawn, then cleared (transient)
    quick = io.StringIO()
    asyncio.run(work(Console(file=quick, force_terminal=True, width=80), 0.0))
    assert quick.getvalue() == ""  # done before the delay: never drawn
    pipe = io.StringIO()
    asyncio.run(work(Console(file=pipe, force_terminal=False, width=80), 0.3))
    assert pipe.getvalue() == ""  # not a terminal: never drawn


def test_an_unexpected_error_propagates_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not an AttributeError from looking up an exception class typer no longer has."""
    import cairn.cli
    from cairn.cli.commands import browse

    def broken_pipe(*args: Any, **kwargs: Any) -> Any:
        raise BrokenPipeError("stdout closed")

    monkeypatch.setattr(browse, "launch", broken_pipe)  # outside the command's own handling
    with pytest.raises(BrokenPipeError, match="stdout closed"):
        cairn.cli.main(["list"])
