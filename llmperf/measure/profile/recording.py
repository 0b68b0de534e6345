"""One profiled generation: the engine's greedy generation timed per step and per operator
(`llmperf.engine.Recorder`), its rows joined with their predictions; with several runs of it (rounds,
`ProfileSettings.runs`), each step and operator the median over them.

Per-operator recording costs host time (a pair of CUDA events per operator) and an eager engine on a
GPU is launch-bound, so on CUDA the steps, TTFT, TPOT and end-to-end times come from a run recorded
per step only (synchronise, perf_counter, synchronise) and the per-operator breakdown from a second,
recorded run of the same generation; `steps.csv` keeps the recorded step time beside
(`measured_recorded_s`). On CPU an operator's record is two `perf_counter` calls, about a microsecond,
so one recorded run serves both (`ProfileSettings.separate_step_run` forces two).

A model's layers differ (`ModelSpec.layer_kinds`: sliding or full attention, dense or MoE FFN, rotary
or not): a generation row sums an operator over the layers of one kind (ops.csv `layer`, the kind's
label; `model` for the model-level operators) and is joined to ONE layer of that kind's prediction
times their number. Every MoE layer reports the distinct routed experts its tokens chose in each step
(`llmperf.engine.instrument.EXPERTS_TOUCHED`) beside the expectation under uniform routing,
`E * (1 - (1 - k/E) ** tokens)` (`llmperf.analysis.operators.expected_experts_touched`), and the rows
each expert got, from which `balance` works out each expert-parallel layout's busiest GPU.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from llmperf.analysis.operators import expected_experts_touched
from llmperf.analysis.vocabulary import OP_NAMES, Op, Phase
from llmperf.measure.profile.balance import balance_rows, expert_counts
from llmperf.measure.profile.join import join_report
from llmperf.measure.profile.predict import Predictor
from llmperf.measure.profile.settings import ProfileSettings
from llmperf.measure.profile.tables import MODEL_LEVEL, op_row
from llmperf.specs import ModelSpec


class Generated(NamedTuple):
    """What one profiled generation produced: its ops.csv, steps.csv and generations.csv rows, the join
    of its measured operators with the predicted ones (`join_report`) and, for a mixture-of-experts
    model, the experts.csv and expert_balance.csv rows (`expert_rows`, `balance.balance_rows`) and the
    rows each expert got (`load`, for expert_load.json)."""

    ops: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    generation: dict[str, Any]
    join: list[dict[str, Any]]
    experts: list[dict[str, Any]]
    balance: list[dict[str, Any]]
    load: dict[int, Any] | None = None  # MoE: per layer, the rows each expert got (`balance.expert_counts`)


def generation(engine: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, config: str, batch: int,
               prompt_len: int, gen_len: int) -> Generated:
    """One greedy generation, recorded (`record_generation`) and summarised (`summarize`)."""
    return summarize([record_generation(engine, spec, settings, batch, prompt_len, gen_len)], spec, pred, config,
                     batch, prompt_len, gen_len)


class Recorded(NamedTuple):
    """One run of a generation: its steps timed unrecorded (`settings.two_runs`; else None) and its
    recorded trace (steps and operators)."""

    step_trace: Any
    trace: Any


def record_generation(engine: Any, spec: ModelSpec, settings: ProfileSettings, batch: int, prompt_len: int,
                      gen_len: int) -> Recorded:
    """One greedy generation after a warm-up: its steps timed in an unrecorded run when
    `settings.two_runs`, its operators in a recorded run (see the module docstring)."""
    import torch

    from llmperf.engine import Recorder, SamplingParams
    from llmperf.measure.timers import gc_paused

    gen = torch.Generator().manual_seed(settings.seed)
    prompts = torch.randint(0, spec.vocab_size, (batch, prompt_len), generator=gen).tolist()
    params = SamplingParams(max_new_tokens=gen_len, min_new_tokens=gen_len)
    device = engine.model.device
    if device.type == "cuda":
        # the whole generation once: Triton autotunes per length bucket (prefill, and decode's split
        # count), which must not land in a timed step; a GPU generation costs well under a second
        engine.generate(prompts, params, seed=settings.seed)
    else:
        # the real prompts and one decode step: oneDNN builds a GEMM primitive for every new row count on
        # its first call (a bf16 64-token prefill's first QKV GEMM took 4.3 ms, then 0.25 ms), and the
        # allocator first meets the prefill's sizes; the time model prices the steady state
        engine.generate(prompts, SamplingParams(max_new_tokens=2, min_new_tokens=2), seed=settings.seed)
    step_trace = None
    if settings.two_runs:  # the steps as they run without per-operator instrumentation
        step_rec = Recorder(device, ops=False)
        with gc_paused():
            engine.generate(prompts, params, seed=settings.seed, recorder=step_rec)
        step_trace = step_rec.trace
    rec = Recorder(device)
    with gc_paused():  # a garbage collection inside a timed step is not the engine's time
        engine.generate(prompts, params, seed=settings.seed, recorder=rec)
    return Recorded(step_trace, rec.trace)


def summarize(runs: Sequence[Recorded], spec: ModelSpec, pred: Predictor, config: str, batch: int, prompt_len: int,
              gen_len: int) -> Generated:
    """The rows of one configuration from its runs (the same greedy generation each time): each step's
    time the median over the runs, each operator's the median over every run's steps (`joined_op_rows`);
    the join, the experts and their balance from the first run."""
    if not runs:
        raise ValueError("summarize: no runs")
    first = runs[0].trace

    def step_times(trace: Any) -> dict[tuple[str, int], float]:
        return {(st.phase, st.step): st.seconds for st in trace.steps}

    timed = [step_times(r.step_trace if r.step_trace is not None else r.trace) for r in runs]
    recorded = [step_times(r.trace) for r in runs]

    def median_of(per_run: list[dict[tuple[str, int], float]], key: tuple[str, int]) -> float:
        values = [t[key] for t in per_run if key in t]
        return float(statistics.median(values)) if values else math.nan

    steps_rows = []
    for st in (runs[0].step_trace or first).steps:
        key = (st.phase, st.step)
        roof, cal = pred.step(st.batch, st.q_len, st.kv_len)
        steps_rows.append(dict(config=config, step=st.step, phase=st.phase, batch=st.batch, q_len=st.q_len,
                               kv_len=st.kv_len, measured_s=median_of(timed, key),
                               measured_recorded_s=median_of(recorded, key),
                               predicted_roofline_s=roof, predicted_calibrated_s=cal))
    ops_rows = joined_op_rows_over([r.trace.ops for r in runs], spec, pred)
    join = join_report(first, spec, pred.fm, config)
    experts = expert_rows(first, spec, config)
    balance = balance_rows(first, spec, config) if spec.is_moe else []

    pre = [s for s in steps_rows if s["phase"] == Phase.prefill.value]
    dec = [s for s in steps_rows if s["phase"] == Phase.decode.value]

    def total(rows: list[dict], key: str) -> float:
        return float(sum(r[key] for r in rows))

    gen_row: dict[str, Any] = dict(config=config, batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                                   measured_ttft_s=total(pre, "measured_s"),
                                   measured_tpot_s=total(dec, "measured_s") / len(dec) if dec else 0.0,
                                   measured_e2e_s=total(pre + dec, "measured_s"))
    for model in ("roofline", "calibrated"):
        key = f"predicted_{model}_s"
        gen_row[f"predicted_ttft_s_{model}"] = total(pre, key)
        gen_row[f"predicted_tpot_s_{model}"] = total(dec, key) / len(dec) if dec else 0.0
        gen_row[f"predicted_e2e_s_{model}"] = total(pre + dec, key)
    load = expert_counts(first, spec.num_experts) if spec.is_moe else None
    return Generated(ops_rows, steps_rows, gen_row, join, experts, balance, load)


def joined_op_rows(records: Iterable[Any], spec: ModelSpec, pred: Predictor) -> list[dict[str, Any]]:
    """`joined_op_rows_over` one recorded run's `OpRecord`s."""
    return joined_op_rows_over([records], spec, pred)


def joined_op_rows_over(runs: Sequence[Iterable[Any]], spec: ModelSpec, pred: Predictor) -> list[dict[str, Any]]:
    """ops.csv rows (kind `generation`) from the `OpRecord`s of runs of one generation: per step of each
    run, each operator summed over the layers of one kind (and over the experts of a MoE layer, each
    timed apart); then one row per (phase, operator, layer kind, batch, q_len, kv_len) with the median
    over those steps, joined to one layer of that kind's prediction times its number of layers. A name
    with no prediction keeps its row, its predictions NaN (`join_report` names it)."""
    kinds = spec.layer_kinds()
    groups = {kind.label: (kind, count) for kind, count in spec.layer_groups()}
    per_step: dict[tuple, float] = defaultdict(float)
    for run_index, run in enumerate(runs):
        for r in run:
            label = MODEL_LEVEL if r.layer is None else kinds[r.layer].label
            per_step[(run_index, r.phase, r.step, r.op, label, r.batch, r.q_len, r.kv_len)] += r.seconds
    grouped: dict[tuple, list[float]] = defaultdict(list)
    for (_run, phase, _step, op, label, b, q, kv), s in per_step.items():
        grouped[(phase, op, label, b, q, kv)].append(s)
    rows = []
    for (phase, name, label, b, q, kv), samples in sorted(grouped.items(), key=lambda kv_: (kv_[0][0], kv_[0][5])):
        op = Op(name) if name in OP_NAMES else None
        kind, layers = groups.get(label, (None, 1))
        cost = pred.cost(op, b, q, kv, kind) if op is not None else None
        if cost is None:
            p = (math.nan, math.nan)
        else:
            r, c = pred.times(cost, b, q)
            p = (r * layers, c * layers)
        spread = (float(np.quantile(samples, 0.9) - np.quantile(samples, 0.1))) if len(samples) > 1 else 0.0
        rows.append(op_row("generation", phase, name, b, q, kv, statistics.median(samples), spread, len(samples),
                           cost, p, pred.hardware, pred.compute_dtype, layers=layers, layer=label))
    return rows


def expert_rows(trace: Any, spec: ModelSpec, config: str) -> list[dict[str, Any]]:
    """experts.csv rows: per step and MoE layer, the distinct routed experts its tokens chose (the
    layer's `EXPERTS_TOUCHED` count) beside the analytical expectation under uniform routing,
    `E * (1 - (1 - k / E) ** tokens)` (`expected_experts_touched`, what the analytical model reads
    the expert weights of)."""
    from llmperf.engine.instrument import EXPERTS_TOUCHED

    rows = []
    for c in trace.counts:
        if c.name != EXPERTS_TOUCHED:
            continue
        tokens = c.batch * c.q_len
        rows.append(dict(config=config, phase=c.phase, step=c.step, layer=c.layer, batch=c.batch, q_len=c.q_len,
                         kv_len=c.kv_len, tokens=tokens, experts_touched=c.value,
                         expected_uniform=float(expected_experts_touched(tokens, spec.num_experts,
                                                                         spec.experts_per_token))))
    return rows


def experts_summary(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """run.json `experts_touched`: per (configuration, phase, layer), the mean, least and most distinct
    experts touched over the steps, beside the uniform-routing expectation at the phase's tokens per
    step (the mean over steps; every decode step of a generation has the same tokens)."""
    by: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["config"], r["phase"], r["layer"])].append(r)
    out = []
    for (config, phase, layer), rs in by.items():
        touched = [r["experts_touched"] for r in rs]
        out.append(dict(config=config, phase=phase, layer=layer, batch=rs[0]["batch"], tokens=rs[0]["tokens"],
                        steps=len(rs), measured_mean=float(np.mean(touched)), measured_min=int(min(touched)),
                        measured_max=int(max(touched)),
                        expected_uniform=float(np.mean([r["expected_uniform"] for r in rs]))))
    return out
