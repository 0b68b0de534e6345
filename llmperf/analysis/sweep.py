"""Sweeps: every combination of models x devices x precisions x tp x pp x batch x prompt x generation
length, through the one roll-up (`llmperf.analysis.rollup.rollup`) with numpy arrays. A single
estimate is a sweep of one: `estimate(...).summary()` equals the matching row here. 10,000
configurations take a fraction of a second.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from llmperf.analysis.generation import check_lengths, resolve_precision
from llmperf.analysis.rollup import DEFAULT_MAX_BATCHED_TOKENS, REGIME_COLUMNS, Conventions, rollup
from llmperf.analysis.roofline import TimeModel, resolve_time_model
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model

#: version of the result schema (the columns of a sweep row / an estimate summary); see README
SCHEMA_VERSION = 1


def _as_list(value: object) -> list:
    if isinstance(value, (str, int, ModelSpec, HardwareSpec, Precision)) or value is None \
            or not isinstance(value, Iterable):
        return [value]
    return list(value)


def _lengths(name: str, value: object) -> np.ndarray:
    values = _as_list(value)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values):
        raise SpecError(f"{name}: every value must be an integer >= 1, got {values!r}")
    return np.asarray(values, dtype=np.int64)


def sweep(models: str | ModelSpec | Sequence = "llama-3.1-8b",
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
          time_model: TimeModel | None = None) -> pd.DataFrame:
    """One row per (model, hardware, precision, tp, pp, batch, prompt_len, gen_len), in that nesting
    order; the columns are the result schema (README, "Output schema"), the same as
    `estimate(...).summary()`. Lists are accepted for models, hardware, the precisions, tp, pp and the
    three lengths; every other option applies to every row."""
    batches, prompts, gens = (_lengths(n, v) for n, v in
                              (("batch", batch), ("prompt_len", prompt_len), ("gen_len", gen_len)))
    tps, pps = _as_list(tp), _as_list(pp)
    conv = Conventions(attention=attention, attention_flops=attention_flops, all_logits=all_logits,
                       fused_qkv=fused_qkv, fused_gate_up=fused_gate_up, max_seq_len=max_seq_len,
                       block_size=block_size, mem_util=mem_util, max_batched_tokens=max_batched_tokens)
    tm = resolve_time_model(time_model)
    B, P, G = (a.ravel() for a in np.meshgrid(batches, prompts, gens, indexing="ij"))
    frames = []
    for model_ref, hw_ref in itertools.product(_as_list(models), _as_list(hardware)):
        m, hw = load_model(model_ref), load_hardware(hw_ref)
        for w in check_lengths(m, 1, int(prompts.max()), int(gens.max())):
            warnings.warn(w, stacklevel=2)
        precs = _precisions(m, precision, weights, activations, kv, group_size, zero_point, embeddings)
        for prec, t, p in itertools.product(precs, tps, pps):
            cols = rollup(m, hw, prec, tp=t, pp=p, conv=conv, batch=B, prompt_len=P, gen_len=G, time_model=tm)
            frame = pd.DataFrame({k: v for k, v in cols.items() if not k.startswith("_")}, index=range(B.size))
            for k in REGIME_COLUMNS:  # integers, or missing where there is no answer
                frame[k] = pd.array(np.where(np.isnan(cols[k]), None, cols[k]), dtype="Int64")
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)


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
