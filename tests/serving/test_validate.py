"""`simulate --validate` end to end on a tiny model: the engine's run is written on the workload's
clock (seconds from the start, not `perf_counter` readings), requests are admitted when they arrive
(the scheduler clock follows the wall clock), and the replay of the engine's step times makes the
engine's decisions step by step."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from llmperf.serving.validate import run_validation, validation_model, write_validation  # noqa: E402
from llmperf.serving.workload import WorkloadSpec, generate  # noqa: E402
from llmperf.specs import HardwareSpec  # noqa: E402

EFF = {"schema_version": 3, "dtypes": {"fp32": {
    "matmul": {"e_compute": 0.5, "e_memory": 0.7, "overhead_s": 2e-5},
    "attention": {"e_compute": 0.3, "e_memory": 0.7, "overhead_s": 2e-5},
    "elementwise": {"e_compute": 1.0, "e_memory": 0.5, "overhead_s": 1e-5},
    "norm": {"e_compute": 1.0, "e_memory": 0.5, "overhead_s": 1e-5},
    "embedding": {"e_compute": 1.0, "e_memory": 0.5, "overhead_s": 1e-5}}}}


def test_validation_writes_the_engine_run_on_the_workload_clock(tmp_path):
    import torch

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
