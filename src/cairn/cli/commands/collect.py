"""``cairn delete`` and ``cairn gc``: checkpoints removed, never what another one needs.

Both check their arguments (the id; the retention policy and its pins) before they
open the store, and with ``--dry-run`` only say what they would delete. What they keep
and why is :mod:`cairn.cli.maintain`'s and the library's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from cairn import CheckpointId, GcResult, RetentionPolicy
from cairn.cli import views
from cairn.cli.catalog import LATEST, parse_ref, resolve
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.limits import at_least
from cairn.cli.maintain import delete, parse_duration
from cairn.cli.options import RefArgument, launch
from cairn.cli.session import Session

__all__ = ["delete_command", "gc_command"]

DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Only say what would be deleted.")]


def delete_command(
    ctx: typer.Context,
    ref: RefArgument,
    force: Annotated[
        bool,
        typer.Option("--force", help="Delete even if other checkpoints or saves build on it."),
    ] = False,
    dry_run: DryRunOption = False,
) -> None:
    """Delete one checkpoint: its manifest first (never half-listed), then its files.

    Refuses when other checkpoints or saves in progress build on it (their chains would
    break), unless --force. If _latest names it, _latest moves to the newest checkpoint
    that remains.
    """
    launch(ctx, lambda session: _delete(session, ref, force, dry_run))


async def _delete(session: Session, ref: str, force: bool, dry_run: bool) -> None:
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


def gc_command(
    ctx: typer.Context,
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
    dry_run: DryRunOption = False,
) -> None:
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
    rules = _Rules(keep_last, keep_within, keep_every, pin or [])
    launch(ctx, lambda session: _gc(session, rules, min_age, dry_run))


@dataclass(frozen=True)
class _Rules:
    """``gc``'s retention flags, as given."""

    keep_last: int | None
    keep_within: dt.timedelta | None
    keep_every: int | None
    pins: list[str]


def _policy(rules: _Rules) -> RetentionPolicy:
    """The retention policy of ``gc``'s flags, each checked and named (no I/O): at least
    one of --keep-last, --keep-within and --keep-every-n-epochs."""
    keep_within = rules.keep_within
    if rules.keep_last is None and keep_within is None and rules.keep_every is None:
        raise CliError(
            "give at least one of --keep-last, --keep-within and --keep-every-n-epochs",
            ExitCode.USAGE,
        )
    if keep_within is not None and keep_within <= dt.timedelta(0):
        raise CliError(
            f"--keep-within must be longer than 0s, got {keep_within.total_seconds():g}s",
            ExitCode.USAGE,
        )
    for pin in rules.pins:
        if pin.lower() == LATEST:  # a pin names one checkpoint for good, not what is latest
            raise CliError("--pin: give a checkpoint id, not 'latest'", ExitCode.USAGE)
        try:
            parse_ref(pin)
        except CliError as exc:
            raise CliError(f"--pin: {exc.message}", exc.code) from None
    return RetentionPolicy(
        keep_last=rules.keep_last,
        keep_within=keep_within,
        keep_every_n_epochs=rules.keep_every,
    )


async def _gc(
    session: Session, rules: _Rules, min_age: dt.timedelta | None, dry_run: bool
) -> ExitCode:
    policy = _policy(rules)
    ckpt = await session.open()
    pinned: list[CheckpointId] = []
    for ref in rules.pins:
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
    out = session.output
    table = views.gc_table(result, full_ids=out.full_ids, wide=out.wide)
    out.report(views.gc_doc(session.doc(), result), table)
    failure = _gc_failure(result)
    if failure is None:
        return ExitCode.OK
    error_type, message, code = failure
    out.fail(error_type, message, code)
    return code


def _gc_failure(result: GcResult) -> tuple[str, str, ExitCode] | None:
    """What makes a GC run fail, the most serious first: its error type, message and exit
    code; None when it succeeded."""
    if result.failures:
        path, reason = result.failures[0]
        count = f"{len(result.failures)} object(s) could not be deleted"
        return "StoreError", f"store failure: {count}; {path}: {reason}", ExitCode.STORE
    if result.newer_format:
        cid, reason = next(iter(result.newer_format.items()))
        count = f"{len(result.newer_format)} checkpoint(s) need a newer cairn: nothing deleted"
        return "NewerFormatError", f"{count}; {cid}: {reason}", ExitCode.NEWER_FORMAT
    if result.damaged:
        cid, reason = next(iter(result.damaged.items()))
        count = f"{len(result.damaged)} damaged checkpoint(s) left alone"
        return "IntegrityError", f"{count}; {cid}: {reason}", ExitCode.INTEGRITY
    return None
