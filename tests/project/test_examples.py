"""The scripts in ``examples/`` behave as a new user expects.

Each parses its command line before it touches anything: ``--help`` describes the
arguments and the store prefix and exits 0, an unknown option exits 2 with argparse's
message, and neither leaves anything in the working directory. What an example saves is
where ``cairn list`` looks by default (store ``./checkpoints``, its root),
and the example prints the exact command that lists it. The torch example's launcher
summarises only the injected kill of rank 1 in one line; any other failure keeps its
traceback (the crash-and-resume run itself is in ``test_torch_example.py``).
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support.cli import cairn
from support.paths import REPO

from cairn import CheckpointData, IntegrityMismatchError, SyncCheckpointer

EXAMPLES = REPO / "examples"
SCRIPTS = [
    "quickstart.py",
    "metrics_job.py",
    "torch_train.py",
    "rocksdb_job.py",
    "lightning_train.py",
    "ray_wordcount.py",
]


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(SCRIPTS)


def example(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python examples/SCRIPT ARGS`` in ``cwd``."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_the_arguments_and_touches_nothing(script: str, tmp_path: Path) -> None:
    proc = example(script, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {script}"), proc.stdout
    assert "--prefix" in proc.stdout and "root" in proc.stdout, proc.stdout
    assert proc.stderr == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_option_is_refused_and_touches_nothing(script: str, tmp_path: Path) -> None:
    proc = example(script, "--no-such-option", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "error: unrecognized arguments: --no-such-option" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def listed_epochs(cwd: Path, *args: str) -> list[int]:
    """The epochs ``cairn list ARGS --json`` finds, run in ``cwd``."""
    run = cairn("list", *args, "--json", cwd=cwd)
    assert run.code == 0, run.explain()
    return [row["epoch"] for row in run.json()["checkpoints"]]


def test_quickstart_saves_where_cairn_list_looks(tmp_path: Path) -> None:
    proc = example("quickstart.py", "./checkpoints", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, *_, last = proc.stdout.splitlines()
    assert first == "store   ./checkpoints, prefix ''"
    command = "cairn list --store ./checkpoints --prefix ''"
    assert last == f"inspect {command}"
    assert listed_epochs(tmp_path, *shlex.split(command)[2:]) == [1, 2, 3]
    assert listed_epochs(tmp_path) == [1, 2, 3], "cairn's default store and prefix"


def test_quickstart_prints_a_prefix_of_its_own_in_the_command(tmp_path: Path) -> None:
    proc = example("quickstart.py", "store dir", "--prefix", "job/a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "inspect cairn list --store 'store dir' --prefix job/a/"
    assert listed_epochs(tmp_path, "--store", "store dir", "--prefix", "job/a/") == [1, 2, 3]


def test_metrics_job_saves_where_cairn_list_looks(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    proc = example("metrics_job.py", "--serve-seconds", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("serving /metrics on port ")
    assert lines[1] == "store ./checkpoints, prefix ''"
    assert lines[2].endswith("cairn list --store ./checkpoints --prefix ''")
    assert listed_epochs(tmp_path) == [1, 2, 3]


# -- the torch example's launcher: only the injected kill is summarised --------------------


@pytest.fixture(scope="module")
def torch_train() -> ModuleType:
    """The example as a module: its launcher imports cairn only, not torch."""
    spec = importlib.util.spec_from_file_location("torch_train", EXAMPLES / "torch_train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: boom\n'


def failed(stderr: str = TRACEBACK) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["torchrun"], 1, stdout="", stderr=stderr)


def saved(store: Path, epoch: int) -> None:
    ckpt = SyncCheckpointer(str(store))
    try:
        ckpt.save(CheckpointData(epoch=epoch, snapshots={("rank-0", 0): b"weights"}))
    finally:
        ckpt.close()


def test_a_failure_other_than_the_injected_kill_keeps_its_traceback(
    torch_train: ModuleType, tmp_path: Path
) -> None:
    saved(tmp_path / "store", 20)
    note = tmp_path / "killed"  # rank 1 never reached its kill: no note
    expected, report = torch_train.outcome(failed(), note, str(tmp_path / "store"), "")
    assert (expected, report) == (False, TRACEBACK)


def test_the_injected_kill_is_one_line_naming_the_verified_checkpoint(
    torch_train: ModuleType, tmp_path: Path
) -> None:
    saved(tmp_path / "store", 20)
    note = tmp_path / "killed"
    note.write_text("25")
    expected, report = torch_train.outcome(failed(), note, str(tmp_path / "store"), "")
    assert expected
    assert report == (
        "rank 1 was killed on purpose after step 25 (--kill-at 25); the newest checkpoint, "
        "step 20, is intact (every digest verified); run again without --kill-at to resume "
        "from it"
    )


def test_the_injected_kill_before_any_checkpoint_says_so(
    torch_train: ModuleType, tmp_path: Path
) -> None:
    note = tmp_path / "killed"
    note.write_text("5")
    expected, report = torch_train.outcome(failed(), note, str(tmp_path / "store"), "")
    assert expected
    assert report == (
        "rank 1 was killed on purpose after step 5 (--kill-at 5), before its first "
        "checkpoint; run again without --kill-at"
    )


def test_a_damaged_checkpoint_after_the_kill_is_an_error_not_a_summary(
    torch_train: ModuleType, tmp_path: Path
) -> None:
    saved(tmp_path / "store", 20)
    [snap] = (tmp_path / "store").rglob("*.snap")
    snap.write_bytes(b"X" + snap.read_bytes()[1:])
    note = tmp_path / "killed"
    note.write_text("25")
    with pytest.raises(IntegrityMismatchError):
        torch_train.outcome(failed(), note, str(tmp_path / "store"), "")
