"""Phi-3 / Phi-4-mini (`phi3`): read with Phi3Config's defaults for absent keys (its fused qkv_proj and
gate_up_proj are the same GEMMs as q/k/v and gate/up), parameters exact against transformers (tiny structures
and the class defaults, on the meta device), partial rotary positions, longrope (and `su` / `yarn`, which
transformers reads as longrope) with its short and long factors kept, a sliding window on every layer, KV
widths as transformers' cache fills them, transformers' own save read back, refusals by name, the simulator's
static batch priced as `estimate`, and `llmperf estimate` on a saved config directory. (The engine:
tests/engine/test_phi3_engine.py.)"""

from __future__ import annotations

import json
import re

import pytest

from llmperf.errors import SpecError
from llmperf.specs.hf import model_spec_from_hf_config
from tests.analysis.model_checks import (
    assert_read_or_one_error,
    assert_saved_config_reads_back,
    assert_simulated_static_batch_is_estimate,
    checkpoint_count,
    hf_model,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

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


def read(cfg: dict):  # noqa: ANN201
    return model_spec_from_hf_config(json.loads(json.dumps(cfg)), name="t")


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_param_count_is_exact(name):
    assert read(TINY[name]).param_count == checkpoint_count(hf_model(TINY[name]))


def test_the_config_class_defaults_are_exact():
    cfg = transformers.AutoConfig.for_model("phi3").to_dict()
    spec = read(cfg)
    assert spec.param_count == checkpoint_count(hf_model({"model_type": "phi3"}))
    assert read({"model_type": "phi3"}).param_count == spec.param_count
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


@pytest.mark.parametrize("name", sorted(TINY))
def test_kv_width_matches_the_cache(name):
    spec = read(TINY[name])
    model = hf_model(TINY[name], device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (1, 5)), use_cache=True).past_key_values
    assert len(cache.layers) == spec.num_layers
    for layer in cache.layers:
        width = layer.keys.shape[1] * layer.keys.shape[3] + layer.values.shape[1] * layer.values.shape[3]
        assert layer.keys.shape[2] == 5 and width == spec.kv_width_per_token_per_layer


@pytest.mark.parametrize("name", sorted(TINY))
def test_saved_by_transformers_reads_back(name, tmp_path):
    from llmperf.specs.hf import read_hf_config
    assert_saved_config_reads_back(read, TINY[name], tmp_path)
    _, keys = read_hf_config(dict(TINY[name]), "t", "config")  # every key but the token ids (no math)
    assert set(TINY[name]) - keys == {"pad_token_id", "bos_token_id", "eos_token_id"}


@pytest.mark.parametrize("cfg, needle", [
    (dict(_BASE, rope_parameters=dict(rope_type="linear", factor=2.0)),
     "rope_scaling.rope_type='linear' is not modelled (Phi3Config takes default or longrope)"),
    (dict(_BASE, partial_rotary_factor=0.5, rope_parameters=dict(_LONGROPE, short_factor=[1.0] * 8)),
     "rope_scaling.short_factor must list rotary_dim / 2 = 4 factors"),
    (dict(_BASE, partial_rotary_factor=1.5), "partial_rotary_factor must be in (0, 1], got 1.5"),
])
def test_refused_by_name_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        read(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key, value", [("short_factor", "x"), ("long_factor", [1.0, None, 2.0, 3.0]),
                                        ("original_max_position_embeddings", -3), ("rope_theta", "big")])
def test_junk_gives_a_spec_or_one_error(key, value):
    assert_read_or_one_error(read, dict(TINY["phi3-longrope"], rope_parameters=dict(_LONGROPE, **{key: value})))


@pytest.mark.parametrize("name", ["phi3", "phi3-longrope"])
def test_the_simulator_prices_a_static_batch_as_estimate(name):
    assert_simulated_static_batch_is_estimate(read(TINY[name]))


def test_estimate_reads_a_saved_config_dir(tmp_path):
    from typer.testing import CliRunner

    from llmperf.cli import app
    hf_model(TINY["phi3"]).config.save_pretrained(tmp_path)
    r = CliRunner().invoke(app, ["estimate", str(tmp_path), "-f", "json"])
    assert r.exit_code == 0, r.output
    row, = json.loads(r.stdout)["configurations"]
    assert row["kv_bytes_per_token"] == 3 * 2 * 2 * 16 * 2  # layers x K,V x kv heads x head_dim x fp16
