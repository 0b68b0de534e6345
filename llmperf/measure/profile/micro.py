"""Micro-benchmarks (ops.csv `kind="micro"`): each operator of one layer at the model's real shapes.

The projections and FFN as GEMM (prefill, rows = batch * prompt) and GEMV-like (decode, rows =
batch), each at the analytical model's own GEMM shape (`micro_matmuls`: a dense layer's, the router
and shared experts of a MoE layer; not the routed experts), through the engine's GEMM
(`llmperf.engine.ops.ops_for`); the LM head; and attention prefill / decode through the engine's
backend (SDPA, naive, or on CUDA the Triton kernels). Each weight is rotated through enough copies to
exceed the last-level cache, as the weights of a real forward pass do.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from llmperf.analysis.roofline import OpCost
from llmperf.analysis.vocabulary import FUSED_PARTS, WEIGHT_MATMUL_OPS, Op, Phase
from llmperf.measure.profile.predict import Predictor
from llmperf.measure.profile.settings import ProfileSettings
from llmperf.measure.profile.tables import MODEL_LEVEL, op_row
from llmperf.specs import ModelSpec
from llmperf.specs.model import LayerKind

#: the layer kind the attention micro-benchmark is (plain causal attention over every key)
MICRO_ATTENTION = LayerKind(attention="full", window=None, rope=True, moe=False)


CACHE_ROTATION_FACTOR = 2  # rotate weights through copies totalling 2x the last-level cache


MICRO_BUDGET_S = 2.0  # a micro-benchmark stops repeating (after two calls) once it has spent this


def micro_matmuls(pred: Predictor, batch: int, q_len: int,
                  kv_len: int) -> list[tuple[Op, int, int, OpCost, str]]:
    """(operator, in, out, cost, layer kind) of every weight matmul the micro-benchmarks time, each one
    plain GEMM of the model at the analytical model's own shape (`OpCost.gemm`): the split parts of
    the fused GEMMs, of the first dense layer (its attention and FFN) and of the first MoE layer (its
    router and shared experts, and its attention when no layer is dense), and the LM head. Not timed
    here: routed experts (a GEMM per expert over the rows the routing decides) and MLA's kv_b_proj,
    q_absorb and v_absorb (rows or groups set by the context and the heads)."""
    kinds = pred.fm.model.layer_kinds()
    first = [next((k for k in kinds if not k.moe), None), next((k for k in kinds if k.moe), None)]
    out: dict[Op, tuple[Op, int, int, OpCost, str]] = {}
    for kind in (k for k in first if k is not None):
        routed = {Op.gate_proj, Op.up_proj, Op.down_proj} if kind.moe else set()
        for op in Op:
            if op not in WEIGHT_MATMUL_OPS or op in FUSED_PARTS or op in routed or op in out:
                continue
            cost = pred.cost(op, batch, q_len, kv_len, kind)
            if cost is None or cost.gemm is None or np.ndim(cost.gemm.groups) or cost.gemm.groups != 1:
                continue
            out[op] = (op, cost.gemm.k, cost.gemm.n, cost, kind.label if cost.per_layer else MODEL_LEVEL)
    return [out[op] for op in Op if op in out]


def _llc_bytes(dev: dict[str, Any]) -> int:
    caches = dev.get("caches") or {}
    return int(max(caches.values()) if caches else dev.get("l2_cache_bytes", 0))


def micro_benchmarks(model: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, batch: int,
                     prompt_len: int, gen_len: int, llc: int) -> list[dict[str, Any]]:
    """Every weight matmul and the attention of one layer, at this configuration's prefill and at its
    middle decode step (context prompt + gen / 2)."""
    import torch

    from llmperf.engine.ops import ops_for
    from llmperf.measure.timers import time_fn

    device, dtype = model.device, model.dtype
    in_out = False  # the engine stores (out, in) on every device
    gemm = ops_for(device, dtype)  # the engine's GEMM: packed where it packs
    linear = gemm.linear
    elem = torch.empty((), dtype=dtype).element_size()
    rows_out = []
    shapes = [(Phase.prefill, prompt_len, prompt_len), (Phase.decode, 1, prompt_len + max(gen_len // 2, 1))]
    for phase, q_len, kv_len in shapes:
        for op, d_in, d_out, cost, label in micro_matmuls(pred, batch, q_len, kv_len):
            rows = int(pred.rows(cost, batch, q_len, pred.fm))
            copies = max(1, min(8, -(-CACHE_ROTATION_FACTOR * llc // (d_in * d_out * elem)))) if llc else 1
            ws = [torch.randn((d_in, d_out) if in_out else (d_out, d_in), device=device, dtype=dtype)
                  for _ in range(copies)]
            x = torch.randn(rows, d_in, device=device, dtype=dtype)
            for w in ws:
                linear(x, w)  # pack every copy before timing
            state = {"i": 0}

            def call(x=x, ws=ws, state=state) -> Any:
                state["i"] = (state["i"] + 1) % len(ws)
                return linear(x, ws[state["i"]])

            t = time_fn(call, device, reps=settings.reps, warmup=1, max_time_s=MICRO_BUDGET_S)
            rows_out.append(op_row("micro", phase.value, op.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                                   cost, pred.times(cost, batch, q_len, micro=True), pred.hardware, pred.compute_dtype,
                                   layer=label))
            del ws, x
            gemm.clear()
        rows_out += _attention_micro(model, spec, pred, settings, batch, phase, q_len, kv_len)
    return rows_out


def _attention_micro(model: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, batch: int,
                     phase: Phase, q_len: int, kv_len: int) -> list[dict[str, Any]]:
    """The attention core of one layer through the engine's backend at (batch, q_len, kv_len): plain
    causal GQA over every key, so it is predicted as a full-attention layer's core without soft-cap or
    sinks (`MICRO_ATTENTION`; the engine's sliding, capped or sinked layers are in the generation rows).
    None for MLA, whose latent attention is not this core."""
    import torch
    import torch.nn.functional as F

    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta
    from llmperf.measure.timers import time_fn

    if spec.is_mla:
        return []
    device, dtype = model.device, model.dtype
    H, H_kv, D = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q = torch.randn(batch, H, q_len, D, device=device, dtype=dtype)
    k = torch.randn(batch, H_kv, kv_len, D, device=device, dtype=dtype)
    v = torch.randn_like(k)
    causal = q_len > 1
    if settings.backend == "triton":
        import kernels
        if q_len > 1:
            fn = lambda: kernels.flash_attention(q, k, v, causal=True)  # noqa: E731
        else:
            lens = torch.full((batch,), kv_len, dtype=torch.int32, device=device)
            fn = lambda: kernels.flash_decoding(q[:, :, 0], k, v, lens, validate=False)  # noqa: E731
    elif settings.backend == "naive":
        import kernels
        fn = lambda: kernels.naive_attention(q, k, v, causal)  # noqa: E731
    elif q_len == 1:  # the engine's decode path (llmperf's own kernel on a CPU that runs them)
        meta = StepMeta.decode(batch, kv_len, device)
        fn = lambda: sdpa_decode(q[:, :, 0], k, v, meta, D ** -0.5)  # noqa: E731
    else:
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != H_kv)  # noqa: E731
    t = time_fn(fn, device, reps=settings.reps, warmup=1, max_time_s=MICRO_BUDGET_S)
    names = [Op.attention] if settings.backend != "naive" else [Op.attn_score, Op.attn_softmax, Op.attn_value]
    core = replace(pred, fm=replace(pred.fm, model=spec.scaled(attn_softcap=None, attn_sinks=False)))
    costs = [core.cost(n, batch, q_len, kv_len, MICRO_ATTENTION) for n in names]
    if settings.backend == "naive":  # one timed call covers the three naive operators: join it to their sum
        total = OpCost(name=Op.attention.value, kind="attention",
                       **{f: sum(getattr(c, f) for c in costs) for f in
                          ("flops", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")})
        times = [pred.times(c, batch, q_len, micro=True) for c in costs]
        p = (sum(t_[0] for t_ in times), sum(t_[1] for t_ in times))
        return [op_row("micro", phase.value, Op.attention.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                       total, p, pred.hardware, pred.compute_dtype, layer=MICRO_ATTENTION.label)]
    cost = costs[0]
    return [op_row("micro", phase.value, Op.attention.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                   cost, pred.times(cost, batch, q_len, micro=True), pred.hardware, pred.compute_dtype,
                   layer=MICRO_ATTENTION.label)]
