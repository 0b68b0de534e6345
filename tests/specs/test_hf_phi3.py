"""Phi-3 / Phi-4-mini (`phi3`): read with Phi3Config's defaults for absent keys (its fused qkv_proj and
gate_up_proj are the same GEMMs as q/k/v and gate/up), parameters exact against transformers (tiny structures
and the class defaults, on the meta device), partial rotary positions, longrope (and `su` / `yarn`, which
transformers reads as longrope) with its short and long factors kept, a sliding window on every layer, KV
widths as transformers' cache fills them, transformers' own save read back, refusals by name, the simulator's
static batch priced as `estimate`, and `llmperf estimate` on a saved config directory. (The engine:
tests/engine/test_phi3_engine.py.)"""

from __future__ import annotations

import pytest

from tests.analysis.model_checks import hf_type_checks, spec_at_class_defaults
from tests.analysis.model_checks import read_config as read

pytest.importorskip("torch")
pytest.importorskip("transformers")

_BASE = dict(model_type="phi3", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=3, max_position_embeddings=256, pad_token_id=None,
             bos_token_id=None, eos_token_id=None)
_LONGROPE = dict(rope_type="longrope", short_factor=[1.0, 1.5, 2.0, 2.5], long_factor=[3.0, 4.0, 5.0, 6.0],
                 original_max_position_embeddings=64)
TINY = {
    "phi3": dict(_BASE, partial_rotary_factor=0.5, sliding_window=8),
    "phi3-longrope": dict(_BASE, partial_rotary_factor=0.5, rope_parameters=dict(_LONGROPE, rope_theta=5000.0)),
    "phi3-tied": dict(_BASE, num_key_value_heads=None, tie_word_embeddings=True),
}


def test_the_config_class_defaults_are_exact():
    spec = spec_at_class_defaults("phi3")
    assert (spec.num_kv_heads, spec.rotary_dim, spec.rope_scaling, spec.sliding_window) == (32, 96, None, None)


def test_structure_read():
    spec = read(TINY["phi3"])
    assert spec.rotary_dim == 8 and spec.sliding_window == 8 and not spec.qkv_bias and not spec.tied_embeddings
    long = read(TINY["phi3-longrope"])
    assert long.rope_theta == 5000.0 and long.rope_scaling["rope_type"] == "longrope"
    assert long.rope_scaling["long_factor"] == [3.0, 4.0, 5.0, 6.0]
    # transformers 4's spelling: top-level rope_scaling of type su (transformers reads it as longrope), and
    # original_max_position_embeddings at the top level
    su = dict(_BASE, partial_rotary_factor=0.5, original_max_position_embeddings=64,
              rope_scaling=dict(type="su", short_factor=[1.0] * 4, long_factor=[2.0] * 4))
    spec = read(su)
    assert spec.rope_scaling["rope_type"] == "longrope" and spec.rope_scaling["original_max_position_embeddings"] == 64
    assert read(TINY["phi3-tied"]).num_kv_heads == 4  # absent: multi-head, as Phi3Config builds it


# the tests every type shares: tiny parameters exact, KV widths, transformers' save read back, refusals in one
# line, junk (in longrope's parameters) a spec or one error, the simulator's static batch, `llmperf estimate` on a
# saved config directory
globals().update(hf_type_checks(
    TINY,
    refused=[
        (dict(_BASE, rope_parameters=dict(rope_type="linear", factor=2.0)),
         "rope_scaling.rope_type='linear' is not modelled (Phi3Config takes default or longrope)"),
        (dict(_BASE, partial_rotary_factor=0.5, rope_parameters=dict(_LONGROPE, short_factor=[1.0] * 8)),
         "rope_scaling.short_factor must list rotary_dim / 2 = 4 factors"),
        (dict(_BASE, partial_rotary_factor=1.5), "partial_rotary_factor must be in (0, 1], got 1.5"),
    ],
    junk=[("short_factor", "x"), ("long_factor", [1.0, None, 2.0, 3.0]), ("original_max_position_embeddings", -3),
          ("rope_theta", "big")],
    junk_config=lambda key, value: dict(TINY["phi3-longrope"], rope_parameters=dict(_LONGROPE, **{key: value})),
    simulated=["phi3", "phi3-longrope"],
    estimate=("phi3", 3 * 2 * 2 * 16 * 2),  # layers x K,V x kv heads x head_dim x fp16
))
