"""``--json``: one JSON object on stdout from every command, whether it succeeds or fails.

Every document is checked against its command's JSON Schema (``cairn/cli/schemas/``,
``cairn.cli.views.json_schema``), which pins ``schema_version`` and forbids unknown
members, so a field added or renamed without its schema fails here. Failures must print
one object too, ``{"schema_version": 1, "error": {"type", "message", "exit_code"}}``,
whose message is the ``error:`` line of stderr and whose exit code is the process's.
Everything runs as real subprocesses, as scripts run it.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
from support.cli import (
    PREFIX,
    SCHEMAS,
    Filled,
    cairn,
    cairn_many,
    document,
    failure,
    flip_byte,
    store_root,
)

from cairn.cli import views


def test_the_schemas_are_valid_json_schemas() -> None:
    for schema in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    with pytest.raises(ValueError, match="no JSON schema for command 'frobnicate'"):
        views.json_schema("frobnicate")


def test_every_command_document_matches_its_schema(local: Filled, tmp_path: Path) -> None:
    store = ["--store", local.url, "--json"]
    listed, shown, shown_delta, verified, restored, copied, dry = cairn_many(
        [
            ["list", *store],
            ["show", "latest", *store],
            ["show", str(local.delta), "--partitions", *store],
            ["verify", "--all", *store],
            ["restore", str(local.delta), "--to", str(tmp_path / "restored"), *store],
            ["copy", "--all", "--to", str(tmp_path / "copy"), *store],
            ["gc", "--keep-last", "1", "--min-age", "0s", "--dry-run", *store],
        ]
    )
    for command, run in (
        ("list", listed),
        ("show", shown),
        ("show", shown_delta),
        ("verify", verified),
        ("restore", restored),
        ("copy", copied),
        ("gc", dry),
    ):
        assert run.code == 0, run.explain()
        assert "error" not in document(command, run)
    assert [c["kind"] for c in document("list", listed)["checkpoints"]] == [
        "full",
        "incremental",
        "full",
    ]
    assert {e["kind"] for e in document("show", shown_delta)["entries"]} == {"snapshot", "delta"}
    assert document("restore", restored)["files"][0]["action"] == "created"

    deleted = cairn("delete", str(local.newest), *store)
    assert deleted.code == 0, deleted.explain()
    assert document("delete", deleted)["deleted"] == str(local.newest)
    collected = cairn("gc", "--keep-last", "1", "--min-age", "0s", *store)
    assert collected.code == 0, collected.explain()
    assert document("gc", collected)["deleted"] == [str(local.base)]

    # A failure the command reports itself: the result, plus the error.
    flip_byte(store_root(local) / PREFIX / local.base_snapshot)
    damaged = cairn("verify", "--all", *store)
    doc = failure("verify", damaged, 1, "IntegrityError")
    assert doc["ok"] is False and [c["ok"] for c in doc["checkpoints"]] == [False]


def test_demo_document_matches_its_schema(tmp_path: Path) -> None:
    run = cairn("demo", "--events", "600", "--stream-seconds", "0.5", "--json", cwd=tmp_path)
    assert run.code == 0, run.explain()
    doc = document("demo", run)
    assert doc["exactly_once"] is True
    # One word for a kind of checkpoint everywhere: the demo says what `cairn list` says.
    assert {row["kind"] for row in doc["checkpoints"]} == {"full", "incremental"}
    listed = cairn("list", "--json", cwd=tmp_path)
    kinds = {c["id"]: c["kind"] for c in document("list", listed)["checkpoints"]}
    assert kinds == {row["id"]: row["kind"] for row in doc["checkpoints"]}


def test_every_failure_prints_one_json_object(local: Filled, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    unknown = "01a20000-0000-7000-8000-000000000000"
    store = ["--store", local.url]
    cases: list[tuple[str, list[str], int, str, str]] = [
        ("list", ["list", "--store", "s3:/x"], 2, "InvalidStoreUrlError", "malformed URL"),
        ("list", ["list", "--bogus"], 2, "UsageError", "No such option: --bogus"),
        ("show", ["show", "latest"], 3, "StoreError", "does not exist (the default store"),
        ("show", ["show", "not-an-id"], 2, "UsageError", "not a checkpoint id"),
        ("show", ["show", unknown, *store], 2, "UsageError", f"no checkpoint {unknown}"),
        ("verify", ["verify", *store], 2, "UsageError", "name a checkpoint"),
        ("restore", ["restore", "latest", "--to", str(a_file), *store], 2, "UsageError", "file"),
        ("delete", ["delete", unknown, *store], 2, "UsageError", f"no checkpoint {unknown}"),
        ("gc", ["gc", "--keep-last", "0", *store], 2, "UsageError", "'--keep-last'"),
        ("gc", ["gc", "--keep-last", "1", "--pin", "x", *store], 2, "UsageError", "--pin: not"),
        ("copy", ["copy", "latest", *store], 2, "UsageError", "Missing option '--to'"),
        ("copy", ["copy", "--all", "--to", "ftp://x", *store], 2, "InvalidStoreUrlError", "ftp"),
        ("demo", ["demo", "--store", "memory://"], 2, "UsageError", "memory:// store"),
    ]
    runs = cairn_many([[*args, "--json"] for _, args, _, _, _ in cases], cwd=tmp_path)
    for (command, _, code, kind, needle), run in zip(cases, runs, strict=True):
        doc = failure(command, run, code, kind)
        assert set(doc) == {"schema_version", "error"}, run.explain()
        assert needle in doc["error"]["message"], run.explain()
