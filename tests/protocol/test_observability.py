"""Metrics and traces: a real Prometheus registry scraped in text format, real
OpenTelemetry spans from the SDK's in-memory exporter, retries through the fault proxy."""

from __future__ import annotations

import datetime as dt
import io
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from obstore.store import MemoryStore, S3Store
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.artifacts import artifact_path
from support.backends import make_checkpointer
from support.faults import FaultPlan, FaultyStore
from support.paths import REPO
from support.proxy import FaultProxy
from support.servers import s3_store_options

from cairn import (
    CheckpointData,
    FencedError,
    ObjectStoreCheckpointer,
    RetentionPolicy,
    RetryPolicy,
    StoreError,
    SyncCheckpointer,
)
from cairn.observe import Observer, Operation
from cairn.observe.metrics import PrometheusMetrics
from cairn.observe.tracing import MAX_EVENTS, OpenTelemetryTracer
from cairn.stores import ObstoreStore


def scrape(registry: prometheus_client.CollectorRegistry) -> dict[str, float]:
    """The registry in Prometheus text format, parsed back: ``name{labels}`` -> value."""
    text = prometheus_client.generate_latest(registry).decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


async def test_prometheus_counts_saves_restores_fallbacks_and_gc() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    inner = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(inner, observers=[metrics])
    first = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"a" * 1000}))
    second = await ckpt.save(
        CheckpointData(epoch=2, deltas={("op", 0): b"+" * 10}, parent_id=first.checkpoint_id)
    )
    failing = make_checkpointer(
        FaultyStore(inner, FaultPlan(fail_puts_matching="doomed")), observers=[metrics]
    )
    with pytest.raises(StoreError):
        await failing.save(CheckpointData(epoch=3, snapshots={("doomed", 0): b"x"}))
    stale = make_checkpointer(inner, observers=[metrics])
    await ObjectStoreCheckpointer(inner).take_over()
    with pytest.raises(FencedError):
        await stale.save(CheckpointData(epoch=4, snapshots={("op", 0): b"late"}))
    await ckpt.load(first.checkpoint_id)
    # Damage the newest: load_latest falls back to the first.
    await inner.put(artifact_path(ckpt.paths, second, "op", 0, is_delta=True), b"-" * 10)
    loaded = await ckpt.load_latest()
    assert loaded is not None and loaded.checkpoint_id == first.checkpoint_id
    await ckpt.take_over()  # the writer that took over above is gone; this one goes on
    await ckpt.save(CheckpointData(epoch=5, snapshots={("op", 0): b"b" * 500}))
    gc = await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))

    samples = scrape(registry)
    assert samples['cairn_checkpoints_total{outcome="committed"}'] == 3
    assert samples['cairn_checkpoints_total{outcome="failed"}'] == 1
    assert samples['cairn_checkpoints_total{outcome="fenced"}'] == 1
    assert samples["cairn_checkpoint_duration_seconds_count"] == 5
    assert samples["cairn_checkpoint_uploaded_bytes_total"] == 1000 + 10 + 500
    assert samples["cairn_checkpoint_carried_bytes_total"] == 1000
    assert samples["cairn_last_checkpoint_size_bytes"] == 500
    assert samples["cairn_last_checkpoint_full_size_bytes"] == 500
    assert samples["cairn_last_completed_checkpoint_timestamp_seconds"] > 1.7e9
    assert samples["cairn_restore_duration_seconds_count"] == 2
    assert samples["cairn_restore_fallbacks_total"] == 1
    assert samples["cairn_gc_deleted_objects_total"] == gc.objects_deleted > 0
    assert samples["cairn_gc_reclaimed_bytes_total"] == gc.bytes_reclaimed > 0
    assert samples['cairn_store_requests_total{operation="put",outcome="ok"}'] > 5
    assert samples['cairn_store_requests_total{operation="head",outcome="not_found"}'] >= 1
    assert samples["cairn_saves_in_flight"] == 0
    assert not any("checkpoint_id" in key or "01" in key.split("{")[0] for key in samples)


async def test_retries_through_the_throttling_proxy_are_counted(
    s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    registry = prometheus_client.CollectorRegistry()
    options: dict[str, Any] = dict(s3_store_options(s3_proxy.endpoint))
    options["client_options"] = {"allow_http": True, "pool_max_idle_per_host": "0"}
    options["retry_config"] = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=5)}
    store = S3Store(s3_bucket, **options)
    ckpt = ObjectStoreCheckpointer(
        store,
        retry=RetryPolicy(attempts=8, initial_delay=0.001, max_delay=0.005),
        observers=[PrometheusMetrics(registry)],
    )
    s3_proxy.throttle(0.3, seed=7)
    try:
        saved = await ckpt.save(
            CheckpointData(epoch=1, snapshots={("op", p): b"%d" % p * 100 for p in range(8)})
        )
        loaded = await ckpt.load_latest()
    finally:
        s3_proxy.reset()
    assert loaded is not None and loaded.manifest == saved
    samples = scrape(registry)
    retries = sum(v for k, v in samples.items() if k.startswith("cairn_store_retries_total{"))
    throttled = sum(
        v
        for k, v in samples.items()
        if k.startswith("cairn_store_requests_total{") and 'outcome="transient"' in k
    )
    assert retries > 0 and retries == throttled
    assert all(
        'reason="status_503"' in k for k in samples if k.startswith("cairn_store_retries_total{")
    )
    assert saved.stats is not None and saved.stats.retries > 0


def spans_by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


async def test_opentelemetry_spans_nest_and_carry_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OpenTelemetryTracer(tracer_provider=provider)
    inner = ObstoreStore(MemoryStore())
    ckpt = make_checkpointer(inner, observers=[tracer])
    # More store calls than events kept: streams, each uploaded as an object of its own.
    many: dict[tuple[str, int], Any] = {("op", p): io.BytesIO(b"x") for p in range(MAX_EVENTS)}
    manifest = await ckpt.save(CheckpointData(epoch=9, snapshots=many))
    await ckpt.load_latest()
    await ckpt.gc(RetentionPolicy(keep_last=1), min_age=dt.timedelta(0))
    failing = make_checkpointer(
        FaultyStore(inner, FaultPlan(fail_puts_matching="doomed")), observers=[tracer]
    )
    with pytest.raises(StoreError):
        await failing.save(CheckpointData(epoch=10, snapshots={("doomed", 0): b"x"}))
    async with ckpt.observed("copy", checkpoint_id=manifest.checkpoint_id):
        await ckpt.load(manifest.checkpoint_id)

    spans = spans_by_name(exporter)
    assert {
        "cairn.save",
        "cairn.commit",
        "cairn.load",
        "cairn.load_latest",
        "cairn.gc",
        "cairn.copy",
    } <= set(spans)
    good, bad = spans["cairn.save"]
    commit = next(
        s for s in spans["cairn.commit"] if s.parent and s.parent.span_id == good.context.span_id
    )
    assert commit.context.trace_id == good.context.trace_id
    assert good.attributes is not None
    assert good.attributes["cairn.checkpoint.id"] == str(manifest.checkpoint_id)
    assert good.attributes["cairn.epoch"] == 9
    assert good.attributes["cairn.bytes"] == MAX_EVENTS
    events = [e.name for e in good.events]
    assert len(events) == MAX_EVENTS and "store.put" in events
    dropped = good.attributes["cairn.store.events_dropped"]
    assert isinstance(dropped, int) and dropped > 0
    assert bad.attributes is not None and bad.attributes["error.type"] == "StoreError"
    assert bad.status.status_code.name == "ERROR"
    [copy] = spans["cairn.copy"]
    [load] = [
        s for s in spans["cairn.load"] if s.parent and s.parent.span_id == copy.context.span_id
    ]
    assert load.attributes is not None and load.attributes["cairn.checkpoint.id"] == str(
        manifest.checkpoint_id
    )


async def test_an_observer_that_raises_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Observer):
        def ended(self, operation: Operation) -> None:
            raise RuntimeError("observer bug")

    ckpt = ObjectStoreCheckpointer(MemoryStore(), observers=[Broken()])
    manifest = await ckpt.save(CheckpointData(epoch=1, snapshots={("op", 0): b"a"}))
    assert (await ckpt.load(manifest.checkpoint_id)).manifest == manifest
    assert "observer bug" in caplog.text
    with pytest.raises(ValueError, match="Observer"):
        ObjectStoreCheckpointer(MemoryStore(), observers=[object()])  # type: ignore[list-item]


def test_the_blocking_facade_reports_background_saves(tmp_path: Path) -> None:
    registry = prometheus_client.CollectorRegistry()
    ckpt = SyncCheckpointer(str(tmp_path), observers=[PrometheusMetrics(registry)])
    futures = [
        ckpt.save_async(CheckpointData(epoch=e, snapshots={("op", 0): b"s"})) for e in (1, 2)
    ]
    for future in futures:
        future.result(timeout=30)
    ckpt.wait_for_saves()
    samples = scrape(registry)
    assert samples['cairn_checkpoints_total{outcome="committed"}'] == 2
    assert samples["cairn_saves_in_flight"] == 0


def test_the_metrics_example_serves_metrics_over_http(tmp_path: Path) -> None:
    job = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "metrics_job.py"), str(tmp_path / "store")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout is not None
        line = job.stdout.readline()
        match = re.match(r"serving /metrics on port (\d+)", line)
        assert match, line
        deadline = time.monotonic() + 60
        while True:  # scraped over HTTP until the job's three saves show
            with urllib.request.urlopen(f"http://127.0.0.1:{match[1]}/metrics", timeout=5) as r:
                body = r.read().decode()
            if 'cairn_checkpoints_total{outcome="committed"} 3.0' in body:
                break
            assert time.monotonic() < deadline, body[-2000:]
            time.sleep(0.1)
        assert 'cairn_store_requests_total{operation="put",outcome="ok"}' in body
    finally:
        job.terminate()
        job.wait(timeout=30)
        if job.stdout is not None:
            job.stdout.close()


async def test_prometheus_counts_the_bytes_each_kind_of_write_sent(tmp_path: Path) -> None:
    registry = prometheus_client.CollectorRegistry()
    ckpt = make_checkpointer(ObstoreStore(MemoryStore()), observers=[PrometheusMetrics(registry)])
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 12_289)  # a file: uploaded as a stream, in parts
    manifest = await ckpt.save(
        CheckpointData(epoch=1, snapshots={("big", 0): big, ("small", 0): b"s" * 3000})
    )
    assert manifest.stats is not None and isinstance(manifest.stats.stored_bytes, int)

    samples = scrape(registry)
    streamed = samples['cairn_store_sent_bytes_total{operation="put_stream"}']
    assert streamed == big.stat().st_size
    # The puts: the small artifact's object and the manifest, which the save's stored
    # bytes count, plus its records (intent, pointer), which are small.
    put = samples['cairn_store_sent_bytes_total{operation="put"}']
    own = manifest.stats.stored_bytes - big.stat().st_size
    assert own <= put <= own + 4096, (put, own)
    assert not any(
        key.startswith("cairn_store_sent_bytes_total") and "put" not in key for key in samples
    )
