"""Tools for tests of the ``cairn`` command line: run it as a user does, fill stores.

:func:`cairn` runs one command as a real subprocess (``python -m cairn.cli``) in an
environment without cairn's, the clouds' or rich's settings; :func:`cairn_many` runs
independent commands a few at a time. :func:`fill` saves the three checkpoints of
:class:`Filled` (:func:`fill_store` with cairn's defaults; the ``local`` fixture in a
fresh directory store). :func:`document` and :func:`failure` check a ``--json`` document
against its command's JSON Schema.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from obstore.store import ObjectStore, S3Store

from cairn import (
    CheckpointData,
    CheckpointId,
    CheckpointPaths,
    ObjectStoreCheckpointer,
    SourceOffsetEntry,
)
from cairn.cli import views

from .artifacts import artifact_path
from .servers import S3_ACCESS_KEY_ID, S3_REGION, S3_SECRET_ACCESS_KEY, S3Server

CLI = [sys.executable, "-m", "cairn.cli"]
PARALLEL = 4
PREFIX = ""
"""Where :func:`fill_store` saves: cairn's default, the store's root."""


# -- running the command line --------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One finished ``cairn`` process."""

    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """The JSON document printed on stdout."""
        return json.loads(self.stdout)

    def explain(self) -> str:
        """What to print when an assertion about this run fails."""
        return f"cairn {' '.join(self.args)} -> {self.code}\n{self.stdout}\n{self.stderr}"

    def error_line(self) -> str:
        """The single ``error: ...`` line a failing command prints on stderr."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, self.explain()
        assert lines[0].startswith("error: "), self.explain()
        assert "Traceback" not in self.stderr, self.explain()
        return lines[0]


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess: ours, without cairn's and rich's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CAIRN_", "AWS_", "GOOGLE_", "GCE_")) and k not in ("COLUMNS", "LINES")
    }
    env.update(extra or {})
    return env


def cairn(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Run:
    """Run ``cairn ARGS`` to completion."""
    import subprocess

    proc = subprocess.run(
        [*CLI, *args],
        env=base_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Run(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def cairn_many(
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> list[Run]:
    """Run independent commands, a few at a time; results in the order given."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(lambda args: cairn(*args, env=env, cwd=cwd), commands))


# -- stores --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filled:
    """A store holding three checkpoints: a full one, a delta on it, and another full one.

    ``base`` is full (epoch 1); ``delta`` (epoch 2) has ``base`` as parent, a delta for
    ``("agg", 0)`` and carries ``("agg", 1)`` and ``("join", 0)`` over by reference;
    ``newest`` (epoch 3) is full and independent, and is the latest.
    """

    url: str
    base: CheckpointId
    delta: CheckpointId
    newest: CheckpointId
    artifacts: dict[str, bytes]
    """Objects of the store and the bytes they hold, by path relative to the base prefix."""
    base_snapshot: str
    """The object holding ``base``'s snapshot of ``("agg", 0)``, relative to the base
    prefix: a pack that holds it first (damaging its byte 3 damages that snapshot), then
    ``("agg", 1)`` and ``("join", 0)``."""
    delta_artifact: str
    """``delta``'s delta of ``("agg", 0)``, relative to the base prefix."""

    @property
    def ids(self) -> list[str]:
        """The three ids, oldest first."""
        return [str(self.base), str(self.delta), str(self.newest)]


def offsets(position: int, epoch: int) -> dict[str, SourceOffsetEntry]:
    """The source offsets of a test checkpoint."""
    return {"events": SourceOffsetEntry("kafka", {"events-0": str(position)}, epoch)}


async def fill(ckpt: ObjectStoreCheckpointer, url: str) -> Filled:
    """Save the three checkpoints of :class:`Filled`."""
    first = {("agg", 0): b"agg-0 base " * 50, ("agg", 1): b"agg-1 base", ("join", 0): b"j0"}
    base = await ckpt.save(CheckpointData(epoch=1, snapshots=first, source_offsets=offsets(100, 1)))
    delta = await ckpt.save(
        CheckpointData(
            epoch=2,
            deltas={("agg", 0): b"agg-0 delta"},
            parent_id=base.checkpoint_id,
            source_offsets=offsets(200, 2),
        )
    )
    newest = await ckpt.save(
        CheckpointData(
            epoch=3,
            snapshots={("agg", 0): b"agg-0 v3", ("agg", 1): b"agg-1 v3", ("join", 0): b"j0 v3"},
            source_offsets=offsets(300, 3),
            watermark=1234,
        )
    )
    prefix = ckpt.paths.base_prefix
    base_snapshot = artifact_path(ckpt.paths, base, "agg", 0).removeprefix(prefix)
    delta_artifact = artifact_path(ckpt.paths, delta, "agg", 0, is_delta=True).removeprefix(prefix)
    return Filled(
        url=url,
        base=base.checkpoint_id,
        delta=delta.checkpoint_id,
        newest=newest.checkpoint_id,
        artifacts={
            base_snapshot: b"".join(first.values()),  # a pack: the three, in order
            delta_artifact: b"agg-0 delta",  # alone in its save: an object of its own
        },
        base_snapshot=base_snapshot,
        delta_artifact=delta_artifact,
    )


def fill_store(store: ObjectStore | str, url: str) -> Filled:
    """Fill ``store`` (which the command line reaches as ``url``) under :data:`PREFIX`
    with the checkpoints of :class:`Filled`, through a checkpointer of cairn's defaults."""
    return asyncio.run(fill(ObjectStoreCheckpointer(store, CheckpointPaths(PREFIX)), url))


@pytest.fixture
def local(tmp_path: Path) -> Filled:
    """A local directory store with the checkpoints of :class:`Filled`."""
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()
    return fill_store(url, url)


def s3_env(server: S3Server) -> dict[str, str]:
    """What a subprocess needs to reach the moto server through ``s3://bucket`` URLs."""
    return {
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
        "AWS_REGION": S3_REGION,
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
    }


def s3_store(server: S3Server, bucket: str) -> S3Store:
    """The bucket as an obstore store, for filling and damaging it in-process."""
    return S3Store(
        bucket,
        endpoint=server.endpoint,
        access_key_id=S3_ACCESS_KEY_ID,
        secret_access_key=S3_SECRET_ACCESS_KEY,
        region=S3_REGION,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )


def flip_byte(path: Path, index: int = 3) -> None:
    """Damage one byte of a local file."""
    data = bytearray(path.read_bytes())
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


def store_root(filled: Filled) -> Path:
    """The directory of a local store."""
    return Path(filled.url.removeprefix("file://"))


# -- --json documents ---------------------------------------------------------------------


SCHEMAS = {command: views.json_schema(command) for command in views.COMMANDS_WITH_SCHEMAS}
"""The JSON Schema of each command's ``--json`` document."""


def document(command: str, run: Run) -> dict[str, Any]:
    """The one JSON object ``run`` printed, validated against ``command``'s schema."""
    doc = json.loads(run.stdout)  # exactly one document: trailing output fails to parse
    assert isinstance(doc, dict), run.explain()
    jsonschema.Draft202012Validator(SCHEMAS[command]).validate(doc)
    assert doc["schema_version"] == 1
    return doc


def failure(command: str, run: Run, code: int, kind: str) -> dict[str, Any]:
    """The error member of a failed run's document; checks it against stderr and the code."""
    assert run.code == code, run.explain()
    doc = document(command, run)
    error = doc["error"]
    assert error["exit_code"] == code and error["type"] == kind, run.explain()
    assert f"error: {error['message']}" == run.error_line()
    return doc
