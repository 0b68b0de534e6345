"""The `llmperf` command line: thin commands that parse, call the library, and render.

Bad input prints one line naming the option and the value to stderr and exits with code 2.
"""

from __future__ import annotations

import signal
import sys
import threading


def _quiet_interrupt(signum: int, frame: object) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)  # Ctrl-C while the modules load: exit 130, no traceback


_MAIN = threading.current_thread() is threading.main_thread()
_SIGINT_BEFORE = signal.getsignal(signal.SIGINT) if _MAIN else None
if _MAIN and _SIGINT_BEFORE is signal.default_int_handler:
    signal.signal(signal.SIGINT, _quiet_interrupt)

import os  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402
from typing import Annotated

import typer
from rich.console import Console

from llmperf.cli.clitools import (
    AttentionImpl,
    OutputFormat,
    check_output,
    fail,
    out_console,
    parse_int_list,
    parse_name_list,
    warn,
    write_output,
)
from llmperf.cli.commands.simulate import EplbOpt, ExpertLoadOpt, expert_load_from_option
from llmperf.defaults import DEFAULT_MAX_BATCHED_TOKENS
from llmperf.errors import SpecError


def _one_line_usage_error(exc) -> None:  # noqa: ANN001
    """typer draws a usage error (an unknown option, an option that is not a number, a format
    that is not a choice) as a box of five lines; llmperf shows every bad input as one line."""
    message = exc.format_message()
    if not message.strip():  # `llmperf` alone: the help was printed, and that is all
        return
    where = f" (see `{exc.ctx.command_path} --help`)" if getattr(exc, "ctx", None) is not None else ""
    fail(f"{message}{where}")


class _RichUtilsOnDemand(types.ModuleType):
    """Stands in for `typer.rich_utils` until typer needs more of it than the renderer of usage errors.

    typer imports that module (`from . import rich_utils`, which finds this attribute of `typer`) only
    to show help or an error, and it costs start-up tens of milliseconds (rich's markdown, syntax and
    traceback modules); importing it here to replace its `rich_format_error` made every command pay
    that. Its usage-error renderer is ours from the start; any other name imports the real module
    (which then replaces this stand-in as `typer.rich_utils`), patched the same way."""

    def __init__(self) -> None:
        super().__init__("typer.rich_utils")
        self.rich_format_error = _one_line_usage_error

    def __getattr__(self, name: str) -> object:
        import importlib

        real = importlib.import_module("typer.rich_utils")
        if hasattr(real, "rich_format_error"):
            real.rich_format_error = _one_line_usage_error
        return getattr(real, name)


if "typer.rich_utils" in sys.modules:  # already loaded (a test, a host program): patch it in place
    if hasattr(sys.modules["typer.rich_utils"], "rich_format_error"):
        sys.modules["typer.rich_utils"].rich_format_error = _one_line_usage_error
else:
    typer.rich_utils = _RichUtilsOnDemand()

app = typer.Typer(
    name="llmperf", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Predict, measure and compare LLM inference performance (roofline model, real kernels).")


def _render_single(est, per_op: bool, console: Console) -> None:  # noqa: ANN001
    from llmperf.cli.render import generation_tables, ops_table
    for table in generation_tables(est):
        console.print(table)
    if per_op:
        console.print(ops_table(est.prefill, f"prefill: batch {est.batch} x {est.prompt_len} tokens",
                                width=console.width))
        console.print(ops_table(est.decode_first, f"decode step 1: batch {est.batch}, context {est.prompt_len + 1}",
                                width=console.width))


def _ops_frame(estimates: list):  # noqa: ANN202
    """Every configuration's per-operator rows (prefill and first decode step), numbered in order."""
    import pandas as pd

    parts = []
    for index, est in enumerate(estimates):
        ops = est.ops_frame()
        ops.insert(0, "configuration", index)
        parts.append(ops)
    return pd.concat(parts, ignore_index=True)


def _warn_unfit(rows: list[dict]) -> None:
    """A configuration that does not fit is an answer (exit 0), flagged in the output and here. `rows`:
    the result rows (a frame's records, or the estimates' summaries: the same fields)."""
    bad = [r for r in rows if not bool(r["fits"])]
    if not bad:
        return
    if len(rows) == 1:
        r = bad[0]
        max_batch = "<NA>" if r["max_batch"] is None else r["max_batch"]  # as the frame shows a missing one
        warn(f"does not fit: {r['model']} on {r['hardware']}, batch {r['batch']} x {r['prompt_len'] + r['gen_len']} "
             f"tokens needs {r['total_gib']:.1f} GiB per GPU of {r['usable_gib']:.1f} GiB usable "
             f"(max batch {max_batch})")
    else:
        warn(f"{len(bad)} of {len(rows)} configurations do not fit in memory (fits = false)")


@app.command()
def estimate(
    model: Annotated[str, typer.Argument(help="Built-in model name(s), comma-separated, or a YAML / HF config.json path. See `llmperf models`.")] = "llama-3.1-8b",
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="Built-in device name(s), comma-separated, or a YAML path. See `llmperf hardware`.")] = "a100-80gb-sxm",
    batch: Annotated[str, typer.Option("--batch", "-b", help="Sequences decoded together (a list sweeps: 1,8,64,512).")] = "1",
    prompt_len: Annotated[str, typer.Option("--prompt-len", "-p", help="Prompt length in tokens (a list sweeps).")] = "512",
    gen_len: Annotated[str, typer.Option("--gen-len", "-g", help="Generated tokens per sequence (a list sweeps).")] = "128",
    dtype: Annotated[str | None, typer.Option("--dtype", help="Precision preset(s) for weights, activations and KV (fp32, fp16, bf16, fp8, int8, int4; a list sweeps). Default: the model's native dtype, or a quantised checkpoint's.")] = None,
    weights: Annotated[str | None, typer.Option("--weights", help="Weight precision(s), overriding --dtype (int4 = 0.5 byte plus group scales).")] = None,
    activations: Annotated[str | None, typer.Option("--activations", help="Activation precision(s); matrix work runs at it unless the device lacks it.")] = None,
    kv: Annotated[str | None, typer.Option("--kv", help="KV cache precision(s).")] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", help="int4/int8 weights: input elements per 16-bit scale (default 128 for int4, per channel for int8; -1: per channel).")] = None,
    embeddings: Annotated[str | None, typer.Option("--embeddings", help="Precision of the embedding and lm_head (default: the weights', or 16-bit when weights are quantised, as AWQ/GPTQ).")] = None,
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel degree(s) (GPUs splitting each layer; a list sweeps).")] = "1",
    pp: Annotated[str, typer.Option("--pp", help="Pipeline-parallel degree(s) (GPUs splitting the layers; a list sweeps).")] = "1",
    attention: Annotated[AttentionImpl, typer.Option("--attention", help="fused: FlashAttention-style, S and P stay on chip; naive: S and P written to memory.")] = AttentionImpl.fused,
    attention_flops: Annotated[str, typer.Option("--attention-flops", help="executed: FLOPs the kernel runs (a fused causal kernel skips masked tiles); dense: the whole square (torch.utils.flop_counter).")] = "executed",
    all_logits: Annotated[bool, typer.Option("--all-logits", help="Prefill computes logits at every position (default: the last only, as servers do).")] = False,
    fused_qkv: Annotated[bool, typer.Option("--fused-qkv/--split-qkv", help="Q, K and V as one GEMM reading the input once (vLLM, TensorRT-LLM), or three.")] = True,
    fused_gate_up: Annotated[bool, typer.Option("--fused-gate-up/--split-gate-up", help="Gate and up projections as one GEMM, or two.")] = True,
    mla_mode: Annotated[str, typer.Option("--mla-mode", help="Multi-head latent attention (DeepSeek): auto (unabsorbed prefill, absorbed decode, as vLLM and SGLang), absorbed or unabsorbed.")] = "auto",
    ep: Annotated[int, typer.Option("--ep", help="Expert parallelism within the tp group: each GPU holds num_experts / ep routed experts (ep divides tp and the experts).")] = 1,
    dp_attention: Annotated[bool, typer.Option("--dp-attention", help="Attention data-parallel over the tp group (each GPU its own sequences, heads whole; MoE layers expert-parallel, ep = tp).")] = False,
    expert_load: ExpertLoadOpt = None,
    eplb: EplbOpt = None,
    kv_window: Annotated[str, typer.Option("--kv-window", help="Sliding and chunked layers' KV: capped (each holds its window, vLLM's hybrid allocator) or full (pages for the whole context, as engines without it).")] = "capped",
    streaming: Annotated[str | None, typer.Option("--streaming", help="StreamingLLM KV eviction, SINKS:WINDOW (e.g. 4:2044): every layer keeps the first SINKS tokens and the last WINDOW (priced as a sliding window of SINKS + WINDOW: the same keys per query, bytes and KV).")] = None,
    max_seq_len: Annotated[int | None, typer.Option("--max-seq-len", help="Tokens a contiguous KV cache reserves per sequence (default: the model's max positions).")] = None,
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per block of a paged KV cache.")] = 16,
    mem_util: Annotated[float, typer.Option("--mem-util", help="Fraction of device memory usable (as vLLM's gpu_memory_utilization).")] = 0.9,
    max_batched_tokens: Annotated[int, typer.Option("--max-batched-tokens", help="Per-step token budget: activation memory (GiB) is reserved once for a forward of this many tokens (vLLM's max_num_batched_tokens).")] = DEFAULT_MAX_BATCHED_TOKENS,
    efficiency: Annotated[str | None, typer.Option("--efficiency", help="Time model: roofline (e = 1, no overhead: the bound), typical (published fractions of the roofs, GPUs), calibrated (what `llmperf calibrate` measured; --hardware local). Default: the expected time, typical on a GPU, calibrated for --hardware local; the roofline bound is shown beside it.")] = None,
    engine: Annotated[str | None, typer.Option("--engine", help="Serving stack's profile for a GPU's step overhead and kernel launches (models_spec/engines): compiled (CUDA graphs: vLLM, SGLang, TensorRT-LLM; the default) or eager (PyTorch eager, llmperf's own engine). Not for a CPU; the roofline takes none.")] = None,
    per_op: Annotated[bool, typer.Option("--per-op", help="Also show every operator of the prefill and of the first decode step (of every configuration).")] = False,
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="table (rich), json or csv (the same columns; see docs/schemas.md).")] = OutputFormat.table,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout.")] = None,
) -> None:
    """Predict TTFT, time per output token, throughput, memory and the bound (memory or compute)
    of generating GEN_LEN tokens after a PROMPT_LEN prompt for BATCH sequences.

    Units: times in seconds, FLOPs as multiply + add = 2, bytes decimal (GB = 1e9), capacities GiB.
    A configuration that does not fit in memory is flagged (fits = false) and warned about.
    """
    # Only a sweep's table, or JSON / CSV, makes a data frame: one configuration's table needs no pandas.
    try:
        out = check_output(output)  # before anything is computed
        models = parse_name_list("model", model)
        if streaming is not None:
            from llmperf.specs import load_model
            from llmperf.specs.streaming import parse_streaming
            from llmperf.specs.streaming import streaming as streaming_spec
            sinks, window = parse_streaming("--streaming", streaming)
            models = [streaming_spec(load_model(m), sinks, window) for m in models]
        devices = parse_name_list("--hardware", hardware)
        lists = dict(batch=parse_int_list("--batch", batch), prompt_len=parse_int_list("--prompt-len", prompt_len),
                     gen_len=parse_int_list("--gen-len", gen_len), tp=parse_int_list("--tp", tp),
                     pp=parse_int_list("--pp", pp))
        precisions = {name: (parse_name_list(opt, value) if value is not None else None) for name, opt, value in
                      (("precision", "--dtype", dtype), ("weights", "--weights", weights),
                       ("activations", "--activations", activations), ("kv", "--kv", kv))}
        for name, value in (("--max-seq-len", max_seq_len), ("--block-size", block_size),
                            ("--max-batched-tokens", max_batched_tokens)):
            if value is not None and value < 1:
                raise SpecError(f"{name}: must be a positive integer, got {value}")
        if not 0 < mem_util <= 1:
            raise SpecError(f"--mem-util: must be in (0, 1], got {mem_util}")
        if kv_window not in ("capped", "full"):
            raise SpecError(f"--kv-window: must be capped or full, got {kv_window!r}")
        if attention_flops not in ("executed", "dense"):
            raise SpecError(f"--attention-flops: must be executed or dense, got {attention_flops!r}")
        from llmperf.analysis.timemodel import TIME_MODELS, default_efficiency, load_engine, time_model_for
        if efficiency is not None and efficiency not in TIME_MODELS:
            raise SpecError(f"--efficiency: must be one of {', '.join(TIME_MODELS)}, got {efficiency!r}")
        if engine is not None:
            load_engine(engine)
        conventions = dict(time_model=lambda hw, dtype: time_model_for(hw, efficiency or default_efficiency(hw), dtype,
                                                                       engine=engine),
                           attention=attention.value, attention_flops=attention_flops, all_logits=all_logits,
                           fused_qkv=fused_qkv, fused_gate_up=fused_gate_up, max_seq_len=max_seq_len,
                           block_size=block_size, mem_util=mem_util, max_batched_tokens=max_batched_tokens,
                           group_size=group_size, embeddings=embeddings, mla_mode=mla_mode, ep=ep,
                           dp_attention=dp_attention, kv_window=kv_window, eplb=eplb,
                           expert_load=expert_load_from_option(expert_load))
        table = output_format is OutputFormat.table
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from llmperf.analysis.sweep import estimates_frame, sweep, sweep_estimates
            from llmperf.analysis.timemodel import sweep_jobs  # one time model per part (--efficiency)
            jobs = sweep_jobs(efficiency, models, devices, dict(lists, **precisions, **conventions), engine=engine)
            estimates, ops, frame = [], None, None
            single = all(len(v) == 1 for v in (models, devices, *lists.values())) and all(
                v is None or len(v) == 1 for v in precisions.values())
            if not (per_op or (single and table)):
                import pandas as pd
                frame = pd.concat([sweep(ms, ds, **opts) for ms, ds, opts in jobs], ignore_index=True)
            if frame is None or (len(frame) == 1 and table):
                # each configuration rolled up once: its row is its estimate's summary (the sweep's row)
                estimates = [e for ms, ds, opts in jobs for e in sweep_estimates(ms, ds, **opts)]
                ops = None if table else _ops_frame(estimates)
                frame = None if table and len(estimates) == 1 else estimates_frame(estimates)
            rows = [e.summary() for e in estimates] if frame is None else frame.to_dict("records")
        for w in dict.fromkeys(str(w.message) for w in caught):
            warn(w)
        _warn_unfit(rows)

        if output_format is OutputFormat.json:
            from llmperf.analysis import schema
            text = schema.to_json(frame, ops)
        elif output_format is OutputFormat.csv:
            from llmperf.analysis import schema
            text = schema.to_csv(ops if ops is not None else frame)
        else:
            text = _render_tables(frame, estimates, per_op, to_file=out is not None)
            if out is None:
                return
        write_output(text, out)
    except (SpecError, ValueError) as exc:
        raise fail(str(exc)) from None


def _render_tables(frame, estimates: list, per_op: bool, to_file: bool) -> str:  # noqa: ANN001
    """Print the tables (width: the terminal's, COLUMNS, or 80 when piped), or return their text. `frame`:
    the rows of a sweep (None for one configuration, drawn from its estimate)."""
    from llmperf.cli.render import ops_table, sweep_tables
    sink = open(os.devnull, "w") if to_file else None  # noqa: SIM115
    console = Console(file=sink, record=to_file, highlight=False, markup=False)
    try:
        if frame is None or len(frame) == 1:
            _render_single(estimates[0], per_op, console)
        else:
            for table in sweep_tables(frame, width=console.width):
                console.print(table)
            for index, est in enumerate(estimates):
                console.print(ops_table(est.prefill, f"[{index}] prefill: batch {est.batch} x {est.prompt_len}",
                                        width=console.width))
                console.print(ops_table(est.decode_first,
                                        f"[{index}] decode step 1: batch {est.batch}, context {est.prompt_len + 1}",
                                        width=console.width))
        return console.export_text() if to_file else ""
    finally:
        if sink is not None:
            sink.close()


def _version_callback(value: bool) -> None:
    if value:
        from llmperf import __version__
        out_console.print(f"llmperf {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Predict, measure and compare LLM inference performance (roofline model, real kernels)."""


FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="table (rich), json or csv.")]
OutputOption = Annotated[str | None, typer.Option("--output", "-o",
                                                    help="Write to this file (atomically) instead of stdout.")]


def _write_listing(rows: list[dict], table, output_format: OutputFormat, output: str | None) -> None:  # noqa: ANN001
    """A listing: the rich table (`table()`, built only when shown), or JSON / CSV of the exact rows."""
    try:
        output = check_output(output)
        if output_format is OutputFormat.table:
            from llmperf.cli.listing import table_text
            if output is None:
                out_console.print(table())
                return
            text = table_text(table())
        elif output_format is OutputFormat.json:
            import json
            text = json.dumps(rows, indent=2, allow_nan=False)
        else:
            import pandas as pd
            text = pd.DataFrame(rows).to_csv(index=False)
        write_output(text, output)
    except SpecError as exc:
        raise fail(str(exc)) from None


@app.command("models")
def models_cmd(output_format: FormatOption = OutputFormat.table, output: OutputOption = None) -> None:
    """List the built-in models: parameters, shape, context, KV bytes per token at fp16
    (exact counts and every field with --format json or csv)."""
    from llmperf.cli.listing import models_table
    from llmperf.specs.catalog import model_rows
    rows = model_rows()
    _write_listing(rows, lambda: models_table(rows), output_format, output)


@app.command("hardware")
def hardware_cmd(output_format: FormatOption = OutputFormat.table, output: OutputOption = None) -> None:
    """List the built-in devices: dense peaks (TFLOP/s), memory bandwidth (GB/s), capacity (GiB),
    ridge point (FLOP/B) and GPU-to-GPU link (GB/s each way)."""
    from llmperf.cli.listing import hardware_table
    from llmperf.specs.catalog import hardware_rows
    rows = hardware_rows()
    _write_listing(rows, lambda: hardware_table(rows), output_format, output)


# Commands defined in their own modules (llmperf/cli/commands/<name>.py), one registration line each.
from llmperf.cli.commands import bench as _bench  # noqa: E402
from llmperf.cli.commands import calibrate as _calibrate
from llmperf.cli.commands import plan as _plan  # noqa: E402
from llmperf.cli.commands import profile as _profile
from llmperf.cli.commands import report as _report
from llmperf.cli.commands import simulate as _simulate
from llmperf.cli.commands import speculate as _speculate

for _command in (_calibrate, _profile, _simulate, _report, _plan, _speculate, _bench):
    _command.register(app)

if _MAIN and signal.getsignal(signal.SIGINT) is _quiet_interrupt:  # loaded: Ctrl-C is KeyboardInterrupt again
    signal.signal(signal.SIGINT, _SIGINT_BEFORE)


def main() -> None:
    """The `llmperf` entry point: Ctrl-C exits 130 without a traceback, and SIGTERM (timeout, kill, CI)
    runs the same cleanups as Ctrl-C (no temporary file is left), exiting 143."""
    from llmperf.outputs import install_signal_cleanup
    if _MAIN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    install_signal_cleanup()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
