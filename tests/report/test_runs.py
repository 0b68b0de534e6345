"""Reading profile and simulate run directories: the contract's columns, and every bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from llmperf.errors import SpecError
from llmperf.report import load_profile, load_run, load_simulate
from llmperf.report.sources import profile_section, simulate_section, slo_targets

from report_testing import write_profile, write_simulate


def test_profile_round_trip(tmp_path: Path) -> None:
    run = load_profile(write_profile(tmp_path / "p"))
    assert run.model == "tiny-llama" and len(run.ops) == 16
    assert run.errors["median_abs_err"].tolist() == [0.7, 0.05]
    section = profile_section(run)
    assert [f.name for f in section.figures] == ["roofline", "breakdown", "batch", "errors"]
    assert not section.notes  # a built-in device: ceilings drawn


def test_simulate_round_trip(tmp_path: Path) -> None:
    run = load_run(write_simulate(tmp_path / "s"))
    assert run.rates is not None and len(run.requests) == 40
    section = simulate_section(run)
    assert [f.name for f in section.figures] == ["serving"]
    assert ("requests", "40") in section.facts
    assert "0.2" in section.figures[0].caption or "knee" in section.figures[0].caption


def test_rates_optional(tmp_path: Path) -> None:
    run = load_simulate(write_simulate(tmp_path / "s", rates=False))
    assert run.rates is None
    assert "no rate sweep" in simulate_section(run).figures[0].caption


def test_unknown_device_draws_no_ceilings_and_says_so(tmp_path: Path) -> None:
    section = profile_section(load_profile(write_profile(tmp_path / "p", hardware="my-laptop")))
    assert "no ceilings" in section.notes[0]
    assert "No device ceilings" in section.figures[0].caption


def test_partial_last_row_is_dropped(tmp_path: Path) -> None:
    folder = write_profile(tmp_path / "p")
    with open(folder / "ops.csv", "a") as fh:
        fh.write("micro,decode,q_proj,1,1,")  # a row being written when the run was read
    assert len(load_profile(folder).ops) == 16


@pytest.mark.parametrize("edit, message", [
    (lambda f: (f / "run.json").unlink(), "run.json: missing"),
    (lambda f: (f / "run.json").write_text("{"), "not valid JSON"),
    (lambda f: (f / "run.json").write_text("[1]"), "must hold a JSON object"),
    (lambda f: (f / "ops.csv").unlink(), "ops.csv: missing"),
    (lambda f: (f / "ops.csv").write_text(""), "ops.csv: empty"),
    (lambda f: pd.read_csv(f / "ops.csv").drop(columns=["measured_s"]).to_csv(f / "ops.csv", index=False),
     "column 'measured_s' is missing"),
    (lambda f: pd.read_csv(f / "ops.csv").assign(flops="lots").to_csv(f / "ops.csv", index=False),
     "column 'flops' has a non-numeric value 'lots'"),
    (lambda f: (f / "run.json").write_text(json.dumps({"kind": "profile", "schema_version": 2})),
     "schema_version 2 is not supported"),
    (lambda f: (f / "run.json").write_text(json.dumps({"kind": "bench", "schema_version": 1})),
     "kind is 'bench', expected 'profile' or 'simulate'"),
])
def test_bad_profile_runs(tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    folder = write_profile(tmp_path / "p")
    edit(folder)
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        load_run(folder)


def test_wrong_kind_for_reader(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="kind is 'simulate', expected 'profile'"):
        load_profile(write_simulate(tmp_path / "s"))
    with pytest.raises(SpecError, match="does not exist"):
        load_run(tmp_path / "nothing")


def test_simulate_missing_steps(tmp_path: Path) -> None:
    folder = write_simulate(tmp_path / "s")
    (folder / "steps.csv").unlink()
    with pytest.raises(SpecError, match="steps.csv: missing"):
        load_simulate(folder)


def test_slo_targets_from_settings() -> None:
    assert slo_targets({"slo_ttft_s": 0.5, "slo_tpot_ms": 50, "rate": 3}) == {"ttft_s": 0.5, "tpot_s": 0.05}
    assert slo_targets({"slo": {"ttft_s": 1.0}}) == {"ttft_s": 1.0}
    assert slo_targets(None) == {}


def test_profile_with_ops_only_has_no_batch_figure(tmp_path: Path) -> None:
    folder = write_profile(tmp_path / "p")
    (folder / "steps.csv").unlink()
    (folder / "generations.csv").unlink()
    names = [f.name for f in profile_section(load_profile(folder)).figures]
    assert names == ["roofline", "breakdown", "errors"]


def test_stored_measured_spec_draws_measured_roofs(tmp_path: Path) -> None:
    """A profile against `local` stores the spec calibrate made: its roofs are measured, not datasheet."""
    folder = write_profile(tmp_path / "p", hardware="local")
    doc = json.loads((folder / "run.json").read_text())
    doc["settings"]["hardware_spec"] = dict(
        name="local", vendor="cpu", peak_tflops={"fp32": 0.36}, memory_bandwidth_gbps=28.0, memory_gib=24.0,
        source="measured by llmperf calibrate on 2026-11-23", efficiency={"schema_version": 1})
    doc["settings"]["compute_dtype"] = "fp32"
    (folder / "run.json").write_text(json.dumps(doc))
    fig = profile_section(load_profile(folder)).figures[0]
    assert "local fp32 measured (llmperf calibrate): 0.36 TFLOP/s, 28 GB/s" in fig.caption
    assert "datasheet" not in fig.caption


def test_calibration_ceilings_beside_the_datasheet() -> None:
    from dataclasses import replace

    from llmperf.report.sources import ceilings_for
    from llmperf.specs import load_hardware

    hw = replace(load_hardware("h100-sxm"), calibration={
        "ceilings": {"memory_gbps": 2900.0, "peak_tflops": {"bf16": 700.0}},
        "datasheet": {"name": "h100-sxm", "peak_tflops": {"bf16": 989.0}, "memory_bandwidth_gbps": 3350.0}})
    roofs = ceilings_for(hw, "bf16")
    assert [(r.calibrated, r.peak_flops_per_s, r.bandwidth_bytes_per_s) for r in roofs] == [
        (False, 989e12, 3350e9), (True, 700e12, 2900e9)]
    plain = ceilings_for(load_hardware("h100-sxm"), "bf16")
    assert [r.calibrated for r in plain] == [False, False]  # datasheet matrix roof + fp32 vector roof
