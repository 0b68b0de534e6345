"""Gated DeltaNet token mixers (Yang et al. 2024, arXiv:2412.06464), the `linear` layers of Qwen3-Next
and Qwen3.5, in plain torch as `transformers` computes them (`models/qwen3_next/modeling_qwen3_next.py`),
and the per-sequence state they keep instead of a KV cache.

Letters: B sequences, T new tokens each, C hidden size, nk / nv key / value heads (each key head serves
r = nv / nk value heads), dk / dv their widths, K the convolution's width, W = 2 nk dk + nv dv the
convolved channels ([q | k | v]).

A layer: one GEMM to [q | k | v | z] (`in_proj_qkvz`), one to [b | a] (`in_proj_ba`); a causal depthwise
convolution with the activation over [q | k | v] whose state is the sequence's last K - 1 inputs
(`conv1d`); l2-normalised q and k, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); the gated
delta rule over the recurrent state S (nv, dk, dv), fp32: chunks of 64 tokens in prefill
(`chunk_gated_delta_rule`), token by token in decode (`recurrent_gated_delta_rule`), the same numbers
(`deltanet`); RMSNorm of each value head's output (plain weight, fp32) times silu(z) (`gated_norm`);
`out_proj` (`o_proj`).

The conv and recurrent states live in the cache (`llmperf.engine.cache.LinearStates`: a slot per
sequence id, zeroed when it is allocated, copied on fork and beam reorder, freed at its end), addressed by
the step's `StepMeta.states` / `state_rows`. A sequence whose step starts at position 0 reads a zero
state whatever its slot holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmperf.analysis.vocabulary import Op
from llmperf.engine.ops import TorchOps
from llmperf.engine.step import StepMeta
from llmperf.specs import ModelSpec

CHUNK = 64  # the chunked form's block of tokens (transformers' and FLA's chunk_size)
_QKVZ, _BA, _CONV, _RULE, _GNORM, _OUT = (Op.in_proj_qkvz.value, Op.in_proj_ba.value, Op.conv1d.value,
                                          Op.deltanet.value, Op.gated_norm.value, Op.o_proj.value)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last axis (FLA's and transformers' `l2norm`)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             l2: bool) -> tuple[torch.Tensor, ...]:
    """Shared set-up of both forms: q, k repeated to the value heads, everything fp32 `(B, nv, T, ...)` (fp64
    inputs keep fp64), q and k l2-normalised (`l2`), q scaled by 1/sqrt(dk)."""
    nk, nv = k.shape[2], v.shape[2]
    if nk != nv:
        q, k = q.repeat_interleave(nv // nk, dim=2), k.repeat_interleave(nv // nk, dim=2)
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, beta, g = [x.transpose(1, 2).to(wide, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g)]
    if l2:
        q, k = l2norm(q), l2norm(k)
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           initial_state: torch.Tensor | None = None, *, chunk: int = CHUNK,
                           l2: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule in chunks (the WY / UT form, transformers' `torch_chunk_gated_delta_rule`):
    `q`, `k (B, T, nk, dk)`, `v (B, T, nv, dv)`, `g`, `beta (B, T, nv)`, `initial_state (B, nv, dk, dv)`
    or None (zeros) -> the output `(B, T, nv, dv)` in q's dtype and the final state fp32. Inputs of a
    wider float (fp64) keep their precision."""
    dtype = q.dtype
    B, T = q.shape[:2]
    nv, dv = v.shape[2:]
    q, k, v, g, beta = _prepare(q, k, v, g, beta, l2)
    dk = k.shape[-1]
    pad = (chunk - T % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    n = (T + pad) // chunk
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(B, nv, n, chunk, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(B, nv, n, chunk)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    cum = g.cumsum(dim=3)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    decayed_k_beta = k_beta * cum.exp()[..., None]
    new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(ut, decayed_k_beta, upper=False, unitriangular=True)
    state = (torch.zeros(B, nv, dk, dv, dtype=new_v.dtype, device=new_v.device) if initial_state is None
             else initial_state.to(new_v))
    out = torch.zeros_like(new_v)
    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]
    for i in range(n):
        v_new = new_v[:, :, i] - k_cum[:, :, i] @ state
        out[:, :, i] = q[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(B, nv, -1, dv)[:, :, :T]
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), state


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                               l2: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token (transformers' `torch_recurrent_gated_delta_rule`): per token
    S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q. Shapes as `chunk_gated_delta_rule`."""
    dtype = q.dtype
    B, T = q.shape[:2]
    nv, dv = v.shape[2:]
    q, k, v, g, beta = _prepare(q, k, v, g, beta, l2)
    state = (torch.zeros(B, nv, k.shape[-1], dv, dtype=v.dtype, device=v.device) if initial_state is None
             else initial_state.to(v))
    out = torch.zeros_like(v)
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]
        state = state * g[:, :, t].exp()[..., None, None]
        kv_mem = (state * k_t[..., None]).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, t, None]
        state = state + k_t[..., None] * delta[..., None, :]
        out[:, :, t] = (state * q_t[..., None]).sum(dim=-2)
    return out.transpose(1, 2).contiguous().to(dtype), state


class GatedRMSNorm(nn.Module):
    """Qwen3-Next's `RMSNormGated`: RMSNorm of `x (..., dv)` in fp32, cast back, times `weight` (no
    offset), times silu(z) in fp32, cast to x's dtype."""

    def __init__(self, size: int, eps: float, **kw: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, **kw))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The gated norm of `x` by `z` (both `(..., dv)`)."""
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet token mixer. Parameters (names used by `weights.py`): qkvz_weight (C, 2 nk dk +
    2 nv dv) as [q | k | v | z]; ba_weight (C, 2 nv) as [b | a] (shapes for `weight_layout="in_out"`,
    transposed for "out_in"); conv_weight (W, 1, K); dt_bias, A_log (nv); norm.weight (dv);
    out_weight (nv dv, C)."""

    def __init__(self, spec: ModelSpec, index: int, ops: TorchOps, **kw: Any) -> None:
        super().__init__()
        from llmperf.engine.parts import _ACTIVATIONS, _linear_params

        self.index, self.ops = index, ops
        self.nk, self.nv = spec.linear_num_key_heads, spec.linear_num_value_heads
        self.dk, self.dv = spec.linear_key_head_dim, spec.linear_value_head_dim
        self.key_dim, self.value_dim, self.conv_dim = spec.linear_key_dim, spec.linear_value_dim, spec.linear_conv_dim
        self.K = spec.linear_conv_kernel
        self.act = _ACTIVATIONS[spec.hidden_act]
        C, in_out = spec.hidden_size, ops.in_out
        _linear_params(self, "qkvz", C, self.conv_dim + self.value_dim, False, in_out, **kw)
        _linear_params(self, "ba", C, 2 * self.nv, False, in_out, **kw)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, 1, self.K, **kw))
        self.dt_bias = nn.Parameter(torch.empty(self.nv, **kw))
        self.A_log = nn.Parameter(torch.empty(self.nv, **kw))
        self.norm = GatedRMSNorm(self.dv, spec.norm_eps, **kw)
        _linear_params(self, "out", self.value_dim, C, False, in_out, **kw)

    def forward(self, h: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]], ctx: Any) -> torch.Tensor:
        """`h (1, N, C)` (the normed input of the step's tokens, group after group; `spans`: each
        group's (meta, B, T, first row)) -> the layer's output `(1, N, C)`. Each group reads and writes
        its sequences' states through `meta.states` / `meta.state_rows` (none: a forward from
        position 0 without a cache)."""
        rec, i = ctx.rec, self.index
        with rec.op(_QKVZ, i):
            qkvz = self.ops.linear(h, self.qkvz_weight)[0]  # (N, W + nv dv)
        with rec.op(_BA, i):
            ba = self.ops.linear(h, self.ba_weight)[0]  # (N, 2 nv)
        outs = [self._group(qkvz[lo:lo + B * T].view(B, T, -1), ba[lo:lo + B * T].view(B, T, -1), meta, rec)
                for meta, B, T, lo in spans]
        o = (outs[0] if len(outs) == 1 else torch.cat(outs))[None]  # (1, N, nv dv)
        with rec.op(_OUT, i):
            return self.ops.linear(o, self.out_weight)

    def _group(self, qkvz: torch.Tensor, ba: torch.Tensor, meta: StepMeta, rec: Any) -> torch.Tensor:
        """One group of B sequences of T tokens: `(B * T, nv dv)`, the gated norm's output."""
        i = self.index
        B, T, _ = qkvz.shape
        states = meta.states
        rows = meta.state_rows
        fresh = [s == 0 for s in meta.starts]
        with rec.op(_CONV, i):
            mixed = self.act(causal_conv(qkvz[..., :self.conv_dim], self.conv_weight, None, meta, i, fresh))
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = q.reshape(B, T, self.nk, self.dk), k.reshape(B, T, self.nk, self.dk)
        v = v.reshape(B, T, self.nv, self.dv)
        b, a = ba.split(self.nv, dim=-1)
        with rec.op(_RULE, i):
            beta = b.sigmoid()
            g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
            init = None
            if states is not None and not all(fresh):
                init = states.recurrent[states.layer(i)].index_select(0, rows)  # (B, nv, dk, dv) fp32
                if any(fresh):
                    init[torch.tensor(fresh, device=init.device)] = 0
            rule = recurrent_gated_delta_rule if T == 1 else chunk_gated_delta_rule
            core, state = rule(q, k, v, g, beta, init)  # (B, T, nv, dv), (B, nv, dk, dv)
            if states is not None:
                states.recurrent[states.layer(i)].index_copy_(0, rows, state.to(states.recurrent.dtype))
        z = qkvz[..., self.conv_dim:].reshape(B, T, self.nv, self.dv)
        with rec.op(_GNORM, i):
            return self.norm.forward(core, z).reshape(B * T, self.value_dim)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, meta: StepMeta, layer: int,
                fresh: Sequence[bool]) -> torch.Tensor:
    """A linear layer's causal depthwise convolution of `x (B, T, W)` by `weight (W, 1, K)` [+ `bias`], before
    its activation: `(B, T, W)`. Each sequence continues from its last K - 1 inputs (the cache's conv state,
    zeros for a sequence whose step starts at position 0; `fresh`), which are then replaced by its latest."""
    states, rows = meta.states, meta.state_rows
    B, _, W = x.shape
    K1 = weight.shape[-1] - 1
    x = x.transpose(1, 2)  # (B, W, T)
    if states is None or all(fresh):
        prev = x.new_zeros(B, W, K1)
    else:
        prev = states.conv[states.layer(layer)].index_select(0, rows).to(x.dtype)  # (B, W, K - 1)
        if any(fresh):
            prev[torch.tensor(fresh, device=x.device)] = 0
    xs = torch.cat((prev, x), dim=-1)  # (B, W, K - 1 + T)
    if states is not None:
        states.conv[states.layer(layer)].index_copy_(0, rows, xs[:, :, -K1:].to(states.conv.dtype))
    return F.conv1d(xs, weight, bias, groups=W).transpose(1, 2)  # (B, T, W)


def check_linear(spec: ModelSpec) -> None:
    """A ValueError naming what the engine's linear layers do not build: Gated DeltaNet layers outside a
    Llama-family SwiGLU model, Mamba-2 layers outside a Llama-family one."""
    if spec.family != "llama" or (spec.ffn_kind != "swiglu" and not spec.is_mamba):
        raise ValueError(f"layer_types: linear ({spec.linear_mixer_name}) layers are built in Llama-family models "
                         "(Gated DeltaNet: SwiGLU ones), "
                         f"got family={spec.family!r}, ffn_kind={spec.ffn_kind!r} ({spec.name})")


def refuse_linear(spec: ModelSpec, feature: str, why: str) -> None:
    """A ValueError naming `feature` when `spec` has linear (Gated DeltaNet or Mamba-2) layers."""
    if spec.has_linear_layers:
        raise ValueError(f"{feature}: {spec.name} has linear ({spec.linear_mixer_name}) layers, whose per-sequence "
                         f"state {why}")


__all__ = ["CHUNK", "GatedDeltaNet", "GatedRMSNorm", "causal_conv", "check_linear", "chunk_gated_delta_rule",
           "l2norm", "recurrent_gated_delta_rule", "refuse_linear"]
