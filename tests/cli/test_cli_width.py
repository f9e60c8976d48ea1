"""Tables that fit the terminal, ids a user can paste back, numbers that agree.

The tables are drawn in-process at 60, 80 and 200 columns (fast), then the commands run
as processes with ``COLUMNS`` set, as a terminal would.
"""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import pytest
from rich.console import Console, RenderableType
from support.cli import PREFIX, Filled, cairn_many, document, flip_byte, store_root

from cairn import CheckpointId, CheckpointPaths, ObjectStoreCheckpointer
from cairn.cli import views
from cairn.cli.catalog import latest_mark, read_manifests
from cairn.cli.errors import ExitCode
from cairn.cli.history import Point, history_chart
from cairn.cli.output import Col, FitTable
from cairn.cli.verify import verify_one
from cairn.protocol.discover import checkpoint_counts, short_ids

WIDTHS = (60, 80, 200)


def render(renderable: RenderableType, width: int) -> list[str]:
    """``renderable`` as a terminal of ``width`` columns shows it, line by line."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False).print(renderable)
    return out.getvalue().splitlines()


def _ids_in(lines: list[str], filled: Filled, *, full: bool = False) -> None:
    """Every id of ``filled``, short (unique among them) or whole, whole on some line."""
    ids = [CheckpointId(text) for text in filled.ids]
    names = {cid: str(cid) for cid in ids} if full else short_ids(ids)
    for cid, name in names.items():
        assert any(re.search(rf"(^|\s){re.escape(name)}(\s|$)", line) for line in lines), name
        assert [other for other in ids if str(other).startswith(name)] == [cid]
        assert len(name) >= 8


def _checkpointer(filled: Filled) -> ObjectStoreCheckpointer:
    return ObjectStoreCheckpointer(filled.url, CheckpointPaths(PREFIX))


@pytest.mark.parametrize("width", WIDTHS)
def test_list_verify_and_history_fit_every_width(local: Filled, width: int) -> None:
    async def tables() -> list[tuple[RenderableType, bool]]:
        ckpt = _checkpointer(local)
        ids = await ckpt.list_checkpoints()
        listed = await read_manifests(ckpt, ids)
        mark = await latest_mark(ckpt)
        results = [await verify_one(ckpt, cid) for cid in ids]
        points = [Point(item.checkpoint_id, "committed", item.manifest) for item in listed]
        return [
            (views.list_table(listed, mark), True),
            (views.verify_table(results), True),
            (history_chart(points), True),
            (views.show_table(listed[1].manifest, mark), False),  # type: ignore[arg-type]
        ]

    for renderable, has_every_id in asyncio.run(tables()):
        lines = render(renderable, width)
        assert all(len(line) <= width for line in lines), "\n".join(lines)
        if has_every_id:  # (show abbreviates digests with "…" on purpose)
            _ids_in(lines, local)
            assert not any("…" in line for line in lines), "\n".join(lines)  # nothing cut


def test_a_fitted_table_drops_the_least_useful_columns_and_the_empty_ones() -> None:
    table = FitTable(
        "t", [Col("ID", whole=True), Col("Big", 3), Col("Empty", 1), Col("Mid", 2), Col("", 1)]
    )
    table.add_row("01a230b8", "x" * 30, "", "y" * 10, "◀ latest")
    assert [table.columns[i].header for i in table.kept(200)] == ["ID", "Big", "Mid", ""]
    assert [table.columns[i].header for i in table.kept(40)] == ["ID", "Mid", ""]
    assert [table.columns[i].header for i in table.kept(10)] == ["ID"]
    table.wide = True
    assert [table.columns[i].header for i in table.kept(10)] == ["ID", "Big", "Mid", ""]
    lines = render(table, 40)
    assert all(len(line) <= 40 for line in lines)
    assert any(line.startswith("01a230b8 ") for line in lines), lines


def test_the_commands_fit_columns_and_take_their_short_ids_back(local: Filled) -> None:
    store = ["--store", local.url]
    short = short_ids([CheckpointId(text) for text in local.ids])
    delta = short[local.delta]
    for width in WIDTHS:
        runs = cairn_many(
            [["list", *store], ["verify", "--all", *store], ["history", *store]],
            env={"COLUMNS": str(width)},
        )
        for run in runs:
            assert run.code == 0, run.explain()
            lines = run.stdout.splitlines()
            assert all(len(line) <= width for line in lines), run.explain()
            _ids_in(lines, local)
    wide = cairn_many(
        [
            ["list", "--wide", *store],
            ["list", "--ids", *store],
            ["verify", "--all", "--ids", *store],
        ],
        env={"COLUMNS": "200"},
    )
    for run in wide:
        assert run.code == 0, run.explain()
        _ids_in(run.stdout.splitlines(), local, full=True)
    assert "Took" in wide[0].stdout and "Uploaded" in wide[0].stdout

    shown, verified, dry, listed = cairn_many(
        [
            ["show", delta, *store, "--json"],
            ["verify", delta, *store, "--json"],
            ["delete", delta, "--dry-run", *store, "--json"],
            ["list", *store, "--json"],
        ]
    )
    assert document("show", shown)["id"] == str(local.delta), shown.explain()
    assert [c["id"] for c in document("verify", verified)["checkpoints"]] == [str(local.delta)]
    assert document("delete", dry)["deleted"] == str(local.delta), dry.explain()
    assert [c["id"] for c in document("list", listed)["checkpoints"]] == local.ids  # whole ids

    common = str(local.base)[:8]  # saved within a second: all three start alike
    ambiguous, missing, short_arg = cairn_many(
        [
            ["show", common, *store],
            ["show", "ffffffff", *store],
            ["show", "01a2", *store],
        ]
    )
    assert ambiguous.code == ExitCode.USAGE and common in ambiguous.stderr, ambiguous.explain()
    assert "ambiguous" in ambiguous.stderr and str(local.base) in ambiguous.stderr
    assert missing.code == ExitCode.USAGE and "ffffffff" in missing.stderr, missing.explain()
    assert short_arg.code == ExitCode.USAGE and "at least its first 8" in short_arg.stderr


def test_verify_all_on_nothing_fails_and_names_the_prefixes_that_hold_some(
    local: Filled, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    wrong, nothing, as_json = cairn_many(
        [
            ["verify", "--all", "--store", local.url, "--prefix", "nope/"],
            ["verify", "--all", "--store", str(empty), "--prefix", "x/"],
            ["verify", "--all", "--store", local.url, "--prefix", "nope/", "--json"],
        ]
    )
    assert wrong.code == 4 and ExitCode.NOTHING_VERIFIED.value == 4, wrong.explain()
    assert "no checkpoints to verify" in wrong.stderr and repr(PREFIX) in wrong.stderr
    assert nothing.code == 4, nothing.explain()
    doc = document("verify", as_json)
    assert doc["error"]["exit_code"] == 4 and doc["error"]["type"] == "NothingVerified"


def test_one_checkpoint_reads_the_same_in_every_output(local: Filled) -> None:
    """``delta`` uploads one artifact and carries three (two partitions unchanged)."""
    store = ["--store", local.url]
    ckpt = _checkpointer(local)
    manifest = asyncio.run(ckpt.load_manifest(local.delta))
    counts = checkpoint_counts(manifest)
    assert (counts.artifacts, counts.uploaded_artifacts, counts.carried_artifacts) == (4, 1, 3)
    assert (counts.partitions, counts.unchanged_partitions) == (3, 2)
    listed, shown, verified, table, show_text, verify_text = cairn_many(
        [
            ["list", *store, "--json"],
            ["show", str(local.delta), *store, "--json"],
            ["verify", str(local.delta), *store, "--json"],
            ["list", *store],
            ["show", str(local.delta), *store],
            ["verify", str(local.delta), *store],
        ],
        env={"COLUMNS": "200"},
    )
    [row] = [c for c in document("list", listed)["checkpoints"] if c["id"] == str(local.delta)]
    one = document("show", shown)
    [checked] = document("verify", verified)["checkpoints"]
    for doc in (row, one):
        assert doc["artifacts"] == counts.artifacts
        assert doc["uploaded_artifacts"] == counts.uploaded_artifacts
        assert doc["carried_artifacts"] == counts.carried_artifacts
        assert doc["size_bytes"] == counts.size_bytes
        assert doc["writer_generation"] == counts.writer_generation == 0
    assert (checked["artifacts"], checked["size_bytes"]) == (counts.artifacts, counts.size_bytes)
    assert "4 (1 new)" in table.stdout and "4 (1 new) artifacts" in show_text.stdout
    assert re.search(r"writer generation\s+0\b", show_text.stdout), show_text.explain()
    [line] = [line for line in verify_text.stdout.splitlines() if " ok" in line]
    assert re.search(r"\b2\s+4\s", line), verify_text.explain()


def test_a_damaged_checkpoint_whose_manifest_reads_shows_its_epoch(local: Filled) -> None:
    flip_byte(store_root(local) / PREFIX / local.delta_artifact)
    doc_run, text_run = cairn_many(
        [
            ["verify", str(local.delta), "--store", local.url, "--json"],
            ["verify", str(local.delta), "--store", local.url],
        ],
        env={"COLUMNS": "80"},
    )
    assert doc_run.code == text_run.code == ExitCode.INTEGRITY, doc_run.explain()
    [checked] = document("verify", doc_run)["checkpoints"]
    assert checked["ok"] is False and checked["epoch"] == 2 and checked["artifacts"] == 4
    assert " ? " not in text_run.stdout and re.search(r"\b2\s+4\s", text_run.stdout)
    assert all(len(line) <= 80 for line in text_run.stdout.splitlines()), text_run.explain()
