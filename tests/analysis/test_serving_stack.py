"""Serving-stack profiles (`models_spec/engines/`, `--engine`): they parse, bad values and unknown names
are refused in one line, and their step overhead and launch terms move a decode step by exactly what
they say (structural checks on a tiny model, no timing). Named without "engine" so that `-k "not
engine"` (the torch engine's tests) keeps them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import llmperf
from llmperf.analysis.timemodel import (
    DEFAULT_ENGINE,
    OP_KINDS,
    EngineProfile,
    engine_names,
    load_engine,
    time_model_for,
)
from llmperf.cli import app
from llmperf.errors import SpecError
from llmperf.specs import load_hardware

runner = CliRunner()


def run(*args):  # noqa: ANN201
    return runner.invoke(app, [str(a) for a in args])


def _raw(**changes):  # noqa: ANN201
    raw = dict(schema_version=1, name="x", source="s", launch_s=dict(matmul=5e-6), graph_max_batch=8,
               decode=dict(step_overhead_s=1e-4, cuda_graph=True), prefill=dict(step_overhead_s=2e-4, cuda_graph=False))
    raw.update(changes)
    return raw


# ---- the profiles ------------------------------------------------------------------------------------
def test_shipped_profiles_parse_and_cite_their_figures():
    assert {"compiled", "eager"} <= set(engine_names()) and DEFAULT_ENGINE == "compiled"
    for name in engine_names():
        p = load_engine(name)
        assert p.name == name and p.source and set(p.launch_s) == set(OP_KINDS)
        assert 0 < p.decode.step_overhead_s < 1e-2 and 0 < p.prefill.step_overhead_s < 1e-2
    compiled, eager = load_engine("compiled"), load_engine("eager")
    assert compiled.decode.cuda_graph and not compiled.prefill.cuda_graph and compiled.graph_max_batch >= 1
    assert not eager.decode.cuda_graph and not eager.prefill.cuda_graph and eager.calibrated_overheads


@pytest.mark.parametrize("changes, message", [
    (dict(schema_version=2), "schema_version: expected 1, got 2"),
    (dict(colour="red"), "unknown field 'colour'"),
    (dict(launch_s=dict(gemm=1e-6)), "launch_s: unknown operator kind 'gemm'"),
    (dict(launch_s=dict(matmul=-1e-6)), "launch_s.matmul: must be seconds in [0, 1), got -1e-06"),
    (dict(decode=dict(step_overhead_s=2.0, cuda_graph=True)), "decode.step_overhead_s: must be seconds in [0, 1)"),
    (dict(decode=dict(step_overhead_s=1e-4, cuda_graph="yes")), "decode.cuda_graph: must be true or false"),
    (dict(prefill=dict(step_overhead_s=1e-4)), "prefill: expected a mapping with step_overhead_s and cuda_graph"),
    (dict(expert_launches="each"), "expert_launches: must be one of grouped, per_expert, got 'each'"),
    (dict(graph_max_batch=0), "graph_max_batch: a CUDA-graph phase needs the largest batch it captures"),
    (dict(graph_max_batch=-3), "graph_max_batch: must be an integer >= 0, got -3"),
])
def test_bad_profile_values_are_refused_in_one_line(changes, message):
    with pytest.raises(SpecError) as info:
        EngineProfile.parse(_raw(**changes), "x.yaml")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_names_and_a_cpu_are_refused():
    hw = load_hardware("h100-sxm")
    with pytest.raises(SpecError, match=r"^--engine: unknown engine profile 'nope' \(profiles: compiled, eager"):
        time_model_for(hw, "typical", "bf16", engine="nope")
    with pytest.raises(SpecError, match="unknown engine profile"):  # even where the roofline takes none
        time_model_for(hw, "roofline", "bf16", engine="nope")
    cpu = replace(hw, name="some-cpu", vendor="cpu")
    with pytest.raises(SpecError, match="^--engine compiled: 'some-cpu' is a CPU, which runs llmperf's own engine"):
        time_model_for(cpu, "calibrated", "fp32", engine="compiled")


def test_the_roofline_takes_no_profile_and_a_gpu_defaults_to_compiled():
    hw = load_hardware("h100-sxm")
    assert time_model_for(hw, "roofline", "bf16", engine="eager").name == "roofline"
    tm = time_model_for(hw, "typical", "bf16")
    assert tm.engine == "compiled" and tm.for_phase("prefill").engine == "compiled"


# ---- what the terms do to a step -----------------------------------------------------------------------
def _phases(engine: str, batch: int = 1):  # noqa: ANN202
    tm = time_model_for(load_hardware("h100-sxm"), "typical", "bf16", engine=engine)
    est = llmperf.estimate("gpt2", "h100-sxm", batch=batch, prompt_len=64, gen_len=4, time_model=tm)
    return est.prefill, est.decode_first


def test_a_graph_replayed_decode_step_pays_the_step_overhead_and_no_launch():
    p = load_engine("compiled")
    prefill, decode = _phases("compiled")
    assert decode.step_overhead_s == p.decode.step_overhead_s
    assert all(float(o.host_s) == 0 for o in decode.ops)  # only the kernels' device floors
    assert decode.time_s == pytest.approx(sum(float(o.time_s) for o in decode.ops) + decode.pipeline_s
                                          + p.decode.step_overhead_s, rel=1e-12)
    # the prefill runs eagerly: every kernel's launch overlapped, the prefill's own step overhead
    assert prefill.step_overhead_s == p.prefill.step_overhead_s
    for o in prefill.ops:
        assert float(o.host_s) == pytest.approx(p.launch_s[o.cost.kind] * o.cost.calls, rel=1e-12)


def test_a_decode_batch_above_the_captured_sizes_launches_eagerly():
    p = load_engine("compiled")
    _, decode = _phases("compiled", batch=p.graph_max_batch + 1)
    for o in decode.ops:
        assert float(o.host_s) == pytest.approx(p.launch_s[o.cost.kind] * o.cost.calls, rel=1e-12)


def test_an_eager_decode_step_is_launch_bound_on_a_tiny_model():
    """gpt2 at batch 1 on an H100: every norm's device time is far below the eager launch, so each
    norm costs its launch; the step's fixed cost is the eager engine's."""
    p = load_engine("eager")
    _, decode = _phases("eager")
    assert decode.step_overhead_s == p.decode.step_overhead_s
    norms = [o for o in decode.ops if o.cost.kind == "norm"]
    assert norms
    for o in norms:
        assert float(o.time_s) == pytest.approx(p.launch_s["norm"] * o.cost.calls, rel=1e-12)
    _, compiled = _phases("compiled")
    assert decode.time_s > compiled.time_s


def test_a_serving_step_with_a_prefill_chunk_takes_the_prefill_terms():
    from llmperf.serving.costmodel import StepCostModel
    tm = time_model_for(load_hardware("h100-sxm"), "typical", "bf16")
    est = llmperf.estimate("gpt2", "h100-sxm", batch=2, prompt_len=64, gen_len=4, precision="bf16",
                           time_model=tm)
    cm = StepCostModel(model=est.model, hardware=est.hardware, precision=est.precision, time_model=tm)
    assert cm.step_time_s([64, 64], [64, 64], 2) == pytest.approx(est.ttft_s, rel=1e-12)
    assert cm.step_time_s([1, 1], [65, 65], 2) == pytest.approx(est.decode_step_times_s()[0], rel=1e-12)
    assert cm.prefill_costs.step_overhead_s == load_engine("compiled").prefill.step_overhead_s


# ---- the commands name the time model and the profile, and show the bound ------------------------------
def test_estimate_defaults_to_the_expected_time_with_the_bound_beside_it():
    r = run("estimate", "gpt2", "-H", "h100-sxm")
    assert r.exit_code == 0, r.output
    assert "expected" in r.stdout and "bound" in r.stdout and "typical, engine compiled" in r.stdout
    row = json.loads(run("estimate", "gpt2", "-H", "h100-sxm", "-f", "json").stdout)["configurations"][0]
    assert row["time_model"] == "typical" and row["engine"] == "compiled"
    assert 0 < row["tpot_bound_s"] < row["tpot_s"] and 0 < row["ttft_bound_s"] < row["ttft_s"]
    eager = json.loads(run("estimate", "gpt2", "-H", "h100-sxm", "--engine", "eager", "-f", "json").stdout)
    assert eager["configurations"][0]["engine"] == "eager"
    assert eager["configurations"][0]["tpot_bound_s"] == row["tpot_bound_s"]  # the bound takes no engine
    roof = json.loads(run("estimate", "gpt2", "-H", "h100-sxm", "--efficiency", "roofline", "-f", "json").stdout)
    roof = roof["configurations"][0]
    assert roof["engine"] == "none" and roof["tpot_s"] == roof["tpot_bound_s"] == row["tpot_bound_s"]
    csv = run("estimate", "gpt2", "-H", "h100-sxm", "-b", "1,2", "-f", "csv").stdout.splitlines()[0].split(",")
    assert {"time_model", "engine", "tpot_s", "tpot_bound_s"} <= set(csv)


@pytest.mark.parametrize("command", [
    ["estimate", "gpt2"], ["simulate", "gpt2", "--requests", "5"], ["report", "-m", "gpt2", "-o", "x.html"],
    ["plan", "gpt2", "--rate", "1", "--slo-tpot", "0.1"],
])
def test_every_command_refuses_an_unknown_profile_in_one_line(command):
    r = run(*command, "--engine", "nope")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--engine: unknown engine profile 'nope' (profiles: compiled, eager" in r.output


def test_simulate_and_plan_run_dirs_name_the_time_model_and_the_profile(tmp_path):
    small = ["--requests", "20", "--prompt-len", "uniform:20:60", "--output-len", "uniform:4:12"]
    r = run("simulate", "gpt2", "-H", "h100-sxm", "--rate", "5", *small, "--engine", "eager",
            "--run-dir", tmp_path / "sim")
    assert r.exit_code == 0, r.output
    assert "TPOT expected" in r.stdout and "TPOT bound" in r.stdout
    doc = json.loads((tmp_path / "sim" / "run.json").read_text())
    assert doc["settings"]["time_model"] == "typical" and doc["settings"]["engine"] == "eager"
    assert doc["summary"]["bound"]["tpot_s"]["p50"] < doc["summary"]["tpot_s"]["p50"]
    r = run("plan", "gpt2", "-H", "h100-sxm", "--precisions", "bf16", "--tp", "1", "--rate", "2", "--slo-tpot", "0.1",
            *small, "--run-dir", tmp_path / "plan")
    assert r.exit_code == 0, r.output
    assert "engine profile compiled" in r.stdout
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert doc["settings"]["engine"] == "compiled"
    assert {(row["time_model"], row["engine"]) for row in doc["rows"]} == {("typical", "compiled")}


# ---- a MoE layer's routed experts: one grouped kernel, or a call each ------------------------------
def _routed(fm, batch, q_len):  # noqa: ANN001, ANN202
    from llmperf.analysis.gemm import GemmShape

    ops = {c.name: c for c in fm.layer_ops(batch, q_len, q_len + 1, fm.model.layer_kinds()[0])}
    up, dense = ops["gate_up_proj"], ops["qkv_proj"]
    assert isinstance(up.gemm, GemmShape) and up.gemm.groups > 1 and dense.gemm.groups == 1
    return up, dense


def test_per_expert_launches_pay_each_touched_experts_call_at_its_own_rows():
    """llmperf's own engine (calibrated, or `--engine eager`) calls each touched expert's GEMM: a routed
    operator pays its per-call overhead and device floor once per expert, at the expert's share of the
    rows; a grouped stack (compiled: vLLM's fused MoE) pays them once; a dense projection is one call."""
    from llmperf.analysis import ForwardModel
    from llmperf.specs import Precision, load_model

    h100 = load_hardware("h100-sxm")
    fm = ForwardModel(model=load_model("qwen3-30b-a3b").scaled(num_layers=1), precision=Precision.uniform("bf16"),
                      fused_qkv=True, fused_gate_up=True)
    compiled = time_model_for(h100, "typical", "bf16", engine="compiled").prefill
    eager = time_model_for(h100, "typical", "bf16", engine="eager").prefill
    assert (compiled.expert_launches, eager.expert_launches) == ("grouped", "per_expert")
    up, dense = _routed(fm, 1, 512)
    experts = float(up.gemm.groups)  # the experts 512 tokens touch under uniform routing (~128 of 128)
    assert 120 < experts <= 128 and compiled.launches(up) is None and eager.launches(up) == pytest.approx(experts)
    g, e = compiled.efficiency(up, h100), eager.efficiency(up, h100)
    assert g.host_s == load_engine("compiled").launch_s["matmul"]  # one launch of the grouped kernel
    assert e.host_s == pytest.approx(experts * load_engine("eager").launch_s["matmul"])
    assert e.floor_s == pytest.approx(experts * g.floor_s) and g.floor_s == compiled.floor_for(up)
    assert eager.efficiency(dense, h100).host_s == load_engine("eager").launch_s["matmul"]  # a dense one: one call
    assert eager.launches(dense) is None
    # the calibrated model prices llmperf's own engine: per expert, its per-rows dispatch at each expert's rows
    dispatch = _curve([[1, 1e-6], [16, 1e-4]])  # seconds a call by its rows
    cal = replace(eager, name="calibrated", op_overhead_rows={"gate_up_proj": dispatch}, overhead_mode="add")
    per_expert_rows = 512 * 8 / experts  # ~32: past the curve's 16 rows
    assert cal.efficiency(up, h100).overhead_s == pytest.approx(experts * 1e-4)
    decode_up, _ = _routed(fm, 4, 1)  # 32 routed rows over ~29 experts: about one row each
    touched = float(decode_up.gemm.groups)
    assert per_expert_rows > 16 and 28 < touched < 32
    assert cal.efficiency(decode_up, h100).overhead_s == pytest.approx(touched * dispatch(32 / touched))
    assert dispatch(32 / touched) < 5e-6  # not the 32-row figure the layer's rows would read


def test_per_expert_launches_call_the_experts_activation_and_sum_once_per_expert():
    """The routed operators that are not GEMMs (the experts' activation, `moe_sum`) run once per touched
    expert in llmperf's own engine (`llmperf.engine.moe`) and once per layer in a grouped stack; the
    router's choice (`moe_route`) and the shared experts' activation run once in both."""
    from llmperf.analysis import ForwardModel
    from llmperf.specs import Precision, load_model

    h100 = load_hardware("h100-sxm")
    fm = ForwardModel(model=load_model("qwen3-30b-a3b").scaled(num_layers=1), precision=Precision.uniform("bf16"),
                      fused_qkv=True, fused_gate_up=True)
    compiled = time_model_for(h100, "typical", "bf16", engine="compiled")
    eager = time_model_for(h100, "typical", "bf16", engine="eager")
    ops = {c.name: c for c in fm.layer_ops(4, 1, 100, fm.model.layer_kinds()[0])}
    touched = float(ops["gate_up_proj"].gemm.groups)
    assert 28 < touched < 32
    for name in ("act", "moe_sum"):
        assert ops[name].experts == pytest.approx(touched) and compiled.launches(ops[name]) is None
        assert eager.launches(ops[name]) == pytest.approx(touched)
        e, g = eager.efficiency(ops[name], h100), compiled.efficiency(ops[name], h100)
        assert e.floor_s == pytest.approx(touched * g.floor_s)
        assert e.host_s == pytest.approx(touched * eager.overhead_for(ops[name], 32 / touched)[0])
    assert ops["moe_route"].experts is None and eager.launches(ops["moe_route"]) is None


def _curve(points):  # noqa: ANN001, ANN202
    from llmperf.specs.efficiency import Curve

    return Curve.parse(points, "test", x="rows")


def test_a_calibration_prices_llmperfs_engine_with_a_call_per_expert():
    from llmperf.analysis.timemodel import EfficiencyTimeModel

    cpu = load_hardware("reports/calibrate/2026-11-26e-cpu-todays.yaml")
    assert time_model_for(cpu, "calibrated", "fp32").expert_launches == "per_expert"
    assert time_model_for(load_hardware("h100-sxm"), "typical", "bf16", engine=None).expert_launches == "grouped"
    with pytest.raises(SpecError, match="expert_launches: must be one of grouped, per_expert, got 'some'"):
        EfficiencyTimeModel(name="x", expert_launches="some")


def test_a_calibrated_prefill_attention_reads_its_sequences_length_not_the_steps_tokens():
    """calibrate times attention as causal squares of one sequence (prefill) and as decode batches, so the
    calibrated model keys a fused attention's curves by the prompt's length in a prefill (4 prompts of
    512 tokens: the 512-token square's efficiency, not a 2048-token one's) and by the batch in a decode."""
    from llmperf.analysis.attention_eff import AttnShape
    from llmperf.analysis.roofline import OpCost
    from llmperf.specs.efficiency import Curve, KindTerms

    curve = Curve.parse([[1, 0.5], [4, 0.4], [256, 0.2], [1024, 0.3]], "t", x="rows")
    tm = replace(time_model_for(load_hardware("reports/calibrate/2026-11-26e-cpu-todays.yaml"), "calibrated", "fp32"),
                 kinds={"attention": KindTerms(e_compute=curve, e_memory=curve)})

    def attention(batch, q_len):  # noqa: ANN001, ANN202
        shape = AttnShape(batch=batch, q_len=q_len, context=q_len, heads=32, kv_heads=4, head_dim=128)
        return OpCost(name="attention", kind="attention", flops=1e9, act_read_bytes=1e6, rows=batch * q_len, attn=shape)

    for batch in (1, 4, 16):
        e = tm.efficiency(attention(batch, 512), None)
        assert (e.e_compute, e.e_memory) == (pytest.approx(curve(512)), pytest.approx(curve(512)))
    assert tm.efficiency(attention(4, 1), None).e_memory == pytest.approx(0.4)  # a decode: its batch
    assert tm.efficiency(attention(1, 1024), None).e_compute == pytest.approx(0.3)
    # a model that prices attention by its shape (typical: attention_eff) is not keyed by rows at all
    typical = time_model_for(load_hardware("h100-sxm"), "typical", "bf16", engine="compiled")
    assert typical.attention_eff is not None
