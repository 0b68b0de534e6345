"""`simulate --validate` end to end on a tiny model: the engine's run is written on the workload's
clock (seconds from the start, not `perf_counter` readings), requests are admitted when they arrive
(the scheduler clock follows the wall clock), and the replay of the engine's step times makes the
engine's decisions step by step."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from llmperf.errors import SpecError  # noqa: E402
from llmperf.measure.validate import run_validation, validation_model, write_validation  # noqa: E402
from llmperf.serving.workload import WorkloadSpec, generate  # noqa: E402
from llmperf.specs import HardwareSpec  # noqa: E402

EFF = {"schema_version": 3, "dtypes": {"fp32": {
    "matmul": {"e_compute": 0.5, "e_memory": 0.7, "overhead_s": 2e-5},
    "attention": {"e_compute": 0.3, "e_memory": 0.7, "overhead_s": 2e-5},
    "elementwise": {"e_compute": 1.0, "e_memory": 0.5, "overhead_s": 1e-5},
    "norm": {"e_compute": 1.0, "e_memory": 0.5, "overhead_s": 1e-5},
    "embedding": {"e_compute": 1.0, "e_memory": 0.5, "overhead_s": 1e-5}}}}


def test_validation_writes_the_engine_run_on_the_workload_clock(tmp_path, monkeypatch):
    import torch
    from rich.console import Console

    import llmperf.measure.validate as v

    threads = torch.get_num_threads()
    hw = HardwareSpec(name="local", vendor="cpu", peak_tflops={"fp32": 0.1}, memory_bandwidth_gbps=20, memory_gib=8,
                      efficiency=EFF, calibration={"tool": "llmperf calibrate"})
    work = generate(WorkloadSpec(arrival="poisson:100", prompt_len="uniform:8:24", output_len="uniform:2:6",
                                 num_requests=8, seed=3))
    report = run_validation(model=validation_model(hidden=64, layers=2, vocab=97), hardware=hw, workload=work,
                            num_blocks=16, block_size=4, max_batched_tokens=32, threads=1)
    req = report.engine_requests.sort_values("request_id")
    # arrivals on the workload's clock (the engine admits at wall-clock arrival times: a few ms of slack)
    assert list(req["arrival_s"]) == pytest.approx(list(work.arrival_s), abs=1e-6)
    assert (req["first_token_s"] > req["arrival_s"]).all() and (req["finish_s"] >= req["first_token_s"]).all()
    assert (req["ttft_s"] - (req["first_token_s"] - req["arrival_s"])).abs().max() < 1e-9
    assert report.schedule_identical, f"replay diverged at step {report.first_divergence}"
    assert torch.get_num_threads() == threads  # the engine run's threads=1 is not left behind
    steps = report.engine_steps
    assert steps["start_s"].iloc[0] >= 0 and steps["start_s"].is_monotonic_increasing
    write_validation(report, tmp_path / "run")
    assert (tmp_path / "run" / "engine" / "requests.csv").exists()
    summary = json.loads((tmp_path / "run" / "validation.json").read_text())
    assert summary
    # the host's read of the engine's own weights before and after its run, beside the calibration's
    assert len(report.host_read_gbps) == 2 and all(g > 0 for g in report.host_read_gbps)
    assert report.calibration_gbps == pytest.approx(20.0)
    assert summary["host_bandwidth_gbps"] == pytest.approx(report.host_read_gbps)
    assert summary["calibration_bandwidth_gbps"] == pytest.approx(20.0)
    assert summary["host_lines"] == report.host_lines()
    assert report.host_lines()[0].startswith("host DRAM read during the run: median ")
    assert "the calibration priced DRAM at 20.0 GB/s" in report.host_lines()[0]
    monkeypatch.setattr(v, "run_validation", lambda **kw: report)  # the command prints them under its table
    monkeypatch.setattr(v, "load_hardware", lambda name: hw)
    console = Console(record=True, width=200)
    v.run_validation_cli(model="llama-3.1-8b", rate=1.0, requests=8, prompt_len=None, output_len=None, seed=0,
                         num_blocks=16, max_batched_tokens=32, chunked_prefill=True, hardware="local", run_dir=None,
                         hidden=64, layers=2, console=console)
    assert report.host_lines()[0] in console.export_text()


def test_the_default_rate_is_a_steady_state_load(monkeypatch, tmp_path):
    """Without --rate the validation offers DEFAULT_LOAD of the replica's simulated service rate (the
    old fixed 2.5 req/s was just above this CPU's: a queue growing all run long); --rate is taken as
    given; a hardware without calibration is refused before anything runs."""
    import llmperf.measure.validate as v
    from llmperf.serving.simulator import saturated_rate

    hw = HardwareSpec(name="local", vendor="cpu", peak_tflops={"fp32": 0.1}, memory_bandwidth_gbps=20, memory_gib=8,
                      efficiency=EFF, calibration={"tool": "llmperf calibrate"})
    seen = []

    class Stop(Exception):
        pass

    def fake_run(**kw):
        seen.append(kw["workload"])
        raise Stop

    monkeypatch.setattr(v, "run_validation", fake_run)
    monkeypatch.setattr(v, "load_hardware", lambda name: hw)
    common = dict(model="llama-3.1-8b", requests=None, prompt_len=None, output_len=None, seed=0, num_blocks=None,
                  max_batched_tokens=2048,
                  chunked_prefill=True, hardware="local", run_dir=None, hidden=64, layers=2)
    with pytest.raises(Stop):
        v.run_validation_cli(rate=None, **common)
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:16:192", output_len="uniform:8:64", num_requests=60,
                        seed=0)
    mu = saturated_rate(spec, v._sim_config(validation_model(64, 2), hw, 32, 16, 2048, True, "fp32"))
    rate = len(seen[0]) / float(seen[0].arrival_s[-1])  # Poisson: about the offered rate
    assert 0.5 * v.DEFAULT_LOAD * mu < rate < 1.5 * v.DEFAULT_LOAD * mu
    with pytest.raises(Stop):
        v.run_validation_cli(rate=0.5, **common)
    assert len(seen[1]) / float(seen[1].arrival_s[-1]) < 1.0
    monkeypatch.setattr(v, "load_hardware", lambda name: HardwareSpec(name="a100", vendor="NVIDIA",
                                                                      peak_tflops={"fp32": 19.5},
                                                                      memory_bandwidth_gbps=2000, memory_gib=80))
    with pytest.raises(SpecError, match="carries no calibration"):
        v.run_validation_cli(rate=None, **common)


def _through_the_cli(monkeypatch, *args):
    """`llmperf simulate --validate ARGS` up to the engine run: the hardware name it loads and the
    workload it would serve (the engine run itself is replaced)."""
    from typer.testing import CliRunner

    import llmperf.measure.validate as v
    from llmperf.cli import app
    from llmperf.specs import load_hardware

    calibrated = HardwareSpec(name="local", vendor="cpu", peak_tflops={"fp32": 0.1}, memory_bandwidth_gbps=20,
                              memory_gib=8, efficiency=EFF, calibration={"tool": "llmperf calibrate"})
    seen: dict = {}

    def hardware(name):
        seen["hardware"] = name
        return calibrated if name == "local" else load_hardware(name)

    def engine_run(**kw):
        seen["workload"] = kw["workload"]
        raise SpecError("stopped before the engine")

    monkeypatch.setattr(v, "load_hardware", hardware)
    monkeypatch.setattr(v, "run_validation", engine_run)
    result = CliRunner().invoke(app, ["simulate", "--validate", "--rate", "1", *args])
    return result, seen


def test_an_explicit_hardware_is_taken_as_given(monkeypatch, fresh_cache):
    """`-H a100-80gb-sxm` (the simulator's default device, given explicitly) was once silently replaced by
    `local`: now it is the device validated against, and refused by name since it carries no calibration."""
    result, seen = _through_the_cli(monkeypatch, "-H", "a100-80gb-sxm")
    assert result.exit_code == 2, result.output
    assert seen["hardware"] == "a100-80gb-sxm"
    assert "'a100-80gb-sxm' carries no calibration" in result.output and "workload" not in seen


def test_options_left_out_take_validates_own_defaults(monkeypatch, fresh_cache):
    result, seen = _through_the_cli(monkeypatch)
    assert result.exit_code == 2 and "stopped before the engine" in result.output, result.output
    assert seen["hardware"] == "local"
    work = seen["workload"]
    assert 16 <= work.prompt_tokens.min() and work.prompt_tokens.max() <= 192
    assert 8 <= work.output_tokens.min() and work.output_tokens.max() <= 64


def test_given_lengths_are_taken_as_given_even_when_they_equal_simulates_defaults(monkeypatch, fresh_cache):
    result, seen = _through_the_cli(monkeypatch, "--prompt-len", "lognormal:6:0.8:16:4096",
                                    "--output-len", "300", "-n", "50")
    assert "stopped before the engine" in result.output, result.output
    work = seen["workload"]
    assert (work.output_tokens == 300).all() and work.prompt_tokens.max() > 192
