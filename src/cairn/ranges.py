"""Objects of ranges: one stored object made of many byte ranges, each verifiable alone.

A DCP rank's tensors are saved as one such object (see :mod:`cairn.torch`): one
multipart upload instead of an object per tensor, while a read of one tensor stays one
ranged GET checked against that tensor's own SHA-256. Pass a :class:`RangeSource` as a
partition's data to :meth:`~cairn.ObjectStoreCheckpointer.save_partitions_concurrent`.

The stored object is the ranges' bytes end to end, then its *index*::

    b"cairn-ranges-v1\\n"                         16 bytes
    per range: length (8 bytes, big-endian), SHA-256 (32 bytes)

Its manifest entry records the whole object's size (``size_bytes``), the index's size
(``index_size_bytes``) and the index's SHA-256 (``sha256``).

Invariants:

* each range is hashed once, by whoever produces it (:class:`Range`); the object as a
  whole has no digest of its own: the entry's digest covers the index, the index every
  range's digest, and each digest its range's bytes, so checking every range against
  the index checks every byte of the object (:func:`verify_ranges`);
* ranges are stored as given: no codec (a compressed range could not be read alone);
* decoding an index is strict (:func:`decode_index`): a size that is not the magic plus
  whole records, or lengths that do not add up to the bytes before the index, is
  damage, raised as :class:`UndecodableArtifactError` naming the object (a digest or
  size that does not match, as :class:`IntegrityMismatchError`).
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from cairn._buffer import Buffer
from cairn.errors import IntegrityMismatchError, InvalidInputError, UndecodableArtifactError

__all__ = [
    "INDEX_MAGIC",
    "INDEX_RECORD_BYTES",
    "Range",
    "RangeSource",
    "StoredRange",
    "decode_index",
    "encode_index",
    "group_spans",
    "index_size",
    "verify_ranges",
]

INDEX_MAGIC = b"cairn-ranges-v1\n"
"""The first bytes of every index (its format's version)."""

INDEX_RECORD_BYTES = 40
"""Bytes per range in the index: an 8-byte length and a 32-byte SHA-256."""

T = TypeVar("T")

_MAX_LENGTH = 2**63 - 1
_FORMAT = "cairn range index"


@dataclass(frozen=True)
class Range:
    """One range to store: its bytes, and the SHA-256 hex digest of exactly those bytes."""

    data: Buffer
    sha256: str


class RangeSource(abc.ABC):
    """The ranges of one object to upload, in order.

    :meth:`open` is called once per upload attempt (a transient failure makes the
    upload start again) and must produce the same ranges each time; what the last
    attempt produced is what is stored.
    """

    @abc.abstractmethod
    def open(self) -> AsyncIterator[Range]:
        """A fresh pass over the ranges."""


class StoredRange(NamedTuple):
    """One range of a stored object: where it is (``offset``, ``length``) and its digest."""

    offset: int
    length: int
    sha256: str


def index_size(count: int) -> int:
    """The bytes of the index of ``count`` ranges."""
    return len(INDEX_MAGIC) + count * INDEX_RECORD_BYTES


def encode_index(ranges: Sequence[tuple[int, str]]) -> bytes:
    """The index of ranges given as ``(length, sha256 hex)``, in order."""
    parts = [INDEX_MAGIC]
    for length, digest in ranges:
        if not 0 <= length <= _MAX_LENGTH:
            raise InvalidInputError(f"range length {length} is out of range")
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise InvalidInputError(f"not a SHA-256 hex digest: {digest!r:.80}")
        parts.append(length.to_bytes(8, "big") + raw)
    return b"".join(parts)


def decode_index(path: str, index: Buffer, data_size: int) -> list[StoredRange]:
    """The ranges an index describes, which must cover exactly ``data_size`` bytes (those
    before the index in the object at ``path``); else :class:`UndecodableArtifactError`."""
    view = memoryview(index).cast("B")
    body = view.nbytes - len(INDEX_MAGIC)
    if body < 0 or body % INDEX_RECORD_BYTES or view[: len(INDEX_MAGIC)] != INDEX_MAGIC:
        reason = f"its last {view.nbytes} bytes are not an index of whole records"
        raise UndecodableArtifactError(path, _FORMAT, reason)
    ranges: list[StoredRange] = []
    offset = 0
    for start in range(len(INDEX_MAGIC), view.nbytes, INDEX_RECORD_BYTES):
        length = int.from_bytes(view[start : start + 8], "big")
        digest = view[start + 8 : start + INDEX_RECORD_BYTES].hex()
        ranges.append(StoredRange(offset, length, digest))
        offset += length
    if offset != data_size:
        reason = f"its index describes {offset} bytes of ranges, the object holds {data_size}"
        raise UndecodableArtifactError(path, _FORMAT, reason)
    return ranges


def group_spans(
    members: Iterable[T], extent: Callable[[T], tuple[int, int]], max_bytes: int, max_gap: int
) -> list[list[T]]:
    """``members`` of one object, each at ``extent(member)`` (offset, length), grouped in
    offset order into spans to read with one ranged request each: a span covers at most
    ``max_bytes`` (a member larger than that is a span alone), and its members lie at
    most ``max_gap`` bytes apart (the bytes between them are read and dropped)."""
    spans: list[list[T]] = []
    start = end = 0
    for member in sorted(members, key=extent):
        first, length = extent(member)
        last = first + length
        if spans and first - end <= max_gap and max(end, last) - start <= max_bytes:
            spans[-1].append(member)
            end = max(end, last)
        else:
            spans.append([member])
            start, end = first, last
    return spans


def verify_ranges(path: str, data: Buffer, index_bytes: int, index_sha256: str) -> None:
    """Check the object ``data`` read from ``path``: its last ``index_bytes`` bytes hash to
    ``index_sha256``, and every range they describe to its own digest.

    Raises :class:`IntegrityMismatchError` naming the object and, for a range, its bytes.
    """
    view = memoryview(data).cast("B")
    if not 0 <= index_bytes <= view.nbytes:
        raise UndecodableArtifactError(
            path, _FORMAT, f"{view.nbytes} bytes cannot end with an index of {index_bytes}"
        )
    split = view.nbytes - index_bytes
    index = view[split:]
    actual = hashlib.sha256(index).hexdigest()
    if actual != index_sha256:
        raise IntegrityMismatchError(path, index_sha256, actual, what="sha256 of its range index")
    for offset, length, digest in decode_index(path, index, split):
        got = hashlib.sha256(view[offset : offset + length]).hexdigest()
        if got != digest:
            raise IntegrityMismatchError(
                path, digest, got, what=f"sha256 of bytes {offset}..{offset + length}"
            )
