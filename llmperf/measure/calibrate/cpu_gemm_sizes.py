"""A CPU weight GEMM's streaming efficiency by weight size: the engine's `x @ W.T` at a few weight
shapes and the decode rows.

The GEMM sweep (`ceilings.measure_gemm`) times one weight shape; a model's decode runs its
projections at other sizes, and a CPU's GEMM kernels stream a small weight at a different speed than a
large one (on an AVX2-only CPU oneDNN's packed GEMM streamed 1024-wide weights at ~25 GB/s while on the
sweep's 4096 x 8192 it ran slower than the GEMV). Here the engine's own GEMM path
(`llmperf.engine.ops.ops_for`, oneDNN packing included) is timed on each of `Settings.gemm_sizes`
(N x K weights, a wide-and-short lm_head-like one among them) at the rows of `gemm_size_rows_for`, the
calls cycling through copies of W that fill the calibration's working set (`ceilings.working_set_for`)
so that every call streams from DRAM, as in a model's step. `fit.fit_gemm_e_memory` turns the points
into the time model's `gemm_e_memory` (`llmperf.specs.efficiency.GemmBytesCurves`). A dtype's points
stop before one predicted to take it past its budget (`ceilings.sweep_fits`), noted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from llmperf.measure.calibrate.ceilings import (
    _gemm_path_edges,
    _time_steady,
    _Weights,
    copies_for,
    sweep_budget_s,
    sweep_fits,
    working_set_for,
)
from llmperf.measure.calibrate.points import ComputePoint
from llmperf.measure.calibrate.settings import DTYPE_NAMES, Progress, Settings


def gemm_size_rows_for(s: Settings, dname: str, device: Any) -> tuple[int, ...]:
    """`s.gemm_size_rows` and both sides of each edge between the engine's GEMM paths up to their
    largest (`engine.paths.gemm_path_edges`), so that a rows curve steps where the kernel changes."""
    if not s.gemm_size_rows:
        return ()
    top = max(s.gemm_size_rows)
    return tuple(sorted(set(s.gemm_size_rows) | {r for r in _gemm_path_edges(dname, device) if r <= top}))


def gemm_size_shapes(s: Settings, dname: str, device: Any) -> list[tuple[int, int, int]]:
    """The (N, K, rows) points of `dname`'s sweep, in the order they are timed: weights from the
    smallest, each at every row count (a stopped sweep loses its largest weights, never a row count)."""
    rows = gemm_size_rows_for(s, dname, device)
    return [(n, k, r) for n, k in sorted(s.gemm_sizes, key=lambda nk: nk[0] * nk[1]) for r in rows]


def measure_gemm_sizes(s: Settings, device: Any, progress: Progress, dtypes: Sequence[str],
                       notes: list[str]) -> list[tuple[int, ComputePoint]]:
    """Per dtype of `dtypes`, (weight bytes, point) for each (N, K, rows) of `gemm_size_shapes`: the
    typical call of `x (rows, K) @ W (N, K).T` through the engine's GEMM, over copies of W used in turn."""
    import torch

    out: list[tuple[int, ComputePoint]] = []
    working_set = working_set_for(s, device)
    for dname in dtypes:
        dtype = getattr(torch, DTYPE_NAMES[dname])
        elem = torch.empty((), dtype=dtype).element_size()
        budget = sweep_budget_s(s, dname, device, s.gemm_size_budget_s)
        spent, last = 0.0, None  # seconds of this dtype's sweep; (weight bytes, seconds) of the last point
        weights, held = None, None
        for n, k, rows in gemm_size_shapes(s, dname, device):
            w_bytes = elem * n * k
            copies = copies_for(w_bytes, working_set)
            # a point's time grows about with its weight's bytes (streamed; the decode rows add little)
            next_s = last[1] * w_bytes / last[0] if last else 0.0
            if last and not sweep_fits(spent, next_s, budget):
                notes.append(f"gemm sizes {dname}: stopped before {n}x{k} rows={rows} (predicted {next_s:.2g} s; "
                             f"{spent:.1f} s spent of {budget:g} s)")
                break
            progress(f"gemm size {dname} {n}x{k} rows={rows}")
            started = time.perf_counter()
            try:
                if held != (n, k):
                    weights = None  # free the last shape's copies first
                    weights = _Weights(k, n, dtype, device, 1)
                    weights.ws += [weights.ws[0].clone() for _ in range(copies - 1)]  # distinct buffers, cold
                    held = (n, k)
                fn = weights.fn(rows)
                t = _time_steady(fn, device, reps=max(s.reps, copies), warmup=copies, notes=notes,
                                 what=f"gemm size {dname} {n}x{k} rows={rows}")
            except RuntimeError as exc:  # a dtype this device or build cannot multiply
                notes.append(f"gemm sizes {dname}: not measured ({str(exc).splitlines()[0]})")
                break
            took = time.perf_counter() - started
            spent += took
            last = (w_bytes, took)
            out.append((w_bytes, ComputePoint(
                op="matmul", dtype=dname, rows=rows,
                shape=f"({rows},{k})@({k},{n})" + (f" x{copies} in turn" if copies > 1 else ""),
                seconds=t.min_s, median_s=t.median_s, spread_s=t.spread_s, n=t.n, flops=2.0 * rows * k * n,
                bytes=float(elem * (k * n + rows * k + rows * n)))))
            del fn
        del weights
    return out
