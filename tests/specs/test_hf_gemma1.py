"""Gemma 1 (`gemma`): read with GemmaConfig's defaults for absent keys (head_dim 256, 16 KV heads, a tied head,
GeGLU; a legacy `gelu` read as gelu_pytorch_tanh, as GemmaConfig does), parameters exact against transformers
(tiny structures and the class defaults, on the meta device), KV widths as transformers' cache fills them,
transformers' own save read back, refusals by name, the simulator's static batch priced as `estimate`, and
`llmperf estimate` on a saved config directory. (The engine: tests/engine/test_gemma1_engine.py.)"""

from __future__ import annotations

import pytest

from tests.analysis.model_checks import hf_type_checks, spec_at_class_defaults
from tests.analysis.model_checks import read_config as read

pytest.importorskip("torch")
pytest.importorskip("transformers")

_BASE = dict(model_type="gemma", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, num_hidden_layers=3, max_position_embeddings=256,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
TINY = {
    "gemma": _BASE,
    "gemma-mqa-biased-untied": dict(_BASE, num_key_value_heads=1, attention_bias=True, tie_word_embeddings=False,
                                    hidden_act="gelu"),
}


def test_the_config_class_defaults_are_exact():
    spec = spec_at_class_defaults("gemma")
    assert (spec.head_dim, spec.num_kv_heads, spec.tied_embeddings, spec.hidden_act) == (256, 16, True,
                                                                                        "gelu_pytorch_tanh")


def test_structure_read():
    spec = read(TINY["gemma"])
    assert spec.embedding_scale and spec.norm_offset and spec.ffn_kind == "swiglu" and not spec.sandwich_norms
    other = read(TINY["gemma-mqa-biased-untied"])
    assert other.qkv_bias and other.out_bias and not other.tied_embeddings and other.hidden_act == "gelu_pytorch_tanh"


# the tests every type shares: tiny parameters exact, KV widths, transformers' save read back, refusals in one
# line, junk a spec or one error, the simulator's static batch, `llmperf estimate` on a saved config directory
globals().update(hf_type_checks(
    TINY,
    refused=[
        (dict(_BASE, use_bidirectional_attention=True), "use_bidirectional_attention=True is not modelled"),
        (dict(_BASE, hidden_activation="relu"), "hidden_activation='relu' is not modelled (GemmaConfig computes with "
                                                "hidden_act='gelu_pytorch_tanh')"),
        (dict(_BASE, sliding_window=8), "sliding_window=8 is not modelled (gemma has no sliding-window attention)"),
    ],
    junk=[("hidden_act", 3), ("head_dim", -1), ("attention_bias", "no"), ("num_key_value_heads", 3)],
    junk_config=lambda key, value: dict(_BASE, **{key: value}),
    estimate=("gemma", 3 * 2 * 2 * 32 * 2),  # layers x K,V x kv heads x head_dim x fp16
))
