"""In and out of DCP's own directory format: export_dcp/import_dcp and their commands.

One process (``no_dist``). The directories are compared with what torch's own
``FileSystemWriter`` writes and ``FileSystemReader``/``dcp_to_torch_save`` read. Two
tests adapt PyTorch's ``test/distributed/checkpoint/test_format_utils.py``
(``test_dcp_to_torch_save``, ``test_torch_save_to_dcp``).
"""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it (scripts/test.sh)

import torch
from support.cli import cairn, cairn_many, document, failure
from support.swaps import link_before_rename
from support.torch_worker import BLANK_SEED, digests, make_state
from torch import nn
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import (
    CheckpointNotFoundError,
    CheckpointPaths,
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidInputError,
    MissingArtifactError,
    ObjectStoreCheckpointer,
    SyncCheckpointer,
)
from cairn.cli import dcp as cli_dcp
from cairn.cli.errors import CliError
from cairn.torch import CairnReader, CairnWriter, export_dcp, export_dcp_async, import_dcp

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

PREFIX = "dcp/"


def odd_state() -> dict[str, Any]:
    """Tensors of every kind of trouble, and plain values (DCP's byte items)."""
    gen = torch.Generator().manual_seed(3)
    return {
        "big": torch.randn(512, 600, generator=gen),  # over 1 MiB: an artifact of its own
        "bf16": torch.randn(33, 7, generator=gen).to(torch.bfloat16),
        "i64": torch.arange(-50, 50, dtype=torch.int64),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(4, 3, dtype=torch.complex64, generator=gen),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(64, 48, generator=gen).t(),
        "nested": {"step": 41, "note": "héllo", "cfg": {"lr": 0.1}},
    }


def blank_like(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: blank_like(v) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state.contiguous())
    return "" if isinstance(state, str) else 0


def raw(value: Any) -> Any:
    """A state with every tensor as (dtype, shape, its bytes): bit-exact comparisons."""
    if isinstance(value, dict):
        return {k: raw(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return (str(value.dtype), tuple(value.shape), data)
    return value


def save(store: str, state: Any, checkpoint_id: Any = None, epoch: int = 1) -> CairnWriter:
    writer = CairnWriter(store, epoch=epoch, prefix=PREFIX)
    dcp_save(state, storage_writer=writer, checkpoint_id=checkpoint_id, no_dist=True)
    return writer


def fs_save(state: Any, directory: Path) -> Path:
    dcp_save(state, storage_writer=FileSystemWriter(str(directory)), no_dist=True)
    return directory


def cairn_load(store: str, template: Any, checkpoint_id: Any) -> CairnReader:
    reader = CairnReader(store, prefix=PREFIX)
    dcp_load(template, storage_reader=reader, checkpoint_id=checkpoint_id, no_dist=True)
    return reader


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def storage_of(directory: Path) -> dict[Any, Any]:
    with open(directory / ".metadata", "rb") as stream:
        return dict(pickle.load(stream).storage_data)


# -- export ------------------------------------------------------------------------------


def test_an_export_reads_in_dcp_as_a_file_system_save_does(tmp_path: Path) -> None:
    store, state = str(tmp_path / "store"), odd_state()
    writer = save(store, state, "runs/step-7", epoch=7)
    exported = export_dcp(store, "runs/step-7", tmp_path / "out", prefix=PREFIX)
    assert exported.checkpoint_id == writer.checkpoint_id and exported.name == "runs/step-7"
    assert exported.epoch == 7 and exported.target == tmp_path / "out"
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted(name for name, _ in exported.files)
    assert exported.files[-1][0] == ".metadata"
    assert all(n == ".metadata" or (n.startswith("__0_") and n.endswith(".distcp")) for n in names)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # FileSystemReader loads it bit-exactly.
    loaded = blank_like(state)
    dcp_load(loaded, storage_reader=FileSystemReader(str(tmp_path / "out")), no_dist=True)
    assert raw(loaded) == raw(state)


def test_dcp_to_torch_save_of_an_export_equals_that_of_a_file_system_save(
    tmp_path: Path,
) -> None:
    """Adapted from PyTorch's test_format_utils.py (test_dcp_to_torch_save)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 15), nn.Linear(15, 5))
    state = {"model": model.state_dict(), "extra": odd_state()}
    store = str(tmp_path / "store")
    save(store, state)
    export_dcp(store, None, tmp_path / "exported", prefix=PREFIX)
    fs_save(state, tmp_path / "fs")
    dcp_to_torch_save(tmp_path / "exported", tmp_path / "exported.pt")
    dcp_to_torch_save(tmp_path / "fs", tmp_path / "fs.pt")
    from_export = torch.load(tmp_path / "exported.pt", weights_only=True)
    from_fs = torch.load(tmp_path / "fs.pt", weights_only=True)
    assert raw(from_export) == raw(from_fs) == raw(state)


def test_an_export_verifies_every_byte_and_writes_all_or_nothing(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    writer = save(store, odd_state())
    assert writer.checkpoint_id is not None
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    with pytest.raises(InvalidInputError, match="not empty"):
        export_dcp(store, writer.checkpoint_id, occupied, prefix=PREFIX)
    assert [p.name for p in occupied.iterdir()] == ["keep.txt"]
    (tmp_path / "linked").symlink_to(tmp_path / "missing", target_is_directory=True)
    with pytest.raises(InvalidInputError, match="linked': it is a symbolic link"):
        export_dcp(store, writer.checkpoint_id, tmp_path / "linked", prefix=PREFIX)
    assert (tmp_path / "linked").is_symlink() and not (tmp_path / "missing").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    flip_largest_artifact(tmp_path / "store", writer)
    with pytest.raises(IntegrityMismatchError, match="sha256"):
        export_dcp(store, writer.checkpoint_id, empty, prefix=PREFIX)
    assert list(empty.iterdir()) == [] and not (tmp_path / "missing").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(CheckpointNotFoundError, match="named 'nope'"):
        export_dcp(store, "nope", tmp_path / "missing", prefix=PREFIX)
    assert not (tmp_path / "missing").exists()


def flip_largest_artifact(store: Path, writer: CairnWriter) -> None:
    """Flip a byte inside the largest artifact ``writer``'s save stored."""
    assert writer.checkpoint_id is not None
    manifest = SyncCheckpointer(str(store), CheckpointPaths(PREFIX)).load_manifest(
        writer.checkpoint_id
    )
    big = max(manifest.operators["rank-0"].partitions, key=lambda p: p.size_bytes)
    flip(store / PREFIX / str(writer.checkpoint_id) / big.path, 1000)


def test_the_latest_and_a_name_pass_over_a_checkpoint_whose_items_are_damaged(
    tmp_path: Path,
) -> None:
    store, state = tmp_path / "store", odd_state()
    older = save(str(store), state, "run", epoch=1)
    newer = save(str(store), blank_like(state), "run", epoch=2)
    flip_largest_artifact(store, newer)
    for target, out in ((None, "latest"), ("run", "named")):
        exported = export_dcp(str(store), target, tmp_path / out, prefix=PREFIX)
        assert (exported.checkpoint_id, exported.epoch) == (older.checkpoint_id, 1)
        [(passed, reason)] = exported.passed_over
        assert passed == newer.checkpoint_id and "sha256" in reason
        loaded = blank_like(state)
        dcp_load(loaded, storage_reader=FileSystemReader(str(tmp_path / out)), no_dist=True)
        assert raw(loaded) == raw(state)
    # Asked for by id, the damaged checkpoint fails, and nothing is written.
    with pytest.raises(IntegrityMismatchError, match="sha256"):
        export_dcp(str(store), newer.checkpoint_id, tmp_path / "by-id", prefix=PREFIX)
    assert not (tmp_path / "by-id").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # With every candidate damaged, nothing is exported: the newest's damage is raised.
    flip_largest_artifact(store, older)
    with pytest.raises(IntegrityMismatchError, match=str(newer.checkpoint_id)):
        export_dcp(str(store), None, tmp_path / "none", prefix=PREFIX)
    assert not (tmp_path / "none").exists()


def test_an_export_never_writes_through_its_staging_directory_swapped_for_a_link(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "store")
    save(store, {"x": torch.arange(8.0)})
    outside, dest = tmp_path / "outside", tmp_path / "out"
    outside.mkdir()

    def swap(_: int) -> None:  # told of the first file written: the staging directory exists
        [staging] = tmp_path.glob(".out.*")
        staging.rename(tmp_path / "moved-aside")
        staging.symlink_to(outside, target_is_directory=True)

    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(PREFIX))
    with pytest.raises(InvalidInputError, match="staging directory .* was replaced"):
        asyncio.run(export_dcp_async(ckpt, None, dest, progress=swap))
    assert os.listdir(outside) == [], "nothing written through the link"
    assert not dest.exists() and not dest.is_symlink()


def test_an_export_refuses_a_link_swapped_in_at_its_destination_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    save(store, {"x": torch.arange(8.0)})
    outside, dest = tmp_path / "outside", tmp_path / "out"
    outside.mkdir()
    link_before_rename(monkeypatch, dest, outside)
    with pytest.raises(InvalidInputError, match="out': it is a symbolic link"):
        export_dcp(store, None, dest, prefix=PREFIX)
    assert os.readlink(dest) == str(outside) and os.listdir(outside) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "outside", "store"]


# -- import ------------------------------------------------------------------------------


def test_an_import_loads_bit_exact_through_cairn_reader(tmp_path: Path) -> None:
    state = odd_state()
    source = fs_save(state, tmp_path / "step-100")
    store = str(tmp_path / "store")
    imported = import_dcp(store, source, epoch=100, prefix=PREFIX)
    assert imported.name == "step-100" and imported.epoch == 100
    assert (imported.files, imported.tensor_items, imported.byte_items) == (1, 8, 3)
    assert imported.unchecked_items == 0, "DCP's default planner torch.saves byte items"
    assert imported.size_bytes == (source / "__0_0.distcp").stat().st_size
    for checkpoint_id in ("step-100", str(imported.checkpoint_id)):
        loaded = blank_like(state)
        reader = cairn_load(store, loaded, checkpoint_id)
        assert raw(loaded) == raw(state) and reader.checkpoint_id == imported.checkpoint_id
    ckpt = SyncCheckpointer(store, CheckpointPaths(PREFIX))
    assert ckpt.load_manifest(imported.checkpoint_id).epoch == 100
    ckpt.load(imported.checkpoint_id)  # cairn's own verification of every artifact
    # Exported again, it is what FileSystemReader reads.
    export_dcp(store, "step-100", tmp_path / "again", prefix=PREFIX)
    loaded = blank_like(state)
    dcp_load(loaded, storage_reader=FileSystemReader(str(tmp_path / "again")), no_dist=True)
    assert raw(loaded) == raw(state)


def test_torch_save_to_dcp_then_import_loads_through_cairn_reader(tmp_path: Path) -> None:
    """Adapted from PyTorch's test_format_utils.py (test_torch_save_to_dcp)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 10), nn.Linear(10, 15))
    state = {"model": model.state_dict()}
    torch.save(state, tmp_path / "model.pt")
    torch_save_to_dcp(tmp_path / "model.pt", tmp_path / "dcp")
    store = str(tmp_path / "store")
    import_dcp(store, tmp_path / "dcp", name="from-torch-save", prefix=PREFIX)
    fresh = nn.Sequential(nn.Linear(5, 10), nn.Linear(10, 15))
    loaded = {"model": fresh.state_dict()}
    cairn_load(store, loaded, "from-torch-save")
    assert raw(loaded) == raw(state)


def test_a_sharded_save_of_two_ranks_imports_under_two_rank_operators(tmp_path: Path) -> None:
    # A FileSystemWriter save by 2 ranks, made here by writing rank 1's file name: the
    # importer maps __{r}_{n}.distcp to operator rank-{r}.
    source = fs_save({"a": torch.arange(10.0), "b": torch.ones(3)}, tmp_path / "two")
    (source / "__0_0.distcp").rename(source / "__1_0.distcp")
    metadata = pickle.loads((source / ".metadata").read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "__1_0.distcp"
    (source / ".metadata").write_bytes(pickle.dumps(metadata))
    store = str(tmp_path / "store")
    imported = import_dcp(store, source, prefix=PREFIX)
    manifest = SyncCheckpointer(store, CheckpointPaths(PREFIX)).load_manifest(
        imported.checkpoint_id
    )
    assert sorted(manifest.operators) == ["dcp-metadata", "rank-1"]
    [entry] = manifest.operators["rank-1"].partitions  # the file is one object of ranges
    assert entry.index_size_bytes is not None
    loaded = {"a": torch.zeros(10), "b": torch.zeros(3)}
    cairn_load(store, loaded, "two")
    assert torch.equal(loaded["a"], torch.arange(10.0))


def broken(tmp_path: Path, how: str) -> Path:
    """A FileSystemWriter save of odd_state, then damaged ``how``."""
    source = fs_save(odd_state(), tmp_path / how)
    data = source / "__0_0.distcp"
    storage = storage_of(source)
    tensor = next(i for k, i in storage.items() if k.fqn == "big")
    byte_item = next(i for k, i in storage.items() if k.fqn == "nested.note")
    if how == "missing":
        data.unlink()
    elif how == "truncated":
        data.write_bytes(data.read_bytes()[:-10])
    elif how == "longer":
        data.write_bytes(data.read_bytes() + b"extra")
    elif how == "past-the-end":
        metadata = pickle.loads((source / ".metadata").read_bytes())
        info = max(metadata.storage_data.values(), key=lambda i: i.offset)
        info.length += 4096
        (source / ".metadata").write_bytes(pickle.dumps(metadata))
    elif how == "flipped-tensor":
        flip(data, tensor.offset + tensor.length // 2)  # inside the tensor's bytes
    elif how == "flipped-byte-item":
        flip(data, byte_item.offset + 66)  # in its archive's data.pkl
    elif how == "no-record":
        metadata = pickle.loads((source / ".metadata").read_bytes())
        del metadata.storage_data[next(k for k in metadata.storage_data if k.fqn == "i64")]
        (source / ".metadata").write_bytes(pickle.dumps(metadata))
    elif how == "no-metadata":
        (source / ".metadata").unlink()
    elif how == "hostile-metadata":
        (source / ".metadata").write_bytes(pickle.dumps(_Exploit()))
    return source


class _Exploit:
    # eval, not print: a Ray started earlier in the same process replaces builtins.print.
    def __reduce__(self) -> tuple[Any, ...]:
        return (eval, ("print('imported code ran')",))


@pytest.mark.parametrize(
    ("how", "error", "message"),
    [
        ("missing", MissingArtifactError, "__0_0.distcp"),
        ("truncated", IntegrityMismatchError, "past the end"),
        ("longer", IntegrityMismatchError, "bytes after its last item"),
        ("past-the-end", IntegrityMismatchError, "ends at byte"),
        ("flipped-tensor", IntegrityMismatchError, "CRC-32 of archive/data/0 in item 'big'"),
        ("flipped-byte-item", IntegrityMismatchError, "CRC-32 of archive/data.pkl in item"),
        ("no-record", CorruptManifestError, "no storage record, such as 'i64'"),
        ("no-metadata", MissingArtifactError, ".metadata"),
        ("hostile-metadata", CorruptManifestError, "builtins.eval"),
    ],
)
def test_an_import_refuses_a_directory_that_does_not_match_its_metadata(
    tmp_path: Path, how: str, error: type[Exception], message: str
) -> None:
    source = broken(tmp_path, how)
    store = str(tmp_path / "store")
    with pytest.raises(error, match=message.replace("(", r"\(")):
        import_dcp(store, source, prefix=PREFIX)
    assert SyncCheckpointer(store, CheckpointPaths(PREFIX)).list_checkpoints() == []


class RawBytesSavePlanner(DefaultSavePlanner):
    """Stores a BytesIO value as its bytes (DCP's default planner torch.saves it)."""

    def transform_object(self, write_item: Any, object: Any) -> Any:
        if isinstance(object, io.BytesIO):
            return object
        return super().transform_object(write_item, object)


class RawBytesLoadPlanner(DefaultLoadPlanner):
    """Loads byte items as their bytes."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        path = self.mappings[read_item.dest_index.fqn]
        set_element(self.original_state_dict, path, value.getvalue())


def test_a_flipped_byte_in_a_raw_byte_item_cannot_be_seen_on_import(tmp_path: Path) -> None:
    """The limit, stated by a test: a planner that stores a byte item raw leaves nothing
    to check it against (DCP's metadata has no digest), so a flip inside it is imported
    as found. From then on cairn's digests protect it (and export keeps it)."""
    source = tmp_path / "raw"
    state = {"blob": io.BytesIO(b"raw payload " * 20), "t": torch.arange(6.0)}
    dcp_save(
        state,
        storage_writer=FileSystemWriter(str(source)),
        planner=RawBytesSavePlanner(),
        no_dist=True,
    )
    blob = next(i for k, i in storage_of(source).items() if k.fqn == "blob")
    flip(source / "__0_0.distcp", blob.offset + 3)
    store = str(tmp_path / "store")
    imported = import_dcp(store, source, prefix=PREFIX)
    assert (imported.byte_items, imported.unchecked_items, imported.tensor_items) == (1, 1, 1)
    export_dcp(store, "raw", tmp_path / "out", prefix=PREFIX)
    loaded: dict[str, Any] = {"blob": b"", "t": torch.zeros(6)}
    dcp_load(
        loaded,
        storage_reader=FileSystemReader(str(tmp_path / "out")),
        planner=RawBytesLoadPlanner(),
        no_dist=True,
    )
    assert loaded["blob"] == b"raw!payload " + b"raw payload " * 19
    assert torch.equal(loaded["t"], torch.arange(6.0))


def test_what_import_does_not_read_is_refused(tmp_path: Path) -> None:
    from torch.distributed.checkpoint._extension import ZStandard

    pytest.importorskip("zstandard")
    compressed = tmp_path / "compressed"
    dcp_save(
        {"a": torch.ones(4)},
        storage_writer=FileSystemWriter(str(compressed), _extensions=[ZStandard()]),
        no_dist=True,
    )
    with pytest.raises(InvalidInputError, match="stream transforms"):
        import_dcp(str(tmp_path / "store"), compressed, prefix=PREFIX)
    local = tmp_path / "local"
    dcp_save({"a": torch.ones(4)}, storage_writer=FileSystemWriter(str(local)), no_dist=True)
    (local / ".metadata").rename(local / "__0.metadata")
    with pytest.raises(InvalidInputError, match="rank-local metadata"):
        import_dcp(str(tmp_path / "store"), local, prefix=PREFIX)
    with pytest.raises(InvalidInputError, match="checkpoint id, not a name"):
        import_dcp(str(tmp_path / "store"), local, name=str(_an_id()), prefix=PREFIX)


def test_an_import_reads_no_file_through_a_link(tmp_path: Path) -> None:
    source = fs_save({"a": torch.ones(4)}, tmp_path / "linked-metadata")
    elsewhere = tmp_path / "elsewhere.metadata"
    (source / ".metadata").rename(elsewhere)
    (source / ".metadata").symlink_to(elsewhere)
    store = str(tmp_path / "store")
    with pytest.raises(InvalidInputError, match=r"\.metadata: it is a symbolic link"):
        import_dcp(store, source, prefix=PREFIX)
    (source / ".metadata").unlink()
    elsewhere.rename(source / ".metadata")
    (source / "__0_0.distcp").rename(tmp_path / "elsewhere.distcp")
    (source / "__0_0.distcp").symlink_to(tmp_path / "elsewhere.distcp")
    with pytest.raises(InvalidInputError, match=r"__0_0\.distcp: it is a symbolic link"):
        import_dcp(store, source, prefix=PREFIX)
    assert SyncCheckpointer(store, CheckpointPaths(PREFIX)).list_checkpoints() == []


def _an_id() -> Any:
    from cairn import CheckpointId

    return CheckpointId.now()


# -- the commands ------------------------------------------------------------------------


def test_export_and_import_on_the_command_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    state = make_state(4)
    save(str(store), state, "runs/step-4", epoch=4)
    damaged = save(str(store), make_state(5), "runs/step-5", epoch=5)
    flip_largest_artifact(store, damaged)
    common = ["--store", str(store), "--prefix", PREFIX]
    # The export by name and the export of the latest (damaged) one, at once.
    exported, past = cairn_many(
        [
            ["export-dcp", "runs/step-4", "--to", str(tmp_path / "step-4"), *common, "--json"],
            ["export-dcp", "latest", "--to", str(tmp_path / "past"), *common],
        ]
    )
    doc = document("export-dcp", exported)
    assert doc["name"] == "runs/step-4" and doc["epoch"] == 4 and doc["verified"] is True
    assert doc["passed_over"] == []
    assert doc["to"] == str(tmp_path / "step-4")
    loaded = make_state(BLANK_SEED)
    dcp_load(loaded, storage_reader=FileSystemReader(str(tmp_path / "step-4")), no_dist=True)
    assert digests(loaded) == digests(state)
    assert past.code == 0, past.explain()
    assert "(epoch 4)" in past.stdout
    assert f"passed over newer checkpoint {damaged.checkpoint_id}: " in past.stdout

    other = tmp_path / "other"
    imported = cairn(
        "import-dcp", str(tmp_path / "step-4"), "--store", str(other), "--epoch", "9", "--json"
    )
    doc = document("import-dcp", imported)
    assert doc["name"] == "step-4" and doc["epoch"] == 9 and doc["prefix"] == ""
    assert doc["tensor_items"] > 0 and doc["byte_items"] > 0 and doc["unchecked_items"] == 0
    loaded = make_state(BLANK_SEED)
    reader = CairnReader(str(other))
    dcp_load(loaded, storage_reader=reader, checkpoint_id="step-4", no_dist=True)
    assert digests(loaded) == digests(state) and str(reader.checkpoint_id) == doc["id"]

    text = cairn("export-dcp", "latest", "--to", str(tmp_path / "text"), "--store", str(other))
    assert text.code == 0, text.explain()
    assert "every item verified as written" in text.stdout and ".metadata" in text.stdout
    text = cairn("import-dcp", str(tmp_path / "text"), "--name", "again", "--store", str(other))
    assert text.code == 0, text.explain()
    assert "items checked against the CRC-32s torch.save recorded" in text.stdout


def test_the_commands_fail_with_their_exit_codes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    common = ["--store", str(store), "--prefix", PREFIX, "--json"]
    source = broken(tmp_path, "truncated")
    save(str(store), {"x": torch.ones(2)}, "step-1")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    # Independent failures, run at once.
    truncated, missing, unnamed, full, elsewhere = cairn_many(
        [
            ["import-dcp", str(source), *common],
            ["import-dcp", str(tmp_path / "none"), *common],
            ["export-dcp", "step-2", "--to", str(tmp_path / "out"), *common],
            ["export-dcp", "latest", "--to", str(tmp_path / "full"), *common],
            ["export-dcp", "/elsewhere/step-1", "--to", str(tmp_path / "o"), *common],
        ]
    )
    failure("import-dcp", truncated, 1, "IntegrityMismatchError")
    failure("import-dcp", missing, 2, "UsageError")
    doc = failure("export-dcp", unnamed, 2, "CheckpointNotFoundError")
    assert "the names there are 'step-1'" in doc["error"]["message"]
    failure("export-dcp", full, 2, "InvalidInputError")
    failure("export-dcp", elsewhere, 2, "CheckpointLocationError")


def test_without_torch_the_commands_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cairn.torch", None)
    with pytest.raises(CliError, match=r"pip install '\.\[torch\]'") as info:
        cli_dcp.torch_module()
    assert info.value.code == 2
    assert "'cairn-checkpoint[torch]' from a package index" in info.value.message
    monkeypatch.delitem(sys.modules, "cairn.torch")
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(CliError) as missing:
        cli_dcp.torch_module()
    assert missing.value.message.startswith(
        "this command needs the torch extra: cairn.torch needs torch, which is not installed"
    )
    # and the command line itself does not import torch to start
    probe = "import sys, cairn.cli.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
