"""GLM-4-0414 (`glm4`): read with Glm4Config's defaults for absent keys (partial_rotary_factor 0.5, q/k/v biases),
four norms a layer (`sandwich_norms`), rotary pairs adjacent; parameters exact against transformers (tiny
structures and the class defaults, on the meta device), KV widths as transformers' cache fills them,
transformers' own save read back, a sliding window refused by name, the simulator's static batch priced as
`estimate`, and `llmperf estimate` on a saved config directory. (The engine: tests/engine/test_glm4_engine.py.)"""

from __future__ import annotations

import pytest

from tests.analysis.model_checks import hf_type_checks, spec_at_class_defaults
from tests.analysis.model_checks import read_config as read

pytest.importorskip("torch")
pytest.importorskip("transformers")

_BASE = dict(model_type="glm4", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_hidden_layers=3, max_position_embeddings=256,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
TINY = {
    "glm4": _BASE,
    "glm4-no-bias-tied": dict(_BASE, attention_bias=False, tie_word_embeddings=True, partial_rotary_factor=0.25,
                              head_dim=32),
}


def test_the_config_class_defaults_are_exact():
    spec = spec_at_class_defaults("glm4")
    assert (spec.rotary_dim, spec.qkv_bias, spec.out_bias, spec.norm_eps) == (64, True, False, 1.5625e-07)


def test_structure_read():
    spec = read(TINY["glm4"])
    assert spec.sandwich_norms and spec.rope_interleaved and not spec.norm_offset and spec.rotary_dim == 8
    other = read(TINY["glm4-no-bias-tied"])
    assert other.rotary_dim == 8 and not other.qkv_bias and other.tied_embeddings


# the tests every type shares: tiny parameters exact, KV widths, transformers' save read back, refusals in one
# line, junk a spec or one error, the simulator's static batch, `llmperf estimate` on a saved config directory
globals().update(hf_type_checks(
    TINY,
    refused=[
        (dict(_BASE, sliding_window=8), "sliding_window=8 is not modelled (glm4 has no sliding-window attention)"),
        (dict(_BASE, partial_rotary_factor=0.0), "partial_rotary_factor must be in (0, 1], got 0.0"),
        (dict(_BASE, attention_bias="yes"), "attention_bias must be true or false, got 'yes'"),
    ],
    junk=[("partial_rotary_factor", "half"), ("head_dim", 0), ("rms_norm_eps", -1.0), ("num_key_value_heads", 3)],
    junk_config=lambda key, value: dict(_BASE, **{key: value}),
    estimate=("glm4", 3 * 2 * 2 * 16 * 2),  # layers x K,V x kv heads x head_dim x fp16
))
