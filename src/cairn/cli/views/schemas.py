"""The JSON Schema of each command's ``--json`` document, shipped in ``cairn/cli/schemas/``.

Every document carries ``schema_version``; a test checks every document a command
prints against its schema, so a schema and what the command prints never disagree.
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

__all__ = ["COMMANDS_WITH_SCHEMAS", "json_schema"]


COMMANDS_WITH_SCHEMAS = (
    "list",
    "history",
    "show",
    "verify",
    "restore",
    "delete",
    "gc",
    "copy",
    "demo",
    "export-dcp",
    "import-dcp",
    "export-hf",
    "import-hf",
)
"""The commands whose ``--json`` document has a JSON Schema in ``cairn/cli/schemas/``."""


def json_schema(command: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``cairn COMMAND --json``'s document.

    Each document carries ``schema_version`` (1); a failed command's document is either
    the result with an ``error`` member, or ``{"schema_version", "error"}`` alone.
    """
    if command not in COMMANDS_WITH_SCHEMAS:
        raise ValueError(f"no JSON schema for command {command!r}")
    resource = importlib.resources.files("cairn.cli") / "schemas" / f"{command}.schema.json"
    schema: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return schema
