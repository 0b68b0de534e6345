"""Read a Hugging Face `config.json` into a `ModelSpec` (llama, mistral, mixtral, qwen2, gpt2, opt,
gpt_neox). Field names follow each model type's `PretrainedConfig` in `transformers`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llmperf.errors import SpecError
from llmperf.specs.model import ModelSpec

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "gpt2", "opt", "gpt_neox")


def _dtype(cfg: dict[str, Any]) -> str:
    value = cfg.get("torch_dtype") or cfg.get("dtype") or "float16"
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(str(value), "fp16")


def _req(cfg: dict[str, Any], key: str, origin: str) -> Any:
    if cfg.get(key) is None:
        raise SpecError(f"{origin}: missing field {key!r}")
    return cfg[key]


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """RoPE settings: transformers 4 spells them at the top level (`rope_theta`, `rope_scaling`,
    `rotary_pct`), transformers 5 nests them in `rope_parameters` (with `partial_rotary_factor`)."""
    nested = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {k: v for k, v in nested.items()
                                          if k not in ("rope_theta", "partial_rotary_factor")}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    theta = nested.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0)))
    fraction = nested.get("partial_rotary_factor", cfg.get("rotary_pct", cfg.get("partial_rotary_factor", 1.0)))
    return {"rope_theta": float(theta), "rope_scaling": scaling or None, "rotary_fraction": float(fraction)}


def _llama_like(cfg: dict[str, Any], name: str, origin: str) -> dict[str, Any]:
    mt = cfg["model_type"]
    heads = _req(cfg, "num_attention_heads", origin)
    out: dict[str, Any] = dict(
        name=name, family="llama",
        vocab_size=_req(cfg, "vocab_size", origin),
        hidden_size=_req(cfg, "hidden_size", origin),
        num_layers=_req(cfg, "num_hidden_layers", origin),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim"),
        ffn_size=_req(cfg, "intermediate_size", origin),
        ffn_kind="swiglu", hidden_act=cfg.get("hidden_act", "silu"),
        norm_kind="rmsnorm", norm_eps=cfg.get("rms_norm_eps", 1e-6),
        pos_encoding="rope", rope_theta=_rope(cfg)["rope_theta"], rope_scaling=_rope(cfg)["rope_scaling"],
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_positions=_req(cfg, "max_position_embeddings", origin),
        dtype=_dtype(cfg),
    )
    if mt == "llama":
        out["qkv_bias"] = out["out_bias"] = bool(cfg.get("attention_bias", False))
        out["mlp_bias"] = bool(cfg.get("mlp_bias", False))
    elif mt == "qwen2":
        out["qkv_bias"] = True
    elif mt == "mixtral":
        out["num_experts"] = _req(cfg, "num_local_experts", origin)
        out["experts_per_token"] = _req(cfg, "num_experts_per_tok", origin)
    return out


def _gpt2(cfg: dict[str, Any], name: str, origin: str) -> dict[str, Any]:
    h = _req(cfg, "n_embd", origin)
    return dict(
        name=name, family="gpt2",
        vocab_size=_req(cfg, "vocab_size", origin), hidden_size=h,
        num_layers=_req(cfg, "n_layer", origin), num_heads=_req(cfg, "n_head", origin),
        ffn_size=cfg.get("n_inner") or 4 * h, ffn_kind="gelu",
        hidden_act=cfg.get("activation_function", "gelu_new"),
        norm_kind="layernorm", norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        pos_encoding="learned", tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        max_positions=_req(cfg, "n_positions", origin),
        qkv_bias=True, out_bias=True, mlp_bias=True, dtype=_dtype(cfg),
    )


def _opt(cfg: dict[str, Any], name: str, origin: str) -> dict[str, Any]:
    h = _req(cfg, "hidden_size", origin)
    proj = cfg.get("word_embed_proj_dim", h)
    if proj != h:
        raise SpecError(f"{origin}: word_embed_proj_dim={proj} differs from hidden_size={h} "
                        "(OPT-350m's projected embeddings are not modelled)")
    bias = bool(cfg.get("enable_bias", True))
    return dict(
        name=name, family="opt",
        vocab_size=_req(cfg, "vocab_size", origin), hidden_size=h,
        num_layers=_req(cfg, "num_hidden_layers", origin),
        num_heads=_req(cfg, "num_attention_heads", origin),
        ffn_size=_req(cfg, "ffn_dim", origin), ffn_kind="relu",
        hidden_act=cfg.get("activation_function", "relu"),
        norm_kind="layernorm", norm_eps=1e-5, pos_encoding="learned", position_offset=2,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        max_positions=_req(cfg, "max_position_embeddings", origin),
        qkv_bias=bias, out_bias=bias, mlp_bias=bias, dtype=_dtype(cfg),
    )


def _gpt_neox(cfg: dict[str, Any], name: str, origin: str) -> dict[str, Any]:
    h = _req(cfg, "hidden_size", origin)
    heads = _req(cfg, "num_attention_heads", origin)
    head_dim = h // heads
    bias = bool(cfg.get("attention_bias", True))
    return dict(
        name=name, family="gpt_neox",
        vocab_size=_req(cfg, "vocab_size", origin), hidden_size=h,
        num_layers=_req(cfg, "num_hidden_layers", origin), num_heads=heads,
        ffn_size=_req(cfg, "intermediate_size", origin), ffn_kind="gelu",
        hidden_act=cfg.get("hidden_act", "gelu"),
        norm_kind="layernorm", norm_eps=cfg.get("layer_norm_eps", 1e-5),
        pos_encoding="rope", rope_theta=_rope(cfg)["rope_theta"],
        rotary_dim=int(head_dim * _rope(cfg)["rotary_fraction"]),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_positions=_req(cfg, "max_position_embeddings", origin),
        qkv_bias=bias, out_bias=bias, mlp_bias=True,
        parallel_residual=bool(cfg.get("use_parallel_residual", True)), dtype=_dtype(cfg),
    )


_READERS = {"llama": _llama_like, "mistral": _llama_like, "mixtral": _llama_like,
            "qwen2": _llama_like, "gpt2": _gpt2, "opt": _opt, "gpt_neox": _gpt_neox}


def model_spec_from_hf_config(path: str | os.PathLike[str] | dict[str, Any],
                              name: str | None = None) -> ModelSpec:
    """Build a `ModelSpec` from a config.json path, its directory, or an already-parsed dict."""
    from llmperf.specs.loader import read_mapping

    if isinstance(path, dict):
        cfg, origin = path, name or "config"
    else:
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        cfg, origin = read_mapping(p), str(p)
        name = name or (p.parent.name if p.name == "config.json" else p.stem)
    mt = cfg.get("model_type")
    if mt not in _READERS:
        raise SpecError(f"{origin}: model_type {mt!r} is not supported "
                        f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    fields = _READERS[mt](cfg, name or str(mt), origin)
    fields["source"] = f"Hugging Face config ({origin})"
    try:
        return ModelSpec(**fields)
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None
