"""A decoder-only transformer built from a `ModelSpec`: the Llama and GPT-2 families, in plain torch.

Letters: B batch, T new tokens per sequence, C hidden size, H / H_kv query / key-value heads,
D head dim, F FFN width, V vocabulary, E experts, K experts per token.

- Llama family (Llama 2/3, Mistral, Qwen2 with `qkv_bias`, Mixtral with `num_experts > 1`): RMSNorm
  (Zhang & Sennrich 2019), rotary position embeddings (Su et al. 2021, arXiv:2104.09864; the
  "rotate half" layout of Hugging Face checkpoints; `linear` and `llama3` frequency scaling), grouped-
  query attention (Ainslie et al. 2023), SwiGLU MLP (Shazeer 2020).
- GPT-2 family: LayerNorm, learned absolute positions, GELU MLP (`gelu_new`, tanh approximation),
  biases everywhere, tied input/output embeddings (Radford et al. 2019).

Numerics follow Hugging Face `transformers` (RMSNorm in fp32 then cast; RoPE tables in fp32, cast to
the activation dtype; router softmax in fp32), so fp32 greedy decoding reproduces `generate()`.

Matrix layout (`weight_layout`): "out_in" (`nn.Linear`'s `(out, in)`, `F.linear`) or "in_out"
(`x @ W + b`, GPT-2's Conv1D). On CPU, GEMMs with enough rows also run on a copy of each weight packed
for oneDNN (`torch.ops.mkldnn._reorder_linear_weight` + `_linear_pointwise`, what torch inductor runs
on CPU). Both choices, and the measurement behind them, are in one place: `resolve_layout` and
`packed_min_rows`.

Fused weights for speed: Q, K and V are one `(C, q_size + 2 kv_size)` matrix and SwiGLU's gate and
up one `(C, 2F)` matrix, so a decode step runs one GEMM where three (two) would do the same work, and
one RoPE call rotates the adjacent q and k heads. A `Recorder` times exactly these fused GEMMs, under
the shared vocabulary's fused names (`qkv_proj`, `gate_up_proj`; `llmperf.analysis.vocabulary.FUSED_PARTS`
joins them to the split predictions): recording never changes what runs.

A decode step (one token per sequence, with a cache) of a Llama-family model at fp32 / bf16 on a CPU
with llmperf's kernels runs all its layers in one call of them (`cpu_kernels.decode_layers`), the
same kernels in the same order as the layers' Python, so the same logits bit for bit, without ~140
framework calls between them (`Transformer._decode_in_one_call`; `decode_in_one_call = False` turns
it off). A recorder still gets every operator of every layer, timed inside the call.

The forward pass takes the step's metadata (`StepMeta`: positions, cache addressing) and returns the
logits of the last position of each sequence (as serving engines do), or of every position with
`all_logits=True`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter

from llmperf.analysis.vocabulary import Op
from llmperf.engine import cpu_kernels
from llmperf.engine.attention import BACKENDS, get_backend, sdpa_attention
from llmperf.engine.step import StepMeta, softmax_scale
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.specs import ModelSpec

# The fused projections are the model's structure (one GEMM each, as vLLM runs them), and the
# recorder times them under their fused names.
_QKV, _GATE_UP = Op.qkv_proj.value, Op.gate_up_proj.value

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}

ENGINE_FAMILIES = ("llama", "gpt2")


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`fp32` / `fp16` / `bf16` (or a torch dtype among those) as a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype}")
        return dtype
    key = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(str(dtype), str(dtype))
    if key not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[key]


# ---------------------------------------------------------------------------------------------------
# Rotary embeddings


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


# ---------------------------------------------------------------------------------------------------
# Building blocks (parameters only; the math is in `Block.forward`)


class Norm(nn.Module):
    """RMSNorm (`weight`) or LayerNorm (`weight`, `bias`)."""

    def __init__(self, kind: str, size: int, eps: float, **kw: Any) -> None:
        super().__init__()
        self.kind, self.eps, self.shape = kind, eps, (size,)
        self.weight = nn.Parameter(torch.ones(size, **kw))
        self.bias = nn.Parameter(torch.zeros(size, **kw)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)
        if cpu_kernels.use_ops_for(x):  # fp32 / bf16 on CPU: the same in one call
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        # As Hugging Face: normalise in fp32, cast back, then scale in the activation dtype.
        return self.weight * F.rms_norm(x.float(), self.shape, eps=self.eps).to(x.dtype)


WEIGHT_LAYOUTS = ("auto", "in_out", "out_in")

# How each GEMM reads its weights, chosen here and nowhere else. Measured 2026-11-23 on the 2-core
# Xeon (AVX-512, AVX512_BF16, AMX; torch 2.13 CPU): the four projections of 12 layers of a 1024-wide
# Llama (540 MB in fp32, far beyond the caches), rows (B*T) as in a decode step, GB/s of weights read,
# median of 5 (spread within 5%):
#
#                  F.linear (out, in)   x @ W (in, out)   oneDNN packed
#     fp32  1 row        24.4               25.3              21.6
#     fp32  8 rows       10.0               12.6              16.5
#     bf16  1 row        12.8                8.6              18.4
#     bf16  8 rows       13.1               10.5              17.1
#
# So on CPU, with torch's kernels alone: fp32 stores `(in, out)` (the plain matrix-vector path wins
# at one row) and runs GEMMs of 2+ rows on the packed copy; bf16 stores `(out, in)` and runs every
# GEMM on the packed copy (torch's own bf16 GEMV is the slow kernel). Where llmperf's own kernels are
# available (`cpu_kernels`; its docstring has the figures: 25-29 GB/s at one bf16 row against the
# packed copy's 21-22, 25 against 21 at 8 fp32 rows; on AMX 25-27 at 8 bf16 rows against 19-20), both
# dtypes store `(out, in)` and GEMMs of up to `cpu_kernels.rows_for` rows run there (fp32 8; bf16 4,
# or on AMX CPUs 16, rows 3-16 on AMX tiles from a copy packed for them), the rest packed for oneDNN.
# Prefill (32-256 rows) is as fast or faster packed. So a bf16 model on an AMX CPU holds its weights
# three times (as built, packed for AMX, packed for oneDNN), fp32 twice. cuBLAS is indifferent to the
# layout and nothing is packed on CUDA; fp16 was not measured and is not packed.


def resolve_layout(layout: str, dtype: torch.dtype, device: torch.device) -> bool:
    """True when matrices are stored `(in, out)` ("auto": the measurement above; on a CPU it compiles
    llmperf's kernels on first use to know whether they are available)."""
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout: must be one of {', '.join(WEIGHT_LAYOUTS)}, got {layout!r}")
    if layout == "auto":  # (in, out) for torch's fp32 GEMV on CPU; (out, in) for llmperf's own GEMM
        return device.type == "cpu" and dtype == torch.float32 and not cpu_kernels.available()
    return layout == "in_out"


def packed_min_rows(dtype: torch.dtype, device: torch.device) -> int | None:
    """The fewest rows (B*T) from which a GEMM runs on the oneDNN-packed copy of its weight (the
    measurement above); None: never packed (CUDA, fp16, a CPU or torch build without oneDNN bf16)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    if dtype == torch.float32:
        return 2
    if dtype == torch.bfloat16 and onednn_bf16():
        return 1
    return None


def onednn_bf16() -> bool:
    """Whether oneDNN has native bf16 GEMMs on this CPU (AVX512_BF16 or AMX, unless `ONEDNN_MAX_CPU_ISA`
    hides them when torch loads); without them a bf16 GEMM converts every element."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _packed_linear_flops(x_shape: torch.Size, *args: Any, out_shape: torch.Size, **kwargs: Any) -> int:
    """`FlopCounterMode` formula for the packed GEMM (either overload): 2 * rows * in * out, as it
    counts `mm` / `addmm` (the bias not counted)."""
    return 2 * math.prod(out_shape) * x_shape[-1]


_PACKED_LINEAR = torch.ops.mkldnn._linear_pointwise.default
if torch.ops.mkldnn._linear_pointwise not in flop_counter.flop_registry:  # profile's cross-check counts what runs
    flop_counter.register_flop_formula(torch.ops.mkldnn._linear_pointwise)(_packed_linear_flops)


class Linear:
    """`y = x W^T + b` for one model's weights (stored as `resolve_layout` says): on the plain path,
    or, from `min_rows` rows up, on oneDNN-packed copies made on first use and remade whenever the
    weight changes (its version counter or storage), so loading weights after building stays right
    (an inference tensor has no version counter: changing one in place needs `clear()`)."""

    __slots__ = ("in_out", "min_rows", "_packs", "generation")

    def __init__(self, in_out: bool, min_rows: int | None) -> None:
        self.in_out, self.min_rows = in_out, min_rows
        self._packs: dict[tuple[bool, int], tuple[torch.Tensor, int, int, torch.Tensor]] = {}
        self.generation = 0  # counts `clear()` calls (whoever keeps a packed copy's address checks it)

    def clear(self) -> None:
        """Forget every packed copy (they are remade on next use)."""
        self._packs.clear()
        self.generation += 1

    def plain(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return _matmul_in_out(x, w, b) if self.in_out else F.linear(x, w, b)

    def packed(self, w: torch.Tensor, amx: bool = False) -> torch.Tensor:
        """The packed copy of `w` (out, in) for oneDNN, or with `amx` for llmperf's AMX GEMM
        (`cpu_kernels.amx_pack`), made now if `w` is new or changed."""
        key = (amx, id(w))
        entry = self._packs.get(key)
        # a weight made under inference_mode has no version counter: its storage alone is checked
        version = -1 if w.is_inference() else w._version
        if entry is None or entry[0] is not w or entry[1] != version or entry[2] != w.data_ptr():
            if amx:
                packed = cpu_kernels.amx_pack(w)
            else:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.t() if self.in_out else w, None)
            entry = self._packs[key] = (w, version, w.data_ptr(), packed)
        return entry[3]

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        kernel = 0 if self.in_out else cpu_kernels.gemm_kernel(x, w)  # few rows: llmperf's own kernels
        if kernel == cpu_kernels.STREAM:
            return cpu_kernels.small_gemm(x, w, b)
        if kernel == cpu_kernels.AMX:
            return cpu_kernels.amx_gemm(x, self.packed(w, amx=True), w.shape[0], b)
        if self.min_rows is None or x.numel() < self.min_rows * x.shape[-1] or not x.is_cpu:  # moved to CUDA
            return self.plain(x, w, b)
        return _PACKED_LINEAR(x, self.packed(w), b, "none", [], "")


#: a layer's parameters `decode_layers` reads (`Block`'s names); the norms' weights are `Norm` modules'
_ONE_CALL_PARAMS = ("qkv_weight", "qkv_bias", "o_weight", "o_bias", "up_weight", "up_bias", "down_weight", "down_bias")


def _address(t: torch.Tensor | None) -> int:
    """The data address of an optional bias (0: none)."""
    return 0 if t is None else t.data_ptr()


def _mat(in_f: int, out_f: int, in_out: bool, **kw: Any) -> nn.Parameter:
    return nn.Parameter(torch.empty((in_f, out_f) if in_out else (out_f, in_f), **kw))


def _linear_params(module: nn.Module, name: str, in_f: int, out_f: int, bias: bool, in_out: bool, **kw: Any) -> None:
    module.register_parameter(f"{name}_weight", _mat(in_f, out_f, in_out, **kw))
    module.register_parameter(f"{name}_bias", nn.Parameter(torch.empty(out_f, **kw)) if bias else None)


def _matmul_in_out(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """`x (..., in) @ w (in, out) [+ b]`, the bias fused into the GEMM (addmm)."""
    if b is None:
        return torch.matmul(x, w)
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])


class Block(nn.Module):
    """One transformer layer. Parameters (names used by `weights.py`):

    attn_norm; qkv_weight (C, q_size + 2 kv_size) [+ qkv_bias]; o_weight (q_size, C) [+ o_bias];
    mlp_norm; dense MLP: up_weight (C, F), or (C, 2F) for SwiGLU as [gate | up], [+ up_bias],
    down_weight (F, C) [+ down_bias]; MoE: router_weight (C, E), experts_up_weight (E, C, 2F),
    experts_down_weight (E, F, C). Shapes are for `weight_layout="in_out"` (y = x @ W + b);
    "out_in" stores each matrix transposed (y = x @ W^T + b, `F.linear`).
    """

    def __init__(self, spec: ModelSpec, index: int, linear: Linear, **kw: Any) -> None:
        super().__init__()
        self.index = index
        in_out = self.in_out = linear.in_out
        self.linear = linear
        C, F_ = spec.hidden_size, spec.ffn_size
        self.H, self.H_kv, self.D = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.q_size, spec.kv_size
        self.swiglu = spec.ffn_kind == "swiglu"
        self.ffn_size = F_
        self.act = _ACTIVATIONS[spec.hidden_act]
        self.silu = self.act is F.silu
        self.rope = spec.pos_encoding == "rope"
        self.moe = spec.num_experts > 1
        self.top_k = spec.experts_per_token
        self.attn_norm = Norm(spec.norm_kind, C, spec.norm_eps, **kw)
        self.mlp_norm = Norm(spec.norm_kind, C, spec.norm_eps, **kw)
        _linear_params(self, "qkv", C, self.q_size + 2 * self.kv_size, spec.qkv_bias, in_out, **kw)
        _linear_params(self, "o", self.q_size, C, spec.out_bias, in_out, **kw)
        up_rows = 2 * F_ if self.swiglu else F_
        if self.moe:
            E = spec.num_experts
            self.router_weight = _mat(C, E, in_out, **kw)
            self.experts_up_weight = nn.Parameter(torch.empty((E, C, up_rows) if in_out else (E, up_rows, C), **kw))
            self.experts_down_weight = nn.Parameter(torch.empty((E, F_, C) if in_out else (E, C, F_), **kw))
        else:
            _linear_params(self, "up", C, up_rows, spec.mlp_bias, in_out, **kw)
            _linear_params(self, "down", F_, C, spec.mlp_bias, in_out, **kw)

    # ---- attention ------------------------------------------------------------------------------
    def _qkv(self, h: torch.Tensor, rec: Any) -> torch.Tensor:
        """[q | k | v] `(B, T, q_size + 2 kv_size)`: one fused GEMM, timed as `Op.qkv_proj` (what runs
        is what is measured; `FUSED_PARTS` joins it to the q/k/v predictions)."""
        with rec.op(_QKV, self.index):
            return self.linear(h, self.qkv_weight, self.qkv_bias)

    # ---- MLP ------------------------------------------------------------------------------------
    def _ffn(self, h: torch.Tensor, up_w: torch.Tensor, up_b: torch.Tensor | None, down_w: torch.Tensor,
             down_b: torch.Tensor | None, rec: Any, linear: Any) -> torch.Tensor:
        i = self.index
        if self.swiglu:
            with rec.op(_GATE_UP, i):  # one fused GEMM over [gate | up], timed as such
                gate_up = linear(h, up_w, up_b)
            with rec.op("act", i):
                if self.silu and cpu_kernels.use_ops_for(gate_up):  # the same in one call
                    a = cpu_kernels.silu_mul(gate_up)
                else:
                    gate, up = gate_up.chunk(2, dim=-1)
                    a = self.act(gate) * up
        else:
            with rec.op("up_proj", i):
                a = linear(h, up_w, up_b)
            with rec.op("act", i):
                a = self.act(a)
        with rec.op("down_proj", i):
            return linear(a, down_w, down_b)

    def _moe(self, h: torch.Tensor, rec: Any) -> torch.Tensor:
        """Mixtral routing: softmax over experts in fp32, top-k, renormalise, weighted sum of experts."""
        B, T, C = h.shape
        flat = h.reshape(B * T, C)  # (N, C)
        with rec.op("router", self.index):
            logits = self.linear.plain(flat, self.router_weight)  # (N, E)
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights, chosen = torch.topk(weights, self.top_k, dim=-1)  # (N, K)
            weights = weights / weights.sum(dim=-1, keepdim=True)  # fp32, as Hugging Face keeps them
        out = torch.zeros_like(flat)
        for e in torch.unique(chosen).tolist():
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            # experts run plain: their weights are views made per step, not packable parameters
            y = self._ffn(flat[rows], self.experts_up_weight[e], None, self.experts_down_weight[e], None, rec,
                          self.linear.plain)
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out.view(B, T, C)

    def mlp(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        rec, i = ctx.rec, self.index
        with rec.op("mlp_norm", i):
            h = self.mlp_norm.forward(x)
        if self.moe:
            y = self._moe(h, rec)
        else:
            y = self._ffn(h, self.up_weight, self.up_bias, self.down_weight, self.down_bias, rec, self.linear)
        with rec.op("mlp_residual", i):
            return y.add_(x)

    def attention(self, x: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]],
                  ctx: ForwardContext) -> torch.Tensor:
        """`x` (1, N, C): the step's tokens, one group after another; `spans` gives each group's
        (meta, B, T, first row). The norm and the QKV / output GEMMs run once over all N tokens (each
        weight read once), RoPE too (the tables are per token); the KV write and attention run per
        group, each with its own metadata (a plain step is one group)."""
        rec, i = ctx.rec, self.index
        N = x.shape[1]
        H, H_kv, D = self.H, self.H_kv, self.D
        with rec.op("attn_norm", i):
            h = self.attn_norm.forward(x)
        qkv = self._qkv(h, rec).view(N, H + 2 * H_kv, D)
        if self.rope:  # q and k heads are adjacent: one rotation for both
            with rec.op("rope", i):
                if cpu_kernels.use_ops_for(qkv):  # the same, bit for bit, in one call
                    qk = cpu_kernels.rope(qkv, H + H_kv, ctx.cos, ctx.sin)
                else:
                    qk = apply_rope(qkv[None, :, :H + H_kv], ctx.cos, ctx.sin)[0]  # (N, H + H_kv, D)
        else:
            qk = qkv[:, :H + H_kv]
        outs = []
        for meta, B, T, lo in spans:
            part = qk[lo:lo + B * T].view(B, T, H + H_kv, D)
            q, k = part[:, :, :H], part[:, :, H:]
            v = qkv[lo:lo + B * T, H + H_kv:].view(B, T, H_kv, D)
            if meta.store is not None:
                with rec.op("kv_write", i):
                    meta.store.write(i, k, v, meta)
            outs.append(ctx.attend(i, q, k, v, meta, rec).reshape(B * T, H * D))
        o = (outs[0] if len(outs) == 1 else torch.cat(outs))[None]  # (1, N, H*D)
        with rec.op("o_proj", i):
            o = self.linear(o, self.o_weight, self.o_bias)
        with rec.op("attn_residual", i):
            return o.add_(x)  # o is this layer's own buffer: add the residual into it

    def forward(self, x: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]],
                ctx: ForwardContext) -> torch.Tensor:
        return self.mlp(self.attention(x, spans, ctx), ctx)


class ForwardContext:
    """Per-forward values shared by the layers: recorder, attention function, RoPE tables."""

    __slots__ = ("rec", "attend", "cos", "sin")

    def __init__(self, rec: Any, attend: Any, cos: torch.Tensor | None, sin: torch.Tensor | None) -> None:
        self.rec, self.attend, self.cos, self.sin = rec, attend, cos, sin


ROPE_TYPES = ("default", "linear", "llama3")


def check_buildable(spec: ModelSpec) -> None:
    """A ValueError naming the field the engine cannot build (family, activation, rope type, ...),
    raised before anything is allocated, so a command can refuse the spec before it starts."""
    if spec.family not in ENGINE_FAMILIES:
        raise ValueError(f"family: the engine builds {', '.join(ENGINE_FAMILIES)} models, "
                         f"got {spec.family!r} ({spec.name})")
    if spec.hidden_act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act: {spec.hidden_act!r} is not supported "
                         f"(supported: {', '.join(_ACTIVATIONS)})")
    if spec.ffn_kind != "swiglu" and spec.num_experts > 1:
        raise ValueError(f"num_experts: mixture-of-experts needs ffn_kind='swiglu', got {spec.ffn_kind!r}")
    if spec.shared_experts:  # the cost model counts them; running without them would be another model
        raise ValueError(f"shared_experts: the engine runs routed experts only (Mixtral), got "
                         f"{spec.shared_experts} shared experts ({spec.name})")
    _check_todays_fields(spec)
    if spec.pos_encoding == "rope" and (spec.rotary_dim > spec.head_dim or spec.rotary_dim % 2):
        raise ValueError(f"rotary_dim: must be even and <= head_dim={spec.head_dim}, got {spec.rotary_dim} "
                         "(a spec scaled from a bigger one keeps its rotary_dim: pass rotary_dim=None)")
    if spec.pos_encoding == "rope":
        scaling = dict(spec.rope_scaling or {})
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported by the engine "
                             f"(supported: {', '.join(ROPE_TYPES)})")


#: ModelSpec fields of today's models the engine does not build yet, with the value that means "absent"
_NOT_BUILT = (("layer_types", None), ("nope_layers", ()), ("kv_lora_rank", None), ("moe_ffn_size", None),
              ("dense_layers", ()), ("router_bias", False), ("router_score_bias", False), ("qk_norm", None),
              ("attn_sinks", False), ("attn_softcap", None), ("final_softcap", None), ("sandwich_norms", False),
              ("embedding_scale", False), ("shared_expert_gate", False))


def _check_todays_fields(spec: ModelSpec) -> None:
    """The per-layer and architecture fields of today's models (MLA, mixed layers, q/k norms, sinks,
    soft-capping) are costed by the analytical model; the engine refuses them by name rather than
    run another model."""
    for field, absent in _NOT_BUILT:
        value = getattr(spec, field)
        if value != absent and not (field == "layer_types" and spec.uniform_layers and value is not None
                                    and set(value) == {"sliding" if spec.sliding_window else "full"}):
            shown = value if not isinstance(value, tuple) or len(value) <= 4 else f"{list(value[:4])}..."
            raise ValueError(f"{field}: the engine does not build this yet (got {shown!r} for {spec.name}); "
                             "estimate, simulate and plan model it")


class Transformer(nn.Module):
    """The whole decoder. Build with `Transformer(spec, dtype="fp32", device="cpu")` (parameters left
    uninitialised) and fill with `llmperf.engine.weights` (`init_random`, `load_hf_state_dict`), or use
    `weights.build_model(spec, seed=...)` / `weights.from_pretrained(path)`.

    Parameters: embed_weight (V, C); pos_weight (max_positions, C) (learned positions);
    layers.{i}.*; final_norm; lm_head_weight (C, V) ("in_out") or (V, C), or when tied the embedding
    itself (V, C).
    """

    def __init__(self, spec: ModelSpec, *, dtype: str | torch.dtype = "fp32",
                 device: str | torch.device = "cpu", attention: str = "sdpa", weight_layout: str = "auto") -> None:
        super().__init__()
        check_buildable(spec)
        self.spec = spec
        self.dtype = torch_dtype(dtype)
        device = torch.device(device)
        self.in_out = resolve_layout(weight_layout, self.dtype, device)
        self.weight_layout = "in_out" if self.in_out else "out_in"
        self.linear = Linear(self.in_out, packed_min_rows(self.dtype, device))
        kw = dict(dtype=self.dtype, device=device)
        C = spec.hidden_size
        self.embed_weight = nn.Parameter(torch.empty(spec.vocab_size, C, **kw))
        self.pos_weight = (nn.Parameter(torch.empty(spec.max_positions, C, **kw))
                           if spec.pos_encoding == "learned" else None)
        self.layers = nn.ModuleList(Block(spec, i, self.linear, **kw) for i in range(spec.num_layers))
        self.final_norm = Norm(spec.norm_kind, C, spec.norm_eps, **kw)
        if spec.tied_embeddings:  # the embedding itself, (V, C) whatever the layout
            self.lm_head_weight = self.embed_weight
            self._head_linear = Linear(False, self.linear.min_rows)
        else:
            self.lm_head_weight = _mat(C, spec.vocab_size, self.in_out, **kw)
            self._head_linear = self.linear
        self.rotary = RotaryTable(spec, device) if spec.pos_encoding == "rope" else None
        # Math-changing spec fields, honoured by every backend through the step metadata:
        # GPT-2's softmax scale per layer (HF `GPT2Attention.scaling`), and the sliding window.
        if spec.attn_scale and not spec.attn_scale_inverse_layer_idx:
            self.layer_scales: tuple[float, ...] | None = None  # the usual 1/sqrt(D)
        else:
            base = spec.head_dim ** -0.5 if spec.attn_scale else 1.0
            self.layer_scales = tuple(base / (i + 1 if spec.attn_scale_inverse_layer_idx else 1)
                                      for i in range(spec.num_layers))
        self.set_attention(attention)
        first = self.layers[0] if spec.num_layers else None
        # a decode step of these models may run its layers in one call of llmperf's kernels (`_decode_in_one_call`)
        self._one_call_shape = (first is not None and first.attn_norm.kind == "rmsnorm" and first.rope
                                and first.swiglu and first.silu and not first.moe and not self.in_out
                                and spec.head_dim <= cpu_kernels.MAX_HEAD_DIM)
        self.decode_in_one_call = True  # False: every operator from Python (side-by-side measurements)
        self._one_call_memo: tuple[Any, ...] | None = None  # `_one_call_addresses`' last answer
        self._scales = torch.tensor([softmax_scale(self.layer_scales, i, spec.head_dim)
                                     for i in range(spec.num_layers)], dtype=torch.float32)
        self.eos_token_id: int | tuple[int, ...] | None = None  # the checkpoint's (from_pretrained)
        self.requires_grad_(False)  # an inference engine: no autograd graph, ever
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    def set_attention(self, backend: str) -> None:
        """Choose the attention backend: one of `BACKENDS` ("sdpa", "naive", "triton")."""
        self._attend = get_backend(backend)
        self.attention_backend = backend

    def forward(self, tokens: torch.Tensor, meta: StepMeta | None = None, *, all_logits: bool = False,
                rec: Any = NULL_RECORDER, attend: Any = None) -> torch.Tensor:
        """Logits `(B, V)` of each sequence's last new token, or `(B, T, V)` with `all_logits`.

        `tokens` (B, T) int64: T new tokens of each of B sequences. `meta` places them (positions,
        cache); None runs a full causal forward from position 0 without a cache. `attend`: an
        attention function (`attention.get_backend(name)`) for this call; default: the model's.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected (B, T) token ids, got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if meta is None:
            meta = StepMeta.no_cache(B, T, tokens.device)
        x = self._layers([(tokens, meta)], rec, attend).view(B, T, -1)  # (B, T, C)
        if not all_logits:
            x = x[:, -1]  # (B, C): serving engines only need the next token's logits
        with rec.op("final_norm"):
            x = self.final_norm.forward(x)
        with rec.op("lm_head"):
            return self._head_linear(x, self.lm_head_weight)  # (B, V) or (B, T, V)

    def _place(self, tokens: torch.Tensor, meta: StepMeta) -> tuple[int, int]:
        """(B, T) of one group, checked against its metadata, which gets the model's math fields."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected (B, T) token ids, got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if meta.positions.shape != (B, T):
            raise ValueError(f"meta: positions {tuple(meta.positions.shape)} do not match tokens {(B, T)}")
        if meta.max_seq_len > self.spec.max_positions:
            raise ValueError(f"tokens: positions up to {meta.max_seq_len - 1} exceed the model's "
                             f"max_positions={self.spec.max_positions}")
        meta.window, meta.layer_scales = self.spec.sliding_window, self.layer_scales
        return B, T

    def _layers(self, groups: Sequence[tuple[torch.Tensor, StepMeta]], rec: Any, attend: Any) -> torch.Tensor:
        """Embeddings and every layer over the groups' tokens, one group after another: `(1, N, C)`."""
        spans, lo = [], 0
        for tokens, meta in groups:
            B, T = self._place(tokens, meta)
            spans.append((meta, B, T, lo))
            lo += B * T
        if len(groups) == 1:
            tokens, positions = groups[0][0].reshape(1, -1), groups[0][1].positions.reshape(1, -1)
        else:
            tokens = torch.cat([t.reshape(-1) for t, _ in groups])[None]  # (1, N)
            positions = torch.cat([m.positions.reshape(-1) for _, m in groups])[None]  # (1, N)
        cos = sin = None
        if self.rotary is not None:
            cos, sin = self.rotary.lookup(positions, max(m.max_seq_len for _, m in groups) - 1, self.dtype)
        ctx = ForwardContext(rec, attend or self._attend, cos, sin)
        with rec.op("embed"):
            x = F.embedding(tokens, self.embed_weight)  # (1, N, C)
        if self.pos_weight is not None:
            with rec.op("pos_embed"):
                x = x + F.embedding(positions, self.pos_weight)
        if self._one_call_shape and self.decode_in_one_call and len(spans) == 1:
            y = self._decode_in_one_call(x, spans[0][0], ctx)
            if y is not None:
                return y
        for layer in self.layers:
            x = layer.forward(x, spans, ctx)  # .forward skips nn.Module hook dispatch
        return x

    def _decode_in_one_call(self, x: torch.Tensor, meta: StepMeta, ctx: ForwardContext) -> torch.Tensor | None:
        """Every layer of a decode step in one call of llmperf's CPU kernels (`cpu_kernels.decode_layers`),
        or None where it does not apply: a Llama-family model (RMSNorm, RoPE, SwiGLU, no experts) at
        fp32 / bf16 on a CPU with the kernels, the `sdpa` backend, one token per sequence with a
        cache, GEMMs of few enough rows for the kernels, and no dispatch mode watching. The kernels
        are the ones the layers call one by one (the same result, bit for bit); what goes is the
        framework between them: every operator of a decode step starts right after a weight stream,
        with the interpreter's and torch's dispatch state evicted (10-55 us a framework call, see
        `cpu_kernels`). A recorder gets each part of each layer timed inside the call, under the
        operator names the layers record (`cpu_kernels.LAYER_PARTS`), so what is measured is what runs."""
        if (meta.q_len != 1 or meta.store is None or ctx.attend is not sdpa_attention
                or not cpu_kernels.use_layers_for(x)):
            return None
        first = self.layers[0]
        kernel = cpu_kernels.gemm_kernel(x, first.qkv_weight)
        if not kernel:
            return None
        amx = kernel == cpu_kernels.AMX
        ptrs = self._one_call_addresses(meta.store, amx, x.dtype)
        if ptrs is None:
            return None
        rec = ctx.rec
        parts = cpu_kernels.LAYER_PARTS
        times = torch.empty(len(self.layers) * len(parts), dtype=torch.float64) if rec.active else None
        if times is not None and getattr(rec, "before_op", None) is not None:
            rec.before_op()  # as before the first operator of the layers it replaces
        B, C = x.shape[1], x.shape[2]
        cpu_kernels.decode_layers(x.view(B, C), ptrs[0], self._scales,
                                  heads=first.H, kv_heads=first.H_kv, head_dim=first.D, ffn=first.ffn_size,
                                  eps=first.attn_norm.eps, cos=ctx.cos, sin=ctx.sin, seq_lens=meta.seq_lens_tensor(),
                                  max_len=meta.max_seq_len, window=meta.window, tables=meta.block_table(),
                                  k_blocks=ptrs[1], amx=amx, times=times)
        if times is not None:
            for j, seconds in enumerate(times.tolist()):
                rec.add(parts[j % len(parts)], j // len(parts), seconds)
        return x

    def _one_call_addresses(self, store: Any, amx: bool, dtype: torch.dtype
                            ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(`decode_layers`' addresses `(L, len(LAYER_PTRS))`, layer 0's K blocks) for this cache, or
        None where its layout does not fit (a `KVStore` without `blocks`, strides differing per layer, a
        non-contiguous weight). Kept while nothing they point at changed: the same weight objects at
        the same versions and storage, no `Linear.clear()`, a cache of the same class, address and
        layout (rebuilding them costs ~240 us a step: module attributes and views, 12 layers). The
        memo holds the weights (the key's identities) but not the AMX copies: `Linear` keeps those
        until a weight changes or `clear()`, and either changes the key, so `clear()` frees them."""
        blocks = getattr(store, "blocks", None)  # a KVStore of a user's may not address blocks
        if blocks is None:
            return None
        k0, _ = blocks(0)
        weights = [params[name] for layer in self.layers
                   for params, names in ((layer._parameters, _ONE_CALL_PARAMS),
                                         (layer.attn_norm._parameters, ("weight",)),
                                         (layer.mlp_norm._parameters, ("weight",)))
                   for name in names]
        key = (amx, self.linear.generation, type(store), k0.data_ptr(), k0.shape, k0.stride(),
               [(-1 if w is None or w.is_inference() else w._version, 0 if w is None else w.data_ptr())
                for w in weights])
        memo = self._one_call_memo
        if memo is not None and memo[0] == key and all(a is b for a, b in zip(memo[1], weights)):
            return memo[2], k0
        rows = []
        for i, layer in enumerate(self.layers):
            k, v = blocks(i)
            if k.stride() != k0.stride() or v.stride() != k0.stride() or k.dtype != dtype or v.dtype != dtype:
                return None
            mats = (layer.qkv_weight, layer.o_weight, layer.up_weight, layer.down_weight)
            biases = (layer.qkv_bias, layer.o_bias, layer.up_bias, layer.down_bias)
            if not all(t is None or t.is_contiguous() for t in (*mats, *biases)):
                return None
            if amx:
                mats = tuple(self.linear.packed(w, amx=True) for w in mats)
            q, o, gu, d = mats
            rows.append((layer.attn_norm.weight.data_ptr(), q.data_ptr(), _address(layer.qkv_bias), o.data_ptr(),
                         _address(layer.o_bias), layer.mlp_norm.weight.data_ptr(), gu.data_ptr(),
                         _address(layer.up_bias), d.data_ptr(), _address(layer.down_bias), k.data_ptr(), v.data_ptr()))
        ptrs = torch.tensor(rows, dtype=torch.int64)
        # no reference to the cache: a model outlives its engines' caches (the key has their layout)
        self._one_call_memo = (key, weights, ptrs)
        return ptrs, k0

    def forward_groups(self, groups: Sequence[tuple[torch.Tensor, StepMeta]], *, rec: Any = NULL_RECORDER,
                       attend: Any = None) -> list[torch.Tensor]:
        """One forward pass over groups of sequences that feed different numbers of new tokens (a
        mixed step: decode tokens and prefill chunks). `groups`: `(tokens (B_g, T_g), meta_g)` per
        group, each placed by its own metadata. Every GEMM, norm and activation runs once over all the
        step's tokens, so each weight is read once per step, as a serving engine does and as the
        simulator prices a mixed step; the KV writes and attention run per group. Returns each group's
        logits `(B_g, V)` of its sequences' last new tokens."""
        if not groups:
            raise ValueError("groups: expected at least one (tokens, meta) group")
        x = self._layers(groups, rec, attend)
        last, lo = [], 0
        for tokens, _ in groups:
            B, T = tokens.shape
            last += [lo + b * T + T - 1 for b in range(B)]
            lo += B * T
        x = x[0, torch.tensor(last, device=x.device)]  # (sum B_g, C): each sequence's last new token
        with rec.op("final_norm"):
            x = self.final_norm.forward(x)
        with rec.op("lm_head"):
            logits = self._head_linear(x, self.lm_head_weight)
        return list(logits.split([t.shape[0] for t, _ in groups]))


__all__ = ["BACKENDS", "DTYPES", "Block", "Norm", "Transformer", "apply_rope", "rope_inv_freq",
           "torch_dtype"]
