"""``parts_in_flight`` on the DCP writer and reader: checked at construction, and passed to
the store adapter cairn opens (not to a ready ``Store``, which carries its own)."""

from __future__ import annotations

from typing import Any

import pytest
from obstore.store import MemoryStore

from cairn import InvalidInputError
from cairn.stores import ObstoreStore, PartsInFlight
from cairn.torch import CairnReader, CairnWriter


def adapter_of(store: Any) -> Any:
    while hasattr(store, "inner"):
        store = store.inner
    return store


@pytest.mark.parametrize("value", [0, "16", 1.5])
def test_a_bad_setting_is_refused_by_writer_and_reader(value: object) -> None:
    with pytest.raises(InvalidInputError, match=f"parts_in_flight.*{value!r}"):
        CairnWriter(MemoryStore(), epoch=0, parts_in_flight=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=f"parts_in_flight.*{value!r}"):
        CairnReader(MemoryStore(), parts_in_flight=value)  # type: ignore[arg-type]


def test_writer_and_reader_pass_the_setting_to_the_store_they_open() -> None:
    setting = PartsInFlight(initial=4, minimum=2, maximum=32)
    writer = CairnWriter(MemoryStore(), epoch=0, parts_in_flight=setting)
    reader = CairnReader(MemoryStore(), parts_in_flight=6)
    assert adapter_of(writer.checkpointer.store).parts_in_flight == setting
    assert adapter_of(reader.checkpointer.store).parts_in_flight == PartsInFlight.fixed(6)


def test_a_ready_store_with_a_setting_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="carries its own"):
        CairnWriter(ObstoreStore(MemoryStore()), epoch=0, parts_in_flight=4)
