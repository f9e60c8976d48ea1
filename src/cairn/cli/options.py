"""The options the commands share, and the value of each that a command runs with.

The session options, ``--store``, ``--prefix``, ``--json`` and ``--debug``, are declared
once (:mod:`cairn.cli.command`) and every command's class adds them after its own; the
``cairn`` group takes the same four before the command (``cairn --store X list``;
:func:`remember_before`). :func:`launch` runs a command with, for each, the value given
after the command, else the one given before it, else its environment variable or
default. A command with a table also takes ``--wide``, ``--ids`` and ``-o/--output``
(:mod:`cairn.cli.formats`), which :func:`launch` settles together: a clash is a usage
error, reported as the command's failure.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from cairn.cli.errors import CliError, ExitCode
from cairn.cli.formats import OutputFormat, Shown, apply_output
from cairn.cli.limits import at_least
from cairn.cli.pricing import GivenPrices, parse_prices
from cairn.cli.session import Session, run

__all__ = [
    "AllOption",
    "Body",
    "CostOption",
    "DcpRefArgument",
    "DebugOption",
    "EpochOption",
    "Given",
    "IdsOption",
    "JsonOption",
    "LimitOption",
    "PrefixOption",
    "PriceOption",
    "RefArgument",
    "RefsArgument",
    "SinceOption",
    "SkipNewerOption",
    "StoreOption",
    "WideOption",
    "launch",
    "remember_before",
]

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="CAIRN_STORE",
        metavar="URL",
        help="Store URL (file:///dir, s3://bucket/prefix, gs://…, az://…, memory://) or a "
        "local path. \\[default: ./checkpoints]",
        show_default=False,
    ),
]
PrefixOption = Annotated[
    str | None,
    typer.Option(
        "--prefix",
        envvar="CAIRN_PREFIX",
        metavar="PREFIX",
        help="Base prefix of the checkpoints in the store. \\[default: the store's root "
        "(checkpoints/ for a store cairn 0.1 wrote), or the newest `cairn demo` run when "
        "nothing is there]",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout (a failure included)."),
]
DebugOption = Annotated[
    bool, typer.Option("--debug", help="Show cairn's log and the traceback of a failure.")
]
AllOption = Annotated[bool, typer.Option("--all", help="Every committed checkpoint.")]
RefArgument = Annotated[
    str,
    typer.Argument(
        metavar="ID|latest",
        help="A checkpoint id, its unique start (8 characters or more), 'latest' (the "
        "newest checkpoint that loads and verifies, as load_latest finds it) or 'newest' "
        "(the newest committed, whether it loads or not).",
    ),
]
DcpRefArgument = Annotated[
    str,
    typer.Argument(
        metavar="ID|latest|NAME",
        help="A checkpoint id, 'latest' (the latest DCP save), or a checkpoint name.",
    ),
]
EpochOption = Annotated[
    int, typer.Option("--epoch", metavar="N", min=0, help="The epoch to record.")
]
RefsArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="ID|latest",
        help="Checkpoint ids, their unique starts (8 characters or more), 'latest' (the "
        "newest checkpoint that loads and verifies, as load_latest finds it) or 'newest' "
        "(the newest committed, whether it loads or not).",
        show_default=False,
    ),
]
WideOption = Annotated[
    bool,
    typer.Option("--wide", "-w", help="Every column and whole ids, however wide the terminal."),
]
IdsOption = Annotated[
    bool,
    typer.Option(
        "--ids",
        help="Whole checkpoint ids instead of their short form; with list, the ids alone, "
        "one per line.",
    ),
]
SkipNewerOption = Annotated[
    bool,
    typer.Option(
        "--skip-newer-format",
        help="With 'latest' or 'newest': pass over checkpoints a newer cairn wrote "
        "(format features this cairn does not know) and take the newest this cairn "
        "reads, instead of failing (exit 5).",
    ),
]
LimitOption = Annotated[int | None, at_least("--limit", 1, "Only the N newest (after --since).")]
SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="AGE|DATE",
        help="Only those created since: an age (7d, 12h) or a date (2026-01-31, "
        "2026-01-31T12:00Z; UTC unless an offset is given).",
        show_default=False,
    ),
]

CostOption = Annotated[
    bool,
    typer.Option(
        "--cost",
        help="Dollars per checkpoint and per day at the observed interval (the median gap "
        "between commit times), from each save's requests by kind and stored bytes, at "
        "the list prices of the store's cloud (s3://, gs://, az://); see --price.",
    ),
]


def _price(text: str | GivenPrices) -> GivenPrices:
    """``--price``'s parser: a usage error (exit 2) that quotes the bad token."""
    try:
        return parse_prices(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


PriceOption = Annotated[
    GivenPrices | None,
    typer.Option(
        "--price",
        metavar="KEY=USD,...",
        parser=_price,
        help="Prices instead of the built-in ones (implies --cost): "
        "put=…,get=…,head=…,list=…,delete=… in USD per 1,000 requests, gb_month=… in USD "
        "per GiB-month; those not given keep the built-in price (a local or memory store "
        "has none: give all five kinds).",
        show_default=False,
    ),
]

_SESSION_OPTIONS = ("store", "prefix", "json_mode", "debug")
"""The names of the session options' parameters."""

SHARED = "cairn.shared_options"
"""Where a command's class keeps the values of the shared options given to the command
(``ctx.meta``): a mapping of each parameter's name to its value."""

_BEFORE = "cairn.session_options"
"""Where the group keeps the session options given before the command (``ctx.meta``)."""


@dataclass(frozen=True)
class Given:
    """A command's session options and table flags, as given after the command."""

    store: str | None
    prefix: str | None
    json_mode: bool
    debug: bool
    output: OutputFormat | None = None
    wide: bool = False
    full_ids: bool = False


Body = Callable[[Session], Awaitable[ExitCode | None]]
"""What a command does in its session: its exit code (None: 0), or a failure raised."""


def remember_before(
    ctx: typer.Context, store: str | None, prefix: str | None, json_mode: bool, debug: bool
) -> None:
    """Keep the session options given before the command, for :func:`launch`."""
    ctx.meta[_BEFORE] = {"store": store, "prefix": prefix, "json_mode": json_mode, "debug": debug}


def launch(ctx: typer.Context, body: Body, *, full_ids: bool = False) -> None:
    """Run ``body`` in the session the options ask for (see the module docstring), as
    :func:`cairn.cli.session.run` runs a command: its exit code, its failure, its JSON.
    ``full_ids`` is the ``--ids`` of a command that takes it without the other table
    options."""
    given = _with_before(ctx, Given(**{"full_ids": full_ids, **ctx.meta[SHARED]}))
    flags = Shown(given.json_mode, given.wide, given.full_ids)
    try:
        shown = apply_output(given.output, flags)
    except CliError as clash:
        refused = Session.create(given.store, given.prefix, flags.json_mode, given.debug)
        run(refused, functools.partial(_raise, clash))
        return
    session = Session.create(
        given.store,
        given.prefix,
        shown.json_mode,
        given.debug,
        wide=shown.wide,
        full_ids=shown.full_ids,
    )
    run(session, lambda: body(session))


def _with_before(ctx: typer.Context, given: Given) -> Given:
    """``given`` with each session option that was not given after the command taken
    from before it, where it was given there."""
    before: dict[str, Any] = ctx.find_root().meta.get(_BEFORE, {})
    earlier: dict[str, Any] = {}
    for name in _SESSION_OPTIONS:
        source = ctx.get_parameter_source(name)
        value = before.get(name)
        if (source is None or source.name != "COMMANDLINE") and value not in (None, False):
            earlier[name] = value
    return dataclasses.replace(given, **earlier)


async def _raise(error: CliError) -> ExitCode | None:
    raise error
