"""`llmperf simulate MODEL`: serve a workload with the engine's scheduler on a simulated clock, each
step priced by the analytical model (`llmperf.serving.simulator`); `--find-max-rate` bisects the
arrival rate for the SLOs; `--validate` runs the same workload through the real engine on this CPU
and compares (`llmperf.measure.validate`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from llmperf.cli.clitools import (
    OutputFormat,
    err_console,
    out_console,
    refused_cleanly,
    write_output,
)
from llmperf.defaults import (
    DEFAULT_MAX_BATCHED_TOKENS,
    OUTPUT_LEN,
    PROMPT_LEN,
    VALIDATE_HARDWARE,
    VALIDATE_OUTPUT_LEN,
    VALIDATE_PROMPT_LEN,
)
from llmperf.errors import SpecError

DEFAULT_HARDWARE = "a100-80gb-sxm"


class Policy(str, Enum):
    continuous = "continuous"
    static = "static"


class Efficiency(str, Enum):
    auto = "auto"
    roofline = "roofline"
    typical = "typical"
    calibrated = "calibrated"


# Shared by `simulate` and `plan`.
PROMPT_HELP = ("Prompt tokens per request: 512, uniform:LO:HI, normal:MEAN:STD[:LO[:HI]], lognormal:MU:SIGMA[:LO[:HI]], "
               "cycle:A,B,C or file:PATH (one length a line).")
OUTPUT_HELP = "Generated tokens per request (same forms as --prompt-len)."
PromptOpt = Annotated[str, typer.Option("--prompt-len", help=PROMPT_HELP)]
OutputOpt = Annotated[str, typer.Option("--output-len", help=OUTPUT_HELP)]
SystemOpt = Annotated[int, typer.Option("--system-prompt-len", help="Tokens of a system prompt shared by every request (in front of its own prompt; shared KV blocks with prefix sharing).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the workload's random streams (same seed, same run).")]
SloTtftOpt = Annotated[float | None, typer.Option("--slo-ttft", help="SLO on time to first token, seconds.")]
SloTpotOpt = Annotated[float | None, typer.Option("--slo-tpot", help="SLO on time per output token, seconds.")]
SloPctOpt = Annotated[float, typer.Option("--slo-percentile", help="Percentile of TTFT and TPOT the SLOs bound (e.g. 90, 99).")]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="Precision preset (fp32, fp16, bf16, fp8, int8, int4). Default: the model's dtype.")]
KvOpt = Annotated[str | None, typer.Option("--kv", help="KV cache precision, overriding --dtype.")]
PolicyOpt = Annotated[Policy, typer.Option("--policy", help="continuous (in-flight) or static batching.")]
MaxBatchOpt = Annotated[int, typer.Option("--max-batch", help="Most sequences running at once (vLLM max_num_seqs).")]
TokensOpt = Annotated[int, typer.Option("--max-batched-tokens", help="Tokens per step, the chunked-prefill budget (vLLM max_num_batched_tokens); the default, 8192, is the one estimate, simulate and plan share: vLLM V1's server default on 80 GB-class GPUs (it picks 2048 on smaller ones; pass that for an L4 or A10).")]
ChunkOpt = Annotated[bool, typer.Option("--chunked-prefill/--no-chunked-prefill", help="Chunked prefill with mixed prefill+decode steps (Sarathi-Serve).")]
PrefixOpt = Annotated[bool, typer.Option("--prefix-sharing/--no-prefix-sharing", help="Share the KV blocks of a common prompt prefix.")]
BlockOpt = Annotated[int, typer.Option("--block-size", help="Tokens per paged KV block.")]
MemOpt = Annotated[float, typer.Option("--mem-util", help="Fraction of device memory the server uses (vLLM gpu_memory_utilization).")]
EffOpt = Annotated[Efficiency, typer.Option("--efficiency", help="Time model: auto (the expected time: typical on a GPU, the calibration of --hardware local), roofline (the bound), typical, calibrated.")]
EngineOpt = Annotated[str | None, typer.Option("--engine", help="GPU serving stack's profile for step overhead and kernel launches (models_spec/engines): compiled (CUDA graphs: vLLM, SGLang, TensorRT-LLM; the default) or eager (PyTorch eager, llmperf's own engine). Not for a CPU; the roofline takes none.")]
StreamingOpt = Annotated[str | None, typer.Option("--streaming", help="StreamingLLM KV eviction, SINKS:WINDOW (e.g. 4:2044), as `llmperf estimate --streaming`: the model with every layer a sliding window of SINKS + WINDOW tokens (the same keys per query, bytes and KV), its paged pool holding each sequence's window's blocks.")]
DraftOpt = Annotated[str | None, typer.Option("--draft", "-d", help="Speculative decoding: the draft model (the target's vocabulary), as `llmperf speculate --draft` takes it: a built-in name, a YAML / HF config.json path, mtp (the model's own multi-token-prediction layer), eagle3 (an EAGLE-3 head over the target's features; eagle3:N for N draft-vocabulary tokens, default 32,000; or a head's config.json path) or early-exit:N (its own first N layers). Needs --draft-tokens and --acceptance.")]
DraftTokensOpt = Annotated[int | None, typer.Option("--draft-tokens", "-k", help="Speculative decoding: draft tokens per cycle (k, 1 .. 64).")]
TreeOpt = Annotated[str | None, typer.Option("--tree", help="Speculative decoding with a draft tree, TOPK:TOKENS, as EAGLE-2/3 in SGLang (--speculative-eagle-topk, --speculative-num-draft-tokens): draft steps after the first run TOPK candidates a sequence, the target verifies TOKENS of them; --draft-tokens is the depth and --acceptance each depth's. Default: a chain.")]
DraftTpOpt = Annotated[int | None, typer.Option("--draft-tp", help="Speculative decoding: the draft model's tensor-parallel degree (default: the target's --tp; it divides it; 1 runs the draft on one GPU, as vLLM's draft_tensor_parallel_size=1, and that GPU holds all of it). Not for mtp or early-exit drafts, which run on the target's layers.")]
AcceptanceOpt = Annotated[float | None, typer.Option("--acceptance", "-a", help="Speculative decoding: each draft token's acceptance rate (a, in [0, 1]; independent per token; the cycle's tokens are drawn with --seed).")]
ExpertLoadOpt = Annotated[str | None, typer.Option("--expert-load", help="A measured router's load per expert (llmperf profile's expert_load.json, or SGLang's logical_count as JSON): experts priced at its popularity, not uniform routing.")]
EplbOpt = Annotated[int | None, typer.Option("--eplb", help="EPLB (DeepSeek's expert-parallel load balancer) with N redundant experts per MoE layer (0: rearrange only); needs --ep > 1. Default: experts placed contiguously, as servers without a balancer.")]
FormatOpt = Annotated[OutputFormat, typer.Option("--format", "-f", help="table (rich), json or csv.")]
OutOpt = Annotated[str | None, typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout.")]


def _positive(option: str, value: float | None, *, integer: bool = False) -> None:
    import math
    if value is None:
        return
    if not value > 0:
        kind = "a positive integer" if integer else "a number > 0"
        raise SpecError(f"{option}: must be {kind}, got {value:g}")
    if not integer and not math.isfinite(value):
        raise SpecError(f"{option}: must be a finite number, got {value:g}")


def check_serving_options(*, max_batch: int | None = None, max_batched_tokens: int | None = None,
                          block_size: int | None = None, mem_util: float | None = None,
                          num_blocks: int | None = None, tp: int | None = None) -> None:
    """The replica's options, each refused in one line with its own name before anything runs."""
    for opt, v in (("--tp", tp), ("--max-batch", max_batch), ("--max-batched-tokens", max_batched_tokens),
                   ("--block-size", block_size), ("--num-blocks", num_blocks)):
        _positive(opt, v, integer=True)
    if mem_util is not None and not 0 < mem_util <= 1:
        raise SpecError(f"--mem-util: must be in (0, 1], got {mem_util:g}")


def check_layout_options(*, mla_mode: str, kv_window: str) -> None:
    """--mla-mode and --kv-window checked by name before anything runs."""
    from llmperf.analysis.operators import MLA_MODES
    from llmperf.specs.kvcache import KV_WINDOW_MODES
    if mla_mode not in MLA_MODES:
        raise SpecError(f"--mla-mode: must be one of {', '.join(MLA_MODES)}, got {mla_mode!r}")
    if kv_window not in KV_WINDOW_MODES:
        raise SpecError(f"--kv-window: must be one of {', '.join(KV_WINDOW_MODES)}, got {kv_window!r}")


def speculative_from_options(model: str, draft: str | None, draft_tokens: int | None, acceptance: float | None,
                             seed: int, draft_tp: int | None = None, tps: tuple[int, ...] = (1,),
                             tree: str | None = None):  # noqa: ANN201
    """The `SpeculativeConfig` of --draft / --draft-tokens / --acceptance / --draft-tp / --tree (None
    without --draft), the draft resolved against `model` and its degree checked against each target
    degree in `tps`; each bad value refused in one line naming its option."""
    if draft is None:
        for opt, v in (("--draft-tokens", draft_tokens), ("--acceptance", acceptance), ("--draft-tp", draft_tp),
                       ("--tree", tree)):
            if v is not None:
                raise SpecError(f"--draft: {opt} sets speculative decoding; add --draft (a model, mtp, eagle3 or early-exit:N)")
        return None
    if draft_tokens is None:
        raise SpecError("--draft-tokens: needed with --draft (draft tokens per cycle, 1 .. 64)")
    if not 1 <= draft_tokens <= 64:
        raise SpecError(f"--draft-tokens: must be an integer in 1 .. 64, got {draft_tokens}")
    if acceptance is None:
        raise SpecError("--acceptance: needed with --draft (each draft token's acceptance rate, in [0, 1])")
    import math
    if not math.isfinite(acceptance) or not 0.0 <= acceptance <= 1.0:
        raise SpecError(f"--acceptance: must be a number in [0, 1], got {acceptance:g}")
    from llmperf.serving.speculative import SpeculativeConfig
    from llmperf.specs import load_model
    if draft_tp is not None and draft_tp < 1:
        raise SpecError(f"--draft-tp: must be a positive integer, got {draft_tp}")
    from llmperf.analysis.speculative import DraftTree
    shape = None if tree is None else DraftTree.parse("--tree", tree)
    try:
        spec = SpeculativeConfig(draft=draft, num_draft_tokens=draft_tokens, acceptance=acceptance, seed=seed,
                                 draft_tp=draft_tp, tree=shape)
    except SpecError as exc:
        raise SpecError(f"--{exc}") from None
    target = load_model(model)
    try:
        spec.resolve(target)
    except SpecError as exc:
        raise SpecError(f"--{exc}") from None
    try:
        for tp in tps:
            spec.tp_of_draft(target, tp)
    except SpecError as exc:
        raise SpecError(f"--draft-tp{str(exc).removeprefix('draft_tp')}") from None
    return spec


def expert_load_from_option(path: str | None):  # noqa: ANN201
    """The `ExpertLoad` of `--expert-load PATH` (None without it); a bad file raises SpecError naming
    expert_load."""
    if path is None:
        return None
    from llmperf.specs.expert_load import load_expert_load
    try:
        return load_expert_load(path)
    except SpecError as exc:  # a missing or unreadable file names the option too
        text = str(exc)
        raise SpecError(text if text.startswith("expert_load:") else f"expert_load: {text}") from None


def layout_words(settings: dict) -> str:
    """A run's or a plan's expert routing in words: ", EPLB N redundant experts" and ", expert load FILE"
    where set ("" for uniform routing over contiguous experts)."""
    eplb, load = settings.get("eplb"), settings.get("expert_load")
    return ((f", EPLB {eplb} redundant experts" if eplb is not None else "")
            + (f", expert load {Path(str(load)).name}" if load else ""))


def streaming_model(model: str, streaming: str | None):  # noqa: ANN201
    """(`model` as given, None), or under StreamingLLM (`--streaming SINKS:WINDOW`): (its spec with every
    layer a sliding window of SINKS + WINDOW, "SINKS:WINDOW" for the settings). Bad input raises
    SpecError naming --streaming."""
    if streaming is None:
        return model, None
    from llmperf.specs import load_model
    from llmperf.specs.streaming import parse_streaming
    from llmperf.specs.streaming import streaming as streaming_spec
    sinks, window = parse_streaming("--streaming", streaming)
    spec = load_model(model)
    if spec.has_linear_layers:  # their state is not a window of keys: nothing for StreamingLLM to evict
        raise SpecError(f"--streaming: {spec.name} has {spec.linear_mixer_name} (linear) layers, whose state is no "
                        "window of keys; StreamingLLM applies to a model of full-attention layers")
    try:
        return streaming_spec(spec, sinks, window), f"{sinks}:{window}"
    except SpecError as exc:
        raise SpecError(f"--{exc}") from None


def speculation_table(result):  # noqa: ANN001, ANN201
    """The speculation settings and the measured tokens per cycle beside E(a, k) (None without it)."""
    st, s = result.settings, result.summary()
    if "draft" not in st:
        return None
    from rich.table import Table
    topk = st.get("tree_topk", 1)
    shape = (f"a tree: k draft steps, {topk} candidates a sequence after the first, one verify of "
             f"{st.get('verify_tokens')} tokens" if topk > 1 else "k draft steps, one verify of k + 1 tokens")
    t = Table(title=f"speculative decoding (each decode a cycle: {shape})")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in (("draft", f"{st['draft']} (tp {st['draft_tp']})"),
                 ("draft steps per cycle, k" if topk > 1 else "draft tokens per cycle, k", str(st["num_draft_tokens"])),
                 ("acceptance per depth, a" if topk > 1 else "acceptance per draft token, a", f"{st['acceptance']:g}"),
                 ("seed", str(st["speculative_seed"])),
                 ("cycles", str(s["speculative_cycles"])),
                 ("tokens per cycle, measured (all cycles)", f"{s['tokens_per_cycle']:.3f}"),
                 ("tokens per cycle, measured (cycles of k drafts)", f"{s['tokens_per_full_cycle']:.3f}"),
                 ("E(a, k) = (1 - a^(k+1)) / (1 - a)", f"{s['expected_tokens_per_cycle']:.3f}"),
                 ("draft weights / KV per token (per GPU)",
                  f"{st.get('draft_weights_bytes', 0.0) / 2**30:.2f} GiB / "
                  f"{st.get('draft_kv_bytes_per_token', 0.0) / 2**10:.1f} KiB")):
        t.add_row(k, v)
    return t


def check_run_dir(run_dir: str | None):  # noqa: ANN201
    """`--run-dir` checked before anything runs (None when not given); an existing run is not overwritten."""
    if run_dir is None:
        return None
    from llmperf.outputs import check_dir
    d = check_dir(run_dir, "--run-dir")
    if not d.missing and (d.path / "run.json").exists():
        raise SpecError(f"--run-dir: {run_dir!r} already holds a run (run.json); choose another folder")
    return d


def workload_from_options(*, rate: float | None, arrival: str, cv: float | None, trace: Path | None, requests: int | None,
                          duration: float | None, prompt_len: str, output_len: str, system_prompt_len: int,
                          seed: int):  # noqa: ANN201
    """(WorkloadSpec or None, Workload) from the command-line options; bad ones raise SpecError."""
    from llmperf.serving.workload import WorkloadSpec, generate, load_trace
    _positive("--rate", rate)
    _positive("--cv", cv)
    _positive("--duration", duration)
    if cv is not None and arrival != "gamma":
        raise SpecError(f"--cv: sets the spread of gamma arrivals; add --arrival gamma (got --arrival {arrival})")
    cv = 1.0 if cv is None else cv
    if requests is not None and requests < 1:
        raise SpecError(f"--requests: must be a positive integer, got {requests}")
    if system_prompt_len < 0:
        raise SpecError(f"--system-prompt-len: must be >= 0, got {system_prompt_len}")
    if trace is not None:
        if rate is not None or duration is not None or requests is not None:
            raise SpecError("--trace: the trace gives arrivals and lengths; drop --rate / --requests / --duration")
        return None, load_trace(trace)
    if arrival not in ("poisson", "gamma"):
        raise SpecError(f"--arrival: must be poisson or gamma, got {arrival!r}")
    if rate is None:
        if duration is not None:
            raise SpecError("--duration: needs --rate (an offline batch has no duration)")
        proc = "offline"
    else:
        proc = f"poisson:{rate!r}" if arrival == "poisson" else f"gamma:{rate!r}:{cv!r}"
    if requests is not None and duration is not None:
        raise SpecError("--requests / --duration: give one of them, not both")
    if requests is None and duration is None:
        requests = 1000
    spec = WorkloadSpec(arrival=proc, prompt_len=_length("--prompt-len", prompt_len),
                        output_len=_length("--output-len", output_len), num_requests=requests, duration_s=duration,
                        system_prompt_len=system_prompt_len, seed=seed)
    return spec, generate(spec)


def _length(option: str, text: str):  # noqa: ANN202
    from llmperf.serving.workload import parse_length
    try:
        return parse_length(text)
    except SpecError as exc:
        raise SpecError(f"{option}: {exc}") from None


def _fmt_s(x: float | None) -> str:
    import math
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x == 0:
        return "0 s"
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} us"


def summary_tables(result, title: str, bound=None):  # noqa: ANN001, ANN201
    """Rich tables: latency percentiles (the expected time, the p90's interval beside it, and with
    `bound`, the same workload's under the roofline), throughput and memory, and the run over time."""
    import math

    from rich.table import Table
    s = result.summary()
    lat = Table(title=title, caption="[CI]: 95% interval of the p90 (batch sectioning over 10 batches of "
                                     "consecutive requests; llmperf.serving.stability)")
    for col in ("metric", "p50", "p90", "p99", "mean", "p90 [CI]"):
        lat.add_column(col, justify="left" if col == "metric" else "right")
    from llmperf.serving.stability import percentile_ci
    r = result.requests.sort_values("arrival_s", kind="stable")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "end-to-end"), ("queue_s", "queueing")):
        st = s[key]
        ci = percentile_ci(r[key].to_numpy(dtype=float), 90)
        band = (f"[{_fmt_s(max(ci.low, 0.0))}, {_fmt_s(ci.high)}]" if math.isfinite(ci.low) and math.isfinite(ci.high)
                else "-")
        lat.add_row(label + (" expected" if bound is not None else ""),
                    *(_fmt_s(st[k]) for k in ("p50", "p90", "p99", "mean")), band)
        if bound is not None and key in ("ttft_s", "tpot_s"):
            lat.add_row(label + " bound", *(_fmt_s(bound[key][k]) for k in ("p50", "p90", "p99", "mean")), "")
    tot = Table(title="throughput and memory")
    tot.add_column("quantity")
    tot.add_column("value", justify="right")
    slo = result.slo
    rows = [("requests", f"{s['requests']}"), ("makespan", _fmt_s(s["makespan_s"])),
            ("throughput", f"{s['throughput_rps']:.3f} req/s"), ("output tokens/s", f"{s['tokens_per_s']:.1f}"),
            ("goodput" + (" (all requests: no SLO)" if not slo.any else ""), f"{s['goodput_rps']:.3f} req/s"),
            ("preemptions", f"{s['preemptions']}"), ("mean batch (time-weighted)", f"{s['mean_batch']:.1f}"),
            ("mean KV utilisation (used / reserved)", f"{s['mean_kv_util']:.1%}"),
            ("peak KV used / pool (per GPU)",
             f"{s['peak_kv_used_bytes'] / 2**30:.2f} / {s['kv_pool_bytes'] / 2**30:.2f} GiB ({s['num_blocks']} blocks)")]
    if slo.any:
        rows.append((f"p{slo.percentile:g} meets SLO (TTFT <= {_fmt_s(slo.ttft_s)}, TPOT <= {_fmt_s(slo.tpot_s)})",
                     "yes" if s["meets_slo"] else "NO"))
    for k, v in rows:
        tot.add_row(k, v)
    return [lat, tot, over_time_table(result)]


def percentile_cis(result) -> dict[str, dict[str, dict]]:  # noqa: ANN001
    """95% batch-sectioning intervals (`llmperf.serving.stability`) of the reported TTFT and TPOT
    percentiles, over every request in arrival order (nothing discarded: the same requests as the
    percentiles)."""
    from llmperf.serving.stability import percentile_ci
    r = result.requests.sort_values("arrival_s", kind="stable")
    return {col: {f"p{q}": percentile_ci(r[col].to_numpy(dtype=float), q).as_dict() for q in (50, 90, 99)}
            for col in ("ttft_s", "tpot_s")}


def _prefill_share(result) -> float:  # noqa: ANN001
    from llmperf.serving.costsplit import input_time_share
    return input_time_share(result.steps)


def over_time_table(result, buckets: int = 10):  # noqa: ANN001, ANN201
    """The run in `buckets` equal time windows: batch size, KV utilisation, queue, preemptions."""
    import numpy as np
    from rich.table import Table
    st = result.steps
    t = Table(title="over time (time-weighted means per window; KV per GPU)")
    for col in ("window", "steps", "batch", "KV used", "KV util", "running", "waiting", "preemptions"):
        t.add_column(col, justify="right")
    if not len(st):
        return t
    end = float((st["start_s"] + st["duration_s"]).max())
    edges = np.linspace(0.0, end, buckets + 1)
    which = np.clip(np.searchsorted(edges, st["start_s"].to_numpy(), side="right") - 1, 0, buckets - 1)
    for b in range(buckets):
        sel = st[which == b]
        if not len(sel):
            continue
        w = sel["duration_s"].to_numpy()
        w = w if w.sum() > 0 else np.ones(len(sel))
        t.add_row(f"{_fmt_s(edges[b])} - {_fmt_s(edges[b + 1])}", str(len(sel)),
                  f"{np.average(sel['batch'], weights=w):.1f}",
                  f"{np.average(sel['kv_used_bytes'], weights=w) / 2**30:.2f} GiB",
                  f"{np.average(sel['kv_util'], weights=w):.1%}", f"{np.average(sel['running'], weights=w):.1f}",
                  f"{np.average(sel['waiting'], weights=w):.1f}", str(int(sel["preemptions"].sum())))
    return t


def rates_table(frame, search, slo):  # noqa: ANN001, ANN201
    from rich.table import Table
    max_rate = search.max_rate
    title = (f"--find-max-rate: highest rate meeting p{slo.percentile:g} SLOs = "
             + (f"{max_rate:.4g} req/s" if max_rate is not None else "none")
             + (f" ({search.note})" if search.note else ""))
    t = Table(title=title)
    for col in ("rate", f"TTFT p{slo.percentile:g}", f"TPOT p{slo.percentile:g}", "throughput", "goodput", "meets"):
        t.add_column(col, justify="right")
    pct = {50: "p50", 90: "p90", 99: "p99"}.get(int(slo.percentile) if float(slo.percentile).is_integer() else -1)
    for _, r in frame.iterrows():
        ttft = r[f"ttft_{pct}"] if pct else float("nan")
        tpot = r[f"tpot_{pct}"] if pct else float("nan")
        t.add_row(f"{r['rate']:.4g}", _fmt_s(ttft), _fmt_s(tpot), f"{r['throughput_rps']:.3g}",
                  f"{r['goodput_rps']:.3g}", "yes" if r["meets_slo"] else "no")
    return t


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate_cmd(
        model: Annotated[str, typer.Argument(help="Built-in model name, or a YAML / HF config.json path.")] = "llama-3.1-8b",
        hardware: Annotated[str | None, typer.Option("--hardware", "-H", help=f"Built-in device, a YAML path, or `local` (after `llmperf calibrate`). Default: {DEFAULT_HARDWARE}; with --validate, {VALIDATE_HARDWARE}.")] = None,
        rate: Annotated[float | None, typer.Option("--rate", help="Arrival rate, requests/s (default: an offline batch, all at t=0).")] = None,
        arrival: Annotated[str, typer.Option("--arrival", help="poisson, or gamma (with --cv).")] = "poisson",
        cv: Annotated[float | None, typer.Option("--cv", help="Coefficient of variation of gamma inter-arrival gaps (default 1 = Poisson; > 1 bursty); needs --arrival gamma.")] = None,
        trace: Annotated[Path | None, typer.Option("--trace", help="CSV (header) or JSONL with arrival_s, prompt_tokens, output_tokens[, shared_prefix_tokens].")] = None,
        requests: Annotated[int | None, typer.Option("--requests", "-n", help="Number of requests (default 1000 unless --duration).")] = None,
        duration: Annotated[float | None, typer.Option("--duration", help="Generate arrivals for this many seconds instead of --requests.")] = None,
        prompt_len: Annotated[str | None, typer.Option("--prompt-len", help=f"{PROMPT_HELP} Default: {PROMPT_LEN}; with --validate, {VALIDATE_PROMPT_LEN}.")] = None,
        output_len: Annotated[str | None, typer.Option("--output-len", help=f"{OUTPUT_HELP} Default: {OUTPUT_LEN}; with --validate, {VALIDATE_OUTPUT_LEN}.")] = None,
        system_prompt_len: SystemOpt = 0,
        seed: SeedOpt = 0,
        dtype: DtypeOpt = None,
        kv: KvOpt = None,
        tp: Annotated[int, typer.Option("--tp", help="GPUs of the replica (tensor-parallel degree).")] = 1,
        ep: Annotated[int, typer.Option("--ep", help="Expert parallelism within the replica's GPUs (divides --tp and the number of experts).")] = 1,
        dp_attention: Annotated[bool, typer.Option("--dp-attention/--no-dp-attention", help="Data-parallel attention: each GPU runs and holds the KV of its own sequences (a MoE model then needs --ep equal to --tp); how MLA models are served.")] = False,
        expert_load: ExpertLoadOpt = None,
        eplb: EplbOpt = None,
        mla_mode: Annotated[str, typer.Option("--mla-mode", help="MLA's computation: auto (prefill chunks unabsorbed, decode absorbed), absorbed, unabsorbed.")] = "auto",
        kv_window: Annotated[str, typer.Option("--kv-window", help="KV of sliding/chunked layers: capped (each holds the blocks of its window or chunk: vLLM's hybrid KV manager beside full-attention layers, one capped table when every layer slides with one window; else full pages, and it says so) or full (pages for the whole context).")] = "capped",
        streaming: StreamingOpt = None,
        policy: PolicyOpt = Policy.continuous,
        max_batch: MaxBatchOpt = 256,
        max_batched_tokens: TokensOpt = DEFAULT_MAX_BATCHED_TOKENS,
        chunked_prefill: ChunkOpt = True,
        prefix_sharing: PrefixOpt = True,
        block_size: BlockOpt = 16,
        mem_util: MemOpt = 0.9,
        num_blocks: Annotated[int | None, typer.Option("--num-blocks", help="KV pool size in blocks (default: what memory leaves).")] = None,
        efficiency: EffOpt = Efficiency.auto,
        engine: EngineOpt = None,
        draft: DraftOpt = None,
        draft_tokens: DraftTokensOpt = None,
        acceptance: AcceptanceOpt = None,
        draft_tp: DraftTpOpt = None,
        tree: TreeOpt = None,
        slo_ttft: SloTtftOpt = None,
        slo_tpot: SloTpotOpt = None,
        slo_percentile: SloPctOpt = 90.0,
        find_max_rate: Annotated[bool, typer.Option("--find-max-rate", help="Bisect the arrival rate for the highest one meeting the SLOs.")] = False,
        validate: Annotated[bool, typer.Option("--validate", help="Run the workload through the real engine on this CPU too, and compare (see docs/serving.md).")] = False,
        run_dir: Annotated[str | None, typer.Option("--run-dir", help="Write run.json, requests.csv, steps.csv (and rates.csv) here, for `llmperf report` (a folder holding a run is refused).")] = None,
        output_format: FormatOpt = OutputFormat.table,
        output: OutOpt = None,
    ) -> None:
        """Simulate serving a workload: TTFT, TPOT, end-to-end and queueing percentiles, throughput,
        goodput, KV utilisation, batch size and preemptions over time.

        The scheduler is the engine's own (continuous batching, chunked prefill, paged KV with
        recompute preemption, prefix sharing); each step is priced by the roofline model or the
        calibrated time model. Times in seconds, bytes decimal, capacities GiB.
        """
        from llmperf.cli.clitools import check_output
        from llmperf.serving import simulator as sim
        with refused_cleanly() as made:
            # Every option and destination is checked before anything runs.
            check_serving_options(tp=tp, max_batch=max_batch, max_batched_tokens=max_batched_tokens,
                                  block_size=block_size, mem_util=mem_util, num_blocks=num_blocks)
            _positive("--ep", ep, integer=True)
            check_layout_options(mla_mode=mla_mode, kv_window=kv_window)
            _positive("--requests", requests, integer=True)
            _positive("--rate", rate)
            out = check_output(output)
            rd = check_run_dir(run_dir)
            made += [rd] if rd is not None else []
            if validate and any(v is not None for v in (draft, draft_tokens, acceptance, draft_tp)):
                raise SpecError("--validate: the engine does not run speculative decoding through the scheduler; "
                                "drop --draft / --draft-tokens / --acceptance / --draft-tp")
            if validate:
                defaults = dict(arrival="poisson", cv=None, system_prompt_len=0, dtype=None,
                                kv=None, tp=1, ep=1, dp_attention=False, expert_load=None, eplb=None,
                                mla_mode="auto", kv_window="capped",
                                streaming=None,
                                max_batch=256, prefix_sharing=True, block_size=16, mem_util=0.9,
                                efficiency=Efficiency.auto, engine=None, slo_ttft=None, slo_tpot=None,
                                slo_percentile=90.0,
                                output_format=OutputFormat.table, output=None)
                given = dict(arrival=arrival, cv=cv, system_prompt_len=system_prompt_len,
                             dtype=dtype, kv=kv, tp=tp, ep=ep, dp_attention=dp_attention, expert_load=expert_load,
                             eplb=eplb, mla_mode=mla_mode,
                             kv_window=kv_window, streaming=streaming, max_batch=max_batch,
                             prefix_sharing=prefix_sharing, block_size=block_size, mem_util=mem_util,
                             efficiency=efficiency, engine=engine,
                             slo_ttft=slo_ttft,
                             slo_tpot=slo_tpot, slo_percentile=slo_percentile, output_format=output_format,
                             output=output)
                for opt, used in (("--trace", trace is not None), ("--duration", duration is not None),
                                  ("--find-max-rate", find_max_rate), ("--policy static", policy is Policy.static)):
                    if used:
                        raise SpecError(f"--validate: serves its own Poisson workload with continuous batching; "
                                        f"drop {opt}")
                ignored = [k for k, v in given.items() if v != defaults[k]]
                if ignored:
                    opt = "--" + ignored[0].replace("_", "-").replace("output-format", "format")
                    raise SpecError(f"--validate: runs its own model on this CPU and prints its comparison; {opt} "
                                    "does not apply (drop it)")
                from llmperf.cli.clitools import out_console
                from llmperf.measure.validate import run_validation_cli

                # the options left out arrive as None: --validate's own defaults apply only to them
                run_validation_cli(model=model, rate=rate, requests=requests, prompt_len=prompt_len,
                                   output_len=output_len, seed=seed, num_blocks=num_blocks,
                                   max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill,
                                   hardware=hardware, run_dir=rd, console=out_console)
                return
            hardware = DEFAULT_HARDWARE if hardware is None else hardware
            model, streamed = streaming_model(model, streaming)  # before everything else
            speculative = speculative_from_options(model, draft, draft_tokens, acceptance, seed, draft_tp, (tp,),
                                                   tree)
            prompt_len = PROMPT_LEN if prompt_len is None else prompt_len
            output_len = OUTPUT_LEN if output_len is None else output_len
            slo = sim.SLO(ttft_s=slo_ttft, tpot_s=slo_tpot, percentile=slo_percentile)
            spec, workload = workload_from_options(rate=rate, arrival=arrival, cv=cv, trace=trace, requests=requests,
                                                   duration=duration, prompt_len=prompt_len, output_len=output_len,
                                                   system_prompt_len=system_prompt_len, seed=seed)
            config = sim.ServingConfig.build(
                model, hardware, precision=dtype, kv=kv, tp=tp, ep=ep, dp_attention=dp_attention,
                expert_load=expert_load_from_option(expert_load), eplb=eplb, mla_mode=mla_mode,
                kv_window=kv_window, policy=policy.value, max_batch=max_batch,
                max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill,
                prefix_sharing=prefix_sharing, block_size=block_size, mem_util=mem_util, num_blocks=num_blocks,
                efficiency=efficiency.value, engine=engine, speculative=speculative)
            search = None
            if find_max_rate:
                if spec is None:
                    raise SpecError("--find-max-rate: needs a synthetic workload (--rate), not a --trace")
                if rate is None:
                    spec = sim.with_rate(spec, 1.0)
                search = _search_with_progress(spec, config, slo)
                result = search.best
                if result is None:
                    result = min(search.points, key=lambda p: p.rate).result
            else:
                result = sim.simulate(workload, config, slo=slo)
            result.settings["streaming"] = streamed  # "SINKS:WINDOW", or None
            bound = None  # the same workload under the roofline: the bound beside the expected time
            if search is None and result.settings["time_model"] != "roofline":
                from dataclasses import replace
                b = sim.simulate(workload, replace(config, efficiency="roofline", time_model=None, engine=None),
                                 slo=slo).summary()
                bound = {k: b[k] for k in ("ttft_s", "tpot_s", "e2e_s")}
            rates = search.to_frame() if search is not None else None
            if rd is not None:
                from llmperf.serving.rundir import write_run_dir
                summary = result.summary()
                if bound is not None:
                    summary["bound"] = bound
                extra = (dict(max_rate_rps=search.max_rate, service_rate_bound_rps=search.service_rate_rps,
                              max_rate_capped=search.capped, max_rate_note=search.note)
                         if search is not None else None)
                write_run_dir(rd, model=config.model.name, hardware=config.hardware.name,
                              settings=result.settings, summary=summary, requests=result.requests,
                              steps=result.steps, rates=rates, extra=extra)
            _render(result, search, rates, output_format, out, bound)


def _search_with_progress(spec, config, slo):  # noqa: ANN001, ANN202
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from llmperf.serving.simulator import find_max_rate
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console,
                  transient=True, disable=not err_console.is_terminal) as progress:
        task = progress.add_task("bisecting the arrival rate", total=None)

        def on_point(p) -> None:  # noqa: ANN001
            progress.update(task, description=f"rate {p.rate:.4g} req/s: {'meets' if p.result.meets_slo else 'misses'} SLOs")
        return find_max_rate(spec, config, slo, on_point=on_point)


def _render(result, search, rates, output_format: OutputFormat, output, bound=None) -> None:  # noqa: ANN001
    from llmperf.outputs import json_text
    s = result.summary()
    if bound is not None:
        s["bound"] = bound
    if output_format is OutputFormat.json:
        doc = dict(settings=result.settings, summary=s, percentile_ci=percentile_cis(result),
                   prefill_time_share=_prefill_share(result))
        if search is not None:
            doc["max_rate_rps"] = search.max_rate
            doc["service_rate_bound_rps"] = search.service_rate_rps
            doc["max_rate_capped"] = search.capped
            doc["max_rate_note"] = search.note
            doc["rates"] = rates.to_dict(orient="records")
        write_output(json_text(doc), output)
        return
    if output_format is OutputFormat.csv:
        if rates is not None:
            write_output(rates.to_csv(index=False), output)
            return
        import pandas as pd
        flat = {k: v for k, v in s.items() if not isinstance(v, dict)}
        for k, v in s.items():
            if isinstance(v, dict) and k != "bound":
                flat |= {f"{k.removesuffix('_s')}_{q}_s": x for q, x in v.items()}
        for k, v in (s.get("bound") or {}).items():  # ttft_bound_p90_s, ...
            flat |= {f"{k.removesuffix('_s')}_bound_{q}_s": x for q, x in v.items()}
        write_output(pd.DataFrame([flat]).to_csv(index=False), output)
        return
    st = result.settings
    layout = f"tp={st['tp']}" + (f", ep={st['ep']}" if st.get("ep", 1) > 1 else "") + (
        ", data-parallel attention" if st.get("dp_attention") else "") + layout_words(st)
    tm = (f"{st['time_model']} time model" + (" (the optimistic bound)" if st["time_model"] == "roofline"
                                                else f", engine {st.get('engine', '?')}"))
    gemm = f" {st['gemm']}" if st.get("gemm") else ""
    title = (f"{st['model']} on {st['hardware']} ({layout}, {st['weights']} weights{gemm}, {tm}): "
             f"{s['requests']} requests, {st['policy']}"
             + (f", chunked prefill {st['max_batched_tokens']} tokens/step" if st["chunked_prefill"] else "")
             + (f"\n{st['kv_note']}" if st.get("kv_note") else "")
             + (f"\n{st['precision_note']}" if st.get("precision_note") else ""))
    tables = summary_tables(result, title, bound)
    spec = speculation_table(result)
    if spec is not None:
        tables.insert(1, spec)
    if search is not None:
        tables.insert(0, rates_table(rates, search, result.slo))
    if output is None:
        for t in tables:
            out_console.print(t)
        return
    import os

    from rich.console import Console
    console = Console(record=True, width=160, file=open(os.devnull, "w"), markup=False)
    for t in tables:
        console.print(t)
    write_output(console.export_text(), output)
