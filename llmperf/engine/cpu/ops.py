"""The CPU fast path behind the engine's ops seam (`llmperf.engine.ops`): `CpuOps` runs a model's
operators on llmperf's C++ kernels (`kernels`) and oneDNN's packed GEMM where they are faster, and in
plain torch (`TorchOps`) elsewhere, choosing per call by dtype, rows and what this CPU has.

Every GEMM of R rows (B*T), in this order (`llmperf.engine.paths` describes the same choice):

- llmperf's weight-streaming GEMM (`kernels.small_gemm`) up to `kernels.rows_for(dtype)` rows (fp32 8,
  bf16 4), or bf16 rows 3-16 on the AMX GEMM from a copy packed for its tiles (`kernels.amx_pack`),
  where the kernels run (AVX-512 F/BW + AVX512_BF16, a compiler);
- oneDNN's packed GEMM (`torch.ops.mkldnn._linear_pointwise` on a `_reorder_linear_weight` copy, what
  torch inductor runs on CPU) from `packed_min_rows` rows (fp32 2, bf16 1 where oneDNN has native bf16);
- below that, torch: at one fp32 row the matrix-vector product on a transposed `(in, out)` copy
  (`GEMV_ROWS`; torch's GEMV reads it faster than `F.linear` reads `(out, in)`), else `F.linear`.

Copies are private, made from the model's weights on first use and remade when a weight changes
(its version counter or storage; an inference tensor has none: changing one in place needs
`clear()`). A Llama-family decode step (RMSNorm, RoPE, SwiGLU, no experts, `(out, in)` weights, the
`sdpa` backend, a cache whose blocks the kernels address) runs all its layers in one call of the
kernels (`decode_layers`): the same kernels in the same order, the same logits bit for bit, without
~140 framework calls between them. The measurements behind each choice, and what each path gains on
an AVX-512 and an AVX2-only CPU against torch eager and `torch.compile`:
`reports/engine/2026-11-25-cpu-seam/README.md` (and the kernels' own in `kernels`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils import flop_counter

from llmperf.engine.attention import sdpa_attention
from llmperf.engine.cpu import kernels
from llmperf.engine.ops import TorchOps, matmul_in_out

GEMV_ROWS = 1  # fp32 GEMMs of this many rows run torch's GEMV on a transposed copy (where nothing faster runs)


def onednn_bf16() -> bool:
    """Whether oneDNN has native bf16 GEMMs on this CPU (AVX512_BF16 or AMX, unless `ONEDNN_MAX_CPU_ISA`
    hides them when torch loads); without them a bf16 GEMM converts every element."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packed_min_rows(dtype: torch.dtype, device: torch.device | str = "cpu") -> int | None:
    """The fewest rows (B*T) from which a GEMM runs on the oneDNN-packed copy of its weight (the
    report's measurement); None: never packed (CUDA, fp16, a torch build or CPU without oneDNN bf16)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    if dtype == torch.float32:
        return 2
    if dtype == torch.bfloat16 and onednn_bf16():
        return 1
    return None


def _packed_linear_flops(x_shape: torch.Size, *args: Any, out_shape: torch.Size, **kwargs: Any) -> int:
    """`FlopCounterMode` formula for the packed GEMM (either overload): 2 * rows * in * out, as it
    counts `mm` / `addmm` (the bias not counted)."""
    return 2 * math.prod(out_shape) * x_shape[-1]


_PACKED_LINEAR = torch.ops.mkldnn._linear_pointwise.default
if torch.ops.mkldnn._linear_pointwise not in flop_counter.flop_registry:  # profile's cross-check counts what runs
    flop_counter.register_flop_formula(torch.ops.mkldnn._linear_pointwise)(_packed_linear_flops)

#: a layer's parameters `decode_layers` reads (`Block`'s names); the norms' weights are `Norm` modules'
_ONE_CALL_PARAMS = ("qkv_weight", "qkv_bias", "o_weight", "o_bias", "up_weight", "up_bias", "down_weight", "down_bias")
_ONEDNN, _AMX, _T = "onednn", "amx", "t"  # the private copies: packed for oneDNN, for AMX, transposed


def _address(t: torch.Tensor | None) -> int:
    """The data address of an optional bias (0: none)."""
    return 0 if t is None else t.data_ptr()


class CpuOps(TorchOps):
    """The ops of one model on a CPU (fp32 / bf16): the GEMM paths above, the kernels' RMSNorm, RoPE
    and SwiGLU activation, and the decode step in one call; torch's operators wherever the kernels
    cannot run (another dtype or device, `kernels.disabled()`, `LLMPERF_CPU_KERNELS=0`, a CPU
    without them). `min_rows`: `packed_min_rows` of the model's dtype (None: nothing packed)."""

    def __init__(self, dtype: torch.dtype, in_out: bool = False) -> None:
        super().__init__(in_out)
        self.min_rows = packed_min_rows(dtype)
        self._packs: dict[tuple[str, int], tuple[torch.Tensor, int, int, torch.Tensor]] = {}
        self.generation = 0  # counts `clear()` calls (whoever keeps a copy's address checks it)
        self._one_call_memo: tuple[Any, ...] | None = None  # `_one_call_addresses`' last answer
        self._one_call_fits: bool | None = None  # whether the model's structure fits `decode_layers`
        self._scales: torch.Tensor | None = None  # the softmax scale per layer, for `decode_layers`

    def clear(self) -> None:
        """Forget every private copy (they are remade on next use)."""
        self._packs.clear()
        self.generation += 1

    def packed(self, w: torch.Tensor, kind: str = _ONEDNN) -> torch.Tensor:
        """The private copy of `w` of `kind` (packed for oneDNN, for the AMX GEMM, or transposed), made
        now if `w` is new or changed."""
        key = (kind, id(w))
        entry = self._packs.get(key)
        # a weight made under inference_mode has no version counter: its storage alone is checked
        version = -1 if w.is_inference() else w._version
        if entry is None or entry[0] is not w or entry[1] != version or entry[2] != w.data_ptr():
            if kind == _AMX:
                copy = kernels.amx_pack(w)
            elif kind == _T:
                copy = w.t().contiguous()
            else:
                copy = torch.ops.mkldnn._reorder_linear_weight(w.t() if self.in_out else w, None)
            entry = self._packs[key] = (w, version, w.data_ptr(), copy)
        return entry[3]

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        kernel = 0 if self.in_out else kernels.gemm_kernel(x, w)  # few rows: llmperf's own kernels
        if kernel == kernels.STREAM:
            return kernels.small_gemm(x, w, b)
        if kernel == kernels.AMX:
            return kernels.amx_gemm(x, self.packed(w, _AMX), w.shape[0], b)
        if self.min_rows is None or x.numel() < self.min_rows * x.shape[-1] or not x.is_cpu:  # moved to CUDA
            if (not self.in_out and x.dtype == torch.float32 and x.is_cpu and w.dtype == x.dtype
                    and x.numel() <= GEMV_ROWS * x.shape[-1]):
                return matmul_in_out(x, self.packed(w, _T), b)
            return self.plain(x, w, b)
        return _PACKED_LINEAR(x, self.packed(w), b, "none", [], "")

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        if kernels.use_ops_for(x):  # fp32 / bf16 on CPU: the same in one call
            return kernels.rms_norm(x, w, eps)
        return super().rms_norm(x, w, eps)

    def rms_norm_heads_(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        if kernels.use_ops_for(x) and x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]:  # in place, one call
            return kernels.rms_norm_heads_(x, w, eps)
        return super().rms_norm_heads_(x, w, eps)

    def rope(self, qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor,
             interleaved: bool = False, in_place: bool = False) -> torch.Tensor:
        if not interleaved and kernels.use_ops_for(qkv):  # the same, bit for bit, in one call
            in_place = in_place and qkv.dim() == 3 and qkv.stride(2) == 1 and qkv.stride(1) == qkv.shape[2]
            return kernels.rope(qkv, heads, cos, sin, in_place=in_place)
        return super().rope(qkv, heads, cos, sin, interleaved)

    def glu(self, gate_up: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if act is F.silu and kernels.use_ops_for(gate_up):  # the same in one call
            return kernels.silu_mul(gate_up)
        return super().glu(gate_up, act)

    # ---- a decode step in one call --------------------------------------------------------------

    def _fits(self, model: Any) -> bool:
        """Whether the model's structure is what `kernels.decode_layers` runs (asked once)."""
        if self._one_call_fits is None:
            self._one_call_fits = bool(len(model.layers) and model.spec.one_call_layers and not self.in_out
                                       and model.spec.head_dim <= kernels.MAX_HEAD_DIM)
            self._scales = torch.tensor([p.scale for p in model.attn_params], dtype=torch.float32)
        return self._one_call_fits

    def decode_layers(self, model: Any, x: torch.Tensor, meta: Any, ctx: Any) -> torch.Tensor | None:
        """Every layer of a decode step in one call of llmperf's CPU kernels (`kernels.decode_layers`),
        or None where it does not apply: a Llama-family model (RMSNorm, RoPE, SwiGLU, no experts) at
        fp32 / bf16 on a CPU with the kernels, the `sdpa` backend, one token per sequence with a
        cache, GEMMs of few enough rows for the kernels, and no dispatch mode watching. The kernels
        are the ones the layers call one by one (the same result, bit for bit); what goes is the
        framework between them: every operator of a decode step starts right after a weight stream,
        with the interpreter's and torch's dispatch state evicted (10-55 us a framework call, see
        `kernels`). A recorder gets each part of each layer timed inside the call, under the
        operator names the layers record (`kernels.LAYER_PARTS`), so what is measured is what runs."""
        if (meta.q_len != 1 or meta.store is None or ctx.attend is not sdpa_attention
                or not kernels.use_layers_for(x) or not self._fits(model)):
            return None
        first = model.layers[0]
        kernel = kernels.gemm_kernel(x, first.qkv_weight)
        if not kernel:
            return None
        amx = kernel == kernels.AMX
        ptrs = self._one_call_addresses(model, meta.store, amx, x.dtype)
        if ptrs is None:
            return None
        rec = ctx.rec
        parts = kernels.LAYER_PARTS
        times = torch.empty(len(model.layers) * len(parts), dtype=torch.float64) if rec.active else None
        if times is not None and getattr(rec, "before_op", None) is not None:
            rec.before_op()  # as before the first operator of the layers it replaces
        B, C = x.shape[1], x.shape[2]
        kernels.decode_layers(x.view(B, C), ptrs[0], self._scales,
                              heads=first.H, kv_heads=first.H_kv, head_dim=first.D, ffn=first.ffn_size,
                              eps=first.attn_norm.eps, cos=ctx.cos, sin=ctx.sin, seq_lens=meta.seq_lens_tensor(),
                              max_len=meta.max_seq_len, window=meta.window, tables=meta.block_table(),
                              k_blocks=ptrs[1], amx=amx, times=times)
        if times is not None:
            for j, seconds in enumerate(times.tolist()):
                rec.add(parts[j % len(parts)], j // len(parts), seconds)
        return x

    def _one_call_addresses(self, model: Any, store: Any, amx: bool, dtype: torch.dtype
                            ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(`decode_layers`' addresses `(L, len(LAYER_PTRS))`, layer 0's K blocks) for this cache, or
        None where its layout does not fit (a `KVStore` without `blocks`, strides differing per layer, a
        non-contiguous weight). Kept while nothing they point at changed: the same weight objects at
        the same versions and storage, no `clear()`, a cache of the same class, address and layout
        (rebuilding them costs ~240 us a step: module attributes and views, 12 layers). The memo
        holds the weights (the key's identities) but not the AMX copies: `_packs` keeps those until
        a weight changes or `clear()`, and either changes the key, so `clear()` frees them."""
        blocks = getattr(store, "blocks", None)  # a KVStore of a user's may not address blocks
        if blocks is None:
            return None
        k0, _ = blocks(0)
        weights = [params[name] for layer in model.layers
                   for params, names in ((layer._parameters, _ONE_CALL_PARAMS),
                                         (layer.attn_norm._parameters, ("weight",)),
                                         (layer.mlp_norm._parameters, ("weight",)))
                   for name in names]
        key = (amx, self.generation, type(store), k0.data_ptr(), k0.shape, k0.stride(),
               [(-1 if w is None or w.is_inference() else w._version, 0 if w is None else w.data_ptr())
                for w in weights])
        memo = self._one_call_memo
        if memo is not None and memo[0] == key and all(a is b for a, b in zip(memo[1], weights)):
            return memo[2], k0
        rows = []
        for i, layer in enumerate(model.layers):
            k, v = blocks(i)
            if k.stride() != k0.stride() or v.stride() != k0.stride() or k.dtype != dtype or v.dtype != dtype:
                return None
            mats = (layer.qkv_weight, layer.o_weight, layer.up_weight, layer.down_weight)
            biases = (layer.qkv_bias, layer.o_bias, layer.up_bias, layer.down_bias)
            if not all(t is None or t.is_contiguous() for t in (*mats, *biases)):
                return None
            if amx:
                mats = tuple(self.packed(w, _AMX) for w in mats)
            q, o, gu, d = mats
            rows.append((layer.attn_norm.weight.data_ptr(), q.data_ptr(), _address(layer.qkv_bias), o.data_ptr(),
                         _address(layer.o_bias), layer.mlp_norm.weight.data_ptr(), gu.data_ptr(),
                         _address(layer.up_bias), d.data_ptr(), _address(layer.down_bias), k.data_ptr(), v.data_ptr()))
        ptrs = torch.tensor(rows, dtype=torch.int64)
        # no reference to the cache: a model outlives its engines' caches (the key has their layout)
        self._one_call_memo = (key, weights, ptrs)
        return ptrs, k0


__all__ = ["GEMV_ROWS", "CpuOps", "onednn_bf16", "packed_min_rows"]
