"""load_latest without a usable ``_latest``: the same choice as reading every manifest.

The fallback decodes only the ranking fields of each manifest and fully checks the
candidates in rank order; these tests compare it with the brute-force rule — decode and
check every manifest, rank by (writer generation, epoch, id), return the first that loads
— over random histories with random damage.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore
from support.artifacts import artifact_path
from support.backends import make_checkpointer

from cairn import CheckpointData, CheckpointerError, CheckpointId, ObjectStoreCheckpointer

DAMAGE = [
    "none",
    "manifest-tail",  # a flipped byte after the ranking fields: the header still decodes
    "manifest-head",  # a flipped byte inside the header
    "artifact-byte",
    "artifact-gone",
    "manifest-gone",
    "tombstone",
]

history = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 2), st.sampled_from(DAMAGE)),
    min_size=1,
    max_size=7,
)


async def brute_force(ckpt: ObjectStoreCheckpointer) -> CheckpointId | None:
    """Decode every manifest in full, rank, and return the first checkpoint that loads."""
    listing = await ckpt.store.list_dir(ckpt.paths.base_prefix)
    manifests = []
    for prefix in listing.prefixes:
        cid = ckpt.paths.parse_checkpoint_dir(prefix)
        if cid is None:
            continue
        try:
            manifests.append(await ckpt.load_manifest(cid))
        except CheckpointerError:
            continue
    manifests.sort(key=lambda m: (m.writer_generation or 0, m.epoch, m.checkpoint_id), reverse=True)
    for manifest in manifests:
        try:
            await ckpt.load(manifest.checkpoint_id)
        except CheckpointerError:
            continue
        return manifest.checkpoint_id
    return None


async def flip(ckpt: ObjectStoreCheckpointer, path: str, index: int) -> None:
    body = bytearray((await ckpt.store.get(path)).data)
    body[index % len(body)] ^= 0x20
    await ckpt.store.put(path, bytes(body))


async def build(steps: list[tuple[int, int, str]]) -> ObjectStoreCheckpointer:
    ckpt = make_checkpointer(MemoryStore())
    for i, (epoch, generation, damage) in enumerate(steps):
        ckpt.writer_generation = generation
        data = CheckpointData(epoch=epoch, snapshots={("op", 0): b"state %d" % i})
        try:
            manifest = await ckpt.save(data)
        except CheckpointerError:
            continue  # a lower generation after a higher one is fenced: nothing committed
        cid = manifest.checkpoint_id
        path, artifact = ckpt.paths.manifest(cid), artifact_path(ckpt.paths, manifest, "op", 0)
        if damage == "manifest-tail":
            await flip(ckpt, path, -30)
        elif damage == "manifest-head":
            await flip(ckpt, path, 40)
        elif damage == "artifact-byte":
            await flip(ckpt, artifact, 0)
        elif damage == "artifact-gone":
            await ckpt.store.delete([artifact])
        elif damage == "manifest-gone":
            await ckpt.store.delete([path])
        elif damage == "tombstone":
            await ckpt.store.delete([path])
            await ckpt.store.put(path, b"")
    await ckpt.store.delete([ckpt.paths.latest_pointer()])
    return ckpt


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history)
def test_the_fallback_chooses_what_reading_everything_chooses(
    steps: list[tuple[int, int, str]],
) -> None:
    async def check() -> None:
        ckpt = await build(steps)
        expected = await brute_force(ckpt)
        loaded = await ckpt.load_latest()
        assert (loaded.manifest.checkpoint_id if loaded else None) == expected
        # "latest" has one meaning: latest_id names what load_latest loads, damage or not.
        assert await ckpt.latest_id() == expected

    asyncio.run(check())


async def test_a_damaged_newest_manifest_falls_back_to_the_next() -> None:
    ckpt = await build([(1, 0, "none"), (2, 0, "none"), (3, 0, "manifest-tail")])
    ids = await ckpt.list_checkpoints()
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.manifest.checkpoint_id == ids[1]
    assert bytes(loaded.artifacts[("op", 0)]) == b"state 1"
