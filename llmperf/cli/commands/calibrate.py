"""`llmperf calibrate`: measure this device's ceilings and write its hardware YAML (`local`).

Thin: parses options, runs `llmperf.measure.calibrate.calibrate` under a progress bar, renders the
measured ceilings beside the datasheet's, and writes the YAML atomically (default: the user's cache
folder, `local.yaml` in `llmperf.outputs.cache_dir()`, so `--hardware local` works everywhere).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from llmperf.cli.clitools import err_console, fail, out_console, parse_name_list, warn

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str) -> str:
    """'auto' -> cuda when torch sees one, else cpu; 'cuda' without CUDA is bad input."""
    import torch

    if device not in DEVICES:
        raise ValueError(f"--device: must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but torch sees no CUDA device "
                         f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    return device


def expected_ticks(s: Any) -> int:
    import torch

    groups = len(s.decode_groups) if torch.device(s.device).type == "cpu" else 1  # decode timed at each
    attn = len(s.attn_decode) * groups + len(s.attn_prefill)

    from llmperf.measure.calibrate import op_overhead_backends
    dev = torch.device(s.device)
    # per backend; a CPU measures each twice (cold caches, then warm)
    backends = len(op_overhead_backends(dev)) * (2 if dev.type == "cpu" else 1) if s.op_overhead else 0
    ceilings = 2 if dev.type == "cpu" else 0  # plain torch's GEMV and largest GEMM per dtype
    return (len(s.stream_sizes) + len(s.dtypes) * (len(s.gemm_rows) + attn + ceilings) + 1 + int(s.step_overhead)
            + backends + int(s.allreduce))


def run_calibration(settings: Any, *, quiet: bool = False) -> Any:
    """`calibrate(settings)` under a rich progress bar on stderr."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from llmperf.measure.calibrate import calibrate

    with Progress(TextColumn("calibrating"), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=quiet) as bar:
        task = bar.add_task("", total=expected_ticks(settings))

        def tick(msg: str) -> None:
            bar.update(task, advance=1, description=msg)

        return calibrate(settings, progress=tick)


def calibration_tables(cal: Any, path: Path | None) -> list[Any]:
    from rich.table import Table

    ds = cal.datasheet
    ceil = Table(title=f"measured ceilings: {cal.device.get('name')} ({cal.device.get('kind')}, "
                       f"{cal.device.get('threads') or cal.device.get('sms')} "
                       f"{'threads' if cal.device.get('kind') == 'cpu' else 'SMs'})")
    for col in ("ceiling", "measured", "datasheet"):
        ceil.add_column(col, justify="left" if col == "ceiling" else "right")
    ceil.add_row("memory bandwidth (best DRAM stream)", f"{cal.memory_bytes_per_s() / 1e9:.1f} GB/s",
                 f"{ds.memory_bandwidth_gbps:.0f} GB/s" if ds else "-")
    ceil.add_row("copy bandwidth (DRAM-sized)", f"{cal.copy_bytes_per_s() / 1e9:.1f} GB/s", "-")
    for d in cal.measured_dtypes():
        sheet = f"{ds.peak_tflops[d]:.1f}" if ds and d in ds.peak_tflops else "-"
        sides = [("plain torch", cal.torch_peak_flops_per_s(d), cal.gemv_bytes_per_s(d, plain=True)),
                 ("engine", cal.engine_peak_flops_per_s(d), cal.gemv_bytes_per_s(d))]
        if d in cal.plain_torch_dtypes:  # the engine's GEMM is plain torch's: one row says both
            sides = [("plain torch = engine", *sides[1][1:])]
        for who, peak, gemv in sides:
            if peak:
                ceil.add_row(f"GEMM peak {d} ({who})", f"{peak / 1e12:.3f} TFLOP/s", sheet)
            if gemv:
                ceil.add_row(f"GEMV bandwidth {d} ({who})", f"{gemv / 1e9:.1f} GB/s", "-")
    for k, v in cal.overhead_s.items():
        ceil.add_row(f"tiny {k} operator", f"{v * 1e6:.2f} us", "-")
    if cal.step_overhead_s:
        ceil.add_row("engine step outside the forward", f"{cal.step_overhead_s * 1e6:.1f} us", "-")
    for p in cal.allreduce:
        ceil.add_row(f"all-reduce {p.size_bytes / 1024:g} KiB ({p.backend}, {p.world})",
                     f"{p.seconds * 1e6:.1f} us, busbw {p.busbw / 1e9:.2f} GB/s", "-")
    streams = Table(title="streaming bandwidth by buffer size (GB/s, read + written)")
    for col in ("size", "read", "copy", "add", "spread (copy)"):
        streams.add_column(col, justify="right")
    by = {}
    for p in cal.streams:
        by.setdefault(p.size_bytes, {})[p.kind] = p
    for size, kinds in sorted(by.items()):
        cells = [f"{kinds[k].bytes_per_s / 1e9:.1f}" if k in kinds else "-" for k in ("read", "copy", "add")]
        spread = kinds.get("copy")
        rel = f"±{spread.spread_s / spread.seconds:.0%}" if spread else "-"
        streams.add_row(f"{size / 2**20:g} MiB", *cells, rel)
    tables = [ceil, streams]
    if cal.op_overhead_s:
        backends = list(cal.op_overhead_s)
        ops_table = Table(title="engine operator overheads (us per call; tiny model's decode, median)")
        ops_table.add_column("operator")
        for b in backends:
            ops_table.add_column(b, justify="right")
        names = list(dict.fromkeys(op for b in backends for op in cal.op_overhead_s[b]))
        for op in names:
            ops_table.add_row(op, *(f"{cal.op_overhead_s[b][op] * 1e6:.1f}" if op in cal.op_overhead_s[b] else "-"
                                    for b in backends))
        tables.append(ops_table)
    return tables


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_cmd(
        device: Annotated[str, typer.Option("--device", help="auto (cuda when available), cpu or cuda.")] = "auto",
        dtypes: Annotated[str, typer.Option("--dtypes", help="GEMM/attention dtypes to measure, comma-separated (fp32, bf16, fp16).")] = "fp32,bf16,fp16",
        output: Annotated[str | None, typer.Option("--output", "-o", help="Write the hardware YAML here, atomically ('-': stdout; default: the user's cache dir as 'local').")] = None,
        name: Annotated[str, typer.Option("--name", help="Name of the written spec.")] = "local",
        allreduce: Annotated[bool, typer.Option("--allreduce/--no-allreduce", help="Measure all-reduce (NCCL over >= 2 GPUs; gloo over 2 CPU processes).")] = True,
        quick: Annotated[bool, typer.Option("--quick", help="Tiny sizes: checks the tool in seconds; the figures mean nothing.")] = False,
        threads: Annotated[int | None, typer.Option("--threads", help="CPU threads while measuring (default: torch's).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the written YAML's content as JSON instead of tables.")] = False,
    ) -> None:
        """Measure this device's real ceilings (bandwidth by buffer size, GEMV bandwidth, GEMM peak per
        dtype, attention, tiny-operator overhead, all-reduce) and write a calibrated hardware YAML,
        usable as `--hardware local`. Under 2 minutes on a 2-core CPU."""
        from llmperf.errors import SpecError
        from llmperf.measure.calibrate import DTYPE_NAMES, Settings, write_yaml, yaml_text
        from llmperf.outputs import check_dir, check_file
        from llmperf.specs.local import local_path

        try:
            dev = resolve_device(device)
            names = parse_name_list("--dtypes", dtypes)
            bad = [d for d in names if d not in DTYPE_NAMES]
            if bad:
                raise SpecError(f"--dtypes: {bad[0]!r} is not one of {', '.join(DTYPE_NAMES)}")
            if not name.strip():
                raise SpecError("--name: must not be empty")
            # The destination is checked before the (up to two-minute) measurement: a FIFO, device,
            # directory, missing folder or unwritable file costs nothing.
            to_stdout = output == "-"
            cache = check_dir(local_path().parent, "--output") if output is None else None
            if output is None:
                target = None if cache.missing else check_file(str(local_path()), "--output")
            else:
                target = check_file(output, "--output")
            base = Settings.tiny(device=dev) if quick else Settings.for_device(dev)
            from dataclasses import replace
            if threads is not None and threads < 1:
                raise SpecError(f"--threads: must be a positive integer, got {threads}")
            settings = replace(base, dtypes=tuple(names), allreduce=allreduce and not quick, threads=threads)
            cal = run_calibration(settings)
            mapping = cal.to_mapping(name)
            if to_stdout:
                out_console.file.write(yaml_text(mapping))
                out_console.file.flush()
            else:
                if target is None:  # the cache folder is new
                    cache.create()
                    target = check_file(str(local_path()), "--output")
                write_yaml(mapping, target)
        except (SpecError, ValueError) as exc:
            raise fail(str(exc)) from None
        path = Path(target.shown) if target is not None else None
        for note in cal.notes:
            warn(note, "note:")
        if to_stdout:  # stdout holds the YAML alone
            return
        if as_json:
            out_console.print_json(json.dumps(mapping))
        else:
            for table in calibration_tables(cal, path):
                out_console.print(table)
            out_console.print(f"wrote {path} (use it as --hardware {name if output is None else path})")
