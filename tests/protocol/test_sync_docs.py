"""Every public method of :class:`SyncCheckpointer` documents what it does (its async
twin's text, said of a blocking call), not only where to look."""

from __future__ import annotations

import inspect
import pydoc

from cairn import ObjectStoreCheckpointer, SyncCheckpointer


def public_methods() -> list[str]:
    return [
        name
        for name, member in vars(SyncCheckpointer).items()
        if not name.startswith("_") and callable(member)
    ]


def test_every_public_method_is_documented_in_full() -> None:
    names = public_methods()
    assert "save" in names and "load_latest" in names and len(names) > 20
    for name in names:
        doc = inspect.getdoc(getattr(SyncCheckpointer, name)) or ""
        assert not doc.startswith("See "), (name, doc)
        assert len(doc) > 60, (name, doc)
    for name in ("__enter__", "__exit__"):
        assert len(inspect.getdoc(getattr(SyncCheckpointer, name)) or "") > 40, name


def test_a_method_says_what_its_async_twin_says_and_that_it_blocks() -> None:
    save = inspect.getdoc(SyncCheckpointer.save) or ""
    twin = inspect.getdoc(ObjectStoreCheckpointer.save) or ""
    assert save.startswith(twin.splitlines()[0])
    assert "Blocks until it is done" in save and "CheckpointAbortedError" in save
    assert "await :meth:" not in (inspect.getdoc(SyncCheckpointer.save_async) or "")
    assert "Blocks until it is done" in pydoc.render_doc(SyncCheckpointer.load_latest)


def test_a_summary_over_several_lines_stays_whole_before_the_blocking_note() -> None:
    twin = inspect.getdoc(ObjectStoreCheckpointer.load_manifests) or ""
    summary = twin.partition("\n\n")[0]
    assert "\n" in summary, "the twin's summary takes more than one line"
    doc = inspect.getdoc(SyncCheckpointer.load_manifests) or ""
    assert doc.startswith(summary + "\n\nBlocks until it is done"), doc
