"""The fixed cost of a tiny operator of each kind, and on CUDA a kernel's device floor.

`measure_overheads`: host dispatch on CPU, launch on GPU, as the mean time of back-to-back calls on
1-row tensors (median of rounds). `measure_floors` (CUDA, efficiency schema 4): one-row operators at
a real width (4096, bf16) replayed 20 to a CUDA graph, so no launch gap is counted
(`llmperf.measure.gpu_terms`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmperf.measure.calibrate.settings import Progress


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_call_s(fn: Callable[[], Any], device: Any, calls: int = 200, rounds: int = 7) -> float:
    """Mean time of back-to-back calls (what an eager engine pays per operator), median over rounds."""
    import statistics
    import time

    fn()
    _sync(device)
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def measure_overheads(device: Any, progress: Progress) -> dict[str, float]:
    """Dispatch / launch cost of a tiny operator of each kind (1 row, width 64)."""
    import torch
    import torch.nn.functional as F

    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta

    progress("tiny-operator overhead")
    x = torch.randn(1, 64, device=device)
    w = torch.randn(64, 64, device=device)
    y = torch.randn(1, 64, device=device)
    q = torch.randn(1, 1, 64, device=device)
    kv = torch.randn(1, 1, 8, 64, device=device)
    meta = StepMeta.decode(1, 8, device)
    table = torch.randn(256, 64, device=device)
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    nw = torch.ones(64, device=device)

    def rmsnorm() -> Any:  # the engine's RMSNorm: square, mean, rsqrt, scale, weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw

    return dict(matmul=_per_call_s(lambda: torch.matmul(x, w), device),
                attention=_per_call_s(lambda: sdpa_decode(q, kv, kv, meta, 0.125), device),  # the engine's decode
                elementwise=_per_call_s(lambda: y.add_(x), device),
                norm=_per_call_s(rmsnorm, device),
                embedding=_per_call_s(lambda: F.embedding(ids, table), device))


def measure_floors(device: Any, progress: Progress) -> dict[str, float]:
    """CUDA: a kernel's minimum DEVICE time per vector kind (`floor_s`, efficiency schema 4): one-row
    operators at a real width (4096, bf16) replayed 20 to a CUDA graph, so no launch gap is counted
    (`llmperf.measure.gpu_terms`). The engine's RMSNorm is its five kernels; a fused one is faster."""
    import torch
    import torch.nn.functional as F

    from llmperf.measure.gpu_terms import _graph_time_s

    progress("kernel device floors (CUDA graph)")
    x = torch.randn(1, 4096, device=device, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    w = torch.ones(4096, device=device, dtype=torch.bfloat16)
    table = torch.randn(1024, 4096, device=device, dtype=torch.bfloat16)
    ids = torch.zeros(1, dtype=torch.long, device=device)
    return dict(elementwise=_graph_time_s(torch, lambda: x + y, copies=20),
                norm=_graph_time_s(torch, lambda: F.rms_norm(x, (4096,), w, 1e-6), copies=20),
                embedding=_graph_time_s(torch, lambda: F.embedding(ids, table), copies=20))
