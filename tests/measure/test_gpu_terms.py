"""`python -m llmperf.measure.gpu_terms`: a GPU measurement; without CUDA it says so and exits 2."""

import csv

import pytest

from llmperf.measure import gpu_terms


def test_without_cuda_it_refuses_in_one_line(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: this checks the refusal without one")
    assert gpu_terms.main([str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_shapes_are_real_projections_and_rows_cover_gemv_to_plateau():
    assert gpu_terms.GEMM_ROWS[0] == 1 and gpu_terms.GEMM_ROWS[-1] >= 4096
    names = {name for name, _, _ in gpu_terms.GEMM_SHAPES}
    assert {"llama3-8b.qkv", "llama3-70b-tp8.qkv", "lm_head-8b"} <= names
    # Llama-3-70B at TP 8: (64 + 2 x 8) heads x 128 / 8 = 1280 rows of W, K = 8192
    assert ("llama3-70b-tp8.qkv", 1280, 8192) in gpu_terms.GEMM_SHAPES
    for _, groups, n, k in gpu_terms.GROUPED_SHAPES:
        assert groups >= 8 and n > 0 and k > 0


def test_write_makes_one_csv_with_a_header(tmp_path):
    gpu_terms._write(tmp_path / "x.csv", [dict(m=1, time_s=1e-5), dict(m=2, time_s=2e-5)])
    rows = list(csv.DictReader((tmp_path / "x.csv").open()))
    assert [r["m"] for r in rows] == ["1", "2"]
    gpu_terms._write(tmp_path / "empty.csv", [])
    assert not (tmp_path / "empty.csv").exists()
