"""OLMoE (`olmoe`: q and k each RMS-normed across all their heads before the rotation, every layer softmax-routed
experts, no shared expert) from tiny checkpoints saved by transformers: the engine's logits and generate() tokens
equal transformers' (paged, contiguous, chunked prefill), and its parameter count is the spec's."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import from_pretrained
from llmperf.specs import ModelSpec

from checkpoints import assert_generation_matches, assert_logits_match, saved_checkpoint

_BASE = dict(model_type="olmoe", vocab_size=128, hidden_size=64, intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6,
             num_experts=4, num_experts_per_tok=2, pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    "olmoe": _BASE,
    "olmoe-renormalised-biased": dict(_BASE, norm_topk_prob=True, attention_bias=True, num_key_value_heads=None),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: (path, saved_checkpoint(cfg, path, seed=23, noise=0.2))
            for name, cfg in CONFIGS.items() for path in [tmp_path_factory.mktemp(name)]}


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["olmoe"][0])
    assert spec.qk_norm == "rmsnorm_across_heads" and spec.num_experts == 4 and not spec.router_renormalize
    assert spec.shared_experts == 0 and spec.num_moe_layers == 2 and not spec.post_norm
    other = ModelSpec.from_hf_config(checkpoints["olmoe-renormalised-biased"][0])
    assert other.router_renormalize and other.qkv_bias and other.out_bias and other.num_kv_heads == 4
    for name, (path, hf) in checkpoints.items():
        model = from_pretrained(path, dtype="fp32")
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert n == model.spec.param_count == sum(p.numel() for p in hf.parameters()), name


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    assert_logits_match(path, hf)


_MEMO: dict = {}


@pytest.mark.parametrize("engine", ["paged", "contiguous", "chunked"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_equal_transformers_generate(checkpoints, name, engine):
    path, hf = checkpoints[name]
    with torch.no_grad():
        assert_generation_matches(path, hf, "greedy", engine, memo=_MEMO)
