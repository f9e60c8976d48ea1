"""A program that uses cairn and exits right after an async store call exits cleanly.

The script below is what a user writes: import cairn, await a call, then (as engines
do) a couple of its own obstore calls, and return. Without cairn's exit guard
(cairn/_shutdown.py) CPython 3.11 aborts it in a good share of runs: with the guard
switched off (``GRACE_SECONDS = 0``), 18 of 60 runs here ended in SIGABRT (exit 134).
It runs 32 times per store kind, four at a time, and every exit must be 0.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import obstore
    import cairn

    async def main() -> None:
        store = cairn.open_store(sys.argv[1])
        ckpt = cairn.ObjectStoreCheckpointer(store)
        assert await ckpt.read_latest() is None
        await obstore.put_async(store, "engine/marker", b"x")

        async def read() -> None:
            result = await obstore.get_async(store, "engine/marker")
            await result.bytes_async()

        await asyncio.gather(*(read() for _ in range(8)))

    asyncio.run(main())
    """
)

RUNS = 32


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_exit_right_after_a_store_call_is_clean(kind: str, tmp_path: Path) -> None:
    script = tmp_path / "user_program.py"
    script.write_text(SCRIPT)

    def run(index: int) -> int:
        url = (tmp_path / f"store-{index}").as_uri() if kind == "file" else "memory://"
        done = subprocess.run(
            [sys.executable, str(script), url], capture_output=True, timeout=60, check=False
        )
        return done.returncode

    with ThreadPoolExecutor(max_workers=4) as pool:
        codes = list(pool.map(run, range(RUNS)))
    assert codes == [0] * RUNS, f"exit codes seen: {sorted(set(codes))}, {codes.count(0)} clean"
