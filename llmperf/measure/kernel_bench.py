"""Benchmark the attention kernels against the roofline: `python -m llmperf.measure.kernel_bench`.

Options: `[--out DIR] [--dry-run]`.

On a CUDA device, times each kernel with `triton.testing.do_bench` (median; L2 flushed between runs)
over Llama-3-8B-like attention (32 query / 8 KV heads, head dim 128), batch 1..64, context 512..32k:
  prefill  flash_attention vs torch SDPA vs naive attention (causal, T_q = T_kv);
  decode   flash_decoding  vs torch SDPA vs naive decode (uniform and ragged lengths);
  paged    paged_attention vs gather + SDPA (`paged_decode_reference`), block size 16.
For each it reports time, achieved TFLOP/s and GB/s, the fraction of the device's dense peak and of
its memory bandwidth, the fraction of the roofline prediction (`roofline time / measured time`), and,
for decode, GB/s as a fraction of the measured device-to-device copy bandwidth. FLOPs and bytes come
from `llmperf.analysis.attention_cost` (the one source of truth; a fused kernel executes about half
the causal square, a naive one all of it); ragged batches sum the per-sequence costs. Results go to a
rich table and to `<out>/kernels.json` and `<out>/kernels.csv` (device, versions and date included).

Targets on an H100 SXM (reported, never asserted): decode kernels >= 70% of copy bandwidth when
batch x context >= 64k tokens; prefill >= 40% of dense bf16 peak at context >= 4k and faster than
torch SDPA's default backend at the same shape.

Letters: B batch, H query heads, H_kv KV heads, D head dim, T context (tokens per sequence).
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

from llmperf.analysis import OpCost, attention_cost, roofline_time_s
from llmperf.specs import HardwareSpec, load_hardware, match_hardware

H, H_KV, HEAD_DIM = 32, 8, 128  # Llama-3-8B attention
BLOCK_SIZE = 16  # paged cache block (vLLM's default)
DECODE_TARGET_TOKENS = 64 * 1024  # batch x context from which the decode bandwidth target applies
DECODE_TARGET_COPY_FRACTION = 0.70
PREFILL_TARGET_CONTEXT = 4096
PREFILL_TARGET_PEAK_FRACTION = 0.40
NAIVE_MEMORY_FRACTION = 0.5  # skip naive attention when S, P and the fp32 softmax exceed this share of free memory
COPY_BYTES = 1 << 30  # each side of the copy-bandwidth measurement
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True, kw_only=True)
class Case:
    """One benchmark shape. `lens` lists per-sequence contexts for a ragged decode batch (else all `context`)."""

    op: str  # "prefill" | "decode" | "paged"
    batch: int
    context: int
    lens: tuple[int, ...] = ()
    causal: bool = True

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return self.lens or (self.context,) * self.batch

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def label(self) -> str:
        ragged = " ragged" if self.lens else ""
        return f"{self.op} B={self.batch} T={self.context}{ragged}"


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
    return out


def _sum_cost(cost: OpCost, n: int) -> OpCost:
    """Collapse a cost evaluated at n per-sequence lengths into one. Counts that do not depend on the
    length (Q and O bytes) come back as scalars, so every field is broadcast to n entries first."""
    counts = {f.name: float(np.sum(np.broadcast_to(getattr(cost, f.name), (n,)))) for f in dataclasses.fields(OpCost)
              if f.name not in ("name", "kind", "per_layer", "layer", "compute_dtype", "comm_gpus", "gemm", "attn")}
    return OpCost(name=cost.name, kind=cost.kind, per_layer=cost.per_layer, layer=cost.layer,
                  compute_dtype=cost.compute_dtype, comm_gpus=cost.comm_gpus, **counts)


def case_cost(case: Case, impl: str, elem_bytes: float) -> OpCost:
    """FLOPs and bytes of `case` from `llmperf.analysis` ("fused" or "naive"), summed over sequences."""
    common = dict(num_heads=H, num_kv_heads=H_KV, head_dim=HEAD_DIM, act_bytes=elem_bytes, kv_bytes=elem_bytes,
                  impl=impl, causal=case.causal)
    if case.op == "prefill":
        return attention_cost(case.batch, case.context, case.context, **common)
    lens = np.asarray(case.seq_lens, dtype=float)
    return _sum_cost(attention_cost(1, 1, lens, **common), len(lens))


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
    max_rel_error: float = float("nan")  # against torch SDPA at the same shape
    note: str = ""


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
        max_rel_error=max_rel_error, note=note,
    )


def skipped_row(case: Case, impl: str, cost: OpCost, note: str) -> Row:
    nan = float("nan")
    return Row(op=case.op, impl=impl, batch=case.batch, context=case.context, ragged=bool(case.lens),
               tokens=case.tokens, time_s=nan, flops=float(cost.flops), bytes=float(cost.bytes_total),
               tflops_per_s=nan, gb_per_s=nan, peak_fraction=nan, bandwidth_fraction=nan, roofline_fraction=nan,
               copy_fraction=nan, note=note)


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
    sdpa = {(r.op, r.batch, r.context, r.ragged): r for r in rows if r.impl == "sdpa"}
    for r in rows:
        if math.isnan(r.time_s):
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
            r.op + (" ragged" if r.ragged else ""), str(r.batch), str(r.context), r.impl,
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
    scores = case.batch * H * (case.context if case.op == "prefill" else 1) * case.context
    need = scores * (2 * elem_bytes + 4)
    if need > NAIVE_MEMORY_FRACTION * free:
        return False, f"naive skipped: S and P need {need / 2**30:.0f} GiB"
    return True, ""


def _make_inputs(case: Case, dtype, device):
    """Tensors for `case`: prefill (q, k, v); decode (q, k_cache, v_cache, seq_lens); paged adds the pool."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    B, T = case.batch, case.context
    if case.op == "prefill":
        return dict(q=randn(B, H, T, HEAD_DIM), k=randn(B, H_KV, T, HEAD_DIM), v=randn(B, H_KV, T, HEAD_DIM))
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
    q = randn(B, H, HEAD_DIM)
    if case.op == "decode":
        return dict(q=q, k_cache=randn(B, H_KV, T, HEAD_DIM), v_cache=randn(B, H_KV, T, HEAD_DIM), seq_lens=seq_lens)
    blocks_per_seq = -(-T // BLOCK_SIZE)
    num_blocks = B * blocks_per_seq
    perm = torch.randperm(num_blocks, generator=g, device=device).to(torch.int32)
    return dict(q=q, key_blocks=randn(num_blocks, BLOCK_SIZE, H_KV, HEAD_DIM),
                value_blocks=randn(num_blocks, BLOCK_SIZE, H_KV, HEAD_DIM),
                block_tables=perm.view(B, blocks_per_seq), seq_lens=seq_lens)


def _implementations(case: Case, x: dict) -> dict[str, tuple[str, Callable[[], Any]]]:
    """impl name -> (cost model impl, zero-argument call) for `case`. The first entry is the Triton kernel."""
    import kernels

    if case.op == "prefill":
        q, k, v = x["q"], x["k"], x["v"]
        return {
            "flash_attention": ("fused", lambda: kernels.flash_attention(q, k, v, case.causal)),
            "sdpa": ("fused", lambda: kernels.sdpa_attention(q, k, v, case.causal)),
            "naive": ("naive", lambda: kernels.naive_attention(q, k, v, case.causal)),
        }
    if case.op == "decode":
        q, kc, vc, lens = x["q"], x["k_cache"], x["v_cache"], x["seq_lens"]
        if case.lens:  # ragged: SDPA needs a length mask
            sdpa = lambda: kernels.sdpa_decode(q, kc, vc, lens, validate=False)  # noqa: E731
        else:  # uniform: the mask-free call lets SDPA pick its fastest backend
            sdpa = lambda: kernels.sdpa_attention(q[:, :, None], kc, vc, False)[:, :, 0]  # noqa: E731
        return {
            "flash_decoding": ("fused", lambda: kernels.flash_decoding(q, kc, vc, lens, validate=False)),
            "sdpa": ("fused", sdpa),
            "naive": ("naive", lambda: kernels.naive_decode(q, kc, vc, lens, validate=False)),
        }
    args = (x["q"], x["key_blocks"], x["value_blocks"], x["block_tables"], x["seq_lens"])
    return {
        "paged_attention": ("fused", lambda: kernels.paged_attention(*args, validate=False)),
        "gather+sdpa": ("fused", lambda: kernels.paged_decode_reference(*args, validate=False)),
    }


def bench_case(case: Case, dtype_name: str, hw: HardwareSpec | None, copy_bps: float, device) -> list[Row]:
    """Time every implementation of `case` (each checked against SDPA first) and return their rows."""
    import torch

    import kernels

    dtype = getattr(torch, DTYPES[dtype_name])
    elem = torch.empty((), dtype=dtype).element_size()
    x = _make_inputs(case, dtype, device)
    impls = _implementations(case, x)
    first = next(iter(impls))
    if first in ("flash_decoding", "paged_attention"):
        getattr(kernels, first)(**x)  # one validated launch checks the lengths and the block table
    reference = impls["sdpa"][1]() if "sdpa" in impls else impls["gather+sdpa"][1]()
    rows = []
    for name, (cost_impl, fn) in impls.items():
        cost = case_cost(case, cost_impl, elem)
        if name == "naive":
            fits, note = _naive_fits(case, elem)
            if not fits:
                rows.append(skipped_row(case, name, cost, note))
                continue
        err = _rel_error(fn(), reference)  # also the warm-up: autotuning happens here
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
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    case_list = cases(args.quick)
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
