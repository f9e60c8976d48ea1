"""A griffe extension: msgspec structs with the constructor Python gives them.

A :class:`msgspec.Struct` declares its fields as annotated class attributes; msgspec
makes its ``__init__`` when the class is made, so the source has none and the API
reference would show ``SourceOffsetEntry`` with no parameters. This extension gives
every struct of the package, in the reference only, an ``__init__`` with the parameters
:func:`inspect.signature` reports at run time (names, order, keyword-only, defaults),
annotated as the source writes each field. A field's meaning is in its class's
``Attributes:`` section (``tests/project/test_docstrings.py`` requires one entry per
field, as for a dataclass).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe
import msgspec

_KINDS: dict[inspect._ParameterKind, griffe.ParameterKind] = {
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
}


def _default(field: msgspec.structs.FieldInfo) -> str | None:
    if field.default is not msgspec.NODEFAULT:
        return repr(field.default)
    if field.default_factory is not msgspec.NODEFAULT:
        return repr(field.default_factory())  # {} or (), as the source writes it
    return None


def _runtime(cls: griffe.Class) -> Any:
    module = importlib.import_module(cls.module.path)
    return getattr(module, cls.name, None)


def _structs(module: griffe.Module) -> list[griffe.Class]:
    found = []
    for member in module.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Module):
            found.extend(_structs(member))
        elif isinstance(member, griffe.Class):
            found.append(member)
    return found


class MsgspecStructs(griffe.Extension):
    """Give each msgspec struct the ``__init__`` msgspec makes for it."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "cairn":
            return
        for documented in _structs(pkg):
            runtime = _runtime(documented)
            if not (isinstance(runtime, type) and issubclass(runtime, msgspec.Struct)):
                continue
            if "__init__" in documented.members:
                continue
            signature = inspect.signature(runtime)
            fields = {field.name: field for field in msgspec.structs.fields(runtime)}
            parameters = [griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)]
            for name, parameter in signature.parameters.items():
                attribute = documented.members.get(name)
                annotation = (
                    attribute.annotation if isinstance(attribute, griffe.Attribute) else None
                )
                parameters.append(
                    griffe.Parameter(
                        name,
                        annotation=annotation,
                        kind=_KINDS[parameter.kind],
                        default=_default(fields[name]),
                    )
                )
            init = griffe.Function(
                "__init__",
                lineno=documented.lineno,
                endlineno=documented.lineno,
                parameters=griffe.Parameters(*parameters),
                returns="None",
            )
            documented.set_member("__init__", init)
