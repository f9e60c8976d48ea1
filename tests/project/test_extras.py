"""A module of cairn whose optional extra is incomplete fails on import in one line.

Each case runs in a fresh interpreter where a package of the extra is hidden
(``sys.modules[name] = None``, which makes ``import name`` raise ImportError as if it
were not installed): the import raises :class:`cairn.MissingExtraError`, an
ImportError, whose message is one line naming the missing packages and the extra, and
the examples and ``cairn export-dcp`` say that same line instead of tracebacks.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import REPO

from cairn import CheckpointerError, MissingExtraError

pytestmark = pytest.mark.subprocess

CASES = [
    ("cairn.torch", "torch", ["numpy"], None),
    ("cairn.torch", "torch", ["zstandard"], None),
    ("cairn.torch", "torch", ["numpy", "zstandard"], None),
    ("cairn.observe.metrics", "metrics", ["prometheus_client"], None),
    ("cairn.observe.tracing", "metrics", ["opentelemetry"], None),
    ("cairn.testing", "test", ["pytest_asyncio"], None),
    ("cairn.hf", "hf", ["transformers"], None),
    ("cairn.hf", "hf", ["accelerate"], None),
    # Lightning's CheckpointIO comes from lightning, or pytorch_lightning's lightning_fabric
    ("cairn.lightning", "lightning", ["lightning", "lightning_fabric"], ["lightning"]),
]
"""Module, its extra, the packages hidden, and the ones the error names (None: those)."""
NEEDS_TORCH = ("cairn.torch", "cairn.hf", "cairn.lightning")


def hiding(packages: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which ``packages`` do not import."""
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in packages)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{hide}{code}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("module", "extra", "hidden", "named"), CASES)
def test_an_incomplete_extra_is_one_line_naming_it(
    module: str, extra: str, hidden: list[str], named: list[str] | None
) -> None:
    if module in NEEDS_TORCH:
        pytest.importorskip("torch", reason="the torch extra is not installed here")
    proc = hiding(
        hidden,
        f"from cairn import MissingExtraError\n"
        f"try:\n    import {module}\n"
        f"except MissingExtraError as exc:\n"
        f"    print(type(exc).__name__, isinstance(exc, ImportError), exc.extra, exc.missing)\n"
        f"    print(exc)\n",
    )
    missing = hidden if named is None else named
    assert proc.returncode == 0, proc.stderr
    kind, message = proc.stdout.splitlines()
    assert kind == f"MissingExtraError True {extra} {tuple(missing)!r}"
    names = " and ".join(missing)
    assert message.startswith(f"{module} needs {names}, which ")
    assert f"install cairn with its {extra!r} extra (pip install '.[{extra}]'" in message
    assert message.endswith(f"or pip install {' '.join(missing)}")


def test_uncaught_it_is_a_short_traceback_ending_in_that_line() -> None:
    proc = hiding(["prometheus_client"], "import cairn.observe.metrics")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[-1].startswith(
        "cairn.errors.MissingExtraError: cairn.observe.metrics needs prometheus_client, "
    )
    assert "During handling" not in proc.stderr and len(lines) < 15, proc.stderr


def test_the_error_is_a_cairn_error_and_an_import_error() -> None:
    error = MissingExtraError("cairn.torch", "torch", ("numpy",))
    assert isinstance(error, CheckpointerError) and isinstance(error, ImportError)
    assert "\n" not in str(error)
    MissingExtraError.require("x", "y", ("json", "sqlite3"))  # all there: nothing raised
    with pytest.raises(MissingExtraError) as info:
        MissingExtraError.require("x", "y", ("json", "no_such_package_for_cairn"))
    assert info.value.missing == ("no_such_package_for_cairn",)


def test_the_torch_example_says_what_is_missing_before_starting_any_rank() -> None:
    pytest.importorskip("torch", reason="the torch extra is not installed here")
    script = REPO / "examples" / "torch_train.py"
    proc = hiding(
        ["numpy"],
        f"import runpy\nsys.argv = [{str(script)!r}, '--demo']\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n",
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "torch_train.py: cairn.torch needs numpy, which is not installed: install cairn "
        "with its 'torch' extra (pip install '.[torch]' in cairn's directory, or "
        "'cairn-checkpoint[torch]' from a package index), or pip install numpy"
    ], proc.stderr


def test_export_dcp_without_numpy_is_a_usage_error_naming_the_extra() -> None:
    pytest.importorskip("torch", reason="the torch extra is not installed here")
    proc = hiding(
        ["numpy"],
        "sys.argv = ['cairn', 'export-dcp', 'latest', '--to', 'out', '--store', 'memory://']\n"
        "from cairn.cli import main\nsys.exit(main())\n",
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: this command needs the torch extra: cairn.torch needs numpy, which is not "
        "installed: install cairn with its 'torch' extra (pip install '.[torch]' in cairn's "
        "directory, or 'cairn-checkpoint[torch]' from a package index), or pip install numpy"
    ], proc.stderr


@pytest.mark.parametrize("script", ["quickstart.py", "metrics_job.py", "torch_train.py"])
def test_every_example_help_says_what_it_needs(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    needs = {
        "quickstart.py": "Needs cairn alone, no extra.",
        "metrics_job.py": "Needs the metrics extra (prometheus_client, opentelemetry-api)",
        "torch_train.py": "Needs the torch extra (torch, numpy, zstandard)",
    }
    assert needs[script] in text, proc.stdout
