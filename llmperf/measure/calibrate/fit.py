"""Fitting the calibrated time model's efficiency curves on the calibration's points.

For each measured GEMM / attention point, with `t' = t - overhead`:
`e_compute(rows) = min(1, flops / (peak * t'))` and `e_memory(rows) = min(1, max(e_gemv,
bytes / (bw * t')))`, so the model (`llmperf.analysis.timemodel`) reproduces every calibration point
and interpolates in log(rows) between them. A vector operator's memory efficiency is a curve over
the bytes one call moves (`fit_op_e_memory`); on a CPU a weight GEMM's is a curve over its weight's bytes
per row count (`fit_gemm_e_memory`); on a CPU decode attention's cost per byte is a line in its query-head
group (`fit_decode_groups`). Figures are rounded to 4 significant figures for the YAML.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from llmperf.measure.calibrate.points import ComputePoint

MEMORY_BOUND_SHARE = 0.8  # a point whose memory time explains this share of its time is memory-bound


def fit_curves(pts: Sequence[ComputePoint], peak: float, bw: float, overhead: float) -> dict[str, Any]:
    """`e_compute(rows)`, `e_memory(rows)` that reproduce every point `t = max(c / e_c, m / e_m) + overhead`.

    `e_mem0`, the smallest-rows point's bytes / (bw t'), is the streaming efficiency (a GEMV's). A point
    whose memory time at `e_mem0` explains most of its time is memory-bound: its `e_memory` is its own
    bytes / (bw t') and its `e_compute` is only bounded below (compute must not exceed t'), so it takes
    the first compute-bound point's value when that is higher: interpolating a memory-bound point's
    `flops / (peak t')` to more rows would wrongly make those rows compute-bound. A compute-bound point
    gets `e_compute = flops / (peak t')` and `e_memory = e_mem0`. A point marked `memory_bound` (a decode
    attention call: its time is its KV stream, however slow) is memory-bound whatever its time. All
    values are clipped to (0, 1].
    With t' = t - overhead, t the point's typical (median) call (at least half of t: the overhead never
    explains a whole call)."""
    by_rows: dict[int, list[ComputePoint]] = {}
    for p in pts:
        by_rows.setdefault(p.rows, []).append(p)
    rows = sorted(by_rows)

    def t_prime(p: ComputePoint) -> float:
        return _t_prime(p, overhead)

    first = by_rows[rows[0]][0]
    e_mem0 = min(1.0, first.bytes / (bw * t_prime(first)))
    ec_floor: dict[int, float] = {}
    em: dict[int, float] = {}
    memory_bound: dict[int, bool] = {}
    for r in rows:
        ps = by_rows[r]
        ec_floor[r] = min(1.0, max(p.flops / (peak * t_prime(p)) for p in ps))
        em[r] = min(1.0, max(e_mem0, max(p.bytes / (bw * t_prime(p)) for p in ps)))
        memory_bound[r] = all(p.memory_bound or p.bytes / (bw * e_mem0) >= MEMORY_BOUND_SHARE * t_prime(p)
                              for p in ps)
    compute_rows = [r for r in rows if not memory_bound[r]]
    ec = {}
    for r in rows:
        if memory_bound[r]:
            later = [ec_floor[c] for c in compute_rows if c > r]
            ec[r] = max(ec_floor[r], later[0]) if later else 1.0
            em[r] = min(1.0, max(p.bytes / (bw * t_prime(p)) for p in by_rows[r]))
        else:
            ec[r] = ec_floor[r]
            em[r] = e_mem0
    return dict(e_compute=[[r, _clean(max(ec[r], 1e-6))] for r in rows],
                e_memory=[[r, _clean(max(em[r], 1e-6))] for r in rows], overhead_s=_clean(overhead))


def fit_decode_groups(pts: Sequence[ComputePoint], overhead: float) -> dict[str, Any] | None:
    """The additive decode-attention model `seconds per byte = a + c G` of one dtype, from its decode
    points (`memory_bound`, `group` >= 1) timed at two or more groups G over the same KV cache: each
    point's `t' / bytes` (t' as `fit_curves`), fitted by least squares over every point, equally
    weighted. Least squares rather than the median of the exact solution at each (batch, context):
    it takes any number of groups (with two it is the line through the groups' mean costs, which with
    two decode shapes is what the median of the per-point solutions gives too) and needs no pairing.
    A negative slope (a byte no dearer at a larger group: noise) is taken as 0 and `a` is then the mean
    cost; a negative intercept as 0 and `c` the least-squares slope through the origin, so every group
    gets a positive cost. None with fewer than two groups.

    Why additive: on a 2-core AVX-512 EPYC, fp32, 4096 keys, the engine's decode attention read the
    cache at 28-37 GB/s at G = 1, 25-27 at G = 4, 17-19 at G = 8 while its FLOP rate rose 14 -> 78
    GFLOP/s: neither roof of `max(compute, memory)` fits every group. Fitted on G = 1 and 4, `a + c G`
    priced the held-out G = 8 within 0-9% at head dim 128 (the attention curves alone: 22-28% fast,
    G = 1 31-53% slow; reports/streaming/README.md, "2026-11-27-cpu-group"). Returns
    `{s_per_byte: a, s_per_byte_per_group: c, groups: [the groups fitted]}`."""
    dec = [p for p in pts if p.memory_bound and p.group >= 1 and p.bytes > 0]
    groups = sorted({p.group for p in dec})
    if len(groups) < 2:
        return None
    g = [float(p.group) for p in dec]
    y = [_t_prime(p, overhead) / p.bytes for p in dec]
    g_mean, y_mean = statistics.fmean(g), statistics.fmean(y)
    c = sum((gi - g_mean) * (yi - y_mean) for gi, yi in zip(g, y)) / sum((gi - g_mean) ** 2 for gi in g)
    a = y_mean - c * g_mean
    if c < 0:
        a, c = y_mean, 0.0
    elif a < 0:
        a, c = 0.0, sum(gi * yi for gi, yi in zip(g, y)) / sum(gi * gi for gi in g)
    return dict(s_per_byte=_clean(a), s_per_byte_per_group=_clean(c), groups=groups)


def _t_prime(p: ComputePoint, overhead: float) -> float:
    """The typical call less the overhead (at least half the call: the overhead never explains it all)."""
    return max(p.typical_s - overhead, 0.5 * p.typical_s)


def fit_gemm_e_memory(points: Sequence[tuple[float, ComputePoint]], bw: float, overhead: float
                      ) -> dict[int, list[list[float]]]:
    """`{rows: [[weight bytes, e_memory], ...]}` from (weight bytes, point) pairs of one dtype: each
    point's `e = weight bytes / (bw t')` (t' as `fit_curves`), its whole call read as a stream of its
    weight alone (efficiency schema 7: a GEMM of the same rows and weight bytes has the same FLOPs
    whatever its N x K, so a skinny router is not priced by a square weight's activation bytes),
    clipped to (1e-6, 1]; one point per (rows, weight bytes), the best.

    A point probed with a read of its own weight copies just before it (`read_bytes_per_s`) is read
    against that read instead of `bw`, which a shared host may have measured in another of its DRAM
    speeds, then scaled by the probes' median over `bw` (at most 1): `e = weight bytes / (read t') x
    min(1, median read / bw)`. So each point is its GEMM's share of what the host streamed at that
    moment, and the curve prices at the host's typical speed."""
    probed = [p.read_bytes_per_s for _, p in points if p.read_bytes_per_s > 0]
    scale = min(1.0, statistics.median(probed) / bw) if probed else 1.0
    best: dict[int, dict[int, float]] = {}
    for w_bytes, p in points:
        ref = p.read_bytes_per_s / scale if p.read_bytes_per_s > 0 else bw
        e = min(1.0, max(w_bytes / (ref * _t_prime(p, overhead)), 1e-6))
        per = best.setdefault(int(p.rows), {})
        per[int(w_bytes)] = max(per.get(int(w_bytes), 0.0), e)
    return {r: [[b, _clean(per[b])] for b in sorted(per)] for r, per in sorted(best.items())}


def _clean(x: float) -> float:
    """Round to 4 significant figures for a readable YAML (the spreads are far wider)."""
    x = float(x)
    return float(f"{x:.4g}") if math.isfinite(x) and x != 0 else x


def _clean_ops(per_backend: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{backend: {operator: seconds}} with every figure `_clean`ed, for the YAML."""
    return {b: {op: _clean(v) for op, v in ops.items()} for b, ops in per_backend.items()}


def fit_op_e_memory(samples: dict[str, list[tuple[float, float]]], bw: float, overheads: dict[str, float]
                    ) -> dict[str, list[list[float]]]:
    """Per operator, `[[bytes, e_memory], ...]` from (bytes of one call, typical seconds) samples:
    `e = bytes / (bw (t - overhead))`, 1 where the memory roof at full bandwidth explains the call
    (a call no slower than its dispatch), clipped to (1e-4, 1]; one point per byte count (the best)."""
    out: dict[str, list[list[float]]] = {}
    for op, pts in samples.items():
        best: dict[int, float] = {}
        for nbytes, seconds in pts:
            if nbytes <= 0:
                continue
            t = seconds - overheads.get(op, 0.0)
            e = 1.0 if t <= nbytes / bw else max(nbytes / (bw * t), 1e-4)
            key = max(1, int(nbytes))
            best[key] = max(best.get(key, 0.0), e)
        if best:
            out[op] = [[b, best[b]] for b in sorted(best)]
    return out
