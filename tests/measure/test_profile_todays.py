"""`llmperf profile` on today's families: the exact cross-checks on a tiny spec of each family the
engine builds (matmul FLOPs of a prefill and a decode step against `FlopCounterMode`, weight bytes,
the weight bytes a decode step reads with a mixture of experts' experts as routed, KV bytes per
token), the join of measured operators with the predictions of their own layer kind, what is reported
when a name is on one side only, the experts each MoE layer touched beside the uniform-routing
expectation, and `--layers` keeping every layer kind. No test asserts a duration."""

from __future__ import annotations

import csv
import json
import math

import pytest
import yaml

torch = pytest.importorskip("torch")

from llmperf.analysis import ForwardModel  # noqa: E402
from llmperf.analysis.operators import expected_experts_touched  # noqa: E402
from llmperf.analysis.routing import busiest_expert_load  # noqa: E402
from llmperf.engine import Engine, Recorder, SamplingParams, build_model  # noqa: E402
from llmperf.engine.instrument import (  # noqa: E402
    EXPERTS_TOUCHED,
    CountRecord,
    OpRecord,
    RoutingRecord,
    StepRecord,
    Trace,
)
from llmperf.measure import profile as prof  # noqa: E402
from llmperf.specs import ModelSpec, Precision, load_hardware, load_model  # noqa: E402

BASE = dict(vocab_size=320, hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=48, ffn_size=192,
            max_positions=512)
# windows (16) longer than the cross-checks' decode context (12 + 1): the engine's sliding layers read
# the whole cache in decode and mask it, where the analytical model reads the window (see the report)
FAMILIES = {
    "qwen3": dict(num_layers=2, qk_norm="rmsnorm", norm_eps=1e-6, rope_theta=1e6),
    "qwen3-sliding": dict(num_layers=2, qk_norm="rmsnorm", layer_types=("sliding", "full"), sliding_window=16),
    "gemma2": dict(num_layers=2, hidden_act="gelu_pytorch_tanh", layer_types=("sliding", "full"), sliding_window=16,
                   sandwich_norms=True, embedding_scale=True, tied_embeddings=True, attn_softcap=50.0,
                   final_softcap=30.0, norm_offset=True, query_pre_attn_scalar=64.0),
    "gemma3": dict(num_layers=6, hidden_act="gelu_pytorch_tanh", layer_types=("sliding",) * 5 + ("full",),
                   sliding_window=16, sandwich_norms=True, embedding_scale=True, tied_embeddings=True,
                   qk_norm="rmsnorm", norm_offset=True, query_pre_attn_scalar=64.0, rope_local_theta=10000.0,
                   rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # EXAONE 4: norms after each sublayer, sliding layers and a full NoPE one
    "exaone4": dict(num_layers=4, qk_norm="rmsnorm", post_norm=True, layer_types=("sliding",) * 3 + ("full",),
                    sliding_window=16, nope_layers=(3,)),
    "qwen3-moe": dict(num_layers=2, qk_norm="rmsnorm", moe_ffn_size=64, num_experts=8, experts_per_token=2),
    "moe-dense-first": dict(num_layers=3, moe_ffn_size=64, num_experts=8, experts_per_token=2, dense_layers=(0,)),
    "gpt-oss": dict(num_layers=2, layer_types=("sliding", "full"), sliding_window=16, attn_sinks=True, qkv_bias=True,
                    out_bias=True, mlp_bias=True, router_bias=True, num_experts=8, experts_per_token=2,
                    moe_ffn_size=64, swiglu_limit=7.0),
    "llama4": dict(num_layers=4, layer_types=("chunked",) * 3 + ("full",), attention_chunk_size=16, nope_layers=(3,),
                   qk_norm="l2", num_experts=4, experts_per_token=1, shared_experts=1, dense_layers=(0, 2),
                   moe_ffn_size=64, router_scoring="sigmoid", router_renormalize=False, router_input_scaling=True,
                   rope_interleaved=True, nope_temperature=(8.0, 0.1)),
    "glm4.5": dict(num_layers=3, qkv_bias=True, qk_norm="rmsnorm", rotary_dim=24, num_experts=8, experts_per_token=2,
                   moe_ffn_size=32, shared_experts=2, dense_layers=(0,), router_score_bias=True,
                   router_scoring="sigmoid", router_scale=2.5, router_groups=4, router_topk_groups=2),
    # multi-head latent attention: unabsorbed in prefill, absorbed in decode; DeepSeek-V3's MoE layers
    "deepseek-v3": dict(num_layers=3, num_kv_heads=4, rotary_dim=16, q_lora_rank=96, kv_lora_rank=64,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24, rope_interleaved=True, ffn_size=256,
                        moe_ffn_size=64,
                        num_experts=8, experts_per_token=2, shared_experts=1, dense_layers=(0,),
                        router_score_bias=True, router_scoring="sigmoid", router_scale=2.5, router_groups=4,
                        router_topk_groups=2),
    "deepseek-v2-lite": dict(num_layers=2, num_kv_heads=4, rotary_dim=16, kv_lora_rank=64, qk_nope_head_dim=32,
                             qk_rope_head_dim=16, v_head_dim=24),
}
FP32 = Precision.uniform("fp32")


def spec_of(family: str) -> ModelSpec:
    return ModelSpec(name=f"tiny-{family}", **{**BASE, **FAMILIES[family]})


def settings(**kw) -> prof.ProfileSettings:  # noqa: ANN003
    return prof.ProfileSettings(**{**dict(model="x", hardware="x", batches=(2,), prompt_lens=(12,), gen_lens=(3,),
                                          reps=1, threads=1), **kw})


@pytest.fixture(scope="module")
def models():
    return {f: build_model(spec_of(f), seed=0) for f in FAMILIES}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cross_checks_pass_for_each_family(family, models):
    """FLOPs (prefill and decode step) against FlopCounterMode, weight bytes, decode-step weight bytes
    read and KV bytes: exact, per family."""
    checks = prof.cross_checks(models[family], spec_of(family), FP32, settings())
    assert [c["name"] for c in checks] == [
        "matmul FLOPs vs FlopCounterMode", "decode-step matmul FLOPs vs FlopCounterMode", "weight bytes vs parameters",
        "decode-step weight bytes vs parameters read", "KV cache bytes vs cache storage"]
    assert all(c["passed"] for c in checks), [c["detail"] for c in checks if not c["passed"]]


@pytest.mark.parametrize("family", ["gemma3", "moe-dense-first", "deepseek-v3"])
def test_cross_checks_pass_with_a_paged_cache(family, models):
    checks = prof.cross_checks(models[family], spec_of(family), FP32, settings(kv="paged", batches=(3,)))
    assert all(c["passed"] for c in checks), [c["detail"] for c in checks if not c["passed"]]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefill_flops_equal_the_counter_directly(family, models):
    """The same comparison as the check, written out: FlopCounterMode over the model's forward (naive
    attention) against the analytical dense-convention matmul FLOPs of the same step."""
    from torch.utils.flop_counter import FlopCounterMode

    model, spec = models[family], spec_of(family)
    model.set_attention("naive")
    try:
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            model(torch.randint(0, spec.vocab_size, (3, 10)))
    finally:
        model.set_attention("sdpa")
    assert counter.get_total_flops() == prof.matmul_flops(spec, FP32, 3, 10, 10)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_bytes_equal_the_analytical_ones(family, models):
    """The parameters' bytes equal the analytical weight bytes (ModelSpec.param_count at fp32), and the
    engine's cache holds the analytical KV bytes per token."""
    from llmperf.engine.cache import make_cache

    model, spec = models[family], spec_of(family)
    real = sum(p.numel() * p.element_size() for p in model.parameters())
    assert real == spec.param_count * 4 == spec.weight_bytes("fp32")
    cache = make_cache("contiguous", spec, dtype=torch.float32, device="cpu", max_batch=2, max_seq_len=20)
    assert cache.capacity_bytes == 2 * 20 * spec.kv_bytes_per_token("fp32")


@pytest.mark.parametrize("touched", [{1: 1, 2: 8}, {1: 3, 2: 2}])
def test_moe_step_weight_bytes_follow_the_experts_touched(touched, models):
    """A MoE decode step reads its touched experts' weights: both sides count k experts' slices per
    layer, for any k (the dense first layer reads its whole FFN)."""
    spec, model = spec_of("moe-dense-first"), models["moe-dense-first"]
    assert prof.engine_step_weight_bytes(model, 2, touched) == prof.step_weight_bytes(spec, FP32, 2, 1, 13, touched)
    one_more = {**touched, 1: touched[1] + 1} if touched[1] < 8 else {**touched, 1: 7}
    per_expert = 3 * spec.hidden_size * spec.expert_ffn_size * 4
    diff = prof.engine_step_weight_bytes(model, 2, one_more) - prof.engine_step_weight_bytes(model, 2, touched)
    assert diff == per_expert * (one_more[1] - touched[1])
    with pytest.raises(ValueError, match="touched"):
        prof.engine_step_weight_bytes(model, 2, None)


# ---- the join -------------------------------------------------------------------------------------


def _trace(spec: ModelSpec, fm: ForwardModel, batch: int, q_len: int, kv_len: int, phase: str = "decode",
           drop: tuple[tuple[int | None, str], ...] = (), extra: tuple[tuple[int | None, str], ...] = ()) -> Trace:
    """A synthetic recorded step: every operator the analytical model predicts, in every layer, one
    microsecond each, less `drop` and plus `extra` ((layer, name) pairs)."""
    ops = [(None, c.name) for c in fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len)]
    for i, kind in enumerate(spec.layer_kinds()):
        ops += [(i, c.name) for c in fm.layer_ops(batch, q_len, kv_len, kind)]
    ops = [o for o in ops if o not in drop] + list(extra)
    shape = dict(phase=phase, step=0, batch=batch, q_len=q_len, kv_len=kv_len)
    return Trace(ops=[OpRecord(layer=layer, op=name, seconds=1e-6, **shape) for layer, name in ops],
                 steps=[StepRecord(tokens_in_cache=batch * kv_len, seconds=1e-3, forward_seconds=1e-3, **shape)])


def _predictor(spec: ModelSpec) -> prof.Predictor:
    fm = ForwardModel(model=spec, precision=FP32, fused_qkv=True, fused_gate_up=True)
    return prof.Predictor(fm=fm, hardware=load_hardware("h100-sxm"), compute_dtype="fp32", calibrated=None)


def test_each_layer_kind_is_joined_to_its_own_prediction():
    """Gemma 3 at a context past its window: the sliding layers' attention row is five sliding layers'
    prediction, the full layer's one full layer's; the steps' prediction sums the kinds too."""
    spec = spec_of("gemma3")
    pred = _predictor(spec)
    trace = _trace(spec, pred.fm, 2, 1, 40)
    rows = prof.joined_op_rows(trace.ops, spec, pred)
    att = {r["layer"]: r for r in rows if r["op"] == "attention"}
    assert set(att) == {"sliding-16", "full"}
    kinds = {k.label: k for k in spec.layer_kinds()}
    for label, layers in (("sliding-16", 5), ("full", 1)):
        cost = pred.cost(prof.Op.attention, 2, 1, 40, kinds[label])
        assert att[label]["flops"] == pytest.approx(cost.flops * layers)
        assert att[label]["measured_s"] == pytest.approx(layers * 1e-6)  # the layers of the kind summed
    assert att["sliding-16"]["flops"] / 5 < att["full"]["flops"]  # 16 keys against 40
    assert {r["layer"] for r in rows if r["op"] in ("embed", "lm_head", "final_softcap", "embed_scale")} == {"model"}
    assert all(math.isfinite(r["predicted_roofline_s"]) for r in rows)
    # the step: five sliding layers and one full one, cheaper than six full layers past the window
    full = spec.scaled(layer_types=None, sliding_window=None)
    assert pred.forward(2, 1, 40)[0] < _predictor(full).forward(2, 1, 40)[0]
    assert pred.forward(2, 1, 12)[0] == pytest.approx(_predictor(full).forward(2, 1, 12)[0])  # inside the window


def test_dense_and_moe_layers_join_their_own_ffn():
    spec = spec_of("moe-dense-first")
    pred = _predictor(spec)
    rows = prof.joined_op_rows(_trace(spec, pred.fm, 2, 1, 13).ops, spec, pred)
    gate_up = {r["layer"]: r for r in rows if r["op"] == "gate_up_proj"}
    assert set(gate_up) == {"full", "full/moe"}
    dense = pred.cost(prof.Op.gate_up_proj, 2, 1, 13, spec.layer_kinds()[0])
    routed = pred.cost(prof.Op.gate_up_proj, 2, 1, 13, spec.layer_kinds()[1])
    assert gate_up["full"]["bytes"] == pytest.approx(dense.bytes_total)
    assert gate_up["full/moe"]["bytes"] == pytest.approx(2 * routed.bytes_total)  # two MoE layers
    # the dense layer reads its FFN of 192; a MoE layer the expected 3.5 touched experts of 64
    assert dense.weight_bytes == 128 * 2 * 192 * 4
    assert routed.weight_bytes == pytest.approx(expected_experts_touched(2, 8, 2) * 128 * 2 * 64 * 4)
    assert any(r["op"] == "router" and r["layer"] == "full/moe" for r in rows)
    assert not any(r["op"] == "router" and r["layer"] == "full" for r in rows)


def test_a_complete_trace_joins_everything():
    for family in FAMILIES:
        spec = spec_of(family)
        pred = _predictor(spec)
        for q_len, kv_len, phase in ((12, 12, "prefill"), (1, 13, "decode")):
            join = prof.join_report(_trace(spec, pred.fm, 2, q_len, kv_len, phase), spec, pred.fm, "c")
            assert all(not e["measured_only"] and not e["predicted_only"] for e in join), (family, join)
            labels = {e["layer"] for e in join}
            assert labels == {"model"} | {k.label for k in spec.layer_kinds()}
            assert prof.join_check(join)["passed"]


def test_names_on_one_side_only_are_reported_not_dropped():
    """A measured operator with no prediction keeps its row (NaN predictions) and is listed; a predicted
    operator never measured is listed; the check fails naming both, per phase and layer kind."""
    spec = spec_of("gemma3")
    pred = _predictor(spec)
    trace = _trace(spec, pred.fm, 2, 1, 13, drop=((5, "qk_norm"),), extra=((5, "router"), (0, "mystery_op")))
    join = {e["layer"]: e for e in prof.join_report(trace, spec, pred.fm, "b2-p12-g3")}
    assert join["full"]["predicted_only"] == ["qk_norm"] and join["full"]["measured_only"] == ["router"]
    assert join["sliding-16"]["measured_only"] == ["mystery_op"] and not join["sliding-16"]["predicted_only"]
    assert "qk_norm" in join["sliding-16"]["joined"] and "qk_norm" not in join["full"]["joined"]
    check = prof.join_check(prof.merge_joins(join.values()))
    assert not check["passed"]
    assert "decode full: measured, not predicted: router; predicted, not measured: qk_norm" in check["detail"]
    assert "decode sliding-16: measured, not predicted: mystery_op" in check["detail"]
    rows = prof.joined_op_rows(trace.ops, spec, pred)
    orphan = [r for r in rows if r["op"] in ("router", "mystery_op")]
    assert len(orphan) == 2 and all(math.isnan(r["predicted_roofline_s"]) and r["measured_s"] > 0 for r in orphan)
    assert not prof.join_check([])["passed"]  # nothing recorded is not a pass


@pytest.mark.parametrize("backend", ["sdpa", "naive"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_operator_the_engine_records_joins_its_prediction(family, backend, models):
    """The engine's own recorded names (a real generation, both backends: the naive one records
    attn_score, attn_softcap, attn_softmax, attn_value) against the analytical model's operators of
    the same layer kind and phase: nothing on one side only, in prefill and in decode."""
    model, spec = models[family], spec_of(family)
    rec = Recorder("cpu")
    Engine(model, cache="contiguous", attention=backend).generate(
        [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]] * 2, SamplingParams(max_new_tokens=3, min_new_tokens=3), recorder=rec)
    fm = ForwardModel(model=spec, precision=FP32, attention="naive" if backend == "naive" else "fused",
                      fused_qkv=True, fused_gate_up=True)
    join = prof.join_report(rec.trace, spec, fm, "b2-p12-g3")
    assert {(e["phase"], e["layer"]) for e in join} == {
        (p, k) for p in ("prefill", "decode") for k in ["model"] + [k.label for k in spec.layer_kinds()]}
    assert prof.join_check(join)["passed"], prof.join_check(join)["detail"]
    names = {n for e in join for n in e["joined"]}
    if spec.attn_softcap and backend == "naive":
        assert "attn_softcap" in names
    if spec.final_softcap:
        assert {"final_softcap", "embed_scale", "post_attn_norm", "post_mlp_norm"} <= names
    rows = prof.joined_op_rows(rec.trace.ops, spec, _predictor(spec) if backend == "sdpa" else prof.Predictor(
        fm=fm, hardware=load_hardware("h100-sxm"), compute_dtype="fp32", calibrated=None))
    assert all(math.isfinite(r["predicted_roofline_s"]) for r in rows)


def test_fused_names_join_their_parts_both_ways():
    assert prof.unmatched({"qkv_proj"}, {"q_proj", "k_proj", "v_proj"}) == ([], [])
    assert prof.unmatched({"q_proj", "k_proj", "v_proj"}, {"qkv_proj"}) == ([], [])
    assert prof.unmatched({"q_proj"}, {"qkv_proj"}) == ([], ["qkv_proj"])  # k and v never measured
    assert prof.unmatched({"shared_gate_up_proj"}, {"shared_gate_proj", "shared_up_proj"}) == ([], [])
    assert prof.unmatched({"gate_up_proj"}, {"shared_gate_up_proj"}) == (["gate_up_proj"], ["shared_gate_up_proj"])


def test_mla_decode_and_prefill_predict_their_own_forms():
    """The join's predicted names of an MLA layer: the unabsorbed form in prefill, the absorbed one in
    decode (what the engine's MLA must record)."""
    spec = ModelSpec(name="tiny-mla", **{**BASE, "num_kv_heads": 4}, num_layers=2, q_lora_rank=96, kv_lora_rank=64,
                     qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24)
    fm = ForwardModel(model=spec, precision=FP32, fused_qkv=True, fused_gate_up=True)
    kind = spec.layer_kinds()[0]
    prefill, decode = (set(prof.predicted_names(fm, 2, q, 13, kind)) for q in (12, 1))
    assert {"q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "kv_b_proj"} <= prefill
    assert {"q_absorb", "v_absorb"} <= decode and "kv_b_proj" not in decode
    assert not {"q_absorb", "v_absorb"} & prefill


# ---- experts touched --------------------------------------------------------------------------------


def test_expert_rows_stand_beside_the_uniform_expectation():
    spec = spec_of("qwen3-moe")
    counts = [CountRecord(phase="decode", step=s, layer=layer, name=EXPERTS_TOUCHED, value=v, batch=4, q_len=1,
                          kv_len=13 + s) for s, (layer, v) in enumerate([(0, 5), (1, 3), (0, 7), (1, 3)])]
    counts.append(CountRecord(phase="decode", step=0, layer=0, name="something_else", value=1, batch=4, q_len=1,
                              kv_len=13))
    rows = prof.expert_rows(Trace(counts=counts), spec, "b4-p12-g3")
    assert len(rows) == 4 and set(rows[0]) == set(prof.EXPERTS_COLUMNS)
    expected = expected_experts_touched(4, 8, 2)
    assert expected == pytest.approx(8 * (1 - (1 - 2 / 8) ** 4))
    assert all(r["expected_uniform"] == pytest.approx(expected) and r["tokens"] == 4 for r in rows)
    summary = {s["layer"]: s for s in prof.experts_summary(rows)}
    assert summary[0]["measured_mean"] == 6 and summary[0]["measured_min"] == 5 and summary[0]["measured_max"] == 7
    assert summary[1]["steps"] == 2 and summary[1]["expected_uniform"] == pytest.approx(expected)


def test_moe_layers_count_the_experts_their_router_chose(models):
    """Each MoE layer reports, per step, the distinct experts its tokens chose: between k and
    min(E, tokens x k), one count per MoE layer and step (none from the dense layer), with or
    without operator timing."""
    model, spec = models["moe-dense-first"], spec_of("moe-dense-first")
    for ops in (True, False):
        rec = Recorder("cpu", ops=ops)
        Engine(model, cache="contiguous").generate([[1, 2, 3, 4, 5, 6]] * 3, SamplingParams(max_new_tokens=3,
                                                                                            min_new_tokens=3),
                                                   recorder=rec)
        counts = [c for c in rec.trace.counts if c.name == EXPERTS_TOUCHED]
        assert len(counts) == len(rec.trace.steps) * 2 and {c.layer for c in counts} == {1, 2}
        for c in counts:
            assert spec.experts_per_token <= c.value <= min(spec.num_experts, c.batch * c.q_len * 2)
        # and the routing itself: the same experts, their rows every token's k choices
        routes = {(r.phase, r.step, r.layer): r for r in rec.trace.routes}
        assert set(routes) == {(c.phase, c.step, c.layer) for c in counts}
        for c in counts:
            r = routes[(c.phase, c.step, c.layer)]
            assert len(r.experts) == c.value and list(r.experts) == sorted(set(r.experts))
            assert sum(r.rows) == c.batch * c.q_len * spec.experts_per_token and min(r.rows) >= 1


def test_expert_balance_is_worked_out_from_the_routing():
    """8 experts, one step of 4 tokens x 2: experts 0, 1, 5 and 6 got 3, 1, 2 and 2 rows. EP 2 (experts
    0-3 | 4-7): 4 rows and 2 experts each; EP 4 (pairs): 4 rows and 2 experts on GPU 0;
    EP 8: 3 rows, 1 expert. Beside each, the uniform-routing prediction at 4 tokens and the mean."""
    spec = spec_of("qwen3-moe")
    assert prof.busiest_of((0, 1, 5, 6), (3, 1, 2, 2), 8, 2) == (4, 2)
    assert prof.busiest_of((0, 1, 5, 6), (3, 1, 2, 2), 8, 4) == (4, 2)
    assert prof.busiest_of((0, 1, 5, 6), (3, 1, 2, 2), 8, 8) == (3, 1)
    route = RoutingRecord(phase="decode", step=0, layer=1, experts=(0, 1, 5, 6), rows=(3, 1, 2, 2), batch=4,
                          q_len=1, kv_len=13)
    rows = prof.balance_rows(Trace(routes=[route, route]), spec, "b4-p12-g3")
    assert len(rows) == 2 * 3 and set(rows[0]) == set(prof.EXPERT_BALANCE_COLUMNS)
    by_ep = {r["ep"]: r for r in rows}
    assert [(by_ep[ep]["busiest_rows"], by_ep[ep]["busiest_touched"]) for ep in (2, 4, 8)] == [(4, 2), (4, 2), (3, 1)]
    for ep in (2, 4, 8):
        pred_rows, pred_touched = busiest_expert_load(4, 8, 2, ep)
        assert by_ep[ep]["predicted_rows"] == pytest.approx(pred_rows, abs=1e-3)
        assert by_ep[ep]["predicted_touched"] == pytest.approx(pred_touched, abs=1e-3)
        assert by_ep[ep]["mean_rows"] == 4 * 2 / ep
    summary = {s["ep"]: s for s in prof.balance_summary(rows)}
    assert summary[2]["samples"] == 2 and summary[2]["busiest_rows"] == 4
    assert summary[8]["rows_ratio"] == pytest.approx(3 / by_ep[8]["predicted_rows"])


# ---- --layers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, n, kept, labels", [
    ("gemma-3-27b", 2, (0, 5), ["sliding-1024", "full"]),
    ("gemma-3-27b", 7, (0, 1, 2, 3, 4, 5, 6), None),
    ("deepseek-v3", 2, (0, 3), ["full", "full/moe"]),
    ("gpt-oss-20b", 2, (0, 1), ["sliding-128/moe", "full/moe"]),
    ("qwen3-8b", 2, (0, 1), ["full", "full"]),
    ("qwen3-30b-a3b", 2, (0, 1), ["full/moe", "full/moe"]),
    ("gemma-2-9b", 1, (0,), None),
])
def test_layers_keeps_every_layer_kind(name, n, kept, labels):
    full = load_model(name)
    assert prof.kept_layer_indices(full, n) == kept
    spec = prof.keep_layers(full, n)
    assert spec.num_layers == n
    assert [k.label for k in spec.layer_kinds()] == [full.layer_kinds()[i].label for i in kept]
    if labels is not None:
        assert [k.label for k in spec.layer_kinds()] == labels


def test_layers_keeps_llama4s_nope_and_dense_layers():
    full = load_model("llama-4-maverick")
    kinds = full.layer_kinds()
    spec = prof.keep_layers(full, len(set(kinds)))
    assert set(spec.layer_kinds()) == set(kinds)  # every kind of the model, once each
    assert prof.keep_layers(full, full.num_layers + 2).num_layers == full.num_layers + 2  # more: the pattern


# ---- end to end -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs on this CPU predicted with a datasheet (no calibration: the calibrated column is
    empty, which these tests do not read): Gemma 3 through `--layers 2`, a MoE with a dense first
    layer, DeepSeek-V3 (MLA and MoE)."""
    folder = tmp_path_factory.mktemp("todays")
    out = {}
    for family, layers in (("gemma3", 2), ("moe-dense-first", None), ("deepseek-v3", None)):
        path = folder / f"{family}.yaml"
        spec = spec_of(family)
        fields = {**BASE, **FAMILIES[family], "name": spec.name}
        if family == "moe-dense-first":  # a spec of quantised weights: profiled unquantised, and said so
            fields["quantization"] = dict(method="awq", bits=4, group_size=32, zero_point=True)
        path.write_text(yaml.safe_dump({k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items()}))
        s = settings(model=str(path), layers=layers)
        out[family] = prof.run_profile(s, load_hardware("h100-sxm"), folder / family)
    return out


def _read(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_todays_runs_complete_with_every_operator_joined(runs):
    for family, res in runs.items():
        assert res.run["status"] == "complete"
        assert all(c["passed"] for c in res.run["checks"]), (family, res.run["checks"])
        assert prof.JOIN_CHECK in {c["name"] for c in res.run["checks"]}
        gen = [r for r in res.ops if r["kind"] == "generation"]
        assert gen and all(math.isfinite(r["predicted_roofline_s"]) for r in gen)
        assert tuple(next(csv.reader((res.out_dir / "ops.csv").open()))) == prof.OPS_COLUMNS
    gemma = runs["gemma3"]
    assert gemma.run["settings"]["layers_kept"] == [0, 5]  # of the YAML's 6 layers
    assert gemma.run["settings"]["layer_kinds"] == ["sliding-16", "full"]
    assert {(r["op"], r["layer"]) for r in gemma.ops if r["kind"] == "generation" and r["op"] == "attention"} == {
        ("attention", "sliding-16"), ("attention", "full")}
    assert not (gemma.out_dir / "experts.csv").exists() and "experts_touched" not in gemma.run


def test_a_moe_run_reports_the_experts_touched(runs):
    res = runs["moe-dense-first"]
    assert any("awq-quantised weights" in n for n in res.run["settings"]["notes"])
    rows = _read(res.out_dir / "experts.csv")
    assert rows and tuple(rows[0]) == prof.EXPERTS_COLUMNS
    decode = [r for r in rows if r["phase"] == "decode"]
    assert len(decode) == 2 * 2  # two decode steps x two MoE layers
    summary = [e for e in res.run["experts_touched"] if e["phase"] == "decode"]
    assert {e["layer"] for e in summary} == {1, 2}
    for e in summary:
        assert e["expected_uniform"] == pytest.approx(float(expected_experts_touched(2, 8, 2)))
        assert 2 <= e["measured_min"] <= e["measured_mean"] <= e["measured_max"] <= 4
    micro = {(r["op"], r["layer"]) for r in res.ops if r["kind"] == "micro"}
    names = {op for op, _ in micro}
    assert {"qkv_proj", "gate_up_proj"}.isdisjoint(names)  # the parts are timed
    # the dense layer's projections and FFN, the MoE layer's router; no routed expert
    assert {("q_proj", "full"), ("gate_proj", "full"), ("down_proj", "full"), ("router", "full/moe"),
            ("lm_head", "model"), ("attention", "full")} <= micro
    assert not any(layer == "full/moe" and op in ("gate_proj", "up_proj", "down_proj") for op, layer in micro)
    from llmperf.cli.commands.profile import summary_tables

    titles = [t.title for t in summary_tables(res)]
    assert any("distinct routed experts" in t for t in titles) and any("joined" in t for t in titles)
    assert any("expert parallelism on this routing" in t for t in titles)
    # what expert parallelism would wait for on this router's choices, beside uniform routing's prediction
    balance = _read(res.out_dir / "expert_balance.csv")
    assert balance and tuple(balance[0]) == prof.EXPERT_BALANCE_COLUMNS
    assert {int(b["ep"]) for b in balance} == {2, 4, 8}
    assert all(float(b["busiest_rows"]) >= float(b["mean_rows"]) for b in balance)
    summary = [b for b in res.run["expert_balance"] if b["phase"] == "decode"]
    assert {b["ep"] for b in summary} == {2, 4, 8} and all(b["samples"] == 2 * 2 for b in summary)
    for b in summary:
        assert b["predicted_rows"] == pytest.approx(busiest_expert_load(2, 8, 2, b["ep"])[0], abs=1e-3)
        assert b["rows_ratio"] > 0 and b["touched_ratio"] > 0
    doc = json.loads((res.out_dir / "run.json").read_text())  # the typed manifest reads it back whole
    assert prof.RunManifest.load(res.out_dir / "run.json").to_dict() == doc and doc["expert_balance"]
    # the rows each expert got, which --expert-load prices: every routed row of every step, per MoE layer
    from llmperf.specs.expert_load import load_expert_load

    load = load_expert_load(res.out_dir / "expert_load.json")
    routed = {}
    for b in balance:
        if int(b["ep"]) == 2:
            routed[int(b["layer"])] = routed.get(int(b["layer"]), 0) + int(b["tokens"]) * 2
    assert load.num_experts == 8 and dict(zip(load.layers, load.counts.sum(axis=1).tolist())) == routed


def test_an_mla_run_joins_both_forms(runs):
    """DeepSeek-V3: the prefill layers measured and joined in the unabsorbed form (kv_b_proj), the decode
    layers in the absorbed one (q_absorb, v_absorb), dense and MoE layers each to their own kind."""
    res = runs["deepseek-v3"]
    assert all(c["passed"] for c in res.run["checks"]), res.run["checks"]
    join = {(e["phase"], e["layer"]): e for e in res.run["join"]}
    assert set(join) == {(p, k) for p in ("prefill", "decode") for k in ("model", "full", "full/moe")}
    for kind in ("full", "full/moe"):
        assert "kv_b_proj" in join[("prefill", kind)]["joined"] and "q_absorb" not in join[("prefill", kind)]["joined"]
        assert {"q_absorb", "v_absorb"} <= set(join[("decode", kind)]["joined"])
        assert "kv_b_proj" not in join[("decode", kind)]["joined"]
    for phase in ("prefill", "decode"):  # the router's choice and the sum of expert outputs, measured and priced
        assert {"shared_gate_up_proj", "router", "moe_route", "moe_sum"} <= set(join[(phase, "full/moe")]["joined"])
    micro = {r["op"] for r in res.ops if r["kind"] == "micro"}
    assert {"q_a_proj", "q_b_proj", "kv_a_proj", "o_proj", "router", "shared_gate_proj"} <= micro
    assert not {"attention", "kv_b_proj", "q_absorb"} & micro  # refused by name in the notes
    assert any("latent attention" in n for n in res.run["settings"]["notes"])


def test_the_predictor_prices_a_routed_operator_at_its_own_rows():
    """A MoE layer's routed experts see tokens x k rows (`OpCost.rows`), as estimate prices them; the
    profile's predictions use the same rows (it had priced them at the step's tokens)."""
    from dataclasses import replace

    from llmperf.analysis.timemodel import time_model_for
    from llmperf.analysis.vocabulary import Op

    spec = load_model("qwen3-30b-a3b").scaled(num_layers=1)
    cpu = load_hardware("reports/calibrate/2026-11-26e-cpu-todays.yaml")
    pred = replace(_predictor(spec), hardware=cpu, calibrated=time_model_for(cpu, "calibrated", "fp32"))
    kind = spec.layer_kinds()[0]
    up = pred.cost(Op.gate_up_proj, 1, 512, 512, kind)
    assert up.rows == 512 * spec.experts_per_token and pred.rows(up, 1, 512, pred.fm) == up.rows
    assert pred.times(up, 1, 512)[1] == pytest.approx(
        float(pred.calibrated.op_time_s(up, pred.hardware, pred.compute_dtype, up.rows)))
    head = pred.cost(Op.lm_head, 4, 512, 512)
    assert pred.rows(head, 4, 512, pred.fm) == 4  # one row of logits per sequence
