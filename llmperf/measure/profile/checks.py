"""Exact cross-checks of the analytical counts against the engine (`run.json` "checks").

The matmul FLOPs of a prefill and of one decode step against `torch.utils.flop_counter.FlopCounterMode`
on the real model (dense convention, naive attention so every product is a counted matmul); the
analytical weight bytes against the real parameters; the weight bytes a decode step reads (embedding
rows, every matrix, and of a mixture of experts the experts its router chose) against the parameters
the engine reads; the analytical KV-cache bytes against the real cache's storage.
"""

from __future__ import annotations

from typing import Any

from llmperf.analysis.memory import weight_bytes_per_gpu
from llmperf.analysis.operators import ForwardModel, expected_experts_touched
from llmperf.analysis.vocabulary import Op, Phase
from llmperf.measure.profile.settings import ProfileSettings
from llmperf.specs import ModelSpec, Precision

PAGED_BLOCK = 16  # tokens per block of the paged cache (vLLM's default, the engine's)


ROUTED_OPS = frozenset({Op.gate_up_proj.value, Op.gate_proj.value, Op.up_proj.value, Op.down_proj.value})


def matmul_flops(spec: ModelSpec, prec: Precision, batch: int, q_len: int, kv_len: int) -> float:
    """The analytical matrix-product FLOPs of one forward pass as `FlopCounterMode` counts them: the
    dense convention (naive attention computes every score of its square), the matmul and attention
    kinds only (norms, soft-caps, sinks, RoPE are elementwise), and no bias adds (an `addmm` counts its
    product only; the router's score correction is an add too)."""
    bare = dict(qkv_bias=False, out_bias=False, mlp_bias=False)
    if spec.is_moe:
        bare.update(router_bias=False, router_score_bias=False)
    fm = ForwardModel(model=spec.scaled(**bare), precision=prec, attention="naive", attention_flops="dense")
    return float(sum(c.flops for c in fm.forward_ops(batch, q_len, kv_len) if c.kind in ("matmul", "attention")))


def step_weight_bytes(spec: ModelSpec, prec: Precision, batch: int, q_len: int, kv_len: int,
                      touched: dict[int, int] | None = None) -> float:
    """The analytical weight bytes one step reads, layer by layer (each of its kind): the embedding rows
    its tokens gather, every layer's matrices and norms (and attention sinks), the LM head. A MoE
    layer's routed experts are read for the experts the step touches: `touched[layer]` of them when
    given (what the engine's router chose), else the uniform-routing expectation
    (`expected_experts_touched`)."""
    fm = ForwardModel(model=spec, precision=prec)
    total = sum(float(c.weight_bytes) for c in fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len))
    expected = float(expected_experts_touched(batch * q_len, spec.num_experts, spec.experts_per_token))
    for i, kind in enumerate(spec.layer_kinds()):
        for c in fm.layer_ops(batch, q_len, kv_len, kind):
            w = float(c.weight_bytes)
            if kind.moe and c.name in ROUTED_OPS and touched is not None:
                w = w / expected * touched[i]  # the per-expert bytes times the experts touched
            total += w
    if spec.attn_sinks:  # one sink logit per head and layer, which the attention operators leave out of
        total += spec.num_layers * spec.num_heads * prec.act_bytes  # their bytes (llmperf.analysis.operators)
    return total


def engine_step_weight_bytes(model: Any, tokens: int, touched: dict[int, int] | None = None) -> int:
    """The bytes of the engine's parameters one step of `tokens` tokens reads: every parameter once
    (a tied LM head is the embedding, read whole), the embedding and learned positions for the rows
    gathered, and of each MoE layer's stacked expert tensors (`experts*` parameters of
    `llmperf.engine.moe.MoE`, one slice per expert) the slices of the `touched[layer]` experts."""
    spec = model.spec
    per_expert = {}
    for block in model.layers:
        if getattr(block, "moe_ffn", None) is not None:
            for name, p in block.moe_ffn.named_parameters():
                if name.startswith("experts"):
                    per_expert[id(p)] = block.index
    gathered = {id(model.embed_weight)} | ({id(model.pos_weight)} if model.pos_weight is not None else set())
    total = 0
    for p in model.parameters():  # a tied tensor once
        nbytes = p.numel() * p.element_size()
        if id(p) in gathered:
            rows = tokens * p.shape[1] * p.element_size()
            nbytes = rows + (nbytes if p is model.lm_head_weight else 0)
        elif id(p) in per_expert:
            if touched is None:
                raise ValueError("touched: a MoE step's expert bytes need the experts each layer touched")
            nbytes = nbytes // spec.num_experts * touched[per_expert[id(p)]]
        total += nbytes
    return total


def _check(name: str, analytical: float, real: float, real_name: str, context: str) -> dict[str, Any]:
    """A run.json check: the analytical count equals the real one, to the unit."""
    return dict(name=name, passed=int(analytical) == int(real),
                detail=f"analytical {int(analytical)} vs {real_name} {int(real)} ({context})")


def cross_checks(model: Any, spec: ModelSpec, prec: Precision, settings: ProfileSettings) -> list[dict[str, Any]]:
    """Exact checks of the analytical counts against the engine: matmul FLOPs of a prefill and of one
    decode step against `FlopCounterMode` (naive attention, so every product is a counted matmul),
    the weight bytes against the parameters, the weight bytes a decode step reads against the
    parameters it reads (with a MoE model's experts as its router chose them), the KV-cache bytes
    against the cache's storage."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from llmperf.engine import Engine, Recorder, SamplingParams
    from llmperf.engine.cache import make_cache
    from llmperf.engine.instrument import EXPERTS_TOUCHED

    checks = []
    # the decode step's context (seq + 1) within every sliding window and chunk: past them the engine's
    # naive attention still scores every cached key and masks the rest, where the analytical model
    # counts the keys a window or chunk sees
    spans = [k.window for k in spec.layer_kinds() if k.window is not None]
    batch, seq = min(max(settings.batches), 4), max(1, min(min(settings.prompt_lens), 32, *(w - 1 for w in spans)))
    gen = torch.Generator().manual_seed(settings.seed)
    prompts = torch.randint(0, spec.vocab_size, (batch, seq), generator=gen)
    backend = model.attention_backend
    try:
        model.set_attention("naive")  # every attention product a plain matmul the counter sees
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            model(prompts.to(model.device))
        prefill = counter.get_total_flops()
        rec = Recorder(model.device, ops=False)  # the steps' shapes and the experts each MoE layer touched
        with FlopCounterMode(display=False) as counter:
            Engine(model, cache=settings.kv, attention="naive").generate(
                prompts.tolist(), SamplingParams(max_new_tokens=2, min_new_tokens=2), seed=settings.seed, recorder=rec)
        generation = counter.get_total_flops()
    finally:
        model.set_attention(backend)
    checks.append(_check("matmul FLOPs vs FlopCounterMode", matmul_flops(spec, prec, batch, seq, seq), prefill,
                         "counted", f"prefill of {batch} x {seq} tokens, dense attention, logits of the last position"))
    dec = next(st for st in rec.trace.steps if st.phase == Phase.decode.value)
    checks.append(_check("decode-step matmul FLOPs vs FlopCounterMode",
                         matmul_flops(spec, prec, dec.batch, dec.q_len, dec.kv_len), generation - prefill,
                         "counted", f"a decode step of {dec.batch} sequences at context {dec.kv_len}: the "
                         "generation's count less its prefill's"))
    seen: set[int] = set()
    real = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:  # tied embeddings are one tensor
            seen.add(p.data_ptr())
            real += p.numel() * p.element_size()
    checks.append(_check("weight bytes vs parameters", weight_bytes_per_gpu(spec, prec), real, "real", "bytes"))
    touched = {c.layer: c.value for c in rec.trace.counts
               if c.name == EXPERTS_TOUCHED and c.phase == dec.phase and c.step == dec.step}
    experts = (f"; MoE layers' experts touched {[touched[i] for i in sorted(touched)]} of {spec.num_experts}"
               if spec.is_moe else "")
    checks.append(_check("decode-step weight bytes vs parameters read",
                         step_weight_bytes(spec, prec, dec.batch, 1, dec.kv_len, touched if spec.is_moe else None),
                         engine_step_weight_bytes(model, dec.batch, touched if spec.is_moe else None),
                         "real", f"bytes; {dec.batch} tokens' embedding rows{experts}"))
    b, ctx = max(settings.batches), max(settings.prompt_lens) + max(settings.gen_lens)
    cache = make_cache(settings.kv, spec, dtype=model.dtype, device=model.device, max_batch=b, max_seq_len=ctx,
                       block_size=PAGED_BLOCK)
    # a paged cache holds whole blocks of 16 tokens per sequence (the engine's default block size)
    slots = ctx if settings.kv == "contiguous" else -(-ctx // PAGED_BLOCK) * PAGED_BLOCK
    checks.append(_check("KV cache bytes vs cache storage", b * slots * spec.kv_bytes_per_token(prec.kv),
                         cache.capacity_bytes, "real", f"bytes; {settings.kv}, {b} x {slots} token slots"))
    del cache
    return checks
