"""Hugging Face config.json fidelity: defaults of absent fields (hand-computed), sliding windows,
quantized checkpoints, GPT-2 attention scaling, and every field that changes the math honoured or
refused naming it. No transformers needed (tests/specs/test_hf_crosscheck.py checks against it)."""

from __future__ import annotations

import json
import re

import pytest

from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, QuantizationSpec, load_model
from llmperf.specs.hf import (
    HF_CONFIG_FIELDS,
    HF_MODEL_TYPES,
    HF_REFUSED_FIELDS,
    ROPE_TYPES,
    model_spec_from_hf_config,
    read_hf_config,
)

# A tiny Llama: vocab 100, hidden 64, 2 layers, 4 heads of 16, FFN 128.
LLAMA = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
         "max_position_embeddings": 512, "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32}
OPT = {"model_type": "opt", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "ffn_dim": 256, "max_position_embeddings": 32}


def read(cfg: dict) -> ModelSpec:
    return model_spec_from_hf_config(dict(cfg), name="t")


def without(cfg: dict, *keys: str) -> dict:
    return {k: v for k, v in cfg.items() if k not in keys}


def refused(cfg: dict, needle: str):
    with pytest.raises(SpecError, match=re.escape(needle)):
        read(cfg)


# ---- defaults of absent fields, hand-computed -------------------------------------------------------

def test_absent_num_key_value_heads_is_multi_head():
    """transformers: num_key_value_heads=None -> num_attention_heads (MHA). KV per token, fp16:
    2 (K, V) * 2 layers * 4 heads * 16 dims * 2 bytes = 512 B (with 2 KV heads it is 256 B)."""
    assert read(LLAMA).kv_bytes_per_token("fp16") == 256
    m = read(without(LLAMA, "num_key_value_heads"))
    assert m.num_kv_heads == 4 and m.kv_bytes_per_token("fp16") == 512
    assert read({**LLAMA, "num_key_value_heads": None}).num_kv_heads == 4  # null, as saved by some tools
    # per layer: q 64x64, k and v 64x64 (4 heads), o 64x64 = 16,384; MLP 3 x 64 x 128 = 24,576; 2 norms 128
    # total: embed 6,400 + 2 x 41,088 + final norm 64 + untied head 6,400 = 95,040
    assert m.param_count == 95_040


@pytest.mark.parametrize("model_type,default", [("mistral", 8), ("mixtral", 8), ("qwen2", 32)])
def test_absent_num_key_value_heads_is_the_type_default(model_type, default):
    """MistralConfig / MixtralConfig default to 8 KV heads, Qwen2Config to 32; null means MHA."""
    cfg = {**without(LLAMA, "num_key_value_heads"), "model_type": model_type, "num_attention_heads": 64,
           "hidden_size": 1024, "num_local_experts": 2, "num_experts_per_tok": 1}
    assert read(cfg).num_kv_heads == default
    assert read({**cfg, "num_key_value_heads": None}).num_kv_heads == 64
    refused({**cfg, "num_attention_heads": 4, "hidden_size": 64},
            f"num_key_value_heads is absent and {model_type}'s default {default} does not divide "
            "num_attention_heads=4")


def test_absent_tie_word_embeddings_llama_is_untied():
    """LlamaConfig(tie_word_embeddings=False): the head is its own 100 x 64 matrix."""
    m = read(without(LLAMA, "tie_word_embeddings", "num_key_value_heads"))
    assert m.tied_embeddings is False and m.lm_head_params == 6_400 and m.param_count == 95_040


def test_absent_tie_word_embeddings_gpt2_is_tied():
    """PretrainedConfig's default (tied) holds for GPT-2: wte is the head. By hand, per layer:
    ln_1 128 + c_attn 64*192+192 + c_proj 64*64+64 + ln_2 128 + c_fc 64*256+256 + mlp c_proj 256*64+64
    = 49,984; wte 6,400 + wpe 32*64 = 2,048; ln_f 128 -> 6,400 + 2,048 + 2 * 49,984 + 128 = 108,544."""
    m = read(GPT2)
    assert m.tied_embeddings is True and m.lm_head_params == 0
    assert m.param_count == 108_544
    assert read({**GPT2, "tie_word_embeddings": False}).param_count == 108_544 + 6_400


def test_absent_tie_word_embeddings_opt_is_tied():
    assert read(OPT).tied_embeddings is True and read(OPT).lm_head_params == 0


def test_absent_optional_fields_take_the_type_defaults():
    m = read(without(LLAMA, "tie_word_embeddings"))
    assert (m.hidden_act, m.norm_eps, m.rope_theta, m.qkv_bias, m.mlp_bias) == ("silu", 1e-6, 10000.0, False, False)
    mix = read({**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2})
    assert mix.norm_eps == 1e-5 and mix.num_experts == 4 and mix.sliding_window is None
    assert read({**LLAMA, "model_type": "qwen2"}).qkv_bias is True
    g = read(GPT2)
    assert (g.ffn_size, g.hidden_act, g.attn_scale, g.attn_scale_inverse_layer_idx) == (256, "gelu_new", True, False)


# ---- sliding window -----------------------------------------------------------------------------------

MISTRAL = {**LLAMA, "model_type": "mistral"}
QWEN2 = {**LLAMA, "model_type": "qwen2"}


@pytest.mark.parametrize("cfg,window", [
    ({**MISTRAL, "sliding_window": 4096}, 4096),
    (MISTRAL, 4096),  # MistralConfig's default
    ({**MISTRAL, "sliding_window": None}, None),  # Mistral v0.2+
    ({**LLAMA, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 128},
     128),
    ({**QWEN2, "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28}, None),
    ({**QWEN2, "sliding_window": 256, "use_sliding_window": True, "max_window_layers": 0}, 256),
    ({**QWEN2, "sliding_window": 256, "use_sliding_window": True, "max_window_layers": 2}, None),  # no layer slides
    ({**QWEN2, "sliding_window": 256, "use_sliding_window": True}, None),  # default max_window_layers 28 >= 2
    ({**QWEN2, "sliding_window": None, "use_sliding_window": True, "max_window_layers": 0}, None),
    ({**QWEN2, "sliding_window": 256, "layer_types": ["full_attention"] * 2}, None),
    ({**QWEN2, "sliding_window": 256, "layer_types": ["sliding_attention"] * 2}, 256),
])
def test_sliding_window(cfg, window):
    m = read(cfg)
    assert m.sliding_window == window
    held = m.kv_cache("fp16").tokens_held(10_000)
    assert held == (10_000 if window is None else min(window, 10_000))


def test_sliding_window_refusals():
    refused({**QWEN2, "sliding_window": 256, "use_sliding_window": True, "max_window_layers": 1},
            "max_window_layers=1 is not modelled")
    refused({**QWEN2, "sliding_window": 256, "layer_types": ["full_attention", "sliding_attention"]},
            "layer_types=['full_attention', 'sliding_attention'] is not modelled")
    refused({**LLAMA, "sliding_window": 4096}, "sliding_window=4096 is not modelled (llama has no")
    refused({**GPT2, "sliding_window": 64}, "sliding_window=64")


# ---- quantized checkpoints ----------------------------------------------------------------------------

AWQ = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm",
       "zero_point": True}  # as TheBloke/Llama-2-7B-AWQ publishes it
GPTQ = {"bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False, "sym": True,
        "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model",
        "quant_method": "gptq"}  # as TheBloke/Llama-2-7B-GPTQ publishes it


@pytest.mark.parametrize("qcfg,expected", [
    (AWQ, QuantizationSpec(method="awq", bits=4, group_size=128, zero_point=True)),
    ({**AWQ, "zero_point": False, "group_size": 64}, QuantizationSpec(method="awq", bits=4, group_size=64,
                                                                      zero_point=False)),
    (GPTQ, QuantizationSpec(method="gptq", bits=4, group_size=128, zero_point=False)),
    ({**GPTQ, "sym": False, "desc_act": True}, QuantizationSpec(method="gptq", bits=4, group_size=128,
                                                                zero_point=True, act_order=True)),
    ({**GPTQ, "group_size": -1, "bits": 8}, QuantizationSpec(method="gptq", bits=8, group_size=None,
                                                             zero_point=False)),
    ({**GPTQ, "quant_method": "GPTQ"}, QuantizationSpec(method="gptq", bits=4, group_size=128, zero_point=False)),
])
def test_quantization_config(qcfg, expected):
    m = read({**LLAMA, "torch_dtype": "float16", "quantization_config": qcfg})
    assert m.quantization == expected
    assert m.dtype == "fp16"  # the unquantized tensors (embedding, head, norms)
    assert read(LLAMA).quantization is None


@pytest.mark.parametrize("qcfg,needle", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quantization_config.quant_method='bitsandbytes'"),
    ({"quant_method": "hqq"}, "quantization_config.quant_method='hqq' is not modelled (supported: awq, gptq, fp8"),
    ({"bits": 4}, "quantization_config.quant_method=None"),
    ({**GPTQ, "bits": 3}, "quantization_config.bits must be one of 4, 8, got 3"),
    ({**GPTQ, "bits": None}, "missing field 'quantization_config.bits'"),
    ({**AWQ, "group_size": 0}, "quantization_config.group_size must be a positive integer"),
    ({**AWQ, "modules_to_not_convert": ["mlp.down_proj"]}, "quantization_config.modules_to_not_convert"),
    ({**GPTQ, "modules_in_block_to_quantize": [["self_attn.q_proj"]]},
     "quantization_config.modules_in_block_to_quantize"),
    ("int4", "quantization_config must be a mapping, got 'int4'"),
])
def test_quantization_refusals(qcfg, needle):
    refused({**LLAMA, "quantization_config": qcfg}, needle)


# ---- GPT-2 attention scaling -------------------------------------------------------------------------

def test_gpt2_attention_scaling_flags():
    m = read({**GPT2, "scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True})
    assert m.attn_scale is False and m.attn_scale_inverse_layer_idx is True
    assert m.param_count == read(GPT2).param_count  # values change, counts do not


# ---- refused fields ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key,value", [
    ("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0), ("alibi", True), ("use_alibi", True),
    ("position_embedding_type", "relative_key"), ("use_qk_norm", True), ("qk_layernorm", True),
    ("embedding_multiplier", 12.0), ("residual_multiplier", 0.22), ("logits_scaling", 8.0),
    ("attention_multiplier", 0.0078125),
])
def test_math_changing_fields_are_refused(key, value):
    refused({**LLAMA, key: value}, f"{key}={value!r} is not modelled")


@pytest.mark.parametrize("key,neutral", [("alibi", False), ("attn_logit_softcapping", None),
                                         ("position_embedding_type", "absolute"), ("embedding_multiplier", 1.0)])
def test_neutral_values_are_accepted(key, neutral):
    assert read({**LLAMA, key: neutral}).param_count == read(LLAMA).param_count


@pytest.mark.parametrize("scaling", [{"rope_type": "made_up", "factor": 4.0}, {"type": "su", "factor": 2.0}])
def test_unsupported_rope_scaling_refused(scaling):
    kind = scaling.get("rope_type", scaling.get("type"))
    refused({**LLAMA, "rope_scaling": scaling}, f"rope_scaling.rope_type={kind!r} is not modelled")
    refused({**LLAMA, "rope_parameters": {"rope_theta": 1e4, **scaling}}, "rope_parameters.rope_type")


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 2.0}, {"type": "linear", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                     {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "truncate": False},
                                     {"type": "dynamic", "factor": 2.0},
                                     {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}])
def test_supported_rope_scaling_kept(scaling):
    assert read({**LLAMA, "rope_scaling": scaling}).rope_scaling == scaling
    assert read({**LLAMA, "rope_scaling": {"rope_type": "default"}}).rope_scaling is None
    nested = read({**LLAMA, "rope_parameters": {"rope_theta": 5e5, **scaling}})
    assert nested.rope_scaling == scaling and nested.rope_theta == 5e5


@pytest.mark.parametrize("cfg,needle", [
    ({**LLAMA, "architectures": ["LlamaForSequenceClassification"]},
     "architectures='LlamaForSequenceClassification' is not modelled"),
    ({**LLAMA, "torch_dtype": "float64"}, "torch_dtype='float64' is not modelled"),
    ({**LLAMA, "dtype": "int8"}, "dtype='int8' is not modelled"),
    ({**GPT2, "add_cross_attention": True}, "add_cross_attention=True is not modelled"),
    ({**OPT, "do_layer_norm_before": False}, "do_layer_norm_before=False is not modelled"),
    ({**OPT, "_remove_final_layer_norm": True}, "_remove_final_layer_norm=True"),
    ({**OPT, "layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine=False"),
    ({**LLAMA, "rope_scaling": "big"}, "rope_scaling must be a mapping, got 'big'"),
])
def test_other_refusals(cfg, needle):
    refused(cfg, needle)


def test_every_refused_field_has_a_refusal_test():
    """HF_REFUSED_FIELDS is the documented list: each entry is exercised above."""
    tested = {"attn_logit_softcapping", "final_logit_softcapping", "alibi", "use_alibi", "position_embedding_type",
              "use_qk_norm", "qk_layernorm", "embedding_multiplier", "residual_multiplier", "logits_scaling",
              "attention_multiplier", "rope_scaling", "rope_parameters", "sliding_window", "layer_types",
              "max_window_layers", "quantization_config", "architectures", "torch_dtype", "add_cross_attention",
              "do_layer_norm_before", "_remove_final_layer_norm", "layer_norm_elementwise_affine",
              # today's models: tests/specs/test_hf_today.py::test_refused_fields_of_today
              "index_topk", "index_n_heads", "hybrid_override_pattern", "linear_num_value_heads", "mlp_bias",
              "topk_method", "scoring_func", "use_bidirectional_attention", "text_config", "experts_per_token",
              "swiglu_alpha",
              # Nemotron-H: tests/analysis/test_nemotron_h.py::test_refused_fields
              "residual_in_fp32", "mamba_hidden_act", "mamba_ssm_cache_dtype", "mlp_hidden_act",
              "layers_block_type", "tie_word_embeddings", "n_shared_experts",
              # Granite: tests/analysis/test_granite.py::test_refused_fields
              "hidden_act", "shared_intermediate_size", "time_step_limit",
              # DeepSeek-V4: tests/specs/test_deepseek_v4.py::test_refused_by_name
              "num_key_value_heads", "attention_bias", "expert_dtype", "compress_rates", "compress_ratios"}
    assert set(HF_REFUSED_FIELDS) == tested
    # none of these changes a FLOP, a weight or a KV byte; the engine keeps its own, shorter list
    assert ROPE_TYPES == ("default", "linear", "llama3", "yarn", "longrope", "dynamic", "proportional")


# ---- every field read is listed ----------------------------------------------------------------------

FULL_CONFIGS = [
    {**LLAMA, "attention_bias": True, "mlp_bias": True, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5,
     "rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "torch_dtype": "bfloat16",
     "quantization_config": AWQ, "architectures": ["LlamaForCausalLM"]},
    {**MISTRAL, "sliding_window": 4096, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}},
    {**QWEN2, "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 0, "quantization_config": GPTQ},
    {**QWEN2, "sliding_window": 64, "layer_types": ["sliding_attention"] * 2, "dtype": "float32"},
    {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    {**GPT2, "n_inner": 128, "activation_function": "gelu", "layer_norm_epsilon": 1e-6, "scale_attn_weights": False,
     "scale_attn_by_inverse_layer_idx": True, "tie_word_embeddings": True, "add_cross_attention": False},
    {**OPT, "enable_bias": False, "word_embed_proj_dim": 64, "do_layer_norm_before": True},
    {"model_type": "gpt_neox", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
     "num_attention_heads": 4, "intermediate_size": 256, "max_position_embeddings": 32, "rotary_pct": 0.5,
     "rotary_emb_base": 5000, "use_parallel_residual": False, "attention_bias": False, "layer_norm_eps": 1e-6},
]


@pytest.mark.parametrize("cfg", FULL_CONFIGS, ids=lambda c: c["model_type"])
def test_every_key_read_is_listed(cfg):
    fields, read_keys = read_hf_config(cfg, "t", "config")
    assert read_keys <= set(HF_CONFIG_FIELDS) | set(HF_REFUSED_FIELDS), read_keys - set(HF_CONFIG_FIELDS)
    # and every key of these configs that names a math-changing field was read
    assert set(cfg) <= read_keys, set(cfg) - read_keys
    ModelSpec(**fields)


def test_gpt_neox_partial_rotary_and_base():
    m = read(FULL_CONFIGS[-1])
    assert m.rotary_dim == 8 and m.rope_theta == 5000.0 and m.parallel_residual is False and not m.qkv_bias


def test_every_supported_type_described_once():
    assert set(HF_MODEL_TYPES) == {"llama", "mistral", "mixtral", "qwen2", "gpt2", "opt", "gpt_neox", "qwen3",
                                   "qwen3_moe", "deepseek_v3", "kimi_k2", "deepseek_v2", "glm4_moe", "gpt_oss",
                                   "llama4_text", "gemma2", "gemma3_text", "qwen3_next", "qwen3_5_text", "deepseek_v32",
                                   "qwen3_5_moe_text", "glm_moe_dsa", "glm4_moe_lite",
                                   "minimax_m2", "smollm3", "seed_oss", "olmo2", "olmo3",
                                   "exaone4", "ernie4_5_moe", "gemma4_text", "nemotron_h",
                                   "granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "bamba",
                                   "ministral3", "phi3", "glm4", "cohere2", "gemma", "qwen2_moe", "olmoe",
                                   "deepseek_v4"}
    for t in HF_MODEL_TYPES.values():
        assert set(t.required) <= set(t.keys.values()) | {"ffn_dim"}
        assert t.architectures and all(a.endswith(("ForCausalLM", "LMHeadModel")) for a in t.architectures)


def test_quantized_checkpoint_through_load_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "quantization_config": AWQ}))
    assert load_model(str(tmp_path)).quantization.method == "awq"


# ---- any junk in any field: a ModelSpec or one SpecError, never another exception -------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.analysis.model_checks import assert_read_or_one_error  # noqa: E402

_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 70_000), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=6), st.lists(st.integers(0, 3), max_size=3),
                  st.lists(st.sampled_from(["full_attention", "sliding_attention"]), max_size=3),
                  st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "quant_method", "bits",
                                                   "group_size", "rope_theta"]),
                                  st.one_of(st.sampled_from(["yarn", "linear", "awq", "gptq", "llama3"]),
                                            st.integers(-1, 256), st.floats(allow_nan=True)), max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FULL_CONFIGS), st.data())
def test_junk_values_give_a_spec_or_one_spec_error(cfg, data):
    keys = sorted(set(cfg) | set(HF_CONFIG_FIELDS) | set(HF_REFUSED_FIELDS))
    changed = dict(cfg)
    for key in data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
        if key != "model_type":
            changed[key] = data.draw(_JUNK)
    assert_read_or_one_error(read, changed)


def test_families_and_hf_model_types_agree():
    """Each family lists the HF model types built its way; each HF description names its family."""
    from llmperf.specs import FAMILIES
    listed = {mt: fam.name for fam in FAMILIES.values() for mt in fam.hf_model_types}
    assert listed == {mt: t.family for mt, t in HF_MODEL_TYPES.items()}
