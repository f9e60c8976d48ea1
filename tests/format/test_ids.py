"""CheckpointId: UUIDv7, chronological, strictly increasing within a process."""

from __future__ import annotations

import itertools
import pickle
import threading
import time
import uuid

import pytest

from cairn import CheckpointId, InvalidInputError


def test_ids_are_uuid7_and_hyphenated() -> None:
    cid = CheckpointId.now()
    assert cid.uuid.version == 7
    assert len(str(cid)) == 36 and str(cid).count("-") == 4
    assert cid.to_string_id() == str(cid)
    assert abs(cid.timestamp_ms - time.time() * 1000) < 5_000


def test_ids_strictly_increase_within_one_millisecond() -> None:
    ids = [CheckpointId.now() for _ in range(20_000)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert len({i.timestamp_ms for i in ids}) < len(ids), "many ids shared a millisecond"
    texts = [str(i) for i in ids]
    assert texts == sorted(texts), "the text order is the time order"


def test_ids_from_many_threads_are_unique_and_ordered_per_thread() -> None:
    results: list[list[CheckpointId]] = [[] for _ in range(4)]

    def make(out: list[CheckpointId]) -> None:
        out.extend(CheckpointId.now() for _ in range(2_000))

    threads = [threading.Thread(target=make, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for r in results for i in r]
    assert len(set(everything)) == len(everything)
    for r in results:
        assert r == sorted(r)


def test_ordering_is_chronological() -> None:
    first = CheckpointId.now()
    time.sleep(0.002)
    second = CheckpointId.now()
    assert first < second and second > first and first != second
    assert first.timestamp_ms < second.timestamp_ms


def test_parse_and_from_uuid_round_trip() -> None:
    cid = CheckpointId.now()
    assert CheckpointId.parse(str(cid)) == cid
    assert CheckpointId.parse(str(cid).upper()) == cid
    assert CheckpointId.from_uuid(cid.uuid) == cid
    assert hash(CheckpointId.parse(str(cid))) == hash(cid)
    assert pickle.loads(pickle.dumps(cid)) == cid


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not-a-uuid",
        "0190a0a0-0000-4000-8000-000000000000",  # a v4 uuid
        "0190a0a0000070008000000000000000",
        "{0190a0a0-0000-7000-8000-000000000000}",
    ],
)
def test_parse_rejects_what_is_not_a_uuid7(text: str) -> None:
    with pytest.raises(InvalidInputError, match="checkpoint id|UUIDv7"):
        CheckpointId.parse(text)


def test_from_uuid_rejects_other_versions() -> None:
    with pytest.raises(InvalidInputError, match="UUIDv7"):
        CheckpointId.from_uuid(uuid.uuid4())


def test_ids_are_immutable() -> None:
    cid = CheckpointId.now()
    with pytest.raises(AttributeError):
        cid._uuid = uuid.uuid4()
