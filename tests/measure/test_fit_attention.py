"""`python -m llmperf.measure.fit_attention`: both layouts load, the fit on a small extract predicts its
held-out shapes, and the block it writes is read back by the typical time model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmperf.analysis.timemodel import _read_yaml, parse_efficiency, typical_path
from llmperf.measure import fit_attention

DATA = Path(__file__).parent / "data" / "attention"
KERNELS = Path(__file__).parents[2] / "reports" / "kernels" / "2026-11-23-h100" / "kernels.csv"


def test_kernel_benchmark_layout_keeps_flash_class_rows():
    df = fit_attention.load(KERNELS)
    assert set(df["impl"]) == {"sdpa", "flash_attention", "flash_decoding", "paged_attention"}
    assert (df[df["phase"] == "decode"]["q_len"] == 1).all()
    assert set(df["head_dim"]) == {128} and set(df["heads"] / df["kv_heads"]) == {4}


def test_sweep_layout_prices_each_shape_with_llmperfs_counts():
    df = fit_attention.load(DATA / "attention.csv")
    assert set(df["head_dim"]) == {64, 128, 256} and set(df["kv_heads"]) == {4, 8, 32}
    assert (df["flops"] > 0).all() and (df["bytes"] > 0).all()


def test_unknown_layout_is_refused(tmp_path: Path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="neither the kernel benchmark's columns"):
        fit_attention.load(bad)


def test_fit_on_the_extract_predicts_held_out_shapes_and_the_other_device():
    result = fit_attention.run(DATA / "attention.csv")
    p = result["params"]
    assert 0.3 < p.e_compute <= 1 and 0.7 < p.e_memory <= 1 and 0 < p.latency_s < 5e-5
    errors = result["errors"]
    assert set(errors) == {"in_sample", "held_group", "held_context", "device_h200"}
    assert errors["in_sample"].loc["all", "median"] < 0.1
    assert errors["held_group"].loc["all", "median"] < 0.15
    assert errors["device_h200"].loc["all", "median"] < 0.2
    assert "held out: GQA group 4" in fit_attention.report(result)


def test_kernel_benchmark_fit_holds_out_sdpa_batch_8_and_triton():
    result = fit_attention.run(KERNELS)
    assert set(result["errors"]) == {"in_sample", "held_sdpa", "held_triton"}
    assert result["errors"]["held_triton"].loc["decode", "median"] < 0.1


def test_write_replaces_its_block_and_the_time_model_reads_it(tmp_path: Path):
    yaml_path = tmp_path / "typical.yaml"
    shutil.copy(typical_path(), yaml_path)
    result = fit_attention.run(KERNELS)
    fit_attention.write_typical(yaml_path, result)
    fit_attention.write_typical(yaml_path, result)  # twice: one block, replaced
    text = yaml_path.read_text()
    assert text.count("# >>> fit_attention") == 1 and "schema_version: 5" in text
    parsed = parse_efficiency(_read_yaml(yaml_path), str(yaml_path))
    assert parsed["attention_eff"]["default"].e_memory == pytest.approx(result["params"].e_memory, rel=1e-3)


def test_typical_yaml_has_the_fitted_block():
    parsed = parse_efficiency(_read_yaml(typical_path()), "typical")
    block = parsed["attention_eff"]["default"]
    assert "gpu-terms/2026-11-25-h100" in block.source
