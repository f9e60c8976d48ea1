"""What a checkpoint costs in dollars: price tables, ``--price``, and the estimates.

A save records the store requests it made, by kind, and the bytes it left in the store
(:class:`cairn.format.manifest.SaveStats`); a price table turns those into dollars. The
tables are list prices in US dollars, per 1,000 requests of each kind cairn counts
(``put``, ``get``, ``head``, ``list``, ``delete``) and per GiB-month (2**30 bytes kept
for a month) of storage, for one region of each cloud (:data:`TABLES`, each naming its
source page and the date of its prices). The store's URL picks the table
(:func:`table_for_url`); a local or memory store has none. ``--price`` gives prices
itself (:func:`parse_prices`), over the table's or, where there is none, all of them.

How a store bills a request of each kind, and where cairn's counts fall short of the
bill: one streamed (multipart) upload counts as one ``put``, and the store bills each of
its parts too (8 MiB each), so for artifacts over 8 MiB the estimate is low; the HTTP
retries obstore makes inside one call are not counted either. Pure: no I/O.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cairn.cli.views.summary import REQUEST_KINDS

__all__ = [
    "AZURE_BLOB_HOT",
    "DAY_MS",
    "GCS_STANDARD",
    "GIB",
    "PRICE_KEYS",
    "S3_ENDPOINT_VARIABLES",
    "S3_STANDARD",
    "TABLES",
    "GivenPrices",
    "PriceTable",
    "dollars",
    "interval_ms",
    "no_price_reason",
    "parse_prices",
    "request_usd",
    "storage_usd_per_month",
    "table_for_url",
]

PRICE_KEYS = (*REQUEST_KINDS, "gb_month")
"""The keys ``--price`` takes."""

GIB = 2**30
"""The bytes of the GB the clouds bill storage in (AWS, Google and Azure: 2**30)."""

DAY_MS = 86_400_000
PER = 1000
"""Request prices are dollars per this many requests."""


@dataclass(frozen=True)
class PriceTable:
    """Prices for one kind of storage: ``requests`` in dollars per 1,000 requests of each
    kind, ``gb_month`` in dollars per GiB kept a month (None: storage not priced).

    Attributes:
        name: What the prices are for, region included.
        requests: Dollars per 1,000 requests, by kind (:data:`REQUEST_KINDS`).
        gb_month: Dollars per GiB-month of storage, or None.
        source: The page the prices are published on, or None (given with ``--price``).
        as_of: The date of the prices (``YYYY-MM``), or None.
    """

    name: str
    requests: Mapping[str, float]
    gb_month: float | None
    source: str | None = None
    as_of: str | None = None

    def doc(self) -> dict[str, Any]:
        """The table as ``history --cost --json`` prints it."""
        return {
            "name": self.name,
            "source": self.source,
            "as_of": self.as_of,
            "per_1000_requests": {kind: self.requests[kind] for kind in REQUEST_KINDS},
            "gb_month": self.gb_month,
        }

    def text(self) -> str:
        """The prices in one line, for people."""
        kinds = ", ".join(
            f"{kind.upper()} {_number(self.requests[kind])}" for kind in REQUEST_KINDS
        )
        storage = (
            f"; storage ${_number(self.gb_month)} per GiB-month"
            if self.gb_month is not None
            else "; storage not priced"
        )
        where = f" ({self.source}, prices of {self.as_of})" if self.source else ""
        return f"prices: {self.name}, USD per 1,000 requests: {kinds}{storage}{where}"


S3_STANDARD = PriceTable(
    name="Amazon S3 Standard, US East (N. Virginia)",
    requests={"put": 0.005, "get": 0.0004, "head": 0.0004, "list": 0.005, "delete": 0.0},
    gb_month=0.023,
    source="https://aws.amazon.com/s3/pricing/",
    as_of="2026-12",
)
"""S3 Standard list prices, US East (N. Virginia): PUT and LIST are "PUT, COPY, POST,
LIST requests", GET and HEAD "GET, SELECT and all other requests", DELETE is free;
storage: the first 50 TB a month."""

GCS_STANDARD = PriceTable(
    name="Google Cloud Storage Standard, region us-central1",
    requests={"put": 0.005, "get": 0.0004, "head": 0.0004, "list": 0.005, "delete": 0.0},
    gb_month=0.020,
    source="https://cloud.google.com/storage/pricing",
    as_of="2026-12",
)
"""Cloud Storage Standard list prices in a single region (us-central1): inserts and
object listings are Class A operations, reads and metadata reads Class B, deletes free."""

AZURE_BLOB_HOT = PriceTable(
    name="Azure Blob Storage Hot, LRS, East US",
    requests={"put": 0.0055, "get": 0.00044, "head": 0.00044, "list": 0.0055, "delete": 0.0},
    gb_month=0.018,
    source="https://azure.microsoft.com/en-us/pricing/details/storage/blobs/",
    as_of="2026-12",
)
"""Azure Blob Storage Hot tier, LRS, East US, pay as you go (the page lists prices per
10,000 operations; here per 1,000): PUT is a write operation, LIST a list operation,
GET a read, HEAD (Get Blob Properties) one of "all other operations", DELETE free;
storage: the first 50 TB a month."""

TABLES: Mapping[str, PriceTable] = {"s3": S3_STANDARD, "gcs": GCS_STANDARD, "azure": AZURE_BLOB_HOT}
"""The built-in tables, by cloud."""

_CLOUD_OF_SCHEME = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "az": "azure",
    "azure": "azure",
    "abfs": "azure",
    "abfss": "azure",
}
_CLOUD_OF_HOST = (
    (re.compile(r"(^|\.)amazonaws\.com$"), "s3"),
    (re.compile(r"^storage\.googleapis\.com$"), "gcs"),
    (re.compile(r"\.(blob|dfs)\.core\.windows\.net$"), "azure"),
)


S3_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
"""The environment variables that send ``s3://`` to another endpoint (an S3-compatible
store, which bills by its own prices), the first set wins."""


def _s3_endpoint(env: Mapping[str, str]) -> str | None:
    """The endpoint ``s3://`` goes to when it is not AWS's, from ``env``; else None."""
    for name in S3_ENDPOINT_VARIABLES:
        if env.get(name):
            host = (urlsplit(env[name]).hostname or env[name]).lower()
            return None if host.endswith("amazonaws.com") else env[name]
    return None


def table_for_url(url: str, env: Mapping[str, str] | None = None) -> PriceTable | None:
    """The built-in table for a store URL: S3 for ``s3://`` (and AWS's https hosts),
    GCS for ``gs://``, Azure for ``az://`` (``azure://``, ``abfs[s]://``, its https
    hosts); None for a local or memory store, for ``s3://`` sent to another endpoint by
    ``env`` (:data:`S3_ENDPOINT_VARIABLES`), and for any other https endpoint: an
    S3-compatible store bills by its own prices.

    Args:
        url: The store URL, as ``cairn`` prints it.
        env: The environment the store is opened in (its endpoint variables).

    Returns:
        The table, or None when none applies.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    cloud = _CLOUD_OF_SCHEME.get(scheme)
    if cloud == "s3" and _s3_endpoint(env or {}) is not None:
        return None
    if cloud is not None:
        return TABLES[cloud]
    if scheme == "https":
        host = (parts.hostname or "").lower()
        for pattern, name in _CLOUD_OF_HOST:
            if pattern.search(host):
                return TABLES[name]
    return None


def no_price_reason(url: str, env: Mapping[str, str] | None = None) -> str:
    """Why no built-in price applies to the store at ``url``, in words.

    Args:
        url: The store URL.
        env: The environment the store is opened in.

    Returns:
        The reason, ending in what to do (give ``--price``).
    """
    scheme = urlsplit(url).scheme.lower()
    endpoint = _s3_endpoint(env or {}) if _CLOUD_OF_SCHEME.get(scheme) == "s3" else None
    if endpoint is not None:
        what = f"an S3-compatible endpoint ({endpoint}), which bills by its own prices"
    else:
        what = {"file": "a local store", "memory": "a memory store"}.get(
            scheme, f"this store ({url})"
        )
        what += f" ({url})" if scheme in ("file", "memory") else ""
    return f"no built-in price applies to {what}; give --price"


@dataclass(frozen=True)
class GivenPrices:
    """What ``--price`` gave: dollars per 1,000 requests by kind, and ``gb_month``.

    Attributes:
        prices: The prices given, by key (:data:`PRICE_KEYS`).
        text: The option's value as given.
    """

    prices: Mapping[str, float]
    text: str

    def over(self, table: PriceTable | None) -> PriceTable:
        """The prices given, over ``table``'s (those not given are the table's).

        Args:
            table: The built-in table of the store, or None.

        Returns:
            The table to price with.

        Raises:
            ValueError: ``table`` is None and a request kind has no price given; the
                message names the kinds.
        """
        given = {k: v for k, v in self.prices.items() if k in REQUEST_KINDS}
        if table is None:
            missing = [kind for kind in REQUEST_KINDS if kind not in given]
            if missing:
                raise ValueError(
                    f"no price for {', '.join(missing)}, and no built-in price applies to "
                    f"this store: give all of {', '.join(REQUEST_KINDS)}"
                )
            return PriceTable("prices given with --price", given, self.prices.get("gb_month"))
        requests = {**table.requests, **given}
        gb_month = self.prices.get("gb_month", table.gb_month)
        keys = ", ".join(k for k in PRICE_KEYS if k in self.prices)
        return PriceTable(
            f"{table.name}, with --price {keys}",
            requests,
            gb_month,
            table.source,
            table.as_of,
        )


_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


def parse_prices(text: str | GivenPrices) -> GivenPrices:
    """``--price``'s value: ``key=dollars`` pairs, comma-separated (``put=0.005,get=0.0004``).

    Keys are :data:`PRICE_KEYS`; request prices are dollars per 1,000 requests,
    ``gb_month`` dollars per GiB-month. Each key at most once; each value a plain
    decimal number, 0 or more.

    Args:
        text: The option's value (or an already parsed one, which is returned).

    Returns:
        The prices.

    Raises:
        ValueError: A token is not ``key=number``, names an unknown key or one given
            twice, or its value is not a plain decimal number; the message quotes it.
    """
    if isinstance(text, GivenPrices):
        return text
    prices: dict[str, float] = {}
    for token in text.split(","):
        key, sep, value = token.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not key:
            raise ValueError(f"{token!r} is not key=dollars (e.g. put=0.005)")
        if key not in PRICE_KEYS:
            raise ValueError(f"{token!r}: unknown key {key!r}; use {', '.join(PRICE_KEYS)}")
        if key in prices:
            raise ValueError(f"{token!r}: {key} is given twice")
        if not _NUMBER.fullmatch(value):
            raise ValueError(f"{token!r}: {value!r} is not a number of dollars (0 or more)")
        prices[key] = float(value)
    return GivenPrices(prices, text)


def request_usd(requests: Mapping[str, int], table: PriceTable) -> float:
    """The dollars ``requests`` (counts by kind) cost at ``table``'s prices.

    Args:
        requests: Request counts by kind (:data:`REQUEST_KINDS`).
        table: The prices.

    Returns:
        Their cost in dollars.
    """
    return sum(requests[kind] * table.requests[kind] for kind in REQUEST_KINDS) / PER


def storage_usd_per_month(stored_bytes: int, table: PriceTable) -> float | None:
    """What keeping ``stored_bytes`` costs a month at ``table``'s prices (None: not priced).

    Args:
        stored_bytes: Bytes kept in the store.
        table: The prices.

    Returns:
        Dollars a month, or None when the table prices no storage.
    """
    return None if table.gb_month is None else stored_bytes / GIB * table.gb_month


def interval_ms(times_ms: Sequence[int]) -> tuple[float | None, int]:
    """The usual time between checkpoints: the median of the gaps between consecutive
    times (sorted), and the number of gaps; None when there is no gap, or the median
    one is 0.

    Args:
        times_ms: Commit times, in ms since 1970.

    Returns:
        The median gap in ms (or None) and the number of gaps.
    """
    ordered = sorted(times_ms)
    gaps = [b - a for a, b in itertools.pairwise(ordered)]
    if not gaps:
        return None, 0
    median = statistics.median(gaps)
    return (float(median) if median > 0 else None), len(gaps)


def _number(value: float) -> str:
    """A price as written: ``0.005``, ``0.00044``, ``0`` (no exponent, no trailing 0)."""
    text = f"{value:.10f}".rstrip("0").rstrip(".")
    return text or "0"


def dollars(value: float | None) -> str:
    """``$0.0123``: dollars with three significant digits below $1, cents above; None
    as ``unknown``.

    Args:
        value: Dollars, or None.

    Returns:
        The text.
    """
    if value is None:
        return "unknown"
    if value == 0:
        return "$0"
    if value >= 1:
        return f"${value:,.2f}"
    digits = 2 - math.floor(math.log10(value))
    return f"${value:.{digits}f}"
