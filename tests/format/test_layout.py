"""CheckpointPaths and name validation: pure, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairn import CheckpointId, CheckpointPaths, InvalidInputError, InvalidNameError
from cairn.format.layout import validate_name, validate_relative_path

CID = CheckpointId.parse("01900000-0000-7000-8000-000000000001")


def test_layout_matches_the_documented_paths() -> None:
    paths = CheckpointPaths("jobs/wc")
    assert paths.base_prefix == "jobs/wc/"
    assert paths.latest_pointer() == "jobs/wc/_latest"
    assert paths.checkpoint_dir(CID) == f"jobs/wc/{CID}/"
    assert paths.manifest(CID) == f"jobs/wc/{CID}/manifest.json"
    assert paths.snapshot(CID, "agg", 3) == f"jobs/wc/{CID}/operators/agg/partition-3.snap"
    assert paths.delta(CID, "agg", 3) == f"jobs/wc/{CID}/operators/agg/partition-3.delta"
    assert paths.source_offset(CID, "kafka") == f"jobs/wc/{CID}/offsets/kafka.json"


def test_default_and_root_bases() -> None:
    assert CheckpointPaths() == CheckpointPaths("")  # the default is the store's root
    assert CheckpointPaths("checkpoints").latest_pointer() == "checkpoints/_latest"
    root = CheckpointPaths("")
    assert root.latest_pointer() == "_latest"
    assert root.manifest(CID) == f"{CID}/manifest.json"


@pytest.mark.parametrize("base", ["/abs", "a//b", "a/../b", "./a", 5])
def test_bad_bases_are_refused(base: object) -> None:
    with pytest.raises(InvalidInputError, match="base_prefix"):
        CheckpointPaths(base)  # type: ignore[arg-type]


def test_every_artifact_is_under_the_checkpoint_dir() -> None:
    paths = CheckpointPaths("p")
    directory = paths.checkpoint_dir(CID)
    for path in (
        paths.manifest(CID),
        paths.snapshot(CID, "x", 0),
        paths.delta(CID, "x", 1),
        paths.source_offset(CID, "s"),
    ):
        assert path.startswith(directory)


def test_parse_checkpoint_dir() -> None:
    paths = CheckpointPaths("p")
    assert paths.parse_checkpoint_dir(f"p/{CID}/") == CID
    assert paths.parse_checkpoint_dir(f"p/{CID}") == CID
    assert paths.parse_checkpoint_dir("p/not-an-id/") is None
    assert paths.parse_checkpoint_dir(f"q/{CID}/") is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "a/b",
        "a\\b",
        "nul\x00",
        "bell\x07",
        "del\x7f",
        "x" * 256,
        "é" * 128,
        "\ud800",
    ],
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name("operator", name)
    assert isinstance(info.value, ValueError)
    assert repr(name)[:50] in str(info.value)


@given(
    st.text(
        st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/\\"),
        min_size=1,
        max_size=60,
    ).filter(lambda s: s not in (".", ".."))
)
def test_valid_names_become_one_path_segment(name: str) -> None:
    path = CheckpointPaths("b").snapshot(CID, name, 0)
    assert path == f"b/{CID}/operators/{name}/partition-0.snap"
    assert path.split("/")[3] == name


@pytest.mark.parametrize("path", ["../x", "/x", "a/../../b", "a//b", "a/./b", "", "a\\b"])
def test_relative_paths_cannot_escape(path: str) -> None:
    with pytest.raises(InvalidInputError):
        validate_relative_path(path)


def test_the_layout_module_keeps_every_public_name() -> None:
    import cairn.format.layout as layout

    assert sorted(layout.__all__) == [
        "CheckpointPaths",
        "LEGACY_BASE_PREFIX",
        "MAX_CHECKPOINT_NAME_BYTES",
        "MAX_NAME_BYTES",
        "MAX_PARTITION",
        "MAX_RELATIVE_PATH_BYTES",
        "MAX_SOURCE_NAME_BYTES",
        "is_attempt_artifact",
        "is_cairn_name",
        "is_intent",
        "new_attempt",
        "short_repr",
        "validate_checkpoint_name",
        "validate_name",
        "validate_partition",
        "validate_relative_path",
    ]
    for name in layout.__all__:
        assert getattr(layout, name) is not None, name
    limits = (layout.MAX_NAME_BYTES, layout.MAX_SOURCE_NAME_BYTES, layout.MAX_PARTITION)
    assert limits == (255, 236, 2**32 - 1)
    assert (layout.MAX_RELATIVE_PATH_BYTES, layout.MAX_CHECKPOINT_NAME_BYTES) == (1024, 1024)
    assert layout.LEGACY_BASE_PREFIX == "checkpoints/"


def test_an_attempt_that_is_not_a_string_is_refused_with_a_typed_error() -> None:
    paths = CheckpointPaths("base")
    cid = CheckpointId.now()
    with pytest.raises(InvalidInputError, match=r"not an attempt token: 12"):
        paths.intent(cid, 12)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"not an attempt token \(12 hex digits\): 7"):
        CheckpointPaths.relative_pack(0, 7)  # type: ignore[arg-type]
    assert paths.intent(cid, "0123456789ab") == f"base/{cid}/intent.0123456789ab.json"
