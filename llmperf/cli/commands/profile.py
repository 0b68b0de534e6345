"""`llmperf profile MODEL`: measure a model op by op and step by step, join with the predictions.

Thin: parses options, resolves the hardware (default: the calibrated `local` device, calibrating
first if there is none), runs `llmperf.measure.profile.run_profile` under a progress bar, and renders
the errors per phase (roofline and calibrated side by side), the exact cross-checks and the
per-operator join of the first configuration. The run directory is written as it goes.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from llmperf.cli.clitools import err_console, fail, out_console, parse_int_list


def _hardware(name: str | None, device: str, threads: int | None = None) -> Any:
    """The named spec, or `local` (calibrating this device first when no calibration exists)."""
    from llmperf.specs import load_hardware
    from llmperf.specs.local import local_path

    if name is not None:
        return load_hardware(name)
    if not local_path().is_file():
        from llmperf.cli.commands.calibrate import run_calibration
        from llmperf.measure.calibrate import Settings, write_yaml

        err_console.print(f"no calibration at {local_path()}: calibrating this device first")
        cal = run_calibration(Settings.for_device(device, threads=threads))  # profiled with the same threads
        write_yaml(cal.to_mapping(), local_path())
    return load_hardware("local")


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def _ms(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:.3f}"


def _ratio(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def summary_tables(result: Any) -> list[Any]:
    from rich.table import Table
    from rich.text import Text

    run = result.run
    err = Table(title=f"{run['model']} on {run['hardware']}: |predicted / measured - 1| per phase "
                      "(median / p90; held-out: nothing was fitted on these runs)")
    for col in ("phase", "n", "roofline median", "roofline p90", "calibrated median", "calibrated p90"):
        err.add_column(col, justify="left" if col == "phase" else "right")
    by = {(e["phase"], e["model"]): e for e in run["errors"]}
    for phase in dict.fromkeys(e["phase"] for e in run["errors"]):
        r, c = by.get((phase, "roofline"), {}), by.get((phase, "calibrated"), {})
        err.add_row(phase, str(r.get("n", 0)), _pct(r.get("median_abs_err")), _pct(r.get("p90_abs_err")),
                    _pct(c.get("median_abs_err")), _pct(c.get("p90_abs_err")))
    checks = Table(title="exact cross-checks")
    for col in ("check", "result", "detail"):
        checks.add_column(col)
    for c in run["checks"]:
        checks.add_row(c["name"], Text("pass", style="green") if c["passed"] else Text("FAIL", style="red"), c["detail"])
    tables = [err, checks]
    if run.get("join"):
        join = Table(title="operators joined to their predictions, per phase and layer kind (fused names join "
                           "their parts)")
        for col in ("phase", "layer", "joined", "measured, not predicted", "predicted, not measured"):
            join.add_column(col, justify="right" if col == "joined" else "left")
        for e in run["join"]:
            join.add_row(e["phase"], e["layer"], str(len(e["joined"])),
                         Text(", ".join(e["measured_only"]) or "-", style="red" if e["measured_only"] else ""),
                         Text(", ".join(e["predicted_only"]) or "-", style="red" if e["predicted_only"] else ""))
        tables.append(join)
    if run.get("experts_touched"):
        experts = Table(title="distinct routed experts per MoE layer and step: measured (the router's choices) "
                              "vs the analytical expectation under uniform routing, E (1 - (1 - k/E)^tokens)")
        for col in ("config", "phase", "layer", "tokens", "steps", "measured mean", "min", "max", "expected"):
            experts.add_column(col, justify="left" if col in ("config", "phase") else "right")
        for e in run["experts_touched"]:
            experts.add_row(e["config"], e["phase"], str(e["layer"]), str(e["tokens"]), str(e["steps"]),
                            f"{e['measured_mean']:.2f}", str(e["measured_min"]), str(e["measured_max"]),
                            f"{e['expected_uniform']:.2f}")
        tables.append(experts)
    if run.get("expert_balance"):
        balance = Table(title="expert parallelism on this routing: the busiest of ep GPUs' routed rows and experts "
                              "(means over steps and MoE layers) vs uniform random routing's "
                              "(llmperf.analysis.routing); ratio > 1: the router is more skewed than uniform")
        for col in ("config", "phase", "ep", "tokens", "samples", "mean rows", "busiest rows", "predicted",
                    "ratio", "busiest experts", "predicted", "ratio"):
            balance.add_column(col, justify="left" if col in ("config", "phase") else "right")
        for b in run["expert_balance"]:
            balance.add_row(b["config"], b["phase"], str(b["ep"]), str(b["tokens"]), str(b["samples"]),
                            f"{b['mean_rows']:.1f}", f"{b['busiest_rows']:.1f}", f"{b['predicted_rows']:.1f}",
                            f"{b['rows_ratio']:.2f}", f"{b['busiest_touched']:.2f}", f"{b['predicted_touched']:.2f}",
                            f"{b['touched_ratio']:.2f}")
        tables.append(balance)
    if result.ops:
        first = result.ops[0]
        ops = Table(title=f"operators at batch {first['batch']} (micro: one layer; generation: all layers of the "
                          "kind); times in ms, ratio = predicted / measured")
        for col in ("kind", "phase", "op", "layer", "q", "kv", "measured", "± spread", "roofline", "calibrated",
                    "ratio roof", "ratio cal", "bound"):
            ops.add_column(col, justify="left" if col in ("kind", "phase", "op", "layer", "bound") else "right")
        seen_decode: set[tuple] = set()
        for r in result.ops:
            if r["batch"] != first["batch"]:
                continue
            if r["kind"] == "generation" and r["phase"] == "decode":  # one decode step is enough to show
                key = (r["op"], r.get("layer", ""))
                if key in seen_decode:
                    continue
                seen_decode.add(key)
            ops.add_row(r["kind"], r["phase"], r["op"], r.get("layer", ""), str(r["q_len"]), str(r["kv_len"]), _ms(r["measured_s"]),
                        _ms(r["measured_spread_s"]), _ms(r["predicted_roofline_s"]), _ms(r["predicted_calibrated_s"]),
                        _ratio(r["ratio_roofline"]), "-" if math.isnan(r["ratio_calibrated"]) else
                        f"{r['ratio_calibrated']:.2f}", r["bound"])
        tables.insert(0, ops)
    return tables


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        model: Annotated[str, typer.Argument(help="Built-in model name, or a YAML / HF config.json path (a family the engine builds).")],
        hardware: Annotated[str | None, typer.Option("--hardware", "-H", help="Spec to predict with (default: the calibrated 'local' device; calibrates first if none).")] = None,
        device: Annotated[str, typer.Option("--device", help="auto (cuda when available), cpu or cuda.")] = "auto",
        batch: Annotated[str, typer.Option("--batch", "-b", help="Sequences per generation (a list sweeps).")] = "1",
        prompt_len: Annotated[str, typer.Option("--prompt-len", "-p", help="Prompt tokens (a list sweeps).")] = "64",
        gen_len: Annotated[str, typer.Option("--gen-len", "-g", help="Generated tokens (a list sweeps).")] = "16",
        dtype: Annotated[str, typer.Option("--dtype", help="Weights, activations and KV: fp32, bf16 or fp16.")] = "fp32",
        backend: Annotated[str, typer.Option("--backend", help="Attention: sdpa, naive or triton (CUDA only).")] = "sdpa",
        kv: Annotated[str, typer.Option("--kv", help="KV cache: contiguous or paged.")] = "contiguous",
        layers: Annotated[int | None, typer.Option("--layers", help="Keep only N layers (same shapes) so a big spec fits: the first layer of each kind (sliding/full, dense/MoE), then the earliest others.")] = None,
        reps: Annotated[int, typer.Option("--reps", help="Timed repetitions of each micro-benchmark.")] = 5,
        runs: Annotated[int, typer.Option("--runs", help="Rounds of generations: every configuration once a round, each step and operator the median over the rounds (a shared machine's speed moves over minutes).")] = 1,
        micro: Annotated[bool, typer.Option("--micro/--no-micro", help="Per-operator micro-benchmarks beside the generation loop.")] = True,
        threads: Annotated[int | None, typer.Option("--threads", help="CPU threads (default: torch's); recorded in run.json.")] = None,
        separate_step_run: Annotated[bool | None, typer.Option("--separate-step-run/--one-run", help="Time steps in a run without per-operator recording and take operators from a second, recorded run (default: on CUDA only, where recording slows launch-bound steps).")] = None,
        output: Annotated[str | None, typer.Option("--output", "-o", help="Run directory (default reports/profile/<date>-<device>).")] = None,
    ) -> None:
        """Run per-operator micro-benchmarks and the full generation loop of MODEL on this device, and
        join every measurement with its roofline and calibrated predictions by (phase, operator,
        batch, q_len, kv_len). Writes run.json, ops.csv, steps.csv and generations.csv."""
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from llmperf.cli.commands.calibrate import resolve_device
        from llmperf.errors import SpecError
        from llmperf.measure.calibrate import DTYPE_NAMES
        from llmperf.measure.profile import ProfileSettings, run_profile

        try:
            dev = resolve_device(device)
            if dtype not in DTYPE_NAMES:
                raise SpecError(f"--dtype: must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
            settings = ProfileSettings(
                model=model, hardware=hardware or "local", device=dev, batches=tuple(parse_int_list("--batch", batch)),
                prompt_lens=tuple(parse_int_list("--prompt-len", prompt_len)),
                gen_lens=tuple(parse_int_list("--gen-len", gen_len)), dtype=dtype, backend=backend, kv=kv,
                layers=layers, reps=reps, micro=micro, threads=threads, separate_step_run=separate_step_run,
                runs=runs)
            settings.validate()
            from llmperf.measure.profile import resolve_spec
            resolve_spec(settings)  # unknown names and impossible lengths before anything is measured
            from llmperf.outputs import check_dir
            out_dir = Path(output) if output is not None else (
                Path("reports") / "profile" / f"{dt.date.today().isoformat()}-{dev}")
            out = check_dir(output if output is not None else out_dir, "--output")  # before anything runs
            if not out.missing and (out.path / "run.json").exists():
                raise SpecError(f"--output: {str(out_dir)!r} already holds a run (run.json); choose another folder")
            hw = _hardware(hardware, dev, threads)
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                          console=err_console, transient=True) as bar:
                task = bar.add_task("profiling", total=None)
                result = run_profile(settings, hw, out,
                                     progress=lambda msg: bar.update(task, description=msg))
        except (SpecError, ValueError) as exc:
            raise fail(str(exc)) from None
        for table in summary_tables(result):
            out_console.print(table)
        for note in result.run["settings"].get("notes", []):
            out_console.print(f"note: {note}")
        if result.interrupted:
            err_console.print(f"interrupted: {len(result.steps)} steps and {len(result.ops)} operator rows kept in "
                              f"{out_dir}")
            raise typer.Exit(130)
        extra = ", experts.csv, expert_balance.csv, expert_load.json" if result.experts else ""
        out_console.print(f"wrote {out_dir}/run.json, ops.csv, steps.csv, generations.csv{extra}")
