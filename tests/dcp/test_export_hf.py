"""Hugging Face safetensors out of cairn and into it: export_hf and import_hf.

One process (``no_dist``). Checkpoints whose tensors are saved in chunks (by rows, and
on a 2-D grid, as a tensor-parallel save stores them) come from a planner that cuts
them so, which DCP records as it records a multi-rank save's shards. Every output is
read back with ``safetensors.torch.load_file`` and compared bit for bit.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it (scripts/test.sh)
pytest.importorskip("safetensors", reason="these tests need safetensors (the hf extra)")

import safetensors.torch as safetensors_torch
import torch
from obstore.store import S3Store
from support.cli import cairn, cairn_many, document, failure
from support.servers import S3Server, s3_store_options
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cairn import (
    CorruptManifestError,
    IntegrityMismatchError,
    InvalidInputError,
    ObjectExistsError,
    SyncCheckpointer,
)
from cairn.format._buffer import Buffer
from cairn.protocol._blocking import run_blocking
from cairn.stores import ForwardingStore, ObstoreStore, Store, as_store
from cairn.stores._types import Metadata, ObjectInfo, OpenChunks, PutMode
from cairn.torch import CairnReader, CairnWriter, _hfimport, export_hf, import_hf, under_prefix

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)


class ChunkingPlanner(DefaultSavePlanner):
    """Saves the tensors of ``grid`` as blocks: ``grid[fqn]`` parts along each dimension."""

    def __init__(self, grid: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.grid = grid

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        items: list[WriteItem] = []
        for item in plan.items:
            parts = self.grid.get(item.index.fqn)
            if parts is None or item.tensor_data is None:
                items.append(item)
                continue
            data = item.tensor_data
            for offsets, sizes in blocks(tuple(data.size), parts):
                chunk = ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))
                items.append(
                    WriteItem(
                        index=MetadataIndex(item.index.fqn, torch.Size(offsets)),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(chunk, data.properties, data.size),
                    )
                )
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> Any:
        if write_item.index.fqn not in self.grid or write_item.tensor_data is None:
            return super().resolve_data(write_item)
        chunk = write_item.tensor_data.chunk
        tensor = self.state_dict[write_item.index.fqn]
        for dim, (o, s) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
            tensor = tensor.narrow(dim, o, s)
        return tensor.contiguous()


def blocks(shape: tuple[int, ...], parts: tuple[int, ...]) -> Iterator[tuple[list[int], list[int]]]:
    """The blocks of ``shape`` cut into ``parts`` along each dimension (uneven cuts)."""
    cuts = []
    for n, p in zip(shape, parts, strict=True):
        edges = sorted({0, n, *(n * k // p + k % 2 for k in range(1, p))})
        cuts.append(list(itertools.pairwise(edges)))
    for spans in itertools.product(*cuts):
        yield [a for a, _ in spans], [b - a for a, b in spans]


def sample_state() -> dict[str, Any]:
    """Tensors of most dtypes safetensors knows, odd shapes, and a byte item."""
    gen = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(97, 33, generator=gen),
        "layer.0.weight": torch.randn(64, 48, generator=gen).bfloat16(),
        "layer.0.bias": torch.randn(48, generator=gen).half(),
        "layer.1.weight": torch.randn(5, 7, 9, generator=gen, dtype=torch.float64),
        "scale": torch.tensor(0.5),
        "empty": torch.zeros(0, 4),
        "mask": torch.rand(17, generator=gen) > 0.5,
        "ids": torch.arange(-40, 40, dtype=torch.int64),
        "small": torch.arange(12, dtype=torch.int8).reshape(3, 4),
        "fp8": torch.randn(8, 8, generator=gen).to(torch.float8_e4m3fn),
        "step": 11,
    }


GRID = {"embed.weight": (3, 2), "layer.0.weight": (4, 1), "layer.1.weight": (2, 3, 2)}


def tensors_of(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def read_export(root: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every tensor of the exported directory, and its index (checked against the files)."""
    index = json.loads((root / "model.safetensors.index.json").read_text())
    loaded: dict[str, torch.Tensor] = {}
    for file in sorted(set(index["weight_map"].values())):
        part = safetensors_torch.load_file(str(root / file))
        assert {k for k, v in index["weight_map"].items() if v == file} == set(part)
        loaded.update(part)
    return loaded, index


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: dtype, shape and bytes."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8))
        if a.numel()
        else (a.dtype == b.dtype and a.shape == b.shape)
    )


def save(store: Any, state: dict[str, Any], **writer: Any) -> None:
    dcp_save(
        state,
        storage_writer=CairnWriter(store, epoch=1, **writer),
        planner=ChunkingPlanner(GRID),
        no_dist=True,
    )


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_an_export_in_shards_loads_bit_exact(tmp_path: Path, compression: str | None) -> None:
    state = sample_state()
    save(str(tmp_path / "store"), state, compression=compression)
    out = tmp_path / "out"
    exported = export_hf(str(tmp_path / "store"), None, out, max_shard_bytes=8_000)
    loaded, index = read_export(out)
    expected = tensors_of(state)
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert same(loaded[name], tensor), name
    files = [f for f, _ in exported.files]
    count = len(files) - 1
    assert count > 2 and files[-1] == "model.safetensors.index.json"
    assert files[:-1] == [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]
    assert sorted(p.name for p in out.iterdir()) == sorted(files)
    assert [(p, (out / p).stat().st_size) for p in files] == list(exported.files)
    total = sum(t.numel() * t.element_size() for t in expected.values())
    assert index["metadata"]["total_size"] == exported.total_size == total
    assert exported.left_out == ("step",) and exported.tensors == len(expected)
    for file in files[:-1]:  # at most the limit of tensor bytes, or one tensor alone
        part = safetensors_torch.load_file(str(out / file))
        data = sum(t.numel() * t.element_size() for t in part.values())
        assert data <= 8_000 or len(part) == 1


def test_a_cast_changes_floating_point_tensors_only(tmp_path: Path) -> None:
    state = sample_state()
    del state["fp8"]  # float8 has no cast a test can compare across rounding modes
    save(str(tmp_path / "store"), state)
    export_hf(str(tmp_path / "store"), None, tmp_path / "out", dtype=torch.bfloat16)
    loaded, _ = read_export(tmp_path / "out")
    for name, tensor in tensors_of(state).items():
        want = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert same(loaded[name], want), name


def test_the_fqn_map_renames_and_leaves_out(tmp_path: Path) -> None:
    model = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    state = {"model": model, "optim": {"w.exp_avg": torch.zeros(2, 3)}, "epoch": 3}
    dcp_save(state, storage_writer=CairnWriter(str(tmp_path / "s"), epoch=1), no_dist=True)
    exported = export_hf(str(tmp_path / "s"), None, tmp_path / "o", fqn_map=under_prefix("model."))
    loaded, _ = read_export(tmp_path / "o")
    assert set(loaded) == {"w", "b"} and same(loaded["w"], model["w"])
    assert set(exported.left_out) == {"optim.w.exp_avg", "epoch"}
    with pytest.raises(InvalidInputError, match=r"one name 'x'"):
        export_hf(str(tmp_path / "s"), None, tmp_path / "o2", fqn_map=lambda fqn: "x")
    assert not (tmp_path / "o2").exists() or not any((tmp_path / "o2").iterdir())


def flip_a_byte(store: Store, path: str, at: int) -> None:
    async def flip() -> None:
        data = bytearray((await store.get(path)).data)
        data[at] ^= 0x40
        await store.put(path, bytes(data))

    run_blocking(flip())


def rank_object(ckpt: SyncCheckpointer) -> str:
    [cid] = ckpt.list_checkpoints()
    manifest = ckpt.load_manifest(cid)
    first = manifest.operators["rank-0"].partitions[0]  # the rank's first items
    return ckpt.paths.resolve(cid, first.path)


def test_a_flipped_byte_is_refused_and_no_export_is_left(tmp_path: Path) -> None:
    big = {"first": torch.randn(3000), "second": torch.randn(3000)}
    save(str(tmp_path / "store"), big)
    ckpt = SyncCheckpointer(str(tmp_path / "store"))
    # "second" is the second item of the rank object: damage it, so that the first
    # shard is written whole before the second fails.
    flip_a_byte(ckpt.async_checkpointer.store, rank_object(ckpt), 3000 * 4 + 100)
    out = tmp_path / "out"
    with pytest.raises(IntegrityMismatchError, match=r"item 'second'") as caught:
        export_hf(str(tmp_path / "store"), None, out, max_shard_bytes=12_000)
    assert caught.value.operator == "rank-0" and caught.value.item == "second"
    assert sorted(p.name for p in out.iterdir()) == []  # the first shard deleted, no index


def test_the_latest_passes_over_a_checkpoint_whose_items_are_damaged(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    older = {"first": torch.randn(3000), "second": torch.randn(3000)}
    save(store, older)
    save(store, {k: v + 1 for k, v in older.items()})
    ckpt = SyncCheckpointer(store)
    old_id, new_id = ckpt.list_checkpoints()
    first = ckpt.load_manifest(new_id).operators["rank-0"].partitions[0]
    flip_a_byte(ckpt.async_checkpointer.store, ckpt.paths.resolve(new_id, first.path), 100)

    exported = export_hf(store, None, tmp_path / "out", max_shard_bytes=12_000)

    assert exported.checkpoint_id == old_id
    [(passed, reason)] = exported.passed_over
    assert passed == new_id and "item 'first'" in reason
    loaded, index = read_export(tmp_path / "out")
    assert index["metadata"]["cairn_checkpoint_id"] == str(old_id)
    assert all(same(loaded[k], older[k]) for k in older)
    with pytest.raises(IntegrityMismatchError, match=r"item 'first'"):
        export_hf(store, new_id, tmp_path / "by-id")
    assert sorted(p.name for p in (tmp_path / "by-id").iterdir()) == []


def test_an_existing_export_is_refused(tmp_path: Path) -> None:
    save(str(tmp_path / "store"), {"w": torch.ones(4)})
    export_hf(str(tmp_path / "store"), None, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    with pytest.raises(ObjectExistsError, match="already holds an export"):
        export_hf(str(tmp_path / "store"), None, tmp_path / "out")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_an_import_loads_resharded_and_exports_back_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_hfimport, "IMPORT_CHUNK_BYTES", 1000)  # big tensors in row chunks
    state = tensors_of(sample_state())
    source = tmp_path / "hf"
    source.mkdir()
    safetensors_torch.save_file(state, str(source / "model.safetensors"))
    imported = import_hf(str(tmp_path / "store"), source, name="base")
    assert imported.name == "base" and imported.tensors == len(state)
    assert imported.files == ("model.safetensors",)
    store = str(tmp_path / "store")
    metadata = CairnReader(str(tmp_path / "store"), checkpoint_id="base").read_metadata()
    embed = metadata.state_dict_metadata["embed.weight"]
    assert isinstance(embed, TensorStorageMetadata) and len(embed.chunks) > 1  # in chunks
    # Loaded into whole tensors: another sharding than the saved chunks.
    target = {k: torch.empty_like(v) for k, v in state.items()}
    dcp_load(target, storage_reader=CairnReader(store, checkpoint_id="base"), no_dist=True)
    for name, tensor in state.items():
        assert same(target[name], tensor), name
    export_hf(store, "base", tmp_path / "back", max_shard_bytes=5_000)
    loaded, _ = read_export(tmp_path / "back")
    for name, tensor in state.items():
        assert same(loaded[name], tensor), name


def test_an_import_of_a_damaged_file_commits_nothing(tmp_path: Path) -> None:
    source = tmp_path / "hf"
    source.mkdir()
    safetensors_torch.save_file({"w": torch.ones(10)}, str(source / "model.safetensors"))
    with (source / "model.safetensors").open("ab") as f:
        f.write(b"\0")  # a byte past the last tensor: not a whole file
    with pytest.raises(CorruptManifestError, match=r"end at byte \d+, the file at byte"):
        import_hf(str(tmp_path / "store"), source)
    assert SyncCheckpointer(str(tmp_path / "store")).list_checkpoints() == []
    index = {"metadata": {}, "weight_map": {"w": "model.safetensors", "v": "gone.safetensors"}}
    (source / "model.safetensors").write_bytes(safetensors_torch.save({"w": torch.ones(10)}))
    (source / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CorruptManifestError, match="a file the index names is missing"):
        import_hf(str(tmp_path / "store"), source)
    with pytest.raises(InvalidInputError, match="is not a directory"):
        import_hf(str(tmp_path / "store"), tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
    assert SyncCheckpointer(str(tmp_path / "store")).list_checkpoints() == []


def s3(server: S3Server, bucket: str, prefix: str) -> ObstoreStore:
    return ObstoreStore(S3Store(bucket, prefix=prefix, **s3_store_options(server)))


def listing(store: Store) -> list[str]:
    return sorted(info.path for info in run_blocking(store.list("")))


def test_on_s3_an_export_streams_shards_and_a_damaged_one_leaves_nothing(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    gen = torch.Generator().manual_seed(1)
    # 20 MiB in one tensor, saved as four 2-D chunks, which the export puts together.
    state = {"big": torch.randn(2560, 2048, generator=gen), "bias": torch.randn(2048)}
    source = s3(s3_server, s3_bucket, "ckpts")
    dcp_save(
        state,
        storage_writer=CairnWriter(source, epoch=1),
        planner=ChunkingPlanner({"big": (2, 2)}),
        no_dist=True,
    )
    dest = s3(s3_server, s3_bucket, "hf/run-1")
    exported = export_hf(source, None, dest, max_shard_bytes=10 << 20)
    assert [f for f, _ in exported.files] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    local = tmp_path / "downloaded"
    local.mkdir()
    for name in listing(dest):
        (local / name).write_bytes(bytes(run_blocking(dest.get(name)).data))
    loaded, _ = read_export(local)
    assert same(loaded["big"], state["big"]) and same(loaded["bias"], state["bias"])
    # The same from S3 back into a checkpoint, read from the store directly.
    imported = import_hf(s3(s3_server, s3_bucket, "imported"), dest, name="from-hf")
    target = {k: torch.empty_like(v) for k, v in state.items()}
    reader = CairnReader(s3(s3_server, s3_bucket, "imported"), checkpoint_id="from-hf")
    dcp_load(target, storage_reader=reader, no_dist=True)
    assert imported.tensors == 2 and all(same(target[k], state[k]) for k in state)

    ckpt = SyncCheckpointer(source)
    flip_a_byte(
        ckpt.async_checkpointer.store, rank_object(ckpt), 5 << 20
    )  # inside a chunk of "big"
    damaged = s3(s3_server, s3_bucket, "hf/run-2")
    with pytest.raises(IntegrityMismatchError, match=r"item 'big'"):
        export_hf(source, None, damaged, max_shard_bytes=10 << 20)
    assert listing(damaged) == []  # the shard's upload never completed: no object
    assert uploads_in_progress(s3_server, s3_bucket, "hf/run-2") == []  # and it was aborted


def uploads_in_progress(server: S3Server, bucket: str, prefix: str) -> list[str]:
    """The keys of the multipart uploads under ``prefix`` begun and neither completed nor
    aborted (S3's ListMultipartUploads; moto does not check signatures)."""
    url = f"{server.endpoint}/{bucket}?uploads&prefix={prefix}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = reply.read().decode()
    return re.findall(r"<Upload>.*?<Key>(.*?)</Key>", body, flags=re.S)


def test_export_and_import_on_the_command_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    state = {"model": {"w": torch.arange(12.0).reshape(3, 4)}, "optim": {"m": torch.ones(2)}}
    dcp_save(
        state, storage_writer=CairnWriter(str(store), epoch=4), checkpoint_id="step-4", no_dist=True
    )
    out = tmp_path / "hf" / "step-4"
    args = ["--to", str(out), "--store", str(store), "--strip-prefix", "model."]
    # An argument refused before anything is touched runs beside the export.
    exported, unreadable = cairn_many(
        [
            ["export-hf", "step-4", *args, "--dtype", "bfloat16", "--json"],
            ["export-hf", "latest", *args, "--max-shard-size", "lots", "--json"],
        ]
    )
    doc = document("export-hf", exported)
    assert doc["name"] == "step-4" and doc["epoch"] == 4 and doc["verified"] is True
    assert doc["tensors"] == 1 and doc["left_out"] == ["optim.m"]
    loaded, _ = read_export(out)
    assert same(loaded["w"], state["model"]["w"].bfloat16())
    failure("export-hf", unreadable, 2, "UsageError")

    other = tmp_path / "other"
    again, imported = cairn_many(
        [
            ["export-hf", "latest", *args],
            ["import-hf", str(out), "--store", str(other), "--epoch", "9", "--json"],
        ]
    )
    assert again.code == 2 and "already holds an export" in again.stderr, again.explain()
    doc = document("import-hf", imported)
    assert doc["name"] == "step-4" and doc["epoch"] == 9 and doc["tensors"] == 1
    target = {"w": torch.empty(3, 4, dtype=torch.bfloat16)}
    dcp_load(target, storage_reader=CairnReader(str(other), checkpoint_id="step-4"), no_dist=True)
    assert same(target["w"], state["model"]["w"].bfloat16())
    text = cairn("export-hf", "step-4", "--to", str(tmp_path / "text"), "--store", str(other))
    assert text.code == 0 and "every item verified against its SHA-256" in text.stdout, (
        text.explain()
    )


def test_transformers_loads_an_export_of_a_model_saved_with_its_optimizer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optim.step()
    state = {"model": model.state_dict(), "optim": optim.state_dict()}
    dcp_save(state, storage_writer=CairnWriter(str(tmp_path / "s"), epoch=1), no_dist=True)
    out = tmp_path / "out"
    exported = export_hf(
        str(tmp_path / "s"), None, out, fqn_map=under_prefix("model."), max_shard_bytes=20_000
    )
    assert len(exported.files) > 3 and all(f.startswith("optim.") for f in exported.left_out)
    config.save_pretrained(out)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[5, 7, 11, 13]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert all(same(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())


class AbandonsFirstStream(ForwardingStore):
    """A store whose first streamed upload of each path reads two chunks, then gives up
    and starts again, as a store retrying a failed upload does."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.abandoned: list[str] = []

    async def put_stream(
        self, path: str, open_chunks: OpenChunks, *, metadata: Metadata = None
    ) -> None:
        if path not in self.abandoned:
            self.abandoned.append(path)
            chunks = open_chunks()
            await anext(chunks)
            await anext(chunks)
            await chunks.aclose()  # type: ignore[attr-defined]
        await self.inner.put_stream(path, open_chunks, metadata=metadata)


def test_a_retried_shard_upload_reads_and_checks_everything_again(tmp_path: Path) -> None:
    state = sample_state()
    save(str(tmp_path / "store"), state)
    out = AbandonsFirstStream(as_store(str(tmp_path / "out")))
    exported = export_hf(str(tmp_path / "store"), None, out, max_shard_bytes=8_000)
    assert out.abandoned == [f for f, _ in exported.files[:-1]]
    loaded, _ = read_export(tmp_path / "out")
    for name, tensor in tensors_of(state).items():
        assert same(loaded[name], tensor), name


class IndexWrittenMeanwhile(ForwardingStore):
    """A store where another export writes its index just before this one's."""

    async def put(
        self, path: str, data: Buffer, *, mode: PutMode = "overwrite", metadata: Metadata = None
    ) -> ObjectInfo:
        if path == "model.safetensors.index.json":
            await self.inner.put(path, b'{"weight_map": {}}', mode="create")
        return await self.inner.put(path, data, mode=mode, metadata=metadata)


def test_an_export_that_loses_the_race_for_the_index_deletes_nothing(tmp_path: Path) -> None:
    save(str(tmp_path / "store"), {"w": torch.ones(4)})
    out = IndexWrittenMeanwhile(as_store(str(tmp_path / "out")))
    with pytest.raises(ObjectExistsError):
        export_hf(str(tmp_path / "store"), None, out)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]
    assert (tmp_path / "out" / "model.safetensors.index.json").read_bytes() == b'{"weight_map": {}}'
