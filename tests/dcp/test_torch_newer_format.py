"""DCP checkpoints a newer cairn wrote: the DCP reader's latest stops there.

``cairn.torch.load_latest`` and a ``CairnReader`` without a checkpoint id raise
``NewerFormatError`` rather than load older state past a checkpoint a newer cairn wrote;
``skip_newer_format=True`` passes over it, with a warning naming it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.dcp import PREFIX, save
from support.newer import FEATURE, newer_cairn
from support.torch_worker import BLANK_SEED, digests, make_state
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from cairn import NewerFormatError
from cairn.torch import CairnReader, load_latest

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)


def test_the_latest_dcp_checkpoint_from_a_newer_cairn_is_not_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path)
    first = make_state(1)
    first_id = save(store, first, epoch=1)
    with newer_cairn():
        newer_id = save(store, make_state(2), epoch=2)

    with pytest.raises(NewerFormatError) as raised:
        load_latest(make_state(BLANK_SEED), store, prefix=PREFIX)
    assert raised.value.checkpoint_id == str(newer_id) and raised.value.features == (FEATURE,)
    with pytest.raises(NewerFormatError):
        CairnReader(store, prefix=PREFIX).read_metadata()

    state = make_state(BLANK_SEED)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        loaded = load_latest(state, store, prefix=PREFIX, skip_newer_format=True)
    assert loaded == first_id and digests(state) == digests(first)
    assert any(
        "passing over" in r.getMessage() and str(newer_id) in r.getMessage() for r in caplog.records
    )
    reader = CairnReader(store, prefix=PREFIX, skip_newer_format=True)
    state = make_state(BLANK_SEED)
    dcp_load(state, storage_reader=reader, no_dist=True)
    assert reader.checkpoint_id == first_id and digests(state) == digests(first)
