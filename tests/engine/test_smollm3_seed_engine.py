"""SmolLM3 (NoPE layers, q/k/v/o biases, NoPE layers sliding under use_sliding_window), Seed-OSS (q/k/v
biases without an o_proj bias, head_dim != hidden / heads) and EXAONE 4 (norms after each sublayer,
`post_norm`; per-head q/k norms; sliding layers and a full NoPE one) from tiny checkpoints saved by
transformers: the engine's logits and generate() tokens equal transformers' (paged, contiguous, chunked
prefill), and its parameter count is the spec's."""

from __future__ import annotations

from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks

_BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    # layers 1 and 3 NoPE (interval 2), sliding over 6 tokens: shorter than the prompts, so it matters
    "smollm3": dict(_BASE, model_type="smollm3", num_hidden_layers=4, no_rope_layer_interval=2,
                    use_sliding_window=True, sliding_window=6, attention_bias=True, tie_word_embeddings=True),
    "seed_oss": dict(_BASE, model_type="seed_oss", num_hidden_layers=2, head_dim=32, attention_bias=True,
                     attention_out_bias=False),
    # per-head q/k norms, norms after each sublayer; layers 0-2 slide over 6 tokens, layer 3 full and NoPE
    "exaone4": dict(_BASE, model_type="exaone4", num_hidden_layers=4, sliding_window=6, sliding_window_pattern=4),
}


# the checkpoints fixture; the logits and generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=3))


def test_the_checkpoints_are_what_they_claim(checkpoints):
    smol = ModelSpec.from_hf_config(checkpoints["smollm3"][0])
    assert smol.nope_layers == (1, 3) and smol.layer_types == ("full", "sliding", "full", "sliding")
    assert smol.qkv_bias and smol.out_bias and smol.tied_embeddings
    seed = ModelSpec.from_hf_config(checkpoints["seed_oss"][0])
    assert seed.qkv_bias and not seed.out_bias and seed.head_dim == 32
    exaone = ModelSpec.from_hf_config(checkpoints["exaone4"][0])
    assert exaone.post_norm and exaone.qk_norm == "rmsnorm" and exaone.nope_layers == (3,)
    assert_param_counts_equal(checkpoints)
