"""The report's charts: tidy frames in, a captioned matplotlib figure out. Nothing here computes a
prediction or a measurement; every number drawn is a column of the frame it is given (see
`llmperf.report.sources` for where the frames come from).

1 roofline, 2 time breakdown, 3 batch sweep, 4 context sweep, 5 memory, 6 naive vs fused attention,
7 prediction vs measurement (7b: typical against Vidur's measured operators), 8 several devices,
9 serving; and a capacity plan (`llmperf plan`) for the
notebooks.

The roofline chart follows Williams, Waterman & Patterson ("Roofline: an insightful visual
performance model", CACM 2009): attainable FLOP/s = min(peak, bandwidth x intensity), log-log, the
ridge point where the two roofs meet. The attention figure restates the point of Dao et al.
("FlashAttention", NeurIPS 2022, Fig. 1 and Sec. 3.2): the naive kernel's S and P round trips to HBM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from llmperf.report.style import (
    BLACK,
    BLUE,
    GREEN,
    HATCH_COMPUTE,
    ORANGE,
    PURPLE,
    SKY_BLUE,
    VERMILLION,
    YELLOW,
    marker_style,
    new_figure,
    phase_color,
    report_style,
    series_color,
)


@dataclass(frozen=True, kw_only=True)
class ReportFigure:
    """One chart: a short file-safe `name`, a title, a caption that says what to look at, the figure,
    and the frame it was drawn from."""

    name: str
    title: str
    caption: str
    figure: Figure = field(repr=False)
    data: pd.DataFrame = field(repr=False)

    def png(self, dpi: int | None = None) -> bytes:
        """The figure as PNG bytes (the report's resolution unless `dpi` is given)."""
        import io

        from llmperf.report.style import DPI
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=dpi or DPI)
        return buf.getvalue()

    def _repr_png_(self) -> bytes:  # Jupyter shows the chart when a cell ends with it
        return self.png()


@dataclass(frozen=True, kw_only=True)
class Ceiling:
    """A roof of the roofline chart: a peak (FLOP/s) and a bandwidth (bytes/s)."""

    label: str
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    calibrated: bool = False

    @property
    def ridge_point(self) -> float:
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s


def _require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: the frame lacks column {missing[0]!r}")


_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def time_unit(values: object, *, by: str = "median") -> tuple[float, str]:
    """(divisor, unit) that shows times in seconds with readable magnitudes (s, ms, µs, ns), chosen
    for the median value (log axes) or the largest (`by="max"`: bar lengths on a linear axis)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr) & (arr > 0)]
    ref = (float(np.max(arr)) if by == "max" else float(np.median(arr))) if arr.size else 1.0
    for scale, unit in _TIME_UNITS:
        if ref >= scale:
            return scale, unit
    return _TIME_UNITS[-1]


def _num(v: float) -> str:
    """A number with three significant digits, never in exponent form for everyday magnitudes."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _sources_legend(ax, kinds: Sequence[str], phases: Sequence[str] = ()) -> None:  # noqa: ANN001
    """One legend: a colour patch per phase, a marker per kind (measured, roofline, calibrated)."""
    handles = [Patch(color=phase_color(p), label=p) for p in phases]
    names = {"measured": "measured", "roofline": "predicted (roofline)",
             "calibrated": "predicted (calibrated)"}
    for k in kinds:
        handles.append(Line2D([], [], linestyle="none", markersize=6, label=names.get(k, k),
                              **marker_style(k, BLACK)))
    if handles:
        ax.legend(handles=handles, loc="best", frameon=False)


# 1 ---------------------------------------------------------------------------------------------
def roofline_figure(points: pd.DataFrame, ceilings: Sequence[Ceiling], *, title: str,
                    label_ops: bool = True) -> ReportFigure:
    """Operators at their arithmetic intensity (FLOP/B) and attained FLOP/s, under the device's roofs.

    `points`: columns phase, op, kind ('roofline' | 'typical' | 'calibrated' | 'measured'), intensity, flops_per_s.
    Rows without FLOPs or bytes (nothing to place on a log axis) are left out and counted.
    """
    _require(points, ("phase", "op", "kind", "intensity", "flops_per_s"), "roofline")
    ok = (points["intensity"] > 0) & (points["flops_per_s"] > 0) & np.isfinite(points["intensity"])
    shown, dropped = points[ok], points[~ok]
    with report_style():
        fig, (ax,) = new_figure(width=7.5, height=5.0)
        xs = shown["intensity"].to_numpy(dtype=float)
        lo = min([xs.min() / 3 if xs.size else 0.1] + [c.ridge_point / 1e3 for c in ceilings])
        hi = max([xs.max() * 3 if xs.size else 1e3] + [c.ridge_point * 30 for c in ceilings])
        grid = np.logspace(np.log10(lo), np.log10(hi), 200)
        for i, c in enumerate(ceilings):
            color = (BLACK if i == 0 else "#777777") if not c.calibrated else ORANGE
            style = "-" if not c.calibrated else "--"
            ax.plot(grid, np.minimum(c.peak_flops_per_s, c.bandwidth_bytes_per_s * grid), style,
                    color=color, linewidth=1.6 - 0.3 * min(i, 2),
                    label=f"{c.label} (ridge {c.ridge_point:,.1f} FLOP/B)")
            ax.axvline(c.ridge_point, color=color, linestyle=":", linewidth=0.8)
        kinds = [k for k in ("roofline", "typical", "calibrated", "measured") if k in set(shown["kind"])]
        phases = list(dict.fromkeys(shown["phase"]))
        for (phase, kind), grp in shown.groupby(["phase", "kind"], sort=False):
            ax.plot(grp["intensity"], grp["flops_per_s"], linestyle="none", markersize=6, alpha=0.9,
                    **marker_style(str(kind), phase_color(str(phase))))
        if label_ops and 0 < len(shown) <= 80:
            placed: list[tuple[float, float]] = []
            for _, r in shown[shown["kind"] == kinds[0]].iterrows():
                xy = (np.log10(r["intensity"]), np.log10(r["flops_per_s"]))
                if any(abs(xy[0] - a) < 0.25 and abs(xy[1] - b) < 0.12 for a, b in placed):
                    continue  # a label already sits there: keep the chart readable
                placed.append(xy)
                ax.annotate(str(r["op"]), (r["intensity"], r["flops_per_s"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points", color=phase_color(str(r["phase"])))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/B)")
        ax.set_ylabel("attained performance (FLOP/s)")
        ax.set_title(title)
        if ceilings:
            ax.add_artist(ax.legend(loc="lower right", frameon=False))
        handles = [Patch(color=phase_color(p), label=p) for p in phases]
        names = {"measured": "measured", "roofline": "predicted (roofline)", "typical": "predicted (typical)",
                 "calibrated": "predicted (calibrated)"}
        handles += [Line2D([], [], linestyle="none", markersize=6, label=names[k], **marker_style(k, BLACK))
                    for k in kinds]
        ax.legend(handles=handles, loc="upper left", frameon=False)
    ceil_text = "; ".join(f"{c.label}: {c.peak_flops_per_s / 1e12:,.3g} TFLOP/s, "
                          f"{c.bandwidth_bytes_per_s / 1e9:,.4g} GB/s" for c in ceilings)
    caption = ("Each operator sits at its arithmetic intensity. Left of a ridge point (dotted) it is "
               "memory-bound: its height is capped by the slanted bandwidth roof; right of it, by the flat "
               "compute roof. Look at where decode (one token per sequence) sits compared with prefill: "
               "far to the left, on the slope." + (f" Roofs: {ceil_text}." if ceilings else
                                                   " No device ceilings are known for this run."))
    if len(dropped):
        caption += f" {len(dropped)} rows without FLOPs or bytes (e.g. {dropped['op'].iloc[0]}) are not drawn."
    return ReportFigure(name="roofline", title="Roofline", caption=caption, figure=fig, data=points)


# 2 ---------------------------------------------------------------------------------------------
def breakdown_figure(frame: pd.DataFrame, *, title: str) -> ReportFigure:
    """Time per operator, one panel per phase; solid bars are memory-bound time, hatched compute-bound.

    `frame`: columns phase, op, time_s, bound ('memory' | 'compute' | 'comm')."""
    _require(frame, ("phase", "op", "time_s", "bound"), "time breakdown")
    phases = list(dict.fromkeys(frame["phase"]))
    with report_style():
        fig, axes = new_figure(ncols=max(len(phases), 1), width=4.0 * max(len(phases), 1) + 1,
                               height=0.22 * frame["op"].nunique() + 1.8)
        shares = []
        for ax, phase in zip(axes, phases):
            grp = frame[frame["phase"] == phase].groupby("op", sort=False).agg(
                time_s=("time_s", "sum"), bound=("bound", "first")).reset_index()
            scale, unit = time_unit(grp["time_s"], by="max")
            y = np.arange(len(grp))
            color = phase_color(str(phase))
            ax.barh(y, grp["time_s"] / scale, color=[color if b == "memory" else "white" for b in grp["bound"]],
                    edgecolor=color, hatch=[HATCH_COMPUTE if b != "memory" else "" for b in grp["bound"]])
            ax.set_yticks(y, grp["op"])
            ax.invert_yaxis()
            total = grp["time_s"].sum()
            mem = grp.loc[grp["bound"] == "memory", "time_s"].sum()
            shares.append(f"{phase}: {mem / total:.0%} memory-bound" if total else f"{phase}: no time")
            ax.set_title(f"{phase} ({_num(total / scale)} {unit}; {mem / total:.0%} memory-bound)" if total
                         else str(phase))
            ax.set_xlabel(f"time ({unit})")
            ax.set_ylabel("operator")
        axes[0].legend(handles=[Patch(facecolor=BLACK, label="memory-bound"),
                                Patch(facecolor="white", edgecolor=BLACK, hatch=HATCH_COMPUTE,
                                      label="compute-bound")], loc="lower right", frameon=False)
        fig.suptitle(title)
    caption = ("Where the time goes, operator by operator: solid bars are time spent under the memory "
               "roof, hatched bars under the compute roof. Look at the weight matmuls: compute-bound in "
               "prefill, memory-bound in decode. " + "; ".join(shares) + ".")
    return ReportFigure(name="breakdown", title="Time breakdown", caption=caption, figure=fig, data=frame)


# 3 ---------------------------------------------------------------------------------------------
def batch_figure(frame: pd.DataFrame, *, title: str, critical: Mapping[str, int | None] | None = None
                 ) -> ReportFigure:
    """Decode step time and decode tokens/s against batch.

    `frame`: columns series (e.g. 'context 512'), kind ('roofline' | 'typical' | 'calibrated' | 'measured'),
    batch, step_s. `critical`: label -> batch at which decode turns compute-bound (vertical lines)."""
    _require(frame, ("series", "kind", "batch", "step_s"), "batch sweep")
    data = frame.assign(tokens_per_s=frame["batch"] / frame["step_s"])
    with report_style():
        fig, (ax_t, ax_r) = new_figure(ncols=2, width=10.0, height=4.2)
        scale, unit = time_unit(data["step_s"])
        series = list(dict.fromkeys(data["series"]))
        for i, s in enumerate(series):
            for kind, grp in data[data["series"] == s].groupby("kind", sort=False):
                grp = grp.sort_values("batch")
                style = marker_style(str(kind), series_color(i))
                ls = "-" if kind == "roofline" else ("none" if kind == "measured" else "--")  # a time model: dashed
                label = f"{s}, {'measured' if kind == 'measured' else f'predicted ({kind})'}"
                ax_t.plot(grp["batch"], grp["step_s"] / scale, linestyle=ls, color=series_color(i),
                          markersize=4, label=label, **style)
                ax_r.plot(grp["batch"], grp["tokens_per_s"], linestyle=ls, color=series_color(i),
                          markersize=4, **style)
        notes = []
        for j, (label, b) in enumerate((critical or {}).items()):
            if b:
                for ax in (ax_t, ax_r):
                    ax.axvline(b, color=[GREEN, PURPLE, SKY_BLUE][j % 3], linestyle=":", linewidth=1.2)
                ax_r.annotate(f"{label}: {b:,}", (b, 0.02 + 0.07 * j), xycoords=("data", "axes fraction"),
                              fontsize=7, rotation=90, va="bottom", ha="right")
                notes.append(f"{label} at batch {b:,}")
        for ax in (ax_t, ax_r):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch (sequences)")
        ax_t.set_ylabel(f"decode step time ({unit})")
        ax_r.set_ylabel("decode throughput (tokens/s)")
        ax_t.legend(frameon=False, fontsize=7)
        fig.suptitle(title)
    caption = ("Decode reads every weight once per step whatever the batch, so the step time stays flat "
               "while the batch grows and throughput rises almost linearly; past the critical batch the "
               "step turns compute-bound and the time starts to grow with the batch. Look for the knee. "
               + (("Marked: " + "; ".join(notes) + ".") if notes else "No critical batch in this range."))
    return ReportFigure(name="batch", title="Batch sweep", caption=caption, figure=fig, data=data)


# 4 ---------------------------------------------------------------------------------------------
def context_figure(frame: pd.DataFrame, *, title: str) -> ReportFigure:
    """Attention's share of FLOPs, bytes and time as the context grows, per phase.

    `frame`: columns phase, context, flops_share, bytes_share, time_share (fractions 0..1)."""
    _require(frame, ("phase", "context", "flops_share", "bytes_share", "time_share"), "context sweep")
    with report_style():
        fig, axes = new_figure(ncols=3, width=11.0, height=3.8)
        for ax, col, what in zip(axes, ("flops_share", "bytes_share", "time_share"), ("FLOPs", "bytes", "time")):
            for phase, grp in frame.groupby("phase", sort=False):
                grp = grp.sort_values("context")
                ax.plot(grp["context"], 100 * grp[col], "-", color=phase_color(str(phase)), label=str(phase),
                        markersize=4, **marker_style("roofline", phase_color(str(phase))))
            ax.axhline(50, color=BLACK, linestyle=":", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 100)
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(f"attention share of {what} (%)")
            ax.set_title(f"{what}")
        axes[0].legend(frameon=False)
        fig.suptitle(title)
    caption = ("Attention's share of the layer grows with the context: in prefill its FLOPs grow with the "
               "square of the prompt, in decode its KV-cache reads grow with the context while the weights "
               "stay fixed. Look where each curve crosses 50% (dotted): beyond it, attention is the model.")
    return ReportFigure(name="context", title="Context sweep", caption=caption, figure=fig, data=frame)


# 5 ---------------------------------------------------------------------------------------------
def memory_figure(frame: pd.DataFrame, kv_util: pd.DataFrame, *, device_gib: float, usable_gib: float,
                  title: str) -> ReportFigure:
    """Weights + KV cache (+ activations) against batch for several contexts, under the device's
    memory; and the share of reserved KV bytes that hold tokens, contiguous vs paged.

    `frame`: columns context, batch, weights_gib, kv_cache_gib, activation_peak_gib, total_gib,
    max_batch. `kv_util`: columns context, contiguous, paged (fractions)."""
    _require(frame, ("context", "batch", "weights_gib", "kv_cache_gib", "total_gib", "max_batch"), "memory")
    _require(kv_util, ("context", "contiguous", "paged"), "KV utilisation")
    with report_style():
        fig, (ax_m, ax_u) = new_figure(ncols=2, width=10.5, height=4.2)
        notes = []
        for i, (ctx, grp) in enumerate(frame.groupby("context", sort=True)):
            grp = grp.sort_values("batch")
            color = series_color(i)
            ax_m.plot(grp["batch"], grp["total_gib"], "-", color=color, label=f"context {int(ctx):,}")
            mb = int(grp["max_batch"].iloc[0])
            if mb >= 1:
                ax_m.plot([mb], [usable_gib], linestyle="none", color=color, **marker_style("roofline", color))
                notes.append(f"{mb:,} at {int(ctx):,} tokens")
        weights = float(frame["weights_gib"].iloc[0]) if len(frame) else 0.0
        ax_m.axhline(weights, color=BLACK, linestyle="-.", linewidth=1, label=f"weights {weights:,.1f} GiB")
        ax_m.axhline(device_gib, color=BLACK, linewidth=1.5, label=f"device {device_gib:,.1f} GiB")
        ax_m.axhline(usable_gib, color=BLACK, linestyle="--", linewidth=1, label=f"usable {usable_gib:,.1f} GiB")
        ax_m.set_xscale("log", base=2)
        ax_m.set_yscale("log")
        ax_m.set_xlabel("batch (sequences)")
        ax_m.set_ylabel("memory per GPU (GiB)")
        ax_m.set_title("weights + KV cache + activations")
        ax_m.legend(frameon=False, fontsize=7)
        ku = kv_util.sort_values("context")
        ax_u.plot(ku["context"], 100 * ku["contiguous"], "-", color=ORANGE, label="contiguous (reserves max_seq_len)",
                  **marker_style("roofline", ORANGE))
        ax_u.plot(ku["context"], 100 * ku["paged"], "-", color=SKY_BLUE, label="paged (blocks)",
                  **marker_style("calibrated", SKY_BLUE))
        ax_u.set_xscale("log", base=2)
        ax_u.set_ylim(0, 105)
        ax_u.set_xlabel("context at the end of the generation (tokens)")
        ax_u.set_ylabel("KV bytes holding tokens / reserved (%)")
        ax_u.set_title("KV cache utilisation")
        ax_u.legend(frameon=False, fontsize=7)
        fig.suptitle(title)
    caption = ("Left: memory grows linearly with the batch at a slope set by the context (KV bytes per "
               "sequence); where a line meets the usable line (dashed) is the largest batch that fits "
               f"(marked: {'; '.join(notes) if notes else 'none fits'}). Right: a contiguous cache reserves "
               "the longest possible sequence for every request and wastes most of it at short contexts; "
               "a paged cache wastes less than one block per sequence.")
    return ReportFigure(name="memory", title="Memory", caption=caption, figure=fig,
                        data=frame.merge(kv_util, on="context", how="left"))


# 6 ---------------------------------------------------------------------------------------------
def attention_figure(frame: pd.DataFrame, *, title: str, shape: str) -> ReportFigure:
    """HBM bytes and time of naive (S and P written to memory) vs fused attention, per phase.

    `frame`: columns phase, impl ('naive' | 'fused'), op, bytes, time_s."""
    _require(frame, ("phase", "impl", "op", "bytes", "time_s"), "attention")
    totals = frame.groupby(["phase", "impl"], sort=False)[["bytes", "time_s"]].sum().reset_index()
    phases = list(dict.fromkeys(frame["phase"]))
    with report_style():
        fig, axes = new_figure(ncols=2, nrows=max(len(phases), 1), width=10.0, height=1.9 * max(len(phases), 1) + 0.8)
        for row, phase in enumerate(phases):
            ax_b, ax_t = axes[2 * row], axes[2 * row + 1]
            sub = frame[frame["phase"] == phase]
            scale, unit = time_unit(sub.groupby("impl")["time_s"].sum(), by="max")
            labels = []
            for pos, impl in enumerate(i for i in ("naive", "fused") if (sub["impl"] == i).any()):
                part = sub[sub["impl"] == impl]
                left_b = left_t = 0.0
                for j, (_, r) in enumerate(part.iterrows()):
                    kw = dict(color=phase_color(str(phase)), edgecolor=BLACK, linewidth=0.5,
                              alpha=1.0 - 0.2 * (j % 4), hatch=("", "..", "//", "xx")[j % 4], label=str(r["op"]))
                    ax_b.barh(pos, r["bytes"] / 1e9, left=left_b, **kw)
                    ax_t.barh(pos, r["time_s"] / scale, left=left_t, **kw)
                    left_b += r["bytes"] / 1e9
                    left_t += r["time_s"] / scale
                ax_b.annotate(f" {_num(left_b)} GB", (left_b, pos), va="center", fontsize=7)
                ax_t.annotate(f" {_num(left_t)} {unit}", (left_t, pos), va="center", fontsize=7)
                labels.append(f"{impl}")
            for ax in (ax_b, ax_t):
                ax.set_yticks(range(len(labels)), labels)
                ax.invert_yaxis()
                ax.set_ylabel(f"{phase}: kernel")
                ax.margins(x=0.18)
            ax_b.set_xlabel("HBM traffic (GB)")
            ax_t.set_xlabel(f"time ({unit})")
            if row == 0:
                ax_t.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.suptitle(title)
    ratios = []
    for phase, grp in totals.groupby("phase", sort=False):
        by = grp.set_index("impl")
        if {"naive", "fused"} <= set(by.index) and by.loc["fused", "bytes"] > 0:
            ratios.append(f"{phase}: {by.loc['naive', 'bytes'] / by.loc['fused', 'bytes']:,.1f}x the bytes, "
                          f"{by.loc['naive', 'time_s'] / by.loc['fused', 'time_s']:,.1f}x the time")
    caption = (f"Attention at {shape}. A naive kernel writes the score matrix S and the probabilities P "
               "to HBM and reads them back; a fused (FlashAttention) kernel keeps them on chip and moves "
               "only Q, K, V and the output. Look at the length of the naive bars: " +
               ("; ".join(ratios) if ratios else "no comparison available") + " (log axes).")
    return ReportFigure(name="attention", title="Naive vs fused attention", caption=caption, figure=fig,
                        data=frame)


# 7 ---------------------------------------------------------------------------------------------
def error_figure(frame: pd.DataFrame, *, title: str) -> ReportFigure:
    """Predicted / measured time per operator and phase, for the roofline and the calibrated model.

    `frame`: columns phase, op, model ('roofline' | 'calibrated'), ratio (predicted / measured)."""
    _require(frame, ("phase", "op", "model", "ratio"), "prediction vs measurement")
    data = frame[np.isfinite(frame["ratio"]) & (frame["ratio"] > 0)]
    keys = list(dict.fromkeys(zip(data["phase"], data["op"])))
    medians = data.groupby(["phase", "op", "model"], sort=False)["ratio"].median().reset_index()
    with report_style():
        fig, (ax,) = new_figure(width=7.5, height=0.28 * max(len(keys), 4) + 1.6)
        index = {k: i for i, k in enumerate(keys)}
        offsets = {"roofline": -0.15, "calibrated": 0.15}
        for (phase, model), grp in data.groupby(["phase", "model"], sort=False):
            y = np.array([index[(phase, o)] for o in grp["op"]]) + offsets.get(str(model), 0)
            style = marker_style(str(model), phase_color(str(phase)))
            ax.plot(grp["ratio"], y, linestyle="none", markersize=3, alpha=0.35, **style)
        for _, r in medians.iterrows():
            y = index[(r["phase"], r["op"])] + offsets.get(str(r["model"]), 0)
            ax.plot([r["ratio"]], [y], linestyle="none", markersize=7,
                    **marker_style(str(r["model"]), phase_color(str(r["phase"]))))
        ax.axvline(1.0, color=BLACK, linewidth=1)
        for f in (0.5, 2.0):
            ax.axvline(f, color=BLACK, linestyle=":", linewidth=0.8)
        ax.set_yticks(range(len(keys)), [f"{o} ({p})" for p, o in keys])
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("predicted / measured time (ratio; 1 = exact)")
        ax.set_ylabel("operator (phase)")
        ax.set_title(title)
        _sources_legend(ax, [m for m in ("roofline", "calibrated") if m in set(data["model"])],
                        list(dict.fromkeys(data["phase"])))
    summary = []
    for model, grp in data.groupby("model", sort=False):
        err = np.abs(np.log(grp["ratio"].to_numpy(dtype=float)))
        summary.append(f"{model}: median |log ratio| {np.median(err):.2f} (x{np.exp(np.median(err)):.2f})")
    caption = ("Each operator's predicted time over its measured time (small markers: each shape; large: "
               "the median). Left of 1 the model is optimistic: the roofline assumes the device reaches its "
               "peaks, so its points sit left; the calibrated model should sit near 1. Dotted lines mark a "
               "factor of 2. " + ("; ".join(summary) + "." if summary else "No rows to compare."))
    return ReportFigure(name="errors", title="Prediction vs measurement", caption=caption, figure=fig, data=frame)


# 7b --------------------------------------------------------------------------------------------
def typical_figure(frame: pd.DataFrame, *, title: str, band: float = 0.2) -> ReportFigure:
    """Measured against predicted operator times (a parity plot, log-log), coloured by device, one
    marker per operator kind, with the line y = x and a +-`band` band.

    `frame`: columns device, kind ('GEMM' | 'small'), measured_s, predicted_s (and optionally
    fitted: whether the prediction's terms were fitted on that row's shapes)."""
    _require(frame, ("device", "kind", "measured_s", "predicted_s"), "typical vs measured operators")
    data = frame[np.isfinite(frame["measured_s"]) & np.isfinite(frame["predicted_s"])
                 & (frame["measured_s"] > 0) & (frame["predicted_s"] > 0)]
    devices = list(dict.fromkeys(data["device"]))
    kinds = list(dict.fromkeys(data["kind"]))
    markers = {"GEMM": "s", "small": "o"}
    # one hue per device, dark for its GEMMs and light for its small operators
    pairs = ((BLUE, SKY_BLUE), (VERMILLION, ORANGE), (GREEN, YELLOW), (PURPLE, BLACK))
    with report_style():
        fig, (ax,) = new_figure(width=6.5, height=5.5)
        div, unit = time_unit(np.concatenate([data["measured_s"].to_numpy(), data["predicted_s"].to_numpy()]))
        for i, device in enumerate(devices):
            for kind in kinds:
                grp = data[(data["device"] == device) & (data["kind"] == kind)]
                if len(grp):
                    ax.plot(grp["measured_s"] / div, grp["predicted_s"] / div, linestyle="none",
                            marker=markers.get(str(kind), "D"), markersize=3.5, alpha=0.45,
                            color=pairs[i % len(pairs)][0 if kind == "GEMM" else 1], markeredgewidth=0,
                            label=f"{str(device).upper()} {kind} (n={len(grp):,})")
        if len(data):
            lo = float(min(data["measured_s"].min(), data["predicted_s"].min())) / div / 1.5
            hi = float(max(data["measured_s"].max(), data["predicted_s"].max())) / div * 1.5
            x = np.geomspace(lo, hi, 50)
            ax.plot(x, x, color=BLACK, linewidth=1, label="predicted = measured")
            ax.fill_between(x, x * (1 - band), x * (1 + band), color=BLACK, alpha=0.08, linewidth=0,
                            label=f"within ±{band:.0%}")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel(f"measured time ({unit})")
        ax.set_ylabel(f"predicted time, typical ({unit})")
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=8)
    summary = []
    for (device, kind), grp in data.groupby(["device", "kind"], sort=False):
        err = np.abs(grp["predicted_s"].to_numpy() / grp["measured_s"].to_numpy() - 1)
        summary.append(f"{str(device).upper()} {kind}: median {np.median(err):.0%}, p90 {np.quantile(err, 0.9):.0%}, "
                       f"{np.mean(err <= band):.0%} within ±{band:.0%}")
    fitted = ""
    if "fitted" in data and data["fitted"].any():
        fitted = (f" {int(data['fitted'].sum()):,} of the {len(data):,} points (A100's 7-8B small operators) are "
                  "what typical's small-operator terms were fitted on; the rest are held out.")
    caption = ("Each point is one operator of one layer at one token count and TP degree, as Vidur measured it "
               "(fp16, CUDA events) against what llmperf predicts with --efficiency typical, building the "
               "operator exactly as estimate does. On the diagonal the prediction is exact; above it "
               "pessimistic, below it optimistic; the band is ±" f"{band:.0%}." + fitted + " "
               + ("; ".join(summary) + "." if summary else "No rows to compare."))
    return ReportFigure(name="typical", title="Typical vs measured operators", caption=caption, figure=fig,
                        data=frame)


# 8 ---------------------------------------------------------------------------------------------
def devices_figure(frame: pd.DataFrame, *, title: str) -> ReportFigure:
    """TTFT and decode time per token against batch on several devices, one colour per device.

    `frame`: columns hardware, batch, ttft_s, tpot_s, ridge_point."""
    _require(frame, ("hardware", "batch", "ttft_s", "tpot_s", "ridge_point"), "devices")
    with report_style():
        fig, (ax_p, ax_d, ax_r) = new_figure(ncols=3, width=12.0, height=4.0)
        scale_p, unit_p = time_unit(frame["ttft_s"])
        scale_d, unit_d = time_unit(frame["tpot_s"])
        for i, (hw, grp) in enumerate(frame.groupby("hardware", sort=False)):
            grp = grp.sort_values("batch")
            color = series_color(i)
            label = f"{hw} (ridge {float(grp['ridge_point'].iloc[0]):,.0f} FLOP/B)"
            ax_p.plot(grp["batch"], grp["ttft_s"] / scale_p, "-", color=color, label=label,
                      markersize=4, **marker_style("roofline", color))
            ax_d.plot(grp["batch"], grp["tpot_s"] / scale_d, "-", color=color, markersize=4,
                      **marker_style("roofline", color))
            ax_r.plot(grp["batch"], grp["batch"] / grp["tpot_s"], "-", color=color, markersize=4,
                      **marker_style("roofline", color))
        ax_p.set_ylabel(f"time to first token, prefill ({unit_p})")
        ax_d.set_ylabel(f"time per output token, decode ({unit_d})")
        ax_r.set_ylabel("decode throughput (tokens/s)")
        for ax, t in ((ax_p, "prefill"), (ax_d, "decode"), (ax_r, "decode throughput")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch (sequences)")
            ax.set_title(t)
        ax_p.legend(frameon=False, fontsize=7)
        fig.suptitle(title)
    caption = ("The same model and workload on each device (colour = device here; all predicted). Prefill "
               "follows the compute peaks, decode the memory bandwidths: look at how the gap between two "
               "devices changes from the prefill panel to the decode panel.")
    return ReportFigure(name="devices", title="Several devices", caption=caption, figure=fig, data=frame)


# 9 ---------------------------------------------------------------------------------------------
def _cdf(ax, values, color: str, label: str) -> None:  # noqa: ANN001
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if v.size:
        ax.step(v, np.arange(1, v.size + 1) / v.size * 100, where="post", color=color, label=label)


def serving_figure(requests: pd.DataFrame, steps: pd.DataFrame, rates: pd.DataFrame | None, *, title: str,
                   slo: Mapping[str, float] | None = None) -> ReportFigure:
    """TTFT and TPOT distributions, latency against request rate with the SLO knee, and the scheduler's
    KV utilisation and batch over time.

    `requests`: ttft_s, tpot_s. `steps`: start_s, phase, batch, kv_util. `rates` (optional): rate,
    ttft_p50, ttft_p99, tpot_p50, tpot_p99, meets_slo. `slo`: 'ttft_s' / 'tpot_s' targets (seconds)."""
    _require(requests, ("ttft_s", "tpot_s"), "serving requests")
    _require(steps, ("start_s", "phase", "batch", "kv_util"), "serving steps")
    slo = dict(slo or {})
    with report_style():
        fig, axes = new_figure(ncols=3, nrows=2, width=12.0, height=7.0)
        ax_ttft, ax_tpot, ax_rate, ax_kv, ax_batch, ax_q = axes
        for ax, col, phase, name in ((ax_ttft, "ttft_s", "prefill", "TTFT"), (ax_tpot, "tpot_s", "decode", "TPOT")):
            scale, unit = time_unit(requests[col])
            _cdf(ax, requests[col] / scale, phase_color(phase), name)
            if slo.get(col):
                ax.axvline(slo[col] / scale, color=BLACK, linestyle="--", linewidth=1,
                           label=f"SLO {slo[col] / scale:,.3g} {unit}")
            for q, ls in ((50, ":"), (99, "-.")):
                if len(requests):
                    ax.axvline(np.nanpercentile(requests[col], q) / scale, color=phase_color(phase),
                               linestyle=ls, linewidth=0.8, label=f"p{q}")
            ax.set_xlabel(f"{name} ({unit})")
            ax.set_ylabel("requests (%, cumulative)")
            ax.set_title(f"{name} distribution")
            ax.legend(frameon=False, fontsize=7)
        knee = None
        if rates is not None and len(rates):
            r = rates.sort_values("rate")
            scale, unit = time_unit(pd.concat([r["ttft_p99"], r["tpot_p99"]]))
            for col, phase, ls in (("ttft_p50", "prefill", ":"), ("ttft_p99", "prefill", "-"),
                                   ("tpot_p50", "decode", ":"), ("tpot_p99", "decode", "-")):
                ax_rate.plot(r["rate"], r[col] / scale, ls, color=phase_color(phase), label=col.replace("_", " "),
                             markersize=4, **marker_style("roofline", phase_color(phase)))
            for key, phase in (("ttft_s", "prefill"), ("tpot_s", "decode")):
                if slo.get(key):
                    ax_rate.axhline(slo[key] / scale, color=phase_color(phase), linestyle="--", linewidth=0.8,
                                    label=f"SLO {key.split('_')[0].upper()} {slo[key] / scale:,.3g} {unit}")
            ok = r[r["meets_slo"].astype(str).str.lower().isin(("true", "1", "1.0"))]
            if len(ok):
                knee = float(ok["rate"].max())
                ax_rate.axvline(knee, color=GREEN, linestyle="--", linewidth=1.2,
                                label=f"max rate meeting SLO: {knee:,.3g}/s")
            ax_rate.set_yscale("log")
            ax_rate.set_xlabel("request rate (requests/s)")
            ax_rate.set_ylabel(f"latency ({unit})")
            ax_rate.set_title("latency against request rate")
            ax_rate.legend(frameon=False, fontsize=7)
        else:
            ax_rate.set_axis_off()
            ax_rate.text(0.5, 0.5, "no rate sweep in this run\n(rates.csv absent)", ha="center", va="center",
                         transform=ax_rate.transAxes)
        st = steps.sort_values("start_s")
        ax_kv.plot(st["start_s"], 100 * st["kv_util"], "-", color=BLACK, linewidth=0.8)
        ax_kv.set_ylim(0, 105)
        ax_kv.set_xlabel("time (s)")
        ax_kv.set_ylabel("KV bytes holding tokens / reserved (%)")
        ax_kv.set_title("KV cache utilisation")
        for phase, grp in st.groupby("phase", sort=False):
            ax_batch.plot(grp["start_s"], grp["batch"], linestyle="none", markersize=2,
                          label=str(phase), **marker_style("roofline", phase_color(str(phase))))
        ax_batch.set_xlabel("time (s)")
        ax_batch.set_ylabel("batch (sequences in the step)")
        ax_batch.set_title("batch size over time")
        ax_batch.legend(frameon=False, fontsize=7, markerscale=2)
        if {"running", "waiting"} <= set(st.columns):
            ax_q.plot(st["start_s"], st["running"], "-", color=BLACK, linewidth=0.8, label="running")
            ax_q.plot(st["start_s"], st["waiting"], "--", color=ORANGE, linewidth=0.8, label="waiting")
            ax_q.set_xlabel("time (s)")
            ax_q.set_ylabel("requests")
            ax_q.set_title("running and waiting requests")
            ax_q.legend(frameon=False, fontsize=7)
        else:
            ax_q.set_axis_off()
        fig.suptitle(title)
    caption = ("Top: how long users wait for the first token and between tokens (cumulative; dotted p50, "
               "dash-dot p99, dashed the SLO), and how the tails grow with the request rate "
               + (f"(the knee: the highest rate meeting the SLO is {knee:,.3g} requests/s)" if knee is not None
                  else "(no rate meets the SLO, or no rate sweep)") +
               ". Bottom: the scheduler over time; look for the KV cache filling up and the queue of "
               "waiting requests growing, which is where latency takes off.")
    data = requests.assign(source="requests")
    return ReportFigure(name="serving", title="Serving", caption=caption, figure=fig, data=data)


# capacity plan (`llmperf plan`) ---------------------------------------------------------------------
#: how a losing configuration's cell reads, by what it loses on
_LOSES_ON = {"memory": "does not fit", "TTFT": "TTFT", "TPOT": "TPOT", "replicas": "too many replicas", "tp": "TP"}


def _is_true(v: object) -> bool:
    return str(v).strip().lower() in ("true", "1", "1.0")


def plan_figure(frame: pd.DataFrame, *, title: str, slo: Mapping[str, float] | None = None,
                percentile: float = 90.0) -> ReportFigure:
    """A capacity plan at a glance: every device x precision x TP candidate as a cell holding its GPU
    count and cost per million generated tokens (or what it loses on), and each candidate's simulated
    p90 TTFT against p90 TPOT beside the SLO box.

    `frame`: `PlanResult.to_frame()` columns device, precision, tp, replicas, gpus, feasible, binding,
    ttft_s, tpot_s, cost_per_million_tokens. `slo`: 'ttft_s' / 'tpot_s' targets (seconds) at `percentile`."""
    _require(frame, ("device", "precision", "tp", "replicas", "gpus", "feasible", "binding", "ttft_s", "tpot_s",
                     "cost_per_million_tokens"), "plan")
    slo = dict(slo or {})
    ok = frame["feasible"].map(_is_true)
    rows = list(dict.fromkeys(zip(frame["device"], frame["precision"])))
    tps = sorted({int(t) for t in frame["tp"]})
    cost = pd.to_numeric(frame["cost_per_million_tokens"], errors="coerce")
    with report_style():
        fig, (ax_grid, ax_slo) = new_figure(ncols=2, width=12.0, height=max(3.5, 0.42 * len(rows) + 1.6))
        import matplotlib as mpl
        cmap = mpl.colormaps["cividis"]  # sequential and colour-vision safe; lighter = cheaper
        lo, hi = (float(cost[ok].min()), float(cost[ok].max())) if ok.any() and cost[ok].notna().any() else (0.0, 1.0)
        norm = mpl.colors.Normalize(vmin=lo, vmax=hi if hi > lo else lo + 1)
        for _, r in frame.iterrows():
            y, x = rows.index((r["device"], r["precision"])), tps.index(int(r["tp"]))
            if _is_true(r["feasible"]):
                c = pd.to_numeric(r["cost_per_million_tokens"], errors="coerce")
                face = cmap(1 - norm(c)) if pd.notna(c) else "white"
                text = f"{int(r['gpus'])} GPUs" + (f"\n${c:.2f}" if pd.notna(c) else "\n$?")
                dark = pd.notna(c) and norm(c) > 0.5
                ax_grid.add_patch(mpl.patches.Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor="white"))
                ax_grid.text(x, y, text, ha="center", va="center", fontsize=7, color="white" if dark else BLACK)
            else:
                ax_grid.add_patch(mpl.patches.Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor="#EEEEEE", hatch="//",
                                                        edgecolor="white"))
                ax_grid.text(x, y, "loses:\n" + _LOSES_ON.get(str(r["binding"]), str(r["binding"])), ha="center",
                             va="center", fontsize=7, color=BLACK)
        ax_grid.set_xlim(-0.5, len(tps) - 0.5)
        ax_grid.set_ylim(len(rows) - 0.5, -0.5)
        ax_grid.set_xticks(range(len(tps)), [str(t) for t in tps])
        ax_grid.set_yticks(range(len(rows)), [f"{d} {p}" for d, p in rows])
        ax_grid.grid(False)
        ax_grid.set_xlabel("tensor-parallel degree (GPUs per replica)")
        ax_grid.set_ylabel("device and weight precision")
        ax_grid.set_title("GPUs and $ per million generated tokens")
        precisions = list(dict.fromkeys(frame["precision"]))
        devices = list(dict.fromkeys(frame["device"]))
        device_marker = dict(zip(devices, ("o", "s", "D", "^", "v", "P", "X", "*")))
        sim = frame[pd.to_numeric(frame["ttft_s"], errors="coerce").notna()]
        scale_x, unit_x = time_unit(sim["ttft_s"]) if len(sim) else (1.0, "s")
        scale_y, unit_y = time_unit(sim["tpot_s"]) if len(sim) else (1.0, "s")
        for _, r in sim.iterrows():
            color = series_color(precisions.index(r["precision"]))
            win = _is_true(r["feasible"])
            ax_slo.plot([float(r["ttft_s"]) / scale_x], [float(r["tpot_s"]) / scale_y], linestyle="none",
                        marker=device_marker[r["device"]], markersize=6, markeredgecolor=color,
                        markerfacecolor=color if win else "white", markeredgewidth=1.4)
        if slo.get("ttft_s"):
            ax_slo.axvline(slo["ttft_s"] / scale_x, color=BLACK, linestyle="--", linewidth=1)
        if slo.get("tpot_s"):
            ax_slo.axhline(slo["tpot_s"] / scale_y, color=BLACK, linestyle="--", linewidth=1)
        ax_slo.set_xscale("log")
        ax_slo.set_yscale("log")
        ax_slo.set_xlabel(f"p{percentile:g} time to first token ({unit_x})")
        ax_slo.set_ylabel(f"p{percentile:g} time per output token ({unit_y})")
        ax_slo.set_title("latency of each candidate (SLO dashed)")
        handles = [Patch(color=series_color(i), label=p) for i, p in enumerate(precisions)]
        handles += [Line2D([], [], linestyle="none", marker=device_marker[d], markeredgecolor=BLACK,
                           markerfacecolor=BLACK, label=d) for d in devices]
        handles.append(Line2D([], [], linestyle="none", marker="o", markeredgecolor=BLACK, markerfacecolor="white",
                              label="hollow: misses the SLO"))
        ax_slo.legend(handles=handles, frameon=False, fontsize=7, loc="best")
        fig.suptitle(title)
    best = frame[ok].assign(_c=cost[ok]).sort_values(["_c", "gpus"], na_position="last").head(1)
    lead = (f"The cheapest: {best['device'].iloc[0]} at {best['precision'].iloc[0]}, TP {int(best['tp'].iloc[0])} x "
            f"{int(best['replicas'].iloc[0])} replicas = {int(best['gpus'].iloc[0])} GPUs. " if len(best) else
            "No configuration meets the SLOs. ")
    counts = frame.loc[~ok, "binding"].value_counts()
    losers = ", ".join(f"{n} on {b}" for b, n in counts.items())
    caption = (lead + "Left: each cell is one replica shape; lighter is cheaper per million generated tokens "
               "(at a fixed load, cost is GPUs x price, so what a precision or TP degree buys is fewer GPUs); "
               "hatched cells lose" + (f" ({losers})" if losers else "") + f". Right: each candidate's simulated "
               f"p{percentile:g} latencies at its replica count (a lone request's, for one that lost on a floor; "
               "colour = precision, marker = device); a point outside the dashed SLO box misses it, and a loser "
               "without a point lost before any simulation (memory).")
    return ReportFigure(name="plan", title="Capacity plan", caption=caption, figure=fig, data=frame)
