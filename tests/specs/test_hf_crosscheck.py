"""Every built-in model against Hugging Face `transformers`, the implementation its numbers must match.

For each built-in `ModelSpec` we build the equivalent `transformers` config, instantiate the model on
the meta device (shapes only, no memory: the 405B model builds in about half a second) and check:
- `spec.param_count` equals the parameters `transformers` allocates (tied weights counted once);
- the K projection's width, i.e. the KV cache bytes per token;
- `ModelSpec.from_hf_config` reads the saved config back to the same spec.
Hub-format `config.json` literals (as published, transformers-4 style) are read back too.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from llmperf.specs import ModelSpec, list_models, load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# The `transformers` model type each built-in model is (family alone does not say: Mistral, Mixtral
# and Qwen2 are family "llama"). A new built-in model without an entry fails `test_every_model_mapped`.
HF_MODEL_TYPE = {
    "gpt2": "gpt2", "gpt2-medium": "gpt2", "gpt2-large": "gpt2", "gpt2-xl": "gpt2", "gpt3-175b": "gpt2",
    "opt-13b": "opt",
    "llama-2-7b": "llama", "llama-2-13b": "llama", "llama-2-70b": "llama",
    "llama-3.1-8b": "llama", "llama-3.1-70b": "llama", "llama-3.1-405b": "llama",
    "mistral-7b": "mistral", "mixtral-8x7b": "mixtral",
    "qwen2.5-7b": "qwen2", "qwen2.5-72b": "qwen2",
}

# transformers 5 saves rope_theta / rope_scaling / rotary_pct inside `rope_parameters`, which
# llmperf/specs/hf.py does not read yet (transformers 4 saved them at the top level).
_ROPE_NESTED = int(transformers.__version__.split(".")[0]) >= 5

_HF_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def hf_config(spec: ModelSpec, model_type: str):
    """The `transformers` config of `spec`, built from the spec's fields only."""
    if model_type == "gpt2":
        assert spec.family == "gpt2" and spec.ffn_size == 4 * spec.hidden_size
        return transformers.GPT2Config(
            vocab_size=spec.vocab_size, n_embd=spec.hidden_size, n_layer=spec.num_layers,
            n_head=spec.num_heads, n_positions=spec.max_positions, n_inner=spec.ffn_size,
            activation_function=spec.hidden_act, layer_norm_epsilon=spec.norm_eps,
            tie_word_embeddings=spec.tied_embeddings, dtype=_HF_DTYPE[spec.dtype])
    if model_type == "opt":
        return transformers.OPTConfig(
            vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, word_embed_proj_dim=spec.hidden_size,
            num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, ffn_dim=spec.ffn_size,
            max_position_embeddings=spec.max_positions, activation_function=spec.hidden_act,
            enable_bias=spec.qkv_bias, tie_word_embeddings=spec.tied_embeddings,
            dtype=_HF_DTYPE[spec.dtype])
    # Llama-like. rope_theta / rope_scaling are the hub's (transformers-4) spelling; transformers 5
    # folds them into `rope_parameters`.
    common = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.ffn_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, hidden_act=spec.hidden_act,
        max_position_embeddings=spec.max_positions, rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta, tie_word_embeddings=spec.tied_embeddings, dtype=_HF_DTYPE[spec.dtype])
    if spec.rope_scaling:
        common["rope_scaling"] = dict(spec.rope_scaling)
    if model_type == "llama":
        assert spec.qkv_bias == spec.out_bias
        return transformers.LlamaConfig(**common, head_dim=spec.head_dim, attention_bias=spec.qkv_bias,
                                        mlp_bias=spec.mlp_bias)
    if model_type == "mistral":
        return transformers.MistralConfig(**common, head_dim=spec.head_dim)
    if model_type == "mixtral":
        return transformers.MixtralConfig(**common, head_dim=spec.head_dim, num_local_experts=spec.num_experts,
                                          num_experts_per_tok=spec.experts_per_token)
    if model_type == "qwen2":
        assert spec.qkv_bias and not spec.out_bias and not spec.mlp_bias  # Qwen2's fixed bias layout
        return transformers.Qwen2Config(**common)
    raise AssertionError(model_type)


def meta_model(cfg):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def hf_param_count(model) -> int:
    unique = {id(p): p for p in model.parameters()}  # a tied embedding is one tensor, counted once
    n = sum(p.numel() for p in unique.values())
    assert n == model.num_parameters()
    return n


def hf_kv_width(model, model_type: str) -> int:
    """Width of one layer's K projection output in the real module (= kv_heads * head_dim)."""
    if model_type == "gpt2":
        return model.transformer.h[0].attn.c_attn.weight.shape[1] // 3  # Conv1D (in, 3 * hidden)
    if model_type == "gpt_neox":
        return model.gpt_neox.layers[0].attention.query_key_value.out_features // 3
    layers = model.model.decoder.layers if model_type == "opt" else model.model.layers
    return layers[0].self_attn.k_proj.out_features


def hf_num_layers(cfg) -> int:
    return cfg.num_hidden_layers  # GPT2Config maps this to n_layer


def structure(spec: ModelSpec) -> ModelSpec:
    """The spec with the fields that do not describe shape (name, source, dtype) blanked."""
    return replace(spec, name="x", source="", dtype="fp16")


def test_every_model_mapped():
    """Each built-in is checked against transformers here or (today's models) in test_hf_today.py."""
    import importlib.util
    from pathlib import Path
    today = importlib.util.spec_from_file_location("_hf_today", Path(__file__).with_name("test_hf_today.py"))
    module = importlib.util.module_from_spec(today)
    today.loader.exec_module(module)
    BUILTIN_CONFIGS = module.BUILTIN_CONFIGS
    assert sorted([*HF_MODEL_TYPE, *BUILTIN_CONFIGS]) == sorted(list_models())


@pytest.mark.parametrize("name", sorted(HF_MODEL_TYPE))
def test_param_count_and_kv_match_transformers(name):
    spec = load_model(name)
    mt = HF_MODEL_TYPE[name]
    cfg = hf_config(spec, mt)
    model = meta_model(cfg)
    assert hf_param_count(model) == spec.param_count
    kv_per_token = 2 * hf_num_layers(cfg) * hf_kv_width(model, mt) * 2  # K and V, every layer, fp16
    assert spec.kv_bytes_per_token("fp16") == kv_per_token


@pytest.mark.parametrize("name", sorted(HF_MODEL_TYPE))
def test_saved_hf_config_reads_back(name, tmp_path):
    spec = load_model(name)
    hf_config(spec, HF_MODEL_TYPE[name]).save_pretrained(tmp_path)
    back = ModelSpec.from_hf_config(tmp_path)
    assert back.name == tmp_path.name
    assert back.param_count == spec.param_count
    assert back.kv_bytes_per_token("fp16") == spec.kv_bytes_per_token("fp16")
    assert back.dtype == spec.dtype
    # every shape field, rope aside (see test_saved_hf_config_keeps_rope)
    assert replace(structure(back), rope_theta=spec.rope_theta) == structure(spec)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b"])
def test_saved_hf_config_keeps_rope(name, tmp_path):
    spec = load_model(name)
    hf_config(spec, HF_MODEL_TYPE[name]).save_pretrained(tmp_path)
    back = ModelSpec.from_hf_config(tmp_path)
    assert back.rope_theta == spec.rope_theta
    assert back.rope_scaling == spec.rope_scaling


def test_tied_embeddings_counted_once():
    spec = load_model("gpt2")
    model = meta_model(hf_config(spec, "gpt2"))
    assert model.lm_head.weight is model.transformer.wte.weight
    assert spec.lm_head_params == 0 and spec.param_count == 124_439_808


# ---- a tiny GPT-NeoX (cost model only in llmperf; no built-in) --------------------------------------

def _tiny_neox(**overrides):
    kw = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=256, max_position_embeddings=128, rotary_pct=0.25, rotary_emb_base=10000,
              use_parallel_residual=True, tie_word_embeddings=False)
    kw.update(overrides)
    return transformers.GPTNeoXConfig(**kw)


@pytest.mark.parametrize("overrides", [{}, {"attention_bias": False}, {"use_parallel_residual": False}])
def test_gpt_neox_round_trip(tmp_path, overrides):
    cfg = _tiny_neox(**overrides)
    model = meta_model(cfg)
    cfg.save_pretrained(tmp_path)
    spec = ModelSpec.from_hf_config(tmp_path)
    assert spec.family == "gpt_neox"
    assert spec.param_count == hf_param_count(model)
    assert spec.kv_bytes_per_token("fp16") == 2 * 2 * hf_kv_width(model, "gpt_neox") * 2
    assert spec.parallel_residual == cfg.use_parallel_residual
    assert spec.qkv_bias == spec.out_bias == cfg.attention_bias


def test_gpt_neox_in_code_matches_transformers():
    """The same tiny model written as a ModelSpec by hand (no HF reader involved)."""
    spec = ModelSpec(name="tiny-neox", family="gpt_neox", vocab_size=512, hidden_size=64, num_layers=2,
                     num_heads=4, ffn_size=256, ffn_kind="gelu", hidden_act="gelu", norm_kind="layernorm",
                     pos_encoding="rope", max_positions=128, qkv_bias=True, out_bias=True, mlp_bias=True,
                     parallel_residual=True)
    assert spec.param_count == hf_param_count(meta_model(_tiny_neox()))


def test_gpt_neox_saved_config_keeps_partial_rotary(tmp_path):
    _tiny_neox().save_pretrained(tmp_path)
    assert ModelSpec.from_hf_config(tmp_path).rotary_dim == 4  # 25% of head_dim 16


# ---- config.json files as published on the Hub (transformers-4 spelling), read without transformers ---

HUB_CONFIGS = {
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256},
    "llama-2-7b": {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
        "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
        "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000},
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
        "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000},
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 152064},
    "gpt2": {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257},
    "opt-13b": {
        "activation_dropout": 0.0, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
        "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1,
        "eos_token_id": 2, "ffn_dim": 20480, "hidden_size": 5120, "init_std": 0.02, "layerdrop": 0.0,
        "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 40,
        "num_hidden_layers": 40, "output_projection": True, "pad_token_id": 1, "prefix": "</s>",
        "torch_dtype": "float16", "use_cache": True, "vocab_size": 50272, "word_embed_proj_dim": 5120},
}


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_hub_config_json_equals_builtin(name, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIGS[name]))
    back = ModelSpec.from_hf_config(tmp_path / "config.json")
    spec = load_model(name)
    assert structure(back) == structure(spec)
    assert back.rope_scaling == spec.rope_scaling  # not part of ==
    if "torch_dtype" in HUB_CONFIGS[name]:
        assert back.dtype == spec.dtype
    # and through load_model, as the CLI takes it
    assert load_model(str(tmp_path)).param_count == spec.param_count


def test_structure_compares_every_shape_field():
    """Guard for `structure`: the only fields it ignores are the three it blanks (and rope_scaling)."""
    ignored = {f.name for f in fields(ModelSpec) if not f.compare} | {"name", "source", "dtype"}
    assert ignored == {"name", "source", "dtype", "rope_scaling"}


# ---- the defaults llmperf assumes for absent config fields are transformers' own --------------------

CONFIG_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "mixtral": "MixtralConfig",
                  "qwen2": "Qwen2Config", "gpt2": "GPT2Config", "opt": "OPTConfig", "gpt_neox": "GPTNeoXConfig",
                  "qwen3": "Qwen3Config", "qwen3_moe": "Qwen3MoeConfig", "deepseek_v3": "DeepseekV3Config",
                  "kimi_k2": "DeepseekV3Config", "deepseek_v2": "DeepseekV2Config", "glm4_moe": "Glm4MoeConfig",
                  "gpt_oss": "GptOssConfig", "llama4_text": "Llama4TextConfig", "gemma2": "Gemma2Config",
                  "gemma3_text": "Gemma3TextConfig"}
# defaults llmperf gives keys the config class does not hold, with why
_NOT_IN_CLASS = {
    ("deepseek_v3", "moe_layer_freq"): 1, ("kimi_k2", "moe_layer_freq"): 1,  # DeepSeek's own modelling; 1 everywhere
    ("deepseek_v2", "moe_layer_freq"): 1, ("deepseek_v2", "num_nextn_predict_layers"): 0,  # V2 has no MTP
    ("gemma3_text", "sliding_window_pattern"): 6,  # a kwarg of Gemma3TextConfig (_sliding_window_pattern)
    ("gpt_oss", "torch_dtype"): "bfloat16",  # the released config.json has none; its unquantised tensors are bf16
}


@pytest.mark.parametrize("model_type", sorted(CONFIG_CLASSES))
def test_hf_defaults_are_transformers_defaults(model_type):
    from llmperf.specs.hf import HF_MODEL_TYPES
    cfg = getattr(transformers, CONFIG_CLASSES[model_type])()
    nested = getattr(cfg, "rope_parameters", None) or {}
    renamed = {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"}  # transformers 5
    for key, value in HF_MODEL_TYPES[model_type].defaults.items():
        if (model_type, key) in _NOT_IN_CLASS:
            assert value == _NOT_IN_CLASS[model_type, key]
            if key == "sliding_window_pattern":
                assert cfg._sliding_window_pattern == value
            continue
        if key == "sliding_window" and getattr(cfg, "use_sliding_window", True) is False:
            # Qwen3: the window is dropped unless use_sliding_window; its default is the one then used
            actual = getattr(transformers, CONFIG_CLASSES[model_type])(use_sliding_window=True).sliding_window
        elif hasattr(cfg, key):
            actual = getattr(cfg, key)
        else:
            actual = nested[renamed.get(key, key)]
        assert actual == value, (model_type, key, actual)


@pytest.mark.parametrize("model_type,heads,kv_heads", [("llama", 4, 4), ("mistral", 16, 8), ("mixtral", 16, 8),
                                                      ("qwen2", 64, 32)])
def test_absent_kv_heads_and_tying_match_transformers(model_type, heads, kv_heads, tmp_path):
    """Drop num_key_value_heads and tie_word_embeddings from a saved config: transformers builds the
    config class's default KV heads (Llama: MHA) with an untied head, and so does the spec read back."""
    cfg = getattr(transformers, CONFIG_CLASSES[model_type])(
        vocab_size=100, hidden_size=heads * 16, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=64)
    cfg.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.pop("num_key_value_heads"), data.pop("tie_word_embeddings", None)
    (tmp_path / "config.json").write_text(json.dumps(data))
    model = meta_model(transformers.AutoConfig.from_pretrained(tmp_path))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert spec.num_kv_heads == kv_heads == hf_kv_width(model, model_type) // 16
    assert not spec.tied_embeddings and spec.param_count == hf_param_count(model)
    data["num_key_value_heads"] = None  # explicit null: MHA for every type
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert ModelSpec.from_hf_config(tmp_path).num_kv_heads == heads


def test_absent_tying_gpt2_matches_transformers(tmp_path):
    transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.pop("tie_word_embeddings", None)
    (tmp_path / "config.json").write_text(json.dumps(data))
    model = meta_model(transformers.AutoConfig.from_pretrained(tmp_path))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert spec.tied_embeddings and spec.param_count == hf_param_count(model) == 108_544


@pytest.mark.parametrize("overrides,window", [({}, None), ({"use_sliding_window": True, "sliding_window": 64,
                                                            "max_window_layers": 0}, 64),
                                              ({"use_sliding_window": True, "sliding_window": 64,
                                                "max_window_layers": 2}, None)])
def test_qwen2_sliding_window_as_transformers_saves_it(overrides, window, tmp_path):
    cfg = transformers.Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, **overrides)
    cfg.save_pretrained(tmp_path)
    assert ModelSpec.from_hf_config(tmp_path).sliding_window == window


def test_qwen2_mixed_layers_refused_as_transformers_saves_them(tmp_path):
    from llmperf.errors import SpecError
    transformers.Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                             sliding_window=64, max_window_layers=2).save_pretrained(tmp_path)
    with pytest.raises(SpecError, match="layer_types|max_window_layers"):
        ModelSpec.from_hf_config(tmp_path)
