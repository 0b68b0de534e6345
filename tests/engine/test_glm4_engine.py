"""GLM-4-0414 (`glm4`: a norm after attention and after the MLP besides the two before them, under GLM-4's own
names; q/k/v biases without an o_proj bias; half of each head rotated over adjacent pairs; gate/up in one
`gate_up_proj` tensor) from tiny checkpoints saved by transformers: the engine's logits and generate() tokens
equal transformers' (paged, contiguous, chunked prefill), and its parameter count is the spec's."""

from __future__ import annotations

from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks

_BASE = dict(model_type="glm4", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    "glm4": _BASE,  # partial_rotary_factor: the class's 0.5
    "glm4-full-rotary-tied": dict(_BASE, partial_rotary_factor=1.0, attention_bias=False, tie_word_embeddings=True,
                                  head_dim=32),
}


# the checkpoints fixture; the logits and generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=11, tol=1e-5))


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["glm4"][0])
    assert spec.rotary_dim == 8 and spec.rope_interleaved and spec.sandwich_norms and not spec.norm_offset
    assert spec.qkv_bias and not spec.out_bias
    other = ModelSpec.from_hf_config(checkpoints["glm4-full-rotary-tied"][0])
    assert other.rotary_dim == 32 and not other.qkv_bias and other.tied_embeddings
    assert_param_counts_equal(checkpoints, hf_tensor="post_self_attn_layernorm.weight")
