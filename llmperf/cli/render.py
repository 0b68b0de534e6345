"""Rich tables for the CLI: result objects and DataFrames in, `rich.table.Table` out. Computes nothing.

Tables must read in 80 columns (a pipe, or COLUMNS=80): values that are the same in every row go to
the title instead of a column, headers are short, and no cell is ever truncated (long names fold
onto a second line instead of ending in an ellipsis).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

from llmperf.analysis import GenerationEstimate, PhaseEstimate
from llmperf.cli import format as fmt
from llmperf.specs import list_hardware, list_models, load_hardware, load_model
from llmperf.specs.kvcache import KVCacheSpec

if TYPE_CHECKING:
    import pandas as pd


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold", overflow="fold")
    table.add_column("value", justify="right", overflow="fold")
    for k, v in rows:
        table.add_row(k, v)
    return table


def _conventions(est: GenerationEstimate) -> str:
    c = est.conventions
    parts = [f"{c.attention} attention ({c.attention_flops} FLOPs)",
             "fused QKV" if c.fused_qkv else "split QKV",
             "fused gate+up" if c.fused_gate_up else "split gate+up",
             "logits at every position" if c.all_logits else "last-position logits"]
    if est.model.sliding_window:
        parts.append(f"sliding window {est.model.sliding_window:,}"
                     + (" (KV: full pages)" if c.kv_window == "full" else ""))
    if est.model.is_mla:
        parts.append(f"MLA {c.mla_mode}" + (" (unabsorbed prefill, absorbed decode)" if c.mla_mode == "auto" else ""))
    router = "uniform random routing" if c.expert_load is None else "the measured load of " + c.expert_load.label()
    if c.ep > 1:
        row = est.row  # a decode step's tokens over the group
        placed = (f", placed by EPLB with {c.eplb} redundant experts" if c.eplb else
                  ", placed by EPLB" if c.eplb == 0 else "")
        parts.append(f"experts split {c.ep} ways (ep){placed}, priced on the busiest GPU under {router} "
                     f"(decode: {float(row['ep_busiest_rows']):.2f}x uniform routing's mean routed rows, "
                     f"{float(row['ep_busiest_experts']):.2f}x its experts touched)")
    elif c.expert_load is not None and est.model.is_moe:
        parts.append(f"experts touched under {router}")
    if c.dp_attention:
        parts.append("data-parallel attention")
    return ", ".join(parts)


def _kv_spec(est: GenerationEstimate) -> KVCacheSpec:
    """The KV one GPU holds (its stage with the most KV, heads or MLA's latent as sharded)."""
    spec = KVCacheSpec.from_model(est.model, est.precision, window=est.conventions.kv_window)
    return spec.sharded(tp=1 if est.conventions.dp_attention else est.tp, pp=est.pp)


def _kv_tokens(est: GenerationEstimate, spec: KVCacheSpec) -> str:
    """Tokens of KV a sequence keeps: its context, the window's share of it, or by layer kind."""
    context = est.prompt_len + est.gen_len
    if len(spec.groups) > 1:
        return f"{context:,} tokens of context; by layer kind below"
    if not spec.groups:  # every layer keeps a constant state (Mamba-2, Gated DeltaNet): no KV at all
        return "none, a constant state per sequence"
    window = spec.groups[0].cap
    if window is not None and context > window:
        what = "chunk" if spec.groups[0].attention == "chunked" else "sliding window"
        return f"{window:,} tokens, {what}; context {context:,}"
    return f"{context:,} tokens"


def _kv_rows(est: GenerationEstimate, spec: KVCacheSpec) -> list[tuple[str, str]]:
    """MLA's latent, a linear-layer model's state per sequence, and the KV of one sequence by layer kind
    (sliding and chunked layers hold their window when capped, the whole context with full pages), where
    the model has any of them."""
    m, rows = est.model, []
    if m.is_mla:
        rows.append(("KV per token and layer: MLA latent (one for all heads, whole on every tp rank)",
                     f"{m.kv_lora_rank} + {m.qk_rope_head_dim} = {m.kv_lora_rank + m.qk_rope_head_dim} elements"))
    if spec.state_bytes:  # MiB: a state of a few layers rounds to 0.00 GiB
        n = spec.linear_layers
        rows.append((f"  one sequence's {m.linear_mixer_name} state, {n} layer{'s' * (n != 1)} (whatever its "
                     "context)", f"{spec.state_bytes / 2**20:.1f} MiB"))
    if len(spec.groups) > 1 or spec.state_bytes or (spec.groups and spec.groups[0].window is not None):
        context = est.prompt_len + est.gen_len
        for g in spec.groups:
            held = g.tokens_held(context)
            rows.append((f"  one sequence's KV, {g.label} layers x{g.num_layers} ({held:,} {g.unit})",
                         fmt.gib(g.bytes_for_context(context))))
    return rows


def time_model_label(time_model: object) -> str:
    """The time model and the engine profile that priced a number: "typical, engine compiled"."""
    from llmperf.analysis.roofline import engine_label
    name = getattr(time_model, "name", "roofline")
    return "roofline (the bound)" if name == "roofline" else f"{name}, engine {engine_label(time_model)}"


def _with_bound(est: GenerationEstimate, seconds: float, bound_column: str) -> str:
    """`seconds` as the expected time with the roofline bound beside it ("7.9 ms expected, 5.2 ms
    bound"), or the bound alone under the roofline."""
    bound = est.row.get(bound_column) if isinstance(est.row, dict) else None
    if est.time_model.name == "roofline" or bound is None:
        return f"{fmt.seconds(seconds)} bound" if est.time_model.name == "roofline" else fmt.seconds(seconds)
    return f"{fmt.seconds(seconds)} expected, {fmt.seconds(float(bound))} bound"


def generation_tables(est: GenerationEstimate) -> list[Table]:
    """Latency, phases, memory and regimes of one estimate."""
    m = est.model
    head = (f"{m.name} on {est.hardware.name} · {est.precision.label()} · batch {est.batch} · "
            f"prompt {est.prompt_len} · gen {est.gen_len} · {est.gpus} GPU{'s' if est.gpus > 1 else ''}"
            + (f" (tp {est.tp} x pp {est.pp})" if est.gpus > 1 else ""))
    params = fmt.count(m.param_count) + (f" ({fmt.count(m.active_param_count)} active)" if m.is_moe else "")
    latency = _kv_table(head, [
        ("parameters", params),
        ("time to first token (prefill)", _with_bound(est, est.ttft_s, "ttft_bound_s")),
        ("time per output token (mean decode step)", _with_bound(est, est.tpot_s, "tpot_bound_s")),
        ("end-to-end latency", _with_bound(est, est.e2e_s, "e2e_bound_s")),
        ("throughput (generated tokens/s, all sequences)", f"{est.tokens_per_s:,.1f}"),
        ("decode throughput (tokens/s)", f"{est.decode_tokens_per_s:,.1f}"),
        ("achieved FLOP/s / peak (whole generation)", f"{est.peak_fraction:.1%}"),
        ("conventions", _conventions(est)),
        ("time model", time_model_label(est.time_model)),
        *_gemm_rows(est),
    ])
    phases = Table(title="Phases (one forward pass; per GPU)", title_justify="left")
    for col in ("phase", "FLOPs", "bytes", "FLOP/B", "bound", "time", "% peak"):
        phases.add_column(col, justify="left" if col in ("phase", "bound") else "right", overflow="fold")
    for label, ph in (("prefill", est.prefill), (f"decode (ctx {est.decode_first.kv_len})", est.decode_first),
                      (f"decode (ctx {est.decode_last.kv_len})", est.decode_last)):
        phases.add_row(label, fmt.flops(ph.flops), fmt.nbytes(ph.bytes_total), f"{ph.intensity:.1f}",
                       ph.bound, fmt.seconds(ph.time_s), f"{ph.peak_fraction:.1%}")
    mem, kv_spec = est.memory, _kv_spec(est)
    verdict = "fits" if mem.fits else "DOES NOT FIT"
    memory = _kv_table(f"Memory per GPU ({est.hardware.memory_gib:g} GiB device, {mem.mem_util:.0%} usable = "
                       f"{fmt.gib(mem.usable_bytes)})", [
        ("weights", fmt.gib(mem.weights_bytes)),
        (f"KV cache{' and ' + est.model.linear_mixer_name + ' state' if kv_spec.state_bytes else ''}, paged "
         f"({est.batch} x "
         f"{_kv_tokens(est, kv_spec)})", fmt.gib(mem.kv_cache_bytes)),
        *_kv_rows(est, kv_spec),
        (f"activations (one reservation for {mem.max_batched_tokens:,} tokens/step)",
         fmt.gib(mem.activation_peak_bytes)),
        ("total", f"{fmt.gib(mem.total_bytes)} ({verdict})"),
        ("KV cache per token", f"{mem.kv_bytes_per_token / 1024:,.0f} KiB"),
        ("max batch at this context (paged KV)", fmt.count(mem.max_batch)),
        (f"max batch, contiguous KV reserving {mem.kv.max_seq_len:,} tokens", fmt.count(mem.max_batch_contiguous)),
        ("KV utilisation, contiguous / paged", f"{mem.kv.contiguous_utilization:.1%} / {mem.kv.paged_utilization:.1%}"
                                                f" (block {mem.kv.block_size})"),
    ])
    r = est.regimes
    regimes = _kv_table(f"Regimes ({r.compute_dtype}, ridge point {r.ridge_point:.1f} FLOP/B)", [
        ("decode batch where the linear layers turn compute-bound", fmt.count(r.critical_batch_matmul)),
        (f"decode batch where the whole step turns compute-bound (ctx {est.prompt_len + est.gen_len})",
         fmt.count(r.critical_batch) if r.critical_batch else "never"),
        ("prompt length where attention FLOPs = rest of layer", fmt.count(r.attention_flops_crossover)),
        (f"context where attention bytes = rest of layer (batch {est.batch})",
         fmt.count(r.attention_bytes_crossover)),
        ("decode context where attention turns compute-bound",
         fmt.count(r.attention_critical_context) if r.attention_critical_context else "never"),
    ])
    return [latency, phases, memory, regimes]


#: per-operator columns: header, justification; `_OPS_DROP_ORDER` are given up first in a narrow console
_OPS_COLUMNS = (("op", "left"), ("kind", "left"), ("FLOPs", "right"), ("weights", "right"), ("act", "right"),
                ("KV", "right"), ("FLOP/B", "right"), ("time", "right"), ("share", "right"), ("bound", "left"))
_OPS_DROP_ORDER = ("kind", "act", "KV", "share")


def ops_table(phase: PhaseEstimate, title: str, width: int | None = None) -> Table:
    """Per-operator FLOPs, bytes, intensity, time and bound (per-layer operators summed over layers).
    With a console `width` (80 when piped), the least needed columns are left out until every cell
    fits on one line (the title says which; `-f csv --per-op` has them all); if it still does not fit
    (long layer-kind labels), the operator names fold onto a second line."""
    frame = phase.to_frame()
    # layers of several kinds (sliding and full, MoE and dense): each operator says which, and how many
    mixed = frame.loc[frame["scope"] == "layer", "layer"].nunique() > 1
    rows = [[_op_label(row, mixed), row.kind, fmt.flops(row.flops), fmt.nbytes(row.weight_bytes),
             fmt.nbytes(row.act_bytes), fmt.nbytes(row.kv_bytes), f"{row.intensity:.1f}", fmt.seconds(row.time_s),
             f"{row.time_share:.1%}", row.bound] for row in frame.itertuples()]
    total = ["total", "", fmt.flops(phase.flops), fmt.nbytes(phase.weight_bytes), "", fmt.nbytes(phase.kv_bytes),
             f"{phase.intensity:.1f}", fmt.seconds(phase.time_s), "100%", phase.bound]
    names = [h for h, _ in _OPS_COLUMNS]
    widths = {h: max(len(h), *(len(r[i]) for r in (*rows, total))) for i, h in enumerate(names)}
    cols = list(names)
    dropped = []
    for c in _OPS_DROP_ORDER:
        if width is None or sum(widths[k] for k in cols) + 2 * len(cols) <= width:  # a space each side of a cell
            break
        cols.remove(c)
        dropped.append(c)
    fits = width is None or sum(widths[k] for k in cols) + 2 * len(cols) <= width
    note = f" (not shown: {', '.join(dropped)}; every column: -f csv --per-op)" if dropped else ""
    scope = ("per-layer operators summed over the layers of their kind, [kind] xN; [kind+kind]: the "
                 "same operator in both kinds" if mixed
             else f"x{phase.layers} layers where scope=layer")
    # Text, never markup: `[sliding-128/moe]` is a layer kind, not a style (with or without markup)
    table = Table(title=Text(f"{title} — operators ({scope}){note}"),
                  title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    keep = [names.index(c) for c in cols]
    for i in keep:
        header, justify = _OPS_COLUMNS[i]
        fold = header == "op" and not fits  # still too wide: a long name folds, no figure is ever cut
        table.add_column(header, justify=justify, overflow="fold", min_width=None if fold else widths[header],
                         no_wrap=not fold)
    for r in rows:
        table.add_row(*(Text(r[i]) for i in keep))
    table.add_row(*(Text(total[i]) for i in keep), style="bold")
    return table


def _op_label(row, mixed: bool) -> str:  # noqa: ANN001
    """`attention`, or with layers of several kinds `attention [sliding-4096] x21`."""
    if not mixed or row.scope != "layer":
        return row.op
    return f"{row.op} [{row.layer}] x{int(row.layers)}"  # a Text cell: the brackets are not markup


#: identity columns: shown as a column only when they vary, else in the title
_SWEEP_KEYS = {"model": ("model", str), "hardware": ("device", str), "precision": ("precision", str),
               "tp": ("tp", fmt.count), "pp": ("pp", fmt.count), "batch": ("batch", fmt.count),
               "prompt_len": ("prompt", fmt.count), "gen_len": ("gen", fmt.count),
               "time_model": ("time model", str), "engine": ("engine", str)}
_SWEEP_VALUES = {
    "ttft_s": ("TTFT", fmt.seconds), "tpot_s": ("TPOT", fmt.seconds), "tpot_bound_s": ("bound", fmt.seconds),
    "tokens_per_s": ("tok/s", lambda v: f"{v:,.0f}"),
    "decode_bound": ("decode", str), "total_gib": ("GiB", lambda v: f"{v:.1f}"),
    "fits": ("fits", lambda v: "yes" if v else "NO"), "max_batch": ("max b", fmt.count),
}
_TITLE_NAMES = {"tp": "tp ", "pp": "pp ", "batch": "batch ", "prompt_len": "prompt ", "gen_len": "gen ",
                "time_model": "time model ", "engine": "engine "}


#: value columns given up first when the table would be wider than the console (all are in -f csv)
_DROP_ORDER = ("total_gib", "tokens_per_s", "decode_bound", "max_batch", "tpot_bound_s")


def sweep_tables(frame: pd.DataFrame, width: int | None = None) -> list[Table]:
    """`sweep_table`, or, when even its narrowest form would fold names (model, device, precision)
    in `width` columns, one table per distinct (model, device, precision), which go to the titles."""
    table = sweep_table(frame, width)
    keys = [c for c in ("model", "hardware", "precision") if frame[c].nunique(dropna=False) > 1]
    if width is None or table.columns[0].min_width is not None or not keys:
        return [table]
    parts = frame.groupby(keys, sort=False, dropna=False)
    return [sweep_table(part.reset_index(drop=True), width) for _, part in parts]


def sweep_table(frame: pd.DataFrame, width: int | None = None) -> Table:
    """One row per configuration; what is the same in every row is said once, in the title. With a
    console `width`, the least important value columns are left out until the table fits (the
    title says so: every column is in `-f csv` / `-f json`); if it still does not fit, cells fold
    (no column then has a `min_width`: `sweep_tables` splits such a table by model, device and
    precision instead)."""
    keys = [c for c in _SWEEP_KEYS if c in frame.columns]  # TPOT is the expected time, "bound" the roofline's
    varying = [c for c in keys if frame[c].nunique(dropna=False) > 1]
    fixed = [f"{_TITLE_NAMES.get(c, '')}{frame[c].iloc[0]}" for c in keys if c not in varying]
    title = f"{len(frame)} configurations" + (": " + " · ".join(fixed) if fixed else "")
    roofline = "time_model" not in frame.columns or bool((frame["time_model"] == "roofline").all())
    cols = varying + [c for c in _SWEEP_VALUES if c in frame.columns and not (roofline and c == "tpot_bound_s")]
    records_ = frame.to_dict(orient="records")
    cells = {c: [(_SWEEP_KEYS.get(c) or _SWEEP_VALUES[c])[1](r[c]) for r in records_] for c in cols}
    widths = {c: max([len((_SWEEP_KEYS.get(c) or _SWEEP_VALUES[c])[0])] + [len(x) for x in cells[c]]) for c in cols}
    dropped = []
    for c in _DROP_ORDER:
        if width is None or sum(widths[k] for k in cols) + 2 * len(cols) <= width:
            break
        cols.remove(c)
        dropped.append((_SWEEP_VALUES[c])[0])
    fits_all = width is None or sum(widths[k] for k in cols) + 2 * len(cols) <= width
    if dropped:
        title += f" (not shown: {', '.join(dropped)}; every column: -f csv)"
    # a light box with one space between columns, so ten columns fit in 80
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for c in cols:
        header = (_SWEEP_KEYS.get(c) or _SWEEP_VALUES[c])[0]
        left = c in ("model", "hardware", "precision", "decode_bound")
        table.add_column(header, justify="left" if left else "right", overflow="fold",
                         min_width=widths[c] if fits_all else None)
    for i, r in enumerate(records_):
        table.add_row(*(cells[c][i] for c in cols), style=None if r["fits"] else "red")
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
    import pandas as pd

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
    import pandas as pd

    rows = []
    for name in list_hardware():
        h = load_hardware(name)
        rows.append(dict(name=name, variant=h.variant, fp16_tflops=h.peak_tflops.get("fp16", float("nan")),
                         bf16_tflops=h.peak_tflops.get("bf16", float("nan")),
                         fp8_tflops=h.peak_tflops.get("fp8", float("nan")), bandwidth_gbps=h.memory_bandwidth_gbps,
                         memory_gib=h.memory_gib, ridge_fp16=round(h.ridge_point("fp16"), 1),
                         interconnect_gbps=h.interconnect_gbps, source=h.source))
    return pd.DataFrame(rows)


def _gemm_rows(est) -> list[tuple[str, str]]:  # noqa: ANN001
    """The linear layers' GEMM mode (W8A8, W8A16, W4A16, ...) as this device runs the precision, and
    for fp8 the line saying whether it is W8A8 or weight-only here."""
    from llmperf.specs.precision import gemm_mode, precision_note
    note = precision_note(est.precision, est.hardware)
    return [("GEMMs", gemm_mode(est.precision, est.hardware) + (f": {note}" if note else ""))]
