"""Where a report's frames come from: an estimate run on the spot through the public analytical API
(`llmperf.estimate`, `llmperf.sweep`, `ForwardModel`, `op_time`), a
`profile` run directory, or a `simulate` run directory. Each source becomes a `Section`: a heading,
a few key numbers, tables and the figures of `llmperf.report.figures`.

Nothing here adds a formula: estimates are the analytical model's numbers, profile and simulate
figures are the columns their run directories hold.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

import llmperf
from llmperf.analysis import ForwardModel, op_time
from llmperf.analysis.generation import resolve_precision
from llmperf.analysis.vocabulary import ATTENTION_OPS
from llmperf.errors import SpecError
from llmperf.report import figures as F
from llmperf.report.runs import ProfileRun, SimulateRun
from llmperf.specs import HardwareSpec, list_hardware, load_hardware, load_model
from llmperf.specs.expert_load import ExpertLoad, as_expert_load
from llmperf.specs.loader import hardware_from_mapping

DEFAULT_COMPARE = ("a100-80gb-sxm", "h100-sxm", "h200")
_ATTN = {op.value for op in ATTENTION_OPS}


@dataclass(frozen=True, kw_only=True)
class Section:
    """A part of the report: one source's heading, key numbers, tables and figures."""

    kind: str  # 'estimate' | 'profile' | 'simulate'
    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    figures: list[F.ReportFigure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    attachments: dict[str, pd.DataFrame] = field(default_factory=dict)  # CSV files written beside the report


@dataclass(frozen=True, kw_only=True)
class EstimateSpec:
    """What to predict: models x devices x batches x prompt lengths x generation lengths (a sweep), with
    one precision and parallel layout. The first value of each list is the *primary* configuration,
    drawn operator by operator; the whole sweep feeds the batch and memory figures and the CSV."""

    models: Sequence[str] = ("llama-3.1-8b",)
    hardware: Sequence[str] = ("a100-80gb-sxm",)
    batch: Sequence[int] = (1,)
    prompt_len: Sequence[int] = (512,)
    gen_len: Sequence[int] = (128,)
    precision: str | None = None
    weights: str | None = None
    activations: str | None = None
    kv: str | None = None
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert parallelism within the tp group
    dp_attention: bool = False  # attention data-parallel over the tp group (MLA models)
    expert_load: ExpertLoad | None = None  # a measured router's load (or its file; None: uniform routing)
    eplb: int | None = None  # EPLB's redundant experts per MoE layer (None: experts placed contiguously)
    mla_mode: str = "auto"  # MLA: auto (unabsorbed prefill, absorbed decode) | absorbed | unabsorbed
    kv_window: str = "capped"  # sliding / chunked layers hold their window | get full pages
    attention: str = "fused"
    block_size: int = 16
    mem_util: float = 0.9
    compare: Sequence[str] = DEFAULT_COMPARE
    efficiency: str | None = None  # the time model (None: the expected time, `default_efficiency`)
    engine: str | None = None  # a GPU's engine profile (None: the default, compiled)

    def __post_init__(self) -> None:
        for name in ("models", "hardware", "batch", "prompt_len", "gen_len"):
            if not list(getattr(self, name)):
                raise SpecError(f"{name}: needs at least one value")
        for name in ("batch", "prompt_len", "gen_len"):
            for v in getattr(self, name):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                    raise SpecError(f"{name}: every value must be an integer >= 1, got {v!r}")
        if self.attention not in ("fused", "naive"):
            raise SpecError(f"attention: must be 'fused' or 'naive', got {self.attention!r}")
        object.__setattr__(self, "expert_load", as_expert_load(self.expert_load))  # a file is read once

    @property
    def layout_kwargs(self) -> dict[str, object]:
        """The parallel layout and the today's-model conventions, as `estimate` and `sweep` take them."""
        return dict(ep=self.ep, dp_attention=self.dp_attention, expert_load=self.expert_load, eplb=self.eplb,
                    mla_mode=self.mla_mode, kv_window=self.kv_window)

    @property
    def precision_kwargs(self) -> dict[str, object]:
        return dict(precision=self.precision, weights=self.weights, activations=self.activations, kv=self.kv)


def _pow2_grid(lo: int, hi: int) -> list[int]:
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return out


def _grid(user: Sequence[int], lo: int, hi: int) -> list[int]:
    """The user's values when they already form a sweep (3 or more), else powers of two plus theirs."""
    values = sorted(set(int(v) for v in user))
    if len(values) >= 3:
        return values
    return sorted(set(_pow2_grid(lo, hi)) | set(values))


def _pick(values: Sequence[int], n: int) -> list[int]:
    """At most `n` values spread evenly (log-spaced index) over a sorted list, ends included."""
    values = sorted(set(values))
    if len(values) <= n:
        return values
    idx = np.unique(np.round(np.linspace(0, len(values) - 1, n)).astype(int))
    return [values[i] for i in idx]


def _peak_tflops(peaks: object, dtype: str) -> float | None:
    """A peak (TFLOP/s) at `dtype` from a {dtype: TFLOP/s} mapping, or the widest format listed."""
    if not isinstance(peaks, dict) or not peaks:
        return None
    for key in (dtype, "fp16", "bf16", "fp32"):
        if isinstance(peaks.get(key), (int, float)) and peaks[key] > 0:
            return float(peaks[key])
    return None


def ceilings_for(hw: HardwareSpec, compute_dtype: str) -> list[F.Ceiling]:
    """The roofs of the roofline chart: the datasheet's (matrix peak at the compute dtype and the fp32
    vector peak) always when known, and the ceilings `llmperf calibrate` measured when the spec carries
    them (its `calibration.ceilings`). A spec made by `calibrate` itself (the `local` device: peaks
    *are* the measured ceilings, no datasheet) gives only the measured roofs."""
    cal = hw.calibration if isinstance(hw.calibration, dict) else {}
    roofs: list[F.Ceiling] = []
    measured_spec = not cal and hw.efficiency is not None and hw.source.startswith("measured")
    datasheet = cal.get("datasheet") if cal else None
    if isinstance(datasheet, dict):
        peak = _peak_tflops(datasheet.get("peak_tflops"), compute_dtype)
        bw = datasheet.get("memory_bandwidth_gbps")
        if peak and isinstance(bw, (int, float)) and bw > 0:
            roofs.append(F.Ceiling(label=f"{datasheet.get('name', hw.name)} {compute_dtype} datasheet",
                                   peak_flops_per_s=peak * 1e12, bandwidth_bytes_per_s=bw * 1e9))
    elif not cal:
        bw = hw.mem_bandwidth_bytes_per_s
        kind = "measured (llmperf calibrate)" if measured_spec else "datasheet"
        roofs.append(F.Ceiling(label=f"{hw.name} {compute_dtype} {kind}", calibrated=measured_spec,
                               peak_flops_per_s=hw.peak_flops_per_s(compute_dtype), bandwidth_bytes_per_s=bw))
        if compute_dtype != "fp32" and "fp32" in hw.peak_tflops and not measured_spec:
            roofs.append(F.Ceiling(label=f"{hw.name} fp32 (vector) datasheet",
                                   peak_flops_per_s=hw.peak_flops_per_s("fp32"), bandwidth_bytes_per_s=bw))
    roofs.extend(calibrated_ceilings(hw, compute_dtype))
    return roofs


def calibrated_ceilings(hw: HardwareSpec, compute_dtype: str) -> list[F.Ceiling]:
    """Measured ceilings from `llmperf calibrate` (`calibration.ceilings`: memory_gbps, peak_tflops per
    dtype), when the spec carries them; none otherwise."""
    cal = hw.calibration if isinstance(hw.calibration, dict) else {}
    ceilings = cal.get("ceilings") if cal else None
    if not isinstance(ceilings, dict):
        return []
    peak = _peak_tflops(ceilings.get("peak_tflops"), compute_dtype)
    bw = ceilings.get("memory_gbps")
    if not peak or not isinstance(bw, (int, float)) or bw <= 0:
        return []
    return [F.Ceiling(label=f"{hw.name} measured (llmperf calibrate)", peak_flops_per_s=peak * 1e12,
                      bandwidth_bytes_per_s=float(bw) * 1e9, calibrated=True)]


# typical's accuracy ----------------------------------------------------------------------------
def typical_section(root: str | None = None) -> Section:
    """Vidur's measured operator times (the extract committed under `reports/vidur`, or `root`)
    against `--efficiency typical`'s predictions, computed now by llmperf's operator model
    (`llmperf.measure.vidur.predictions`)."""
    from llmperf.measure.vidur import default_dir, predictions

    frame = predictions(root)
    src = default_dir() if root is None else root
    err = np.abs(frame["predicted_s"] / frame["measured_s"] - 1)
    facts = [(f"{d.upper()} {k}", f"median {np.median(e):.1%}, p90 {np.quantile(e, 0.9):.1%} (n={len(e):,})")
             for (d, k), e in err.groupby([frame["device"], frame["kind"]], sort=False)]
    note = (f"Measured: Vidur's fp16 operator times (github.com/microsoft/vidur, MIT licence; extract in {src}). "
            "Predicted: each row's operator built by llmperf's operator model (fp16, the row's TP degree and "
            "tokens) and priced by the typical time model at report time.")
    fig = F.typical_figure(frame, title="How good is typical: Vidur's measured operators (A100, H100)")
    return Section(kind="typical", title="Typical time model against measured operators", facts=facts,
                   figures=[fig], notes=[note], attachments={"typical-vs-vidur.csv": frame})


# estimate --------------------------------------------------------------------------------------
def estimate_section(spec: EstimateSpec) -> Section:
    """Run the estimate (and the sweep) through the public API and draw figures 1-6 and 8."""
    t0 = time.perf_counter()
    model = load_model(spec.models[0])
    hw = load_hardware(spec.hardware[0])
    b0, p0, g0 = int(spec.batch[0]), int(spec.prompt_len[0]), int(spec.gen_len[0])
    from llmperf.analysis.roofline import engine_label
    from llmperf.analysis.timemodel import TIME_MODELS, default_efficiency, load_engine, time_model_for
    if spec.efficiency is not None and spec.efficiency not in TIME_MODELS:
        raise SpecError(f"--efficiency: must be one of {', '.join(TIME_MODELS)}, got {spec.efficiency!r}")
    if spec.engine is not None:
        load_engine(spec.engine)

    def time_model(device, dtype):  # noqa: ANN001, ANN202 - each device its own expected time
        return time_model_for(device, spec.efficiency or default_efficiency(device), dtype, engine=spec.engine)
    common = dict(tp=spec.tp, pp=spec.pp, block_size=spec.block_size, mem_util=spec.mem_util, **spec.layout_kwargs,
                  **spec.precision_kwargs, time_model=time_model)
    est = llmperf.estimate(model, hw, batch=b0, prompt_len=p0, gen_len=g0, attention=spec.attention, **common)
    naive = llmperf.estimate(model, hw, batch=b0, prompt_len=p0, gen_len=g0, attention="naive", **common)
    fused = llmperf.estimate(model, hw, batch=b0, prompt_len=p0, gen_len=g0, attention="fused", **common)
    dtype = est.prefill.compute_dtype
    head = (f"{model.name} on {hw.name} · {est.precision} · batch {b0} · prompt {p0} · gen {g0}"
            + (f" · tp {spec.tp}" if spec.tp > 1 else "") + (f" · pp {spec.pp}" if spec.pp > 1 else "")
            + (f" · ep {spec.ep}" if spec.ep > 1 else "") + (" · dp attention" if spec.dp_attention else "")
            + (f" · EPLB {spec.eplb}" if spec.eplb is not None else "")
            + (f" · expert load {spec.expert_load.label()}" if spec.expert_load is not None else ""))

    full = llmperf.sweep(list(spec.models), list(spec.hardware), batch=list(spec.batch),
                         prompt_len=list(spec.prompt_len), gen_len=list(spec.gen_len), attention=spec.attention,
                         **common)
    limit = model.max_positions
    batches = _grid(spec.batch, 1, 1024)
    contexts = [c for c in _grid(spec.prompt_len, 128, min(limit, 1 << 17)) if c + g0 <= limit] or [p0]
    main_sweep = llmperf.sweep(model, hw, batch=batches, prompt_len=_pick(contexts, 5), gen_len=[g0],
                               attention=spec.attention, **common)

    figs = [
        F.roofline_figure(_estimate_points(est), ceilings_for(hw, dtype), title=f"Roofline: {head}"),
        F.breakdown_figure(est.ops_frame()[["phase", "op", "time_s", "bound"]], title=f"Time per operator: {head}"),
        F.batch_figure(_batch_frame(main_sweep, est.time_model.name),
                       title=f"Decode against batch: {model.name} on {hw.name}, {g0} generated tokens",
                       critical={f"critical batch, context {p0 + g0:,}": est.regimes.critical_batch,
                                 "linear layers compute-bound": est.regimes.critical_batch_matmul}),
        F.context_figure(_context_frame(spec, model, hw, b0, contexts),
                         title=f"Attention's share against context: {model.name} on {hw.name}, batch {b0}"),
        _memory(spec, model, hw, main_sweep, est),
        F.attention_figure(_attention_frame(naive, fused), shape=f"batch {b0}, prompt {p0} ({model.name}, "
                           f"{model.num_heads} heads x {model.head_dim}, {model.num_layers} layers) on {hw.name}",
                           title=f"Naive vs fused attention: {model.name} on {hw.name}"),
    ]
    compare = list(dict.fromkeys([hw.name, *spec.compare]))
    dev = llmperf.sweep(model, compare, batch=batches, prompt_len=[p0], gen_len=[g0], attention=spec.attention,
                        **common)
    figs.append(F.devices_figure(dev[["hardware", "batch", "ttft_s", "tpot_s", "ridge_point"]],
                                 title=f"{model.name} on several devices: prompt {p0}, {g0} generated tokens"))
    facts = [
        ("time to first token", f"{est.ttft_s * 1e3:,.3f} ms expected, {est.row['ttft_bound_s'] * 1e3:,.3f} ms bound"),
        ("time per output token",
         f"{est.tpot_s * 1e3:,.3f} ms expected, {est.row['tpot_bound_s'] * 1e3:,.3f} ms bound"),
        ("throughput", f"{est.tokens_per_s:,.1f} tokens/s"),
        ("prefill / decode bound", f"{est.prefill.bound} / {est.decode_first.bound}"),
        ("ridge point", f"{est.regimes.ridge_point:,.1f} FLOP/B ({dtype})"),
        ("critical batch (decode compute-bound)", f"{est.regimes.critical_batch:,}" if est.regimes.critical_batch
         else "none"),
        ("memory", f"{est.memory.total_bytes / 2**30:,.2f} GiB of {hw.memory_gib:,.1f} GiB "
                   f"({'fits' if est.memory.fits else 'does not fit'}); largest batch {est.memory.max_batch:,}"),
        ("configurations in the sweep", f"{len(full):,}"),
    ]
    tm = est.time_model
    note = (f"Estimated with the {tm.name} time model" + (f" (engine profile {engine_label(tm)})"
                                                          if tm.name != "roofline" else " (the bound)")
            + f", the roofline bound beside it, in {time.perf_counter() - t0:.2f} s.")
    return Section(kind="estimate", title=f"Estimate: {head}", facts=facts, figures=figs,
                   tables=[(f"Sweep ({min(len(full), 50)} of {len(full):,} rows; all of them in sweep.csv)",
                            full.head(50))],
                   attachments={"sweep.csv": full}, notes=[note])


def _estimate_points(est) -> pd.DataFrame:  # noqa: ANN001
    ops = est.ops_frame()
    with np.errstate(divide="ignore", invalid="ignore"):
        fps = np.where(ops["time_s"] > 0, ops["flops"] / ops["time_s"], 0.0)
    return pd.DataFrame(dict(phase=ops["phase"], op=ops["op"], kind=est.time_model.name, intensity=ops["intensity"],
                             flops_per_s=fps))


def _batch_frame(sweep: pd.DataFrame, time_model: str) -> pd.DataFrame:
    """Decode step against batch: the expected time (`time_model`) and, beside it, the roofline bound."""
    series = [f"context {p:,}" for p in sweep["prompt_len"]]
    frames = [pd.DataFrame(dict(series=series, kind=time_model, batch=sweep["batch"], step_s=sweep["tpot_s"]))]
    if time_model != "roofline":
        frames.append(pd.DataFrame(dict(series=series, kind="roofline", batch=sweep["batch"],
                                        step_s=sweep["tpot_bound_s"])))
    return pd.concat(frames, ignore_index=True)


def _context_frame(spec: EstimateSpec, model, hw: HardwareSpec, batch: int, contexts: Sequence[int]) -> pd.DataFrame:  # noqa: ANN001
    """Attention's share of one forward pass at every context at once (the cost functions take arrays)."""
    prec = resolve_precision(model, spec.precision, weights=spec.weights, activations=spec.activations, kv=spec.kv)
    fm = ForwardModel(model=model, precision=prec, attention=spec.attention, tp=spec.tp, ep=spec.ep,
                      dp_attention=spec.dp_attention, mla_mode=spec.mla_mode, expert_load=spec.expert_load,
                      eplb=spec.eplb)
    dtype = hw.compute_dtype(prec.activations)
    ctx = np.asarray(sorted(contexts), dtype=np.int64)
    frames = []
    for phase, q_len in (("prefill", ctx), ("decode", 1 + 0 * ctx)):
        sums = {k: np.zeros(ctx.size) for k in ("flops", "bytes", "time", "attn_flops", "attn_bytes", "attn_time")}
        for cost in fm.forward_ops(batch, q_len, ctx):
            t = op_time(cost, hw, dtype)
            parts = {"flops": cost.flops, "bytes": cost.bytes_total, "time": t.time_s}
            for key, value in parts.items():
                sums[key] = sums[key] + value
                if cost.name in _ATTN:
                    sums[f"attn_{key}"] = sums[f"attn_{key}"] + value
        with np.errstate(divide="ignore", invalid="ignore"):
            frames.append(pd.DataFrame(dict(phase=phase, context=ctx, **{
                f"{k}_share": np.where(sums[k] > 0, sums[f"attn_{k}"] / sums[k], 0.0)
                for k in ("flops", "bytes", "time")})))
    return pd.concat(frames, ignore_index=True)


def _memory(spec: EstimateSpec, model, hw: HardwareSpec, sweep: pd.DataFrame, est) -> F.ReportFigure:  # noqa: ANN001
    """Memory against batch per context, and KV utilisation per context: `llmperf.sweep` columns."""
    frame = pd.DataFrame(dict(context=sweep["prompt_len"] + sweep["gen_len"], batch=sweep["batch"],
                              weights_gib=sweep["weights_gib"], kv_cache_gib=sweep["kv_cache_gib"],
                              activation_peak_gib=sweep["activation_peak_gib"], total_gib=sweep["total_gib"],
                              max_batch=sweep["max_batch"]))
    util = (sweep.assign(context=sweep["prompt_len"] + sweep["gen_len"])
            .groupby("context", as_index=False)[["kv_util_contiguous", "kv_util_paged"]].first()
            .rename(columns={"kv_util_contiguous": "contiguous", "kv_util_paged": "paged"}))
    max_seq = int(sweep["max_seq_len"].iloc[0]) if "max_seq_len" in sweep else model.max_positions
    usable = float(sweep["usable_gib"].iloc[0]) if "usable_gib" in sweep else hw.memory_gib * spec.mem_util
    return F.memory_figure(frame, util, device_gib=hw.memory_gib, usable_gib=usable,
                           title=f"Memory: {model.name} ({est.precision}) on {hw.name}, "
                                 f"{int(spec.gen_len[0])} generated tokens; contiguous cache reserves {max_seq:,} "
                                 f"tokens, blocks of {spec.block_size}")


def _attention_frame(naive, fused) -> pd.DataFrame:  # noqa: ANN001
    rows = []
    for impl, est in (("naive", naive), ("fused", fused)):
        for phase_est in (est.prefill, est.decode_first):
            frame = phase_est.to_frame()
            # one bar segment per operator, summed over the layer kinds (sliding and full layers, ...)
            attn = frame[frame["op"].isin(_ATTN)].groupby("op", sort=False)[["bytes_total", "time_s"]].sum()
            for op, r in attn.iterrows():
                rows.append(dict(phase=frame["phase"].iloc[0], impl=impl, op=op, bytes=r["bytes_total"],
                                 time_s=r["time_s"]))
    return pd.DataFrame(rows)


# profile ---------------------------------------------------------------------------------------
def profile_hardware(run: ProfileRun) -> HardwareSpec | None:
    """The device spec a profile ran against: a spec stored in run.json, or a built-in name. A name that
    is not built in (e.g. a local device described at run time) gives None: no ceilings are drawn."""
    stored = run.manifest.settings.hardware_spec
    if stored is not None:
        try:
            return hardware_from_mapping(stored, origin=run.hardware)
        except (TypeError, ValueError):
            return None
    if run.hardware in list_hardware():
        return load_hardware(run.hardware)
    return None


def profile_section(run: ProfileRun) -> Section:
    """Figures 1, 2, 3 and 7 from a profile run: measured beside predicted."""
    ops = run.ops
    title = f"Profile: {run.model} on {run.hardware} ({run.path})"
    figs = []
    micro = ops[ops["kind"] == "micro"] if (ops["kind"] == "micro").any() else ops
    pts = []
    for kind, col in (("measured", "measured_s"), ("roofline", "predicted_roofline_s"),
                      ("calibrated", "predicted_calibrated_s")):
        t = pd.to_numeric(micro[col], errors="coerce")
        with np.errstate(divide="ignore", invalid="ignore"):
            fps = np.where(t > 0, micro["flops"] / t, np.nan)
        pts.append(pd.DataFrame(dict(phase=micro["phase"], op=micro["op"], kind=kind, intensity=micro["intensity"],
                                     flops_per_s=fps)))
    points = pd.concat(pts, ignore_index=True).dropna(subset=["flops_per_s"])
    hw = profile_hardware(run)
    settings = run.manifest.settings
    dtype = str(settings.compute_dtype or settings.dtype or "fp32")
    try:
        ceilings = ceilings_for(hw, hw.compute_dtype(dtype)) if hw is not None else []
    except SpecError:
        ceilings = ceilings_for(hw, "fp32") if hw is not None else []
    figs.append(F.roofline_figure(points, ceilings,
                                  title=f"Roofline, measured and predicted: {run.model} on {run.hardware}",
                                  label_ops=False))
    gen = ops[ops["kind"] == "generation"]
    source = gen if len(gen) else ops
    breakdown = source.groupby(["phase", "op"], sort=False).agg(time_s=("measured_s", "sum"),
                                                                 bound=("bound", "first")).reset_index()
    figs.append(F.breakdown_figure(breakdown,
                                   title=f"Measured time per operator ({'generation' if len(gen) else 'micro'}"
                                                    f" rows; bound as predicted): {run.model} on {run.hardware}"))
    batch = _profile_batch_frame(run)
    if batch is not None:
        figs.append(F.batch_figure(batch, title="Decode against batch, measured and predicted: "
                                                f"{run.model} on {run.hardware}"))
    err = pd.concat([pd.DataFrame(dict(phase=ops["phase"], op=ops["op"], model=m,
                                       ratio=pd.to_numeric(ops[c], errors="coerce")))
                     for m, c in (("roofline", "ratio_roofline"), ("calibrated", "ratio_calibrated"))],
                     ignore_index=True)
    figs.append(F.error_figure(err.dropna(subset=["ratio"]),
                               title=f"Predicted / measured: {run.model} on {run.hardware}"))
    facts = [("created", "?" if run.manifest.created is None else run.manifest.created),
             ("git commit", str(run.manifest.git_commit))]
    facts += [(f"device {k}", str(v)) for k, v in list(run.manifest.device.items())[:8]]
    tables = [("Errors (|predicted - measured| / measured)", run.errors), ("Checks", run.checks)]
    if run.generations is not None:
        tables.append(("Generations (seconds)", run.generations))
    notes = [] if ceilings else [f"Hardware {run.hardware!r} is not a built-in device and run.json stores no spec: "
                                 "the roofline chart shows no ceilings."]
    return Section(kind="profile", title=title, facts=facts, tables=tables, figures=figs, notes=notes)


def _profile_batch_frame(run: ProfileRun) -> pd.DataFrame | None:
    """Median decode step per batch from steps.csv (else TPOT per batch from generations.csv)."""
    rows = []
    if run.steps is not None and (run.steps["phase"] == "decode").any():
        dec = run.steps[run.steps["phase"] == "decode"]
        for kind, col in (("measured", "measured_s"), ("roofline", "predicted_roofline_s"),
                          ("calibrated", "predicted_calibrated_s")):
            med = dec.groupby("batch")[col].median()
            rows += [dict(series="decode steps", kind=kind, batch=b, step_s=v) for b, v in med.items()]
    elif run.generations is not None and len(run.generations):
        g = run.generations
        for kind, col in (("measured", "measured_tpot_s"), ("roofline", "predicted_tpot_s_roofline"),
                          ("calibrated", "predicted_tpot_s_calibrated")):
            med = g.groupby("batch")[col].median()
            rows += [dict(series="TPOT", kind=kind, batch=b, step_s=v) for b, v in med.items()]
    frame = pd.DataFrame(rows, columns=["series", "kind", "batch", "step_s"])
    frame = frame[pd.to_numeric(frame["step_s"], errors="coerce") > 0]
    return frame if len(frame) else None


# simulate --------------------------------------------------------------------------------------
def slo_targets(settings: object) -> dict[str, float]:
    """TTFT/TPOT targets (seconds) from a simulate run's settings, under the names simulate uses."""
    out: dict[str, float] = {}
    if not isinstance(settings, dict):
        return out
    flat = dict(settings)
    if isinstance(settings.get("slo"), dict):
        flat.update({f"slo_{k}": v for k, v in settings["slo"].items()})
    for key, value in flat.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            continue
        k = str(key).lower()
        if "slo" in k or "target" in k:
            if "ttft" in k:
                out["ttft_s"] = float(value) / (1e3 if k.endswith("_ms") else 1)
            elif "tpot" in k:
                out["tpot_s"] = float(value) / (1e3 if k.endswith("_ms") else 1)
    return out


def simulate_section(run: SimulateRun) -> Section:
    title = f"Simulate: {run.model} on {run.hardware} ({run.path})"
    fig = F.serving_figure(run.requests, run.steps, run.rates, slo=slo_targets(run.meta.get("settings")),
                           title=f"Serving {run.model} on {run.hardware}: {len(run.requests):,} requests")
    facts = []
    s = run.summary
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "end to end"), ("queue_s", "queueing")):
        q = s.get(key)
        if isinstance(q, dict):
            facts.append((f"{label} p50 / p90 / p99", " / ".join(
                f"{float(q[p]) * 1e3:,.2f} ms" if isinstance(q.get(p), (int, float)) else "?"
                for p in ("p50", "p90", "p99"))))
    for key, label in (("throughput_rps", "throughput (requests/s)"), ("tokens_per_s", "tokens/s"),
                       ("goodput_rps", "goodput (requests/s)"), ("preemptions", "preemptions"),
                       ("requests", "requests")):
        if isinstance(s.get(key), (int, float)):
            facts.append((label, f"{s[key]:,.4g}"))
    tables = []
    if run.rates is not None:
        tables.append(("Rate sweep", run.rates))
    settings = run.meta.get("settings")
    if isinstance(settings, dict):
        tables.append(("Settings", pd.DataFrame([(str(k), str(v)) for k, v in settings.items()],
                                                columns=["setting", "value"])))
    return Section(kind="simulate", title=title, facts=facts, tables=tables, figures=[fig])
