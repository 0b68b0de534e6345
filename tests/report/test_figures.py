"""Each figure from a small hand-made frame: its axes, labels (with units) and the data it draws."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from llmperf.report import figures as F
from llmperf.report.style import HATCH_COMPUTE, PHASE_COLORS, marker_style


def _labels(fig):  # noqa: ANN001
    return [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.figure.axes if ax.axison]


def _units_everywhere(fig) -> None:  # noqa: ANN001
    for x, y in _labels(fig):
        assert "(" in x and ")" in x, f"x label without a unit: {x!r}"
        assert y, "empty y label"


def test_roofline_ceilings_ridge_and_points() -> None:
    pts = pd.DataFrame(dict(phase=["prefill", "decode", "decode", "decode"], op=["q_proj", "q_proj", "q_proj", "embed"],
                            kind=["roofline", "roofline", "measured", "roofline"], intensity=[200.0, 1.0, 1.0, 0.0],
                            flops_per_s=[3.1e14, 2.0e12, 1.0e12, 0.0]))
    roofs = [F.Ceiling(label="dev", peak_flops_per_s=312e12, bandwidth_bytes_per_s=2039e9),
             F.Ceiling(label="dev measured", peak_flops_per_s=200e12, bandwidth_bytes_per_s=1500e9, calibrated=True)]
    fig = F.roofline_figure(pts, roofs, title="t")
    ax = fig.figure.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/B)"
    assert ax.get_ylabel() == "attained performance (FLOP/s)"
    roof = ax.lines[0]
    x, y = roof.get_data()
    assert np.max(y) == pytest.approx(312e12)  # the flat roof is the peak
    np.testing.assert_allclose(y[x < 100], 2039e9 * x[x < 100])  # the slanted roof is bandwidth x intensity
    ridges = [ln.get_xdata()[0] for ln in ax.lines if ln.get_linestyle() == ":"]
    assert ridges == pytest.approx([312e12 / 2039e9, 200e12 / 1500e9])
    assert ax.lines[2].get_linestyle() == "--"  # calibrated roofs dashed
    drawn = {(to_hex(ln.get_markeredgecolor()), ln.get_marker()): (tuple(ln.get_xdata()), tuple(ln.get_ydata()))
             for ln in ax.lines if ln.get_linestyle() == "None"}
    assert drawn[(PHASE_COLORS["prefill"].lower(), "s")] == ((200.0,), (3.1e14,))
    assert drawn[(PHASE_COLORS["decode"].lower(), "o")] == ((1.0,), (1.0e12,))  # measured: a filled circle
    assert "1 rows without FLOPs" in fig.caption and "ridge point" in fig.caption
    assert "153" in fig.caption or "312" in fig.caption


def test_breakdown_hatches_compute_bound_time() -> None:
    frame = pd.DataFrame(dict(phase=["prefill", "prefill", "decode", "decode"], op=["q_proj", "attn_norm"] * 2,
                              time_s=[3e-3, 1e-3, 2e-5, 1e-5], bound=["compute", "memory", "memory", "memory"]))
    fig = F.breakdown_figure(frame, title="t")
    pre, dec = fig.figure.axes[:2]
    assert pre.get_xlabel() == "time (ms)" and dec.get_xlabel() == "time (µs)"
    widths = [p.get_width() for p in pre.patches[:2]]
    assert widths == pytest.approx([3.0, 1.0])
    assert pre.patches[0].get_hatch() == HATCH_COMPUTE and not pre.patches[1].get_hatch()
    assert "25% memory-bound" in pre.get_title()
    assert "decode: 100% memory-bound" in fig.caption
    _units_everywhere(fig)


def test_batch_sweep_lines_tokens_and_critical_batch() -> None:
    frame = pd.DataFrame(dict(series="context 512", kind=["roofline"] * 3 + ["measured"] * 3,
                              batch=[1, 8, 64] * 2, step_s=[0.01, 0.011, 0.02, 0.02, 0.021, 0.03]))
    fig = F.batch_figure(frame, title="t", critical={"critical batch": 64})
    ax_t, ax_r = fig.figure.axes[:2]
    assert ax_t.get_ylabel() == "decode step time (ms)" and ax_r.get_ylabel() == "decode throughput (tokens/s)"
    assert ax_t.get_xlabel() == "batch (sequences)"
    lines = [ln for ln in ax_r.lines if len(ln.get_xdata()) == 3]
    np.testing.assert_allclose(lines[0].get_ydata(), [100, 8 / 0.011, 64 / 0.02])
    assert lines[1].get_linestyle() == "None" and lines[1].get_marker() == "o"  # measured: points only
    assert any(ln.get_xdata()[0] == 64 for ln in ax_t.lines if len(ln.get_xdata()) == 2)
    assert "critical batch at batch 64" in fig.caption


def test_context_shares_in_percent() -> None:
    frame = pd.DataFrame(dict(phase=["prefill", "prefill", "decode", "decode"], context=[512, 4096] * 2,
                              flops_share=[0.1, 0.4, 0.01, 0.05], bytes_share=[0.05, 0.3, 0.1, 0.6],
                              time_share=[0.1, 0.5, 0.1, 0.6]))
    fig = F.context_figure(frame, title="t")
    axes = fig.figure.axes
    assert [a.get_ylabel() for a in axes] == ["attention share of FLOPs (%)", "attention share of bytes (%)",
                                              "attention share of time (%)"]
    assert axes[1].lines[1].get_ydata().tolist() == pytest.approx([10, 60])
    assert to_hex(axes[0].lines[0].get_color()) == PHASE_COLORS["prefill"].lower()
    _units_everywhere(fig)


def test_memory_lines_device_line_and_max_batch() -> None:
    b = np.array([1, 2, 4, 8])
    frame = pd.DataFrame(dict(context=4096, batch=b, weights_gib=10.0, kv_cache_gib=2.0 * b, activation_peak_gib=0.1,
                              total_gib=10.1 + 2.0 * b, max_batch=30))
    util = pd.DataFrame(dict(context=[4096], contiguous=[0.25], paged=[0.99]))
    fig = F.memory_figure(frame, util, device_gib=80.0, usable_gib=72.0, title="t")
    ax_m, ax_u = fig.figure.axes[:2]
    assert ax_m.get_ylabel() == "memory per GPU (GiB)"
    assert ax_m.lines[0].get_ydata().tolist() == pytest.approx((10.1 + 2.0 * b).tolist())
    assert ax_m.lines[1].get_xdata().tolist() == [30]  # the largest batch, on the usable line
    hlines = {round(float(ln.get_ydata()[0]), 3) for ln in ax_m.lines[2:]}
    assert hlines == {10.0, 80.0, 72.0}
    assert [ln.get_ydata()[0] for ln in ax_u.lines] == pytest.approx([25, 99])
    assert "30 at 4,096 tokens" in fig.caption
    _units_everywhere(fig)


def test_attention_naive_vs_fused_totals_and_ratio() -> None:
    frame = pd.DataFrame(dict(phase="prefill", impl=["naive"] * 3 + ["fused"],
                              op=["attn_score", "attn_softmax", "attn_value", "attention"],
                              bytes=[2e9, 3e9, 2e9, 1e9], time_s=[1e-3, 1.5e-3, 1e-3, 0.5e-3]))
    fig = F.attention_figure(frame, title="t", shape="batch 1")
    ax_b, ax_t = fig.figure.axes[:2]
    assert ax_b.get_xlabel() == "HBM traffic (GB)" and ax_t.get_xlabel() == "time (ms)"
    assert sum(p.get_width() for p in ax_b.patches) == pytest.approx(8.0)
    assert "7.0x the bytes, 7.0x the time" in fig.caption


def test_error_figure_ratio_axis_and_medians() -> None:
    frame = pd.DataFrame(dict(phase="decode", op=["q_proj"] * 4,
                              model=["roofline", "roofline", "calibrated", "calibrated"], ratio=[0.25, 0.5, 1.0, 1.2]))
    fig = F.error_figure(frame, title="t")
    ax = fig.figure.axes[0]
    assert ax.get_xscale() == "log" and "predicted / measured" in ax.get_xlabel()
    medians = [ln.get_xdata()[0] for ln in ax.lines if ln.get_markersize() == 7]
    assert medians == pytest.approx([0.375, 1.1])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["q_proj (decode)"]


def test_devices_one_line_per_device() -> None:
    frame = pd.DataFrame(dict(hardware=["a", "a", "b", "b"], batch=[1, 2, 1, 2], ttft_s=[0.1, 0.2, 0.05, 0.1],
                              tpot_s=[0.01, 0.01, 0.005, 0.005], ridge_point=[153.0, 153.0, 295.0, 295.0]))
    fig = F.devices_figure(frame, title="t")
    ax_p, ax_d, ax_r = fig.figure.axes
    assert len(ax_d.lines) == 2 and ax_r.lines[1].get_ydata().tolist() == pytest.approx([200, 400])
    assert "ridge 295 FLOP/B" in ax_p.get_legend().get_texts()[1].get_text()
    _units_everywhere(fig)


def test_serving_cdfs_knee_and_timeline() -> None:
    req = pd.DataFrame(dict(ttft_s=[0.1, 0.2, 0.3, 0.4], tpot_s=[0.01, 0.02, 0.03, 0.04]))
    steps = pd.DataFrame(dict(start_s=[0.0, 0.1, 0.2], phase=["prefill", "decode", "decode"], batch=[1, 2, 3],
                              kv_util=[0.5, 0.6, 0.7], running=[1, 2, 3], waiting=[0, 1, 0]))
    rates = pd.DataFrame(dict(rate=[1.0, 2.0, 3.0], ttft_p50=0.1, ttft_p90=0.2, ttft_p99=0.3, tpot_p50=0.01,
                              tpot_p90=0.02, tpot_p99=0.03, meets_slo=[True, True, False]))
    fig = F.serving_figure(req, steps, rates, title="t", slo={"ttft_s": 0.25})
    ax_ttft, ax_tpot, ax_rate, ax_kv, ax_batch, ax_q = fig.figure.axes
    assert ax_ttft.get_xlabel() == "TTFT (ms)" and ax_tpot.get_xlabel() == "TPOT (ms)"
    cdf = ax_ttft.lines[0]
    assert cdf.get_xdata().tolist() == pytest.approx([100, 200, 300, 400])
    assert cdf.get_ydata().tolist() == pytest.approx([25, 50, 75, 100])
    assert any(ln.get_xdata()[0] == pytest.approx(250) for ln in ax_ttft.lines[1:])  # the SLO line
    assert "2" in fig.caption and "highest rate meeting the SLO is 2 requests/s" in fig.caption
    assert ax_kv.lines[0].get_ydata().tolist() == pytest.approx([50, 60, 70])
    assert ax_rate.get_xlabel() == "request rate (requests/s)"
    assert ax_batch.get_ylabel().startswith("batch")


def test_serving_without_rates_says_so() -> None:
    req = pd.DataFrame(dict(ttft_s=[0.1], tpot_s=[0.01]))
    steps = pd.DataFrame(dict(start_s=[0.0], phase=["decode"], batch=[1], kv_util=[0.5]))
    fig = F.serving_figure(req, steps, None, title="t")
    assert "no rate sweep" in fig.figure.axes[2].texts[0].get_text()


def test_missing_column_names_the_column() -> None:
    with pytest.raises(ValueError, match="'step_s'"):
        F.batch_figure(pd.DataFrame(dict(series=[], kind=[], batch=[])), title="t")


def test_dollar_in_a_name_prints_literally() -> None:
    frame = pd.DataFrame(dict(hardware=["$x_1$"], batch=[1], ttft_s=[0.1], tpot_s=[0.01], ridge_point=[1.0]))
    fig = F.devices_figure(frame, title="model $\\alpha$")
    fig.figure.canvas.draw()  # mathtext off: '$' is a character, parsing cannot fail
    assert fig.figure.texts[0].get_text() == "model $\\alpha$"


def test_marker_style_filled_measured_hollow_predicted() -> None:
    assert marker_style("measured", "#000000")["markerfacecolor"] == "#000000"
    assert marker_style("roofline", "#000000")["markerfacecolor"] == "white"


def _plan_frame() -> pd.DataFrame:
    return pd.DataFrame(dict(
        rank=[1, 2, None, None], device=["h100-sxm", "h100-sxm", "a100-80gb-sxm", "h100-sxm"],
        precision=["fp8", "bf16", "bf16", "bf16"], tp=[2, 4, 1, 1], replicas=[1, 2, None, None],
        gpus=[2, 8, None, None], feasible=[True, True, False, False], binding=["", "", "memory", "TPOT"],
        ttft_s=[0.2, 0.3, None, 0.9], tpot_s=[0.02, 0.03, None, 0.06], cost_per_million_tokens=[0.28, 1.1, None, None]))


def test_plan_grid_cells_losers_and_slo_box() -> None:
    fig = F.plan_figure(_plan_frame(), title="t", slo={"ttft_s": 0.5, "tpot_s": 0.035})
    grid, lat = fig.figure.axes[:2]
    assert [t.get_text() for t in grid.get_xticklabels()] == ["1", "2", "4"]
    assert [t.get_text() for t in grid.get_yticklabels()] == ["h100-sxm fp8", "h100-sxm bf16", "a100-80gb-sxm bf16"]
    assert grid.get_xlabel() == "tensor-parallel degree (GPUs per replica)"
    cells = {t.get_text() for t in grid.texts}
    assert {"2 GPUs\n$0.28", "8 GPUs\n$1.10", "loses:\ndoes not fit", "loses:\nTPOT"} == cells
    assert sum(p.get_hatch() == "//" for p in grid.patches) == 2  # the two losers, hatched
    assert lat.get_xscale() == lat.get_yscale() == "log"
    assert lat.get_xlabel() == "p90 time to first token (ms)" and lat.get_ylabel() == "p90 time per output token (ms)"
    points = [(ln.get_xdata()[0], ln.get_ydata()[0], ln.get_markerfacecolor() == "white")
              for ln in lat.lines if ln.get_linestyle() == "None"]
    assert [p[2] for p in points] == [False, False, True]  # the memory loser: no point
    assert [p[:2] for p in points] == [pytest.approx(xy) for xy in [(200, 20), (300, 30), (900, 60)]]
    vline, hline = [ln for ln in lat.lines if ln.get_linestyle() == "--"]
    assert list(vline.get_xdata()) == pytest.approx([500, 500]) and list(hline.get_ydata()) == pytest.approx([35, 35])
    assert fig.caption.startswith("The cheapest: h100-sxm at fp8, TP 2 x 1 replicas = 2 GPUs.")
    assert "1 on memory" in fig.caption and "1 on TPOT" in fig.caption
    _units_everywhere(fig)


def test_plan_with_no_winner_says_so() -> None:
    frame = _plan_frame().assign(feasible=False, binding="memory", ttft_s=None, tpot_s=None)
    fig = F.plan_figure(frame, title="t")
    assert fig.caption.startswith("No configuration meets the SLOs.")
