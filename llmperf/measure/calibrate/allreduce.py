"""All-reduce latency and bus bandwidth as nccl-tests reports them: NCCL over every CUDA device
(two or more), gloo over two CPU processes; `busbw = bytes / time * 2 (n - 1) / n`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmperf.measure.calibrate.floors import _sync
from llmperf.measure.calibrate.points import AllreducePoint
from llmperf.measure.calibrate.settings import MiB, Progress, Settings


def _allreduce_worker(rank: int, world: int, backend: str, sizes: Sequence[int], init_file: str,
                      result_file: str) -> None:  # pragma: no cover - runs in spawned processes
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        results = []
        for size in sizes:
            buf = torch.ones(size // 4, device=device)
            for _ in range(3):
                dist.all_reduce(buf)
            reps = 20 if size <= MiB else 5
            times = []
            for _ in range(reps):
                dist.barrier()
                _sync(device)
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                _sync(device)
                times.append(time.perf_counter() - t0)
            times.sort()
            results.append(dict(size_bytes=size, seconds=times[len(times) // 2]))
        if rank == 0:
            Path(result_file).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def measure_allreduce(s: Settings, device: Any, progress: Progress) -> list[AllreducePoint]:
    """All-reduce between `world` processes: NCCL over every CUDA device (needs two), gloo over two
    CPU processes."""
    import torch
    import torch.multiprocessing as mp

    if device.type == "cuda":
        world, backend = torch.cuda.device_count(), "nccl"
        if world < 2:
            return []
    else:
        world, backend = 2, "gloo"
    progress(f"all-reduce ({backend}, {world} processes)")
    with tempfile.TemporaryDirectory() as tmp:
        init_file, result_file = os.path.join(tmp, "init"), os.path.join(tmp, "result.json")
        mp.spawn(_allreduce_worker, args=(world, backend, list(s.allreduce_sizes), init_file, result_file),
                 nprocs=world, join=True)
        rows = json.loads(Path(result_file).read_text())
    return [AllreducePoint(backend=backend, world=world, size_bytes=r["size_bytes"], seconds=r["seconds"])
            for r in rows]
