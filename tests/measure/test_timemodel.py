"""The calibrated time model (`llmperf.analysis.timemodel`): curves, parsing, the three models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.analysis import ForwardModel, roofline_time_s
from llmperf.analysis.roofline import OpCost
from llmperf.analysis.timemodel import (
    READABLE_SCHEMAS,
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
    with pytest.raises(SpecError, match="schema_version"):  # one newer than this version reads
        parse_efficiency({**good, "schema_version": max(READABLE_SCHEMAS) + 1}, "f")
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


# ---- per-operator overheads and the overhead mode (efficiency schema 2) ------------------------------

def _hw(eff, vendor="cpu"):
    return HardwareSpec(name="local", vendor=vendor, peak_tflops={"fp32": 0.1}, memory_bandwidth_gbps=12,
                        memory_gib=8, efficiency=eff, calibration={"tool": "llmperf calibrate"})


def _eff(**extra):
    return {"schema_version": 2, "dtypes": {"fp32": {
        "matmul": {"e_compute": 0.5, "e_memory": 0.5, "overhead_s": 2e-6},
        "elementwise": {"e_compute": 1.0, "e_memory": 1.0, "overhead_s": 1e-6}}}, **extra}


def test_per_operator_overhead_wins_over_the_kind_and_is_per_backend():
    ops = {"sdpa": {"rope": 9e-5, "qkv_proj": 3e-5}, "naive": {"rope": 5e-5}}
    hw = _hw(_eff(op_overhead_s=ops))
    fm = ForwardModel(model=load_model("llama-3.1-8b").scaled(num_layers=2), precision=Precision.uniform("fp32"),
                      fused_qkv=True)
    rope, qkv, act = fm.rope(1, 1, 10), fm.qkv_proj(1, 1, 10), fm.act(1, 1, 10)
    sdpa = time_model_for(hw, "calibrated", "fp32")  # sdpa is the default backend
    assert sdpa.backend == "sdpa" and sdpa.overhead_for(rope) == (9e-5, "op")
    assert sdpa.overhead_for(qkv) == (3e-5, "op") and sdpa.overhead_for(act) == (1e-6, "kind")
    naive = time_model_for(hw, "calibrated", "fp32", backend="naive")
    assert naive.overhead_for(rope) == (5e-5, "op") and naive.overhead_for(qkv) == (2e-6, "kind")
    triton = time_model_for(hw, "calibrated", "fp32", backend="triton")  # never measured: per kind
    assert triton.op_overhead_s == {} and triton.backend == "" and triton.overhead_for(rope) == (1e-6, "kind")
    # add mode (the default, CPU): device time + overhead
    dev = ROOFLINE_MODEL.op_time_s(rope, hw, "fp32", 1)  # e = 1 for elementwise here
    assert sdpa.op_time_s(rope, hw, "fp32", 1) == pytest.approx(dev + 9e-5)
    with pytest.raises(SpecError, match="--backend"):
        time_model_for(hw, "calibrated", "fp32", backend="flash")


def test_warm_overheads_for_weights_that_fit_the_private_caches():
    """A CPU calibration measures each operator twice: cold (after a weight matrix streamed, as in a
    real model's step; the default) and warm. The warm figures apply only to a model whose weights fit
    `warm_below_bytes`; a bad `warm_below_bytes` is named."""
    hw = _hw(_eff(op_overhead_s={"sdpa": {"rope": 9e-5}}, op_overhead_warm_s={"sdpa": {"rope": 2e-5}},
                  warm_below_bytes=4 * 2**20))
    fm = ForwardModel(model=load_model("llama-3.1-8b").scaled(num_layers=2), precision=Precision.uniform("fp32"))
    rope = fm.rope(1, 1, 10)
    assert time_model_for(hw, "calibrated", "fp32").overhead_for(rope) == (9e-5, "op")  # unknown size: cold
    assert time_model_for(hw, "calibrated", "fp32", weight_bytes=16e9).overhead_for(rope) == (9e-5, "op")
    assert time_model_for(hw, "calibrated", "fp32", weight_bytes=1e6).overhead_for(rope) == (2e-5, "op")
    assert time_model_for(hw, "calibrated", "fp32", weight_bytes=4 * 2**20).overhead_for(rope) == (2e-5, "op")
    with pytest.raises(SpecError, match="warm_below_bytes"):
        time_model_for(_hw(_eff(op_overhead_s={"sdpa": {"rope": 9e-5}}, warm_below_bytes=-1)), "calibrated", "fp32")


def test_overlap_mode_takes_the_max_of_device_and_host():
    hw = _hw(_eff(overhead_mode="overlap", op_overhead_s={"sdpa": {"qkv_proj": 1e-4}}), vendor="NVIDIA")
    tm = time_model_for(hw, "calibrated", "fp32", engine="eager")  # the engine calibrate measured: its overheads
    fm = ForwardModel(model=load_model("llama-3.1-8b").scaled(num_layers=2), precision=Precision.uniform("fp32"),
                      fused_qkv=True)
    small = OpCost(name="qkv_proj", kind="matmul", flops=2e3, weight_bytes=4e3, rows=1)  # launch-bound
    big = fm.qkv_proj(64, 512, 512)
    for cost, rows in ((small, 1), (big, 64 * 512)):
        e_c, e_m = 0.5, 0.5
        device = max(cost.flops / (hw.peak_flops_per_s("fp32") * e_c), cost.bytes_total / (12e9 * e_m))
        assert tm.op_time_s(cost, hw, "fp32", rows) == pytest.approx(max(device, 1e-4))
    assert tm.op_time_s(big, hw, "fp32", 64 * 512) > 1e-4  # the big GEMM hides its launch entirely
    # the same through the library's one op_time (estimate, simulate): host_s is a floor, not an addend
    from llmperf.analysis.roofline import op_time
    t = op_time(small, hw, "fp32", tm)
    assert t.host_s == 1e-4 and t.overhead_s == 0 and float(t.time_s) == pytest.approx(1e-4)


def test_overlap_keeps_the_decode_closed_form_exact():
    """The closed-form decode sum (a flat host line in the max) equals the step-by-step sum."""
    from llmperf.analysis import estimate

    tm = time_model_for(H100, "typical", "bf16")
    assert tm.overhead_mode == "overlap"
    for batch, prompt in ((1, 100), (64, 3000)):
        est = estimate("llama-3.1-8b", "h100-sxm", batch=batch, prompt_len=prompt, gen_len=200, precision="bf16",
                       time_model=tm)
        assert est.decode_total_s == pytest.approx(float(est.decode_step_times_s().sum()), rel=1e-9)


def test_schema_1_still_loads_and_schema_2_fields_are_checked():
    old = {"schema_version": 1, "dtypes": {"fp32": {"matmul": {"overhead_s": 2e-6}}}}
    tm = time_model_for(_hw(old), "calibrated", "fp32")
    assert tm.overhead_mode == "add" and tm.op_overhead_s == {}
    with pytest.raises(SpecError, match="needs schema_version 2"):
        parse_efficiency({**old, "op_overhead_s": {"sdpa": {"rope": 1e-6}}}, "f")
    with pytest.raises(SpecError, match="overhead_mode"):
        parse_efficiency(_eff(overhead_mode="sometimes"), "f")
    with pytest.raises(SpecError, match="unknown attention backend 'flash'"):
        parse_efficiency(_eff(op_overhead_s={"flash": {"rope": 1e-6}}), "f")
    with pytest.raises(SpecError, match="unknown operator 'rotary'"):
        parse_efficiency(_eff(op_overhead_s={"sdpa": {"rotary": 1e-6}}), "f")
    with pytest.raises(SpecError, match=r"op_overhead_s.sdpa.rope: must be seconds"):
        parse_efficiency(_eff(op_overhead_s={"sdpa": {"rope": -1}}), "f")


@pytest.mark.parametrize("mode", ["add", "overlap"])
def test_the_overhead_is_paid_once_per_layer_in_every_roll_up(mode):
    """A per-layer operator launches once per layer: `estimate` (whose roll-ups scale an operator to L
    layers) pays its overhead L times, exactly as the per-layer sum does, in both overhead modes."""
    from llmperf.analysis import estimate

    oh = 1e-3  # far above any device time of gpt2's decode at batch 1 on an H100
    terms = KindTerms(e_compute=Curve(((1.0, 1.0),)), e_memory=Curve(((1.0, 1.0),)), overhead_s=oh)
    tm = EfficiencyTimeModel(name="t", kinds={k: terms for k in ("matmul", "attention", "norm", "elementwise",
                                                                  "embedding")}, overhead_mode=mode)
    est = estimate("gpt2", "h100-sxm", batch=1, prompt_len=16, gen_len=3, precision="fp16", time_model=tm)
    fm = est.forward_model()
    L = est.model.num_layers
    per_layer, model_level = len(fm.layer_ops(1, 1, 17)), len(fm.head_ops(1, 1, 17) + fm.tail_ops(1, 1, 17))
    launches = per_layer * L + model_level
    step = float(est.decode_step_times_s()[0])
    if mode == "overlap":  # every operator is launch-bound here: the step is its launches
        assert step == pytest.approx(launches * oh, rel=1e-9)
    else:
        roof = estimate("gpt2", "h100-sxm", batch=1, prompt_len=16, gen_len=3, precision="fp16")
        assert step - float(roof.decode_step_times_s()[0]) == pytest.approx(launches * oh, rel=1e-9)
    assert est.decode_total_s == pytest.approx(float(est.decode_step_times_s().sum()), rel=1e-9)


# ---- per-operator memory efficiency over the bytes of one call (efficiency schema 3) -----------------

def test_op_e_memory_prices_a_vector_operator_by_the_bytes_it_moves():
    """A measured curve over bytes replaces the kind's e_memory for that operator only (at its dtype),
    is read per call for a cost scaled to L layers, and keeps decode closed-form exact (the bytes of
    these operators never depend on the context)."""
    eff = {**_eff(), "schema_version": 3, "op_e_memory": {"fp32": {"act": [[2e5, 1.0], [1e8, 0.1]]},
                                                          "bf16": {"rope": [[1, 0.5]]}}}
    hw = _hw(eff)
    fm = ForwardModel(model=load_model("llama-3.1-8b").scaled(num_layers=2), precision=Precision.uniform("fp32"))
    tm = time_model_for(hw, "calibrated", "fp32")
    assert set(tm.op_e_memory) == {"act"}  # bf16's curves stay with bf16
    small, big = fm.act(1, 1, 10), fm.act(64, 512, 512)
    assert small.bytes_total < 2e5 and big.bytes_total > 1e8
    assert tm.efficiency(small, hw).e_memory == pytest.approx(1.0)
    assert tm.efficiency(big, hw).e_memory == pytest.approx(0.1)
    mid = fm.act(1, 64, 64)
    expect = np.interp(np.log(mid.bytes_total), np.log([2e5, 1e8]), [1.0, 0.1])
    assert tm.efficiency(mid, hw).e_memory == pytest.approx(expect)
    assert tm.efficiency(mid.scaled(32), hw).e_memory == pytest.approx(expect)  # per call, not per 32 calls
    rope = fm.rope(64, 512, 512)
    assert tm.efficiency(rope, hw).e_memory == 1.0  # elementwise kind: no curve for rope at fp32
    dev = big.bytes_total / (hw.mem_bandwidth_bytes_per_s * 0.1)
    assert tm.op_time_s(big, hw, "fp32", 64 * 512) == pytest.approx(dev + 1e-6)
    a, b = fm.forward_ops(8, 1, 100), fm.forward_ops(8, 1, 100_000)
    for x, y in zip(a, b):
        if x.kind != "attention":
            assert tm.efficiency(x, hw, 8) == tm.efficiency(y, hw, 8)
    assert tm.to_dict()["op_e_memory"] == {"act": [[2e5, 1.0], [1e8, 0.1]]}


def test_op_e_memory_errors_name_the_field():
    base = {**_eff(), "schema_version": 3}
    with pytest.raises(SpecError, match="op_e_memory: needs schema_version 3, the file says 2"):
        parse_efficiency({**_eff(), "op_e_memory": {"fp32": {"act": 0.5}}}, "f")
    with pytest.raises(SpecError, match="unknown operator 'swish'"):
        parse_efficiency({**base, "op_e_memory": {"fp32": {"swish": 0.5}}}, "f")
    with pytest.raises(SpecError, match="'attn_softmax' cannot take a per-operator memory efficiency"):
        parse_efficiency({**base, "op_e_memory": {"fp32": {"attn_softmax": 0.5}}}, "f")
    with pytest.raises(SpecError, match=r"f.op_e_memory.fp32.act: bytes must be >= 1, got 0"):
        parse_efficiency({**base, "op_e_memory": {"fp32": {"act": [[0, 0.5]]}}}, "f")
    with pytest.raises(SpecError, match=r"f.op_e_memory.fp32.act: an efficiency must be in \(0, 1\]"):
        parse_efficiency({**base, "op_e_memory": {"fp32": {"act": [[10, 1.5]]}}}, "f")
    with pytest.raises(SpecError, match=r"f.op_e_memory.fp32: expected a mapping"):
        parse_efficiency({**base, "op_e_memory": {"fp32": [1, 2]}}, "f")


def test_op_overhead_rows_wins_per_dtype_and_rows():
    """`op_overhead_rows_s` (CPU: the plain one-row GEMM dispatches cheaper than the packed one) wins
    over `op_overhead_s` for its dtype and backend, interpolates over rows, is skipped for a model
    whose weights fit the private caches (warm dispatch), and its errors name the field."""
    rows_tab = {"fp32": {"sdpa": {"qkv_proj": [[1, 4e-5], [2, 1.2e-4]]}}}
    eff = {**_eff(op_overhead_s={"sdpa": {"qkv_proj": 3e-5, "rope": 9e-5}},
                  op_overhead_warm_s={"sdpa": {"qkv_proj": 5e-6}}, warm_below_bytes=4 * 2**20),
           "schema_version": 3, "op_overhead_rows_s": rows_tab}
    hw = _hw(eff)
    fm = ForwardModel(model=load_model("llama-3.1-8b").scaled(num_layers=2), precision=Precision.uniform("fp32"),
                      fused_qkv=True)
    tm = time_model_for(hw, "calibrated", "fp32")
    one, four = fm.qkv_proj(1, 1, 10), fm.qkv_proj(4, 1, 10)
    assert tm.overhead_for(one) == (pytest.approx(4e-5), "op")
    assert tm.overhead_for(four) == (pytest.approx(1.2e-4), "op")  # flat past the last point
    assert tm.overhead_for(one, rows=4) == (pytest.approx(1.2e-4), "op")
    assert tm.overhead_for(fm.rope(4, 1, 10)) == (9e-5, "op")  # no rows curve: the per-operator figure
    dev = ROOFLINE_MODEL.op_time_s(four, hw, "fp32", 4)
    assert tm.op_time_s(four, hw, "fp32", 4) >= dev + 1.2e-4 - 1e-12
    assert time_model_for(hw, "calibrated", "fp32", backend="naive").op_overhead_rows == {}
    assert time_model_for(hw, "calibrated", "fp32", weight_bytes=1e6).overhead_for(four) == (5e-6, "op")  # warm
    bf16 = _hw({**eff, "dtypes": {**eff["dtypes"], "bf16": eff["dtypes"]["fp32"]}})
    assert time_model_for(bf16, "calibrated", "bf16").op_overhead_rows == {}  # measured for fp32 only
    assert time_model_for(hw, "calibrated", "fp32").to_dict()["op_overhead_rows_s"] == {
        "qkv_proj": [[1.0, 4e-5], [2.0, 1.2e-4]]}
    with pytest.raises(SpecError, match="op_overhead_rows_s: needs schema_version 3"):
        parse_efficiency({**_eff(), "op_overhead_rows_s": rows_tab}, "f")
    with pytest.raises(SpecError, match=r"f.op_overhead_rows_s.fp32.sdpa.qkv_proj: seconds must be in \(0, 1\)"):
        parse_efficiency({**eff, "op_overhead_rows_s": {"fp32": {"sdpa": {"qkv_proj": [[1, 2.0]]}}}}, "f")
    with pytest.raises(SpecError, match="unknown attention backend 'flash'"):
        parse_efficiency({**eff, "op_overhead_rows_s": {"fp32": {"flash": {}}}}, "f")
    with pytest.raises(SpecError, match="unknown operator 'proj'"):
        parse_efficiency({**eff, "op_overhead_rows_s": {"fp32": {"sdpa": {"proj": 1e-5}}}}, "f")


def test_a_model_is_priced_with_the_dispatch_of_the_path_its_decode_step_takes():
    """Schema 8 (CPU): the rows table, measured on a Llama-shaped model whose decode step runs in one
    call of llmperf's kernels, prices a decode step of a model that does too (plain Llama layers, a
    head dim and rows the kernels take, the sdpa backend); every other model (today's families), a
    decode of more rows, a prefill and the naive backend pay each operator's dispatch one by one
    (`op_overhead_rows_by_op_s`); the weight GEMMs keep their rows curves; a file without the figures
    prices every model alike; the estimate, the simulator and profile ask the same; errors name the field."""
    from llmperf.analysis.generation import estimate
    from llmperf.serving.simulator import ServingConfig

    rows_tab = {"fp32": {b: {"qkv_proj": [[1, 4e-5], [2, 1.2e-4]], "attn_norm": [[1, 2e-6], [2, 3e-6]]}
                         for b in ("sdpa", "naive")}}
    by_op = {"fp32": {b: {"attn_norm": [[1, 1.5e-5], [2, 1.6e-5]], "qk_norm": [[1, 3e-5], [2, 3.1e-5]]}
                      for b in ("sdpa", "naive")}}
    eff = {**_eff(), "schema_version": 8, "op_overhead_rows_s": rows_tab, "op_overhead_rows_by_op_s": by_op,
           "one_call": {"max_head_dim": 128, "rows": {"fp32": 8}}}
    hw = _hw(eff)
    llama = load_model("llama-3.1-8b").scaled(num_layers=2)
    qwen3 = load_model("qwen3-8b").scaled(num_layers=2)
    assert llama.one_call_layers and not qwen3.one_call_layers
    fm = ForwardModel(model=qwen3, precision=Precision.uniform("fp32"), fused_qkv=True)
    norm, qk, qkv = fm.attn_norm(1, 1, 10), fm.qk_norm(1, 1, 10), fm.qkv_proj(1, 1, 10)
    tm = time_model_for(hw, "calibrated", "fp32")
    dense, other = tm.for_model(llama), tm.for_model(qwen3)
    for rows, seconds in ((1, 2e-6), (8, 3e-6), (9, 1.6e-5), (64, 1.6e-5)):  # one call up to its 8 rows
        assert dense.overhead_for(norm, rows=rows) == (pytest.approx(seconds), "op")
    assert other.overhead_for(norm, rows=1) == (pytest.approx(1.5e-5), "op")
    assert other.overhead_for(qk, rows=1) == (pytest.approx(3e-5), "op")
    assert dense.for_phase("prefill").overhead_for(norm, rows=1) == (pytest.approx(1.5e-5), "op")
    for model in (dense, other, dense.for_phase("prefill")):  # the weight GEMMs: their rows curve
        assert model.overhead_for(qkv, rows=1) == (pytest.approx(4e-5), "op")
    naive = time_model_for(hw, "calibrated", "fp32", backend="naive").for_model(llama)
    assert naive.overhead_for(norm, rows=1) == (pytest.approx(1.5e-5), "op")  # the one call runs sdpa only
    wide = load_model("llama-3.1-8b").scaled(num_layers=2, head_dim=256, rotary_dim=None)
    assert tm.for_model(wide).overhead_for(norm, rows=1) == (pytest.approx(1.5e-5), "op")
    older = time_model_for(_hw({**_eff(), "schema_version": 7, "op_overhead_rows_s": rows_tab}), "calibrated", "fp32")
    assert older.for_model(qwen3) is older
    assert time_model_for(hw, "calibrated", "fp32").to_dict()["one_call_rows"] == 8
    # every pricing of a model asks for its path: an estimate's decode step, the simulator's model, profile's
    slow = _hw({**eff, "op_overhead_rows_by_op_s": {"fp32": {"sdpa": {**by_op["fp32"]["sdpa"],
                                                                      "attn_norm": [[1, 0.25]]}}}})
    base = estimate(qwen3, hw, batch=1, prompt_len=8, gen_len=4, precision="fp32", time_model=tm)
    more = estimate(qwen3, slow, batch=1, prompt_len=8, gen_len=4, precision="fp32",
                    time_model=time_model_for(slow, "calibrated", "fp32"))
    assert more.tpot_s - base.tpot_s == pytest.approx(2 * (0.25 - 1.5e-5), rel=1e-6)  # two layers' norms
    same = [estimate(llama, h, batch=1, prompt_len=8, gen_len=4, precision="fp32",
                     time_model=time_model_for(h, "calibrated", "fp32")).tpot_s for h in (hw, slow)]
    assert same[0] == same[1]  # one call: the one-by-one figure never prices its decode
    sim = ServingConfig(model=qwen3, hardware=hw, precision=Precision.uniform("fp32"), efficiency="calibrated")
    assert sim.resolve_time_model().overhead_for(norm, rows=1) == (pytest.approx(1.5e-5), "op")
    from llmperf.measure.profile import calibrated_model
    assert calibrated_model(hw, qwen3, Precision.uniform("fp32"), "fp32", "sdpa").overhead_for(norm, rows=1) == (
        pytest.approx(1.5e-5), "op")
    with pytest.raises(SpecError, match="f.one_call: needs schema_version 8, the file says 7"):
        parse_efficiency({**eff, "schema_version": 7}, "f")
    with pytest.raises(SpecError, match=r"f.one_call.max_head_dim: must be an integer in \[0, 4096\], got -1"):
        parse_efficiency({**eff, "one_call": {"max_head_dim": -1}}, "f")
    with pytest.raises(SpecError, match=r"f.one_call.rows.fp32: must be an integer in \[0, 4096\], got 'eight'"):
        parse_efficiency({**eff, "one_call": {"rows": {"fp32": "eight"}}}, "f")
    with pytest.raises(SpecError, match="f.one_call: unknown field 'row'"):
        parse_efficiency({**eff, "one_call": {"row": {}}}, "f")


def test_a_routed_experts_own_operators_take_their_own_dispatch():
    """`op_overhead_rows_expert_s` (schema 8, CPU): llmperf's engine calls a routed expert's activation
    once per expert, between the expert's small GEMMs, so it takes that figure per call (times the
    experts touched); a dense FFN's activation keeps the dense one; a file without it prices both alike."""
    rows_tab = {"fp32": {"sdpa": {"act": [[1, 2e-6], [2, 2e-6]]}}}
    by_op = {"fp32": {"sdpa": {"act": [[1, 1.9e-5], [2, 2e-5]]}}}
    eff = {**_eff(), "schema_version": 8, "op_overhead_rows_s": rows_tab, "op_overhead_rows_by_op_s": by_op,
           "one_call": {"max_head_dim": 128, "rows": {"fp32": 8}},
           "op_overhead_rows_expert_s": {"fp32": {"sdpa": {"act": [[1, 8e-6], [2, 9e-6]]}}}}
    moe = load_model("qwen3-30b-a3b").scaled(num_layers=2)
    dense = load_model("qwen3-8b").scaled(num_layers=2)

    def act(spec, hw):  # noqa: ANN001, ANN202
        fm = ForwardModel(model=spec, precision=Precision.uniform("fp32"), fused_qkv=True, fused_gate_up=True)
        cost = next(c for c in fm.layer_ops(1, 1, 10, spec.layer_kinds()[0]) if c.name == "act")
        return cost, time_model_for(hw, "calibrated", "fp32").for_model(spec).efficiency(cost).overhead_s

    cost, seconds = act(moe, _hw(eff))
    assert cost.experts == pytest.approx(8.0) and seconds == pytest.approx(8 * 8e-6)  # one call per expert
    assert act(dense, _hw(eff))[1] == pytest.approx(1.9e-5)
    plain = {k: v for k, v in eff.items() if k != "op_overhead_rows_expert_s"}
    assert act(moe, _hw(plain))[1] == pytest.approx(8 * 1.9e-5)
    assert time_model_for(_hw(eff), "calibrated", "fp32").to_dict()["op_overhead_rows_expert_s"] == {
        "act": [[1.0, 8e-6], [2.0, 9e-6]]}
    with pytest.raises(SpecError, match="f.op_overhead_rows_expert_s: needs schema_version 8, the file says 7"):
        parse_efficiency({**_eff(), "schema_version": 7, "op_overhead_rows_expert_s": {}}, "f")


def test_estimates_parts_are_priced_as_its_rollup_on_a_cpu_calibration():
    """A CPU calibration prices each model by the path its decode step takes (`for_model`): the
    estimate's per-step series and its phase tables must be priced so too, as its roll-up is (before:
    Qwen3's decode steps summed 0.2% below the roll-up's decode time)."""
    from pathlib import Path

    from llmperf.analysis.generation import estimate
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.specs import load_hardware, load_model
    cal = Path(__file__).resolve().parents[2] / "reports" / "speculative" / "2026-11-27-cpu" / "calibration.yaml"
    hw = load_hardware(cal)
    for name in ("qwen3-8b", "llama-3.1-8b"):
        e = estimate(load_model(name).scaled(num_layers=2), hw, batch=1, prompt_len=64, gen_len=16, precision="fp32",
                     time_model=lambda h, d: time_model_for(h, "calibrated", d))
        assert e.decode_step_times_s().sum() == pytest.approx(e.decode_total_s, rel=1e-12)
        assert e.prefill.time_s == pytest.approx(e.ttft_s, rel=1e-12)
