"""Key groups: the stable hash, Flink's contiguous ranges, their records in a manifest,
and the pure restore plan."""

from __future__ import annotations

import hashlib
import itertools
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cairn import (
    CheckpointId,
    CheckpointManifest,
    InvalidInputError,
    KeyGroupError,
    KeyGroups,
    KeySpaceMismatchError,
    NewerFormatError,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
)
from cairn.format import features
from cairn.format.keygroups import KEY_GROUP_HASH, MAX_KEY_GROUPS, from_runs, to_runs
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import KeyGroupEntry, check_manifest, decode_manifest, encode_manifest
from cairn.format.ranges import StoredRange, index_size
from cairn.format.rescale import plan_restore

CID = CheckpointId.parse("01900000-0000-7000-8000-000000000001")
OWNER = CheckpointId.parse("01900000-0000-7000-8000-000000000000")
DIGEST = "ab" * 32


# -- the hash -------------------------------------------------------------------------------


def test_group_of_is_the_documented_hash_and_pinned() -> None:
    assert KEY_GROUP_HASH == "sha256-u64-mod/1"
    for key in (b"", b"user-17", bytes(range(256))):
        for count in (1, 7, 128, MAX_KEY_GROUPS):
            expected = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % count
            assert KeyGroups(count).group_of(key) == expected
    # Literal values: a change to the hash breaks these, whatever the code computes.
    assert KeyGroups(128).group_of(b"") == 0xE3B0C44298FC1C14 % 128 == 20
    assert KeyGroups(4096).group_of(b"user-17") == (
        int.from_bytes(bytes.fromhex(hashlib.sha256(b"user-17").hexdigest()[:16]), "big") % 4096
    )
    assert (
        KeyGroups(1000).group_of(bytearray(b"abc"))
        == KeyGroups(1000).group_of(b"abc")
        == (0xBA7816BF8F01CFEA % 1000)
    )


def test_a_key_must_be_bytes() -> None:
    with pytest.raises(KeyGroupError, match="key"):
        KeyGroups(8).group_of("text")  # type: ignore[arg-type]


# -- ranges as Flink computes them --------------------------------------------------------------


def test_ranges_match_flinks_key_group_range_assignment() -> None:
    space = KeyGroups(128)
    assert [space.groups_of(i, 3) for i in range(3)] == [
        range(0, 43),
        range(43, 86),
        range(86, 128),
    ]
    assert [space.owner_of(g, 3) for g in (0, 42, 43, 85, 86, 127)] == [0, 0, 1, 1, 2, 2]
    assert KeyGroups(10).groups_of(0, 1) == range(10)
    # more workers than groups: some hold none
    assert [len(KeyGroups(2).groups_of(i, 4)) for i in range(4)] == [1, 0, 1, 0]


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 4096), workers=st.integers(1, 64))
def test_every_group_is_owned_by_exactly_one_worker_in_contiguous_ranges(
    count: int, workers: int
) -> None:
    space = KeyGroups(count)
    ranges = [space.groups_of(i, workers) for i in range(workers)]
    covered = [g for r in ranges for g in r]
    assert covered == list(range(count))  # contiguous, disjoint, in worker order, all
    for worker, groups in enumerate(ranges):
        assert groups.step == 1
        for group in groups:
            assert space.owner_of(group, workers) == worker


@settings(max_examples=100, deadline=None)
@given(
    count=st.integers(1, 4096),
    saved_by=st.integers(1, 64),
    restored_by=st.integers(1, 64),
    keys=st.lists(st.binary(max_size=24), unique=True, max_size=60),
)
def test_every_key_restores_exactly_once(
    count: int, saved_by: int, restored_by: int, keys: list[bytes]
) -> None:
    """Saved by the worker owning its group, restored by the workers whose ranges hold it:
    exactly one, whatever the two parallelisms."""
    space = KeyGroups(count)
    saved: dict[int, list[bytes]] = {}
    for key in keys:
        saved.setdefault(space.owner_of(space.group_of(key), saved_by), []).append(key)
    restored: list[bytes] = []
    for worker in range(restored_by):
        mine = space.groups_of(worker, restored_by)
        restored += [k for ks in saved.values() for k in ks if space.group_of(k) in mine]
    assert sorted(restored) == sorted(keys)


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: KeyGroups(0), "key-group count 0"),
        (lambda: KeyGroups(MAX_KEY_GROUPS + 1), f"key-group count {MAX_KEY_GROUPS + 1}"),
        (lambda: KeyGroups(True), "key-group count True"),
        (lambda: KeyGroups(8).groups_of(3, 3), "worker index 3 is out of range: expected 0..2"),
        (lambda: KeyGroups(8).groups_of(-1, 3), "worker index -1"),
        (lambda: KeyGroups(8).groups_of(0, 0), "worker count 0"),
        (lambda: KeyGroups(8).owner_of(8, 2), "key group 8 is out of range: expected 0..7"),
        (lambda: KeyGroups(8).owner_of(1, 0), "worker count 0"),
    ],
)
def test_out_of_range_is_a_typed_error_naming_the_value(call: object, what: str) -> None:
    with pytest.raises(KeyGroupError, match=what):
        call()  # type: ignore[operator]
    assert issubclass(KeyGroupError, InvalidInputError)


@given(st.sets(st.integers(0, 300)))
def test_runs_are_one_encoding_of_a_set(groups: set[int]) -> None:
    runs = to_runs(groups)
    assert from_runs(runs) == sorted(groups)
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert end < start  # disjoint and not adjacent
    assert to_runs(sorted(groups, reverse=True)) == runs


# -- the manifest -----------------------------------------------------------------------------


def keyed_entry(
    partition: int, count: int, runs: tuple[tuple[int, int], ...]
) -> PartitionSnapshotEntry:
    held = len(from_runs(runs))
    size = index_size(held)
    return PartitionSnapshotEntry(
        partition_id=partition,
        is_delta=False,
        path=f"operators/counts/partition-{partition}.0123456789ab.snap",
        size_bytes=size + 10 * held,
        sha256=DIGEST,
        index_size_bytes=size,
        key_groups=KeyGroupEntry(count=count, groups=runs),
    )


def keyed_manifest(*entries: PartitionSnapshotEntry) -> CheckpointManifest:
    return CheckpointManifest(
        version=2,
        checkpoint_id=CID,
        epoch=1,
        timestamp_ms=1_700_000_000_000,
        operators={"counts": OperatorSnapshotEntry.from_partitions(list(entries))},
    )


def test_a_keyed_manifest_requires_the_key_groups_feature_and_round_trips() -> None:
    manifest = keyed_manifest(keyed_entry(0, 16, ((0, 8),)), keyed_entry(1, 16, ((8, 16),)))
    assert features.features_of(manifest) == ("key-groups", "ranges")
    data = encode_manifest(manifest)
    document = json.loads(data)
    assert document["requires"] == ["key-groups", "ranges"]
    first = document["operators"]["counts"]["partitions"][0]
    assert first["key_groups"] == {"count": 16, "groups": [[0, 8]]}
    assert decode_manifest("m", data) == manifest
    # A cairn that does not know the feature refuses it as too new, never as damage.
    assert features.unknown_features(["key-groups"]) == ()
    assert "key-groups" in features.KNOWN


def test_a_reader_without_the_key_groups_feature_refuses_it_as_newer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = encode_manifest(keyed_manifest(keyed_entry(0, 16, ((0, 16),))))
    monkeypatch.setattr(features, "KNOWN", features.KNOWN - {"key-groups"})
    with pytest.raises(NewerFormatError) as caught:
        decode_manifest("id/manifest.json", data)
    assert caught.value.features == ("key-groups",)


def test_a_manifest_without_key_groups_is_written_as_before() -> None:
    plain = keyed_manifest(msgspec.structs.replace(keyed_entry(0, 16, ((0, 16),)), key_groups=None))
    data = encode_manifest(plain)
    assert b"key_groups" not in data and b"key-groups" not in data


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            (keyed_entry(0, 16, ((0, 9),)), keyed_entry(1, 16, ((8, 16),))),
            "partitions 0 and 1 both hold key group 8",
        ),
        (
            (keyed_entry(0, 16, ((0, 8),)), keyed_entry(1, 32, ((8, 16),))),
            "partition 1 has 32 key groups, partition 0 16",
        ),
        (
            (
                keyed_entry(0, 16, ((0, 8),)),
                msgspec.structs.replace(keyed_entry(1, 16, ((8, 16),)), key_groups=None),
            ),
            "partition 1 is not keyed state",
        ),
    ],
)
def test_a_manifest_whose_partitions_disagree_is_refused(
    entries: tuple[PartitionSnapshotEntry, ...], message: str
) -> None:
    with pytest.raises(KeySpaceMismatchError, match=message) as caught:
        check_manifest(keyed_manifest(*entries))
    assert caught.value.operator == "counts"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (keyed_entry(0, 16, ((0, 17),)), "run end"),
        (keyed_entry(0, 16, ((4, 4),)), "not sorted, disjoint"),
        (keyed_entry(0, 16, ((0, 4), (4, 8))), "not sorted, disjoint"),
        (keyed_entry(0, 16, ((5, 8), (0, 2))), "not sorted, disjoint"),
        (keyed_entry(0, 0, ()), "key-group count"),
        (
            msgspec.structs.replace(
                keyed_entry(0, 16, ((0, 4),)),
                key_groups=KeyGroupEntry(count=16, groups=((0, 4),), used=((1, 2),)),
            ),
            "only an object carried from another checkpoint has",
        ),
        (
            msgspec.structs.replace(
                keyed_entry(0, 16, ((0, 4),)),
                owner=OWNER,
                key_groups=KeyGroupEntry(count=16, groups=((0, 4),), used=((3, 5),)),
            ),
            "used key groups of .* are not all in its groups",
        ),
        (
            msgspec.structs.replace(keyed_entry(0, 16, ((0, 4),)), index_size_bytes=index_size(3)),
            "holds 4 key groups but its index is of",
        ),
        (
            msgspec.structs.replace(
                keyed_entry(0, 16, ((0, 4),)),
                is_delta=True,
                path="operators/counts/partition-0.0123456789ab.delta",
            ),
            "only a snapshot that is an object of ranges",
        ),
    ],
)
def test_a_malformed_key_group_record_is_refused(
    entry: PartitionSnapshotEntry, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        check_manifest(keyed_manifest(entry))


# -- the plan ---------------------------------------------------------------------------------


def test_the_plan_reads_each_group_from_its_range_and_deals_other_state() -> None:
    entries = [keyed_entry(0, 8, ((0, 4),)), keyed_entry(1, 8, ((4, 8),))]
    plain = PartitionSnapshotEntry(
        partition_id=0,
        is_delta=False,
        path="operators/src/partition-0.snap",
        size_bytes=1,
        sha256=DIGEST,
    )
    manifest = msgspec.structs.replace(
        keyed_manifest(*entries),
        operators={
            "counts": OperatorSnapshotEntry.from_partitions(entries),
            "src": OperatorSnapshotEntry.from_partitions(
                [
                    msgspec.structs.replace(
                        plain, partition_id=p, path=f"operators/src/partition-{p}.snap"
                    )
                    for p in range(5)
                ]
            ),
        },
    )
    digests = [f"{g:02x}" * 32 for g in range(8)]
    paths = CheckpointPaths()
    indexes = {
        paths.resolve(CID, entries[p].path): [
            StoredRange(10 * i, 10, digests[4 * p + i]) for i in range(4)
        ]
        for p in (0, 1)
    }
    plan = plan_restore(manifest, paths, indexes, 3, "split")
    assert [w.keyed["counts"].groups for w in plan.assignments] == [
        range(0, 3),
        range(3, 6),
        range(6, 8),
    ]
    middle = plan.worker(1).keyed["counts"]
    assert [(r.group, r.partition, r.offset, r.length, r.sha256) for r in middle.reads] == [
        (3, 0, 30, 10, digests[3]),
        (4, 1, 0, 10, digests[4]),
        (5, 1, 10, 10, digests[5]),
    ]
    assert middle.bytes == 30
    assert middle.reads[0].path == paths.resolve(CID, entries[0].path)
    assert [w.partitions["src"] for w in plan.assignments] == [(0, 3), (1, 4), (2,)]
    union = plan_restore(manifest, paths, indexes, 2, {"src": "union"})
    assert [w.partitions["src"] for w in union.assignments] == [(0, 1, 2, 3, 4)] * 2
    with pytest.raises(InvalidInputError, match="'src' needs a mode"):
        plan_restore(manifest, paths, indexes, 2, {"other": "union"})
    with pytest.raises(InvalidInputError, match="non_keyed must be one of"):
        plan_restore(manifest, paths, indexes, 2, "broadcast")  # type: ignore[arg-type]
    with pytest.raises(KeyGroupError, match="worker count 0"):
        plan_restore(manifest, paths, indexes, 0)


def test_a_partition_may_carry_groups_of_objects_another_partition_saved() -> None:
    """After a rescale, new partitions each carry the groups of one old object they hold."""
    shared = msgspec.structs.replace(keyed_entry(3, 16, ((0, 16),)), owner=OWNER)
    first = msgspec.structs.replace(
        shared,
        partition_id=0,
        key_groups=KeyGroupEntry(count=16, groups=((0, 16),), used=((0, 8),)),
        used_bytes=80,
    )
    second = msgspec.structs.replace(
        shared,
        partition_id=1,
        key_groups=KeyGroupEntry(count=16, groups=((0, 16),), used=((8, 16),)),
        used_bytes=80,
    )
    check_manifest(keyed_manifest(first, second))
    with pytest.raises(KeySpaceMismatchError, match="partitions 0 and 1 both hold key group 7"):
        check_manifest(
            keyed_manifest(
                first,
                msgspec.structs.replace(
                    second, key_groups=KeyGroupEntry(count=16, groups=((0, 16),), used=((7, 9),))
                ),
            )
        )
    twice = msgspec.structs.replace(
        keyed_entry(0, 16, ((4, 6),)), path="operators/counts/partition-0.ba9876543210.snap"
    )
    with pytest.raises(KeySpaceMismatchError, match="partition 0 holds key group 4 twice"):
        check_manifest(
            keyed_manifest(
                msgspec.structs.replace(
                    first, key_groups=KeyGroupEntry(count=16, groups=((0, 16),), used=((4, 5),))
                ),
                twice,
            )
        )
    # Only keyed objects carried from another checkpoint may be shared, or named by
    # another partition than their own.
    with pytest.raises(InvalidInputError, match="is not at the layout's path"):
        check_manifest(
            keyed_manifest(
                msgspec.structs.replace(
                    first,
                    owner=None,
                    key_groups=KeyGroupEntry(count=16, groups=((0, 16),)),
                    used_bytes=None,
                )
            )
        )
