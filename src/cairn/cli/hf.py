"""``cairn export-hf`` and ``cairn import-hf``: what they check and what they print.

Both are thin over :func:`cairn.torch.export_hf_async` and
:func:`cairn.torch.import_hf_async` (the format and what is verified are in
:mod:`cairn.torch._hf`). They need the ``torch`` extra: without it they fail with exit 2
saying how to install it (:func:`cairn.cli.dcp.torch_module`), before touching a store.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cairn.cli.dcp import passed_over_doc, passed_over_lines
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.output import human_size, make_table

__all__ = ["CAST_DTYPES", "export_doc", "export_table", "import_doc", "import_text", "parse_size"]

CAST_DTYPES = ("bfloat16", "float16", "float32", "float64")
"""The dtypes ``--dtype`` casts floating-point tensors to."""

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """``--max-shard-size``: bytes, or a number with a unit (``5GB``, ``500MiB``, as
    ``transformers`` writes them); a usage error (exit 2) for anything else."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise CliError(
            f"--max-shard-size {text!r}: give bytes or a size such as 5GB or 500MiB",
            ExitCode.USAGE,
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise CliError(f"--max-shard-size {text!r}: must be at least one byte", ExitCode.USAGE)
    return size


def _name(name: str | None) -> str:
    return "" if name is None else f" {name!r}"


def export_doc(where: dict[str, str], exported: Any) -> dict[str, Any]:
    """``cairn export-hf --json``."""
    return {
        **where,
        "id": str(exported.checkpoint_id),
        "name": exported.name,
        "epoch": exported.epoch,
        "to": exported.target,
        "verified": True,
        "tensors": exported.tensors,
        "left_out": list(exported.left_out),
        "total_size": exported.total_size,
        "size_bytes": exported.size_bytes,
        "files": [{"path": path, "size_bytes": size} for path, size in exported.files],
        "passed_over": passed_over_doc(exported),
    }


def export_table(exported: Any) -> RenderableType:
    """``cairn export-hf``: the files written, then a one-line summary."""
    table = make_table(f"safetensors at {exported.target}", "File", ">Size")
    for path, size in exported.files:
        table.add_row(Text(path), Text(human_size(size)))
    left = f"; left out {len(exported.left_out)} item(s)" if exported.left_out else ""
    summary = Text(
        f"exported checkpoint {exported.checkpoint_id}{_name(exported.name)} (epoch "
        f"{exported.epoch}): {exported.tensors} tensors in {len(exported.files) - 1} "
        f"shard(s), {human_size(exported.total_size)}, every item verified against its "
        f"SHA-256{left}"
    )
    return Group(table, summary, *passed_over_lines(exported))


def import_doc(where: dict[str, str], imported: Any) -> dict[str, Any]:
    """``cairn import-hf --json``."""
    return {
        **where,
        "id": str(imported.checkpoint_id),
        "name": imported.name,
        "epoch": imported.epoch,
        "from": imported.source,
        "files": list(imported.files),
        "tensors": imported.tensors,
        "size_bytes": imported.size_bytes,
    }


def import_text(imported: Any) -> RenderableType:
    """``cairn import-hf``: what was committed."""
    return Text(
        f"imported {imported.source} as checkpoint {imported.checkpoint_id}"
        f"{_name(imported.name)} (epoch {imported.epoch}): {imported.tensors} tensors "
        f"from {len(imported.files)} file(s), {human_size(imported.size_bytes)}, each "
        "header checked, SHA-256 digests computed as uploaded"
    )
