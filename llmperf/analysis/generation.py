"""A whole generation: prefill of `batch` prompts of `prompt_len` tokens, then `gen_len - 1` decode
steps (the prefill already yields the first token). TTFT is the prefill time; decode step j reads a
context of `prompt_len + j` tokens; TPOT is the mean decode step time.

Every decode operator's compute and memory time is linear in the context, so the sum over steps of
`max(compute, memory)` has a closed form (`sum_max_linear`): a generation of any length, or a sweep
of 10,000 of them, costs a few numpy operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmperf.analysis.memory import MemoryEstimate, estimate_memory
from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.phase import PhaseEstimate, estimate_phase, pipeline_transfer_s
from llmperf.analysis.regimes import RegimeEstimate, estimate_regimes
from llmperf.analysis.roofline import op_time
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model


def _segment_sum(a0, a1, lo, hi):  # noqa: ANN001
    """Sum of `a0 + a1 * x` over integers x in [lo, hi] (zero when empty)."""
    count = np.maximum(hi - lo + 1, 0)
    return count * a0 + a1 * (lo + hi) * count / 2


def sum_max_linear(u0, u1, v0, v1, x_lo, x_hi):  # noqa: ANN001
    """Sum over integers x in [x_lo, x_hi] of `max(u0 + u1 x, v0 + v1 x)`, elementwise on arrays."""
    d0, d1 = np.asarray(u0 - v0, dtype=float), np.asarray(u1 - v1, dtype=float)
    safe = np.where(d1 == 0, 1.0, d1)
    with np.errstate(over="ignore", divide="ignore"):
        xc = -d0 / safe  # where the two lines cross
    # d1 > 0: u wins from ceil(xc) on; d1 < 0: u wins up to floor(xc)
    k_up = np.clip(np.ceil(xc), x_lo, x_hi + 1)
    k_dn = np.clip(np.floor(xc), x_lo - 1, x_hi)
    rising = _segment_sum(v0, v1, x_lo, k_up - 1) + _segment_sum(u0, u1, k_up, x_hi)
    falling = _segment_sum(u0, u1, x_lo, k_dn) + _segment_sum(v0, v1, k_dn + 1, x_hi)
    flat = np.where(d0 >= 0, _segment_sum(u0, u1, x_lo, x_hi), _segment_sum(v0, v1, x_lo, x_hi))
    return np.where(d1 > 0, rising, np.where(d1 < 0, falling, flat))


def decode_total_s(fm: ForwardModel, hardware: HardwareSpec, batch, prompt_len, gen_len, *,  # noqa: ANN001
                   pp: int, compute_dtype: str):
    """Total time of decode steps j = 1 .. gen_len - 1 (context prompt_len + j), exact and vectorised."""
    x_lo, x_hi = prompt_len + 1, prompt_len + gen_len - 1
    at0 = fm.forward_ops(batch, 1, 0 * prompt_len)
    at1 = fm.forward_ops(batch, 1, 0 * prompt_len + 1)
    total = 0.0
    for c0, c1 in zip(at0, at1):
        t0, t1 = op_time(c0, hardware, compute_dtype), op_time(c1, hardware, compute_dtype)
        u0, v0 = t0.compute_s, t0.memory_s + t0.comm_s  # an op moves memory bytes or sends comm bytes
        total = total + sum_max_linear(u0, t1.compute_s - u0, v0, t1.memory_s + t1.comm_s - v0, x_lo, x_hi)
    steps = np.maximum(gen_len - 1, 0)
    return total + steps * pipeline_transfer_s(fm, hardware, batch, 1, pp)


@dataclass(frozen=True, kw_only=True)
class GenerationEstimate:
    """Prediction for generating `gen_len` tokens for each of `batch` prompts of `prompt_len` tokens."""

    model: ModelSpec
    hardware: HardwareSpec
    precision: Precision
    batch: int
    prompt_len: int
    gen_len: int
    tp: int
    pp: int
    attention: str
    prefill: PhaseEstimate
    decode_first: PhaseEstimate  # the first decode step (context prompt_len + 1)
    decode_last: PhaseEstimate  # the last decode step (context prompt_len + gen_len - 1)
    decode_total_s: float
    decode_flops: float
    decode_bytes: float
    memory: MemoryEstimate
    regimes: RegimeEstimate

    @property
    def decode_steps(self) -> int:
        return max(self.gen_len - 1, 0)

    @property
    def ttft_s(self) -> float:
        """Time to first token: the prefill."""
        return self.prefill.time_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (mean decode step)."""
        return self.decode_total_s / self.decode_steps if self.decode_steps else 0.0

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + self.decode_total_s

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the whole generation (all sequences)."""
        return self.batch * self.gen_len / self.e2e_s if self.e2e_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.batch / self.tpot_s if self.tpot_s else 0.0

    @property
    def total_flops(self) -> float:
        return self.prefill.flops + self.decode_flops

    @property
    def total_bytes(self) -> float:
        return self.prefill.bytes_total + self.decode_bytes

    @property
    def peak_fraction(self) -> float:
        """Achieved FLOP/s over the whole generation as a fraction of the device's peak."""
        peak = self.hardware.peak_flops_per_s(self.prefill.compute_dtype)
        return self.total_flops / self.e2e_s / peak if self.e2e_s else 0.0

    def decode_step_times_s(self) -> np.ndarray:
        """Time of every decode step j = 1 .. gen_len - 1, in order."""
        fm = _forward_model(self.model, self.precision, self.attention, self.tp)
        ctx = self.prompt_len + np.arange(1, self.gen_len)
        total = pipeline_transfer_s(fm, self.hardware, self.batch, 1, self.pp) + 0.0 * ctx
        for c in fm.forward_ops(self.batch, 1, ctx):
            total = total + op_time(c, self.hardware, self.prefill.compute_dtype).time_s
        return np.asarray(total, dtype=float)

    def summary(self) -> dict[str, object]:
        """The headline numbers, flat (one row of `to_frame()`)."""
        out: dict[str, object] = dict(
            model=self.model.name, hardware=self.hardware.name, precision=str(self.precision),
            batch=self.batch, prompt_len=self.prompt_len, gen_len=self.gen_len, tp=self.tp, pp=self.pp,
            attention=self.attention, ttft_s=self.ttft_s, tpot_s=self.tpot_s, e2e_s=self.e2e_s,
            tpot_first_s=self.decode_first.time_s if self.decode_steps else 0.0,
            tpot_last_s=self.decode_last.time_s if self.decode_steps else 0.0,
            tokens_per_s=self.tokens_per_s, decode_tokens_per_s=self.decode_tokens_per_s,
            total_flops=self.total_flops, total_bytes=self.total_bytes, peak_fraction=self.peak_fraction,
            prefill_intensity=self.prefill.intensity, prefill_bound=self.prefill.bound,
            decode_intensity=self.decode_first.intensity, decode_bound=self.decode_first.bound)
        out.update(self.memory.summary())
        out.update(self.regimes.summary())
        return out

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.summary()])

    def ops_frame(self) -> pd.DataFrame:
        """Per-operator rows of the prefill and of the first decode step."""
        return pd.concat([self.prefill.to_frame(), self.decode_first.to_frame()], ignore_index=True)


def _forward_model(model: ModelSpec, precision: Precision, attention: str, tp: int) -> ForwardModel:
    return ForwardModel(model=model, precision=precision, attention=attention, tp=tp)


def resolve_precision(model: ModelSpec, precision: Precision | str | None = None, *, weights: str | None = None,
                      activations: str | None = None, kv: str | None = None) -> Precision:
    """A `Precision` from a preset (or the model's native dtype) with per-tensor overrides."""
    if isinstance(precision, Precision):
        base = precision
    else:
        base = Precision.uniform(precision or model.dtype)
    return Precision(weights=weights or base.weights, activations=activations or base.activations,
                     kv=kv or base.kv)


def check_lengths(model: ModelSpec, batch: int, prompt_len: int, gen_len: int) -> list[str]:
    """Validate the workload; returns warnings (a context beyond the model's positions)."""
    for name, value, low in (("batch", batch, 1), ("prompt_len", prompt_len, 1), ("gen_len", gen_len, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise SpecError(f"{name}: must be an integer >= {low}, got {value!r}")
    if prompt_len + gen_len > model.max_positions:
        return [f"context {prompt_len + gen_len} (prompt_len + gen_len) exceeds {model.name}'s "
                f"max_positions={model.max_positions}"]
    return []


def estimate(model: str | ModelSpec = "llama-3.1-8b", hardware: str | HardwareSpec = "a100-80gb-sxm", *,
             batch: int = 1, prompt_len: int = 512, gen_len: int = 128,
             precision: Precision | str | None = None, weights: str | None = None,
             activations: str | None = None, kv: str | None = None, tp: int = 1, pp: int = 1,
             attention: str = "fused", max_seq_len: int | None = None, block_size: int = 16,
             mem_util: float = 0.9) -> GenerationEstimate:
    """Predict a generation: TTFT, TPOT, latency, throughput, memory and regime.

    `model`/`hardware` are built-in names, file paths or specs. `precision` is a dtype preset (default:
    the model's native dtype) that `weights`, `activations` and `kv` override separately.
    """
    m, hw = load_model(model), load_hardware(hardware)
    check_lengths(m, batch, prompt_len, gen_len)
    prec = resolve_precision(m, precision, weights=weights, activations=activations, kv=kv)
    fm = _forward_model(m, prec, attention, tp)
    from llmperf.analysis.memory import layers_per_stage
    layers_per_stage(m, pp)
    dtype = hw.compute_dtype(prec.activations)
    prefill = estimate_phase(fm, hw, batch, prompt_len, prompt_len, pp=pp, compute_dtype=dtype)
    first = estimate_phase(fm, hw, batch, 1, prompt_len + 1, pp=pp, compute_dtype=dtype)
    last = estimate_phase(fm, hw, batch, 1, prompt_len + max(gen_len - 1, 1), pp=pp, compute_dtype=dtype)
    steps = max(gen_len - 1, 0)
    # FLOPs and bytes are linear in the context: the sum over steps is steps * (mean of first and last)
    decode_flops = steps * (first.flops + last.flops) / 2 if steps else 0.0
    decode_bytes = steps * (first.bytes_total + last.bytes_total) / 2 if steps else 0.0
    total = float(decode_total_s(fm, hw, batch, prompt_len, gen_len, pp=pp, compute_dtype=dtype))
    memory = estimate_memory(m, prec, hw, batch=batch, prompt_len=prompt_len, gen_len=gen_len, tp=tp, pp=pp,
                             attention=attention, max_seq_len=max_seq_len, block_size=block_size,
                             mem_util=mem_util)
    regimes = estimate_regimes(fm, hw, batch=batch, context=prompt_len + gen_len, compute_dtype=dtype)
    return GenerationEstimate(model=m, hardware=hw, precision=prec, batch=batch, prompt_len=prompt_len,
                              gen_len=gen_len, tp=tp, pp=pp, attention=attention, prefill=prefill,
                              decode_first=first, decode_last=last, decode_total_s=total,
                              decode_flops=decode_flops, decode_bytes=decode_bytes, memory=memory,
                              regimes=regimes)
