"""The ``cairn`` commands: typer definitions that parse options and call the operations.

Every command takes ``--store URL`` (or ``$CAIRN_STORE``; default ``./checkpoints``),
``--prefix`` (or ``$CAIRN_PREFIX``; default ``checkpoints/``), ``--json`` where it
reports, and ``--debug``. Exit codes are documented in :mod:`cairn.cli.errors`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from cairn import RetentionPolicy, __version__
from cairn.cli import views
from cairn.cli.catalog import parse_id, read_manifests, resolve, resolve_many
from cairn.cli.copy import copy_checkpoints
from cairn.cli.demo import demo_command
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.maintain import delete, parse_duration
from cairn.cli.progress import Transfer
from cairn.cli.restore import restore
from cairn.cli.session import DEFAULT_PREFIX, Session, open_checkpointer, run, store_url
from cairn.cli.verify import verify

__all__ = ["app"]

app = typer.Typer(
    name="cairn",
    help="Inspect, verify, restore, copy and collect cairn checkpoints in any object store.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="CAIRN_STORE",
        metavar="URL",
        help="Store URL: file:///dir, s3://bucket/prefix, gs://…, az://…, memory://, "
        "or a local path. [default: ./checkpoints]",
        show_default=False,
    ),
]
PrefixOption = Annotated[
    str,
    typer.Option("--prefix", envvar="CAIRN_PREFIX", help="Base prefix of the checkpoints."),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout, for scripts.")
]
DebugOption = Annotated[
    bool, typer.Option("--debug", help="Show cairn's log and the traceback of a failure.")
]
AllOption = Annotated[bool, typer.Option("--all", help="Every committed checkpoint.")]


def _where(session: Session) -> dict[str, str]:
    return {"store": session.url, "prefix": session.prefix}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cairn {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Inspect, verify, restore, copy and collect cairn checkpoints in any object store.

    Exit codes: 0 ok, 1 verification or integrity failure, 2 bad usage or input
    (including an unknown checkpoint), 3 store unreachable or failing.
    """


@app.command("list")
def list_command(
    store: StoreOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """List committed checkpoints, oldest first: epoch, age, kind, artifacts and size."""
    session = Session.create(store, prefix, json_mode)

    async def body() -> None:
        ckpt = session.checkpointer()
        ids = await ckpt.list_checkpoints()
        listed = await read_manifests(ckpt, ids)
        latest = ids[-1] if ids else None
        session.output.json(views.list_doc(_where(session), listed, latest))
        session.output.show(views.list_table(listed, latest))
        for item in listed:
            if item.error is not None:
                session.output.warning(f"checkpoint {item.checkpoint_id}: {item.error}")

    run(session, debug, body)


@app.command("show")
def show_command(
    ref: Annotated[str, typer.Argument(metavar="ID|latest", help="A checkpoint id or 'latest'.")],
    partitions: Annotated[
        bool,
        typer.Option(
            "--partitions",
            help="List every artifact and source, however many (with --json too).",
        ),
    ] = False,
    store: StoreOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Show one checkpoint's manifest: sources, offsets, and every artifact of its chains.

    Over 200 artifacts (or 50 sources), a summary per operator instead.

    --partitions lists every artifact and source. --json follows the same rule:
    a summary has "listed": false and no "entries".
    """
    session = Session.create(store, prefix, json_mode)

    async def body() -> None:
        ckpt = session.checkpointer()
        cid = await resolve(ckpt, ref, session.where())
        manifest = await ckpt.load_manifest(cid)
        ids = await ckpt.list_checkpoints()
        latest = bool(ids) and ids[-1] == cid
        listed = views.show_lists_entries(manifest, partitions)
        session.output.json({**_where(session), **views.show_doc(manifest, latest, listed)})
        session.output.show(views.show_table(manifest, latest, listed))

    run(session, debug, body)


@app.command("verify")
def verify_command(
    refs: Annotated[
        list[str] | None,
        typer.Argument(metavar="[ID|latest]...", help="Checkpoints to verify.", show_default=False),
    ] = None,
    every: AllOption = False,
    store: StoreOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Load checkpoints and check the SHA-256 of every artifact of every restore chain.

    Exits with 1 when any checkpoint fails, naming the damaged artifact or manifest.
    """
    session = Session.create(store, prefix, json_mode)

    async def body() -> ExitCode:
        ckpt = session.checkpointer()
        ids = await resolve_many(ckpt, refs or [], every, session.where())
        async with Transfer(session.output.err, "verifying", len(ids), unit="items") as bar:
            results = await verify(ckpt, ids, bar)
        session.output.json(views.verify_doc(_where(session), results))
        session.output.show(views.verify_table(results))
        failed = [r for r in results if not r.ok]
        if not failed:
            return ExitCode.OK
        session.output.error(
            f"{len(failed)} of {len(results)} checkpoint(s) failed verification; "
            f"{failed[0].checkpoint_id}: {failed[0].error}"
        )
        return ExitCode.INTEGRITY

    run(session, debug, body)


@app.command("restore")
def restore_command(
    ref: Annotated[str, typer.Argument(metavar="ID|latest", help="A checkpoint id or 'latest'.")],
    to: Annotated[
        Path,
        typer.Option("--to", metavar="DIR", help="Directory to write into (created if missing)."),
    ],
    store: StoreOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Write a checkpoint's verified artifacts and manifest as files under DIR.

    DIR mirrors the store layout ({id}/manifest.json, {owner}/operators/..., {id}/offsets/
    ...), so it is itself a store: `cairn verify ID --store DIR --prefix ""`. Each file is
    written to a temporary name, fsynced and renamed; the result is re-verified on disk.
    A symbolic link inside DIR where a file or folder is to be written is refused
    (exit 2), never followed or replaced.
    """
    session = Session.create(store, prefix, json_mode)
    target = to.expanduser().resolve()

    async def body() -> None:
        ckpt = session.checkpointer()
        cid = await resolve(ckpt, ref, session.where())
        async with Transfer(session.output.err, "restoring", None) as bar:
            restored = await restore(ckpt, cid, target, bar)
        session.output.json(views.restore_doc(_where(session), restored))
        session.output.show(views.restore_table(restored))

    run(session, debug, body)


@app.command("delete")
def delete_command(
    ref: Annotated[str, typer.Argument(metavar="ID", help="The checkpoint id to delete.")],
    force: Annotated[
        bool, typer.Option("--force", help="Delete even if later checkpoints build on it.")
    ] = False,
    store: StoreOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Delete one checkpoint: its manifest first (so it is never half-listed), then its files.

    Refuses when later checkpoints build on it (their chains would break), unless --force.
    """
    session = Session.create(store, prefix, json_mode)

    async def body() -> None:
        cid = parse_id(ref)
        ckpt = session.checkpointer()
        deleted = await delete(ckpt, cid, force, session.where())
        session.output.json(views.delete_doc(_where(session), deleted))
        session.output.show(views.delete_text(deleted))

    run(session, debug, body)


@app.command("gc")
def gc_command(
    keep_last: Annotated[
        int, typer.Option("--keep-last", metavar="N", help="Keep the N newest checkpoints.")
    ],
    keep_within: Annotated[
        dt.timedelta | None,
        typer.Option(
            "--keep-within",
            metavar="AGE",
            parser=parse_duration,
            help="Also keep every checkpoint younger than AGE (7d, 12h, 30m, 1h30m).",
        ),
    ] = None,
    keep_every: Annotated[
        int | None,
        typer.Option(
            "--keep-every-n-epochs", metavar="N", help="Also keep every epoch divisible by N."
        ),
    ] = None,
    pin: Annotated[
        list[str] | None,
        typer.Option("--pin", metavar="ID", help="Also keep this checkpoint (repeatable)."),
    ] = None,
    min_age: Annotated[
        dt.timedelta | None,
        typer.Option(
            "--min-age",
            metavar="AGE",
            parser=parse_duration,
            help="Leave uncommitted objects younger than AGE alone (a save may be in "
            "progress). [default: 1h]",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say what would be deleted.")
    ] = False,
    store: StoreOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Delete the checkpoints a retention policy does not keep, and sweep orphaned uploads.

    Never deletes the latest checkpoint, a kept or pinned one, or anything a kept
    checkpoint's restore chains need.
    """
    session = Session.create(store, prefix, json_mode)

    async def body() -> ExitCode:
        policy = RetentionPolicy(
            keep_last=keep_last,
            keep_within=keep_within,
            keep_every_n_epochs=keep_every,
            pinned=tuple(parse_id(p) for p in pin or []),
        )
        ckpt = session.checkpointer()
        label = "planning garbage collection" if dry_run else "collecting garbage"
        async with Transfer(session.output.err, label, None, unit=""):
            if min_age is None:
                result = await ckpt.gc(policy, dry_run=dry_run)
            else:
                result = await ckpt.gc(policy, dry_run=dry_run, min_age=min_age)
        session.output.json(views.gc_doc(_where(session), result))
        session.output.show(views.gc_table(result))
        if result.failures:
            path, reason = result.failures[0]
            session.output.error(
                f"store failure: {len(result.failures)} object(s) could not be deleted; "
                f"{path}: {reason}"
            )
            return ExitCode.STORE
        return ExitCode.OK

    run(session, debug, body)


@app.command("copy")
def copy_command(
    to: Annotated[
        str, typer.Option("--to", metavar="URL", help="Target store URL (or local path).")
    ],
    refs: Annotated[
        list[str] | None,
        typer.Argument(metavar="[ID|latest]...", help="Checkpoints to copy.", show_default=False),
    ] = None,
    to_prefix: Annotated[
        str | None,
        typer.Option("--to-prefix", help="Base prefix in the target. [default: --prefix]"),
    ] = None,
    every: AllOption = False,
    store: StoreOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    json_mode: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Copy checkpoints to another store or prefix; each copy is loaded and verified there.

    Chains are preserved, not flattened: a checkpoint brings the ancestors its restore
    chains need, and parents are copied before children under the same ids.
    """
    session = Session.create(store, prefix, json_mode)

    async def body() -> ExitCode:
        source = session.checkpointer()
        target_url = store_url(to)
        target_prefix = prefix if to_prefix is None else to_prefix
        target = open_checkpointer(target_url, target_prefix, create=True)
        if target_url == session.url and target.paths == source.paths:
            raise CliError(
                "the target is the source: give another --to or --to-prefix", ExitCode.USAGE
            )
        ids = await resolve_many(source, refs or [], every, session.where())
        async with Transfer(session.output.err, "copying", len(ids), unit="items") as bar:
            results = await copy_checkpoints(source, target, ids, bar)
        to_doc = {"store": target_url, "prefix": target_prefix}
        session.output.json(views.copy_doc(_where(session), to_doc, results))
        session.output.show(views.copy_table(results, f"{target_url} (prefix {target_prefix!r})"))
        failed = [r for r in results if not r.ok]
        if not failed:
            return ExitCode.OK
        session.output.error(
            f"{len(failed)} of {len(results)} checkpoint(s) were not copied; "
            f"{failed[0].checkpoint_id}: {failed[0].error}"
        )
        return ExitCode.INTEGRITY

    run(session, debug, body)


app.command("demo")(demo_command)
