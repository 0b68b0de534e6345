"""OLMoE (`olmoe`: q and k each RMS-normed across all their heads before the rotation, every layer softmax-routed
experts, no shared expert) from tiny checkpoints saved by transformers: the engine's logits and generate() tokens
equal transformers' (paged, contiguous, chunked prefill), and its parameter count is the spec's."""

from __future__ import annotations

from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks

_BASE = dict(model_type="olmoe", vocab_size=128, hidden_size=64, intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6,
             num_experts=4, num_experts_per_tok=2, pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    "olmoe": _BASE,
    "olmoe-renormalised-biased": dict(_BASE, norm_topk_prob=True, attention_bias=True, num_key_value_heads=None),
}


# the checkpoints fixture; the logits and generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=23))


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["olmoe"][0])
    assert spec.qk_norm == "rmsnorm_across_heads" and spec.num_experts == 4 and not spec.router_renormalize
    assert spec.shared_experts == 0 and spec.num_moe_layers == 2 and not spec.post_norm
    other = ModelSpec.from_hf_config(checkpoints["olmoe-renormalised-biased"][0])
    assert other.router_renormalize and other.qkv_bias and other.out_bias and other.num_kv_heads == 4
    assert_param_counts_equal(checkpoints)
