"""``SafeLoadPlanner``: DCP's default load planner, without unpickling arbitrary objects.

DCP saves every value of a state dict that is not a tensor (a step count, a learning
rate schedule, a dict of settings) as a *byte item*: ``torch.save`` of the value. On
load, ``DefaultLoadPlanner.load_bytes`` turns it back with
``torch.load(value, weights_only=False)``: a full unpickle, which runs whatever code
the bytes name. Whoever can write the store can therefore run code in every process
that loads the checkpoint. Digests do not help (they are as writable as the bytes);
signed checkpoints (:mod:`cairn.signing`) do, for readers given the key.

Invariants:

* :class:`SafeLoadPlanner` unpickles a byte item only with ``weights_only=True``:
  tensors, primitive values, lists, tuples, dicts and the globals allowlisted with
  ``torch.serialization.add_safe_globals``; anything else is refused with
  ``pickle.UnpicklingError`` naming the item, before any of its code runs;
* :class:`~cairn.torch.CairnReader` hands a byte item to any other planner only after
  it passed the same weights-only load (:func:`check_byte_item`), so no planner loading
  through cairn unpickles arbitrary objects.
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem

__all__ = ["SafeLoadPlanner", "check_byte_item", "load_byte_item", "unpickles_safely"]


def load_byte_item(read_item: ReadItem, value: io.BytesIO) -> Any:
    """The value of a byte item, unpickled with ``weights_only=True``.

    Raises ``pickle.UnpicklingError`` naming the item for anything the weights-only
    unpickler refuses (a global that is not allowlisted): nothing of it runs.
    """
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message is pages long, and advises weights_only=False: keep its reason.
        found = re.search(r"WeightsUnpickler error: ([^\n]*)", str(exc))
        reason = found.group(1) if found else str(exc).strip().split("\n")[0]
        raise pickle.UnpicklingError(
            f"refused to unpickle DCP byte item {read_item.dest_index.fqn!r}: it is not "
            "made of tensors and plain values only, and unpickling it could run any code "
            f"its writer chose ({reason})"
        ) from None


def check_byte_item(read_item: ReadItem, data: bytes) -> None:
    """Raise ``pickle.UnpicklingError`` unless ``data`` loads with ``weights_only=True``."""
    load_byte_item(read_item, io.BytesIO(data))


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose byte items are unpickled with ``weights_only=True``.

    Use it with every ``dcp.load`` of a checkpoint you did not write yourself::

        dcp.load(state, storage_reader=CairnReader(store), planner=SafeLoadPlanner())

    Its arguments are ``DefaultLoadPlanner``'s. Tensors load as with the default planner;
    a byte item holding anything but tensors and plain values (or the classes allowlisted
    with ``torch.serialization.add_safe_globals``) raises ``pickle.UnpicklingError``
    naming the item, and none of its code runs. :func:`cairn.torch.load_latest` uses it
    unless given another planner.
    """

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Unpickle the byte item with ``weights_only=True`` into the state dict."""
        loaded = load_byte_item(read_item, value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def unpickles_safely(planner: LoadPlanner) -> bool:
    """True when ``planner`` loads byte items with :class:`SafeLoadPlanner`'s own method."""
    return getattr(type(planner), "load_bytes", None) is SafeLoadPlanner.load_bytes
