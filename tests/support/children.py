"""The parent's side of :mod:`support.crash_child`: where a child saves, start it, watch it.

:func:`child_store` names the store :func:`support.backends.make_store` opens, as a child
reaches it (a URL and an environment); :func:`start_child` starts a child on it, its
output going to files; :func:`wait_for_line` waits until it printed a line of a kind.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .crash_child import child_command, child_env, parse_lines
from .servers import gcs_env, s3_store_options

CHILD_LINE_TIMEOUT = 30.0  # the child must print its first line(s) within this


def child_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Keyword arguments for :func:`start_child`: the same store ``make_store`` opens."""
    if kind == "local":
        return {"store": (tmp_path / "store").as_uri(), "env": child_env()}
    if kind == "gcs":
        server = request.getfixturevalue("gcs_server")
        bucket = request.getfixturevalue("gcs_bucket")
        return {"store": f"gs://{bucket}", "env": {**child_env(), **gcs_env(server)}}
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return {"store": f"s3://{bucket}", "env": child_env(s3_store_options(server.endpoint))}


def start_child(
    mode_args: list[str],
    store: str,
    env: dict[str, str],
    out: Path,
    err: Path,
    *,
    stdin: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``crash_child.py MODE ...`` on ``store``, its stdout and stderr going to files.

    Files, not pipes: nothing the child prints can block it, and whatever it printed
    before a SIGKILL is there to read afterwards. ``stdin`` gives it a pipe to read.
    """
    with out.open("wb") as stdout, err.open("wb") as stderr:
        return subprocess.Popen(
            child_command(mode_args[0], store, *mode_args[1:]),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=env,
        )


def wait_for_line(
    proc: subprocess.Popen[bytes], out: Path, kind: str, context: str, err: Path
) -> None:
    """Block until the child printed a ``kind`` line; fail if it exits or takes too long."""
    deadline = time.monotonic() + CHILD_LINE_TIMEOUT
    while not any(line.kind == kind for line in parse_lines(out.read_bytes())):
        if proc.poll() is not None:
            pytest.fail(
                f"{context}: the child exited with {proc.returncode} before printing "
                f"{kind!r}; stdout:\n{out.read_text()}\nstderr:\n{err.read_text()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"{context}: no {kind!r} line within {CHILD_LINE_TIMEOUT}s")
        time.sleep(0.005)
