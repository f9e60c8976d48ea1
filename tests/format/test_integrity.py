"""verify_integrity and the digest helpers."""

from __future__ import annotations

import hashlib

import pytest

from cairn import IntegrityMismatchError, sha256_hex, verify_integrity
from cairn.format.integrity import INLINE_HASH_LIMIT, sha256_hex_async


def test_verify_passes_and_fails_with_context() -> None:
    data = b"abc"
    good = hashlib.sha256(data).hexdigest()
    verify_integrity("p", data, good)
    verify_integrity("p", memoryview(data), good.upper())
    with pytest.raises(IntegrityMismatchError) as info:
        verify_integrity("ckpt/op/partition-0.snap", b"abd", good)
    err = info.value
    assert (err.path, err.expected, err.actual) == (
        "ckpt/op/partition-0.snap",
        good,
        hashlib.sha256(b"abd").hexdigest(),
    )
    assert "ckpt/op/partition-0.snap" in str(err)


@pytest.mark.parametrize("size", [0, 1, INLINE_HASH_LIMIT, INLINE_HASH_LIMIT + 1, 3 << 20])
async def test_async_digest_matches(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert await sha256_hex_async(data) == sha256_hex(data) == hashlib.sha256(data).hexdigest()
