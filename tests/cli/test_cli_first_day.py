"""What a newcomer meets in their first commands: a fresh directory, restoring state
as files, pipes and scripts, long paths at 80 columns, and the words of the tables."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console
from support.cli import PREFIX, Filled, cairn, cairn_many
from test_cli_history import id_at

from cairn import CheckpointData, CheckpointId, CheckpointPaths, SyncCheckpointer
from cairn.cli.history import Point, history_chart
from cairn.cli.output import human_duration, plural


def test_list_and_history_in_a_fresh_directory_say_there_are_no_checkpoints_yet(
    tmp_path: Path,
) -> None:
    listed, data, history, shown = cairn_many(
        [["list"], ["list", "--json"], ["history"], ["show", "latest"]], cwd=tmp_path
    )
    for run in (listed, history):
        assert run.code == 0, run.explain()
        assert run.stdout.splitlines() == [
            f"no checkpoints yet: the local directory {tmp_path / 'checkpoints'} does not "
            "exist (the default store: pass --store URL or set CAIRN_STORE)"
        ], run.explain()
        assert run.stderr == ""
    assert data.code == 0 and data.json()["count"] == 0, data.explain()
    # A command about one checkpoint still says the store is not there (exit 3).
    assert shown.code == 3 and "does not exist" in shown.error_line(), shown.explain()
    assert not (tmp_path / "checkpoints").exists(), "a listing created the store"


def test_restore_as_partition_files_writes_the_state_a_job_reads(
    local: Filled, tmp_path: Path
) -> None:
    target = tmp_path / "state"
    run = cairn(
        "restore", str(local.delta), "--to", str(target), "--layout", "partitions",
        "--store", local.url, "--json",
    )  # fmt: skip
    assert run.code == 0, run.explain()
    written = {
        p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()
    }
    assert sorted(written) == [
        "agg/partition-0.delta-1",
        "agg/partition-0.snapshot",
        "agg/partition-1.snapshot",
        "join/partition-0.snapshot",
        "offsets/events.json",
    ]
    assert written["agg/partition-0.snapshot"] == b"agg-0 base " * 50
    assert written["agg/partition-0.delta-1"] == b"agg-0 delta"
    assert written["agg/partition-1.snapshot"] == b"agg-1 base"
    assert written["join/partition-0.snapshot"] == b"j0"
    assert b'"events-0": "200"' in written["offsets/events.json"]
    assert sorted(f["path"] for f in run.json()["files"]) == sorted(written)
    # The default is unchanged: the store's own layout.
    store_layout = tmp_path / "store-layout"
    again = cairn("restore", str(local.delta), "--to", str(store_layout), "--store", local.url)
    assert again.code == 0, again.explain()
    assert (store_layout / str(local.delta) / "manifest.json").is_file()
    helped = cairn("restore", "--help", env={"COLUMNS": "200"})
    text = " ".join(helped.stdout.split())
    assert "--layout store (the default) writes the store's own objects" in text
    assert "--layout partitions writes the state a job restores from" in text


def test_piped_tables_end_at_their_last_character(local: Filled, tmp_path: Path) -> None:
    store = ["--store", local.url]
    runs = cairn_many(
        [
            ["list", *store],
            ["list", *store, "--wide"],
            ["show", "latest", *store],
            ["verify", "--all", *store],
            ["history", *store],
            ["restore", str(local.delta), "--to", str(tmp_path / "r"), *store],
        ]
    )
    for run in runs:
        assert run.code == 0, run.explain()
        lines = run.stdout.splitlines()
        assert len(lines) > 2, run.explain()
        assert [line for line in lines if line != line.rstrip()] == [], run.explain()


def test_ids_prints_one_whole_id_per_line(local: Filled, tmp_path: Path) -> None:
    ids, by_option, none = cairn_many(
        [
            ["list", "--ids", "--store", local.url],
            ["list", "-o", "ids", "--store", local.url],
            ["list", "--ids", "--store", str(tmp_path / "empty")],
        ]
    )
    assert ids.code == 0, ids.explain()
    assert ids.stdout.splitlines() == local.ids
    assert by_option.stdout == ids.stdout
    assert none.code == 0 and none.stdout == "", none.explain()
    assert "no checkpoints yet" in none.stderr


def test_a_long_target_path_is_not_broken_at_80_columns(local: Filled, tmp_path: Path) -> None:
    target = tmp_path / ("a-directory-with-a-long-name-" * 3) / "restored"
    run = cairn(
        "restore", str(local.newest), "--to", str(target), "--store", local.url,
        env={"COLUMNS": "80"},
    )  # fmt: skip
    assert run.code == 0, run.explain()
    assert f"files restored under {target}" in run.stdout.splitlines(), run.explain()


def test_copy_notes_name_checkpoints_as_the_table_does(local: Filled, tmp_path: Path) -> None:
    run = cairn("copy", str(local.delta), "--to", str(tmp_path / "copy"), "--store", local.url)
    assert run.code == 0, run.explain()
    note = next(line for line in run.stdout.splitlines() if "carries artifacts of" in line)
    assert str(local.base) not in note, run.explain()
    shown = re.search(r"carries artifacts of (\S+)", note)
    assert shown is not None and str(local.base).startswith(shown.group(1))
    assert len(shown.group(1)) < len(str(local.base))
    assert run.stdout.splitlines()[0].startswith(f"copy to {(tmp_path / 'copy').as_uri()} ")


def test_durations_and_counts_read_as_people_say_them() -> None:
    assert human_duration(358) == "358 ms"
    assert human_duration(1500) == "1.5 s"
    assert human_duration(90_000) == "90 s"
    assert human_duration(12.5 * 60_000) == "12.5 min"
    assert (plural(1, "file"), plural(0, "file"), plural(2, "item")) == (
        "1 file",
        "0 files",
        "2 items",
    )
    start = 1_700_000_000_000
    stamps = [start, start + 10, start + 20, start + 30, start + 388]
    points = [Point(id_at(ms), "uncommitted") for ms in stamps]
    console = Console(file=io.StringIO(), width=120)
    console.print(history_chart(points))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "gap: 358 ms without a checkpoint" in text, text
    assert isinstance(points[0].checkpoint_id, CheckpointId) and PREFIX == ""


def test_restore_as_partition_files_writes_a_directory_partition_as_its_files(
    tmp_path: Path,
) -> None:
    src = tmp_path / "db"
    (src / "sub").mkdir(parents=True)
    (src / "CURRENT").write_bytes(b"MANIFEST-000001\n")
    (src / "sub" / "000001.sst").write_bytes(b"sst" * 1000)
    store = tmp_path / "store"
    ckpt = SyncCheckpointer(store.as_uri(), CheckpointPaths(PREFIX))
    saved = ckpt.save(
        CheckpointData(epoch=1, directories={("db", 0): src}, snapshots={("op", 0): b"s"})
    )
    ckpt.close()
    target = tmp_path / "state"
    run = cairn(
        "restore", str(saved.checkpoint_id), "--to", str(target), "--layout", "partitions",
        "--store", store.as_uri(),
    )  # fmt: skip
    assert run.code == 0, run.explain()
    assert (target / "db" / "partition-0" / "CURRENT").read_bytes() == b"MANIFEST-000001\n"
    assert (target / "db" / "partition-0" / "sub" / "000001.sst").read_bytes() == b"sst" * 1000
    assert (target / "op" / "partition-0.snapshot").read_bytes() == b"s"
    assert "3 files" in run.stdout, run.explain()
