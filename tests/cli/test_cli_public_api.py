"""The command line uses typer, click and rich through their documented names only.

typer 0.26 and later vendor click as ``typer._click`` and say that code there is not
for applications; click itself is not a dependency of cairn. So the source of the
command line (and the docs hook that renders its help) may name typer's top-level
names only, never a typer submodule or click (imported, or named in a string for
importlib to load), a module of rich its reference does not document or a private
name of rich, nor a rewritten ``__signature__``. The one exception is
:mod:`cairn.cli.help`: it adjusts typer's rendering through the classes typer's
``cls=`` takes (``typer.core``), on the typer minor ``pyproject.toml`` pins, and
``tests/cli/test_cli_help.py`` checks what it prints; and :mod:`cairn.cli.command`
builds the shared options with ``typer.main.get_command``, which typer documents (its
"Using Click" page), and subclasses :mod:`cairn.cli.help`'s command class.

Every command but ``demo`` takes the session options under the names
:func:`cairn.cli.options.launch` reads, from its class, not its function.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import ModuleType

import typer
import typer.core
import typer.main
from support.paths import REPO

from cairn.cli.app import COMMANDS, app

CLI = REPO / "src" / "cairn" / "cli"
SOURCES = [*sorted(CLI.rglob("*.py")), REPO / "docs" / "_hooks" / "cli_help.py"]
HELP = CLI / "help.py"
COMMAND = CLI / "command.py"
HELP_CLASSES = {"TyperArgument", "TyperCommand", "TyperGroup", "TyperOption"}
RICH_DOCUMENTED = {
    *("abc", "align", "bar", "box", "color", "columns", "console", "control", "emoji"),
    *("highlighter", "json", "layout", "live", "logging", "markdown", "markup", "measure"),
    *("padding", "panel", "pretty", "progress", "progress_bar", "prompt", "protocol"),
    *("rule", "segment", "spinner", "status", "style", "styled", "syntax", "table"),
    *("text", "theme", "traceback", "tree"),
}
"""The modules of rich its API reference documents (rich.readthedocs.io, Reference)."""
PUBLIC_TYPER = {
    name
    for name, value in vars(typer).items()
    if not name.startswith("_") and not isinstance(value, ModuleType)
}


def _problems(path: Path) -> list[str]:
    """Each forbidden use in the file ``path``, as ``FILE:LINE what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [
                f"{where} imports {a.name}"
                for a in node.names
                if _outside(a.name) and not (path == COMMAND and a.name == "typer.main")
            ]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found += _from_import(where, node, path)
        elif isinstance(node, ast.Attribute):
            on_typer = isinstance(node.value, ast.Name) and node.value.id == "typer"
            get_command = path == COMMAND and _dotted(node) == "typer.main"
            if on_typer and node.attr not in PUBLIC_TYPER and not get_command:
                found.append(f"{where} uses typer.{node.attr}")
            if node.attr == "__signature__":
                found.append(f"{where} touches __signature__")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if _MODULE.fullmatch(text) and _outside(text):  # for importlib to load
                found.append(f"{where} names {text}")
    return found


_MODULE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*")


def _outside(module: str) -> bool:
    """A module of typer other than its top level, or click."""
    top, *rest = module.split(".")
    return (top == "typer" and bool(rest)) or top == "click"


def _from_import(where: str, node: ast.ImportFrom, path: Path) -> list[str]:
    module = node.module or ""
    names = {alias.name for alias in node.names}
    if module == "typer.core" and path == HELP and names <= HELP_CLASSES:
        return []
    if _outside(module):
        return [f"{where} imports {module}"]
    top, _, submodule = module.partition(".")
    if top == "rich" and submodule and submodule not in RICH_DOCUMENTED:
        return [f"{where} imports {module}, which rich's reference does not document"]
    if top == "rich" and any(name.startswith("_") for name in names):
        return [f"{where} imports private names of {module}"]
    return []


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def test_the_command_line_names_public_typer_click_and_rich_only() -> None:
    assert {"Typer", "TyperException", "Abort", "Exit", "Context"} <= PUBLIC_TYPER
    problems = [problem for path in SOURCES for problem in _problems(path)]
    assert problems == []


def test_the_scan_sees_what_it_forbids(tmp_path: Path) -> None:
    """The check can fail: each forbidden use, written once, is reported, in order."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import importlib\n"
        "import typer\n"
        "import click\n"
        "from typer.main import get_command\n"
        "from typer.core import TyperGroup\n"
        "from rich.console import _STD_STREAMS\n"
        "from rich.cells import cell_len\n"
        "errors = importlib.import_module('typer._click.exceptions')\n"
        "typer.rich_utils.COLOR_SYSTEM = None\n"
        "def f(): pass\n"
        "f.__signature__ = None\n"
        "raise typer.Exit(typer.BadParameter('ok').exit_code)\n"
    )
    assert sorted(_problems(sample), key=lambda p: int(p.split(":")[1].split()[0])) == [
        "sample.py:3 imports click",
        "sample.py:4 imports typer.main",
        "sample.py:5 imports typer.core",
        "sample.py:6 imports private names of rich.console",
        "sample.py:7 imports rich.cells, which rich's reference does not document",
        "sample.py:8 names typer._click.exceptions",
        "sample.py:9 uses typer.rich_utils",
        "sample.py:11 touches __signature__",
    ]


def test_every_command_takes_the_session_options_launch_reads() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name, function, _class in COMMANDS:
        options = [param.name for param in group.commands[name].params]
        assert options[-4:] == ["store", "prefix", "json_mode", "debug"], (name, options)
        if name == "demo":  # demo makes its own session (cairn.demo.harness)
            continue
        declared = list(inspect.signature(function).parameters)
        assert declared[0] == "ctx", (name, declared)
        shared = {"store", "prefix", "json_mode", "debug", "wide", "full_ids", "output"}
        assert not shared & set(declared[1:]) - {"full_ids"}, (name, declared)


def test_a_table_command_takes_the_table_options() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name in ("list", "history", "show", "verify", "gc"):
        options = [param.name for param in group.commands[name].params]
        assert {"wide", "full_ids", "output"} <= set(options), (name, options)
