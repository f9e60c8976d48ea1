"""An epoch of a streaming job on Ray (``cairn.ray``) against a one-process save of the
same state.

    python bench/bench_ray_epoch.py [--workers 4] [--words 64000] [--rounds 9] [--json out.json]

A local Ray (2 CPUs) runs the word count of ``examples/ray_wordcount.py`` on
``--workers`` partition actors over ``--words`` words, into a store on tmpfs
(``/dev/shm`` where there is one). Then, each round, in alternating order:

* ``epoch``: ``job.checkpoint()`` from the driver: barrier to every actor, each uploads
  its key groups, confirms, and the coordinator commits with ``commit_distributed``;
* ``save``: ``ObjectStoreCheckpointer.save`` in this process of the same state (one
  ``KeyedSnapshot`` per partition, the groups read back from the latest checkpoint) into
  a second store on the same filesystem, the baseline: what the same bytes cost without
  actors;
* ``confirm``: the confirmation alone (one call to every actor, gathered): what the
  check that every reporting actor still runs adds to an epoch.

Round 0 is a discarded warm-up. Reported: the median of each, and ``epoch`` over
``save``. Ray's actors share the machine's cores with the coordinator and the driver:
on a loaded machine every figure slows.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cairn import CheckpointData, CheckpointPaths, KeyedSnapshot, ObjectStoreCheckpointer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_wordcount.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("ray_wordcount_bench", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def _save_same_state(store: str, baseline: str, workers: int, example: Any) -> float:
    ckpt = ObjectStoreCheckpointer(store, CheckpointPaths(""))
    latest = await ckpt.latest_id()
    assert latest is not None
    manifest = await ckpt.load_manifest(latest)
    space = example.KEY_GROUPS
    groups = await ckpt.load_key_groups(latest, example.OPERATOR, range(space.count))
    data = {g: bytes(b) for g, b in groups.items()}
    snapshots = {
        ("baseline", w): KeyedSnapshot(
            space, {g: data[g] for g in space.groups_of(w, workers) if g in data}
        )
        for w in range(workers)
    }
    saver = ObjectStoreCheckpointer(baseline, CheckpointPaths(""))  # the job's store is fenced
    began = time.perf_counter()
    await saver.save(
        CheckpointData(
            epoch=manifest.epoch,
            snapshots=snapshots,
            source_offsets=dict(manifest.source_offsets),
        )
    )
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--words", type=int, default=64_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()

    import ray

    from cairn.ray import StreamJob

    example = _example()
    ray.cloudpickle.register_pickle_by_value(example)  # type: ignore[no-untyped-call]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with (
        tempfile.TemporaryDirectory(dir=base) as tmp,
        tempfile.TemporaryDirectory(dir=base) as other,
    ):
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        epochs: list[float] = []
        saves: list[float] = []
        confirms: list[float] = []
        job = StreamJob(
            tmp,
            example.WordCount,
            example.WordSource(7, args.words),
            workers=args.workers,
            key_groups=example.KEY_GROUPS,
            operator=example.OPERATOR,
        )
        try:
            job.start()
            job.run()
            actors = job.actors()
            for round_ in range(args.rounds + 1):
                began = time.perf_counter()
                ray.get([a.confirm.remote() for a in actors])
                confirm = time.perf_counter() - began
                if round_ % 2 == 0:
                    began = time.perf_counter()
                    job.checkpoint()
                    epoch = time.perf_counter() - began
                    save = asyncio.run(_save_same_state(tmp, other, args.workers, example))
                else:
                    save = asyncio.run(_save_same_state(tmp, other, args.workers, example))
                    began = time.perf_counter()
                    job.checkpoint()
                    epoch = time.perf_counter() - began
                if round_ > 0:
                    epochs.append(epoch)
                    saves.append(save)
                    confirms.append(confirm)
        finally:
            job.stop()
            ray.shutdown()
    figures = {
        "workers": args.workers,
        "words": args.words,
        "rounds": args.rounds,
        "epoch_ms": round(statistics.median(epochs) * 1000, 1),
        "save_ms": round(statistics.median(saves) * 1000, 1),
        "confirm_ms": round(statistics.median(confirms) * 1000, 1),
        "epoch_over_save": round(statistics.median(epochs) / statistics.median(saves), 2),
    }
    print(
        f"{args.workers} actors, {args.words:,} words, median of {args.rounds} rounds: "
        f"epoch {figures['epoch_ms']} ms, save {figures['save_ms']} ms "
        f"(epoch/save {figures['epoch_over_save']}), confirm {figures['confirm_ms']} ms"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
