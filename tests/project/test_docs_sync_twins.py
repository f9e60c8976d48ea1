"""The API reference shows ``SyncCheckpointer``'s blocking methods with their twins'
parameters and documentation (``docs/_hooks/sync_twins.py``), not ``(*args, **kwargs)``."""

from __future__ import annotations

import inspect

import pytest
from support.paths import REPO

from cairn import SyncCheckpointer

griffe = pytest.importorskip("griffe", reason="the documentation tools (docs extra) are absent")


def test_the_reference_gives_every_blocking_method_its_twins_parameters() -> None:
    extension = griffe.load_extensions(f"{REPO / 'docs/_hooks/sync_twins.py'}:SyncTwins")
    package = griffe.load("cairn", search_paths=[str(REPO / "src")], extensions=extension)
    documented = package["sync.SyncCheckpointer"]
    checked = 0
    for name, member in documented.members.items():
        if name.startswith("_") or not isinstance(member, griffe.Function):
            continue
        runtime = inspect.signature(getattr(SyncCheckpointer, name))
        assert [p.name for p in member.parameters] == list(runtime.parameters), name
        assert member.docstring.value == inspect.getdoc(getattr(SyncCheckpointer, name)), name
        checked += 1
    assert checked > 20
    assert [p.name for p in documented["load_manifest"].parameters] == ["self", "checkpoint_id"]
