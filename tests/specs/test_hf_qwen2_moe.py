"""Qwen1.5-MoE / Qwen2-MoE (`qwen2_moe`): read with Qwen2MoeConfig's defaults for absent keys (60 experts, top-4,
a shared expert behind a sigmoid gate, q/k/v biases from `qkv_bias`), dense `mlp_only_layers` and
`decoder_sparse_step`, sliding layers under use_sliding_window; parameters exact against transformers (tiny
structures and the class defaults, on the meta device), KV widths as transformers' cache fills them,
transformers' own save read back, refusals by name, the simulator's static batch priced as `estimate`, and
`llmperf estimate` on a saved config directory. (The engine: tests/engine/test_qwen2_moe_engine.py.)"""

from __future__ import annotations

import pytest

from tests.analysis.model_checks import hf_type_checks, spec_at_class_defaults
from tests.analysis.model_checks import read_config as read

pytest.importorskip("torch")
pytest.importorskip("transformers")

_BASE = dict(model_type="qwen2_moe", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=4, max_position_embeddings=256, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2)
TINY = {
    "qwen2_moe": dict(_BASE, mlp_only_layers=[0], decoder_sparse_step=1),
    "qwen2_moe-step2-sliding": dict(_BASE, decoder_sparse_step=2, use_sliding_window=True, sliding_window=8,
                                    max_window_layers=3, qkv_bias=False, norm_topk_prob=True),
}


def test_the_config_class_defaults_are_exact():
    spec = spec_at_class_defaults("qwen2_moe")
    assert (spec.num_experts, spec.experts_per_token, spec.shared_experts, spec.shared_ffn_size) == (60, 4, 1, 5632)
    assert spec.shared_expert_gate and spec.qkv_bias and not spec.out_bias and spec.layer_types is None


def test_structure_read():
    spec = read(TINY["qwen2_moe"])
    assert spec.dense_layers == (0,) and spec.moe_ffn_size == 32 and not spec.router_renormalize
    other = read(TINY["qwen2_moe-step2-sliding"])
    assert other.dense_layers == (0, 2) and other.router_renormalize and not other.qkv_bias
    assert other.layer_types == ("sliding", "full", "sliding", "full") and other.sliding_window == 8


# the tests every type shares: tiny parameters exact, KV widths, transformers' save read back (every key read),
# refusals in one line, junk a spec or one error, the simulator's static batch, `llmperf estimate` on a saved
# config directory
globals().update(hf_type_checks(
    TINY,
    every_key_read=True,
    refused=[
        (dict(_BASE, num_experts_per_tok=9), "num_experts_per_tok=9 exceeds the 8 routed experts"),
        (dict(_BASE, decoder_sparse_step=0), "decoder_sparse_step must be a positive integer, got 0"),
        (dict(_BASE, mlp_only_layers=[7]), "mlp_only_layers"),
    ],
    junk=[("qkv_bias", "yes"), ("num_experts", 1), ("shared_expert_intermediate_size", 0), ("norm_topk_prob", 2)],
    junk_config=lambda key, value: dict(_BASE, **{key: value}),
    simulated=sorted(TINY),
    estimate=("qwen2_moe", 4 * 2 * 2 * 16 * 2),  # layers x K,V x kv heads x head_dim x fp16
))
