"""The import rules of ARCHITECTURE.md, checked on the source.

Every module under ``src/cairn`` is parsed (never imported) and its imports of cairn
modules are collected: ``import cairn.x``, ``from cairn import x`` (a submodule, or the
package ``cairn`` itself for a name it exports), ``from cairn.x import y``, and
``importlib.import_module("cairn.x")`` with a literal name. Three rules:

* the command line and the demo use the public API only: no module whose dotted name
  has a component starting with ``_``;
* the integrations (``cairn.torch``, ``cairn.distributed``) use public modules, their
  own package, and one internal interface, :data:`INTEGRATION_INTERFACE`;
* each module imports only modules of its own layer or a lower one (imports under
  ``if TYPE_CHECKING:`` are type annotations, not dependencies, and do not count), and
  the layers here are the table of ARCHITECTURE.md, row for row.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "cairn"

LAYERS: list[tuple[str, set[str]]] = [
    (
        "values",
        {
            "ids",
            "layout",
            "manifest",
            "signing",
            "integrity",
            "errors",
            "data",
            "codecs",
            "inputs",
            "ranges",
            "observe",
            "_validate",
            "_buffer",
            "_concurrency",
        },
    ),
    (
        "store boundary",
        {
            "stores",
            "_storetypes",
            "_translate",
            "localfs",
            "_localstore",
            "_urls",
            "_shutdown",
            "retry",
            "_dispatch",
            "testing",
        },
    ),
    ("records", {"_pointer", "_lease", "_parts"}),
    (
        "checkpointer parts",
        {
            "_context",
            "_catalog",
            "_chains",
            "_upload",
            "_download",
            "_directories",
            "_commit",
            "retention",
            "_background",
            "discover",
        },
    ),
    ("façades", {"__init__", "checkpointer", "sync", "_integration", "distributed", "torch"}),
    ("watching", {"metrics", "tracing"}),
    ("applications", {"__main__", "cli", "demo"}),
]
"""Bottom to top: the layers of ARCHITECTURE.md, by the first component of each module's
name below ``cairn`` (a package, such as ``torch`` or ``cli``, is one entry)."""

INTEGRATION_INTERFACE = "cairn._integration"
"""The one internal module the integrations may import: what the library offers them
beyond its public API (committing a prepared manifest, leases, the pointer)."""

INTEGRATIONS = ("torch", "distributed")
APPLICATIONS = ("cli", "demo")


@dataclass(frozen=True)
class Import:
    """One import of a cairn module by ``module`` (dotted), at ``line``."""

    module: str
    imported: str
    line: int
    typing_only: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    """True when ``dotted`` (``cairn.x.y``) names a module or package of the source."""
    relative = Path(*dotted.split("."))
    base = SRC.parent / relative
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _typing_blocks(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                inside.update(id(n) for n in ast.walk(child))
    return inside


def imports_of(path: Path) -> list[Import]:
    """The cairn modules ``path`` imports."""
    name = module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing = _typing_blocks(tree)
    found: list[Import] = []

    def add(target: str, node: ast.AST) -> None:
        if target == "cairn" or target.startswith("cairn."):
            found.append(Import(name, target, node.lineno, id(node) in typing))  # type: ignore[attr-defined]

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if is_module(sub) else base, node)
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value, node)
    return found


@functools.cache
def every_import() -> tuple[Import, ...]:
    return tuple(found for path in sorted(SRC.rglob("*.py")) for found in imports_of(path))


def top(dotted: str) -> str:
    """The layer key of a module: its first component below ``cairn``."""
    parts = dotted.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def is_private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split(".")[1:])


def layer_of(key: str) -> int:
    [index] = [i for i, (_, keys) in enumerate(LAYERS) if key in keys]
    return index


def test_every_module_is_in_exactly_one_layer() -> None:
    keys = {top(module_name(path)) for path in SRC.rglob("*.py")}
    listed = [key for _, layer in LAYERS for key in layer]
    assert len(listed) == len(set(listed)), "a module is in two layers"
    assert keys <= set(listed), f"not in any layer: {sorted(keys - set(listed))}"


def test_the_parser_sees_what_the_modules_import() -> None:
    """A sanity check of the collector itself, on imports every reader can see."""
    found = {(i.module, i.imported) for i in every_import()}
    assert ("cairn.cli.app", "cairn") in found  # from cairn import (names)
    assert ("cairn.cli.app", "cairn.cli.catalog") in found
    assert ("cairn.checkpointer", "cairn._commit") in found  # from cairn import _commit
    assert ("cairn.cli.dcp", "cairn.torch") in found  # importlib.import_module("cairn.torch")


def test_the_command_line_and_the_demo_use_the_public_api_only() -> None:
    private = [
        f"{i.module}:{i.line} imports {i.imported}"
        for i in every_import()
        if top(i.module) in APPLICATIONS and is_private(i.imported)
    ]
    assert private == []


def _integration_violations() -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.imported}"
        for i in every_import()
        if top(i.module) in INTEGRATIONS
        and is_private(i.imported)
        and top(i.imported) != top(i.module)  # its own package's modules
        and i.imported != INTEGRATION_INTERFACE
    ]


def test_the_integrations_use_public_modules_and_the_integration_interface() -> None:
    assert _integration_violations() == []


def test_each_layer_imports_only_its_own_layer_or_lower() -> None:
    upward = [
        f"{i.module}:{i.line} ({LAYERS[layer_of(top(i.module))][0]}) imports {i.imported} "
        f"({LAYERS[layer_of(top(i.imported))][0]})"
        for i in every_import()
        if not i.typing_only and layer_of(top(i.imported)) > layer_of(top(i.module))
    ]
    assert upward == []


def _architecture_table() -> list[tuple[str, set[str]]]:
    """The rows of the ``## Layers`` table of ARCHITECTURE.md: (layer, its modules)."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[str, set[str]]] = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        rows.append((cells[0], set(re.findall(r"`([^`]+)`", cells[1]))))
    return rows


def test_the_layers_are_the_table_of_architecture_md() -> None:
    def shown(key: str) -> str:
        return {"__init__": "cairn", "__main__": "__main__"}.get(key, key)

    expected = [(name, {shown(key) for key in keys}) for name, keys in LAYERS]
    assert _architecture_table() == expected
