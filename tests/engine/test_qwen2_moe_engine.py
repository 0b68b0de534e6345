"""Qwen1.5-MoE / Qwen2-MoE (`qwen2_moe`: softmax-routed experts beside one shared expert behind a sigmoid gate,
dense `mlp_only_layers`, q/k/v biases, per-layer sliding windows under use_sliding_window) from tiny checkpoints
saved by transformers: the engine's logits and generate() tokens equal transformers' (paged, contiguous, chunked
prefill), and its parameter count is the spec's."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import from_pretrained
from llmperf.specs import ModelSpec

from checkpoints import assert_generation_matches, assert_logits_match, saved_checkpoint

_BASE = dict(model_type="qwen2_moe", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=3, max_position_embeddings=64, rms_norm_eps=1e-6,
             moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
CONFIGS = {
    # layer 1 dense; layer 0 slides over 6 tokens (even and below max_window_layers), layers 1-2 full
    "qwen2_moe": dict(_BASE, mlp_only_layers=[1], use_sliding_window=True, sliding_window=6, max_window_layers=2),
    "qwen2_moe-renormalised": dict(_BASE, norm_topk_prob=True, qkv_bias=False),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: (path, saved_checkpoint(cfg, path, seed=19, noise=0.2))
            for name, cfg in CONFIGS.items() for path in [tmp_path_factory.mktemp(name)]}


def test_the_checkpoints_are_what_they_claim(checkpoints):
    spec = ModelSpec.from_hf_config(checkpoints["qwen2_moe"][0])
    assert spec.dense_layers == (1,) and spec.shared_expert_gate and spec.shared_ffn_size == 48
    assert spec.layer_types == ("sliding", "full", "full") and spec.qkv_bias and not spec.router_renormalize
    other = ModelSpec.from_hf_config(checkpoints["qwen2_moe-renormalised"][0])
    assert other.router_renormalize and not other.qkv_bias and other.layer_types is None
    for name, (path, hf) in checkpoints.items():
        model = from_pretrained(path, dtype="fp32")
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert n == model.spec.param_count == sum(p.numel() for p in hf.parameters()), name


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    assert_logits_match(path, hf)  # measured: at most 1.5e-5 apart (experts summed in another order)


_MEMO: dict = {}


@pytest.mark.parametrize("engine", ["paged", "contiguous", "chunked"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_equal_transformers_generate(checkpoints, name, engine):
    path, hf = checkpoints[name]
    with torch.no_grad():
        assert_generation_matches(path, hf, "greedy", engine, memo=_MEMO)
