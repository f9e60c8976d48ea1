"""The public API documents its parameters, results and errors in sections the API
reference renders.

The modules checked are the ones the pages of ``docs/api`` render (their ``::: module``
lines); their public names are ``__all__``, or else the public names each defines. Every
public function and method says, in Google-style sections (``mkdocs.yml`` parses them):
each parameter in ``Args:`` (a class names its constructor's in its own docstring, under
``Args:`` or, for the fields of a dataclass or an error, ``Attributes:``), its result
in ``Returns:`` or ``Yields:`` unless it returns ``None``, and, in ``Raises:``, only
classes that exist. Parameters forwarded as ``*args``/``**kwargs`` need no entry, nor do
the fixtures of the contract's own tests (``StoreContract.test_*``).
A method that implements a documented one (a :class:`~cairn.stores.Store` method of a store,
an :class:`~cairn.observe.Observer` method of an observer, a DCP storage writer's) has
its parameters and result documented there, and is not checked again.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.apipages import rendered_modules

from cairn.checkpointer import ObjectStoreCheckpointer
from cairn.observe import Observer
from cairn.stores import Store
from cairn.sync import SyncCheckpointer

SECTION = re.compile(r"^(\w+):\s*$")
ENTRY = re.compile(r"^    (\*{0,2}[\w.]+)(?: \([^)]*\))?:")


def sections(doc: str) -> dict[str, list[str]]:
    """The Google-style sections of a cleaned docstring: each heading, and the names
    its entries start with (``name:`` or ``name (type):`` at the first indent)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        heading = SECTION.match(line)
        if heading is not None:
            current = found.setdefault(heading.group(1), [])
        elif line and not line.startswith(" "):
            current = None
        elif current is not None:
            entry = ENTRY.match(line)
            if entry is not None:
                current.append(entry.group(1).lstrip("*"))
    return found


@dataclass(frozen=True)
class Documented:
    """One public function, method or class, as the API reference shows it."""

    name: str
    doc: str
    signature: inspect.Signature | None
    is_class: bool


def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        # The parameters it has itself: a method that forwards ``*args, **kwargs``
        # verbatim (SyncCheckpointer's) needs no entries; the result, what it returns
        # (that of the coroutine it runs).
        own = inspect.signature(func, follow_wrapped=False)
        result = inspect.signature(func).return_annotation
        return own.replace(return_annotation=result)
    except (TypeError, ValueError):
        return None


def _members(cls: type) -> Iterator[Documented]:
    init = vars(cls).get("__init__")
    # A dataclass's and a msgspec struct's constructor is made from its fields.
    if (
        init is not None
        or hasattr(cls, "__dataclass_fields__")
        or hasattr(cls, "__struct_fields__")
    ):
        yield Documented(cls.__qualname__, inspect.getdoc(cls) or "", _signature(cls), True)
    for name, member in vars(cls).items():
        func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
        if name.startswith("_") or not inspect.isfunction(func):
            continue
        if name.startswith("test_") and cls.__module__.startswith("cairn.testing"):
            continue  # a test of the contract: its parameters are pytest fixtures
        if _implements_documented(cls, name):
            continue  # the interface it implements documents its parameters and result
        doc = inspect.getdoc(func) or ""
        yield Documented(f"{cls.__qualname__}.{name}", doc, _signature(func), False)


def _implements_documented(cls: type, name: str) -> bool:
    """Whether method ``name`` of ``cls`` implements one that a base class, or an interface
    cairn documents (:class:`cairn.stores.Store`, :class:`cairn.observe.Observer`), documents."""
    interfaces = (Store, Observer, *cls.__mro__[1:])
    return any(getattr(getattr(base, name, None), "__doc__", None) for base in interfaces)


def _rendered_with(cls: type) -> list[type]:
    """``cls``, and the bases whose methods the API reference shows on it: those of a
    private module of cairn (``ObjectStoreCheckpointer`` inherits its reading methods)."""
    private = [
        base
        for base in cls.__mro__[1:]
        if base.__module__.startswith("cairn.")
        and any(part.startswith("_") for part in base.__module__.split("."))
    ]
    return [cls, *private]


def public_api() -> Iterator[tuple[str, Documented]]:
    """Every public function, method and class of the rendered modules, once each."""
    seen: set[int] = set()
    for module_name in rendered_modules():
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [
                name
                for name, value in vars(module).items()
                if not name.startswith("_") and getattr(value, "__module__", None) == module_name
            ]
        for name in names:
            value = getattr(module, name)
            if id(value) in seen:
                continue
            seen.add(id(value))
            if inspect.isclass(value):
                for cls in _rendered_with(value):
                    if cls is value or id(cls) not in seen:
                        seen.add(id(cls))
                        yield from ((cls.__module__, member) for member in _members(cls))
            elif inspect.isfunction(value):
                doc = inspect.getdoc(value) or ""
                yield value.__module__, Documented(name, doc, _signature(value), False)


def _named_parameters(signature: inspect.Signature) -> list[str]:
    forwarded = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        name
        for name, parameter in signature.parameters.items()
        if name not in ("self", "cls") and parameter.kind not in forwarded
    ]


def _returns_none(signature: inspect.Signature) -> bool:
    return signature.return_annotation in (None, "None", inspect.Signature.empty)


def _exists(error: str, module: str) -> bool:
    if hasattr(builtins, error):
        return True
    owner, _, attribute = error.rpartition(".")
    candidates = [owner] if owner else [module, "cairn.errors"]
    for candidate in candidates:
        try:
            if hasattr(importlib.import_module(candidate), attribute):
                return True
        except ImportError:
            continue
    return False


def problems(module: str, item: Documented) -> list[str]:
    """What the docstring of ``item`` (defined in ``module``) leaves undocumented."""
    found = sections(item.doc)
    wrong = []
    if item.signature is not None:
        parameters = _named_parameters(item.signature)
        documented = found.get("Args", [])
        if item.is_class:
            documented = documented + found.get("Attributes", [])
        missing = [name for name in parameters if name not in documented]
        if missing:
            wrong.append(f"no Args entry for {', '.join(missing)}")
        wants_result = not item.is_class and not _returns_none(item.signature)
        if wants_result and not ({"Returns", "Yields"} & found.keys()):
            wrong.append("no Returns: or Yields: section")
    unknown = [error for error in found.get("Raises", []) if not _exists(error, module)]
    if unknown:
        wrong.append(f"Raises names no class: {', '.join(unknown)}")
    return wrong


def test_the_api_reference_renders_modules() -> None:
    assert "cairn" in rendered_modules()
    assert "cairn.errors" in rendered_modules()


def test_every_public_function_documents_its_parameters_result_and_errors() -> None:
    report = [
        f"{module}.{item.name}: {'; '.join(wrong)}"
        for module, item in public_api()
        if (wrong := problems(module, item))
    ]
    assert not report, f"{len(report)} undocumented:\n" + "\n".join(report)


def test_a_blocking_method_names_its_twin_before_the_sections_and_raises_in_a_loop() -> None:
    blocking = inspect.getdoc(SyncCheckpointer.update_latest) or ""
    twin = sections(inspect.getdoc(ObjectStoreCheckpointer.update_latest) or "")
    assert blocking.index("(The blocking form of") < blocking.index("\nArgs:")
    found = sections(blocking)
    assert found["Args"] == twin["Args"] == ["checkpoint_id", "force"]
    assert found["Raises"] == [*twin["Raises"], "SyncInAsyncContextError"]
    # A twin that documents no error gets a Raises section of its own.
    assert sections(inspect.getdoc(SyncCheckpointer.read_latest) or "")["Raises"] == [
        "SyncInAsyncContextError"
    ]


def _documented(doc: str, *, returns: str = "None") -> Documented:
    signature = inspect.Signature(
        [inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD)],
        return_annotation=returns,
    )
    return Documented("f", inspect.cleandoc(doc), signature, False)


@pytest.mark.parametrize(
    ("doc", "returns", "expected"),
    [
        ("Reads.\n\nArgs:\n    path: where.\n\nReturns:\n    The bytes.", "bytes", []),
        ("Reads.\n\nArgs:\n    other: where.", "None", ["no Args entry for path"]),
        ("Reads.\n\nArgs:\n    path: where.", "bytes", ["no Returns: or Yields: section"]),
        (
            "Reads.\n\nArgs:\n    path: where.\n\nRaises:\n    NoSuchError: never.",
            "None",
            ["Raises names no class: NoSuchError"],
        ),
        (
            "Reads.\n\nArgs:\n    path: where.\n\nRaises:\n    CheckpointNotFoundError: gone.",
            "None",
            [],
        ),
    ],
)
def test_the_check_finds_what_a_docstring_leaves_out(
    doc: str, returns: str, expected: list[str]
) -> None:
    assert problems("cairn", _documented(doc, returns=returns)) == expected
