"""The serving simulator, its speculative draft and the planner under a measured router's load
(`expert_load`) and EPLB (`eplb`): skewed routing slows the busiest expert-parallel GPU, EPLB's
redundant experts take memory, a draft routes as the target only when it is the target's own layers,
and bad values are refused naming the field."""

from __future__ import annotations

import json

import pytest

from llmperf.errors import SpecError
from llmperf.serving import planner
from llmperf.serving.simulator import SLO, ServingConfig, plan_memory, simulate
from llmperf.serving.speculative import SpeculativeConfig, _draft_conventions, draft_memory
from llmperf.serving.workload import WorkloadSpec, generate
from llmperf.specs import Precision, load_hardware, load_model
from llmperf.specs.expert_load import ExpertLoad, load_expert_load

FP8 = Precision.preset("fp8", "bf16")


def skewed_load(path, experts: int, hot: int, layers: int = 2):
    """A SGLang logical_count file: the first `hot` experts four times as popular as the rest (all on the
    first expert-parallel GPUs when placed contiguously)."""
    row = [4000.0] * hot + [1000.0] * (experts - hot)
    path.write_text(json.dumps({"logical_count": [row] * layers}))
    return path


def p50(config: ServingConfig, workload) -> float:
    return float(simulate(workload, config).summary()["ttft_s"]["p50"])


def test_a_skewed_load_slows_prefill_on_expert_parallel_gpus_and_eplb_evens_it(tmp_path):
    path = skewed_load(tmp_path / "load.json", 128, 16)
    w = generate(WorkloadSpec(arrival="poisson:2", prompt_len="2000", output_len="10", num_requests=6, seed=0))
    common = dict(model="qwen3-30b-a3b", hardware="h100-sxm", tp=4, ep=4, efficiency="roofline")
    uniform = ServingConfig.build(**common)
    skewed = ServingConfig.build(**common, expert_load=str(path))  # a path is read into an ExpertLoad
    balanced = ServingConfig.build(**common, expert_load=skewed.expert_load, eplb=0)
    assert isinstance(skewed.expert_load, ExpertLoad)
    t_u, t_s, t_b = p50(uniform, w), p50(skewed, w), p50(balanced, w)
    assert t_s > t_u * 1.02  # the hot experts' GPU holds the rows of 64 of 176 shares, not 1/4
    assert t_b < t_s
    st = skewed.settings()
    assert (st["expert_load"], st["eplb"], st["ep"]) == (str(path), None, 4)
    assert balanced.settings()["eplb"] == 0 and uniform.settings()["expert_load"] is None


def test_eplb_redundant_experts_take_weights_and_blocks():
    m, hw = load_model("deepseek-v3"), load_hardware("h200")
    plain = plan_memory(ServingConfig(model=m, hardware=hw, precision=FP8, tp=8, ep=8))
    eplb = plan_memory(ServingConfig(model=m, hardware=hw, precision=FP8, tp=8, ep=8, eplb=32))
    assert eplb.weights_bytes > plain.weights_bytes * 1.05  # 36 routed experts a GPU, not 32
    assert eplb.num_blocks < plain.num_blocks


@pytest.mark.parametrize("kw, field", [
    (dict(model="deepseek-v3", tp=8, ep=8, eplb=3), "eplb: 256 experts + 3 redundant do not divide over ep=8"),
    (dict(model="qwen3-30b-a3b", eplb=8), "eplb: 8 needs expert parallelism (ep > 1)"),
    (dict(model="qwen3-30b-a3b", tp=2, ep=2, eplb=-1), "eplb: must be an integer >= 0"),
    (dict(model="llama-3.1-8b", eplb=0), "eplb: 0 needs a mixture-of-experts model"),
    (dict(model="deepseek-v3", tp=8, ep=8, expert_load="LOAD"), "expert_load: "),
])
def test_bad_expert_load_and_eplb_are_refused_naming_the_field(tmp_path, kw, field):
    if kw.get("expert_load") == "LOAD":
        kw["expert_load"] = skewed_load(tmp_path / "q.json", 128, 16)  # 128 experts, DeepSeek-V3 has 256
    with pytest.raises(SpecError) as exc:
        ServingConfig.build(hardware="h200", **kw)
    assert str(exc.value).startswith(field.split(" ")[0]) and field in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_draft_routes_as_the_target_only_when_it_is_the_targets_own_layers(tmp_path):
    m, hw = load_model("deepseek-v3"), load_hardware("h200")
    load = load_expert_load(skewed_load(tmp_path / "d.json", 256, 32))

    def config(draft, **kw):
        spec = SpeculativeConfig(draft=draft, num_draft_tokens=2, acceptance=0.8)
        return ServingConfig(model=m, hardware=hw, precision=FP8, tp=8, ep=8, speculative=spec, **kw)

    mtp = config("mtp", expert_load=load, eplb=32)
    conv = _draft_conventions(mtp, mtp.speculative.resolve(m)[0])
    assert conv.expert_load is load and conv.eplb == 32 and conv.ep == 8
    # EPLB's redundant experts in the MTP layer's weights too
    assert draft_memory(mtp).weights_bytes > draft_memory(config("mtp")).weights_bytes
    # a separate MoE model drafting: its experts are not the measured ones
    other = m.scaled(name="deepseek-v3 first 5 layers", num_layers=5)
    sep = config(other, expert_load=load, eplb=32)
    conv = _draft_conventions(sep, other)
    assert conv.expert_load is None and conv.eplb is None and conv.ep == 8


def test_plan_prices_eplb_on_expert_parallel_candidates_only(tmp_path):
    path = skewed_load(tmp_path / "d.json", 256, 32)
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:100:400", output_len="uniform:5:40",
                        num_requests=20, seed=0)
    res = planner.plan("deepseek-v3", rate=1.0, slo=SLO(ttft_s=5.0), workload=spec, devices=["h200"],
                       precisions=["fp8"], tps=[8], jobs=1, expert_load=str(path), eplb=3)
    rows = {r.layout: r for r in res.rows}
    assert rows["tp"].feasible and rows["tp"].eplb is None and rows["tp"].expert_load == str(path)
    for lay in ("tp+ep", "dp+ep"):  # 256 + 3 experts do not spread evenly over 8 GPUs
        r = rows[lay]
        assert not r.feasible and r.binding == "layout" and r.eplb == 3
        assert r.detail == f"{lay}: eplb: 256 experts + 3 redundant do not divide over ep=8 GPUs"
    assert (res.settings["expert_load"], res.settings["eplb"]) == (str(path), 3)
    frame = res.to_frame()
    assert {"expert_load", "eplb"} <= set(frame.columns)


@pytest.mark.parametrize("kw, message", [
    (dict(model="llama-3.1-8b", eplb=2), "eplb: 2 needs a mixture-of-experts model"),
    (dict(model="deepseek-v3", eplb=32, layouts=["tp"]), "eplb: 32 needs an expert-parallel candidate"),
    (dict(model="deepseek-v3", eplb=1.5), "eplb: must be an integer >= 0"),
    (dict(model="deepseek-v3", expert_load="LOAD"), "expert_load: "),
])
def test_plan_refuses_what_no_candidate_could_take(tmp_path, kw, message):
    if kw.get("expert_load") == "LOAD":
        kw["expert_load"] = skewed_load(tmp_path / "q.json", 128, 16)
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="100", output_len="10", num_requests=5, seed=0)
    with pytest.raises(SpecError, match="^" + message.split(":")[0]) as exc:
        planner.plan(rate=1.0, slo=SLO(ttft_s=5.0), workload=spec, devices=["h200"], precisions=["fp8"], tps=[8],
                     jobs=1, **kw)
    assert message in str(exc.value)
