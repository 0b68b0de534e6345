"""Measure the terms of the GPU time model on a CUDA device, shape by shape.

`python -m llmperf.measure.gpu_terms OUT [--quick]` writes, under OUT:
- `gemm.csv`: `x (M, K) @ W^T` (`torch.nn.functional.linear`, as engines call it) per dtype (bf16,
  fp16; fp8 e4m3 through `torch._scaled_mm` where the device has fp8 tensor cores) over M = 1 .. 8192
  and the (N, K) of real models' projections, and grouped GEMMs (`torch.bmm`) as MoE experts run;
- `attention.csv`: `scaled_dot_product_attention` (bf16, the backend torch picks, recorded) for
  causal prefill and single-token decode over head dims, GQA groups, contexts and batches;
- `small_ops.csv`: vector operators (residual add, RMSNorm, SiLU-and-multiply, RoPE-like rotate,
  copy) over rows, each timed inside a CUDA graph (device time, no launch gaps);
- `launch.csv`: the host's cost to launch one tiny kernel eagerly, a tiny kernel's device time
  replayed in a CUDA graph, and one graph launch;
- `meta.json`: the device, clocks, driver and versions, the date.

Each time is `triton.testing.do_bench`'s median (the L2 flushed before each call, CUDA events around
the call alone), or CUDA events around a graph replay divided by the operators in it. These files
are measurements, never fitted here: `llmperf.measure.fit_gemm --check` and `fit_attention` read them.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmperf.outputs import write_file

# (name, N, K): per-GPU projection shapes of models people serve (TP shards where named)
GEMM_SHAPES: tuple[tuple[str, int, int], ...] = (
    ("llama3-8b.qkv", 6144, 4096), ("llama3-8b.o", 4096, 4096), ("llama3-8b.gate_up", 28672, 4096),
    ("llama3-8b.down", 4096, 14336), ("llama3-70b-tp8.qkv", 1280, 8192), ("llama3-70b-tp8.o", 8192, 1024),
    ("llama3-70b-tp8.gate_up", 7168, 8192), ("llama3-70b-tp8.down", 8192, 3584),
    ("qwen3-32b-tp2.gate_up", 25600, 5120), ("qwen3-32b-tp2.down", 5120, 12800),
    ("mistral-7b.qkv", 6144, 4096), ("odd.5120x5120", 5120, 5120), ("lm_head-8b", 128256, 4096),
)
GEMM_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
QUICK_ROWS = (1, 16, 256, 4096)
# (name, groups, N, K): MoE experts, gate+up and down (per-expert widths of Qwen3-30B-A3B, DeepSeek-V3)
GROUPED_SHAPES = (("qwen3-30b-a3b.gate_up", 128, 1536, 2048), ("qwen3-30b-a3b.down", 128, 2048, 768),
                  ("deepseek-v3-ep8.gate_up", 32, 4096, 7168), ("deepseek-v3-ep8.down", 32, 7168, 2048))
GROUPED_ROWS = (1, 4, 16, 64, 256)


def _bench_s(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=40, return_mode="median")) * 1e-3


def _write(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows)", flush=True)


def measure_gemm(torch: Any, dev: Any, quick: bool) -> list[dict[str, Any]]:
    rows_list = QUICK_ROWS if quick else GEMM_ROWS
    out = []
    cap = torch.cuda.get_device_capability(dev)
    dtypes = [("bf16", torch.bfloat16), ("fp16", torch.float16)]
    fp8 = cap >= (8, 9) and hasattr(torch, "_scaled_mm")
    for name, n, k in GEMM_SHAPES:
        for dname, dt in dtypes:
            if dname == "fp16" and quick:
                continue
            w = torch.randn(n, k, device=dev, dtype=dt) * 0.02
            for m in rows_list:
                x = torch.randn(m, k, device=dev, dtype=dt)
                t = _bench_s(lambda: torch.nn.functional.linear(x, w))
                out.append(dict(shape=name, m=m, n=n, k=k, groups=1, dtype=dname, op="linear", time_s=t))
            w = None  # freed now (a `del` would unbind what the timed lambdas close over)
        if fp8:
            w8 = (torch.randn(n, k, device=dev) * 0.02).to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev, dtype=torch.float32)
            for m in rows_list:
                mm = max(16, m)  # _scaled_mm needs every dimension a multiple of 16
                x8 = torch.randn(mm, k, device=dev).to(torch.float8_e4m3fn)
                try:
                    t = _bench_s(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16))
                except RuntimeError as exc:  # an unsupported layout: say so once, go on
                    print(f"fp8 {name} m={mm}: {str(exc).splitlines()[0]}", flush=True)
                    break
                out.append(dict(shape=name, m=mm, n=n, k=k, groups=1, dtype="fp8", op="scaled_mm", time_s=t))
            del w8
        torch.cuda.empty_cache()
        print(f"gemm {name}: done", flush=True)
    for name, g, n, k in GROUPED_SHAPES:
        w = torch.randn(g, k, n, device=dev, dtype=torch.bfloat16) * 0.02
        for m in (GROUPED_ROWS[:3] if quick else GROUPED_ROWS):
            x = torch.randn(g, m, k, device=dev, dtype=torch.bfloat16)
            t = _bench_s(lambda: torch.bmm(x, w))
            out.append(dict(shape=name, m=m, n=n, k=k, groups=g, dtype="bf16", op="bmm", time_s=t))
        w = None  # freed now (a `del` would unbind what the timed lambdas close over)
        torch.cuda.empty_cache()
    return out


def measure_attention(torch: Any, dev: Any, quick: bool) -> list[dict[str, Any]]:
    F = torch.nn.functional
    out = []
    heads = 32
    bf16 = torch.bfloat16

    def backend_of(q: Any, k: Any, v: Any, causal: bool) -> str:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            try:
                with sdpa_kernel([b]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                return b.name.lower()
            except RuntimeError:
                continue
        return "math"

    prefill_ctx = (1024, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    for hd in ((128,) if quick else (64, 128, 256)):
        for kvh in ((8,) if quick else (32, 8, 4)):
            for ctx in prefill_ctx:
                q = torch.randn(1, heads, ctx, hd, device=dev, dtype=bf16)
                k = torch.randn(1, kvh, ctx, hd, device=dev, dtype=bf16)
                v = torch.randn_like(k)
                impl = backend_of(q, k, v, True)
                t = _bench_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
                out.append(dict(phase="prefill", batch=1, q_len=ctx, context=ctx, heads=heads, kv_heads=kvh,
                                head_dim=hd, dtype="bf16", impl=f"sdpa-{impl}", time_s=t))
                q = k = v = None  # freed now (a `del` would unbind what the timed lambdas close over)
    decode_b = (1, 32) if quick else (1, 8, 32, 64)
    decode_ctx = (2048, 32768) if quick else (512, 2048, 8192, 32768)
    for hd in ((128,) if quick else (64, 128, 256)):
        for kvh in ((8,) if quick else (32, 8)):
            for b in decode_b:
                for ctx in decode_ctx:
                    if b * ctx * kvh * hd * 2 * 2 > 24e9:  # K + V over 24 GB: skip
                        continue
                    q = torch.randn(b, heads, 1, hd, device=dev, dtype=bf16)
                    k = torch.randn(b, kvh, ctx, hd, device=dev, dtype=bf16)
                    v = torch.randn_like(k)
                    impl = backend_of(q, k, v, False)
                    t = _bench_s(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                    out.append(dict(phase="decode", batch=b, q_len=1, context=ctx, heads=heads, kv_heads=kvh,
                                    head_dim=hd, dtype="bf16", impl=f"sdpa-{impl}", time_s=t))
                    q = k = v = None  # freed now (a `del` would unbind what the timed lambdas close over)
            torch.cuda.empty_cache()
        print(f"attention head_dim {hd}: done", flush=True)
    return out


def _graph_time_s(torch: Any, fn: Callable[[], Any], copies: int, replays: int = 20) -> float:
    """Device seconds of one `fn` call: `copies` calls captured in one CUDA graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(copies):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / copies)
    times.sort()
    return times[len(times) // 2]


def _kernels_per_call(torch: Any, fn: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def measure_small_ops(torch: Any, dev: Any, quick: bool) -> list[dict[str, Any]]:
    F = torch.nn.functional
    out = []
    bf16 = torch.bfloat16
    for hidden in (4096, 8192):
        wn = torch.ones(hidden, device=dev, dtype=bf16)
        for rows in ((1, 256, 8192) if quick else (1, 4, 16, 64, 256, 1024, 4096, 16384)):
            x = torch.randn(rows, hidden, device=dev, dtype=bf16)
            y = torch.randn_like(x)
            gu = torch.randn(rows, 2 * hidden, device=dev, dtype=bf16)
            cos = torch.randn(rows, hidden // 2, device=dev, dtype=bf16)
            e = x.element_size()
            ops = {
                "add": (lambda: x + y, 3 * rows * hidden * e),
                "copy": (lambda: x.clone(), 2 * rows * hidden * e),
                "rms_norm": (lambda: F.rms_norm(x, (hidden,), wn, 1e-6), 2 * rows * hidden * e),
                "silu_mul": (lambda: F.silu(gu[:, :hidden]) * gu[:, hidden:], 3 * rows * hidden * e),
                "rotate": (lambda: torch.cat((x[:, : hidden // 2] * cos - x[:, hidden // 2:] * cos,
                                              x[:, hidden // 2:] * cos + x[:, : hidden // 2] * cos), -1),
                           2 * rows * hidden * e),
            }
            for name, (fn, nbytes) in ops.items():
                t = _graph_time_s(torch, fn, copies=20)
                out.append(dict(op=name, rows=rows, hidden=hidden, bytes=nbytes, kernels=_kernels_per_call(torch, fn),
                                dtype="bf16", device_time_s=t))
            x = y = gu = cos = None  # freed now (a `del` would unbind what the timed lambdas close over)
        print(f"small ops hidden {hidden}: done", flush=True)
    return out


def measure_launch(torch: Any, dev: Any) -> list[dict[str, Any]]:
    import time

    x = torch.zeros(1, device=dev)
    out = []
    for _ in range(3):  # eager: the host's launch rate on a tiny kernel (the device keeps up)
        n = 2000
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        torch.cuda.synchronize()
        out.append(dict(what="eager_tiny_kernel", value_s=(time.perf_counter() - t0) / n))
    out.append(dict(what="graph_tiny_kernel_device", value_s=_graph_time_s(torch, lambda: x.add_(1.0), copies=200)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1.0)
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    out.append(dict(what="graph_launch_one_kernel", value_s=(time.perf_counter() - t0) / n))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmperf.measure.gpu_terms", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--quick", action="store_true", help="a few shapes of each (a smoke run)")
    p.add_argument("--only", default="launch,small_ops,gemm,attention", help="comma-separated parts")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_terms: no CUDA device (this measures a GPU)", file=sys.stderr)
        return 2
    from llmperf.measure.device import describe_cuda, versions

    dev = torch.device("cuda")
    a.out.mkdir(parents=True, exist_ok=True)
    meta = dict(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), device=describe_cuda(0),
                versions=versions(), quick=a.quick)
    write_file(a.out / "meta.json", json.dumps(meta, indent=1, default=str) + "\n", "--out")
    parts = a.only.split(",")
    if "launch" in parts:
        _write(a.out / "launch.csv", measure_launch(torch, dev))
    if "small_ops" in parts:
        _write(a.out / "small_ops.csv", measure_small_ops(torch, dev, a.quick))
    if "gemm" in parts:
        _write(a.out / "gemm.csv", measure_gemm(torch, dev, a.quick))
    if "attention" in parts:
        _write(a.out / "attention.csv", measure_attention(torch, dev, a.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
