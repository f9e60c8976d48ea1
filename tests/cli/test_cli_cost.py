"""``cairn history --cost``: each save's requests priced in dollars, and a day's cost at
the observed interval; the price tables, ``--price`` and its errors; ``unknown`` for
checkpoints saved before cairn counted requests."""

from __future__ import annotations

import asyncio
import shutil
import statistics
from pathlib import Path

import msgspec
import pytest
from support.cli import PREFIX, cairn_many, document
from support.paths import DATA

from cairn import CheckpointData, CheckpointManifest, CheckpointPaths, ObjectStoreCheckpointer
from cairn.cli.pricing import (
    AZURE_BLOB_HOT,
    GCS_STANDARD,
    GIB,
    S3_STANDARD,
    dollars,
    interval_ms,
    parse_prices,
    request_usd,
    table_for_url,
)
from cairn.format.manifest import StoreRequests

MINUTE_MS = 60_000
PRICES = "put=0.005,get=0.0004,head=0.0004,list=0.005,delete=0.001,gb_month=0.023"
"""Every price given: dollars per 1,000 requests, and per GiB-month."""


async def saves_minutes_apart(root: Path, minutes: tuple[int, ...]) -> list[CheckpointManifest]:
    """A save committed at each of ``minutes`` (after a fixed start), each building on
    the one before."""
    ckpt = ObjectStoreCheckpointer(root.as_uri(), CheckpointPaths(PREFIX))
    start = 1_790_000_000_000
    manifests: list[CheckpointManifest] = []
    parent = None
    for i, minute in enumerate(minutes):
        data = CheckpointData(
            epoch=i,
            snapshots={("op", 0): b"s" * 4000} if parent is None else {},
            deltas={} if parent is None else {("op", 0): b"d" * (100 + i)},
            parent_id=parent,
            timestamp_ms=start + minute * MINUTE_MS,
        )
        manifest = await ckpt.save(data)
        parent = manifest.checkpoint_id
        manifests.append(manifest)
    return manifests


def requests_of(manifest: CheckpointManifest) -> dict[str, int]:
    assert manifest.stats is not None and isinstance(manifest.stats.requests, StoreRequests)
    return msgspec.structs.asdict(manifest.stats.requests)


def stored_of(manifest: CheckpointManifest) -> int:
    assert manifest.stats is not None and isinstance(manifest.stats.stored_bytes, int)
    return manifest.stats.stored_bytes


def test_history_cost_prices_each_save_and_a_day_at_the_median_interval(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    # Gaps of 10, 10 and 40 minutes: the median is 10 minutes, 144 checkpoints a day.
    manifests = asyncio.run(saves_minutes_apart(root, (0, 10, 20, 60)))
    store = ["--store", root.as_uri()]
    text, data = cairn_many(
        [["history", *store, "--price", PRICES], ["history", *store, "--price", PRICES, "--json"]],
        env={"COLUMNS": "200"},
    )
    assert text.code == 0 and data.code == 0, text.explain() + data.explain()
    doc = document("history", data)
    cost = doc["cost"]
    put, get, head, lst, delete = 0.005, 0.0004, 0.0004, 0.005, 0.001
    expected = []
    for row, manifest in zip(doc["series"], manifests, strict=True):
        n = requests_of(manifest)
        usd = (n["put"] * put + n["get"] * get + n["head"] * head + n["list"] * lst) / 1000 + n[
            "delete"
        ] * delete / 1000
        expected.append(usd)
        assert row["requests"] == n
        assert row["request_usd"] == pytest.approx(usd)
        assert row["sent_bytes"] == manifest.stats.uploaded_bytes  # type: ignore[union-attr]
        assert row["storage_usd_per_month"] == pytest.approx(stored_of(manifest) / GIB * 0.023)
    assert (cost["interval_ms"], cost["interval_gaps"]) == (10 * MINUTE_MS, 3)
    assert cost["checkpoints_per_day"] == pytest.approx(144)
    assert cost["known"] == 4
    assert cost["request_usd_per_checkpoint"] == pytest.approx(statistics.fmean(expected))
    assert cost["request_usd_per_day"] == pytest.approx(statistics.fmean(expected) * 144)
    mean_stored = statistics.fmean(stored_of(m) for m in manifests)
    assert cost["stored_bytes_per_day"] == round(mean_stored * 144)
    assert cost["storage_usd_per_month_per_day"] == pytest.approx(
        round(mean_stored * 144) / GIB * 0.023
    )
    assert cost["prices"]["per_1000_requests"]["delete"] == 0.001
    assert cost["prices"]["source"] is None and "no_price" not in cost

    assert "PUT" in text.stdout and "DELETE" in text.stdout
    for value in expected:
        assert dollars(value) in text.stdout, text.stdout
    assert "interval: 10.0 min, the median of 3 gap(s)" in text.stdout, text.stdout
    assert "per day at that interval: 144 checkpoints" in text.stdout, text.stdout
    assert dollars(statistics.fmean(expected) * 144) + " in requests" in text.stdout

    [narrow] = cairn_many([["history", *store, "--price", PRICES]], env={"COLUMNS": "80"})
    assert narrow.code == 0, narrow.explain()
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines()), narrow.stdout
    assert "Requests $" in narrow.stdout and dollars(expected[0]) in narrow.stdout


def test_a_local_store_has_no_price_unless_given(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    manifests = asyncio.run(saves_minutes_apart(root, (0, 5)))
    store = ["--store", root.as_uri()]
    text, data = cairn_many(
        [["history", *store, "--cost"], ["history", *store, "--cost", "--json"]],
        env={"COLUMNS": "120"},
    )
    assert text.code == 0, text.explain()
    doc = document("history", data)
    assert doc["cost"]["prices"] is None
    assert doc["cost"]["no_price"].startswith("no built-in price applies to a local store")
    assert doc["cost"]["interval_ms"] == 5 * MINUTE_MS  # the interval needs no price
    assert doc["cost"]["request_usd_per_day"] is None
    assert [row["request_usd"] for row in doc["series"]] == [None, None]
    assert [row["requests"] for row in doc["series"]] == [requests_of(m) for m in manifests]
    said = " ".join(text.stdout.split())  # the store's path may wrap the line anywhere
    assert "no built-in price applies to a local store" in said
    assert "give --price put=" in said
    assert "$" not in text.stdout.replace("$/month", ""), text.stdout


def test_price_overrides_the_table_of_the_stores_cloud() -> None:
    assert table_for_url("s3://bucket/jobs") is S3_STANDARD
    assert table_for_url("s3a://bucket") is S3_STANDARD
    assert table_for_url("https://bucket.s3.eu-west-1.amazonaws.com/x") is S3_STANDARD
    assert table_for_url("gs://bucket/jobs") is GCS_STANDARD
    assert table_for_url("https://storage.googleapis.com/bucket") is GCS_STANDARD
    for url in ("az://c/p", "azure://c/p", "abfss://c@acct.dfs.core.windows.net/p"):
        assert table_for_url(url) is AZURE_BLOB_HOT, url
    assert table_for_url("https://acct.blob.core.windows.net/c") is AZURE_BLOB_HOT
    for url in ("file:///tmp/x", "memory://", "https://minio.example/bucket"):
        assert table_for_url(url) is None, url
    # s3:// sent elsewhere is an S3-compatible store with prices of its own.
    assert table_for_url("s3://b", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}) is None
    aws = {"AWS_ENDPOINT_URL": "https://s3.us-east-1.amazonaws.com"}
    assert table_for_url("s3://b", aws) is S3_STANDARD

    # S3 bills PUT and LIST at $0.005, GET and HEAD at $0.0004 per 1,000; DELETE is free.
    counts = {"put": 1000, "get": 1000, "head": 1000, "list": 1000, "delete": 1000}
    assert request_usd(counts, S3_STANDARD) == pytest.approx(0.005 + 0.0004 * 2 + 0.005)
    given = parse_prices("put=0.01, GB_MONTH=0.05")
    table = given.over(S3_STANDARD)
    assert table.requests["put"] == 0.01 and table.requests["get"] == 0.0004
    assert table.gb_month == 0.05 and table.source == S3_STANDARD.source
    assert "with --price put, gb_month" in table.name
    with pytest.raises(ValueError, match="no price for get, head, list, delete"):
        given.over(None)
    assert interval_ms([30, 0, 10]) == (15.0, 2)  # sorted first: gaps 10 and 20
    assert interval_ms([5]) == (None, 0) and interval_ms([7, 7]) == (None, 1)
    assert [dollars(v) for v in (None, 0, 0.0000212, 0.0123, 2.5, 1234.5)] == [
        "unknown",
        "$0",
        "$0.0000212",
        "$0.0123",
        "$2.50",
        "$1,234.50",
    ]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("put=abc", "'put=abc'"),
        ("put=0.005,foo=1", "'foo=1'"),
        ("put=-1", "'put=-1'"),
        ("put=1e-3", "'put=1e-3'"),
        ("put=nan", "'put=nan'"),
        ("put=0.1,put=0.2", "'put=0.2'"),
        ("put", "'put'"),
        ("put=0.005,,get=1", "''"),
    ],
)
def test_a_bad_price_is_a_usage_error_naming_the_token(
    tmp_path: Path, value: str, named: str
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    asyncio.run(saves_minutes_apart(root, (0,)))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    store = ["--store", root.as_uri()]
    text, data = cairn_many(
        [["history", *store, "--price", value], ["history", *store, "--price", value, "--json"]]
    )
    assert text.code == 2, text.explain()
    line = text.error_line()
    assert "--price" in line and named in line, line
    error = document("history", data)["error"]
    assert (error["type"], error["exit_code"]) == ("UsageError", 2)
    assert named in error["message"]
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_prices_missing_for_a_store_without_a_table_are_named(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    asyncio.run(saves_minutes_apart(root, (0,)))
    [run] = cairn_many([["history", "--store", root.as_uri(), "--price", "put=0.005,list=0.005"]])
    assert run.code == 2, run.explain()
    assert "no price for get, head, delete" in run.error_line()


@pytest.mark.parametrize("old", ["store-unpacked", "store-0.1.0"])
def test_checkpoints_saved_before_requests_were_counted_cost_unknown(
    tmp_path: Path, old: str
) -> None:
    root = tmp_path / "old"
    shutil.copytree(DATA / old, root)
    store = ["--store", root.as_uri(), "--price", PRICES]
    text, data = cairn_many([["history", *store], ["history", *store, "--json"]])
    assert text.code == 0 and data.code == 0, text.explain() + data.explain()
    doc = document("history", data)
    committed = [row for row in doc["series"] if row["status"] == "committed"]
    assert committed
    for row in committed:
        assert "requests" not in row
        assert row["request_usd"] is None and row["storage_usd_per_month"] is None
    assert doc["cost"]["known"] == 0
    assert doc["cost"]["request_usd_per_checkpoint"] is None
    assert doc["cost"]["request_usd_per_day"] is None
    rows = [
        line for line in text.stdout.splitlines() if line[:8] in {r["id"][:8] for r in committed}
    ]
    assert len(rows) == len(committed), text.stdout
    assert all("unknown" in line and "$0 " not in line for line in rows), text.stdout
