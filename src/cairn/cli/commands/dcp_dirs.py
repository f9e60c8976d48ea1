"""``cairn export-dcp`` and ``cairn import-dcp``: DCP's own directories, out and in.

Both need the ``torch`` extra: without it they fail with exit 2 before touching the
store (:func:`cairn.cli.dcp.torch_module`); what they check is in :mod:`cairn.cli.dcp`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cairn import CheckpointNotFoundError
from cairn.cli import dcp
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.options import DcpRefArgument, EpochOption, launch
from cairn.cli.session import Session

__all__ = ["export_dcp_command", "import_dcp_command"]


def export_dcp_command(
    ctx: typer.Context,
    ref: DcpRefArgument,
    to: Annotated[
        Path,
        typer.Option("--to", metavar="DIR", help="Directory to write (missing, or empty)."),
    ],
) -> None:
    """Write a DCP checkpoint as a directory DCP's FileSystemReader reads, verified.

    DIR gets .metadata and one __{rank}_{n}.distcp per artifact, as torch's
    FileSystemWriter writes them (dcp.load(checkpoint_id=DIR) and dcp_to_torch_save read
    it). Every item is verified against its SHA-256 as it is read, written into a
    staging directory beside DIR, read back and checked again, and only then renamed to
    DIR: DIR must be missing or empty, and appears whole or not at all. NAME is the name
    a save was given (dcp.save's checkpoint_id): the newest checkpoint with it. Needs
    the torch extra.
    """
    launch(ctx, lambda session: _export(session, ref, to))


async def _export(session: Session, ref: str, to: Path) -> None:
    target_dir = _absolute(to)
    module = dcp.torch_module()

    ckpt = await session.open()
    target = (
        None
        if ref.lower() == "latest"
        else module.interpret_checkpoint_id(ref, session.url, ckpt.paths, "the checkpoint")
    )
    try:
        async with session.transfer("exporting", None) as bar:
            exported = await module.export_dcp_async(
                ckpt, target, target_dir, store=session.url, progress=bar.advance
            )
    except CheckpointNotFoundError as exc:
        hint = await session.elsewhere(ckpt)
        if not hint:
            raise
        raise CliError(str(exc) + hint, ExitCode.USAGE, type(exc).__name__) from None
    session.output.report(dcp.export_doc(session.doc(), exported), dcp.export_table(exported))


def _absolute(directory: Path) -> Path:
    """``--to DIR`` made absolute (``~`` expanded); the export checks what is there."""
    return directory.expanduser().absolute()


def import_dcp_command(
    ctx: typer.Context,
    source: Annotated[
        Path, typer.Argument(metavar="DIR", help="A DCP directory (.metadata, *.distcp).")
    ],
    epoch: EpochOption = 0,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="NAME",
            help="The checkpoint's name. \\[default: DIR's name, such as step-100]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Commit a directory DCP's FileSystemWriter wrote as one checkpoint, checked.

    Nothing is committed unless the metadata matches the files: every item has its
    record and every record its item, each file is exactly its items (a missing, short
    or longer file is refused, exit 1), each item matches the CRC-32s torch.save recorded
    in it, and each tensor has the dtype and shape of the metadata. DCP's format has no
    digest of its own: a byte item a planner stored raw (not with torch.save) is checked
    for size only. The new checkpoint loads through CairnReader by its id or its name.
    Needs the torch extra.
    """
    launch(ctx, lambda session: _import(session, source, epoch, name))


async def _import(session: Session, source: Path, epoch: int, name: str | None) -> None:
    module = dcp.torch_module()
    directory = dcp.source_dir(source)
    ckpt = await session.open(create=True)
    async with session.transfer(f"importing {directory}", None) as bar:
        imported = await module.import_dcp_async(
            ckpt, directory, epoch=epoch, name=name, progress=bar.advance
        )
    session.output.report(dcp.import_doc(session.doc(), imported), dcp.import_text(imported))
