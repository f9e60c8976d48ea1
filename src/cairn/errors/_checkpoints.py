"""Errors about one checkpoint or one save as a whole: it is not there, already there, in
use, fenced off, aborted, or needs a codec or format features this cairn lacks.

Invariant: each carries, as attributes, the checkpoint id, path or writer generation it
is about; none is an ``IntegrityError``: none says that stored bytes are damaged.
"""

from __future__ import annotations

import importlib.util
import sys

from cairn.errors._root import CheckpointerError

__all__ = [
    "ArtifactExistsError",
    "CheckpointAbortedError",
    "CheckpointExistsError",
    "CheckpointInUseError",
    "CheckpointNotFoundError",
    "CodecError",
    "FencedError",
    "MissingExtraError",
    "NewerFormatError",
]


class CheckpointNotFoundError(CheckpointerError, FileNotFoundError):
    """A checkpoint, manifest or artifact does not exist at ``path``.

    Attributes:
        path: The store path (or checkpoint id) that was looked for.
        what: What was looked for, in words (``"object"`` unless told).
        detail: What was searched and what was found instead; empty when nothing more.
    """

    def __init__(self, path: str, what: str = "object", detail: str = "") -> None:
        self.path, self.what, self.detail = path, what, detail
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
        self.checkpoint_id, self.path = checkpoint_id, path
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
        self.checkpoint_id, self.path = checkpoint_id, path
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


class FencedError(CheckpointerError):
    """This writer was fenced off: a writer with a newer generation took over the store.

    Attributes:
        own_generation: This writer's generation.
        current_generation: The generation that holds the store now.
    """

    def __init__(self, own_generation: int, current_generation: int) -> None:
        self.own_generation, self.current_generation = own_generation, current_generation
        super().__init__(
            f"writer generation {own_generation} is fenced: "
            f"generation {current_generation} has taken over the store"
        )


class CheckpointAbortedError(CheckpointerError):
    """A save of ``checkpoint_id`` ended before its commit point, and committed nothing.

    Either its id was claimed (``path``, its manifest's, holds a tombstone: GC, or a
    deletion of the checkpoint it builds on, found its lease lapsed) and can never
    commit, or, for a save in a pipeline (``save_async``), the save submitted before it
    did not commit. Save again with a new :class:`~cairn.CheckpointData` (leases and
    tombstones: docs/format.md, "Intents and leases" and "Tombstones").

    Attributes:
        checkpoint_id: The save's checkpoint id.
        path: Its manifest's store path.
        why: Which of the two, in words; None for a claimed id.
    """

    def __init__(self, checkpoint_id: str, path: str, why: str | None = None) -> None:
        self.checkpoint_id, self.path, self.why = checkpoint_id, path, why
        reason = why if why is not None else f"its id was claimed ({path!r} is a tombstone)"
        super().__init__(
            f"checkpoint {checkpoint_id} was aborted before it committed: {reason}; "
            "nothing was committed"
        )


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
        self.path, self.codec = path, codec
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


class MissingExtraError(CheckpointerError, ImportError):
    """A part of cairn needs packages of an optional extra that are not installed.

    Raised when the module is imported (``import cairn.torch`` without numpy), in one
    line that names the missing packages and the extra that brings them. Also an
    :class:`ImportError`, so ``except ImportError`` and ``pytest.importorskip`` still
    catch it.

    Args:
        feature: What needs them (``"cairn.torch"``).
        extra: The extra of cairn that installs them (``"torch"``).
        missing: The packages that do not import, by their import names.

    Attributes:
        feature: What needs them.
        extra: The extra that installs them.
        missing: The packages that do not import.
    """

    def __init__(self, feature: str, extra: str, missing: tuple[str, ...]) -> None:
        self.feature, self.extra, self.missing = feature, extra, missing
        names = " and ".join(missing)
        verb = "is" if len(missing) == 1 else "are"
        super().__init__(
            f"{feature} needs {names}, which {verb} not installed: install cairn with its "
            f"{extra!r} extra (pip install '.[{extra}]' in cairn's directory, or "
            f"'cairn-checkpoint[{extra}]' from a package index), or "
            f"pip install {' '.join(missing)}"
        )
        self.name = missing[0]  # ImportError's: the module that failed to import

    @classmethod
    def require(cls, feature: str, extra: str, modules: tuple[str, ...]) -> None:
        """Raise, naming every one of ``modules`` that is not installed.

        Nothing is imported: a package that is there may warn when a package it uses is
        missing (torch without numpy does), and the one line this raises says it all.

        Args:
            feature: What needs them (``"cairn.torch"``).
            extra: The extra of cairn that installs them.
            modules: Their top-level import names.

        Raises:
            MissingExtraError: One or more of them is not installed.
        """
        missing = tuple(module for module in modules if not _installed(module))
        if missing:
            raise cls(feature, extra, missing)


def _installed(module: str) -> bool:
    """Whether the top-level module ``module`` can be found (``sys.modules`` holding None
    for it, as for a module known not to import, counts as not installed)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None
