"""DeepSeek-V4 (`deepseek_v4`): read from its config.json (the class's defaults for absent keys, the legacy keys
DeepseekV4Config folds in) into a spec whose parameters are exactly what transformers' DeepseekV4ForCausalLM
builds plus the persistent buffers its checkpoint holds (the scored layers' e_score_correction_bias, the hash
layers' tid2eid table), on the meta device at the class's default shape and on tiny structures of our own;
what transformers builds otherwise than the config says is refused by name. Its KV cache is what
transformers holds, byte for byte; `estimate`, `simulate` and `plan` price it, the engine refuses it by name."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.errors import SpecError
from llmperf.specs import ModelSpec
from llmperf.specs.hf import HF_CONFIG_FIELDS, HF_REFUSED_FIELDS, model_spec_from_hf_config, read_hf_config
from tests.analysis.model_checks import checkpoint_count, hf_model

#: a tiny structure of our own: each attention kind, two hash-routed layers, three residual streams
TINY = dict(model_type="deepseek_v4", vocab_size=300, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=5,
            num_attention_heads=4, head_dim=32, q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=2,
            o_groups=2, o_lora_rank=24, index_n_heads=2, index_head_dim=16, index_topk=3, sliding_window=8,
            hc_mult=3, hc_sinkhorn_iters=5, max_position_embeddings=512,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                         "compressed_sparse_attention", "sliding_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"])
_LEGACY = {k: v for k, v in TINY.items() if k not in ("layer_types", "compress_rates", "mlp_layer_types")}
STRUCTURES = {
    "tiny": TINY,
    # the legacy keys DeepseekV4Config's __post_init__ folds in
    "legacy": dict(_LEGACY, compress_ratios=[128, 4, 0, 4, 128], compress_rate_csa=8, compress_rate_hca=32,
                   num_hash_layers=1, qk_rope_head_dim=8),
    "default-schedule": dict(_LEGACY, num_hidden_layers=6),  # two hca, then hca / csa; three hash layers
    "sliding-only": dict(_LEGACY, layer_types=["sliding_attention"] * 5, hc_mult=1),
    "all-hash-tied": dict(_LEGACY, mlp_layer_types=["hash_moe"] * 5, tie_word_embeddings=True, o_groups=4),
    "longer-lists": dict(TINY, num_hidden_layers=3),  # transformers keeps the first num_hidden_layers entries
}


def read(cfg: dict) -> ModelSpec:
    return model_spec_from_hf_config(json.loads(json.dumps(cfg)), name="t")


def test_the_class_default_shape_is_exact():
    transformers = pytest.importorskip("transformers")
    full = transformers.AutoConfig.for_model("deepseek_v4").to_dict()
    spec, bare = read(full), read({"model_type": "deepseek_v4"})
    assert spec.param_count == bare.param_count == checkpoint_count(hf_model({"model_type": "deepseek_v4"}))
    kinds = spec.layer_types
    assert (kinds[:3], kinds.count("csa"), kinds.count("hca"), "sliding" in kinds) == (("hca",) * 3, 20, 23, False)
    assert spec.hash_moe_layers == (0, 1, 2) and spec.num_moe_layers == 43 and spec.shared_experts == 1
    assert (spec.num_kv_heads, spec.head_dim, spec.rotary_dim, spec.sliding_window) == (1, 512, 64, 128)
    assert (spec.csa_rate, spec.hca_rate, spec.hc_mult, spec.hc_sinkhorn_iters) == (4, 128, 4, 20)
    assert (spec.router_scoring, spec.router_scale, spec.mtp_layers, spec.attn_sinks) == ("sqrtsoftplus", 1.5, 1, True)


@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_tiny_structures_are_exact(name):
    cfg = STRUCTURES[name]
    spec = read(cfg)
    model = hf_model(cfg)
    assert spec.param_count == checkpoint_count(model)
    c = model.config
    names = {"sliding_attention": "sliding", "compressed_sparse_attention": "csa",
             "heavily_compressed_attention": "hca"}
    assert list(spec.layer_types) == [names[t] for t in c.layer_types]
    assert spec.hash_moe_layers == tuple(i for i, t in enumerate(c.mlp_layer_types) if t == "hash_moe")
    assert spec.rotary_dim == c.qk_rope_head_dim
    assert spec.tied_embeddings == (model.lm_head.weight is model.model.embed_tokens.weight)
    for kind, rate in (("csa", "compressed_sparse_attention"), ("hca", "heavily_compressed_attention")):
        assert getattr(spec, f"{kind}_rate") == (c.compress_rates[rate] if kind in spec.layer_types else None)


def test_the_counted_buffers_are_the_checkpoints():
    """The persistent buffers: a scored layer's correction bias (one fp32 an expert), a hash layer's token table
    (vocab x top-k); the rotary tables are not saved."""
    model = hf_model(TINY)
    saved = {n for n in model.state_dict() if not any(n == p for p, _ in model.named_parameters())}
    assert {n.split(".", 3)[3] for n in saved} == {"mlp.gate.e_score_correction_bias", "mlp.gate.tid2eid"}
    spec = read(TINY)
    hashed, scored = (next(k for k in spec.layer_kinds() if k.hash_router == h) for h in (True, False))
    assert spec.router_table_params(hashed) == 300 * 2 - 8 and spec.router_table_params(scored) == 0


def test_saved_by_transformers_reads_back(tmp_path):
    for name in ("tiny", "legacy"):
        hf_model(STRUCTURES[name]).config.save_pretrained(tmp_path / name)
        back, spec = ModelSpec.from_hf_config(tmp_path / name), read(STRUCTURES[name])
        assert back.param_count == spec.param_count and back.layer_kinds() == spec.layer_kinds()
        assert (back.rotary_dim, back.rope_theta) == (spec.rotary_dim, spec.rope_theta)
        _, keys = read_hf_config(json.loads((tmp_path / name / "config.json").read_text()), "t", "config")
        assert keys <= set(HF_CONFIG_FIELDS) | set(HF_REFUSED_FIELDS), keys - set(HF_CONFIG_FIELDS)


def test_every_key_of_the_tiny_configs_is_read():
    for cfg in STRUCTURES.values():
        _, keys = read_hf_config(json.loads(json.dumps(cfg)), "t", "config")
        assert keys <= set(HF_CONFIG_FIELDS) | set(HF_REFUSED_FIELDS), keys - set(HF_CONFIG_FIELDS)
        assert set(cfg) <= keys, set(cfg) - keys


@pytest.mark.parametrize("change,needle", [
    ({"num_key_value_heads": 2}, "num_key_value_heads=2 is not modelled (transformers builds one shared K = V head)"),
    ({"attention_bias": True}, "attention_bias=True is not modelled"),
    ({"mlp_bias": True}, "mlp_bias=True is not modelled"),
    ({"n_shared_experts": 2}, "n_shared_experts=2 is not modelled"),
    ({"expert_dtype": "fp4"}, "expert_dtype='fp4' is not modelled"),
    ({"quantization_config": {"quant_method": "fp8", "expert_dtype": "fp4"}}, "expert_dtype='fp4' is not modelled"),
    ({"layer_types": ["sliding_attention"] * 4}, "layer_types must list num_hidden_layers=5 entries"),
    ({"layer_types": ["full_attention"] * 5}, "layer_types holds 'full_attention'"),
    ({"layer_types": None, "compress_ratios": [0, 8, 0, 0, 0]}, "compress_ratios must list"),
    ({"mlp_layer_types": ["dense"] * 5}, "mlp_layer_types holds 'dense'"),
    ({"compress_rates": {"compressed_sparse_attention": 4}}, "compress_rates has no rate for the "
                                                             "heavily_compressed_attention layers"),
    ({"scoring_func": "relu"}, "scoring_func='relu' is not modelled"),
    ({"rope_parameters": {"rope_type": "ntk"}}, "rope_parameters.compress.rope_type='ntk' is not modelled"),
    ({"o_groups": 3}, "o_groups=3 does not divide num_heads x head_dim=128"),
])
def test_refused_by_name(change, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        read({**TINY, **change})
    assert "\n" not in str(info.value)


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 600), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=4), st.lists(st.sampled_from([0, 4, 128, 7]), max_size=6),
                  st.lists(st.sampled_from(["sliding_attention", "compressed_sparse_attention", "moe", "hash_moe",
                                            "heavily_compressed_attention", "full_attention"]), max_size=6),
                  st.dictionaries(st.sampled_from(["compressed_sparse_attention", "heavily_compressed_attention",
                                                   "main", "compress", "rope_type", "rope_theta", "factor"]),
                                  st.one_of(st.integers(-1, 130), st.sampled_from(["yarn", "default", "ntk"]),
                                            st.dictionaries(st.sampled_from(["rope_type", "rope_theta"]),
                                                            st.sampled_from(["yarn", "x", 1e4, -1]), max_size=2)),
                                  max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(STRUCTURES)), st.data())
def test_junk_gives_a_spec_or_one_spec_error(name, data):
    """Junk in any key DeepSeek-V4 reads (its legacy keys too): a spec with its parameters, or one SpecError
    line, never another exception."""
    keys = {"expert_dtype", "quantization_config", "rope_scaling", "rope_parameters", "tie_word_embeddings"}
    for cfg in STRUCTURES.values():
        keys |= read_hf_config(json.loads(json.dumps(cfg)), "t", "config")[1]
    changed = dict(STRUCTURES[name])
    for key in data.draw(st.lists(st.sampled_from(sorted(keys - {"model_type"})), min_size=1, max_size=3,
                                  unique=True)):
        changed[key] = data.draw(_JUNK)
    try:
        spec = read(changed)
    except SpecError as exc:
        assert "\n" not in str(exc)
    else:
        assert spec.param_count > spec.active_param_count > 0


def test_estimate_simulate_and_plan_price_a_saved_config(tmp_path):
    """`llmperf estimate`, `simulate` and `plan` on transformers' own save of the config print their tables, naming
    their time model; plain tensor parallelism is refused by name (DeepSeek-V4's attention runs whole on a GPU:
    dp_attention)."""
    from typer.testing import CliRunner

    from llmperf.cli import app

    hf_model(TINY).config.save_pretrained(tmp_path)
    result = CliRunner().invoke(app, ["estimate", str(tmp_path), "-H", "h100-sxm", "-p", "40", "-g", "4"])
    assert result.exit_code == 0, result.output
    assert "time model" in result.output and "compressed-4 layers x2" in result.output
    result = CliRunner().invoke(app, ["estimate", str(tmp_path), "-H", "h100-sxm", "--tp", "2"])
    assert result.exit_code == 2 and "tp: DeepSeek-V4's attention" in result.output, result.output
    small = ["--requests", "12", "--prompt-len", "uniform:20:200", "--output-len", "uniform:2:20"]
    result = CliRunner().invoke(app, ["simulate", str(tmp_path), "-H", "h100-sxm", "--rate", "5", *small])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "time model" in text and "DeepSeek-V4's window and compressed entries" in text
    result = CliRunner().invoke(app, ["plan", str(tmp_path), "--rate", "2", "-H", "h100-sxm", "--precisions", "bf16",
                                      "--tp", "1", "--slo-ttft", "2", "--slo-tpot", "0.5", *small, "-f", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["rows"] and all(r["time_model"] for r in doc["rows"]) and any(r["feasible"] for r in doc["rows"])


def test_the_engine_refuses_it_by_name():
    from llmperf.engine.parts import check_buildable

    spec = read(TINY)
    with pytest.raises(SpecError, match=r"o_groups=2: DeepSeek-V4's cache is a window plus compressed entries"):
        spec.kv_width_per_token_per_layer  # noqa: B018
    with pytest.raises(SpecError, match="kv_window: DeepSeek-V4's cache"):
        spec.kv_cache("bf16").from_model(spec, "bf16", window="full")
    with pytest.raises(SpecError, match=r"hc_mult=2: DeepSeek-V4's hyper-connections"):
        ModelSpec(name="hc", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, max_positions=128,
                  hc_mult=2)
    with pytest.raises(ValueError, match="o_groups: the engine does not build DeepSeek-V4's layers"):
        check_buildable(spec)


@pytest.mark.parametrize("name", sorted(STRUCTURES) + ["class-default"])
@pytest.mark.parametrize("kv", ["bf16", "fp8", "fp32"])
def test_the_kv_cache_is_what_transformers_holds(name, kv):
    """`KVCacheSpec.from_model`'s bytes a sequence = `deepseek_v4_cache_elements` x the KV element's bytes, the
    csa layers' overlap gate at fp32 (the compressors' position_bias dtype), at contexts around the window and
    the rates; paged, whole blocks of each paged group (the partial windows exactly)."""
    from llmperf.specs.kvcache import KVCacheSpec, deepseek_v4_cache_elements
    from llmperf.specs.precision import dtype_bytes

    spec = read(STRUCTURES.get(name, {"model_type": "deepseek_v4"}))
    cache, e = KVCacheSpec.from_model(spec, kv), dtype_bytes(kv)
    n_csa, m = spec.layer_types.count("csa"), spec.csa_rate
    for context in (0, 1, 3, 4, 7, 8, 9, 16, 17, 40, 131, 8192, 131072):
        parts = deepseek_v4_cache_elements(spec, context)
        gate = n_csa * m * (spec.head_dim + spec.index_head_dim) if n_csa and context >= m else 0
        assert cache.bytes_for_context(context) == pytest.approx(sum(parts.values()) * e + gate * (4 - e), rel=1e-12)
    paged = cache.paged_bytes_for_context(40, 16)
    assert paged == sum(g.paged_tokens(40, 16) * g.bytes_per_token for g in cache.groups) >= cache.bytes_for_context(40)


@pytest.mark.parametrize("context,decoded", [(1, 0), (3, 0), (4, 0), (7, 0), (8, 0), (17, 0), (40, 0), (6, 3),
                                             (15, 2)])
def test_the_cache_elements_are_transformers(context, decoded):
    """What transformers' caches hold after a prompt of `context` tokens (two sequences) and `decoded` steps of
    one token, part by part, against `deepseek_v4_cache_elements`: a sliding layer's K and V apart, a compressed
    layer's one tensor."""
    torch = pytest.importorskip("torch")
    from llmperf.specs.kvcache import deepseek_v4_cache_elements

    torch.manual_seed(0)
    model = hf_model(TINY, device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 300, (2, context)), use_cache=True).cache
        for _ in range(decoded):
            cache = model(torch.randint(0, 300, (2, 1)), cache=cache, use_cache=True).cache
    held = dict.fromkeys(("window", "compressed", "indexer_keys", "partial_windows"), 0)
    for layer in cache.layers:
        same = layer.values.data_ptr() == layer.keys.data_ptr()
        held["window"] += layer.keys.numel() + (0 if same else layer.values.numel())
        for part, states in (("compressed", "compressed_kv"), ("partial_windows", "buffer_kv"),
                             ("partial_windows", "buffer_gate"), ("partial_windows", "overlap_kv"),
                             ("partial_windows", "overlap_gate")):
            for name, t in (getattr(layer, states, None) or {}).items():
                if t is not None:
                    held["indexer_keys" if (part, name) == ("compressed", "indexer") else part] += t.numel()
    assert {k: v // 2 for k, v in held.items()} == deepseek_v4_cache_elements(read(TINY), context + decoded)


@pytest.mark.parametrize("change,needle", [
    (dict(layer_types=("csa", "sliding"), o_groups=None, o_lora_rank=None, q_lora_rank=None, index_topk=None,
          index_n_heads=None, index_head_dim=None, csa_rate=None), "csa needs o_groups (DeepSeek-V4's attention)"),
    (dict(o_groups=None), "index_topk (DeepSeek Sparse Attention) needs multi-head latent attention with "
                          "q_lora_rank (or DeepSeek-V4's attention, o_groups)"),
    (dict(num_kv_heads=2, num_heads=4), "has one shared K = V head and no qk_norm, got num_kv_heads=2"),
    (dict(o_lora_rank=None), "o_groups (DeepSeek-V4's attention) needs q_lora_rank and o_lora_rank"),
    (dict(hca_rate=None, layer_types=("hca", "sliding")), "layer_types has hca layers but hca_rate is not set"),
    (dict(index_topk=None, index_n_heads=None, index_head_dim=None), "layer_types has csa layers but index_topk"),
    (dict(hash_moe_layers=(1,), dense_layers=(1,)), "hash_moe_layers holds layer 1, which is not a mixture"),
    (dict(hc_mult=None), "hc_sinkhorn_iters=5 needs hc_mult"),
    (dict(sliding_window=None, layer_types=("hca", "csa")), "layer_types has csa layers but sliding_window is not set"),
])
def test_the_spec_checks_its_fields(change, needle):
    """A spec written by hand (a YAML file) is held to the same structure, one line naming the field."""
    from dataclasses import replace

    with pytest.raises(SpecError, match=re.escape(needle)):
        replace(read({**TINY, "num_hidden_layers": 2}), **change)


def test_the_engine_refuses_sqrtsoftplus_routing_by_name():
    """A spec scoring experts by sqrtsoftplus (DeepSeek-V4's) without the rest of DeepSeek-V4: the engine's MoE
    check names router_scoring."""
    from llmperf.engine.parts import check_buildable

    spec = ModelSpec(name="sq", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                     max_positions=128, num_experts=4, experts_per_token=2, router_scoring="sqrtsoftplus")
    with pytest.raises(ValueError, match="router_scoring: the engine scores experts by softmax or sigmoid, got "
                                         "'sqrtsoftplus'"):
        check_buildable(spec)
