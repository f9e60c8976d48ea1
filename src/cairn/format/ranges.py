"""Objects of ranges: one stored object made of many byte ranges, each verifiable alone.

A DCP rank's tensors are saved as one such object (see :mod:`cairn.torch`): one
multipart upload instead of an object per tensor, while a read of one tensor stays one
ranged GET checked against that tensor's own SHA-256. Pass a :class:`RangeSource` as a
partition's data to :meth:`~cairn.ObjectStoreCheckpointer.save_partitions_concurrent`.
The object, its two kinds of index and its manifest entry are specified in
docs/format.md, section "Objects of ranges".

Invariants:

* each range is hashed once, by whoever produces it (:class:`Range`), over its bytes
  before compression; the object as a whole has no digest of its own: the entry's
  digest covers the index, the index every range's digest, and each digest its range's
  bytes, so checking every range against the index checks every byte of the object
  (:func:`verify_ranges`);
* ranges are stored as their source gives them: the checkpointer's codec is not applied
  to the object (a compressed object could not be read a range at a time); a source
  that compresses makes one frame per range;
* a compressed range is decoded by the bounded decoder of :mod:`cairn.format.codecs`, to
  exactly the decoded length its index records: a frame that inflates past it is an
  :class:`~cairn.errors.OversizedArtifactError`, never a larger allocation;
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

from cairn.errors import IntegrityMismatchError, InvalidInputError, UndecodableArtifactError
from cairn.format._buffer import Buffer
from cairn.format.codecs import get_codec

__all__ = [
    "COMPRESSED_INDEX_MAGIC",
    "COMPRESSED_RECORD_BYTES",
    "INDEX_MAGIC",
    "INDEX_RECORD_BYTES",
    "RANGE_CODECS",
    "Range",
    "RangeSource",
    "StoredRange",
    "decode_index",
    "decode_range",
    "encode_compressed_index",
    "encode_index",
    "group_spans",
    "index_size",
    "is_index_size",
    "verify_ranges",
]

INDEX_MAGIC = b"cairn-ranges-v1\n"
"""The first bytes of the index of ranges stored as given (its format's version)."""

INDEX_RECORD_BYTES = 40
"""Bytes per range in that index: an 8-byte length and a 32-byte SHA-256."""

COMPRESSED_INDEX_MAGIC = b"cairn-ranges-z1\n"
"""The first bytes of the index of ranges stored as one zstd frame each."""

COMPRESSED_RECORD_BYTES = 48
"""Bytes per range in that index: stored and decoded lengths (8 bytes each), SHA-256."""

RANGE_CODECS = ("zstd",)
"""The codecs a :class:`RangeSource` may store its ranges in."""

T = TypeVar("T")

_MAX_LENGTH = 2**63 - 1
_FORMAT = "cairn range index"


@dataclass(frozen=True)
class Range:
    """One range to store: its bytes, and the SHA-256 hex digest of exactly those bytes.

    Attributes:
        data: The range's bytes; from a source with a :attr:`~RangeSource.codec`, the
            range compressed (one frame).
        sha256: The hex digest of the range's bytes (before compression, if compressed).
        decoded_size: How many bytes a compressed range decodes to; None otherwise.
    """

    data: Buffer
    sha256: str
    decoded_size: int | None = None


class RangeSource(abc.ABC):
    """The ranges of one object to upload, in order.

    :meth:`open` is called once per upload attempt (a transient failure makes the
    upload start again) and must produce the same ranges each time; what the last
    attempt produced is what is stored. ``codec`` (one of :data:`RANGE_CODECS`, or None)
    says that every range it produces is compressed, one frame per range.
    """

    codec: str | None = None

    @abc.abstractmethod
    def open(self) -> AsyncIterator[Range]:
        """A fresh pass over the ranges.

        Returns:
            An async iterator of the object's ranges, in order.
        """


class StoredRange(NamedTuple):
    """One range of a stored object: where it is (``offset``, ``length``: its bytes as
    stored), the digest of its bytes, and how many they are decoded (``decoded_size``,
    when it is stored compressed; None when stored as is)."""

    offset: int
    length: int
    sha256: str
    decoded_size: int | None = None


def index_size(count: int, codec: str | None = None) -> int:
    """The bytes of the index of ``count`` ranges.

    Args:
        count: How many ranges.
        codec: The codec of compressed ranges, or None for ranges stored as is.

    Returns:
        The index's size in bytes.
    """
    record = INDEX_RECORD_BYTES if codec is None else COMPRESSED_RECORD_BYTES
    return len(INDEX_MAGIC) + count * record


def is_index_size(size: int) -> bool:
    """Whether an index of either kind can be ``size`` bytes (a check on a manifest
    entry before the index is read; :func:`decode_index` is the strict one).

    Args:
        size: A size in bytes.

    Returns:
        True when an index of either kind can have it.
    """
    body = size - len(INDEX_MAGIC)
    return body >= 0 and (body % INDEX_RECORD_BYTES == 0 or body % COMPRESSED_RECORD_BYTES == 0)


def encode_index(ranges: Sequence[tuple[int, str]]) -> bytes:
    """The index of uncompressed ranges.

    Args:
        ranges: ``(length, sha256 hex)`` of each range, in order.

    Returns:
        The index's bytes.

    Raises:
        InvalidInputError: A length is out of range, or a digest is not SHA-256 hex.
    """
    return _encode(INDEX_MAGIC, [((length,), digest) for length, digest in ranges])


def encode_compressed_index(ranges: Sequence[tuple[int, int, str]], codec: str) -> bytes:
    """The index of ranges stored as frames of ``codec``.

    Args:
        ranges: ``(stored length, decoded length, sha256 hex of the decoded bytes)`` of
            each range, in order.
        codec: The ranges' codec, one of :data:`RANGE_CODECS`.

    Returns:
        The index's bytes.

    Raises:
        InvalidInputError: ``codec`` is not a range codec, a length is out of range, or
            a digest is not SHA-256 hex.
    """
    if codec not in RANGE_CODECS:
        raise InvalidInputError(f"ranges cannot be stored with codec {codec!r:.40}")
    records = [((length, decoded), digest) for length, decoded, digest in ranges]
    return _encode(COMPRESSED_INDEX_MAGIC, records)


def _encode(magic: bytes, records: Sequence[tuple[tuple[int, ...], str]]) -> bytes:
    parts = [magic]
    for lengths, digest in records:
        for n in lengths:
            if not 0 <= n <= _MAX_LENGTH:
                raise InvalidInputError(f"range length {n} is out of range")
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise InvalidInputError(f"not a SHA-256 hex digest: {digest!r:.80}")
        parts.append(b"".join(n.to_bytes(8, "big") for n in lengths) + raw)
    return b"".join(parts)


def decode_index(path: str, index: Buffer, data_size: int) -> list[StoredRange]:
    """The ranges an index describes, which must cover exactly ``data_size`` bytes.

    Args:
        path: The object's store path, for errors.
        index: The index's bytes (the object's last bytes).
        data_size: How many bytes of the object come before the index.

    Returns:
        The ranges, in order.

    Raises:
        UndecodableArtifactError: ``index`` is not an index of whole records, or its
            ranges do not cover exactly ``data_size`` bytes.
    """
    view = memoryview(index).cast("B")
    magic = bytes(view[: len(INDEX_MAGIC)])
    compressed = magic == COMPRESSED_INDEX_MAGIC
    record = COMPRESSED_RECORD_BYTES if compressed else INDEX_RECORD_BYTES
    body = view.nbytes - len(INDEX_MAGIC)
    if body < 0 or body % record or magic not in (INDEX_MAGIC, COMPRESSED_INDEX_MAGIC):
        reason = f"its last {view.nbytes} bytes are not an index of whole records"
        raise UndecodableArtifactError(path, _FORMAT, reason)
    ranges: list[StoredRange] = []
    offset = 0
    digest_at = record - 32
    for start in range(len(INDEX_MAGIC), view.nbytes, record):
        length = int.from_bytes(view[start : start + 8], "big")
        decoded = int.from_bytes(view[start + 8 : start + 16], "big") if compressed else None
        digest = view[start + digest_at : start + record].hex()
        ranges.append(StoredRange(offset, length, digest, decoded))
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
    most ``max_gap`` bytes apart (the bytes between them are read and dropped).

    Args:
        members: The members of one object.
        extent: The ``(offset, length)`` of a member.
        max_bytes: The most bytes one span covers.
        max_gap: The most bytes between two members of one span.

    Returns:
        The spans, in offset order, each a list of members in offset order.
    """
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

    Args:
        path: The object's store path, for errors.
        data: The whole object's bytes.
        index_bytes: The size of its index, as its manifest entry records.
        index_sha256: The index's hex digest, as its manifest entry records.

    Raises:
        IntegrityMismatchError: The index or a range does not hash to its digest (the
            error names the object and, for a range, its number and bytes).
        UndecodableArtifactError: The index is not one, or a compressed range does not
            decode (naming the range too).
        OversizedArtifactError: A compressed range inflates past its decoded size.
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
    for number, stored in enumerate(decode_index(path, index, split)):
        end = stored.offset + stored.length
        where = f"range {number} (bytes {stored.offset}..{end})"
        try:
            decoded = decode_range(path, view[stored.offset : end], stored)
        except UndecodableArtifactError as exc:
            raise UndecodableArtifactError(path, exc.codec, f"{where}: {exc.reason}") from None
        except IntegrityMismatchError as exc:  # decoded short of its length
            what = f"decoded size of {where}"
            raise IntegrityMismatchError(path, exc.expected, exc.actual, what=what) from None
        got = hashlib.sha256(decoded).hexdigest()
        if got != stored.sha256:
            raise IntegrityMismatchError(path, stored.sha256, got, what=f"sha256 of {where}")


def decode_range(path: str, stored_bytes: Buffer, stored: StoredRange) -> Buffer:
    """The bytes of range ``stored`` of the object at ``path``, given its
    ``stored_bytes``: as they are, or decoded to exactly its decoded size, in memory
    bounded by it (a compressed range; call it from a worker thread when large).

    Args:
        path: The object's store path, for errors.
        stored_bytes: The range's bytes as stored.
        stored: The range, as the index describes it.

    Returns:
        The range's bytes, decoded where it is compressed.

    Raises:
        OversizedArtifactError: A frame inflates past the decoded size.
        IntegrityMismatchError: A frame ends short of it.
        UndecodableArtifactError: The bytes are not a frame.
    """
    if stored.decoded_size is None:
        return stored_bytes
    codec = get_codec(RANGE_CODECS[0], path=path)
    return codec.decompress(stored_bytes, path=path, size_bytes=stored.decoded_size)
