"""Speed of the analytical side on today's models: `llmperf bench todays [--repeats 5] [--only estimate|sweep]`
(or `python -m llmperf.cli.commands.bench_todays`).

The targets: `estimate --per-op` of DeepSeek-V3 answers as fast as Llama's, and a 10,000-configuration
sweep of MoE/MLA models stays within 2x of a dense one. Two measurements, every model timed in the
same run, interleaved (round-robin over the models in each repeat, so a load spike on a shared
machine falls on all of them alike):

- `estimate`: `llmperf estimate MODEL --per-op` end to end in-process (typer's CliRunner: parse,
  roll-up, per-operator detail, rich tables), default settings (a100-80gb-sxm, batch 1, prompt 512,
  gen 128);
- `sweep`: `llmperf.analysis.sweep` of 10 batches x 10 prompt lengths x 10 generation lengths x 10
  devices = 10,000 configurations (100 groups of 100 rows: every group runs the roll-up, its
  closed-form decode and its regime searches once).

Prints median, min and max wall seconds over the repeats and each model's ratio to the dense
baseline (first model). A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmperf.measure.startup import Timing as RunTimes

ESTIMATE_MODELS = ("llama-3.1-8b", "deepseek-v3", "gpt-oss-120b", "llama-4-maverick")
SWEEP_MODELS = ("llama-3.1-70b", "deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b")
SWEEP_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SWEEP_PROMPTS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SWEEP_GENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SWEEP_DEVICES = ("a10", "a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm", "b200", "h100-pcie", "h100-sxm",
                 "h200", "l40s", "mi300x")


@dataclass(frozen=True, kw_only=True)
class Timing(RunTimes):
    """Wall seconds of one model's runs (in the order they ran), and how many configurations a run covers."""

    model: str
    configurations: int


def _interleaved(what: str, models: Sequence[str], run: Callable[[str], int], repeats: int) -> list[Timing]:
    """Time `run(model)` (it returns the configurations it covered) `repeats` times per model,
    round-robin over the models; one untimed warm-up run each first (imports, spec loading, caches)."""
    configs = {m: run(m) for m in models}
    times: dict[str, list[float]] = {m: [] for m in models}
    for _ in range(repeats):
        for m in models:
            t = time.perf_counter()
            run(m)
            times[m].append(time.perf_counter() - t)
    return [Timing(what=what, model=m, configurations=configs[m], seconds=tuple(times[m])) for m in models]


def estimate_cli_run(model: str, args: Sequence[str] = ()) -> int:
    """`llmperf estimate MODEL --per-op ARGS` in-process; raises if it does not exit 0."""
    from typer.testing import CliRunner

    from llmperf.cli import app
    result = CliRunner().invoke(app, ["estimate", model, "--per-op", *args], env={"COLUMNS": "120"})
    if result.exit_code != 0:
        raise RuntimeError(f"estimate {model} exited {result.exit_code}: {result.output[-500:]}")
    return 1


def sweep_run(model: str, batches: Sequence[int] = SWEEP_BATCHES, prompts: Sequence[int] = SWEEP_PROMPTS,
              gens: Sequence[int] = SWEEP_GENS, devices: Sequence[str] = SWEEP_DEVICES):  # noqa: ANN201
    """The benchmark's sweep of `model` (a DataFrame, one row per configuration)."""
    import warnings

    from llmperf.analysis.sweep import sweep
    with warnings.catch_warnings():  # long contexts above a model's positions are warned about, not refused
        warnings.simplefilter("ignore")
        return sweep(model, list(devices), batch=list(batches), prompt_len=list(prompts), gen_len=list(gens))


def bench(*, repeats: int = 5, estimate_models: Sequence[str] = ESTIMATE_MODELS,
          sweep_models: Sequence[str] = SWEEP_MODELS, batches: Sequence[int] = SWEEP_BATCHES,
          prompts: Sequence[int] = SWEEP_PROMPTS, gens: Sequence[int] = SWEEP_GENS,
          devices: Sequence[str] = SWEEP_DEVICES) -> list[Timing]:
    """Both measurements (smaller lists make a quick run); `Timing`s in model order, estimate first."""
    out = _interleaved("estimate --per-op", estimate_models, estimate_cli_run, repeats) if estimate_models else []
    if sweep_models:
        out += _interleaved("sweep", sweep_models,
                            lambda m: len(sweep_run(m, batches, prompts, gens, devices)), repeats)
    return out


def report(timings: Sequence[Timing]) -> str:
    """The figures as text: per measurement, each model's median (min .. max) and ratio to the first."""
    lines = []
    for what in dict.fromkeys(t.what for t in timings):
        rows = [t for t in timings if t.what == what]
        base = rows[0].median_s
        lines.append(f"{what} ({rows[0].configurations:,} configuration(s) per run, {len(rows[0].seconds)} repeats):")
        for t in rows:
            lines.append(f"  {t.model:<18} median {t.median_s * 1e3:9.1f} ms  (min {t.min_s * 1e3:.1f}, "
                         f"max {t.max_s * 1e3:.1f})  x{t.median_s / base:.2f} of {rows[0].model}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("estimate", "sweep"), default=None)
    args = ap.parse_args(argv)
    timings = bench(repeats=args.repeats, estimate_models=() if args.only == "sweep" else ESTIMATE_MODELS,
                    sweep_models=() if args.only == "estimate" else SWEEP_MODELS)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: wall time moves with it)")
    print(report(timings))


if __name__ == "__main__":
    main()
