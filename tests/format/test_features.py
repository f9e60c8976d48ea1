"""Format features: a manifest names the features it uses (``requires``) and its writer
(``written_by``), and a reader refuses one that needs a feature it does not know as too
new (``NewerFormatError``), not as damage, before decoding it strictly."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import tomllib
from typing import Any

import msgspec
import pytest
from support.forgery import CHECKSUM, ZEROED, with_checksum
from support.paths import DATA, REPO

import cairn
from cairn import (
    CheckpointId,
    CheckpointManifest,
    CorruptManifestError,
    IntegrityError,
    NewerFormatError,
    OperatorSnapshotEntry,
    PartitionSnapshotEntry,
    SignatureError,
    SourceOffsetEntry,
)
from cairn.format import features
from cairn.format.layout import CheckpointPaths
from cairn.format.manifest import (
    DirectoryEntry,
    FileEntry,
    SaveStats,
    decode_header,
    decode_manifest,
    decode_part,
    decode_root,
    encode_manifest,
    encode_stored,
)
from cairn.format.signing import SigningKeys, signing_keys

CID = CheckpointId.parse("01900000-0000-7000-8000-000000000001")
OWNER = CheckpointId.parse("01900000-0000-7000-8000-000000000000")
DIGEST = "ab" * 32
ATTEMPT = "0123456789ab"
KEY = b"k" * 32
NEWER = b'\n  "requires": [\n    "packs",\n    "zebra"\n  ],\n  "written_by": "9.1.0",'
"""Members a newer writer adds: a feature this cairn knows, one it does not, its version."""
UNKNOWN_MEMBER = b'\n  "zebra_stripes": {\n    "count": 7\n  },'
"""A top-level member this cairn's strict decoder refuses."""


def manifest(**fields: Any) -> CheckpointManifest:
    plain = CheckpointManifest(
        version=2, checkpoint_id=CID, epoch=3, timestamp_ms=1_700_000_000_000
    )
    return msgspec.structs.replace(plain, **fields)


def entry(partition: int = 0, **fields: Any) -> PartitionSnapshotEntry:
    path = CheckpointPaths.relative_artifact("agg", partition, False)
    return msgspec.structs.replace(
        PartitionSnapshotEntry(partition, False, path, 60, DIGEST), **fields
    )


def with_entries(*entries: PartitionSnapshotEntry) -> CheckpointManifest:
    return manifest(operators={"agg": OperatorSnapshotEntry.from_partitions(list(entries))})


PACK = CheckpointPaths.relative_pack(0, ATTEMPT)
FILE = FileEntry("CURRENT", 16, DIGEST, 0, CheckpointPaths.relative_file("db", 0, ATTEMPT, 0))
USING = {
    "packs": with_entries(entry(0, path=PACK, offset=0), entry(1, path=PACK, offset=60)),
    "ranges": with_entries(entry(0, index_size_bytes=56)),
    "directories": manifest(directories=(DirectoryEntry("db", 0, (FILE,)),)),
}
"""For each feature but ``parts``, a manifest that uses it and nothing else."""


def members(body: bytes) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(body)
    return parsed


REQUIRES = re.compile(rb'\n  "requires": \[[^]]*\],\n  "written_by": "[^"]*",')
"""The members ``requires`` and ``written_by`` as the encoder writes them."""


def spliced(body: bytes, extra: bytes) -> bytes:
    """``body`` with ``extra`` members in place of its ``requires`` and ``written_by``,
    before its signature or checksum, the checksum recomputed (as a writer of a newer
    format would have written it)."""
    body = REQUIRES.sub(b"", body)
    at = body.index(b'\n  "signature"' if b'"signature"' in body else b'\n  "manifest_sha256"')
    return with_checksum(body[:at] + extra + body[at:])


def signed_by(body: bytes, keys: SigningKeys) -> bytes:
    """``body`` (signed) signed again by ``keys`` over its bytes as they are now, as a
    holder of the key writing a newer format would sign it."""
    blank = re.sub(rb'("value": ")[0-9a-f]*(")', rb"\1\2", CHECKSUM.sub(ZEROED, body), count=1)
    value = keys.sign(blank)
    return with_checksum(blank.replace(b'"value": ""', f'"value": "{value}"'.encode(), 1))


# -- what a writer records ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(USING))
def test_a_manifest_names_exactly_the_feature_it_uses_and_its_writer(name: str) -> None:
    body = members(encode_manifest(USING[name]))
    assert body["requires"] == [name]
    assert body["written_by"] == cairn.__version__ == features.VERSION


def test_a_manifest_in_parts_names_parts_and_what_its_parts_hold() -> None:
    entries = [entry(p, path=PACK, offset=60 * p) for p in range(70)]
    stored = encode_stored(with_entries(*entries), part_entries=32)
    assert len(stored.parts) == 3
    assert members(stored.root)["requires"] == ["packs", "parts"], "packs are in the parts only"
    for _, body in stored.parts:
        assert members(body)["requires"] == ["packs"]
        assert members(body)["written_by"] == features.VERSION
    plain = encode_stored(with_entries(*(entry(p) for p in range(70))), part_entries=32)
    assert members(plain.root)["requires"] == ["parts"]
    assert all(b"requires" not in body for _, body in plain.parts)


def test_a_manifest_using_only_what_0_1_0_wrote_names_nothing() -> None:
    stats = SaveStats(
        duration_ms=1,
        upload_ms=1,
        commit_ms=0,
        uploaded_bytes=9,
        uploaded_artifacts=1,
        carried_bytes=0,
        carried_artifacts=0,
    )
    carried = entry(0, owner=OWNER, codec="zstd", stored_size_bytes=12)
    every_old_field = msgspec.structs.replace(
        with_entries(carried, entry(0, is_delta=True, path="operators/agg/partition-0.delta")),
        source_offsets={"kafka": SourceOffsetEntry("kafka", {"p0": "12"}, 3)},
        parent_id=OWNER,
        watermark=-5,
        writer_generation=2,
        stats=stats,
        name="step-100",
    )
    body = encode_manifest(every_old_field)
    assert b"requires" not in body and b"written_by" not in body
    assert decode_manifest("m", body) == every_old_field


def test_a_manifest_without_features_is_byte_for_byte_what_0_1_0_wrote() -> None:
    old = sorted((DATA / "store-0.1.0").glob("*/*/manifest.json"))
    assert len(old) == 4
    for path in old:
        written = path.read_bytes()
        assert encode_manifest(decode_manifest(str(path), written)) == written, path


def test_a_signed_manifest_covers_requires() -> None:
    keys = signing_keys(KEY)
    body = encode_manifest(USING["packs"], keys)
    assert decode_manifest("m", body, keys) == USING["packs"]
    assert body.index(b'"requires"') < body.index(b'"signature"'), "inside the signed bytes"
    stripped = REQUIRES.sub(b"", body)
    assert stripped != body
    more = body.replace(b'    "packs"\n', b'    "packs",\n    "parts"\n')
    assert more != body
    for tampered in (with_checksum(stripped), with_checksum(more)):
        assert decode_manifest("m", tampered) == USING["packs"], "the checksum is satisfied"
        with pytest.raises(SignatureError, match="does not verify"):
            decode_manifest("m", tampered, keys)


# -- what a reader does with a feature it does not know -------------------------------


def assert_newer(error: NewerFormatError, path: str) -> None:
    assert (error.path, error.checkpoint_id) == (path, str(CID))
    assert (error.features, error.written_by) == (("zebra",), "9.1.0")
    assert str(error) == (
        f"checkpoint {CID} needs a newer cairn: {path!r} uses format feature(s) zebra, which "
        "this cairn does not know; it was written by cairn 9.1.0"
    )


def test_an_unknown_feature_is_a_newer_format_before_any_strict_check() -> None:
    body = spliced(encode_manifest(USING["packs"]), NEWER + UNKNOWN_MEMBER)
    for decode in (decode_manifest, decode_root, decode_header):
        with pytest.raises(NewerFormatError) as info:
            decode("base/m.json", body)
        assert_newer(info.value, "base/m.json")
    version_3 = with_checksum(body.replace(b'"version": 2', b'"version": 3'))
    with pytest.raises(NewerFormatError):
        decode_manifest("m", version_3)


def test_a_newer_format_is_not_damage_and_pickles() -> None:
    assert not issubclass(NewerFormatError, IntegrityError)
    assert NewerFormatError.__name__ in cairn.errors.__all__
    error = NewerFormatError("m", None, ("a", "b"), None)
    assert str(error) == (
        "a checkpoint needs a newer cairn: 'm' uses format feature(s) a, b, which this "
        "cairn does not know; it was written by a cairn that did not say"
    )
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is NewerFormatError and vars(copy) == vars(error)


def test_known_features_in_requires_decode_as_before() -> None:
    plain = with_entries(entry(0))
    body = spliced(encode_manifest(plain), b'\n  "requires": [\n    "packs"\n  ],')
    assert decode_manifest("m", body) == plain
    assert decode_header("m", body).checkpoint_id == CID


def test_damage_is_never_taken_for_a_newer_format() -> None:
    body = spliced(encode_manifest(USING["packs"]), NEWER)
    flipped = body.replace(b'"epoch": 3', b'"epoch": 4')
    for decode in (decode_manifest, decode_header):
        with pytest.raises(CorruptManifestError, match="checksum mismatch"):
            decode("m", flipped)
    for requires, match in (
        (b'"packs"', "requires is not a list of feature names: 'packs'"),
        (b'["Zebra"]', r"requires is not a list of feature names: \['Zebra'\]"),
        (b"[7]", r"requires is not a list of feature names: \[7\]"),
    ):
        damaged = spliced(encode_manifest(manifest()), b'\n  "requires": ' + requires + b",")
        with pytest.raises(CorruptManifestError, match=match):
            decode_manifest("m", damaged)
    bad_writer = spliced(encode_manifest(manifest()), b'\n  "written_by": "9 1",')
    with pytest.raises(CorruptManifestError, match="written_by is not a version: '9 1'"):
        decode_manifest("m", bad_writer)


def test_with_keys_only_a_signed_manifest_is_a_newer_format() -> None:
    keys = signing_keys(KEY)
    assert keys is not None
    unsigned = spliced(encode_manifest(USING["packs"]), NEWER)
    with pytest.raises(SignatureError, match="it is not signed"):
        decode_manifest("m", unsigned, keys)
    forged = spliced(encode_manifest(USING["packs"], keys), NEWER + UNKNOWN_MEMBER)
    for decode in (decode_manifest, decode_header):
        with pytest.raises(SignatureError, match="does not verify"):
            decode("m", forged, keys)
    newer = signed_by(forged, keys)
    for decode in (decode_manifest, decode_header):
        with pytest.raises(NewerFormatError) as info:
            decode("m", newer, keys)
        assert_newer(info.value, "m")
    with pytest.raises(NewerFormatError):
        decode_manifest("m", newer)  # without keys, the signature is not looked at


def test_a_part_that_requires_an_unknown_feature_is_a_newer_format() -> None:
    stored = encode_stored(with_entries(*(entry(p) for p in range(40))), part_entries=16)
    root = decode_root("m", stored.root)
    record = root.parts[0]
    [(path, body)] = [(p, b) for p, b in stored.parts if p == record.path]
    assert decode_part(root, record, path, body) == stored.manifest.operators["agg"].partitions[:16]
    newer = body[:-2] + b',"requires":["zebra"],"written_by":"9.1.0","zebra_stripes":7}\n'
    digest = hashlib.sha256(newer).hexdigest()
    record = msgspec.structs.replace(record, size_bytes=len(newer), sha256=digest)
    with pytest.raises(NewerFormatError) as info:
        decode_part(root, record, path, newer)
    assert_newer(info.value, path)
    known = body[:-2] + b',"requires":["packs"]}\n'
    record = msgspec.structs.replace(
        record, size_bytes=len(known), sha256=hashlib.sha256(known).hexdigest()
    )
    assert len(decode_part(root, record, path, known)) == 16


def test_a_root_of_parts_that_requires_an_unknown_feature_is_a_newer_format() -> None:
    stored = encode_stored(with_entries(*(entry(p) for p in range(40))), part_entries=16)
    newer = spliced(stored.root, NEWER + UNKNOWN_MEMBER)
    for decode in (decode_root, decode_header):
        with pytest.raises(NewerFormatError) as info:
            decode("m", newer)
        assert_newer(info.value, "m")
    header = decode_header("m", stored.root)
    assert (header.checkpoint_id, header.epoch, header.writer_generation) == (CID, 3, None)
    assert [part.entries for part in header.parts] == [16, 16, 8]


# -- the table ------------------------------------------------------------------------


def test_every_feature_has_a_name_a_release_and_a_line() -> None:
    names = [feature.name for feature in features.FEATURES]
    assert names == sorted(set(names)) and set(names) == features.KNOWN
    for feature in features.FEATURES:
        assert features.FEATURE_NAME.fullmatch(feature.name), feature
        assert re.fullmatch(r"\d+\.\d+\.\d+", feature.since) and feature.since != "0.1.0"
        assert feature.summary and "\n" not in feature.summary and "|" not in feature.summary
    assert features.unknown_features(["zebra", "packs", "zebra"]) == ("zebra",)


def test_the_version_is_one_and_the_same_everywhere() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == cairn.__version__ == features.VERSION == "0.2.0.dev0"
    release = version_tuple(features.VERSION.split(".dev")[0])
    assert all(version_tuple(feature.since) <= release for feature in features.FEATURES)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(number) for number in version.split("."))
