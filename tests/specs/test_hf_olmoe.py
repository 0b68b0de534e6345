"""OLMoE (`olmoe`): read with OlmoeConfig's defaults for absent keys (64 experts of intermediate_size, top-8, MHA),
q and k each RMS-normed across all their heads, every layer MoE; parameters exact against transformers (tiny
structures and the class defaults, on the meta device), KV widths as transformers' cache fills them,
transformers' own save read back, refusals by name (`clip_qkv`), the simulator's static batch priced as
`estimate`, and `llmperf estimate` on a saved config directory. (The engine: tests/engine/test_olmoe_engine.py.)"""

from __future__ import annotations

import json
import re

import pytest

from llmperf.analysis import ForwardModel
from llmperf.errors import SpecError
from llmperf.specs import Precision
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

_BASE = dict(model_type="olmoe", vocab_size=128, hidden_size=64, intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=3, max_position_embeddings=256, num_experts=8,
             num_experts_per_tok=2, pad_token_id=None, bos_token_id=None, eos_token_id=None)
TINY = {
    "olmoe": _BASE,
    "olmoe-mha-renormalised": dict(_BASE, num_key_value_heads=None, norm_topk_prob=True, attention_bias=True),
}


def read(cfg: dict):  # noqa: ANN201
    return model_spec_from_hf_config(json.loads(json.dumps(cfg)), name="t")


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_param_count_is_exact(name):
    assert read(TINY[name]).param_count == checkpoint_count(hf_model(TINY[name]))


def test_the_config_class_defaults_are_exact():
    cfg = transformers.AutoConfig.for_model("olmoe").to_dict()
    spec = read(cfg)
    assert spec.param_count == checkpoint_count(hf_model({"model_type": "olmoe"}))
    assert read({"model_type": "olmoe"}).param_count == spec.param_count
    assert (spec.num_experts, spec.experts_per_token, spec.num_kv_heads, spec.expert_ffn_size) == (64, 8, 16, 2048)


def test_structure_read():
    spec = read(TINY["olmoe"])
    assert spec.qk_norm == "rmsnorm_across_heads" and spec.num_moe_layers == 3 and not spec.router_renormalize
    assert spec.qk_norm_gathered  # vLLM's OlmoeAttention all-gathers q and k under tensor parallelism
    ops = {o.name for o in ForwardModel(model=spec, precision=Precision.uniform("bf16"), tp=2).forward_ops(2, 1, 50)}
    assert "qk_norm_gather" in ops and "qk_norm_allreduce" not in ops
    other = read(TINY["olmoe-mha-renormalised"])
    assert other.router_renormalize and other.num_kv_heads == 4 and other.qkv_bias and other.out_bias


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
    (dict(_BASE, clip_qkv=8.0), "clip_qkv=8.0 is not modelled (the clamp of q, k and v is not built)"),
    (dict(_BASE, head_dim=32), "head_dim=32 is not modelled (OLMoE's q norm spans hidden_size: head_dim is 16)"),
    (dict(_BASE, num_experts_per_tok=9), "num_experts_per_tok=9 exceeds the 8 routed experts"),
])
def test_refused_by_name_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        read(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key, value", [("clip_qkv", "x"), ("num_experts", 1), ("norm_topk_prob", "no"),
                                        ("intermediate_size", 0)])
def test_junk_gives_a_spec_or_one_error(key, value):
    assert_read_or_one_error(read, dict(_BASE, **{key: value}))


def test_the_simulator_prices_a_static_batch_as_estimate():
    assert_simulated_static_batch_is_estimate(read(TINY["olmoe"]))


def test_estimate_reads_a_saved_config_dir(tmp_path):
    from typer.testing import CliRunner

    from llmperf.cli import app
    hf_model(TINY["olmoe"]).config.save_pretrained(tmp_path)
    r = CliRunner().invoke(app, ["estimate", str(tmp_path), "-f", "json"])
    assert r.exit_code == 0, r.output
    row, = json.loads(r.stdout)["configurations"]
    assert row["kv_bytes_per_token"] == 3 * 2 * 2 * 16 * 2  # layers x K,V x kv heads x head_dim x fp16
