"""The analytical FLOP counts against PyTorch's own counter (`torch.utils.flop_counter`) on real
Hugging Face models built from the same spec (random weights, no download).

Conventions compared: the dense attention convention (eager attention computes the whole masked
square, sliding and chunked layers included), logits at every position, matrix products only (norms,
soft-caps, sinks, RoPE and the scaled embedding are elementwise; a bias add is not counted). MLA is
compared in prefill, where transformers computes it unabsorbed, as `mla_mode="auto"` does. MoE: the
experts run as transformers' eager loop over the experts the tokens hit, so the counter sees what a
token executes (tokens x k rows: the analytical convention), exactly for Qwen3-MoE, DeepSeek-V3 and
gpt-oss; Llama 4's experts are one batched matmul over every expert, and its test adds the (E - k)
experts per token the counter sees on top of the executed ones."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from llmperf.analysis import ForwardModel  # noqa: E402
from llmperf.specs import ModelSpec, Precision  # noqa: E402


def analytical_matmul_flops(spec: ModelSpec, batch: int, seq: int) -> float:
    """Dense convention (the whole attention square) and logits at every position, like HF."""
    fm = ForwardModel(model=spec, precision=Precision(), attention="naive", all_logits=True,
                      attention_flops="dense")
    ops = fm.forward_ops(batch, seq, seq)
    # the counter counts matrix products only, and a bias add not at all
    return sum(o.flops - (batch * seq * _bias_width(spec, o.name) if _has_bias(spec, o.name) else 0)
               for o in ops if o.kind in ("matmul", "attention"))


def _has_bias(spec: ModelSpec, name: str) -> bool:
    return ((name in ("q_proj", "k_proj", "v_proj") and spec.qkv_bias) or (name == "o_proj" and spec.out_bias)
            or (name in ("up_proj", "gate_proj", "down_proj") and spec.mlp_bias))


def _bias_width(spec: ModelSpec, name: str) -> int:
    return {"q_proj": spec.q_size, "k_proj": spec.kv_size, "v_proj": spec.kv_size, "o_proj": spec.hidden_size,
            "up_proj": spec.ffn_size, "gate_proj": spec.ffn_size,
            "down_proj": spec.hidden_size}[name] * spec.num_layers


def counted(model, batch: int, seq: int) -> int:  # noqa: ANN001
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    return counter.get_total_flops()


def test_llama_gqa_matches_flop_counter():
    spec = ModelSpec(name="t", vocab_size=320, hidden_size=128, num_layers=3, num_heads=8, num_kv_heads=2,
                     ffn_size=352, max_positions=512)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=128, num_hidden_layers=3, num_attention_heads=8,
                                   num_key_value_heads=2, intermediate_size=352, max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "eager"
    assert counted(model, 2, 37) == analytical_matmul_flops(spec, 2, 37)


def test_gpt2_matches_flop_counter():
    spec = ModelSpec(name="t", family="gpt2", vocab_size=300, hidden_size=96, num_layers=2, num_heads=4,
                     ffn_size=384, ffn_kind="gelu", hidden_act="gelu_new", norm_kind="layernorm",
                     pos_encoding="learned", tied_embeddings=True, max_positions=128, qkv_bias=True,
                     out_bias=True, mlp_bias=True)
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=96, n_layer=2, n_head=4, n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.config._attn_implementation = "eager"
    assert counted(model, 3, 20) == analytical_matmul_flops(spec, 3, 20)


# ---- today's models (issue 22): tiny configs of each family, built with transformers' own classes ----
def analytical_without_biases(spec: ModelSpec, batch: int, seq: int) -> float:
    """`analytical_matmul_flops` of the same model without its bias adds (the counter counts an
    `addmm` as its product only, and the router's score-correction add not at all)."""
    changes = dict(qkv_bias=False, out_bias=False, mlp_bias=False)
    if spec.is_moe:
        changes.update(router_bias=False, router_score_bias=False)
    return analytical_matmul_flops(spec.scaled(**changes), batch, seq)


def _hf(cls_name: str, config_name: str, **cfg):  # noqa: ANN003, ANN202
    """A transformers model from its config class, eager attention, and the experts as a loop over
    the experts the tokens hit (`_experts_implementation="eager"`): what a token executes."""
    config = getattr(transformers, config_name)(**cfg)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return getattr(transformers, cls_name)(config).eval()


TINY = dict(vocab_size=320, hidden_size=128, num_attention_heads=4, max_position_embeddings=512)
SPEC = dict(name="t", vocab_size=320, hidden_size=128, num_heads=4, max_positions=512)


def test_qwen3_matches_flop_counter():
    """q/k RMSNorm over head_dim, head_dim 48 != hidden / heads: the norms are not matrix products."""
    model = _hf("Qwen3ForCausalLM", "Qwen3Config", num_hidden_layers=2, num_key_value_heads=2, head_dim=48,
                intermediate_size=192, **TINY)
    spec = ModelSpec(num_layers=2, num_kv_heads=2, head_dim=48, ffn_size=192, qk_norm="rmsnorm", **SPEC)
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21)


def test_qwen3_moe_matches_flop_counter():
    """Routed experts of moe_intermediate_size: each token runs through its k experts (the counter
    sees the loop over the experts hit: tokens x k rows, the executed convention)."""
    model = _hf("Qwen3MoeForCausalLM", "Qwen3MoeConfig", num_hidden_layers=2, num_key_value_heads=2, head_dim=48,
                intermediate_size=192, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, **TINY)
    spec = ModelSpec(num_layers=2, num_kv_heads=2, head_dim=48, ffn_size=192, moe_ffn_size=64, num_experts=8,
                     experts_per_token=2, qk_norm="rmsnorm", **SPEC)
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21)


def test_deepseek_v3_mla_unabsorbed_prefill_matches_flop_counter():
    """MLA as transformers computes it (unabsorbed: kv_b_proj up-projects every key, then attention
    with heads of 32 + 16 for QK and 24 for PV), a dense first layer, 8 routed experts (2 per token),
    one shared expert, the sigmoid router with its score correction."""
    model = _hf("DeepseekV3ForCausalLM", "DeepseekV3Config", num_hidden_layers=3, num_key_value_heads=4,
                intermediate_size=256, moe_intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32,
                qk_rope_head_dim=16, v_head_dim=24, n_group=2, topk_group=1, rope_scaling=None, **TINY)
    spec = ModelSpec(num_layers=3, num_kv_heads=4, head_dim=48, ffn_size=256, moe_ffn_size=64, num_experts=8,
                     experts_per_token=2, shared_experts=1, dense_layers=(0,), router_score_bias=True,
                     q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24,
                     **SPEC)
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21)


def test_minimax_m2_matches_flop_counter():
    """q and k each RMS-normed across all their heads (not a matrix product), partial rotary positions,
    every layer MoE of intermediate_size experts (2 of 8 a token) under the sigmoid router."""
    model = _hf("MiniMaxM2ForCausalLM", "MiniMaxM2Config", num_hidden_layers=2, num_key_value_heads=2, head_dim=48,
                intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, **TINY)
    spec = ModelSpec(num_layers=2, num_kv_heads=2, head_dim=48, ffn_size=64, num_experts=8, experts_per_token=2,
                     qk_norm="rmsnorm_across_heads", router_score_bias=True, router_scoring="sigmoid", **SPEC)
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21)


def test_olmo3_matches_flop_counter():
    """OLMo 3: norms after each sublayer, q/k normed across all heads, three sliding layers in four (eager
    attention computes the whole masked square: the dense convention)."""
    model = _hf("Olmo3ForCausalLM", "Olmo3Config", num_hidden_layers=4, num_key_value_heads=2, intermediate_size=96,
                sliding_window=8, **TINY)
    spec = ModelSpec(num_layers=4, num_kv_heads=2, ffn_size=96, qk_norm="rmsnorm_across_heads", post_norm=True,
                     layer_types=("sliding", "sliding", "sliding", "full"), sliding_window=8, **SPEC)
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21)


def test_gpt_oss_matches_flop_counter():
    """Sliding (window 8) and full layers alternating, sinks (one more softmax column: not a matrix
    product), biases everywhere, the router with a bias. Eager attention computes the whole square
    with a mask: the dense convention."""
    model = _hf("GptOssForCausalLM", "GptOssConfig", num_hidden_layers=2, num_key_value_heads=2, head_dim=32,
                intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, sliding_window=8, **TINY)
    spec = ModelSpec(num_layers=2, num_kv_heads=2, head_dim=32, ffn_size=96, num_experts=4, experts_per_token=2,
                     layer_types=("sliding", "full"), sliding_window=8, attn_sinks=True, router_bias=True,
                     qkv_bias=True, out_bias=True, mlp_bias=True, **SPEC)
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_matches_flop_counter(family):
    """Gemma 2 (sliding/full alternating, attention and final soft-caps) and Gemma 3 (5 sliding : 1
    full, q/k norms): soft-caps, sandwich norms and the scaled embedding are elementwise."""
    layers = 2 if family == "gemma2" else 6
    cls, cfg = (("Gemma2ForCausalLM", "Gemma2Config") if family == "gemma2"
                else ("Gemma3ForCausalLM", "Gemma3TextConfig"))
    model = _hf(cls, cfg, num_hidden_layers=layers, num_key_value_heads=2, head_dim=48, intermediate_size=192,
                sliding_window=8, **TINY)
    types = tuple("full" if t == "full_attention" else "sliding" for t in model.config.layer_types)
    extra = (dict(attn_softcap=50.0, final_softcap=30.0) if family == "gemma2" else dict(qk_norm="rmsnorm"))
    spec = ModelSpec(num_layers=layers, num_kv_heads=2, head_dim=48, ffn_size=192, hidden_act="gelu_pytorch_tanh",
                     layer_types=types, sliding_window=8, sandwich_norms=True, embedding_scale=True,
                     tied_embeddings=True, **extra, **SPEC)
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21)


def test_llama4_matches_flop_counter_with_its_dense_experts():
    """Chunked (8) RoPE layers and a NoPE global layer, an MoE FFN every other layer with a shared
    expert. transformers' Llama4TextExperts runs EVERY expert over every token (a batched matmul over
    the stacked experts, the routing weights zeroing the rest), so the counter sees E experts where
    a token executes k: the counted FLOPs exceed the executed ones by (E - k) experts per token per
    MoE layer, 2 x 3 x hidden x expert width each."""
    model = _hf("Llama4ForCausalLM", "Llama4TextConfig", num_hidden_layers=4, num_key_value_heads=2, head_dim=32,
                intermediate_size=64, intermediate_size_mlp=192, num_local_experts=4, num_experts_per_tok=1,
                interleave_moe_layer_step=2, attention_chunk_size=8, **TINY)
    spec = ModelSpec(num_layers=4, num_kv_heads=2, head_dim=32, ffn_size=192, moe_ffn_size=64, num_experts=4,
                     experts_per_token=1, shared_experts=1, dense_layers=(0, 2),
                     layer_types=("chunked", "chunked", "chunked", "full"), attention_chunk_size=8,
                     nope_layers=(3,), qk_norm="l2", **SPEC)
    assert [t for t in model.config.layer_types] == ["chunked_attention"] * 3 + ["full_attention"]
    dense_experts = spec.num_moe_layers * 2 * 21 * (4 - 1) * 2 * 3 * 128 * 64
    assert counted(model, 2, 21) == analytical_without_biases(spec, 2, 21) + dense_experts
