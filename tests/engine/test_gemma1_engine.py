"""Gemma 1 (`gemma`: GeGLU, RMSNorms that multiply by 1 + weight, sqrt(hidden)-scaled embeddings, head_dim other
than hidden / heads, a tied head) from tiny checkpoints saved by transformers: the engine's logits and generate()
tokens equal transformers' (paged, contiguous, chunked prefill), and its parameter count is the spec's."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import from_pretrained
from llmperf.specs import ModelSpec

from checkpoints import assert_generation_matches, assert_logits_match, saved_checkpoint

_BASE = dict(model_type="gemma", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    "gemma": _BASE,
    "gemma-legacy-gelu-biased": dict(_BASE, hidden_act="gelu", attention_bias=True, num_key_value_heads=1),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: (path, saved_checkpoint(cfg, path, seed=17, noise=0.2))
            for name, cfg in CONFIGS.items() for path in [tmp_path_factory.mktemp(name)]}


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["gemma"][0])
    assert spec.embedding_scale and spec.norm_offset and spec.tied_embeddings and spec.head_dim == 32
    assert spec.hidden_act == "gelu_pytorch_tanh" and not spec.sandwich_norms
    legacy = ModelSpec.from_hf_config(checkpoints["gemma-legacy-gelu-biased"][0])
    assert legacy.hidden_act == "gelu_pytorch_tanh" and legacy.qkv_bias and legacy.out_bias
    for name, (path, hf) in checkpoints.items():
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
