"""The test markers hold: the tables that give them name real tests, a test not marked
``servers`` cannot start an emulator, and ``scripts/test.sh`` runs a marker selection as
given, installing Azurite only for a selection that may need it."""

from __future__ import annotations

import ast
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from support.markers import DIRECTORY_MARKERS, SLOW_TESTS, STARTS_A_SERVER
from support.paths import REPO
from support.servers import GcsServer, S3Server, ServerRefusedError, refusing_starts


def defined_tests(path: Path) -> set[str]:
    """``function`` and ``Class::function`` for every test function ``path`` defines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{f.name}" for f in node.body if isinstance(f, functions))
    return {name for name in names if name.split("::")[-1].startswith("test_")}


@pytest.mark.parametrize("entry", sorted(SLOW_TESTS | STARTS_A_SERVER))
def test_every_test_a_table_names_is_defined_in_its_file(entry: str) -> None:
    path, name = entry.split("::", 1)
    assert (REPO / path).is_file(), f"{entry}: no file {path}"
    assert name in defined_tests(REPO / path), f"{entry}: {path} defines no test {name}"


def test_every_directory_with_markers_holds_tests() -> None:
    for directory in DIRECTORY_MARKERS:
        assert list((REPO / directory).glob("test_*.py")), f"{directory}: no test module"


def test_a_test_not_marked_servers_starts_no_emulator(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    assert request.node.get_closest_marker("servers") is None
    binary = tmp_path / "fake-gcs-server"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    for server in (S3Server(), GcsServer(executable=binary)):
        with pytest.raises(ServerRefusedError) as refused:
            server.start()
        assert str(refused.value) == (
            f"{server.name} server not started: {request.node.nodeid} is not marked "
            "`servers`, and a test that needs a server must be (see tests/support/markers.py)"
        )
        with pytest.raises(RuntimeError, match="not started"):
            _ = server.port  # nothing was spawned, no port was taken


def test_a_refusal_inside_another_gives_its_own_reason_then_the_outer_one(
    request: pytest.FixtureRequest,
) -> None:
    inner = pytest.raises(ServerRefusedError, match="^moto server not started: inner reason$")
    with refusing_starts("inner reason"), inner:
        S3Server().start()
    with pytest.raises(ServerRefusedError, match=request.node.name):
        S3Server().start()


# -- scripts/test.sh ----------------------------------------------------------------------

STUB_PYTHON = """#!/usr/bin/env bash
# A python that makes stub virtualenvs; each call is logged, one argument a line.
{ echo "python"; printf '  %s\\n' "$@"; } >> "$STUB_LOG"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
"""

STUB_NPM = """#!/usr/bin/env bash
echo "npm $*" >> "$STUB_LOG"
mkdir -p node_modules
"""


def run_test_script(tmp_path: Path, *args: str) -> list[str]:
    """Run a copy of ``scripts/test.sh`` with ``args``, with stub ``python3`` and ``npm``
    (no install, no test run); what they were called with, one argument a line."""
    repo = tmp_path / "repo"
    if not repo.exists():
        shutil.copytree(REPO / "scripts", repo / "scripts")
        for name in ("pyproject.toml", "package-lock.json"):
            shutil.copy(REPO / name, repo / name)
        (tmp_path / "bin").mkdir()
        for name, body in (("python3", STUB_PYTHON), ("npm", STUB_NPM)):
            stub = tmp_path / "bin" / name
            stub.write_text(body)
            stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    log.write_text("")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "VIRTUAL_ENV"))},
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "STUB_LOG": str(log),
    }
    env.pop("PYTHON", None)
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "test.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return log.read_text().splitlines()


def pytest_call(calls: list[str]) -> list[str]:
    """The arguments of the last python call: the test run."""
    start = len(calls) - calls[::-1].index("python")
    return [line.removeprefix("  ") for line in calls[start:]]


@pytest.mark.subprocess
def test_the_core_selection_runs_as_given_without_azurite(tmp_path: Path) -> None:
    calls = run_test_script(tmp_path, "-m", "not servers and not slow", "-q")
    assert pytest_call(calls) == [
        *("-m", "pytest", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"),
        *("-m", "not servers and not slow", "-q"),
    ]
    assert not any(call.startswith("npm") for call in calls), "Azurite installed"
    calls = run_test_script(tmp_path, "-mnot slow and not servers")
    assert pytest_call(calls)[-1] == "-mnot slow and not servers"
    assert not any(call.startswith("npm") for call in calls), "Azurite installed"


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "args",
    [
        (),
        ("-m", "slow"),
        ("-m", "not servers or slow"),
        ("-m", "not (servers and slow)"),
        ("-m", "not servers", "-m", "servers"),  # pytest takes the last
    ],
)
def test_a_selection_that_may_need_a_server_installs_azurite(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    calls = run_test_script(tmp_path, *args)
    assert "npm ci --no-audit --no-fund --loglevel=error" in calls
    assert pytest_call(calls) == [
        *("-m", "pytest", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"),
        *args,
    ]
