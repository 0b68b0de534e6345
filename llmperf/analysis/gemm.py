"""The time of a GEMM from its shape, its element sizes and the device's datasheet (`gemm_time_s`,
`gemm_efficiency`; the fitted terms in `GemmParams`).

A weight GEMM `C(M, N) = A(M, K) @ W(K, N)` (`groups` independent GEMMs of the same N, K, e.g. the
experts a step touches on one GPU) runs as a grid of output tiles `tm x tn` (optionally split `s`
ways along K), dealt to the device's `num_sms` streaming multiprocessors in waves (NVIDIA, "Matrix
Multiplication Background User's Guide": tile and wave quantisation; Kerr et al., CUTLASS, split-K).
Per tile configuration `(tm, tn, s)`, with `a` and `w` the activation and weight element sizes:

    tiles   = groups * ceil(M / tm) * ceil(N / tn) * s
    waves   = ceil(tiles / num_sms)
    tile    = max(2 tm tn, feed_flop_per_byte (tm a + tn w)) K/s / (peak / num_sms * e_peak)
    stream  = (groups N K w + M groups K a + M groups N a [+ split-K's fp32 partials])
              / (bandwidth * e_memory)                                    # HBM, every byte once
    time    = latency_s + max(waves * tile, stream)

and the GEMM takes the best configuration of `TILES` x `SPLITS`, as cuBLAS's heuristics pick a kernel
per shape. The four fitted terms (`e_peak`, `e_memory`, `latency_s`, `feed_flop_per_byte`) describe
how well kernels use a GPU, not one GPU, so they price a device known only from its datasheet (peak,
HBM bandwidth, SM count). Fitted by `python -m llmperf.measure.fit_gemm` (`typical.yaml`'s `gemm:`).

Every argument may be a numpy array (broadcast together): a sweep prices its rows in one call. The time
depends on the shape only, so a decode step's GEMMs are flat in the context. What each term means:
docs/time-models.md, "GEMMs by shape". Pure numpy (no torch), like the rest of `llmperf.analysis`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmperf.errors import SpecError
from llmperf.specs.efficiency import GEMM_FIELDS, gemm_terms

Number = Any  # float or numpy array

#: output tiles (tm, tn) a cuBLAS-like library chooses among, and the split-K factors
TILES = ((128, 256), (128, 128), (64, 128), (64, 64), (16, 128))
SPLITS = (1, 2, 4, 8, 16)
MIN_SPLIT_K = 256  # a split keeps at least this much of K
PARTIAL_BYTES = 4.0  # split-K's partial sums are fp32, written and read back once each

_TM = np.array([t[0] for t in TILES for _ in SPLITS], dtype=float)
_TN = np.array([t[1] for t in TILES for _ in SPLITS], dtype=float)
_S = np.array([s for _ in TILES for s in SPLITS], dtype=float)


@dataclass(frozen=True, kw_only=True)
class GemmShape:
    """The per-GPU shape of a weight GEMM (the shard tensor or expert parallelism leaves on one GPU):
    `groups` GEMMs of `n` outputs over `k` inputs, each with `rows * m_per_row` rows, `rows` being
    the operator's `OpCost.rows`. A dense projection: groups 1, m_per_row 1. The experts of a MoE
    layer under uniform routing: groups = the experts a step touches on this GPU, m_per_row = 1 /
    groups (each touched expert takes an equal share of the rows routed here). `groups` and
    `m_per_row` may be arrays (one per configuration of a sweep), `n` and `k` are the matrix's."""

    n: int
    k: int
    groups: Number = 1.0
    m_per_row: Number = 1.0

    def __post_init__(self) -> None:
        for name in ("n", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise SpecError(f"GemmShape.{name}: must be a positive integer, got {v!r}")

    def m(self, rows: Number) -> Number:
        """Rows of each group's GEMM for an operator of `rows` rows."""
        return rows * self.m_per_row


@dataclass(frozen=True, kw_only=True)
class GemmParams:
    """The fitted terms of the shape model (module docstring), with where they come from."""

    e_peak: float
    e_memory: float
    latency_s: float
    feed_flop_per_byte: float
    source: str = ""

    FIELDS = GEMM_FIELDS

    @classmethod
    def parse(cls, raw: Any, where: str) -> GemmParams:
        """From a `gemm:` mapping; a bad or missing value raises one line naming the field
        (`llmperf.specs.efficiency.gemm_terms`)."""
        return cls(**gemm_terms(raw, where))

    def to_dict(self) -> dict[str, Any]:
        """The four terms and their source as plain values, as the `gemm:` block of an efficiency file holds them."""
        return dict(e_peak=self.e_peak, e_memory=self.e_memory, latency_s=self.latency_s,
                    feed_flop_per_byte=self.feed_flop_per_byte, source=self.source)


def gemm_time_s(m: Number, n: Number, k: Number, groups: Number = 1.0, *, peak_flops_per_s: float,
                bandwidth_bytes_per_s: float, num_sms: int, params: GemmParams, w_bytes: Number = 2.0,
                a_bytes: Number = 2.0, parts: bool = False) -> Number:
    """Seconds of `groups` GEMMs `(m x k) @ (k x n)` on a device (module docstring): the best tile
    configuration's time. `w_bytes` / `a_bytes`: bytes per weight / activation element (int4 0.5).
    `parts`: that configuration's `(latency + waves * tile, latency + stream)` instead, whose maximum
    is the time (which one wins says whether the GEMM is bound by its tiles' work or by HBM)."""
    m, n, k, g, w, a = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k, groups, w_bytes, a_bytes)))
    if (m.size > 16 and np.ndim(peak_flops_per_s) == 0 and np.ndim(bandwidth_bytes_per_s) == 0
            and all(x.min() == x.max() for x in (n, k, g, w, a))):
        # a sweep's rows repeat a few row counts of one matrix: price each distinct one once
        um, inverse = np.unique(m, return_inverse=True)
        if len(um) < 0.5 * m.size:
            res = gemm_time_s(um, n.flat[0], k.flat[0], g.flat[0], peak_flops_per_s=peak_flops_per_s,
                              bandwidth_bytes_per_s=bandwidth_bytes_per_s, num_sms=num_sms, params=params,
                              w_bytes=w.flat[0], a_bytes=a.flat[0], parts=parts)
            inverse = inverse.reshape(m.shape)
            return tuple(r[inverse] for r in res) if parts else res[inverse]
    scalar = m.ndim == 0
    shape = (-1,) + (1,) * m.ndim
    tm, tn, s = _TM.reshape(shape), _TN.reshape(shape), _S.reshape(shape)
    ks = np.ceil(k / s)
    sms = float(num_sms)
    tiles = g * np.ceil(m / tm) * np.ceil(n / tn) * s
    waves = np.ceil(tiles / sms)
    sm_flops = peak_flops_per_s / sms * params.e_peak
    # a tile's mainloop runs at the SM's matrix rate unless its operands (tm a + tn w bytes per k)
    # cannot feed it: below `feed_flop_per_byte` FLOP per operand byte the rate falls in proportion
    tile = np.maximum(2.0 * tm * tn, params.feed_flop_per_byte * (tm * a + tn * w)) * ks / sm_flops
    partial = np.where(s > 1, 2.0 * s * m * g * n * PARTIAL_BYTES, 0.0)
    stream = (g * n * k * w + m * g * (k + n) * a + partial) / (bandwidth_bytes_per_s * params.e_memory)
    work = waves * tile
    # split-K only where the unsplit tiles leave SMs idle (as cuBLAS's heuristics use it), each split
    # keeping at least MIN_SPLIT_K of K
    t = np.where((s > 1) & ((ks < MIN_SPLIT_K) | (tiles >= sms * s)), np.inf, np.maximum(work, stream))
    if not parts:
        out = np.where(m > 0, params.latency_s + t.min(axis=0), 0.0)  # no rows, no kernel
        return float(out) if scalar else out
    best = np.argmin(t, axis=0)[None]
    work = np.where(m > 0, params.latency_s + np.take_along_axis(np.broadcast_to(work, t.shape), best, 0)[0], 0.0)
    stream = np.where(m > 0, params.latency_s + np.take_along_axis(np.broadcast_to(stream, t.shape), best, 0)[0], 0.0)
    return (float(work), float(stream)) if scalar else (work, stream)


def gemm_time_for(shape: GemmShape, rows: Number, *, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                  num_sms: int, params: GemmParams, w_bytes: Number = 2.0, a_bytes: Number = 2.0,
                  parts: bool = False) -> Number:
    """`gemm_time_s` of an operator's `shape` at `rows` (`OpCost.rows`)."""
    return gemm_time_s(shape.m(rows), shape.n, shape.k, shape.groups, peak_flops_per_s=peak_flops_per_s,
                       bandwidth_bytes_per_s=bandwidth_bytes_per_s, num_sms=num_sms, params=params,
                       w_bytes=w_bytes, a_bytes=a_bytes, parts=parts)
