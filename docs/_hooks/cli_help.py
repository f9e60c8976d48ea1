"""MkDocs hooks: the command line's ``--help`` in the pages, and docstrings' roles as code.

A line ``<!-- cairn-help: COMMAND -->`` becomes what ``cairn COMMAND --help`` prints at
build time, so the command-line reference cannot fall behind the code;
``<!-- cairn-help: -->`` (no command) is ``cairn --help``. A command that fails fails
the build.

cairn's docstrings name other objects with reStructuredText roles
(``:class:`~cairn.stores.Store```), which Markdown renders as the role's text followed
by code: the role is dropped, and ``~`` keeps the last component only, as Sphinx would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj|const):<code>(~?)([\w.]+)</code>")
_MARKER = re.compile(r"^<!-- cairn-help:\s*([a-z-]*)\s*-->$", re.MULTILINE)
_SRC = Path(__file__).resolve().parents[2] / "src"


def _help(command: str) -> str:
    env = {
        **os.environ,
        "COLUMNS": "100",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_SRC), os.environ.get("PYTHONPATH")])),
    }
    env = {k: v for k, v in env.items() if not k.startswith("CAIRN_")}
    args = [sys.executable, "-m", "cairn", *([command] if command else []), "--help"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[2:])} exited {proc.returncode}: {proc.stderr}")
    lines = [line.rstrip() for line in proc.stdout.strip("\n").splitlines()]
    return "```text\n" + "\n".join(lines) + "\n```"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace every help marker of a page with the help it names (run side by side)."""
    commands = sorted(set(_MARKER.findall(markdown)))
    with ThreadPoolExecutor(max_workers=4) as pool:
        helps = dict(zip(commands, pool.map(_help, commands), strict=True))
    return _MARKER.sub(lambda match: helps[match.group(1)], markdown)


def on_page_content(html: str, **_: Any) -> str:
    """Drop the reStructuredText role before each code span the docstrings made of one."""
    return _ROLE.sub(
        lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>",
        html,
    )
