"""OLMoE (`olmoe`): read with OlmoeConfig's defaults for absent keys (64 experts of intermediate_size, top-8, MHA),
q and k each RMS-normed across all their heads, every layer MoE; parameters exact against transformers (tiny
structures and the class defaults, on the meta device), KV widths as transformers' cache fills them,
transformers' own save read back, refusals by name (`clip_qkv`), the simulator's static batch priced as
`estimate`, and `llmperf estimate` on a saved config directory. (The engine: tests/engine/test_olmoe_engine.py.)"""

from __future__ import annotations

import pytest

from llmperf.analysis import ForwardModel
from llmperf.specs import Precision
from tests.analysis.model_checks import hf_type_checks, spec_at_class_defaults
from tests.analysis.model_checks import read_config as read

pytest.importorskip("torch")
pytest.importorskip("transformers")

_BASE = dict(model_type="olmoe", vocab_size=128, hidden_size=64, intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=3, max_position_embeddings=256, num_experts=8,
             num_experts_per_tok=2, pad_token_id=None, bos_token_id=None, eos_token_id=None)
TINY = {
    "olmoe": _BASE,
    "olmoe-mha-renormalised": dict(_BASE, num_key_value_heads=None, norm_topk_prob=True, attention_bias=True),
}


def test_the_config_class_defaults_are_exact():
    spec = spec_at_class_defaults("olmoe")
    assert (spec.num_experts, spec.experts_per_token, spec.num_kv_heads, spec.expert_ffn_size) == (64, 8, 16, 2048)


def test_structure_read():
    spec = read(TINY["olmoe"])
    assert spec.qk_norm == "rmsnorm_across_heads" and spec.num_moe_layers == 3 and not spec.router_renormalize
    assert spec.qk_norm_gathered  # vLLM's OlmoeAttention all-gathers q and k under tensor parallelism
    ops = {o.name for o in ForwardModel(model=spec, precision=Precision.uniform("bf16"), tp=2).forward_ops(2, 1, 50)}
    assert "qk_norm_gather" in ops and "qk_norm_allreduce" not in ops
    other = read(TINY["olmoe-mha-renormalised"])
    assert other.router_renormalize and other.num_kv_heads == 4 and other.qkv_bias and other.out_bias


# the tests every type shares: tiny parameters exact, KV widths, transformers' save read back, refusals in one
# line, junk a spec or one error, the simulator's static batch, `llmperf estimate` on a saved config directory
globals().update(hf_type_checks(
    TINY,
    refused=[
        (dict(_BASE, clip_qkv=8.0), "clip_qkv=8.0 is not modelled (the clamp of q, k and v is not built)"),
        (dict(_BASE, head_dim=32), "head_dim=32 is not modelled (OLMoE's q norm spans hidden_size: head_dim is 16)"),
        (dict(_BASE, num_experts_per_tok=9), "num_experts_per_tok=9 exceeds the 8 routed experts"),
    ],
    junk=[("clip_qkv", "x"), ("num_experts", 1), ("norm_topk_prob", "no"), ("intermediate_size", 0)],
    junk_config=lambda key, value: dict(_BASE, **{key: value}),
    estimate=("olmoe", 3 * 2 * 2 * 16 * 2),  # layers x K,V x kv heads x head_dim x fp16
))
