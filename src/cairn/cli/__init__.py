"""The ``cairn`` command line: inspect, verify, restore, copy and collect checkpoints.

``main()`` is the console script's entry point (``cairn = "cairn.cli:main"``); it is
also what ``python -m cairn.cli`` runs. The modules, one job each:

* :mod:`cairn.cli.app`: the typer commands (option parsing, then one call each);
* :mod:`cairn.cli.session`: the store URL and prefix, running a command, logging;
* :mod:`cairn.cli.errors`: exit codes and the one-line error messages;
* :mod:`cairn.cli.output`, :mod:`cairn.cli.views`: consoles, units, tables, JSON;
* :mod:`cairn.cli.progress`: progress bars for long transfers;
* :mod:`cairn.cli.catalog`, :mod:`cairn.cli.verify`, :mod:`cairn.cli.restore`,
  :mod:`cairn.cli.files`, :mod:`cairn.cli.copy`, :mod:`cairn.cli.maintain`: the
  operations;
* :mod:`cairn.cli.demo`: ``cairn demo`` (the job itself is :mod:`cairn.demo`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cairn`` with ``argv`` (default: the process arguments); returns the exit code.

    Usage errors are reported as one ``error: ...`` line on stderr with exit code 2;
    every other failure is handled by the command itself (see :mod:`cairn.cli.errors`).
    """
    import importlib

    import typer

    from cairn.cli.app import app
    from cairn.cli.errors import ExitCode, click_exceptions, one_line

    errors = click_exceptions()
    # typer >= 0.26 keeps Abort in typer.exceptions, beside its vendored click; older
    # versions raise click's own.
    aborted = getattr(errors, "Abort", None) or importlib.import_module("typer.exceptions").Abort
    command = typer.main.get_command(app)
    try:
        result = command.main(
            args=list(argv) if argv is not None else None,
            prog_name="cairn",
            standalone_mode=False,
        )
    except errors.UsageError as exc:
        if not exc.format_message().strip():  # no arguments at all: the help was printed
            return int(ExitCode.USAGE)
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        typer.echo(f"error: {one_line(exc.format_message())}{hint}", err=True)
        return int(ExitCode.USAGE)
    except errors.ClickException as exc:
        typer.echo(f"error: {one_line(exc.format_message())}", err=True)
        return int(exc.exit_code)
    except aborted:
        typer.echo("error: aborted", err=True)
        return 130
    return result if isinstance(result, int) else int(ExitCode.OK)
