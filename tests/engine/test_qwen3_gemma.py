"""Qwen3 (dense) and Gemma 2 / Gemma 3 (text) from tiny checkpoints saved by transformers: the same
logits and generate() tokens (q/k norms, explicit head_dim, soft-capping, sandwich norms, (1 + w)
norms, scaled embeddings, GeGLU, sliding / full layers with their own rotary bases)."""

from __future__ import annotations

import pytest

from checkpoints import CASES, ENGINES, assert_generation_matches, assert_logits_match, saved_checkpoint

_BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, head_dim=16)
CONFIGS = {
    "qwen3": dict(_BASE, model_type="qwen3", head_dim=32),  # q_size 128 != hidden 64
    "gemma2": dict(_BASE, model_type="gemma2", sliding_window=6, query_pre_attn_scalar=20,
                   attn_logit_softcapping=5.0, final_logit_softcapping=8.0),
    "gemma3": dict(_BASE, model_type="gemma3_text", sliding_window=6, query_pre_attn_scalar=20,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        out[name] = (path, saved_checkpoint(cfg, path, seed=3))
    return out


_MEMO: dict = {}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    assert_logits_match(path, hf)


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_equal_transformers_generate(checkpoints, name, case, engine):
    path, hf = checkpoints[name]
    assert_generation_matches(path, hf, case, engine, memo=_MEMO)
