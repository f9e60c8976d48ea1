"""A job that checkpoints and exposes cairn's Prometheus metrics on /metrics.

    pip install 'cairn-checkpoint[metrics]'
    python examples/metrics_job.py ./checkpoints [PORT]

It serves ``/metrics`` on 127.0.0.1 (PORT, or a free one, printed on the first line),
saves a checkpoint every half second for a few rounds (full, then deltas), loads the
latest, and keeps serving until interrupted, so that a Prometheus server (or ``curl``)
can scrape ``cairn_checkpoints_total``, ``cairn_checkpoint_duration_seconds``,
``cairn_store_requests_total`` and the rest.
"""

from __future__ import annotations

import sys
import time

import prometheus_client

from cairn import CheckpointData, SyncCheckpointer
from cairn.metrics import PrometheusMetrics


def main() -> None:
    store = sys.argv[1] if len(sys.argv) > 1 else "./checkpoints"
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    registry = prometheus_client.CollectorRegistry()
    server, _ = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    print(f"serving /metrics on port {server.server_port}", flush=True)

    ckpt = SyncCheckpointer(store, observers=[PrometheusMetrics(registry)])
    parent = None
    for epoch in range(1, 4):
        if parent is None:
            data = CheckpointData(epoch=epoch, snapshots={("counts", 0): b"0" * 4096})
        else:
            data = CheckpointData(epoch=epoch, deltas={("counts", 0): b"+1"}, parent_id=parent)
        parent = ckpt.save(data).checkpoint_id
        time.sleep(0.5)
    ckpt.load_latest()
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
