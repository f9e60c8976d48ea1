"""The ``cairn`` group: its options, ``--version``, and the table of its commands.

Every command takes ``--store URL`` (or ``$CAIRN_STORE``; default ``./checkpoints``),
``--prefix`` (or ``$CAIRN_PREFIX``; default the store's root, ``checkpoints/`` for a
store cairn 0.1 wrote, or the newest demo run's, see :mod:`cairn.cli.session`),
``--json`` and ``--debug``, after the command or before it (:mod:`cairn.cli.options`).
Each command checks its arguments first (ids, policy, URLs, target directory), then
opens the store. The commands are in :mod:`cairn.cli.commands`; exit codes are
documented in :mod:`cairn.cli.errors`; the JSON documents in
``cairn/cli/schemas/*.schema.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import typer

from cairn.cli.command import SessionCommand, TableCommand
from cairn.cli.commands.browse import history_command, list_command, show_command
from cairn.cli.commands.collect import delete_command, gc_command
from cairn.cli.commands.dcp_dirs import export_dcp_command, import_dcp_command
from cairn.cli.commands.hf_files import export_hf_command, import_hf_command
from cairn.cli.commands.transfer import copy_command, restore_command, verify_command
from cairn.cli.errors import EXIT_CODES_HELP
from cairn.cli.help import CairnCommand, CairnGroup
from cairn.cli.options import remember_before
from cairn.cli.session import distribution_version
from cairn.demo.harness import demo_command

__all__ = ["COMMANDS", "Invocation", "app"]

SUMMARY = "Inspect, verify, restore, copy and collect cairn checkpoints in any object store."

app = typer.Typer(
    name="cairn",
    cls=CairnGroup,
    help=f"{SUMMARY}\n\n{EXIT_CODES_HELP}",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

COMMANDS: tuple[tuple[str, Callable[..., None], type[CairnCommand]], ...] = (
    ("list", list_command, TableCommand),
    ("history", history_command, TableCommand),
    ("show", show_command, TableCommand),
    ("verify", verify_command, TableCommand),
    ("restore", restore_command, SessionCommand),
    ("delete", delete_command, SessionCommand),
    ("gc", gc_command, TableCommand),
    ("copy", copy_command, SessionCommand),
    ("export-dcp", export_dcp_command, SessionCommand),
    ("import-dcp", import_dcp_command, SessionCommand),
    ("export-hf", export_hf_command, SessionCommand),
    ("import-hf", import_hf_command, SessionCommand),
    ("demo", demo_command, CairnCommand),
)
"""Each command's name, function and class (the shared options it takes:
:mod:`cairn.cli.command`), in the order ``cairn --help`` lists them."""

for name, function, command_class in COMMANDS:
    app.command(name, cls=command_class)(function)


@dataclass
class Invocation:
    """What the group learns of a run of ``cairn`` (its context's ``obj``): the command
    named, once the group's own options have been read."""

    command: str | None = None

    def command_path(self) -> str:
        """``cairn`` and the command: where ``--help`` explains a usage error."""
        return " ".join(filter(None, ("cairn", self.command)))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cairn {distribution_version()}")
        raise typer.Exit()


_EARLY = " Before the command too; one given after it wins."


@app.callback()
def _root(
    ctx: typer.Context,
    store: Annotated[
        str | None,
        typer.Option("--store", metavar="URL", help="The store URL of the command." + _EARLY),
    ] = None,
    prefix: Annotated[
        str | None,
        typer.Option("--prefix", metavar="PREFIX", help="The base prefix of the command." + _EARLY),
    ] = None,
    json_mode: Annotated[
        bool, typer.Option("--json", help="The command prints one JSON document." + _EARLY)
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="The command shows its log and tracebacks." + _EARLY)
    ] = False,
    version: Annotated[
        bool,
        typer.Option("-V", "--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """The ``cairn`` group (its help is the app's); keeps the session options given
    before the command for the command to use, and the command's name."""
    remember_before(ctx, store, prefix, json_mode, debug)
    if isinstance(ctx.obj, Invocation):
        ctx.obj.command = ctx.invoked_subcommand
