"""Today's mixture-of-experts families from tiny checkpoints saved by transformers: Qwen3-MoE (softmax
routing with and without norm_topk_prob, a dense layer), gpt-oss (biased router, softmax over the top-k
logits, clamped SwiGLU with biases and alternating gate/up columns; sliding / full layers with sinks),
Llama 4 (sigmoid of the top-k logits scaling the experts' input, a shared expert, dense and MoE layers
alternating; chunked attention, NoPE layers with their temperature, L2 q/k norm), GLM-4.5 (sigmoid
scores with the score correction, group-limited routing, renormalised and scaled weights, two shared
experts in one MLP, a dense first layer; partial rotary, q/k norms, q/k/v biases), DeepSeek-V3 (the
same routing in fp32, behind multi-head latent attention) and DeepSeek-V2 (softmax, group-limited
greedy on the group max, scaled; V2-Lite's q_proj).

Each family: the same logits as transformers, the same generate() tokens over CASES x ENGINES (ragged
prompts), the same seeded samples, the weights saved back under transformers 5's names, the FFN
operators recorded under the analytical model's names and order, and the distinct experts each MoE
layer touched equal to what transformers' router chose.

The checkpoints' weights are moved by noise 0.2 (not the harness's 0.05): with smaller weights the
routers of these tiny models barely separate the experts and the gpt-oss clamp never binds. The
score correction of DeepSeek-V3 / GLM-4.5 is a buffer, not a parameter: it is moved here, then the
checkpoint saved again. No family needed a quirk in transformers' generate() (Llama 4's chunked
layers run on its default cache).
"""

from __future__ import annotations

import pytest
import torch

from llmperf.analysis.operators import ForwardModel
from llmperf.engine import (
    Engine,
    Recorder,
    SamplingParams,
    from_pretrained,
    to_hf_state_dict,
)
from llmperf.engine.moe import touched_experts
from llmperf.engine.sampling import hf_generate_kwargs
from llmperf.specs import Precision

from checkpoints import (
    CASES,
    ENGINES,
    PROMPTS,
    assert_generation_matches,
    assert_logits_match,
    saved_checkpoint,
)

_BASE = dict(vocab_size=128, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, head_dim=16)
_MLA = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=32,
            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, first_k_dense_replace=1, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=2, rms_norm_eps=1e-5)
CONFIGS = {
    # layer 1 dense (mlp_only_layers); weights not renormalised (Qwen3MoeConfig's default)
    "qwen3_moe": dict(_BASE, model_type="qwen3_moe", intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                      num_experts_per_tok=2, mlp_only_layers=[1], norm_topk_prob=False),
    # sliding (window 6) / full layers alternate; a clamp small enough to bind; yarn as gpt-oss's, scaled down
    "gpt_oss": dict(_BASE, model_type="gpt_oss", intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                    sliding_window=6, swiglu_limit=0.3,
                    rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                                         beta_fast=32.0, beta_slow=1.0, truncate=False, rope_theta=150000.0)),
    # layers 1 and 3 MoE (interleave step 2), layer 3 NoPE (every 4th), chunks of 8, temperature from position 3
    "llama4_text": dict(_BASE, model_type="llama4_text", intermediate_size=32, intermediate_size_mlp=96,
                        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                        attention_chunk_size=8, floor_scale=4, attn_scale=0.5),
    # 4 groups of 2 experts, 2 groups kept; layer 0 dense; the shared MLP is 2 x 32 wide
    "glm4_moe": dict(_BASE, model_type="glm4_moe", intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                     num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
                     routed_scaling_factor=2.5, n_shared_experts=2, partial_rotary_factor=0.5, use_qk_norm=True,
                     attention_bias=True),
    # latent attention (q_lora_rank, interleaved rotary) with layer 0 dense, then experts routed within 2 of 4
    # groups by sigmoid scores + correction, renormalised and scaled; two shared experts as one MLP
    "deepseek_v3": dict(_MLA, model_type="deepseek_v3", q_lora_rank=48, n_group=4, topk_group=2,
                        routed_scaling_factor=2.5, norm_topk_prob=True),
    # V2-Lite's q_proj; softmax, group_limited_greedy on the group max, scaled, not renormalised
    "deepseek_v2": dict(_MLA, model_type="deepseek_v2", q_lora_rank=None, n_group=4, topk_group=2,
                        topk_method="group_limited_greedy", routed_scaling_factor=2.0),
}
#: checked for logits only: the other setting of a routing flag
LOGITS_ONLY = {"qwen3_moe_norm_topk": dict(CONFIGS["qwen3_moe"], norm_topk_prob=True, mlp_only_layers=[]),
               "deepseek_v2_greedy": dict(CONFIGS["deepseek_v2"], topk_method="greedy", n_group=1, topk_group=1),
               "deepseek_v3_no_renormalisation": dict(CONFIGS["deepseek_v3"], norm_topk_prob=False, n_group=1,
                                                      topk_group=1)}
NOISE = 0.2


def _checkpoint(name: str, cfg: dict, path):
    hf = saved_checkpoint(cfg, path, seed=3, noise=NOISE)
    buffers = [b for n, b in hf.named_buffers() if n.endswith("e_score_correction_bias")]
    if buffers:
        g = torch.Generator().manual_seed(9)
        with torch.no_grad():
            for b in buffers:  # as large as the sigmoid scores' spread: the correction changes choices
                b.add_(torch.randn(b.shape, generator=g) * 0.1)
        hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, cfg in {**CONFIGS, **LOGITS_ONLY}.items():
        path = tmp_path_factory.mktemp(name)
        out[name] = (path, _checkpoint(name, cfg, path))
    return out


_MEMO: dict = {}


@pytest.mark.parametrize("name", [*CONFIGS, *LOGITS_ONLY])
def test_logits_equal_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    assert_logits_match(path, hf)
    assert_logits_match(path, hf, weight_layout="in_out", batch=1, tokens=9)


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_equal_transformers_generate(checkpoints, name, case, engine):
    path, hf = checkpoints[name]
    assert_generation_matches(path, hf, case, engine, memo=_MEMO)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_seeded_samples_equal_transformers_and_repeat(checkpoints, name):
    """Prompt i of a batch samples with seed + i, as transformers' generate() after torch.manual_seed
    does; the same seed gives the same tokens on every cache and with chunked prefill."""
    path, hf = checkpoints[name]
    params = SamplingParams(max_new_tokens=8, do_sample=True, temperature=1.3, top_k=20)
    expected = []
    for i, prompt in enumerate(PROMPTS):
        torch.manual_seed(11 + i)
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              **hf_generate_kwargs(params))
        expected.append(out[0, len(prompt):].tolist())
    model = from_pretrained(path, dtype="fp32")
    for settings in ENGINES.values():
        outputs = Engine(model, **settings).generate([list(p) for p in PROMPTS], params, seed=11)
        assert [o.tokens for o in outputs] == expected
    assert [o.tokens for o in Engine(model).generate([list(p) for p in PROMPTS], params, seed=12)] != expected


@pytest.mark.parametrize("name", list(CONFIGS))
def test_weights_save_back_under_transformers_names(checkpoints, name):
    path, hf = checkpoints[name]
    for layout in ("out_in", "in_out"):
        saved = to_hf_state_dict(from_pretrained(path, dtype="fp32", weight_layout=layout))
        theirs = hf.state_dict()
        assert set(saved) <= set(theirs), set(saved) - set(theirs)
        assert {k for k in theirs if k not in saved and "rotary" not in k} == set()
        for k, v in saved.items():
            assert torch.equal(v, theirs[k]), k


def test_touched_experts_are_the_experts_transformers_routes_to(checkpoints):
    """Each MoE layer records the distinct experts its forward ran: the experts transformers' router
    chose for the same tokens (its top-k of the router logits)."""
    path, hf = checkpoints["qwen3_moe"]
    model = from_pretrained(path, dtype="fp32")
    tokens = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        model(tokens)
        routers = hf(tokens, output_router_logits=True).router_logits  # one (N, E) per MoE layer
    moe_layers = [i for i, kind in enumerate(model.spec.layer_kinds()) if kind.moe]
    k = model.spec.experts_per_token
    expected = {i: len(torch.unique(logits.topk(k, dim=-1).indices)) for i, logits in zip(moe_layers, routers)}
    assert touched_experts(model) == expected
    assert all(1 < n < model.spec.num_experts for n in expected.values())  # the check has something to see


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ffn_operators_follow_the_analytical_model(checkpoints, name):
    """Every layer's FFN operators (dense, or router, routed experts, shared experts), recorded in the
    analytical model's order under its names; the routed experts' repeat once per expert run."""
    path, _ = checkpoints[name]
    model = from_pretrained(path, dtype="fp32")
    rec = Recorder()
    Engine(model).generate([PROMPTS[0]], SamplingParams(max_new_tokens=2), recorder=rec)
    df = rec.trace.to_frame()
    fm = ForwardModel(model=model.spec, precision=Precision.uniform("fp32"), attention="fused", fused_qkv=True,
                      fused_gate_up=True)
    T = len(PROMPTS[0])
    for phase, q_len in (("prefill", T), ("decode", 1)):
        step = df[(df.phase == phase) & (df.step == df[df.phase == phase].step.min())]
        for layer, kind in enumerate(model.spec.layer_kinds()):
            ops = list(step[step.layer == layer].op)
            ffn = ops[ops.index("mlp_norm") + 1:]
            expected = [o.name for o in fm.section_ops("ffn", 1, q_len, q_len + 1, kind)]
            assert list(dict.fromkeys(ffn)) == expected
            if kind.moe:
                touched = sum(1 for o in ffn if o == "gate_up_proj")
                assert 1 <= touched <= min(model.spec.num_experts, q_len * model.spec.experts_per_token)
