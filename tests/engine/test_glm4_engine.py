"""GLM-4-0414 (`glm4`: a norm after attention and after the MLP besides the two before them, under GLM-4's own
names; q/k/v biases without an o_proj bias; half of each head rotated over adjacent pairs; gate/up in one
`gate_up_proj` tensor) from tiny checkpoints saved by transformers: the engine's logits and generate() tokens
equal transformers' (paged, contiguous, chunked prefill), and its parameter count is the spec's."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import from_pretrained
from llmperf.specs import ModelSpec

from checkpoints import assert_generation_matches, assert_logits_match, saved_checkpoint

_BASE = dict(model_type="glm4", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    "glm4": _BASE,  # partial_rotary_factor: the class's 0.5
    "glm4-full-rotary-tied": dict(_BASE, partial_rotary_factor=1.0, attention_bias=False, tie_word_embeddings=True,
                                  head_dim=32),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: (path, saved_checkpoint(cfg, path, seed=11, noise=0.2))
            for name, cfg in CONFIGS.items() for path in [tmp_path_factory.mktemp(name)]}


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["glm4"][0])
    assert spec.rotary_dim == 8 and spec.rope_interleaved and spec.sandwich_norms and not spec.norm_offset
    assert spec.qkv_bias and not spec.out_bias
    other = ModelSpec.from_hf_config(checkpoints["glm4-full-rotary-tied"][0])
    assert other.rotary_dim == 32 and not other.qkv_bias and other.tied_embeddings
    for name, (path, hf) in checkpoints.items():
        assert any(k.endswith("post_self_attn_layernorm.weight") for k in hf.state_dict())
        model = from_pretrained(path, dtype="fp32")
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert n == model.spec.param_count == sum(p.numel() for p in hf.parameters()), name


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    assert_logits_match(path, hf, tol=1e-5)


_MEMO: dict = {}


@pytest.mark.parametrize("engine", ["paged", "contiguous", "chunked"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_equal_transformers_generate(checkpoints, name, engine):
    path, hf = checkpoints[name]
    with torch.no_grad():
        assert_generation_matches(path, hf, "greedy", engine, memo=_MEMO)
