"""MoE blocks checked as modules, every routing variant in both layouts and both expert formats: the
engine's `moe.MoE` against transformers' `DeepseekV3MoE` (sigmoid scores, the score correction for
choosing only, group-limited routing on the top-2 sum, renormalised and scaled; the shared experts as
one MLP), `DeepseekV2Moe` (softmax, greedy and group_limited_greedy on the group max, scaled, not
renormalised) and `Qwen2MoeSparseMoeBlock` (the sigmoid-gated shared expert), with the same weights
loaded by `weights.load_moe_state_dict` from transformers' names, stacked and one expert at a time
(Qwen2-MoE is not a model type the spec loader reads; the whole DeepSeek models are in
test_moe_families.py).

Also: every built-in MoE model, scaled down, builds and decodes in fp32 and bf16; the refusals of MoE
fields the engine does not build; the analytical count of touched experts that `profile` compares
with `moe.touched_experts`.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.engine import Engine, SamplingParams, build_model
from llmperf.engine.model import Transformer
from llmperf.engine.moe import GPT_OSS_SWIGLU_ALPHA, MoE, clamped_swiglu, expected_touched, touched_experts
from llmperf.engine.ops import TorchOps
from llmperf.engine.weights import hf_config, load_moe_state_dict
from llmperf.specs import ModelSpec
from llmperf.specs.hf import model_spec_from_hf_config

from engine_testing import tiny

transformers = pytest.importorskip("transformers")

_MLA = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=16,
            q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, first_k_dense_replace=1,
            num_experts_per_tok=3, n_shared_experts=2)
BLOCKS = {
    "deepseek_v3": (dict(_MLA, model_type="deepseek_v3", n_routed_experts=8, n_group=4, topk_group=2,
                         routed_scaling_factor=2.5, norm_topk_prob=True), "DeepseekV3MoE"),
    "deepseek_v3_no_groups": (dict(_MLA, model_type="deepseek_v3", n_routed_experts=8, n_group=1, topk_group=1,
                                   routed_scaling_factor=1.5, norm_topk_prob=False), "DeepseekV3MoE"),
    "deepseek_v2_greedy": (dict(_MLA, model_type="deepseek_v2", n_routed_experts=8, topk_method="greedy",
                                routed_scaling_factor=2.0), "DeepseekV2Moe"),
    "deepseek_v2_group_limited": (dict(_MLA, model_type="deepseek_v2", n_routed_experts=8, n_group=4, topk_group=2,
                                       topk_method="group_limited_greedy", routed_scaling_factor=2.0),
                                  "DeepseekV2Moe"),
}
QWEN2_MOE = dict(model_type="qwen2_moe", vocab_size=128, hidden_size=64, intermediate_size=96,
                 moe_intermediate_size=16, shared_expert_intermediate_size=40, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_experts=8,
                 num_experts_per_tok=2, norm_topk_prob=False)
#: Qwen2-MoE is not a model type the spec loader reads: its spec, by hand
QWEN2_SPEC = ModelSpec(name="qwen2-moe-tiny", vocab_size=128, hidden_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, ffn_size=96, num_experts=8, experts_per_token=2, moe_ffn_size=16,
                       shared_experts=1, shared_ffn_size=40, shared_expert_gate=True, router_renormalize=False,
                       max_positions=64, qkv_bias=True)


def _hf_block(cfg: dict, cls_name: str, seed: int):
    """transformers' MoE block of `cfg`, every parameter and the score correction drawn at random."""
    config = transformers.AutoConfig.for_model(**cfg)
    module = transformers.models.__dict__[cfg["model_type"]]
    block = getattr(getattr(module, f"modeling_{cfg['model_type']}"), cls_name)(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        for name, b in block.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return block


def _per_expert(sd: dict[str, torch.Tensor], experts: int) -> dict[str, torch.Tensor]:
    """The stacked experts of a state dict one expert at a time, as transformers saves them."""
    out = {}
    for k, v in sd.items():
        if k.endswith("experts.gate_up_proj"):
            head = k.removesuffix("gate_up_proj")
            for j in range(experts):
                gate, up = v[j].chunk(2, dim=0)
                out[f"{head}{j}.gate_proj.weight"], out[f"{head}{j}.up_proj.weight"] = gate, up
        elif k.endswith("experts.down_proj"):
            for j in range(experts):
                out[f"{k.removesuffix('down_proj')}{j}.down_proj.weight"] = v[j]
        else:
            out[k] = v
    return out


def _check_block(spec: ModelSpec, block, layout: str, per_expert: bool) -> MoE:
    sd = {f"model.layers.1.mlp.{k}": v for k, v in block.state_dict().items()}
    if per_expert:
        sd = _per_expert(sd, spec.num_experts)
    moe = MoE(spec, 1, TorchOps(in_out=layout == "in_out"), dtype=torch.float32, device="cpu")
    load_moe_state_dict(moe, spec, sd, layer=1)
    x = torch.randn(2, 9, spec.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = block(x)
        expected = expected[0] if isinstance(expected, tuple) else expected
        rec = _NoRec()
        ours = moe(x, rec=rec)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    shared = ["shared_gate_up_proj", "shared_act", "shared_down_proj"]
    shared += ["shared_expert_gate"] * spec.shared_expert_gate
    experts = ["gate_up_proj", "act", "down_proj", "moe_sum"] * moe.last_touched
    assert rec.names == ["router", "moe_route"] + experts + shared
    assert rec.counts[0] == ("experts_touched", moe.index, moe.last_touched)
    # the routing: the distinct experts ascending, their rows summing to the 2 x 9 tokens' k choices each
    (name, layer, chosen, rows), = rec.counts[1:]
    assert (name, layer, len(chosen)) == ("routing", moe.index, moe.last_touched)
    assert list(chosen) == sorted(set(chosen)) and min(rows) >= 1 and sum(rows) == 2 * 9 * spec.experts_per_token
    return moe


class _NoRec:
    """A recorder that keeps the operators' names, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.counts: list[tuple] = []

    def op(self, name, layer=None):
        self.names.append(name)
        return nullcontext()

    def count(self, name, layer, value):  # the experts touched, as a Recorder keeps them per step
        self.counts.append((name, layer, value))

    def routing(self, layer, experts, pairs):  # and the rows each got
        self.counts.append(("routing", layer, tuple(experts), tuple(len(r) for r, _ in pairs)))


@pytest.mark.parametrize("per_expert", [False, True], ids=["stacked", "per_expert"])
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_deepseek_moe_block_equals_transformers(name, layout, per_expert):
    cfg, cls_name = BLOCKS[name]
    spec = model_spec_from_hf_config(cfg, name="t")
    assert spec.layer_kinds()[1].moe and spec.shared_experts == 2
    moe = _check_block(spec, _hf_block(cfg, cls_name, seed=4), layout, per_expert)
    assert moe.router_weight.dtype == torch.float32  # DeepSeek's routers stay fp32 in any model dtype
    assert 1 < moe.last_touched <= spec.num_experts


@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_qwen2_moe_gated_shared_expert_equals_transformers(layout):
    _check_block(QWEN2_SPEC, _hf_block(QWEN2_MOE, "Qwen2MoeSparseMoeBlock", seed=5), layout, per_expert=False)


def test_routing_details_matter():
    """The test's blocks route differently without each detail: the score correction, the groups."""
    cfg, cls_name = BLOCKS["deepseek_v3"]
    spec = model_spec_from_hf_config(cfg, name="t")
    block = _hf_block(cfg, cls_name, seed=4)
    moe = _check_block(spec, block, "out_in", per_expert=False)
    x = torch.randn(18, spec.hidden_size, generator=torch.Generator().manual_seed(2))
    _, chosen = moe.route(x)
    bias, moe.router_score_bias = moe.router_score_bias, None
    assert not torch.equal(moe.route(x)[1].sort().values, chosen.sort().values)
    moe.router_score_bias, moe.groups = bias, 1
    assert not torch.equal(moe.route(x)[1].sort().values, chosen.sort().values)


def test_moe_fields_the_engine_does_not_build_are_refused_by_name():
    base = QWEN2_SPEC
    with pytest.raises(ValueError, match="mlp_bias"):
        Transformer(replace(base, mlp_bias=True))
    with pytest.raises(ValueError, match="router_input_scaling"):
        Transformer(replace(base, shared_expert_gate=False, router_input_scaling=True))  # softmax: not Llama 4's
    with pytest.raises(ValueError, match="router_bias"):
        Transformer(replace(base, shared_experts=0, shared_ffn_size=None, shared_expert_gate=False, router_bias=True,
                            router_scoring="sigmoid"))
    with pytest.raises(ValueError, match="swiglu_limit"):
        Transformer(replace(base, swiglu_limit=7.0, hidden_act="gelu"))
    with pytest.raises(ValueError, match="router_groups"):  # noaux_tc groups score their two best experts
        Transformer(replace(base, router_score_bias=True, router_scoring="sigmoid", router_groups=8,
                            router_topk_groups=2))
    with pytest.raises(ValueError, match="shared_experts"):  # the reference config writer: Mixtral only
        hf_config(replace(base, moe_ffn_size=None))
    with pytest.raises(ValueError, match="moe_ffn_size"):
        hf_config(replace(base, shared_experts=0, shared_ffn_size=None, shared_expert_gate=False,
                          router_renormalize=True))


def test_expected_touched_experts_under_uniform_routing():
    assert expected_touched(8, 2, 0) == 0
    assert expected_touched(8, 2, 1) == pytest.approx(2)
    assert expected_touched(256, 8, 32) == pytest.approx(163.3, abs=0.1)  # DeepSeek-V3 decoding 32 tokens
    assert expected_touched(256, 8, 128) == pytest.approx(251.6, abs=0.1)
    assert expected_touched(4, 4, 3) == 4
    g = torch.Generator().manual_seed(0)  # uniform routing, simulated: the mean count is the formula's
    counts = [len(set(torch.cat([torch.randperm(16, generator=g)[:2] for _ in range(5)]).tolist()))
              for _ in range(4000)]
    assert sum(counts) / len(counts) == pytest.approx(expected_touched(16, 2, 5), rel=0.01)
    with pytest.raises(ValueError, match="experts_per_token"):
        expected_touched(4, 5, 1)


BUILTIN_MOE = ["mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "llama-4-scout", "llama-4-maverick", "glm-4.5",
               "deepseek-v3", "kimi-k2"]


@pytest.mark.parametrize("name", BUILTIN_MOE)
def test_builtin_moe_models_build_and_decode(name):
    """The built-in specs' routing fields as they are (groups, scales, score corrections, shared
    experts, dense layers, clamps), on a 4-layer model of their family with random weights; its
    parameters weigh what the analytical model counts at both dtypes (DeepSeek's router weight at the
    model's dtype, its score-correction bias fp32: the GPU session of 2026-11-27 found the router
    kept in fp32, 918,016 bytes over the count at bf16)."""
    from llmperf.analysis.memory import weight_bytes_per_gpu
    from llmperf.specs import Precision

    mla = dict(kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, head_dim=32,
               rotary_dim=16, num_kv_heads=4)  # DeepSeek-V3, Kimi-K2: latent attention scaled down too
    spec = tiny(name, num_layers=4, moe_ffn_size=16, ffn_size=32, **(mla if name in ("deepseek-v3", "kimi-k2") else {}))
    for dtype in ("fp32", "bf16"):
        model = build_model(spec, seed=1, dtype=dtype)
        real = sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in model.parameters()}.values())
        assert real == weight_bytes_per_gpu(spec, Precision.uniform(dtype))
        out = Engine(model).generate([[1, 2, 3, 4, 5], [7, 8]], SamplingParams(max_new_tokens=3))
        assert all(len(o.tokens) == 3 for o in out)
        touched = touched_experts(model)
        assert sorted(touched) == [i for i, kind in enumerate(spec.layer_kinds()) if kind.moe]
        assert all(1 <= n <= min(spec.num_experts, 2 * spec.experts_per_token) for n in touched.values())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_clamped_swiglu_in_two_buffers_is_transformers_expression_bit_for_bit(dtype):
    """gpt-oss's activation reuses its buffers (fewer page-faulted allocations on a CPU) and still
    equals transformers' expression exactly, values past the clamp included; its input is untouched."""
    gen = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(33, 2 * 48, generator=gen) * 6).to(dtype)
    before = gate_up.clone()
    gate, up = gate_up.chunk(2, dim=-1)
    gate, up = gate.clamp(max=7.0), up.clamp(min=-7.0, max=7.0)
    expected = (up + 1) * (gate * torch.sigmoid(gate * GPT_OSS_SWIGLU_ALPHA))  # GptOssExperts._apply_gate
    got = clamped_swiglu(gate_up, 7.0)
    assert got.dtype == dtype and torch.equal(got, expected) and torch.equal(gate_up, before)
    assert (gate_up.abs() > 7).any()  # the clamps were exercised


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_grouping_by_sort_gives_each_experts_rows_as_nonzero_does(data):
    """`MoE.group` by one stable sort of the choices (a GPU's path: one wait for the device) gives the
    distinct experts ascending and each one's (rows, slots) exactly as `torch.unique` + `nonzero`
    (a CPU's path), so the experts run and add their rows in the same order either way."""
    experts = data.draw(st.integers(1, 40))
    k = data.draw(st.integers(1, experts))
    tokens = data.draw(st.integers(1, 24))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    chosen = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    spec = ModelSpec(name="group", vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, ffn_size=8,
                     num_experts=experts, experts_per_token=k, max_positions=16)
    moe = MoE(spec, 0, TorchOps(), dtype=torch.float32, device="meta")
    names, pairs = moe.group(chosen, by_sort=True)
    want_names, want_pairs = moe.group(chosen)  # on a CPU: unique + nonzero
    assert names == want_names == torch.unique(chosen).tolist()
    for (rows, slots), (want_rows, want_slots) in zip(pairs, want_pairs, strict=True):
        assert torch.equal(rows, want_rows) and torch.equal(slots, want_slots)
