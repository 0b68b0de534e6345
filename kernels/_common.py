"""Helpers shared by the Triton wrappers: interpreter detection, launch configs, argument checks.

Letters: B batch, H query heads, H_kv key/value heads, G = H / H_kv query heads per KV head,
T_q / T_kv query / key lengths, S_max cache capacity, D head dim.

Every check raises `ValueError` whose message starts with the name of the offending argument, so a
caller (or a test) can tell which input was wrong without reading a traceback.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import torch

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
REFERENCE_DTYPES = KERNEL_DTYPES + (torch.float64,)  # the references also run in float64
MAX_HEAD_DIM = 256  # K and V tiles of a wider head no longer fit in shared memory with a useful BLOCK_N


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (read when the kernel modules are imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def tuning_configs(configs: Sequence, fallback: int) -> list:
    """The autotuning space `configs`, or only `configs[fallback]` (one that launches at every dtype and
    head dim) when LLMPERF_TRITON_AUTOTUNE=0: the GPU tests check values, not speed, and compile one
    config per shape instead of all of them (minutes less in a short GPU lease). Read at import."""
    if os.environ.get("LLMPERF_TRITON_AUTOTUNE", "1") == "0":
        return [configs[fallback]]
    return list(configs)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def padded_head_dim(D: int) -> int:
    """`tl.arange` needs a power of two and `tl.dot` a reduction dim >= 16: pad D up, mask the rest."""
    return max(16, next_power_of_2(D))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products ("ieee"); on GPU the default would be TF32 (10-bit mantissa)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def default_sm_scale(D: int, sm_scale: float | None) -> float:
    if sm_scale is None:
        return D**-0.5
    return check_sm_scale(sm_scale)


def check_sm_scale(sm_scale: object) -> float:
    """A positive finite softmax scale (no default: for MLA it depends on the model, not on a tensor's width)."""
    if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool) or not 0 < sm_scale < float("inf"):
        raise ValueError(f"sm_scale: must be a positive number, got {sm_scale!r}")
    return float(sm_scale)


def check_tensor(name: str, t: object, ndim: int, dims: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor {dims}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims {dims}, got shape {tuple(t.shape)}")
    return t


def check_float(name: str, t: torch.Tensor, dtype: torch.dtype | None = None, ref: str = "q") -> None:
    """A float dtype the references take; with `dtype`, exactly the dtype of the argument `ref`."""
    if dtype is None:
        if t.dtype not in REFERENCE_DTYPES:
            raise ValueError(f"{name}: dtype must be float16, bfloat16, float32 or float64, got {t.dtype}")
    elif t.dtype != dtype:
        raise ValueError(f"{name}: dtype {t.dtype} differs from {ref}'s {dtype}")


def check_head_dim(name: str, D: int, expected: int | None = None) -> None:
    if expected is not None and D != expected:
        raise ValueError(f"{name}: head dim {D} differs from q's {expected}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head dim must be in [1, {MAX_HEAD_DIM}], got {D}")


def check_heads(H: int, H_kv: int, kv_name: str) -> int:
    """Return G, the number of query heads that share one KV head."""
    if H_kv < 1 or H % H_kv != 0:
        raise ValueError(f"{kv_name}: {H_kv} KV heads do not divide q's {H} heads (GQA needs H % H_kv == 0)")
    return H // H_kv


def check_same_device(tensors: Sequence[tuple[str, torch.Tensor]]) -> torch.device:
    device = tensors[0][1].device
    for name, t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, but {tensors[0][0]} is on {device}")
    return device


def check_kernel_inputs(q: torch.Tensor, name: str = "q") -> None:
    """The Triton kernels run on a GPU, or on CPU tensors under TRITON_INTERPRET=1, in fp16/bf16/fp32.

    Call after the signature checks, which make every other tensor match q's device and dtype (`name`:
    the query argument's name in the message)."""
    if q.dtype not in KERNEL_DTYPES:
        raise ValueError(f"{name}: the Triton kernels take float16, bfloat16 or float32, got {q.dtype}")
    if q.device.type == "cuda" or (q.device.type == "cpu" and interpreting()):
        return
    hint = " (set TRITON_INTERPRET=1 before importing the kernels to run on CPU)" if q.device.type == "cpu" else ""
    raise ValueError(f"{name}: the Triton kernels need CUDA tensors, got device {q.device}{hint}")


def check_index_tensor(name: str, t: object, ndim: int, dims: str) -> torch.Tensor:
    t = check_tensor(name, t, ndim, dims)
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: dtype must be torch.int32, got {t.dtype}")
    return t


def check_out(out: torch.Tensor | None, like: torch.Tensor, like_name: str = "q") -> torch.Tensor:
    """Validate a caller-provided output buffer or allocate one with the shape, dtype and device of `like`
    (the argument `like_name`)."""
    if out is None:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out: expected a torch.Tensor, got {type(out).__name__}")
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(
            f"out: must match {like_name} (shape {tuple(like.shape)}, {like.dtype}, {like.device}), "
            f"got shape {tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    return out


def check_inner_contiguous(name: str, t: torch.Tensor) -> None:
    """Kernels accept any strides except along D, which must be unit-stride for vectorised loads."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last (head) dim must be contiguous (stride 1), got strides {t.stride()}")


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it q's (a no-op for CPU tensors)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
