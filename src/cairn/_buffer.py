"""The buffer-protocol type, and the one way cairn turns a caller's buffer into bytes.

Invariant: every buffer cairn hands on (to hashlib, to a codec, to obstore) is a 1-D
``memoryview`` of format ``"B"`` over the caller's own memory — no copy, whatever the
caller's format, item size or number of dimensions — and its bytes are exactly the
caller's ``tobytes()`` (C order). A buffer whose bytes are not one C-ordered block (a
strided slice, a Fortran-ordered array), or whose items are Python object pointers, is
refused with :class:`InvalidInputError`: never copied behind the caller's back, never
sent in another order, never stored as meaningless addresses.
"""

from __future__ import annotations

import sys

from cairn.errors import InvalidInputError

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer

__all__ = ["Buffer", "raw_bytes"]

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
