"""What a ranged GET costs on moto's S3 server, by the size of the object it reads from.

    python bench/moto_ranged_reads.py

Eight ranged GETs of 16 MiB from one 128 MiB object (written with one PUT, and with a
multipart upload), then eight of 1 MiB from it, then eight of 16 MiB from a 16 MiB
object. On moto each ranged GET costs in proportion to the object's whole size, not to
the range, which real S3 does not: a reader of one large object per rank (the DCP
layout) pays for it on moto where one of many small objects does not.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/moto_ranged_reads.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers

import obstore  # noqa: E402

from bench.harness import MiB, memory_or_moto_store, table  # noqa: E402


def timed_ranges(
    store: obstore.store.ObjectStore, path: str, object_size: int, size: int, count: int
) -> float:
    """Seconds for ``count`` ranged GETs of ``size`` bytes each, one after another, from
    the object at ``path`` of ``object_size`` bytes."""
    start = time.perf_counter()
    for i in range(count):
        obstore.get_range(store, path, start=i * size % object_size, length=size)
    return time.perf_counter() - start


def main() -> None:
    rows = []
    with memory_or_moto_store("s3", "cairn-bench-ranges") as store:
        obstore.put(store, "single", bytes(128 * MiB), use_multipart=False)
        obstore.put(store, "multipart", bytes(128 * MiB), chunk_size=8 * MiB, max_concurrency=4)
        obstore.put(store, "small", bytes(16 * MiB), use_multipart=False)
        for path, object_mib, size in (
            ("single", 128, 16 * MiB),
            ("multipart", 128, 16 * MiB),
            ("single", 128, MiB),
            ("small", 16, 16 * MiB),
        ):
            seconds = timed_ranges(store, path, object_mib * MiB, size, 8)
            rows.append([path, f"{object_mib}", f"{size // MiB}", f"{seconds / 8 * 1000:.0f}"])
    print(table(["object", "object MiB", "range MiB", "ms per ranged GET"], rows))


if __name__ == "__main__":
    main()
