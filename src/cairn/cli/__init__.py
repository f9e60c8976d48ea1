"""The ``cairn`` command line: inspect, verify, restore, copy and collect checkpoints.

``main()`` is the console script's entry point (``cairn = "cairn.cli:main"``); it is
also what ``python -m cairn`` and ``python -m cairn.cli`` run. The modules, one job each:

* :mod:`cairn.cli.app`: the typer commands (option parsing, then one call each);
* :mod:`cairn.cli.session`: the store URL and prefix, running a command, logging;
* :mod:`cairn.cli.errors`: exit codes and the one-line error messages;
* :mod:`cairn.cli.limits`: the bounds of numeric and duration options;
* :mod:`cairn.cli.output`, :mod:`cairn.cli.views`: consoles, units, tables, JSON (each
  document's JSON Schema is in ``cairn/cli/schemas/``);
* :mod:`cairn.cli.help`: how ``--help`` renders;
* :mod:`cairn.cli.progress`: progress bars for long transfers;
* :mod:`cairn.cli.catalog`, :mod:`cairn.cli.verify`, :mod:`cairn.cli.restore`,
  :mod:`cairn.cli.files`, :mod:`cairn.cli.copy`, :mod:`cairn.cli.maintain`: the
  operations;
* ``cairn demo`` lives in :mod:`cairn.demo` (its harness, and the job it kills).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cairn`` with ``argv`` (default: the process arguments); returns the exit code.

    Usage errors are reported as one ``error: ...`` line on stderr with exit code 2 (and,
    with ``--json``, as the ``error`` of one JSON document on stdout); every other
    failure is handled by the command itself (see :mod:`cairn.cli.errors`).
    """
    import importlib
    import sys

    import typer

    from cairn.cli.app import app
    from cairn.cli.errors import ExitCode, click_exceptions, one_line
    from cairn.cli.output import Output, no_color

    if no_color():  # --help too: typer's console writes no style escape without colours
        vars(importlib.import_module("typer.rich_utils"))["COLOR_SYSTEM"] = None
    args = list(argv) if argv is not None else sys.argv[1:]
    output = Output(json_mode="--json" in args)
    errors = click_exceptions()
    # typer >= 0.26 keeps Abort in typer.exceptions, beside its vendored click; older
    # versions raise click's own.
    aborted = getattr(errors, "Abort", None) or importlib.import_module("typer.exceptions").Abort
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="cairn", standalone_mode=False)
    except errors.UsageError as exc:
        if not exc.format_message().strip():  # no arguments at all: the help was printed
            return int(ExitCode.USAGE)
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        output.fail("UsageError", f"{one_line(exc.format_message())}{hint}", ExitCode.USAGE)
        output.emit()
        return int(ExitCode.USAGE)
    except errors.ClickException as exc:
        output.fail("UsageError", one_line(exc.format_message()), exc.exit_code)
        output.emit()
        return int(exc.exit_code)
    except aborted:
        output.fail("Interrupted", "aborted", ExitCode.INTERRUPTED)
        output.emit()
        return int(ExitCode.INTERRUPTED)
    return result if isinstance(result, int) else int(ExitCode.OK)
