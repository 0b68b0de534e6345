"""Rotary position embeddings (Su et al. 2021, arXiv:2104.09864) as Hugging Face checkpoints use them:
the "rotate half" layout, fp32 tables cast to the activation dtype, and `rope_scaling` of type `linear`
or `llama3` (Hugging Face `modeling_rope_utils`).

Letters: B batch, T new tokens per sequence, D head dim.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmperf.specs import ModelSpec


ROPE_TYPES = ("default", "linear", "llama3")


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


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse frequencies `(rotary_dim / 2,)` fp32, with the spec's `rope_scaling` applied
    (Hugging Face `modeling_rope_utils`: default, `linear`, `llama3`)."""
    dim = spec.rotary_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = dict(spec.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
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
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported by the engine "
                     "(supported: default, linear, llama3)")


class RotaryTable(nn.Module):
    """cos/sin tables `(positions, rotary_dim)` in fp32, grown on demand (doubling) up to max_positions."""

    def __init__(self, spec: ModelSpec, device: torch.device) -> None:
        super().__init__()
        self.max_positions = spec.max_positions
        self.register_buffer("inv_freq", rope_inv_freq(spec).to(device), persistent=False)
        self.register_buffer("cos", torch.empty(0, spec.rotary_dim, device=device), persistent=False)
        self.register_buffer("sin", torch.empty(0, spec.rotary_dim, device=device), persistent=False)

    def _grow(self, n: int) -> None:
        n = min(max(n, 2 * self.cos.shape[0], 256), max(n, self.max_positions))
        pos = torch.arange(n, device=self.inv_freq.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]  # (n, rotary_dim / 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (n, rotary_dim)
        self.cos, self.sin = emb.cos(), emb.sin()

    def lookup(self, positions: torch.Tensor, max_position: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `(B, T, 1, rotary_dim)` at `positions` (B, T), in `dtype`."""
        if max_position >= self.cos.shape[0]:
            self._grow(max_position + 1)
        cos = self.cos[positions].to(dtype)[:, :, None]
        sin = self.sin[positions].to(dtype)[:, :, None]
        return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim features of `x` (B, T, heads, D) by the tables (B, T, 1, rotary_dim)."""
    rd = cos.shape[-1]
    xr = x[..., :rd] if rd < x.shape[-1] else x
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    out = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
    return out if rd == x.shape[-1] else torch.cat((out, x[..., rd:]), dim=-1)


__all__ = ["ROPE_TYPES", "RotaryTable", "apply_rope", "check_rope", "rope_inv_freq"]
