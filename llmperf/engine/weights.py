"""Weights for `Transformer`: seeded random ones for any spec, or a local Hugging Face checkpoint.

A checkpoint directory holds `config.json` and `model.safetensors`, or shards listed in
`model.safetensors.index.json` (`pytorch_model.bin` / its index as a fallback); nothing is
downloaded. Tensor names follow `transformers` (llama, mistral, qwen2, mixtral in both the
per-expert `block_sparse_moe.experts.{j}.w1/w2/w3` layout of published checkpoints and the stacked
`mlp.experts.gate_up_proj` layout of transformers 5; gpt2 with or without the `transformer.` prefix,
whose `Conv1D` weights are stored transposed, `(in, out)`).

The engine fuses Q/K/V and SwiGLU's gate/up into single matrices (see `model.py`); `_layout` lists,
for every engine parameter, the checkpoint tensors it is made of, in order, so loading concatenates
them and `to_hf_state_dict` splits them back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from llmperf.engine.model import Transformer, torch_dtype
from llmperf.specs import ModelSpec

INIT_STD = 0.02  # GPT-2 / Llama `initializer_range`
# Matrix parameters (suffixes), stored (in, out) or (out, in) depending on the model's weight_layout.
_MATRICES = ("qkv_weight", "o_weight", "up_weight", "down_weight", "router_weight", "lm_head_weight",
             "q_a_weight", "q_b_weight", "q_weight", "kv_a_weight", "kv_b_weight")  # the last five: MLA


# ---------------------------------------------------------------------------------------------------
# Random weights


@torch.no_grad()
def init_random(model: Transformer, seed: int = 0) -> Transformer:
    """Fill every parameter from a generator seeded with `seed`: matrices, embeddings and biases
    ~ N(0, 0.02), norm weights 1 (+ N(0, 0.02) jitter so they matter), norm biases N(0, 0.02).

    Values are drawn in fp32 in `named_parameters` order, matrices in `(out, in)` shape whatever the
    model's layout, then cast: on CPU for a CPU model (one seed gives the same weights in every dtype
    and layout), on the GPU for a CUDA model (fast for billions of parameters; reproducible there,
    but not the CPU's values).
    """
    device = model.embed_weight.device
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed)
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:  # tied embeddings
            continue
        seen.add(id(p))
        transposed = model.in_out and name.endswith(_MATRICES)
        shape = (*p.shape[:-2], p.shape[-1], p.shape[-2]) if transposed else p.shape
        values = torch.randn(shape, generator=gen, dtype=torch.float32, device=gen.device) * INIT_STD
        if transposed:
            values = values.transpose(-1, -2)
        if name.endswith("norm.weight"):
            values += 1.0
        p.copy_(values.to(device=p.device, dtype=p.dtype))
    return model


def build_model(spec: ModelSpec, *, seed: int = 0, dtype: str | torch.dtype = "fp32",
                device: str | torch.device = "cpu", attention: str = "sdpa", weight_layout: str = "auto") -> Transformer:
    """A `Transformer` for `spec` with seeded random weights (any spec, e.g. a `.scaled()` one).
    One seed gives the same weights whatever the dtype and `weight_layout` (on one device type)."""
    return init_random(Transformer(spec, dtype=dtype, device=device, attention=attention,
                                   weight_layout=weight_layout), seed)


# ---------------------------------------------------------------------------------------------------
# The checkpoint layout


@dataclass(frozen=True)
class _Entry:
    """Engine parameter `ours` from checkpoint tensors `parts`: each is brought to `nn.Linear`'s
    `(out, in)` layout (GPT-2's Conv1D stores `(in, out)`: `conv1d` transposes it), they are
    concatenated over dim 0, and a `matrix` is transposed when the model stores `(in, out)`."""

    ours: str
    parts: tuple[str, ...]
    conv1d: bool = False
    matrix: bool = False


def _layout(spec: ModelSpec, moe_format: str = "stacked") -> list[_Entry]:
    """Every engine parameter and the Hugging Face tensors it is built from."""
    out: list[_Entry] = []
    if spec.family == "llama":
        out += [_Entry("embed_weight", ("model.embed_tokens.weight",)),
                _Entry("final_norm.weight", ("model.norm.weight",))]
        if not spec.tied_embeddings:
            out.append(_Entry("lm_head_weight", ("lm_head.weight",), matrix=True))
        for i, kind in enumerate(spec.layer_kinds()):
            hf, us = f"model.layers.{i}.", f"layers.{i}."
            attn = hf + "self_attn."
            out.append(_Entry(us + "attn_norm.weight", (hf + "input_layernorm.weight",)))
            if spec.sandwich_norms:  # Gemma: a norm after attention and around the MLP
                out += [_Entry(us + "post_attn_norm.weight", (hf + "post_attention_layernorm.weight",)),
                        _Entry(us + "mlp_norm.weight", (hf + "pre_feedforward_layernorm.weight",)),
                        _Entry(us + "post_mlp_norm.weight", (hf + "post_feedforward_layernorm.weight",))]
            else:
                out.append(_Entry(us + "mlp_norm.weight", (hf + "post_attention_layernorm.weight",)))
            if spec.is_mla:
                out += _mla_entries(spec, attn, us + "attn.")
            else:
                out += [_Entry(us + "qkv_weight", tuple(f"{attn}{p}_proj.weight" for p in "qkv"), matrix=True),
                        _Entry(us + "o_weight", (attn + "o_proj.weight",), matrix=True)]
                if spec.qkv_bias:
                    out.append(_Entry(us + "qkv_bias", tuple(f"{attn}{p}_proj.bias" for p in "qkv")))
                if spec.out_bias:
                    out.append(_Entry(us + "o_bias", (attn + "o_proj.bias",)))
            if spec.qk_norm == "rmsnorm":
                out += [_Entry(us + "q_norm.weight", (attn + "q_norm.weight",)),
                        _Entry(us + "k_norm.weight", (attn + "k_norm.weight",))]
            if spec.attn_sinks:
                out.append(_Entry(us + "sinks", (attn + "sinks",)))
            if kind.moe:
                out += _moe_entries(spec, hf, us, moe_format)
                continue
            mlp = hf + "mlp."
            out += [_Entry(us + "up_weight", (mlp + "gate_proj.weight", mlp + "up_proj.weight"), matrix=True),
                    _Entry(us + "down_weight", (mlp + "down_proj.weight",), matrix=True)]
            if spec.mlp_bias:
                out += [_Entry(us + "up_bias", (mlp + "gate_proj.bias", mlp + "up_proj.bias")),
                        _Entry(us + "down_bias", (mlp + "down_proj.bias",))]
        return out
    if spec.family == "gpt2":
        t = "transformer."
        out += [_Entry("embed_weight", (t + "wte.weight",)), _Entry("pos_weight", (t + "wpe.weight",)),
                _Entry("final_norm.weight", (t + "ln_f.weight",)), _Entry("final_norm.bias", (t + "ln_f.bias",))]
        if not spec.tied_embeddings:
            out.append(_Entry("lm_head_weight", ("lm_head.weight",), matrix=True))
        for i in range(spec.num_layers):
            hf, us = f"{t}h.{i}.", f"layers.{i}."
            out += [_Entry(us + "attn_norm.weight", (hf + "ln_1.weight",)),
                    _Entry(us + "attn_norm.bias", (hf + "ln_1.bias",)),
                    _Entry(us + "qkv_weight", (hf + "attn.c_attn.weight",), conv1d=True, matrix=True),
                    _Entry(us + "qkv_bias", (hf + "attn.c_attn.bias",)),
                    _Entry(us + "o_weight", (hf + "attn.c_proj.weight",), conv1d=True, matrix=True),
                    _Entry(us + "o_bias", (hf + "attn.c_proj.bias",)),
                    _Entry(us + "mlp_norm.weight", (hf + "ln_2.weight",)),
                    _Entry(us + "mlp_norm.bias", (hf + "ln_2.bias",)),
                    _Entry(us + "up_weight", (hf + "mlp.c_fc.weight",), conv1d=True, matrix=True),
                    _Entry(us + "up_bias", (hf + "mlp.c_fc.bias",)),
                    _Entry(us + "down_weight", (hf + "mlp.c_proj.weight",), conv1d=True, matrix=True),
                    _Entry(us + "down_bias", (hf + "mlp.c_proj.bias",))]
        return out
    raise ValueError(f"family: no checkpoint layout for {spec.family!r}")


def _mla_entries(spec: ModelSpec, attn: str, us: str) -> list[_Entry]:
    """DeepSeek's latent attention (`mla.MLAttention`, transformers' `DeepseekV3Attention` names): one
    engine tensor per checkpoint tensor. Biases where `attention_bias` puts them (q_a, kv_a, o)."""
    q = [("q_a", "q_a_proj"), ("q_b", "q_b_proj")] if spec.q_lora_rank is not None else [("q", "q_proj")]
    mats = [*q, ("kv_a", "kv_a_proj_with_mqa"), ("kv_b", "kv_b_proj"), ("o", "o_proj")]
    out = [_Entry(f"{us}{ours}_weight", (f"{attn}{theirs}.weight",), matrix=True) for ours, theirs in mats]
    out.append(_Entry(us + "kv_a_norm.weight", (attn + "kv_a_layernorm.weight",)))
    if spec.q_lora_rank is not None:
        out.append(_Entry(us + "q_a_norm.weight", (attn + "q_a_layernorm.weight",)))
    biased = [m for m in mats if (m[0] in ("q_a", "kv_a") and spec.qkv_bias) or (m[0] == "o" and spec.out_bias)]
    return out + [_Entry(f"{us}{ours}_bias", (f"{attn}{theirs}.bias",)) for ours, theirs in biased]


def _moe_entries(spec: ModelSpec, hf: str, us: str, moe_format: str) -> list[_Entry]:
    us += "moe_ffn."
    if moe_format == "stacked":  # transformers 5
        return [_Entry(us + "router_weight", (hf + "mlp.gate.weight",), matrix=True),
                _Entry(us + "experts_up_weight", (hf + "mlp.experts.gate_up_proj",), matrix=True),
                _Entry(us + "experts_down_weight", (hf + "mlp.experts.down_proj",), matrix=True)]
    # Published Mixtral checkpoints: one module per expert, w1 = gate, w3 = up, w2 = down. The stacked
    # engine tensors are assembled by `_assemble_experts`; these entries name the per-expert parts.
    moe = hf + "block_sparse_moe."
    E = spec.num_experts
    return [_Entry(us + "router_weight", (moe + "gate.weight",), matrix=True),
            _Entry(us + "experts_up_weight", tuple(f"{moe}experts.{j}.{w}.weight" for j in range(E) for w in ("w1", "w3")),
                   matrix=True),
            _Entry(us + "experts_down_weight", tuple(f"{moe}experts.{j}.w2.weight" for j in range(E)), matrix=True)]


# ---------------------------------------------------------------------------------------------------
# Loading from a mapping of tensors


def _strip_gpt2_prefix(keys: set[str]) -> Callable[[str], str]:
    """Original GPT-2 checkpoints name `h.0.ln_1.weight`, transformers' `transformer.h.0.ln_1.weight`."""
    if any(k.startswith("transformer.") for k in keys):
        return lambda k: k
    return lambda k: k.removeprefix("transformer.")


@torch.no_grad()
def load_hf_state_dict(model: Transformer, tensors: Mapping[str, torch.Tensor] | TensorSource,
                       *, strict: bool = True) -> Transformer:
    """Copy Hugging Face-named tensors into `model` (cast to its dtype, moved to its device).

    `tensors` is a state dict (e.g. `hf_model.state_dict()`) or a `TensorSource` over checkpoint
    files. With `strict`, a missing tensor or one of the wrong shape raises `ValueError`; extra
    tensors (rotary buffers, GPT-2's causal-mask buffers) are ignored.
    """
    spec = model.spec
    keys = set(tensors.keys())
    moe_format = "stacked"
    if spec.num_experts > 1 and not any(k.endswith("mlp.experts.gate_up_proj") for k in keys):
        moe_format = "per_expert"
    rename = _strip_gpt2_prefix(keys) if spec.family == "gpt2" else (lambda k: k)
    params = dict(model.named_parameters(remove_duplicate=False))
    for entry in _layout(spec, moe_format):
        names = [rename(p) for p in entry.parts]
        missing = [n for n in names if n not in keys]
        if missing:
            if strict:
                raise ValueError(f"checkpoint: missing tensor {missing[0]!r} (for {entry.ours})")
            continue
        parts = [tensors[n] for n in names]
        if entry.conv1d:
            parts = [p.t() for p in parts]
        if entry.ours.endswith(".experts_up_weight"):
            value = _assemble_experts_up(parts, spec) if moe_format == "per_expert" else parts[0]
        elif entry.ours.endswith(".experts_down_weight") and moe_format == "per_expert":
            value = torch.stack(parts)
        else:
            value = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        if entry.matrix and model.in_out:
            value = value.transpose(-1, -2)  # (out, in) -> the engine's (in, out)
        target = params[entry.ours]
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(_shape_mismatch(spec, entry, names, parts, tuple(value.shape), tuple(target.shape)))
        target.copy_(value.to(dtype=target.dtype))
    return model


def _shape_mismatch(spec: ModelSpec, entry: _Entry, names: list[str], parts: list[torch.Tensor],
                    got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """One line naming the checkpoint tensor that does not fit and both shapes: for a fused parameter
    (q/k/v, gate/up) the part whose rows differ from what the config gives it."""
    if len(parts) > 1 and ("qkv" in entry.ours or entry.ours.endswith("up_weight")):
        for name, part, rows in zip(names, parts, _split_sizes(spec, entry)):
            if part.shape[0] != rows:
                expected = (rows, *part.shape[1:])
                return (f"checkpoint: {name!r} has shape {tuple(part.shape)}, the config expects {expected} "
                        f"(part of {entry.ours}, {want})")
    return f"checkpoint: {names[0]!r} has shape {got}, the model expects {want} for {entry.ours}"


def _assemble_experts_up(parts: list[torch.Tensor], spec: ModelSpec) -> torch.Tensor:
    """Per-expert [w1_0, w3_0, w1_1, w3_1, ...] -> (E, 2F, C) with gate rows first."""
    E = spec.num_experts
    return torch.stack([torch.cat((parts[2 * j], parts[2 * j + 1]), dim=0) for j in range(E)])


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names (transformers 5 layout), e.g. to load them into a
    `LlamaForCausalLM` / `GPT2LMHeadModel` with `load_state_dict(..., strict=False)`."""
    params = dict(model.named_parameters(remove_duplicate=False))
    out: dict[str, torch.Tensor] = {}
    for entry in _layout(model.spec):
        value = params[entry.ours].detach()
        if entry.matrix and model.in_out:
            value = value.transpose(-1, -2)  # back to (out, in)
        if len(entry.parts) == 1:
            chunks = [value]
        else:
            sizes = _split_sizes(model.spec, entry)
            chunks = list(value.split(sizes, dim=0))
        for name, chunk in zip(entry.parts, chunks):
            out[name] = (chunk.t() if entry.conv1d else chunk).contiguous().clone()
    if model.spec.tied_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight" if model.spec.family == "llama"
                                    else "transformer.wte.weight"]
    return out


def _split_sizes(spec: ModelSpec, entry: _Entry) -> list[int]:
    if "qkv" in entry.ours:
        return [spec.q_size, spec.kv_size, spec.kv_size]
    return [spec.ffn_size, spec.ffn_size]  # [gate; up]


# ---------------------------------------------------------------------------------------------------
# Checkpoint files


class TensorSource(Mapping[str, torch.Tensor]):
    """Lazy read-only mapping name -> tensor over a checkpoint directory's safetensors shards
    (or `.bin` files), reading each tensor only when asked for."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        d = Path(directory)
        self._where: dict[str, Path] = {}
        self._handles: dict[Path, Any] = {}
        self._bin: dict[str, torch.Tensor] = {}
        for index_name, kind in (("model.safetensors.index.json", "st"), ("pytorch_model.bin.index.json", "bin")):
            if (d / index_name).is_file():
                weight_map = json.loads((d / index_name).read_text())["weight_map"]
                files = sorted({d / f for f in weight_map.values()})
                break
        else:
            files = sorted(d.glob("*.safetensors")) or sorted(d.glob("pytorch_model*.bin"))
        if not files:
            raise ValueError(f"checkpoint: no *.safetensors or pytorch_model*.bin files in {str(d)!r}")
        for f in files:
            if not f.is_file():
                raise ValueError(f"checkpoint: shard {str(f)!r} listed in the index is missing")
            if f.suffix == ".safetensors":
                from safetensors import safe_open
                handle = safe_open(str(f), framework="pt", device="cpu")
                self._handles[f] = handle
                for k in handle.keys():
                    self._where[k] = f
            else:
                self._bin.update(torch.load(f, map_location="cpu", weights_only=True))
        for k in self._bin:
            self._where.setdefault(k, Path("<bin>"))

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self._bin:
            return self._bin[key]
        return self._handles[self._where[key]].get_tensor(key)

    def shapes(self) -> dict[str, torch.Tensor]:
        """Every tensor as an empty one of its shape on the meta device (read from the safetensors
        headers, no data), for checking a checkpoint against a model before allocating it."""
        out = {}
        for key, where in self._where.items():
            shape = (self._bin[key].shape if key in self._bin
                     else self._handles[where].get_slice(key).get_shape())
            out[key] = torch.empty(tuple(shape), device="meta")
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def from_pretrained(path: str | os.PathLike[str], *, dtype: str | torch.dtype | None = None,
                    device: str | torch.device = "cpu", attention: str = "sdpa",
                    spec: ModelSpec | None = None, weight_layout: str = "auto") -> Transformer:
    """Load a local Hugging Face checkpoint directory (config.json + weights) into a `Transformer`.

    `dtype` None keeps the checkpoint's (`spec.dtype`, fp16 when the config names none); `spec` None
    reads `config.json` with `ModelSpec.from_hf_config`.
    """
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"path: {str(path)!r} is not a checkpoint directory")
    if spec is None:
        spec = honour_hf_fields(ModelSpec.from_hf_config(d), json.loads((d / "config.json").read_text()))
    source = TensorSource(d)
    dtype = torch_dtype(dtype or spec.dtype)
    # The same load on the meta device first: a tensor missing or of the wrong shape (a config that
    # does not match its weights) is named, with both shapes, before anything is allocated.
    load_hf_state_dict(Transformer(spec, dtype=dtype, device="meta", attention=attention,
                                   weight_layout=weight_layout), source.shapes())
    model = Transformer(spec, dtype=dtype, device=device, attention=attention, weight_layout=weight_layout)
    model.eos_token_id = checkpoint_eos(d)
    return load_hf_state_dict(model, source)


#: Hugging Face config fields that change the math of a model the engine builds, and what the engine
#: does with each: "honoured" (through the named ModelSpec field, which every attention backend
#: reads) or "refused" (loading raises, naming the field). Tested field by field.
MATH_FIELDS: dict[str, str] = {
    "sliding_window": "honoured: ModelSpec.sliding_window (Mistral, Mixtral; Qwen2 with use_sliding_window)",
    "use_sliding_window": "honoured: Qwen2 enables sliding_window with it",
    "max_window_layers": "honoured when every layer slides (0) or none does (>= num_layers); refused otherwise",
    "layer_types": "honoured: ModelSpec.layer_types, each layer's attention (full, sliding, chunked)",
    "scale_attn_weights": "honoured: ModelSpec.attn_scale (GPT-2)",
    "scale_attn_by_inverse_layer_idx": "honoured: ModelSpec.attn_scale_inverse_layer_idx (GPT-2)",
    "attn_logit_softcapping": "honoured: ModelSpec.attn_softcap (Gemma 2)",
    "final_logit_softcapping": "honoured: ModelSpec.final_softcap (Gemma 2)",
    "attention_chunk_size": "honoured: ModelSpec.attention_chunk_size on chunked layers (Llama 4)",
}


def _refuse(field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{field}: the checkpoint sets {value!r}, which the engine does not implement ({why}); "
                      "refusing to load a model that would compute wrong logits")


def honour_hf_fields(spec: ModelSpec, cfg: dict[str, Any]) -> ModelSpec:
    """`spec` with every field of `MATH_FIELDS` found in the raw HF config `cfg` honoured (whatever the
    spec loader kept), or a ValueError naming a field the engine cannot honour. A spec whose layers
    differ (`layer_types`, read by `ModelSpec.from_hf_config`) keeps its per-layer windows."""
    model_type = cfg.get("model_type", "")
    changes: dict[str, Any] = {}
    if model_type == "gpt2":
        changes["attn_scale"] = bool(cfg.get("scale_attn_weights", True))
        changes["attn_scale_inverse_layer_idx"] = bool(cfg.get("scale_attn_by_inverse_layer_idx", False))
    if spec.layer_types is not None:
        return replace(spec, **changes) if changes else spec
    window = cfg.get("sliding_window")
    if model_type == "qwen2" or "use_sliding_window" in cfg:
        window = window if cfg.get("use_sliding_window") else None
    if window is not None:
        mwl = cfg.get("max_window_layers")
        if model_type == "qwen2" and mwl is not None and mwl >= spec.num_layers:
            window = None  # no layer reaches max_window_layers: all attend fully
        elif model_type == "qwen2" and mwl:
            raise _refuse("max_window_layers", mwl, f"layers below {mwl} attend fully and the rest slide, as "
                          "Qwen2's config class does not state per layer")
    types = cfg.get("layer_types")
    if types and set(types) == {"full_attention"}:
        window = None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window: must be a positive integer or null, got {window!r}")
    if window is not None and window < spec.max_positions:
        changes["sliding_window"] = window
    elif spec.sliding_window is not None and window is None:
        changes["sliding_window"] = None
    return replace(spec, **changes) if changes else spec


def checkpoint_eos(directory: str | os.PathLike[str]) -> int | tuple[int, ...] | None:
    """The checkpoint's end-of-sequence id(s), as Hugging Face `generate()` decides them by default: a
    `generation_config.json` decides alone (no `eos_token_id` in it: never stop on EOS, as
    transformers reloads it as None); only without one does `config.json`'s id decide. An int, or a
    tuple when there are several (Llama 3, Qwen3, gpt-oss stop on any of them)."""
    for name in ("generation_config.json", "config.json"):
        f = Path(directory) / name
        if not f.is_file():
            continue
        try:
            eos = json.loads(f.read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{name}: cannot read {str(f)!r} ({exc})") from None
        if eos is None or eos == []:
            return None
        ids = eos if isinstance(eos, list) else [eos]
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ValueError(f"eos_token_id: {name} holds {eos!r}, not a non-negative integer or a list of them")
        return ids[0] if len(ids) == 1 else tuple(ids)
    return None


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """A Hugging Face config dict (`model_type` included) describing `spec`, for building the
    reference `transformers` model in tests and benchmarks (`AutoConfig.for_model(**cfg)`)."""
    if spec.family == "gpt2":
        return dict(model_type="gpt2", vocab_size=spec.vocab_size, n_embd=spec.hidden_size,
                    n_layer=spec.num_layers, n_head=spec.num_heads, n_inner=spec.ffn_size,
                    n_positions=spec.max_positions, activation_function=spec.hidden_act,
                    layer_norm_epsilon=spec.norm_eps, tie_word_embeddings=spec.tied_embeddings,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=spec.attn_scale,
                    scale_attn_by_inverse_layer_idx=spec.attn_scale_inverse_layer_idx)
    if spec.family != "llama":
        raise ValueError(f"family: no Hugging Face config for {spec.family!r}")
    if not spec.attn_scale or spec.attn_scale_inverse_layer_idx:
        raise ValueError("attn_scale: only GPT-2 configs express non-default attention scaling")
    cfg: dict[str, Any] = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
        intermediate_size=spec.ffn_size, hidden_act=spec.hidden_act, rms_norm_eps=spec.norm_eps,
        max_position_embeddings=spec.max_positions, tie_word_embeddings=spec.tied_embeddings,
        rope_theta=spec.rope_theta, attention_dropout=0.0)
    if spec.rope_scaling:
        cfg["rope_scaling"] = dict(spec.rope_scaling)
    if spec.is_mla:
        return _deepseek_config(spec, cfg)
    if spec.num_experts > 1:
        cfg.update(model_type="mixtral", num_local_experts=spec.num_experts,
                   num_experts_per_tok=spec.experts_per_token, sliding_window=spec.sliding_window)
    elif spec.qkv_bias and not spec.out_bias:
        cfg.update(model_type="qwen2")
        if spec.sliding_window is not None:  # every layer slides (max_window_layers=0)
            cfg.update(use_sliding_window=True, sliding_window=spec.sliding_window, max_window_layers=0)
    elif spec.sliding_window is not None:
        if spec.qkv_bias or spec.mlp_bias:
            raise ValueError("sliding_window: no Hugging Face model type has both a sliding window and llama biases")
        cfg.update(model_type="mistral", sliding_window=spec.sliding_window)
    else:
        cfg.update(model_type="llama", attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias)
    return cfg


def _deepseek_config(spec: ModelSpec, cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` as a DeepSeek-V3 config of an MLA spec with dense layers (`first_k_dense_replace` = every
    layer; V3's class also builds V2-Lite's q_proj when q_lora_rank is null, and its rope_interleave
    is V2's complex pairs)."""
    if spec.num_experts > 1:
        raise ValueError("num_experts: hf_config writes DeepSeek configs whose layers are all dense")
    if spec.qkv_bias != spec.out_bias:
        raise ValueError(f"qkv_bias: DeepSeek's attention_bias sets the q_a, kv_a and o biases together, got "
                         f"qkv_bias={spec.qkv_bias} and out_bias={spec.out_bias}")
    del cfg["head_dim"]
    return dict(cfg, model_type="deepseek_v3", num_key_value_heads=spec.num_heads, kv_lora_rank=spec.kv_lora_rank,
                q_lora_rank=spec.q_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
                qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                rope_interleave=spec.rope_interleaved, first_k_dense_replace=spec.num_layers,
                attention_bias=spec.qkv_bias)


__all__ = ["MATH_FIELDS", "TensorSource", "build_model", "checkpoint_eos", "from_pretrained", "hf_config",
           "honour_hf_fields", "init_random", "load_hf_state_dict", "to_hf_state_dict"]
