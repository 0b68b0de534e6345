"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv:2405.04434 §2.1; DeepSeek-V3, arXiv:2412.19437;
Kimi-K2, a DeepSeek-V3 by config), as transformers computes it (`models/deepseek_v3/modeling_deepseek_v3.py`,
`models/deepseek_v2/modeling_deepseek_v2.py`: `DeepseekV3Attention`, `DeepseekV2Attention`).

Letters: N tokens of the step, B sequences and T new tokens of one group, S keys attended, C hidden
size, H heads, Dn = qk_nope_head_dim, Dr = qk_rope_head_dim, Dq = Dn + Dr, Dv = v_head_dim, R =
kv_lora_rank, Rq = q_lora_rank.

Per token the query is q_b(norm(q_a(x))) (DeepSeek-V2-Lite: q_proj(x)), H heads of [nope Dn | rope
Dr]; kv_a(x) = [latent c (R) | k_rope (Dr)], the latent normed. The cache holds [c | k_rope]
(`llmperf.engine.cache`). Two exact forms of the same attention (`MLA_MODES`):

- unabsorbed (prefill and extend steps): kv_b up-projects every attended latent into per-head K
  (Dq) and V (Dv), then ordinary multi-head attention and o_proj;
- absorbed (decode steps): kv_b's key half folds into the query (`q_absorb`), which meets the cached
  [c | k_rope] as MQA with one KV head; the result goes through kv_b's value half (`v_absorb`).

`MLAttention` is one layer; `set_mla_mode(model, mode)` forces one form for every step; `check_mla`
refuses what the engine does not build. Backends: `sdpa` and `naive` run both forms, `triton` runs
them through `kernels.flash_attention` and absorbed decode through `kernels.mla_decode`.

Parameters (`(in, out)` as `weight_layout="in_out"` stores them, transposed for "out_in"): q_a_weight
(C, Rq) [+ q_a_bias], q_a_norm (Rq), q_b_weight (Rq, H Dq), or q_weight (C, H Dq); kv_a_weight (C, R
+ Dr) [+ kv_a_bias]; kv_a_norm (R); kv_b_weight (R, H (Dn + Dv)); o_weight (H Dv, C) [+ o_bias].
The forms, V at the q/k width for fused kernels, scales, backends: docs/engine.md, "Multi-head latent attention".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmperf.engine import attention as backends
from llmperf.engine.step import LayerAttn, StepMeta
from llmperf.specs import ModelSpec

MLA_MODES = ("auto", "absorbed", "unabsorbed")

#: transformers' DeepseekV2/V3 RMSNorm default, which q_a_layernorm and kv_a_layernorm keep (they are
#: built without the config's rms_norm_eps)
LATENT_NORM_EPS = 1e-6

#: ModelSpec fields that change attention and that transformers' DeepSeek attention does not have,
#: with the value that means "absent" (the spec itself refuses q/k norms, sinks and positions other
#: than RoPE with MLA)
_NOT_WITH_MLA = (("attn_softcap", None), ("sliding_window", None),
                 ("layer_types", None), ("attention_chunk_size", None), ("nope_layers", ()),
                 ("query_pre_attn_scalar", None), ("nope_temperature", None), ("query_log_scale", None),
                 ("attn_scale", True),
                 ("attn_scale_inverse_layer_idx", False), ("sandwich_norms", False), ("rope_local_theta", None))


def check_mla(spec: ModelSpec) -> None:
    """A ValueError naming the field of an MLA spec the engine does not build, before anything is
    allocated: attention features transformers' DeepSeek attention does not combine with latent
    attention, a rotary width other than the Dr rotary features, and an `mscale_all_dim`
    softmax factor under a rope type other than yarn (transformers applies it for any type, the
    engine's `yarn_softmax_mscale` for yarn)."""
    for field, absent in _NOT_WITH_MLA:
        value = getattr(spec, field)
        if value != absent:
            raise ValueError(f"{field}: the engine's multi-head latent attention does not build this (got "
                             f"{value!r} for {spec.name}); estimate, simulate and plan model it")
    if spec.rotary_dim != spec.qk_rope_head_dim:
        raise ValueError(f"rotary_dim: multi-head latent attention rotates exactly qk_rope_head_dim="
                         f"{spec.qk_rope_head_dim} features, got {spec.rotary_dim} for {spec.name}")
    scaling = dict(spec.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if scaling.get("mscale_all_dim") and kind not in ("yarn", "default"):
        raise ValueError(f"rope_scaling: mscale_all_dim={scaling['mscale_all_dim']!r} with rope_type {kind!r} "
                         f"(the engine applies DeepSeek's softmax mscale with yarn only) for {spec.name}")


def set_mla_mode(model: nn.Module, mode: str) -> None:
    """Run every MLA layer of `model` in one form: "absorbed", "unabsorbed", or "auto" (the default:
    unabsorbed when a group feeds several tokens per sequence, absorbed for one)."""
    if mode not in MLA_MODES:
        raise ValueError(f"mla_mode: must be one of {', '.join(MLA_MODES)}, got {mode!r}")
    found = False
    for module in model.modules():
        if isinstance(module, MLAttention):
            module.mode, found = mode, True
    if not found:
        raise ValueError("mla_mode: the model has no multi-head latent attention layers")


def _backend(attend: Any) -> str:
    """The name of the attention backend `attend` (MLA runs its own forms of each)."""
    names = {backends.sdpa_attention: "sdpa", backends.naive_attention: "naive",
             backends.triton_attention: "triton"}
    if attend not in names:
        raise ValueError(f"attention: multi-head latent attention runs on the {', '.join(backends.BACKENDS)} "
                         f"backends, got {attend!r}")
    return names[attend]


class MLAttention(nn.Module):
    """One layer's multi-head latent attention: `forward(h (1, N, C), spans, ctx) -> (1, N, C)` (the
    normed input; `Block` adds the residual)."""

    def __init__(self, spec: ModelSpec, index: int, ops: Any, **kw: Any) -> None:
        super().__init__()
        from llmperf.engine.parts import Norm, _linear_params

        self.index, self.ops, self.mode = index, ops, "auto"
        in_out = self.in_out = ops.in_out
        C, H = spec.hidden_size, spec.num_heads
        self.H, self.R, self.Dr = H, spec.kv_lora_rank, spec.qk_rope_head_dim
        self.Dn, self.Dv = spec.qk_nope_head_dim, spec.v_head_dim
        self.Dq = self.Dn + self.Dr
        self.interleaved = spec.rope_interleaved
        norm = dict(eps=LATENT_NORM_EPS, ops=ops, **kw)
        self.q_lora = spec.q_lora_rank is not None
        if self.q_lora:
            _linear_params(self, "q_a", C, spec.q_lora_rank, spec.qkv_bias, in_out, **kw)
            self.q_a_norm = Norm("rmsnorm", spec.q_lora_rank, **norm)
            _linear_params(self, "q_b", spec.q_lora_rank, H * self.Dq, False, in_out, **kw)
        else:  # DeepSeek-V2-Lite: one projection, never a bias (transformers builds q_proj with bias=False)
            _linear_params(self, "q", C, H * self.Dq, False, in_out, **kw)
        _linear_params(self, "kv_a", C, self.R + self.Dr, spec.qkv_bias, in_out, **kw)
        self.kv_a_norm = Norm("rmsnorm", self.R, **norm)
        _linear_params(self, "kv_b", self.R, H * (self.Dn + self.Dv), False, in_out, **kw)
        _linear_params(self, "o", H * self.Dv, C, spec.out_bias, in_out, **kw)

    # ---- projections ----------------------------------------------------------------------------
    def _query(self, h: torch.Tensor, rec: Any) -> torch.Tensor:
        """Every head's query `(N, H, Dq)` as [nope | rope], before the rotation."""
        i, linear = self.index, self.ops.linear
        if self.q_lora:
            with rec.op("q_a_proj", i):
                q = linear(h, self.q_a_weight, self.q_a_bias)  # (1, N, Rq)
            with rec.op("q_a_norm", i):
                q = self.q_a_norm.forward(q)
            with rec.op("q_b_proj", i):
                q = linear(q, self.q_b_weight)  # (1, N, H*Dq)
        else:
            with rec.op("q_proj", i):
                q = linear(h, self.q_weight)
        return q.view(-1, self.H, self.Dq)  # (N, H, Dq)

    def _latent(self, h: torch.Tensor, q: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's cache rows `(N, R + Dr)`, [normed latent | rotated shared key], and the rotated
        rotary parts of the query heads `(N, H, Dr)`."""
        rec, i, H, R = ctx.rec, self.index, self.H, self.R
        with rec.op("kv_a_proj", i):
            ckv = self.ops.linear(h, self.kv_a_weight, self.kv_a_bias)[0]  # (N, R + Dr)
        with rec.op("kv_a_norm", i):
            c = self.kv_a_norm.forward(ckv[:, :R])  # (N, R)
        # the query heads' rotary parts and the shared key, adjacent: one rotation for all
        rot = torch.cat((q[:, :, self.Dn:], ckv[:, None, R:]), dim=1)  # (N, H + 1, Dr)
        with rec.op("rope", i):
            rot = self.ops.rope(rot, H + 1, ctx.cos, ctx.sin, self.interleaved)  # (N, H + 1, Dr)
        return torch.cat((c, rot[:, H]), dim=-1), rot[:, :H]  # (N, R + Dr), (N, H, Dr)

    def _kv_b_heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b's per-head halves as views: W_UK `(H, Dn, R)` and W_UV `(H, Dv, R)`."""
        w = self.kv_b_weight
        w = w.view(self.R, self.H, self.Dn + self.Dv).permute(1, 2, 0) if self.in_out else \
            w.view(self.H, self.Dn + self.Dv, self.R)  # (H, Dn + Dv, R)
        return w[:, :self.Dn], w[:, self.Dn:]

    # ---- the layer ------------------------------------------------------------------------------
    def forward(self, h: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]], ctx: Any) -> torch.Tensor:
        """`h` (1, N, C): the step's normed tokens, one group after another; `spans` gives each group's
        (meta, B, T, first row). Projections and the rotation run once over all N tokens; the cache
        write and attention per group, each in its form (`mode`)."""
        rec, i = ctx.rec, self.index
        q = self._query(h, rec)  # (N, H, Dq)
        latent, q_rope = self._latent(h, q, ctx)  # (N, R + Dr), (N, H, Dr)
        outs = []
        for meta, B, T, lo in spans:
            rows = slice(lo, lo + B * T)
            lat = latent[rows].view(B, T, 1, self.R + self.Dr)
            if meta.store is not None:
                with rec.op("kv_write", i):
                    meta.store.write(i, lat, None, meta)
            absorbed = self.mode == "absorbed" or (self.mode == "auto" and T == 1)
            form = self._absorbed if absorbed else self._unabsorbed
            outs.append(form(q[rows, :, :self.Dn], q_rope[rows], lat, meta, B, T, ctx))  # (B*T, H*Dv)
        o = (outs[0] if len(outs) == 1 else torch.cat(outs))[None]  # (1, N, H*Dv)
        with rec.op("o_proj", i):
            return self.ops.linear(o, self.o_weight, self.o_bias)

    def _keys(self, lat: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        """The cache rows this group attends to, `(B, 1, S, R + Dr)`: its own (a fresh group) or the
        cache's (after this step's write)."""
        if meta.fresh:
            return lat.transpose(1, 2)
        if meta.store is None:
            raise ValueError("meta: a step that continues cached sequences needs a cache")
        return meta.store.gather(self.index, meta)[0]

    def _unabsorbed(self, q_nope: torch.Tensor, q_rope: torch.Tensor, lat: torch.Tensor, meta: StepMeta, B: int,
                    T: int, ctx: Any) -> torch.Tensor:
        """Per-head K and V from every attended key's latent, then multi-head attention: `(B*T, H*Dv)`."""
        rec, i, H, R, Dn = ctx.rec, self.index, self.H, self.R, self.Dn
        keys = self._keys(lat, meta)[:, 0]  # (B, S, R + Dr)
        S = keys.shape[1]
        Dv = self.Dv
        with rec.op("kv_b_proj", i):
            kv = self.ops.linear(keys[..., :R], self.kv_b_weight).view(B, S, H, Dn + Dv)
        # each key and head one row [v | k_nope | k_rope] (Dv + Dq): K and V are views of it, and a fused
        # kernel of one q/k/v width reads V at the q/k width from the same row (`_value_at_width`)
        vk = kv.new_empty(B, S, H, Dv + self.Dq)
        vk[..., :Dv] = kv[..., Dn:]
        vk[..., Dv:Dv + Dn] = kv[..., :Dn]
        vk[..., Dv + Dn:] = keys[:, :, None, R:]
        q = torch.cat((q_nope, q_rope), dim=-1).view(B, T, H, self.Dq)
        o = self._attend(q, vk[..., Dv:].transpose(1, 2), vk[..., :Dv].transpose(1, 2), meta, ctx)  # (B, T, H*Dv)
        return o.reshape(B * T, H * Dv)

    def _absorbed(self, q_nope: torch.Tensor, q_rope: torch.Tensor, lat: torch.Tensor, meta: StepMeta, B: int,
                  T: int, ctx: Any) -> torch.Tensor:
        """q_nope through W_UK, MQA over the latent, the result through W_UV: `(B*T, H*Dv)`."""
        rec, i, H, R = ctx.rec, self.index, self.H, self.R
        w_uk, w_uv = self._kv_b_heads()
        with rec.op("q_absorb", i):
            q_lat = torch.matmul(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # (B*T, H, R)
        q = torch.cat((q_lat, q_rope), dim=-1).view(B, T, H, R + self.Dr)
        o = self._attend_latent(q, lat, meta, ctx).view(B * T, H, R)
        with rec.op("v_absorb", i):
            o = torch.matmul(o.transpose(0, 1), w_uv.transpose(1, 2))  # (H, B*T, Dv)
        return o.transpose(0, 1).reshape(B * T, H * self.Dv)

    # ---- attention cores ------------------------------------------------------------------------
    def _attend(self, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, meta: StepMeta, ctx: Any) -> torch.Tensor:
        """`q (B, T, H, Dq)` over `K (B, H_kv, S, Dq)`, `V (B, H_kv, S, Dv)` on the context's backend ->
        `(B, T, H * Dv)`."""
        rec, i = ctx.rec, self.index
        p = meta.attn(i, self.Dq)
        backend = _backend(ctx.attend)
        if backend == "naive":
            return backends.naive_core(i, q, K, V, meta, p, rec)
        B, T, H, D = q.shape
        Dv = V.shape[-1]
        with rec.op("attention", i):
            # torch's CPU SDPA runs its flash kernel for one q/k/v width only (else the math path, which
            # materialises the scores); its decode (T = 1), CUDA's kernels and a V wider than q/k (no
            # such model yet) take V as it is
            if backend == "sdpa" and (Dv >= D or T == 1 or not q.is_cpu):
                return backends.sdpa_core(q, K, V, meta, p)
            if backend == "sdpa":
                o = backends.sdpa_core(q, K, _value_at_width(K, V), meta, p)  # (B, T, H*D)
            else:
                o = backends.flash_core(backends._kernels(), q, K, _value_at_width(K, V), meta, sm_scale=p.scale)
            return o.view(B, T, H, D)[..., :Dv].reshape(B, T, H * Dv)

    def _attend_latent(self, q: torch.Tensor, lat: torch.Tensor, meta: StepMeta, ctx: Any) -> torch.Tensor:
        """Absorbed attention, `q (B, T, H, R + Dr)` = [q_lat | q_rope] over the cached latent (K = the
        latent, V = its first R features) -> `(B, T, H * R)`."""
        rec, i, R = ctx.rec, self.index, self.R
        B, T, H, _ = q.shape
        if _backend(ctx.attend) == "triton" and T == 1 and meta.store is not None:
            with rec.op("attention", i):
                return _mla_decode(q, meta, meta.attn(i, self.Dq), i, R).view(B, 1, H * R)
        K = self._keys(lat, meta)  # (B, 1, S, R + Dr)
        return self._attend(q, K, K[..., :R], meta, ctx)


def _value_at_width(K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """V `(B, H_kv, S, Dv)` as a tensor of K's width D `(B, H_kv, S, D)` whose first Dv features are V's,
    for a fused kernel of one q/k/v width: output feature j sums the probabilities times value feature
    j alone, so outputs 0..Dv-1 are exact whatever features Dv..D-1 hold, and the caller drops those
    outputs. No copy where V's rows continue in memory: V the first Dv features of K (the absorbed
    form: K itself), or V followed by K in one row (the unabsorbed form's [v | k], `_unabsorbed`: the
    D-wide view from V's start, its extra features K's first D - Dv, finite). Else V zero-padded."""
    D, Dv = K.shape[-1], V.shape[-1]
    if Dv > D:
        raise ValueError(f"v_head_dim: a fused kernel of one width takes V at most as wide as q/k ({D}), got {Dv}")
    if Dv == D:
        return V
    if V.stride() == K.stride() and V.stride(-1) == 1:
        if V.data_ptr() == K.data_ptr():
            return K
        if V.data_ptr() + Dv * V.element_size() == K.data_ptr():
            return V.as_strided(K.shape, K.stride(), V.storage_offset())
    return F.pad(V, (0, D - Dv))


def _mla_decode(q: torch.Tensor, meta: StepMeta, p: LayerAttn, layer: int, R: int) -> torch.Tensor:
    """Absorbed decode over the cache's latent blocks through `kernels.mla_decode`, `q (B, 1, H, R + Dr)`
    -> `(B, H, R)`: a paged cache's pool `(N, P, R + Dr)` read in place through the block tables, or a
    contiguous cache's rows as blocks of S_max tokens (`StepMeta.block_table`). The split count comes
    from the lengths the host knows (no device read of seq_lens in every layer)."""
    kernels = backends._kernels()
    from kernels.mla import heads_per_program

    B, _, H, W = q.shape
    blocks = meta.store.blocks(layer)[0][:, :, 0]  # (N, P, R + Dr)
    key = ("mla_splits", H, W)
    if key not in meta._memo:
        meta._memo[key] = kernels.num_mla_splits(B, H, meta.max_seq_len, backends._num_sms(q.device),
                                                 heads_per_program=heads_per_program(H), latent_dim=R,
                                                 rope_dim=W - R, cache_bytes=blocks.element_size())
    q = q[:, 0]  # (B, H, R + Dr)
    return kernels.mla_decode(q[..., :R], q[..., R:], blocks, meta.block_table(), meta.seq_lens_tensor(),
                              meta._memo[key], sm_scale=p.scale, validate=False)


__all__ = ["LATENT_NORM_EPS", "MLA_MODES", "MLAttention", "check_mla", "set_mla_mode"]
