"""`llmperf bench NAME [ARGS...]`: the project's benchmarks under one command. Each prints figures
measured side by side in one run (ratios, spreads) and asserts nothing; `llmperf bench` lists them,
`llmperf bench NAME --help` gives a benchmark's own options. The modules stay runnable as
`python -m <module>` too."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from llmperf.cli.clitools import fail, out_console

#: name -> (module with `main(argv)`, what it measures, what it needs)
BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "engine": ("llmperf.measure.engine_bench",
               "the engine's decode and prefill steps against their memory and compute limits", "torch"),
    "kernels": ("llmperf.measure.kernel_bench",
                "the Triton attention kernels against SDPA, naive attention and the roofline", "torch, a CUDA GPU "
                "(--dry-run lists the shapes without one)"),
    "compile": ("llmperf.engine.cpu.bench_compile",
                "a CPU decode step: llmperf's CPU ops, plain torch ops, torch.compile", "torch"),
    "speculative": ("llmperf.measure.speculative",
                    "speculative decoding on the engine beside plain decoding, and the model at the measured "
                    "acceptance", "torch"),
    "streaming": ("llmperf.measure.streaming",
                  "StreamingLLM's eviction on the engine beside plain decoding, each step priced", "torch"),
    "tensor-parallel": ("llmperf.measure.tensor_parallel",
                        "tensor parallelism on the engine (ranks in processes: gloo on a CPU, NCCL on GPUs) beside one "
                        "rank, each step priced at its tp", "torch"),
    "startup": ("llmperf.measure.startup", "`llmperf estimate`'s start-up against the bare import of its libraries",
                "-"),
    "simulator": ("llmperf.serving.bench", "the serving simulator's speed (requests simulated per second)", "-"),
    "report": ("llmperf.report.bench", "building and writing a report over a 10,000-configuration sweep", "-"),
    "todays": ("llmperf.cli.commands.bench_todays", "the analytical side's speed on today's models", "-"),
}


def bench(ctx: typer.Context,
          name: Annotated[str | None, typer.Argument(help="the benchmark; none lists them", show_default=False)]
          = None) -> None:
    """Run one of llmperf's benchmarks (`llmperf bench` lists them; `llmperf bench NAME --help`)."""
    if name is None:
        from rich.table import Table

        table = Table(title="llmperf bench NAME [ARGS...]")
        for col in ("name", "measures", "needs", "module"):
            table.add_column(col)
        for key, (module, what, needs) in BENCHMARKS.items():
            table.add_row(key, what, needs, module)
        out_console.print(table)
        return
    if name not in BENCHMARKS:
        raise fail(f"bench: no benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    module = importlib.import_module(BENCHMARKS[name][0])
    argv0, sys.argv[0] = sys.argv[0], f"llmperf bench {name}"  # argparse's usage line names the command
    try:
        rc = module.main(list(ctx.args))
    finally:
        sys.argv[0] = argv0
    if isinstance(rc, int) and rc:
        raise typer.Exit(rc)


def register(app: typer.Typer) -> None:
    app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                           "help_option_names": []})(bench)
