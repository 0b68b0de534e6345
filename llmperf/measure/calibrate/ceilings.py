"""The device's ceilings: streaming bandwidth and the GEMM sweep per dtype.

- streaming `read` (a sum) and `copy` bandwidth over buffer sizes that reveal the caches (bytes moved
  = read + written, decimal GB/s), and an elementwise `add` on the largest buffer;
- the engine's GEMM curve per dtype, `x (rows, K) @ W (K, N)` through the engine's GEMM
  (`llmperf.engine.ops.ops_for`), over rows = 1 .. R and both sides of each edge between the
  engine's GEMM paths: rows = 1 is a GEMV, the matrix-vector bandwidth decode really gets;
- the device's GEMM ceilings in plain torch (`torch.nn.functional.linear`, as any torch model's
  `nn.Linear`): the GEMV and the sweep's largest rows, where the engine's GEMM is not plain torch's
  (a CPU in fp32 or bf16); elsewhere the sweep is plain torch and is the ceiling. A dtype's peak is
  the better of the two, so every efficiency stays in (0, 1] and the roofline stays a bound.
On CPU the calls cycle through copies of W that together fill twice the largest cache reported (at
least 512 MiB, `working_set_for`), so every call streams from DRAM as in a real model's step.

The method is an empirical roofline toolkit's (Berkeley ERT, Intel Advisor, Nsight Compute's
roofline; see REFERENCE.md). Timers: `llmperf.measure.timers` (CUDA events via
`triton.testing.do_bench` on GPU; a warmed-up `perf_counter` on CPU, threads recorded). A sweep's
work is sized from what it measured first (`sweep_fits`), so a slow machine or dtype measures fewer
points instead of running for minutes; every stop is noted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from llmperf.measure.calibrate.points import ComputePoint, StreamPoint
from llmperf.measure.calibrate.settings import DTYPE_NAMES, MiB, Progress, Settings
from llmperf.measure.timers import pooled, time_fn


def measure_streams(s: Settings, device: Any, progress: Progress) -> list[StreamPoint]:
    import torch

    out = []
    for size in s.stream_sizes:
        progress(f"stream {size / MiB:g} MiB")
        n = max(size // 4, 1)
        src = torch.rand(n, device=device)
        dst = torch.empty_like(src)
        for kind, fn, moved in (("read", lambda: src.sum(), 4 * n), ("copy", lambda: dst.copy_(src), 8 * n)):
            t = time_fn(fn, device, reps=s.reps, min_time_s=0.05)
            out.append(StreamPoint(kind=kind, size_bytes=4 * n, bytes_moved=moved, seconds=t.min_s,
                                   spread_s=t.spread_s, n=t.n))
        if size == max(s.stream_sizes):
            t = time_fn(lambda: dst.add_(src), device, reps=s.reps, min_time_s=0.02)  # reads 2, writes 1
            out.append(StreamPoint(kind="add", size_bytes=4 * n, bytes_moved=12 * n, seconds=t.min_s,
                                   spread_s=t.spread_s, n=t.n))
    return out


WORKING_SET_MIN = 512 * MiB  # CPU: at least this much in turn, whatever the caches report


def working_set_for(s: Settings, device: Any) -> int:
    """The bytes a CPU micro-benchmark's large operand cycles through: `s.working_set_bytes` if set,
    else twice the largest cache the CPU reports, and at least `WORKING_SET_MIN`, at most an eighth of
    the memory. Measured here: a (1, 4096) x (4096, 8192) bf16 GEMV (67 MB of weights) ran at
    49 GB/s back to back and 25 GB/s cycling through twelve copies; the engine's decode GEMVs stream
    at 18-25 GB/s (a shared last-level cache of hundreds of MB held the single copy). On CUDA
    `do_bench` already flushes the L2 before every call: 0."""
    if s.working_set_bytes is not None:
        return max(0, int(s.working_set_bytes))
    if getattr(device, "type", str(device)) != "cpu":
        return 0
    from llmperf.measure.device import _total_memory_bytes, cpu_caches

    caches = cpu_caches()
    target = max(WORKING_SET_MIN, 2 * max(caches.values(), default=0))
    memory = _total_memory_bytes()
    return min(target, memory // 8) if memory else target


def copies_for(one_bytes: int, working_set: int, limit: int = 64) -> int:
    """How many copies of an operand of `one_bytes` fill `working_set` (1 .. `limit`)."""
    if working_set <= one_bytes or one_bytes <= 0:
        return 1
    return min(limit, math.ceil(working_set / one_bytes))


def _in_turn(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    """One call of the next function of `fns`, round robin."""
    if len(fns) == 1:
        return fns[0]
    state = [0]

    def call() -> Any:
        i = state[0]
        state[0] = (i + 1) % len(fns)
        return fns[i]()
    return call


class _Weights:
    """The engine's `x @ W` for one dtype and device, over `copies` weight matrices used in turn (its
    weight layout and, where it packs weights for oneDNN, the packed GEMM of
    `llmperf.engine.ops.ops_for`, packed before timing); with `plain`, torch's own
    `torch.nn.functional.linear` over the same (out, in) weights instead. The copies are clones of one
    random matrix: distinct buffers, which is all that streaming them cold needs, at a copy's cost."""

    def __init__(self, k: int, n: int, dtype: Any, device: Any, copies: int, *, plain: bool = False) -> None:
        import torch

        from llmperf.engine.ops import ops_for

        self.k, self.dtype, self.device = k, dtype, device
        in_out = False  # the engine stores (out, in) on every device
        first = torch.randn((k, n) if in_out else (n, k), device=device, dtype=dtype)
        self.ws = [first] + [first.clone() for _ in range(copies - 1)]
        self.linear = torch.nn.functional.linear if plain else ops_for(device, dtype).linear

    def fn(self, rows: int) -> Callable[[], Any]:
        import torch

        x = torch.randn(rows, self.k, device=self.device, dtype=self.dtype)
        for w in self.ws:
            self.linear(x, w)  # packs now (once per weight), outside the timing
        return _in_turn([lambda w=w: self.linear(x, w) for w in self.ws])


ROUND_BELOW_S = 0.02  # CPU GEMM calls faster than this (the memory-bound rows) are timed in rounds
DISTURBED = 1.5  # a point whose median call is this much slower than its fastest was disturbed
RETRIES = 2


def _time_steady(fn: Callable[[], Any], device: Any, *, reps: int, warmup: int, notes: list[str], what: str) -> Any:
    """`time_fn`, timed again (up to `RETRIES` times, the steadiest kept) while the median call is over
    `DISTURBED` x the fastest: on a shared machine one burst of another job's work can land on half the
    calls of a point (a bf16 GEMM at 256 rows: median 21.6 ms, fastest 9.6 ms; timed again, 10.4 ms),
    and the fit reads medians."""
    t = time_fn(fn, device, reps=reps, warmup=warmup)
    for _ in range(RETRIES):
        if t.median_s <= DISTURBED * t.min_s:
            break
        again = time_fn(fn, device, reps=reps, warmup=warmup)
        notes.append(f"{what}: timed again (median {t.median_s * 1e3:.3g} ms, fastest {t.min_s * 1e3:.3g} ms; "
                     f"then {again.median_s * 1e3:.3g} ms)")
        t = min(t, again, key=lambda x: x.median_s / x.min_s)
    return t


def _gemm_path_edges(dname: str, device: Any) -> tuple[int, ...]:
    """`engine.paths.gemm_path_edges` for the dtype named `dname`."""
    import torch

    from llmperf.engine.paths import gemm_path_edges

    return gemm_path_edges(getattr(torch, DTYPE_NAMES[dname]), device)


def sweep_fits(spent_s: float, next_s: float, budget_s: float, call_s: float = 0.0,
               call_budget_s: float = math.inf) -> bool:
    """Whether a sweep that has taken `spent_s` measures its next point, predicted to take `next_s` in
    all (`call_s` a call) from the point before it: within `budget_s` in all and `call_budget_s` a call.
    A sweep's work is sized from what it measured first, so a slow machine or dtype (bf16 without a
    native kernel) measures fewer points instead of running for minutes; every stop is noted."""
    return spent_s + next_s <= budget_s and call_s <= call_budget_s


def sweep_budget_s(s: Settings, dname: str, device: Any, native_s: float) -> float:
    """A dtype's budget for one sweep: `native_s`, or on CPU `s.emulated_budget_s` where the dtype has
    no native kernel (`engine.paths.native_kernel`)."""
    import torch

    from llmperf.engine.paths import native_kernel

    if getattr(device, "type", str(device)) != "cpu" or native_kernel(getattr(torch, DTYPE_NAMES[dname])):
        return native_s
    return min(native_s, s.emulated_budget_s)


def gemm_sweep_rows(s: Settings, dname: str, device: Any) -> tuple[int, ...]:
    """The rows of `dname`'s GEMM sweep: `s.gemm_rows` and both sides of each edge between the engine's
    GEMM paths inside its range (`engine.paths.gemm_path_edges`; fp32 8 and 9 with llmperf's kernels),
    so that the efficiency curve steps where the engine changes kernel instead of blending two
    kernels' speeds over the rows between sweep points (fp32 rows 9-15 had been priced between the
    own GEMM at 8 and oneDNN's at 16)."""
    return tuple(sorted(set(s.gemm_rows) | {r for r in _gemm_path_edges(dname, device) if r < max(s.gemm_rows)}))


def measure_gemm(s: Settings, device: Any, progress: Progress) -> tuple[list[ComputePoint], list[str]]:
    """The GEMM sweep per dtype over `gemm_sweep_rows`. On CPU the calls under `ROUND_BELOW_S` (the
    memory-bound rows) are timed in `s.gemm_rounds` interleaved rounds and pooled (`timers.pooled`): this
    machine's DRAM bandwidth drifts by 10% over a minute, and the decode efficiency of `rows` is the
    ratio of its time to the GEMV's, so both must be measured under the same conditions (the fp32
    4-row GEMM measured 23.4, 28.4 and 25.4 GB/s in three calibrations of one afternoon)."""
    import torch

    out, notes = [], []
    k, n = s.gemm_k, s.gemm_n
    working_set = working_set_for(s, device)
    for dname in s.dtypes:
        dtype = getattr(torch, DTYPE_NAMES[dname])
        elem = torch.empty((), dtype=dtype).element_size()
        copies = copies_for(elem * k * n, working_set)
        reps = max(s.reps, copies)
        weights = None
        timed: dict[int, list[Any]] = {}
        again: dict[int, Callable[[], Any]] = {}
        sweep = gemm_sweep_rows(s, dname, device)
        budget = sweep_budget_s(s, dname, device, s.gemm_sweep_budget_s)
        if budget < s.gemm_sweep_budget_s:
            notes.append(f"gemm {dname}: no native kernel on this CPU"
                         + (" (no AVX512_BF16 or AMX)" if dname == "bf16" else "") + ": torch converts every "
                         f"element, about 10x an fp32 GEMM's time; its sweeps stop at {budget:g} s")
        spent, last = 0.0, None  # seconds of this dtype's sweep so far; (rows, median call) of the last point
        for rows in sweep:
            # a compute-bound point (predicted past ROUND_BELOW_S a call) needs no cycling through the copies
            call_s = last[1] * rows / last[0] if last else 0.0
            heavy = call_s >= ROUND_BELOW_S
            n_calls, warmup = (s.reps, 1) if heavy else (reps, copies)
            if last and not sweep_fits(spent, call_s * (n_calls + warmup), budget, call_s, s.gemm_call_budget_s):
                notes.append(f"gemm {dname}: stopped before rows={rows} (predicted {call_s:.2g} s a call from "
                             f"rows={last[0]}; {spent:.1f} s spent of the sweep's {budget:g} s)")
                break
            progress(f"gemm {dname} rows={rows}")
            started = time.perf_counter()
            try:
                if weights is None:
                    weights = _Weights(k, n, dtype, device, copies)
                fn = weights.fn(rows)
                t = _time_steady(fn, device, reps=n_calls, warmup=warmup, notes=notes,
                                 what=f"gemm {dname} rows={rows}")
            except RuntimeError as exc:  # a dtype this device or build cannot multiply
                notes.append(f"gemm {dname}: not measured ({str(exc).splitlines()[0]})")
                break
            spent += time.perf_counter() - started
            last = (rows, t.median_s)
            timed[rows] = [t]
            if device.type == "cpu" and t.median_s < ROUND_BELOW_S:
                again[rows] = fn
            del fn
        for i in range(1, s.gemm_rounds if len(again) > 1 else 1):
            progress(f"gemm {dname} round {i + 1} of {s.gemm_rounds} (rows {', '.join(map(str, again))})")
            for rows, fn in again.items():
                timed[rows].append(time_fn(fn, device, reps=reps, warmup=1))
        for rows, ts in timed.items():
            t = pooled(ts)
            out.append(ComputePoint(op="matmul", dtype=dname, rows=rows,
                                    shape=f"({rows},{k})@({k},{n})" + (f" x{copies} in turn" if copies > 1 else ""),
                                    seconds=t.min_s, median_s=t.median_s, spread_s=t.spread_s, n=t.n,
                                    flops=2.0 * rows * k * n,
                                    bytes=float(elem * (k * n + rows * k + rows * n))))
        del weights, again
    return out, notes


def engine_gemm_is_plain_torch(dname: str, device: Any) -> bool:
    """Whether the engine multiplies `dname` on `device` with plain torch (`engine.ops.TorchOps`): then
    its GEMM sweep is the device's ceiling as it stands."""
    import torch

    from llmperf.engine.ops import TorchOps, ops_for

    return type(ops_for(device, getattr(torch, DTYPE_NAMES[dname]))) is TorchOps


def measure_torch_gemm(s: Settings, device: Any, progress: Progress, sweep: Sequence[ComputePoint]
                       ) -> tuple[list[ComputePoint], list[str]]:
    """The device's GEMM ceilings in plain torch for each dtype of `sweep` (the engine's GEMM points)
    whose engine GEMM is not plain torch's: the GEMV (rows = 1, through as many cold copies as the
    sweep) and the largest rows the sweep reached, with the sweep's weight shape. A point whose first
    call takes longer than `s.gemm_call_budget_s` is not timed further, and noted (bf16 where torch
    converts every element). Elsewhere the sweep's points are the ceilings: noted, nothing timed."""
    import torch

    out, notes = [], []
    k, n = s.gemm_k, s.gemm_n
    working_set = working_set_for(s, device)
    plain = []
    for dname in dict.fromkeys(p.dtype for p in sweep if p.op == "matmul"):
        if engine_gemm_is_plain_torch(dname, device):
            plain.append(dname)
            continue
        dtype = getattr(torch, DTYPE_NAMES[dname])
        elem = torch.empty((), dtype=dtype).element_size()
        copies = copies_for(elem * k * n, working_set)
        largest = max(p.rows for p in sweep if p.op == "matmul" and p.dtype == dname)
        weights = _Weights(k, n, dtype, device, copies, plain=True)
        for rows in sorted({1, largest}):
            progress(f"ceiling {dname} rows={rows} (plain torch)")
            if rows == 1:  # the GEMV streams: cold copies in turn, as the sweep's (a call per copy warms up)
                fn, cycled = weights.fn(1), copies > 1
            else:  # compute-bound: one weight
                x = torch.randn(rows, k, device=device, dtype=dtype)
                fn, cycled = (lambda x=x, w=weights.ws[0], linear=weights.linear: linear(x, w)), False
            started = time.perf_counter()
            fn()
            first_s = time.perf_counter() - started
            if first_s > s.gemm_call_budget_s:
                notes.append(f"ceiling {dname} rows={rows} (plain torch): one call took {first_s:.2g} s, over the "
                             f"{s.gemm_call_budget_s:g} s a call may take; not timed (the engine's sweep stands)")
                continue
            t = _time_steady(fn, device, reps=max(s.reps, copies) if cycled else s.reps, warmup=0, notes=notes,
                             what=f"ceiling {dname} rows={rows} (plain torch)")
            out.append(ComputePoint(op="matmul", dtype=dname, rows=rows,
                                    shape=f"({rows},{k})@({k},{n}) plain torch"
                                          + (f" x{copies} in turn" if cycled else ""),
                                    seconds=t.min_s, median_s=t.median_s, spread_s=t.spread_s, n=t.n,
                                    flops=2.0 * rows * k * n, bytes=float(elem * (k * n + rows * k + rows * n))))
            del fn
        del weights
    if plain:
        notes.append(f"ceilings {', '.join(plain)}: the engine's GEMM on {getattr(device, 'type', device)} is plain "
                     "torch's (torch.nn.functional.linear), so its sweep is the device's ceiling")
    return out, notes
