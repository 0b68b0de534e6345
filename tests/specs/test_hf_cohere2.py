"""Command R7B / Command A (`cohere2`): read with Cohere2Config's defaults for absent keys; one bias-free
LayerNorm a layer read by attention and the FFN side by side (`shared_input_norm`, `layernorm_no_bias`: the cost
model has no mlp_norm operator), sliding layers by `sliding_window_pattern`, NoPE full layers (a null window
refused), `logit_scale`, a tied head; parameters exact against transformers (tiny structures and the
class defaults, on the meta device), KV widths as transformers' cache fills them, transformers' own save read
back, refusals by name, the simulator's static batch priced as `estimate`, and `llmperf estimate` on a saved
config directory. (The engine: tests/engine/test_cohere2_engine.py.)"""

from __future__ import annotations

import pytest

from llmperf.analysis import ForwardModel
from llmperf.specs import Precision
from tests.analysis.model_checks import hf_type_checks, spec_at_class_defaults
from tests.analysis.model_checks import read_config as read

pytest.importorskip("torch")
pytest.importorskip("transformers")

_BASE = dict(model_type="cohere2", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=4, max_position_embeddings=256, pad_token_id=None,
             bos_token_id=None, eos_token_id=None)
TINY = {
    "cohere2": dict(_BASE, sliding_window=8),
    "cohere2-biased-untied": dict(_BASE, sliding_window=8, sliding_window_pattern=2, attention_bias=True,
                                  tie_word_embeddings=False, logit_scale=1.0),
    "cohere2-all-full": dict(_BASE, sliding_window=8, num_key_value_heads=None, layer_types=["full_attention"] * 4),
}


def test_the_config_class_defaults_are_exact():
    spec = spec_at_class_defaults("cohere2")
    assert spec.tied_embeddings and spec.logit_scale == 0.0625 and spec.num_kv_heads == 64
    assert spec.layer_types == ("sliding", "sliding", "sliding", "full") * 10 and len(spec.nope_layers) == 10


def test_structure_read():
    spec = read(TINY["cohere2"])
    assert spec.shared_input_norm and spec.norm_kind == "layernorm_no_bias" and spec.rope_interleaved
    assert spec.layer_types == ("sliding",) * 3 + ("full",) and spec.nope_layers == (3,) and spec.sliding_window == 8
    other = read(TINY["cohere2-biased-untied"])
    assert other.qkv_bias and other.out_bias and not other.tied_embeddings and other.logit_scale is None
    assert other.nope_layers == (1, 3)
    plain = read(TINY["cohere2-all-full"])  # no layer slides: none rotates (as transformers applies RoPE)
    assert plain.layer_types is None and plain.nope_layers == (0, 1, 2, 3) and plain.num_kv_heads == 4


def test_one_norm_a_layer_in_the_cost_model():
    spec = read(TINY["cohere2"])
    ops = {o.name: o for o in ForwardModel(model=spec, precision=Precision.uniform("bf16")).forward_ops(2, 1, 50)}
    assert "mlp_norm" not in ops and "attn_norm" in ops
    assert ops["attn_norm"].per_layer and ops["attn_norm"].weight_bytes == 64 * 2  # a layer's: a weight, no bias
    assert ops["attn_norm"].flops == 2 * 64 * 6


# the tests every type shares: tiny parameters exact, KV widths, transformers' save read back, refusals in one
# line, junk a spec or one error, the simulator's static batch, `llmperf estimate` on a saved config directory
globals().update(hf_type_checks(
    TINY,
    refused=[
        (dict(_BASE, head_dim=32), "head_dim=32 is not modelled (Cohere2Config sets it to hidden_size / "
                                   "num_attention_heads = 16)"),
        (dict(_BASE, logit_scale=-1.0), "logit_scale"),
        (dict(_BASE, sliding_window_pattern=0), "sliding_window_pattern must be a positive integer, got 0"),
        (dict(_BASE, use_qk_norm=True), "use_qk_norm=True is not modelled"),
        (dict(_BASE, sliding_window=None), "sliding_window=None is not modelled (transformers' Cohere2Model builds"),
    ],
    junk=[("logit_scale", "x"), ("layer_types", ["sliding_attention"]), ("sliding_window", 0),
          ("layer_norm_eps", float("nan"))],
    junk_config=lambda key, value: dict(TINY["cohere2"], **{key: value}),
    simulated=["cohere2", "cohere2-all-full"],
    estimate=("cohere2", 4 * 2 * 2 * 16 * 2),  # layers x K,V x kv heads x head_dim x fp16 (S < window)
))
