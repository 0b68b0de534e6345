"""Gemma 1 (`gemma`: GeGLU, RMSNorms that multiply by 1 + weight, sqrt(hidden)-scaled embeddings, head_dim other
than hidden / heads, a tied head) from tiny checkpoints saved by transformers: the engine's logits and generate()
tokens equal transformers' (paged, contiguous, chunked prefill), and its parameter count is the spec's."""

from __future__ import annotations

from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks

_BASE = dict(model_type="gemma", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    "gemma": _BASE,
    "gemma-legacy-gelu-biased": dict(_BASE, hidden_act="gelu", attention_bias=True, num_key_value_heads=1),
}


# the checkpoints fixture; the logits and generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=17, tol=1e-5))


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["gemma"][0])
    assert spec.embedding_scale and spec.norm_offset and spec.tied_embeddings and spec.head_dim == 32
    assert spec.hidden_act == "gelu_pytorch_tanh" and not spec.sandwich_norms
    legacy = ModelSpec.from_hf_config(checkpoints["gemma-legacy-gelu-biased"][0])
    assert legacy.hidden_act == "gelu_pytorch_tanh" and legacy.qkv_bias and legacy.out_bias
    assert_param_counts_equal(checkpoints)
