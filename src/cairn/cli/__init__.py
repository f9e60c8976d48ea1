"""The ``cairn`` command line: inspect, verify, restore, copy and collect checkpoints.

``main()`` is the console script's entry point (``cairn = "cairn.cli:main"``); it is
also what ``python -m cairn`` and ``python -m cairn.cli`` run. The modules, one job each:

* :mod:`cairn.cli.app`: the ``cairn`` group, its options and the table of commands;
* :mod:`cairn.cli.commands`: the commands, grouped by what they do (their options,
  their ``--help``, what each does);
* :mod:`cairn.cli.options`: the options the commands share, and which value of each a
  command runs with;
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
    import sys

    import typer

    from cairn.cli.app import Invocation, app
    from cairn.cli.errors import ExitCode, one_line
    from cairn.cli.output import Output

    args = list(argv) if argv is not None else sys.argv[1:]
    output = Output(json_mode="--json" in args)
    invocation = Invocation()
    try:
        # Not standalone: typer returns the exit code and raises the usage errors, which
        # are reported here, as every other failure is.
        result = app(args=args, prog_name="cairn", standalone_mode=False, obj=invocation)
    except typer.TyperException as exc:
        message = one_line(exc.format_message())
        if not message:  # no arguments at all: the help was printed
            return int(ExitCode.USAGE)
        if exc.exit_code == ExitCode.USAGE:
            message += f" (see '{invocation.command_path()} --help')"
        output.fail("UsageError", message, exc.exit_code)
        output.emit()
        return int(exc.exit_code)
    except typer.Abort:
        output.fail("Interrupted", "aborted", ExitCode.INTERRUPTED)
        output.emit()
        return int(ExitCode.INTERRUPTED)
    return result if isinstance(result, int) else int(ExitCode.OK)
