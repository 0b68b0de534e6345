"""The calibrated time model (`llmperf.analysis.timemodel`): curves, parsing, the three models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.analysis import ForwardModel, roofline_time_s
from llmperf.analysis.timemodel import (
    ROOFLINE_MODEL,
    Curve,
    EfficiencyTimeModel,
    KindTerms,
    parse_efficiency,
    time_model_for,
)
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, Precision, load_hardware, load_model

H100 = load_hardware("h100-sxm")


def test_curve_is_log_linear_and_flat_outside():
    c = Curve.parse([[1, 0.2], [100, 0.8]], "x")
    assert c(10) == pytest.approx(0.5)  # halfway in log(rows)
    assert c(0.5) == 0.2 and c(1e6) == 0.8
    assert np.allclose(c(np.array([1.0, 10.0, 100.0])), [0.2, 0.5, 0.8])
    assert Curve.parse(0.7, "x")(123) == 0.7


@pytest.mark.parametrize("raw, message", [
    ([[1, 1.5]], "in \\(0, 1\\]"), ([[1, 0.0]], "in \\(0, 1\\]"), ([[0, 0.5]], "rows must be >= 1"),
    ([[1, 0.5], [1, 0.6]], "rows repeat"), ("fast", "expected a number"), ([[1]], "\\[rows, value\\]"),
])
def test_curve_refuses_nonsense(raw, message):
    with pytest.raises(SpecError, match=message):
        Curve.parse(raw, "eff.matmul.e_compute")


def test_efficiency_block_errors_name_the_field():
    good = {"schema_version": 1, "dtypes": {"fp32": {"matmul": {"e_compute": 0.5}}}}
    assert parse_efficiency(good, "f")["dtypes"]["fp32"]["matmul"].e_compute(1) == 0.5
    with pytest.raises(SpecError, match="schema_version"):
        parse_efficiency({**good, "schema_version": 7}, "f")
    with pytest.raises(SpecError, match="unknown operator kind 'matmal'"):
        parse_efficiency({"schema_version": 1, "dtypes": {"fp32": {"matmal": {}}}}, "f")
    with pytest.raises(SpecError, match="overhead_s"):
        KindTerms.parse({"overhead_s": -1}, "f.matmul")
    with pytest.raises(SpecError, match="unknown field 'speed'"):
        KindTerms.parse({"speed": 1}, "f.matmul")


def _fm():
    return ForwardModel(model=load_model("llama-3.1-8b"), precision=Precision.uniform("bf16"))


def test_roofline_model_equals_the_analysis_roofline():
    fm = _fm()
    for c in fm.forward_ops(4, 1, 1000):
        assert ROOFLINE_MODEL.op_time_s(c, H100, "bf16", 4) == pytest.approx(float(roofline_time_s(c, H100, "bf16")))


def test_typical_is_slower_than_the_roofline_by_published_factors():
    tm = time_model_for(H100, "typical", "bf16")
    assert tm.name == "typical"
    fm = _fm()
    big = fm.gate_proj(1, 4096, 4096)  # a large compute-bound GEMM
    ratio = float(roofline_time_s(big, H100, "bf16")) / tm.op_time_s(big, H100, "bf16", 4096)
    assert 0.63 <= ratio <= 0.93  # the published range of peak-roofline / measured
    gemv = fm.gate_proj(1, 1, 1000)
    assert tm.op_time_s(gemv, H100, "bf16", 1) > float(roofline_time_s(gemv, H100, "bf16")) / 0.75


def test_calibrated_and_typical_refusals():
    with pytest.raises(SpecError, match="no calibration"):
        time_model_for(H100, "calibrated", "bf16")
    cpu = HardwareSpec(name="cpu-x", vendor="cpu", peak_tflops={"fp32": 0.1}, memory_bandwidth_gbps=10,
                       memory_gib=8)
    with pytest.raises(SpecError, match="GPU measurements"):
        time_model_for(cpu, "typical", "fp32")
    with pytest.raises(SpecError, match="--efficiency"):
        time_model_for(H100, "measured", "bf16")


def test_calibrated_picks_the_dtype_or_refuses():
    eff = {"schema_version": 1, "step_overhead_s": 7e-5,
           "dtypes": {"fp32": {"matmul": {"e_compute": [[1, 0.1], [64, 0.8]], "e_memory": 0.6, "overhead_s": 2e-6}}}}
    hw = HardwareSpec(name="local", vendor="cpu", peak_tflops={"fp32": 0.1, "bf16": 0.2}, memory_bandwidth_gbps=12,
                      memory_gib=8, efficiency=eff, calibration={"tool": "llmperf calibrate"})
    tm = time_model_for(hw, "calibrated", "fp32")
    assert tm.step_overhead_s == 7e-5 and tm.terms("matmul").overhead_s == 2e-6
    assert tm.terms("norm").e_memory(5) == 1.0  # an unmeasured kind keeps the roofline
    with pytest.raises(SpecError, match="no efficiency terms for compute dtype 'bf16'"):
        time_model_for(hw, "calibrated", "bf16")


@settings(max_examples=40, deadline=None)
@given(e_c=st.floats(0.01, 1.0), e_m=st.floats(0.01, 1.0), oh=st.floats(0, 1e-3), batch=st.integers(1, 64),
       ctx=st.integers(1, 8192))
def test_never_faster_than_the_roofline(e_c, e_m, oh, batch, ctx):
    terms = KindTerms(e_compute=Curve(((1.0, e_c),)), e_memory=Curve(((1.0, e_m),)), overhead_s=oh)
    tm = EfficiencyTimeModel(name="t", kinds={k: terms for k in ("matmul", "attention", "norm", "elementwise",
                                                                  "embedding")})
    for c in _fm().forward_ops(batch, 1, ctx):
        assert tm.op_time_s(c, H100, "bf16", batch) >= float(roofline_time_s(c, H100, "bf16")) * (1 - 1e-12)


def test_decode_efficiencies_do_not_depend_on_the_context():
    """Efficiencies key on (kind, rows) only, so a decode op stays max(a + b ctx, c + d ctx) + overhead
    and the closed-form sum over a generation stays exact."""
    tm = time_model_for(H100, "typical", "bf16")
    fm = _fm()
    for a, b in zip(fm.forward_ops(8, 1, 100), fm.forward_ops(8, 1, 100_000)):
        assert tm.efficiency(a, H100, 8) == tm.efficiency(b, H100, 8)
    short, long_ = fm.attention_ops(8, 1, 100)[0], fm.attention_ops(8, 1, 100_000)[0]
    assert tm.efficiency(short, H100, 8) == tm.efficiency(long_, H100, 8)
    ctx = np.array([1000.0, 2000.0, 3000.0])
    t = tm.op_time_s(fm.attention_ops(8, 1, ctx)[0], H100, "bf16", 8)
    assert t[2] - t[1] == pytest.approx(t[1] - t[0])  # memory-bound decode attention: linear in context
