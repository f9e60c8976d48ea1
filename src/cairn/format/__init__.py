"""The storage format: what cairn writes to a store, and how it is read back. Pure: no I/O.

Identifiers (:mod:`~cairn.format.ids`), where each object lives
(:mod:`~cairn.format.layout`), the manifest, its JSON, its parts and its checks
(:mod:`~cairn.format.manifest`), the format features a reader must know
(:mod:`~cairn.format.features`), compression (:mod:`~cairn.format.codecs`), digests
(:mod:`~cairn.format.integrity`), objects of ranges (:mod:`~cairn.format.ranges`) and
signatures (:mod:`~cairn.format.signing`). The format itself, object by object, is
specified in docs/format.md.
"""
