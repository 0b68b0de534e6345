"""Weights for `Transformer`: seeded random ones for any spec, or a local Hugging Face checkpoint.

A checkpoint directory holds `config.json` and `model.safetensors`, or shards listed in
`model.safetensors.index.json` (`pytorch_model.bin` / its index as a fallback); nothing is
downloaded. Tensor names follow `transformers` (llama, mistral, qwen2, qwen3, gemma 2/3, phi3's and glm4's fused
`qkv_proj` / `gate_up_proj`; the MoE
families in `_moe_entries`: mixtral, qwen3_moe, qwen2_moe, deepseek_v2/v3, glm4_moe(_lite), minimax_m2 with experts
stacked as transformers 5 holds them (`mlp.experts.gate_up_proj`) or one by one as it saves them
and as published checkpoints store them (`mlp.experts.{j}.gate_proj.weight`, Mixtral's
`block_sparse_moe.experts.{j}.w1/w2/w3`), gpt-oss and llama4_text with their `(E, in, out)` expert
tensors; gpt2 with or without the `transformer.` prefix, whose `Conv1D` weights are stored
transposed, `(in, out)`).

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
_MATRICES = ("qkv_weight", "o_weight", "up_weight", "down_weight", "router_weight", "shared_gate_weight",
             "lm_head_weight", "q_a_weight", "q_b_weight", "q_weight", "kv_a_weight", "kv_b_weight",  # last five: MLA
             "qkvz_weight", "ba_weight", "out_weight", "in_weight")  # Gated DeltaNet, Mamba-2


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
                device: str | torch.device = "cpu", attention: str = "sdpa",
                weight_layout: str = "auto") -> Transformer:
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
    concatenated over dim 0, and a `matrix` is transposed when the model stores `(in, out)`.

    `form` says how stacked experts are stored: "" as above; "gate_up" per-expert parts
    [gate_0, up_0, gate_1, up_1, ...] -> `(E, 2F, C)`; "stack" one part per expert -> `(E, ...)`;
    "in_out" one `(E, in, out)` tensor (Llama 4, gpt-oss), transposed; "in_out_alternating" gpt-oss's
    gate_up `(E, C, 2F)` whose gate and up columns alternate, transposed and de-interleaved to
    [gate | up] rows; "alternating" its gate_up bias `(E, 2F)`, de-interleaved.

    `perm`: the concatenated rows reordered, engine row j = checkpoint row perm[j] (Qwen3-Next's
    per-key-head-group in_proj_qkvz / in_proj_ba, a gated q_proj's per-head [q | gate]); `sizes`: the
    parts' rows where they are not [q; k; v] or halves."""

    ours: str
    parts: tuple[str, ...]
    conv1d: bool = False
    matrix: bool = False
    form: str = ""
    perm: tuple[int, ...] | None = None
    sizes: tuple[int, ...] | None = None


def _from_alternating(t: torch.Tensor, dim: int) -> torch.Tensor:
    """gpt-oss's alternating [g0, u0, g1, u1, ...] along `dim` -> [g0, g1, ... | u0, u1, ...]."""
    x = t.movedim(dim, -1)
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1).movedim(-1, dim)


def _to_alternating(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[gate | up] along `dim` -> gpt-oss's alternating order (`_from_alternating`'s inverse)."""
    gate, up = t.movedim(dim, -1).chunk(2, dim=-1)
    return torch.stack((gate, up), dim=-1).flatten(-2).movedim(-1, dim)


def _engine_value(entry: _Entry, parts: list[torch.Tensor]) -> torch.Tensor:
    """The checkpoint tensors of `entry` as one `(out, in)` engine value."""
    if entry.conv1d:
        parts = [p.t() for p in parts]
    if entry.form == "gate_up":
        return torch.stack([torch.cat(parts[j:j + 2], dim=0) for j in range(0, len(parts), 2)])
    if entry.form == "stack":
        return torch.stack(parts)
    if entry.form == "row":  # ERNIE 4.5's (1, E) score correction
        return parts[0].reshape(-1)
    value = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    if entry.perm is not None:
        value = value[torch.tensor(entry.perm, device=value.device)]
    if entry.form in ("in_out", "in_out_alternating"):
        value = value.transpose(-1, -2)
    if entry.form == "in_out_alternating":
        value = _from_alternating(value, -2)
    elif entry.form == "alternating":
        value = _from_alternating(value, -1)
    return value


def _hf_value(entry: _Entry, value: torch.Tensor) -> torch.Tensor:
    """An `(out, in)` engine value of a one-part entry in the checkpoint's layout (`_engine_value`'s inverse)."""
    if entry.form == "row":
        return value.reshape(1, -1)
    if entry.form == "in_out_alternating":
        value = _to_alternating(value, -2)
    elif entry.form == "alternating":
        value = _to_alternating(value, -1)
    if entry.form in ("in_out", "in_out_alternating"):
        value = value.transpose(-1, -2)
    return value


#: how a checkpoint stores a Gated DeltaNet layer's input projections: "fused" (Qwen3-Next: `in_proj_qkvz`,
#: `in_proj_ba`, laid out per key-head group) or "split" (Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
#: `in_proj_a`, each contiguous)
LINEAR_FORMATS = ("fused", "split")


def _qkvz_perm(spec: ModelSpec) -> tuple[int, ...]:
    """Qwen3-Next's `in_proj_qkvz` rows, per key-head group g [q_g | k_g | v_g (r heads) | z_g (r heads)]
    (`fix_query_key_value_ordering`), as the engine's [q | k | v | z]."""
    nk, dk, dv = spec.linear_num_key_heads, spec.linear_key_head_dim, spec.linear_value_head_dim
    r = spec.linear_num_value_heads // nk  # type: ignore[operator]
    w = 2 * dk + 2 * r * dv  # type: ignore[operator]
    spans = [(0, dk), (dk, 2 * dk), (2 * dk, 2 * dk + r * dv), (2 * dk + r * dv, w)]  # type: ignore[operator]
    return tuple(g * w + j for lo, hi in spans for g in range(nk) for j in range(lo, hi))  # type: ignore[arg-type]


def _ba_perm(spec: ModelSpec) -> tuple[int, ...]:
    """Qwen3-Next's `in_proj_ba` rows, per key-head group [b_g | a_g] (r each), as [b | a]."""
    nk = spec.linear_num_key_heads
    r = spec.linear_num_value_heads // nk  # type: ignore[operator]
    return tuple(g * 2 * r + j for lo in (0, r) for g in range(nk) for j in range(lo, lo + r))  # type: ignore[arg-type]


def _gated_q_perm(spec: ModelSpec) -> tuple[int, ...]:
    """A gated q_proj's rows, per head [q_h | gate_h] (`attn_output_gate`), then k and v, as the
    engine's [q | k | v | gate]."""
    H, D, kv = spec.num_heads, spec.head_dim, spec.kv_size
    q = [h * 2 * D + d for h in range(H) for d in range(D)]
    return tuple(q + [2 * H * D + j for j in range(2 * kv)] + [i + D for i in q])


def _linear_entries(spec: ModelSpec, hf: str, us: str, linear_format: str) -> list[_Entry]:
    """A Gated DeltaNet layer's `linear_attn.*` parameters and their checkpoint tensors."""
    la, us = hf + "linear_attn.", us + "linear_attn."
    if linear_format == "fused":
        out = [_Entry(us + "qkvz_weight", (la + "in_proj_qkvz.weight",), matrix=True, perm=_qkvz_perm(spec)),
               _Entry(us + "ba_weight", (la + "in_proj_ba.weight",), matrix=True, perm=_ba_perm(spec))]
    else:
        nv = spec.linear_num_value_heads
        out = [_Entry(us + "qkvz_weight", (la + "in_proj_qkv.weight", la + "in_proj_z.weight"), matrix=True,
                      sizes=(spec.linear_conv_dim, spec.linear_value_dim)),
               _Entry(us + "ba_weight", (la + "in_proj_b.weight", la + "in_proj_a.weight"), matrix=True,
                      sizes=(nv, nv))]  # type: ignore[arg-type]
    return out + [_Entry(us + "conv_weight", (la + "conv1d.weight",)), _Entry(us + "dt_bias", (la + "dt_bias",)),
                  _Entry(us + "A_log", (la + "A_log",)), _Entry(us + "norm.weight", (la + "norm.weight",)),
                  _Entry(us + "out_weight", (la + "out_proj.weight",), matrix=True)]


def _layout(spec: ModelSpec, moe_format: str = "stacked", linear_format: str = "fused",
            bias_at: str = "", shared_mlp: bool | None = None, bamba: bool | None = None) -> list[_Entry]:
    """Every engine parameter and the Hugging Face tensors it is built from (`shared_mlp`: a dense Granite
    layer's FFN is Granite 4.0-H's `shared_mlp`, `_granite_shared_mlp`; `bamba`: Bamba's names, `_bamba_names`)."""
    out: list[_Entry] = []
    if spec.sublayer_layers:
        return _nemotron_layout(spec, moe_format)
    if spec.family == "llama":
        bamba = _bamba_names(spec) if bamba is None else bamba
        out += [_Entry("embed_weight", ("model.embed_tokens.weight",)),
                _Entry("final_norm.weight", ("model.final_layernorm.weight" if bamba else "model.norm.weight",))]
        if not spec.tied_embeddings:
            out.append(_Entry("lm_head_weight", ("lm_head.weight",), matrix=True))
        for i, kind in enumerate(spec.layer_kinds()):
            hf, us = f"model.layers.{i}.", f"layers.{i}."
            attn = hf + "self_attn."
            if spec.post_norm:  # OLMo 2/3, EXAONE 4: the norms after attention and after the MLP, none before
                out += [_Entry(us + "attn_norm.weight", (hf + "post_attention_layernorm.weight",)),
                        _Entry(us + "mlp_norm.weight", (hf + "post_feedforward_layernorm.weight",))]
            elif spec.sandwich_norms:  # Gemma: a norm after attention and around the MLP
                out += [_Entry(us + "attn_norm.weight", (hf + "input_layernorm.weight",)),
                        _Entry(us + "post_attn_norm.weight", (hf + "post_attention_layernorm.weight",)),
                        _Entry(us + "mlp_norm.weight", (hf + "pre_feedforward_layernorm.weight",)),
                        _Entry(us + "post_mlp_norm.weight", (hf + "post_feedforward_layernorm.weight",))]
            else:  # Bamba calls its norm before the MLP pre_ff_layernorm; Cohere has one norm for both sublayers
                out.append(_Entry(us + "attn_norm.weight", (hf + "input_layernorm.weight",)))
                if not spec.shared_input_norm:
                    norm = "pre_ff_layernorm" if bamba else "post_attention_layernorm"
                    out.append(_Entry(us + "mlp_norm.weight", (hf + norm + ".weight",)))
            if kind.attention == "linear" and spec.is_mamba:  # Granite 4.0-H's Mamba-2 layers
                out += _mamba_entries(spec, hf + "mamba.", us + "linear_attn.")
            elif kind.attention == "linear":
                out += _linear_entries(spec, hf, us, linear_format)
            elif spec.is_mla:
                out += _mla_entries(spec, attn, us + "attn.")
            else:
                gated = dict(perm=_gated_q_perm(spec), sizes=(2 * spec.q_size, spec.kv_size, spec.kv_size)) \
                    if spec.attn_output_gate else {}
                out += [_Entry(us + "qkv_weight", tuple(f"{attn}{p}_proj.weight" for p in "qkv"), matrix=True,
                               **gated),
                        _Entry(us + "o_weight", (attn + "o_proj.weight",), matrix=True)]
                if spec.qkv_bias:
                    out.append(_Entry(us + "qkv_bias", tuple(f"{attn}{p}_proj.bias" for p in "qkv"), **gated))
                if spec.out_bias:
                    out.append(_Entry(us + "o_bias", (attn + "o_proj.bias",)))
            if spec.qk_norm in ("rmsnorm", "rmsnorm_across_heads") and kind.attention != "linear":
                out += [_Entry(us + "q_norm.weight", (attn + "q_norm.weight",)),
                        _Entry(us + "k_norm.weight", (attn + "k_norm.weight",))]
            if spec.attn_sinks and kind.attention != "linear":
                out.append(_Entry(us + "sinks", (attn + "sinks",)))
            if _is_granite(spec) and (kind.moe or (_granite_shared_mlp(spec) if shared_mlp is None else shared_mlp)):
                out += _granite_ffn_entries(spec, hf, us, kind.moe, moe_format)
                continue
            if kind.moe:
                out += _moe_entries(spec, hf, us, moe_format, bias_at)
                continue
            mlp = hf + ("feed_forward." if bamba else _ffn_prefix(spec))
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


def _nemotron_layout(spec: ModelSpec, moe_format: str) -> list[_Entry]:
    """Nemotron-H (transformers' `NemotronHForCausalLM` names): each layer's one norm (`norm`, the engine's
    attn_norm before a token mixer, mlp_norm before an FFN) and its one `mixer`: Mamba-2, attention (no biases),
    a two-matrix MLP, or a mixture of two-matrix experts (stacked `experts.up_proj` (E, F, C) as transformers
    holds them, or one by one as it saves them: `experts.{j}.up_proj.weight`) with its one shared expert."""
    out = [_Entry("embed_weight", ("model.embeddings.weight",)), _Entry("final_norm.weight", ("model.norm_f.weight",)),
           _Entry("lm_head_weight", ("lm_head.weight",), matrix=True)]
    for i, kind in enumerate(spec.layer_kinds()):
        hf, us = f"model.layers.{i}.", f"layers.{i}."
        mixer = hf + "mixer."
        out.append(_Entry(us + ("mlp_norm" if kind.attention == "none" else "attn_norm") + ".weight",
                          (hf + "norm.weight",)))
        biased: list[tuple[str, str]] = []
        if kind.attention == "linear":
            out += _mamba_entries(spec, mixer, us + "linear_attn.")
        elif kind.attention == "full":
            out += [_Entry(us + "qkv_weight", tuple(f"{mixer}{p}_proj.weight" for p in "qkv"), matrix=True),
                    _Entry(us + "o_weight", (mixer + "o_proj.weight",), matrix=True)]
        elif kind.moe:
            moe, E = us + "moe_ffn.", spec.num_experts
            experts = [(moe + f"experts_{p}_weight", mixer + f"experts.{p}_proj") for p in ("up", "down")]
            if moe_format == "stacked":
                out += [_Entry(ours, (theirs,), matrix=True) for ours, theirs in experts]
            else:
                out += [_Entry(ours, tuple(theirs.replace("experts.", f"experts.{j}.") + ".weight" for j in range(E)),
                               matrix=True, form="stack") for ours, theirs in experts]
            out += [_Entry(moe + "router_weight", (mixer + "gate.weight",), matrix=True),
                    _Entry(moe + "router_score_bias", (mixer + "gate.e_score_correction_bias",))]
            out += [_Entry(moe + f"shared_{p}_weight", (mixer + f"shared_experts.{p}_proj.weight",), matrix=True)
                    for p in ("up", "down")]
        else:
            out += [_Entry(us + f"{p}_weight", (mixer + f"{p}_proj.weight",), matrix=True) for p in ("up", "down")]
            biased += [(us + f"{p}_bias", mixer + f"{p}_proj.bias") for p in ("up", "down")] if spec.mlp_bias else []
        out += [_Entry(ours, (theirs,)) for ours, theirs in biased]
    return out


def _mamba_entries(spec: ModelSpec, mixer: str, la: str) -> list[_Entry]:
    """A Mamba-2 mixer's parameters (`mamba2.Mamba2Mixer`) and their tensors under `mixer` (transformers' names:
    Nemotron-H's `mixer.`, Granite 4.0-H's `mamba.`), biases where the spec has them."""
    out = [_Entry(la + "in_weight", (mixer + "in_proj.weight",), matrix=True),
           _Entry(la + "out_weight", (mixer + "out_proj.weight",), matrix=True),
           *(_Entry(la + p, (mixer + p,)) for p in ("dt_bias", "A_log", "D", "norm.weight")),
           _Entry(la + "conv_weight", (mixer + "conv1d.weight",))]
    biased = [(la + "conv_bias", mixer + "conv1d.bias")] if spec.linear_conv_bias else []
    biased += [(la + "in_bias", mixer + "in_proj.bias"), (la + "out_bias", mixer + "out_proj.bias")] \
        if spec.linear_proj_bias else []
    return out + [_Entry(ours, (theirs,)) for ours, theirs in biased]


def _is_granite(spec: ModelSpec) -> bool:
    """A Granite spec (granite, granitemoe, granitemoeshared, granitemoehybrid): its config reader always sets
    the softmax scale `attention_multiplier` (1.0 by default), which no other model type has."""
    return spec.attention_multiplier is not None


def _granite_shared_mlp(spec: ModelSpec, keys: set[str] | None = None) -> bool:
    """Whether a dense Granite layer's FFN is Granite 4.0-H's `shared_mlp` (`num_local_experts` 0) rather than
    Granite 3's Llama `mlp`: the checkpoint's names say so; without them (saving back), a model with Mamba-2
    layers (a dense 4.0-H of attention layers alone saves under Granite 3's names)."""
    if keys:
        return any(".shared_mlp." in k for k in keys)
    return spec.has_linear_layers


def _bamba_names(spec: ModelSpec, keys: set[str] | None = None) -> bool:
    """Whether a checkpoint names its layers as Bamba's (`pre_ff_layernorm`, `feed_forward.`, `final_layernorm`):
    its names say so; without them (saving back), a model with Mamba-2 layers followed by an FFN that is not
    Granite's (a Bamba of attention layers alone saves under Llama's names)."""
    if keys:
        return any(".pre_ff_layernorm." in k for k in keys)
    return spec.is_mamba and spec.has_linear_layers and not spec.sublayer_layers and not _is_granite(spec)


def _granite_ffn_entries(spec: ModelSpec, hf: str, us: str, moe: bool, moe_format: str) -> list[_Entry]:
    """A Granite MoE layer (`block_sparse_moe.`: the router, the experts stacked (E, 2F, C) as [gate | up] and
    (E, C, F), as transformers holds them (`moe_format` stacked) or as it saves them: `router.layer`,
    `input_linear`, `output_linear`) and its `shared_mlp` ([gate | up] in one `input_linear`, `output_linear`);
    a dense Granite 4.0-H layer's `shared_mlp` alone, as its FFN."""
    shared = hf + "shared_mlp."
    if not moe:
        return [_Entry(us + "up_weight", (shared + "input_linear.weight",), matrix=True),
                _Entry(us + "down_weight", (shared + "output_linear.weight",), matrix=True)]
    moe_ffn, block = us + "moe_ffn.", hf + "block_sparse_moe."
    names = (("router.weight", "experts.gate_up_proj", "experts.down_proj") if moe_format == "stacked"
             else ("router.layer.weight", "input_linear.weight", "output_linear.weight"))
    out = [_Entry(moe_ffn + ours, (block + theirs,), matrix=True)
           for ours, theirs in zip(("router_weight", "experts_up_weight", "experts_down_weight"), names)]
    if spec.shared_experts:
        out += [_Entry(moe_ffn + "shared_up_weight", (shared + "input_linear.weight",), matrix=True),
                _Entry(moe_ffn + "shared_down_weight", (shared + "output_linear.weight",), matrix=True)]
    return out


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


def _ffn_prefix(spec: ModelSpec) -> str:
    """Where a layer's FFN lives: Llama 4's `feed_forward.` (dense and MoE layers alike), else `mlp.`."""
    return "feed_forward." if spec.router_input_scaling else "mlp."


#: how a checkpoint stores the routed experts of the Llama-style MoE families: "stacked" (transformers
#: 5 in memory: `mlp.experts.gate_up_proj` (E, 2F, C)), "per_expert" (what transformers 5 saves for
#: Qwen3-MoE, DeepSeek, GLM-4.5, and the published checkpoints: `mlp.experts.{j}.gate_proj.weight`),
#: "mixtral" (published Mixtral: `block_sparse_moe.experts.{j}.w1/w3/w2`). Llama 4 and gpt-oss
#: always store them stacked `(E, in, out)`.
MOE_FORMATS = ("stacked", "per_expert", "mixtral")


def _moe_entries(spec: ModelSpec, hf: str, us: str, moe_format: str = "stacked", bias_at: str = "") -> list[_Entry]:
    """The engine's `moe_ffn.*` parameters of one MoE layer and the checkpoint tensors they come from
    (transformers 5's names per family: `modeling_mixtral`, `qwen3_moe`, `qwen2_moe`, `deepseek_v2/v3`,
    `glm4_moe`, `gpt_oss`, `llama4`)."""
    us += "moe_ffn."
    mlp = hf + _ffn_prefix(spec)
    E = spec.num_experts
    out: list[_Entry] = []
    if spec.router_input_scaling:  # Llama 4: Llama4TextMoe (router, experts (E, C, 2F), shared_expert)
        out += [_Entry(us + "router_weight", (mlp + "router.weight",), matrix=True),
                _Entry(us + "experts_up_weight", (mlp + "experts.gate_up_proj",), matrix=True, form="in_out"),
                _Entry(us + "experts_down_weight", (mlp + "experts.down_proj",), matrix=True, form="in_out")]
        shared = mlp + "shared_expert."
    elif spec.router_bias:  # gpt-oss: GptOssMLP (router with a bias, experts (E, C, 2F) alternating, biased)
        ex = mlp + "experts."
        out += [_Entry(us + "router_weight", (mlp + "router.weight",), matrix=True),
                _Entry(us + "router_bias", (mlp + "router.bias",)),
                _Entry(us + "experts_up_weight", (ex + "gate_up_proj",), matrix=True, form="in_out_alternating"),
                _Entry(us + "experts_down_weight", (ex + "down_proj",), matrix=True, form="in_out")]
        if spec.mlp_bias:
            out += [_Entry(us + "experts_up_bias", (ex + "gate_up_proj_bias",), form="alternating"),
                    _Entry(us + "experts_down_bias", (ex + "down_proj_bias",))]
        shared = mlp + "shared_expert."
    else:
        if moe_format == "mixtral":  # published Mixtral: one module per expert, w1 = gate, w3 = up, w2 = down
            moe = hf + "block_sparse_moe."
            gate_up = tuple(f"{moe}experts.{j}.{w}.weight" for j in range(E) for w in ("w1", "w3"))
            down = tuple(f"{moe}experts.{j}.w2.weight" for j in range(E))
            out.append(_Entry(us + "router_weight", (moe + "gate.weight",), matrix=True))
        else:
            out.append(_Entry(us + "router_weight", (mlp + "gate.weight",), matrix=True))
            if moe_format == "per_expert":
                gate_up = tuple(f"{mlp}experts.{j}.{w}_proj.weight" for j in range(E) for w in ("gate", "up"))
                down = tuple(f"{mlp}experts.{j}.down_proj.weight" for j in range(E))
        if moe_format == "stacked":
            out += [_Entry(us + "experts_up_weight", (mlp + "experts.gate_up_proj",), matrix=True),
                    _Entry(us + "experts_down_weight", (mlp + "experts.down_proj",), matrix=True)]
        else:
            out += [_Entry(us + "experts_up_weight", gate_up, matrix=True, form="gate_up"),
                    _Entry(us + "experts_down_weight", down, matrix=True, form="stack")]
        if spec.router_score_bias:  # noaux_tc's correction, where the checkpoint keeps it (`SCORE_BIAS_AT`)
            at = bias_at or _score_bias_at(spec, set())
            block = (hf + "block_sparse_moe.") if moe_format == "mixtral" and at == "block" else mlp
            out.append(_Entry(us + "router_score_bias", (block + SCORE_BIAS_AT[at] + "e_score_correction_bias",),
                              form="row" if at.endswith("statics") else ""))
        # DeepSeek's `shared_experts` (one MLP of n_shared x width), Qwen2-MoE's gated `shared_expert`
        shared = mlp + ("shared_expert." if spec.shared_expert_gate else "shared_experts.")
    if spec.shared_experts:
        out += [_Entry(us + "shared_up_weight", (shared + "gate_proj.weight", shared + "up_proj.weight"), matrix=True),
                _Entry(us + "shared_down_weight", (shared + "down_proj.weight",), matrix=True)]
    if spec.shared_expert_gate:
        out.append(_Entry(us + "shared_gate_weight", (mlp + "shared_expert_gate.weight",), matrix=True))
    return out


#: where a checkpoint keeps noaux_tc's routing-score correction, after the FFN's prefix: on the router
#: (DeepSeek-V3, GLM-4.5, Kimi: `gate.`), on the MoE block (MiniMax-M2; saved under Mixtral's
#: `block_sparse_moe.`), in ERNIE 4.5's statics module as published and saved (`moe_statics.`) or as
#: transformers holds it (`gate.moe_statics.`), there shaped (1, E)
SCORE_BIAS_AT = {"router": "gate.", "block": "", "statics": "moe_statics.", "gate_statics": "gate.moe_statics."}


def _score_bias_at(spec: ModelSpec, keys: set[str]) -> str:
    """Which of `SCORE_BIAS_AT` a checkpoint's tensor names use. Where they hold none (a model saved back,
    or built from a spec), where transformers' class of the family keeps it: ERNIE 4.5 (the one family
    scoring by softmax with a correction) in its statics, MiniMax-M2 (the one with a q/k norm across all
    heads) on the block, the others on the router."""
    for k in keys:
        if k.endswith(".e_score_correction_bias"):
            for at in ("gate_statics", "statics", "router"):
                if k.endswith("." + SCORE_BIAS_AT[at] + "e_score_correction_bias"):
                    return at
            return "block"
    if spec.router_scoring == "softmax":
        return "gate_statics"
    return "block" if spec.qk_norm == "rmsnorm_across_heads" else "router"


def _moe_format(spec: ModelSpec, keys: set[str]) -> str:
    """Which of `MOE_FORMATS` a checkpoint's tensor names use."""
    if not spec.is_moe or any(k.endswith(("experts.gate_up_proj", "mixer.experts.up_proj")) for k in keys):
        return "stacked"
    if any(".block_sparse_moe." in k for k in keys):
        return "mixtral"
    return "per_expert"


# ---------------------------------------------------------------------------------------------------
# Loading from a mapping of tensors


def _linear_format(spec: ModelSpec, keys: set[str]) -> str:
    """Which of `LINEAR_FORMATS` a checkpoint's Gated DeltaNet tensors use."""
    return "split" if any(k.endswith("linear_attn.in_proj_qkv.weight") for k in keys) else "fused"


def _language_model_prefix(keys: set[str]) -> Callable[[str], str]:
    """A multimodal wrapper's checkpoint keeps the text model under a prefix: the text tensors' names there.
    Qwen3.5's `ForConditionalGeneration` (and any wrapper in memory): `model.language_model.`; Kimi K2.5 as
    published: `language_model.model.layers.` and `language_model.lm_head.`, and as transformers 5 saves it
    (its load-time rename of `blocks` to `layers`, reversed for every key): `language_model.model.blocks.`."""
    if any(k.startswith("model.layers.") for k in keys):
        return lambda k: k
    if any(k.startswith("backbone.layers.") for k in keys):  # Nemotron-H as published and as transformers saves it
        return lambda k: "backbone." + k.removeprefix("model.") if k.startswith("model.") else k
    if any(k.startswith("model.language_model.") for k in keys):
        return lambda k: "model.language_model." + k.removeprefix("model.") if k.startswith("model.") else k
    if any(k.startswith("language_model.model.") for k in keys):
        blocks = any(k.startswith("language_model.model.blocks.") for k in keys)
        head = "language_model.lm_head.weight" if "language_model.lm_head.weight" in keys else "lm_head.weight"

        def kimi(k: str) -> str:
            if k == "lm_head.weight":
                return head
            if blocks and k.startswith("model.layers."):
                k = "model.blocks." + k.removeprefix("model.layers.")
            return "language_model." + k if k.startswith("model.") else k
        return kimi
    return lambda k: k


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
    rename = _strip_gpt2_prefix(keys) if spec.family == "gpt2" else _language_model_prefix(keys)
    params = dict(model.named_parameters(remove_duplicate=False))
    layout = _layout(spec, _moe_format(spec, keys), _linear_format(spec, keys), _score_bias_at(spec, keys),
                     _granite_shared_mlp(spec, keys), _bamba_names(spec, keys))
    _copy_entries(spec, params, _fused_parts(layout, keys), tensors, keys, model.in_out, strict, rename)
    return model


#: GLM-4's names of the four norms of a sandwich-normed layer (engine parameter suffix -> checkpoint norm)
_GLM4_NORMS = {"attn_norm.weight": "input_layernorm", "post_attn_norm.weight": "post_self_attn_layernorm",
               "mlp_norm.weight": "post_attention_layernorm", "post_mlp_norm.weight": "post_mlp_layernorm"}


def _fused_parts(entries: list[_Entry], keys: set[str]) -> list[_Entry]:
    """`entries` as a checkpoint that stores the fused matrices whole names them: Phi-3's `self_attn.qkv_proj`
    ([q; k; v] rows) and its and GLM-4's `mlp.gate_up_proj` ([gate; up] rows), the engine's own layouts; and
    GLM-4's names of its four norms (`post_self_attn_layernorm`, ...; Gemma's otherwise)."""
    qkv = any(k.endswith("self_attn.qkv_proj.weight") for k in keys)
    gate_up = any(k.endswith("mlp.gate_up_proj.weight") for k in keys)
    glm4 = any(k.endswith("post_self_attn_layernorm.weight") for k in keys)
    if not qkv and not gate_up and not glm4:
        return entries
    out = []
    for e in entries:
        p = e.parts
        suffix = e.ours.split(".", 2)[-1] if e.ours.startswith("layers.") else ""
        if glm4 and suffix in _GLM4_NORMS:
            e = replace(e, parts=(p[0].rsplit(".", 2)[0] + f".{_GLM4_NORMS[suffix]}.weight",))
        if qkv and len(p) == 3 and e.perm is None and p[0].endswith(("attn.q_proj.weight", "attn.q_proj.bias")):
            e = replace(e, parts=(p[0].replace("self_attn.q_proj.", "self_attn.qkv_proj."),))
        elif gate_up and len(p) == 2 and p[0].endswith(("mlp.gate_proj.weight", "mlp.gate_proj.bias")):
            e = replace(e, parts=(p[0].replace("mlp.gate_proj.", "mlp.gate_up_proj."),))
        out.append(e)
    return out


def _copy_entries(spec: ModelSpec, params: Mapping[str, torch.Tensor], entries: list[_Entry],
                  tensors: Mapping[str, torch.Tensor], keys: set[str], in_out: bool, strict: bool = True,
                  rename: Callable[[str], str] = lambda k: k) -> None:
    """Copy each entry's checkpoint tensors into the engine parameter it names (see `load_hf_state_dict`)."""
    for entry in entries:
        names = [rename(p) for p in entry.parts]
        missing = [n for n in names if n not in keys]
        if missing:
            if strict:
                raise ValueError(f"checkpoint: missing tensor {missing[0]!r} (for {entry.ours})")
            continue
        parts = [tensors[n] for n in names]
        value = _engine_value(entry, parts)
        if entry.matrix and in_out:
            value = value.transpose(-1, -2)  # (out, in) -> the engine's (in, out)
        target = params[entry.ours]
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(_shape_mismatch(spec, entry, names, parts, tuple(value.shape), tuple(target.shape),
                                             in_out))
        target.copy_(value.to(dtype=target.dtype))


@torch.no_grad()
def load_moe_state_dict(moe: torch.nn.Module, spec: ModelSpec, tensors: Mapping[str, torch.Tensor],
                        layer: int) -> torch.nn.Module:
    """Copy one MoE layer's Hugging Face-named tensors (`model.layers.{layer}.mlp.*`, any of
    `MOE_FORMATS`) into a lone `moe.MoE` module built for `spec`: module-level checks against a
    transformers MoE block whose model the engine cannot build whole."""
    keys = set(tensors.keys())
    entries = _moe_entries(spec, f"model.layers.{layer}.", "", _moe_format(spec, keys), _score_bias_at(spec, keys))
    params = {f"moe_ffn.{k}": v for k, v in moe.named_parameters()}
    _copy_entries(spec, params, entries, tensors, keys, moe.ops.in_out)
    return moe


def _shape_mismatch(spec: ModelSpec, entry: _Entry, names: list[str], parts: list[torch.Tensor],
                    got: tuple[int, ...], want: tuple[int, ...], in_out: bool) -> str:
    """One line naming the checkpoint tensor that does not fit and both shapes: for a fused parameter
    (q/k/v, gate/up) the part whose rows differ from what the config gives it."""
    if len(parts) > 1 and not entry.form and ("qkv" in entry.ours or entry.ours.endswith("up_weight")):
        rows = want[-1] if entry.matrix and in_out else want[0]  # the engine value's (out, in) rows
        for name, part, part_rows in zip(names, parts, _split_sizes(spec, entry, rows)):
            if part.shape[0] != part_rows:
                expected = (part_rows, *part.shape[1:])
                return (f"checkpoint: {name!r} has shape {tuple(part.shape)}, the config expects {expected} "
                        f"(part of {entry.ours}, {want})")
    return f"checkpoint: {names[0]!r} has shape {got}, the model expects {want} for {entry.ours}"


def to_hf_state_dict(model: Transformer, linear_format: str = "fused") -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names (transformers 5 layout), e.g. to load them into a
    `LlamaForCausalLM` / `GPT2LMHeadModel` with `load_state_dict(..., strict=False)`. `linear_format`:
    Gated DeltaNet layers as Qwen3-Next ("fused") or Qwen3.5 ("split") name them."""
    if linear_format not in LINEAR_FORMATS:
        raise ValueError(f"linear_format: must be one of {', '.join(LINEAR_FORMATS)}, got {linear_format!r}")
    params = dict(model.named_parameters(remove_duplicate=False))
    out: dict[str, torch.Tensor] = {}
    for entry in _layout(model.spec, linear_format=linear_format):
        value = params[entry.ours].detach()
        if entry.matrix and model.in_out:
            value = value.transpose(-1, -2)  # back to (out, in)
        if entry.perm is not None:  # engine row j is checkpoint row perm[j]
            value = value[torch.argsort(torch.tensor(entry.perm, device=value.device))]
        if len(entry.parts) == 1:
            chunks = [_hf_value(entry, value)]
        else:
            sizes = _split_sizes(model.spec, entry, value.shape[0])
            chunks = list(value.split(sizes, dim=0))
        for name, chunk in zip(entry.parts, chunks):
            out[name] = (chunk.t() if entry.conv1d else chunk).contiguous().clone()
    if model.spec.tied_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight" if model.spec.family == "llama"
                                    else "transformer.wte.weight"]
    return out


def _split_sizes(spec: ModelSpec, entry: _Entry, rows: int) -> list[int]:
    """Rows of each part of a concatenated `(out, in)` value: [q; k; v], or [gate; up] halves."""
    if entry.sizes is not None:
        return list(entry.sizes)
    if "qkv" in entry.ours:
        return [spec.q_size, spec.kv_size, spec.kv_size]
    return [rows // 2, rows // 2]


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
    if spec.quantization is not None:  # its tensors are packed blocks and scales, not the weights
        q = spec.quantization
        raise ValueError(f"quantization: {str(path)!r} is a {q.method} checkpoint ({q.bits}-bit); the engine "
                         "loads unquantised fp32 / fp16 / bf16 weights (dequantise it first; estimate, simulate "
                         "and plan model it as shipped)")
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
    text = cfg.get("text_config")
    if isinstance(text, Mapping):  # a multimodal wrapper (Mistral 3): its text model's fields
        cfg = {"model_type": "", **text}
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


#: the MoE fields of a spec and their values in a Mixtral config, the one MoE type `hf_config` writes
_MIXTRAL_MOE: tuple[tuple[str, Any], ...] = (
    ("shared_experts", 0), ("shared_expert_gate", False), ("dense_layers", ()),
    ("router_bias", False), ("router_score_bias", False), ("router_scoring", "softmax"), ("router_renormalize", True),
    ("router_scale", 1.0), ("router_groups", 1), ("router_input_scaling", False), ("swiglu_limit", None),
    ("mlp_bias", False))


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
        for field, mixtral in _MIXTRAL_MOE:
            if getattr(spec, field) != mixtral:
                raise ValueError(f"{field}: hf_config writes Mixtral configs only ({field}={mixtral!r}), got "
                                 f"{getattr(spec, field)!r}; save the family's own checkpoint instead")
        if spec.expert_ffn_size != spec.ffn_size:
            raise ValueError(f"moe_ffn_size: Mixtral's experts are ffn_size={spec.ffn_size} wide, "
                             f"got {spec.moe_ffn_size}")
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


__all__ = ["LINEAR_FORMATS", "MATH_FIELDS", "MOE_FORMATS", "TensorSource", "build_model", "checkpoint_eos",
           "from_pretrained", "hf_config", "honour_hf_fields", "init_random", "load_hf_state_dict",
           "load_moe_state_dict", "to_hf_state_dict"]
