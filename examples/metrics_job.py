"""A job that checkpoints and exposes cairn's Prometheus metrics on /metrics.

    pip install 'cairn-checkpoint[metrics]'
    python examples/metrics_job.py [STORE] [PORT]

It serves ``/metrics`` on 127.0.0.1 (PORT, or a free one, printed on the first line),
saves a checkpoint every half second for a few rounds (full, then deltas), loads the
latest, and keeps serving until interrupted (or for ``--serve-seconds``), so that a
Prometheus server (or ``curl``) can scrape ``cairn_checkpoints_total``,
``cairn_checkpoint_duration_seconds``, ``cairn_store_requests_total`` and the rest.

The checkpoints go to STORE (default ``./checkpoints``), in its root (``--prefix`` to
put them under a prefix): the store and prefix ``cairn`` reads by default, so ``cairn
list`` in the same directory lists them.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from cairn import CheckpointData, CheckpointPaths, MissingExtraError, SyncCheckpointer

DEFAULT_STORE = "./checkpoints"
"""The store ``cairn`` reads when given no ``--store``."""
DEFAULT_PREFIX = ""
"""The base prefix ``cairn`` reads when given no ``--prefix``."""


def port_number(text: str) -> int:
    """A TCP port, or 0 for a free one (argparse type)."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0 to 65535)")
    return port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--help`` and bad options exit here, before any store is made."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs the metrics extra (prometheus_client, opentelemetry-api): "
        "pip install '.[metrics]' in cairn's directory.",
    )
    parser.add_argument(
        "store",
        nargs="?",
        default=DEFAULT_STORE,
        metavar="STORE",
        help="where the checkpoints go: a directory (made if missing) or a URL "
        "(default: %(default)s, the store `cairn` reads by default)",
    )
    parser.add_argument(
        "port",
        nargs="?",
        type=port_number,
        default=0,
        metavar="PORT",
        help="port of /metrics on 127.0.0.1 (default: a free one, printed)",
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help="base prefix of the checkpoints in STORE (default: the store's root, the one "
        "`cairn` reads by default)",
    )
    parser.add_argument(
        "--serve-seconds",
        type=float,
        metavar="S",
        help="stop serving after S seconds (default: serve until interrupted)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve /metrics, checkpoint a few rounds, then keep serving."""
    args = parse_args(argv)
    try:
        from cairn.observe.metrics import PrometheusMetrics
    except MissingExtraError as exc:  # one line naming the extra to install
        sys.exit(f"metrics_job.py: {exc}")
    import prometheus_client

    paths = CheckpointPaths(args.prefix)
    registry = prometheus_client.CollectorRegistry()
    server, _ = prometheus_client.start_http_server(args.port, addr="127.0.0.1", registry=registry)
    print(f"serving /metrics on port {server.server_port}", flush=True)
    print(f"store {args.store}, prefix {paths.base_prefix!r}", flush=True)

    ckpt = SyncCheckpointer(args.store, paths, observers=[PrometheusMetrics(registry)])
    parent = None
    for epoch in range(1, 4):
        if parent is None:
            data = CheckpointData(epoch=epoch, snapshots={("counts", 0): b"0" * 4096})
        else:
            data = CheckpointData(epoch=epoch, deltas={("counts", 0): b"+1"}, parent_id=parent)
        parent = ckpt.save(data).checkpoint_id
        time.sleep(0.5)
    ckpt.load_latest()
    inspect = f"cairn list --store {shlex.quote(args.store)} "
    print(f"saved 3 checkpoints; inspect: {inspect}--prefix {shlex.quote(paths.base_prefix)}")
    if args.serve_seconds is None:
        print("serving until interrupted (Ctrl-C)", flush=True)
    deadline = None if args.serve_seconds is None else time.monotonic() + args.serve_seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
