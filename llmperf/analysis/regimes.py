"""Where the regime changes: the ridge point, the batch at which decode turns compute-bound, and the
context at which attention stops being negligible next to the rest of the layer.

Decode at batch 1 reads every weight to do 2 FLOPs per weight (about 1 FLOP/B at fp16), far below an
A100's ridge of 153 FLOP/B, so batching up to roughly the ridge point is nearly free ("LLM inference
is memory-bound"). Attention's cost grows with the context (decode: KV bytes; prefill: FLOPs
quadratic in the prompt), so at long context it dominates the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.roofline import op_time
from llmperf.specs import HardwareSpec

_SEARCH_MAX = 1 << 26  # no answer up to 67M: report None
_ATTENTION_OPS = ("attention", "attn_score", "attn_softmax", "attn_value", "kv_write")


def first_true(pred: Callable[[int], bool], lo: int = 1, hi: int = _SEARCH_MAX) -> int | None:
    """Smallest integer n in [lo, hi] with pred(n) True, for a pred that stays True once True."""
    if not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True, kw_only=True)
class RegimeEstimate:
    compute_dtype: str
    ridge_point: float  # FLOP/B
    critical_batch_matmul: int | None  # decode batch at which the linear layers turn compute-bound
    critical_batch: int | None  # decode batch at which the whole step (at this context) turns compute-bound
    attention_flops_crossover: int | None  # prefill length where attention FLOPs = the rest of the layer's
    attention_bytes_crossover: int | None  # decode context where attention bytes = the rest of the layer's

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.summary()])

    def summary(self) -> dict[str, object]:
        return dict(compute_dtype=self.compute_dtype, ridge_point=self.ridge_point,
                    critical_batch_matmul=self.critical_batch_matmul, critical_batch=self.critical_batch,
                    attention_flops_crossover=self.attention_flops_crossover,
                    attention_bytes_crossover=self.attention_bytes_crossover)


def _compute_bound(fm: ForwardModel, hw: HardwareSpec, dtype: str, batch: int, kv_len: int,
                   only_matmul: bool) -> bool:
    ops = fm.forward_ops(batch, 1, kv_len)
    if only_matmul:
        ops = [o for o in ops if o.kind == "matmul"]
    times = [op_time(o, hw, dtype) for o in ops]
    return sum(t.compute_s for t in times) >= sum(t.memory_s for t in times)


def _split(fm: ForwardModel, batch: int, q_len: int, kv_len: int, field: str) -> tuple[float, float]:
    """(attention, rest of the layer) totals of `field` over one layer's operators."""
    attn = rest = 0.0
    for op in fm.layer_ops(batch, q_len, kv_len):
        value = float(getattr(op, field))
        if op.name in _ATTENTION_OPS:
            attn += value
        else:
            rest += value
    return attn, rest


def estimate_regimes(fm: ForwardModel, hw: HardwareSpec, *, batch: int, context: int,
                     compute_dtype: str) -> RegimeEstimate:
    def flops_cross(n: int) -> bool:
        attn, rest = _split(fm, 1, n, n, "flops")
        return attn >= rest

    def bytes_cross(n: int) -> bool:
        attn, rest = _split(fm, batch, 1, n, "bytes_total")
        return attn >= rest

    return RegimeEstimate(
        compute_dtype=compute_dtype, ridge_point=hw.ridge_point(compute_dtype),
        critical_batch_matmul=first_true(lambda b: _compute_bound(fm, hw, compute_dtype, b, context, True)),
        critical_batch=first_true(lambda b: _compute_bound(fm, hw, compute_dtype, b, context, False)),
        attention_flops_crossover=first_true(flops_cross),
        attention_bytes_crossover=first_true(bytes_cross))
