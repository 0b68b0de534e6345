"""The `llmperf` command line: thin commands that parse, call the library, and render.

Bad input prints one line naming the option and the value to stderr and exits with code 2.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from llmperf.clitools import (
    AttentionImpl, OutputFormat, err_console, fail, out_console, parse_int_list, parse_name_list, write_output,
)
from llmperf.errors import SpecError

app = typer.Typer(
    name="llmperf", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Predict, measure and compare LLM inference performance (roofline model, real kernels).")


def _render_single(est, per_op: bool) -> None:  # noqa: ANN001
    from llmperf.render import generation_tables, ops_table
    for table in generation_tables(est):
        out_console.print(table)
    if per_op:
        out_console.print(ops_table(est.prefill, f"prefill: batch {est.batch} x {est.prompt_len} tokens"))
        out_console.print(ops_table(est.decode_first,
                                    f"decode step 1: batch {est.batch}, context {est.prompt_len + 1}"))


@app.command()
def estimate(
    model: Annotated[str, typer.Argument(help="Built-in model name(s), comma-separated, or a YAML / HF config.json path. See `llmperf models`.")] = "llama-3.1-8b",
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="Built-in device name(s), comma-separated, or a YAML path. See `llmperf hardware`.")] = "a100-80gb-sxm",
    batch: Annotated[str, typer.Option("--batch", "-b", help="Sequences decoded together (a list sweeps: 1,8,64,512).")] = "1",
    prompt_len: Annotated[str, typer.Option("--prompt-len", "-p", help="Prompt length in tokens (a list sweeps).")] = "512",
    gen_len: Annotated[str, typer.Option("--gen-len", "-g", help="Generated tokens per sequence (a list sweeps).")] = "128",
    dtype: Annotated[str | None, typer.Option("--dtype", help="Precision preset for weights, activations and KV (fp32, fp16, bf16, fp8, int8, int4). Default: the model's native dtype.")] = None,
    weights: Annotated[str | None, typer.Option("--weights", help="Weight precision, overriding --dtype (int4 = 0.5 byte).")] = None,
    activations: Annotated[str | None, typer.Option("--activations", help="Activation precision; matrix work runs at it unless the device lacks it.")] = None,
    kv: Annotated[str | None, typer.Option("--kv", help="KV cache precision.")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree (GPUs splitting each layer).")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree (GPUs splitting the layers).")] = 1,
    attention: Annotated[AttentionImpl, typer.Option("--attention", help="fused: FlashAttention-style, S and P stay on chip; naive: S and P written to memory.")] = AttentionImpl.fused,
    max_seq_len: Annotated[int | None, typer.Option("--max-seq-len", help="Tokens a contiguous KV cache reserves per sequence (default: the model's max positions).")] = None,
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per block of a paged KV cache.")] = 16,
    mem_util: Annotated[float, typer.Option("--mem-util", help="Fraction of device memory usable (as vLLM's gpu_memory_utilization).")] = 0.9,
    per_op: Annotated[bool, typer.Option("--per-op", help="Also show every operator of the prefill and of the first decode step.")] = False,
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="table (rich), json or csv.")] = OutputFormat.table,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout.")] = None,
) -> None:
    """Predict TTFT, time per output token, throughput, memory and the bound (memory or compute)
    of generating GEN_LEN tokens after a PROMPT_LEN prompt for BATCH sequences.

    Units: times in seconds, FLOPs as multiply + add = 2, bytes decimal (GB = 1e9), capacities GiB.
    """
    import llmperf.analysis as analysis

    try:
        models = parse_name_list("model", model)
        devices = parse_name_list("--hardware", hardware)
        batches = parse_int_list("--batch", batch)
        prompts = parse_int_list("--prompt-len", prompt_len)
        gens = parse_int_list("--gen-len", gen_len)
        if max_seq_len is not None and max_seq_len < 1:
            raise SpecError(f"--max-seq-len: must be a positive integer, got {max_seq_len}")
        if block_size < 1:
            raise SpecError(f"--block-size: must be a positive integer, got {block_size}")
        common = dict(precision=dtype, weights=weights, activations=activations, kv=kv, tp=tp, pp=pp,
                      attention=attention.value, block_size=block_size, mem_util=mem_util)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if max(len(models), len(devices), len(batches), len(prompts), len(gens)) > 1:
                result = analysis.sweep(models, devices, batch=batches, prompt_len=prompts, gen_len=gens,
                                        **common)
                single = None
            else:
                single = analysis.estimate(models[0], devices[0], batch=batches[0], prompt_len=prompts[0],
                                           gen_len=gens[0], max_seq_len=max_seq_len, **common)
                from llmperf.analysis.generation import check_lengths
                for w in check_lengths(single.model, single.batch, single.prompt_len, single.gen_len):
                    warnings.warn(w, stacklevel=1)
        for w in caught:
            err_console.print(f"[yellow]warning:[/] {w.message}", markup=True)

        if single is None:
            if output_format is OutputFormat.table and output is None:
                from llmperf.render import sweep_table
                out_console.print(sweep_table(result))
            else:
                text = (result.to_json(orient="records", indent=2) if output_format is OutputFormat.json
                        else result.to_csv(index=False))
                write_output(text, output)
            return
        if output_format is OutputFormat.table and output is None:
            _render_single(single, per_op)
            return
        if output_format is OutputFormat.csv:
            text = (single.ops_frame() if per_op else single.to_frame()).to_csv(index=False)
        elif output_format is OutputFormat.json:
            doc: dict[str, object] = {"summary": single.summary()}
            if per_op:
                doc["ops"] = single.ops_frame().to_dict(orient="records")
            text = json.dumps(doc, indent=2, default=_json_default)
        else:  # a table written to a file
            console = Console(record=True, width=160, file=open(os.devnull, "w"))
            from llmperf.render import generation_tables
            for table in generation_tables(single):
                console.print(table)
            text = console.export_text()
        write_output(text, output)
    except (SpecError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"--output: {exc}") from None


def _json_default(value: object) -> object:
    import numpy as np
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _show_listing(frame, shown, title: str, output_format: OutputFormat) -> None:  # noqa: ANN001
    """A listing as a rich table (`shown`, display-formatted) or as JSON/CSV of the exact `frame`."""
    if output_format is OutputFormat.table:
        from llmperf.render import frame_table
        out_console.print(frame_table(shown.drop(columns=["source"]), title))
    elif output_format is OutputFormat.json:
        write_output(frame.to_json(orient="records", indent=2), None)
    else:
        write_output(frame.to_csv(index=False), None)


FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="table, json or csv.")]


@app.command("models")
def models_cmd(output_format: FormatOption = OutputFormat.table) -> None:
    """List the built-in models: parameters, shape, KV bytes per token (fp16), source."""
    from llmperf.render import models_frame
    frame = models_frame()
    shown = frame.assign(params=[f"{p / 1e9:.3f} B" for p in frame["params"]]).rename(
        columns={"kv_bytes_per_token_fp16": "KV B/token (fp16)"})
    _show_listing(frame, shown, "Built-in models (exact counts: --format json)", output_format)


@app.command("hardware")
def hardware_cmd(output_format: FormatOption = OutputFormat.table) -> None:
    """List the built-in devices: dense peaks (TFLOP/s), memory bandwidth (GB/s), capacity (GiB), ridge point."""
    from llmperf.render import hardware_frame
    frame = hardware_frame()
    _show_listing(frame, frame, "Built-in devices (dense peaks)", output_format)


# Commands defined in their own modules (llmperf/commands/<name>.py), one registration line each.
from llmperf.commands import simulate as _simulate; _simulate.register(app)  # noqa: E402, E702
from llmperf.commands import plan as _plan; _plan.register(app)  # noqa: E402, E702


def main() -> None:
    app()


if __name__ == "__main__":
    main()
