"""A program that awaits obstore calls and returns right away exits cleanly (exit code 0).

The script below is what a user writes: install cairn's exit guard (``import cairn``
does it; the script calls it explicitly so it runs whatever ``cairn/__init__.py``
holds), await a few obstore calls on a local store and a memory store, and return from
``asyncio.run``. Without the guard, CPython 3.11 aborts such a program during
finalization in a large share of runs (a tokio thread retaking the GIL; see
``cairn/stores/_shutdown.py``). It runs 48 times, four at a time, and every exit must be 0.

``CAIRN_CLEAN_EXIT_CONTROL=1`` also runs the control: the same script with the exit
handler unregistered must abort at least once, which shows that the main test can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

SRC = REPO / "src"

SCRIPT = textwrap.dedent(
    """
    import asyncio
    import os
    import sys

    import cairn.stores._shutdown

    cairn.stores._shutdown.install()
    if os.environ.get("CLEAN_EXIT_GUARD") == "0":  # the control: same imports, no handler
        import atexit

        atexit.unregister(cairn.stores._shutdown._drain_at_exit)

    import obstore
    from obstore.store import LocalStore, MemoryStore


    async def main() -> None:
        memory = MemoryStore()
        await obstore.put_async(memory, "a", b"x")
        await (await obstore.get_async(memory, "a")).bytes_async()

        local = LocalStore(sys.argv[1], mkdir=True)
        await asyncio.gather(*(obstore.put_async(local, f"k{i}", b"x" * 100) for i in range(8)))
        results = await asyncio.gather(*(obstore.get_async(local, f"k{i}") for i in range(8)))
        await asyncio.gather(*(result.bytes_async() for result in results))
        await obstore.list(local).collect_async()
        await obstore.head_async(local, "k0")


    asyncio.run(main())
    """
)

RUNS = 48
PARALLEL = 4


def _run_many(tmp_path: Path, *, guard: bool) -> list[tuple[int, str]]:
    script = tmp_path / "user_program.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["CLEAN_EXIT_GUARD"] = "1" if guard else "0"

    def run(index: int) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / f"store-{index}")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        return done.returncode, done.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        return list(pool.map(run, range(RUNS)))


def test_exit_right_after_obstore_calls_is_clean(tmp_path: Path) -> None:
    results = _run_many(tmp_path, guard=True)
    codes = Counter(code for code, _ in results)
    failures = [stderr for code, stderr in results if code != 0]
    assert not failures, (
        f"exit codes seen (code: runs): {dict(codes)}; stderr of a failed run:\n{failures[0]}"
    )


@pytest.mark.skipif(
    os.environ.get("CAIRN_CLEAN_EXIT_CONTROL") != "1",
    reason="control run; set CAIRN_CLEAN_EXIT_CONTROL=1 to run it",
)
def test_control_without_the_guard_aborts(tmp_path: Path) -> None:
    codes = Counter(code for code, _ in _run_many(tmp_path, guard=False))
    assert set(codes) != {0}, f"no run failed without the guard: {dict(codes)}"
