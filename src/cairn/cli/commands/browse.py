"""``cairn list``, ``cairn history`` and ``cairn show``: what a store holds, read only.

None of them writes to the store. When there are no checkpoints under the prefix,
``list`` and ``history`` name the prefixes of the store that hold some, and ``show``
does when the checkpoint it is given is not there.
"""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer

from cairn import ObjectStoreCheckpointer
from cairn.cli import views
from cairn.cli.catalog import Latest, latest_mark, parse_ref, read_manifests
from cairn.cli.costs import cost_summary, cost_table, row_costs
from cairn.cli.errors import CliError, ExitCode
from cairn.cli.history import Point, history_chart, history_doc
from cairn.cli.maintain import parse_since, window
from cairn.cli.options import (
    CostOption,
    LimitOption,
    PriceOption,
    RefArgument,
    SinceOption,
    launch,
)
from cairn.cli.pricing import GivenPrices, PriceTable, no_price_reason, table_for_url
from cairn.cli.session import Session, checkpoint_prefixes, other_prefixes_hint
from cairn.cli.verify import signature_of, signature_state

__all__ = ["history_command", "list_command", "show_command"]


def list_command(
    ctx: typer.Context,
    limit: LimitOption = None,
    since: SinceOption = None,
) -> None:
    """List committed checkpoints, oldest first: epoch, age, kind, artifacts and size.

    Ids are shown short: the fewest characters (8 or more) that tell them apart, which
    every command takes. The table fits the terminal, dropping its least useful columns
    when narrow; --wide shows every column and whole ids. The latest (what load_latest
    and every command's 'latest' take) is marked: finding it reads and verifies the
    newest checkpoint's artifacts, up to 64 MiB in 1,024 objects (a larger newest is
    marked newest, unverified: 'cairn verify latest' reads it all); a newest that does
    not load is marked too. --ids
    prints the whole ids alone, one per line, oldest first, for scripts. When there are
    none under the prefix, names the prefixes of the store that hold some. --since and
    --limit list only the newest (by the time an id carries).
    """
    launch(ctx, lambda session: _list(session, limit, since))


async def _list(session: Session, limit: int | None, since: str | None) -> None:
    since_ms = _since(since)
    ckpt = await session.open(missing_is_empty=True)
    every = await ckpt.list_checkpoints()
    ids = window(every, limit, since_ms)
    out = session.output
    if out.full_ids and not out.wide and not out.json_mode:
        for cid in ids:  # for scripts: the ids alone, and nothing else on stdout
            out.line(str(cid))
        if not ids:
            out.note(_nothing_there(session))
        return
    if every and not ids:
        session.output.json(views.list_doc(session.doc(), [], Latest(None, None), []))
        session.output.line(
            f"no checkpoints since {since} under prefix {session.prefix!r} of {session.url} "
            f"({len(every)} older)"
        )
        return
    if not ids:
        others = await _none_under_prefix(session, ckpt)
        session.output.json(views.list_doc(session.doc(), [], Latest(None, None), others))
        return
    listed = await read_manifests(ckpt, ids)
    mark = await latest_mark(ckpt)
    session.output.json(views.list_doc(session.doc(), listed, mark, []))
    out.show(views.list_table(listed, mark, full_ids=out.full_ids, wide=out.wide))
    for item in listed:
        if item.error is not None:
            session.output.warning(f"checkpoint {item.checkpoint_id}: {item.error}")
    if mark.newest_fails:
        latest = "no checkpoint loads" if mark.latest is None else f"the latest is {mark.latest}"
        session.output.warning(
            f"the newest checkpoint, {mark.newest}, does not load: {latest} "
            f"(cairn verify newest names the damage)"
        )


def history_command(
    ctx: typer.Context,
    limit: LimitOption = None,
    since: SinceOption = None,
    cost: CostOption = False,
    price: PriceOption = None,
) -> None:
    """Draw the checkpoints over time: size uploaded and carried, duration, full or
    incremental, and the saves that did not commit and long gaps, at a glance.

    --since and --limit draw only the newest saves, committed or not. When there are
    none under the prefix, names the prefixes of the store that hold some. --cost
    lists each save's requests by kind and the bytes it sent and stored, in dollars,
    and what a day of checkpoints costs; unknown where a save recorded no requests.
    """
    launch(ctx, lambda session: _history(session, limit, since, cost or price is not None, price))


async def _history(
    session: Session, limit: int | None, since: str | None, cost: bool, price: GivenPrices | None
) -> None:
    since_ms = _since(since)
    table = _prices(session.parse(), price) if cost else None
    ckpt = await session.open(missing_is_empty=True)
    committed = set(await ckpt.list_checkpoints())
    dirs = await ckpt.list_checkpoint_dirs()
    if not dirs:
        others = await _none_under_prefix(session, ckpt)
        session.output.json({**history_doc(session.doc(), []), "other_prefixes": others})
        return
    listed = {item.checkpoint_id: item for item in await read_manifests(ckpt, sorted(committed))}
    points = [
        Point(cid, "uncommitted")
        if cid not in committed
        else Point(cid, "committed", listed[cid].manifest)
        if listed[cid].manifest is not None
        else Point(cid, "newer")
        if listed[cid].newer
        else Point(cid, "unreadable")
        for cid in window(dirs, limit, since_ms)
    ]
    out = session.output
    if not cost:
        chart = history_chart(points, full_ids=out.full_ids, wide=out.wide)
        out.report(history_doc(session.doc(), points), chart)
        return
    summary = cost_summary(
        points, table, None if table else no_price_reason(session.url, os.environ)
    )
    doc = history_doc(session.doc(), points)
    for row, point in zip(doc["series"], points, strict=True):
        row.update(row_costs(point, table))
    view = cost_table(points, summary, table, full_ids=out.full_ids, wide=out.wide)
    out.report({**doc, "cost": summary}, view)


def _prices(url: str, given: GivenPrices | None) -> PriceTable | None:
    """The prices ``history --cost`` uses for the store at ``url``: the built-in table
    of its cloud, with what ``--price`` gave over it; None when no price applies. A
    usage error when ``--price`` leaves a kind unpriced that no built-in table prices."""
    table = table_for_url(url, os.environ)
    if given is None:
        return table
    try:
        return given.over(table)
    except ValueError as exc:
        raise CliError(f"--price {given.text!r}: {exc}", ExitCode.USAGE) from None


def _since(text: str | None) -> int | None:
    """``--since`` in milliseconds after 1970 (None: not given), or a usage error."""
    if text is None:
        return None
    try:
        return parse_since(text, time.time_ns() // 1_000_000)
    except ValueError as exc:
        raise CliError(f"--since: {exc}", ExitCode.USAGE) from None


async def _none_under_prefix(session: Session, ckpt: ObjectStoreCheckpointer) -> list[str]:
    """Say there are no checkpoints under the prefix, naming the prefixes of the store
    that hold some; returns those."""
    others = await checkpoint_prefixes(ckpt.store, session.prefix)
    session.output.line(_nothing_there(session) + other_prefixes_hint(others))
    return others


def _nothing_there(session: Session) -> str:
    """The line that says the store holds no checkpoints under the prefix."""
    if session.missing_dir is not None:
        store = " (the default store: pass --store URL or set CAIRN_STORE)"
        return f"no checkpoints yet: the local directory {session.missing_dir} does not exist" + (
            store if session.default_store else ""
        )
    return f"no checkpoints under prefix {session.prefix!r} of {session.url}"


def show_command(
    ctx: typer.Context,
    ref: RefArgument,
    partitions: Annotated[
        bool,
        typer.Option(
            "--partitions",
            help="List every artifact and source, however many (with --json too).",
        ),
    ] = False,
) -> None:
    """Show one checkpoint: sources, offsets, the artifacts of its restore chains, and
    whether it is signed (with CAIRN_SIGNING_KEY, one not signed by it is refused).

    Over 200 artifacts (or 50 sources), a summary per operator instead; --partitions
    lists every artifact and source. --json follows the same rule: a summary has
    "listed": false and no "entries".
    """
    launch(ctx, lambda session: _show(session, ref, partitions))


async def _show(session: Session, ref: str, partitions: bool) -> None:
    parse_ref(ref)
    ckpt = await session.open()
    cid = await session.resolve(ckpt, ref)
    manifest = await ckpt.load_manifest(cid)  # with keys: refused unless signed by one
    signature = await signature_of(ckpt, cid)
    state = signature_state(ckpt, signature, verified=True)
    key_id = signature.key_id if signature is not None else None
    mark = await latest_mark(ckpt)
    listed = views.show_lists_entries(manifest, partitions)
    doc = views.show_doc(manifest, mark, listed, signature=state, key_id=key_id)
    out = session.output
    table = views.show_table(
        manifest,
        mark,
        listed,
        signature=state,
        key_id=key_id,
        full_ids=out.full_ids,
        wide=out.wide,
    )
    out.report({**session.doc(), **doc}, table)
