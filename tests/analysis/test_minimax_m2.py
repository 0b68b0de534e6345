"""MiniMax-M2 (`minimax_m2`): read with its q and k each RMS-normed across all their heads, partial rotary
positions (`rotary_dim` as the hub spells it, or transformers' `partial_rotary_factor`) and sigmoid-routed
experts with the fp32 score-correction bias; parameters exact against transformers at the config class's
default shape; the norm's weights and, under tensor parallelism, the one all-reduce of its variances
(vLLM's `forward_qk`: two fp32 values a token); the serving cost model prices a static batch as
`estimate`; the engine builds it (token for token: tests/engine/test_minimax_engine.py). OLMo 3 (the
same q/k norm, all-gathered under tp as vLLM runs it; norms after each sublayer) is priced the same way.
(Tiny configs: tests/specs/test_hf_today.py; FLOPs against transformers' counter:
tests/analysis/test_flop_counter.py.)"""

from __future__ import annotations

import re

import pytest
from model_checks import assert_static_batch_is_estimate

import llmperf
from llmperf.analysis import ForwardModel
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError
from llmperf.specs import Precision, load_hardware
from llmperf.specs.hf import model_spec_from_hf_config

CFG = dict(model_type="minimax_m2", vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
           num_attention_heads=8, num_key_value_heads=4, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
           max_position_embeddings=4096, rotary_dim=8, torch_dtype="bfloat16")
SPEC = model_spec_from_hf_config(CFG, name="tiny-minimax-m2")
BF16 = Precision.uniform("bf16")


def test_the_default_shape_is_exact():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    full = transformers.AutoConfig.for_model("minimax_m2").to_dict()
    spec = model_spec_from_hf_config(full, name="t")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("minimax_m2"))
    buffers = sum(b.numel() for n, b in model.named_buffers() if "e_score_correction_bias" in n)
    assert spec.param_count == sum(p.numel() for p in model.parameters()) + buffers == 228_689_764_864
    assert spec.qk_norm == "rmsnorm_across_heads" and spec.rope_theta == 5e6 and spec.rotary_dim == 128
    assert (spec.router_scoring, spec.router_renormalize, spec.router_score_bias) == ("sigmoid", True, True)
    assert spec.num_moe_layers == 62 and spec.shared_experts == 0 and spec.expert_ffn_size == 1536


def test_the_norm_across_heads_and_its_all_reduce():
    assert SPEC.rotary_dim == 8
    one = {o.name: o for o in ForwardModel(model=SPEC, precision=BF16).forward_ops(3, 1, 100)}
    assert one["qk_norm"].weight_bytes == SPEC.num_layers * (8 + 4) * 16 * 2  # a weight for each element
    assert one["qk_norm"].flops == SPEC.num_layers * 3 * (8 + 4) * 16 * 4  # as per-head norms: the same elements
    assert "qk_norm_allreduce" not in one
    two = {o.name: o for o in ForwardModel(model=SPEC, precision=BF16, tp=2).forward_ops(3, 1, 100)}
    assert two["qk_norm"].weight_bytes == SPEC.num_layers * (4 + 2) * 16 * 2  # this GPU's heads
    ar = two["qk_norm_allreduce"]
    assert ar.kind == "comm" and ar.comm_bytes == SPEC.num_layers * 2 * (1 / 2) * 3 * 2 * 4  # ring, 2 fp32 a token
    dp = ForwardModel(model=SPEC, precision=BF16, tp=2, ep=2, dp_attention=True)
    dp = {o.name for o in dp.forward_ops(3, 1, 100)}
    assert "qk_norm_allreduce" not in dp  # attention replicated: each GPU norms whole heads


@pytest.mark.parametrize("tp, eff", [(1, "roofline"), (2, "typical"), (4, "typical")])
def test_a_static_batch_is_priced_as_estimate(tp, eff):
    assert_static_batch_is_estimate(SPEC, tp, eff)


@pytest.mark.parametrize("cfg, needle", [
    ({**CFG, "rotary_dim": 7}, "rotary_dim=7 must be even and at most head_dim=16"),
    ({**CFG, "rotary_dim": 0}, "rotary_dim must be a positive integer"),
    ({**CFG, "num_experts_per_tok": 9}, "num_experts_per_tok=9 exceeds the 8 routed experts"),
])
def test_refused_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        model_spec_from_hf_config(cfg, name="t")
    assert "\n" not in str(info.value)


def test_the_engine_builds_its_norm_across_heads():
    """The engine builds it (no refusal), the q and k norms one weight across all heads each; its tensor
    parallelism refuses it by name (tests/engine/test_minimax_engine.py checks the logits and tokens)."""
    pytest.importorskip("torch")
    from llmperf.engine import build_model
    from llmperf.engine.tensor_parallel import shard_spec

    layer = build_model(SPEC, seed=0).layers[0]
    assert layer.q_norm.weight.shape == (SPEC.q_size,) and layer.k_norm.weight.shape == (SPEC.kv_size,)
    with pytest.raises(ValueError, match="^qk_norm: "):
        shard_spec(SPEC, 2)


OLMO3 = dict(model_type="olmo3", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, sliding_window=8)


def test_olmo_gathers_q_and_k_under_tp():
    """OLMo 2/3 run the same norm under tp as vLLM's `Olmo2Attention._apply_qk_norm` does: every GPU's q and k
    all-gathered (an all-gather of (tp - 1) / tp of them a GPU), normed whole on every GPU with the whole
    weight, split again; no variance all-reduce. At tp 1 it is MiniMax-M2's norm."""
    spec = model_spec_from_hf_config(OLMO3, name="tiny-olmo3")
    assert spec.qk_norm_gathered and not SPEC.qk_norm_gathered
    one = {o.name: o for o in ForwardModel(model=spec, precision=BF16).forward_ops(3, 1, 100)}
    assert "qk_norm_gather" not in one
    fm = ForwardModel(model=spec, precision=BF16, tp=2)
    two = {o.name: o for o in fm.forward_ops(3, 1, 100)}
    assert "qk_norm_allreduce" not in two and two["qk_norm"].flops == one["qk_norm"].flops  # whole, on every GPU
    layer = fm.layer_ops(3, 1, 100)
    g = next(o for o in layer if o.name == "qk_norm_gather")
    assert g.kind == "comm" and g.comm_bytes == (1 / 2) * 3 * (4 + 2) * 16 * 2  # one layer, 3 tokens, bf16
    names = [o.name for o in layer]
    assert names.index("qk_norm_gather") == names.index("qk_norm") - 1
    dp = {o.name for o in ForwardModel(model=spec, precision=BF16, tp=2, dp_attention=True).forward_ops(3, 1, 100)}
    assert "qk_norm_gather" not in dp


def test_olmo3_is_priced_as_estimate():
    """OLMo 3 shares MiniMax-M2's q/k norm across heads (gathered under tp) beside sliding layers; its
    norms after each sublayer cost what norms before them do."""
    cfg = OLMO3
    spec = model_spec_from_hf_config(cfg, name="tiny-olmo3")
    assert_static_batch_is_estimate(spec, 2, "typical", batch=2, prompt=30, steps=5)
    hw = load_hardware("h200")
    tm = time_model_for(hw, "typical", "bf16")
    est = llmperf.estimate(spec, hw, batch=2, prompt_len=30, gen_len=5, tp=2, time_model=tm)
    pre = spec.scaled(post_norm=False)
    assert est.ttft_s == llmperf.estimate(pre, hw, batch=2, prompt_len=30, gen_len=5, tp=2, time_model=tm).ttft_s


def test_the_norm_weights_per_gpu():
    """MiniMax-M2's q/k norm weights are split with the heads under tp (vLLM's `MiniMaxText01RMSNormTP`);
    OLMo's are whole on every GPU (it norms the gathered q and k)."""
    from dataclasses import replace

    from llmperf.analysis.rollup import stage_weight_bytes

    for spec, split in ((SPEC, True), (model_spec_from_hf_config(OLMO3, name="olmo3"), False)):
        whole = replace(spec, qk_norm=None, qk_norm_gathered=False)  # the same model without the norms
        norms = spec.num_layers * (spec.q_size + spec.kv_size) * 2  # bf16
        two = sum(stage_weight_bytes(spec, BF16, tp=2)) - sum(stage_weight_bytes(whole, BF16, tp=2))
        assert two == (norms / 2 if split else norms)
