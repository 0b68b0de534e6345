"""`llmperf report`: pictures of an estimate (run on the spot), of `profile` and `simulate` run
directories, or of several of these, in one self-contained HTML file with the PNGs beside it.

Thin: parse the options, call `llmperf.report.build_report`, write atomically. The figures and what
they read are described in `llmperf/report`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer

from llmperf.cli.clitools import AttentionImpl, fail, out_console, parse_int_list, parse_name_list, warn
from llmperf.cli.commands.simulate import EplbOpt, ExpertLoadOpt, expert_load_from_option
from llmperf.errors import SpecError


def report(
    runs: Annotated[list[Path] | None, typer.Argument(help="Run directories written by `llmperf profile` or `llmperf simulate` (any number).", show_default=False)] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Estimate this model on the spot (built-in name(s), comma-separated, or a YAML / HF config path; the first is drawn operator by operator). Default: llama-3.1-8b when no run directory is given, else no estimate.")] = None,
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="Device name(s) or YAML path(s) for the estimate, comma-separated.")] = "a100-80gb-sxm",
    batch: Annotated[str, typer.Option("--batch", "-b", help="Sequences decoded together; a list sweeps (1,8,64). The first value is drawn operator by operator.")] = "1",
    prompt_len: Annotated[str, typer.Option("--prompt-len", "-p", help="Prompt length(s) in tokens; a list sweeps.")] = "512",
    gen_len: Annotated[str, typer.Option("--gen-len", "-g", help="Generated tokens per sequence; a list sweeps.")] = "128",
    dtype: Annotated[str | None, typer.Option("--dtype", help="Precision preset (fp32, fp16, bf16, fp8, int8, int4). Default: the model's native dtype.")] = None,
    weights: Annotated[str | None, typer.Option("--weights", help="Weight precision, overriding --dtype.")] = None,
    activations: Annotated[str | None, typer.Option("--activations", help="Activation precision, overriding --dtype.")] = None,
    kv: Annotated[str | None, typer.Option("--kv", help="KV cache precision, overriding --dtype.")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel degree within the tp group (MoE models; divides tp and the experts).")] = 1,
    dp_attention: Annotated[bool, typer.Option("--dp-attention", help="Attention data-parallel over the tp group, experts expert-parallel (how MLA models are served; needs --ep equal to --tp).")] = False,
    expert_load: ExpertLoadOpt = None,
    eplb: EplbOpt = None,
    mla_mode: Annotated[str, typer.Option("--mla-mode", help="MLA models: auto (unabsorbed prefill, absorbed decode, as vLLM and SGLang), absorbed or unabsorbed.")] = "auto",
    kv_window: Annotated[str, typer.Option("--kv-window", help="Sliding / chunked layers: capped (hold their window, vLLM's hybrid KV manager) or full (full pages).")] = "capped",
    attention: Annotated[AttentionImpl, typer.Option("--attention", help="fused or naive attention for the estimate (figure 6 always shows both).")] = AttentionImpl.fused,
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per block of a paged KV cache.")] = 16,
    mem_util: Annotated[float, typer.Option("--mem-util", help="Fraction of device memory usable (as vLLM's gpu_memory_utilization).")] = 0.9,
    compare: Annotated[str, typer.Option("--compare", help="Devices drawn side by side (figure 8), comma-separated names or YAML paths (`local`: this machine as `llmperf calibrate` measured it).")] = "a100-80gb-sxm,h100-sxm,h200",
    efficiency: Annotated[str | None, typer.Option("--efficiency", help="Time model of the estimate: roofline (the bound), typical, calibrated. Default: the expected time (typical on a GPU, calibrated for --hardware local).")] = None,
    engine: Annotated[str | None, typer.Option("--engine", help="GPU serving stack's profile (models_spec/engines): compiled (the default) or eager. Not for a CPU.")] = None,
    title: Annotated[str, typer.Option("--title", help="The report's title.")] = "llmperf report",
    output: Annotated[str, typer.Option("--output", "-o", help="The HTML file to write (atomically); PNGs and CSVs go to <name>_files/ beside it (a folder holding other files is refused, never emptied).")] = "report.html",
) -> None:
    """Draw a report: roofline, time breakdown, batch and context sweeps, memory, naive vs fused
    attention, several devices (from an estimate); measured vs predicted (from a profile run); TTFT/TPOT
    distributions, latency against rate and the scheduler over time (from a simulate run).

    Units: seconds, FLOP/s, bytes decimal (GB = 1e9 B), capacities GiB.
    """
    from llmperf.report import EstimateSpec, build_report, files_folder
    from llmperf.report.html import check_destination

    try:
        check_destination(output)  # before anything is rendered: a bad -o costs nothing
        run_dirs = list(runs or [])
        for path in run_dirs:
            if not path.is_dir():
                raise SpecError(f"RUNS: {str(path)!r} is not a directory")
        spec = None
        if model is not None or not run_dirs:
            if block_size < 1:
                raise SpecError(f"--block-size: must be a positive integer, got {block_size}")
            for name, value in (("--tp", tp), ("--pp", pp)):
                if value < 1:
                    raise SpecError(f"{name}: must be a positive integer, got {value}")
            spec = EstimateSpec(
                models=parse_name_list("--model", model or "llama-3.1-8b"),
                hardware=parse_name_list("--hardware", hardware), batch=parse_int_list("--batch", batch),
                prompt_len=parse_int_list("--prompt-len", prompt_len), gen_len=parse_int_list("--gen-len", gen_len),
                precision=dtype, weights=weights, activations=activations, kv=kv, tp=tp, pp=pp, ep=ep,
                dp_attention=dp_attention, expert_load=expert_load_from_option(expert_load), eplb=eplb,
                mla_mode=mla_mode, kv_window=kv_window,
                attention=attention.value, block_size=block_size, mem_util=mem_util,
                compare=parse_name_list("--compare", compare), efficiency=efficiency, engine=engine)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = build_report(estimate=spec, runs=run_dirs, title=title)
        for w in caught:
            if issubclass(w.category, UserWarning):
                warn(str(w.message))
        path = result.write(output)
    except (SpecError, ValueError) as exc:
        raise fail(str(exc)) from None
    out_console.print(f"wrote {path} ({len(result.figures)} figures, rendered in {result.rendered.seconds:.1f} s) "
                      f"and {files_folder(path)}/", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
