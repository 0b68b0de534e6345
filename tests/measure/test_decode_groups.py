"""CPU decode attention by query-head group (efficiency schema 9, `decode_attention`): the additive fit
`seconds per byte = a + c G` on synthetic points, its terms in the efficiency block (checked, written,
read back), and the calibrated time model pricing a decode as `bytes (a + c G)` where they apply and
exactly as before everywhere else. Structure and arithmetic only: no timing, no ISA."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import llmperf
from llmperf.analysis import ForwardModel
from llmperf.analysis.operators import attention_cost
from llmperf.analysis.roofline import op_time
from llmperf.analysis.timemodel import DecodeGroupTerms, parse_efficiency, time_model_for
from llmperf.errors import SpecError
from llmperf.measure.calibrate import Calibration, ComputePoint, Settings, fit_decode_groups, write_yaml
from llmperf.serving.costmodel import StepCostModel
from llmperf.specs import HardwareSpec, Precision, load_model
from llmperf.specs.local import load_calibrated

A, C = 2.5e-11, 3.0e-12  # seconds per byte, and per byte per query head of a KV head
H_KV, D, ELEM = 4, 128, 4.0  # fp32


def _decode_point(batch: int, kv: int, group: int, s_per_byte: float, overhead: float = 0.0,
                  dtype: str = "fp32") -> ComputePoint:
    cost = attention_cost(batch, 1, kv, num_heads=H_KV * group, num_kv_heads=H_KV, head_dim=D, act_bytes=ELEM,
                          kv_bytes=ELEM)
    t = float(cost.bytes_total) * s_per_byte + overhead
    return ComputePoint(op="attention", dtype=dtype, rows=batch, shape="", seconds=t, median_s=t, spread_s=0.0, n=5,
                        flops=float(cost.flops), bytes=float(cost.bytes_total), memory_bound=True, group=group)


# ---- the fit ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("groups", [(1, 4), (4, 1), (1, 2, 4, 8)])
def test_the_fit_gives_back_the_line_of_synthetic_points(groups):
    """Points made by `a + c G` (and an overhead each call pays, taken off as in `fit_curves`) give back
    a and c exactly, whatever the order or number of groups."""
    oh = 4e-6
    pts = [_decode_point(b, kv, g, A + C * g, oh) for b, kv in ((1, 4096), (4, 4096), (2, 1024)) for g in groups]
    terms = fit_decode_groups(pts, oh)
    assert terms["s_per_byte"] == pytest.approx(A, rel=1e-3)
    assert terms["s_per_byte_per_group"] == pytest.approx(C, rel=1e-3)
    assert terms["groups"] == sorted(groups)


def test_the_fit_with_two_groups_is_the_median_of_each_points_exact_solution():
    """With G = 1 and 4 at two (batch, context) points, least squares is each point's exact solution
    averaged: a = (4 y1 - y4) / 3, c = (y4 - y1) / 3 per point."""
    y = {(1, 1): 3.0e-11, (1, 4): 4.0e-11, (4, 1): 3.4e-11, (4, 4): 4.6e-11}
    pts = [_decode_point(b, 4096, g, y[b, g]) for b, g in y]
    terms = fit_decode_groups(pts, 0.0)
    c = np.mean([(y[b, 4] - y[b, 1]) / 3 for b in (1, 4)])
    a = np.mean([(4 * y[b, 1] - y[b, 4]) / 3 for b in (1, 4)])
    assert terms["s_per_byte"] == pytest.approx(a, rel=1e-3)
    assert terms["s_per_byte_per_group"] == pytest.approx(c, rel=1e-3)


def test_the_fit_keeps_both_terms_non_negative_and_needs_two_groups():
    falling = [_decode_point(1, 4096, g, y) for g, y in ((1, 4e-11), (4, 3e-11))]  # cheaper at a larger group
    terms = fit_decode_groups(falling, 0.0)
    assert terms["s_per_byte_per_group"] == 0.0 and terms["s_per_byte"] == pytest.approx(3.5e-11, rel=1e-3)
    steep = [_decode_point(1, 4096, g, y) for g, y in ((1, 1e-11), (4, 8e-11))]  # intercept below 0
    terms = fit_decode_groups(steep, 0.0)
    assert terms["s_per_byte"] == 0.0 and terms["s_per_byte_per_group"] == pytest.approx(33e-11 / 17, rel=1e-3)
    assert fit_decode_groups([_decode_point(b, 4096, 4, A + 4 * C) for b in (1, 4)], 0.0) is None
    prefill = replace(_decode_point(1, 4096, 1, A + C), memory_bound=False)  # not a decode point
    assert fit_decode_groups([prefill, _decode_point(1, 4096, 4, A + 4 * C)], 0.0) is None


def _cal(points: list[ComputePoint], kind: str = "cpu") -> Calibration:
    """A calibration of `points` beside a GEMV and a DRAM read (the ceilings every fit needs)."""
    from llmperf.measure.calibrate import StreamPoint

    s = Settings.tiny(dtypes=("fp32",), attn_group=4, attn_heads=16, allreduce=False)
    gemv = ComputePoint(op="matmul", dtype="fp32", rows=1, shape="", seconds=1e-3, spread_s=0.0, n=3,
                        flops=2.0 * 4096 * 4096, bytes=4.0 * 4096 * 4096)
    stream = StreamPoint(kind="read", size_bytes=1 << 28, bytes_moved=1 << 28, seconds=1e-2, spread_s=0.0, n=3)
    return Calibration(device={"kind": kind, "name": "test device", "cores": 2}, versions={}, created="today",
                       settings=s, streams=[stream], compute=[gemv, *points])


DECODE = [_decode_point(b, 4096, g, A + C * g) for b in (1, 4) for g in (4, 1)]


def test_a_cpu_calibration_writes_the_terms_and_keeps_the_curves_on_its_own_group():
    """`Calibration.fit_terms`: the decode points at every group give `decode_attention` (schema 9); the
    attention kind's curves are fitted on `attn_group`'s points alone, as before the extra group; a
    CUDA calibration writes none (its attention is priced by shape)."""
    cal = _cal(DECODE)
    eff = cal.fit_terms()
    assert eff["schema_version"] == 9
    terms = eff["decode_attention"]["fp32"]
    assert terms["s_per_byte"] == pytest.approx(A, rel=1e-3) and terms["groups"] == [1, 4]
    only_own = _cal([p for p in DECODE if p.group == 4])
    assert eff["dtypes"]["fp32"]["attention"] == only_own.fit_terms()["dtypes"]["fp32"]["attention"]
    assert "decode_attention" not in only_own.fit_terms()
    assert "decode_attention" not in _cal(DECODE, kind="cuda").fit_terms()
    assert [r.get("group") for r in cal.provenance()["compute"]] == [None, 4, 1, 4, 1]


# ---- the efficiency block -------------------------------------------------------------------------

def _eff(decode: dict | None = None, schema: int = 9) -> dict:
    eff = {"schema_version": schema, "overhead_mode": "add", "step_overhead_s": 0.0, "dtypes": {"fp32": {
        "matmul": {"e_compute": 0.5, "e_memory": 0.8, "overhead_s": 3e-6},
        "attention": {"e_compute": [[1, 0.2], [1024, 0.5]], "e_memory": [[1, 0.6], [4, 0.5]], "overhead_s": 5e-6}}}}
    if decode is not None:
        eff["decode_attention"] = {"fp32": decode}
    return eff


TERMS = {"s_per_byte": A, "s_per_byte_per_group": C, "groups": [1, 4], "source": "synthetic"}


def _hw(eff: dict) -> HardwareSpec:
    return HardwareSpec(name="local", vendor="cpu", peak_tflops={"fp32": 0.4}, memory_bandwidth_gbps=40,
                        memory_gib=64, efficiency=eff, calibration={"tool": "llmperf calibrate"})


def test_the_terms_are_checked_field_by_field():
    parsed = parse_efficiency(_eff(TERMS), "f")["decode_attention"]["fp32"]
    assert parsed == DecodeGroupTerms(s_per_byte=A, s_per_byte_per_group=C, groups=(1, 4), source="synthetic")
    assert parsed.seconds_per_byte(8) == pytest.approx(A + 8 * C)
    assert parse_efficiency(_eff(), "f")["decode_attention"] == {}  # older files: no terms
    with pytest.raises(SpecError, match="f.decode_attention: needs schema_version 9, the file says 8"):
        parse_efficiency(_eff(TERMS, schema=8), "f")
    for bad, message in [({**TERMS, "s_per_byte": -1e-12}, "f.decode_attention.fp32.s_per_byte: must be"),
                         ({**TERMS, "s_per_byte_per_group": 1.0}, "s_per_byte_per_group: must be seconds per byte"),
                         ({**TERMS, "s_per_byte": 0.0, "s_per_byte_per_group": 0.0}, "one must be positive"),
                         ({**TERMS, "groups": [0, 4]}, "f.decode_attention.fp32.groups: must be integers >= 1"),
                         ({**TERMS, "speed": 1}, "unknown field 'speed'"),
                         ({k: v for k, v in TERMS.items() if k != "s_per_byte"}, "s_per_byte: must be")]:
        with pytest.raises(SpecError, match=message):
            parse_efficiency(_eff(bad), "f")


def test_the_terms_round_trip_through_the_hardware_yaml(tmp_path):
    """Written as `calibrate` writes a calibration and read back as `-H FILE`: the same terms."""
    path = write_yaml(_cal(DECODE).to_mapping(), tmp_path / "local.yaml")
    tm = time_model_for(load_calibrated(path), "calibrated", "fp32")
    assert tm.decode_attention is not None and tm.decode_attention.groups == (1, 4)
    assert tm.decode_attention.s_per_byte == pytest.approx(A, rel=1e-3)
    assert tm.decode_attention.s_per_byte_per_group == pytest.approx(C, rel=1e-3)
    assert tm.to_dict()["decode_attention"]["s_per_byte"] == tm.decode_attention.s_per_byte


# ---- the time model ---------------------------------------------------------------------------------

def _decode(group: float, batch: int = 2, kv_heads: int = H_KV):
    return attention_cost(batch, 1, 4096, num_heads=int(kv_heads * group), num_kv_heads=kv_heads, head_dim=D,
                          act_bytes=ELEM, kv_bytes=ELEM)


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_a_decode_is_priced_as_its_bytes_times_the_groups_line_plus_the_overhead(group):
    hw = _hw(_eff(TERMS))
    tm = time_model_for(hw, "calibrated", "fp32")
    cost = _decode(group)
    t = op_time(cost, hw, "fp32", tm)
    assert float(t.memory_s) == pytest.approx(float(cost.bytes_total) * (A + C * group), rel=1e-12)
    assert float(t.time_s) == pytest.approx(float(cost.bytes_total) * (A + C * group) + 5e-6, rel=1e-12)
    assert float(t.compute_s) == pytest.approx(float(cost.flops) / hw.peak_flops_per_s("fp32"))  # e_compute 1


def test_the_time_per_byte_grows_with_the_group_as_the_line_says():
    hw = _hw(_eff(TERMS))
    tm = time_model_for(hw, "calibrated", "fp32")
    per_byte = {g: (float(op_time(_decode(g), hw, "fp32", tm).time_s) - 5e-6) / float(_decode(g).bytes_total)
                for g in (1, 4, 8)}
    assert (per_byte[8] - per_byte[4]) / 4 == pytest.approx((per_byte[4] - per_byte[1]) / 3, rel=1e-9)
    assert per_byte[8] / per_byte[1] == pytest.approx((A + 8 * C) / (A + C), rel=1e-9)


def test_without_the_terms_and_where_they_do_not_apply_the_price_is_the_curves_as_before():
    """A file without the terms prices decode as before (max of the kind's roofs at its batch); with
    them, prefill, a fractional group and MLA's latent attention keep exactly that price."""
    with_terms = time_model_for(_hw(_eff(TERMS)), "calibrated", "fp32")
    old = time_model_for(_hw(_eff(schema=8)), "calibrated", "fp32")
    hw = _hw(_eff(TERMS))
    assert old.decode_attention is None
    e_c, e_m = 0.2, 0.55  # the curves at 2 rows (log-linear between 1 and 4 rows: 0.6 -> 0.5)
    cost = _decode(4)
    t_old = op_time(cost, hw, "fp32", old)
    want = max(float(cost.flops) / (hw.peak_flops_per_s("fp32") * e_c),
               float(cost.bytes_total) / (hw.mem_bandwidth_bytes_per_s * e_m)) + 5e-6
    assert float(t_old.time_s) == pytest.approx(want, rel=1e-12)
    prefill = attention_cost(1, 256, 256, num_heads=16, num_kv_heads=4, head_dim=D, act_bytes=ELEM, kv_bytes=ELEM)
    fractional = _decode(1.5)  # 6 query heads over 4 KV heads
    latent = replace(_decode(4), attn=replace(_decode(4).attn, latent=True))
    for c in (prefill, fractional, latent):
        assert float(op_time(c, hw, "fp32", with_terms).time_s) == float(op_time(c, hw, "fp32", old).time_s)
    assert float(op_time(_decode(4), hw, "fp32", with_terms).time_s) != float(t_old.time_s)


def test_an_array_of_shapes_takes_the_terms_row_by_row():
    hw = _hw(_eff(TERMS))
    tm = time_model_for(hw, "calibrated", "fp32")
    q = np.array([1.0, 1.0, 64.0])
    cost = attention_cost(2, q, 4096, num_heads=8, num_kv_heads=2, head_dim=D, act_bytes=ELEM, kv_bytes=ELEM)
    t = op_time(cost, hw, "fp32", tm)
    one = [float(op_time(attention_cost(2, float(x), 4096, num_heads=8, num_kv_heads=2, head_dim=D, act_bytes=ELEM,
                                        kv_bytes=ELEM), hw, "fp32", tm).time_s) for x in q]
    assert np.allclose(t.time_s, one, rtol=1e-12)


def test_mla_attention_says_it_is_latent_in_both_forms():
    fm = ForwardModel(model=load_model("deepseek-v3"), precision=Precision.uniform("bf16"))
    for q_len in (1, 16):  # absorbed decode, unabsorbed prefill
        (att,) = [op for op in fm.attention_ops(1, q_len, 1024) if op.attn is not None]
        assert bool(att.attn.latent)
    llama = ForwardModel(model=load_model("llama-3.1-8b"), precision=Precision.uniform("bf16"))
    (att,) = [op for op in llama.attention_ops(1, 1, 1024) if op.attn is not None]
    assert not att.attn.latent and float(att.attn.group) == 4.0


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt2", "deepseek-v3"])
def test_the_step_cost_model_prices_decode_attention_as_the_estimate_does(model):
    """The simulator's step cost model reads a fused attention's rates from the time model at the
    shape it keeps (group, and MLA's latent flag): its decode steps equal `estimate`'s under the terms,
    which change them for GQA and MHA and leave MLA's as they were."""
    hw = _hw(_eff(TERMS))
    steps = {}
    for name, tm in (("terms", time_model_for(hw, "calibrated", "fp32")),
                     ("old", time_model_for(_hw(_eff(schema=8)), "calibrated", "fp32"))):
        est = llmperf.estimate(model, hw, batch=2, prompt_len=64, gen_len=4, precision="fp32", time_model=tm)
        cm = StepCostModel(model=est.model, hardware=est.hardware, precision=est.precision, time_model=tm)
        steps[name] = [cm.step_time_s([1] * 2, [64 + j] * 2, 2) for j in range(1, 4)]
        assert np.allclose(steps[name], est.decode_step_times_s(), rtol=1e-9)
    assert np.allclose(steps["terms"], steps["old"], rtol=1e-12) == (model == "deepseek-v3")
