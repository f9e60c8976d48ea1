"""The demo's child processes: what one run of a job reported, and how it ended.

A demo job prints one JSON object per line on stdout; :func:`read_message` reads the
next within a deadline (a job that stops making progress is killed, and the demo fails
with a clear error), :func:`finish` reads the rest, its stderr and its exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from cairn.cli.errors import CliError, ExitCode

__all__ = [
    "PHASE_TIMEOUT",
    "ChildRun",
    "Kill",
    "child_failed",
    "finish",
    "kill_at_random",
    "read_message",
    "spawn",
]

PHASE_TIMEOUT = 120.0
"""Seconds one phase of a demo (a run of the job) may take at most."""


@dataclass
class ChildRun:
    """What one run of the job reported on stdout, and how it ended."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """The messages of one ``type``."""
        return [m for m in self.messages if m.get("type") == kind]


@dataclass
class Kill:
    """When and how the first run was killed."""

    after_checkpoints: int
    delay_ms: int
    pid: int
    killed: bool = False


async def read_message(proc: asyncio.subprocess.Process, deadline: float) -> dict[str, Any] | None:
    """The next message of ``proc``, or None at the end of its output; a job silent
    past ``deadline`` is killed (:class:`CliError`)."""
    assert proc.stdout is not None
    remaining = max(0.01, deadline - time.monotonic())
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), remaining)
    except TimeoutError:
        proc.kill()
        raise CliError(
            "the demo job stopped making progress (timed out)", ExitCode.INTEGRITY
        ) from None
    if not line:
        return None
    message = json.loads(line)
    if not isinstance(message, dict):
        raise CliError(f"the demo job printed {line!r}", ExitCode.INTEGRITY)
    return message


async def finish(proc: asyncio.subprocess.Process, run_: ChildRun, deadline: float) -> None:
    """Read the rest of ``proc``'s messages into ``run_``, then its stderr and status."""
    while (message := await read_message(proc, deadline)) is not None:
        run_.messages.append(message)
    assert proc.stderr is not None
    run_.stderr = (await proc.stderr.read()).decode(errors="replace")
    run_.returncode = await proc.wait()


async def kill_at_random(
    proc: asyncio.subprocess.Process,
    stream_seconds: float,
    checkpoints: int,
    rng: random.Random,
) -> tuple[ChildRun, Kill]:
    """Read a paced job's messages until a random checkpoint, SIGKILL it a random moment
    within the next interval, and collect what it said (a run that ends first is not
    killed: the caller checks its exit)."""
    interval = stream_seconds / checkpoints
    kill = Kill(
        after_checkpoints=rng.randint(1, max(1, checkpoints - 2)),
        delay_ms=int(rng.uniform(0, interval) * 1000),
        pid=proc.pid,
    )
    run_ = ChildRun()
    deadline = time.monotonic() + PHASE_TIMEOUT
    while len(run_.of_type("checkpoint")) < kill.after_checkpoints:
        message = await read_message(proc, deadline)
        if message is None:
            break
        run_.messages.append(message)
    else:
        await asyncio.sleep(kill.delay_ms / 1000)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
                kill.killed = True
    await finish(proc, run_, deadline)
    return run_, kill


async def spawn(command: list[str]) -> asyncio.subprocess.Process:
    """Start a demo job's process, its output piped back (see :func:`read_message`)."""
    return await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def child_failed(what: str, run_: ChildRun) -> None:
    """Raise the failure of a job run that ended badly, with its last line of errors."""
    lines = [line for line in run_.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "no error output"
    raise CliError(f"{what} exited with status {run_.returncode}: {last}", ExitCode.INTEGRITY)
