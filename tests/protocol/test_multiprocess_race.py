"""Eight writer *processes* race on one store: a local directory, an S3 and a GCS bucket.

Each writer is ``crash_child.py race`` in its own interpreter; writer ``w`` saves
``ROUNDS`` checkpoints with epochs ``r * 8 + w`` and reports the id and the exact
manifest bytes of each commit. All eight start saving together (they wait for ``go`` on
stdin once ready). Afterwards:

* ``_latest`` names the checkpoint with the greatest ``(epoch, id)`` committed, and
  ``load_latest()`` loads it, verified;
* every manifest in the store is byte-identical to what its writer reported;
* the listed checkpoints are exactly the reported ones: no commit lost, none invented.

On the local store the compare-and-swap of ``_latest`` is a file lock between processes
(see :mod:`cairn.stores`), so this is the test that it holds between interpreters.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import subprocess
import time
from pathlib import Path

import pytest
from support.backends import make_store
from support.children import child_store, start_child, wait_for_line
from support.crash_child import parse_lines, race_data

from cairn import CheckpointId, ObjectStoreCheckpointer
from cairn.format.manifest import decode_manifest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

WRITERS = 8
ROUNDS = 5
RUN_TIMEOUT = 120.0  # every writer must be done within this after "go"


async def check_store(
    reader: ObjectStoreCheckpointer, reported: dict[CheckpointId, bytes], context: str
) -> None:
    listed = await reader.list_checkpoints()
    assert sorted(listed) == sorted(reported), (
        f"{context}: listed minus reported: {sorted(set(listed) - set(reported))}, "
        f"reported minus listed: {sorted(set(reported) - set(listed))}"
    )
    for cid, body in reported.items():
        stored = bytes((await reader.store.get(reader.paths.manifest(cid))).data)
        assert stored == body, f"{context}: the manifest of {cid} is not what its writer saved"
    epochs = {cid: decode_manifest(str(cid), body).epoch for cid, body in reported.items()}
    best = max(reported, key=lambda cid: (epochs[cid], cid))
    assert epochs[best] == ROUNDS * WRITERS - 1, context
    assert await reader.read_latest() == best, f"{context}: _latest is not the newest commit"
    latest = await reader.load_latest()
    assert latest is not None and latest.checkpoint_id == best, context
    round_, writer = divmod(epochs[best], WRITERS)
    expected = race_data(writer, round_, WRITERS).snapshots
    assert {key: bytes(data) for key, data in latest.artifacts.items()} == expected, context


@pytest.mark.parametrize("kind", ["local", "s3", "gcs"])
def test_eight_writer_processes_race_to_latest(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seed = random.randrange(2**32)
    context = f"[{kind}] seed={seed}"
    reader = ObjectStoreCheckpointer(make_store(kind, tmp_path, request))
    where = child_store(kind, tmp_path, request)
    logs = tmp_path / "writers"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    began = time.monotonic()
    try:
        for w in range(WRITERS):
            args = ["race", "--writer", str(w), "--writers", str(WRITERS)]
            args += ["--rounds", str(ROUNDS), "--seed", str(seed + w)]
            out, err = logs / f"{w}.out", logs / f"{w}.err"
            procs.append(start_child(args, where["store"], where["env"], out, err, stdin=True))
        for w, proc in enumerate(procs):
            out, err = logs / f"{w}.out", logs / f"{w}.err"
            wait_for_line(proc, out, "ready", f"{context} writer {w}", err)
        started = time.monotonic()
        for proc in procs:  # as close together as we can: they all block on stdin
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        deadline = started + RUN_TIMEOUT
        for w, proc in enumerate(procs):
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            assert code == 0, f"{context}: writer {w} exited with {code}:\n{report(logs, w)}"
        raced = time.monotonic() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()

    reported: dict[CheckpointId, bytes] = {}
    for w in range(WRITERS):
        lines = parse_lines((logs / f"{w}.out").read_bytes())
        commits = [line for line in lines if line.kind == "committed"]
        assert len(commits) == ROUNDS, f"{context}: writer {w} reported {len(commits)} commits"
        for line in commits:
            epoch, cid, body = int(line.words[0]), CheckpointId.parse(line.words[1]), line.words[2]
            assert epoch % WRITERS == w, context
            reported[cid] = bytes.fromhex(body)
    asyncio.run(asyncio.wait_for(check_store(reader, reported, context), 60))
    print(
        f"\n{context}: {WRITERS} processes x {ROUNDS} saves raced in {raced:.1f}s "
        f"({time.monotonic() - began:.1f}s with start-up and checks); "
        f"consecutive commits came from different writers {interleaving(reported)} times "
        f"(one writer after another: {WRITERS - 1}, fully interleaved: {WRITERS * ROUNDS - 1})"
    )


def report(logs: Path, writer: int) -> str:
    """What writer ``writer`` printed: its protocol lines (manifests cut short), its stderr."""
    lines = [
        f"{line.kind} {' '.join(line.words)}"[:80]
        for line in parse_lines((logs / f"{writer}.out").read_bytes())
    ]
    stderr = (logs / f"{writer}.err").read_text(errors="replace")
    return "stdout:\n" + "\n".join(lines) + "\nstderr:\n" + stderr


def interleaving(reported: dict[CheckpointId, bytes]) -> int:
    """How often consecutive commits (in manifest time order) come from different writers."""
    manifests = sorted(
        (decode_manifest(str(cid), body) for cid, body in reported.items()),
        key=lambda m: (m.timestamp_ms, m.checkpoint_id),
    )
    writers = [m.epoch % WRITERS for m in manifests]
    return sum(a != b for a, b in itertools.pairwise(writers))
