"""The conventions of the ``cairn`` command line: options before the command, version,
shell completion, NO_COLOR, gc's rules alone and its reasons, --limit and --since."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.metadata
import json
import re
from pathlib import Path

import pytest
from support.cli import Filled, cairn, cairn_many, fill

from cairn import CheckpointPaths, ObjectStoreCheckpointer, __version__
from cairn.cli import session as session_module
from cairn.cli.maintain import parse_since, window
from cairn.format.ids import CheckpointId

ESC = "\x1b"


def test_session_options_before_the_command(local: Filled) -> None:
    runs = cairn_many(
        [
            ["--store", local.url, "--json", "list"],
            ["--store", "/nowhere/at/all", "list", "--store", local.url, "--json"],
            ["--prefix", "elsewhere/", "--store", local.url, "list"],
            [
                "--prefix",
                "elsewhere/",
                "--store",
                local.url,
                "list",
                "--prefix",
                "",
                "--ids",
            ],
            ["--debug", "--json", "--store", local.url, "history"],
        ],
        env={"CAIRN_STORE": "/nowhere/from/the/environment"},
    )
    before, after_wins, other_prefix, prefix_after, flags = runs
    assert before.code == 0, before.explain()
    assert [c["id"] for c in before.json()["checkpoints"]] == local.ids  # not $CAIRN_STORE
    assert after_wins.code == 0 and after_wins.json()["count"] == 3, after_wins.explain()
    assert other_prefix.code == 0, other_prefix.explain()
    assert "no checkpoints under prefix 'elsewhere/'" in other_prefix.stdout
    assert "pass --prefix '')" in other_prefix.stdout  # the store's root, cairn's default
    assert prefix_after.code == 0 and local.ids[0] in prefix_after.stdout
    assert flags.code == 0 and flags.json()["count"] == 3, flags.explain()


def test_an_empty_prefix_before_the_command_is_the_store_root(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    old = ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths("checkpoints/"))
    asyncio.run(fill(old, root.as_uri()))  # where cairn 0.1's default prefix put them
    run = cairn("--prefix", "", "--store", root.as_uri(), "list")
    assert run.code == 0, run.explain()
    assert "no checkpoints under prefix ''" in run.stdout  # given: not second-guessed
    assert "pass --prefix checkpoints/" in run.stdout


def test_help_says_the_options_go_before_the_command_too() -> None:
    run = cairn("--help", env={"COLUMNS": "200"})
    assert run.code == 0
    assert "Before the command too; one given after it wins." in run.stdout
    for option in ("--store", "--prefix", "--json", "--debug", "--version", "-V"):
        assert option in run.stdout


def test_version_is_the_distributions() -> None:
    long, short = cairn_many([["--version"], ["-V"]])
    expected = f"cairn {importlib.metadata.version('cairn-checkpoint')}\n"
    assert long.code == 0 and long.stdout == expected
    assert short.code == 0 and short.stdout == expected


def test_version_without_an_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert session_module.distribution_version() == __version__


def test_shell_completion_prints_a_script() -> None:
    run = cairn("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert run.code == 0, run.explain()
    assert "complete" in run.stdout and "_CAIRN_COMPLETE" in run.stdout
    assert "--install-completion" in cairn("--help").stdout


def test_no_color_removes_every_style(local: Filled) -> None:
    forced = {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "COLUMNS": "160"}
    args = [
        ["gc", "--keep-last", "1", "--dry-run", "--store", local.url],
        ["show", "latest", "--store", local.url],
        ["--help"],
    ]
    styled = cairn_many(args, env=forced)
    plain = cairn_many(args, env={**forced, "NO_COLOR": "1"})
    for run in styled:
        assert run.code == 0 and ESC in run.stdout, run.explain()  # the check can fail
    for run in plain:
        assert run.code == 0 and ESC not in run.stdout + run.stderr, run.explain()
    assert "would delete" in plain[0].stdout


def test_gc_takes_any_rule_alone_and_says_why_it_keeps(local: Filled) -> None:
    within, every, none, table = cairn_many(
        [
            ["gc", "--keep-within", "7d", "--dry-run", "--json", "--store", local.url],
            ["gc", "--keep-every-n-epochs", "2", "--dry-run", "--json", "--store", local.url],
            ["gc", "--dry-run", "--store", local.url],
            ["gc", "--keep-last", "1", "--pin", local.ids[0], "--dry-run", "--store", local.url],
        ],
        env={"COLUMNS": "200"},
    )
    assert within.code == 0, within.explain()
    doc = within.json()
    assert doc["deleted"] == []
    assert doc["reasons"][local.ids[0]] == ["keep-within 7d"]
    assert doc["reasons"][local.ids[2]] == ["keep-within 7d", "latest"]
    assert every.code == 0, every.explain()
    assert every.json()["reasons"] == {
        local.ids[1]: ["keep-every-n-epochs 2"],
        local.ids[2]: ["latest"],
    }
    assert none.code == 2 and "give at least one of --keep-last" in none.stderr
    assert table.code == 0, table.explain()
    assert "kept: pinned" in table.stdout
    assert "kept: keep-last 1, latest" in table.stdout


def test_list_and_history_limit_and_since(local: Filled) -> None:
    at = "--store", local.url
    runs = cairn_many(
        [
            ["list", "--limit", "2", "--json", *at],
            ["list", "--since", "1h", "--json", *at],
            ["list", "--since", "2000-01-31", "--limit", "1", "--ids", *at],
            ["list", "--since", "2999-01-01T00:00+02:00", *at],
            ["list", "--since", "yesterday", *at],
            ["history", "--limit", "1", "--json", *at],
            ["history", "--since", "2999-01-01", "--json", *at],
            ["list", "--limit", "0", *at],
        ],
        env={"COLUMNS": "200"},
    )
    two, hour, one, future, bad, h_one, h_none, zero = runs
    assert [c["id"] for c in two.json()["checkpoints"]] == local.ids[1:]
    assert hour.json()["count"] == 3
    assert one.code == 0 and local.ids[2] in one.stdout and local.ids[0] not in one.stdout
    assert future.code == 0 and "no checkpoints since 2999-01-01T00:00+02:00" in future.stdout
    assert "(3 older)" in future.stdout
    assert bad.code == 2 and "--since: not a duration or a date: 'yesterday'" in bad.stderr
    assert [p["id"] for p in h_one.json()["series"]] == local.ids[2:]
    assert h_none.code == 0 and h_none.json()["series"] == []
    assert zero.code == 2 and "--limit" in zero.stderr


def test_history_names_the_prefixes_that_hold_checkpoints(local: Filled) -> None:
    human, doc = cairn_many(
        [
            ["history", "--store", local.url, "--prefix", "elsewhere/"],
            ["history", "--store", local.url, "--prefix", "elsewhere/", "--json"],
        ]
    )
    assert human.code == 0, human.explain()
    assert "no checkpoints under prefix 'elsewhere/'" in human.stdout
    assert "pass --prefix '')" in human.stdout
    assert json.loads(doc.stdout)["other_prefixes"] == [""]


def test_since_and_window() -> None:
    now = 1_800_000_000_000
    assert parse_since("1h", now) == now - 3_600_000
    assert parse_since("2026-01-31", now) == int(
        dt.datetime(2026, 1, 31, tzinfo=dt.UTC).timestamp() * 1000
    )
    assert parse_since("2026-01-31T02:00+02:00", now) == parse_since("2026-01-31", now)
    with pytest.raises(ValueError, match="not a duration or a date"):
        parse_since("soon", now)
    ids = [CheckpointId.now() for _ in range(4)]
    assert window(ids, None, None) == ids
    assert window(ids, 2, None) == ids[2:]
    assert window(ids, None, ids[1].timestamp_ms + 10**9) == []


def test_dash_o_names_the_output_format_of_every_command_with_a_table(local: Filled) -> None:
    store = ["--store", local.url]
    newest = str(local.newest)
    commands = [
        ["list"],
        ["history"],
        ["show", newest],
        ["verify", newest],
        ["gc", "--keep-last", "2", "--dry-run"],
    ]
    runs = cairn_many(
        [[*c, *store, "-o", "json"] for c in commands] + [[*c, *store, "--json"] for c in commands]
    )
    by_flag, by_option = runs[len(commands) :], runs[: len(commands)]
    for flag, option in zip(by_flag, by_option, strict=True):
        assert option.code == flag.code == 0, option.explain()
        assert option.json() == flag.json(), option.explain()
    formats = ("table", "wide", "ids", "WIDE")
    runs = cairn_many(
        [["list", *store, "-o", fmt] for fmt in formats]
        + [["list", *store, *flag] for flag in ([], ["--wide"], ["--ids"])],
        env={"COLUMNS": "200"},
    )
    for run in runs:
        assert run.code == 0, run.explain()
    table, wide, ids, upper, plain, wide_flag, ids_flag = (ages_masked(r.stdout) for r in runs)
    assert (table, wide, ids, upper) == (plain, wide_flag, ids_flag, wide_flag)
    assert newest not in table and newest[:8] in table  # short ids
    assert newest in wide and newest in ids


def ages_masked(text: str) -> str:
    """``text`` with the ages a table shows ("3 s ago", "just now") replaced, and each
    run of spaces or of a rule's dashes made one (an age of another length pads its
    column otherwise)."""
    masked = re.sub(r"\d+ [smhd] ago|just now", "AGE", text)
    return re.sub(r"─+", "─", re.sub(r" +", " ", masked))


def test_dash_o_and_a_flag_that_ask_for_other_output_are_a_usage_error(local: Filled) -> None:
    store = ["--store", local.url]
    clash, early, agree, unknown = cairn_many(
        [
            ["list", *store, "-o", "json", "--wide"],
            ["--json", "list", *store, "-o", "table"],
            ["list", *store, "-o", "wide", "--ids", "--wide"],
            ["list", *store, "-o", "xml"],
        ]
    )
    assert clash.code == 2 and "-o json and --wide" in clash.stderr, clash.explain()
    assert clash.stdout == ""
    assert early.code == 2 and "-o table and --json" in early.stdout, early.explain()
    assert early.json()["error"]["type"] == "UsageError"  # --json given: the error is JSON
    assert agree.code == 0 and str(local.newest) in agree.stdout, agree.explain()
    assert unknown.code == 2 and "'xml' is not one of" in unknown.stderr, unknown.explain()


def test_a_usage_error_names_the_help_of_the_command_it_is_in() -> None:
    in_command, before_command, no_command, as_json = cairn_many(
        [
            ["list", "--bogus"],
            ["--bogus", "list"],
            ["bogus"],
            ["gc", "--keep-last", "x", "--json"],
        ]
    )
    assert in_command.code == 2, in_command.explain()
    assert in_command.error_line() == "error: No such option: --bogus (see 'cairn list --help')"
    assert before_command.code == 2, before_command.explain()
    assert before_command.error_line() == "error: No such option: --bogus (see 'cairn --help')"
    assert no_command.code == 2, no_command.explain()
    assert no_command.error_line() == "error: No such command 'bogus'. (see 'cairn --help')"
    assert as_json.code == 2 and as_json.stderr.startswith("error: "), as_json.explain()
    assert as_json.json()["error"] == {
        "type": "UsageError",
        "message": "Invalid value for '--keep-last': not an integer: 'x' (see 'cairn gc --help')",
        "exit_code": 2,
    }
