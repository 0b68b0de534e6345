"""Read a Hugging Face `config.json` into a `ModelSpec` (`model_spec_from_hf_config`), offline: llama,
mistral, mixtral, qwen2, gpt2, opt, gpt_neox, qwen3, qwen3_moe, deepseek_v2, deepseek_v3 (and kimi_k2,
a DeepseekV3ForCausalLM), deepseek_v32, glm4_moe, glm_moe_dsa, qwen3_next, qwen3_5_text, qwen3_5_moe_text,
glm4_moe_lite, minimax_m2, smollm3, seed_oss, olmo2, olmo3, exaone4, ernie4_5_moe, gpt_oss, llama4_text,
gemma2, gemma3_text, gemma4_text, nemotron_h, granite, granitemoe, granitemoeshared, granitemoehybrid, bamba,
ministral3, phi3, glm4, cohere2, gemma, qwen2_moe, olmoe, deepseek_v4 (priced by estimate only), and the text
model of the multimodal llama4 / gemma3 / gemma4 / qwen3_5 / kimi_k25 / mistral3 checkpoints (read from
`text_config`; the vision and audio towers are not modelled).

Field names and the defaults of absent fields follow each model type's `PretrainedConfig` in
transformers 5 (`transformers/models/<type>/configuration_<type>.py`). Each model type is one
`HFModelType` description: its block family, the config keys of the spec's fields, the defaults of
absent keys, how it spells sliding-window attention, and an `extra` function for what does not map
one to one (which layers are MoE, each layer's attention kind, MLA ranks, shared experts, q/k norms,
sinks, soft-caps, and the routing and rotary numerics the engine needs).

A field that changes the math is honoured or refused naming it, never dropped: `HF_CONFIG_FIELDS`
lists every field read and honoured, `HF_REFUSED_FIELDS` every field refused when it holds a value
llmperf does not model (a model type not listed above is refused whole). `quantization_config` (AWQ, GPTQ,
fp8 block-wise, MXFP4, NVFP4) is resolved to llmperf's modules (`llmperf.specs.precision.MODULES`). What each
of these means: docs/specs.md, "Hugging Face config.json".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmperf.errors import SpecError
from llmperf.numeric import check_number, is_count, is_real, layer_indices
from llmperf.specs.model import ModelSpec
from llmperf.specs.precision import normalize_dtype
from llmperf.specs.quantization import QuantizationSpec

_ABSENT = object()
# keys whose explicit null differs from their absence: a null window is full attention (the Mistral
# default is 4096), null KV heads are multi-head attention (the Mistral default is 8)
# (null q_lora_rank: a plain q_proj; null soft-caps: no cap; null chunk size: no chunked layers)
_NULL_IS_A_VALUE = frozenset({"sliding_window", "num_key_value_heads", "q_lora_rank", "attn_logit_softcapping",
                              "final_logit_softcapping", "attention_chunk_size"})


class _Config:
    """A config.json mapping that knows its origin, the HF defaults of its model type, and records
    which keys were read (the test of `HF_CONFIG_FIELDS` uses that record)."""

    def __init__(self, data: Mapping[str, Any], origin: str, defaults: Mapping[str, Any]) -> None:
        self.data, self.origin, self.defaults = data, origin, defaults
        self.read: set[str] = set()

    def get(self, key: str, default: Any = _ABSENT) -> Any:
        """The value of `key`; absent or null: the model type's HF default (or `default`). For the
        keys whose null means something (`_NULL_IS_A_VALUE`) only an absent key takes the default."""
        self.read.add(key)
        if key in _NULL_IS_A_VALUE and key in self.data:
            return self.data[key]
        value = self.data.get(key)
        if value is None:
            value = self.defaults.get(key) if default is _ABSENT else default
        return value

    def has(self, key: str) -> bool:
        self.read.add(key)
        return self.data.get(key) is not None

    def req(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise SpecError(f"{self.origin}: missing field {key!r}")
        return value

    def flag(self, key: str) -> bool:
        """A boolean key (absent or null: the HF default, else false); anything but true / false is
        refused naming the key: `bool("false")` is True, so nothing here is truthy-coerced."""
        value = self.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise SpecError(f"{self.origin}: {key} must be true or false, got {value!r}")
        return value

    def refuse(self, key: str, value: Any, why: str) -> SpecError:
        return SpecError(f"{self.origin}: {key}={value!r} is not modelled ({why})")


@dataclass(frozen=True, kw_only=True)
class HFModelType:
    """How one Hugging Face `model_type` maps onto a `ModelSpec`."""

    model_type: str
    family: str  # the llmperf block family (llmperf.specs.families)
    architectures: tuple[str, ...]  # the causal-LM classes that save this model type
    keys: Mapping[str, str]  # ModelSpec field -> config key, read as is
    required: tuple[str, ...]  # config keys without a usable default (the model's shape)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # config key -> its HF default
    fixed: Mapping[str, Any] = field(default_factory=dict)  # ModelSpec fields fixed by the architecture
    # "none": no such attention; "all": every layer, when sliding_window is set; "gated": only with
    # use_sliding_window, and for layers >= max_window_layers (Qwen2)
    # "layers": the extra function states each layer's attention (layer_types, windows, chunks)
    sliding_window: str = "none"
    rope: bool = True  # reads rope_theta / rope_scaling (or transformers 5's rope_parameters)
    honours: tuple[str, ...] = ()  # `_NEUTRAL` fields this type models (soft-caps, q/k norms)
    extra: Callable[[_Config, dict[str, Any]], None] | None = None  # fields that do not map one to one


def _llama_biases(cfg: _Config, out: dict[str, Any]) -> None:
    out["qkv_bias"] = out["out_bias"] = cfg.flag("attention_bias")
    out["mlp_bias"] = cfg.flag("mlp_bias")


def _gpt2_extra(cfg: _Config, out: dict[str, Any]) -> None:
    out["ffn_size"] = cfg.get("n_inner") or 4 * out["hidden_size"]
    if cfg.flag("add_cross_attention"):
        raise cfg.refuse("add_cross_attention", True, "decoder-only models have no cross-attention")


def _opt_extra(cfg: _Config, out: dict[str, Any]) -> None:
    h = out["hidden_size"]
    proj = cfg.get("word_embed_proj_dim", h)
    if proj != h:
        raise SpecError(f"{cfg.origin}: word_embed_proj_dim={proj} differs from hidden_size={h} "
                        "(OPT-350m's projected embeddings are not modelled)")
    out["qkv_bias"] = out["out_bias"] = out["mlp_bias"] = cfg.flag("enable_bias")
    if not cfg.flag("do_layer_norm_before"):
        raise cfg.refuse("do_layer_norm_before", False, "post-norm blocks (OPT-350m)")
    if cfg.flag("_remove_final_layer_norm"):
        raise cfg.refuse("_remove_final_layer_norm", True, "a model without its final norm")
    if not cfg.flag("layer_norm_elementwise_affine"):
        raise cfg.refuse("layer_norm_elementwise_affine", False, "norms without weights and biases")


def _neox_extra(cfg: _Config, out: dict[str, Any]) -> None:
    out["qkv_bias"] = out["out_bias"] = cfg.flag("attention_bias")
    heads = out["num_heads"]
    if out["hidden_size"] % heads:
        return  # ModelSpec names the error
    key = "rope_parameters.partial_rotary_factor" if "partial_rotary_factor" in _rope_parameters(cfg) else "rotary_pct"
    fraction = _number(cfg, key, _rope_parameters(cfg).get("partial_rotary_factor", cfg.get("rotary_pct")))
    if not 0 < fraction <= 1:
        raise SpecError(f"{cfg.origin}: {key} must be in (0, 1], got {fraction!r}")
    out["rotary_dim"] = int(out["hidden_size"] // heads * fraction)


_LLAMA_KEYS = dict(vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
                   num_heads="num_attention_heads", num_kv_heads="num_key_value_heads", head_dim="head_dim",
                   ffn_size="intermediate_size", hidden_act="hidden_act", norm_eps="rms_norm_eps",
                   tied_embeddings="tie_word_embeddings", max_positions="max_position_embeddings")
_LLAMA_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size", "max_position_embeddings")
# The transformers defaults each config class gives an absent key (tests/specs/test_hf_crosscheck.py
# checks them against the installed transformers).
_LLAMA_DEFAULTS = dict(hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False)

_MLA_KEYS = dict(vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
                 num_heads="num_attention_heads", ffn_size="intermediate_size", hidden_act="hidden_act",
                 norm_eps="rms_norm_eps", tied_embeddings="tie_word_embeddings",
                 max_positions="max_position_embeddings", num_experts="n_routed_experts",
                 experts_per_token="num_experts_per_tok", moe_ffn_size="moe_intermediate_size")
_MLA_REQUIRED = _LLAMA_REQUIRED
_DEEPSEEK_V3_DEFAULTS = dict(
    _LLAMA_DEFAULTS, attention_bias=False, n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8,
    topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, moe_intermediate_size=2048,
    num_nextn_predict_layers=1, moe_layer_freq=1)
_DEEPSEEK_V32_DEFAULTS = dict(_DEEPSEEK_V3_DEFAULTS, index_topk=2048, index_head_dim=128, index_n_heads=64)
# Glm4MoeLiteConfig's defaults (GLM-4.7-Flash; no MTP field: transformers builds none)
_GLM4_MOE_LITE_DEFAULTS = dict(
    _DEEPSEEK_V3_DEFAULTS, vocab_size=154880, hidden_size=2048, intermediate_size=10240, moe_intermediate_size=1536,
    num_hidden_layers=47, num_attention_heads=20, num_key_value_heads=20, n_routed_experts=64,
    routed_scaling_factor=1.8, q_lora_rank=768, qk_nope_head_dim=192, v_head_dim=256, n_group=1, topk_group=1,
    num_experts_per_tok=4, rms_norm_eps=1e-5, max_position_embeddings=202752, first_k_dense_replace=1,
    num_nextn_predict_layers=0)
# GlmMoeDsaConfig's defaults (no MTP field: transformers builds none; no moe_layer_freq: every layer past
# first_k_dense_replace is MoE)
_GLM5_DEFAULTS = dict(
    _DEEPSEEK_V3_DEFAULTS, vocab_size=154880, hidden_size=6144, intermediate_size=12288, num_hidden_layers=78,
    num_attention_heads=64, num_key_value_heads=64, rms_norm_eps=1e-5, max_position_embeddings=202752,
    q_lora_rank=2048, qk_nope_head_dim=192, v_head_dim=256, n_group=1, topk_group=1, num_nextn_predict_layers=0,
    index_topk=2048, index_head_dim=128, index_n_heads=32)
_DEEPSEEK_V2_DEFAULTS = dict(
    _LLAMA_DEFAULTS, attention_bias=False, mlp_bias=False, first_k_dense_replace=0, kv_lora_rank=512,
    q_lora_rank=1536, n_routed_experts=64, n_shared_experts=2, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, routed_scaling_factor=1.0, topk_method="greedy", norm_topk_prob=False,
    moe_intermediate_size=1407, num_nextn_predict_layers=0, moe_layer_freq=1)
_GEMMA_KEYS = {**_LLAMA_KEYS, "hidden_act": "hidden_activation"}
_GDN_MOE_KEYS = {**_LLAMA_KEYS, "num_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                 "moe_ffn_size": "moe_intermediate_size"}
_GDN_DEFAULTS = dict(_LLAMA_DEFAULTS, max_position_embeddings=32768, head_dim=256, attention_bias=False,
                     linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                     linear_num_key_heads=16, linear_num_value_heads=32, full_attention_interval=4,
                     partial_rotary_factor=0.25)
_QWEN3_NEXT_DEFAULTS = dict(_GDN_DEFAULTS, vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                            num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2,
                            decoder_sparse_step=1, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                            num_experts_per_tok=10, num_experts=512, norm_topk_prob=True)
_QWEN3_5_DEFAULTS = dict(_GDN_DEFAULTS, vocab_size=248320, hidden_size=4096, intermediate_size=12288,
                         num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4)
_QWEN3_5_MOE_DEFAULTS = dict(_GDN_DEFAULTS, vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
                             num_attention_heads=16, num_key_value_heads=2, moe_intermediate_size=512,
                             shared_expert_intermediate_size=512, num_experts_per_tok=8, num_experts=256)
_GEMMA2_DEFAULTS = dict(
    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True, num_key_value_heads=4,
    head_dim=256, attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
    attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
_GEMMA3_DEFAULTS = dict(
    _GEMMA2_DEFAULTS, attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window_pattern=6,
    use_bidirectional_attention=False)

#: Gemma4TextConfig's defaults (transformers 5.24); global_head_dim and num_global_key_value_heads are
#: keyword arguments its __post_init__ pops (512 and None)
_GEMMA4_DEFAULTS = dict(
    vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, sliding_window=512,
    final_logit_softcapping=None, vocab_size_per_layer_input=262_144, hidden_size_per_layer_input=256,
    attention_k_eq_v=False, num_kv_shared_layers=0, enable_moe_block=False, use_double_wide_mlp=False,
    global_head_dim=512, num_global_key_value_heads=None, num_experts=None, top_k_experts=None,
    moe_intermediate_size=None, per_layer_config=None)

#: NemotronHConfig's defaults (transformers 5.24; its class default layers: one of each block type)
_NEMOTRON_H_DEFAULTS = dict(
    vocab_size=131072, hidden_size=4096, tie_word_embeddings=False, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=4096, attention_bias=False, sliding_window=None, intermediate_size=21504,
    mlp_hidden_act="relu2", mlp_bias=False, ssm_state_size=128, mamba_num_heads=128, mamba_head_dim=64,
    mamba_hidden_act="silu", n_groups=8, conv_kernel=4, use_conv_bias=True, chunk_size=128, time_step_min=0.001,
    mamba_ssm_cache_dtype="float32", n_routed_experts=8, n_shared_experts=1, moe_intermediate_size=7688,
    moe_shared_expert_intermediate_size=7688, moe_latent_size=None, num_experts_per_tok=2, routed_scaling_factor=1.0,
    n_group=1, topk_group=1, norm_topk_prob=True, num_nextn_predict_layers=0, use_bias=False,
    layer_norm_epsilon=1e-5, residual_in_fp32=False)

#: GraniteConfig's defaults (transformers 5.24); granitemoe, granitemoeshared and granitemoehybrid add theirs
_GRANITE_DEFAULTS = dict(
    _LLAMA_DEFAULTS, vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, max_position_embeddings=2048, attention_bias=False, mlp_bias=False,
    embedding_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0, attention_multiplier=1.0)
_GRANITE_MOE_DEFAULTS = dict(_GRANITE_DEFAULTS, num_local_experts=8, num_experts_per_tok=2)
_GRANITE_SHARED_DEFAULTS = dict(_GRANITE_MOE_DEFAULTS, shared_intermediate_size=0)
#: BambaConfig's defaults (transformers 5.24): its Mamba-2 keys are Granite 4.0-H's
_BAMBA_DEFAULTS = dict(
    _LLAMA_DEFAULTS, vocab_size=128000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, max_position_embeddings=262144,
    attention_bias=False, mlp_bias=False, mamba_n_heads=128, mamba_n_groups=1, mamba_d_state=256, mamba_d_head="auto",
    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False,
    time_step_limit=(0.0, float("inf")))
_GRANITE_HYBRID_DEFAULTS = dict(
    _GRANITE_MOE_DEFAULTS, shared_intermediate_size=1024, position_embedding_type=None, mamba_n_heads=128,
    mamba_n_groups=1, mamba_d_state=256, mamba_d_head="auto", mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256,
    mamba_conv_bias=True, mamba_proj_bias=False, time_step_limit=(0.0, float("inf")))

# ---- today's models: per-layer structure ------------------------------------------------------------
# transformers' layer_types spelling -> ModelSpec's. Gated DeltaNet layers (`linear_attention`) are read
# by the types that build them (Qwen3-Next, Qwen3.5), Nemotron-H's Mamba-2 layers by its own reader
# (`_nemotron_h_extra`); other state-keeping layer types in a layer_types list are refused by name.
_LAYER_TYPE_NAMES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
                     "linear_attention": "linear"}
_STATE_LAYER_TYPES = ("mamba", "mamba2", "conv", "recurrent")


def _index_list(cfg: _Config, key: str, n: int) -> list[int]:
    """A config list of layer indices, each in 0..n-1 (one line naming the key otherwise)."""
    value = cfg.get(key)
    if value is None:
        return []
    return list(layer_indices(f"{cfg.origin}: {key}", value, n, distinct=False, hint=f" (num_hidden_layers={n})"))


def _positive(cfg: _Config, key: str, value: Any = _ABSENT) -> int:
    value = cfg.get(key) if value is _ABSENT else value
    if not is_count(value) or value <= 0:
        raise SpecError(f"{cfg.origin}: {key} must be a positive integer, got {value!r}")
    return value


def _count(cfg: _Config, key: str) -> int:
    """An integer >= 0 (absent: the type's default), one line naming the key otherwise."""
    value = cfg.get(key)
    if not is_count(value) or value < 0:
        raise SpecError(f"{cfg.origin}: {key} must be an integer >= 0, got {value!r}")
    return value


def _positive_number(cfg: _Config, key: str, value: Any) -> float:
    _number(cfg, key, value)  # "must be a number" first
    return check_number(f"{cfg.origin}: {key}", value)


def _set_layer_types(cfg: _Config, out: dict[str, Any], default: list[str], window: int | None,
                     chunk: int | None = None, *, given: bool = False) -> list[str]:
    """Each layer's attention from `layer_types` (or the type's `default` derivation, as the config
    class's `__post_init__`), into `out`: no `layer_types` when every layer is alike (then
    `sliding_window` alone says whether they slide). A sliding layer without a window, or a chunked one
    without a chunk size, attends to everything, as transformers builds it. Returns every layer's kind
    (full | sliding | chunked | linear) as built. `given`: `default` is already the kinds to build (the type
    read `layer_types` itself: Gemma 4 forces its last layer full)."""
    n = out["num_layers"]
    kinds = default if given or not cfg.has("layer_types") else cfg.get("layer_types")
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise SpecError(f"{cfg.origin}: layer_types must be a list of attention kinds, got {kinds!r}")
    if len(kinds) != n:
        raise SpecError(f"{cfg.origin}: layer_types has {len(kinds)} entries, num_hidden_layers={n}")
    for k in kinds:
        if k == "linear_attention" and "linear_num_key_heads" not in out:
            raise cfg.refuse("layer_types", k, "this model type builds no Gated DeltaNet layers")
        if k in _STATE_LAYER_TYPES:
            raise cfg.refuse("layer_types", k, "a layer with a constant per-sequence state (linear attention, "
                             "Mamba) is not modelled yet")
        if k not in _LAYER_TYPE_NAMES:
            raise SpecError(f"{cfg.origin}: layer_types holds {k!r} (known: {', '.join(_LAYER_TYPE_NAMES)})")
    mapped = [_LAYER_TYPE_NAMES[k] for k in kinds]
    mapped = ["full" if (t == "sliding" and window is None) or (t == "chunked" and chunk is None) else t
              for t in mapped]
    if window is not None:
        window = _positive(cfg, "sliding_window", window)
    if chunk is not None:
        chunk = _positive(cfg, "attention_chunk_size", chunk)
    if set(mapped) == {"full"}:
        out["layer_types"], out["sliding_window"] = None, None
    elif set(mapped) == {"sliding"}:
        out["layer_types"], out["sliding_window"] = None, window
    else:
        out["layer_types"] = tuple(mapped)
        out["sliding_window"] = window if "sliding" in mapped else None
        if "chunked" in mapped:
            out["attention_chunk_size"] = chunk
    return mapped


def _biases(cfg: _Config, out: dict[str, Any], *, out_proj: bool = True) -> None:
    """q/k/v (and o, where the type puts one there) biases from `attention_bias`."""
    out["qkv_bias"] = cfg.flag("attention_bias")
    out["out_bias"] = out["qkv_bias"] and out_proj


def _routing_values(cfg: _Config, out: dict[str, Any], *, scoring: str | None = None,
                    renormalize: bool | None = None, groups: bool = True) -> None:
    """Routing fields that change which experts win and their weights, not what a token costs, into
    `out`: scoring (the type's own, else `scoring_func`), renormalisation (the type's own, else
    `norm_topk_prob`), `routed_scaling_factor`, `n_group` / `topk_group` (where the type routes by groups)."""
    experts = out["num_experts"]
    norm = cfg.flag("norm_topk_prob")
    out["router_renormalize"] = norm if renormalize is None else renormalize
    scale = cfg.get("routed_scaling_factor")
    if scale is not None:
        out["router_scale"] = _positive_number(cfg, "routed_scaling_factor", scale)
    n_groups, top_groups = cfg.get("n_group"), cfg.get("topk_group")
    if n_groups is not None:
        n_groups = _positive(cfg, "n_group", n_groups)
        if experts % n_groups:
            raise SpecError(f"{cfg.origin}: n_group={n_groups} does not divide the {experts} routed experts")
        if top_groups is not None and _positive(cfg, "topk_group", top_groups) > n_groups:
            raise SpecError(f"{cfg.origin}: topk_group={top_groups} exceeds n_group={n_groups}")
        if groups:
            out["router_groups"], out["router_topk_groups"] = n_groups, top_groups or n_groups
    func = cfg.get("scoring_func", None)
    if func is not None and func not in ("softmax", "sigmoid"):
        raise cfg.refuse("scoring_func", func, "routing scores are softmax or sigmoid")
    out["router_scoring"] = scoring or func or "softmax"


_ROUTER_FIELDS = ("router_scoring", "router_renormalize", "router_scale", "router_groups", "router_topk_groups",
                  "router_input_scaling")


def _top_k(cfg: _Config, out: dict[str, Any], key: str = "num_experts_per_tok") -> None:
    """top-k against the expert count, named in one line (ModelSpec says it too, without the key)."""
    k = out.get("experts_per_token")
    if out["num_experts"] < 2:
        raise SpecError(f"{cfg.origin}: a mixture of {out['num_experts']} expert is not modelled (a router and "
                        "one expert per MoE layer; ModelSpec's MoE needs num_experts > 1)")
    if k is None:
        raise SpecError(f"{cfg.origin}: missing field {key!r} (the model has {out['num_experts']} experts)")
    if k > out["num_experts"]:
        raise SpecError(f"{cfg.origin}: {key}={k} exceeds the {out['num_experts']} routed experts")


def _dense_layers(out: dict[str, Any], is_moe: Callable[[int], bool]) -> None:
    n = out["num_layers"]
    out["dense_layers"] = tuple(i for i in range(n) if not is_moe(i))
    if len(out["dense_layers"]) == n:  # no MoE layer at all: a dense model of the dense FFN width
        out["num_experts"] = out["experts_per_token"] = 1
        out["dense_layers"] = ()
        for f in ("moe_ffn_size", "shared_experts", "shared_ffn_size", "router_bias", "router_score_bias",
                  *_ROUTER_FIELDS, "swiglu_limit"):
            out.pop(f, None)


def _qwen3_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Qwen3: RMSNorm on every q and k head (no flag: the architecture has it); Qwen2's gated sliding
    window spelled per layer (layers >= max_window_layers slide when use_sliding_window)."""
    _biases(cfg, out)
    out["qk_norm"] = "rmsnorm"
    window = cfg.get("sliding_window") if cfg.flag("use_sliding_window") else None
    first = cfg.get("max_window_layers")
    first = _int(cfg, "max_window_layers", first)
    default = ["sliding_attention" if window is not None and i >= first else "full_attention"
               for i in range(out["num_layers"])]
    _set_layer_types(cfg, out, default, window)


def _qwen3_moe_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Qwen3-MoE: layer i is MoE unless listed in `mlp_only_layers`, and iff (i + 1) % decoder_sparse_step
    == 0; dense layers use intermediate_size. A sliding window (use_sliding_window) covers every layer."""
    _biases(cfg, out)
    out["qk_norm"] = "rmsnorm"
    if cfg.data.get("num_experts") is None and cfg.has("num_local_experts"):  # transformers 5 saves this name
        out["num_experts"] = _positive(cfg, "num_local_experts")
    n = out["num_layers"]
    window = cfg.get("sliding_window") if cfg.flag("use_sliding_window") else None
    _set_layer_types(cfg, out, ["sliding_attention" if window is not None else "full_attention"] * n, window)
    dense = set(_index_list(cfg, "mlp_only_layers", n))
    step = _positive(cfg, "decoder_sparse_step")
    _routing_values(cfg, out, scoring="softmax", groups=False)
    _top_k(cfg, out)
    _dense_layers(out, lambda i: i not in dense and (i + 1) % step == 0)


def _qwen2_moe_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention (q/k/v biases from `qkv_bias`, none on o_proj); layer i is MoE
    unless listed in `mlp_only_layers`, and iff (i + 1) % decoder_sparse_step == 0 (dense layers use
    intermediate_size); one shared expert of shared_expert_intermediate_size behind a sigmoid gate; softmax
    routing, renormalised with norm_topk_prob. With use_sliding_window, layer i slides iff i is even and below
    max_window_layers (Qwen2MoeConfig's `layer_types`, where not given)."""
    out["qkv_bias"], out["out_bias"] = cfg.flag("qkv_bias"), False
    n = out["num_layers"]
    window = cfg.get("sliding_window") if cfg.flag("use_sliding_window") else None
    first = _int(cfg, "max_window_layers", cfg.get("max_window_layers"))
    default = ["sliding_attention" if window is not None and (i + 1) % 2 and i < first else "full_attention"
               for i in range(n)]
    _set_layer_types(cfg, out, default, window)
    dense = set(_index_list(cfg, "mlp_only_layers", n))
    step = _positive(cfg, "decoder_sparse_step")
    out.update(shared_experts=1, shared_ffn_size=_positive(cfg, "shared_expert_intermediate_size"),
               shared_expert_gate=True)
    _routing_values(cfg, out, scoring="softmax", groups=False)
    _top_k(cfg, out)
    _dense_layers(out, lambda i: i not in dense and (i + 1) % step == 0)


def _olmoe_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """OLMoE: q and k each RMS-normed across all their heads (`rmsnorm_across_heads`, after the projections and
    before the rotation, with input norms as Llama's; under tensor parallelism gathered whole first, as vLLM's
    `OlmoeAttention._apply_qk_norm` runs it: `qk_norm_gathered`), q/k/v/o biases from attention_bias, every layer
    a mixture of intermediate_size experts routed by softmax (renormalised with norm_topk_prob), no shared expert.
    `clip_qkv` (q, k and v clamped) is refused by name; head_dim is hidden / heads (its q norm spans hidden)."""
    _biases(cfg, out)
    clip = cfg.get("clip_qkv", None)
    if clip is not None:
        raise cfg.refuse("clip_qkv", clip, "the clamp of q, k and v is not built")
    head_dim = out["hidden_size"] // out["num_heads"]
    if out.get("head_dim") not in (None, head_dim):
        raise cfg.refuse("head_dim", out["head_dim"], f"OLMoE's q norm spans hidden_size: head_dim is {head_dim}")
    out.update(qk_norm="rmsnorm_across_heads", qk_norm_gathered=True)
    _routing_values(cfg, out, scoring="softmax", groups=False)
    _top_k(cfg, out)


def _mla_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """DeepSeek-V2/V3, Kimi-K2: multi-head latent attention and shared-expert MoE. head_dim is the q/k
    width per head (qk_nope_head_dim + qk_rope_head_dim, what the unabsorbed attention multiplies),
    rotary_dim the rotary part; the cache holds kv_lora_rank + qk_rope_head_dim per token and layer.
    num_key_value_heads is not the cache's head count: the KV heads are the query heads (unabsorbed)."""
    mt = cfg.data.get("model_type")
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if (key in cfg.data and cfg.data[key] is None) or cfg.get(key) is None:  # absent: the class default
            raise SpecError(f"{cfg.origin}: multi-head latent attention needs {key} (missing or null)")
        out[_MLA_FIELDS[key]] = _positive(cfg, key)
    q_rank = cfg.get("q_lora_rank")
    out["q_lora_rank"] = None if q_rank is None else _positive(cfg, "q_lora_rank", q_rank)
    out["head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    out["rotary_dim"] = out["qk_rope_head_dim"]
    cfg.get("num_key_value_heads")  # read, not used: the unabsorbed KV heads are the query heads
    out["num_kv_heads"] = out["num_heads"]
    _biases(cfg, out)
    if mt == "deepseek_v2" and cfg.flag("mlp_bias"):
        raise cfg.refuse("mlp_bias", True, "DeepSeek-V2 puts it on the dense and shared MLPs only")
    out["mtp_layers"] = _count(cfg, "num_nextn_predict_layers")
    first_dense = _count(cfg, "first_k_dense_replace")
    # DeepSeek's own modelling also needs layer % moe_layer_freq == 0 (transformers drops the field;
    # every published config has 1)
    freq = _positive(cfg, "moe_layer_freq", cfg.get("moe_layer_freq"))
    method = cfg.get("topk_method", None)
    if mt == "deepseek_v2":
        out["router_score_bias"] = False
        if method not in (None, "greedy", "group_limited_greedy"):
            raise cfg.refuse("topk_method", method, "DeepSeek-V2 routes greedy or group_limited_greedy")
    else:  # transformers' DeepseekV3TopkRouter always holds the noaux_tc score-correction bias
        if method not in (None, "noaux_tc"):
            raise cfg.refuse("topk_method", method, "DeepSeek-V3 routes noaux_tc")
        out["router_score_bias"] = True
    out["shared_experts"] = _count(cfg, "n_shared_experts")
    if mt == "deepseek_v2":  # softmax scores, no renormalisation; groups only for group_limited_greedy
        _routing_values(cfg, out, scoring="softmax", renormalize=False, groups=method == "group_limited_greedy")
        out["rope_interleaved"] = True  # transformers' DeepseekV2 rotates complex pairs
    else:  # DeepseekV3TopkRouter: sigmoid scores, noaux_tc group-limited routing
        _routing_values(cfg, out, scoring="sigmoid")
        interleave = cfg.get("rope_interleave", True)
        if not isinstance(interleave, bool):
            raise SpecError(f"{cfg.origin}: rope_interleave must be true or false, got {interleave!r}")
        out["rope_interleaved"] = interleave
    _top_k(cfg, out)
    _dense_layers(out, lambda i: i >= first_dense and i % freq == 0)


def _dsa_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """DeepSeek-V3.2 and GLM-5: DeepSeek-V3's MLA and MoE with DeepSeek Sparse Attention in every layer
    (`layer_types` all `indexed_attention`): the lightning indexer's heads, head dim and top-k.
    `mlp_layer_types` ("dense" / "sparse" a layer), where given, says which FFNs are dense (else
    first_k_dense_replace). GLM-5 (`glm_moe_dsa`): `indexer_types` ("full" runs the indexer, "shared"
    reuses the previous full layer's top-k), else transformers' pattern (`_glm5_indexer_types`)."""
    _mla_extra(cfg, out)
    for f in ("index_n_heads", "index_head_dim", "index_topk"):
        out[f] = _positive(cfg, f)
    n = out["num_layers"]
    kinds = cfg.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != n:
            raise SpecError(f"{cfg.origin}: layer_types must list num_hidden_layers={n} kinds, got {kinds!r}")
        other = [k for k in kinds if k != "indexed_attention"]
        if other:
            raise cfg.refuse("layer_types", other[0], "every DeepSeek Sparse Attention layer is indexed_attention")
    if cfg.get("model_type") == "glm_moe_dsa":
        indexers = _glm5_indexer_types(cfg, n)
        if indexers[0] != "full":
            raise cfg.refuse("indexer_types", indexers[0], "layer 0 has no earlier top-k to reuse")
        out["shared_topk_layers"] = tuple(i for i, t in enumerate(indexers) if t == "shared")
    _mlp_layer_types(cfg, out)


def _mlp_layer_types(cfg: _Config, out: dict[str, Any]) -> bool:
    """`mlp_layer_types` ("dense" / "sparse" a layer), where given, says which FFNs are dense; whether given."""
    n, mlp = out["num_layers"], cfg.get("mlp_layer_types")
    if mlp is None:
        return False
    if not isinstance(mlp, list) or len(mlp) != n or not set(mlp) <= {"dense", "sparse"}:
        raise SpecError(f"{cfg.origin}: mlp_layer_types must list num_hidden_layers={n} of dense / sparse, got {mlp!r}")
    _dense_layers(out, lambda i: mlp[i] == "sparse")
    return True


def _glm4_moe_lite_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """GLM-4.7-Flash (`glm4_moe_lite`): DeepSeek-V3's MLA and MoE (sigmoid routing with its score-correction
    bias, a shared expert); its dense layers come from `mlp_layer_types` (transformers' default: layer 0).
    A `first_k_dense_replace` other than 1 without `mlp_layer_types` is refused: transformers ignores it
    and builds layer 0 dense, DeepSeek-style engines honour it."""
    _mla_extra(cfg, out)
    if not _mlp_layer_types(cfg, out) and _count(cfg, "first_k_dense_replace") != 1:
        raise cfg.refuse("first_k_dense_replace", cfg.get("first_k_dense_replace"),
                         "transformers' Glm4MoeLite builds its dense layers from mlp_layer_types, default layer 0 "
                         "only; give mlp_layer_types")


def _glm5_indexer_types(cfg: _Config, n: int) -> list[str]:
    """GLM-5's per-layer indexer mode, as GlmMoeDsaConfig decides it: `indexer_types`, else
    `index_topk_pattern` ("F" full, "S" shared, a string or a list), else layer i runs its indexer iff
    max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (defaults 2 and 1: every layer)."""
    given = cfg.get("indexer_types")
    if given is None and cfg.get("index_topk_pattern") is not None:
        pattern = cfg.get("index_topk_pattern")
        letters = {"F": "full", "S": "shared"}
        if isinstance(pattern, str):
            if not set(pattern) <= set(letters):
                raise cfg.refuse("index_topk_pattern", pattern, "a pattern is F (full) and S (shared) letters")
            pattern = [letters[c] for c in pattern]
        given, key = pattern, "index_topk_pattern"
    else:
        key = "indexer_types"
    if given is None:
        freq = cfg.get("index_topk_freq", 1)
        offset = cfg.get("index_skip_topk_offset", 2)
        for k, v in (("index_topk_freq", freq), ("index_skip_topk_offset", offset)):
            if not is_count(v) or v < 0:
                raise SpecError(f"{cfg.origin}: {k} must be an integer >= 0, got {v!r}")
        freq = max(freq, 1)
        return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if not isinstance(given, list) or len(given) != n or not set(given) <= {"full", "shared"}:
        raise SpecError(f"{cfg.origin}: {key} must list num_hidden_layers={n} of full / shared, got {given!r}")
    return given


_MLA_FIELDS = {"kv_lora_rank": "kv_lora_rank", "qk_nope_head_dim": "qk_nope_head_dim",
               "qk_rope_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim"}


def _partial_rotary(cfg: _Config, out: dict[str, Any], *, hub_rotary_dim: bool = False) -> None:
    """`rotary_dim` from partial_rotary_factor (in rope_parameters or at the top level); with
    `hub_rotary_dim`, the hub's own `rotary_dim` where no factor is given (transformers converts it)."""
    head_dim = out.get("head_dim") or out["hidden_size"] // out["num_heads"]
    nested = _rope_parameters(cfg).get("partial_rotary_factor")
    if hub_rotary_dim and nested is None and not cfg.has("partial_rotary_factor") and cfg.has("rotary_dim"):
        rotary = _positive(cfg, "rotary_dim")
        if rotary > head_dim or rotary % 2:
            raise SpecError(f"{cfg.origin}: rotary_dim={rotary} must be even and at most head_dim={head_dim}")
        out["rotary_dim"] = rotary
        return
    fraction = _rope_parameters(cfg).get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    fraction = _number(cfg, "partial_rotary_factor", fraction)
    if not 0 < fraction <= 1:
        raise SpecError(f"{cfg.origin}: partial_rotary_factor must be in (0, 1], got {fraction!r}")
    out["rotary_dim"] = int(head_dim * fraction)


def _gated_deltanet_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Qwen3-Next and Qwen3.5 (text): Gated DeltaNet (`linear_attention`) layers and gated full-attention
    layers (`layer_types`, else every `full_attention_interval`-th layer full), RMSNorms that multiply by
    1 + weight (the q/k norms too), partial rotary positions; `mamba_ssm_dtype`: the recurrent state's dtype.
    Qwen3-Next is MoE by `decoder_sparse_step` / `mlp_only_layers`; Qwen3.5-MoE every layer;
    both with one shared expert behind a sigmoid gate. Qwen3.5's M-RoPE equals RoPE for text positions."""
    _biases(cfg, out)
    out.update(qk_norm="rmsnorm", norm_offset=True, attn_output_gate=True)
    gate = cfg.get("attn_output_gate", True)
    if gate is not True:
        raise cfg.refuse("attn_output_gate", gate, "transformers builds the gated attention of this model type")
    for f in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
        out[f] = _positive(cfg, f)
    out["linear_conv_kernel"] = _positive(cfg, "linear_conv_kernel_dim")
    if cfg.has("mamba_ssm_dtype"):
        ssm = cfg.get("mamba_ssm_dtype")
        if str(ssm) not in ("float32", "float16", "bfloat16"):
            raise cfg.refuse("mamba_ssm_dtype", ssm, "a recurrent state is kept in float32, float16 or bfloat16")
        out["state_dtype"] = normalize_dtype(str(ssm))
    _partial_rotary(cfg, out)
    if cfg.has("mtp_num_hidden_layers"):
        out["mtp_layers"] = _count(cfg, "mtp_num_hidden_layers")
    n = out["num_layers"]
    interval = _positive(cfg, "full_attention_interval")
    default = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    _set_layer_types(cfg, out, default, None)
    if out.get("layer_types") is None:  # no linear layer at all: plain gated attention
        for f in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                  "linear_conv_kernel", "state_dtype"):
            out.pop(f, None)
    mt = cfg.get("model_type")
    if mt == "qwen3_5_text":
        return
    out["shared_experts"] = 1
    out["shared_ffn_size"] = _positive(cfg, "shared_expert_intermediate_size")
    out["shared_expert_gate"] = True
    if mt == "qwen3_5_moe_text":
        _routing_values(cfg, out, scoring="softmax", renormalize=True, groups=False)
        _top_k(cfg, out)
        return
    # num_experts 0 (transformers then builds every layer dense) is refused by the count check, as for qwen3_moe
    dense = set(_index_list(cfg, "mlp_only_layers", n))
    step = _positive(cfg, "decoder_sparse_step")
    _routing_values(cfg, out, scoring="softmax", groups=False)
    _top_k(cfg, out)
    _dense_layers(out, lambda i: i not in dense and (i + 1) % step == 0)


_GRANITE_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "logits_scaling", "attention_multiplier")
#: granitemoehybrid's layer types (transformers 5 remaps the hub's `mamba` / `attention`) -> ModelSpec's
_GRANITE_LAYERS = {"linear_attention": "linear", "mamba": "linear", "full_attention": "full", "attention": "full"}


def _granite_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """IBM Granite 3.x / 4.0 (granite, granitemoe, granitemoeshared, granitemoehybrid): Llama's or Mixtral's
    layers with four scalars (the embedding, each sublayer's output before its residual add and the logits scaled,
    the softmax scale set) read as `ModelSpec` fields. The MoE types route by a softmax over the top-k logits, add
    a shared MLP of `shared_intermediate_size` (none at 0) and have no FFN biases; granitemoehybrid's layers are
    Mamba-2 or attention (`_granite_hybrid`), each followed by its FFN, dense when `num_local_experts` is 0."""
    mt = cfg.data["model_type"]
    _biases(cfg, out)
    out["mlp_bias"] = cfg.flag("mlp_bias") if mt == "granite" else False
    for key in _GRANITE_MULTIPLIERS:
        value = _positive_number(cfg, key, cfg.get(key))
        out[key] = value if key == "attention_multiplier" else float(value)
    if mt == "granite":
        return
    if mt == "granitemoehybrid":
        _granite_hybrid(cfg, out)
    shared = _count(cfg, "shared_intermediate_size") if mt != "granitemoe" else 0
    experts = _count(cfg, "num_local_experts")
    if experts == 0 and mt == "granitemoehybrid":  # transformers builds the shared MLP alone: a dense FFN
        if shared == 0:
            raise cfg.refuse("shared_intermediate_size", 0, "num_local_experts 0 leaves the layers no FFN")
        out["ffn_size"] = shared
        for f in ("num_experts", "experts_per_token"):
            out.pop(f, None)
        return
    out["num_experts"] = experts
    _top_k(cfg, out)
    if shared:
        out["shared_experts"], out["shared_ffn_size"] = 1, shared
    out.update(router_scoring="softmax", router_renormalize=True)  # softmax over the top-k logits


def _granite_hybrid(cfg: _Config, out: dict[str, Any]) -> None:
    """granitemoehybrid's layers (`layer_types`, alias `layers_block_type`; default all Mamba-2) and its Mamba-2
    mixers (`_mamba2_fields`); attention layers rotate positions only with `position_embedding_type` rope."""
    n = out["num_layers"]
    key = next((k for k in ("layer_types", "layers_block_type") if cfg.has(k)), "layer_types")
    kinds = cfg.get(key) if cfg.has(key) else ["linear_attention"] * n
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise SpecError(f"{cfg.origin}: {key} must be a list of layer types, got {kinds!r}")
    if len(kinds) != n:
        raise SpecError(f"{cfg.origin}: {key} has {len(kinds)} entries, num_hidden_layers={n}")
    unknown = [k for k in kinds if k not in _GRANITE_LAYERS]
    if unknown:
        raise cfg.refuse(key, unknown[0], "granitemoehybrid builds Mamba-2 (linear_attention) and full_attention "
                         "layers")
    types = [_GRANITE_LAYERS[k] for k in kinds]
    pos = cfg.get("position_embedding_type")
    if pos not in (None, "rope"):
        raise cfg.refuse("position_embedding_type", pos, "granitemoehybrid rotates positions with rope, else none")
    out["nope_layers"] = () if pos == "rope" else tuple(i for i, t in enumerate(types) if t == "full")
    out["layer_types"] = None if set(types) == {"full"} else tuple(types)
    out["sliding_window"] = None
    if "linear" in types:
        _mamba2_fields(cfg, out)


def _mamba2_fields(cfg: _Config, out: dict[str, Any]) -> None:
    """The Mamba-2 mixers of Granite 4.0-H and Bamba (`mamba_*`, transformers' BambaMixer: its convolution's
    activation is `hidden_act`, its gated norm's eps `rms_norm_eps`, dt clamped to `time_step_limit` in a prompt)."""
    if out.get("hidden_act") not in ("silu", "swish"):
        raise cfg.refuse("hidden_act", out.get("hidden_act"), "it is also the Mamba-2 convolution's activation, "
                         "read as silu")
    heads, expand = _positive(cfg, "mamba_n_heads"), _positive(cfg, "mamba_expand")
    inner = expand * out["hidden_size"]
    head_dim = cfg.get("mamba_d_head")
    if head_dim == "auto":
        head_dim = inner // heads
    if not is_count(head_dim) or head_dim * heads != inner:
        raise SpecError(f"{cfg.origin}: mamba_d_head={cfg.get('mamba_d_head')!r} x mamba_n_heads={heads} must be "
                        f"mamba_expand x hidden_size = {inner}")
    raw = cfg.get("time_step_limit")
    limit = [_saved_float(v) for v in raw] if isinstance(raw, (list, tuple)) else [raw]
    if len(limit) != 2 or not all(is_real(v) or v == float("inf") for v in limit) or not 0 <= limit[0] < limit[1]:
        raise SpecError(f"{cfg.origin}: time_step_limit must be [min >= 0, max > min], "
                        f"got {cfg.get('time_step_limit')!r}")
    if limit[1] != float("inf"):
        raise cfg.refuse("time_step_limit", cfg.get("time_step_limit"), "an upper clamp of dt")
    for f in ("mamba_conv_bias", "mamba_proj_bias"):
        if not isinstance(cfg.get(f), bool):
            raise SpecError(f"{cfg.origin}: {f} must be true or false, got {cfg.get(f)!r}")
    out.update(linear_mixer="mamba2", linear_num_key_heads=_positive(cfg, "mamba_n_groups"),
               linear_num_value_heads=heads, linear_key_head_dim=_positive(cfg, "mamba_d_state"),
               linear_value_head_dim=head_dim, linear_conv_kernel=_positive(cfg, "mamba_d_conv"),
               linear_chunk_size=_positive(cfg, "mamba_chunk_size"), linear_conv_bias=cfg.get("mamba_conv_bias"),
               linear_proj_bias=cfg.get("mamba_proj_bias"), linear_dt_min=float(limit[0]),
               state_dtype="fp32")  # no mamba_ssm_cache_dtype: transformers' cache keeps its scan's fp32 state


def _saved_float(value: Any) -> Any:
    """A number as transformers saves a non-finite one (`{"__float__": "Infinity"}`) read back; anything else as is."""
    if isinstance(value, Mapping) and isinstance(value.get("__float__"), str):
        try:
            return float(value["__float__"])
        except ValueError:
            return value
    return value


def _bamba_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Bamba: Llama's layers (biases from `attention_bias`, `mlp_bias`) whose token mixer is attention in the
    layers `attn_layer_indices` lists and a Mamba-2 mixer in the others (`_mamba2_fields`), each followed by its
    MLP; the attention rotates the first `partial_rotary_factor` of each head (`rope_parameters`, else the 0.5
    BambaConfig sets)."""
    _biases(cfg, out)
    out["mlp_bias"] = cfg.flag("mlp_bias")
    for key in ("layers_block_type", "layer_types"):
        if cfg.has(key):
            raise cfg.refuse(key, cfg.get(key), "Bamba's layers follow attn_layer_indices (its config class derives "
                             "them)")
    n = out["num_layers"]
    attn = set(_index_list(cfg, "attn_layer_indices", n))
    types = ["full" if i in attn else "linear" for i in range(n)]
    out["layer_types"] = None if not attn ^ set(range(n)) else tuple(types)
    out["sliding_window"] = None
    fraction = _number(cfg, "rope_parameters.partial_rotary_factor",
                       _rope_parameters(cfg).get("partial_rotary_factor", 0.5))
    if not 0 < fraction <= 1:
        raise SpecError(f"{cfg.origin}: rope_parameters.partial_rotary_factor must be in (0, 1], got {fraction!r}")
    heads, head_dim = out["num_heads"], out.get("head_dim")
    if head_dim is None and out["hidden_size"] % heads == 0:
        head_dim = out["hidden_size"] // heads
    if head_dim:
        out["rotary_dim"] = int(head_dim * fraction)
    if attn != set(range(n)):
        _mamba2_fields(cfg, out)


#: Nemotron-H's block types (`layers_block_type`, or the legacy `hybrid_override_pattern` characters M, *, -, E)
#: -> (ModelSpec layer_types entry, has a token mixer without an FFN)
_NEMOTRON_BLOCKS = {"linear_attention": ("linear", True), "full_attention": ("full", True), "mlp": ("none", False),
                    "moe": ("none", False)}
_NEMOTRON_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
#: NemotronHConfig's legacy keyword arguments (its __post_init__ pops them over the new keys)
_NEMOTRON_LEGACY = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "use_conv_bias": "mamba_conv_bias",
                    "chunk_size": "mamba_chunk_size", "time_step_min": "mamba_dt_min"}
#: the activations of Nemotron-H's two-matrix MLPs and experts -> ModelSpec's ffn_kind
_NEMOTRON_ACTS = {"relu2": "relu", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}


def _nemotron_get(cfg: _Config, key: str) -> Any:
    """A Nemotron-H key, its legacy spelling first (`_NEMOTRON_LEGACY`), as NemotronHConfig reads it."""
    legacy, value = _NEMOTRON_LEGACY.get(key), cfg.get(key)
    return cfg.get(legacy) if legacy is not None and cfg.has(legacy) else value


def _nemotron_blocks(cfg: _Config) -> list[str]:
    """Every layer's block type: `layers_block_type` (or its alias `layer_types`), else the legacy
    `hybrid_override_pattern`, else the config class's default; the number of layers is its length, as
    transformers builds it (`num_hidden_layers` is ignored)."""
    cfg.get("num_hidden_layers")
    key = next((k for k in ("layers_block_type", "layer_types") if cfg.has(k)), None)
    if key is None and cfg.has("hybrid_override_pattern"):
        pattern = cfg.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern or any(c not in _NEMOTRON_PATTERN for c in pattern):
            raise SpecError(f"{cfg.origin}: hybrid_override_pattern must be a non-empty string of "
                            f"{', '.join(_NEMOTRON_PATTERN)}, got {pattern!r}")
        return [_NEMOTRON_PATTERN[c] for c in pattern]
    blocks = cfg.get(key) if key is not None else ["linear_attention", "moe", "full_attention", "mlp"]
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, str) for b in blocks):
        raise SpecError(f"{cfg.origin}: {key} must be a non-empty list of block types, got {blocks!r}")
    unknown = [b for b in blocks if b not in _NEMOTRON_BLOCKS]
    if unknown:
        raise SpecError(f"{cfg.origin}: {key} holds {unknown[0]!r} (known: {', '.join(_NEMOTRON_BLOCKS)})")
    return blocks


def _nemotron_h_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Nemotron-H (NVIDIA Nemotron-H, Nemotron-Nano 2 and 3): each layer is one sublayer behind its RMSNorm: a
    Mamba-2 mixer, attention without positions, a two-matrix MLP (relu2) or a mixture of such experts (at a
    latent width with `moe_latent_size`) beside one shared expert, with DeepSeek-V3's sigmoid routing and
    score-correction bias (`layers_block_type`). The
    attention has no biases (transformers builds none whatever `attention_bias` says), and the MoE layers one
    shared expert (`n_shared_experts` other than 1 is refused), the lm_head its own weights (a tied one is
    refused)."""
    blocks = _nemotron_blocks(cfg)
    out["num_layers"] = len(blocks)
    act = out.get("hidden_act")
    if act not in _NEMOTRON_ACTS:
        raise cfg.refuse("mlp_hidden_act", act, f"Nemotron-H's MLPs are read with {', '.join(_NEMOTRON_ACTS)}")
    out["ffn_kind"] = _NEMOTRON_ACTS[act]
    if out.get("tied_embeddings"):
        raise cfg.refuse("tie_word_embeddings", True, "transformers' NemotronHForCausalLM keeps an lm_head of its own")
    out["qkv_bias"] = out["out_bias"] = False
    out["mlp_bias"] = cfg.flag("mlp_bias")
    for key, neutral, why in (("residual_in_fp32", False, "an fp32 residual stream"),
                              ("sliding_window", None, "transformers' Nemotron-H attends to every token")):
        value = cfg.get(key, None)
        if value not in (neutral, None):
            raise cfg.refuse(key, value, why)
    mixer = cfg.get("mamba_hidden_act")
    if mixer not in ("silu", "swish"):
        raise cfg.refuse("mamba_hidden_act", mixer, "the Mamba-2 mixer is read with silu")
    types = [_NEMOTRON_BLOCKS[b][0] for b in blocks]
    out["layer_types"] = tuple(types)
    out["mixer_only_layers"] = tuple(i for i, b in enumerate(blocks) if _NEMOTRON_BLOCKS[b][1])
    out["nope_layers"] = tuple(i for i, t in enumerate(types) if t == "full")
    out["sliding_window"] = None
    if "linear" in types:
        out.update(linear_mixer="mamba2",
                   linear_num_key_heads=_positive(cfg, "n_groups", _nemotron_get(cfg, "n_groups")),
                   linear_num_value_heads=_positive(cfg, "mamba_num_heads"),
                   linear_key_head_dim=_positive(cfg, "ssm_state_size"),
                   linear_value_head_dim=_positive(cfg, "mamba_head_dim"),
                   linear_conv_kernel=_positive(cfg, "conv_kernel", _nemotron_get(cfg, "conv_kernel")),
                   linear_chunk_size=_positive(cfg, "chunk_size", _nemotron_get(cfg, "chunk_size")),
                   linear_proj_bias=cfg.flag("use_bias"))
        conv_bias = _nemotron_get(cfg, "use_conv_bias")
        if not isinstance(conv_bias, bool):
            raise SpecError(f"{cfg.origin}: use_conv_bias must be true or false, got {conv_bias!r}")
        out["linear_conv_bias"] = conv_bias
        dt_min = _nemotron_get(cfg, "time_step_min")
        if isinstance(dt_min, bool) or not isinstance(dt_min, (int, float)) or not 0 <= dt_min < float("inf"):
            raise SpecError(f"{cfg.origin}: time_step_min must be a finite number >= 0, got {dt_min!r}")
        out["linear_dt_min"] = float(dt_min)  # the chunked scan's clamp of dt (transformers' mixer)
        ssm = cfg.get("mamba_ssm_cache_dtype")
        if str(ssm) not in ("float32", "float16", "bfloat16"):
            raise cfg.refuse("mamba_ssm_cache_dtype", ssm, "a recurrent state is kept in float32, float16 or bfloat16")
        out["state_dtype"] = normalize_dtype(str(ssm))
    out["mtp_layers"] = _count(cfg, "num_nextn_predict_layers")
    if "moe" not in blocks:
        for f in ("num_experts", "experts_per_token", "moe_ffn_size"):
            out.pop(f, None)
        return
    if out["mlp_bias"]:
        raise cfg.refuse("mlp_bias", True, "Nemotron-H's routed experts have no bias while its MLPs would")
    shared = _count(cfg, "n_shared_experts")
    if shared != 1:
        raise cfg.refuse("n_shared_experts", shared, "transformers builds one shared expert of "
                         "moe_shared_expert_intermediate_size whatever it says")
    out["shared_experts"] = 1
    out["shared_ffn_size"] = _positive(cfg, "moe_shared_expert_intermediate_size")
    if cfg.has("moe_latent_size"):  # the routed experts' width in and out, projected down and up around them
        out["moe_latent_size"] = _positive(cfg, "moe_latent_size")
    out["router_score_bias"] = True
    _routing_values(cfg, out, scoring="sigmoid")
    _top_k(cfg, out)
    _dense_layers(out, lambda i: blocks[i] == "moe")


#: DeepseekV4Config's defaults (transformers 5.24; `compress_rates` and the default layer and MLP schedules are
#: its __post_init__'s, `_deepseek_v4_extra`)
_DEEPSEEK_V4_DEFAULTS = dict(
    vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43, num_attention_heads=64,
    num_key_value_heads=1, head_dim=512, q_lora_rank=1024, num_experts_per_tok=6, n_routed_experts=256,
    n_shared_experts=1, scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5,
    max_position_embeddings=1048576, rope_theta=10000.0, compress_rope_theta=160000.0, hc_mult=4,
    hc_sinkhorn_iters=20, hc_eps=1.0e-6, swiglu_limit=10.0, sliding_window=128, o_groups=8, o_lora_rank=1024,
    index_n_heads=64, index_head_dim=128, index_topk=512, num_nextn_predict_layers=1, hidden_act="silu",
    rms_norm_eps=1.0e-6, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
#: DeepSeek-V4's layer_types -> ModelSpec's; its legacy per-layer `compress_ratios` (0, 4, 128) -> layer_types
_V4_LAYER_TYPES = {"sliding_attention": "sliding", "compressed_sparse_attention": "csa",
                   "heavily_compressed_attention": "hca"}
_V4_COMPRESS_RATIOS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def _v4_schedule(cfg: _Config, key: str, allowed: tuple[str, ...], default: list[str]) -> list[str]:
    """A DeepSeek-V4 per-layer list (`layer_types`, `mlp_layer_types`) as DeepseekV4Config keeps it: its first
    num_hidden_layers entries (fewer are refused, as transformers refuses them), else `default`."""
    n = len(default)
    value = cfg.get(key) if cfg.has(key) else default
    if not isinstance(value, list) or len(value) < n:
        raise SpecError(f"{cfg.origin}: {key} must list num_hidden_layers={n} entries, got {value!r}")
    bad = [t for t in value[:n] if t not in allowed]
    if bad:
        raise SpecError(f"{cfg.origin}: {key} holds {bad[0]!r} (DeepSeek-V4's: {', '.join(allowed)})")
    return list(value[:n])


def _v4_layer_types(cfg: _Config, n: int) -> list[str]:
    """DeepSeek-V4's attention schedule: `layer_types`, else the legacy `compress_ratios` (0 / 4 / 128 per layer),
    else DeepseekV4Config's default (two hca layers, then hca and csa alternating)."""
    default = ["heavily_compressed_attention"] * min(n, 2) + [
        "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
    if not cfg.has("layer_types") and cfg.has("compress_ratios"):
        ratios = cfg.get("compress_ratios")
        if not isinstance(ratios, list) or len(ratios) < n or any(r not in _V4_COMPRESS_RATIOS for r in ratios[:n]):
            raise SpecError(f"{cfg.origin}: compress_ratios must list num_hidden_layers={n} of 0, 4 or 128, got "
                            f"{ratios!r}")
        default = [_V4_COMPRESS_RATIOS[r] for r in ratios[:n]]
    return _v4_schedule(cfg, "layer_types", tuple(_V4_LAYER_TYPES), default)


def _v4_rates(cfg: _Config, kinds: list[str]) -> dict[str, int]:
    """The compression rate of each compressed layer type present: `compress_rates` (else 4 and 128), the
    legacy `compress_rate_csa` / `compress_rate_hca` over it."""
    rates = cfg.get("compress_rates", {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128})
    if not isinstance(rates, Mapping):
        raise SpecError(f"{cfg.origin}: compress_rates must be a mapping of layer type to rate, got {rates!r}")
    rates = dict(rates)
    for key, layer_type in (("compress_rate_csa", "compressed_sparse_attention"),
                            ("compress_rate_hca", "heavily_compressed_attention")):
        if cfg.has(key):
            rates[layer_type] = cfg.get(key)
    out = {}
    for layer_type, field_name in (("compressed_sparse_attention", "csa_rate"),
                                   ("heavily_compressed_attention", "hca_rate")):
        if layer_type in kinds:
            if layer_type not in rates:
                raise SpecError(f"{cfg.origin}: compress_rates has no rate for the {layer_type} layers")
            out[field_name] = _positive(cfg, f"compress_rates.{layer_type}", rates[layer_type])
    return out


def _v4_rope(cfg: _Config, out: dict[str, Any]) -> None:
    """DeepSeek-V4's rotary: `partial_rotary_factor` (else the legacy qk_rope_head_dim / head_dim, else 1/8) of
    each head, interleaved pairs; the sliding layers' base `rope_theta`, the compressed layers' `compress_rope_theta`
    and scaling (`rope_parameters`' main / compress, or flat as DeepseekV4Config folds it): values, not costs."""
    d = out["head_dim"]
    factor = cfg.get("partial_rotary_factor", None)
    if factor is None:
        factor = _positive(cfg, "qk_rope_head_dim") / d if cfg.has("qk_rope_head_dim") else 64 / 512
    factor = _number(cfg, "partial_rotary_factor", factor)
    if not 0 < factor <= 1 or int(d * factor) < 2:
        raise SpecError(f"{cfg.origin}: partial_rotary_factor must leave at least 2 rotary features of head_dim={d}, "
                        f"got {factor!r}")
    out["rotary_dim"] = int(d * factor)
    out["rope_interleaved"] = True
    nested = _rope_parameters(cfg)
    if not nested and cfg.has("rope_scaling"):
        nested = cfg.get("rope_scaling")
        if not isinstance(nested, Mapping):
            raise SpecError(f"{cfg.origin}: rope_scaling must be a mapping, got {nested!r}")
    parts = {k: v for k, v in nested.items() if k in ("main", "compress") and isinstance(v, Mapping)}
    if len(parts) < 2:  # flat: the compressed layers' scaling, the sliding layers' plain rotary
        parts = {"compress": {k: v for k, v in nested.items() if k not in ("main", "compress")}}
    for label, params in parts.items():
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise cfg.refuse(f"rope_parameters.{label}.rope_type", kind, f"supported: {', '.join(ROPE_TYPES)}")
    main = parts.get("main", {})
    out["rope_theta"] = _positive_number(cfg, "rope_theta", main.get("rope_theta", cfg.get("rope_theta")))
    _positive_number(cfg, "compress_rope_theta", parts["compress"].get("rope_theta", cfg.get("compress_rope_theta")))


def _deepseek_v4_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """DeepSeek-V4: every layer attends over a sliding window with one shared K = V head (MQA, a low-rank query,
    a sink per head, a grouped output projection); its csa layers add entries compressed every `csa_rate` tokens
    read through a Lightning Indexer's top-k, its hca layers entries compressed every `hca_rate` tokens; the
    residual is `hc_mult` streams mixed by hyper-connections; every layer is MoE (one shared expert, routed by a
    frozen token table in its `hash_moe` layers, else by sqrtsoftplus scores with a correction bias). What
    transformers builds otherwise than the config says is refused: more KV heads, attention or MLP biases,
    shared experts other than one, a tied head is honoured (transformers ties it)."""
    n = out["num_layers"]
    for key, neutral, why in (("num_key_value_heads", 1, "transformers builds one shared K = V head"),
                              ("attention_bias", False, "transformers' DeepseekV4Attention has no biases"),
                              ("mlp_bias", False, "it would bias the shared expert only, not the routed ones"),
                              ("n_shared_experts", 1, "transformers builds one shared expert whatever it says")):
        value = cfg.get(key)
        if value != neutral or isinstance(value, bool) != isinstance(neutral, bool):
            raise cfg.refuse(key, value, why)
    expert_dtype = cfg.get("expert_dtype", None)
    q = cfg.get("quantization_config", None)
    if expert_dtype is None and isinstance(q, Mapping):
        expert_dtype = q.get("expert_dtype")
    if expert_dtype is not None:
        raise cfg.refuse("expert_dtype", expert_dtype, "a dtype of the routed experts apart from quantization_config's "
                         "format is not read")
    out["num_kv_heads"] = 1
    out["qkv_bias"] = out["out_bias"] = out["mlp_bias"] = False
    out["attn_sinks"] = True
    out["q_lora_rank"] = _positive(cfg, "q_lora_rank")
    out["o_groups"], out["o_lora_rank"] = _positive(cfg, "o_groups"), _positive(cfg, "o_lora_rank")
    out["hc_mult"] = _positive(cfg, "hc_mult")
    out["hc_sinkhorn_iters"] = _count(cfg, "hc_sinkhorn_iters")
    eps = _number(cfg, "hc_eps", cfg.get("hc_eps"))  # a value, not a cost: a floor of the Sinkhorn normalisation
    if not 0 <= eps < float("inf"):
        raise SpecError(f"{cfg.origin}: hc_eps must be a finite number >= 0, got {eps!r}")
    _v4_rope(cfg, out)
    names = _v4_layer_types(cfg, n)
    kinds = [_V4_LAYER_TYPES[t] for t in names]
    out["layer_types"] = tuple(kinds)
    out["sliding_window"] = _positive(cfg, "sliding_window")
    out.update(_v4_rates(cfg, names))
    index = {f: _positive(cfg, f) for f in ("index_n_heads", "index_head_dim", "index_topk")}
    if "csa" in kinds:  # only csa layers build an indexer
        out.update(index)
    hashed = min(n, _count(cfg, "num_hash_layers") if cfg.has("num_hash_layers") else 3)  # the legacy key, else 3
    mlp = _v4_schedule(cfg, "mlp_layer_types", ("hash_moe", "moe"), ["hash_moe"] * hashed + ["moe"] * (n - hashed))
    out["hash_moe_layers"] = tuple(i for i, t in enumerate(mlp) if t == "hash_moe")
    out["shared_experts"] = 1
    out["router_score_bias"] = "moe" in mlp  # the scored layers' e_score_correction_bias (a persistent buffer)
    out["mtp_layers"] = _count(cfg, "num_nextn_predict_layers")
    if cfg.get("swiglu_limit", None) is not None:  # a value, not a cost; not gpt-oss's clamp (ModelSpec.swiglu_limit)
        _positive_number(cfg, "swiglu_limit", cfg.get("swiglu_limit"))
    func = cfg.get("scoring_func")
    if func not in ("sqrtsoftplus", "softmax", "sigmoid"):
        raise cfg.refuse("scoring_func", func, "DeepSeek-V4 routes by sqrtsoftplus, softmax or sigmoid scores")
    out["router_scoring"] = func
    out["router_renormalize"] = True  # DeepseekV4TopKRouter and HashRouter always renormalise
    cfg.get("norm_topk_prob")  # read, not used: transformers renormalises whatever it says
    out["router_scale"] = _positive_number(cfg, "routed_scaling_factor", cfg.get("routed_scaling_factor"))
    _top_k(cfg, out)


def _glm4_moe_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """GLM-4.5: GQA with q/k/v biases (none on o_proj), optional q/k RMSNorm, partial rotary, DeepSeek-V3
    style MoE (first_k_dense_replace dense layers, shared experts, noaux_tc score-correction bias)."""
    _biases(cfg, out, out_proj=False)
    if cfg.flag("use_qk_norm"):
        out["qk_norm"] = "rmsnorm"
    _partial_rotary(cfg, out)
    out["mtp_layers"] = _count(cfg, "num_nextn_predict_layers")
    out["shared_experts"] = _count(cfg, "n_shared_experts")
    out["router_score_bias"] = True
    first_dense = _count(cfg, "first_k_dense_replace")
    _routing_values(cfg, out, scoring="sigmoid")
    _top_k(cfg, out)
    _set_layer_types(cfg, out, ["full_attention"] * out["num_layers"], None)
    _dense_layers(out, lambda i: i >= first_dense)


def _minimax_m2_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """MiniMax-M2: GQA whose q and k are each RMS-normed across all their heads at once (one weight of
    heads x head_dim: `rmsnorm_across_heads`), partial rotary positions (`rotary_dim`, or transformers'
    `partial_rotary_factor`), every layer MoE of intermediate_size experts routed by sigmoid scores with
    DeepSeek's fp32 score-correction bias (no groups, renormalised top-k, no shared expert)."""
    _biases(cfg, out)
    out.update(qk_norm="rmsnorm_across_heads", router_score_bias=True, router_scoring="sigmoid",
               router_renormalize=True)
    _partial_rotary(cfg, out, hub_rotary_dim=True)
    if "rope_theta" not in _rope_parameters(cfg) and not cfg.has("rope_theta"):  # MiniMaxM2Config's default
        out["rope_theta"] = 5_000_000.0
    _top_k(cfg, out)


def _gpt_oss_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """gpt-oss: learned attention sinks, biased router and experts, alternating sliding / full layers
    (layer i slides iff i is even, GptOssConfig's default)."""
    _biases(cfg, out)
    out.update(attn_sinks=True, router_bias=True, mlp_bias=True)
    if not cfg.has("rope_scaling") and not cfg.has("rope_parameters"):  # GptOssConfig's default
        out["rope_theta"] = 150000.0 if not cfg.has("rope_theta") else out["rope_theta"]
        out["rope_scaling"] = dict(_GPT_OSS_ROPE)
    n = out["num_layers"]
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    _set_layer_types(cfg, out, default, cfg.get("sliding_window"))
    legacy = cfg.get("experts_per_token", None)  # the original checkpoint's spelling of the top-k
    if legacy is not None and legacy != out.get("experts_per_token"):
        raise SpecError(f"{cfg.origin}: experts_per_token={legacy!r} differs from num_experts_per_tok="
                        f"{out.get('experts_per_token')!r}")
    out["swiglu_limit"] = _positive_number(cfg, "swiglu_limit", cfg.get("swiglu_limit"))
    alpha = cfg.get("swiglu_alpha", GPT_OSS_SWIGLU_ALPHA)  # GptOssExperts: gate * sigmoid(alpha * gate)
    if alpha != GPT_OSS_SWIGLU_ALPHA:
        raise cfg.refuse("swiglu_alpha", alpha, f"gpt-oss's clamped SwiGLU has the slope {GPT_OSS_SWIGLU_ALPHA}")
    # GptOssTopKRouter: top-k of the logits, softmax over those k = softmax scores renormalised
    out.update(router_scoring="softmax", router_renormalize=True)
    _top_k(cfg, out)


GPT_OSS_SWIGLU_ALPHA = 1.702  # GptOssConfig's default; the engine (llmperf.engine.moe) builds this one

_GPT_OSS_ROPE = MappingProxyType({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "truncate": False, "original_max_position_embeddings": 4096})


def _nope_flags(cfg: _Config, out: dict[str, Any]) -> list[int]:
    """Each layer's rotary flag from `no_rope_layers` (1 = rotary, 0 = NoPE; an empty list or none: every
    no_rope_layer_interval-th layer NoPE, as Llama 4's and SmolLM3's config classes), into `nope_layers`."""
    n = out["num_layers"]
    flags = cfg.get("no_rope_layers")
    if flags:  # transformers: an empty list means the default
        if not isinstance(flags, list) or len(flags) != n or not all(f in (0, 1) for f in flags):
            raise SpecError(f"{cfg.origin}: no_rope_layers must be {n} flags (1: rotary, 0: NoPE), got {flags!r}")
    else:
        interval = _positive(cfg, "no_rope_layer_interval")
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    out["nope_layers"] = tuple(i for i, f in enumerate(flags) if not f)
    return flags


def _smollm3_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """SmolLM3: Llama with NoPE layers (`no_rope_layers`, default every 4th) and q/k/v/o biases from
    attention_bias; with use_sliding_window (and a window) its NoPE layers slide, as the config class derives
    `layer_types`; without it no layer slides, whatever `layer_types` says (transformers' attention)."""
    _biases(cfg, out)
    flags = _nope_flags(cfg, out)
    window = cfg.get("sliding_window")  # read either way: without use_sliding_window it changes nothing
    window = window if cfg.flag("use_sliding_window") else None
    default = ["sliding_attention" if window is not None and not f else "full_attention" for f in flags]
    _set_layer_types(cfg, out, default, window)


def _olmo_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """OLMo 2 / OLMo 3: q/k/v/o biases from attention_bias, q and k each RMS-normed across all their heads
    (under tensor parallelism gathered whole first, as vLLM runs it: `qk_norm_gathered`), each sublayer's
    output normed before its residual add (`post_norm`, no input norms); OLMo 3 slides
    three layers in four over `sliding_window` (its config class's `layer_types`)."""
    _biases(cfg, out)
    out.update(qk_norm="rmsnorm_across_heads", qk_norm_gathered=True, post_norm=True)
    if cfg.get("model_type") == "olmo3":
        n = out["num_layers"]
        default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
        _set_layer_types(cfg, out, default, cfg.get("sliding_window"))


def _exaone4_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """EXAONE 4: q and k RMS-normed per head, each sublayer's output normed before its residual add
    (`post_norm`), no biases; with a `sliding_window` layer i slides iff (i + 1) % sliding_window_pattern
    != 0 (`layer_types` where given) and only sliding layers rotate positions (its full layers are NoPE, as
    transformers applies RoPE); without one every layer is full and rotates."""
    out.update(qk_norm="rmsnorm", post_norm=True)
    n, window = out["num_layers"], cfg.get("sliding_window")
    if window is None:
        default = ["full_attention"] * n
    elif cfg.has("layer_types"):
        default = cfg.get("layer_types")
    else:
        pattern = _positive(cfg, "sliding_window_pattern", cfg.get("sliding_window_pattern"))
        default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    kinds = _set_layer_types(cfg, out, default, window)
    if window is not None:
        out["nope_layers"] = tuple(i for i, t in enumerate(kinds) if t != "sliding")


def _ernie_moe_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """ERNIE 4.5 MoE: layer i is MoE iff (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
    moe_layer_end_index (-1: the last layer), else a dense FFN of intermediate_size; moe_num_shared_experts
    shared experts of moe_intermediate_size; softmax scores with an fp32 score-correction bias choosing the
    top moe_k, their weights renormalised. `use_bias` (biases on every projection and the LM head) is refused."""
    if cfg.flag("use_bias"):
        raise cfg.refuse("use_bias", True, "biases on the experts and the LM head are not modelled")
    out.update(qkv_bias=False, out_bias=False, router_score_bias=True, rope_interleaved=True)  # GLM-style pairs
    n = out["num_layers"]
    start, end = _int(cfg, "moe_layer_start_index", cfg.get("moe_layer_start_index")), \
        _int(cfg, "moe_layer_end_index", cfg.get("moe_layer_end_index"))
    end = n - 1 if end == -1 else end
    step = _positive(cfg, "moe_layer_interval")
    cfg.get("moe_norm_min")  # the renormalisation's floor: changes values, not costs
    out["shared_experts"] = _count(cfg, "moe_num_shared_experts")
    _routing_values(cfg, out, scoring="softmax", renormalize=True, groups=False)
    _top_k(cfg, out, "moe_k")
    _dense_layers(out, lambda i: (i + 1) % step == 0 and start <= i <= end)


def _seed_oss_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Seed-OSS: Llama with q/k/v biases (attention_bias, default true) and o_proj's own (attention_out_bias)."""
    out["qkv_bias"] = cfg.flag("attention_bias")
    out["out_bias"] = cfg.flag("attention_out_bias")


def _llama4_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Llama 4 (text): MoE layers with one always-on shared expert of the expert width; layer i is MoE iff
    it is in `moe_layers`, else iff (i + 1) % interleave_moe_layer_step == 0; dense layers use
    intermediate_size_mlp. NoPE layers from `no_rope_layers` (1 = rotary, 0 = none; default: every
    no_rope_layer_interval-th layer is NoPE); rotary layers attend in chunks of attention_chunk_size,
    NoPE layers globally; use_qk_norm is a weightless L2 norm on the rotary layers."""
    _biases(cfg, out)
    n = out["num_layers"]
    if cfg.flag("use_qk_norm"):
        out["qk_norm"] = "l2"
    flags = _nope_flags(cfg, out)
    chunk = cfg.get("attention_chunk_size")
    default = ["chunked_attention" if f and chunk is not None else "full_attention" for f in flags]
    _set_layer_types(cfg, out, default, None, chunk)
    step = _positive(cfg, "interleave_moe_layer_step")
    moe = set(_index_list(cfg, "moe_layers", n)) if cfg.has("moe_layers") else set(range(step - 1, n, step))
    out["shared_experts"] = 1
    # Llama4Router: sigmoid of the top-k logits, not renormalised, scaling the experts' input
    out.update(router_scoring="sigmoid", router_renormalize=False, router_input_scaling=True, rope_interleaved=True)
    if cfg.flag("attn_temperature_tuning"):
        out["nope_temperature"] = (_positive_number(cfg, "floor_scale", cfg.get("floor_scale")),
                                   _positive_number(cfg, "attn_scale", cfg.get("attn_scale")))
    _top_k(cfg, out)
    _dense_layers(out, lambda i: i in moe)


#: Ministral3Config's rope_parameters when it has none (transformers 5.24; its top-level rope_theta is then unused)
_MINISTRAL3_ROPE = MappingProxyType({
    "rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
    "max_position_embeddings": 262144, "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
    "llama_4_scaling_beta": 0.1})


def _ministral3_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Ministral 3: Mistral's layers (a sliding window on every layer where one is set) whose queries, once
    rotated, are scaled by 1 + beta * log(1 + floor(position / original_max_position_embeddings)) in every layer
    (`query_log_scale`; beta: rope_parameters' `llama_4_scaling_beta`). Without rope_parameters (or rope_scaling)
    the config class's own yarn rope, whatever a top-level rope_theta says (refused when it differs)."""
    if not cfg.has("rope_parameters") and not cfg.has("rope_scaling"):
        theta = cfg.get("rope_theta", None)
        if theta is not None and theta != _MINISTRAL3_ROPE["rope_theta"]:
            raise cfg.refuse("rope_theta", theta, "without rope_parameters transformers' Ministral3Config builds "
                             f"its default yarn rope of rope_theta {_MINISTRAL3_ROPE['rope_theta']:g}")
        scaling = dict(_MINISTRAL3_ROPE)
        out["rope_theta"] = scaling.pop("rope_theta")
        out["rope_scaling"] = scaling
    scaling = out.get("rope_scaling") or {}
    where = "rope_parameters" if cfg.has("rope_parameters") else "rope_scaling"
    for key in ("llama_4_scaling_beta", "original_max_position_embeddings"):
        if scaling.get(key) is None:  # transformers' Ministral3Attention reads both
            raise SpecError(f"{cfg.origin}: missing field '{where}.{key}' (Ministral 3's query scaling reads it)")
    beta = _number(cfg, f"{where}.llama_4_scaling_beta", scaling["llama_4_scaling_beta"])
    interval = _positive_number(cfg, f"{where}.original_max_position_embeddings",
                                scaling["original_max_position_embeddings"])
    if beta < 0:
        raise SpecError(f"{cfg.origin}: {where}.llama_4_scaling_beta must be >= 0, got {beta!r}")
    out["query_log_scale"] = (beta, interval) if beta else None
    out["rope_scaling"] = {k: v for k, v in scaling.items() if k != "llama_4_scaling_beta"}  # not the rotation's


def _phi3_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Phi-3 / Phi-4-mini: Mistral's layers (a sliding window on every layer where one is set) with q/k/v and
    gate/up fused in the checkpoint (the same GEMMs), partial rotary positions (`partial_rotary_factor`), no
    biases; transformers reads a rope type of `su` or `yarn` as `longrope` (its short and long factors kept in
    `rope_scaling`; the engine refuses it by name)."""
    out["qkv_bias"] = out["out_bias"] = False
    _partial_rotary(cfg, out)
    scaling = out.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in ("su", "yarn"):  # Phi3Config.convert_rope_params_to_dict
            kind = "longrope"
            out["rope_scaling"] = {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": kind}
        if kind != "longrope":
            raise cfg.refuse("rope_scaling.rope_type", kind, "Phi3Config takes default or longrope")
        head_dim = out.get("head_dim") or out["hidden_size"] // out["num_heads"]
        for key in ("short_factor", "long_factor"):
            factors = scaling.get(key)
            if not isinstance(factors, list) or len(factors) != out["rotary_dim"] // 2:
                raise SpecError(f"{cfg.origin}: rope_scaling.{key} must list rotary_dim / 2 = "
                                f"{out['rotary_dim'] // 2} factors (head_dim {head_dim}), got {factors!r}")
        if scaling.get("original_max_position_embeddings") is None:
            out["rope_scaling"] = {**out["rope_scaling"], "original_max_position_embeddings":
                                   _positive(cfg, "original_max_position_embeddings")}


def _glm4_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """GLM-4-0414 (`glm4`): q/k/v biases from attention_bias (none on o_proj), a norm after attention and after
    the MLP besides the two before them (`sandwich_norms`, plain RMSNorms), partial rotary positions over
    adjacent pairs (`partial_rotary_factor`, default 0.5), gate/up fused in the checkpoint (the same GEMMs)."""
    _biases(cfg, out, out_proj=False)
    out.update(sandwich_norms=True, rope_interleaved=True)
    _partial_rotary(cfg, out)


def _cohere2_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Command R7B / Command A (`cohere2`): attention and the FFN side by side from one LayerNorm without a bias
    (`shared_input_norm`, `layernorm_no_bias`), q/k/v/o biases from attention_bias, the logits times
    `logit_scale`, a tied head by default; layer i slides iff (i + 1) % sliding_window_pattern (default 4)
    (`layer_types` where given) and only sliding layers rotate positions, over adjacent pairs: its full layers are
    NoPE (as transformers applies RoPE); a null sliding_window is refused. head_dim is always
    hidden_size / num_attention_heads (Cohere2Config sets it so: another value is refused)."""
    _biases(cfg, out)
    out.update(norm_kind="layernorm_no_bias", shared_input_norm=True, rope_interleaved=True)
    head_dim = out["hidden_size"] // out["num_heads"]
    if out.get("head_dim") not in (None, head_dim):
        raise cfg.refuse("head_dim", out["head_dim"], f"Cohere2Config sets it to hidden_size / num_attention_heads "
                         f"= {head_dim}")
    out["head_dim"] = head_dim
    scale = cfg.get("logit_scale")
    out["logit_scale"] = None if scale == 1 else _positive_number(cfg, "logit_scale", scale)
    n, window = out["num_layers"], cfg.get("sliding_window")
    pattern = _positive(cfg, "sliding_window_pattern", cfg.get("sliding_window_pattern"))
    default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if window is None:
        raise cfg.refuse("sliding_window", None, "transformers' Cohere2Model builds its sliding-window mask from it "
                         "and cannot run without one")
    kinds = _set_layer_types(cfg, out, default, window)
    out["nope_layers"] = tuple(i for i, t in enumerate(kinds) if t != "sliding")


def _gemma1_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Gemma (1): Llama's layers with GeGLU (`hidden_act`; GemmaConfig reads a legacy `gelu` as
    gelu_pytorch_tanh), RMSNorms that multiply by 1 + weight, sqrt(hidden)-scaled embeddings, q/k/v/o biases
    from attention_bias, a tied head by default; bidirectional attention (an encoder) and a `hidden_activation`
    that disagrees (transformers 5 ignores it) are refused by name."""
    _biases(cfg, out)
    if out["hidden_act"] == "gelu":
        out["hidden_act"] = "gelu_pytorch_tanh"
    out.update(embedding_scale=True, norm_offset=True)
    legacy = cfg.get("hidden_activation", None)
    if legacy is not None and legacy != out["hidden_act"]:
        raise cfg.refuse("hidden_activation", legacy, f"GemmaConfig computes with hidden_act={out['hidden_act']!r}")
    if cfg.flag("use_bidirectional_attention"):
        raise cfg.refuse("use_bidirectional_attention", True, "an encoder, not a causal LM")


def _gemma_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Gemma 2 / 3: GeGLU (a gated 3-matrix FFN), four norms per layer (sandwich), sqrt(hidden)-scaled
    embeddings, tied head; Gemma 2 soft-caps attention scores and logits and alternates sliding / full
    layers; Gemma 3 norms q and k per head and has one full layer in `sliding_window_pattern`."""
    mt = cfg.data.get("model_type")
    _biases(cfg, out)
    out.update(ffn_kind="swiglu", sandwich_norms=True, embedding_scale=True)
    for key, f in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "final_softcap")):
        value = cfg.get(key)
        out[f] = None if value is None else _positive_number(cfg, key, value)
    out["query_pre_attn_scalar"] = _positive_number(cfg, "query_pre_attn_scalar", cfg.get("query_pre_attn_scalar"))
    out["norm_offset"] = True  # Gemma's RMSNorm: x * (1 + weight)
    n = out["num_layers"]
    if mt == "gemma3_text":
        out["qk_norm"] = "rmsnorm"
        local = _rope_parameters(cfg).get("sliding_attention")
        theta = local.get("rope_theta") if isinstance(local, Mapping) else None
        if theta is None:  # transformers 4's key; Gemma3TextConfig's default local base is 10000
            theta = cfg.get("rope_local_base_freq", 10000.0)
        out["rope_local_theta"] = _positive_number(cfg, "rope_local_base_freq", theta)
        if cfg.flag("use_bidirectional_attention"):
            raise cfg.refuse("use_bidirectional_attention", True, "an encoder (EmbeddingGemma), not a causal LM")
        pattern = _positive(cfg, "sliding_window_pattern", cfg.get("sliding_window_pattern"))
    else:
        pattern = 2
    default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    _set_layer_types(cfg, out, default, cfg.get("sliding_window"))

def _gemma4_extra(cfg: _Config, out: dict[str, Any]) -> None:
    """Gemma 4 (text): per-head q/k RMSNorms and a weightless one on V (plain `x * w` norms, unlike Gemma 2/3),
    four norms per layer, sqrt(hidden)-scaled embeddings, a tied head soft-capped by `final_logit_softcapping`,
    one learned scalar per layer; one full layer in six (`layer_types` where given), the last always full. Its
    full layers have `global_head_dim` and, with `attention_k_eq_v`, `num_global_key_value_heads` KV heads and
    no v_proj (V is the key projection, normed apart; the cache keeps both). `enable_moe_block`: every layer
    runs its dense FFN beside `num_experts` experts (`top_k_experts` of `moe_intermediate_size`): the shared
    expert, with the branches' own norms (`moe_parallel_ffn`). `hidden_size_per_layer_input`: per-layer
    embeddings (a table of `vocab_size_per_layer_input` rows, `ple_dim`); the last `num_kv_shared_layers` layers
    read the cache of the last earlier layer of their kind (`kv_shared_layers`; with `use_double_wide_mlp` their
    dense FFN is twice as wide). Bidirectional attention is refused by name."""
    bidirectional = cfg.get("use_bidirectional_attention")
    if bidirectional == "all":
        raise cfg.refuse("use_bidirectional_attention", bidirectional, "an encoder, not a causal LM")
    _biases(cfg, out)
    out.update(ffn_kind="swiglu", sandwich_norms=True, embedding_scale=True, qk_norm="rmsnorm", v_norm=True,
               layer_scalar=True)
    cap = cfg.get("final_logit_softcapping")
    out["final_softcap"] = None if cap is None else _positive_number(cfg, "final_logit_softcapping", cap)
    n = out["num_layers"]
    default = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    given = cfg.get("layer_types") if cfg.has("layer_types") else default
    if isinstance(given, list) and given:  # transformers forces the last layer full
        given = [*given[:-1], "full_attention"]
    kinds = _set_layer_types(cfg, out, given, cfg.get("sliding_window"), given=True)
    local = _rope_parameters(cfg).get("sliding_attention")
    if isinstance(local, Mapping) and local.get("rope_theta") is not None:
        out["rope_local_theta"] = _positive_number(cfg, "rope_parameters.sliding_attention.rope_theta",
                                                   local["rope_theta"])
    if "full" in kinds:
        if cfg.flag("attention_k_eq_v"):
            out["global_k_eq_v"] = True
        if cfg.has("per_layer_config"):  # as transformers saves it: the full layers' shape, layer by layer
            hd, kv = _gemma4_layer_shapes(cfg, kinds)
        else:  # as the hub spells it; transformers' __post_init__ turns them into per_layer_config
            hd = _positive(cfg, "global_head_dim", cfg.get("global_head_dim", 512))
            kv = _positive(cfg, "num_global_key_value_heads") if out.get("global_k_eq_v") and cfg.has(
                "num_global_key_value_heads") else None
        out["global_head_dim"] = hd
        if kv is not None:
            out["global_kv_heads"] = kv
    if cfg.flag("enable_moe_block"):
        out.update(num_experts=_positive(cfg, "num_experts"), experts_per_token=_positive(cfg, "top_k_experts"),
                   moe_ffn_size=_positive(cfg, "moe_intermediate_size"), shared_experts=1,
                   shared_ffn_size=out["ffn_size"], moe_parallel_ffn=True)
    ple = cfg.get("hidden_size_per_layer_input")
    if ple:  # 0 or null: none
        out["ple_dim"] = _positive(cfg, "hidden_size_per_layer_input", ple)
        out["ple_vocab"] = _positive(cfg, "vocab_size_per_layer_input")
    shared = _count(cfg, "num_kv_shared_layers")
    if shared >= n:
        raise cfg.refuse("num_kv_shared_layers", shared, f"every one of the {n} layers would read another "
                         "model's cache (an assistant model)")
    out["kv_shared_layers"] = tuple(range(n - shared, n))
    if shared and cfg.flag("use_double_wide_mlp"):
        out["wide_shared_ffn"] = True


def _gemma4_layer_shapes(cfg: _Config, kinds: list[str]) -> tuple[int, int | None]:
    """The full layers' (head_dim, KV heads or None) from `per_layer_config` ({layer: {head_dim,
    num_key_value_heads}}): one shape for every full layer and none for another layer, else refused."""
    given = cfg.get("per_layer_config")
    if not isinstance(given, Mapping):
        raise SpecError(f"{cfg.origin}: per_layer_config must map layers to their shape, got {given!r}")
    if not given:  # every layer the model's shape
        return _positive(cfg, "head_dim"), None
    shapes = set()
    for key, shape in given.items():
        i = int(key) if isinstance(key, str) and key.isdigit() else key
        if not is_count(i) or not 0 <= i < len(kinds) or not isinstance(shape, Mapping) \
                or not set(shape) <= {"head_dim", "num_key_value_heads"}:
            raise SpecError(f"{cfg.origin}: per_layer_config[{key!r}] must give a layer's head_dim and "
                            f"num_key_value_heads, got {shape!r}")
        if kinds[i] != "full":
            raise cfg.refuse(f"per_layer_config[{key!r}]", dict(shape), "a shape of its own in a sliding layer")
        shapes.add((shape.get("head_dim"), shape.get("num_key_value_heads")))
    full = sum(k == "full" for k in kinds)
    if len(shapes) != 1 or len(given) != full:
        raise cfg.refuse("per_layer_config", given, "full layers of different shapes")
    hd, kv = shapes.pop()
    return _positive(cfg, "per_layer_config.head_dim", hd or cfg.get("head_dim")), (
        None if kv is None else _positive(cfg, "per_layer_config.num_key_value_heads", kv))


_TYPES = (
    HFModelType(model_type="llama", family="llama", architectures=("LlamaForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED, defaults={**_LLAMA_DEFAULTS, "attention_bias": False, "mlp_bias": False},
                extra=_llama_biases),
    HFModelType(model_type="mistral", family="llama", architectures=("MistralForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "num_key_value_heads": 8, "sliding_window": 4096},
                sliding_window="all"),
    HFModelType(model_type="ministral3", family="llama", architectures=("Ministral3ForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 14336,
                          "num_hidden_layers": 34, "num_attention_heads": 32, "num_key_value_heads": 8,
                          "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5},
                sliding_window="all", extra=_ministral3_extra),
    HFModelType(model_type="phi3", family="llama", architectures=("Phi3ForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
                          "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 4096,
                          "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                          "partial_rotary_factor": 1.0},
                sliding_window="all", extra=_phi3_extra),
    HFModelType(model_type="glm4", family="llama", architectures=("Glm4ForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
                          "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2,
                          "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07,
                          "attention_bias": True, "partial_rotary_factor": 0.5},
                extra=_glm4_extra),
    HFModelType(model_type="cohere2", family="llama", architectures=("Cohere2ForCausalLM",),
                keys={**_LLAMA_KEYS, "norm_eps": "layer_norm_eps"}, required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528,
                          "num_hidden_layers": 40, "num_attention_heads": 64, "max_position_embeddings": 8192,
                          "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False,
                          "sliding_window": 4096, "sliding_window_pattern": 4, "logit_scale": 0.0625},
                sliding_window="layers", extra=_cohere2_extra),
    HFModelType(model_type="gemma", family="llama", architectures=("GemmaForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
                          "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
                          "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
                          "tie_word_embeddings": True, "attention_bias": False},
                extra=_gemma1_extra),
    HFModelType(model_type="qwen2_moe", family="llama", architectures=("Qwen2MoeForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                      "moe_ffn_size": "moe_intermediate_size"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                          "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                          "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
                          "max_window_layers": 28, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
                          "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
                          "norm_topk_prob": False, "qkv_bias": True},
                sliding_window="layers", extra=_qwen2_moe_extra),
    HFModelType(model_type="olmoe", family="llama", architectures=("OlmoeForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                      "moe_ffn_size": "intermediate_size"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048,
                          "num_hidden_layers": 16, "num_attention_heads": 16, "max_position_embeddings": 4096,
                          "rms_norm_eps": 1e-5, "attention_bias": False, "num_experts_per_tok": 8,
                          "num_experts": 64, "norm_topk_prob": False},
                extra=_olmoe_extra),
    HFModelType(model_type="mixtral", family="llama", architectures=("MixtralForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "num_local_experts",
                      "experts_per_token": "num_experts_per_tok"},
                required=(*_LLAMA_REQUIRED, "num_local_experts", "num_experts_per_tok"),
                defaults={**_LLAMA_DEFAULTS, "num_key_value_heads": 8, "rms_norm_eps": 1e-5},
                sliding_window="all"),
    HFModelType(model_type="qwen2", family="llama", architectures=("Qwen2ForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "num_key_value_heads": 32, "use_sliding_window": False,
                          "max_window_layers": 28},
                fixed={"qkv_bias": True}, sliding_window="gated"),
    HFModelType(model_type="gpt2", family="gpt2", architectures=("GPT2LMHeadModel",),
                keys=dict(vocab_size="vocab_size", hidden_size="n_embd", num_layers="n_layer", num_heads="n_head",
                          hidden_act="activation_function", norm_eps="layer_norm_epsilon",
                          tied_embeddings="tie_word_embeddings", max_positions="n_positions",
                          attn_scale="scale_attn_weights",
                          attn_scale_inverse_layer_idx="scale_attn_by_inverse_layer_idx"),
                required=("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
                defaults=dict(activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                              scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False),
                rope=False, extra=_gpt2_extra),
    HFModelType(model_type="opt", family="opt", architectures=("OPTForCausalLM",),
                keys=dict(vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
                          num_heads="num_attention_heads", ffn_size="ffn_dim", hidden_act="activation_function",
                          tied_embeddings="tie_word_embeddings", max_positions="max_position_embeddings"),
                required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim",
                          "max_position_embeddings"),
                defaults=dict(activation_function="relu", tie_word_embeddings=True, enable_bias=True,
                              do_layer_norm_before=True, _remove_final_layer_norm=False,
                              layer_norm_elementwise_affine=True),
                rope=False, extra=_opt_extra),
    HFModelType(model_type="gpt_neox", family="gpt_neox", architectures=("GPTNeoXForCausalLM",),
                keys=dict(vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
                          num_heads="num_attention_heads", ffn_size="intermediate_size", hidden_act="hidden_act",
                          norm_eps="layer_norm_eps", tied_embeddings="tie_word_embeddings",
                          max_positions="max_position_embeddings", parallel_residual="use_parallel_residual"),
                required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings"),
                defaults=dict(hidden_act="gelu", layer_norm_eps=1e-5, tie_word_embeddings=False,
                              use_parallel_residual=True, attention_bias=True, rotary_pct=0.25,
                              rotary_emb_base=10000),
                extra=_neox_extra),
    # ---- today's models (issue 22): per-layer structure in the `extra` functions above ----------------
    HFModelType(model_type="qwen3", family="llama", architectures=("Qwen3ForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "num_key_value_heads": 32, "head_dim": 128, "attention_bias": False,
                          "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
                sliding_window="layers", honours=("use_qk_norm",), extra=_qwen3_extra),
    HFModelType(model_type="qwen3_moe", family="llama", architectures=("Qwen3MoeForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                      "moe_ffn_size": "moe_intermediate_size"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "num_key_value_heads": 4, "attention_bias": False,
                          "use_sliding_window": False, "sliding_window": 4096, "decoder_sparse_step": 1,
                          "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128,
                          "norm_topk_prob": False},
                sliding_window="layers", honours=("use_qk_norm",), extra=_qwen3_moe_extra),
    HFModelType(model_type="deepseek_v32", family="llama", architectures=("DeepseekV32ForCausalLM",), keys=_MLA_KEYS,
                required=_MLA_REQUIRED, defaults=_DEEPSEEK_V32_DEFAULTS, sliding_window="layers",
                honours=("index_topk", "index_n_heads"), extra=_dsa_extra),
    HFModelType(model_type="glm4_moe_lite", family="llama", architectures=("Glm4MoeLiteForCausalLM",),
                keys=_MLA_KEYS, required=_MLA_REQUIRED, defaults=_GLM4_MOE_LITE_DEFAULTS, sliding_window="layers",
                extra=_glm4_moe_lite_extra),
    HFModelType(model_type="glm_moe_dsa", family="llama", architectures=("GlmMoeDsaForCausalLM",), keys=_MLA_KEYS,
                required=_MLA_REQUIRED, defaults=_GLM5_DEFAULTS, sliding_window="layers",
                honours=("index_topk", "index_n_heads"), extra=_dsa_extra),
    *(HFModelType(model_type=mt, family="llama", architectures=(arch,), keys=_MLA_KEYS, required=_MLA_REQUIRED,
                  defaults=defaults, sliding_window="layers", extra=_mla_extra)
      for mt, arch, defaults in (("deepseek_v3", "DeepseekV3ForCausalLM", _DEEPSEEK_V3_DEFAULTS),
                                 ("kimi_k2", "DeepseekV3ForCausalLM", _DEEPSEEK_V3_DEFAULTS),
                                 ("deepseek_v2", "DeepseekV2ForCausalLM", _DEEPSEEK_V2_DEFAULTS))),
    HFModelType(model_type="glm4_moe", family="llama", architectures=("Glm4MoeForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "n_routed_experts", "experts_per_token": "num_experts_per_tok",
                      "moe_ffn_size": "moe_intermediate_size"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "attention_bias": False,
                          "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
                          "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                          "first_k_dense_replace": 1, "norm_topk_prob": True, "use_qk_norm": False,
                          "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5},
                sliding_window="layers", honours=("use_qk_norm",), extra=_glm4_moe_extra),
    *(HFModelType(model_type=mt, family="llama", architectures=(arch,), keys=keys, required=required,
                  defaults=defaults, sliding_window="layers", honours=("linear_num_value_heads",),
                  extra=_gated_deltanet_extra)
      for mt, arch, keys, required, defaults in (
          ("qwen3_next", "Qwen3NextForCausalLM", _GDN_MOE_KEYS, _LLAMA_REQUIRED, _QWEN3_NEXT_DEFAULTS),
          ("qwen3_5_text", "Qwen3_5ForCausalLM", _LLAMA_KEYS, _LLAMA_REQUIRED, _QWEN3_5_DEFAULTS),
          ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", {**_GDN_MOE_KEYS, "ffn_size": "moe_intermediate_size"},
           tuple(k for k in _LLAMA_REQUIRED if k != "intermediate_size"), _QWEN3_5_MOE_DEFAULTS))),
    HFModelType(model_type="smollm3", family="llama", architectures=("SmolLM3ForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008,
                          "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
                          "max_position_embeddings": 32768, "tie_word_embeddings": True, "no_rope_layer_interval": 4,
                          "use_sliding_window": False, "attention_bias": False},
                sliding_window="layers", extra=_smollm3_extra),
    HFModelType(model_type="seed_oss", family="llama", architectures=("SeedOssForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 155136, "hidden_size": 4096, "intermediate_size": 27648,
                          "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
                          "max_position_embeddings": 524288, "attention_bias": True, "attention_out_bias": False},
                extra=_seed_oss_extra),
    *(HFModelType(model_type=mt, family="llama", architectures=(arch,), keys=_LLAMA_KEYS, required=_LLAMA_REQUIRED,
                  defaults={**_LLAMA_DEFAULTS, "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008,
                            "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
                            "rms_norm_eps": 1e-5, "attention_bias": False, **extra},
                  sliding_window="layers" if mt == "olmo3" else "none", extra=_olmo_extra)
      for mt, arch, extra in (("olmo2", "Olmo2ForCausalLM", {}),
                              ("olmo3", "Olmo3ForCausalLM", {"sliding_window": 4096}))),
    HFModelType(model_type="exaone4", family="llama", architectures=("Exaone4ForCausalLM",), keys=_LLAMA_KEYS,
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384,
                          "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "sliding_window": 4096,
                          "sliding_window_pattern": 4},
                sliding_window="layers", extra=_exaone4_extra),
    HFModelType(model_type="ernie4_5_moe", family="llama", architectures=("Ernie4_5_MoeForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "moe_num_experts", "experts_per_token": "moe_k",
                      "moe_ffn_size": "moe_intermediate_size"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288,
                          "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
                          "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
                          "moe_intermediate_size": 1536, "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2,
                          "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1,
                          "moe_norm_min": 1e-12},
                extra=_ernie_moe_extra),
    HFModelType(model_type="minimax_m2", family="llama", architectures=("MiniMaxM2ForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                      "moe_ffn_size": "intermediate_size"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
                          "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8,
                          "head_dim": 128, "max_position_embeddings": 196608, "num_experts_per_tok": 8,
                          "num_local_experts": 256, "partial_rotary_factor": 1.0},
                sliding_window="none", extra=_minimax_m2_extra),
    HFModelType(model_type="gpt_oss", family="llama", architectures=("GptOssForCausalLM",),
                keys={**_LLAMA_KEYS, "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "head_dim": 64,
                          "sliding_window": 128, "attention_bias": True, "num_experts_per_tok": 4,
                          "num_local_experts": 128, "swiglu_limit": 7.0,
                          # the released config.json has no torch_dtype; its unquantised tensors are bf16
                          "torch_dtype": "bfloat16"},
                sliding_window="layers", extra=_gpt_oss_extra),
    HFModelType(model_type="llama4_text", family="llama", architectures=("Llama4ForCausalLM",),
                keys={**_LLAMA_KEYS, "ffn_size": "intermediate_size_mlp", "moe_ffn_size": "intermediate_size",
                      "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"},
                required=_LLAMA_REQUIRED,
                defaults={**_LLAMA_DEFAULTS, "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "head_dim": 128,
                          "intermediate_size_mlp": 16384, "num_experts_per_tok": 1, "num_local_experts": 16,
                          "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layer_interval": 4,
                          "attention_chunk_size": 8192, "attention_bias": False, "attn_temperature_tuning": True,
                          "floor_scale": 8192, "attn_scale": 0.1},
                sliding_window="layers", honours=("use_qk_norm",), extra=_llama4_extra),
    *(HFModelType(model_type=mt, family="llama", architectures=(arch,), keys=_GEMMA_KEYS,
                  required=_LLAMA_REQUIRED, defaults=defaults, sliding_window="layers",
                  honours=("attn_logit_softcapping", "final_logit_softcapping"), extra=_gemma_extra)
      for mt, arch, defaults in (("gemma2", "Gemma2ForCausalLM", _GEMMA2_DEFAULTS),
                                 ("gemma3_text", "Gemma3ForCausalLM", _GEMMA3_DEFAULTS))),
    HFModelType(model_type="gemma4_text", family="llama", architectures=("Gemma4ForCausalLM",), keys=_GEMMA_KEYS,
                required=_LLAMA_REQUIRED, defaults=_GEMMA4_DEFAULTS, sliding_window="layers",
                honours=("final_logit_softcapping",), extra=_gemma4_extra),
    *(HFModelType(model_type=mt, family="llama", architectures=(arch,), keys=keys, required=(), defaults=defaults,
                  sliding_window="layers" if mt == "granitemoehybrid" else "none", honours=honours,
                  extra=_granite_extra)
      for mt, arch, keys, defaults, honours in (
          ("granite", "GraniteForCausalLM", _LLAMA_KEYS, _GRANITE_DEFAULTS, _GRANITE_MULTIPLIERS),
          *((t, a, {**_LLAMA_KEYS, "experts_per_token": "num_experts_per_tok"},
             d, _GRANITE_MULTIPLIERS + h)
            for t, a, d, h in (("granitemoe", "GraniteMoeForCausalLM", _GRANITE_MOE_DEFAULTS, ()),
                               ("granitemoeshared", "GraniteMoeSharedForCausalLM", _GRANITE_SHARED_DEFAULTS, ()),
                               ("granitemoehybrid", "GraniteMoeHybridForCausalLM", _GRANITE_HYBRID_DEFAULTS,
                                ("position_embedding_type",)))))),
    HFModelType(model_type="bamba", family="llama", architectures=("BambaForCausalLM",), keys=_LLAMA_KEYS,
                required=(), defaults=_BAMBA_DEFAULTS, sliding_window="layers", extra=_bamba_extra),
    HFModelType(model_type="deepseek_v4", family="llama", architectures=("DeepseekV4ForCausalLM",),
                keys={**{k: v for k, v in _LLAMA_KEYS.items() if k != "num_kv_heads"},
                      "ffn_size": "moe_intermediate_size", "num_experts": "n_routed_experts",
                      "experts_per_token": "num_experts_per_tok", "moe_ffn_size": "moe_intermediate_size"},
                required=(), defaults=_DEEPSEEK_V4_DEFAULTS, sliding_window="layers", rope=False,
                honours=("index_topk", "index_n_heads"), extra=_deepseek_v4_extra),
    HFModelType(model_type="nemotron_h", family="llama", architectures=("NemotronHForCausalLM",),
                keys={**{k: v for k, v in _LLAMA_KEYS.items() if k != "num_layers"}, "hidden_act": "mlp_hidden_act",
                      "norm_eps": "layer_norm_epsilon", "num_experts": "n_routed_experts",
                      "experts_per_token": "num_experts_per_tok", "moe_ffn_size": "moe_intermediate_size"},
                required=("vocab_size", "hidden_size", "num_attention_heads", "max_position_embeddings"),
                defaults=_NEMOTRON_H_DEFAULTS, sliding_window="layers", rope=False,
                honours=("hybrid_override_pattern",), extra=_nemotron_h_extra),
)

#: every supported model type's description, by `model_type`
HF_MODEL_TYPES: Mapping[str, HFModelType] = MappingProxyType({t.model_type: t for t in _TYPES})
SUPPORTED_MODEL_TYPES = tuple(HF_MODEL_TYPES)

# ModelSpec fields that are counts: checked as soon as they are read, naming the config key
_COUNT_FIELDS = frozenset({"vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                           "ffn_size", "max_positions", "num_experts", "experts_per_token"})

#: rope_scaling types llmperf's cost model accepts: none changes a FLOP, a weight or a KV byte (they
#: rescale positions or the softmax; Gemma 4's `proportional` rotates the whole head, some pairs by zero),
#: so their values are kept in `rope_scaling`, and unknown types are refused. The engine
#: (`llmperf.engine.model`) builds fewer and refuses the rest itself.
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic", "proportional")

#: fields refused by name in any config: each belongs to an architecture llmperf does not model yet
_HYBRID_FIELDS: Mapping[str, str] = MappingProxyType({
    "index_topk": "DeepSeek Sparse Attention is read for deepseek_v32 and glm_moe_dsa only",
    "index_n_heads": "DeepSeek Sparse Attention is read for deepseek_v32 and glm_moe_dsa only",
    "hybrid_override_pattern": "Mamba / attention hybrid layers are read for nemotron_h only",
    "linear_num_value_heads": "Gated DeltaNet layers are read for qwen3_next, qwen3_5 and qwen3_5_moe only",
})

#: multimodal wrappers whose text model is read from `text_config` (the vision tower is not modelled)
_TEXT_CONFIG_TYPES: Mapping[str, str] = MappingProxyType({"llama4": "llama4_text", "gemma3": "gemma3_text",
                                                          "gemma4": "gemma4_text",
                                                          "qwen3_5": "qwen3_5_text",
                                                          "qwen3_5_moe": "qwen3_5_moe_text",
                                                          "kimi_k25": "deepseek_v3", "mistral3": "mistral"})
#: other text model types a wrapper's `text_config` may name (Kimi K2.5's hub config says kimi_k2, which
#: transformers reads as deepseek_v3)
_TEXT_CONFIG_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType({"kimi_k25": ("kimi_k2",),
                                                                         "mistral3": ("ministral3",)})
#: wrappers whose head is tied by the outer config's tie_word_embeddings (its class default when absent),
#: whatever text_config says: transformers ties Kimi K2.5's lm_head to the embedding so
_TIED_BY_WRAPPER: Mapping[str, bool] = MappingProxyType({"kimi_k25": True, "mistral3": True})
#: a wrapper's text model when it has no `text_config`: the outer config class's own (Mistral3Config's
#: sub-config defaults, transformers 5.24), not the text config class's defaults
_TEXT_CONFIG_DEFAULTS: Mapping[str, Mapping[str, Any]] = MappingProxyType({"mistral3": MappingProxyType(dict(
    model_type="mistral", vocab_size=131072, hidden_size=5120, intermediate_size=32768, num_hidden_layers=40,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=131072,
    rms_norm_eps=1e-5, rope_theta=1e9, sliding_window=None))})

#: fields refused when present with a value other than the neutral one(s) listed
_NEUTRAL: Mapping[str, tuple[Any, ...]] = MappingProxyType({
    "attn_logit_softcapping": (None,),  # Gemma 2: tanh-capped attention logits
    "final_logit_softcapping": (None,),
    "alibi": (None, False),  # ALiBi position biases (Falcon, BLOOM, MPT)
    "use_alibi": (None, False),
    "position_embedding_type": (None, "absolute", "rope", "rotary"),
    "use_qk_norm": (None, False),  # norms on q and k
    "qk_layernorm": (None, False),
    "embedding_multiplier": (None, 1, 1.0),  # Granite's scaled embeddings, residuals, logits, attention
    "residual_multiplier": (None, 1, 1.0),
    "logits_scaling": (None, 1, 1.0),
    "attention_multiplier": (None,),
})

#: every config field llmperf reads and honours
HF_CONFIG_FIELDS: tuple[str, ...] = tuple(sorted(
    {k for t in _TYPES for k in (*t.keys.values(), *t.required, *t.defaults)}
    | {"model_type", "architectures", "torch_dtype", "dtype", "attention_bias", "mlp_bias", "n_inner",
       "enable_bias", "word_embed_proj_dim", "rotary_pct", "partial_rotary_factor", "rotary_emb_base",
       "rope_theta", "rope_scaling", "rope_parameters", "sliding_window", "use_sliding_window",
       "max_window_layers", "layer_types", "quantization_config",
       # today's models (issue 22): read by the extra functions
       "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_shared_experts",
       "first_k_dense_replace", "moe_layer_freq", "topk_method", "num_nextn_predict_layers", "norm_topk_prob",
       "routed_scaling_factor", "n_group", "topk_group", "scoring_func", "mlp_only_layers", "decoder_sparse_step",
       "use_qk_norm", "experts_per_token", "swiglu_limit", "swiglu_alpha", "no_rope_layers", "no_rope_layer_interval",
       "attention_chunk_size", "moe_layers", "interleave_moe_layer_step", "attn_logit_softcapping",
       "final_logit_softcapping", "query_pre_attn_scalar", "sliding_window_pattern", "use_bidirectional_attention",
       "text_config", "rope_local_base_freq", "rope_interleave", "attn_temperature_tuning", "floor_scale",
       "attn_scale", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
       "linear_num_key_heads", "linear_num_value_heads", "full_attention_interval", "shared_expert_intermediate_size",
       "mamba_ssm_dtype", "attn_output_gate", "mtp_num_hidden_layers", "index_head_dim", "mlp_layer_types",
       "indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset", "rotary_dim",
       "attention_out_bias", "use_bias", "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval",
       "moe_norm_min", "moe_num_shared_experts", "logit_scale", "clip_qkv",
       # Nemotron-H (its extra function; legacy spellings too)
       "layers_block_type", "hybrid_override_pattern", "residual_in_fp32", "moe_latent_size", "mamba_hidden_act",
       "mamba_ssm_cache_dtype", *_NEMOTRON_LEGACY.values(), "num_hidden_layers",
       # Granite (its extra function)
       *_GRANITE_MULTIPLIERS, "shared_intermediate_size", "num_local_experts", "position_embedding_type",
       "mamba_n_heads", "mamba_expand", "mamba_d_head", "mamba_d_state", "mamba_proj_bias", "time_step_limit",
       "attn_layer_indices",
       # DeepSeek-V4 (its extra function; legacy spellings too)
       "compress_rates", "compress_rate_csa", "compress_rate_hca", "compress_ratios", "compress_rope_theta",
       "hc_mult", "hc_sinkhorn_iters", "hc_eps", "o_groups", "o_lora_rank", "num_hash_layers", "expert_dtype"}))

#: every config field refused when it holds a value llmperf does not model (named in the error)
HF_REFUSED_FIELDS: tuple[str, ...] = tuple(sorted(
    {*_NEUTRAL, "add_cross_attention", "do_layer_norm_before", "_remove_final_layer_norm",
     "layer_norm_elementwise_affine", "rope_scaling", "rope_parameters", "sliding_window", "layer_types",
     "max_window_layers", "quantization_config", "architectures", "torch_dtype", *_HYBRID_FIELDS,
     "mlp_bias", "topk_method", "scoring_func", "use_bidirectional_attention", "text_config",
     "experts_per_token", "swiglu_alpha", "residual_in_fp32", "mamba_hidden_act",
     "mamba_ssm_cache_dtype", "mlp_hidden_act", "layers_block_type", "tie_word_embeddings", "n_shared_experts",
     "position_embedding_type", "time_step_limit", "hidden_act", "shared_intermediate_size",
     "num_key_value_heads", "attention_bias", "expert_dtype", "compress_ratios", "compress_rates"}))


def _dtype(cfg: _Config) -> str:
    value = cfg.get("torch_dtype") or cfg.get("dtype") or "float16"
    key = "torch_dtype" if cfg.has("torch_dtype") else "dtype"
    if str(value) not in ("float32", "float16", "bfloat16"):
        raise cfg.refuse(key, value, "a checkpoint's tensors are float32, float16 or bfloat16")
    return normalize_dtype(str(value))


def _rope_parameters(cfg: _Config) -> dict[str, Any]:
    nested = cfg.get("rope_parameters", None)
    return dict(nested) if isinstance(nested, Mapping) else {}


def _rope(cfg: _Config, spec_type: HFModelType) -> dict[str, Any]:
    """RoPE settings: transformers 4 spells them at the top level (`rope_theta`, `rope_scaling`),
    transformers 5 nests them in `rope_parameters`. Unknown scaling types are refused."""
    nested = _rope_parameters(cfg)
    if isinstance(nested.get("full_attention"), Mapping):  # transformers 5, per layer type (Gemma 3)
        for layer_type, params in nested.items():
            kind = params.get("rope_type", "default") if isinstance(params, Mapping) else params
            if kind not in ROPE_TYPES:
                raise cfg.refuse(f"rope_parameters.{layer_type}.rope_type", kind, f"supported: {', '.join(ROPE_TYPES)}")
        nested = dict(nested["full_attention"])
    scaling = cfg.get("rope_scaling", None)
    key = "rope_scaling"
    if not scaling and nested:
        scaling = {k: v for k, v in nested.items() if k not in ("rope_theta", "partial_rotary_factor")}
        key = "rope_parameters"
    if scaling is not None and not isinstance(scaling, Mapping):
        raise SpecError(f"{cfg.origin}: {key} must be a mapping, got {scaling!r}")
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    kind = "longrope" if kind == "su" and spec_type.model_type == "phi3" else kind  # Phi3Config's renaming
    if (scaling or {}).get("llama_4_scaling_beta") and spec_type.model_type != "ministral3":
        raise cfg.refuse(f"{key}.llama_4_scaling_beta", scaling["llama_4_scaling_beta"],
                         f"Ministral 3's query scaling is read for ministral3 only; transformers' "
                         f"{spec_type.model_type} ignores it")
    if kind not in ROPE_TYPES:
        raise cfg.refuse(f"{key}.rope_type", kind, f"supported: {', '.join(ROPE_TYPES)}")
    default_theta = cfg.get("rotary_emb_base", 10000.0) if spec_type.model_type == "gpt_neox" else 10000.0
    theta = nested.get("rope_theta", cfg.get("rope_theta", default_theta))
    return {"rope_theta": _number(cfg, "rope_theta", theta),
            "rope_scaling": None if kind == "default" else dict(scaling)}


def _number(cfg: _Config, key: str, value: Any) -> float:
    """A config number as a float; anything else is refused naming the key (ModelSpec then checks
    that it is finite and positive)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{cfg.origin}: {key} must be a number, got {value!r}")
    return float(value)


def _int(cfg: _Config, key: str, value: Any) -> int:
    if not is_count(value):
        raise SpecError(f"{cfg.origin}: {key} must be an integer, got {value!r}")
    return value


def _sliding_window(cfg: _Config, spec_type: HFModelType, num_layers: int) -> int | None:
    """The window every layer attends over, None for full attention; mixed layers are refused."""
    window = cfg.get("sliding_window")
    if spec_type.sliding_window == "none":
        if window is not None:
            raise cfg.refuse("sliding_window", window, f"{spec_type.model_type} has no sliding-window attention")
        return None
    if cfg.has("layer_types"):  # transformers 5 states each layer's attention explicitly
        kinds = cfg.get("layer_types")
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise SpecError(f"{cfg.origin}: layer_types must be a list of attention kinds, got {kinds!r}")
        if set(kinds) <= {"full_attention"}:
            return None
        if set(kinds) == {"sliding_attention"} and len(kinds) == num_layers and window is not None:
            return window
        raise cfg.refuse("layer_types", kinds if len(kinds) <= 4 else f"{kinds[:4]}...",
                         "layers that mix sliding-window and full attention")
    if spec_type.sliding_window == "gated":
        if not cfg.flag("use_sliding_window") or window is None:
            return None
        first_sliding = _int(cfg, "max_window_layers", cfg.get("max_window_layers"))  # layers >= it slide
        if first_sliding >= num_layers:
            return None
        if first_sliding > 0:
            raise cfg.refuse("max_window_layers", first_sliding,
                             f"the first {first_sliding} of {num_layers} layers full, the rest sliding-window")
    return window


# ---- quantization_config ------------------------------------------------------------------------
# Module names (and globs, and compressed-tensors' `re:` patterns) in `modules_to_not_convert`,
# ModelOpt's `exclude_modules` / `ignore`, resolved to llmperf's MODULES by their last named part:
# `model.layers.*.self_attn` -> attention, `model.layers.3.mlp.gate` -> router, `lm_head` -> lm_head.
# Norms are never quantised (nothing to resolve); a part of a module (`mlp.down_proj`, one expert)
# or a module kept in some layers only is refused: llmperf gives a module one format in every layer.
_KEPT_NAMES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    **dict.fromkeys(("self_attn", "attn", "attention", "self_attention"), ("attention",)),
    **dict.fromkeys(("mlp", "feed_forward"), ("dense_mlp", "expert", "shared_expert", "router")),
    "block_sparse_moe": ("expert", "router"),
    "experts": ("expert",), "shared_expert": ("shared_expert",), "shared_experts": ("shared_expert",),
    **dict.fromkeys(("router", "gate", "shared_expert_gate"), ("router",)),
    **dict.fromkeys(("embed_tokens", "wte", "embed_in", "word_embeddings", "tok_embeddings"), ("embedding",)),
    **dict.fromkeys(("lm_head", "embed_out"), ("lm_head",)),
    "layers": ("attention", "dense_mlp", "expert", "shared_expert", "router"),  # a whole decoder layer
})
_PATH_WORDS = frozenset({"model", "language_model", "transformer", "decoder", "base_model"})
_LAYER_WORDS = frozenset({"layers", "h", "blocks"})
_NOT_COUNTED = ("mtp", "visual", "vision", "multi_modal_projector", "audio")  # parts llmperf does not count


def _kept_pattern(cfg: _Config, key: str, pattern: str) -> tuple[tuple[str, ...], int | None]:
    """The MODULES one kept-module pattern names, and its layer (None: every layer)."""
    text = pattern.strip()
    if text.startswith("re:"):  # compressed-tensors: a regular expression, read as a glob
        text = text[3:].replace("\\.", "\x00").replace(".*", "*").replace("\x00", ".").strip("^$")
    parts = [p.strip("*") for p in text.split(".")]
    names: list[str] = []
    layer: int | None = None
    for i, part in enumerate(parts):
        if not part or part in _PATH_WORDS:
            continue
        if part.isdigit():
            if names and names[-1] == "layers":
                layer = int(part)
                continue
            raise cfg.refuse(key, pattern, "it keeps one expert or one part of a module; llmperf gives a "
                             "module one format")
        names.append("layers" if part in _LAYER_WORDS else part)
    if not names or any(n.startswith(_NOT_COUNTED) for n in names):
        return (), None
    last = names[-1]
    if "norm" in last or last.startswith("ln_"):
        return (), None  # norms stay at the activation precision anyway
    if last in _KEPT_NAMES:
        return _KEPT_NAMES[last], layer
    if any(n in _KEPT_NAMES for n in names[:-1]):
        raise cfg.refuse(key, pattern, "it names a part of a module; llmperf gives a module one format")
    raise cfg.refuse(key, pattern, f"it names no module llmperf knows ({', '.join(sorted(_KEPT_NAMES))})")


def _kept_modules(cfg: _Config, key: str, patterns: Any) -> tuple[str, ...]:
    """The MODULES a checkpoint keeps at its dtype, from its list of module names or globs."""
    if patterns is None:
        return ()
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise SpecError(f"{cfg.origin}: {key} must be a list of module names, got {patterns!r}")
    everywhere: set[str] = set()
    by_layer: dict[str, set[int]] = {}
    for pattern in patterns:
        modules, layer = _kept_pattern(cfg, key, pattern)
        for module in modules:
            if layer is None:
                everywhere.add(module)
            else:
                by_layer.setdefault(module, set()).add(layer)
    num_layers = cfg.data.get("num_hidden_layers", cfg.data.get("n_layer"))
    for module, layers in by_layer.items():
        every = isinstance(num_layers, int) and layers >= set(range(num_layers))
        # the router exists in the MoE layers only (not in DeepSeek's dense first layers): listed in any, kept
        if module in everywhere or every or module == "router":
            everywhere.add(module)
            continue
        shown = sorted(layers)
        raise cfg.refuse(key, patterns if len(patterns) <= 4 else f"{patterns[:4]}...",
                         f"it keeps {module} in layer(s) {shown if len(shown) <= 8 else shown[:8]} only; "
                         "llmperf gives a module one format in every layer")
    return tuple(sorted(everywhere))


def _fp8_fields(cfg: _Config, q: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`quant_method: fp8` (transformers' FineGrainedFP8Config: DeepSeek-V3, Qwen3-FP8)."""
    fmt = q.get("fmt", "e4m3")
    if str(fmt).lower() != "e4m3":
        raise cfg.refuse(f"{where}.fmt", fmt, "supported: e4m3")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise cfg.refuse(f"{where}.activation_scheme", scheme, "supported: dynamic, static")
    block = q.get("weight_block_size", [128, 128])
    if block is None:
        raise cfg.refuse(f"{where}.weight_block_size", None, "per-tensor fp8 scales; supported: blocks [rows, inputs]")
    if (not isinstance(block, list) or len(block) != 2
            or not all(is_count(n) and n > 0 for n in block)):
        raise SpecError(f"{cfg.origin}: {where}.weight_block_size must be two positive integers, got {block!r}")
    scale_fmt = q.get("scale_fmt")
    if scale_fmt not in (None, "ue8m0"):  # ue8m0: power-of-two values in the same fp32 scale tensors
        raise cfg.refuse(f"{where}.scale_fmt", scale_fmt, "supported: ue8m0")
    kept = _kept_modules(cfg, f"{where}.modules_to_not_convert", q.get("modules_to_not_convert"))
    return dict(method="fp8", block_size=tuple(block), group_size=block[1], activation_scheme=scheme,
                modules_to_not_convert=kept)


_MODELOPT_KV = {"FP8": "fp8", "NVFP4": "fp4"}


def _modelopt_fields(cfg: _Config, q: Mapping[str, Any], where: str) -> dict[str, Any]:
    """NVIDIA ModelOpt's NVFP4 (`quant_method: modelopt`, `quant_algo: NVFP4`, `group_size: 16`,
    `exclude_modules` or `ignore`; hf_quant_config.json's `quantization` block reads the same)."""
    algo = q.get("quant_algo")
    if str(algo).upper() != "NVFP4":
        raise cfg.refuse(f"{where}.quant_algo", algo, "supported: NVFP4")
    group = q.get("group_size", 16)
    if group != 16:
        raise cfg.refuse(f"{where}.group_size", group, "NVFP4 has one scale per 16 inputs")
    key = "exclude_modules" if q.get("exclude_modules") is not None else "ignore"
    kept = _kept_modules(cfg, f"{where}.{key}", q.get(key))
    kv = q.get("kv_cache_quant_algo")
    if kv is not None and str(kv).upper() not in _MODELOPT_KV:
        raise cfg.refuse(f"{where}.kv_cache_quant_algo", kv, f"supported: {', '.join(_MODELOPT_KV)}")
    return dict(method="nvfp4", group_size=16, modules_to_not_convert=kept,
                kv_cache=None if kv is None else _MODELOPT_KV[str(kv).upper()])


def _compressed_tensors_fields(cfg: _Config, q: Mapping[str, Any], where: str) -> dict[str, Any]:
    """llm-compressor's NVFP4 (`quant_method: compressed-tensors`, `format: nvfp4-pack-quantized`):
    every config group fp4 weights and activations in groups of 16 over the Linear layers."""
    fmt = q.get("format")
    if fmt != "nvfp4-pack-quantized":
        raise cfg.refuse(f"{where}.format", fmt, "supported: nvfp4-pack-quantized")
    groups = q.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise SpecError(f"{cfg.origin}: {where}.config_groups must be a mapping, got {groups!r}")
    for name, group in groups.items():
        at = f"{where}.config_groups.{name}"
        weights = (group or {}).get("weights") or {}
        if (weights.get("num_bits"), weights.get("type"), weights.get("group_size")) != (4, "float", 16):
            raise cfg.refuse(f"{at}.weights", dict(weights), "supported: 4-bit float in groups of 16 (NVFP4)")
        acts = (group or {}).get("input_activations")
        if not acts or (acts.get("num_bits"), acts.get("type")) != (4, "float"):
            raise cfg.refuse(f"{at}.input_activations", acts, "weight-only NVFP4 (W4A16) is not modelled")
        if group.get("targets") not in (None, ["Linear"]):
            raise cfg.refuse(f"{at}.targets", group.get("targets"), "groups for some layers only")
    kept = _kept_modules(cfg, f"{where}.ignore", q.get("ignore"))
    kv = q.get("kv_cache_scheme")
    if kv is not None and (kv.get("num_bits"), kv.get("type")) != (8, "float"):
        raise cfg.refuse(f"{where}.kv_cache_scheme", kv, "supported: 8-bit float")
    return dict(method="nvfp4", group_size=16, modules_to_not_convert=kept, kv_cache=None if kv is None else "fp8")


_QUANT_SUPPORTED = ("awq, gptq, fp8, mxfp4, modelopt (quant_algo NVFP4), "
                    "compressed-tensors (format nvfp4-pack-quantized)")


def _quantization(cfg: _Config) -> QuantizationSpec | None:
    """The checkpoint's `quantization_config`: AWQ / GPTQ (integer groups), fp8 block-wise, MXFP4,
    NVFP4 (ModelOpt or compressed-tensors); the modules it keeps at its dtype resolved to MODULES."""
    q = cfg.get("quantization_config", None)
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise SpecError(f"{cfg.origin}: quantization_config must be a mapping, got {q!r}")
    where = "quantization_config"
    if q.get("quant_method") is None and isinstance(q.get("quantization"), Mapping):
        q, where = q["quantization"], f"{where}.quantization"  # ModelOpt's hf_quant_config.json layout
    method = str(q.get("quant_method", "")).lower()
    if method in ("modelopt", "modelopt_fp4") or (not method and q.get("quant_algo") is not None):
        fields = _modelopt_fields(cfg, q, where)
    elif method == "awq":
        kept = _kept_modules(cfg, f"{where}.modules_to_not_convert", q.get("modules_to_not_convert"))
        fields = dict(method=method, bits=q.get("bits", q.get("w_bit")),
                      group_size=q.get("group_size", q.get("q_group_size", 128)),
                      zero_point=q.get("zero_point", True), act_order=False, modules_to_not_convert=kept)
    elif method == "gptq":
        if q.get("modules_in_block_to_quantize"):
            raise cfg.refuse(f"{where}.modules_in_block_to_quantize", q["modules_in_block_to_quantize"],
                             "only some linear layers quantized")
        fields = dict(method=method, bits=q.get("bits"), group_size=q.get("group_size", 128),
                      zero_point=not q.get("sym", True), act_order=q.get("desc_act", False))
    elif method == "fp8":
        fields = _fp8_fields(cfg, q, where)
    elif method == "mxfp4":
        fields = dict(method="mxfp4", group_size=32, modules_to_not_convert=_kept_modules(
            cfg, f"{where}.modules_to_not_convert", q.get("modules_to_not_convert")))
    elif method == "compressed-tensors":
        fields = _compressed_tensors_fields(cfg, q, where)
    else:
        raise cfg.refuse(f"{where}.quant_method", q.get("quant_method"), f"supported: {_QUANT_SUPPORTED}")
    if fields["method"] in ("awq", "gptq"):
        if fields["group_size"] == -1:  # per output channel
            fields["group_size"] = None
        if fields["bits"] is None:
            raise SpecError(f"{cfg.origin}: missing field '{where}.bits'")
    try:
        return QuantizationSpec(**fields)
    except SpecError as exc:
        raise SpecError(f"{cfg.origin}: {str(exc).replace('quantization.', where + '.')}") from None


def _refuse_unmodelled(cfg: _Config, spec_type: HFModelType) -> None:
    for key, neutral in _NEUTRAL.items():
        if key in spec_type.honours:
            continue
        value = cfg.data.get(key)
        if value not in neutral:
            raise cfg.refuse(key, value, "it changes the math and llmperf does not model it")
    for key, why in _HYBRID_FIELDS.items():
        if cfg.data.get(key) is not None and key not in spec_type.honours:
            raise cfg.refuse(key, cfg.data[key], why)
    archs = cfg.get("architectures", None) or []
    for arch in archs if isinstance(archs, list) else [archs]:
        if not str(arch).endswith(("ForCausalLM", "LMHeadModel")):
            raise cfg.refuse("architectures", arch, f"not a causal LM head; expected {spec_type.architectures[0]}")


def read_hf_config(data: Mapping[str, Any], name: str, origin: str) -> tuple[dict[str, Any], set[str]]:
    """The `ModelSpec` fields of a parsed config.json, and the set of config keys read."""
    mt = data.get("model_type")
    if isinstance(mt, str) and mt in _TEXT_CONFIG_TYPES:
        return _read_text_config(data, name, origin)
    if mt not in HF_MODEL_TYPES:
        raise SpecError(f"{origin}: model_type {mt!r} is not supported "
                        f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    spec_type = HF_MODEL_TYPES[mt]
    cfg = _Config(data, origin, spec_type.defaults)
    cfg.read.add("model_type")
    for key in spec_type.required:
        cfg.req(key)
    _refuse_unmodelled(cfg, spec_type)
    out: dict[str, Any] = {"name": name, "family": spec_type.family}
    for spec_field, key in spec_type.keys.items():
        value = cfg.get(key)
        if value is None:
            continue
        if spec_field in _COUNT_FIELDS and (not is_count(value) or value <= 0):
            raise SpecError(f"{origin}: {key} must be a positive integer, got {value!r}")
        out[spec_field] = value
    if "num_kv_heads" in out and "num_key_value_heads" not in data:
        # absent: the config class's default (Mistral, Mixtral: 8; Qwen2: 32), as transformers builds it
        kv, heads = out["num_kv_heads"], out["num_heads"]
        if isinstance(heads, int) and (kv > heads or heads % kv):
            raise SpecError(f"{origin}: num_key_value_heads is absent and {mt}'s default {kv} does not divide "
                            f"num_attention_heads={heads}")
    if out.get("num_kv_heads") is None and spec_type.keys.get("num_kv_heads"):
        out["num_kv_heads"] = out["num_heads"]  # null (or Llama's absent): multi-head attention, as transformers
    out.update(spec_type.fixed)
    if spec_type.rope:
        out.update({k: v for k, v in _rope(cfg, spec_type).items() if k != "rope_scaling" or v})
    if spec_type.extra is not None:
        spec_type.extra(cfg, out)
    if spec_type.sliding_window != "layers":  # else the extra function set the layers' attention
        out["sliding_window"] = _sliding_window(cfg, spec_type, out["num_layers"])
    out["quantization"] = _quantization(cfg)
    out["dtype"] = _dtype(cfg)
    return out, cfg.read


def _read_text_config(data: Mapping[str, Any], name: str, origin: str) -> tuple[dict[str, Any], set[str]]:
    """A multimodal checkpoint (Llama 4, Gemma 3, Qwen3.5, Kimi K2.5): its text model, from `text_config`
    (absent: the text config class's defaults, as transformers). The dtype and the tied head fall back to
    the outer config (Kimi K2.5's head: the outer config's, `_TIED_BY_WRAPPER`)."""
    outer = data["model_type"]
    text = data.get("text_config")
    if text is None:
        text = dict(_TEXT_CONFIG_DEFAULTS.get(outer, {}))
    if not isinstance(text, Mapping):
        raise SpecError(f"{origin}: text_config must be a mapping, got {text!r}")
    inner = text.get("model_type", _TEXT_CONFIG_TYPES[outer])
    if inner != _TEXT_CONFIG_TYPES[outer] and inner not in _TEXT_CONFIG_ALIASES.get(outer, ()):
        raise SpecError(f"{origin}: text_config.model_type={inner!r}, expected {_TEXT_CONFIG_TYPES[outer]!r} "
                        f"in a {outer} config")
    merged = dict(text)
    merged["model_type"] = inner
    for key in ("torch_dtype", "dtype", "tie_word_embeddings", "quantization_config"):
        if merged.get(key) is None and data.get(key) is not None:
            merged[key] = data[key]
    if outer in _TIED_BY_WRAPPER:
        tied = data.get("tie_word_embeddings")
        tied = _TIED_BY_WRAPPER[outer] if tied is None else tied
        if not isinstance(tied, bool):
            raise SpecError(f"{origin}: tie_word_embeddings must be true or false, got {tied!r}")
        merged["tie_word_embeddings"] = tied
    fields, read = read_hf_config(merged, name, f"{origin} (text_config)")
    return fields, {"model_type", "text_config", "architectures"} | read


def model_spec_from_hf_config(path: str | os.PathLike[str] | dict[str, Any],
                              name: str | None = None) -> ModelSpec:
    """Build a `ModelSpec` from a config.json path, its directory, or an already-parsed dict."""
    from llmperf.specs.loader import read_mapping

    if isinstance(path, dict):
        data, origin = path, name or "config"
    else:
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        data, origin = read_mapping(p), str(p)
        name = name or (p.parent.name if p.name == "config.json" else p.stem)
    fields, _ = read_hf_config(data, name or str(data.get("model_type")), origin)
    fields["source"] = f"Hugging Face config ({origin})"
    wrapper = data.get("model_type")
    if isinstance(wrapper, str) and wrapper in _TEXT_CONFIG_TYPES:
        fields["source"] += f"; the text model of a {wrapper} checkpoint (the vision tower is not modelled)"
    try:
        return ModelSpec(**fields)
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None
