"""Private names stay private: a module uses another's public names only.

A private module (``cairn.stores._urls``) may be imported where the layers allow it
(``tests/project/test_layers.py``), but no module imports a private name (``_runner``,
``_REMOTE_SCHEMES``) of another module, nor reaches into the private attributes of an
object that is not itself (``ckpt._context()``): what one part offers another is public
in the module that offers it. The source is parsed, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO

SRC = REPO / "src" / "cairn"

OWN = ("self", "cls", "other")
"""The names under which a class reaches its own private attributes (``other``: another
instance of the same class, in a comparison)."""

STANDARD_LIBRARY = {
    ("sys", "_current_frames"),
    ("threading", "_DummyThread"),
    ("threading", "_register_atexit"),
}
"""Private names of the standard library some module relies on, each where it says why."""


def _is_module(src: Path, dotted: str) -> bool:
    relative = Path(*dotted.split("."))
    base = src.parent / relative
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _modules(src: Path) -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(src.parent)), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(src.rglob("*.py"))
    ]


def private_imports(src: Path = SRC) -> list[str]:
    """Each ``from cairn.x import _name`` whose ``_name`` is not a module, except in a
    package's ``__init__`` from its own modules: the package is their public face (as
    ``cairn.errors`` is where pickles find what rebuilds an error)."""
    found = []
    for where, tree in _modules(src):
        package = where.removesuffix("/__init__.py").replace("/", ".")
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module != "cairn" and not node.module.startswith("cairn."):
                continue
            if where.endswith("/__init__.py") and node.module.startswith(f"{package}."):
                continue
            found += [
                f"{where}:{node.lineno} imports {node.module}.{alias.name}"
                for alias in node.names
                if _private(alias.name) and not _is_module(src, f"{node.module}.{alias.name}")
            ]
    return found


def private_attributes(src: Path = SRC) -> list[str]:
    """Each ``thing._name`` where ``thing`` is not the object itself (nor a standard
    library module in :data:`STANDARD_LIBRARY`)."""
    found = []
    for where, tree in _modules(src):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and (
                owner.id in OWN or (owner.id, node.attr) in STANDARD_LIBRARY
            ):
                continue
            found.append(f"{where}:{node.lineno} reaches {ast.unparse(node)}")
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports() == []


def test_no_module_reaches_into_another_objects_private_attributes() -> None:
    assert private_attributes() == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The collectors themselves, on a tree that breaks both rules."""
    package = tmp_path / "cairn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sync.py").write_text("_runner = object()\n")
    (package / "_interface.py").write_text(
        "from cairn.sync import _runner\n"
        "from cairn import sync\n"
        "async def begin(ckpt):\n"
        "    return await ckpt._context(), sync._runner, ckpt.paths\n"
    )
    errors = package / "errors"
    errors.mkdir()
    (errors / "_root.py").write_text("def _rebuild(): pass\n")
    (errors / "__init__.py").write_text("from cairn.errors._root import _rebuild\n")
    (package / "other").mkdir()
    (package / "other" / "__init__.py").write_text("from cairn.errors._root import _rebuild\n")
    imports = private_imports(package)
    assert imports == [
        "cairn/_interface.py:1 imports cairn.sync._runner",
        "cairn/other/__init__.py:1 imports cairn.errors._root._rebuild",
    ]
    assert sorted(private_attributes(package)) == [
        "cairn/_interface.py:4 reaches ckpt._context",
        "cairn/_interface.py:4 reaches sync._runner",
    ]
