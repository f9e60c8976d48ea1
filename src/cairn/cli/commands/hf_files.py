"""``cairn export-hf`` and ``cairn import-hf``: Hugging Face safetensors, out and in.

Both need the ``torch`` extra: without it they fail with exit 2 before touching a store
(:func:`cairn.cli.dcp.torch_module`); what they print is in :mod:`cairn.cli.hf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cairn import CheckpointNotFoundError, ObjectExistsError
from cairn.cli import dcp, hf
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.options import DcpRefArgument, EpochOption, launch
from cairn.cli.session import Session, cli_store_url
from cairn.stores import as_store

__all__ = ["export_hf_command", "import_hf_command"]


def export_hf_command(
    ctx: typer.Context,
    ref: DcpRefArgument,
    to: Annotated[
        str,
        typer.Option("--to", metavar="URL", help="Store URL or directory to write into."),
    ],
    max_shard_size: Annotated[
        str,
        typer.Option(
            "--max-shard-size", metavar="SIZE", help="Tensor bytes per shard at most (5GB, 500MiB)."
        ),
    ] = "5GB",
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            metavar="DTYPE",
            help="Cast floating-point tensors to bfloat16, float16, float32 or float64.",
            show_default=False,
        ),
    ] = None,
    strip_prefix: Annotated[
        str | None,
        typer.Option(
            "--strip-prefix",
            metavar="PREFIX",
            help="Write only the tensors whose FQN starts with PREFIX (model.), without it.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write a DCP checkpoint as Hugging Face safetensors shards, streamed and verified.

    URL gets model-00001-of-0000N.safetensors ... and model.safetensors.index.json, which
    safetensors and transformers' from_pretrained read. Each shard is streamed from the
    checkpoint's objects to URL (a multipart upload on S3, GCS and Azure): nothing is
    staged on a local disk, no tensor is held whole, and every item is checked against
    its SHA-256 before the shard's upload ends, so a damaged item fails the export (exit
    1) and its shard never appears. The index is written last: a URL without it holds no
    complete export, and one with it is refused. Byte items (non-tensor values) are left
    out. Needs the torch extra.
    """
    launch(ctx, lambda session: _export(session, ref, to, max_shard_size, dtype, strip_prefix))


async def _export(
    session: Session,
    ref: str,
    to: str,
    max_shard_size: str,
    dtype: str | None,
    strip_prefix: str | None,
) -> None:
    max_shard_bytes = hf.parse_size(max_shard_size)
    if dtype is not None and dtype not in hf.CAST_DTYPES:
        raise CliError(
            f"--dtype {dtype!r}: choose one of {', '.join(hf.CAST_DTYPES)}", ExitCode.USAGE
        )
    module = dcp.torch_module()
    import torch

    target_url = cli_store_url(to)
    session.other_store = True
    ckpt = await session.open()
    target = (
        None
        if ref.lower() == "latest"
        else module.interpret_checkpoint_id(ref, session.url, ckpt.paths, "the checkpoint")
    )
    cast = None if dtype is None else getattr(torch, dtype)
    fqn_map = None if strip_prefix is None else module.under_prefix(strip_prefix)
    try:
        async with session.transfer("exporting", None) as bar:
            exported = await module.export_hf_async(
                ckpt,
                target,
                as_store(target_url),
                shown=target_url,
                max_shard_bytes=max_shard_bytes,
                dtype=cast,
                fqn_map=fqn_map,
                store=session.url,
                progress=bar.advance,
            )
    except ObjectExistsError as exc:  # the destination holds an export: choose another
        raise CliError(f"--to {target_url}: {exc.reason}", ExitCode.USAGE) from None
    except CheckpointNotFoundError as exc:
        hint = await session.elsewhere(ckpt)
        if not hint:
            raise
        raise CliError(str(exc) + hint, ExitCode.USAGE, type(exc).__name__) from None
    session.output.report(hf.export_doc(session.doc(), exported), hf.export_table(exported))


def import_hf_command(
    ctx: typer.Context,
    source: Annotated[
        str,
        typer.Argument(
            metavar="DIR_OR_URL", help="A safetensors directory: a local path or a store URL."
        ),
    ],
    epoch: EpochOption = 0,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="NAME",
            help="The checkpoint's name. \\[default: the last segment of DIR_OR_URL]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Commit a safetensors directory as one DCP checkpoint, digests made on the way in.

    DIR_OR_URL holds model.safetensors, or shards and model.safetensors.index.json. Every
    header is checked before anything is uploaded (each tensor's bytes are its dtype
    times its shape, end to end, to the end of the file; a file the index names must be
    there): a file that fails commits nothing (exit 1). safetensors carries no checksum,
    so cairn's SHA-256 digests, computed as the bytes are uploaded, protect the tensors
    from then on. dcp.load through CairnReader loads the checkpoint, by its id or name,
    at any sharding. Needs the torch extra.
    """
    launch(ctx, lambda session: _import(session, source, epoch, name))


async def _import(session: Session, source: str, epoch: int, name: str | None) -> None:
    module = dcp.torch_module()
    source_url = cli_store_url(source)
    if source_url.startswith("file://"):
        dcp.source_dir(Path(source))
    chosen = name if name is not None else source_url.rstrip("/").rsplit("/", 1)[-1]
    session.other_store = True
    ckpt = await session.open(create=True)
    async with session.transfer(f"importing {source_url}", None) as bar:
        imported = await module.import_hf_async(
            ckpt,
            as_store(source_url),
            shown=source_url,
            name=chosen,
            epoch=epoch,
            progress=bar.advance,
        )
    session.output.report(hf.import_doc(session.doc(), imported), hf.import_text(imported))
