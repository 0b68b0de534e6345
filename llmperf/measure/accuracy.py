"""The accuracy benchmark: how close are the predictions of a `llmperf profile` run to its measurements?

    python -m llmperf.measure.accuracy reports/profile/<run> [more run dirs] [--save]

Prints, per run directory, the median and p90 of |predicted / measured - 1| per phase for the
roofline and the calibrated model side by side (from `run.json`, recomputed from `steps.csv` and
`generations.csv` so a hand-edited `run.json` cannot hide anything), against the targets on a CPU
(`TARGETS`), and the critical-batch check: the batch at which the measured decode step starts to grow
(the first batch whose step takes `GROWTH` times the batch-1 step, interpolated in log(batch)
between measured batches; each batch's step is the median of its first `STEP_WINDOW` decode steps)
against the same point of the calibrated model's decode step, evaluated on every batch from 1 to 1024
at the same context. A GPU run also gets `typical + eager` beside them (what a user who never
calibrated is told) and a diagnostic line: the calibration's figures with host and device as a
two-stage pipeline (`pipeline_predictions`; docs/time-models.md).

Targets (a Llama-style model whose weights exceed the cache, fp32 and bf16, batch 1-16, context
64-2048): calibrated decode step median <= 10% and p90 <= 20%; prefill median <= 15%; end-to-end
generation median <= 10%; critical batch within 2x. They are printed as met / MISS, never asserted:
figures measured on a shared machine say so beside them. Nothing here is fitted: the calibrated terms
come from `llmperf calibrate`'s micro-benchmarks, never from the profiled runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from llmperf.analysis.operators import ForwardModel
from llmperf.measure.profile import E2E, Predictor, RunManifest, calibrated_model, error_stats
from llmperf.outputs import write_file
from llmperf.specs import Precision
from llmperf.specs.loader import hardware_from_mapping, model_from_mapping

TARGETS = {("decode", "median"): 0.10, ("decode", "p90"): 0.20, ("prefill", "median"): 0.15, (E2E, "median"): 0.10}
GROWTH = 1.5  # the decode step "starts to grow" once it takes 1.5x the batch-1 step
CRITICAL_BATCH_FACTOR = 2.0


@dataclass(frozen=True, kw_only=True)
class CriticalBatch:
    context: int
    measured: float  # NaN when the measured batches never reach GROWTH x
    predicted: float
    largest: int = 0  # the largest batch measured

    @property
    def beyond_sweep(self) -> bool:
        """The measured step never grew GROWTH x up to the largest batch, and the prediction could still
        be within the factor of a critical batch past it: the target cannot be checked by this run."""
        return (not math.isfinite(self.measured) and math.isfinite(self.predicted)
                and self.predicted * CRITICAL_BATCH_FACTOR > self.largest)

    @property
    def within(self) -> bool:
        if not (math.isfinite(self.measured) and math.isfinite(self.predicted)):
            return False
        return max(self.measured, self.predicted) / min(self.measured, self.predicted) <= CRITICAL_BATCH_FACTOR


STEP_WINDOW = 4  # decode steps per batch whose median is the measured step of the critical batch


def first_steps(rows: pd.DataFrame) -> pd.Series:
    """Per batch, the measured decode step at its first decode steps' context: the median of its first
    `STEP_WINDOW` steps (the first step after a prefill alone ran 1.05-1.75x its successors on this
    CPU, and the context barely moves over a few steps)."""
    first = rows.groupby("batch")["kv_len"].min()
    near = rows["kv_len"] < rows["batch"].map(first) + STEP_WINDOW
    return rows[near].groupby("batch")["measured_s"].median()


def _growth_batch(batches: np.ndarray, times: np.ndarray) -> float:
    """First batch where `times` reaches GROWTH x its batch-1 value (log-interpolated), NaN if never."""
    order = np.argsort(batches)
    b, t = batches[order].astype(float), times[order].astype(float)
    if b[0] != 1:
        return math.nan
    goal = GROWTH * t[0]
    for i in range(1, len(b)):
        if t[i] >= goal:
            frac = (goal - t[i - 1]) / (t[i] - t[i - 1]) if t[i] > t[i - 1] else 1.0
            return float(np.exp(np.log(b[i - 1]) + frac * (np.log(b[i]) - np.log(b[i - 1]))))
    return math.nan


def _manifest(run: RunManifest | Mapping) -> RunManifest:
    """`run` as a manifest (a mapping is a parsed run.json, checked as `RunManifest.load` checks a file)."""
    return run if isinstance(run, RunManifest) else RunManifest.from_mapping(dict(run))


def _run_predictor(run: RunManifest, why: str) -> Predictor | None:
    """The run's own model and hardware spec priced as `profile` priced them (the engine's fused GEMMs),
    with its calibrated model where the hardware spec carries one (else `calibrated` is None); None
    without the specs in `run.json`. `why` names the need for the dtype in its error."""
    s = run.settings
    if s.model_spec is None or s.hardware_spec is None:
        return None
    run.require("settings.dtype", why=why)
    spec = model_from_mapping(dict(s.model_spec), origin=str(run.model))
    hw = hardware_from_mapping(dict(s.hardware_spec), origin=str(run.hardware))
    dtype = s.compute_dtype or hw.compute_dtype(s.dtype)
    try:
        tm = calibrated_model(hw, spec, Precision.uniform(s.dtype), dtype, s.backend or "sdpa")
    except Exception:  # noqa: BLE001 - an uncalibrated spec
        tm = None
    fm = ForwardModel(model=spec, precision=Precision.uniform(s.dtype),
                      attention="naive" if s.backend == "naive" else "fused", fused_qkv=True,
                      fused_gate_up=True)  # the engine's fused GEMMs, as profile predicts them
    return Predictor(fm=fm, hardware=hw, compute_dtype=dtype, calibrated=tm)


def critical_batches(run: RunManifest | Mapping, steps: pd.DataFrame) -> list[CriticalBatch]:
    """Per prompt length: the measured and predicted batch where the decode step grows (see the docstring);
    the roofline's step where the run has no calibration."""
    run = _manifest(run)
    predictor = _run_predictor(run, "the critical batch prices the run's dtype")
    if predictor is None:
        return []
    step = predictor.step
    pick = 1 if predictor.calibrated is not None else 0  # (roofline, calibrated) seconds of a step
    decode = steps[steps["phase"] == "decode"]
    out = []
    grid = np.arange(1, 1025)
    for prompt in sorted({int(c.split("-p")[1].split("-")[0]) for c in decode["config"]}):
        rows = decode[decode["config"].str.contains(f"-p{prompt}-")]
        ctx = int(rows.groupby("batch")["kv_len"].min().max())
        meas = first_steps(rows)
        if len(meas) < 2:
            continue
        pred = np.array([step(b, 1, ctx)[pick] for b in grid])  # each layer kind times its layers
        out.append(CriticalBatch(context=ctx, measured=_growth_batch(meas.index.to_numpy(), meas.to_numpy()),
                                 predicted=_growth_batch(grid, pred), largest=int(meas.index.max())))
    return out


def pipeline_predictions(run: RunManifest | Mapping, steps: pd.DataFrame) -> pd.Series | None:
    """A GPU run's steps priced by its calibration's own figures with the host and the device as a
    two-stage pipeline (`Predictor.pipeline_step`): a diagnostic beside the calibrated column, which
    sums per-operator maxima, to test on new runs whether an eager engine's queue carries slack across
    operators (docs/time-models.md). None for a CPU run or a run without a calibrated hardware spec."""
    run = _manifest(run)
    predictor = _run_predictor(run, "the pipeline prices the run's dtype") if run.device.get("kind") == "cuda" else None
    if predictor is None or predictor.calibrated is None:
        return None
    shapes = [(int(b), int(q), int(k)) for b, q, k in zip(steps["batch"], steps["q_len"], steps["kv_len"])]
    priced = {key: predictor.pipeline_step(*key) for key in set(shapes)}
    return pd.Series([priced[key] for key in shapes], index=steps.index)


TYPICAL_ENGINE = "eager"  # the profile of llmperf's own engine (`models_spec/engines/eager.yaml`)


def typical_predictions(run: RunManifest | Mapping, steps: pd.DataFrame, gens: pd.DataFrame
                        ) -> tuple[pd.Series, pd.Series] | None:
    """A GPU run's steps and generations as `--efficiency typical --engine eager` prices them on the
    datasheet of the device it ran on: what a user who never calibrated would have been told, beside
    the roofline and the calibration. Computed here from the run's shapes (profile records no typical
    column); None for a CPU run or a device without a built-in datasheet."""
    from llmperf.analysis.rollup import phase_arrays
    from llmperf.analysis.roofline import phase_time_model
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.specs import match_hardware

    run = _manifest(run)
    s = run.settings
    if run.device.get("kind") != "cuda" or s.model_spec is None:
        return None
    hw = match_hardware(str(run.device.get("name", "")))
    if hw is None:
        return None
    run.require("settings.dtype", why="the typical model prices the run's dtype")
    spec = model_from_mapping(dict(s.model_spec), origin=str(run.model))
    prec = Precision.uniform(s.dtype)
    dtype = s.compute_dtype or hw.compute_dtype(s.dtype)
    tm = time_model_for(hw, "typical", dtype, backend=s.backend or "sdpa", engine=TYPICAL_ENGINE)
    fm = ForwardModel(model=spec, precision=prec, attention="naive" if s.backend == "naive" else "fused",
                      fused_qkv=True, fused_gate_up=True)
    pred = pd.Series(np.nan, index=steps.index)
    for phase, rows in steps.groupby("phase"):
        arrays = phase_arrays(fm, hw, rows["batch"].to_numpy(float), rows["q_len"].to_numpy(float),
                              rows["kv_len"].to_numpy(float), pp=1, compute_dtype=dtype,
                              time_model=phase_time_model(tm, str(phase)))
        pred[rows.index] = np.broadcast_to(arrays.time_s, len(rows))
    e2e = gens["config"].map(pred.groupby(steps["config"]).sum())
    return pred, e2e


def report(run_dir: Path) -> tuple[str, bool]:
    """The printed report for one run directory, and whether every calibrated target was met."""
    run = RunManifest.load(run_dir / "run.json")
    run.require("model", "hardware", "created", "settings.dtype", "settings.backend", "settings.kv",
                origin=str(run_dir / "run.json"), why="the accuracy report names it")
    steps = pd.read_csv(run_dir / "steps.csv")
    gens = pd.read_csv(run_dir / "generations.csv")
    s = run.settings
    steps_from = run.measurements.steps if run.measurements and run.measurements.steps else \
        "the recorded run (schema-1 run: one run)"
    lines = [f"# {run_dir}: {run.model} on {run.hardware} ({run.device.get('name')}, "
             f"{s.threads or '-'} threads, {s.dtype}, {s.backend}, {s.kv} KV), status "
             f"{run.status or '?'}",
             f"batch {s.batch}, prompt {s.prompt_len}, gen {s.gen_len}; created {run.created}",
             f"steps from {steps_from}",
             "", f"{'phase':8} {'n':>4}  {'roofline median':>15} {'p90':>7}  {'calibrated median':>17} {'p90':>7}"]
    typical = typical_predictions(run, steps, gens)
    if typical is not None:
        lines[-1] += f"  {'typical+' + TYPICAL_ENGINE + ' median':>21} {'p90':>7}"
    ok = True
    for phase in ("prefill", "decode", E2E):
        cells = {}
        for model in ("roofline", "calibrated"):
            if phase == E2E:
                med, p90, n = error_stats(gens[f"predicted_e2e_s_{model}"], gens["measured_e2e_s"])
            else:
                rows = steps[steps["phase"] == phase]
                med, p90, n = error_stats(rows[f"predicted_{model}_s"], rows["measured_s"])
            cells[model] = (med, p90, n)
        r, c = cells["roofline"], cells["calibrated"]
        lines.append(f"{phase:8} {c[2]:>4}  {r[0]:>15.1%} {r[1]:>7.1%}  {c[0]:>17.1%} {c[1]:>7.1%}")
        if typical is not None:
            if phase == E2E:
                t = error_stats(typical[1], gens["measured_e2e_s"])
            else:
                mask = steps["phase"] == phase
                t = error_stats(typical[0][mask], steps.loc[mask, "measured_s"])
            lines[-1] += f"  {t[0]:>21.1%} {t[1]:>7.1%}"
        for (tphase, stat), goal in TARGETS.items():
            if tphase == phase:
                value = c[0] if stat == "median" else c[1]
                met = math.isfinite(value) and value <= goal
                ok &= met
                lines.append(f"    {'met ' if met else 'MISS'} calibrated {phase} {stat} {value:.1%} "
                             f"(target <= {goal:.0%})")
    pipeline = pipeline_predictions(run, steps)
    if pipeline is not None:  # a diagnostic beside the calibrated column (docs/time-models.md)
        cells = [f"{phase} {m:.1%} / {p:.1%}" for phase in ("prefill", "decode")
                 for m, p, _ in [error_stats(pipeline[steps["phase"] == phase],
                                             steps.loc[steps["phase"] == phase, "measured_s"])]]
        lines.append("diagnostic, not a time model: the calibrated figures with host and device as a two-stage "
                     f"pipeline (median / p90): {', '.join(cells)}")
    ops = pd.read_csv(run_dir / "ops.csv")
    lines.append("")
    lines.append("operators: |predicted / measured - 1| (median, p90, share within 20%), roofline | calibrated")
    for (kind, phase), rows in ops.groupby(["kind", "phase"]):
        cells = []
        for model in ("roofline", "calibrated"):
            err = (rows[f"ratio_{model}"] - 1).abs().dropna()
            cells.append(f"{err.median():6.1%} {err.quantile(0.9):6.1%} {(err <= 0.2).mean():4.0%}" if len(err)
                         else "      -")
        lines.append(f"  {kind:10} {phase:8} n={len(rows):4}  {cells[0]} | {cells[1]}")
    lines.append("")
    crit = critical_batches(run, steps)
    for cb in crit:
        if cb.beyond_sweep:  # neither met nor missed: say so (it is not counted as met)
            ok = False
            lines.append(f"n/a  critical batch at context {cb.context}: the measured step never grew {GROWTH:g}x up "
                         f"to batch {cb.largest} (the critical batch is beyond the sweep), predicted "
                         f"{cb.predicted:.1f}: consistent, not checked (sweep larger batches)")
            continue
        ok &= cb.within
        lines.append(f"{'met ' if cb.within else 'MISS'} critical batch at context {cb.context}: measured "
                     f"{cb.measured:.1f}, predicted {cb.predicted:.1f} (target within {CRITICAL_BATCH_FACTOR:g}x; "
                     f"growth = {GROWTH:g}x the batch-1 decode step)")
    if not crit:
        lines.append("critical batch: needs batch 1 and at least one more batch in the run")
    checks = run.checks
    lines.append("checks: " + ", ".join(f"{c.name}: {'pass' if c.passed else 'FAIL'}" for c in checks))
    lines += [f"  FAIL {c.name}: {c.detail}" for c in checks if not c.passed]
    # the host during the run beside the calibration's (`llmperf.measure.profile.host`): a CPU's DRAM
    # read, a GPU's dispatch of a tiny kernel (what a host-bound engine's steps follow)
    from llmperf.measure.profile.host import config_lines, dispatch_lines, drift_lines

    host = None
    if run.host_bandwidth:
        host = ([(p.config, p.read_gb_per_s) for p in run.host_bandwidth], s.calibration_bandwidth_gb_per_s,
                drift_lines, {})
    elif run.host_dispatch:
        host = ([(p.config, p.dispatch_us) for p in run.host_dispatch], s.calibration_dispatch_us, dispatch_lines,
                dict(unit="us a kernel", what="host dispatch"))
    if host is not None:
        pairs, calibrated_probe, overall, words = host
        lines += overall([v for _, v in pairs], calibrated_probe)
        dec = steps[steps["phase"] == "decode"]
        per_config = {str(c): error_stats(g["predicted_calibrated_s"], g["measured_s"])[0]
                      for c, g in dec.groupby("config")}
        lines += config_lines(pairs, {c: e for c, e in per_config.items() if math.isfinite(e)}, calibrated_probe,
                              **words)
    for e in run.experts_touched or []:
        if e.phase == "decode":
            lines.append(f"experts touched, {e.config} decode layer {e.layer}: measured {e.measured_mean:.2f} "
                         f"({e.measured_min}-{e.measured_max}) vs {e.expected_uniform:.2f} under uniform "
                         "routing")
    return "\n".join(lines), ok


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmperf.measure.accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="profile run directories")
    p.add_argument("--save", action="store_true", help="also write accuracy.txt into each run directory")
    args = p.parse_args(argv)
    for run_dir in args.runs:
        if not (run_dir / "run.json").is_file():
            print(f"accuracy: {run_dir} has no run.json (not a profile run directory)", file=sys.stderr)
            return 2
        text, _ = report(run_dir)
        print(text + "\n")
        if args.save:
            write_file(run_dir / "accuracy.txt", text + "\n", "--save")
    return 0


if __name__ == "__main__":
    sys.exit(main())
