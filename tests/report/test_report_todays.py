"""`llmperf report` on today's models: an MLA + MoE model under DP attention and expert parallelism,
and a sliding-window model with full KV pages; bad layout options are one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from llmperf.cli import app

runner = CliRunner()


def test_deepseek_v3_dp_attention_report(tmp_path: Path) -> None:
    out = tmp_path / "d.html"
    res = runner.invoke(app, ["report", "-m", "deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8", "--dp-attention",
                              "-b", "1,64", "-p", "1024", "-g", "32", "--compare", "h200", "-o", str(out)])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert "ep 8" in html and "dp attention" in html
    sweep = pd.read_csv(tmp_path / "d_files" / "01-estimate-sweep.csv")
    assert set(sweep["ep"]) == {8} and set(sweep["dp_attention"]) == {True}
    assert set(sweep["kv_bytes_per_token"]) == {70_272}  # the MLA latent, whole on each GPU


def test_gpt_oss_full_pages_report(tmp_path: Path) -> None:
    out = tmp_path / "g.html"
    args = ["report", "-m", "gpt-oss-20b", "-H", "h100-sxm", "-p", "8192", "-g", "16", "--compare", "h100-sxm"]
    capped = runner.invoke(app, [*args, "-o", str(out)])
    full = runner.invoke(app, [*args, "--kv-window", "full", "-o", str(tmp_path / "f.html")])
    assert capped.exit_code == 0 and full.exit_code == 0, capped.output + full.output
    c = pd.read_csv(tmp_path / "g_files" / "01-estimate-sweep.csv")
    f = pd.read_csv(tmp_path / "f_files" / "01-estimate-sweep.csv")
    assert set(c["kv_window"]) == {"capped"} and set(f["kv_window"]) == {"full"}
    assert (f["kv_cache_gib"].to_numpy() > c["kv_cache_gib"].to_numpy()).all()


def test_bad_layout_options_are_one_line(tmp_path: Path) -> None:
    for extra, needle in ((["--tp", "8", "--ep", "3"], "ep: 3"), (["--kv-window", "half"], "kv_window"),
                          (["--mla-mode", "sideways"], "mla_mode")):
        out = tmp_path / "x.html"
        res = runner.invoke(app, ["report", "-m", "deepseek-v3", "-H", "h200", *extra, "-o", str(out)])
        assert res.exit_code == 2, res.output
        assert needle in res.output and "Traceback" not in res.output
        assert not out.exists()
