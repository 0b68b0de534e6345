"""Mamba-2 token mixers (Dao and Gu 2024, "Transformers are SSMs", arXiv:2405.21060), the `linear` layers of
Nemotron-H, in plain torch as `transformers` computes them (`models/nemotron_h/modeling_nemotron_h.py`:
`NemotronHMamba2Mixer` and the torch fallbacks `mamba2_chunk_scan`, `mamba2_selective_state_update`).

Letters: B sequences, T new tokens each, C hidden size, H heads of P channels, G groups (B and C shared by
H / G heads each), N state size, K the convolution's width, W = H P + 2 G N the convolved channels
([x | B | C]); in the spec's linear-layer terms G, N, H, P are the key heads, key head dim, value heads and
value head dim.

A layer: one GEMM to [z | x B C | dt] (`in_proj`, with a bias if `linear_proj_bias`); a causal depthwise
convolution with its bias (`linear_conv_bias`) and SiLU over [x | B | C] whose state is the sequence's last
K - 1 inputs (`conv1d`); dt = softplus(dt + dt_bias), A = -exp(A_log); the selective scan over the state S
(H, N, P), fp32: S <- exp(dt A) S + dt B x^T, y = C^T S + D x; chunks of `linear_chunk_size` tokens in
prefill (the SSD form), token by token in decode, the same numbers (`ssd`); y times silu(z), RMS-normed over
G groups of H P / G channels, times the weight (`gated_norm`); `out_proj` (`o_proj`).

As transformers' generate(): a prompt's dt is clamped below at `linear_dt_min` (its chunked scan's limit is
`(time_step_min, inf)`, whatever the config's `time_step_limit` says), a generated token's is not (its one-token
step, `mamba2_selective_state_update`, takes no limit; mamba_ssm's and vLLM's kernels: not checked). Whether a
step feeds a prompt is the runner's `StepMeta.prompt_lens`; without it, as transformers' forward: a step of
several tokens or a sequence's first is clamped.

The states live in the cache (`llmperf.engine.cache.LinearStates`, as Gated DeltaNet's: conv (W, K - 1),
recurrent (H, N, P)); a sequence whose step starts at position 0 reads a zero state whatever its slot holds.
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

_IN, _CONV, _SSD, _GNORM, _OUT = (Op.in_proj.value, Op.conv1d.value, Op.ssd.value, Op.gated_norm.value,
                                  Op.o_proj.value)


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """`(..., l) -> (..., l, l)`: entry [i, j] = x[j+1] + ... + x[i] for j <= i, -inf above the diagonal
    (transformers' `segment_sum`: masked cumulative sums, not differences of one cumulative sum)."""
    L = x.shape[-1]
    x = x[..., None].expand(*x.shape, L)
    below = torch.tril(torch.ones(L, L, dtype=torch.bool, device=x.device), diagonal=-1)
    out = torch.cumsum(x.masked_fill(~below, 0), dim=-2)
    return out.masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool, device=x.device)), float("-inf"))


def _widen(x: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x `(B, T, H, P)` and B, C `(B, T, G, N)` repeated to the H heads, fp32 (fp64 inputs keep fp64)."""
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    H, G = x.shape[2], Bm.shape[2]
    return x.to(wide), Bm.to(wide).repeat_interleave(H // G, dim=2), Cm.to(wide).repeat_interleave(H // G, dim=2)


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor,
               D: torch.Tensor, chunk: int, initial_state: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD in chunks (transformers' `mamba2_chunk_scan`): `x (B, T, H, P)`, `dt (B, T, H)` (after the
    softplus), `A`, `D (H)`, `Bm`, `Cm (B, T, G, N)`, `initial_state (B, H, N, P)` or None (zeros) -> y
    `(B, T, H, P)` and the final state `(B, H, N, P)`, both fp32 (fp64 for fp64 inputs)."""
    Bsz, T, H, P = x.shape
    x, Bm, Cm = _widen(x, Bm, Cm)
    dt = dt.to(x.dtype)
    pad = (chunk - T % chunk) % chunk
    skip = D.to(x.dtype)[:, None] * F.pad(x, (0, 0, 0, 0, 0, pad))  # (B, T + pad, H, P)
    xdt, Adt = x * dt[..., None], A.to(x.dtype) * dt  # (B, T, H, P), (B, T, H)
    n = (T + pad) // chunk
    xdt, Bm, Cm = (F.pad(t, (0, 0, 0, 0, 0, pad)).reshape(Bsz, n, chunk, H, -1) for t in (xdt, Bm, Cm))
    Adt = F.pad(Adt, (0, 0, 0, pad)).reshape(Bsz, n, chunk, H).permute(0, 3, 1, 2)  # (B, H, n, l)
    cum = torch.cumsum(Adt, dim=-1)
    decay = torch.exp(_segsum(Adt))  # (B, H, n, l, s)
    scores = torch.einsum("bclhn,bcshn->bclsh", Cm, Bm) * decay.permute(0, 2, 3, 4, 1)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", scores, xdt)  # within each chunk
    to_end = torch.exp(cum[..., -1:] - cum).permute(0, 2, 3, 1)[..., None]  # (B, n, l, H, 1)
    states = torch.einsum("bclhn,bclhp->bchnp", Bm * to_end, xdt)  # each chunk's own contribution
    first = (torch.zeros_like(states[:, :1]) if initial_state is None
             else initial_state[:, None].to(states.dtype))
    states = torch.cat((first, states), dim=1)  # (B, n + 1, H, N, P)
    across = torch.exp(_segsum(F.pad(cum[..., -1], (1, 0)))).transpose(1, 3)  # (B, n + 1 from, n + 1 to, H)
    states = torch.einsum("bzch,bzhnp->bchnp", across, states)  # the state entering each chunk, and the last
    states, final = states[:, :-1], states[:, -1]
    y_off = torch.einsum("bclhn,bchnp->bclhp", Cm, states) * torch.exp(cum).permute(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).reshape(Bsz, n * chunk, H, P) + skip
    return y[:, :T], final


def recurrent_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor,
                   D: torch.Tensor, initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD token by token (transformers' `mamba2_selective_state_update`, step after step): per token
    S <- exp(dt A) S + (dt B) x^T, y = C^T S + D x. Shapes and dtypes as `chunk_scan`."""
    Bsz, T, H, P = x.shape
    x, Bm, Cm = _widen(x, Bm, Cm)
    dt, A, D = dt.to(x.dtype), A.to(x.dtype), D.to(x.dtype)
    state = (x.new_zeros(Bsz, H, Bm.shape[-1], P) if initial_state is None else initial_state.to(x.dtype))
    out = torch.empty_like(x)
    for t in range(T):
        dt_t = dt[:, t, :, None]  # (B, H, 1)
        state = state * torch.exp(dt_t * A[:, None])[..., None] + (dt_t * Bm[:, t])[..., None] * x[:, t, :, None]
        out[:, t] = (Cm[:, t, :, :, None] * state).sum(dim=-2) + x[:, t] * D[:, None]
    return out, state


class GroupedGatedRMSNorm(nn.Module):
    """Nemotron-H's `NemotronHRMSNormGated` (norm_before_gate=False): `x (..., H P)` times silu(z) in fp32,
    RMS-normed over each of `groups` groups of channels, cast to the activation dtype, times `weight`."""

    def __init__(self, size: int, groups: int, eps: float, **kw: Any) -> None:
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(size, **kw))

    def forward(self, x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The gated norm of `x` by `z` (both `(..., H P)`), in `dtype`."""
        h = x.float() * F.silu(z.float())
        g = h.view(*h.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.view_as(h).to(dtype)


class Mamba2Mixer(nn.Module):
    """One Mamba-2 token mixer. Parameters (names used by `weights.py`): in_weight (C, 2 H P + 2 G N + H) as
    [z | x | B | C | dt] [+ in_bias]; conv_weight (W, 1, K) [+ conv_bias (W)]; dt_bias, A_log, D (H);
    norm.weight (H P); out_weight (H P, C) [+ out_bias] (shapes for `weight_layout="in_out"`)."""

    def __init__(self, spec: ModelSpec, index: int, ops: TorchOps, **kw: Any) -> None:
        super().__init__()
        from llmperf.engine.parts import _linear_params

        self.index, self.ops = index, ops
        self.G, self.N = spec.linear_num_key_heads, spec.linear_key_head_dim
        self.H, self.P = spec.linear_num_value_heads, spec.linear_value_head_dim
        self.inner, self.conv_dim, self.K = spec.linear_value_dim, spec.linear_conv_dim, spec.linear_conv_kernel
        self.chunk = spec.linear_chunk
        self.dt_min = spec.linear_dt_min
        C, in_out, bias = spec.hidden_size, ops.in_out, spec.linear_proj_bias
        _linear_params(self, "in", C, self.inner + self.conv_dim + self.H, bias, in_out, **kw)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, 1, self.K, **kw))
        self.conv_bias = nn.Parameter(torch.empty(self.conv_dim, **kw)) if spec.linear_conv_bias else None
        self.dt_bias = nn.Parameter(torch.empty(self.H, **kw))
        self.A_log = nn.Parameter(torch.empty(self.H, **kw))
        self.D = nn.Parameter(torch.empty(self.H, **kw))
        self.norm = GroupedGatedRMSNorm(self.inner, self.G, spec.norm_eps, **kw)
        _linear_params(self, "out", self.inner, C, bias, in_out, **kw)

    def forward(self, h: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]], ctx: Any) -> torch.Tensor:
        """`h (1, N, C)` (the normed input of the step's tokens, group after group; `spans`: each group's
        (meta, B, T, first row)) -> the layer's output `(1, N, C)`, each group reading and writing its
        sequences' states through `meta.states` / `meta.state_rows`."""
        rec, i = ctx.rec, self.index
        with rec.op(_IN, i):
            zxbcdt = self.ops.linear(h, self.in_weight, self.in_bias)[0]  # (N, 2 H P + 2 G N + H)
        outs = [self._group(zxbcdt[lo:lo + B * T].view(B, T, -1), meta, rec) for meta, B, T, lo in spans]
        y = (outs[0] if len(outs) == 1 else torch.cat(outs))[None]  # (1, N, H P)
        with rec.op(_OUT, i):
            return self.ops.linear(y, self.out_weight, self.out_bias)

    @staticmethod
    def _clamped(meta: StepMeta, T: int, fresh: Sequence[bool]) -> torch.Tensor:
        """`(B, T)` bool: the tokens whose dt is clamped: a prompt's (the runner's `meta.prompt_lens`), else, as
        transformers' forward, those of a step of several tokens or of a sequence's first step."""
        if meta.prompt_lens is not None:
            return meta.positions < torch.tensor(meta.prompt_lens, device=meta.positions.device)[:, None]
        return torch.tensor([T > 1 or f for f in fresh], device=meta.positions.device)[:, None].expand(-1, T)

    def _group(self, zxbcdt: torch.Tensor, meta: StepMeta, rec: Any) -> torch.Tensor:
        """One group of B sequences of T tokens: `(B * T, H P)`, the gated norm's output."""
        from llmperf.engine.deltanet import causal_conv

        i, H, P, G, N = self.index, self.H, self.P, self.G, self.N
        B, T, _ = zxbcdt.shape
        z, xbc, dt = zxbcdt.split([self.inner, self.conv_dim, H], dim=-1)  # (B, T, H P), (B, T, W), (B, T, H)
        fresh = [s == 0 for s in meta.starts]
        with rec.op(_CONV, i):
            xbc = F.silu(causal_conv(xbc, self.conv_weight, self.conv_bias, meta, i, fresh))  # (B, T, W)
        x, Bm, Cm = xbc.split([self.inner, G * N, G * N], dim=-1)
        x, Bm, Cm = x.reshape(B, T, H, P), Bm.reshape(B, T, G, N), Cm.reshape(B, T, G, N)
        states = meta.states
        with rec.op(_SSD, i):
            A = -torch.exp(self.A_log.float())
            dt = F.softplus(dt + self.dt_bias)  # (B, T, H)
            if self.dt_min:
                dt = torch.where(self._clamped(meta, T, fresh)[..., None], dt.clamp(min=self.dt_min), dt)
            init = None
            if states is not None and not all(fresh):
                init = states.recurrent[states.layer(i)].index_select(0, meta.state_rows)  # (B, H, N, P) fp32
                if any(fresh):
                    init[torch.tensor(fresh, device=init.device)] = 0
            if T == 1 and init is not None:  # a token after the sequence's first: the recurrent step
                y, state = recurrent_scan(x, dt, A, Bm, Cm, self.D, init)
            else:
                y, state = chunk_scan(x, dt, A, Bm, Cm, self.D, self.chunk, init)
            if states is not None:
                states.recurrent[states.layer(i)].index_copy_(0, meta.state_rows, state.to(states.recurrent.dtype))
        with rec.op(_GNORM, i):
            return self.norm.forward(y.reshape(B, T, H * P), z, zxbcdt.dtype).reshape(B * T, H * P)


__all__ = ["GroupedGatedRMSNorm", "Mamba2Mixer", "chunk_scan", "recurrent_scan"]
