"""`run_profile`: measure, predict, join and write a profile run directory.

For every configuration (batch x prompt length x generation length): the micro-benchmarks
(`micro`), then the engine's whole greedy generation (`recording`), each row joined with its
predictions (`predict`). Files (the run-directory contract, docs/schemas.md): `run.json` (a
`RunManifest`, written atomically and updated after every configuration), `ops.csv`, `steps.csv`,
`generations.csv` and for a MoE model `experts.csv`, `expert_balance.csv` (`tables`: rows appended
and flushed as they are measured, so an interrupted sweep keeps them) and `expert_load.json` (the rows
each expert got over every configuration so far, `llmperf.specs.expert_load`: `--expert-load`'s input).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.timemodel import ROOFLINE_MODEL, EfficiencyTimeModel
from llmperf.errors import SpecError
from llmperf.measure.profile.balance import balance_summary
from llmperf.measure.profile.checks import cross_checks
from llmperf.measure.profile.host import (
    calibration_bandwidth,
    calibration_dispatch,
    host_moved_notes,
    read_probe,
    weights_to_probe,
)
from llmperf.measure.profile.join import join_check, merge_joins
from llmperf.measure.profile.manifest import (
    CalibratedOverheads,
    Check,
    DispatchProbe,
    ErrorRow,
    ExpertBalance,
    ExpertsTouched,
    HostProbe,
    JoinEntry,
    Measurements,
    RunManifest,
    RunSettings,
    TimeModels,
)
from llmperf.measure.profile.micro import _llc_bytes, micro_benchmarks
from llmperf.measure.profile.predict import Predictor, calibrated_model
from llmperf.measure.profile.recording import Recorded, experts_summary, record_generation, summarize
from llmperf.measure.profile.resolve import check_fits, layers_kept, memory_needed, resolve_spec
from llmperf.measure.profile.settings import ProfileSettings, Progress
from llmperf.measure.profile.tables import (
    EXPERT_BALANCE_COLUMNS,
    EXPERTS_COLUMNS,
    GENERATIONS_COLUMNS,
    OPS_COLUMNS,
    STEPS_COLUMNS,
    _Table,
    errors_table,
)
from llmperf.measure.timers import dispatch_seconds
from llmperf.outputs import json_text, jsonable, write_file
from llmperf.specs import HardwareSpec, ModelSpec, Precision
from llmperf.specs.expert_load import expert_load_document


def _write_run(path: Path, manifest: RunManifest) -> None:
    """run.json through `llmperf.outputs` (atomic: a reader never sees half of it; strict JSON, NaN as null)."""
    write_file(path, json_text(manifest.to_dict()), "--output")


def _write_load(path: Path, load: dict[int, Any], spec: ModelSpec, settings: ProfileSettings) -> None:
    """expert_load.json (atomically): the rows each expert of each MoE layer got so far."""
    source = (f"llmperf profile of {spec.name}, random-initialised weights (seed {settings.seed}), configurations "
              f"{', '.join(f'b{b}-p{p}-g{g}' for b, p, g in settings.configs())}")
    doc = expert_load_document(load, spec.num_experts, model=spec.name, experts_per_token=spec.experts_per_token,
                               source=source)
    write_file(path, json_text(doc), "--output")


@dataclass
class ProfileResult:
    """What `run_profile` produced (the same content as the run directory)."""

    out_dir: Path
    manifest: RunManifest
    ops: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    generations: list[dict[str, Any]] = field(default_factory=list)
    experts: list[dict[str, Any]] = field(default_factory=list)  # experts.csv (MoE models)
    balance: list[dict[str, Any]] = field(default_factory=list)  # expert_balance.csv (MoE models)
    interrupted: bool = False

    @property
    def run(self) -> dict[str, Any]:
        """run.json's mapping (`RunManifest.to_dict`)."""
        return self.manifest.to_dict()


def measurement_sources(settings: ProfileSettings) -> dict[str, str]:
    """Which run each number of the run directory came from (run.json `measurements`)."""
    ops_run = ("the recorded run (a pair of CUDA events per operator, read at the end of each step)"
               if settings.device == "cuda" else "the recorded run (perf_counter around each operator)")
    steps_run = ("the unrecorded run (steps timed with synchronize + perf_counter; no per-operator recording)"
                 if settings.two_runs else ops_run + "; one run serves steps and operators")
    if settings.runs > 1:  # rounds: each number the median over them
        rounds = f"; the median over {settings.runs} rounds, every configuration once a round"
        ops_run, steps_run = ops_run + rounds, steps_run + rounds
    return dict(steps=steps_run, generations=steps_run + " (TTFT, TPOT, e2e summed from its steps)",
                errors=steps_run, ops_generation=ops_run,
                steps_measured_recorded_s=ops_run,
                ops_micro="micro-benchmarks (llmperf.measure.timers.time_fn: CUDA events / do_bench on GPU, "
                          "warmed-up median perf_counter on CPU)")


def run_profile(settings: ProfileSettings, hardware: HardwareSpec, out_dir: Path, *,
                progress: Progress | None = None) -> ProfileResult:
    """Measure, predict, join and write the run directory (see the module docstring)."""
    import torch

    previous = torch.get_num_threads()
    if settings.threads is not None and settings.threads >= 1:
        torch.set_num_threads(settings.threads)
    try:
        return _run_profile(settings, hardware, out_dir, progress)
    finally:
        torch.set_num_threads(previous)


def _run_profile(settings: ProfileSettings, hardware: HardwareSpec, out_dir: Path,
                 progress: Progress | None) -> ProfileResult:
    import torch

    from llmperf.engine import Engine, build_model
    from llmperf.measure.device import available_memory_bytes, describe

    settings.validate()
    tick = progress or (lambda msg: None)
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device: cuda requested but torch sees no CUDA device")
    device = torch.device(settings.device)
    spec = resolve_spec(settings)
    prec = Precision.uniform(settings.dtype)
    attention = "naive" if settings.backend == "naive" else "fused"
    check_fits(memory_needed(spec, prec, settings, attention), available_memory_bytes(device), settings.device)
    compute_dtype = hardware.compute_dtype(settings.dtype)
    calibrated = (calibrated_model(hardware, spec, prec, compute_dtype, settings.backend)
                  if hardware.efficiency else None)
    # the engine runs Q, K, V as one GEMM and gate + up as one (llmperf.engine.model): predict that engine
    fm = ForwardModel(model=spec, precision=prec, attention=attention, fused_qkv=True, fused_gate_up=True)
    pred = Predictor(fm=fm, hardware=hardware, compute_dtype=compute_dtype, calibrated=calibrated)

    from llmperf.outputs import OutputDir, check_dir
    out = out_dir if isinstance(out_dir, OutputDir) else check_dir(out_dir, "--output")
    out_dir = Path(out.create())
    dev = describe(device)
    run = new_manifest(settings, spec, hardware, pred, dev)
    run_path = out_dir / "run.json"
    _write_run(run_path, run)
    tables = dict(ops=_Table(out, "ops.csv", OPS_COLUMNS), steps=_Table(out, "steps.csv", STEPS_COLUMNS),
                  generations=_Table(out, "generations.csv", GENERATIONS_COLUMNS))
    if spec.is_moe:  # the experts each MoE layer touched, per step
        tables["experts"] = _Table(out, "experts.csv", EXPERTS_COLUMNS)
        tables["balance"] = _Table(out, "expert_balance.csv", EXPERT_BALANCE_COLUMNS)
    joins: list[dict[str, Any]] = []
    load: dict[int, Any] = {}
    result = ProfileResult(out_dir=out_dir, manifest=run)
    try:
        tick("building the model")
        model = build_model(spec, seed=settings.seed, dtype=settings.dtype, device=device, attention=settings.backend)
        tick("cross-checks")
        checks = [Check(**c) for c in cross_checks(model, spec, prec, settings)]
        run.checks = checks
        _write_run(run_path, run)
        engine = Engine(model, cache=settings.kv, attention=settings.backend)
        llc = _llc_bytes(dev)
        configs = settings.configs()
        probed = weights_to_probe(model) if settings.device == "cpu" else []
        recorded: dict[str, list[Recorded]] = {}
        # rounds: every configuration once per round; a configuration's rows are written after its last
        for i, (rnd, (b, p, g)) in enumerate((rnd, c) for rnd in range(settings.runs) for c in configs):
            config = f"b{b}-p{p}-g{g}"
            if settings.micro and rnd == 0:
                tick(f"micro-benchmarks {config}")
                with torch.inference_mode():
                    for row in micro_benchmarks(model, spec, pred, settings, b, p, g, llc):
                        tables["ops"].append(row)
            if settings.device == "cpu":  # the host's bandwidth now, beside the calibration's (`host`)
                run.host_bandwidth = (run.host_bandwidth or []) + [
                    HostProbe(config=config, round=rnd, read_gb_per_s=round(read_probe(device, tensors=probed), 2))]
            elif device.type == "cuda":  # a host-bound engine's speed now, beside the calibration's (`host`)
                run.host_dispatch = (run.host_dispatch or []) + [
                    DispatchProbe(config=config, round=rnd, dispatch_us=round(dispatch_seconds(device) * 1e6, 3))]
            tick(f"generation {config}" + (f" (run {rnd + 1} of {settings.runs})" if settings.runs > 1 else ""))
            recorded.setdefault(config, []).append(record_generation(engine, spec, settings, b, p, g))
            if rnd < settings.runs - 1:
                continue
            done = summarize(recorded.pop(config), spec, pred, config, b, p, g)
            for row in done.ops:
                tables["ops"].append(row)
            for row in done.steps:
                tables["steps"].append(row)
            tables["generations"].append(done.generation)
            for row in done.experts:
                tables["experts"].append(row)
            for row in done.balance:
                tables["balance"].append(row)
            joins += done.join
            merged = merge_joins(joins)
            run.join = [JoinEntry(**e) for e in merged]
            run.checks = checks + [Check(**join_check(merged))]
            if spec.is_moe:
                run.experts_touched = [ExpertsTouched(**e) for e in experts_summary(tables["experts"].rows)]
                run.expert_balance = [ExpertBalance(**b) for b in balance_summary(tables["balance"].rows)]
                for layer, counts in (done.load or {}).items():
                    load[layer] = load[layer] + counts if layer in load else counts
                _write_load(out_dir / "expert_load.json", load, spec, settings)
            run.errors = _errors(tables)
            run.settings.configs_done = i + 1 - (settings.runs - 1) * len(configs)
            _write_run(run_path, run)
        run.status = "complete"
    except KeyboardInterrupt:
        run.status = "interrupted"
        result.interrupted = True
    finally:
        for t in tables.values():
            t.close()
        run.errors = _errors(tables)
        if run.status == "running":
            run.status = "failed"
        run.settings.notes = run.settings.notes + host_moved_notes(run)
        _write_run(run_path, run)
    result.ops, result.steps, result.generations = (tables["ops"].rows, tables["steps"].rows,
                                                    tables["generations"].rows)
    result.experts = tables["experts"].rows if "experts" in tables else []
    result.balance = tables["balance"].rows if "balance" in tables else []
    return result


def _errors(tables: dict[str, _Table]) -> list[ErrorRow]:
    return [ErrorRow(**e) for e in errors_table(tables["steps"].rows, tables["generations"].rows)]


def new_manifest(settings: ProfileSettings, spec: ModelSpec, hardware: HardwareSpec, pred: Predictor,
                 dev: dict[str, Any]) -> RunManifest:
    """The run.json of a run about to start (status `running`): where, with what, priced how."""
    import torch

    from llmperf.measure.device import git_commit, versions

    calibrated = pred.calibrated
    return RunManifest(
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), model=spec.name,
        hardware=hardware.name, device=dev, versions=versions(), git_commit=git_commit(),
        settings=RunSettings(
            batch=list(settings.batches), prompt_len=list(settings.prompt_lens), gen_len=list(settings.gen_lens),
            dtype=settings.dtype, compute_dtype=pred.compute_dtype, backend=settings.backend, kv=settings.kv,
            layers=spec.num_layers, layers_kept=layers_kept(settings),
            layer_kinds=[kind.label for kind in spec.layer_kinds()], reps=settings.reps, micro=settings.micro,
            seed=settings.seed, device=settings.device,
            threads=torch.get_num_threads() if settings.device == "cpu" else None,
            separate_step_run=settings.two_runs, runs=settings.runs if settings.runs > 1 else None,
            calibration_bandwidth_gb_per_s=calibration_bandwidth(hardware) if settings.device == "cpu" else None,
            calibration_dispatch_us=calibration_dispatch(hardware) if settings.device == "cuda" else None,
            time_models=TimeModels(roofline=ROOFLINE_MODEL.source,
                                   calibrated=calibrated.source if calibrated else None),
            calibrated_overheads=None if calibrated is None else CalibratedOverheads(
                mode=calibrated.overhead_mode, backend=calibrated.backend or None,
                per_operator=sorted(calibrated.op_overhead_s),
                per_operator_and_rows=sorted(calibrated.op_overhead_rows)),
            hardware_source=hardware.source, notes=run_notes(settings, spec, hardware, calibrated),
            model_spec=jsonable(spec.to_dict()),
            hardware_spec=jsonable({k: v for k, v in hardware.to_dict().items() if k not in ("calibration",)})),
        measurements=Measurements(**measurement_sources(settings)), status="running")


def run_notes(settings: ProfileSettings, spec: ModelSpec, hardware: HardwareSpec,
              calibrated: EfficiencyTimeModel | None) -> list[str]:
    """run.json `settings.notes`: what this run does not measure or price as a reader might assume."""
    import torch

    notes = []
    if settings.device == "cpu":
        notes.append("Triton kernels are not timed on CPU (the interpreter says nothing about speed)")
    if spec.quantization is not None:
        notes.append(f"{spec.name} ships {spec.quantization.method}-quantised weights: the engine runs random weights "
                     f"at {settings.dtype} and the predictions price {settings.dtype} weights, not the shipped format")
    spans = [k.window for k in spec.layer_kinds() if k.window is not None]
    if settings.backend == "naive" and spans and max(settings.prompt_lens) + max(settings.gen_lens) > min(spans):
        notes.append(f"naive attention past a sliding window or chunk ({min(spans)} tokens): the engine scores every "
                     "cached key and masks those outside it, the analytical model counts the keys inside it")
    if settings.micro and spec.is_mla:
        notes.append("multi-head latent attention: no attention micro-benchmark (its latent core is timed in the "
                     "generation rows only), nor kv_b_proj, q_absorb, v_absorb (rows or groups set by the context "
                     "and the heads)")
    if settings.micro and all(k.moe for k in spec.layer_kinds()):
        notes.append("every layer is a mixture of experts: the routed experts' GEMMs are not micro-benchmarked "
                     "(per expert, over the rows the routing decides); they are in the generation rows")
    cal_threads = (hardware.calibration or {}).get("threads")
    if settings.device == "cpu" and cal_threads and cal_threads != torch.get_num_threads():
        notes.append(f"calibrated with {cal_threads} threads but profiled with {torch.get_num_threads()}: "
                     "the calibrated ceilings do not describe this run (pass --threads to match)")
    if calibrated is not None and not calibrated.has_op_overheads:
        notes.append(f"the calibration has no per-operator overheads for the {settings.backend} backend: the "
                     "per-kind tiny-operator figures are used (re-run `llmperf calibrate`)")
    if calibrated is not None and calibrated.has_op_overheads and settings.kv == "paged":
        notes.append("the per-operator overheads were measured with a contiguous KV cache: kv_write and "
                     "attention with the paged cache may dispatch more")
    if calibrated is None:
        notes.append(f"hardware {hardware.name!r} has no calibration: predicted_calibrated_s is empty "
                     "(run `llmperf calibrate`, then --hardware local)")
    return notes
