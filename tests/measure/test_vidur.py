"""Vidur's measured operators against typical (`llmperf.measure.vidur`) and the report's parity
figure, drawn from the extract committed under reports/vidur (no ../shared needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from llmperf.measure import vidur

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return vidur.predictions()


def test_the_extract_is_small_and_licensed():
    root = vidur.default_dir()
    assert "MIT License" in (root / "LICENSE").read_text()
    assert "7d47513363ec447a741ac5e47241580b47724fbf" in (root / "README.md").read_text()
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 300_000


def test_one_row_per_measured_operator_with_finite_predictions(frame: pd.DataFrame):
    expected = 0
    for path in vidur.default_dir().glob("compute/*/*/*/mlp.csv"):
        raw = pd.read_csv(path)
        expected += sum(int((raw[f"time_stats.{c}.median"] > 0).sum()) for c in vidur.OPS
                        if f"time_stats.{c}.median" in raw)
    assert len(frame) == expected
    assert list(frame.columns) == list(vidur.COLUMNS)
    assert set(frame["device"]) == {"a100", "h100"} and set(frame["kind"]) == {"GEMM", "small"}
    assert set(frame["tp"]) == {1, 2, 4, 8}
    assert np.isfinite(frame["predicted_s"]).all() and (frame["predicted_s"] > 0).all()
    # fitted marks A100's 7-8B small operators only
    fitted = frame[frame["fitted"]]
    assert set(fitted["device"]) == {"a100"} and set(fitted["kind"]) == {"small"}


def test_predictions_are_the_operator_models_time(frame: pd.DataFrame):
    """A GEMM row is priced as estimate prices it: ForwardModel's op at the row's tokens and tp."""
    from llmperf.analysis import ForwardModel, op_time
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.specs import Precision, load_hardware, load_model

    row = frame[(frame["device"] == "h100") & (frame["op"] == "down_proj") & (frame["tp"] == 2)].iloc[0]
    hw = load_hardware("h100-sxm")
    fm = ForwardModel(model=load_model(vidur.MODELS[row["model"]]), precision=Precision.uniform("fp16"), tp=2)
    want = op_time(fm.down_proj(row["tokens"], 1, 0.0), hw, "fp16", time_model_for(hw, "typical", "fp16")).time_s
    assert row["predicted_s"] == pytest.approx(float(want), rel=1e-12)


def test_typical_is_within_a_factor_of_two_on_most_rows(frame: pd.DataFrame):
    ratio = frame["predicted_s"] / frame["measured_s"]
    assert ((ratio > 0.5) & (ratio < 2)).mean() > 0.9


def test_the_figure_renders_from_the_committed_extract(frame: pd.DataFrame, tmp_path: Path):
    from llmperf.report.figures import typical_figure

    fig = typical_figure(frame, title="typical vs Vidur")
    png = fig.png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    ax = fig.figure.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("A100 GEMM") for t in labels) and any(t.startswith("H100 small") for t in labels)
    assert "within ±20%" in labels and "predicted = measured" in labels
    assert "H100 GEMM: median" in fig.caption
    fig.figure.clear()


def test_the_figure_refuses_a_frame_without_its_columns():
    from llmperf.report.figures import typical_figure

    with pytest.raises(ValueError, match="lacks column 'predicted_s'"):
        typical_figure(pd.DataFrame(dict(device=["a100"], kind=["GEMM"], measured_s=[1.0])), title="x")
