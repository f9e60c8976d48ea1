"""The options many commands share, declared once, and the command classes that add them.

typer reads a command's options from its function's parameters and has no way to share
a group of them, so the shared ones are declared here once, as the parameters of
:func:`_session_options` and :func:`_table_options`, and the class of a command adds
them to its own: every command but ``demo`` is a :class:`SessionCommand` (``--store``,
``--prefix``, ``--json``, ``--debug``) and a command that prints a table a
:class:`TableCommand` (also ``--wide``, ``--ids`` and ``-o/--output``). When the command
runs, its class takes their values out of the command's parameters and keeps them in its
context, where :func:`cairn.cli.options.launch` reads them: the command's function sees
its own parameters only.

The classes are typer's own command class (through :class:`cairn.cli.help.CairnCommand`),
given to typer with ``cls=``; the options are built by typer from the annotated
parameters (:func:`typer.main.get_command`, documented in typer's "Using Click"), so they
parse, convert and print in the help exactly as a parameter of the function would.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import typer
import typer.main

from cairn.cli.formats import OutputOption
from cairn.cli.help import CairnCommand
from cairn.cli.options import (
    SHARED,
    DebugOption,
    IdsOption,
    JsonOption,
    PrefixOption,
    StoreOption,
    WideOption,
)

__all__ = ["SessionCommand", "TableCommand"]


def _session_options(
    store: StoreOption = None,
    prefix: PrefixOption = None,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """The session options: where the store is, and how the command reports."""


def _table_options(
    wide: WideOption = False,
    full_ids: IdsOption = False,
    output: OutputOption = None,
) -> None:
    """The options of a command that prints a table (see :mod:`cairn.cli.formats`)."""


@functools.cache
def _declared(*functions: Callable[..., None]) -> tuple[Any, ...]:
    """The options typer makes of the parameters of ``functions``, in order."""
    params: list[Any] = []
    for function in functions:
        template = typer.Typer(add_completion=False)
        template.command()(function)
        params += typer.main.get_command(template).params
    return tuple(params)


class SessionCommand(CairnCommand):
    """A command that takes the session options, after its own."""

    shared: ClassVar[tuple[Callable[..., None], ...]] = (_session_options,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        own = list(kwargs.pop("params", None) or [])
        kwargs["params"] = own + [copy.copy(param) for param in _declared(*self.shared)]
        super().__init__(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        """Run the command's function with its own parameters; the shared options' values
        wait in ``ctx.meta`` for :func:`cairn.cli.options.launch`."""
        names = [param.name for param in _declared(*self.shared)]
        ctx.meta[SHARED] = {name: ctx.params.pop(name) for name in names}
        return super().invoke(ctx)


class TableCommand(SessionCommand):
    """A command that prints a table: the session options and the table options."""

    shared = (_table_options, _session_options)
