"""A whole generation: prefill of `batch` prompts of `prompt_len` tokens, then `gen_len - 1` decode
steps (the prefill already yields the first token). TTFT is the prefill time; decode step j reads a
context of `prompt_len + j` tokens; TPOT is the mean decode step time.

`estimate` is the roll-up of one configuration (`llmperf.analysis.rollup.rollup` with arrays of
length one): its `summary()` is exactly the row `sweep` gives for the same configuration. The
per-operator detail (`prefill`, `decode_first`, `decode_last`) is computed by the same cost
functions and the same `op_time`; the per-step series (`decode_step_times_s`) only on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from llmperf.analysis.memory import KVUtilization, MemoryEstimate
from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.phase import PhaseEstimate, estimate_phase
from llmperf.analysis.regimes import RegimeEstimate
from llmperf.analysis.rollup import (
    DEFAULT_MAX_BATCHED_TOKENS,
    REGIME_COLUMNS,
    Conventions,
    forward_model,
    pipeline_transfer_s,
    rollup,
    sum_max_linear,
)
from llmperf.analysis.roofline import (
    ROOFLINE,
    TimeModel,
    model_time_model,
    op_time,
    resolve_time_model,
    step_overhead_s,
)
from llmperf.analysis.vocabulary import Phase
from llmperf.errors import SpecError
from llmperf.outputs import jsonable
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model
from llmperf.specs.expert_load import ExpertLoad, as_expert_load
from llmperf.specs.precision import PER_CHANNEL

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GenerationEstimate", "check_lengths", "decode_total_s", "estimate", "resolve_precision",
           "sum_max_linear"]


def decode_total_s(fm: ForwardModel, hardware: HardwareSpec, batch, prompt_len, gen_len, *,  # noqa: ANN001, ANN201
                   pp: int, compute_dtype: str, time_model: TimeModel | None = None):
    """Total time of decode steps j = 1 .. gen_len - 1 (context prompt_len + j), exact and vectorised."""
    from llmperf.analysis.rollup import decode_sums
    return decode_sums(fm, hardware, batch, prompt_len, gen_len, pp=pp, compute_dtype=compute_dtype,
                       time_model=time_model)[0]


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
    conventions: Conventions = field(default_factory=Conventions)
    time_model: TimeModel = ROOFLINE
    row: dict[str, object] = field(default_factory=dict, compare=False)  # the roll-up's row

    @property
    def decode_steps(self) -> int:
        return max(self.gen_len - 1, 0)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def ttft_s(self) -> float:
        """Time to first token: the prefill."""
        return float(self.row["ttft_s"]) if self.row else self.prefill.time_s

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
        """Achieved FLOP/s per GPU over the whole generation as a fraction of the device's peak (the
        counts are per tensor-parallel rank over all `pp` stages, which run one after another)."""
        peak = max(self.prefill.peak_flops_per_s, self.decode_first.peak_flops_per_s)
        return self.total_flops / self.e2e_s / (self.pp * peak) if self.e2e_s else 0.0

    def forward_model(self) -> ForwardModel:
        """The `ForwardModel` this estimate was computed with (its operators at any shape)."""
        return forward_model(self.model, self.precision, self.conventions, self.tp)

    def decode_step_times_s(self, start: int = 1, stop: int | None = None) -> np.ndarray:
        """Time of decode steps j = start .. stop - 1 (default: every step 1 .. gen_len - 1), in order.
        Computed on demand: ask for a slice of a very long generation. `start` and `stop` are step
        indices (integers); a start below 1 is step 1."""
        for name, value in (("start", start), ("stop", stop)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise ValueError(f"{name}: must be an integer step index, got {value!r}")
        stop = self.gen_len if stop is None else min(stop, self.gen_len)
        fm = self.forward_model()
        ctx = self.prompt_len + np.arange(max(start, 1), stop, dtype=float)
        tm = model_time_model(self.time_model, self.model)  # as the roll-up prices this model's steps
        total = (pipeline_transfer_s(fm, self.hardware, self.batch, 1, self.pp, tm) + 0.0 * ctx
                 + step_overhead_s(tm))
        for c in fm.forward_ops(self.batch, 1, ctx):
            total = total + op_time(c, self.hardware, self.prefill.compute_dtype, tm).time_s
        return np.asarray(total, dtype=float)

    def summary(self) -> dict[str, object]:
        """The headline numbers, flat: exactly one row of `sweep` (docs/schemas.md)."""
        return dict(self.row)

    def to_frame(self) -> pd.DataFrame:
        """`summary()` as a one-row DataFrame (the columns of `llmperf.analysis.schema.COLUMNS`)."""
        import pandas as pd

        return pd.DataFrame([self.summary()])

    def ops_frame(self) -> pd.DataFrame:
        """Per-operator rows of the prefill and of the first decode step."""
        import pandas as pd

        return pd.concat([self.prefill.to_frame(), self.decode_first.to_frame()], ignore_index=True)


def resolve_precision(model: ModelSpec, precision: Precision | str | None = None, *, weights: str | None = None,
                      activations: str | None = None, kv: str | None = None, group_size: int | None = None,
                      zero_point: bool | None = None, embeddings: str | None = None) -> Precision:
    """A `Precision` from a preset (or the model's native dtype) with per-tensor overrides.

    A quantised checkpoint (`model.quantization`) sets the default weight formats, as shipped: AWQ /
    GPTQ their integer format, group size and zero points for every matrix; fp8 block-wise, MXFP4
    and NVFP4 their block-scaled format for the modules they convert (`Precision.modules`), the
    rest at the checkpoint's dtype. The modules it keeps (`modules_to_not_convert`) stay at its
    dtype, and a KV-cache format it ships scales for is the default KV format. An explicit
    `precision` preset or `weights` overrides it (every matrix at that format). The fp8 preset is
    fp8 as deployed (`Precision.preset`): fp8 weights and GEMMs (W8A8; W8A16 on a device without
    fp8 units), 16-bit activations and all-reduces, fp8 KV."""
    if isinstance(precision, Precision):
        base = precision
    else:
        base = Precision.preset(precision or model.dtype, model.dtype)
    q = model.quantization
    w = weights or base.weights
    modules: dict[str, str] | tuple[tuple[str, str], ...] = base.modules if weights is None else ()
    if q is not None and precision is None:
        kv = kv or q.kv_cache
    if q is not None and precision is None and weights is None:
        if q.method in ("awq", "gptq"):  # every matrix at the integer format but the modules kept
            w = q.weight_dtype
            group_size = group_size if group_size is not None else (q.group_size or PER_CHANNEL)
            zero_point = zero_point if zero_point is not None else q.zero_point
            modules = {m: model.dtype for m in q.modules_to_not_convert if m not in ("embedding", "lm_head")}
        else:  # the converted modules at the block-scaled format, the rest at the checkpoint's dtype
            modules = {m: q.weight_format for m in q.quantized_modules}
    if isinstance(precision, Precision):
        group_size = precision.group_size if group_size is None else group_size
        zero_point = precision.zero_point if zero_point is None else zero_point
        embeddings = precision.embeddings if embeddings is None else embeddings
    explicit = group_size is not None and not isinstance(precision, Precision)
    prec = Precision(weights=w, activations=activations or base.activations, kv=kv or base.kv,
                     group_size=group_size, zero_point=zero_point, embeddings=embeddings, modules=modules)
    g = prec.effective_group_size if prec.quantized else None
    if explicit and g is not None:  # a group of inputs tiles each row of every quantised matrix
        widths = (("hidden_size", model.hidden_size), ("num_heads x head_dim", model.num_heads * model.head_dim),
                  ("ffn_size", model.ffn_size))
        bad = next(((n, v) for n, v in widths if v % g), None)
        if bad is not None:
            raise SpecError(f"group_size: {g} does not divide {model.name}'s {bad[0]}={bad[1]} (each row's inputs "
                            "are split into whole groups; -1: one scale per row)")
    return prec


def check_lengths(model: ModelSpec, batch: int, prompt_len: int, gen_len: int) -> list[str]:
    """Validate the workload; returns warnings (a context beyond the model's positions)."""
    from llmperf.analysis.rollup import MAX_COUNT
    for name, value, low in (("batch", batch, 1), ("prompt_len", prompt_len, 1), ("gen_len", gen_len, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= MAX_COUNT:
            raise SpecError(f"{name}: must be an integer in {low} .. 2**53, got {value!r}")
    if prompt_len + gen_len > model.max_positions:
        return [f"context {prompt_len + gen_len} (prompt_len + gen_len) exceeds {model.name}'s "
                f"max_positions={model.max_positions}"]
    return []


def _scalar(value: object) -> object:
    """A roll-up value of a one-row roll-up as a plain Python scalar (NaN -> None)."""
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0]
    return jsonable(value)


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)


def estimate(model: str | ModelSpec = "llama-3.1-8b", hardware: str | HardwareSpec = "a100-80gb-sxm", *,
             batch: int = 1, prompt_len: int = 512, gen_len: int = 128,
             precision: Precision | str | None = None, weights: str | None = None,
             activations: str | None = None, kv: str | None = None, tp: int = 1, pp: int = 1,
             attention: str = "fused", max_seq_len: int | None = None, block_size: int = 16,
             mem_util: float = 0.9, attention_flops: str = "executed", all_logits: bool = False,
             fused_qkv: bool = True, fused_gate_up: bool = True,
             max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, group_size: int | None = None,
             zero_point: bool | None = None, embeddings: str | None = None,
             time_model: TimeModel | None = None, mla_mode: str = "auto", ep: int = 1,
             dp_attention: bool = False, kv_window: str = "capped", expert_load: ExpertLoad | str | None = None,
             eplb: int | None = None) -> GenerationEstimate:
    """Predict a generation: TTFT, TPOT, latency, throughput, memory and regime.

    `model`/`hardware` are built-in names, file paths or specs. `precision` is a dtype preset (default:
    the model's native dtype, or a quantised checkpoint's format) that `weights`, `activations` and
    `kv` override separately. The conventions (`attention`, `attention_flops`, `all_logits`,
    `fused_qkv`, `fused_gate_up`, `mla_mode`) and the memory settings (`max_seq_len`, `block_size`,
    `mem_util`, `max_batched_tokens`) are described in docs/model.md; `time_model` defaults to the pure
    roofline. `ep` splits the routed experts over the tp group; `dp_attention` runs attention
    data-parallel over it (each GPU its own sequences, heads whole) and the MoE layers
    expert-parallel (`ep` = `tp`). `kv_window`: sliding and chunked layers hold their window of KV
    ("capped", vLLM's hybrid allocator) or the whole context ("full" pages). `expert_load` (an
    `ExpertLoad` or its file) prices a measured router instead of uniform routing, and `eplb` places
    the experts by EPLB with that many redundant experts (`llmperf.analysis.routing`).
    """
    m, hw = load_model(model), load_hardware(hardware)
    check_lengths(m, batch, prompt_len, gen_len)
    prec = resolve_precision(m, precision, weights=weights, activations=activations, kv=kv,
                             group_size=group_size, zero_point=zero_point, embeddings=embeddings)
    conv = Conventions(attention=attention, attention_flops=attention_flops, all_logits=all_logits,
                       fused_qkv=fused_qkv, fused_gate_up=fused_gate_up, max_seq_len=max_seq_len,
                       block_size=block_size, mem_util=mem_util, max_batched_tokens=max_batched_tokens,
                       mla_mode=mla_mode, ep=ep, dp_attention=dp_attention, kv_window=kv_window,
                       expert_load=as_expert_load(expert_load), eplb=eplb)
    tm = resolve_time_model(time_model, hw, hw.compute_dtype(prec.activations))
    raw = rollup(m, hw, prec, tp=tp, pp=pp, conv=conv, batch=[batch], prompt_len=[prompt_len],
                 gen_len=[gen_len], time_model=tm)
    row = {k: _scalar(v) for k, v in raw.items() if not k.startswith("_")}
    for k in REGIME_COLUMNS:
        row[k] = _int_or_none(row[k])
    fm = forward_model(m, prec, conv, tp)
    dtype = str(row["compute_dtype"])
    kw = dict(pp=pp, compute_dtype=dtype, time_model=model_time_model(tm, m))  # the roll-up's, per phase below
    prefill = estimate_phase(fm, hw, batch, prompt_len, prompt_len, phase=Phase.prefill, **kw)
    first = estimate_phase(fm, hw, batch, 1, prompt_len + 1, phase=Phase.decode, **kw)
    last = estimate_phase(fm, hw, batch, 1, prompt_len + max(gen_len - 1, 1), phase=Phase.decode, **kw)
    kv_tok = float(row["kv_bytes_per_token"])
    max_seq = int(row["max_seq_len"])
    util = KVUtilization(used_bytes=float(raw["_kv_used_bytes"][0]),
                         contiguous_reserved_bytes=float(raw["_kv_contiguous_bytes"][0]),
                         paged_reserved_bytes=float(raw["_kv_paged_bytes"][0]), max_seq_len=max_seq,
                         block_size=block_size)
    gib = 2.0 ** 30
    memory = MemoryEstimate(
        weights_bytes=float(row["weights_gib"]) * gib, kv_bytes_per_token=kv_tok,
        kv_cache_bytes=float(row["kv_cache_gib"]) * gib, activation_peak_bytes=float(row["activation_peak_gib"]) * gib,
        device_bytes=hw.memory_bytes, mem_util=mem_util, max_batch=int(row["max_batch"]),
        max_batch_contiguous=int(row["max_batch_contiguous"]), kv=util, batch=batch,
        max_batched_tokens=max_batched_tokens)
    regimes = RegimeEstimate(
        compute_dtype=dtype, ridge_point=float(row["ridge_point"]),
        critical_batch_matmul=_int_or_none(row["critical_batch_matmul"]),
        critical_batch=_int_or_none(row["critical_batch"]),
        attention_flops_crossover=_int_or_none(row["attention_flops_crossover"]),
        attention_bytes_crossover=_int_or_none(row["attention_bytes_crossover"]),
        attention_critical_context=_int_or_none(row["attention_critical_context"]))
    return GenerationEstimate(model=m, hardware=hw, precision=prec, batch=batch, prompt_len=prompt_len,
                              gen_len=gen_len, tp=tp, pp=pp, attention=attention, prefill=prefill,
                              decode_first=first, decode_last=last, decode_total_s=float(row["decode_s"]),
                              decode_flops=float(row["decode_flops"]), decode_bytes=float(row["decode_bytes"]),
                              memory=memory, regimes=regimes, conventions=conv, time_model=tm, row=row)
