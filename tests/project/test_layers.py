"""The import rules of ARCHITECTURE.md, checked on the source.

Every module under ``src/cairn`` is parsed (never imported) and its imports of cairn
modules are collected: ``import cairn.x``, ``from cairn import x`` (a submodule, or the
package ``cairn`` itself for a name it exports), ``from cairn.x import y``, and
``importlib.import_module("cairn.x")`` with a literal name. The rules:

* the command line and the demo use the public API only: no module whose dotted name
  has a component starting with ``_``;
* the integrations (``cairn.integrations``, ``cairn.torch``, ``cairn.lightning``,
  ``cairn.hf``, ``cairn.ray``) use public modules, their own package, and one internal
  interface, :data:`INTEGRATION_INTERFACE`;
* each entry of ``src/cairn`` (a subpackage or a top-level module) imports only entries
  of its own layer or a lower one, the layers being the table of ARCHITECTURE.md, read
  from there (imports under ``if TYPE_CHECKING:`` are type annotations, not
  dependencies, and do not count);
* ``src`` has no import cycle (imports inside functions count; those under
  ``if TYPE_CHECKING:`` do not).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO

ROOT = REPO
SRC = ROOT / "src" / "cairn"


def _architecture_table() -> list[tuple[str, set[str]]]:
    """The rows of the ``## Layers`` table of ARCHITECTURE.md, bottom to top: (layer, its
    entries), ``cairn`` standing for the package's ``__init__``."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[str, set[str]]] = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        entries = set(re.findall(r"`([^`]+)`", cells[1]))
        rows.append((cells[0], {"__init__" if entry == "cairn" else entry for entry in entries}))
    return rows


LAYERS = _architecture_table()
"""Bottom to top: the layers of ARCHITECTURE.md, each with the entries of ``src/cairn``
in it (a subpackage, such as ``protocol`` or ``cli``, is one entry)."""


INTEGRATION_INTERFACE = "cairn.integrations._interface"
"""The one internal module the integrations may import: what the library offers them
beyond its public API (committing a prepared manifest, leases, the pointer)."""

INTEGRATIONS = ("integrations", "torch", "lightning", "hf", "ray")
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
    assert ("cairn.cli.commands.browse", "cairn") in found  # from cairn import names
    assert ("cairn.cli.commands.browse", "cairn.cli.options") in found  # import (names)
    assert (
        "cairn.checkpointer",
        "cairn.protocol._commit",
    ) in found  # from cairn.protocol import _commit
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
        and i.module != INTEGRATION_INTERFACE  # the interface is where the private parts meet
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


def test_the_table_has_every_layer_in_order() -> None:
    assert [name for name, _ in LAYERS] == [
        "format",
        "data",
        "observers",
        "stores",
        "protocol",
        "façades",
        "integrations",
        "applications",
    ]


def _runtime_graph() -> dict[str, set[str]]:
    """Each module, and the cairn modules it imports when it runs (at import time or in
    a function)."""
    graph: dict[str, set[str]] = {module_name(path): set() for path in SRC.rglob("*.py")}
    for found in every_import():
        if not found.typing_only and found.imported != found.module:
            graph[found.module].add(found.imported)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in graph:
                continue
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_src_has_no_import_cycle() -> None:
    found = cycles(_runtime_graph())
    assert found == [], f"import cycles in src/cairn: {found}"
