"""Qwen1.5-MoE / Qwen2-MoE (`qwen2_moe`): read with Qwen2MoeConfig's defaults for absent keys (60 experts, top-4,
a shared expert behind a sigmoid gate, q/k/v biases from `qkv_bias`), dense `mlp_only_layers` and
`decoder_sparse_step`, sliding layers under use_sliding_window; parameters exact against transformers (tiny
structures and the class defaults, on the meta device), KV widths as transformers' cache fills them,
transformers' own save read back, refusals by name, the simulator's static batch priced as `estimate`, and
`llmperf estimate` on a saved config directory. (The engine: tests/engine/test_qwen2_moe_engine.py.)"""

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

_BASE = dict(model_type="qwen2_moe", vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=4, max_position_embeddings=256, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2)
TINY = {
    "qwen2_moe": dict(_BASE, mlp_only_layers=[0], decoder_sparse_step=1),
    "qwen2_moe-step2-sliding": dict(_BASE, decoder_sparse_step=2, use_sliding_window=True, sliding_window=8,
                                    max_window_layers=3, qkv_bias=False, norm_topk_prob=True),
}


def read(cfg: dict):  # noqa: ANN201
    return model_spec_from_hf_config(json.loads(json.dumps(cfg)), name="t")


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_param_count_is_exact(name):
    assert read(TINY[name]).param_count == checkpoint_count(hf_model(TINY[name]))


def test_the_config_class_defaults_are_exact():
    cfg = transformers.AutoConfig.for_model("qwen2_moe").to_dict()
    spec = read(cfg)
    assert spec.param_count == checkpoint_count(hf_model({"model_type": "qwen2_moe"}))
    assert read({"model_type": "qwen2_moe"}).param_count == spec.param_count
    assert (spec.num_experts, spec.experts_per_token, spec.shared_experts, spec.shared_ffn_size) == (60, 4, 1, 5632)
    assert spec.shared_expert_gate and spec.qkv_bias and not spec.out_bias and spec.layer_types is None


def test_structure_read():
    spec = read(TINY["qwen2_moe"])
    assert spec.dense_layers == (0,) and spec.moe_ffn_size == 32 and not spec.router_renormalize
    other = read(TINY["qwen2_moe-step2-sliding"])
    assert other.dense_layers == (0, 2) and other.router_renormalize and not other.qkv_bias
    assert other.layer_types == ("sliding", "full", "sliding", "full") and other.sliding_window == 8


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
    assert_saved_config_reads_back(read, TINY[name], tmp_path, every_key_read=True)


@pytest.mark.parametrize("cfg, needle", [
    (dict(_BASE, num_experts_per_tok=9), "num_experts_per_tok=9 exceeds the 8 routed experts"),
    (dict(_BASE, decoder_sparse_step=0), "decoder_sparse_step must be a positive integer, got 0"),
    (dict(_BASE, mlp_only_layers=[7]), "mlp_only_layers"),
])
def test_refused_by_name_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        read(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key, value", [("qkv_bias", "yes"), ("num_experts", 1), ("shared_expert_intermediate_size", 0),
                                        ("norm_topk_prob", 2)])
def test_junk_gives_a_spec_or_one_error(key, value):
    assert_read_or_one_error(read, dict(_BASE, **{key: value}))


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_simulator_prices_a_static_batch_as_estimate(name):
    assert_simulated_static_batch_is_estimate(read(TINY[name]))


def test_estimate_reads_a_saved_config_dir(tmp_path):
    from typer.testing import CliRunner

    from llmperf.cli import app
    hf_model(TINY["qwen2_moe"]).config.save_pretrained(tmp_path)
    r = CliRunner().invoke(app, ["estimate", str(tmp_path), "-f", "json"])
    assert r.exit_code == 0, r.output
    row, = json.loads(r.stdout)["configurations"]
    assert row["kv_bytes_per_token"] == 4 * 2 * 2 * 16 * 2  # layers x K,V x kv heads x head_dim x fp16
