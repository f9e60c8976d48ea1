"""Errors about stored bytes that are not what was written: digests that differ, artifacts
missing, undecodable or oversized, manifests corrupt or untrusted, chains broken.

Invariant: each is an :class:`IntegrityError` naming the path (or link) whose bytes are
wrong; one about a partition's bytes names its operator and partition (and item or file)
in its attributes and at the start of its message, and keeps that through pickling.
"""

from __future__ import annotations

from typing import Self

from cairn.errors._root import CheckpointerError

__all__ = [
    "BrokenChainError",
    "CorruptManifestError",
    "IntegrityError",
    "IntegrityMismatchError",
    "MissingArtifactError",
    "OversizedArtifactError",
    "SignatureError",
    "UndecodableArtifactError",
    "UnsupportedManifestVersionError",
]


class IntegrityError(CheckpointerError):
    """Stored bytes are not the bytes that were written.

    An error about the bytes of one partition of a checkpoint names it, in its attributes
    and at the start of its message (:meth:`located`): ``operator`` and ``partition``;
    within it, ``item`` (a DCP item of a rank object: its fully qualified name, as the
    DCP metadata records it), ``file`` (a file of a directory partition: its path
    relative to the directory) or ``group`` (a key group of a keyed partition, see
    :class:`cairn.KeyedSnapshot`). They are None where the bytes are not one partition's
    (a manifest, a record) or the reader was given a path alone.

    Attributes:
        operator: The operator whose partition's bytes are wrong, or None.
        partition: That partition's number, or None.
        item: The DCP item within the partition, or None.
        file: The file of a directory partition, or None.
        group: The key group of a keyed partition, or None.
        others: The errors of the other damaged partitions found by the same read (a
            whole :meth:`~cairn.ObjectStoreCheckpointer.load` reads every partition, and
            raises the error of the first in the manifest's order), each naming its own;
            empty when this one is all there is.
    """

    operator: str | None = None
    partition: int | None = None
    item: str | None = None
    file: str | None = None
    group: int | None = None
    others: tuple[IntegrityError, ...] = ()

    @property
    def location(self) -> str:
        """The partition (and item or file) whose bytes are wrong, in words
        (``operator 'agg', partition 0``); empty when the error names none."""
        if self.operator is None:
            return ""
        words = f"operator {self.operator!r}, partition {self.partition}"
        if self.item is not None:
            words += f", item {self.item!r}"
        if self.file is not None:
            words += f", file {self.file!r}"
        if self.group is not None:
            words += f", key group {self.group}"
        return words

    def located(
        self,
        operator: str,
        partition: int,
        *,
        item: str | None = None,
        file: str | None = None,
        group: int | None = None,
    ) -> Self:
        """This error, naming the partition of ``operator`` whose bytes it is about (and
        the ``item`` or ``file`` in it): set as attributes and put in front of the
        message. An error that names a partition already is left as it is (the code
        that raised it was closer to the bytes).

        Args:
            operator: The operator whose partition the bytes are.
            partition: The partition's number.
            item: The DCP item of a rank object the bytes are, if any.
            file: The file of a directory partition the bytes are, if any.
            group: The key group of a keyed partition the bytes are, if any.

        Returns:
            The error itself.
        """
        if self.operator is None:
            self.operator, self.partition, self.item, self.file = operator, partition, item, file
            self.group = group
            message = str(self.args[0]) if self.args else ""
            self.args = (f"{self.location}: {message}", *self.args[1:])
        return self


class IntegrityMismatchError(IntegrityError):
    """The SHA-256 digest (or size) of the bytes at ``path`` is not the expected one.

    Bytes that are absent or do not decode raise :class:`MissingArtifactError` and
    :class:`UndecodableArtifactError` instead.

    Args:
        path: The store path of the bytes.
        expected: The digest (hex) the manifest records, or the size with ``what="size"``.
        actual: The digest (hex), or size, of the bytes read.
        what: What differs: ``"sha256"`` or ``"size"``.

    Attributes:
        path: The store path of the bytes.
        expected: The expected digest (hex) or size in bytes; never prose.
        actual: The digest (hex) or size in bytes of what was read; never prose.
    """

    def __init__(self, path: str, expected: str, actual: str, *, what: str = "sha256") -> None:
        self.path, self.expected, self.actual = path, expected, actual
        super().__init__(f"{what} mismatch at {path!r}: expected {expected}, got {actual}")


class MissingArtifactError(IntegrityError):
    """An artifact that a manifest or a worker report names is not in the store at ``path``.

    Attributes:
        path: The artifact's store path.
        whose: Whose artifact it is, in words (the partition, the manifest or the report).
    """

    def __init__(self, path: str, whose: str) -> None:
        self.path, self.whose = path, whose
        super().__init__(f"artifact of {whose} is missing: {path!r}")


class OversizedArtifactError(IntegrityError):
    """The stored bytes at ``path`` decode with ``codec`` to more than the ``size_bytes``
    their entry records: they are damaged, or a decompression bomb.

    Decoding stopped as soon as the output passed ``size_bytes`` (see :mod:`cairn.format.codecs`),
    so how far the bytes would have inflated is not known, nor held in memory.

    Attributes:
        path: The artifact's store path.
        codec: The codec its entry names.
        size_bytes: The decoded size its entry records.
    """

    def __init__(self, path: str, codec: str, size_bytes: int) -> None:
        self.path, self.codec, self.size_bytes = path, codec, size_bytes
        super().__init__(
            f"artifact {path!r} decodes as {codec} to more than the {size_bytes} bytes its "
            "entry records: decoding stopped there"
        )


class UndecodableArtifactError(IntegrityError):
    """The stored bytes at ``path`` do not decode with ``codec``: they are damaged.

    Attributes:
        path: The artifact's store path.
        codec: The codec its entry names.
        reason: What the decoder said.
    """

    def __init__(self, path: str, codec: str, reason: str) -> None:
        self.path, self.codec, self.reason = path, codec, reason
        super().__init__(f"artifact {path!r} does not decode as {codec}: {reason}")


class CorruptManifestError(IntegrityError):
    """The bytes at ``path`` are not a valid checkpoint manifest (or pointer).

    Attributes:
        path: The store path of the bytes.
        reason: What is wrong with them.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"corrupt manifest at {path!r}: {reason}")


class UnsupportedManifestVersionError(CorruptManifestError):
    """The manifest at ``path`` declares a schema ``version`` this cairn cannot read.

    Attributes:
        path: The manifest's store path.
        version: The version it declares, as read.
        supported: The versions this cairn reads.
    """

    def __init__(self, path: str, version: object, supported: tuple[int, ...]) -> None:
        self.version, self.supported = version, supported
        super().__init__(path, f"unsupported manifest version {version!r} (supported: {supported})")


class SignatureError(IntegrityError):
    """The manifest at ``path`` is not signed by one of the reader's keys.

    Raised only by a checkpointer given signing keys (see :mod:`cairn.format.signing`): the
    manifest carries no signature, names a key the reader does not hold, or its
    signature does not verify (someone who can write the store, but does not hold the
    key, wrote or rewrote it). Like any :class:`IntegrityError` it makes that checkpoint
    unloadable without saying anything of the others: ``load_latest`` falls back past it.

    Attributes:
        path: The manifest's store path.
        reason: Which of the three it is.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"untrusted manifest at {path!r}: {reason}")


class BrokenChainError(IntegrityError):
    """An incremental chain cannot be rebuilt.

    Attributes:
        link: The missing or bad piece (a parent, a base, an artifact), in words.
        reason: What is wrong with it.
    """

    def __init__(self, link: str, reason: str) -> None:
        self.link, self.reason = link, reason
        super().__init__(f"broken checkpoint chain at {link}: {reason}")
