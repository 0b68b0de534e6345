"""Compile the Triton kernels ahead of time for a CUDA architecture, without a GPU.

Run WITHOUT TRITON_INTERPRET (the interpreter replaces the jit functions):
    python tests/kernels/aot_compile.py 80 [90 ...] [--all-configs] [--only=_mla_decode_kernel ...]
prints one JSON line per compiled kernel (name, arch, the optional paths it compiled: sliding window,
chunk, sinks; config, its integer constexprs, shared memory, whether PTX and a cubin were produced,
registers per thread and spill stack from cuobjdump). The launch arguments come from the real wrappers:
their launchers are replaced by recorders and the wrappers are called on CPU tensors; each argument is
then specialised exactly as triton's JIT specialises it at launch (`native_specialize_impl`: dtype,
16-byte alignment, ints equal to 1 or divisible by 16), so the compiled signature is the one a GPU
launch would compile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("aot_compile: unset TRITON_INTERPRET (the interpreter replaces the jit functions)")

import kernels.decode as decode  # noqa: E402
import kernels.mla as mla  # noqa: E402
import kernels.paged as paged  # noqa: E402
import kernels.prefill as prefill  # noqa: E402
from kernels._checks import LOCAL_CHUNK, LOCAL_WINDOW  # noqa: E402

# Largest dynamic shared memory per block (bytes): A100 (sm_80) 163 KiB, H100 (sm_90) 227 KiB.
MAX_SHARED = {80: 166912, 90: 232448}


class Recorder:
    """Stands in for a kernel launcher (`kernel[grid](*args, **meta)`) and keeps the call."""

    def __init__(self, fn: triton.JITFunction, calls: list):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.calls.append((self.fn, args, meta))

        return launch


def capture() -> list:
    """Call each wrapper on small CPU tensors and return the recorded launches (fn, args, meta)."""
    calls: list = []
    for module in (prefill, decode, paged, mla):
        module.check_kernel_inputs = lambda q, name="q": None  # CPU tensors stand in for CUDA ones
    prefill._flash_attention_tuned = Recorder(prefill._flash_attention_kernel, calls)
    decode._flash_decoding_tuned = Recorder(decode._flash_decoding_kernel, calls)
    paged._paged_attention_tuned = Recorder(paged._paged_attention_kernel, calls)
    mla._mla_decode_tuned = Recorder(mla._mla_decode_kernel, calls)
    decode._combine_splits_kernel = Recorder(decode._combine_splits_kernel, calls)

    def t(*shape, dtype=torch.float16):
        return torch.zeros(*shape, dtype=dtype)

    lens = torch.tensor([100, 37], dtype=torch.int32)
    # Features: sliding window (gpt-oss: 128), chunk (Llama 4: 8192), sinks (any float dtype).
    window, chunk = dict(window=128), dict(chunk=8192)
    for dtype, D, H, H_kv, T_q, T_kv, causal, features in [
        (torch.float16, 128, 8, 2, 64, 64, True, {}),
        (torch.float32, 64, 4, 4, 20, 50, False, {}),
        (torch.bfloat16, 80, 8, 1, 30, 40, True, {}),
        (torch.bfloat16, 64, 8, 1, 64, 64, True, dict(window, sinks=t(8, dtype=torch.bfloat16))),
        (torch.float16, 128, 8, 2, 30, 40, True, chunk),
        (torch.float32, 64, 4, 4, 20, 50, False, dict(sinks=t(4, dtype=torch.float32))),
    ]:
        prefill.flash_attention(t(2, H, T_q, D, dtype=dtype), t(2, H_kv, T_kv, D, dtype=dtype),
                                t(2, H_kv, T_kv, D, dtype=dtype), causal, **features)
    for dtype, D, H, H_kv, splits, features in [
        (torch.float16, 128, 8, 2, 4, {}),
        (torch.bfloat16, 64, 4, 4, 1, {}),
        (torch.float32, 128, 8, 1, 2, {}),
        (torch.bfloat16, 64, 8, 1, 4, dict(window, sinks=t(8, dtype=torch.bfloat16))),  # sinks in the combine
        (torch.float16, 64, 8, 1, 1, dict(window, sinks=t(8, dtype=torch.float32))),  # sinks in stage 1
        (torch.bfloat16, 128, 8, 2, 2, chunk),
    ]:
        cache = t(2, H_kv, 128, D, dtype=dtype)
        decode.flash_decoding(t(2, H, D, dtype=dtype), cache, cache, lens, splits, **features)
    for dtype, D, H, H_kv, P, splits, features in [
        (torch.float16, 128, 8, 2, 16, 3, {}),
        (torch.bfloat16, 64, 8, 1, 32, 1, {}),
        (torch.bfloat16, 64, 8, 1, 16, 3, dict(window, sinks=t(8, dtype=torch.bfloat16))),
        (torch.float16, 128, 8, 2, 16, 1, dict(chunk, sinks=t(8, dtype=torch.float16))),
    ]:
        blocks = t(16, P, H_kv, D, dtype=dtype)
        table = torch.arange(2 * (128 // P), dtype=torch.int32).view(2, -1) % 16
        paged.paged_attention(t(2, H, D, dtype=dtype), blocks, blocks, table, lens, splits, **features)
    # DeepSeek-V3's latent (R=512, Dr=64): all 128 heads on one GPU, 16 per GPU at TP 8; FlashMLA's P=64.
    for dtype, H, P, splits in [
        (torch.bfloat16, 128, 64, 3),
        (torch.float16, 16, 64, 1),
        (torch.bfloat16, 16, 16, 2),
        (torch.float32, 16, 64, 1),
    ]:
        latent = t(16, P, 512 + 64, dtype=dtype)
        table = torch.arange(2 * (128 // P), dtype=torch.int32).view(2, -1) % 16
        mla.mla_decode(t(2, H, 512, dtype=dtype), t(2, H, 64, dtype=dtype), latent, table, lens, splits,
                       sm_scale=192**-0.5)
    return calls


# One config per kernel for the quick check (it fits an A100 and an H100 for every dtype captured).
SMOKE_CONFIG = {"_flash_attention_kernel": 1, "_flash_decoding_kernel": 0, "_paged_attention_kernel": 0,
                "_mla_decode_kernel": 0}


def configs_for(fn, all_configs: bool) -> list[tuple[dict, int, int]]:
    """(block constexprs, num_warps, num_stages) to compile `fn` with."""
    if fn.__name__ == "_flash_attention_kernel":
        cfgs = [({"BLOCK_M": m, "BLOCK_N": n}, w, s) for m, n, w, s in prefill.CUDA_CONFIGS]
    elif fn.__name__ == "_combine_splits_kernel":
        return [({}, decode.COMBINE_NUM_WARPS, 1)]
    elif fn.__name__ == "_mla_decode_kernel":
        cfgs = [({"BLOCK_N": n}, w, s) for n, w, s in mla.CUDA_CONFIGS]
    else:
        cfgs = [({"BLOCK_N": n}, w, s) for n, w, s in decode.CUDA_CONFIGS]
    return cfgs if all_configs else [cfgs[SMOKE_CONFIG[fn.__name__]]]


def compile_call(fn, args, meta, block: dict, num_warps: int, num_stages: int, cc: int):
    meta = {k: v for k, v in meta.items() if k not in ("num_warps", "num_stages")}
    constexprs = dict(meta, **block)
    names = [n for n in fn.arg_names if n not in constexprs]
    assert len(names) == len(args), (fn.__name__, names, len(args))
    signature, attrs = {}, {}
    for name, value in zip(names, args):
        kind, spec = native_specialize_impl(CUDABackend, value, False, True, True)
        if kind == "constexpr":
            constexprs[name] = spec
        else:
            signature[name] = kind
            if spec:
                attrs[(fn.arg_names.index(name),)] = CUDABackend.parse_attr(spec)
    for name in constexprs:
        signature[name] = "constexpr"
    signature = {n: signature[n] for n in fn.arg_names}
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def resource_usage(cubin: bytes) -> dict[str, int | None]:
    """Registers per thread and spill stack bytes from `cuobjdump --dump-resource-usage` (shipped with triton)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cubin or not tool.exists():
        return {"regs": None, "stack": None}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", text), re.search(r"STACK:(\d+)", text)
    return {"regs": int(regs[1]) if regs else None, "stack": int(stack[1]) if stack else None}


def features_of(meta: dict) -> list[str]:
    """The optional paths a launch compiled: "window" / "chunk" (LOCAL 1 / 2) and "sinks"."""
    local = {LOCAL_WINDOW: ["window"], LOCAL_CHUNK: ["chunk"]}.get(meta.get("LOCAL"), [])
    return local + (["sinks"] if meta.get("HAS_SINKS") else [])


def main(argv: list[str]) -> None:
    all_configs = "--all-configs" in argv
    only = {a.split("=", 1)[1] for a in argv if a.startswith("--only=")}  # e.g. --only=_mla_decode_kernel
    archs = [int(a) for a in argv if not a.startswith("--")]
    for fn, args, meta in capture():
        if only and fn.__name__ not in only:
            continue
        for block, num_warps, num_stages in configs_for(fn, all_configs):
            for cc in archs:
                start = time.perf_counter()
                k = compile_call(fn, args, meta, block, num_warps, num_stages, cc)
                seconds = time.perf_counter() - start
                ptx = k.asm.get("ptx", "")
                print(json.dumps(dict(
                    kernel=fn.__name__, arch=cc, features=features_of(meta),
                    config=dict(block, num_warps=num_warps, num_stages=num_stages),
                    dtype=str(args[0].dtype), shared=k.metadata.shared, max_shared=MAX_SHARED.get(cc),
                    ptx_target=next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), None),
                    ptx_entry=f".entry {fn.__name__}" in ptx, cubin=bool(k.asm.get("cubin")),
                    stages=sorted(k.asm), seconds=round(seconds, 2), **resource_usage(k.asm.get("cubin", b"")),
                    meta={name: v for name, v in meta.items() if name.isupper() and isinstance(v, int)},
                )), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
