"""``cairn export-dcp`` and ``cairn import-dcp``: in and out of DCP's own directory format.

Both are thin over :func:`cairn.torch.export_dcp` and :func:`cairn.torch.import_dcp`
(their async cores, on the command's event loop; the format and what is checked are in
:mod:`cairn.torch._dcpdir`). They need the ``torch`` extra; without it they fail with
exit 2 saying how to install it, before touching the store, and every other command
works without it.

``export-dcp ID|latest|NAME --to DIR``: ``latest`` is the latest checkpoint that DCP
saved (as :class:`~cairn.torch.CairnReader` without a ``checkpoint_id`` chooses it, so
a newer checkpoint of another kind is passed over); a name is read as ``dcp.load`` reads
a ``checkpoint_id`` (the newest committed checkpoint with that name). Either passes over
a checkpoint whose items do not read back verified, and says so. ``import-dcp DIR``
commits the directory as a new checkpoint named, unless ``--name``, after the
directory (``step-100``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cairn import MissingExtraError
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.output import heading, human_size, make_table, plural

__all__ = [
    "export_doc",
    "export_table",
    "import_doc",
    "import_text",
    "passed_over_doc",
    "passed_over_lines",
    "torch_module",
]


def torch_module() -> ModuleType:
    """:mod:`cairn.torch`, or a usage error (exit 2) when torch is not installed."""
    try:
        return importlib.import_module("cairn.torch")
    except MissingExtraError as exc:  # it says what is missing and what to install
        raise CliError(f"this command needs the torch extra: {exc}", ExitCode.USAGE) from None
    except ImportError as exc:
        raise CliError(
            "this command needs the torch extra: install cairn with its 'torch' extra (pip "
            "install '.[torch]' in cairn's directory, or 'cairn-checkpoint[torch]' from a "
            f"package index) ({exc})",
            ExitCode.USAGE,
        ) from None


def _name(name: str | None) -> str:
    return "" if name is None else f" {name!r}"


def _checkpoint(where: dict[str, str], done: Any) -> dict[str, Any]:
    """The members an export's and an import's JSON share: the store, then the checkpoint."""
    return {**where, "id": str(done.checkpoint_id), "name": done.name, "epoch": done.epoch}


def export_doc(where: dict[str, str], exported: Any) -> dict[str, Any]:
    """``cairn export-dcp --json``."""
    return {
        **_checkpoint(where, exported),
        "to": str(exported.target),
        "verified": True,
        "items": exported.items,
        "size_bytes": exported.size_bytes,
        "files": [{"path": path, "size_bytes": size} for path, size in exported.files],
        "passed_over": passed_over_doc(exported),
    }


def passed_over_doc(exported: Any) -> list[dict[str, str]]:
    """The newer checkpoints an export of the latest or a name passed over (``--json``)."""
    return [{"checkpoint_id": str(cid), "reason": reason} for cid, reason in exported.passed_over]


def passed_over_lines(exported: Any) -> list[Text]:
    """The newer checkpoints an export of the latest or a name passed over, one line each."""
    return [
        Text(f"passed over newer checkpoint {cid}: {reason}", style="yellow")
        for cid, reason in exported.passed_over
    ]


def export_table(exported: Any) -> RenderableType:
    """``cairn export-dcp``: the files written, then a one-line summary."""
    table = make_table("", "File", ">Size")
    for path, size in exported.files:
        table.add_row(Text(path), Text(human_size(size)))
    summary = Text(
        f"exported checkpoint {exported.checkpoint_id}{_name(exported.name)} (epoch "
        f"{exported.epoch}): {plural(exported.items, 'item')} in "
        f"{plural(len(exported.files), 'file')}, "
        f"{human_size(exported.size_bytes)}, every item verified as written"
    )
    title = heading(f"DCP directory {exported.target}")
    return Group(title, table, summary, *passed_over_lines(exported))


def import_doc(where: dict[str, str], imported: Any) -> dict[str, Any]:
    """``cairn import-dcp --json``."""
    return {
        **_checkpoint(where, imported),
        "from": str(imported.source),
        "files": imported.files,
        "tensor_items": imported.tensor_items,
        "byte_items": imported.byte_items,
        "unchecked_items": imported.unchecked_items,
        "size_bytes": imported.size_bytes,
        "uploaded_bytes": imported.uploaded_bytes,
    }


def import_text(imported: Any) -> RenderableType:
    """``cairn import-dcp``: what was committed, and what was checked on the way in."""
    checked = imported.tensor_items + imported.byte_items - imported.unchecked_items
    return Text(
        f"imported {imported.source} as checkpoint {imported.checkpoint_id}"
        f"{_name(imported.name)} (epoch {imported.epoch}): {plural(imported.files, 'file')}, "
        f"{human_size(imported.size_bytes)} read, {human_size(imported.uploaded_bytes)} "
        f"stored; {plural(checked, 'item')} "
        "checked against the CRC-32s torch.save recorded"
        + (
            f", {plural(imported.unchecked_items, 'byte item')} stored raw checked for size only "
            "(they carry no checksum)"
            if imported.unchecked_items
            else ""
        )
    )


def source_dir(path: Path) -> Path:
    """``path`` as an absolute directory; a usage error (exit 2) when it is not one."""
    resolved = path.expanduser().absolute()
    if not resolved.is_dir():
        what = "does not exist" if not resolved.exists() else "is not a directory"
        raise CliError(f"cannot import {resolved}: it {what}", ExitCode.USAGE)
    return resolved
