"""``CAIRN_SIGNING_KEY``: the command line signs and verifies, and says what is signed.

Each command is a real subprocess (see ``test_cli.py``); every JSON document is checked
against its command's schema.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.cli import PREFIX, cairn, cairn_many, document, failure
from support.forgery import forge

from cairn import CheckpointData, CheckpointPaths, HmacSigner, ObjectStoreCheckpointer
from cairn.format.signing import read_signature

KEY = bytes.fromhex("5e" * 32)
NEW_KEY = bytes.fromhex("17" * 32)
WRONG_KEY = bytes.fromhex("99" * 32)
ENV = "CAIRN_SIGNING_KEY"


def checkpointer(url: str, key: bytes | None = None) -> ObjectStoreCheckpointer:
    return ObjectStoreCheckpointer(url, CheckpointPaths(PREFIX), signing_key=key)


async def fill(url: str) -> tuple[str, str]:
    """An unsigned checkpoint (epoch 1), then one signed with KEY (epoch 2, the latest)."""
    unsigned = await checkpointer(url).save(CheckpointData(epoch=1, snapshots={("agg", 0): b"one"}))
    signed = await checkpointer(url, KEY).save(
        CheckpointData(epoch=2, snapshots={("agg", 0): b"two"})
    )
    return str(unsigned.checkpoint_id), str(signed.checkpoint_id)


def signatures(doc: dict[str, object]) -> dict[str, tuple[object, object, object]]:
    checkpoints = doc["checkpoints"]
    assert isinstance(checkpoints, list)
    return {c["id"]: (c["ok"], c["signature"], c["key_id"]) for c in checkpoints}


def test_verify_and_show_say_what_is_signed_and_check_it_with_the_key(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()
    unsigned, signed = asyncio.run(fill(url))
    key_id = HmacSigner(KEY).key_id
    where = ["--store", url, "--prefix", PREFIX]
    verify = ["verify", "--all", "--json", *where]
    show = ["show", "latest", "--json", *where]
    plain, plain_show, plain_text = cairn_many([verify, show, ["show", "latest", *where]])
    with_key, key_show, key_text = cairn_many(
        [verify, show, ["show", "latest", *where]], env={ENV: KEY.hex()}
    )
    [rotated] = cairn_many([verify], env={ENV: f"{NEW_KEY.hex()}, {KEY.hex()}"})
    wrong, wrong_show, wrong_latest = cairn_many(
        [verify, ["show", signed, "--json", *where], show], env={ENV: WRONG_KEY.hex()}
    )

    # Without a key: both verify (digests), one signed but not checked.
    assert plain.code == 0, plain.explain()
    assert signatures(document("verify", plain)) == {
        unsigned: (True, "unsigned", None),
        signed: (True, "unchecked", key_id),
    }
    assert document("show", plain_show)["signature"] == "unchecked"
    assert f"signed by key {key_id}, not checked" in plain_text.stdout, plain_text.explain()

    # With the key: the signed one verifies, the unsigned one fails.
    failure("verify", with_key, 1, "IntegrityError")
    assert signatures(document("verify", with_key)) == {
        unsigned: (False, "unsigned", None),
        signed: (True, "verified", key_id),
    }
    shown = document("show", key_show)
    assert (shown["signature"], shown["key_id"], shown["id"]) == ("verified", key_id, signed)
    assert f"signed by key {key_id}, verified" in key_text.stdout, key_text.explain()
    assert signatures(document("verify", rotated))[signed] == (True, "verified", key_id)

    # With another key: the signed one does not verify, and show refuses it.
    assert signatures(document("verify", wrong)) == {
        unsigned: (False, "unsigned", None),
        signed: (False, "invalid", key_id),
    }
    error = failure("show", wrong_show, 1, "SignatureError")["error"]
    assert f"{signed}/manifest.json" in error["message"] and key_id in error["message"]
    assert wrong_latest.code == 2, wrong_latest.explain()  # each refusal is also a warning
    error = document("show", wrong_latest)["error"]
    assert "no checkpoints signed by a key of CAIRN_SIGNING_KEY" in error["message"]


def test_a_forged_latest_is_refused_and_copy_signs_with_the_key(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    url = root.as_uri()
    ckpt = checkpointer(url, KEY)
    older = asyncio.run(ckpt.save(CheckpointData(epoch=1, snapshots={("agg", 0): b"1"})))
    newest = asyncio.run(ckpt.save(CheckpointData(epoch=2, snapshots={("agg", 0): b"2"})))
    asyncio.run(forge(ckpt, newest.checkpoint_id, b"evil", keep_signature=True))
    where = ["--store", url, "--prefix", PREFIX]
    env = {ENV: KEY.hex()}
    unkeyed_verify, keyed_verify, listed = (
        cairn("verify", "latest", "--json", *where),
        cairn("verify", "latest", "--json", *where, env=env),
        cairn("list", "--json", *where, env=env),
    )
    # Without the key the forgery verifies: its digests are consistent.
    assert document("verify", unkeyed_verify)["ok"] is True, unkeyed_verify.explain()
    # With it, "latest" is the older checkpoint, and the forgery fails verification.
    assert document("list", listed)["latest"] == str(older.checkpoint_id), listed.explain()
    assert document("verify", keyed_verify)["checkpoints"][0]["id"] == str(older.checkpoint_id)
    forged = cairn("verify", str(newest.checkpoint_id), "--json", *where, env=env)
    failure("verify", forged, 1, "IntegrityError")
    [result] = document("verify", forged)["checkpoints"]
    assert result["signature"] == "invalid" and "does not verify" in result["error"]

    backup = tmp_path / "backup"
    copied = cairn(
        "copy",
        str(older.checkpoint_id),
        "--to",
        str(backup),
        "--json",
        *where,
        env={ENV: f"{NEW_KEY.hex()},{KEY.hex()}"},
    )
    assert copied.code == 0, copied.explain()
    manifest = backup / PREFIX / str(older.checkpoint_id) / "manifest.json"
    signature = read_signature(manifest.read_bytes())
    assert signature is not None and signature.key_id == HmacSigner(NEW_KEY).key_id


def test_a_key_that_is_not_hex_is_a_usage_error_naming_the_variable(tmp_path: Path) -> None:
    where = ["--store", str(tmp_path)]
    runs = [
        cairn("list", *where, env={ENV: "not hex"}),
        cairn("verify", "--all", "--json", *where, env={ENV: f"{KEY.hex()},zz"}),
        cairn("show", "latest", *where, env={ENV: "abcd"}),
    ]
    for run in runs:
        assert run.code == 2, run.explain()
        line = run.error_line()
        assert ENV in line and KEY.hex() not in line, run.explain()
    failure("verify", runs[1], 2, "UsageError")
    assert "key 2 of 2 is not hex" in runs[1].error_line()
    assert "under the 16 bytes" in runs[2].error_line()
