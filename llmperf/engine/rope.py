"""Rotary position embeddings (Su et al. 2021, arXiv:2104.09864) as Hugging Face checkpoints use them:
the "rotate half" layout (or adjacent pairs, `ModelSpec.rope_interleaved`: DeepSeek, Llama 4), fp32
tables cast to the activation dtype, and `rope_scaling` of type `linear`, `llama3` or `yarn` (Peng et
al. 2023, arXiv:2309.00071; Hugging Face `modeling_rope_utils`, whose yarn `attention_factor` scales
the tables).

Letters: B batch, T new tokens per sequence, D head dim.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmperf.specs import ModelSpec

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def check_rope(spec: ModelSpec) -> None:
    """A ValueError naming the RoPE field the engine cannot build (`rotary_dim`, `rope_scaling`)."""
    if spec.rotary_dim > spec.head_dim or spec.rotary_dim % 2:
        raise ValueError(f"rotary_dim: must be even and <= head_dim={spec.head_dim}, got {spec.rotary_dim} "
                         "(a spec scaled from a bigger one keeps its rotary_dim: pass rotary_dim=None)")
    scaling = dict(spec.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported by the engine "
                         f"(supported: {', '.join(ROPE_TYPES)})")


def rope_inv_freq(spec: ModelSpec, *, local: bool = False) -> torch.Tensor:
    """Inverse frequencies `(rotary_dim / 2,)` fp32, with the spec's `rope_scaling` applied
    (Hugging Face `modeling_rope_utils`: default, `linear`, `llama3`, `yarn`). `local`: a sliding
    layer's table where the spec has its own local base (`rope_local_theta`, Gemma 3: no scaling)."""
    return _rope_parameters(spec, local)[0]


def rope_attention_factor(spec: ModelSpec) -> float:
    """The factor yarn multiplies the cos / sin tables by (1.0 for the other types)."""
    return _rope_parameters(spec, False)[1]


def _rope_parameters(spec: ModelSpec, local: bool) -> tuple[torch.Tensor, float]:
    dim = spec.rotary_dim
    theta = spec.rope_local_theta if local and spec.rope_local_theta is not None else spec.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = {} if local and spec.rope_local_theta is not None else dict(spec.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(scaling["factor"]), 1.0
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn(spec, theta, dim, scaling)
    raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported by the engine "
                     f"(supported: {', '.join(ROPE_TYPES)})")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_softmax_mscale(spec: ModelSpec) -> float:
    """DeepSeek's yarn: the softmax scale is multiplied by mscale(factor, mscale_all_dim)^2 (1.0 unless
    `rope_scaling` is yarn with `mscale_all_dim`; transformers' `yarn_apply_mscale`)."""
    scaling = dict(spec.rope_scaling or {})
    if scaling.get("rope_type", scaling.get("type")) != "yarn" or not scaling.get("mscale_all_dim"):
        return 1.0
    m = _yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
    return m * m


def _yarn(spec: ModelSpec, base: float, dim: int, scaling: dict) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies by `factor`, keep the high ones, ramp between the
    dimensions that rotate beta_slow and beta_fast times over the original context."""
    old_len = float(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor")
    factor = spec.max_positions / old_len if factor is None else float(factor)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all
                            else _yarn_mscale(factor))
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention_factor)


class RotaryTable(nn.Module):
    """cos/sin tables `(positions, rotary_dim)` in fp32, grown on demand (doubling) up to max_positions.
    `local`: the table of sliding layers where the spec gives them their own base (Gemma 3)."""

    def __init__(self, spec: ModelSpec, device: torch.device, *, local: bool = False) -> None:
        super().__init__()
        self.max_positions = spec.max_positions
        inv_freq, self.attention_factor = _rope_parameters(spec, local)
        self.interleaved = spec.rope_interleaved
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        self.register_buffer("cos", torch.empty(0, spec.rotary_dim, device=device), persistent=False)
        self.register_buffer("sin", torch.empty(0, spec.rotary_dim, device=device), persistent=False)

    def _grow(self, n: int) -> None:
        n = min(max(n, 2 * self.cos.shape[0], 256), max(n, self.max_positions))
        pos = torch.arange(n, device=self.inv_freq.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]  # (n, rotary_dim / 2)
        # rotate-half pairs feature i with i + rotary_dim/2; interleaved pairs 2i with 2i + 1
        emb = freqs.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos() * self.attention_factor, emb.sin() * self.attention_factor

    def lookup(self, positions: torch.Tensor, max_position: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `(B, T, 1, rotary_dim)` at `positions` (B, T), in `dtype`."""
        if max_position >= self.cos.shape[0]:
            self._grow(max_position + 1)
        cos = self.cos[positions].to(dtype)[:, :, None]
        sin = self.sin[positions].to(dtype)[:, :, None]
        return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotate the first rotary_dim features of `x` (B, T, heads, D) by the tables (B, T, 1, rotary_dim):
    rotate-half pairs (i, i + rotary_dim/2), or with `interleaved` adjacent pairs (2i, 2i + 1), the
    complex-number form of DeepSeek's and Llama 4's checkpoints (tables from an interleaved
    `RotaryTable`)."""
    rd = cos.shape[-1]
    xr = x[..., :rd] if rd < x.shape[-1] else x
    if interleaved:
        pairs = xr.unflatten(-1, (rd // 2, 2))  # (..., rd/2, 2)
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)
    out = xr * cos + rotated * sin
    return out if rd == x.shape[-1] else torch.cat((out, x[..., rd:]), dim=-1)


__all__ = ["ROPE_TYPES", "RotaryTable", "apply_rope", "check_rope", "rope_attention_factor", "rope_inv_freq",
           "yarn_softmax_mscale"]
