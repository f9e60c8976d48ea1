"""DCP save and load over a link that caps each connection: cairn against fsspec and CRT.

    python bench/bench_link.py [--sizes 64,256] [--reps 3] [--rate 25] [--latency 20]
                               [--moto-memory] [--json out.json] [--quick]

S3 carries about 50-100 MB/s per connection, so a rank moves as fast as the requests it
has in flight at once. This models that on loopback: moto's S3 server behind the tests'
``FaultProxy`` (``tests/support/proxy.py``) with ``shape()``, in a process of its own (as
a network would be, it does not share the client's interpreter lock): each direction of
each connection paced to ``--rate`` MiB/s, and ``--latency`` ms added to each new
connection and to each request (moto closes every connection after one response, so
every request pays both). One process plays one rank: ``dcp.save`` of a state of 16 MiB
float32 tensors adding up to each ``--sizes`` MiB, then ``dcp.load`` of it into
preallocated tensors (checked equal once per variant), each timed on its own. Variants:

* ``cairn``: ``CairnWriter``/``CairnReader`` over one ``ObstoreStore`` with the default
  ``parts_in_flight`` (adaptive, from 8 within 2..16), reused across rounds as a training
  job reuses its store: what the adapter learns in one round it keeps for the next;
* ``cairn-32``: the same with ``PartsInFlight(initial=16, minimum=2, maximum=32)``;
* ``obstore``: no DCP and no checkpoint: each tensor's bytes as an object of its own,
  one obstore ``put`` each, all at once, and one ``get`` each (no hashing, no commit,
  nothing checked; not a peer). Its save is about the floor this link and server set
  for the same objects; its load is not (one connection per object);
* ``fsspec``: torch's ``FsspecWriter``/``FsspecReader`` on ``s3fs`` (skipped if not
  installed);
* ``s3torchconnector``: ``S3StorageWriter``/``S3StorageReader`` (the AWS CRT client, 8 MiB
  parts, many in flight), their ``fs`` pointed at the proxy (skipped if not installed).

Install the peers beside cairn with ``pip install s3torchconnector==1.5.0 tenacity s3fs``
(s3torchconnector imports tenacity without declaring it). Every round runs each variant
once, rotating which goes first; round 0 is a discarded warm-up. Objects are deleted
after every run, untimed, directly on moto. Reported: median seconds and MiB/s per
variant, and each variant's median throughput over the best peer's ("x best peer").
moto is a Python server on the same cores: on a loaded machine every variant slows.
By default moto spools each object or part over 5 MiB to a temporary file, and writes
every completed multipart object again after reading its parts back: work on the
client's cores that S3 does not put there. ``--moto-memory`` keeps them in memory
instead (``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``), which moves moto's ceiling, and with it
which variant each size favours.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import obstore
import torch
from obstore.store import S3Store
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as ``python bench/bench_link.py``
    sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "tests"))  # for support.servers, support.proxy

from bench.harness import MiB, table  # noqa: E402
from cairn.stores import ObstoreStore, PartsInFlight  # noqa: E402
from cairn.torch import CairnReader, CairnWriter  # noqa: E402

# Imported by name at run time (tests/ is not a package; see bench_s3.py).
servers: Any = importlib.import_module("support.servers")

TENSOR_BYTES = 16 * MiB
BUCKET = "link"

Save = Callable[[dict[str, torch.Tensor], str], None]
Load = Callable[[dict[str, torch.Tensor], str], None]


def make_state(total_mib: int) -> dict[str, torch.Tensor]:
    count = max(1, total_mib * MiB // TENSOR_BYTES)
    gen = torch.Generator().manual_seed(total_mib)
    return {f"layer{i}.weight": torch.rand(TENSOR_BYTES // 4, generator=gen) for i in range(count)}


def s3_options(endpoint: str) -> dict[str, Any]:
    return dict(servers.s3_store_options(endpoint))


def cairn_variant(
    endpoint: str, parts: PartsInFlight | None
) -> tuple[Save, Load, Callable[[], str]]:
    store = ObstoreStore(S3Store(BUCKET, **s3_options(endpoint)), parts)

    def save(state: dict[str, torch.Tensor], where: str) -> None:
        dcp_save(state, storage_writer=CairnWriter(store, epoch=0, prefix=where), no_dist=True)

    def load(state: dict[str, torch.Tensor], where: str) -> None:
        dcp_load(state, storage_reader=CairnReader(store, prefix=where), no_dist=True)

    return save, load, lambda: f"up {store.upload_parts}, down {store.download_parts}"


def fsspec_variant(endpoint: str) -> tuple[Save, Load, Callable[[], str]] | str:
    if importlib.util.find_spec("s3fs") is None:
        return "not installed (s3fs)"
    try:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    except ImportError as exc:
        return f"not installed ({exc.name})"
    options = {
        "key": servers.S3_ACCESS_KEY_ID,
        "secret": servers.S3_SECRET_ACCESS_KEY,
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": servers.S3_REGION},
    }

    def save(state: dict[str, torch.Tensor], where: str) -> None:
        writer = FsspecWriter(f"s3://{BUCKET}/{where}", sync_files=False, **options)
        dcp_save(state, storage_writer=writer, no_dist=True)

    def load(state: dict[str, torch.Tensor], where: str) -> None:
        dcp_load(
            state, storage_reader=FsspecReader(f"s3://{BUCKET}/{where}", **options), no_dist=True
        )

    return save, load, lambda: ""


def raw_variant(endpoint: str) -> tuple[Save, Load, Callable[[], str]]:
    store = S3Store(BUCKET, **s3_options(endpoint))

    async def put_all(state: dict[str, torch.Tensor], where: str) -> None:
        await asyncio.gather(
            *(
                obstore.put_async(store, f"{where}/{name}", tensor.numpy().data.cast("B"))
                for name, tensor in state.items()
            )
        )

    async def get_all(state: dict[str, torch.Tensor], where: str) -> None:
        async def get(name: str, tensor: torch.Tensor) -> None:
            got = await obstore.get_async(store, f"{where}/{name}")
            data = await got.bytes_async()
            tensor.numpy().data.cast("B")[:] = memoryview(data)

        await asyncio.gather(*(get(name, tensor) for name, tensor in state.items()))

    def save(state: dict[str, torch.Tensor], where: str) -> None:
        asyncio.run(put_all(state, where))

    def load(state: dict[str, torch.Tensor], where: str) -> None:
        asyncio.run(get_all(state, where))

    return save, load, lambda: ""


def crt_variant(endpoint: str) -> tuple[Save, Load, Callable[[], str]] | str:
    try:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
        from s3torchconnector.dcp.s3_file_system import S3FileSystem
    except ImportError as exc:
        return f"not installed ({exc.name})"
    region = servers.S3_REGION
    os.environ.setdefault("AWS_ACCESS_KEY_ID", servers.S3_ACCESS_KEY_ID)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", servers.S3_SECRET_ACCESS_KEY)
    client = S3Client(
        region, endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True)
    )

    def fs() -> Any:
        return S3FileSystem(region, s3_client=client)

    def save(state: dict[str, torch.Tensor], where: str) -> None:
        writer = S3StorageWriter(region, f"s3://{BUCKET}/{where}")
        writer.fs = fs()
        dcp_save(state, storage_writer=writer, no_dist=True)

    def load(state: dict[str, torch.Tensor], where: str) -> None:
        reader = S3StorageReader(region, f"s3://{BUCKET}/{where}")
        reader.fs = fs()
        dcp_load(state, storage_reader=reader, no_dist=True)

    return save, load, lambda: ""


def empty_bucket(direct: S3Store) -> None:
    paths = [meta["path"] for batch in obstore.list(direct) for meta in batch]
    if paths:
        obstore.delete(direct, paths)


PROXY_PROCESS = """
import sys
sys.path.insert(0, sys.argv[1])
from support.proxy import FaultProxy
proxy = FaultProxy.for_endpoint(sys.argv[2]).start()
proxy.shape(bytes_per_second=float(sys.argv[3]), latency=float(sys.argv[4]))
print(proxy.endpoint, flush=True)
sys.stdin.read()  # until the benchmark closes it
proxy.stop()
"""


@contextmanager
def proxy_process(target: str, rate_mib: float, latency_ms: float) -> Iterator[str]:
    """A shaping ``FaultProxy`` in front of ``target``, in a process of its own, as a
    network would be: it does not share the interpreter lock of the client it paces.
    Its endpoint; it ends when this does."""
    args = [str(REPO / "tests"), target, str(rate_mib * MiB), str(latency_ms / 1000)]
    with subprocess.Popen(
        [sys.executable, "-c", PROXY_PROCESS, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            endpoint = proc.stdout.readline().strip()
            if not endpoint.startswith("http://"):
                raise RuntimeError(f"the proxy did not start (exit code {proc.wait()})")
            yield endpoint
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)


MOTO_BUFFER = "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE"
"""moto's setting: the size above which it spools an object or part to a file."""


@contextmanager
def moto_server(memory: bool) -> Iterator[Any]:
    """moto's S3 server, keeping objects in memory with ``memory`` (see the docstring)."""
    saved = os.environ.get(MOTO_BUFFER)
    if memory:
        os.environ[MOTO_BUFFER] = str(1 << 30)
    try:
        server = servers.S3Server().start()  # the process takes the environment now
    finally:
        if saved is None:
            os.environ.pop(MOTO_BUFFER, None)
        else:
            os.environ[MOTO_BUFFER] = saved
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def shaped_link(
    rate_mib: float, latency_ms: float, memory: bool = False
) -> Iterator[tuple[str, S3Store]]:
    with moto_server(memory) as server:
        server.create_bucket(BUCKET)
        with proxy_process(server.endpoint, rate_mib, latency_ms) as endpoint:
            yield endpoint, S3Store(BUCKET, **s3_options(server.endpoint))


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with shaped_link(args.rate, args.latency, args.moto_memory) as (endpoint, direct):
        made: dict[str, tuple[Save, Load, Callable[[], str]] | str] = {
            "cairn": cairn_variant(endpoint, None),
            "cairn-32": cairn_variant(endpoint, PartsInFlight(16, 2, 32)),
            "obstore": raw_variant(endpoint),
            "fsspec": fsspec_variant(endpoint),
            "s3torchconnector": crt_variant(endpoint),
        }
        variants = {k: v for k, v in made.items() if not isinstance(v, str)}
        skipped = {k: v for k, v in made.items() if isinstance(v, str)}
        for name, why in skipped.items():
            print(f"skipping {name}: {why}", file=sys.stderr)
        for size in args.sizes:
            state = make_state(size)
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            times: dict[tuple[str, str], list[float]] = {}
            names = list(variants)
            for round_ in range(args.reps + 1):
                order = names[round_ % len(names) :] + names[: round_ % len(names)]
                for name in order:
                    save, load, _ = variants[name]
                    where = f"{name}-{size}-{round_}"
                    target = {k: torch.empty_like(v) for k, v in state.items()}
                    began = time.perf_counter()
                    save(state, where)
                    saved = time.perf_counter()
                    load(target, where)
                    loaded = time.perf_counter()
                    if round_ == 0:
                        for key, tensor in state.items():
                            assert torch.equal(tensor, target[key]), (name, key)
                    else:
                        times.setdefault((name, "save"), []).append(saved - began)
                        times.setdefault((name, "load"), []).append(loaded - saved)
                    del target
                    empty_bucket(direct)
            for (name, op), seconds in times.items():
                median = statistics.median(seconds)
                results.append(
                    {
                        "size_mib": size,
                        "variant": name,
                        "op": op,
                        "median_s": median,
                        "min_s": min(seconds),
                        "max_s": max(seconds),
                        "mib_per_s": nbytes / MiB / median,
                        "parts": variants[name][2]() if name.startswith("cairn") else "",
                    }
                )
    peers = [n for n in ("fsspec", "s3torchconnector") if n not in skipped]
    for row in results:
        best = max(
            (
                r["mib_per_s"]
                for r in results
                if r["variant"] in peers
                and r["op"] == row["op"]
                and r["size_mib"] == row["size_mib"]
            ),
            default=None,
        )
        row["x_best_peer"] = None if best is None else row["mib_per_s"] / best
    return {
        "moto_memory": args.moto_memory,
        "rate_mib_per_connection": args.rate,
        "latency_ms": args.latency,
        "reps": args.reps,
        "skipped": skipped,
        "results": results,
    }


def print_report(out: dict[str, Any]) -> None:
    print(
        f"link: {out['rate_mib_per_connection']} MiB/s per connection, "
        f"{out['latency_ms']} ms per connection and per request; medians of {out['reps']}; "
        f"moto {'in memory' if out['moto_memory'] else 'spooling to files (its default)'}"
    )
    rows = [
        [
            f"{r['size_mib']} MiB",
            r["op"],
            r["variant"],
            f"{r['median_s']:.2f}",
            f"{r['min_s']:.2f}-{r['max_s']:.2f}",
            f"{r['mib_per_s']:.0f}",
            "-" if r["x_best_peer"] is None else f"{r['x_best_peer']:.2f}",
            r["parts"],
        ]
        for r in sorted(out["results"], key=lambda r: (r["size_mib"], r["op"], r["variant"]))
    ]
    print(
        table(
            ["size", "op", "variant", "median s", "range s", "MiB/s", "x best peer", "parts"],
            rows,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,256", help="MiB per rank, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rate", type=float, default=25.0, help="MiB/s per connection")
    parser.add_argument("--latency", type=float, default=20.0, help="ms per connection/request")
    parser.add_argument(
        "--moto-memory", action="store_true", help="moto keeps objects in memory, not files"
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="64 MiB, 1 round")
    args = parser.parse_args()
    args.sizes = [64] if args.quick else [int(s) for s in args.sizes.split(",")]
    if args.quick:
        args.reps = 1
    out = run(args)
    print_report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
