"""Today's models, operator by operator (issue 22): layers of different kinds (full, sliding,
chunked attention; NoPE; MoE or dense FFN), multi-head latent attention in both forms, shared
experts and the small operators. Specs are built by hand from the public configs (shared/
ARCHITECTURES.md); every expected value is computed in the test or its comment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.analysis import Efficiency, ForwardModel, estimate
from llmperf.analysis.operators import attended_pairs, expected_experts_touched, keys_read
from llmperf.analysis.rollup import decode_sums, phase_arrays
from llmperf.analysis.roofline import OpCost, op_time
from llmperf.analysis.routing import busiest_expert_load
from llmperf.specs import ModelSpec, Precision, load_hardware


def gemma2_like(**kw) -> ModelSpec:
    """Gemma 2's structure at toy size: sliding and full layers alternating, soft-caps, sandwich
    norms, the scaled embedding."""
    base = dict(name="toy-gemma2", vocab_size=256, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                head_dim=32, ffn_size=128, hidden_act="gelu_pytorch_tanh", max_positions=4096,
                layer_types=("sliding", "full") * 2, sliding_window=16, attn_softcap=50.0, final_softcap=30.0,
                sandwich_norms=True, embedding_scale=True, tied_embeddings=True)
    return ModelSpec(**{**base, **kw})


def llama4_like(**kw) -> ModelSpec:
    """Llama 4's structure at toy size: 3 chunked (RoPE) layers to 1 global NoPE layer, L2 q/k norm
    on the RoPE layers, MoE with one shared expert on every other layer."""
    base = dict(name="toy-llama4", vocab_size=256, hidden_size=64, num_layers=8, num_heads=4, num_kv_heads=2,
                ffn_size=192, moe_ffn_size=64, num_experts=4, experts_per_token=1, shared_experts=1,
                max_positions=4096, layer_types=("chunked", "chunked", "chunked", "full") * 2,
                attention_chunk_size=8, nope_layers=(3, 7), qk_norm="l2", dense_layers=(0, 2, 4, 6))
    return ModelSpec(**{**base, **kw})


def gpt_oss_like(**kw) -> ModelSpec:
    base = dict(name="toy-gpt-oss", vocab_size=256, hidden_size=64, num_layers=4, num_heads=8, num_kv_heads=2,
                head_dim=16, ffn_size=96, num_experts=8, experts_per_token=2, max_positions=4096,
                layer_types=("sliding", "full") * 2, sliding_window=12, attn_sinks=True, router_bias=True,
                qkv_bias=True, out_bias=True, mlp_bias=True)
    return ModelSpec(**{**base, **kw})


def deepseek_v3(**kw) -> ModelSpec:
    """DeepSeek-V3 (config.json): 61 layers, the first 3 dense (18432), 256 routed experts of 2048,
    8 per token, 1 shared; MLA with q_lora_rank 1536, kv_lora_rank 512, nope 128, rope 64, v 128."""
    base = dict(name="deepseek-v3-code", vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128,
                num_kv_heads=128, ffn_size=18432, moe_ffn_size=2048, num_experts=256, experts_per_token=8,
                shared_experts=1, dense_layers=(0, 1, 2), router_score_bias=True, q_lora_rank=1536,
                kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                head_dim=192, max_positions=163840, dtype="bf16")
    return ModelSpec(**{**base, **kw})


def _by_layer(fm: ForwardModel, batch, q_len, kv_len) -> list:  # noqa: ANN001
    """Every operator of every layer, one layer at a time (the brute-force forward pass)."""
    out = fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len)
    for kind in fm.model.layer_kinds():
        out += fm.layer_ops(batch, q_len, kv_len, kind=kind)
    return out


# ---- per-layer kinds ---------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [gemma2_like, llama4_like, gpt_oss_like, deepseek_v3])
@pytest.mark.parametrize("attention", ["fused", "naive"])
@pytest.mark.parametrize("shape", [(2, 40, 40), (3, 1, 77), (1, 9, 30)])
def test_forward_pass_is_the_sum_over_every_layer(make, attention, shape):
    fm = ForwardModel(model=make(), precision=Precision(), attention=attention)
    grouped, brute = fm.forward_ops(*shape), _by_layer(fm, *shape)
    for field in ("flops", "bytes_total", "weight_bytes", "kv_read_bytes", "calls"):
        assert sum(getattr(o, field) for o in grouped) == pytest.approx(sum(getattr(o, field) for o in brute),
                                                                         rel=1e-12)


def test_gemma2_alternates_sliding_and_full_layers():
    m = gemma2_like()
    assert [(k.label, n) for k, n in m.layer_groups()] == [("sliding-16", 2), ("full", 2)]
    fm = ForwardModel(model=m, precision=Precision())
    ops = fm.forward_ops(1, 1, 100)  # a decode step at context 100: sliding layers read 16 keys, full 100
    attn = {o.layer: o for o in ops if o.name == "attention"}
    per_key = 2 * 2 * 32 * 2  # K and V, 2 KV heads x 32, fp16
    assert attn["sliding-16"].kv_read_bytes == 2 * 16 * per_key
    assert attn["full"].kv_read_bytes == 2 * 100 * per_key
    names = [o.name for o in ops]
    assert names[:2] == ["embed", "embed_scale"] and names[-3:] == ["final_norm", "lm_head", "final_softcap"]
    assert names.count("post_attn_norm") == 2  # one per attention kind
    # the FFN part (the same in both kinds) appears once, for the four layers, labelled with both kinds
    post_mlp, = [o for o in ops if o.name == "post_mlp_norm"]
    assert (post_mlp.calls, post_mlp.layer) == (4, "sliding-16+full")


def test_gpt_oss_windows_128_every_other_layer():
    """gpt-oss-20b's attention: 24 layers alternating sliding (128) and full, 64 heads of 64, 8 KV
    heads. A decode step at context 4096 reads 12 x 128 + 12 x 4096 keys per KV head."""
    m = ModelSpec(name="gpt-oss-20b-code", vocab_size=201088, hidden_size=2880, num_layers=24, num_heads=64,
                  num_kv_heads=8, head_dim=64, ffn_size=2880, num_experts=32, experts_per_token=4,
                  layer_types=("sliding", "full") * 12, sliding_window=128, attn_sinks=True, router_bias=True,
                  qkv_bias=True, out_bias=True, mlp_bias=True, max_positions=131072)
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"))
    kv = sum(o.kv_read_bytes for o in fm.forward_ops(1, 1, 4096) if o.name == "attention")
    assert kv == (12 * 128 + 12 * 4096) * 2 * 8 * 64 * 2


def test_llama4_chunked_layers_and_nope_global_layers():
    m = llama4_like()
    fm = ForwardModel(model=m, precision=Precision())
    ops = fm.forward_ops(1, 20, 20)
    rope = [o for o in ops if o.name == "rope"]
    # the attention of the chunked layers is the same in their dense and MoE kinds: one row for six layers
    assert sum(o.calls for o in rope) == 6 and {o.layer for o in rope} == {"chunked-8+chunked-8/moe"}
    assert sum(o.calls for o in ops if o.name == "qk_norm") == 6  # L2: on the RoPE layers only
    assert sum(o.calls for o in ops if o.name == "router") == 4  # every other layer is MoE
    assert sum(o.calls for o in ops if o.name == "shared_down_proj") == 4
    # dense layers use ffn_size, routed experts moe_ffn_size
    dense = [o for o in ops if o.name == "down_proj" and "moe" not in o.layer]
    assert sum(o.flops for o in dense) == 4 * 2 * 20 * 192 * 64
    # a chunked layer's query at position p sees p mod 8 + 1 keys: 20 queries see 36 + 36 + 10 = 82 pairs
    assert attended_pairs(20, 20, True, chunk=8) == 82
    attn = {o.layer: o for o in ops if o.name == "attention"}
    assert attn["chunked-8+chunked-8/moe"].flops == 6 * 2 * 4 * 82 * 16 * 2  # six such layers, 4 heads, QK + PV of 16
    assert attn["full/moe/nope"].flops == 2 * 2 * 4 * (20 * 21 // 2) * 16 * 2


@settings(max_examples=60)
@given(st.integers(1, 40), st.integers(0, 60), st.integers(1, 20), st.sampled_from(["window", "chunk"]))
def test_pairs_and_keys_match_an_explicit_mask(q_len, past, span, how):
    kv = past + q_len
    mask = np.zeros((q_len, kv), dtype=bool)
    for i in range(q_len):
        p = past + i
        lo = p - span + 1 if how == "window" else (p // span) * span
        mask[i, max(lo, 0):p + 1] = True
    kw = {how: span}
    assert attended_pairs(q_len, kv, True, **kw) == mask.sum()
    assert keys_read(q_len, kv, **kw) == kv - np.argmax(mask.any(axis=0))


class _Slow:
    """A time model with efficiencies and a per-launch overhead (keyed on rows only)."""

    name = "slow"

    def efficiency(self, cost, hardware):  # noqa: ANN001, ANN201
        return Efficiency(e_compute=0.5, e_memory=0.7, overhead_s=1e-6)


@pytest.mark.parametrize("bad", [dict(e_compute=1.5), dict(e_memory=0.0), dict(e_compute=float("nan")),
                                 dict(e_comm=np.float64(2.0)), dict(overhead_s=-1e-6), dict(floor_s=float("inf")),
                                 dict(host_s=float("nan")), dict(e_memory=np.array([0.5, 1.2])),
                                 dict(latency_s=np.array([0.0, -1.0]))])
def test_op_time_refuses_an_efficiency_out_of_range(bad):
    """Efficiencies in (0, 1], overheads finite and >= 0: plain floats (checked as floats), numpy
    scalars and arrays alike."""
    field = next(iter(bad))

    class Bad:
        name = "bad"

        def efficiency(self, cost, hardware):  # noqa: ANN001, ANN202
            return Efficiency(**(dict(e_compute=0.5, e_memory=0.7) | bad))

    cost = OpCost(name="gemm", kind="matmul", flops=1e9, weight_bytes=1e6)
    hw = load_hardware("a100-80gb-sxm")
    assert op_time(cost, hw, "fp16", _Slow()).time_s > 0
    with pytest.raises(ValueError, match=f"time model 'bad': {field} for gemm must be"):
        op_time(cost, hw, "fp16", Bad())


@pytest.mark.parametrize("make", [gemma2_like, llama4_like, gpt_oss_like])
@pytest.mark.parametrize("prompt,gen", [(3, 40), (15, 9), (16, 2), (29, 31), (1, 1), (100, 5)])
@pytest.mark.parametrize("tm", [None, _Slow()])
def test_decode_closed_form_equals_the_sum_of_its_steps(make, prompt, gen, tm):
    hw = load_hardware("a100-80gb-sxm")
    fm = ForwardModel(model=make(), precision=Precision())
    batch = np.array([1.0, 7.0])
    t, f, b = decode_sums(fm, hw, batch, np.full(2, float(prompt)), np.full(2, float(gen)), pp=1,
                          compute_dtype="fp16", time_model=tm)
    want_t = want_f = want_b = 0.0
    for j in range(1, gen):
        step = phase_arrays(fm, hw, batch, 1.0, prompt + j + 0.0, pp=1, compute_dtype="fp16", time_model=tm)
        want_t, want_f, want_b = want_t + step.time_s, want_f + step.flops, want_b + step.bytes_total
    np.testing.assert_allclose(t, want_t, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(f, want_f, rtol=1e-12, atol=0)
    np.testing.assert_allclose(b, want_b, rtol=1e-12, atol=0)


def test_estimate_of_a_hybrid_model_keeps_its_step_series():
    est = estimate(llama4_like(), "a100-80gb-sxm", batch=3, prompt_len=5, gen_len=30)
    assert est.decode_step_times_s().sum() == pytest.approx(est.decode_total_s, rel=1e-12)
    layer = est.prefill.layer_frame()
    # attention parts by attention kind, FFN parts by FFN kind (the MoE FFN is shared by two kinds)
    assert set(layer["layer"]) == {"chunked-8+chunked-8/moe", "chunked-8", "chunked-8/moe+full/moe/nope",
                                   "full/moe/nope"}


# ---- multi-head latent attention ---------------------------------------------------------------------
def test_deepseek_v3_parameters():
    m = deepseek_v3()
    assert m.param_count == pytest.approx(671.03e9, rel=1e-4)
    assert m.kv_width_per_token_per_layer == 576


@pytest.mark.parametrize("tp", [1, 8])
def test_absorbed_mla_decode_attention_intensity(tp):
    """2 n (2r + dr) / ((r + dr) b) = 2 x 128 x 1088 / (576 x 2) = 241.8 FLOP/B with every head on
    one GPU; tensor parallelism splits the heads but not the latent, so it falls by tp."""
    fm = ForwardModel(model=deepseek_v3(), precision=Precision.uniform("bf16"), tp=tp)
    (att,) = fm.attention_ops(4, 1, 1 << 20)
    assert att.intensity == pytest.approx(2 * 128 * 1088 / (576 * 2) / tp, rel=1e-3)
    assert att.kv_read_bytes == 4 * (1 << 20) * 576 * 2  # the whole latent, on every rank
    assert fm.kv_write(4, 1, 100).kv_write_bytes == 4 * 576 * 2
    # unabsorbed decode would read per-head K and V: 128 x (192 + 128) wide, an intensity near 1
    (naive,) = ForwardModel(model=deepseek_v3(), precision=Precision.uniform("bf16"), tp=tp,
                            mla_mode="unabsorbed").attention_ops(4, 1, 1 << 20)
    assert naive.intensity == pytest.approx(1.0, rel=1e-2)


def test_mla_auto_is_unabsorbed_in_prefill_and_absorbed_in_decode():
    m = deepseek_v3()
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"))
    prefill = [o.name for o in fm.layer_ops(1, 64, 64)]
    decode = [o.name for o in fm.layer_ops(1, 1, 64)]
    assert prefill[:7] == ["attn_norm", "q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "kv_b_proj"]
    assert "q_absorb" not in prefill and "v_absorb" not in prefill
    assert "kv_b_proj" not in decode and {"q_absorb", "v_absorb"} <= set(decode)
    # arrays of q_len take each row's own form, the same counts as one at a time
    q = np.array([1.0, 64.0])
    mixed = fm.forward_ops(np.ones(2), q, np.array([64.0, 64.0]))
    for i, qi in enumerate((1, 64)):
        one = fm.forward_ops(1, qi, 64)
        for field in ("flops", "bytes_total", "calls"):
            assert sum(np.broadcast_to(getattr(o, field), (2,))[i] for o in mixed) == pytest.approx(
                sum(getattr(o, field) for o in one), rel=1e-12)


def test_mla_operator_counts():
    """Per token, DeepSeek-V3 (n 128, q rank 1536, r 512, dn 128, dr 64, dv 128, H 7168)."""
    m = deepseek_v3()
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"))
    n, r, dn, dr, dv, h = 128, 512, 128, 64, 128, 7168
    dec = {o.name: o for o in fm.layer_ops(1, 1, 1000)}
    assert dec["q_a_proj"].flops == 2 * h * 1536 and dec["q_b_proj"].flops == 2 * 1536 * n * (dn + dr)
    assert dec["kv_a_proj"].flops == 2 * h * (r + dr)
    assert dec["q_absorb"].flops == 2 * n * dn * r and dec["v_absorb"].flops == 2 * n * r * dv
    assert dec["q_absorb"].weight_bytes + dec["v_absorb"].weight_bytes == r * n * (dn + dv) * 2
    assert dec["attention"].flops == 2 * n * 1000 * (r + dr) + 2 * n * 1000 * r
    assert dec["o_proj"].flops == 2 * n * dv * h
    assert dec["rope"].flops == 3 * (n + 1) * dr
    # prefill of a 100-token chunk over 900 cached tokens: kv_b_proj up-projects all 1000 latents
    fm_u = ForwardModel(model=m, precision=Precision.uniform("bf16"), attention_flops="dense")
    chunk = {o.name: o for o in fm_u.layer_ops(1, 100, 1000)}
    assert chunk["kv_b_proj"].flops == 2 * 1000 * r * n * (dn + dv)
    assert chunk["kv_b_proj"].kv_read_bytes == 900 * r * 2
    assert chunk["attention"].flops == 2 * n * 100 * 1000 * (dn + dr) + 2 * n * 100 * 1000 * dv
    assert chunk["attention"].kv_read_bytes == 0  # K and V are activations in the unabsorbed form


def test_mla_tp_splits_heads_not_the_latent():
    one = {o.name: o for o in ForwardModel(model=deepseek_v3(), precision=Precision(), tp=1).layer_ops(2, 1, 500)}
    eight = {o.name: o for o in ForwardModel(model=deepseek_v3(), precision=Precision(), tp=8).layer_ops(2, 1, 500)}
    assert eight["q_b_proj"].flops * 8 == one["q_b_proj"].flops
    assert eight["kv_a_proj"].flops == one["kv_a_proj"].flops  # replicated
    assert eight["attention"].flops * 8 == one["attention"].flops
    assert eight["attention"].kv_read_bytes == one["attention"].kv_read_bytes
    assert eight["kv_write"].kv_write_bytes == one["kv_write"].kv_write_bytes


def test_deepseek_v3_dense_and_moe_layers():
    m = deepseek_v3()
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"))
    ops = fm.forward_ops(1, 1, 100)
    dense = [o for o in ops if o.name == "gate_proj" and "moe" not in o.layer]
    routed = [o for o in ops if o.name == "gate_proj" and "moe" in o.layer]
    assert dense[0].calls == 3 and dense[0].flops == 3 * 2 * 7168 * 18432
    assert routed[0].calls == 58 and routed[0].flops == 58 * 8 * 2 * 7168 * 2048
    (shared,) = [o for o in ops if o.name == "shared_gate_proj"]
    assert shared.flops == 58 * 2 * 7168 * 2048
    (router,) = [o for o in ops if o.name == "router"]
    assert router.flops == 58 * (2 * 7168 * 256 + 256)  # + the score-correction bias
    # one token's matrix FLOPs are 2 per active matrix parameter (MLA absorbed in decode re-uses
    # kv_b_proj's matrices; the unabsorbed prefill of one token applies them once)
    pre = ForwardModel(model=m, precision=Precision(), mla_mode="unabsorbed", all_logits=True)
    matmul = sum(o.flops for o in pre.forward_ops(1, 1, 1) if o.kind == "matmul")
    h = m.hidden_size
    not_matrices = (m.embedding_params + (2 * m.num_layers + 1) * m.norm_params
                    + m.num_layers * (1536 + 512) + m.num_moe_layers * 256)  # q_a/kv_a norms, score bias
    assert matmul == 2 * (m.active_param_count - not_matrices) + m.num_moe_layers * 256
    assert h == 7168


# ---- small operators ------------------------------------------------------------------------------------
def test_softcap_sinks_and_qk_norm_are_counted():
    g = gemma2_like(qk_norm="rmsnorm")
    fused = {(o.name, o.layer): o for o in ForwardModel(model=g, precision=Precision()).layer_ops(1, 10, 10)}
    naive_ops = ForwardModel(model=g, precision=Precision(), attention="naive").layer_ops(1, 10, 10)
    naive = {o.name: o for o in naive_ops}
    pairs = 55  # 10 causal queries (window 16 not reached)
    assert naive["attn_softcap"].flops == 3 * 4 * 100  # over the whole square of S
    matmul = 2 * 4 * pairs * 32 * 2
    assert fused[("attention", "sliding-16")].flops == matmul + 3 * 4 * pairs
    assert fused[("qk_norm", "sliding-16")].flops == 4 * 10 * (4 + 2) * 32
    o = gpt_oss_like()
    att = ForwardModel(model=o, precision=Precision()).attention_ops(2, 5, 5)[0]
    assert att.flops == 2 * 8 * 15 * 16 * 2 * 2 + 2 * 2 * 8 * 5  # the sink: 2 FLOPs per row and head
    sm = {x.name: x for x in ForwardModel(model=o, precision=Precision(), attention="naive").attention_ops(2, 5, 5)}
    assert sm["attn_softmax"].flops == 5 * 2 * 8 * 5 * (5 + 1)  # one more column


def test_every_small_operator_is_in_the_vocabulary_and_forward_order():
    from llmperf.analysis.vocabulary import Op
    for make in (gemma2_like, llama4_like, gpt_oss_like, deepseek_v3):
        for attention in ("fused", "naive"):
            fm = ForwardModel(model=make(), precision=Precision(), attention=attention)
            for kind, _, ops in fm.group_ops(2, 3, 9):
                order = [list(Op).index(Op(o.name)) for o in ops]
                assert order == sorted(order) and len(order) == len(set(order)), kind.label


@pytest.mark.parametrize("make", [gemma2_like, llama4_like, gpt_oss_like, deepseek_v3])
def test_the_serving_cost_model_prices_every_layer_kind(make):
    """The step cost model fits each layer kind's attention (as full attention; MLA absorbed) and
    prices a decode step of one layer kind's sequences like the analytical model does without windows."""
    from llmperf.serving.costmodel import StepCostModel
    hw = load_hardware("h100-sxm")
    m = make()
    cm = StepCostModel(model=m, hardware=hw, precision=Precision.uniform("bf16"))
    assert sum(p.layers for p in cm.parts) == m.num_layers * len(cm.parts) // len(m.layer_groups())
    t = cm.step_time_s([1, 1], [7, 9], logit_rows=2)
    assert t > 0 and cm.step_time_s([5], [5], logit_rows=1) > 0


def test_mla_decode_attention_turns_compute_bound_below_its_intensity():
    """Absorbed MLA decode attention tends to 241.8 FLOP/B (bf16, every head on one GPU): above an
    A100's ridge (153), so from some context on it is compute-bound; below an H100's (295), so never;
    with tp = 2 on the A100 (120.9 FLOP/B) never either. GQA decode attention never is."""
    from llmperf.analysis.regimes import estimate_regimes
    m = deepseek_v3()
    a100, h100 = load_hardware("a100-80gb-sxm"), load_hardware("h100-sxm")
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"))
    r = estimate_regimes(fm, a100, batch=8, context=4096, compute_dtype="bf16")
    c = r.attention_critical_context
    assert c is not None and c < 4096
    (att,) = fm.attention_ops(8, 1, c)
    (before,) = fm.attention_ops(8, 1, c - 1)
    assert att.intensity > a100.ridge_point("bf16") >= before.intensity
    assert estimate_regimes(fm, h100, batch=8, context=4096, compute_dtype="bf16").attention_critical_context is None
    tp2 = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=2)
    assert estimate_regimes(tp2, a100, batch=8, context=4096, compute_dtype="bf16").attention_critical_context is None
    gqa = ForwardModel(model=gpt_oss_like(), precision=Precision())
    assert estimate_regimes(gqa, a100, batch=8, context=4096, compute_dtype="fp16").attention_critical_context is None


# ---- expert parallelism and data-parallel attention ------------------------------------------------------
def test_ep_and_dp_attention_are_refused_by_name_when_they_do_not_fit():
    from llmperf.errors import SpecError
    m = deepseek_v3()
    for kw, text in ((dict(tp=8, ep=3), "ep: 3 does not divide tp=8"),
                     (dict(tp=4, ep=4, dp_attention=False, model=gemma2_like()), "ep: 4 needs a mixture-of-experts"),
                     (dict(tp=8, ep=2, dp_attention=True), "ep: 2 must equal tp=8 with dp_attention"),
                     (dict(tp=8, ep=0), "ep: must be a positive integer")):
        kw = {"model": m, **kw}
        with pytest.raises(SpecError, match=text):
            ForwardModel(precision=Precision(), **kw)
    with pytest.raises(SpecError, match="ep: 3 does not divide .*num_experts=8"):
        ForwardModel(model=gpt_oss_like(), precision=Precision(), tp=3, ep=3)


def test_expert_parallel_experts_cost_the_busiest_gpus_share():
    """Within a tp group, ep splits the experts instead of each expert's width: the mean GPU's FLOPs and
    bytes of the routed experts are tp's, and the step waits for the busiest GPU, whose rows and experts
    touched exceed the mean by uniform random routing's spread (`busiest_expert_load`; tp splits every
    expert over every GPU, so it has none); the tokens stay replicated (tp attention), so the all-reduce
    combines them and no all-to-all is needed."""
    m = deepseek_v3()
    tp = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=8)
    ep = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=8, ep=8)
    excess = []
    for batch in (1, 64, 4096):
        a = {o.name: o for o in tp.layer_ops(batch, 1, 100, kind=m.layer_kinds()[-1])}
        b = {o.name: o for o in ep.layer_ops(batch, 1, 100, kind=m.layer_kinds()[-1])}
        rows, touched = busiest_expert_load(batch, 256, 8, 8)
        mean_rows, mean_touched = batch * 8 / 8, expected_experts_touched(batch, 256, 8) / 8
        for name in ("gate_proj", "up_proj", "down_proj"):
            assert b[name].flops == pytest.approx(a[name].flops * rows / mean_rows, rel=1e-12)
            assert b[name].weight_bytes == pytest.approx(a[name].weight_bytes * touched / mean_touched, rel=1e-12)
        assert "moe_dispatch" not in b and "mlp_allreduce" in b
        excess.append(rows / mean_rows)
    assert excess[0] > excess[1] > excess[2] > 1.0 and excess[2] < 1.03  # falls as the batch grows


def test_the_routers_choice_and_the_sum_of_expert_outputs_are_counted():
    """DeepSeek-V3 at 5 tokens: the choice reads the 256 logits and writes 8 (weight, id, index) of 12
    bytes per token; the sum reads each token's 8 expert outputs and their fp32 weights and writes one
    hidden vector. Llama 4's choice also writes the chosen experts' scaled inputs. Both run after their
    neighbours, in forward order, once per MoE layer."""
    m = deepseek_v3()
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"))
    ops = {o.name: o for o in fm.layer_ops(5, 1, 100, kind=m.layer_kinds()[-1])}
    route, total = ops["moe_route"], ops["moe_sum"]
    assert (route.kind, route.flops, route.act_read_bytes, route.act_write_bytes) == (
        "elementwise", 4 * 5 * 256, 5 * 256 * 2, 5 * 8 * 12)
    assert (total.kind, total.flops, total.act_read_bytes, total.act_write_bytes) == (
        "elementwise", 2 * 5 * 8 * 7168, 5 * 8 * (7168 * 2 + 4), 5 * 7168 * 2)
    names = list(ops)
    assert names.index("router") + 1 == names.index("moe_route")
    assert names.index("down_proj") + 1 == names.index("moe_sum")
    assert "moe_route" not in {o.name for o in fm.layer_ops(5, 1, 100, kind=m.layer_kinds()[0])}  # a dense layer
    forward = fm.forward_ops(5, 1, 100)
    assert sum(o.calls for o in forward if o.name in ("moe_route", "moe_sum")) == 2 * m.num_moe_layers
    # expert parallelism with tp attention: each GPU sums its experts' rows into every token;
    # with dp attention the rows come home first and each GPU sums its own tokens' k rows
    ep = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=8, ep=8)
    dp = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=8, ep=8, dp_attention=True)
    (a,) = [o for o in ep.layer_ops(64, 1, 100, kind=m.layer_kinds()[-1]) if o.name == "moe_sum"]
    (b,) = [o for o in dp.layer_ops(64, 1, 100, kind=m.layer_kinds()[-1]) if o.name == "moe_sum"]
    busiest = busiest_expert_load(64, 256, 8, 8)[0]  # the rows routed to the busiest GPU's experts
    assert (a.flops, a.act_write_bytes) == (pytest.approx(2 * busiest * 7168), 64 * 7168 * 2)
    assert (b.flops, b.act_write_bytes) == (2 * 8 * 8 * 7168, 8 * 7168 * 2)
    names = [o.name for o in dp.layer_ops(64, 1, 100, kind=m.layer_kinds()[-1])]
    assert names.index("moe_combine") + 1 == names.index("moe_sum")
    scaled = llama4_like(router_scoring="sigmoid", router_renormalize=False, router_input_scaling=True)
    scaled_ops = ForwardModel(model=scaled, precision=Precision()).layer_ops(3, 1, 9, kind=scaled.layer_kinds()[-1])
    (r,) = [o for o in scaled_ops if o.name == "moe_route"]
    e, k, h, a = scaled.num_experts, scaled.experts_per_token, scaled.hidden_size, 2
    assert r.act_write_bytes == 3 * k * 12 + 3 * k * h * a and r.act_read_bytes == 3 * e * a + 3 * h * a


def test_dp_attention_runs_whole_attention_on_each_gpus_sequences():
    m = deepseek_v3()
    dp = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=8, ep=8, dp_attention=True)
    one = ForwardModel(model=m, precision=Precision.uniform("bf16"))
    moe = {o.name: o for o in dp.layer_ops(64, 1, 1000, kind=m.layer_kinds()[-1])}
    ref = {o.name: o for o in one.layer_ops(8, 1, 1000, kind=m.layer_kinds()[-1])}  # 64 / 8 sequences
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj", "q_absorb", "attention", "v_absorb", "o_proj", "router",
                 "shared_gate_proj"):
        assert moe[name].flops == ref[name].flops and moe[name].bytes_total == ref[name].bytes_total, name
    assert "attn_allreduce" not in moe and "mlp_allreduce" not in moe
    # each GPU sends its 8 tokens x 8 experts x 7168 x 2 bytes, 7/8 of them leave; the busiest GPU's
    # experts receive more than the mean 64 rows (uniform random routing), each way
    busiest = busiest_expert_load(64, 256, 8, 8)[0]
    assert 64 < busiest < 80
    for name in ("moe_dispatch", "moe_combine"):
        assert moe[name].comm_bytes == pytest.approx(busiest * 7168 * 2 * 7 / 8) and moe[name].kind == "comm"
    # routed experts: 32 of 256 per GPU, whole; the group's 64 x 8 routed rows, the busiest GPU's share
    assert moe["gate_proj"].flops == pytest.approx(busiest * 2 * 7168 * 2048)
    # dense layers stay split tp ways over every token, with their collective
    dense = {o.name: o for o in dp.layer_ops(64, 1, 1000, kind=m.layer_kinds()[0])}
    assert dense["gate_proj"].flops == 64 * 2 * 7168 * 18432 / 8 and "mlp_allreduce" in dense
    # the attention's intensity is the one-GPU intensity: every head, the GPU's own latents
    assert moe["attention"].intensity == pytest.approx(ref["attention"].intensity)


def test_estimate_and_sweep_take_ep_dp_attention_and_mla_mode():
    from llmperf.analysis import sweep
    m = deepseek_v3(num_layers=4, dense_layers=(0,))
    kw = dict(batch=16, prompt_len=256, gen_len=32, tp=8, ep=8, dp_attention=True, mla_mode="absorbed")
    est = estimate(m, "h100-sxm", **kw)
    row = est.summary()
    assert (row["ep"], row["dp_attention"], row["mla_mode"]) == (8, True, "absorbed")
    assert "q_absorb" in set(est.prefill.to_frame()["op"])  # absorbed in prefill too
    s = sweep([m], ["h100-sxm"], batch=[16], prompt_len=[256], gen_len=[32], tp=8, ep=8, dp_attention=True,
              mla_mode="absorbed").iloc[0]
    assert s.tpot_s == pytest.approx(est.tpot_s, rel=1e-12) and s.ttft_s == pytest.approx(est.ttft_s, rel=1e-12)
    auto = estimate(m, "h100-sxm", batch=16, prompt_len=256, gen_len=32, tp=8)
    assert "kv_b_proj" in set(auto.prefill.to_frame()["op"]) and auto.summary()["mla_mode"] == "auto"


def test_per_module_formats_store_and_run_each_matrix_in_its_modules_format():
    """A checkpoint's per-module formats (gpt-oss: MXFP4 experts, the rest bf16): the expert matrices
    are stored at 4.25 bits and run at fp4 where the device has fp4 units (B200), at the activations'
    bf16 elsewhere (W4A16 on an H100, not the fp8 that fp4 would fall back to); attention stays bf16."""
    from llmperf.specs.precision import MXFP4

    m = gpt_oss_like(qkv_bias=False, out_bias=False, mlp_bias=False, router_bias=False)
    prec = Precision(weights="bf16", activations="bf16", kv="bf16", modules={"expert": "mxfp4"})
    fm = ForwardModel(model=m, precision=prec)
    ops = {o.name: o for o in fm.layer_ops(64, 1, 10, kind=m.layer_kinds()[0])}
    touched = ops["down_proj"].weight_bytes / MXFP4.matrix_bytes(96, 64)
    assert 1 < touched <= 8 and ops["down_proj"].compute_dtype == "fp4"
    assert ops["o_proj"].weight_bytes == 8 * 16 * 64 * 2 and ops["o_proj"].compute_dtype == "bf16"
    big = ForwardModel(model=m, precision=prec).layer_ops(4096, 1, 10, kind=m.layer_kinds()[0])
    down = next(o for o in big if o.name == "down_proj")
    h100, b200 = load_hardware("h100-sxm"), load_hardware("b200")
    assert op_time(down, h100, "bf16").compute_s == pytest.approx(down.flops / h100.peak_flops_per_s("bf16"))
    assert op_time(down, b200, "bf16").compute_s == pytest.approx(down.flops / b200.peak_flops_per_s("fp4"))
    fp8 = Precision(weights="bf16", activations="bf16", kv="bf16", modules={"expert": "fp8-block128"})
    down8 = next(o for o in ForwardModel(model=m, precision=fp8).layer_ops(4096, 1, 10, kind=m.layer_kinds()[0])
                 if o.name == "down_proj")
    assert op_time(down8, h100, "bf16").compute_s == pytest.approx(down8.flops / h100.peak_flops_per_s("fp8"))
    a100 = load_hardware("a100-80gb-sxm")  # no fp8 units: W8A16 at the bf16 peak
    assert op_time(down8, a100, "bf16").compute_s == pytest.approx(down8.flops / a100.peak_flops_per_s("bf16"))


@settings(max_examples=25)
@given(st.lists(st.sampled_from(["full", "sliding", "chunked"]), min_size=1, max_size=4), st.integers(1, 20),
       st.integers(1, 20), st.integers(1, 40), st.integers(1, 30), st.booleans())
def test_decode_closed_form_for_any_layer_pattern(types, window, chunk, prompt, gen, mla):
    """Random mixes of full, sliding and chunked layers (MLA or GQA): the closed form over the decode
    steps equals the sum of the steps."""
    kw = dict(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8) if mla else {}
    m = ModelSpec(name="mix", vocab_size=64, hidden_size=32, num_layers=len(types), num_heads=4, num_kv_heads=2,
                  ffn_size=48, max_positions=4096, layer_types=tuple(types), sliding_window=window,
                  attention_chunk_size=chunk, **kw)
    hw = load_hardware("h100-sxm")
    fm = ForwardModel(model=m, precision=Precision())
    t, f, b = decode_sums(fm, hw, 3.0, float(prompt), float(gen), pp=1, compute_dtype="fp16", time_model=_Slow())
    steps = [phase_arrays(fm, hw, 3.0, 1.0, prompt + j + 0.0, pp=1, compute_dtype="fp16", time_model=_Slow())
             for j in range(1, gen)]
    assert float(t) == pytest.approx(sum(float(s.time_s) for s in steps), rel=1e-10, abs=1e-15)
    assert float(f) == pytest.approx(sum(float(s.flops) for s in steps), rel=1e-12, abs=0)
    assert float(b) == pytest.approx(sum(float(s.bytes_total) for s in steps), rel=1e-12, abs=0)


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "llama-4-maverick", "llama-3.1-8b"])
@pytest.mark.parametrize("impl", ["fused", "naive"])
def test_attention_core_ops_are_forward_ops_attention_cores(name, impl):
    """`ForwardModel.attention_core_ops` (the regime search's attention-bound predicate) gives exactly
    the attention-core operators of `forward_ops`, counts and order included."""
    from llmperf.analysis.vocabulary import ATTENTION_OPS
    from llmperf.specs import load_model

    core = {op.value for op in ATTENTION_OPS}
    fm = ForwardModel(model=load_model(name), precision=Precision(), attention=impl)
    b, ctx = np.array([[1.0], [8.0]]), np.array([[100.0, 5000.0, 70000.0]])
    for q in (1, 64):
        want = [o for o in fm.forward_ops(b, q, ctx) if o.name in core]
        got = fm.attention_core_ops(b, q, ctx)
        assert [(o.name, o.layer, o.calls) for o in got] == [(o.name, o.layer, o.calls) for o in want]
        for g, w in zip(got, want):
            for f in ("flops", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes", "rows"):
                np.testing.assert_array_equal(getattr(g, f), getattr(w, f))


def test_phase_op_finds_a_shared_operator_by_either_kind():
    """DeepSeek-V3's attention is one row for its dense and MoE layers (`full+full/moe`): asking for
    either kind finds it; the FFN rows stay per kind."""
    from llmperf.analysis import estimate

    est = estimate("deepseek-v3", "h200", batch=1, prompt_len=64, gen_len=2)
    shared = est.prefill.op("o_proj", layer="full/moe")
    assert shared is est.prefill.op("o_proj", layer="full") and shared.cost.layer == "full+full/moe"
    assert shared.cost.calls == 61
    assert est.prefill.op("down_proj", layer="full").cost.calls == 3
    assert est.prefill.op("down_proj", layer="full/moe").cost.calls == 58


def test_peak_fraction_counts_the_faster_formats_modules_run_in():
    """DeepSeek-V3 ships fp8 block-wise: its matmuls run at the H200's fp8 peak while the phase's compute
    dtype is bf16. The achieved fraction of peak is measured against the fastest peak in use, so it
    stays at most 1 under the roofline (it read 107% against the bf16 peak)."""
    from llmperf.analysis import estimate, sweep

    est = estimate("deepseek-v3", "h200", batch=64, prompt_len=2048, gen_len=16, tp=8, ep=8, dp_attention=True)
    h200 = load_hardware("h200")
    assert est.prefill.compute_dtype == "bf16"
    assert est.prefill.peak_flops_per_s == h200.peak_flops_per_s("fp8")
    assert 0.3 < est.prefill.peak_fraction <= 1.0 and 0 < est.peak_fraction <= 1.0
    row = sweep("deepseek-v3", "h200", batch=[64], prompt_len=[2048], gen_len=[16], tp=8, ep=8,
                dp_attention=True).iloc[0]
    assert row.peak_fraction == pytest.approx(est.peak_fraction, rel=1e-12)
    dense = estimate("llama-3.1-8b", "h200", batch=8, prompt_len=2048, gen_len=16)
    assert dense.prefill.peak_flops_per_s == h200.peak_flops_per_s(dense.prefill.compute_dtype)


def test_a_step_spent_in_collective_latency_is_comm_bound():
    """Qwen3-30B-A3B at fp8 on four H100s, batch 1: under `typical` each of its 48 layers' two
    all-reduces costs an NCCL latency (tens of us), more than half the decode step, so the phase says
    'comm' (it said 'compute'); the roofline prices collectives at bandwidth alone: memory-bound.
    (Qwen3-235B-A22B, this test's first case, spends 48% of its step there since its GEMMs are priced
    from their shapes, each with a kernel latency: memory-bound, as the rule says.)"""
    from llmperf.analysis import estimate, sweep
    from llmperf.analysis.timemodel import time_model_for

    h100 = load_hardware("h100-sxm")
    typical = estimate("qwen3-30b-a3b", h100, precision="fp8", tp=4, batch=1, prompt_len=2048, gen_len=16,
                       time_model=time_model_for(h100, "typical", "fp8"))
    assert typical.decode_first.bound == "comm"
    row = sweep("qwen3-30b-a3b", "h100-sxm", precision="fp8", tp=4, batch=[1], prompt_len=[2048], gen_len=[16],
                time_model=lambda hw, dtype: time_model_for(hw, "typical", dtype)).iloc[0]
    assert row.decode_bound == "comm"
    big = estimate("qwen3-235b-a22b", h100, precision="fp8", tp=4, batch=1, prompt_len=2048, gen_len=16,
                   time_model=time_model_for(h100, "typical", "fp8")).decode_first
    comm = sum(o.time_s for o in big.ops if o.cost.kind == "comm") / big.time_s
    assert big.bound == ("comm" if comm >= 0.5 else "memory") and comm > 0.4
    roof = estimate("qwen3-235b-a22b", h100, precision="fp8", tp=4, batch=1, prompt_len=2048, gen_len=16)
    assert roof.decode_first.bound == "memory"
    assert estimate("llama-3.1-8b", h100, batch=1, prompt_len=512, gen_len=16).decode_first.bound == "memory"
