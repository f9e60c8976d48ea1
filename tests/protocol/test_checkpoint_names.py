"""Checkpoint names: the optional ``name`` of a manifest, without torch.

A name is a label recorded in a manifest (DCP saves record their ``checkpoint_id``
there, see ``test_torch_names.py``). These tests pin what it must not change: a
manifest without one is written byte for byte as one without the field; a bad one is refused when
committing and is damage when reading; the newest checkpoint with a name is found by
writer generation and id; ``cairn list``/``show`` print it (text and JSON, the JSON
checked against its schema) and ``cairn copy`` keeps it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from support.cli import PREFIX, cairn, cairn_many, document
from support.paths import DATA

from cairn import (
    CheckpointId,
    CheckpointManifest,
    CheckpointPaths,
    CorruptManifestError,
    InvalidInputError,
    InvalidNameError,
    ObjectStoreCheckpointer,
)
from cairn.format.layout import MAX_CHECKPOINT_NAME_BYTES, validate_checkpoint_name
from cairn.format.manifest import decode_manifest, encode_manifest
from cairn.protocol import _catalog, _save

OLD_STORE = DATA / "store-0.1.0"


def test_manifests_without_a_name_encode_byte_for_byte_as_before() -> None:
    manifests = sorted(OLD_STORE.glob("checkpoints/*/manifest.json"))
    assert len(manifests) == 4
    for path in manifests:
        data = path.read_bytes()
        manifest = decode_manifest(str(path), data)
        assert manifest.name is None
        assert encode_manifest(manifest) == data, path
        assert b'"name"' not in data


def test_a_name_round_trips_and_is_covered_by_the_checksum() -> None:
    cid = CheckpointId.now()
    manifest = msgspec.structs.replace(CheckpointManifest.new(cid, 3), name="runs/a/step-10")
    data = encode_manifest(manifest)
    assert b'"name": "runs/a/step-10"' in data
    assert decode_manifest("m", data) == manifest
    with pytest.raises(CorruptManifestError, match="checksum"):
        decode_manifest("m", data.replace(b"step-10", b"step-11"))
    # A name that the writer refuses is damage when read (checksum recomputed to match).
    bad = msgspec.structs.replace(manifest, name="a/../b")
    forged = msgspec.json.format(
        msgspec.json.encode({**msgspec.structs.asdict(bad), "checkpoint_id": str(cid)}), indent=2
    )
    with pytest.raises(CorruptManifestError, match="invalid checkpoint name"):
        decode_manifest("m", forged)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "segments"),
        ("a//b", "segments"),
        ("./a", "segments"),
        ("a/..", "segments"),
        ("/abs", "segments"),
        ("a\\b", "'\\\\'"),
        ("tab\there", "control"),
        ("x" * (MAX_CHECKPOINT_NAME_BYTES + 1), "limit"),
        (str(CheckpointId.parse("01a23293-346c-7bf4-8c50-55d6f5cfd0ec")), "is a checkpoint id"),
        (7, "must be a string"),
    ],
)
def test_bad_names_are_refused(name: object, reason: str) -> None:
    with pytest.raises(InvalidNameError, match=reason):
        validate_checkpoint_name(name)


def test_good_names_are_kept_as_given() -> None:
    for name in ("step-100", "runs/a/step-100", "héllo wörld", "x" * MAX_CHECKPOINT_NAME_BYTES):
        assert validate_checkpoint_name(name) == name


async def commit_named(
    ckpt: ObjectStoreCheckpointer, name: str | None, epoch: int = 1
) -> CheckpointId:
    cid = CheckpointId.now()
    entries = await ckpt.save_partitions_concurrent(cid, [("op", 0, False, f"{name}".encode())])
    manifest = _save.assemble_manifest(
        cid, epoch, entries, writer_generation=ckpt.writer_generation, name=name
    )
    await ckpt.commit(manifest)
    return cid


async def test_the_newest_checkpoint_with_a_name_comes_first(tmp_path: Path) -> None:
    ckpt = ObjectStoreCheckpointer(str(tmp_path), CheckpointPaths(PREFIX))
    first = await commit_named(ckpt, "step-10", epoch=10)
    other = await commit_named(ckpt, "step-20", epoch=20)
    second = await commit_named(ckpt, "step-10", epoch=5)  # a lower epoch, saved later
    await commit_named(ckpt, None, epoch=30)

    async def named(name: str) -> list[CheckpointId]:
        return [cid async for cid in _catalog.named_candidates(await ckpt._context(), name)]

    assert await named("step-10") == [second, first]
    assert await named("step-20") == [other]
    assert await named("step-30") == []
    assert await _catalog.checkpoint_names(await ckpt._context()) == ["step-10", "step-20"]
    generation = await ckpt.take_over()  # a newer writer generation outranks later ids
    newer = ObjectStoreCheckpointer(str(tmp_path), CheckpointPaths(PREFIX))
    newer.writer_generation = generation
    third = await commit_named(newer, "step-10")
    assert await named("step-10") == [third, second, first]
    with pytest.raises(InvalidInputError, match="invalid checkpoint name"):
        await commit_named(newer, "bad//name")


def test_list_show_and_copy_carry_the_name(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ckpt = ObjectStoreCheckpointer(str(store), CheckpointPaths(PREFIX))
    named = asyncio.run(commit_named(ckpt, "runs/step-10"))
    plain = asyncio.run(commit_named(ckpt, None, epoch=2))
    common = ["--store", str(store), "--prefix", PREFIX]
    listed, listed_text, shown, shown_text, shown_plain, copied = cairn_many(
        [
            ["list", *common, "--json"],
            ["list", *common],
            ["show", str(named), *common, "--json"],
            ["show", str(named), *common],
            ["show", str(plain), *common, "--json"],
            ["copy", str(named), "--to", str(tmp_path / "copy"), *common],
        ]
    )
    rows = document("list", listed)["checkpoints"]
    assert [(r["id"], r["name"]) for r in rows] == [
        (str(named), "runs/step-10"),
        (str(plain), None),
    ]
    assert "Name" in listed_text.stdout and "runs/step-10" in listed_text.stdout
    assert document("show", shown)["name"] == "runs/step-10"
    assert document("show", shown_plain)["name"] is None
    assert any(
        line.split()[:2] == ["name", "runs/step-10"] for line in shown_text.stdout.splitlines()
    ), shown_text.stdout
    assert copied.code == 0, copied.explain()
    again = cairn(
        "show", str(named), "--store", str(tmp_path / "copy"), "--prefix", PREFIX, "--json"
    )
    assert document("show", again)["name"] == "runs/step-10"


def test_list_has_no_name_column_when_no_checkpoint_has_a_name(tmp_path: Path) -> None:
    store = tmp_path / "store"
    asyncio.run(commit_named(ObjectStoreCheckpointer(str(store), CheckpointPaths(PREFIX)), None))
    listed = cairn("list", "--store", str(store), "--prefix", PREFIX)
    assert listed.code == 0 and "Name" not in listed.stdout, listed.explain()
