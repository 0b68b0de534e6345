"""Benchmark the attention kernels against the roofline: `python -m llmperf.measure.kernel_bench`.

Options: `[--out DIR] [--dtype bf16|fp16] [--hardware NAME] [--quick] [--dry-run] [--ops mla,decode,...]`.

On a CUDA device, times each kernel with `triton.testing.do_bench` (median; L2 flushed between runs)
over Llama-3-8B-like attention (32 query / 8 KV heads, head dim 128), batch 1..64, context 512..32k:
  prefill  flash_attention vs torch SDPA vs naive attention (causal, T_q = T_kv);
  decode   flash_decoding  vs torch SDPA vs naive decode (uniform and ragged lengths);
  paged    paged_attention vs gather + SDPA (`paged_decode_reference`), block size 16;
  mla      mla_decode vs the torch reference (`mla_decode_reference`) on DeepSeek-V3's absorbed latent
           attention (R=512, Dr=64; 128 heads, or 16 at TP 8), block size 64, context 1k..32k;
and today's local attention at its own shapes: gpt-oss (sinks, sliding window 128; OpenAI's gpt-oss
model card, 2025) and Llama 4 (chunked layers of 8192 tokens).
For each it reports time, achieved TFLOP/s and GB/s, their fractions of the device's dense peak and
memory bandwidth, `roofline time / measured time`, and, for decode, GB/s as a fraction of the measured
copy bandwidth. FLOPs and bytes come from `llmperf.analysis.attention_cost` (MLA's from
`ForwardModel.attention_ops` of the DeepSeek-V3 spec, absorbed). Results go to a rich table and to
`<out>/kernels.json` and `<out>/kernels.csv` (device, versions and date included).

Targets on an H100 SXM (reported, never asserted): decode kernels >= 70% of copy bandwidth when
batch x context >= 64k tokens; prefill >= 40% of dense bf16 peak at context >= 4k and faster than
torch SDPA's default backend at the same shape. The shapes in full: docs/kernels.md.

Letters: B batch, H query heads, H_kv KV heads, D head dim, T context (tokens per sequence); MLA: R latent
width (kv_lora_rank), Dr rotary width (qk_rope_head_dim).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as dt
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmperf.analysis import ForwardModel, OpCost, attention_cost, roofline_time_s
from llmperf.specs import HardwareSpec, Precision, load_hardware, load_model, match_hardware

H, H_KV, HEAD_DIM = 32, 8, 128  # Llama-3-8B attention
BLOCK_SIZE = 16  # paged cache block (vLLM's default)
DECODE_TARGET_TOKENS = 64 * 1024  # batch x context from which the decode bandwidth target applies
DECODE_TARGET_COPY_FRACTION = 0.70
PREFILL_TARGET_CONTEXT = 4096
PREFILL_TARGET_PEAK_FRACTION = 0.40
NAIVE_MEMORY_FRACTION = 0.5  # skip naive attention when S, P and the fp32 softmax exceed this share of free memory
COPY_BYTES = 1 << 30  # each side of the copy-bandwidth measurement
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
MLA_MODEL = "deepseek-v3"  # the MLA shapes' model spec (R=512, Dr=64, 128 heads)
MLA_BLOCK_SIZE = 64  # FlashMLA's page size
MLA_TPS = (1, 8)  # all heads on one GPU; 16 per GPU at tensor parallelism 8


@dataclass(frozen=True, kw_only=True)
class Case:
    """One benchmark shape. `lens` lists per-sequence contexts for a ragged decode batch (else all `context`).
    `model` names whose attention shape it is (default Llama-3-8B's), with its window, chunk or sinks."""

    op: str  # "prefill" | "decode" | "paged" | "mla"
    batch: int
    context: int
    lens: tuple[int, ...] = ()
    causal: bool = True
    model: str = ""
    heads: int = H
    kv_heads: int = H_KV
    head_dim: int = HEAD_DIM
    window: int | None = None
    chunk: int | None = None
    sinks: bool = False

    @property
    def features(self) -> str:
        """"" for plain causal attention, else e.g. "gpt-oss window=128 sinks"."""
        parts = [self.model] if self.model else []
        parts += [f"window={self.window}"] if self.window else []
        parts += [f"chunk={self.chunk}"] if self.chunk else []
        return " ".join(parts + (["sinks"] if self.sinks else []))
    tp: int = 1  # MLA: the heads are those of one GPU of a tp-way group

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return self.lens or (self.context,) * self.batch

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def label(self) -> str:
        ragged = " ragged" if self.lens else ""
        tp = f" TP={self.tp}" if self.tp > 1 else ""
        features = f" ({self.features})" if self.features else ""
        return f"{self.op} B={self.batch} T={self.context}{ragged}{tp}{features}"


# Local attention at its models' shapes: gpt-oss's sliding layers (its full layers keep the sinks) and
# Llama 4's chunked layers.
GPT_OSS = dict(model="gpt-oss", heads=64, kv_heads=8, head_dim=64, sinks=True)
LLAMA_4 = dict(model="llama-4", heads=40, kv_heads=8, head_dim=128, chunk=8192)


def ragged_lens(batch: int, context: int, seed: int = 0) -> tuple[int, ...]:
    """Lengths spread uniformly over [context / 2, context], the longest equal to `context`."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(context // 2, context + 1, size=batch)
    lens[0] = context
    return tuple(int(n) for n in lens)


def cases(quick: bool = False) -> list[Case]:
    """The shape list. `quick` keeps one prefill, decode and paged shape per regime (for smoke runs)."""
    prefill_shapes = [(1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (1, 16384), (1, 32768), (4, 4096),
                      (16, 1024)]
    decode_shapes = [(b, t) for b in (1, 8, 32, 64) for t in (512, 4096, 32768)]
    if quick:
        prefill_shapes = [(1, 1024), (1, 4096)]
        decode_shapes = [(1, 4096), (64, 4096)]
    out = [Case(op="prefill", batch=b, context=t) for b, t in prefill_shapes]
    for op in ("decode", "paged"):
        out += [Case(op=op, batch=b, context=t) for b, t in decode_shapes]
        out += [Case(op=op, batch=b, context=t, lens=ragged_lens(b, t)) for b, t in ((8, 4096), (32, 32768))
                if not quick]
    return out + local_cases(quick) + mla_cases(quick)


def local_cases(quick: bool = False) -> list[Case]:
    """gpt-oss (window 128 and sinks; sinks alone for its full layers) and Llama 4 (chunk 8192) shapes."""
    if quick:
        return [Case(op="decode", batch=64, context=8192, window=128, **GPT_OSS),
                Case(op="prefill", batch=1, context=16384, **LLAMA_4)]
    out = [Case(op="prefill", batch=1, context=t, window=128, **GPT_OSS) for t in (4096, 16384)]
    out += [Case(op=op, batch=b, context=t, window=128, **GPT_OSS)
            for op in ("decode", "paged") for b, t in ((1, 32768), (64, 8192))]
    out += [Case(op="decode", batch=64, context=8192, **GPT_OSS)]
    out += [Case(op="prefill", batch=1, context=t, **LLAMA_4) for t in (16384, 32768)]
    out += [Case(op=op, batch=b, context=t, **LLAMA_4)
            for op in ("decode", "paged") for b, t in ((1, 32768), (32, 16384))]
    return out


def mla_cases(quick: bool = False) -> list[Case]:
    """MLA decode shapes: batch 1..64 x context 1k..32k at each of MLA_TPS (quick: one per tp)."""
    shapes = [(1, 4096)] if quick else [(b, t) for b in (1, 8, 32, 64) for t in (1024, 4096, 32768)]
    return [Case(op="mla", batch=b, context=t, tp=tp) for tp in MLA_TPS for b, t in shapes]


def _sum_cost(cost: OpCost, n: int) -> OpCost:
    """Collapse a cost evaluated at n per-sequence lengths into one. Counts that do not depend on the
    length (Q and O bytes) come back as scalars, so every field is broadcast to n entries first."""
    counts = {f.name: float(np.sum(np.broadcast_to(getattr(cost, f.name), (n,)))) for f in dataclasses.fields(OpCost)
              if f.name not in ("name", "kind", "per_layer", "layer", "compute_dtype", "comm_gpus", "gemm", "attn",
                                 "experts")}
    return OpCost(name=cost.name, kind=cost.kind, per_layer=cost.per_layer, layer=cost.layer,
                  compute_dtype=cost.compute_dtype, comm_gpus=cost.comm_gpus, **counts)


def case_cost(case: Case, impl: str, elem_bytes: float) -> OpCost:
    """FLOPs and bytes of `case` from `llmperf.analysis` ("fused" or "naive"), summed over sequences."""
    if case.op == "mla":
        return mla_case_cost(case, impl, elem_bytes)
    common = dict(num_heads=case.heads, num_kv_heads=case.kv_heads, head_dim=case.head_dim, act_bytes=elem_bytes,
                  kv_bytes=elem_bytes, impl=impl, causal=case.causal, window=case.window, chunk=case.chunk,
                  sinks=case.sinks)
    if case.op == "prefill":
        return attention_cost(case.batch, case.context, case.context, **common)
    lens = np.asarray(case.seq_lens, dtype=float)
    return _sum_cost(attention_cost(1, 1, lens, **common), len(lens))


def mla_forward_model(case: Case, impl: str, elem_bytes: float) -> ForwardModel:
    """MLA_MODEL on one GPU of `case.tp`, absorbed, at `elem_bytes` per element (2: bf16 and fp16 alike)."""
    dtype = {2: "bf16", 4: "fp32"}[int(elem_bytes)]
    return ForwardModel(model=load_model(MLA_MODEL), precision=Precision.uniform(dtype), attention=impl,
                        tp=case.tp, mla_mode="absorbed")


def mla_case_cost(case: Case, impl: str, elem_bytes: float) -> OpCost:
    """The absorbed attention core's operators (fused: one; naive: score, softmax, value) at each
    sequence's length, summed."""
    lens = np.asarray(case.seq_lens, dtype=float)
    parts = [_sum_cost(op, len(lens)) for op in mla_forward_model(case, impl, elem_bytes).attention_ops(1, 1, lens)]
    if len(parts) == 1:
        return parts[0]
    total = {f: sum(getattr(p, f) for p in parts) for f in
             ("flops", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")}
    return OpCost(name="attention", kind="attention", rows=case.batch, **total)


@dataclass(frozen=True, kw_only=True)
class Row:
    """One timed (case, implementation). Fractions are NaN when the device has no spec or no copy figure."""

    op: str
    impl: str
    batch: int
    context: int
    ragged: bool
    tokens: int
    time_s: float
    flops: float
    bytes: float
    tflops_per_s: float
    gb_per_s: float
    peak_fraction: float  # achieved FLOP/s / dense peak
    bandwidth_fraction: float  # achieved B/s / spec memory bandwidth
    roofline_fraction: float  # roofline time / measured time
    copy_fraction: float  # achieved B/s / measured copy bandwidth
    max_rel_error: float = float("nan")  # against torch SDPA (naive where SDPA has no sinks; MLA: the torch reference)
    note: str = ""
    tp: int = 1  # MLA: tensor parallelism the heads are split by
    features: str = ""  # `Case.features`: whose window, chunk or sinks ("" for plain causal attention)


def make_row(case: Case, impl: str, cost: OpCost, time_s: float, hw: HardwareSpec | None, dtype: str,
             copy_bytes_per_s: float, *, max_rel_error: float = float("nan"), note: str = "") -> Row:
    flop_rate = cost.flops / time_s
    byte_rate = cost.bytes_total / time_s
    nan = float("nan")
    return Row(
        op=case.op, impl=impl, batch=case.batch, context=case.context, ragged=bool(case.lens), tokens=case.tokens,
        time_s=time_s, flops=float(cost.flops), bytes=float(cost.bytes_total),
        tflops_per_s=flop_rate / 1e12, gb_per_s=byte_rate / 1e9,
        peak_fraction=flop_rate / hw.peak_flops_per_s(dtype) if hw else nan,
        bandwidth_fraction=byte_rate / hw.mem_bandwidth_bytes_per_s if hw else nan,
        roofline_fraction=float(roofline_time_s(cost, hw, dtype)) / time_s if hw else nan,
        copy_fraction=byte_rate / copy_bytes_per_s if copy_bytes_per_s > 0 else nan,
        max_rel_error=max_rel_error, note=note, tp=case.tp, features=case.features,
    )


def skipped_row(case: Case, impl: str, cost: OpCost, note: str) -> Row:
    nan = float("nan")
    return Row(op=case.op, impl=impl, batch=case.batch, context=case.context, ragged=bool(case.lens),
               tokens=case.tokens, time_s=nan, flops=float(cost.flops), bytes=float(cost.bytes_total),
               tflops_per_s=nan, gb_per_s=nan, peak_fraction=nan, bandwidth_fraction=nan, roofline_fraction=nan,
               copy_fraction=nan, note=note, tp=case.tp, features=case.features)


@dataclass(frozen=True, kw_only=True)
class Meta:
    device: str
    hardware: str  # the llmperf spec the fractions use, or "" when none matched
    dtype: str
    torch: str
    triton: str
    cuda: str
    date: str
    copy_gb_per_s: float


def targets(rows: Sequence[Row]) -> list[str]:
    """One line per target check (report only): decode bandwidth and prefill peak / SDPA speed-up."""
    lines = []
    sdpa = {(r.op, r.batch, r.context, r.ragged): r for r in rows if r.impl == "sdpa" and not r.features}
    for r in rows:
        if math.isnan(r.time_s) or r.features:  # the targets are for Llama-3-8B's plain attention
            continue
        if r.impl in ("flash_decoding", "paged_attention") and r.tokens >= DECODE_TARGET_TOKENS:
            ok = r.copy_fraction >= DECODE_TARGET_COPY_FRACTION
            lines.append(f"{'met ' if ok else 'MISS'} {r.impl} B={r.batch} T={r.context}: "
                         f"{r.copy_fraction:.0%} of copy bandwidth (target {DECODE_TARGET_COPY_FRACTION:.0%})")
        if r.impl == "flash_attention" and r.context >= PREFILL_TARGET_CONTEXT:
            base = sdpa.get((r.op, r.batch, r.context, r.ragged))
            faster = base is not None and not math.isnan(base.time_s) and r.time_s < base.time_s
            ok = r.peak_fraction >= PREFILL_TARGET_PEAK_FRACTION and faster
            speedup = f"{base.time_s / r.time_s:.2f}x SDPA" if base and not math.isnan(base.time_s) else "no SDPA"
            lines.append(f"{'met ' if ok else 'MISS'} flash_attention B={r.batch} T={r.context}: "
                         f"{r.peak_fraction:.0%} of peak (target {PREFILL_TARGET_PEAK_FRACTION:.0%}), {speedup}")
    return lines


def render_table(rows: Sequence[Row], meta: Meta):
    """A rich Table of the rows (one line each)."""
    from rich.table import Table

    table = Table(title=f"attention kernels on {meta.device} ({meta.dtype}, copy {meta.copy_gb_per_s:.0f} GB/s)")
    for col in ("op", "B", "T", "impl", "time ms", "TFLOP/s", "GB/s", "% peak", "% BW", "% roofline", "% copy",
                "rel err", "note"):
        table.add_column(col, justify="left" if col in ("op", "impl", "note") else "right")

    def pct(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.0%}"

    def num(x: float, fmt: str) -> str:
        return "-" if math.isnan(x) else format(x, fmt)

    for r in rows:
        table.add_row(
            r.op + (" ragged" if r.ragged else "") + (f" TP={r.tp}" if r.tp > 1 else "")
            + (f" ({r.features})" if r.features else ""), str(r.batch), str(r.context), r.impl,
            num(r.time_s * 1e3, ".3f"), num(r.tflops_per_s, ".1f"), num(r.gb_per_s, ".0f"),
            pct(r.peak_fraction), pct(r.bandwidth_fraction), pct(r.roofline_fraction), pct(r.copy_fraction),
            num(r.max_rel_error, ".1e"), r.note,
        )
    return table


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Build the text with `write(file)`, then write it through `llmperf.outputs` (atomically)."""
    import io

    from llmperf.outputs import write_file
    buf = io.StringIO(newline="")
    write(buf)
    write_file(path, buf.getvalue(), "--out")


def save(rows: Sequence[Row], meta: Meta, out_dir: Path) -> tuple[Path, Path]:
    """`kernels.json` ({"meta": ..., "rows": [...]}) and `kernels.csv` (one row each, meta columns repeated)."""
    from llmperf.outputs import check_dir, json_text, write_file
    check_dir(out_dir, "--out").create()
    meta_d = dataclasses.asdict(meta)
    row_ds = [dataclasses.asdict(r) for r in rows]

    json_path, csv_path = out_dir / "kernels.json", out_dir / "kernels.csv"
    write_file(json_path, json_text({"meta": meta_d, "rows": row_ds}, indent=1), "--out")  # NaN -> null

    def write_csv(f: Any) -> None:
        names = list(meta_d) + [n for n in (row_ds[0] if row_ds else {}) if n not in meta_d]
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for r in row_ds:
            writer.writerow({**meta_d, **r})

    _atomic_write(csv_path, write_csv)
    return json_path, csv_path


def load(out_dir: Path) -> tuple[list[Row], Meta]:
    """Read back a folder written by `save` (e.g. `reports/kernels/2026-11-23-h100/`): rows and meta."""
    data = json.loads((Path(out_dir) / "kernels.json").read_text())
    meta = Meta(**data["meta"])

    def restore(r: dict[str, Any]) -> Row:
        return Row(**{k: (float("nan") if v is None else v) for k, v in r.items()})

    return [restore(r) for r in data["rows"]], meta


# --- CUDA-only part -------------------------------------------------------------------------------


def _bench_ms(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def copy_bandwidth_bytes_per_s(device) -> float:
    """Device-to-device `copy_` of COPY_BYTES: read + written bytes / median time."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _bench_ms(lambda: dst.copy_(src))
    src = dst = None  # freed now (a `del` would unbind what the timed lambdas close over)
    return 2 * COPY_BYTES / (ms * 1e-3)


def _rel_error(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _naive_fits(case: Case, elem_bytes: int) -> tuple[bool, str]:
    """Naive attention materialises S, its fp32 softmax and P: does that fit in free memory?"""
    import torch

    free, _ = torch.cuda.mem_get_info()
    scores = case.batch * case.heads * (case.context if case.op == "prefill" else 1) * case.context
    need = scores * (2 * elem_bytes + 4)
    if need > NAIVE_MEMORY_FRACTION * free:
        return False, f"naive skipped: S and P need {need / 2**30:.0f} GiB"
    return True, ""


def _make_inputs(case: Case, dtype, device):
    """Tensors for `case`: prefill (q, k, v); decode (q, k_cache, v_cache, seq_lens); paged adds the pool;
    plus the case's window, chunk and sinks (H,) when it has them."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    B, T = case.batch, case.context
    if case.op == "mla":
        return _mla_inputs(case, device, randn)
    Hq, Hkv, D = case.heads, case.kv_heads, case.head_dim
    features = {name: value for name, value in (("window", case.window), ("chunk", case.chunk)) if value}
    if case.sinks:
        features["sinks"] = randn(Hq)
    if case.op == "prefill":
        return dict(q=randn(B, Hq, T, D), k=randn(B, Hkv, T, D), v=randn(B, Hkv, T, D), **features)
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
    q = randn(B, Hq, D)
    if case.op == "decode":
        return dict(q=q, k_cache=randn(B, Hkv, T, D), v_cache=randn(B, Hkv, T, D), seq_lens=seq_lens, **features)
    blocks_per_seq = -(-T // BLOCK_SIZE)
    num_blocks = B * blocks_per_seq
    perm = torch.randperm(num_blocks, generator=g, device=device).to(torch.int32)
    return dict(q=q, key_blocks=randn(num_blocks, BLOCK_SIZE, Hkv, D),
                value_blocks=randn(num_blocks, BLOCK_SIZE, Hkv, D),
                block_tables=perm.view(B, blocks_per_seq), seq_lens=seq_lens, **features)


def _mla_inputs(case: Case, device, randn) -> dict:
    """mla_decode's arguments for `case`: MLA_MODEL's widths and heads per GPU, a shuffled pool of blocks."""
    import torch

    fm = mla_forward_model(case, "fused", 2)
    m, H_gpu = fm.model, fm.dims.num_heads
    R, Dr = m.kv_lora_rank, m.qk_rope_head_dim
    B, T = case.batch, case.context
    blocks_per_seq = -(-T // MLA_BLOCK_SIZE)
    num_blocks = B * blocks_per_seq
    perm = torch.randperm(num_blocks, device=device).to(torch.int32)
    return dict(q_latent=randn(B, H_gpu, R), q_rope=randn(B, H_gpu, Dr),  # (B, H, R), (B, H, Dr)
                latent_blocks=randn(num_blocks, MLA_BLOCK_SIZE, R + Dr),  # (N_blk, P, R + Dr)
                block_tables=perm.view(B, blocks_per_seq),  # (B, M_blk)
                seq_lens=torch.tensor(case.seq_lens, dtype=torch.int32, device=device),
                sm_scale=m.mla_q_head_dim**-0.5)


def _implementations(case: Case, x: dict) -> dict[str, tuple[str, Callable[[], Any]]]:
    """impl name -> (cost model impl, zero-argument call) for `case`. The first entry is the Triton kernel;
    SDPA, which has no sinks, is left out of the cases with sinks (the paged one gathers into naive)."""
    import kernels

    if case.op == "mla":
        return {
            "mla_decode": ("fused", lambda: kernels.mla_decode(**x, validate=False)),
            "torch": ("naive", lambda: kernels.mla_decode_reference(**x, validate=False)),
        }
    f = {name: x[name] for name in ("window", "chunk", "sinks") if name in x}  # the case's features
    masks = {name: x[name] for name in ("window", "chunk") if name in x}  # what SDPA can take, as a mask
    if case.op == "prefill":
        q, k, v = x["q"], x["k"], x["v"]
        impls = {
            "flash_attention": ("fused", lambda: kernels.flash_attention(q, k, v, case.causal, **f)),
            "sdpa": ("fused", lambda: kernels.sdpa_attention(q, k, v, case.causal, **masks)),
            "naive": ("naive", lambda: kernels.naive_attention(q, k, v, case.causal, **f)),
        }
    elif case.op == "decode":
        q, kc, vc, lens = x["q"], x["k_cache"], x["v_cache"], x["seq_lens"]
        if case.lens or masks:  # ragged, window or chunk: SDPA needs a mask
            sdpa = lambda: kernels.sdpa_decode(q, kc, vc, lens, validate=False, **masks)  # noqa: E731
        else:  # uniform: the mask-free call lets SDPA pick its fastest backend
            sdpa = lambda: kernels.sdpa_attention(q[:, :, None], kc, vc, False)[:, :, 0]  # noqa: E731
        impls = {
            "flash_decoding": ("fused", lambda: kernels.flash_decoding(q, kc, vc, lens, validate=False, **f)),
            "sdpa": ("fused", sdpa),
            "naive": ("naive", lambda: kernels.naive_decode(q, kc, vc, lens, validate=False, **f)),
        }
    else:
        args = (x["q"], x["key_blocks"], x["value_blocks"], x["block_tables"], x["seq_lens"])
        gather = "gather+naive" if case.sinks else "gather+sdpa"
        return {
            "paged_attention": ("fused", lambda: kernels.paged_attention(*args, validate=False, **f)),
            gather: ("fused", lambda: kernels.paged_decode_reference(*args, impl=gather[7:], validate=False, **f)),
        }
    if case.sinks:
        del impls["sdpa"]
    return impls


def bench_case(case: Case, dtype_name: str, hw: HardwareSpec | None, copy_bps: float, device) -> list[Row]:
    """Time every implementation of `case` (each checked first against SDPA, or where SDPA has no sinks
    against the naive reference when it fits in memory) and return their rows."""
    import torch

    import kernels

    dtype = getattr(torch, DTYPES[dtype_name])
    elem = torch.empty((), dtype=dtype).element_size()
    x = _make_inputs(case, dtype, device)
    impls = _implementations(case, x)
    first = next(iter(impls))
    if first in ("flash_decoding", "paged_attention", "mla_decode"):
        getattr(kernels, first)(**x)  # one validated launch checks the lengths and the block table
    fits, naive_note = _naive_fits(case, elem) if "naive" in impls else (False, "")
    refs = ("sdpa", "gather+sdpa", "gather+naive", "torch")
    ref_name = next((n for n in refs if n in impls), "naive" if fits else None)
    reference = impls[ref_name][1]() if ref_name else None
    rows = []
    for name, (cost_impl, fn) in impls.items():
        cost = case_cost(case, cost_impl, elem)
        if name == "naive" and not fits:
            rows.append(skipped_row(case, name, cost, naive_note))
            continue
        out = fn()  # also the warm-up: autotuning happens here
        err = _rel_error(out, reference) if reference is not None else float("nan")
        del out
        ms = _bench_ms(fn)
        rows.append(make_row(case, name, cost, ms * 1e-3, hw, dtype_name, copy_bps, max_rel_error=err))
    del x, impls, reference
    torch.cuda.empty_cache()
    return rows


def run(case_list: Sequence[Case], dtype_name: str, hardware: str | None) -> tuple[list[Row], Meta]:
    import torch
    import triton

    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    hw = load_hardware(hardware) if hardware else match_hardware(name)
    copy_bps = copy_bandwidth_bytes_per_s(device)
    meta = Meta(device=name, hardware=hw.name if hw else "", dtype=dtype_name, torch=torch.__version__,
                triton=triton.__version__, cuda=str(torch.version.cuda), copy_gb_per_s=copy_bps / 1e9,
                date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    rows = []
    for case in case_list:
        rows += bench_case(case, dtype_name, hw, copy_bps, device)
    return rows, meta


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m llmperf.measure.kernel_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="output folder (default reports/kernels/<date>/)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type of Q, K, V")
    p.add_argument("--hardware", default=None, help="llmperf hardware spec name (default: matched from the device)")
    p.add_argument("--quick", action="store_true", help="a handful of shapes (smoke run)")
    p.add_argument("--dry-run", action="store_true", help="print the shape list and exit (no GPU needed)")
    p.add_argument("--ops", type=_ops, default=None,
                   help=f"only these kernels' shapes, comma-separated ({', '.join(OPS)}; default: all)")
    return p.parse_args(argv)


#: the kernels' shape families, as `Case.op` names them
OPS = ("prefill", "decode", "paged", "mla")


def _ops(text: str) -> frozenset[str]:
    """'mla,decode' -> {'mla', 'decode'}; an unknown name is an argparse error naming it."""
    names = frozenset(t.strip() for t in text.split(",") if t.strip())
    bad = sorted(names - set(OPS))
    if not names or bad:
        raise argparse.ArgumentTypeError(f"unknown kernel {', '.join(bad) or repr(text)} "
                                         f"(choose from {', '.join(OPS)})")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    case_list = [c for c in cases(args.quick) if args.ops is None or c.op in args.ops]
    if args.dry_run:
        for case in case_list:
            print(f"{case.label}  ({case.tokens} tokens)")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("kernel_bench: no CUDA device; the benchmark times GPU kernels (try --dry-run for the shapes)",
              file=sys.stderr)
        return 2
    from rich.console import Console

    rows, meta = run(case_list, args.dtype, args.hardware)
    console = Console(markup=False)
    console.print(render_table(rows, meta))
    for line in targets(rows):
        console.print(line)
    out_dir = args.out or Path("reports") / "kernels" / dt.date.today().isoformat()
    json_path, csv_path = save(rows, meta, out_dir)
    console.print(f"saved {json_path} and {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
