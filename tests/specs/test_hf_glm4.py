"""GLM-4-0414 (`glm4`): read with Glm4Config's defaults for absent keys (partial_rotary_factor 0.5, q/k/v biases),
four norms a layer (`sandwich_norms`), rotary pairs adjacent; parameters exact against transformers (tiny
structures and the class defaults, on the meta device), KV widths as transformers' cache fills them,
transformers' own save read back, a sliding window refused by name, the simulator's static batch priced as
`estimate`, and `llmperf estimate` on a saved config directory. (The engine: tests/engine/test_glm4_engine.py.)"""

from __future__ import annotations

import json
import re

import pytest

from llmperf.errors import SpecError
from llmperf.specs.hf import model_spec_from_hf_config, read_hf_config
from tests.analysis.model_checks import (
    assert_read_or_one_error,
    assert_saved_config_reads_back,
    assert_simulated_static_batch_is_estimate,
    checkpoint_count,
    hf_model,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_BASE = dict(model_type="glm4", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_hidden_layers=3, max_position_embeddings=256,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
TINY = {
    "glm4": _BASE,
    "glm4-no-bias-tied": dict(_BASE, attention_bias=False, tie_word_embeddings=True, partial_rotary_factor=0.25,
                              head_dim=32),
}


def read(cfg: dict):  # noqa: ANN201
    return model_spec_from_hf_config(json.loads(json.dumps(cfg)), name="t")


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_param_count_is_exact(name):
    assert read(TINY[name]).param_count == checkpoint_count(hf_model(TINY[name]))


def test_the_config_class_defaults_are_exact():
    cfg = transformers.AutoConfig.for_model("glm4").to_dict()
    spec = read(cfg)
    assert spec.param_count == checkpoint_count(hf_model({"model_type": "glm4"}))
    assert read({"model_type": "glm4"}).param_count == spec.param_count
    assert (spec.rotary_dim, spec.qkv_bias, spec.out_bias, spec.norm_eps) == (64, True, False, 1.5625e-07)


def test_structure_read():
    spec = read(TINY["glm4"])
    assert spec.sandwich_norms and spec.rope_interleaved and not spec.norm_offset and spec.rotary_dim == 8
    other = read(TINY["glm4-no-bias-tied"])
    assert other.rotary_dim == 8 and not other.qkv_bias and other.tied_embeddings


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
    assert_saved_config_reads_back(read, TINY[name], tmp_path)
    _, keys = read_hf_config(dict(TINY[name]), "t", "config")  # every key but the token ids (no math)
    assert set(TINY[name]) - keys == {"pad_token_id", "bos_token_id", "eos_token_id"}


@pytest.mark.parametrize("cfg, needle", [
    (dict(_BASE, sliding_window=8), "sliding_window=8 is not modelled (glm4 has no sliding-window attention)"),
    (dict(_BASE, partial_rotary_factor=0.0), "partial_rotary_factor must be in (0, 1], got 0.0"),
    (dict(_BASE, attention_bias="yes"), "attention_bias must be true or false, got 'yes'"),
])
def test_refused_by_name_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        read(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key, value", [("partial_rotary_factor", "half"), ("head_dim", 0), ("rms_norm_eps", -1.0),
                                        ("num_key_value_heads", 3)])
def test_junk_gives_a_spec_or_one_error(key, value):
    assert_read_or_one_error(read, dict(_BASE, **{key: value}))


def test_the_simulator_prices_a_static_batch_as_estimate():
    assert_simulated_static_batch_is_estimate(read(TINY["glm4"]))


def test_estimate_reads_a_saved_config_dir(tmp_path):
    from typer.testing import CliRunner

    from llmperf.cli import app
    hf_model(TINY["glm4"]).config.save_pretrained(tmp_path)
    r = CliRunner().invoke(app, ["estimate", str(tmp_path), "-f", "json"])
    assert r.exit_code == 0, r.output
    row, = json.loads(r.stdout)["configurations"]
    assert row["kv_bytes_per_token"] == 3 * 2 * 2 * 16 * 2  # layers x K,V x kv heads x head_dim x fp16
