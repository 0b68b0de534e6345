"""Vectorised sweeps: every combination of models x devices x batch x prompt x generation length,
evaluated with numpy arrays through the same cost functions as a single estimate (one code path).
10,000 configurations take a few tens of milliseconds.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from llmperf.analysis.generation import check_lengths, decode_total_s, resolve_precision
from llmperf.analysis.memory import (
    activation_peak_bytes,
    kv_bytes_per_token_per_gpu,
    layers_per_stage,
    max_batch_that_fits,
    weight_bytes_per_gpu,
)
from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.phase import pipeline_transfer_s
from llmperf.analysis.roofline import op_time
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model


def _as_list(value: object) -> list:
    if isinstance(value, (str, int, ModelSpec, HardwareSpec)) or not isinstance(value, Iterable):
        return [value]
    return list(value)


def _phase_arrays(fm: ForwardModel, hw: HardwareSpec, batch, q_len, kv_len, pp: int, dtype: str):  # noqa: ANN001
    """Time, FLOPs, bytes and memory-bound time of one phase, for array arguments."""
    time = pipeline_transfer_s(fm, hw, batch, q_len, pp) + 0.0 * kv_len
    flops = nbytes = mem_time = 0.0
    for c in fm.forward_ops(batch, q_len, kv_len):
        t = op_time(c, hw, dtype)
        time = time + t.time_s
        flops = flops + c.flops
        nbytes = nbytes + c.bytes_total
        mem_time = mem_time + np.where(t.memory_s >= np.maximum(t.compute_s, t.comm_s), t.time_s, 0.0)
    return time, flops, nbytes, mem_time


def sweep(models: str | ModelSpec | Sequence = "llama-3.1-8b",
          hardware: str | HardwareSpec | Sequence = "a100-80gb-sxm", *,
          batch: int | Sequence[int] = (1,), prompt_len: int | Sequence[int] = (512,),
          gen_len: int | Sequence[int] = (128,), precision: Precision | str | None = None,
          weights: str | None = None, activations: str | None = None, kv: str | None = None,
          tp: int = 1, pp: int = 1, attention: str = "fused", block_size: int = 16,
          mem_util: float = 0.9) -> pd.DataFrame:
    """One row per (model, hardware, batch, prompt_len, gen_len): TTFT, TPOT, latency, throughput,
    intensities and bounds, memory and whether it fits, the largest batch at that context."""
    batches = np.asarray(_as_list(batch), dtype=np.int64)
    prompts = np.asarray(_as_list(prompt_len), dtype=np.int64)
    gens = np.asarray(_as_list(gen_len), dtype=np.int64)
    frames = []
    for model_ref, hw_ref in itertools.product(_as_list(models), _as_list(hardware)):
        m, hw = load_model(model_ref), load_hardware(hw_ref)
        for name, values in (("batch", batches), ("prompt_len", prompts), ("gen_len", gens)):
            if values.size == 0 or values.min() < 1:
                raise SpecError(f"{name}: every value must be an integer >= 1, got {values.tolist()}")
        for w in check_lengths(m, 1, int(prompts.max()), int(gens.max())):
            warnings.warn(w, stacklevel=2)
        prec = resolve_precision(m, precision, weights=weights, activations=activations, kv=kv)
        layers_per_stage(m, pp)
        fm = ForwardModel(model=m, precision=prec, attention=attention, tp=tp)
        dtype = hw.compute_dtype(prec.activations)
        B, P, G = (a.ravel() for a in np.meshgrid(batches, prompts, gens, indexing="ij"))
        ttft, pf_flops, pf_bytes, pf_mem = _phase_arrays(fm, hw, B, P, P, pp, dtype)
        d_time, d_flops, d_bytes, d_mem = _phase_arrays(fm, hw, B, 1, P + 1, pp, dtype)
        decode = decode_total_s(fm, hw, B, P, G, pp=pp, compute_dtype=dtype)
        steps = np.maximum(G - 1, 0)
        e2e = ttft + decode
        weights_b = weight_bytes_per_gpu(m, prec, tp, pp)
        kv_tok = kv_bytes_per_token_per_gpu(m, prec, tp, pp)
        act = activation_peak_bytes(m, prec, B, P, P, tp=tp, attention=attention)
        act_one = activation_peak_bytes(m, prec, 1, P, P, tp=tp, attention=attention)
        ctx = P + G
        total = weights_b + B * ctx * kv_tok + act
        usable = hw.memory_bytes * mem_util
        paged_seq = np.ceil(ctx / block_size) * block_size * kv_tok
        frames.append(pd.DataFrame(dict(
            model=m.name, hardware=hw.name, precision=str(prec), tp=tp, pp=pp, attention=attention,
            batch=B, prompt_len=P, gen_len=G,
            ttft_s=ttft, tpot_s=np.where(steps > 0, decode / np.maximum(steps, 1), 0.0), e2e_s=e2e,
            tokens_per_s=B * G / e2e,
            prefill_intensity=pf_flops / pf_bytes,
            prefill_bound=np.where(pf_mem >= 0.5 * ttft, "memory", "compute"),
            decode_intensity=d_flops / d_bytes,
            decode_bound=np.where(d_mem >= 0.5 * d_time, "memory", "compute"),
            ridge_point=hw.ridge_point(dtype),
            weights_gib=weights_b / 2**30, kv_cache_gib=B * ctx * kv_tok / 2**30,
            activation_peak_gib=act / 2**30, total_gib=total / 2**30, fits=total <= usable,
            max_batch=max_batch_that_fits(usable, weights_b, paged_seq + act_one))))
    return pd.concat(frames, ignore_index=True)
