"""The ``cairn`` commands: typer definitions that parse options and call the operations.

Every command takes ``--store URL`` (or ``$CAIRN_STORE``; default ``./checkpoints``),
``--prefix`` (or ``$CAIRN_PREFIX``; default the store's root, ``checkpoints/`` for a
store cairn 0.1 wrote, or the newest demo run's, see :mod:`cairn.cli.session`),
``--json`` and ``--debug``. Each command checks its arguments first (ids, policy,
URLs, target directory), then opens the store. Exit codes are documented in
:mod:`cairn.cli.errors`; the JSON documents in ``cairn/cli/schemas/*.schema.json``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from cairn import (
    CheckpointId,
    CheckpointNotFoundError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
)
from cairn.cli import dcp, views
from cairn.cli.catalog import (
    LATEST,
    check_refs,
    parse_ref,
    read_manifests,
    resolve,
    resolve_many,
)
from cairn.cli.copy import Copied, copy_checkpoints
from cairn.cli.errors import EXIT_CODES_HELP, CliError, ExitCode
from cairn.cli.files import check_target_dir
from cairn.cli.formats import OutputOption, apply_output
from cairn.cli.help import CairnCommand, CairnGroup
from cairn.cli.history import Point, history_chart, history_doc
from cairn.cli.limits import at_least
from cairn.cli.maintain import delete, parse_duration, parse_since, window
from cairn.cli.restore import restore
from cairn.cli.session import (
    Session,
    checkpoint_prefixes,
    cli_store_url,
    distribution_version,
    open_checkpointer,
    other_prefixes_hint,
    run,
)
from cairn.cli.verify import Verified, signature_of, signature_state, verify
from cairn.demo.harness import demo_command

__all__ = ["app"]

SUMMARY = "Inspect, verify, restore, copy and collect cairn checkpoints in any object store."

app = typer.Typer(
    name="cairn",
    cls=CairnGroup,
    help=f"{SUMMARY}\n\n{EXIT_CODES_HELP}",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="CAIRN_STORE",
        metavar="URL",
        help="Store URL (file:///dir, s3://bucket/prefix, gs://…, az://…, memory://) or a "
        "local path. \\[default: ./checkpoints]",
        show_default=False,
    ),
]
PrefixOption = Annotated[
    str | None,
    typer.Option(
        "--prefix",
        envvar="CAIRN_PREFIX",
        metavar="PREFIX",
        help="Base prefix of the checkpoints in the store. \\[default: the store's root "
        "(checkpoints/ for a store cairn 0.1 wrote), or the newest `cairn demo` run when "
        "nothing is there]",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout (a failure included)."),
]
DebugOption = Annotated[
    bool, typer.Option("--debug", help="Show cairn's log and the traceback of a failure.")
]
AllOption = Annotated[bool, typer.Option("--all", help="Every committed checkpoint.")]
RefArgument = Annotated[
    str,
    typer.Argument(
        metavar="ID|latest",
        help="A checkpoint id, its unique start (8 characters or more), or 'latest'.",
    ),
]
RefsArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="ID|latest",
        help="Checkpoint ids, their unique starts (8 characters or more), or 'latest'.",
        show_default=False,
    ),
]
WideOption = Annotated[
    bool,
    typer.Option("--wide", "-w", help="Every column and whole ids, however wide the terminal."),
]
IdsOption = Annotated[
    bool, typer.Option("--ids", help="Whole checkpoint ids instead of their short form.")
]


_SESSION_OPTIONS = [
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=a)
    for name, a, default in (
        ("store", StoreOption, None),
        ("prefix", PrefixOption, None),
        ("json_mode", JsonOption, False),
        ("debug", DebugOption, False),
    )
]
"""The options every command ends with: ``--store``, ``--prefix``, ``--json``, ``--debug``."""

_BEFORE = "cairn.session_options"
"""Where the root keeps the session options given before the command (``ctx.meta``)."""

Command = Callable[..., Awaitable[ExitCode | None]]


_CONTEXT = inspect.Parameter(
    "cairn_context", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context
)
"""The click context typer hands every command, to read the options given before it."""


def _session_values(given: dict[str, Any]) -> list[Any]:
    """The session options of a command, popped from ``given``: each one given after the
    command, else the one given before it (``cairn --store X list``), else its
    environment variable or default."""
    ctx: typer.Context = given.pop(_CONTEXT.name)
    before: dict[str, Any] = ctx.find_root().meta.get(_BEFORE, {})
    values = []
    for param in _SESSION_OPTIONS:
        value = given.pop(param.name)
        source = ctx.get_parameter_source(param.name)
        early = before.get(param.name)
        if (source is None or source.name != "COMMANDLINE") and early not in (None, False):
            value = early
        values.append(value)
    return values


_OUTPUT = inspect.Parameter(
    "output", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=OutputOption
)
"""``-o/--output``, which every command with a table (a ``wide`` parameter) takes."""


def command(name: str) -> Callable[[Command], Command]:
    """Register ``async func(session, ...)`` as the command ``name``: its own parameters
    (and :data:`_OUTPUT` when it has a table), then :data:`_SESSION_OPTIONS`, from which
    the :class:`Session` it is called with is made (given after the command or before
    it); :func:`run` runs it and turns its outcome into the exit code."""

    def register(func: Command) -> Command:
        own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]
        tabular = any(p.name == "wide" for p in own)

        @functools.wraps(func)
        def cli(**given: Any) -> None:
            output = given.pop(_OUTPUT.name) if tabular else None
            store, prefix, json_mode, debug = _session_values(given)
            clash = None
            if output is not None:
                json_mode, clash = apply_output(output, json_mode, given)
            session = Session.create(store, prefix, json_mode, debug)
            if clash is not None:
                run(session, functools.partial(_refuse, clash))
            else:
                run(session, lambda: func(session, **given))

        params = [_CONTEXT, *own, *([_OUTPUT] if tabular else []), *_SESSION_OPTIONS]
        # typer reads a command's parameters from its signature and type hints.
        cli.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        cli.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        app.command(name, cls=CairnCommand)(cli)
        return func

    return register


async def _refuse(message: str) -> None:
    raise CliError(message, ExitCode.USAGE)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cairn {distribution_version()}")
        raise typer.Exit()


_EARLY = " Before the command too; one given after it wins."


@app.callback()
def _root(
    ctx: typer.Context,
    store: Annotated[
        str | None,
        typer.Option("--store", metavar="URL", help="The store URL of the command." + _EARLY),
    ] = None,
    prefix: Annotated[
        str | None,
        typer.Option("--prefix", metavar="PREFIX", help="The base prefix of the command." + _EARLY),
    ] = None,
    json_mode: Annotated[
        bool, typer.Option("--json", help="The command prints one JSON document." + _EARLY)
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="The command shows its log and tracebacks." + _EARLY)
    ] = False,
    version: Annotated[
        bool,
        typer.Option("-V", "--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """The ``cairn`` group (its help is the app's); keeps the session options given
    before the command for the command to use."""
    ctx.meta[_BEFORE] = {"store": store, "prefix": prefix, "json_mode": json_mode, "debug": debug}


async def _resolve(session: Session, ckpt: ObjectStoreCheckpointer, ref: str) -> CheckpointId:
    """:func:`resolve`, naming the other prefixes that hold checkpoints when it fails."""
    try:
        return await resolve(ckpt, ref, session.where())
    except CliError as exc:
        hint = await session.elsewhere(ckpt)
        if not hint:
            raise
        raise CliError(exc.message + hint, exc.code, exc.kind) from None


def _since(text: str | None) -> int | None:
    """``--since`` in milliseconds after 1970 (None: not given), or a usage error."""
    if text is None:
        return None
    try:
        return parse_since(text, time.time_ns() // 1_000_000)
    except ValueError as exc:
        raise CliError(f"--since: {exc}", ExitCode.USAGE) from None


LimitOption = Annotated[int | None, at_least("--limit", 1, "Only the N newest (after --since).")]
SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="AGE|DATE",
        help="Only those created since: an age (7d, 12h) or a date (2026-01-31, "
        "2026-01-31T12:00Z; UTC unless an offset is given).",
        show_default=False,
    ),
]


@command("list")
async def list_command(
    session: Session,
    limit: LimitOption = None,
    since: SinceOption = None,
    wide: WideOption = False,
    full_ids: IdsOption = False,
) -> None:
    """List committed checkpoints, oldest first: epoch, age, kind, artifacts and size.

    Ids are shown short: the fewest characters (8 or more) that tell them apart, which
    every command takes. The table fits the terminal, dropping its least useful columns
    when narrow; --wide shows every column and whole ids, --ids whole ids. When there
    are none under the prefix, names the prefixes of the store that hold some.
    --since and --limit list only the newest (by the time an id carries).
    """
    since_ms = _since(since)
    ckpt = await session.open()
    every = await ckpt.list_checkpoints()
    ids = window(every, limit, since_ms)
    if every and not ids:
        session.output.json(views.list_doc(session.doc(), [], None, []))
        session.output.line(
            f"no checkpoints since {since} under prefix {session.prefix!r} of {session.url} "
            f"({len(every)} older)"
        )
        return
    listed = await read_manifests(ckpt, ids)
    latest = await ckpt.latest_id() if ids else None
    others = [] if ids else await checkpoint_prefixes(ckpt.store, session.prefix)
    session.output.json(views.list_doc(session.doc(), listed, latest, others))
    if ids:
        session.output.show(views.list_table(listed, latest, full_ids=full_ids, wide=wide))
    else:
        _say_none_under_prefix(session, others)
    for item in listed:
        if item.error is not None:
            session.output.warning(f"checkpoint {item.checkpoint_id}: {item.error}")


def _say_none_under_prefix(session: Session, others: list[str]) -> None:
    session.output.line(
        f"no checkpoints under prefix {session.prefix!r} of {session.url}"
        + other_prefixes_hint(others)
    )


@command("history")
async def history_command(
    session: Session,
    limit: LimitOption = None,
    since: SinceOption = None,
    wide: WideOption = False,
    full_ids: IdsOption = False,
) -> None:
    """Draw the checkpoints over time: size uploaded and carried, duration, full or
    incremental, and the saves that did not commit and long gaps, at a glance.

    --since and --limit draw only the newest saves, committed or not. When there are
    none under the prefix, names the prefixes of the store that hold some.
    """
    since_ms = _since(since)
    ckpt = await session.open()
    committed = set(await ckpt.list_checkpoints())
    dirs = await ckpt.list_checkpoint_dirs()
    every = window(dirs, limit, since_ms)
    if not dirs:
        others = await checkpoint_prefixes(ckpt.store, session.prefix)
        session.output.json({**history_doc(session.doc(), []), "other_prefixes": others})
        _say_none_under_prefix(session, others)
        return
    listed = {item.checkpoint_id: item for item in await read_manifests(ckpt, sorted(committed))}
    points = [
        Point(cid, "uncommitted")
        if cid not in committed
        else Point(cid, "committed", listed[cid].manifest)
        if listed[cid].manifest is not None
        else Point(cid, "unreadable")
        for cid in every
    ]
    chart = history_chart(points, full_ids=full_ids, wide=wide)
    session.output.report(history_doc(session.doc(), points), chart)


@command("show")
async def show_command(
    session: Session,
    ref: RefArgument,
    partitions: Annotated[
        bool,
        typer.Option(
            "--partitions",
            help="List every artifact and source, however many (with --json too).",
        ),
    ] = False,
    wide: WideOption = False,
    full_ids: IdsOption = False,
) -> None:
    """Show one checkpoint: sources, offsets, the artifacts of its restore chains, and
    whether it is signed (with CAIRN_SIGNING_KEY, one not signed by it is refused).

    Over 200 artifacts (or 50 sources), a summary per operator instead; --partitions
    lists every artifact and source. --json follows the same rule: a summary has
    "listed": false and no "entries".
    """
    parse_ref(ref)
    ckpt = await session.open()
    cid = await _resolve(session, ckpt, ref)
    manifest = await ckpt.load_manifest(cid)  # with keys: refused unless signed by one
    signature = await signature_of(ckpt, cid)
    state = signature_state(ckpt, signature, verified=True)
    key_id = signature.key_id if signature is not None else None
    latest = cid == await ckpt.latest_id()
    listed = views.show_lists_entries(manifest, partitions)
    doc = views.show_doc(manifest, latest, listed, signature=state, key_id=key_id)
    table = views.show_table(
        manifest,
        latest,
        listed,
        signature=state,
        key_id=key_id,
        full_ids=full_ids,
        wide=wide,
    )
    session.output.report({**session.doc(), **doc}, table)


@command("verify")
async def verify_command(
    session: Session,
    refs: RefsArgument = None,
    every: AllOption = False,
    wide: WideOption = False,
    full_ids: IdsOption = False,
) -> ExitCode:
    """Load checkpoints and check the SHA-256 of every artifact of every restore chain.

    Exits with 1 when any checkpoint fails, naming the damaged artifact or manifest, and
    with 4 when --all finds nothing to verify (an empty store, or the wrong prefix:
    it names the prefixes that hold checkpoints).
    Says whether each is signed; with CAIRN_SIGNING_KEY (hex keys, comma-separated),
    one not signed by one of the keys fails.
    """
    wanted = check_refs(refs or [], every)
    ckpt = await session.open()
    ids = await resolve_many(ckpt, wanted, every, session.where())
    if not ids:
        hint = await session.elsewhere(ckpt)
        raise CliError(
            f"no checkpoints to verify in {session.where()}{hint}", ExitCode.NOTHING_VERIFIED
        )
    async with session.transfer("verifying", None) as bar:
        results = await verify(ckpt, ids, bar)
    table = views.verify_table(results, full_ids=full_ids, wide=wide)
    session.output.report(views.verify_doc(session.doc(), results), table)
    return _outcome(session, results, "failed verification")


def _outcome(session: Session, results: Sequence[Verified | Copied], failing: str) -> ExitCode:
    """0 when every checkpoint of ``results`` is ``ok``; else 1, reporting the first that
    is not (``failing``: what happened to it, "were not copied")."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return ExitCode.OK
    session.output.fail(
        "IntegrityError",
        f"{len(failed)} of {len(results)} checkpoint(s) {failing}; "
        f"{failed[0].checkpoint_id}: {failed[0].error}",
        ExitCode.INTEGRITY,
    )
    return ExitCode.INTEGRITY


async def _resolve_many(
    session: Session, ckpt: ObjectStoreCheckpointer, refs: list[str], every: bool
) -> list[CheckpointId]:
    ids = await resolve_many(ckpt, refs, every, session.where())
    if every and not ids:
        hint = await session.elsewhere(ckpt)
        session.output.warning(f"no checkpoints in {session.where()}{hint}")
    return ids


@command("restore")
async def restore_command(
    session: Session,
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
) -> None:
    """Write a checkpoint's verified artifacts and manifest as files under DIR.

    DIR mirrors the store layout ({id}/manifest.json, {owner}/operators/..., {id}/offsets/
    ...), so it is itself a store: `cairn verify ID --store DIR --prefix ""`. The files are
    written into a staging directory in DIR and verified there; only then are they renamed
    to their names, the manifest last. A file that already holds other bytes is refused
    (exit 2) unless --overwrite; one that holds the same bytes is left alone. A symbolic
    link inside DIR where a file or folder is to be written is refused (exit 2), never
    followed or replaced.
    """
    target = to.expanduser().resolve()
    parse_ref(ref)
    check_target_dir(target)
    ckpt = await session.open()
    cid = await _resolve(session, ckpt, ref)
    async with session.transfer("restoring", None) as bar:
        restored = await restore(ckpt, cid, target, bar, overwrite=overwrite)
    session.output.report(views.restore_doc(session.doc(), restored), views.restore_table(restored))


@command("delete")
async def delete_command(
    session: Session,
    ref: RefArgument,
    force: Annotated[
        bool,
        typer.Option("--force", help="Delete even if other checkpoints or saves build on it."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say what would be deleted.")
    ] = False,
) -> None:
    """Delete one checkpoint: its manifest first (never half-listed), then its files.

    Refuses when other checkpoints or saves in progress build on it (their chains would
    break), unless --force. If _latest names it, _latest moves to the newest checkpoint
    that remains.
    """
    parse_ref(ref)
    ckpt = await session.open()
    cid = await resolve(ckpt, ref, session.where())
    deleted = await delete(ckpt, cid, force, session.where(), dry_run)
    session.output.report(views.delete_doc(session.doc(), deleted), views.delete_text(deleted))


def _duration(text: str) -> dt.timedelta:
    """:func:`parse_duration` as an option's parser: what is wrong with the value, as a
    usage error (a bare ValueError would reach the user prefixed with "Value error, ")."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _age_option(flag: str, help: str) -> Any:
    """The ``typer.Option`` of a duration option ``flag`` (metavar ``AGE``)."""
    return typer.Option(flag, metavar="AGE", parser=_duration, help=help, show_default=False)


def _policy(
    keep_last: int | None,
    keep_within: dt.timedelta | None,
    keep_every: int | None,
    pins: list[str],
) -> RetentionPolicy:
    """The retention policy of ``gc``'s flags, each checked and named (no I/O): at least
    one of --keep-last, --keep-within and --keep-every-n-epochs."""
    if keep_last is None and keep_within is None and keep_every is None:
        raise CliError(
            "give at least one of --keep-last, --keep-within and --keep-every-n-epochs",
            ExitCode.USAGE,
        )
    if keep_within is not None and keep_within <= dt.timedelta(0):
        raise CliError(
            f"--keep-within must be longer than 0s, got {keep_within.total_seconds():g}s",
            ExitCode.USAGE,
        )
    for pin in pins:
        if pin.lower() == LATEST:  # a pin names one checkpoint for good, not what is latest
            raise CliError("--pin: give a checkpoint id, not 'latest'", ExitCode.USAGE)
        try:
            parse_ref(pin)
        except CliError as exc:
            raise CliError(f"--pin: {exc.message}", exc.code) from None
    return RetentionPolicy(
        keep_last=keep_last,
        keep_within=keep_within,
        keep_every_n_epochs=keep_every,
    )


@command("gc")
async def gc_command(
    session: Session,
    keep_last: Annotated[
        int | None,
        at_least("--keep-last", 1, "Keep the N newest checkpoints."),
    ] = None,
    keep_within: Annotated[
        dt.timedelta | None,
        _age_option("--keep-within", "Keep every checkpoint younger than AGE (7d, 12h, 1h30m)."),
    ] = None,
    keep_every: Annotated[
        int | None,
        at_least("--keep-every-n-epochs", 1, "Keep every epoch divisible by N."),
    ] = None,
    pin: Annotated[
        list[str] | None,
        typer.Option("--pin", metavar="ID", help="Also keep this checkpoint (repeatable)."),
    ] = None,
    min_age: Annotated[
        dt.timedelta | None,
        _age_option(
            "--min-age",
            "Leave uncommitted objects younger than AGE alone (a save may be in progress). "
            "\\[default: 1h]",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say what would be deleted.")
    ] = False,
    wide: WideOption = False,
    full_ids: IdsOption = False,
) -> ExitCode:
    """Delete the checkpoints a retention policy does not keep, and sweep orphaned uploads.

    The policy is --keep-last, --keep-within, --keep-every-n-epochs and --pin together
    (at least one of the first three): a checkpoint any of them keeps stays, and the
    table (and --json's "reasons") says why each is kept. Never deletes the latest
    checkpoint, a kept or pinned one, or anything a kept checkpoint's restore chains need
    (a deleted checkpoint's artifacts that a kept one still uses stay, without their
    manifest; `cairn copy` copies them along). A pack of small artifacts stays whole
    while a kept checkpoint uses any of it: the summary says how much that keeps.
    Objects in checkpoint directories that cairn did not write are left alone and
    listed; a checkpoint whose manifest is damaged is left alone and reported (exit 1).
    A run with nothing to delete writes nothing, so it also works on a read-only store.
    """
    policy = _policy(keep_last, keep_within, keep_every, pin or [])
    ckpt = await session.open()
    pinned: list[CheckpointId] = []
    for ref in pin or []:
        try:
            pinned.append(await resolve(ckpt, ref, session.where()))
        except CliError as exc:
            raise CliError(f"--pin: {exc.message}", exc.code) from None
    policy = dataclasses.replace(policy, pinned=tuple(pinned))
    label = "planning garbage collection" if dry_run else "collecting garbage"
    async with session.transfer(label, None, unit=""):
        if min_age is None:
            result = await ckpt.gc(policy, dry_run=dry_run)
        else:
            result = await ckpt.gc(policy, dry_run=dry_run, min_age=min_age)
    if not result.deleted and not result.retained:
        hint = await session.elsewhere(ckpt)
        if hint:
            session.output.warning(f"no checkpoints in {session.where()}{hint}")
    table = views.gc_table(result, full_ids=full_ids, wide=wide)
    session.output.report(views.gc_doc(session.doc(), result), table)
    if result.failures:
        path, reason = result.failures[0]
        session.output.fail(
            "StoreError",
            f"store failure: {len(result.failures)} object(s) could not be deleted; "
            f"{path}: {reason}",
            ExitCode.STORE,
        )
        return ExitCode.STORE
    if result.damaged:
        cid, reason = next(iter(result.damaged.items()))
        session.output.fail(
            "IntegrityError",
            f"{len(result.damaged)} damaged checkpoint(s) left alone; {cid}: {reason}",
            ExitCode.INTEGRITY,
        )
        return ExitCode.INTEGRITY
    return ExitCode.OK


@command("copy")
async def copy_command(
    session: Session,
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
) -> ExitCode:
    """Copy checkpoints to another store or prefix; each copy is loaded and verified there.

    A checkpoint is copied with every artifact its restore chains use, wherever it lives
    (also the artifacts of an earlier checkpoint that gc deleted but a kept one still
    uses), under the same ids; chains are kept, not flattened.
    """
    wanted = check_refs(refs or [], every)
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
    session.output.report(
        views.copy_doc(session.doc(), to_doc, results),
        views.copy_table(results, f"{target_url} (prefix {target_prefix!r})", full_ids=full_ids),
    )
    return _outcome(session, results, "were not copied")


@command("export-dcp")
async def export_dcp_command(
    session: Session,
    ref: Annotated[
        str,
        typer.Argument(
            metavar="ID|latest|NAME",
            help="A checkpoint id, 'latest' (the latest DCP save), or a checkpoint name.",
        ),
    ],
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
    target_dir = to.expanduser().absolute()
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


@command("import-dcp")
async def import_dcp_command(
    session: Session,
    source: Annotated[
        Path, typer.Argument(metavar="DIR", help="A DCP directory (.metadata, *.distcp).")
    ],
    epoch: Annotated[
        int, typer.Option("--epoch", metavar="N", min=0, help="The epoch to record.")
    ] = 0,
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
    module = dcp.torch_module()
    directory = dcp.source_dir(source)
    ckpt = await session.open(create=True)
    async with session.transfer(f"importing {directory}", None) as bar:
        imported = await module.import_dcp_async(
            ckpt, directory, epoch=epoch, name=name, progress=bar.advance
        )
    session.output.report(dcp.import_doc(session.doc(), imported), dcp.import_text(imported))


app.command("demo", cls=CairnCommand)(demo_command)
