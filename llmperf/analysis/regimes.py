"""Where the regime changes: the ridge point, the batch at which decode turns compute-bound, and the
context at which attention stops being negligible next to the rest of the layer.

Decode at batch 1 reads every weight to do 2 FLOPs per weight (about 1 FLOP/B at fp16), far below an
A100's ridge of 153 FLOP/B, so batching up to roughly the ridge point is nearly free ("LLM inference
is memory-bound"). Attention's cost grows with the context (decode: KV bytes; prefill: FLOPs
quadratic in the prompt), so at long context it dominates the layer. Decode attention itself is
memory-bound for grouped-query attention (about 2 x group / bytes FLOP/B), but multi-head latent
attention's absorbed form shares one latent among all heads: DeepSeek-V3 reaches 2 x 128 x 1088 /
(576 x 2) = 242 FLOP/B on one GPU (bf16), so `attention_critical_context` (the decode context from
which the step's attention is compute-bound) exists on devices whose ridge point is below that, and
grows or vanishes with tensor parallelism, which divides the heads and not the latent (with
`dp_attention` every GPU keeps all heads, and the one-GPU intensity). It hardly depends on the batch:
every sequence reads its own latents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.roofline import TimeModel
from llmperf.specs import HardwareSpec

if TYPE_CHECKING:
    import pandas as pd

_SEARCH_MAX = 1 << 26  # no answer up to 67M: report None


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
    """Where a model on a device changes regime: the ridge point, the critical decode batches and the context
    lengths where attention takes over."""

    compute_dtype: str
    ridge_point: float  # FLOP/B
    critical_batch_matmul: int | None  # decode batch at which the linear layers turn compute-bound
    critical_batch: int | None  # decode batch at which the whole step (at this context) turns compute-bound
    attention_flops_crossover: int | None  # prefill length where attention FLOPs = the rest of the layer's
    attention_bytes_crossover: int | None  # decode context where attention bytes = the rest of the layer's
    attention_critical_context: int | None = None  # decode context from which attention is compute-bound

    def to_frame(self) -> pd.DataFrame:
        """`summary()` as a one-row DataFrame."""
        import pandas as pd

        return pd.DataFrame([self.summary()])

    def summary(self) -> dict[str, object]:
        """The thresholds as a dict, under the schema's column names (`None`: never reached)."""
        return dict(compute_dtype=self.compute_dtype, ridge_point=self.ridge_point,
                    critical_batch_matmul=self.critical_batch_matmul, critical_batch=self.critical_batch,
                    attention_flops_crossover=self.attention_flops_crossover,
                    attention_bytes_crossover=self.attention_bytes_crossover,
                    attention_critical_context=self.attention_critical_context)


def estimate_regimes(fm: ForwardModel, hw: HardwareSpec, *, batch: int, context: int,
                     compute_dtype: str, time_model: TimeModel | None = None) -> RegimeEstimate:
    """The regime thresholds of one configuration (the roll-up's vectorised searches, one row)."""
    from llmperf.analysis.rollup import regime_arrays
    r = regime_arrays(fm, hw, compute_dtype, time_model, batch=batch, context=context, size=1)
    as_int = {k: (None if np.isnan(v[0]) else int(v[0])) for k, v in r.items()}
    return RegimeEstimate(compute_dtype=compute_dtype, ridge_point=hw.ridge_point(compute_dtype), **as_int)
