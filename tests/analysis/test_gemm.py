"""The GEMM shape model (`llmperf.analysis.gemm`): its properties, its data block in typical.yaml, the
shapes the operators carry (per GPU, under TP and EP) and how the `typical` time model uses them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmperf.analysis.gemm import TILES, GemmParams, GemmShape, gemm_time_s
from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.roofline import ROOFLINE, op_time
from llmperf.analysis.routing import busiest_expert_load
from llmperf.analysis.timemodel import EfficiencyTimeModel, parse_efficiency, time_model_for
from llmperf.errors import SpecError
from llmperf.specs import Precision, load_hardware, load_model

H100, A100 = load_hardware("h100-sxm"), load_hardware("a100-80gb-sxm")
P = GemmParams(e_peak=0.75, e_memory=0.8, latency_s=4e-6, feed_flop_per_byte=50.0)


def t(m, n, k, groups=1.0, hw=H100, params=P, **kw):  # noqa: ANN001, ANN201
    return gemm_time_s(m, n, k, groups, peak_flops_per_s=hw.peak_flops_per_s("bf16"),
                       bandwidth_bytes_per_s=hw.mem_bandwidth_bytes_per_s, num_sms=hw.num_sms, params=params, **kw)


def test_monotone_in_m_n_and_k() -> None:
    m = np.arange(1, 8193)
    tm = t(m, 4096, 4096)
    assert np.all(np.diff(tm) >= -1e-15)
    n = np.arange(64, 16385, 64)
    assert np.all(np.diff(t(512, n, 4096)) >= -1e-15)
    k = np.arange(256, 16385, 64)
    assert np.all(np.diff(t(512, 4096, k)) >= -1e-15)


def test_vectorised_equals_scalar() -> None:
    m = np.array([1.0, 7.0, 130.0, 4096.0])
    assert np.allclose(t(m, 6144, 4096), [t(float(x), 6144, 4096) for x in m])
    assert isinstance(t(3.0, 6144, 4096), float)


def test_tiny_gemm_is_its_latency() -> None:
    assert P.latency_s < t(1, 64, 64) < 1.05 * P.latency_s
    assert t(0, 4096, 4096) == 0.0  # no rows, no kernel


def test_gemv_streams_its_weights_at_e_memory() -> None:
    """One row through a 8192 x 28672 bf16 matrix (470 MB): weight bytes / (bandwidth e_memory)."""
    n, k = 28672, 8192
    expected = P.latency_s + (n * k * 2 + (n + k) * 2) / (H100.mem_bandwidth_bytes_per_s * P.e_memory)
    assert t(1, n, k) == pytest.approx(expected, rel=1e-9)
    # quantised weights stream fewer bytes
    assert t(1, n, k, w_bytes=0.5) < 0.3 * t(1, n, k)


def test_large_gemm_reaches_the_plateau() -> None:
    m = n = k = 16384
    flops = 2.0 * m * n * k
    e = flops / (H100.peak_flops_per_s("bf16") * t(m, n, k))
    assert 0.95 * P.e_peak < e <= P.e_peak


def test_wave_quantisation_step_when_tiles_cross_the_sm_count() -> None:
    """A compute-bound GEMM one 128x256 tile wide whose tiles exactly fill the SMs, then one more tile
    row: a second (nearly empty) wave. The best other tiling (128x128 in three waves, 64x128 in five)
    softens the step, as cuBLAS's choice does, but it stays far above the 1/132 more work."""
    sms, (tm, tn) = H100.num_sms, TILES[0]
    k = 16384
    full, past = t(sms * tm, tn, k), t(sms * tm + 1, tn, k)
    assert past / full > 1.3
    assert t(sms * tm - 1, tn, k) == pytest.approx(full, rel=1e-4)  # padding: a partial tile costs a whole one
    m = np.arange(tm, 3 * sms * tm, tm)
    per_row = t(m, tn, k) / m
    assert per_row[sms - 1] < per_row[sms] * 0.8  # the efficiency drops where the wave overflows


def test_groups_are_independent_gemms() -> None:
    """Eight experts of 64 rows each: more than one expert's time, at most eight times it."""
    one = t(64, 4096, 2048)
    eight = t(64, 4096, 2048, groups=8)
    assert one < eight <= 8 * one


def test_fp8_runs_at_its_own_peak() -> None:
    kw = dict(peak_flops_per_s=H100.peak_flops_per_s("fp8"), bandwidth_bytes_per_s=H100.mem_bandwidth_bytes_per_s,
              num_sms=H100.num_sms, params=P, w_bytes=1.0, a_bytes=1.0)
    assert gemm_time_s(8192, 8192, 8192, **kw) < 0.6 * t(8192, 8192, 8192)


# ---- the data block ------------------------------------------------------------------------------
def test_typical_yaml_has_the_gemm_block() -> None:
    tm = time_model_for(H100, "typical", "bf16")
    assert tm.gemm is not None and 0 < tm.gemm.e_peak <= 1 and 0 < tm.gemm.e_memory <= 1
    assert 0 < tm.gemm.latency_s < 2e-5 and tm.gemm.feed_flop_per_byte > 0
    assert "Vidur" in tm.gemm.source and tm.compute_dtype == "bf16"
    assert tm.to_dict()["gemm"]["e_peak"] == tm.gemm.e_peak


GOOD = dict(e_peak=0.7, e_memory=0.8, latency_s=4e-6, feed_flop_per_byte=48.0)


@pytest.mark.parametrize("field,value,match", [
    ("e_peak", 1.5, r"t\.gemm\.e_peak: must be a fraction in \(0, 1\], got 1\.5"),
    ("e_memory", 0, r"t\.gemm\.e_memory: must be a fraction"),
    ("latency_s", -1e-6, r"t\.gemm\.latency_s: must be seconds"),
    ("feed_flop_per_byte", "x", r"t\.gemm\.feed_flop_per_byte: must be a number"),
    ("tile_s", 1e-6, r"t\.gemm: unknown field 'tile_s'"),
])
def test_bad_gemm_values_are_refused_naming_the_field(field: str, value: object, match: str) -> None:
    raw = dict(schema_version=5, dtypes=dict(default=dict(matmul=dict(e_compute=0.5))), gemm={**GOOD, field: value})
    with pytest.raises(SpecError, match=match) as err:
        parse_efficiency(raw, "t")
    assert "\n" not in str(err.value)


def test_gemm_needs_schema_5() -> None:
    raw = dict(schema_version=4, dtypes=dict(default=dict(matmul=dict(e_compute=0.5))), gemm=GOOD)
    with pytest.raises(SpecError, match="gemm: needs schema_version 5"):
        parse_efficiency(raw, "t")
    raw["schema_version"] = 5
    assert parse_efficiency(raw, "t")["gemm"] == GemmParams(**GOOD)


def test_missing_field_is_named() -> None:
    raw = dict(schema_version=5, dtypes=dict(default=dict(matmul=dict(e_compute=0.5))),
               gemm={k: v for k, v in GOOD.items() if k != "e_memory"})
    with pytest.raises(SpecError, match=r"t\.gemm\.e_memory: .* got None"):
        parse_efficiency(raw, "t")


# ---- shapes on the operators -------------------------------------------------------------------
def _ops(model: str, **kw) -> dict:  # noqa: ANN003
    fm = ForwardModel(model=load_model(model), precision=Precision.uniform("bf16"), fused_qkv=True,
                      fused_gate_up=True, **kw)
    return {o.name: o for o in fm.forward_ops(4, 1, 100.0)}


def test_dense_shapes_are_the_tp_shard() -> None:
    ops = _ops("llama-3.1-70b", tp=8)
    assert ops["qkv_proj"].gemm == GemmShape(n=(64 + 2 * 8) * 128 // 8, k=8192)
    assert ops["o_proj"].gemm == GemmShape(n=8192, k=64 * 128 // 8)
    assert ops["gate_up_proj"].gemm == GemmShape(n=2 * 28672 // 8, k=8192)
    assert ops["down_proj"].gemm == GemmShape(n=8192, k=28672 // 8)
    assert ops["lm_head"].gemm == GemmShape(n=math.ceil(128256 / 8), k=8192)
    assert ops["qkv_proj"].gemm.m(ops["qkv_proj"].rows) == 4
    for name, op in ops.items():  # every weight GEMM has one, nothing else does
        assert (op.gemm is not None) == (op.kind == "matmul"), name
    assert len([op for op in ops.values() if op.gemm is not None]) == 5


def test_moe_experts_are_groups_per_gpu() -> None:
    """DeepSeek-V3 at ep=8 over tp=8: the experts the busiest GPU holds that a step's tokens touch are
    the groups (all 256 / 8 of them for a large batch), each with an equal share of the rows routed
    there (`busiest_expert_load`: above the mean 4096 x 8 / 8 rows at 4096 tokens)."""
    m = load_model("deepseek-v3")
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=8, ep=8, fused_gate_up=True)
    kind = next(k for k, _ in fm.groups if k.moe)
    ffn = {o.name: o for o in fm.section_ops("ffn", 4096, 1, 0.0, kind)}
    up = ffn["gate_up_proj"]
    assert up.gemm.n == 2 * m.expert_ffn_size and up.gemm.k == m.hidden_size  # tp / ep = 1: experts whole
    assert up.gemm.groups == pytest.approx(256 / 8, rel=1e-6)
    rows, touched = busiest_expert_load(4096, 256, 8, 8)
    assert up.gemm.m(up.rows) * up.gemm.groups == pytest.approx(rows)  # every row routed there, once
    assert 4096 < rows < 4096 * 1.03
    one = {o.name: o for o in fm.section_ops("ffn", 1, 1, 0.0, kind)}["gate_up_proj"]
    rows, touched = busiest_expert_load(1, 256, 8, 8)  # one token's 8 experts: the busiest GPU holds ~2.5
    assert one.gemm.groups == pytest.approx(touched) and one.gemm.m(one.rows) == pytest.approx(rows / touched)
    assert 2 < touched < 3
    shared = ffn["shared_gate_up_proj"]
    assert shared.gemm.groups == 1 and shared.gemm.n == 2 * m.shared_expert_ffn_size // 8


def test_mla_projections_have_shapes_but_the_attention_side_products_do_not() -> None:
    """MLA's down and up projections of the query and the latent are GEMMs with shapes; kv_b_proj's
    rows grow with the context (every key attended), and it and the absorbed per-head products are
    priced with the attention core by the serving step model (linear in its features), so they keep
    the per-rows curves."""
    m = load_model("deepseek-v3")
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=8)
    decode = {o.name: o for o in fm.layer_ops(2, 1, 500.0)}
    assert decode["kv_a_proj"].gemm == GemmShape(n=m.kv_lora_rank + m.qk_rope_head_dim, k=m.hidden_size)
    assert decode["q_a_proj"].gemm == GemmShape(n=m.q_lora_rank, k=m.hidden_size)
    assert decode["q_b_proj"].gemm == GemmShape(n=128 // 8 * m.mla_q_head_dim, k=m.q_lora_rank)
    assert decode["o_proj"].gemm == GemmShape(n=m.hidden_size, k=128 // 8 * m.v_head_dim)
    assert decode["q_absorb"].gemm is None and decode["v_absorb"].gemm is None
    prefill = {o.name: o for o in fm.layer_ops(1, 256, 256.0)}
    assert prefill["kv_b_proj"].gemm is None


def test_scaled_keeps_the_shape() -> None:
    op = _ops("llama-3.1-8b")["qkv_proj"]
    assert op.scaled(32).gemm is op.gemm


# ---- the time model ------------------------------------------------------------------------------
def test_typical_prices_shaped_gemms_by_their_shape_and_efficiencies_tell_the_truth() -> None:
    tm = time_model_for(H100, "typical", "bf16")
    fm = ForwardModel(model=load_model("llama-3.1-8b"), precision=Precision.uniform("bf16"), fused_qkv=True)
    for batch in (1, 64, 4096):
        op = fm.qkv_proj(batch, 1, 0.0).scaled(32)
        ot = op_time(op, H100, "bf16", tm)
        one = gemm_time_s(batch, 6144, 4096, peak_flops_per_s=H100.peak_flops_per_s("bf16"),
                          bandwidth_bytes_per_s=H100.mem_bandwidth_bytes_per_s, num_sms=H100.num_sms,
                          params=tm.gemm)
        device = max(ot.compute_s, ot.memory_s)
        assert device == pytest.approx(32 * one, rel=1e-9)
        eff = tm.efficiency(op, H100)
        assert ot.compute_s == pytest.approx(op.flops / (H100.peak_flops_per_s("bf16") * eff.e_compute))
        assert 0 < eff.e_compute <= 1 and 0 < eff.e_memory <= 1
        assert tm.op_time_s(op, H100, "bf16", batch) == pytest.approx(ot.time_s, rel=1e-12)
        assert op_time(op, H100, "bf16", ROOFLINE).time_s < ot.time_s  # the roofline stays the bound
    assert op_time(fm.qkv_proj(1, 1, 0.0), H100, "bf16", tm).bound == "memory"
    assert op_time(fm.qkv_proj(8192, 1, 0.0), H100, "bf16", tm).bound == "compute"


def test_gemm_time_is_flat_in_the_context_and_vectorised() -> None:
    tm = time_model_for(A100, "typical", "fp16")
    fm = ForwardModel(model=load_model("llama-3.1-8b"), precision=Precision.uniform("fp16"))
    batch = np.array([1.0, 8.0, 256.0])
    a = op_time(fm.down_proj(batch, 1, 100.0 + 0 * batch), A100, "fp16", tm).time_s
    b = op_time(fm.down_proj(batch, 1, 9000.0 + 0 * batch), A100, "fp16", tm).time_s
    assert np.array_equal(a, b)
    single = [op_time(fm.down_proj(float(x), 1, 100.0), A100, "fp16", tm).time_s for x in batch]
    assert np.allclose(a, single, rtol=1e-12)


def test_without_the_block_or_a_shape_the_rows_curves_price_it() -> None:
    tm = time_model_for(H100, "typical", "bf16")
    curves = EfficiencyTimeModel(name="typical", kinds=tm.kinds, overhead_mode="overlap")
    fm = ForwardModel(model=load_model("llama-3.1-8b"), precision=Precision.uniform("bf16"))
    op = fm.o_proj(16, 1, 0.0)
    assert curves.efficiency(op, H100).e_compute == pytest.approx(tm.kinds["matmul"].e_compute(16))
    from dataclasses import replace

    assert tm.efficiency(replace(op, gemm=None), H100).e_memory == pytest.approx(tm.kinds["matmul"].e_memory(16))


def test_decode_sum_stays_exact_under_typical() -> None:
    """The closed-form decode sum equals the step-by-step one with GEMMs priced by their shape."""
    from llmperf.analysis import estimate

    tm = time_model_for(H100, "typical", "bf16")
    est = estimate("llama-3.1-8b", H100, batch=4, prompt_len=100, gen_len=20, time_model=tm)
    steps = est.decode_step_times_s()
    assert est.decode_total_s == pytest.approx(float(np.sum(steps)), rel=1e-9)


def test_typical_estimate_runs_through_the_cli() -> None:
    """`llmperf estimate llama-3.1-8b -H h100-sxm --efficiency typical`: a decode step priced with the
    GEMM shape model, slower than the roofline bound."""
    from typer.testing import CliRunner

    from llmperf.cli import app

    res = CliRunner().invoke(app, ["estimate", "llama-3.1-8b", "-H", "h100-sxm", "--efficiency", "typical",
                                   "--per-op"])
    assert res.exit_code == 0, res.output
    assert "typical" in res.output and "qkv_proj" in res.output
    from llmperf.analysis import estimate

    tm = time_model_for(H100, "typical", "bf16")
    typical = estimate("llama-3.1-8b", H100, time_model=tm)
    bound = estimate("llama-3.1-8b", H100)
    assert bound.tpot_s < typical.tpot_s < 2 * bound.tpot_s


def test_many_repeated_rows_price_as_each_alone() -> None:
    """A sweep's rows (a few row counts repeated) take the shortcut that prices each distinct one once."""
    m = np.tile([1.0, 8.0, 64.0, 512.0, 4096.0], 40).reshape(20, 10)
    out = t(m, 6144, 4096)
    assert out.shape == (20, 10)
    assert np.allclose(out, np.vectorize(lambda x: t(float(x), 6144, 4096))(m), rtol=1e-12)
    work, stream = t(m, 6144, 4096, parts=True)
    assert np.allclose(np.maximum(work, stream), out, rtol=1e-12)
