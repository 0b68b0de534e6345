"""The GEMM shape model's fit on Vidur's measured GEMM times (an extract under data/vidur), its command,
its evaluation table (`--check`), its block in typical.yaml, and `fit_typical`, which runs every fit."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from llmperf.analysis.gemm import GemmParams
from llmperf.analysis.timemodel import parse_efficiency, time_model_for, typical_path
from llmperf.measure import fit_gemm as fg
from llmperf.measure import fit_typical
from llmperf.specs import load_hardware

DATA = Path(__file__).parent / "data" / "vidur"
A100 = load_hardware("a100-80gb-sxm")


@pytest.fixture(scope="module")
def fitted() -> dict:
    return fg.run(DATA)


def test_shapes_are_per_tensor_parallel_gpu() -> None:
    """Llama-3-8B at TP 2: QKV (32 + 2*8) * 128 / 2 x 4096, O 4096 x 32 * 128 / 2, gate+up 2 * 14336 / 2 x
    4096, down 4096 x 14336 / 2; M = the row's tokens, fp16."""
    df = fg.load(DATA)
    row = df[(df["model"] == "Meta-Llama-3-8B") & (df["tp"] == 2) & (df["m"] == 64)].drop_duplicates("op")
    nk = {r.op: (r.n, r.k) for r in row.itertuples()}
    assert nk == {"qkv_proj": (3072, 4096), "o_proj": (4096, 2048), "gate_up_proj": (14336, 4096),
                  "down_proj": (4096, 7168)}
    assert set(df["dtype"]) == {"fp16"} and set(df["groups"]) == {1.0}


def test_fit_recovers_synthetic_terms() -> None:
    """Rows priced by the model itself give back (about) its terms and reproduce the times."""
    truth = GemmParams(e_peak=0.7, e_memory=0.75, latency_s=4e-6, feed_flop_per_byte=45.0)
    m = np.geomspace(1, 4096, 25).round()
    shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (1536, 4096), (4096, 512)]
    df = pd.DataFrame([dict(device="a100", hardware="a100-80gb-sxm", model="x", op=f"{n}x{k}", tp=1, m=x, n=n, k=k,
                            groups=1.0, dtype="fp16") for n, k in shapes for x in m])
    df["time_s"] = fg.predict(truth, df)
    p = fg.fit(df)
    assert np.allclose(fg.predict(p, df), df["time_s"], rtol=0.03)
    assert p.e_peak == pytest.approx(truth.e_peak, rel=0.05) and p.e_memory == pytest.approx(truth.e_memory, rel=0.05)
    assert p.latency_s == pytest.approx(truth.latency_s, rel=0.1)


def test_fit_on_the_extract_is_close_to_the_packaged_terms(fitted: dict) -> None:
    """The extract (powers of two of M) gives about the terms the full data gave (typical.yaml)."""
    packaged = time_model_for(A100, "typical", "fp16").gemm
    p = fitted["params"]
    assert p.e_peak == pytest.approx(packaged.e_peak, rel=0.1)
    assert p.e_memory == pytest.approx(packaged.e_memory, rel=0.05)
    assert p.latency_s == pytest.approx(packaged.latency_s, rel=0.2)
    assert p.feed_flop_per_byte == pytest.approx(packaged.feed_flop_per_byte, rel=0.3)


def test_heldout_errors(fitted: dict) -> None:
    """In-sample and held out (A100 70B shapes; H100 from its datasheet alone), as the full data's fit
    reports them (typical.yaml: about 6%, 5% and 8% median), within a margin for the extract."""
    e = fitted["errors"]
    assert set(e) == {"in_sample", "a100_70b", "h100"}
    assert set(e["in_sample"].index) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "all"}
    assert e["in_sample"].loc["all", "median"] < 0.08
    assert e["a100_70b"].loc["all", "median"] < 0.08 and e["a100_70b"].loc["all", "p90"] < 0.25
    assert e["h100"].loc["all", "median"] < 0.12
    assert 0.85 < e["h100"].loc["all", "median_ratio"] < 1.15


def test_check_table_is_priced_never_fitted(fitted: dict, tmp_path: Path) -> None:
    """`--check CSV`: measured GEMMs (here: the model's own prediction for bf16 on an H100, times 1.1)
    come back as an evaluation table by device and dtype; the fitted terms are the same as without."""
    rows = pd.DataFrame(dict(m=[1, 64, 4096], n=[4096] * 3, k=[4096] * 3, groups=[1, 1, 8], dtype="bf16",
                             device="h100-sxm"))
    rows["time_s"] = 1.1 * fg.predict(fitted["params"], rows.assign(hardware=rows["device"]))
    path = tmp_path / "measured.csv"
    rows.to_csv(path, index=False)
    out = fg.run(DATA, path)
    assert out["params"] == fitted["params"]
    table = out["check"]["errors"]
    assert table.loc["h100-sxm bf16", "n"] == 3
    assert table.loc["all", "median_ratio"] == pytest.approx(1 / 1.1)
    bad = tmp_path / "bad.csv"
    rows.drop(columns="groups").to_csv(bad, index=False)
    with pytest.raises(ValueError, match="missing column 'groups'"):
        fg.load_check(bad)


def test_command_prints_its_errors_and_writes_the_block(fitted: dict, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "typical.yaml"
    shutil.copy(typical_path(), out)
    assert fg.main([str(DATA), "--write", str(out)]) == 0
    text = capsys.readouterr().out
    for name, (label, _) in fg.CHECKS.items():
        assert label in text
        table = fitted["errors"][name]
        assert f"median {table.loc['all', 'median']:6.1%}  p90 {table.loc['all', 'p90']:6.1%}" in text
    parsed = parse_efficiency(yaml.safe_load(out.read_text()), str(out))
    assert parsed["gemm"].e_peak == pytest.approx(fitted["params"].e_peak)
    assert parsed["gemm"].latency_s == pytest.approx(fitted["params"].latency_s)
    first = out.read_text()
    fg.main([str(DATA), "--write", str(out)])
    assert out.read_text() == first  # rewriting replaces its block, it does not add it again


def test_fit_typical_runs_every_fit(capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # noqa: ANN001
    """One command: the GEMM, small-operator and collective fits, each with its held-out errors; with
    --write the packaged files (here copies) are rewritten and still parse (schema 5 kept)."""
    shutil.copy(typical_path(), tmp_path / "typical.yaml")
    shutil.copy(Path(typical_path()).parent / "collectives.yaml", tmp_path / "collectives.yaml")
    monkeypatch.setattr("llmperf.analysis.timemodel.typical_path", lambda: tmp_path / "typical.yaml")
    assert fit_typical.main([str(DATA), "--write"]) == 0
    text = capsys.readouterr().out
    for name in ("== fit_gemm ==", "== fit_small_ops ==", "== fit_collectives =="):
        assert name in text
    assert "held out: A100, 70B shapes" in text and "held out: H100 (datasheet only)" in text
    assert "held out: h100_dgx from the a100_dgx fit" in text
    raw = yaml.safe_load((tmp_path / "typical.yaml").read_text())
    assert raw["schema_version"] == 5
    parsed = parse_efficiency(raw, "t")
    assert parsed["gemm"] is not None and parsed["op_floor_s"]
