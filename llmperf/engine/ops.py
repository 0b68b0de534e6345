"""The seam between the model and what runs its operators: the model (`model.Transformer`) calls an
ops object for its GEMMs, RMSNorm (of rows, or in place over q/k heads), RoPE, SwiGLU's activation
and a whole decode step, and nothing else decides how they run. `TorchOps`, plain torch, is the
default on every device and dtype; a faster implementation of the same interface
(`llmperf.engine.cpu.CpuOps`: llmperf's C++ kernels and oneDNN's packed GEMM) is chosen in one place,
`ops_for`, by device and dtype.

Weights are stored in one layout, the model's (`(out, in)` as `nn.Linear`, or `(in, out)` when a
model is built with `weight_layout="in_out"`); any other layout an implementation reads (packed for
oneDNN or AMX tiles, transposed) is its private cache, derived from those weights.

Letters: N rows (tokens), C hidden size, D head dim.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from llmperf.engine.rope import apply_rope


def matmul_in_out(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """`x (..., in) @ w (in, out) [+ b]`, the bias fused into the GEMM (addmm)."""
    if b is None:
        return torch.matmul(x, w)
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])


class TorchOps:
    """Every operator in plain torch, on any device and dtype: the reference each faster
    implementation matches (bit for bit where its docstring says so)."""

    def __init__(self, in_out: bool = False) -> None:
        self.in_out = in_out  # matrices stored (in, out): y = x @ W + b

    def plain(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """`y = x W^T + b` in torch (`F.linear`, or `x @ W + b` on `(in, out)` weights)."""
        return matmul_in_out(x, w, b) if self.in_out else F.linear(x, w, b)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """One of the model's GEMMs, `x (..., in)` by a weight parameter of the model."""
        return self.plain(x, w, b)

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of `x (..., C)`; below fp32 as Hugging Face: normalise in fp32, cast back, then
        scale in the activation dtype."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, w.shape, w, eps)
        return w * F.rms_norm(x.float(), w.shape, eps=eps).to(x.dtype)

    def rms_norm_heads_(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """`rms_norm` of every head of `x (N, heads, D)` (the q or k heads of a QKV GEMM's output, a
        view) written back into `x`, which is returned."""
        return x.copy_(self.rms_norm(x, w, eps))

    def rope(self, qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor,
             interleaved: bool = False, in_place: bool = False) -> torch.Tensor:
        """The first `heads` heads of `qkv (N, heads_total, D)` rotated by the tables `(1, N, 1,
        rotary_dim)`: `(N, heads, D)` (`interleaved`: adjacent pairs, `rope.apply_rope`). `in_place`:
        the caller owns `qkv` and lets the result overwrite those heads (an implementation may then
        return a view of `qkv`; this one returns a fresh tensor either way)."""
        return apply_rope(qkv[None, :, :heads], cos, sin, interleaved)[0]

    def glu(self, gate_up: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """A gated MLP's activation over the fused [gate | up] GEMM's output `(..., 2F)`: `act(gate) * up`."""
        gate, up = gate_up.chunk(2, dim=-1)
        return act(gate) * up

    def decode_layers(self, model: Any, x: torch.Tensor, meta: Any, ctx: Any) -> torch.Tensor | None:
        """Every layer of a decode step in one call, or None: the model runs them one by one (always, here)."""
        return None

    def clear(self) -> None:
        """Forget every private copy of the weights (none here)."""


def ops_for(device: torch.device | str, dtype: torch.dtype, in_out: bool = False) -> TorchOps:
    """The ops a model of `dtype` on `device` runs: on a CPU in fp32 or bf16, `llmperf.engine.cpu.CpuOps`
    (which itself falls back to torch per call where its kernels cannot run: see its docstring);
    elsewhere `TorchOps`. On a CPU, glibc is first told to keep freed memory (`cpu.allocator`)."""
    if torch.device(device).type == "cpu":
        from llmperf.engine.cpu.allocator import keep_freed_memory

        keep_freed_memory()  # every CPU engine runs with freed memory kept (`cpu.allocator`)
        if dtype in (torch.float32, torch.bfloat16):
            from llmperf.engine.cpu.ops import CpuOps

            return CpuOps(dtype, in_out)
    return TorchOps(in_out)


__all__ = ["TorchOps", "matmul_in_out", "ops_for"]
