"""How ``cairn --help`` looks: flags without a value placeholder, plain usage lines.

typer 0.29 (pinned in ``pyproject.toml``; ``tests/cli/test_cli_help.py`` checks what it
prints) shows the Python type of every parameter in its own column, so flags read
``--json <bool>`` as if they took a value, arguments ``ID|latest <str>`` and usage lines
``[[ID|latest]...]...`` when an argument's metavar already says how it repeats. Its rich
mode also keeps the line breaks of a docstring's source in the text it prints. The two
classes here, used for every command and for the group, change only that:

* a flag shows no placeholder, an option with a value shows its metavar (every option of
  cairn names one), an argument shows its metavar and no type;
* the usage line lists each argument once, as ``NAME``, ``[NAME]`` when it is optional
  and ``NAME...`` when it repeats;
* each paragraph of a help text is joined into one line for rich to wrap at the width
  of the terminal (a paragraph that starts with ``\\b`` keeps its lines, as in click);
* with ``$NO_COLOR`` set, the help is printed without any style escape, as every other
  output of cairn is (rich's own ``NO_COLOR`` handling drops colours only, and keeps
  bold, dim and italics): typer's rendering is captured and printed as plain text.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import sys
from typing import Any

from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from cairn.cli.output import no_color

__all__ = ["CairnCommand", "CairnGroup", "reflow"]


def reflow(text: str | None) -> str | None:
    """``text`` with each paragraph on one line, except paragraphs that start with ``\\b``."""
    if text is None:
        return None
    paragraphs = [p.strip("\n") for p in _dedent(text).split("\n\n")]
    # typer's rich mode prints a paragraph's line breaks as they are, and the \b too.
    return "\n\n".join(
        p.removeprefix("\b").lstrip("\n")
        if p.startswith("\b")
        else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


def _dedent(text: str) -> str:
    return inspect.cleandoc(text)


class _Argument(TyperArgument):
    """An argument shown by its metavar alone, without its Python type."""

    def display_type_rich(self, ctx: Any) -> str | None:
        """No type column: the metavar (``ID|latest``) says what to give."""
        return None


def _tidy(params: list[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""
        elif type(param) is TyperArgument:
            # typer builds its own TyperArgument; the subclass only changes how it is shown.
            param.__class__ = _Argument
    return params


class _Tidied:
    """What a cairn command and the cairn group share: reflowed help, tidied parameters."""

    help: str | None
    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)
        _tidy(self.params)

    def get_params(self, ctx: Any) -> list[Any]:
        """The parameters, the help option included, tidied for display."""
        return _tidy(list(super().get_params(ctx)))  # type: ignore[misc]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The help as typer renders it, without any style escape when ``$NO_COLOR`` is set."""
        if not no_color():
            super().format_help(ctx, formatter)  # type: ignore[misc]
            return
        with contextlib.redirect_stdout(io.StringIO()) as styled:
            super().format_help(ctx, formatter)  # type: ignore[misc]
        sys.stdout.write(Text.from_ansi(styled.getvalue()).plain)


class CairnCommand(_Tidied, TyperCommand):
    """A cairn command: its help as described in the module docstring."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """``[OPTIONS]``, then each argument once: ``NAME``, ``[NAME]``, ``NAME...``."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not isinstance(param, TyperArgument):
                continue
            name = param.metavar or (param.name or "").upper()
            if not param.required:
                name = f"[{name}]"
            if param.nargs != 1:
                name += "..."
            pieces.append(name)
        return pieces


class CairnGroup(_Tidied, TyperGroup):
    """The ``cairn`` group: its help as described in the module docstring."""
