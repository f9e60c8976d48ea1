"""Progress bars for transfers: on stderr, only on a terminal, only when they take a while.

:class:`Transfer` is an async context manager. The bar appears once the work has run
for ``delay`` seconds (about a second: quick commands never flicker) and is transient:
it disappears when the work ends, leaving the command's real output alone. A bar of
bytes shows the bytes done of the total, the rate and the time left, advanced as each
artifact is read and verified (the library's ``progress`` callbacks). When stderr is
not a terminal, or the command says not to draw (``enabled=False``: ``--json``, or
stdout not a terminal, see :meth:`cairn.cli.session.Session.transfer`), nothing is
drawn at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from cairn import CheckpointManifest

__all__ = ["Transfer", "chain_bytes"]

DEFAULT_DELAY = 1.0


def chain_bytes(manifests: Iterable[object]) -> int:
    """The bytes (decoded) the artifacts and directory files of ``manifests`` list, their
    chains included: the total of a bar that verifying them advances. Anything that is not
    a manifest (a damaged one, as :meth:`cairn.ObjectStoreCheckpointer.load_manifests`
    returns it) counts 0."""
    listed = [manifest for manifest in manifests if isinstance(manifest, CheckpointManifest)]
    artifacts = sum(entry.size_bytes for m in listed for _, entry in m.partition_entries())
    return artifacts + sum(file.size_bytes for m in listed for _, file in m.file_entries())


class Transfer:
    """One task's progress: ``total`` bytes, or items with ``unit="items"``.

    A ``total`` of None (unknown yet, see :meth:`set_total`) shows a pulsing bar; with
    ``unit=""`` only the description and the elapsed time are shown.
    """

    def __init__(
        self,
        console: Console,
        description: str,
        total: float | None,
        *,
        unit: str = "bytes",
        delay: float = DEFAULT_DELAY,
        enabled: bool = True,
    ) -> None:
        columns: list[ProgressColumn] = [
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
        ]
        if unit == "bytes":
            columns += [
                DownloadColumn(binary_units=True),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
            ]
        elif unit == "items":
            columns += [MofNCompleteColumn(), TimeElapsedColumn()]
        else:
            columns.append(TimeElapsedColumn())
        self.enabled = enabled and console.is_terminal
        self._progress = Progress(
            *columns, console=console, transient=True, disable=not self.enabled
        )
        self._task: TaskID = self._progress.add_task(description, total=total)
        self._delay = delay
        self._timer: asyncio.TimerHandle | None = None
        self._shown = False

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` more bytes (or items) as done."""
        self._progress.advance(self._task, amount)

    def set_total(self, total: float) -> None:
        """Set the total once it is known."""
        self._progress.update(self._task, total=total)

    def restart(self, description: str, total: float | None) -> None:
        """Start a new phase: nothing done yet of ``total``, under ``description``."""
        self._progress.reset(self._task, total=total, description=description)

    @property
    def task(self) -> Task:
        """The bar's task: its description, ``completed`` and ``total`` so far."""
        return self._progress.tasks[0]

    def describe(self, description: str) -> None:
        """Change the text shown before the bar."""
        self._progress.update(self._task, description=description)

    def _show(self) -> None:
        if self.enabled and not self._shown:
            self._shown = True
            self._progress.start()

    async def __aenter__(self) -> Transfer:
        if self.enabled:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._show)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._shown:
            self._progress.stop()
