"""Command R7B / Command A (`cohere2`: attention and the FFN side by side from one bias-free LayerNorm, q/k/v/o
biases, sliding layers rotating adjacent pairs and NoPE full layers, logits times `logit_scale`, a tied head) from
tiny checkpoints saved by transformers: the engine's logits and generate() tokens equal transformers' (paged,
contiguous, chunked prefill), and its parameter count is the spec's; tensor parallelism refuses it by name."""

from __future__ import annotations

import pytest

from llmperf.errors import SpecError
from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks

_BASE = dict(model_type="cohere2", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=4, max_position_embeddings=64, layer_norm_eps=1e-5,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    # layers 0-2 slide over 6 tokens (shorter than the prompts) and rotate, layer 3 is full and NoPE
    "cohere2": dict(_BASE, sliding_window=6, logit_scale=0.25),
    # biases everywhere, an untied head, alternating layers
    "cohere2-biased-untied": dict(_BASE, sliding_window=5, sliding_window_pattern=2, attention_bias=True,
                                  tie_word_embeddings=False, logit_scale=2.0),
}


# the checkpoints fixture; the logits and generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=13, tol=1e-5))


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["cohere2"][0])
    assert spec.shared_input_norm and spec.norm_kind == "layernorm_no_bias" and spec.logit_scale == 0.25
    assert spec.layer_types == ("sliding",) * 3 + ("full",) and spec.nope_layers == (3,) and spec.tied_embeddings
    other = ModelSpec.from_hf_config(checkpoints["cohere2-biased-untied"][0])
    assert other.qkv_bias and other.out_bias and not other.tied_embeddings and other.nope_layers == (1, 3)
    assert_param_counts_equal(checkpoints)


def test_tensor_parallelism_refuses_it_by_name(checkpoints):
    from llmperf.engine.tensor_parallel import shard_spec
    with pytest.raises(SpecError, match="shared_input_norm"):
        shard_spec(ModelSpec.from_hf_config(checkpoints["cohere2"][0]), 2)
