"""The buffer-protocol type, the one way cairn turns a caller's buffer into bytes, and
cairn's own reusable read buffers.

Invariant: every buffer cairn hands on (to hashlib, to a codec, to obstore) is a 1-D
``memoryview`` of format ``"B"`` over the caller's own memory — no copy, whatever the
caller's format, item size or number of dimensions — and its bytes are exactly the
caller's ``tobytes()`` (C order). A buffer whose bytes are not one C-ordered block (a
strided slice, a Fortran-ordered array), or whose items are Python object pointers, is
refused with :class:`InvalidInputError`: never copied behind the caller's back, never
sent in another order, never stored as meaningless addresses.

Invariant of :class:`BufferPool`: a buffer is handed out again only once nothing can
read it any more — no ``memoryview`` of it (or slice of one) is alive, no C code (a
store's upload, a hash, a write) holds it through the buffer protocol. Only cairn's own
read buffers are pooled, never a caller's.
"""

from __future__ import annotations

import sys

from cairn.errors import InvalidInputError

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer

__all__ = ["Buffer", "BufferPool", "raw_bytes"]

_CONTIGUOUS_FIX = "pass numpy.ascontiguousarray(x), or x.tobytes() (a copy)"


def raw_bytes(data: object, what: str) -> memoryview | None:
    """``data``'s bytes as a flat unsigned-byte view sharing its memory; None if no buffer.

    ``data`` is "no buffer" when it does not support the buffer protocol (a ``str`` is
    one of those). A buffer that cannot be sent as it is raises
    :class:`InvalidInputError` naming ``what`` and saying how to fix it.
    """
    if isinstance(data, str):  # not a buffer; said here so no exporter can claim otherwise
        return None
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        return None
    except (ValueError, BufferError) as exc:  # a buffer exporter that refuses to export
        raise InvalidInputError(
            f"{what} ({type(data).__name__}) cannot be read as a buffer: {exc}; "
            "pass its bytes instead (e.g. x.tobytes())"
        ) from None
    return _flatten(view, data, what)


def _flatten(view: memoryview, data: object, what: str) -> memoryview:
    if _holds_objects(view, data):
        raise InvalidInputError(
            f"{what} ({type(data).__name__}) holds Python objects: its buffer is memory "
            "addresses, not data; serialize it to bytes first"
        )
    if not view.c_contiguous:
        order = "Fortran-ordered, " if view.f_contiguous else ""
        raise InvalidInputError(
            f"{what} ({type(data).__name__}, format {view.format!r}, shape {view.shape}, "
            f"strides {view.strides}) is {order}not a C-contiguous buffer: its bytes are not "
            f"one C-ordered block; {_CONTIGUOUS_FIX}"
        )
    if view.ndim == 1 and view.format == "B":
        return view  # bytes, bytearray, mmap: already flat bytes
    if view.nbytes == 0:
        # memoryview.cast refuses shapes with a zero in them; there is no memory to share.
        return memoryview(b"")
    return view.cast("B")


def _holds_objects(view: memoryview, data: object) -> bool:
    # "O" is the format numpy exports for an object array; ``hasobject`` also catches
    # structured dtypes with an object field, whose struct format is harder to read.
    dtype = getattr(data, "dtype", None)
    return view.format.lstrip("@=<>!") == "O" or getattr(dtype, "hasobject", False) is True


class BufferPool:
    """Read buffers of ``size`` bytes, taken again once nothing refers to their memory.

    Why: a store may keep a chunk after the call that took it returned (obstore holds a
    multipart part, zero-copy, until the part is written; a memory store, until the
    upload completes), and allocating a fresh 8 MiB per chunk costs page faults and
    leaves freed chunks in the allocator's per-thread arenas (peak memory grows with
    the threads, not with the work). A pool of at most ``capacity`` buffers, reused,
    bounds both.

    How it knows a buffer is free: a ``bytearray`` cannot change size while any buffer
    export of it is alive (CPython raises :class:`BufferError`), and every reader of its
    memory — a memoryview or a slice of one, obstore's hold on a part, hashlib or a file
    write in another thread — holds such an export. So :meth:`take` tries to grow and
    shrink each buffer by one byte: if that succeeds, nothing can read it, whoever still
    has a Python reference to the object. A take that finds no free buffer and a full pool
    returns a new buffer that is not kept (a store that holds every chunk until the end
    gets fresh memory, never a chunk it still holds).
    """

    def __init__(self, size: int, capacity: int) -> None:
        self.size = size
        self.capacity = capacity
        self._buffers: list[bytearray] = []

    def take(self) -> bytearray:
        """A buffer of ``size`` bytes that nothing else reads or writes."""
        for buffer in self._buffers:
            if not _exported(buffer):
                return buffer
        buffer = _new_buffer(self.size)
        if len(self._buffers) < self.capacity:
            self._buffers.append(buffer)
        return buffer

    def clear(self) -> None:
        """Forget every pooled buffer (each is freed once nothing refers to it)."""
        self._buffers.clear()


def _new_buffer(size: int) -> bytearray:
    # One spare byte allocated, so the probe of _exported never reallocates 8 MiB.
    buffer = bytearray(size + 1)
    del buffer[size:]
    return buffer


def _exported(buffer: bytearray) -> bool:
    """Whether any buffer export of ``buffer`` is alive (see :class:`BufferPool`)."""
    try:
        buffer.append(0)
    except BufferError:
        return True
    del buffer[-1]
    return False
