"""Rich tables for the CLI: result objects and DataFrames in, `rich.table.Table` out. Computes nothing."""

from __future__ import annotations

import pandas as pd
from rich.table import Table

from llmperf import format as fmt
from llmperf.analysis import GenerationEstimate, PhaseEstimate
from llmperf.specs import list_hardware, list_models, load_hardware, load_model


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    return table


def generation_tables(est: GenerationEstimate) -> list[Table]:
    """Latency, phases, memory and regimes of one estimate."""
    head = (f"{est.model.name} on {est.hardware.name} · {est.precision} · batch {est.batch} · "
            f"prompt {est.prompt_len} · gen {est.gen_len}"
            + (f" · tp {est.tp}" if est.tp > 1 else "") + (f" · pp {est.pp}" if est.pp > 1 else "")
            + f" · {est.attention} attention")
    latency = _kv_table(head, [
        ("time to first token (prefill)", fmt.seconds(est.ttft_s)),
        ("time per output token (mean decode step)", fmt.seconds(est.tpot_s)),
        ("end-to-end latency", fmt.seconds(est.e2e_s)),
        ("throughput (generated tokens/s, all sequences)", f"{est.tokens_per_s:,.1f}"),
        ("decode throughput (tokens/s)", f"{est.decode_tokens_per_s:,.1f}"),
        ("achieved FLOP/s / peak (whole generation)", f"{est.peak_fraction:.1%}"),
    ])
    phases = Table(title="Phases (one forward pass; per GPU)", title_justify="left")
    for col in ("phase", "FLOPs", "bytes", "FLOP/B", "ridge", "bound", "time", "% peak"):
        phases.add_column(col, justify="left" if col in ("phase", "bound") else "right")
    ridge = est.regimes.ridge_point
    for label, ph in (("prefill", est.prefill), (f"decode (ctx {est.decode_first.kv_len})", est.decode_first),
                      (f"decode (ctx {est.decode_last.kv_len})", est.decode_last)):
        phases.add_row(label, fmt.flops(ph.flops), fmt.nbytes(ph.bytes_total), f"{ph.intensity:.1f}",
                       f"{ridge:.0f}", ph.bound, fmt.seconds(ph.time_s), f"{ph.peak_fraction:.1%}")
    mem = est.memory
    memory = _kv_table(f"Memory per GPU ({est.hardware.memory_gib:g} GiB device, {mem.mem_util:.0%} usable)", [
        ("weights", fmt.gib(mem.weights_bytes)),
        ("KV cache per token", f"{mem.kv_bytes_per_token / 1024:,.0f} KiB"),
        (f"KV cache ({est.batch} x {est.prompt_len + est.gen_len} tokens)", fmt.gib(mem.kv_cache_bytes)),
        ("activations (peak)", fmt.gib(mem.activation_peak_bytes)),
        ("total", f"{fmt.gib(mem.total_bytes)}  ({'fits' if mem.fits else 'DOES NOT FIT'})"),
        ("max batch at this context (paged KV)", fmt.count(mem.max_batch)),
        (f"max batch, contiguous KV reserving {mem.kv.max_seq_len:,} tokens", fmt.count(mem.max_batch_contiguous)),
        ("KV utilisation, contiguous / paged", f"{mem.kv.contiguous_utilization:.1%} / {mem.kv.paged_utilization:.1%}"
                                                f" (block {mem.kv.block_size})"),
    ])
    r = est.regimes
    regimes = _kv_table(f"Regimes ({r.compute_dtype})", [
        ("ridge point (FLOP/B)", f"{r.ridge_point:.1f}"),
        ("decode batch where the linear layers turn compute-bound", fmt.count(r.critical_batch_matmul)),
        (f"decode batch where the whole step turns compute-bound (ctx {est.prompt_len + est.gen_len})",
         fmt.count(r.critical_batch) if r.critical_batch else "never"),
        ("prompt length where attention FLOPs = rest of layer", fmt.count(r.attention_flops_crossover)),
        (f"context where attention bytes = rest of layer (batch {est.batch})",
         fmt.count(r.attention_bytes_crossover)),
    ])
    return [latency, phases, memory, regimes]


def ops_table(phase: PhaseEstimate, title: str) -> Table:
    """Per-operator FLOPs, bytes, intensity, time and bound (per-layer operators summed over layers)."""
    table = Table(title=f"{title} — operators (x{phase.layers} layers where scope=layer)", title_justify="left")
    for col in ("op", "kind", "FLOPs", "weights", "act", "KV", "FLOP/B", "time", "share", "bound"):
        table.add_column(col, justify="left" if col in ("op", "kind", "bound") else "right")
    for row in phase.to_frame().itertuples():
        table.add_row(row.op, row.kind, fmt.flops(row.flops), fmt.nbytes(row.weight_bytes),
                      fmt.nbytes(row.act_bytes), fmt.nbytes(row.kv_bytes), f"{row.intensity:.1f}",
                      fmt.seconds(row.time_s), f"{row.time_share:.1%}", row.bound)
    table.add_row("total", "", fmt.flops(phase.flops), fmt.nbytes(phase.weight_bytes), "",
                  fmt.nbytes(phase.kv_bytes), f"{phase.intensity:.1f}", fmt.seconds(phase.time_s), "100%",
                  phase.bound, style="bold")
    return table


_SWEEP_COLUMNS = {
    "model": str, "hardware": str, "batch": fmt.count, "prompt_len": fmt.count, "gen_len": fmt.count,
    "ttft_s": fmt.seconds, "tpot_s": fmt.seconds, "tokens_per_s": lambda v: f"{v:,.0f}",
    "decode_intensity": lambda v: f"{v:.1f}", "decode_bound": str,
    "total_gib": lambda v: f"{v:.1f}", "fits": lambda v: "yes" if v else "NO", "max_batch": fmt.count,
}


def sweep_table(frame: pd.DataFrame) -> Table:
    table = Table(title=f"Sweep: {len(frame)} configurations", title_justify="left")
    for col in _SWEEP_COLUMNS:
        table.add_column(col[:-2] if col in ("ttft_s", "tpot_s") else col.replace("_per_s", "/s"),
                         justify="left" if col in ("model", "hardware", "decode_bound") else "right")
    for row in frame.to_dict(orient="records"):
        table.add_row(*(render(row[c]) for c, render in _SWEEP_COLUMNS.items()))
    return table


def frame_table(frame: pd.DataFrame, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in frame.columns:
        table.add_column(col, justify="left" if frame[col].dtype == object else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{v:,}" if isinstance(v, int) else (f"{v:,.4g}" if isinstance(v, float) else str(v))
                        for v in row))
    return table


def models_frame() -> pd.DataFrame:
    rows = []
    for name in list_models():
        m = load_model(name)
        rows.append(dict(name=name, family=m.family, params=m.param_count, layers=m.num_layers,
                         hidden=m.hidden_size, heads=m.num_heads, kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                         ffn=m.ffn_size, ffn_kind=m.ffn_kind,
                         experts=f"{m.experts_per_token}/{m.num_experts}" if m.is_moe else "-",
                         kv_bytes_per_token_fp16=int(m.kv_bytes_per_token("fp16")),
                         max_positions=m.max_positions, source=m.source))
    return pd.DataFrame(rows)


def hardware_frame() -> pd.DataFrame:
    rows = []
    for name in list_hardware():
        h = load_hardware(name)
        rows.append(dict(name=name, variant=h.variant, fp16_tflops=h.peak_tflops.get("fp16", float("nan")),
                         bf16_tflops=h.peak_tflops.get("bf16", float("nan")),
                         fp8_tflops=h.peak_tflops.get("fp8", float("nan")), bandwidth_gbps=h.memory_bandwidth_gbps,
                         memory_gib=h.memory_gib, ridge_fp16=round(h.ridge_point("fp16"), 1),
                         interconnect_gbps=h.interconnect_gbps, source=h.source))
    return pd.DataFrame(rows)
