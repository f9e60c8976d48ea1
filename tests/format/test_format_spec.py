"""docs/format.md, the specification of the storage format, agrees with the code: its
table of format features is the one readers use, and its examples are byte for byte
what the encoders write."""

from __future__ import annotations

import hashlib
import json
import re

from support.forgery import with_checksum
from support.paths import REPO

from cairn.format import features
from cairn.format.manifest import decode_manifest, encode_manifest

PAGE = (REPO / "docs" / "format.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text of the section of the page headed ``title`` (any level), to the next."""
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", PAGE, re.MULTILINE | re.DOTALL)
    assert match is not None, title
    return match.group(1)


def json_blocks(text: str) -> list[str]:
    return re.findall(r"^```json\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def table(text: str, header: str) -> list[list[str]]:
    """The rows of the table of ``text`` whose header line is ``header``."""
    lines = text.splitlines()
    rows: list[list[str]] = []
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_table_of_features_is_the_one_readers_use() -> None:
    rows = table(section("Format features and `requires`"), "| feature | since | what it is |")
    assert rows == [[f"`{f.name}`", f.since, f.summary] for f in features.FEATURES]


def test_the_compatibility_table_names_every_feature() -> None:
    rows = table(
        section("Compatibility"), "| change | since | feature | what cairn 0.1.0 does with it |"
    )
    named = {row[2].strip("`") for row in rows if row[2].startswith("`")}
    assert named == features.KNOWN
    since = {row[2].strip("`"): row[1] for row in rows if row[2].startswith("`")}
    assert since == {f.name: f.since for f in features.FEATURES}


def test_the_example_manifest_is_what_the_encoder_writes() -> None:
    [example] = json_blocks(section("Encoding"))
    written = example.encode()
    manifest = decode_manifest("example", written)  # its checksum verifies
    assert json.loads(written)["requires"] == ["packs"]
    release = json.loads(written)["written_by"]
    ours = encode_manifest(manifest).replace(
        f'"written_by": "{features.VERSION}"'.encode(), f'"written_by": "{release}"'.encode()
    )
    assert with_checksum(ours) == written


def test_the_example_part_is_what_its_record_says() -> None:
    part, record = json_blocks(section("Manifest parts"))
    body = part.encode()
    fields = json.loads("{" + record.strip().rstrip(",") + "}")["parts"][0]
    assert fields["size_bytes"] == len(body)
    assert fields["sha256"] == hashlib.sha256(body).hexdigest()
    assert fields["path"] == f"parts/part-{fields['sha256']}.json"


def test_the_page_names_no_source_lines() -> None:
    assert not re.search(r"\.py:\d", PAGE)
