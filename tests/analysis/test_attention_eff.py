"""Fused attention priced by shape (`llmperf.analysis.attention_eff`): the model's properties, its yaml
block, and the decode closed form it must keep (its efficiencies never look at the context)."""

from __future__ import annotations

import numpy as np
import pytest

from llmperf.analysis import ForwardModel, estimate
from llmperf.analysis.attention_eff import AttentionEfficiency, AttnShape
from llmperf.analysis.rollup import decode_sums, phase_arrays
from llmperf.analysis.roofline import op_time
from llmperf.analysis.timemodel import parse_efficiency, time_model_for
from llmperf.errors import SpecError
from llmperf.specs import Precision, load_hardware, load_model
from tests.analysis.test_layers import gemma2_like, gpt_oss_like, llama4_like

MODEL = AttentionEfficiency(e_compute=0.8, head_dim_half=40.0, mma_rows=64.0, cta_half=0.5, e_memory=0.92,
                            kv_half=0.03, latency_s=1.5e-5)


def shape(**kw) -> AttnShape:
    base = dict(batch=1, q_len=1, context=4096, heads=32, kv_heads=8, head_dim=128)
    return AttnShape(**{**base, **kw})


def test_decode_bandwidth_rises_with_batch_toward_its_plateau():
    batches = np.array([1, 2, 8, 32, 256, 4096])
    _, e_m = MODEL.efficiencies(shape(batch=batches), 132)
    assert np.all(np.diff(e_m) > 0) and np.all(e_m <= MODEL.e_memory)
    assert e_m[-1] == pytest.approx(MODEL.e_memory, rel=1e-3)


def test_occupancy_counts_kv_streams_per_sm():
    """B x H_kv over the SMs: MHA at batch 1 fills as much as GQA-4 at batch 4; a device with twice
    the SMs needs twice the streams."""
    _, mha = MODEL.efficiencies(shape(kv_heads=32), 132)
    _, gqa = MODEL.efficiencies(shape(batch=4, kv_heads=8), 132)
    _, big = MODEL.efficiencies(shape(batch=8, kv_heads=8), 264)
    assert mha == pytest.approx(gqa) and big == pytest.approx(gqa)


def test_prefill_compute_rises_with_q_len_and_head_dim():
    q = np.array([128, 512, 2048, 8192, 65536])
    e_c, _ = MODEL.efficiencies(shape(q_len=q, context=q), 132)
    assert np.all(np.diff(e_c) > 0) and e_c[-1] < MODEL.e_compute
    d = np.array([64, 128, 256])
    e_d, _ = MODEL.efficiencies(shape(q_len=4096, context=4096, head_dim=d), 132)
    assert np.all(np.diff(e_d) > 0)


def test_causal_waste_is_the_diagonal_tiles_and_decode_has_none():
    flat = AttentionEfficiency(**{**MODEL.to_dict(), "cta_half": 0.0, "head_dim_half": 0.0})
    e_512, _ = flat.efficiencies(shape(q_len=512, context=512, kv_heads=32), 132)
    pairs, waste = 512 * 513 / 2, 128 * 511 / 2  # tiles of 128 on the diagonal run whole
    assert e_512 == pytest.approx(flat.e_compute * pairs / (pairs + waste))
    e_dec, _ = flat.efficiencies(shape(q_len=1, kv_heads=1, heads=64), 132)  # 64 query rows fill a tile
    assert e_dec == pytest.approx(flat.e_compute)


def test_decode_stays_memory_bound_for_any_group():
    """Decode's intensity and its tile fill both scale with the group g: GQA or MHA, a Llama decode
    step's attention is memory-bound; the latency is a floor under every call."""
    hw = load_hardware("h100-sxm")
    tm = time_model_for(hw, "typical", "bf16")
    for name in ("llama-2-7b", "llama-3.1-8b", "llama-3.1-70b"):  # groups 1, 4, 8
        fm = ForwardModel(model=load_model(name), precision=Precision.uniform("bf16"))
        for batch in (1, 64):
            cost = next(c for c in fm.attention_ops(float(batch), 1.0, 4096.0) if c.name == "attention")
            t = op_time(cost, hw, "bf16", tm)
            assert t.bound == "memory", (name, batch)
            assert t.time_s >= tm.attention_eff.latency_s


def test_efficiencies_never_depend_on_the_context():
    for q in (1, 7, 2048):
        a = MODEL.efficiencies(shape(q_len=q, context=q), 132)
        b = MODEL.efficiencies(shape(q_len=q, context=q + 100_000), 132)
        assert a == b


@pytest.mark.parametrize("make", [gemma2_like, llama4_like, gpt_oss_like])
@pytest.mark.parametrize("prompt,gen", [(3, 40), (29, 31), (100, 5)])
def test_decode_closed_form_is_exact_under_typical(make, prompt, gen):
    """The latency shifts both roofs, so each decode step is still max(a + b ctx, c + d ctx) + ...:
    the closed-form sum equals the loop over steps (full, sliding and chunked layers)."""
    hw = load_hardware("h100-sxm")
    tm = time_model_for(hw, "typical", "fp16")
    fm = ForwardModel(model=make(), precision=Precision())
    batch = np.array([1.0, 7.0])
    t, _, _ = decode_sums(fm, hw, batch, np.full(2, float(prompt)), np.full(2, float(gen)), pp=1,
                          compute_dtype="fp16", time_model=tm)
    want = 0.0
    for j in range(1, gen):
        want = want + phase_arrays(fm, hw, batch, 1.0, prompt + j + 0.0, pp=1, compute_dtype="fp16",
                                   time_model=tm).time_s
    np.testing.assert_allclose(t, want, rtol=1e-10, atol=1e-15)


def test_estimate_prices_fused_attention_by_shape():
    tm = time_model_for(load_hardware("h100-sxm"), "typical", "bf16")
    est = estimate("llama-3.1-8b", "h100-sxm", batch=8, prompt_len=2048, gen_len=16, time_model=tm)
    assert est.decode_step_times_s().sum() == pytest.approx(est.decode_total_s, rel=1e-12)
    ops = est.ops_frame()
    att = ops[ops["op"] == "attention"]
    assert len(att) == 2 and (att["time_s"] > 0).all()
    # per GPU: under TP 2 attention sees half the heads
    fm = ForwardModel(model=est.model, precision=est.precision, tp=2)
    a = next(c for c in fm.attention_ops(8.0, 1.0, 100.0) if c.name == "attention").attn
    assert (a.batch, a.q_len, a.context, a.heads, a.kv_heads, a.head_dim) == (8.0, 1.0, 100.0, 16, 4, 128)


def _typical_with(block: dict) -> dict:
    return dict(schema_version=5, model="typical", dtypes={"default": {"matmul": {"e_compute": 0.7}}},
                attention_eff={"default": block})


def test_yaml_block_parses_and_reaches_the_time_model():
    parsed = parse_efficiency(_typical_with(MODEL.to_dict()), "t")
    assert parsed["attention_eff"]["default"] == MODEL


@pytest.mark.parametrize("field,value,message", [
    ("e_memory", 1.5, "t.attention_eff.default.e_memory: must be a number in [0.001, 1]"),
    ("latency_s", -1e-6, "latency_s: must be a number in [0, 0.001]"),
    ("cta_half", "fast", "cta_half: must be a number"),
    ("e_compute", True, "e_compute: must be a number"),
    ("warp_size", 32, "unknown field 'warp_size'"),
])
def test_yaml_block_refuses_bad_values(field, value, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_efficiency(_typical_with({**MODEL.to_dict(), field: value}), "t")


def test_yaml_block_needs_schema_5():
    raw = {**_typical_with(MODEL.to_dict()), "schema_version": 4}
    with pytest.raises(SpecError, match="attention_eff: needs schema_version 5"):
        parse_efficiency(raw, "t")
