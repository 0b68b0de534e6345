"""`llmperf plan MODEL --rate R | --users N`: which devices, precisions, TP degrees, layouts (tp, tp+ep,
dp+ep) and replica counts serve the load within the SLOs, ranked by cost per million generated tokens
(`llmperf.serving.planner`); every answer names the time model that priced it."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from llmperf.cli.clitools import (
    OutputFormat,
    err_console,
    out_console,
    parse_int_list,
    parse_name_list,
    refused_cleanly,
    write_output,
)
from llmperf.cli.commands.simulate import (
    AcceptanceOpt,
    BlockOpt,
    ChunkOpt,
    DraftOpt,
    DraftTokensOpt,
    DraftTpOpt,
    ExpertLoadOpt,
    FormatOpt,
    MaxBatchOpt,
    MemOpt,
    OutOpt,
    OutputOpt,
    PrefixOpt,
    PromptOpt,
    SeedOpt,
    SloPctOpt,
    SloTpotOpt,
    SloTtftOpt,
    StreamingOpt,
    SystemOpt,
    TokensOpt,
    TreeOpt,
    _fmt_s,
    _length,
    _positive,
    check_serving_options,
    expert_load_from_option,
    layout_words,
    speculative_from_options,
    streaming_model,
)
from llmperf.defaults import DEFAULT_MAX_BATCHED_TOKENS, OUTPUT_LEN, PLAN_TOP, PROMPT_LEN
from llmperf.errors import SpecError


def _money(x: float | None, digits: int = 3) -> str:
    return "?" if x is None or (isinstance(x, float) and math.isnan(x)) else f"${x:.{digits}g}"


def time_models_line(result) -> str:  # noqa: ANN001
    """Which time model and engine profile priced the plan's rows, in words (the optimistic roofline
    said as such)."""
    names = sorted({r.time_model for r in result.rows if r.time_model})
    if not names:
        return f"time model: {result.settings.get('efficiency', '?')}"
    words = [n + (" (the optimistic bound: peak FLOPs and bandwidth)" if n == "roofline" else "") for n in names]
    engines = sorted({engine_of(r.time_model, r.device, result.settings.get("engine")) for r in result.rows
                      if r.time_model and r.time_model != "roofline"})
    return ("priced with the " + " and ".join(words) + " time model"
            + (f", engine profile {' and '.join(engines)}" if engines else ""))


def engine_of(time_model: str | None, device: str, engine: str | None) -> str:
    """The engine profile that priced a plan row: none under the roofline, llmperf's own on a CPU,
    else `--engine` (or the default)."""
    from llmperf.analysis.timemodel import DEFAULT_ENGINE, is_cpu
    from llmperf.specs import load_hardware
    if not time_model or time_model == "roofline":
        return "none"
    return "llmperf" if is_cpu(load_hardware(device)) else (engine or DEFAULT_ENGINE)


def _layout(row) -> str:  # noqa: ANN001
    """A row's layout, with EPLB's redundant experts where it runs the balancer."""
    return row.layout + (f" eplb {row.eplb}" if row.eplb is not None else "")


def routing_line(result) -> str:  # noqa: ANN001
    """How the experts are routed and placed when not uniformly and contiguously ("" then)."""
    st = result.settings if isinstance(result.settings, dict) else {}
    words = layout_words(dict(expert_load=st.get("expert_load"))).removeprefix(", ")
    if st.get("eplb") is not None:
        words += (", " if words else "") + f"EPLB with {st['eplb']} redundant experts in every tp+ep / dp+ep candidate"
    return words


def kv_line(result) -> str:  # noqa: ANN001
    return str(result.settings.get("kv_note") or "")


def stopping_line(result) -> str:  # noqa: ANN001
    """How many requests the percentiles come from, and how sure they are, in words."""
    st = result.settings.get("stopping") or {}
    level = f"{float(st.get('ci_level', 0.95)):.0%}"
    head = (f"percentiles at steady state (the first and last {float(st.get('warmup', 0.1)):.0%} of requests, at "
            f"least {st.get('min_warmup', 50)}, discarded), [{level} interval by batch sectioning]")
    if st.get("method") == "batch sectioning":
        return (head + f"; requests doubled from {st['min_requests']} until each interval is within "
                       f"+-{float(st['ci_tolerance']):.0%} (at most {st['max_requests']})")
    if st:
        return head + f"; a fixed {st.get('requests')} requests per simulation (no stopping rule)"
    return ""


def _ci(x, lo, hi) -> str:  # noqa: ANN001
    import math
    if x is None or lo is None or hi is None or not all(map(math.isfinite, (x, lo, hi))):
        return _fmt_s(x)
    return f"{_fmt_s(x)} [{_fmt_s(max(lo, 0.0))}, {_fmt_s(hi)}]"


def plan_tables(result):  # noqa: ANN001, ANN201
    from rich.table import Table
    slo = result.slo
    pct = f"p{slo.percentile:g}"
    notes = "; ".join(x for x in (time_models_line(result), kv_line(result), routing_line(result)) if x)
    notes += "".join("\n" + n for n in result.settings.get("precision_notes") or [])
    notes += ("\n" + stopping_line(result)) if stopping_line(result) else ""
    win = Table(title=f"{result.model} at {result.rate_rps:.4g} req/s: configurations meeting {pct} "
                      f"TTFT <= {_fmt_s(slo.ttft_s)}, TPOT <= {_fmt_s(slo.tpot_s)} (cheapest first)\n{notes}")
    for col in ("rank", "device", "precision", "TP", "layout", "replicas", "GPUs", f"TTFT {pct} [CI]",
                f"TPOT {pct} [CI]", "TTFT, TPOT bound", "requests", "$/GPU-h", "$/hour", "$/M in", "$/M out"):
        win.add_column(col, justify="right")
    for i, r in enumerate(result.feasible, start=1):
        n = "-" if r.requests_simulated is None else f"{r.requests_simulated}" + ("" if r.ci_converged else "*")
        win.add_row(str(i), r.device, f"{r.precision} {r.gemm}".strip(), str(r.tp), _layout(r), str(r.replicas), str(r.gpus),
                    _ci(r.ttft_s, r.ttft_ci_low_s, r.ttft_ci_high_s), _ci(r.tpot_s, r.tpot_ci_low_s, r.tpot_ci_high_s),
                    f"{_fmt_s(r.ttft_bound_s)}, {_fmt_s(r.tpot_bound_s)}", n, _money(r.usd_per_gpu_hour), _money(r.cost_per_hour), _money(r.cost_per_million_input_tokens),
                    _money(r.cost_per_million_output_tokens))
    win.caption = ("TTFT, TPOT bound: the same replica load under the roofline (the optimistic bound)\n"
                   "$/M in, $/M out: the GPU-hours split between prefill (input) and decode (output) by their "
                   "share of step time in the simulation (a mixed step by its tokens), over input and output tokens")
    st = result.settings if isinstance(result.settings, dict) else {}
    if st.get("draft"):
        tree = (f" (a tree: {st['tree_topk']} candidates a sequence after the first draft step, "
                f"{st['verify_tokens']} verified)" if st.get("tree_topk", 1) > 1 else "")
        win.caption += (f"\nspeculative decoding in every candidate: draft {st['draft']}, k = {st['num_draft_tokens']} "
                        f"draft steps a cycle{tree}, acceptance a = {st['acceptance']:g}, E(a, k) = "
                        f"{st['expected_tokens_per_cycle']:.2f} tokens a cycle"
                        + (f", the draft at tp {st['draft_tp']} within each replica" if st.get("draft_tp")
                           else ", the draft at each candidate's tp"))
    if any(r.requests_simulated is not None and not r.ci_converged for r in result.feasible):
        win.caption += "\n* the interval is wider than the tolerance (fixed sample, or --max-requests reached)"
    lose = Table(title="configurations that lose, and why")
    for col in ("device", "precision", "TP", "layout", "loses on", "why"):
        lose.add_column(col, justify="left" if col == "why" else "right", overflow="fold")
    outranked = [r for r in result.losers if r.binding == "outranked"]
    if outranked:
        top = result.settings.get("top")
        win.caption += (f"\nthe {top} cheapest are certain; {len(outranked)} more configurations were not simulated: "
                        "even their optimistic bounds rank after them (-f csv lists each; --top 0 simulates "
                        "every one)")
    losers = [r for r in result.losers if r.binding != "outranked"]
    for r in sorted(losers, key=lambda r: (r.device, r.precision, r.tp, r.layout)):
        lose.add_row(r.device, f"{r.precision} {r.gemm}".strip(), str(r.tp), _layout(r), r.binding, r.detail)
    return [win, lose] if losers else [win]


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        model: Annotated[str, typer.Argument(help="Built-in model name, or a YAML / HF config.json path.")] = "llama-3.1-8b",
        rate: Annotated[float | None, typer.Option("--rate", help="Offered load, requests/s (Poisson).")] = None,
        users: Annotated[int | None, typer.Option("--users", help="Concurrent users instead of --rate: each sends a request every --user-interval seconds on average.")] = None,
        user_interval: Annotated[float | None, typer.Option("--user-interval", help="Mean seconds between one user's requests (with --users; default 30).")] = None,
        hardware: Annotated[str | None, typer.Option("--hardware", "-H", help="Devices to consider, comma-separated (default: every built-in device).")] = None,
        precisions: Annotated[str, typer.Option("--precisions", help="Weight precisions to consider: bf16/fp16 (16-bit), fp8 (W8A8), int8, int4 (weight-only).")] = "bf16,fp8,int8,int4",
        tps: Annotated[str, typer.Option("--tp", help="Tensor-parallel degrees (GPUs per replica) to consider.")] = "1,2,4,8",
        layouts: Annotated[str | None, typer.Option("--layouts", help="Layouts of a replica's GPUs, comma-separated: tp (tensor parallel), tp+ep (experts expert-parallel, ep = tp), dp+ep (data-parallel attention + expert parallel; how MLA models are served). Default: every layout the model takes (dense models: tp).")] = None,
        expert_load: ExpertLoadOpt = None,
        eplb: Annotated[int | None, typer.Option("--eplb", help="EPLB (DeepSeek's expert-parallel load balancer) with N redundant experts per MoE layer (0: rearrange only) in every expert-parallel candidate (tp+ep, dp+ep at tp > 1; one whose GPUs cannot hold the experts evenly loses on layout); tp candidates run without it. Default: experts placed contiguously, as servers without a balancer.")] = None,
        engine: Annotated[str | None, typer.Option("--engine", help="GPU serving stack's profile pricing step overhead and kernel launches (models_spec/engines): compiled (CUDA graphs: vLLM, SGLang, TensorRT-LLM; the default) or eager (PyTorch eager). Not for a CPU.")] = None,
        efficiency: Annotated[str, typer.Option("--efficiency", help="Time model pricing every step: typical (GPU efficiency figures, the default), roofline (the optimistic bound), calibrated, auto.")] = "typical",
        max_replicas: Annotated[int, typer.Option("--max-replicas", help="Most data-parallel replicas per configuration.")] = 64,
        gpu_cost: Annotated[str | None, typer.Option("--gpu-cost", help="USD per GPU-hour: one price for all, or device=price,... (defaults per device are cited in llmperf/serving/prices.py).")] = None,
        slo_ttft: SloTtftOpt = None,
        slo_tpot: SloTpotOpt = None,
        slo_percentile: SloPctOpt = 90.0,
        prompt_len: PromptOpt = PROMPT_LEN,
        output_len: OutputOpt = OUTPUT_LEN,
        system_prompt_len: SystemOpt = 0,
        requests: Annotated[int | None, typer.Option("--requests", "-n", help="Requests of the first simulation of a load (default 500); given without --ci-tolerance, every simulation serves exactly this many (no stopping rule; the intervals are still shown).")] = None,
        ci_tolerance: Annotated[float | None, typer.Option("--ci-tolerance", help="Stop simulating a load when the confidence interval of each SLO percentile is within this fraction of it (default 0.05: +-5%); the requests double from --requests up to --max-requests.")] = None,
        max_requests: Annotated[int, typer.Option("--max-requests", help="Most requests one simulation serves under the stopping rule.")] = 16000,
        ci_level: Annotated[float, typer.Option("--ci-level", help="Confidence level of the percentiles' intervals (batch sectioning over 10 batches of consecutive requests, warm-up discarded).")] = 0.95,
        jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Processes evaluating candidates (default: one per CPU).")] = None,
        top: Annotated[int, typer.Option("--top", help="Simulate until the N cheapest configurations that meet the SLOs are certain, cheapest optimistic bound first; the others are listed as outranked, not simulated. 0: simulate every candidate.")] = PLAN_TOP,
        seed: SeedOpt = 0,
        draft: DraftOpt = None,
        draft_tokens: DraftTokensOpt = None,
        acceptance: AcceptanceOpt = None,
        draft_tp: DraftTpOpt = None,
        tree: TreeOpt = None,
        max_batch: MaxBatchOpt = 256,
        max_batched_tokens: TokensOpt = DEFAULT_MAX_BATCHED_TOKENS,
        chunked_prefill: ChunkOpt = True,
        prefix_sharing: PrefixOpt = True,
        block_size: BlockOpt = 16,
        mem_util: MemOpt = 0.9,
        streaming: StreamingOpt = None,
        run_dir: Annotated[str | None, typer.Option("--run-dir", help="Write plan.json and plan.csv here.")] = None,
        output_format: FormatOpt = OutputFormat.table,
        output: OutOpt = None,
    ) -> None:
        """Plan capacity: search devices x precision x TP x replicas for the load and the SLOs; rank the
        configurations that meet them by cost per million generated tokens and GPU count, and say why
        each other one loses (memory, TTFT or TPOT). Costs are also shown per million input and per
        million output tokens: the GPU-hours split between prefill and decode by their share of the
        simulated step time (a mixed chunked-prefill step by its tokens). Each load is simulated until
        the SLO percentiles' 95% intervals are within --ci-tolerance; the table shows them."""
        from llmperf.cli.clitools import check_output
        from llmperf.outputs import check_dir
        from llmperf.serving import planner
        from llmperf.serving.prices import parse_gpu_cost
        from llmperf.serving.simulator import SLO
        from llmperf.serving.workload import WorkloadSpec
        with refused_cleanly() as made:
            if (rate is None) == (users is None):
                raise SpecError("plan: give exactly one of --rate and --users")
            if user_interval is not None and users is None:
                raise SpecError("--user-interval: applies to --users (with --rate, drop it)")
            _positive("--rate", rate)
            _positive("--users", users, integer=True)
            _positive("--user-interval", user_interval)
            _positive("--requests", requests, integer=True)
            from llmperf.serving.stability import DEFAULT_TOLERANCE, Stopping
            if requests is not None and ci_tolerance is None:
                stopping = Stopping(tolerance=None, level=ci_level)
            else:
                _positive("--max-requests", max_requests, integer=True)
                first = requests if requests is not None else min(Stopping().min_requests, max_requests)
                stopping = Stopping(tolerance=DEFAULT_TOLERANCE if ci_tolerance is None else ci_tolerance,
                                    level=ci_level, min_requests=first, max_requests=max_requests)
            _positive("--max-replicas", max_replicas, integer=True)
            _positive("--jobs", jobs, integer=True)
            planner.check_top(top)
            check_serving_options(max_batch=max_batch, max_batched_tokens=max_batched_tokens, block_size=block_size,
                                  mem_util=mem_util)
            slo = SLO(ttft_s=slo_ttft, tpot_s=slo_tpot, percentile=slo_percentile)
            if not slo.any:
                raise SpecError("plan: give at least one SLO (--slo-ttft, --slo-tpot)")
            load = rate if rate is not None else users / (30.0 if user_interval is None else user_interval)
            _positive("--users / --user-interval", load)
            out = check_output(output)
            rd = check_dir(run_dir, "--run-dir") if run_dir is not None else None
            made += [rd] if rd is not None else []
            devices = parse_name_list("--hardware", hardware) if hardware is not None else planner.all_devices()
            precs = parse_name_list("--precisions", precisions)
            for p in precs:
                from llmperf.specs.precision import normalize_dtype
                normalize_dtype(p, "--precisions")
            tp_list = parse_int_list("--tp", tps)
            layout_list = (planner.check_layouts(parse_name_list("--layouts", layouts)) if layouts is not None
                           else None)
            from llmperf.serving.simulator import EFFICIENCIES
            if efficiency not in EFFICIENCIES:
                raise SpecError(f"--efficiency: must be one of {', '.join(EFFICIENCIES)}, got {efficiency!r}")
            if engine is not None:
                from llmperf.analysis.timemodel import load_engine
                load_engine(engine)
            costs = parse_gpu_cost(gpu_cost)
            if isinstance(costs, dict):
                known = set(devices) | set(planner.all_devices())
                unknown = [d for d in costs if d not in known]
                if unknown:
                    raise SpecError(f"--gpu-cost: unknown device {unknown[0]!r} (known: {', '.join(sorted(known))})")
            spec = WorkloadSpec(arrival="poisson:1", prompt_len=_length("--prompt-len", prompt_len),
                                output_len=_length("--output-len", output_len),
                                num_requests=requests if requests is not None else stopping.min_requests,
                                system_prompt_len=system_prompt_len, seed=seed)
            base = dict(max_batch=max_batch, max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill,
                        prefix_sharing=prefix_sharing, block_size=block_size, mem_util=mem_util, efficiency=efficiency,
                        engine=engine)
            model, streamed = streaming_model(model, streaming)
            speculative = speculative_from_options(model, draft, draft_tokens, acceptance, seed, draft_tp,
                                                   tuple(tp_list), tree)
            if speculative is not None:  # every candidate simulated with it
                base["speculative"] = speculative
            base["expert_load"], base["eplb"] = expert_load_from_option(expert_load), eplb
            result = _run(model, load, slo, spec, devices, precs, tp_list, max_replicas, costs, base, jobs, top,
                          layout_list, stopping)
            frame = result.to_frame()
            result.settings["streaming"] = streamed  # "SINKS:WINDOW", or None
            if isinstance(result.settings, dict) and result.settings.get("engine") is None:
                from llmperf.analysis.timemodel import DEFAULT_ENGINE
                result.settings["engine"] = DEFAULT_ENGINE  # what priced the GPU rows (named per row below)
            if "time_model" in frame.columns:  # every row names the engine profile that priced it
                frame.insert(list(frame.columns).index("time_model") + 1, "engine",
                             [engine_of(t, d, engine) for t, d in zip(frame["time_model"], frame["device"])])
            if not result.feasible:  # an error (exit 2): the losers are shown, no file is written
                if out is None and output_format is OutputFormat.table:
                    for t in plan_tables(result):
                        out_console.print(t)
                best = result.best_loser()
                lay = f" {best.layout}" if best.layout != "tp" else ""
                raise SpecError(f"plan: no configuration meets the SLOs at {load:.4g} req/s; the closest, "
                                f"{best.device} {best.precision} tp={best.tp}{lay}, loses on {best.binding}: "
                                f"{best.detail} ({time_models_line(result)})")
            if rd is not None:
                from llmperf.outputs import json_text
                with rd.transaction():
                    rd.write("plan.csv", frame.to_csv(index=False))
                    rd.write("plan.json", json_text(dict(kind="plan", schema_version=1, settings=result.settings,
                                                         rows=frame.to_dict(orient="records"))) + "\n")
            if output_format is OutputFormat.json:
                from llmperf.outputs import json_text
                write_output(json_text(jsonable_doc(result, frame)), out)
            elif output_format is OutputFormat.csv:
                write_output(frame.to_csv(index=False), out)
            else:
                tables = plan_tables(result)
                if out is None:
                    for t in tables:
                        out_console.print(t)
                else:
                    import os

                    from rich.console import Console
                    console = Console(record=True, width=180, file=open(os.devnull, "w"), markup=False)
                    for t in tables:
                        console.print(t)
                    write_output(console.export_text(), out)


def jsonable_doc(result, frame) -> dict:  # noqa: ANN001
    from llmperf.outputs import jsonable
    return jsonable(dict(settings=result.settings, rows=frame.to_dict(orient="records")))


def _run(model, load, slo, spec, devices, precs, tp_list, max_replicas, costs, base, jobs, top,  # noqa: ANN001, ANN202
         layouts=None, stopping=None):  # noqa: ANN001
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from llmperf.serving import planner
    total = None  # candidates: devices x precisions x degrees x the model's layouts
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=not err_console.is_terminal) as progress:
        task = progress.add_task("planning", total=total)

        def on_candidate(row) -> None:  # noqa: ANN001
            progress.update(task, advance=1, description=f"{row.device} {row.precision} tp={row.tp} {row.layout}")
        return planner.plan(model, rate=load, slo=slo, workload=spec, devices=devices, precisions=precs, tps=tp_list,
                            max_replicas=max_replicas, gpu_cost=costs, base=base, on_candidate=on_candidate,
                            jobs=jobs, layouts=layouts, stopping=stopping, top=top)
