"""Attention as the engine runs it, and on CUDA the fused-attention shape model's sweep.

`measure_attention`: per dtype, with `Settings.attn_group` query heads per KV head, decode through
the engine's `sdpa_decode` (a large KV cache cycled through copies, memory-bound by construction;
on a CPU at `Settings.attn_decode_groups` too, for `fit_decode_groups`) and causal prefill squares
through `torch.nn.functional.scaled_dot_product_attention` (`enable_gqa`). `measure_attention_shapes`
/ `fit_attention_shapes`: SDPA over real shapes on a GPU, fitted as `llmperf.analysis.attention_eff`
(`llmperf.measure.fit_attention`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmperf.analysis.operators import attention_cost
from llmperf.measure.calibrate.ceilings import _in_turn, copies_for, working_set_for
from llmperf.measure.calibrate.points import ComputePoint
from llmperf.measure.calibrate.settings import DTYPE_NAMES, Progress, Settings
from llmperf.measure.timers import time_fn
from llmperf.specs.local import CALIBRATION_TOOL

if TYPE_CHECKING:
    from llmperf.measure.calibrate.calibration import Calibration


def measure_attention(s: Settings, device: Any, progress: Progress) -> list[ComputePoint]:
    """Attention per dtype as the engine's `sdpa` backend runs it, with `s.attn_group` query heads per
    KV head: decode (one query per sequence over a KV cache through `attention.sdpa_decode`, llmperf's
    own kernel on a CPU that runs them, else SDPA with the group folded into the query axis; copies
    used in turn to fill the working set, memory-bound by construction) and causal prefill squares
    (SDPA, `enable_gqa`). On this CPU SDPA's folded group read the cache at 17 GB/s in fp32 against
    23-27 GB/s for one query per head (measured 2026-11-23): a calibration with one query per head
    priced the engine's decode attention 1.5x fast. What the engine runs is what is timed.
    On a CPU each decode point is timed again right after at each of `s.attn_decode_groups` (the same
    KV heads and cache copies, `H_kv x group` query heads: the same bytes, FLOPs x group), which
    `fit_decode_groups` turns into a cost per byte that grows with the group."""
    import torch

    out = []
    H, D, G = s.attn_heads, s.attn_head_dim, s.attn_group
    H_kv = H // G  # `Settings` checked that G divides H
    groups = s.decode_groups if getattr(device, "type", str(device)) == "cpu" else (G,)
    working_set = working_set_for(s, device)
    for dname in s.dtypes:
        dtype = getattr(torch, DTYPE_NAMES[dname])
        elem = torch.empty((), dtype=dtype).element_size()
        shapes = [(b, 1, t) for b, t in s.attn_decode] + [(1, t, t) for t in s.attn_prefill]
        failed = False
        for batch, q_len, kv_len in shapes:
            decode = q_len == 1
            copies = copies_for(2 * batch * H_kv * kv_len * D * elem, working_set) if decode else 1
            kvs = [(torch.randn(batch, H_kv, kv_len, D, device=device, dtype=dtype),
                    torch.randn(batch, H_kv, kv_len, D, device=device, dtype=dtype)) for _ in range(copies)]
            for g in groups if decode else (G,):
                progress(f"attention {dname} B={batch} q={q_len} kv={kv_len}" + (f" G={g}" if g != G else ""))
                point = _time_attention(kvs, batch, q_len, kv_len, H_kv * g, D, dname, elem, s.reps, device)
                if point is None:
                    failed = True
                    break
                out.append(point)
            del kvs
            if failed:
                break
    return out


def _time_attention(kvs: list[Any], batch: int, q_len: int, kv_len: int, H: int, D: int, dname: str, elem: int,
                    reps: int, device: Any) -> ComputePoint | None:
    """One attention point of `H` query heads over the KV copies `kvs` (each `(K, V)`, `(B, H_kv, S, D)`,
    used in turn): decode through `sdpa_decode`, a prefill square through SDPA; None where torch
    cannot run it (out of memory)."""
    import torch
    import torch.nn.functional as F

    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta

    dtype, H_kv, copies = kvs[0][0].dtype, kvs[0][0].shape[1], len(kvs)
    decode = q_len == 1
    # decode: (B, H, D) through the engine's own decode path; prefill: (B, H, T, D)
    q = torch.randn(*((batch, H, D) if decode else (batch, H, q_len, D)), device=device, dtype=dtype)
    if decode:
        meta, scale = StepMeta.decode(batch, kv_len, device), D ** -0.5
        fn = _in_turn([lambda kk=kk, vv=vv: sdpa_decode(q, kk, vv, meta, scale) for kk, vv in kvs])
    else:
        fn = _in_turn([lambda kk=kk, vv=vv: F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                                           enable_gqa=H > H_kv)
                       for kk, vv in kvs])
    try:
        t = time_fn(fn, device, reps=max(reps, copies), warmup=copies)
    except RuntimeError:
        return None
    cost = attention_cost(batch, q_len, kv_len, num_heads=H, num_kv_heads=H_kv, head_dim=D, act_bytes=elem,
                          kv_bytes=elem, impl="fused", causal=True)
    return ComputePoint(op="attention", dtype=dname, rows=batch * q_len,
                        shape=f"B={batch} H={H} H_kv={H_kv} q={q_len} kv={kv_len} D={D}"
                        + (f" x{copies} in turn" if copies > 1 else ""), seconds=t.min_s,
                        median_s=t.median_s, memory_bound=decode, spread_s=t.spread_s, n=t.n,
                        flops=float(cost.flops), bytes=float(cost.bytes_total), group=H // H_kv)


def measure_attention_shapes(device: Any, progress: Progress) -> list[dict[str, Any]]:
    """CUDA: SDPA (bf16, causal prefill and one-token decode) over head dims 64 and 128, MHA and 4
    query heads per KV head, contexts 512-32k and batches 1-64 (`llmperf.measure.gpu_terms`): what the
    fused-attention shape model (`llmperf.analysis.attention_eff`) is fitted on for this device."""
    import torch
    import torch.nn.functional as F

    from llmperf.measure.gpu_terms import _bench_s

    out: list[dict[str, Any]] = []
    heads, bf16 = 32, torch.bfloat16
    for hd in (64, 128):
        progress(f"attention shapes, head dim {hd}")
        for kvh in (32, 8):
            for phase, batch, ctx in ([("prefill", 1, c) for c in (512, 2048, 8192)]
                                      + [("decode", b, c) for b in (1, 8, 64) for c in (512, 4096, 32768)]):
                q_len = ctx if phase == "prefill" else 1
                if batch * ctx * kvh * hd * 4 > 8e9:  # K + V over 8 GB
                    continue
                q = torch.randn(batch, heads, q_len, hd, device=device, dtype=bf16)
                k = torch.randn(batch, kvh, ctx, hd, device=device, dtype=bf16)
                v = torch.randn_like(k)
                t = _bench_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=phase == "prefill",
                                                                    enable_gqa=True))
                out.append(dict(phase=phase, batch=batch, q_len=q_len, context=ctx, heads=heads, kv_heads=kvh,
                                head_dim=hd, dtype="bf16", impl="sdpa", time_s=t))
                q = k = v = None  # freed now (a `del` would unbind what the timed lambdas close over)
    return out


def fit_attention_shapes(cal: Calibration) -> dict[str, Any] | None:
    """The fused-attention shape model's terms fitted on `cal.attention_shapes` against the calibration's
    own ceilings (bf16 peak, bandwidth, SMs); None without points."""
    if not cal.attention_shapes or cal.peak_flops_per_s("bf16") <= 0:
        return None
    import pandas as pd

    from llmperf.measure.fit_attention import fit, sweep_frame

    sms = int(cal.device.get("sms") or (cal.datasheet.num_sms if cal.datasheet else 132))
    df = sweep_frame(pd.DataFrame(cal.attention_shapes), "calibrate")
    terms = fit(df, (cal.peak_flops_per_s("bf16"), cal.memory_bytes_per_s(), sms)).to_dict()
    return dict(terms, source=f"{CALIBRATION_TOOL}, {cal.created}: SDPA over {len(df)} shapes")
