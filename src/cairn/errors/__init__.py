"""Every error cairn raises, under one root.

```
CheckpointerError
├── CheckpointNotFoundError        (also FileNotFoundError) no such checkpoint or object
├── CheckpointExistsError          a checkpoint with that id is already committed
│   └── ArtifactExistsError        a write-once artifact path already holds other bytes
├── CheckpointInUseError           deleting it would break checkpoints or saves built on it
├── IntegrityError                 stored bytes are not what was written
│   ├── IntegrityMismatchError     SHA-256 (or size) of an artifact differs from the manifest
│   ├── MissingArtifactError       an artifact a manifest or report names is not in the store
│   ├── UndecodableArtifactError   stored bytes do not decode with the codec their entry names
│   ├── OversizedArtifactError     stored bytes decode past the size their entry records
│   ├── CorruptManifestError       bytes at a manifest path are not a valid manifest
│   │   └── UnsupportedManifestVersionError
│   ├── SignatureError             a reader with signing keys met a manifest that is not
│   │                              signed by one of them (unsigned, unknown key, forged)
│   └── BrokenChainError           an incremental chain misses a link (parent, base, artifact)
├── FencedError                    a newer writer has taken over the store
├── CheckpointAbortedError         a save ended before its commit point (its id claimed,
│                                  or the save before it in a pipeline failed)
├── InvalidInputError              (also ValueError) the caller's arguments are wrong
│   ├── AmbiguousCheckpointIdError a short checkpoint id names more than one checkpoint
│   ├── InvalidNameError           operator / source name or partition number
│   ├── InvalidStoreUrlError       URL that open_store cannot open
│   ├── CheckpointLocationError    a DCP checkpoint_id names a place outside the store
│   ├── IncompleteCheckpointError  a distributed commit misses or repeats a partition
│   └── InvalidCheckpointDataError inconsistent CheckpointData (duplicates, deltas
│       │                          without parent, negative epoch, ...)
│       └── SpecialFileError       a directory to save holds a link or special file
├── CodecError                     an artifact needs a codec this reader lacks
├── NewerFormatError               a manifest needs format features this cairn does not
│                                  know: a newer cairn wrote it (not damage)
├── SyncInAsyncContextError        (also RuntimeError) a blocking call inside an event loop
├── PathsUnresolvedError           (also RuntimeError) a checkpointer's default prefix is
│                                  read before it was resolved against its store
└── StoreError                     the object store failed (path and operation attached)
    ├── TransientStoreError        a failure worth retrying (timeout, connection, 5xx)
    ├── ObjectNotFoundError        (also CheckpointNotFoundError) no object at that path
    ├── ObjectExistsError          a create-only write met an existing object
    ├── NotDurableError            a write landed but could not be made durable (fsync)
    ├── StoreNotFoundError         the bucket or container itself does not exist
    ├── StoreCredentialsError      the store's credentials are missing or refused
    └── PreconditionFailedError    a compare-and-swap write met another version
```

Invariants: no exception raised by obstore reaches a caller of cairn's public API;
each error carries the context needed to act on it (path, checkpoint id, value; for
damaged bytes of a partition, its operator and partition number); every
error pickles as itself, attributes included (errors cross processes).
"""

from __future__ import annotations

from typing import Any, Self

__all__ = [
    "AmbiguousCheckpointIdError",
    "ArtifactExistsError",
    "BrokenChainError",
    "CheckpointAbortedError",
    "CheckpointExistsError",
    "CheckpointInUseError",
    "CheckpointLocationError",
    "CheckpointNotFoundError",
    "CheckpointerError",
    "CodecError",
    "CorruptManifestError",
    "FencedError",
    "IncompleteCheckpointError",
    "IntegrityError",
    "IntegrityMismatchError",
    "InvalidCheckpointDataError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidStoreUrlError",
    "MissingArtifactError",
    "NewerFormatError",
    "NotDurableError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "OversizedArtifactError",
    "PathsUnresolvedError",
    "PreconditionFailedError",
    "SignatureError",
    "SpecialFileError",
    "StoreCredentialsError",
    "StoreError",
    "StoreNotFoundError",
    "SyncInAsyncContextError",
    "TransientStoreError",
    "UndecodableArtifactError",
    "UnsupportedManifestVersionError",
]


class CheckpointerError(Exception):
    """Root of every error raised by cairn."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross processes (DCP sends each rank's exception to its coordinator,
        # multiprocessing a worker's to its parent). The constructors take a path, digests
        # or generations, not ``args``, so rebuild from the state instead of calling them.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[CheckpointerError], args: tuple[Any, ...], state: dict[str, Any]
) -> CheckpointerError:
    """An unpickled error: ``cls`` with ``args`` and the attributes it had, as it was."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class CheckpointNotFoundError(CheckpointerError, FileNotFoundError):
    """A checkpoint, manifest or artifact does not exist at ``path``.

    Attributes:
        path: The store path (or checkpoint id) that was looked for.
        what: What was looked for, in words (``"object"`` unless told).
        detail: What was searched and what was found instead; empty when nothing more.
    """

    def __init__(self, path: str, what: str = "object", detail: str = "") -> None:
        self.path = path
        self.what = what
        self.detail = detail
        super().__init__(str(self))

    def __str__(self) -> str:
        # FileNotFoundError's own __str__ would print "[Errno None] ..." otherwise.
        detail = getattr(self, "detail", "")  # absent from a pickled state that lacks it
        return f"{self.what} not found: {self.path!r}" + (f": {detail}" if detail else "")


class CheckpointExistsError(CheckpointerError):
    """A manifest for ``checkpoint_id`` is already committed; the first one is untouched.

    Attributes:
        checkpoint_id: The id that is already committed.
        path: Its manifest's path in the store.
    """

    def __init__(self, checkpoint_id: str, path: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.path = path
        super().__init__(f"checkpoint {checkpoint_id} is already committed at {path!r}")


class ArtifactExistsError(CheckpointExistsError):
    """A write-once artifact path (the reference's ``save_snapshot``/``save_delta`` names)
    already holds other bytes: another save of ``checkpoint_id`` wrote it first. What is
    stored there is untouched.

    Attributes:
        checkpoint_id: The checkpoint the artifact belongs to.
        path: The artifact's path in the store.
    """

    def __init__(self, checkpoint_id: str, path: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.path = path
        CheckpointerError.__init__(
            self,
            f"artifact {path!r} of checkpoint {checkpoint_id} already holds other bytes "
            "(another save of this id wrote it first); it is left as it was",
        )


class CheckpointInUseError(CheckpointerError):
    """Deleting ``checkpoint_id`` would break what builds on it; nothing was deleted.

    Delete the dependents first, or pass ``force=True`` to delete it anyway (they then
    no longer load).

    Args:
        checkpoint_id: The checkpoint that was not deleted.
        dependents: What builds on it (at least one).
        override: How the caller says "delete it anyway", ending the message (a command
            line has its own flag).

    Attributes:
        checkpoint_id: The checkpoint that was not deleted.
        dependents: The committed checkpoints whose restore chains need its manifest or
            its bytes, and the saves in progress that build on it (newest last).
    """

    def __init__(
        self, checkpoint_id: str, dependents: list[str], *, override: str = "pass force=True"
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.dependents = list(dependents)
        more = f" and {len(dependents) - 1} more" if len(dependents) > 1 else ""
        super().__init__(
            f"checkpoint {checkpoint_id} holds state that other checkpoints or saves build "
            f"on ({dependents[0]}{more}); deleting it would break them. Delete those first, "
            f"or {override}"
        )


class IntegrityError(CheckpointerError):
    """Stored bytes are not the bytes that were written.

    An error about the bytes of one partition of a checkpoint names it, in its attributes
    and at the start of its message (:meth:`located`): ``operator`` and ``partition``;
    within it, ``item`` (a DCP item of a rank object: its fully qualified name, as the
    DCP metadata records it) or ``file`` (a file of a directory partition: its path
    relative to the directory). They are None where the bytes are not one partition's
    (a manifest, a record) or the reader was given a path alone.

    Attributes:
        operator: The operator whose partition's bytes are wrong, or None.
        partition: That partition's number, or None.
        item: The DCP item within the partition, or None.
        file: The file of a directory partition, or None.
        others: The errors of the other damaged partitions found by the same read (a
            whole :meth:`~cairn.ObjectStoreCheckpointer.load` reads every partition, and
            raises the error of the first in the manifest's order), each naming its own;
            empty when this one is all there is.
    """

    operator: str | None = None
    partition: int | None = None
    item: str | None = None
    file: str | None = None
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
        return words

    def located(
        self, operator: str, partition: int, *, item: str | None = None, file: str | None = None
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

        Returns:
            The error itself.
        """
        if self.operator is None:
            self.operator, self.partition, self.item, self.file = operator, partition, item, file
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
        self.path = path
        self.expected = expected
        self.actual = actual
        super().__init__(f"{what} mismatch at {path!r}: expected {expected}, got {actual}")


class MissingArtifactError(IntegrityError):
    """An artifact that a manifest or a worker report names is not in the store at ``path``.

    Attributes:
        path: The artifact's store path.
        whose: Whose artifact it is, in words (the partition, the manifest or the report).
    """

    def __init__(self, path: str, whose: str) -> None:
        self.path = path
        self.whose = whose
        super().__init__(f"artifact of {whose} is missing: {path!r}")


class UndecodableArtifactError(IntegrityError):
    """The stored bytes at ``path`` do not decode with ``codec``: they are damaged.

    Attributes:
        path: The artifact's store path.
        codec: The codec its entry names.
        reason: What the decoder said.
    """

    def __init__(self, path: str, codec: str, reason: str) -> None:
        self.path = path
        self.codec = codec
        self.reason = reason
        super().__init__(f"artifact {path!r} does not decode as {codec}: {reason}")


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
        self.path = path
        self.codec = codec
        self.size_bytes = size_bytes
        super().__init__(
            f"artifact {path!r} decodes as {codec} to more than the {size_bytes} bytes its "
            "entry records: decoding stopped there"
        )


class CorruptManifestError(IntegrityError):
    """The bytes at ``path`` are not a valid checkpoint manifest (or pointer).

    Attributes:
        path: The store path of the bytes.
        reason: What is wrong with them.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"corrupt manifest at {path!r}: {reason}")


class UnsupportedManifestVersionError(CorruptManifestError):
    """The manifest at ``path`` declares a schema ``version`` this cairn cannot read.

    Attributes:
        path: The manifest's store path.
        version: The version it declares, as read.
        supported: The versions this cairn reads.
    """

    def __init__(self, path: str, version: object, supported: tuple[int, ...]) -> None:
        self.version = version
        self.supported = supported
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
        self.path = path
        self.reason = reason
        super().__init__(f"untrusted manifest at {path!r}: {reason}")


class BrokenChainError(IntegrityError):
    """An incremental chain cannot be rebuilt.

    Attributes:
        link: The missing or bad piece (a parent, a base, an artifact), in words.
        reason: What is wrong with it.
    """

    def __init__(self, link: str, reason: str) -> None:
        self.link = link
        self.reason = reason
        super().__init__(f"broken checkpoint chain at {link}: {reason}")


class FencedError(CheckpointerError):
    """This writer was fenced off: a writer with a newer generation took over the store.

    Attributes:
        own_generation: This writer's generation.
        current_generation: The generation that holds the store now.
    """

    def __init__(self, own_generation: int, current_generation: int) -> None:
        self.own_generation = own_generation
        self.current_generation = current_generation
        super().__init__(
            f"writer generation {own_generation} is fenced: "
            f"generation {current_generation} has taken over the store"
        )


class CheckpointAbortedError(CheckpointerError):
    """A save of ``checkpoint_id`` ended before its commit point, and committed nothing.

    Either its id was claimed (``path``, its manifest's, holds a tombstone: GC, or a
    deletion of the checkpoint it builds on, found its lease lapsed) and can never
    commit, or, for a save in a pipeline (``save_async``), the save submitted before it
    did not commit. Save again with a new :class:`~cairn.CheckpointData` (see
    :mod:`cairn.protocol._lease` and :mod:`cairn.protocol._background`).

    Attributes:
        checkpoint_id: The save's checkpoint id.
        path: Its manifest's store path.
        why: Which of the two, in words; None for a claimed id.
    """

    def __init__(self, checkpoint_id: str, path: str, why: str | None = None) -> None:
        self.checkpoint_id = checkpoint_id
        self.path = path
        self.why = why
        reason = why if why is not None else f"its id was claimed ({path!r} is a tombstone)"
        super().__init__(
            f"checkpoint {checkpoint_id} was aborted before it committed: {reason}; "
            "nothing was committed"
        )


class InvalidInputError(CheckpointerError, ValueError):
    """The caller passed a value cairn cannot accept; nothing was written."""


class AmbiguousCheckpointIdError(InvalidInputError):
    """A short checkpoint id (a prefix of the hyphenated form) matches more than one
    committed checkpoint.

    Attributes:
        prefix: The short id given.
        candidates: The full ids it matches, oldest first.
    """

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        self.prefix = prefix
        self.candidates = candidates
        shown = ", ".join(candidates[:10]) + (", ..." if len(candidates) > 10 else "")
        super().__init__(
            f"short checkpoint id {prefix!r} is ambiguous: it matches "
            f"{len(candidates)} checkpoints ({shown}); give more characters"
        )


class InvalidNameError(InvalidInputError):
    """An operator or source name, or a partition number, is not allowed.

    Attributes:
        kind: What the value is (``"operator name"``, ``"partition"``, ...).
        value: The value given.
        reason: Why it is not allowed.
    """

    def __init__(self, kind: str, value: object, reason: str) -> None:
        self.kind = kind
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {kind} {value!r}: {reason}")


class InvalidStoreUrlError(InvalidInputError):
    """``open_store`` cannot open ``url``.

    Attributes:
        url: The URL given.
        reason: Why it cannot be opened.
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot open store URL {url!r}: {reason}")


class CheckpointLocationError(InvalidInputError):
    """A DCP ``checkpoint_id`` is a location (a URL, an absolute path) outside the store
    being written or read, or one it cannot be compared with: nothing is written or read
    anywhere but where it names (see :mod:`cairn.torch._target`).

    Attributes:
        checkpoint_id: The ``checkpoint_id`` given.
        store: The store being written or read, in words.
        reason: Why the location is refused.
    """

    def __init__(self, checkpoint_id: str, store: str, reason: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.store = store
        self.reason = reason
        super().__init__(
            f"checkpoint_id {checkpoint_id!r} {reason} (the store is {store}): cairn "
            "saves into and loads from its own store only; give a name such as "
            "'step-100', or a location inside the store"
        )


class InvalidCheckpointDataError(InvalidInputError):
    """The checkpoint asked for is inconsistent (see the message for the offending value)."""


class SpecialFileError(InvalidCheckpointDataError):
    """A directory partition holds something other than regular files and directories:
    a symbolic link (never followed), a socket, a FIFO, a device.

    Attributes:
        path: The local path of the special file.
        kind: What it is (``"symbolic link"``, ``"socket"``, ...).
    """

    def __init__(self, path: str, kind: str) -> None:
        self.path = path
        self.kind = kind
        super().__init__(f"{path!r} is a {kind}: a directory partition holds regular files only")


class IncompleteCheckpointError(InvalidInputError):
    """Worker reports do not cover the expected partitions exactly once; nothing committed."""


class CodecError(CheckpointerError):
    """An artifact is encoded with a codec that is unknown or not installed here.

    Args:
        path: The artifact's store path, or empty.
        codec: The codec's name.
        reason: Why it cannot be used (unknown, or its package is not installed).

    Attributes:
        path: The artifact's store path (empty when the codec was refused before any read).
        codec: The codec's name.
    """

    def __init__(self, path: str, codec: str, reason: str) -> None:
        self.path = path
        self.codec = codec
        where = f"cannot decode {path!r} " if path else ""
        super().__init__(f"{where}(codec {codec!r}): {reason}")


class NewerFormatError(CheckpointerError):
    """The manifest (or manifest part) at ``path`` uses format features this cairn does
    not know: a newer cairn wrote it.

    It is not damage, and not an :class:`IntegrityError`: the checkpoint may be whole, and
    a cairn that knows its features reads it (the bytes were checked against their
    checksum, and with keys their signature, before this was raised). Nothing of it was
    read beyond that, and nothing it names can be known: a reader neither loads it, nor
    builds on it, nor deletes anything on the strength of what it would carry.

    See the table of features in docs/format.md.

    Attributes:
        path: The store path of the manifest (or manifest part).
        checkpoint_id: The id the manifest names (its text; None when it names none).
        features: The feature names this cairn does not know, sorted.
        written_by: The version of cairn that wrote it, as the manifest records it (None
            when it does not).
    """

    def __init__(
        self,
        path: str,
        checkpoint_id: str | None,
        features: tuple[str, ...],
        written_by: str | None,
    ) -> None:
        self.path = path
        self.checkpoint_id = checkpoint_id
        self.features = features
        self.written_by = written_by
        which = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "a checkpoint"
        names = ", ".join(features)
        writer = f"cairn {written_by}" if written_by is not None else "a cairn that did not say"
        super().__init__(
            f"{which} needs a newer cairn: {path!r} uses format feature(s) {names}, which "
            f"this cairn does not know; it was written by {writer}"
        )


class SyncInAsyncContextError(CheckpointerError, RuntimeError):
    """A blocking cairn call (:class:`~cairn.SyncCheckpointer`) was made inside a running
    event loop, which it would deadlock: await the async API there instead."""


class PathsUnresolvedError(CheckpointerError, RuntimeError):
    """``ObjectStoreCheckpointer.paths`` was read before the checkpointer, given no
    ``paths``, chose its base prefix from what its store holds: await
    ``resolve_paths()`` (any of its coroutines does) first, or pass ``paths``."""


class StoreError(CheckpointerError):
    """The object store failed while doing ``operation`` on ``path``.

    Attributes:
        operation: The store operation that failed (``"get"``, ``"put"``, ...).
        path: The store path it was about.
        reason: What the store said, in words.
        status: The HTTP status the store answered the failed request with, when it
            answered one (None for connection failures, timeouts and non-HTTP stores).
    """

    def __init__(
        self, operation: str, path: str, reason: str, *, status: int | None = None
    ) -> None:
        self.operation = operation
        self.path = path
        self.reason = reason
        self.status = status
        super().__init__(f"store {operation} failed for {path!r}: {reason}")


class ObjectNotFoundError(CheckpointNotFoundError, StoreError):
    """The store has no object at ``path`` (a :class:`StoreError` like every store failure,
    and a :class:`CheckpointNotFoundError` for code that catches that).

    Attributes:
        operation: The store operation that found nothing.
        path: The store path.
        what: What was looked for, in words (``"object"`` unless told).
    """

    def __init__(self, operation: str, path: str, what: str = "object") -> None:
        StoreError.__init__(self, operation, path, "no such object")
        self.what = what


class TransientStoreError(StoreError):
    """A store failure that may succeed if tried again (timeout, connection, 5xx, throttling)."""


class ObjectExistsError(StoreError):
    """A create-only write found an object already at ``path``."""


class NotDurableError(StoreError):
    """A write reached the store but could not be made durable (a local store's fsync
    failed). Treat it as failed: the object may be readable now and gone, or damaged,
    after a crash. Not retried: the kernel reports such a failure once, so a second
    fsync would succeed without making anything durable."""


class PreconditionFailedError(StoreError):
    """A compare-and-swap write found another version of the object at ``path``."""


class StoreNotFoundError(StoreError):
    """The bucket or container of the store does not exist (not an object in it).

    Not a :class:`CheckpointNotFoundError`: nothing can be saved to or loaded from the
    store until the bucket is created or the URL corrected, so it is never taken to mean
    "no checkpoint yet".

    Attributes:
        operation: The store operation that failed.
        path: The store path it was about.
        kind: ``"bucket"`` (S3, GCS) or ``"container"`` (Azure).
        name: Its name (None when the store's answer does not say).
        code: The store's error code (``NoSuchBucket``, ``ContainerNotFound``).
        status: The HTTP status of the answer, if any.
    """

    def __init__(
        self,
        operation: str,
        path: str,
        kind: str,
        name: str | None,
        code: str,
        *,
        status: int | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.code = code
        named = f" {name!r}" if name else ""
        reason = (
            f"the {kind}{named} does not exist (the store answered {status or 404} {code} to "
            f"{operation} {path!r}): create it, or correct the {kind} name in the store URL"
        )
        StoreError.__init__(self, operation, path, reason, status=status)
        CheckpointerError.__init__(self, reason)


class StoreCredentialsError(StoreError):
    """The store's credentials are missing or were refused; nothing was read or written.

    Not transient: the request for a token was already retried, and what fails is the
    configuration.

    Args:
        operation: The store operation that failed.
        path: The store path it was about.
        store: The kind of store (``"GCS"``, ``"Azure"``, ``"S3"``).
        problem: What is missing or refused, in words.
        remedy: What to set (environment variables, or :func:`~cairn.open_store` options).
        status: The HTTP status of the answer, if any.

    Attributes:
        store: The kind of store.
        remedy: What to set.
    """

    def __init__(
        self,
        operation: str,
        path: str,
        store: str,
        problem: str,
        remedy: str,
        *,
        status: int | None = None,
    ) -> None:
        self.store = store
        self.remedy = remedy
        reason = f"{problem}; {remedy}"
        StoreError.__init__(self, operation, path, reason, status=status)
        CheckpointerError.__init__(self, reason)
