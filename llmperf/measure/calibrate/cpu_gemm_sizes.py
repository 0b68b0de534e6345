"""A CPU weight GEMM's efficiency by weight size: the engine's `x @ W.T` at a few weight shapes, at
the decode rows, then at a prefill's rows (`Settings.gemm_size_prefill_rows`).

The GEMM sweep (`ceilings.measure_gemm`) times one weight shape; a model's decode runs its
projections at other sizes, and a CPU's GEMM kernels stream a small weight at a different speed than a
large one (on an AVX2-only CPU oneDNN's packed GEMM streamed 1024-wide weights at ~25 GB/s while on the
sweep's 4096 x 8192 it ran slower than the GEMV). Here the engine's own GEMM path
(`llmperf.engine.ops.ops_for`, oneDNN packing included) is timed on each of `Settings.gemm_sizes`
(N x K weights, a wide-and-short lm_head-like one among them) at the rows of `gemm_size_rows_for`, the
calls cycling through copies of W that fill the calibration's working set (`ceilings.working_set_for`)
so that every call streams from DRAM, as in a model's step. `fit.fit_gemm_e_memory` turns the points
into the time model's `gemm_e_memory` (`llmperf.specs.efficiency.GemmBytesCurves`). A dtype's decode
rows stop before a point predicted to take them past their budget (`ceilings.sweep_fits`); a prefill
point past its own budget is skipped; both noted. Before each decode-rows point the copies are read
once more (`_Held.read_bytes_per_s`): a shared host's DRAM speed moves by up to 1.6x within a
calibration, and the fit reads each point against its own moment's read. How the time model reads
them: docs/time-models.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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
from llmperf.measure.timers import read_bytes_per_s


def gemm_size_rows_for(s: Settings, dname: str, device: Any) -> tuple[int, ...]:
    """`s.gemm_size_rows` and both sides of each edge between the engine's GEMM paths up to their
    largest (`engine.paths.gemm_path_edges`), so that a rows curve steps where the kernel changes."""
    if not s.gemm_size_rows:
        return ()
    top = max(s.gemm_size_rows)
    return tuple(sorted(set(s.gemm_size_rows) | {r for r in _gemm_path_edges(dname, device) if r <= top}))


def gemm_size_shapes(s: Settings, dname: str, device: Any) -> list[tuple[int, int, int]]:
    """The (N, K, rows) points of `dname`'s decode-rows sweep, in the order they are timed: weights from
    the smallest, each at every row count (a stopped sweep loses its largest weights, never a row count)."""
    rows = gemm_size_rows_for(s, dname, device)
    return [(n, k, r) for n, k in sorted(s.gemm_sizes, key=lambda nk: nk[0] * nk[1]) for r in rows]


def gemm_size_prefill_shapes(s: Settings) -> list[tuple[int, int, int]]:
    """The (N, K, rows) points of the prefill-rows sweep, in the order they are timed: weights from the
    smallest, each at `s.gemm_size_prefill_rows` ascending (a point past the budget is skipped, so the
    largest weights lose their largest rows first)."""
    return [(n, k, r) for n, k in sorted(s.gemm_sizes, key=lambda nk: nk[0] * nk[1])
            for r in sorted(set(s.gemm_size_prefill_rows))]


READ_PROBE_REPS = 3  # reads of a weight's copies before each decode-rows point (about 10 ms each at 512 MiB)


class _Held:
    """The cold copies of one (N, K) weight in turn, built when a point first needs them."""

    def __init__(self, dtype: Any, device: Any, working_set: int) -> None:
        self.dtype, self.device, self.working_set = dtype, device, working_set
        self.nk: tuple[int, int] | None = None
        self.weights: _Weights | None = None

    def fn(self, n: int, k: int, rows: int, w_bytes: int) -> tuple[Any, int]:
        if self.nk != (n, k):
            self.weights = None  # free the last shape's copies first
            self.weights = _Weights(k, n, self.dtype, self.device, copies_for(w_bytes, self.working_set))
            self.nk = (n, k)
        assert self.weights is not None
        return self.weights.fn(rows), len(self.weights.ws)

    def read_bytes_per_s(self) -> float:
        """Bytes/s of a read of every copy of the held weight (`timers.read_bytes_per_s`, the probe
        `profile` takes too): how fast the host streams these very buffers now."""
        assert self.weights is not None
        return read_bytes_per_s(self.weights.ws, self.device, reps=READ_PROBE_REPS, warmup=1)


def measure_gemm_sizes(s: Settings, device: Any, progress: Progress, dtypes: Sequence[str],
                       notes: list[str]) -> list[tuple[int, ComputePoint]]:
    """Per dtype of `dtypes`, (weight bytes, point) for each (N, K, rows) of `gemm_size_shapes`, then of
    `gemm_size_prefill_shapes`: the typical call of `x (rows, K) @ W (N, K).T` through the engine's
    GEMM, over copies of W used in turn. The decode rows stream the weight (a point's time is predicted
    from the last by its weight's bytes; the sweep stops before one past its budget); the prefill rows
    compute (predicted by FLOPs; a point past its own budget is skipped, the smaller ones after it
    still measured)."""
    import torch

    out: list[tuple[int, ComputePoint]] = []
    working_set = working_set_for(s, device)
    for dname in dtypes:
        dtype = getattr(torch, DTYPE_NAMES[dname])
        elem = torch.empty((), dtype=dtype).element_size()
        held = _Held(dtype, device, working_set)
        # decode rows: a point's time grows about with its weight's bytes (streamed; the rows add little)
        last = _phase(out, held, s, device, progress, notes, dname, elem, gemm_size_shapes(s, dname, device),
                      sweep_budget_s(s, dname, device, s.gemm_size_budget_s), lambda n, k, r: elem * n * k, None,
                      decode=True)
        # prefill rows: by FLOPs; the first predicted from the decode sweep's last point (memory-bound:
        # pessimistic), its bytes turned into the FLOPs of its rows
        first = (2.0 * out[-1][1].rows * last[0] / elem, last[1]) if last else None
        _phase(out, held, s, device, progress, notes, dname, elem, gemm_size_prefill_shapes(s),
               sweep_budget_s(s, dname, device, s.gemm_size_prefill_budget_s), lambda n, k, r: 2.0 * r * n * k,
               first, decode=False)
        del held
    return out


def _phase(out: list[tuple[int, ComputePoint]], held: _Held, s: Settings, device: Any, progress: Progress,
           notes: list[str], dname: str, elem: int, shapes: Sequence[tuple[int, int, int]], budget: float,
           work: Callable[[int, int, int], float], last: tuple[float, float] | None, *,
           decode: bool) -> tuple[float, float] | None:
    """Time `shapes` in turn within `budget` seconds, each point predicted from the last by its `work`
    (`last`: (work, seconds) of the point before); a point past the budget stops the decode rows and
    is skipped among the prefill rows, noted either way. The (work, seconds) of its last point."""
    spent = 0.0
    for n, k, rows in shapes:
        units = work(n, k, rows)
        next_s = last[1] * units / last[0] if last else 0.0
        if last and not sweep_fits(spent, next_s, budget):
            notes.append(f"gemm sizes {dname}: {'stopped before' if decode else 'skipped'} {n}x{k} rows={rows} "
                         f"(predicted {next_s:.2g} s; {spent:.1f} s spent of {budget:g} s)")
            if decode:
                break
            continue
        took = _point(out, held, s, device, progress, notes, dname, elem, n, k, rows, reps_at_least_copies=decode)
        if took is None:
            break
        spent += took
        last = (units, took)
    return last


def _point(out: list[tuple[int, ComputePoint]], held: _Held, s: Settings, device: Any, progress: Progress,
           notes: list[str], dname: str, elem: int, n: int, k: int, rows: int, *,
           reps_at_least_copies: bool) -> float | None:
    """Time one (N, K, rows) point into `out`; the seconds it took, or None where the dtype cannot run
    here (noted). A decode-rows point calls every copy at least once (`reps_at_least_copies`); a
    prefill-rows one `s.reps` times (each call still on a copy not used since it was packed)."""
    progress(f"gemm size {dname} {n}x{k} rows={rows}")
    started = time.perf_counter()
    try:
        fn, copies = held.fn(n, k, rows, elem * n * k)
        reps, warmup = (max(s.reps, copies), copies) if reps_at_least_copies else (s.reps, 1)
        read = held.read_bytes_per_s() if reps_at_least_copies else 0.0
        t = _time_steady(fn, device, reps=reps, warmup=warmup, notes=notes,
                         what=f"gemm size {dname} {n}x{k} rows={rows}")
    except RuntimeError as exc:  # a dtype this device or build cannot multiply
        notes.append(f"gemm sizes {dname}: not measured ({str(exc).splitlines()[0]})")
        return None
    del fn
    out.append((elem * n * k, ComputePoint(
        op="matmul", dtype=dname, rows=rows,
        shape=f"({rows},{k})@({k},{n})" + (f" x{copies} in turn" if copies > 1 else ""),
        seconds=t.min_s, median_s=t.median_s, spread_s=t.spread_s, n=t.n, flops=2.0 * rows * k * n,
        bytes=float(elem * (k * n + rows * k + rows * n)), read_bytes_per_s=read)))
    return time.perf_counter() - started
