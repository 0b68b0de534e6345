"""`llmperf speculate MODEL --draft DRAFT`: speculative decoding priced over draft lengths (k) and
acceptance rates (`llmperf.analysis.speculative`): time per output token, its speedup over plain
decoding, the best k for each acceptance rate, and the memory both models take. Every answer names
the time model and engine profile that priced it and shows the roofline bound beside it."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from llmperf.cli.clitools import (
    OutputFormat,
    check_output,
    out_console,
    parse_int_list,
    refused_cleanly,
    warn,
)
from llmperf.cli.commands.simulate import expert_load_from_option, layout_words
from llmperf.errors import SpecError


def parse_fraction_list(option: str, text: str) -> list[float]:
    """'0.6,0.8' -> [0.6, 0.8], each in [0, 1]; anything else is an error naming the option and the value."""
    values = []
    for part in (p.strip() for p in str(text).split(",")):
        try:
            value = float(part)
        except ValueError:
            raise SpecError(f"{option}: {text!r} is not a comma-separated list of numbers in [0, 1]") from None
        if not 0.0 <= value <= 1.0:
            raise SpecError(f"{option}: {part} in {text!r} is not in [0, 1]")
        values.append(value)
    return values


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def speculate_table(rows: list, ks: list[int], acceptances: list[float]):  # noqa: ANN201
    """One row per k; per acceptance rate the TPOT, its speedup and the roofline's speedup; the best k of
    each acceptance rate starred."""
    from rich.table import Table

    first = rows[0]
    t, s = first.target, first.summary()
    best = {a: max((r for r in rows if r.acceptance == a), key=lambda r: r.speedup) for a in acceptances}
    where = f"tp {t.tp}" + (f", draft tp {first.draft.tp}" if first.draft.tp != t.tp else "")
    where += (f", ep {t.conventions.ep}" if t.conventions.ep > 1 else "") + (
        ", data-parallel attention" if t.conventions.dp_attention else "") + layout_words(s)
    plain_bound = float(t.row.get("tpot_bound_s") or t.tpot_s)
    tree = first.tree
    where += f", {tree.label()}" if tree is not None else ""
    table = Table(title=f"{s['model']} drafted by {s['draft']} on {s['hardware']} ({where}, {s['precision']}), batch "
                        f"{t.batch}, prompt {t.prompt_len}, {t.gen_len} tokens generated\npriced with the "
                        f"{s['time_model']} time model, engine profile {s['engine']}; plain decoding: TPOT "
                        f"{_ms(t.tpot_s)} expected, {_ms(plain_bound)} bound, TTFT {_ms(t.ttft_s)}")
    for col in ("k", "draft steps", "verify", *(f"a = {a:g}: TPOT, speedup [bound]" for a in acceptances)):
        table.add_column(col, justify="right")
    for k in ks:
        cells = []
        for a in acceptances:
            r = next(r for r in rows if r.num_draft_tokens == k and r.acceptance == a)
            star = "*" if r is best[a] else " "
            cells.append(f"{_ms(r.tpot_s)} {r.speedup:.2f}x{star} [{r.speedup_bound:.2f}x]")
        r0 = next(r for r in rows if r.num_draft_tokens == k)
        table.add_row(str(k), _ms(r0.first_draft_s), _ms(r0.first_verify_s), *cells)
    mem = max(r.memory_bytes for r in rows) / 2.0 ** 30
    if tree is None:
        what = ("k: draft tokens per cycle; draft steps, verify: the first cycle's k draft decode steps and the "
                "target's check of k + 1 tokens\na: each draft token's acceptance rate; tokens per cycle "
                "(1 - a^(k+1)) / (1 - a)")
    else:
        what = (f"k: draft steps per cycle (the tree's depth; {tree.topk} candidates a sequence after the first); "
                f"verify: the target's check of {tree.tokens} tree tokens\na: each depth's acceptance rate; tokens "
                "per cycle (1 - a^(d+1)) / (1 - a), d = min(k, tokens - 1) (SGLang's accept length)")
    table.caption = (what + "; * the best k for that a; [bound]: the speedup under the roofline\n"
                     f"memory per GPU {mem:.1f} GiB of {t.memory.usable_bytes / 2.0 ** 30:.1f} GiB usable "
                     "(both models' weights and KV caches); TTFT adds the draft's prefill, "
                     f"{_ms(first.draft.ttft_s)}")
    return table


def _tree_depths(tree, ks: list[int]) -> list[int]:  # noqa: ANN001
    """The draft lengths (depths) of `ks` that can build `tree`; a note on stderr for those left out, and an
    error naming --tree when none can."""
    kept, left = [], []
    for k in ks:
        try:
            tree.check(k)
            kept.append(k)
        except SpecError as exc:
            left.append((k, str(exc).removeprefix("tree: ")))
    if not kept:
        raise SpecError(f"--tree: no draft length in --tokens builds it ({left[0][1]})")
    for k, why in left:
        warn(f"--tokens {k} left out: {why}")
    return kept


def register(app: typer.Typer) -> None:
    @app.command("speculate")
    def speculate_cmd(
        model: Annotated[str, typer.Argument(help="The target model: a built-in name, or a YAML / HF config.json path.", show_default=False)],
        draft: Annotated[str, typer.Option("--draft", "-d", help="The draft model (the target's vocabulary): a built-in name, a YAML / HF config.json path, mtp (the model's own multi-token-prediction layer: DeepSeek-V3, GLM-4.5), eagle3 (an EAGLE-3 head: one decoder layer over the target's features, a 32,000-token draft vocabulary; eagle3:N for another; or the head's config.json path), or early-exit:N (its own first N layers, weights shared).", show_default=False)],
        hardware: Annotated[str, typer.Option("--hardware", "-H", help="Built-in device name, or a YAML path (`--hardware local` for this machine's calibration).")] = "h100-sxm",
        num_tokens: Annotated[str, typer.Option("--tokens", "-k", help="Draft tokens per cycle to compare (a list).")] = "1,2,3,4,5,6,8",
        acceptance: Annotated[str, typer.Option("--acceptance", "-a", help="Per-token acceptance rates to compare, each in [0, 1] (a list; it depends on the data, the draft and the sampling: measure it with llmperf.engine.speculative).")] = "0.6,0.7,0.8,0.9",
        batch: Annotated[int, typer.Option("--batch", "-b", help="Sequences decoded together.")] = 1,
        prompt_len: Annotated[int, typer.Option("--prompt-len", "-p", help="Prompt length in tokens.")] = 512,
        gen_len: Annotated[int, typer.Option("--gen-len", "-g", help="Generated tokens per sequence.")] = 128,
        dtype: Annotated[str | None, typer.Option("--dtype", help="Precision preset of both models (fp16, bf16, fp8, int8, int4; default: each model's native dtype).")] = None,
        tp: Annotated[int, typer.Option("--tp", help="The target's tensor-parallel degree.")] = 1,
        draft_tp: Annotated[int | None, typer.Option("--draft-tp", help="The draft's tensor-parallel degree (default: --tp; 1 as vLLM's draft_tensor_parallel_size=1).")] = None,
        ep: Annotated[int, typer.Option("--ep", help="Expert parallelism within the tp group (MoE targets; divides --tp and the experts): a MoE draft at --tp splits its experts the same way.")] = 1,
        dp_attention: Annotated[bool, typer.Option("--dp-attention", help="Data-parallel attention over the tp group (needs --ep equal to --tp for a MoE model; how MLA models are served): the draft runs the same way.")] = False,
        expert_load: Annotated[str | None, typer.Option("--expert-load", help="A measured router's load per expert (llmperf profile's expert_load.json, or SGLang's logical_count as JSON): experts priced at its popularity, not uniform routing (the target's, and an mtp or early-exit draft's).")] = None,
        eplb: Annotated[int | None, typer.Option("--eplb", help="EPLB (DeepSeek's expert-parallel load balancer) with N redundant experts per MoE layer (0: rearrange only); needs --ep > 1 (the target's, and an mtp or early-exit draft's). Default: experts placed contiguously, as servers without a balancer.")] = None,
        tree: Annotated[str | None, typer.Option("--tree", help="A draft tree, TOPK:TOKENS, as EAGLE-2/3 in SGLang (--speculative-eagle-topk, --speculative-num-draft-tokens): draft steps after the first run TOPK candidates a sequence and the target verifies TOKENS of them; k is the depth (a k whose tree cannot hold TOKENS is left out) and -a each depth's acceptance. Default: a chain of k.")] = None,
        efficiency: Annotated[str | None, typer.Option("--efficiency", help="Time model: roofline, typical, calibrated (--hardware local). Default: the expected time (typical on a GPU, calibrated for --hardware local); the roofline bound is shown beside it.")] = None,
        engine: Annotated[str | None, typer.Option("--engine", help="GPU serving stack's profile (models_spec/engines): compiled (the default) or eager.")] = None,
        output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="table, json or csv.")] = OutputFormat.table,
        output: Annotated[str | None, typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout.")] = None,
    ) -> None:
        """Price speculative decoding: a draft model proposes k tokens, the target checks them in one
        step. For each k and acceptance rate: time per output token, the speedup over plain decoding
        (and under the roofline), the best k; memory of both models. Greedy exactness and measured
        acceptance: llmperf.engine.speculative (docs/model.md, "Speculative decoding")."""
        from llmperf.cli.clitools import write_output
        with refused_cleanly():
            out = check_output(output)
            ks = parse_int_list("--tokens", num_tokens)
            rates = parse_fraction_list("--acceptance", acceptance)
            for name, value in (("--batch", batch), ("--prompt-len", prompt_len), ("--gen-len", gen_len),
                                ("--tp", tp), ("--draft-tp", draft_tp), ("--ep", ep)):
                if value is not None and value < 1:
                    raise SpecError(f"{name}: must be a positive integer, got {value}")
            if draft_tp is not None and tp % draft_tp:
                raise SpecError(f"--draft-tp: {draft_tp} does not divide --tp {tp}")
            from llmperf.analysis.speculative import speculate
            from llmperf.analysis.timemodel import TIME_MODELS, default_efficiency, load_engine, time_model_for
            if efficiency is not None and efficiency not in TIME_MODELS:
                raise SpecError(f"--efficiency: must be one of {', '.join(TIME_MODELS)}, got {efficiency!r}")
            if engine is not None:
                load_engine(engine)

            load = expert_load_from_option(expert_load)  # read once, for every k and acceptance rate
            shape = None
            if tree is not None:
                from llmperf.analysis.speculative import DraftTree
                shape = DraftTree.parse("--tree", tree)
                ks = _tree_depths(shape, list(dict.fromkeys(ks)))

            def priced(hw, compute_dtype):  # noqa: ANN001, ANN202
                return time_model_for(hw, efficiency or default_efficiency(hw), compute_dtype, engine=engine)

            rows = [speculate(model, draft, hardware, num_draft_tokens=k, acceptance=a, batch=batch,
                              prompt_len=prompt_len, gen_len=gen_len, precision=dtype, tp=tp, draft_tp=draft_tp,
                              ep=ep, dp_attention=dp_attention, expert_load=load, eplb=eplb, time_model=priced,
                              tree=shape)
                    for k in dict.fromkeys(ks) for a in dict.fromkeys(rates)]
            if not rows[0].fits:
                r = rows[0]
                warn(f"does not fit: {r.target.model.name} and {r.draft.model.name} need "
                     f"{r.memory_bytes / 2.0 ** 30:.1f} GiB per GPU of {r.target.memory.usable_bytes / 2.0 ** 30:.1f} "
                     "GiB usable")
            if output_format is OutputFormat.table:
                table = speculate_table(rows, list(dict.fromkeys(ks)), list(dict.fromkeys(rates)))
                if out is None:
                    out_console.print(table)
                    return
                from rich.console import Console

                with open(os.devnull, "w") as sink:
                    console = Console(record=True, file=sink, width=150, highlight=False, markup=False)
                    console.print(table)
                text = console.export_text()
            elif output_format is OutputFormat.json:
                from llmperf.outputs import jsonable
                text = json.dumps(jsonable([r.summary() for r in rows]), indent=2) + "\n"
            else:
                import pandas as pd
                text = pd.DataFrame([r.summary() for r in rows]).to_csv(index=False)
            write_output(text, out)
