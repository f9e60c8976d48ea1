"""A griffe extension: ``SyncCheckpointer``'s blocking methods as Python sees them.

Each blocking method takes its async twin's parameters and documentation when the class
is made (``cairn.sync``), so the source holds only ``(*args, **kwargs)`` and a pointer
to the twin. The API reference reads source; this extension gives each such method, in
the reference only, the signature :func:`inspect.signature` reports and the docstring
:func:`inspect.getdoc` returns at run time. A public method whose run-time signature
is still ``(*args, **kwargs)`` fails the build.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

_CLASS = "cairn.sync.SyncCheckpointer"

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _annotation(value: Any) -> str | None:
    if value is inspect.Parameter.empty:
        return None
    return value if isinstance(value, str) else inspect.formatannotation(value)


def _parameters(signature: inspect.Signature) -> griffe.Parameters:
    return griffe.Parameters(
        *(
            griffe.Parameter(
                param.name,
                annotation=_annotation(param.annotation),
                kind=_KINDS[param.kind],
                default=None if param.default is inspect.Parameter.empty else repr(param.default),
            )
            for param in signature.parameters.values()
        )
    )


class SyncTwins(griffe.Extension):
    """Replace each blocking method's ``(*args, **kwargs)`` with its twin's parameters."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "cairn":
            return
        documented = pkg.get_member("sync").get_member("SyncCheckpointer")
        module, _, name = _CLASS.rpartition(".")
        runtime = getattr(importlib.import_module(module), name)
        for member_name, member in documented.members.items():
            if member_name.startswith("_") or not isinstance(member, griffe.Function):
                continue
            function = getattr(runtime, member_name)
            signature = inspect.signature(function)
            if "args" in signature.parameters:
                raise RuntimeError(f"{_CLASS}.{member_name} has no signature of its own")
            member.parameters = _parameters(signature)
            member.returns = _annotation(signature.return_annotation)
            member.docstring = griffe.Docstring(
                inspect.getdoc(function) or "", parent=member, parser="google"
            )
