"""Property-based invariants of the cost model (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.analysis import ForwardModel, estimate, estimate_phase, sum_max_linear, sweep, weight_bytes_per_gpu
from llmperf.analysis.rollup import activation_peak_bytes
from llmperf.specs import ModelSpec, Precision

heads = st.sampled_from([(8, 8), (8, 4), (8, 2), (8, 1), (16, 4)])


@st.composite
def models(draw) -> ModelSpec:
    h, kvh = draw(heads)
    head_dim = draw(st.sampled_from([16, 32, 64]))
    return ModelSpec(name="m", vocab_size=draw(st.integers(100, 5000)), hidden_size=h * head_dim,
                     num_layers=draw(st.integers(1, 8)), num_heads=h, num_kv_heads=kvh,
                     ffn_size=draw(st.integers(16, 1024)), ffn_kind=draw(st.sampled_from(["swiglu", "gelu"])),
                     max_positions=1 << 20)


@st.composite
def moe_models(draw) -> ModelSpec:
    """Mixtures of experts, with and without shared (always-active) experts."""
    base = draw(models())
    experts = draw(st.integers(2, 16))
    return base.scaled(num_experts=experts, experts_per_token=draw(st.integers(1, experts)),
                       shared_experts=draw(st.integers(0, 4)))


dtypes = st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8", "int4"])


@settings(max_examples=40, deadline=None)
@given(models(), st.integers(1, 64), st.integers(1, 512), st.integers(0, 512))
def test_flops_and_bytes_per_token_linear_in_batch(m, batch, q_len, past):
    fm = ForwardModel(model=m, precision=Precision())
    one = fm.forward_ops(1, q_len, q_len + past)
    many = fm.forward_ops(batch, q_len, q_len + past)
    for a, b in zip(one, many):
        assert b.flops == pytest.approx(batch * a.flops)  # FLOPs scale with batch exactly
        # weights are read once whatever the batch; everything else scales
        assert b.bytes_total - b.weight_bytes == pytest.approx(batch * (a.bytes_total - a.weight_bytes))


@settings(max_examples=40, deadline=None)
@given(models(), dtypes, st.integers(1, 10_000))
def test_kv_bytes_linear_in_tokens(m, kv, tokens):
    per = m.kv_bytes_per_token(kv)
    assert per == 2 * m.num_layers * m.num_kv_heads * m.head_dim * Precision(kv=kv).kv_bytes
    fm = ForwardModel(model=m, precision=Precision(kv=kv))
    a = sum(o.kv_read_bytes for o in fm.forward_ops(1, 1, tokens))
    assert a == pytest.approx(tokens * per)


@settings(max_examples=30, deadline=None)
@given(models(), st.integers(1, 128), st.integers(1, 2048), dtypes)
def test_decode_time_at_least_bytes_over_bandwidth(a100, m, batch, ctx, w):
    fm = ForwardModel(model=m, precision=Precision(weights=w))
    ph = estimate_phase(fm, a100, batch, 1, ctx, phase="decode")
    assert ph.time_s >= ph.bytes_total / a100.mem_bandwidth_bytes_per_s * (1 - 1e-12)
    assert ph.time_s >= ph.compute_s * (1 - 1e-12) / len(ph.ops)


@settings(max_examples=30, deadline=None)
@given(models(), st.integers(1, 16), st.integers(1, 300), st.integers(1, 300))
def test_sweep_equals_single_estimate(a100, m, batch, prompt, gen):
    est = estimate(m, a100, batch=batch, prompt_len=prompt, gen_len=gen)
    row = sweep([m], [a100], batch=[batch], prompt_len=[prompt], gen_len=[gen]).iloc[0]
    assert row.ttft_s == pytest.approx(est.ttft_s)
    assert row.tpot_s == pytest.approx(est.tpot_s)
    assert row.e2e_s == pytest.approx(est.e2e_s)
    assert row.max_batch == est.memory.max_batch
    assert row.decode_bound == est.decode_first.bound


@given(st.floats(-5, 5), st.floats(-1, 1), st.floats(-5, 5), st.floats(-1, 1),
       st.integers(-20, 20), st.integers(0, 40))
def test_sum_max_linear_matches_loop(u0, u1, v0, v1, lo, n):
    hi = lo + n - 1
    xs = np.arange(lo, hi + 1)
    expected = np.maximum(u0 + u1 * xs, v0 + v1 * xs).sum() if n else 0.0
    assert float(sum_max_linear(u0, u1, v0, v1, lo, hi)) == pytest.approx(expected, abs=1e-9)


@settings(max_examples=20, deadline=None)
@given(models(), st.integers(1, 64))
def test_gqa_multiplies_decode_attention_intensity(m, batch):
    fm = ForwardModel(model=m, precision=Precision())
    att = fm.attention_ops(batch, 1, 4096)[0]
    assert att.intensity == pytest.approx(m.gqa_group, rel=0.05)


def test_sweep_of_ten_thousand(a100):
    frame = sweep(["llama-3.1-8b"], [a100], batch=list(range(1, 101)),
                  prompt_len=[64 * i for i in range(1, 51)], gen_len=[32, 256])
    assert len(frame) == 10_000
    assert frame["tpot_s"].is_monotonic_increasing is False  # sanity: a real grid, not a constant
    assert (frame["ttft_s"] > 0).all() and frame["fits"].dtype == bool


FFN_OPS = ("gate_proj", "up_proj", "act", "down_proj")


@settings(max_examples=40, deadline=None)
@given(moe_models())
def test_a_token_costs_two_flops_per_active_matrix_parameter(m):
    """Dense or MoE, shared experts or not: one token multiplies by every active matrix once."""
    fm = ForwardModel(model=m, precision=Precision(), all_logits=True)
    matmul = sum(o.flops for o in fm.forward_ops(1, 1, 1) if o.kind == "matmul")
    not_matrices = m.embedding_params + (2 * m.num_layers + 1) * m.norm_params  # no biases in these models
    assert matmul == 2 * (m.active_param_count - not_matrices)


@settings(max_examples=40, deadline=None)
@given(moe_models(), st.integers(1, 16), st.integers(1, 256))
def test_a_shared_expert_costs_what_an_expert_every_token_picks_costs(m, batch, q_len):
    """s shared experts on top of k routed ones do the work of k + s routed experts: the same FFN
    FLOPs, activation bytes after the first matrices, and the same activation peak. The shared
    experts run as one FFN of s x width (as vLLM builds them), so their input is read once."""
    routed = m.scaled(num_experts=m.num_experts + m.shared_experts,
                      experts_per_token=m.experts_per_token + m.shared_experts, shared_experts=0)
    a, b = (ForwardModel(model=x, precision=Precision()) for x in (m, routed))
    ops_a, ops_b = a.layer_ops(batch, q_len, q_len), b.layer_ops(batch, q_len, q_len)
    for name in FFN_OPS if m.ffn_kind == "swiglu" else ("up_proj", "act", "down_proj"):
        x = [o for o in ops_a if o.name in (name, "shared_" + name)]  # routed + shared operators
        (y,) = [o for o in ops_b if o.name == name]
        assert len(x) == (2 if m.shared_experts else 1)
        assert sum(o.flops for o in x) == y.flops
        if name in ("act", "down_proj"):
            assert sum(o.act_read_bytes for o in x) == y.act_read_bytes
    assert activation_peak_bytes(m, Precision(), batch, q_len, q_len) == \
        activation_peak_bytes(routed, Precision(), batch, q_len, q_len)


@settings(max_examples=40, deadline=None)
@given(moe_models())
def test_fp16_weights_are_two_bytes_per_parameter_with_shared_experts(m):
    assert weight_bytes_per_gpu(m, Precision()) == 2 * m.param_count
