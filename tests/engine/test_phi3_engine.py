"""Phi-3 / Phi-4-mini (`phi3`: q/k/v in one `qkv_proj` tensor and gate/up in one `gate_up_proj`, partial rotary
positions, a sliding window on every layer) from tiny checkpoints saved by transformers: the engine loads the
fused tensors, its logits and generate() tokens equal transformers' (paged, contiguous, chunked prefill), its
parameter count is the spec's; a longrope checkpoint is refused by name."""

from __future__ import annotations

import pytest

from llmperf.engine import from_pretrained
from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks, saved_checkpoint

_BASE = dict(model_type="phi3", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    # half of each 16-wide head rotates; every layer slides over 6 tokens (shorter than the prompts)
    "phi3": dict(_BASE, partial_rotary_factor=0.5, sliding_window=6),
    "phi3-tied-mha": dict(_BASE, num_key_value_heads=None, tie_word_embeddings=True),
}


# the checkpoints fixture; the logits and generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=7, tol=1e-5))


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["phi3"][0])
    assert spec.rotary_dim == 8 and spec.sliding_window == 6 and not spec.qkv_bias
    tied = ModelSpec.from_hf_config(checkpoints["phi3-tied-mha"][0])
    assert tied.tied_embeddings and tied.num_kv_heads == 4
    assert_param_counts_equal(checkpoints, hf_tensor="self_attn.qkv_proj.weight")


def test_longrope_is_refused_by_name(tmp_path):
    """longrope switches its factors by the sequence's length: the engine does not build it (estimate does)."""
    rope = dict(rope_type="longrope", short_factor=[1.0] * 8, long_factor=[2.0] * 8,
                original_max_position_embeddings=32)
    saved_checkpoint(dict(_BASE, rope_parameters=rope), tmp_path)
    assert ModelSpec.from_hf_config(tmp_path).rope_scaling["rope_type"] == "longrope"
    with pytest.raises(ValueError, match="rope_scaling: rope_type 'longrope' is not supported by the engine"):
        from_pretrained(tmp_path, dtype="fp32")
