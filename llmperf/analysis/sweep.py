"""Sweeps: every combination of models x devices x precisions x tp x pp x batch x prompt x generation
length, through the one roll-up (`llmperf.analysis.rollup.rollup`) with numpy arrays. A single
estimate is a sweep of one: `estimate(...).summary()` equals the matching row here. 10,000
configurations take a fraction of a second.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llmperf.analysis.generation import GenerationEstimate, check_lengths, estimate, resolve_precision
from llmperf.analysis.rollup import DEFAULT_MAX_BATCHED_TOKENS, MAX_COUNT, REGIME_COLUMNS, Conventions, rollup
from llmperf.analysis.roofline import TimeModel, resolve_time_model
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model
from llmperf.specs.expert_load import ExpertLoad, as_expert_load

if TYPE_CHECKING:
    import pandas as pd

#: version of the result schema (the columns of a sweep row / an estimate summary); see docs/schemas.md
SCHEMA_VERSION = 1


def _as_list(value: object) -> list:
    if isinstance(value, (str, int, ModelSpec, HardwareSpec, Precision)) or value is None \
            or not isinstance(value, Iterable):
        return [value]
    return list(value)


def _lengths(name: str, value: object) -> np.ndarray:
    values = _as_list(value)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= MAX_COUNT
                         for v in values):
        raise SpecError(f"{name}: every value must be an integer in 1 .. 2**53, got {values!r}")
    return np.asarray(values, dtype=np.int64)


@dataclass(frozen=True)
class Group:
    """Configurations that share model, device, precision, parallelism, conventions and time model;
    `batch`, `prompt_len`, `gen_len` are equal-length arrays (every combination of the lists)."""

    model: ModelSpec
    hardware: HardwareSpec
    precision: Precision
    tp: int
    pp: int
    conventions: Conventions
    time_model: TimeModel
    batch: np.ndarray
    prompt_len: np.ndarray
    gen_len: np.ndarray


def plan(models: str | ModelSpec | Sequence = "llama-3.1-8b",
         hardware: str | HardwareSpec | Sequence = "a100-80gb-sxm", *,
         batch: int | Sequence[int] = (1,), prompt_len: int | Sequence[int] = (512,),
         gen_len: int | Sequence[int] = (128,), precision: Precision | str | Sequence | None = None,
         weights: str | Sequence[str] | None = None, activations: str | Sequence[str] | None = None,
         kv: str | Sequence[str] | None = None, tp: int | Sequence[int] = 1, pp: int | Sequence[int] = 1,
         attention: str = "fused", max_seq_len: int | None = None, block_size: int = 16,
         mem_util: float = 0.9, attention_flops: str = "executed", all_logits: bool = False,
         fused_qkv: bool = True, fused_gate_up: bool = True,
         max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, group_size: int | None = None,
         zero_point: bool | None = None, embeddings: str | None = None,
         time_model: TimeModel | None = None, mla_mode: str = "auto", ep: int = 1,
         dp_attention: bool = False, kv_window: str = "capped", expert_load: ExpertLoad | str | None = None,
         eplb: int | None = None) -> list[Group]:
    """The groups of a sweep, in row order (model, hardware, precision, tp, pp, then the lengths)."""
    batches, prompts, gens = (_lengths(n, v) for n, v in
                              (("batch", batch), ("prompt_len", prompt_len), ("gen_len", gen_len)))
    tps, pps = _as_list(tp), _as_list(pp)
    conv = Conventions(attention=attention, attention_flops=attention_flops, all_logits=all_logits,
                       fused_qkv=fused_qkv, fused_gate_up=fused_gate_up, max_seq_len=max_seq_len,
                       block_size=block_size, mem_util=mem_util, max_batched_tokens=max_batched_tokens,
                       mla_mode=mla_mode, ep=ep, dp_attention=dp_attention, kv_window=kv_window,
                       expert_load=as_expert_load(expert_load), eplb=eplb)
    for name, value in (("models", models), ("hardware", hardware), ("precision", precision),
                        ("weights", weights), ("activations", activations), ("kv", kv), ("tp", tp), ("pp", pp)):
        if not _as_list(value):  # an empty list would make an empty sweep, with no row to say why
            raise SpecError(f"{name}: needs at least one value, got an empty list")
    B, P, G = (a.ravel() for a in np.meshgrid(batches, prompts, gens, indexing="ij"))
    groups = []
    for model_ref, hw_ref in itertools.product(_as_list(models), _as_list(hardware)):
        m, hw = load_model(model_ref), load_hardware(hw_ref)
        for w in check_lengths(m, 1, int(prompts.max()), int(gens.max())):
            warnings.warn(w, stacklevel=3)
        precs = _precisions(m, precision, weights, activations, kv, group_size, zero_point, embeddings)
        for prec, t, p in itertools.product(precs, tps, pps):
            tm = resolve_time_model(time_model, hw, hw.compute_dtype(prec.activations))
            groups.append(Group(model=m, hardware=hw, precision=prec, tp=t, pp=p, conventions=conv,
                                time_model=tm, batch=B, prompt_len=P, gen_len=G))
    return groups


def sweep(models: str | ModelSpec | Sequence = "llama-3.1-8b",
          hardware: str | HardwareSpec | Sequence = "a100-80gb-sxm", **options: object) -> pd.DataFrame:
    """One row per (model, hardware, precision, tp, pp, batch, prompt_len, gen_len), in that nesting
    order; the columns are the result schema (docs/schemas.md), the same as
    `estimate(...).summary()`. Lists are accepted for models, hardware, the precisions (`precision`,
    `weights`, `activations`, `kv`), `tp`, `pp` and the three lengths; every other option of
    `estimate` (`attention`, `attention_flops`, `all_logits`, `fused_qkv`, `fused_gate_up`,
    `mla_mode`, `ep`, `dp_attention`, `expert_load`, `eplb`, `kv_window`, `max_seq_len`, `block_size`,
    `mem_util`, `max_batched_tokens`,
    `group_size`, `zero_point`, `embeddings`, `time_model`) applies to every row."""
    import pandas as pd

    frames = []
    for g in plan(models, hardware, **options):
        cols = rollup(g.model, g.hardware, g.precision, tp=g.tp, pp=g.pp, conv=g.conventions,
                      batch=g.batch, prompt_len=g.prompt_len, gen_len=g.gen_len, time_model=g.time_model)
        frame = pd.DataFrame({k: v for k, v in cols.items() if not k.startswith("_")}, index=range(g.batch.size))
        for k in REGIME_COLUMNS:  # integers, or missing where there is no answer
            frame[k] = pd.array(np.where(np.isnan(cols[k]), None, cols[k]), dtype="Int64")
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def sweep_estimates(models: str | ModelSpec | Sequence = "llama-3.1-8b",
                    hardware: str | HardwareSpec | Sequence = "a100-80gb-sxm",
                    **options: object) -> list[GenerationEstimate]:
    """A `GenerationEstimate` for every row of `sweep(...)` with the same arguments, in row order
    (for per-operator detail; each summary equals its row)."""
    out = []
    for g in plan(models, hardware, **options):
        c = g.conventions
        for b, p, n in zip(g.batch.tolist(), g.prompt_len.tolist(), g.gen_len.tolist()):
            out.append(estimate(g.model, g.hardware, batch=b, prompt_len=p, gen_len=n, precision=g.precision,
                                tp=g.tp, pp=g.pp, attention=c.attention, attention_flops=c.attention_flops,
                                all_logits=c.all_logits, fused_qkv=c.fused_qkv, fused_gate_up=c.fused_gate_up,
                                max_seq_len=c.max_seq_len, block_size=c.block_size, mem_util=c.mem_util,
                                max_batched_tokens=c.max_batched_tokens, time_model=g.time_model,
                                mla_mode=c.mla_mode, ep=c.ep, dp_attention=c.dp_attention,
                                kv_window=c.kv_window, expert_load=c.expert_load, eplb=c.eplb))
    return out


def estimates_frame(estimates: Sequence[GenerationEstimate]) -> pd.DataFrame:
    """The rows `sweep(...)` gives for these estimates (each summary is its row), dtypes included:
    the CLI's per-operator path rolls every configuration up once, not once for the row and once
    for the operators."""
    import pandas as pd

    frame = pd.DataFrame([e.summary() for e in estimates])
    for k in REGIME_COLUMNS:  # integers, or missing where there is no answer (as `sweep`)
        frame[k] = pd.array(frame[k].tolist(), dtype="Int64")
    return frame


def _precisions(m: ModelSpec, precision, weights, activations, kv, group_size, zero_point, embeddings):  # noqa: ANN001, ANN202
    """Every combination of the precision lists, resolved against the model (duplicates dropped).
    A group size applies to the integer weights among them; it is refused when there are none."""
    out: list[Precision] = []
    combos = list(itertools.product(_as_list(precision), _as_list(weights), _as_list(activations), _as_list(kv)))
    for pre, w, a, k in combos:
        base = resolve_precision(m, pre, weights=w, activations=a, kv=k, embeddings=embeddings)
        if base.quantized:
            base = resolve_precision(m, pre, weights=w, activations=a, kv=k, group_size=group_size,
                                     zero_point=zero_point, embeddings=embeddings)
        if base not in out:
            out.append(base)
    if (group_size is not None or zero_point is not None) and not any(p.quantized for p in out):
        raise SpecError(f"group_size: group scales apply to int4/int8 weights, got weights="
                        f"{', '.join(sorted({p.weights for p in out}))}")
    return out
