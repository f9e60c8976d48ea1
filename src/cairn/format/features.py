"""Format features: what a reader must understand to read a manifest, and the release of each.

Every change to what a manifest may hold that a reader cannot safely ignore gets a
feature name here, with the cairn release that introduced it. What cairn 0.1.0 (the
first release) already wrote needs no name: every release reads it. A manifest lists
the features it uses in ``requires``, with the version of cairn that wrote it in
``written_by``; the encoder computes both from the content (:func:`features_of`), and
leaves both out of a manifest that uses none, so that manifest is what cairn 0.1.0
wrote and reads.

Invariants:

* a manifest's ``requires`` is exactly :func:`features_of` its content, so no writer
  can forget a feature it uses;
* a name, once in :data:`FEATURES`, keeps its meaning and stays in the table: a reader
  that finds a name it does not know refuses the manifest as too new
  (:class:`~cairn.errors.NewerFormatError`), never as damaged, and never reads it.

See docs/format.md, section "Format features and requires".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cairn.format._schema import CheckpointManifest, PartitionSnapshotEntry

__all__ = [
    "FEATURES",
    "FEATURE_NAME",
    "KNOWN",
    "VERSION",
    "WRITER_VERSION",
    "Feature",
    "entry_features",
    "features_of",
    "unknown_features",
]

VERSION = "0.2.0.dev0"
"""This cairn's version (``cairn.__version__``): what the manifests it writes with a
feature record as ``written_by``."""

FEATURE_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")
"""What a feature name is: lowercase ASCII letters, digits and ``-``, at most 64."""

WRITER_VERSION = re.compile(r"[\x21-\x7e]{1,64}")
"""What a ``written_by`` is: 1 to 64 printable ASCII characters, no space."""


@dataclass(frozen=True)
class Feature:
    """A format feature: its ``name`` in ``requires``, the cairn release it came in
    (``since``), and what it is (``summary``, one line of docs/format.md's table)."""

    name: str
    since: str
    summary: str


FEATURES: tuple[Feature, ...] = (
    Feature(
        "directories",
        "0.2.0",
        "partitions saved as directories, file by file: a non-empty `directories`",
    ),
    Feature(
        "key-groups",
        "0.2.0",
        "keyed state in key groups: an entry with `key_groups`, one range per group",
    ),
    Feature(
        "packs",
        "0.2.0",
        "small artifacts merged into packs: an entry with `offset` is a byte range of one",
    ),
    Feature(
        "parts",
        "0.2.0",
        "a manifest stored as a root and parts: a non-empty `parts`",
    ),
    Feature(
        "ranges",
        "0.2.0",
        "objects of ranges: an entry with `index_size_bytes`, its index plain or of zstd frames",
    ),
)
"""Every feature this cairn reads, by name."""

KNOWN = frozenset(feature.name for feature in FEATURES)
"""The names of :data:`FEATURES`."""


def entry_features(entries: Iterable[PartitionSnapshotEntry]) -> set[str]:
    """The features artifact entries use: ``packs`` (an entry with an offset),
    ``ranges`` (an object of ranges) and ``key-groups`` (a keyed partition)."""
    used: set[str] = set()
    for entry in entries:
        if entry.offset is not None:
            used.add("packs")
        if entry.index_size_bytes is not None:
            used.add("ranges")
        if entry.key_groups is not None:
            used.add("key-groups")
    return used


def features_of(manifest: CheckpointManifest) -> tuple[str, ...]:
    """The features ``manifest`` uses, sorted: its ``requires``.

    Its entries are read as they are: a root with its entries in parts has lost the
    features of those entries, so pass the assembled manifest (``parts`` set, every
    entry present).
    """
    used = entry_features(entry for _, entry in manifest.partition_entries())
    if manifest.directories:
        used.add("directories")
    if manifest.parts:
        used.add("parts")
    return tuple(sorted(used))


def unknown_features(requires: Iterable[str]) -> tuple[str, ...]:
    """The names of ``requires`` this cairn does not know, sorted, each once."""
    return tuple(sorted(set(requires) - KNOWN))
