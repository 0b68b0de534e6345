"""`simulate --validate` (in `measure`: it runs the real engine): one workload through the real engine on
this CPU and through the simulator with the calibrated local hardware, compared side by side.

The engine (`llmperf.engine`, torch) serves a Llama-style model with seeded random weights larger than
the CPU's caches (so decode streams its weights from memory, as on a GPU), Poisson arrivals in real
time, mixed prompt and output lengths, and a paged KV pool small enough to force recompute
preemptions. The simulator serves the same requests (same arrival times, same lengths) with the same
scheduler settings and pool, each step priced by the calibrated time model of `--hardware local`
(`llmperf calibrate` measures this device's ceilings on micro-benchmarks; it never sees this workload,
so nothing is fitted on what is compared).

Compared: median and p90 of per-request TTFT and TPOT, output tokens/s over the run, and the number
of preemptions; targets: medians within 15%, p90 within 25%, preemptions within 20%.
A third run replays the engine's measured step durations through the simulator: with the same step
times the two schedules must be identical step by step (`StepLog.decision()`), which separates
scheduling differences (there should be none) from step-pricing errors. The host's read of the engine's
own weights, before and after its run, is printed beside the bandwidth the calibration priced (as
`profile` does): a miss by their ratio is the host's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from llmperf.defaults import VALIDATE_HARDWARE, VALIDATE_OUTPUT_LEN, VALIDATE_PROMPT_LEN
from llmperf.errors import SpecError
from llmperf.serving.simulator import (
    ServingConfig,
    SimResult,
    saturated_rate,
    simulate,
    with_rate,
)
from llmperf.serving.workload import Workload, WorkloadSpec, generate
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model

if TYPE_CHECKING:
    from rich.console import Console

TARGETS = {"p50": 0.15, "p90": 0.25, "preemptions": 0.20, "throughput": 0.15}


#: the default offered load of `--validate`, as a fraction of the replica's simulated service rate: a
#: steady state. Above the service rate the queue grows for the whole run and TTFT measures its length
#: (at 2.5 req/s, just above this CPU's simulated 2.4, a 1-2% step-time difference moved the TTFT
#: median by 10-20%).
DEFAULT_LOAD = 0.7


def validation_model(hidden: int = 1024, layers: int = 8, vocab: int = 16000) -> ModelSpec:
    """Llama-3.1-8B's architecture (RMSNorm, RoPE, GQA 4:1, SwiGLU) scaled down; at fp32 its weights
    (~0.5 GB with the defaults) are far larger than any CPU cache."""
    heads = hidden // 64
    return load_model("llama-3.1-8b").scaled(hidden_size=hidden, num_layers=layers, num_heads=heads,
                                             num_kv_heads=max(1, heads // 4), ffn_size=int(hidden * 3.5) // 64 * 64,
                                             vocab_size=vocab, max_positions=4096)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    metric: str
    engine: float
    simulator: float
    target: float | None  # allowed relative error (None: reported only)

    @property
    def rel_error(self) -> float:
        if not self.engine:
            return 0.0 if not self.simulator else math.inf
        return (self.simulator - self.engine) / self.engine

    @property
    def passed(self) -> bool | None:
        return None if self.target is None else abs(self.rel_error) <= self.target


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    settings: dict
    comparisons: list[Comparison]
    engine_requests: pd.DataFrame
    engine_steps: pd.DataFrame
    simulated: SimResult
    replay: SimResult
    schedule_identical: bool
    first_divergence: int | None
    engine_wall_s: float
    sim_wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    # the host's read of the engine's own weights before and after its run (GB/s), and the DRAM bandwidth
    # the calibration priced (`measure.profile.host`): a step-time miss by their ratio is the host's
    host_read_gbps: list[float] = field(default_factory=list)
    calibration_gbps: float | None = None

    def host_lines(self) -> list[str]:
        """The host's read of the engine's weights beside the calibration's (`host.drift_lines`)."""
        from llmperf.measure.profile.host import drift_lines
        return drift_lines(self.host_read_gbps, self.calibration_gbps)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([dict(metric=c.metric, engine=c.engine, simulator=c.simulator, rel_error=c.rel_error,
                                  target=c.target, passed=c.passed) for c in self.comparisons])


def _engine_frames(res, workload: Workload) -> tuple[pd.DataFrame, pd.DataFrame]:  # noqa: ANN001
    """The engine's run in the simulate run-directory columns: times in seconds from the start of the
    run, on the clock the workload's arrivals use (the engine's metrics are `perf_counter` readings;
    each request arrived at start + its workload arrival time)."""
    # request i is workload row i (`to_requests`), and arrived at t0 + its arrival_s
    t0 = min((o.metrics.arrival - float(workload.arrival_s[o.request_id]) for o in res.outputs), default=0.0)
    rows = []
    for o in res.outputs:
        m = o.metrics
        n = o.num_generated
        rows.append(dict(request_id=o.request_id, arrival_s=m.arrival - t0, prompt_tokens=len(o.prompt),
                         output_tokens=n, first_token_s=m.first_token - t0, finish_s=m.finished - t0, ttft_s=m.ttft,
                         tpot_s=m.tpot if m.tpot is not None else float("nan"), e2e_s=m.finished - m.arrival,
                         queue_s=m.queue_time, preemptions=m.num_preemptions))
    req = pd.DataFrame(rows).sort_values("request_id").reset_index(drop=True)
    steps = pd.DataFrame([dict(step=s.step, start_s=s.log.start_s, duration_s=s.log.duration_s, phase=str(s.phase),
                               batch=s.batch, prefill_tokens=s.prefill_tokens, decode_tokens=s.decode_tokens,
                               kv_used_bytes=s.usage.used_bytes, kv_reserved_bytes=s.usage.reserved_bytes,
                               kv_util=s.usage.utilization, running=s.num_running, waiting=s.num_waiting,
                               preemptions=s.num_preempted) for s in res.steps])
    return req, steps


def _tokens_per_s(req: pd.DataFrame) -> float:
    span = float(req["finish_s"].max() - req["arrival_s"].min())
    return float(req["output_tokens"].sum()) / span if span > 0 else 0.0


def compare(engine_req: pd.DataFrame, sim: SimResult) -> list[Comparison]:
    out = []
    for col, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
        e = engine_req[col].dropna().to_numpy(dtype=float)
        s = sim.requests[col].dropna().to_numpy(dtype=float)
        for q, key in ((50, "p50"), (90, "p90")):
            out.append(Comparison(metric=f"{name} {key} (s)", engine=float(np.percentile(e, q)),
                                  simulator=float(np.percentile(s, q)), target=TARGETS[key]))
    out.append(Comparison(metric="output tokens/s", engine=_tokens_per_s(engine_req),
                          simulator=_tokens_per_s(sim.requests), target=TARGETS["throughput"]))
    out.append(Comparison(metric="preemptions", engine=float(engine_req["preemptions"].sum()),
                          simulator=float(sim.requests["preemptions"].sum()), target=TARGETS["preemptions"]))
    return out


def run_validation(*, model: ModelSpec, hardware: HardwareSpec, workload: Workload, num_blocks: int,
                   block_size: int = 16, max_batched_tokens: int | None = 512, chunked_prefill: bool = True,
                   dtype: str = "fp32", seed: int = 0, threads: int | None = None,
                   attention: str = "sdpa") -> ValidationReport:
    """Serve `workload` on the real engine (wall clock, real time arrivals), then simulate it with the
    calibrated `hardware`, then replay the engine's step times through the simulator. `threads`: torch's
    CPU threads for the engine run (restored afterwards)."""
    import torch

    previous = torch.get_num_threads()
    try:
        return _run_validation(model=model, hardware=hardware, workload=workload, num_blocks=num_blocks,
                               block_size=block_size, max_batched_tokens=max_batched_tokens,
                               chunked_prefill=chunked_prefill, dtype=dtype, seed=seed, threads=threads,
                               attention=attention)
    finally:
        torch.set_num_threads(previous)


def _run_validation(*, model: ModelSpec, hardware: HardwareSpec, workload: Workload, num_blocks: int,
                    block_size: int, max_batched_tokens: int | None, chunked_prefill: bool, dtype: str, seed: int,
                    threads: int | None, attention: str) -> ValidationReport:
    import torch

    from llmperf.engine import Engine, SamplingParams, build_model
    from llmperf.engine.workload import to_requests
    from llmperf.measure.profile.host import calibration_bandwidth, read_probe, weights_to_probe
    if threads is not None:
        torch.set_num_threads(threads)
    if not getattr(hardware, "efficiency", None):
        raise SpecError(f"--hardware: {hardware.name!r} carries no calibration; run `llmperf calibrate` first and "
                        "validate with --hardware local")
    net = build_model(model, seed=seed, dtype=dtype, attention=attention)
    engine = Engine(net, cache="paged", block_size=block_size, num_blocks=num_blocks,
                    max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill)
    # Every request generates exactly its output length (no EOS), as the simulator assumes.
    params = SamplingParams(max_new_tokens=int(workload.output_tokens.max()),
                            min_new_tokens=int(workload.output_tokens.max()))
    requests = to_requests(workload, vocab_size=model.vocab_size, seed=seed)
    # Warm-up (allocator, kernels, oneDNN's packed weights): one sequence (the plain one-row GEMMs) and two
    # of different lengths (one grouped forward, every GEMM at two rows, so the LM head is packed now: its
    # first packing took 283 ms in the first mixed step of a validation run, which no prediction prices).
    warm = requests[0].prompt
    engine.generate([warm[:8]], SamplingParams(max_new_tokens=4))
    engine.generate([warm[:8], warm[:5]], SamplingParams(max_new_tokens=4))
    # the engine's weights as the host streams them now, before and after the run: a shared machine's
    # DRAM reads at a speed that follows where a buffer lands (on the development VM the validation
    # model's weights read at 54 GB/s while a fresh buffer read 72-92 and the calibration priced 74)
    probe = weights_to_probe(net)
    host = [read_probe(net.device, tensors=probe)]
    t0 = time.perf_counter()
    res = engine.serve(requests, params, policy="continuous", realtime=True)
    wall = time.perf_counter() - t0
    host.append(read_probe(net.device, tensors=probe))
    eng_req, eng_steps = _engine_frames(res, workload)

    config = _sim_config(model, hardware, num_blocks, block_size, max_batched_tokens, chunked_prefill, dtype)
    t1 = time.perf_counter()
    sim = simulate(workload, config)
    sim_wall = time.perf_counter() - t1
    durations = replay_durations(eng_steps["start_s"].to_list(), eng_steps["duration_s"].to_list(),
                                 origin=float(workload.arrival_s.min()))
    try:
        replay = simulate(workload, config, step_times=durations)
        divergence = _first_divergence([s.log for s in res.steps], replay.log)
    except SpecError:  # the replayed schedule ran longer than the engine's
        replay, divergence = sim, len(durations)
    settings = dict(model=model.name, hidden_size=model.hidden_size, num_layers=model.num_layers,
                    vocab_size=model.vocab_size, dtype=dtype, hardware=hardware.name, num_blocks=num_blocks,
                    block_size=block_size, max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill,
                    threads=torch.get_num_threads(), attention=attention,
                    weights_gib=sim.memory.weights_bytes / 2**30, requests=len(workload),
                    workload=workload.description)
    return ValidationReport(settings=settings, comparisons=compare(eng_req, sim), engine_requests=eng_req,
                            engine_steps=eng_steps, simulated=sim, replay=replay, schedule_identical=divergence is None,
                            first_divergence=divergence, engine_wall_s=wall, sim_wall_s=sim_wall,
                            host_read_gbps=host, calibration_gbps=calibration_bandwidth(hardware))


def replay_durations(starts: Sequence[float], durations: Sequence[float], origin: float | None = None) -> list[float]:
    """The step times that replay the engine's clock: each step lasts until the next one started
    (its own duration plus the loop's time before the next step, or an idle wait for an arrival, which
    the simulator then spends the same way), the last one its own duration. The engine's scheduler
    clock follows the wall clock (`Scheduler.run(clock=...)`), so its steps start where these put them.
    `origin`: where the simulator's first step starts (the first arrival); the engine's first step
    started a little later (its clock had run on), and the first duration takes that up, so every
    later step starts at the engine's time. (Without it the replay ran tens of microseconds early, and
    a request that arrived 3 us before an engine step was admitted a step later: a false divergence.)"""
    own = list(durations)
    out = [max(b - a, d) for a, b, d in zip(starts, starts[1:], own)] + own[-1:]
    if origin is not None and out:
        out[0] += max(0.0, float(starts[0]) - origin)
    return out


def _sim_config(model: ModelSpec, hardware: HardwareSpec, num_blocks: int, block_size: int,
                max_batched_tokens: int | None, chunked_prefill: bool, dtype: str) -> ServingConfig:
    """The simulator's view of the validation's engine: its pool, budget and calibrated time model."""
    return ServingConfig(model=model, hardware=hardware, precision=Precision.uniform(dtype), efficiency="calibrated",
                         max_batch=None, max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill,
                         prefix_sharing=False, block_size=block_size, num_blocks=num_blocks)


def _first_divergence(engine_logs: list, sim_logs: list) -> int | None:
    for i, (a, b) in enumerate(zip(engine_logs, sim_logs)):
        if a.decision() != b.decision():
            return i
    return None if len(engine_logs) == len(sim_logs) else min(len(engine_logs), len(sim_logs))


def write_validation(report: ValidationReport, path: str | Path) -> Path:
    """The simulated run as a simulate run directory, plus the engine's run (engine/requests.csv,
    engine/steps.csv) and validation.json / validation.csv."""
    from llmperf.outputs import json_text
    from llmperf.serving.rundir import prepare_dir, write_run_dir
    sim = report.simulated
    d = prepare_dir(path)
    with d.transaction():
        write_run_dir(d, model=report.settings["model"], hardware=report.settings["hardware"],
                      settings=sim.settings, summary=sim.summary(), requests=sim.requests, steps=sim.steps,
                      extra=dict(validation=dict(identical_schedule_with_engine_times=report.schedule_identical)))
        eng = prepare_dir(d.path / "engine")
        with eng.transaction():
            eng.write("requests.csv", report.engine_requests.to_csv(index=False))
            eng.write("steps.csv", report.engine_steps.to_csv(index=False))
        d.written += eng.written
        d.created += eng.created
        frame = report.to_frame()
        d.write("validation.csv", frame.to_csv(index=False))
        doc = dict(kind="simulate-validation", schema_version=1, settings=report.settings,
                   comparisons=frame.to_dict(orient="records"), schedule_identical=report.schedule_identical,
                   first_divergence=report.first_divergence, engine_wall_s=report.engine_wall_s,
                   sim_wall_s=report.sim_wall_s, engine_steps=len(report.engine_steps), sim_steps=len(sim.steps),
                   host_bandwidth_gbps=report.host_read_gbps, calibration_bandwidth_gbps=report.calibration_gbps,
                   host_lines=report.host_lines())
        d.write("validation.json", json_text(doc) + "\n")
    return Path(d.shown)


def validation_table(report: ValidationReport):  # noqa: ANN201
    from rich.table import Table
    s = report.settings
    t = Table(title=f"engine vs simulator: {s['model']} ({s['hidden_size']}x{s['num_layers']}, {s['dtype']}, "
                    f"{s['weights_gib']:.2f} GiB weights), {s['requests']} requests, {s['num_blocks']} blocks, "
                    f"{s['threads']} threads; simulator on {s['hardware']} (calibrated)")
    for col in ("metric", "engine", "simulator", "error", "target", "within"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for c in report.comparisons:
        t.add_row(c.metric, f"{c.engine:.4g}", f"{c.simulator:.4g}", f"{c.rel_error:+.1%}",
                  "-" if c.target is None else f"±{c.target:.0%}", "-" if c.passed is None else
                  ("yes" if c.passed else "NO"))
    t.caption = ("schedule with the engine's step times: "
                 + ("identical, step by step" if report.schedule_identical else
                    f"DIVERGES at step {report.first_divergence}")
                 + f"; engine run {report.engine_wall_s:.1f} s wall, simulation {report.sim_wall_s:.2f} s")
    return t


def run_validation_cli(*, model: str, rate: float | None, requests: int | None, prompt_len: str | None,
                       output_len: str | None, seed: int, num_blocks: int | None, max_batched_tokens: int,
                       chunked_prefill: bool, hardware: str | None, run_dir: Path | None, hidden: int = 1024,
                       layers: int = 8, console: Console | None = None) -> None:
    """What `llmperf simulate --validate` runs. Defaults (sized for a quiet 2-core CPU, about a minute
    of engine time), each taken only where the option was not given (None): `hardware` `local` (the
    calibration; a device without one is refused by name), 60 requests, Poisson arrivals at
    `DEFAULT_LOAD` of the replica's simulated service rate (a steady state; `--rate` sets one),
    prompts uniform 16-192, outputs uniform 8-64 tokens, a pool of 32 blocks of 16 tokens (at most two
    long requests at once: preemptions), chunked prefill with the `--max-batched-tokens` budget.
    `console`: where the table is printed (default: a rich console on stdout)."""
    if console is None:
        from rich.console import Console as _Console
        console = _Console()
    if model not in ("llama-3.1-8b", "validation"):
        raise SpecError("--validate: runs its own scaled Llama-3.1-8B-architecture model; leave MODEL at its "
                        "default (llama-3.1-8b)")
    hw = load_hardware(VALIDATE_HARDWARE if hardware is None else hardware)
    if not getattr(hw, "efficiency", None):
        raise SpecError(f"--hardware: {hw.name!r} carries no calibration; run `llmperf calibrate` first and "
                        "validate with --hardware local")
    spec = WorkloadSpec(arrival=f"poisson:{rate if rate is not None else 1.0!r}",
                        prompt_len=VALIDATE_PROMPT_LEN if prompt_len is None else prompt_len,
                        output_len=VALIDATE_OUTPUT_LEN if output_len is None else output_len,
                        num_requests=requests or 60, seed=seed)
    if spec.arrival.rate_per_s <= 0:
        raise SpecError("--rate: must be > 0")
    net = validation_model(hidden, layers)
    if rate is None:
        config = _sim_config(net, hw, num_blocks or 32, 16, max_batched_tokens, chunked_prefill, "fp32")
        mu = saturated_rate(spec, config)
        spec = with_rate(spec, round(DEFAULT_LOAD * mu, 3))
        console.print(f"rate: {spec.arrival.rate_per_s:.3g} requests/s, {DEFAULT_LOAD:.0%} of the "
                      f"{mu:.3g} requests/s this replica serves flat out on {hw.name} (simulated; "
                      "--rate sets another)")
    workload = generate(spec)
    report = run_validation(model=net, hardware=hw, workload=workload, num_blocks=num_blocks or 32,
                            max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill, seed=seed)
    console.print(validation_table(report))
    for line in report.host_lines():
        console.print(line, markup=False, highlight=False)
    if run_dir is not None:
        write_validation(report, run_dir)


__all__ = ["Comparison", "DEFAULT_LOAD", "TARGETS", "ValidationReport", "compare", "run_validation",
           "run_validation_cli", "validation_model",
           "validation_table", "write_validation"]
