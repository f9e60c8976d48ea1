"""Progress of ``restore``, ``copy`` and ``verify``: bytes as they move, on a terminal only."""

from __future__ import annotations

import asyncio
import hashlib
import io
from pathlib import Path

from obstore.store import MemoryStore
from rich.console import Console

from cairn import CheckpointData, CheckpointId, CheckpointPaths, ObjectStoreCheckpointer
from cairn.cli.copy import copy_checkpoints
from cairn.cli.output import Output
from cairn.cli.progress import Transfer
from cairn.cli.restore import restore
from cairn.cli.session import Session
from cairn.cli.verify import verify

PART = 256 * 1024
PARTS = 4


def terminal(screen: io.StringIO | None = None) -> Console:
    return Console(file=screen or io.StringIO(), force_terminal=True, width=120)


class Recording(Transfer):
    """A bar on a terminal that records ``(description, completed, total)`` at each step."""

    def __init__(self) -> None:
        super().__init__(terminal(), "starting", None, delay=0)
        self.steps: list[tuple[str, float, float | None]] = []

    def advance(self, amount: float = 1) -> None:
        super().advance(amount)
        self.steps.append((self.task.description, self.task.completed, self.task.total))


async def saved(count: int = 1) -> tuple[ObjectStoreCheckpointer, list[CheckpointId]]:
    ckpt = ObjectStoreCheckpointer(MemoryStore(), CheckpointPaths("ck/"))
    ids = []
    for epoch in range(count):
        snapshots = {("op", p): bytes([epoch, p]) * (PART // 2) for p in range(PARTS)}
        data = CheckpointData(epoch=epoch, snapshots=snapshots)
        ids.append((await ckpt.save(data)).checkpoint_id)
    return ckpt, ids


def intermediate(steps: list[tuple[str, float, float | None]], phase: str) -> list[float]:
    """The byte counts of ``phase`` reported before it was done."""
    return [done for what, done, total in steps if what.startswith(phase) and done < (total or 0)]


def test_restore_reports_bytes_as_each_artifact_is_read(tmp_path: Path) -> None:
    async def scenario() -> Recording:
        ckpt, [cid] = await saved()
        bar = Recording()
        async with bar:
            await restore(ckpt, cid, tmp_path / "out", bar)
        return bar

    bar = asyncio.run(scenario())
    reading = intermediate(bar.steps, "reading")
    assert reading == [PART * n for n in range(1, PARTS)]  # in bytes, before the end
    totals = {total for what, _, total in bar.steps if what.startswith("reading")}
    assert totals == {PART * PARTS}
    assert intermediate(bar.steps, "writing")  # the files written, as they are


def test_verify_and_copy_report_bytes_not_checkpoints() -> None:
    async def scenario() -> tuple[Recording, Recording]:
        ckpt, ids = await saved(3)
        checked, copied = Recording(), Recording()
        async with checked:
            verified = await verify(ckpt, ids, checked)
        assert all(r.ok for r in verified)
        target = ObjectStoreCheckpointer(MemoryStore(), CheckpointPaths("ck/"))
        async with copied:
            copies = await copy_checkpoints(ckpt, target, ids, copied)
        assert all(r.ok for r in copies)
        return checked, copied

    for bar in asyncio.run(scenario()):
        whole = 3 * PARTS * PART
        assert {total for _, _, total in bar.steps} == {whole}
        assert [done for _, done, _ in bar.steps] == [PART * n for n in range(1, 3 * PARTS + 1)]


def test_a_bar_of_bytes_shows_size_rate_and_time_left() -> None:
    async def draw(screen: io.StringIO) -> None:
        async with Transfer(terminal(screen), "restoring", 4 * 1024 * 1024, delay=0) as bar:
            await asyncio.sleep(0.05)
            bar.advance(1024 * 1024)
            await asyncio.sleep(0.3)  # rich redraws ten times a second

    screen = io.StringIO()
    asyncio.run(draw(screen))
    text = screen.getvalue()
    assert "restoring" in text and "1.0/4.0 MiB" in text
    assert "/s" in text or "?" in text  # the rate column
    assert "-:--:--" in text or "0:00:0" in text  # the time left column


def test_no_bar_unless_both_streams_are_terminals_and_not_json() -> None:
    def bar(out_tty: bool, err_tty: bool, json_mode: bool) -> bool:
        out = Console(file=io.StringIO(), force_terminal=out_tty)
        err = Console(file=io.StringIO(), force_terminal=err_tty)
        session = Session(None, None, Output(json_mode=json_mode, out=out, err=err))
        return session.transfer("copying", 10).enabled

    assert bar(True, True, False)
    assert not bar(False, True, False)  # stdout to a pipe or a file
    assert not bar(True, False, False)
    assert not bar(True, True, True)  # --json


def test_a_disabled_bar_writes_nothing(tmp_path: Path) -> None:
    async def scenario(screen: io.StringIO) -> None:
        ckpt, [cid] = await saved()
        bar = Transfer(terminal(screen), "restoring", None, delay=0, enabled=False)
        async with bar:
            await restore(ckpt, cid, tmp_path / "out", bar)

    screen = io.StringIO()
    asyncio.run(scenario(screen))
    assert screen.getvalue() == ""


def test_a_streamed_restore_reports_each_range(tmp_path: Path) -> None:
    async def scenario() -> list[int]:
        ckpt, [cid] = await saved()
        manifest = await ckpt.load_manifest(cid)
        [(_, relative, size)] = manifest.stored_objects()  # one pack of the four partitions
        path = ckpt.paths.resolve(cid, relative)
        digest = hashlib.sha256(bytes((await ckpt.store.get(path)).data)).hexdigest()
        seen: list[int] = []
        await ckpt.load_artifact_to(
            path,
            tmp_path / "artifact",
            expected_sha256=digest,
            chunk_size=size // 4,
            progress=seen.append,
        )
        return seen

    assert asyncio.run(scenario()) == [PART * PARTS // 4] * 4
