"""``cairn verify``, ``cairn restore`` and ``cairn copy``: every byte of checkpoints read
and verified, then left where it is, written as files, or copied to another store.

``verify`` and ``copy`` take several checkpoints (or ``--all``) and exit with 1 when any
of them fails, naming the first; ``restore`` takes one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from cairn import CheckpointId, ObjectStoreCheckpointer
from cairn.cli import views
from cairn.cli.catalog import check_refs, parse_ref, resolve_many
from cairn.cli.copy import Copied, copy_checkpoints
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.files import check_target_dir
from cairn.cli.options import (
    AllOption,
    IdsOption,
    RefArgument,
    RefsArgument,
    SkipNewerOption,
    launch,
)
from cairn.cli.restore import Layout, restore
from cairn.cli.session import Session, cli_store_url, open_checkpointer
from cairn.cli.verify import Verified, verify

__all__ = ["copy_command", "restore_command", "verify_command"]


def verify_command(
    ctx: typer.Context,
    refs: RefsArgument = None,
    every: AllOption = False,
) -> None:
    """Load checkpoints and check the SHA-256 of every artifact of every restore chain.

    Exits with 1 when any checkpoint fails, naming the damaged artifact or manifest, and
    with 4 when --all finds nothing to verify (an empty store, or the wrong prefix:
    it names the prefixes that hold checkpoints).
    Says whether each is signed; with CAIRN_SIGNING_KEY (hex keys, comma-separated),
    one not signed by one of the keys fails.
    """
    launch(ctx, lambda session: _verify(session, refs or [], every))


async def _verify(session: Session, refs: list[str], every: bool) -> ExitCode:
    wanted = check_refs(refs, every)
    ckpt = await session.open()
    ids = await resolve_many(ckpt, wanted, every, session.where())
    if not ids:
        hint = await session.elsewhere(ckpt)
        raise CliError(
            f"no checkpoints to verify in {session.where()}{hint}", ExitCode.NOTHING_VERIFIED
        )
    async with session.transfer("verifying", None) as bar:
        results = await verify(ckpt, ids, bar)
    out = session.output
    table = views.verify_table(results, full_ids=out.full_ids, wide=out.wide)
    out.report(views.verify_doc(session.doc(), results), table)
    return _outcome(session, results, "failed verification")


def _outcome(session: Session, results: Sequence[Verified | Copied], failing: str) -> ExitCode:
    """0 when every checkpoint of ``results`` is ``ok``; else 1, reporting the first that
    is not (``failing``: what happened to it, "were not copied"), or 5 when each that is
    not needs a newer cairn (status ``newer``: not damage)."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return ExitCode.OK
    damaged = [r for r in failed if r.status != "newer"]
    code = ExitCode.INTEGRITY if damaged else ExitCode.NEWER_FORMAT
    first = (damaged or failed)[0]
    session.output.fail(
        "IntegrityError" if damaged else "NewerFormatError",
        f"{len(failed)} of {len(results)} checkpoint(s) {failing}; "
        f"{first.checkpoint_id}: {first.error}",
        code,
    )
    return code


def restore_command(
    ctx: typer.Context,
    ref: RefArgument,
    to: Annotated[
        Path,
        typer.Option("--to", metavar="DIR", help="Directory to write into (created if missing)."),
    ],
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace files in DIR that hold other bytes under the same names."
        ),
    ] = False,
    skip_newer_format: SkipNewerOption = False,
    layout: Annotated[
        Layout,
        typer.Option(
            "--layout",
            metavar="LAYOUT",
            case_sensitive=False,
            help="store: a copy of the store's objects; partitions: the state, a file per "
            "partition.",
        ),
    ] = Layout.STORE,
) -> None:
    """Write a checkpoint's verified files under DIR, as a store or as partition files.

    --layout store (the default) writes the store's own objects: packs, the manifest,
    {id}/offsets/..., so DIR is itself a store (`cairn verify ID --store DIR --prefix
    ""`), to copy or inspect. --layout partitions writes the state a job restores from:
    DIR/OPERATOR/partition-P.snapshot, then .delta-1, .delta-2, ... to apply in order
    (decoded), a directory partition's files under DIR/OPERATOR/partition-P/, and
    DIR/offsets/SOURCE.json. Either way the files are written into a staging directory in
    DIR and verified there; only then are they renamed to their names, the manifest
    last. A file that already holds other bytes is refused (exit 2) unless --overwrite;
    one that holds the same bytes is left alone. A symbolic link inside DIR where a file
    or folder is to be written is refused (exit 2), never followed or replaced. When the
    latest checkpoint needs a newer cairn (format features this cairn does not know),
    'latest' fails with exit 5 rather than restore older state; --skip-newer-format
    restores the newest this cairn reads.
    """
    launch(ctx, lambda session: _restore(session, ref, to, overwrite, skip_newer_format, layout))


async def _restore(
    session: Session,
    ref: str,
    to: Path,
    overwrite: bool,
    skip_newer_format: bool,
    layout: Layout,
) -> None:
    parse_ref(ref)
    target = _target_dir(to)
    ckpt = await session.open()
    cid = await session.resolve(ckpt, ref, skip_newer_format=skip_newer_format)
    async with session.transfer("restoring", None) as bar:
        restored = await restore(ckpt, cid, target, bar, overwrite=overwrite, layout=layout)
    session.output.report(views.restore_doc(session.doc(), restored), views.restore_table(restored))


def _target_dir(to: Path) -> Path:
    """``--to DIR`` made absolute, its links resolved, and checked: a usage error when it
    cannot be written into."""
    target = to.expanduser().resolve()
    check_target_dir(target)
    return target


def copy_command(
    ctx: typer.Context,
    to: Annotated[
        str, typer.Option("--to", metavar="URL", help="Target store URL (or local path).")
    ],
    refs: RefsArgument = None,
    to_prefix: Annotated[
        str | None,
        typer.Option(
            "--to-prefix",
            metavar="PREFIX",
            help="Base prefix in the target. \\[default: the source's prefix]",
            show_default=False,
        ),
    ] = None,
    every: AllOption = False,
    full_ids: IdsOption = False,
) -> None:
    """Copy checkpoints to another store or prefix; each copy is loaded and verified there.

    A checkpoint is copied with every artifact its restore chains use, wherever it lives
    (also the artifacts of an earlier checkpoint that gc deleted but a kept one still
    uses), under the same ids; chains are kept, not flattened.
    """
    launch(ctx, lambda session: _copy(session, to, refs or [], to_prefix, every), full_ids=full_ids)


async def _copy(
    session: Session, to: str, refs: list[str], to_prefix: str | None, every: bool
) -> ExitCode:
    wanted = check_refs(refs, every)
    target_url = cli_store_url(to)
    session.other_store = True
    source = await session.open()
    target_prefix = session.prefix if to_prefix is None else to_prefix
    target = open_checkpointer(
        target_url, target_prefix, create=True, signing_key=session.signing_key
    )
    if target_url == session.url and target.paths == source.paths:
        raise CliError("the target is the source: give another --to or --to-prefix", ExitCode.USAGE)
    ids = await _resolve_many(session, source, wanted, every)
    async with session.transfer("copying", None) as bar:
        results = await copy_checkpoints(source, target, ids, bar)
    to_doc = {"store": target_url, "prefix": target_prefix}
    where = f"{target_url} (prefix {target_prefix!r})"
    session.output.report(
        views.copy_doc(session.doc(), to_doc, results),
        views.copy_table(results, where, full_ids=session.output.full_ids),
    )
    return _outcome(session, results, "were not copied")


async def _resolve_many(
    session: Session, ckpt: ObjectStoreCheckpointer, refs: list[str], every: bool
) -> list[CheckpointId]:
    ids = await resolve_many(ckpt, refs, every, session.where())
    if every and not ids:
        hint = await session.elsewhere(ckpt)
        session.output.warning(f"no checkpoints in {session.where()}{hint}")
    return ids
