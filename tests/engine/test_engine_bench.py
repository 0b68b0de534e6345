"""The engine benchmark runs end to end at a toy size and records when, where and with what it ran.
A smoke test: it checks the output's shape, never a timing."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from llmperf.engine.paths import engine_paths  # noqa: E402
from llmperf.measure import engine_bench  # noqa: E402


def test_the_benchmark_prints_the_three_ratios_with_their_spread_and_its_environment(tmp_path, capsys):
    out = tmp_path / "engine" / "2026-01-01-cpu"
    figures = engine_bench.main(["--hidden", "64", "--layers", "1", "--vocab", "256", "--context", "32", "--reps", "2",
                                 "--copy-mib", "4", "--prompt-len", "4", "--new-tokens", "3", "--out", str(out)])
    names = [f.name for f in figures]
    plan = engine_bench.plan_for(engine_paths())  # what this machine can inform (test_paths fakes an AVX2 one)
    assert [n for n in names if n.startswith("decode / memory limit")] == [
        f"decode / memory limit  {d} batch {b}" for d, b in plan.memory_limit]
    assert plan.memory_limit[:4] == (("fp32", 1), ("fp32", 2), ("fp32", 4), ("fp32", 8))
    assert [n for n in names if n.startswith("own CPU kernels / torch")] == ([
        "own CPU kernels / torch  bf16 batch 1", "own CPU kernels / torch  bf16 batch 8",
        "own CPU kernels / torch  fp32 batch 8"] if plan.kernels else [])
    assert [n for n in names if n.startswith("layers in one call")] == ([
        "layers in one call / one by one  bf16 b1", "layers in one call / one by one  bf16 b8",
        "layers in one call / one by one  fp32 b8"] if plan.kernels else [])
    assert all(f.detail == "same tokens" for f in figures if f.name.startswith("layers in one call"))
    assert any(n.startswith("engine / transformers.generate  batch 8") for n in names)
    assert any(n.startswith("paged / contiguous speed") for n in names)
    assert all(f.low <= f.median <= f.high for f in figures)
    printed = capsys.readouterr().out
    text = (out / "engine_bench.txt").read_text()
    for needle in ("# machine:", "cores", "torch threads", "# versions:", "torch", "transformers", "# settings:",
                   "# llmperf's own CPU kernels", "# engine paths (llmperf.engine.paths): cpu: ", plan.targets,
                   *(f"# {note}" for note in plan.notes),
                   "[min, max] over 2 repeats", "same tokens"):
        assert needle in text and needle in printed, needle
    doc = json.loads((out / "engine_bench.json").read_text())
    assert doc["date"][:4].isdigit() and doc["machine"]["name"] and doc["machine"]["threads"] >= 1
    assert {"python", "torch", "transformers", "llmperf"} <= set(doc["versions"])
    assert [f["name"] for f in doc["figures"]] == names


def test_bad_options_are_refused(capsys):
    with pytest.raises(SystemExit):
        engine_bench.main(["--new-tokens", "1"])
    assert "--new-tokens" in capsys.readouterr().err
