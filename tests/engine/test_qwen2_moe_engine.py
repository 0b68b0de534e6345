"""Qwen1.5-MoE / Qwen2-MoE (`qwen2_moe`: softmax-routed experts beside one shared expert behind a sigmoid gate,
dense `mlp_only_layers`, q/k/v biases, per-layer sliding windows under use_sliding_window) from tiny checkpoints
saved by transformers: the engine's logits and generate() tokens equal transformers' (paged, contiguous, chunked
prefill), and its parameter count is the spec's."""

from __future__ import annotations

from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks

_BASE = dict(model_type="qwen2_moe", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=3, max_position_embeddings=64, rms_norm_eps=1e-6,
             moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    # layer 1 dense; layer 0 slides over 6 tokens (even and below max_window_layers), layers 1-2 full
    "qwen2_moe": dict(_BASE, mlp_only_layers=[1], use_sliding_window=True, sliding_window=6, max_window_layers=2),
    "qwen2_moe-renormalised": dict(_BASE, norm_topk_prob=True, qkv_bias=False),
}


# the checkpoints fixture; the logits (measured: at most 1.5e-5 apart, experts summed in another order) and
# generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=19))


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["qwen2_moe"][0])
    assert spec.dense_layers == (1,) and spec.shared_expert_gate and spec.shared_ffn_size == 48
    assert spec.layer_types == ("sliding", "full", "full") and spec.qkv_bias and not spec.router_renormalize
    other = ModelSpec.from_hf_config(checkpoints["qwen2_moe-renormalised"][0])
    assert other.router_renormalize and not other.qkv_bias and other.layer_types is None
    assert_param_counts_equal(checkpoints)
