"""The step cost model on today's models: sliding and chunked layers priced with their own span, MLA
decode absorbed and prefill chunks unabsorbed, every static batch priced exactly as `estimate`
prices it (gpt-oss, Gemma 2, Llama 4, DeepSeek-V3, with tp, ep and data-parallel attention)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmperf
from llmperf.analysis.rollup import Conventions
from llmperf.analysis.timemodel import time_model_for
from llmperf.serving.costmodel import StepCostModel, _scalar_features, span_features
from llmperf.specs import Precision, load_hardware, load_model


def _gpt_oss():  # sliding window of 8 so that short probes cross it
    return load_model("gpt-oss-20b").scaled(sliding_window=8, num_layers=4)


def _gemma2():
    return load_model("gemma-2-9b").scaled(sliding_window=16, num_layers=4)


def _scout():
    return load_model("llama-4-scout").scaled(attention_chunk_size=16, num_layers=4)


def _deepseek():
    return load_model("deepseek-v3").scaled(num_layers=5)  # 3 dense layers, 2 MoE


@pytest.mark.parametrize("make, hw, batch, prompt, gen, tp, eff, attention, kw", [
    (_gpt_oss, "h100-sxm", 3, 20, 12, 1, "roofline", "fused", {}),
    (_gpt_oss, "h100-sxm", 3, 20, 12, 1, "typical", "naive", {}),
    (_gemma2, "h100-sxm", 2, 30, 10, 2, "typical", "fused", {}),
    (_scout, "h100-sxm", 2, 40, 10, 2, "typical", "fused", {}),
    (_scout, "h100-sxm", 2, 40, 10, 2, "roofline", "naive", {}),
    (_deepseek, "h200", 8, 64, 6, 8, "typical", "fused", {}),
    (_deepseek, "h200", 8, 64, 6, 8, "typical", "fused", dict(ep=8, dp_attention=True)),
    (_deepseek, "h200", 8, 64, 6, 8, "roofline", "fused", dict(ep=8, dp_attention=True, mla_mode="unabsorbed")),
    (_deepseek, "h200", 4, 64, 6, 4, "typical", "naive", dict(mla_mode="absorbed")),
    (lambda: "gpt-oss-20b", "h100-sxm", 4, 300, 5, 1, "typical", "fused", {}),
    (lambda: "gemma-2-9b", "h100-sxm", 2, 200, 4, 1, "roofline", "fused", {}),
    (lambda: "llama-4-scout", "h200", 2, 100, 4, 4, "typical", "fused", dict(ep=4)),
    (lambda: "deepseek-v3", "h200", 8, 64, 4, 8, "typical", "fused", dict(ep=8, dp_attention=True)),
])
def test_static_batch_is_priced_as_estimate(make, hw, batch, prompt, gen, tp, eff, attention, kw):
    tm = time_model_for(load_hardware(hw), eff, "fp16")
    est = llmperf.estimate(make(), hw, batch=batch, prompt_len=prompt, gen_len=gen, tp=tp, attention=attention,
                           time_model=tm, **kw)
    cm = StepCostModel(model=est.model, hardware=est.hardware, precision=est.precision, tp=tp, attention=attention,
                       time_model=tm, conventions=Conventions(attention=attention, **kw))
    # both include the engine's step overhead (prefill and decode terms)
    assert cm.step_time_s([prompt] * batch, [prompt] * batch, batch) == pytest.approx(est.ttft_s, rel=1e-12)
    steps = [cm.step_time_s([1] * batch, [prompt + j] * batch, batch) for j in range(1, gen)]
    assert np.allclose(steps, est.decode_step_times_s(), rtol=1e-12)


def test_a_sliding_layer_reads_its_window_not_the_context():
    """gpt-oss-20b's sliding layers (W = 128) cost the same at any context beyond the window; its full
    layers grow with the context."""
    cm = StepCostModel(model=load_model("gpt-oss-20b"), hardware=load_hardware("h100-sxm"),
                       precision=Precision.uniform("bf16"))
    assert cm.spans == ((128, None), (None, None))
    near, far = cm.attention_counts([1], [1_000]), cm.attention_counts([1], [100_000])
    for p, a, b in zip(cm.parts, near, far):
        if cm.groups[p.group][1] == (128, None):
            assert np.array_equal(a, b)
        else:
            assert b[0] > 50 * a[0]


def test_mla_auto_routes_decode_absorbed_and_prefill_unabsorbed():
    """DeepSeek-V3 under mla_mode=auto: a mixed step's attention is its decode sequences priced
    absorbed plus its prefill chunk priced unabsorbed (kv_b_proj over the chunk's cached keys too)."""
    m, hw, prec = load_model("deepseek-v3"), load_hardware("h200"), Precision.uniform("bf16")
    auto = StepCostModel(model=m, hardware=hw, precision=prec, tp=8)
    ab = StepCostModel(model=m, hardware=hw, precision=prec, tp=8, conventions=Conventions(mla_mode="absorbed"))
    un = StepCostModel(model=m, hardware=hw, precision=prec, tp=8, conventions=Conventions(mla_mode="unabsorbed"))
    dec_q, dec_kv, pre_q, pre_kv = [1, 1, 1], [500, 900, 3000], [256], [2048]
    mixed = auto.attention_time_s(auto.features(dec_q + pre_q, dec_kv + pre_kv))
    expect = ab.attention_time_s(ab.features(dec_q, dec_kv)) + un.attention_time_s(un.features(pre_q, pre_kv))
    assert mixed == pytest.approx(expect, rel=1e-12)
    names = {p.name for p in auto.parts}
    assert {"kv_b_proj", "q_absorb", "v_absorb", "attention"} <= names
    # kv_b_proj of a chunk over a cache up-projects every key: twice the keys, twice its FLOPs
    kvb = [i for i, p in enumerate(un.parts) if p.name == "kv_b_proj"]
    one, two = un.attention_counts([256], [1024]), un.attention_counts([256], [2048])
    for i in kvb:
        assert two[i][0] == pytest.approx(2 * one[i][0], rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(q=st.integers(1, 300), extra=st.integers(0, 900), w=st.integers(1, 64), kind=st.sampled_from(["s", "c", "f"]))
def test_the_simulators_scalar_features_equal_the_vectorised_ones(q, extra, w, kind):
    span = {"s": (w, None), "c": (None, w), "f": (None, None)}[kind]
    kv = q + extra
    k, pairs = _scalar_features(q, kv, *span)
    f = span_features(np.array([q], dtype=float), np.array([kv], dtype=float), span)[0]
    assert (k, pairs) == pytest.approx((f[1], f[2]), rel=1e-12)


@pytest.mark.parametrize("make, hw, tp, kw", [
    (_gpt_oss, "h100-sxm", 1, {}),
    (_scout, "h100-sxm", 2, {}),
    (_deepseek, "h200", 8, dict(ep=8, dp_attention=True)),
])
def test_a_simulated_static_batch_of_todays_models_is_estimate(make, hw, tp, kw):
    """The simulator's own feature sums (its per-item path, decode and prefill) price a static batch
    as `estimate` does."""
    from llmperf.serving.simulator import ServingConfig, simulate
    from llmperf.serving.workload import Workload
    m = make()
    est = llmperf.estimate(m, hw, batch=8, prompt_len=40, gen_len=12, tp=tp, **kw)
    cfg = ServingConfig.build(m, hw, tp=tp, policy="static", max_batch=8, max_batched_tokens=None,
                              chunked_prefill=False, prefix_sharing=False, num_blocks=256, efficiency="roofline", **kw)
    w = Workload(arrival_s=np.zeros(8), prompt_tokens=np.full(8, 40), output_tokens=np.full(8, 12),
                 shared_prefix_tokens=np.zeros(8, dtype=int))
    r = simulate(w, cfg).requests
    assert r["ttft_s"].to_numpy() == pytest.approx(np.full(8, est.ttft_s), rel=1e-12)
    assert r["e2e_s"].to_numpy() == pytest.approx(np.full(8, est.e2e_s), rel=1e-12)
