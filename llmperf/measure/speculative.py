"""Speculative decoding measured and predicted side by side: the engine's greedy speculative run
(`llmperf.engine.speculative`) beside plain decoding of the same prompts, and the analytical model
(`llmperf.analysis.speculative`) priced at the acceptance rate the run measured.

    python -m llmperf.measure.speculative reports/profile/llama-style-cpu.yaml --early-exit 2 --tail-scale 0.1
    llmperf bench speculative MODEL --draft DRAFT_MODEL -H local -k 1,2,4 -b 1 -p 64 -g 64 --out DIR

The model (a built-in name or a YAML / HF config.json path) gets random weights (seed 0), the draft
too (seed 1), or is the target's first layers (`--early-exit N`, the same tensors; `--tail-scale`
shrinks the later layers' updates so the exit agrees more often). For each k, each
repeat runs plain decoding (`Engine.generate`, contiguous cache) and the speculative run alternately,
checks that their tokens are the same, and records: the measured acceptance rate (its maximum-
likelihood estimate) and tokens per cycle, against the model's expected tokens at that rate; the
draft's and the verify's seconds over the run, the decode time (the run's wall time after both
prefills: forwards and the loop's own work) and the TPOT, against the prediction; the speedup over
plain decoding, measured and predicted. Figures are medians over `--reps` with [min, max] (after a
warm-up run per k); every figure names the time model and engine profile that priced it: llmperf's own
engine as run (`own_engine_time_model`: the calibration where `-H` has one; on a GPU the eager profile).
`--reprice DIR` prices a saved run again on another `-H` / `--efficiency`. Asserts nothing (a benchmark).
Random weights accept few draft tokens; the comparison is of the time at the rate measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from llmperf.analysis.speculative import expected_tokens, speculate
from llmperf.analysis.vocabulary import Phase
from llmperf.engine.generate import Engine
from llmperf.engine.model import Transformer
from llmperf.engine.sampling import SamplingParams
from llmperf.engine.speculative import SpeculativeResult, early_exit_draft, speculative_generate
from llmperf.engine.weights import build_model
from llmperf.errors import SpecError
from llmperf.measure.device import describe
from llmperf.measure.engine_bench import environment, report_comparison
from llmperf.measure.profile.predict import own_engine_time_model
from llmperf.measure.timers import gc_paused
from llmperf.specs import load_hardware, load_model


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One k: medians over the repeats (and the TPOTs' [min, max]), measured beside predicted."""

    num_draft_tokens: int
    exact: bool  # every repeat's tokens equal plain decoding's
    acceptance: float  # measured (maximum likelihood), the prediction's input
    tokens_per_cycle: float  # measured
    tokens_per_cycle_model: float  # expected at the measured acceptance
    draft_s: float
    draft_pred_s: float
    verify_s: float
    verify_pred_s: float
    decode_s: float
    decode_pred_s: float
    tpot_s: float
    tpot_min_s: float
    tpot_max_s: float
    tpot_pred_s: float
    tpot_plain_s: float
    tpot_plain_pred_s: float
    speedup: float
    speedup_pred: float
    time_model: str
    engine: str

    def ratio(self, name: str) -> float:
        """predicted / measured of `name` (draft_s, verify_s, decode_s, tpot_s, tpot_plain_s, speedup)."""
        pred = getattr(self, name[:-2] + "_pred_s" if name.endswith("_s") else name + "_pred")
        meas = getattr(self, name)
        return pred / meas if meas else float("nan")


def _plain(model: Transformer, prompts: torch.Tensor, gen_len: int) -> tuple[float, list[list[int]]]:
    """(TPOT: the decode steps' seconds over gen_len - 1, tokens) of plain greedy decoding."""
    B, T = prompts.shape
    engine = Engine(model, cache="contiguous", max_batch=B, max_seq_len=T + gen_len)
    with gc_paused():
        out = engine.generate(prompts, SamplingParams(max_new_tokens=gen_len))
    decode = sum(s.seconds for s in engine.last_steps if s.phase == Phase.decode)
    return decode / max(gen_len - 1, 1), [o.tokens for o in out]


def _speculative(target: Transformer, draft: Transformer, prompts: torch.Tensor, k: int,
                 gen_len: int) -> SpeculativeResult:
    with gc_paused():
        return speculative_generate(target, draft, prompts, num_draft_tokens=k, max_new_tokens=gen_len)


def compare(target: Transformer, draft: Transformer, hardware: Any, *, ks: tuple[int, ...] = (1, 2, 4),
            batch: int = 1, prompt_len: int = 64, gen_len: int = 64, reps: int = 3, efficiency: str | None = None,
            seed: int = 0, draft_ref: Any = None, backend: str = "sdpa") -> list[Comparison]:
    """Measure each k on `target` with `draft` (random prompts, seeded) and price it on `hardware` (a
    name, path or spec) at the measured acceptance, as llmperf's engine runs (`price`).
    `draft_ref`: what `speculate` is told drafts (default `draft.spec`; "early-exit:N" for an early exit,
    whose weights are the target's); `backend`: the attention backend the models run (its calibrated
    overheads price them)."""
    hw = load_hardware(hardware)
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[target.dtype]
    prompts = torch.randint(0, target.spec.vocab_size, (batch, prompt_len),
                            generator=torch.Generator().manual_seed(seed)).to(target.device)
    _plain(target, prompts, gen_len)  # warm-up: packed weights, allocator, each step's kernels
    out = []
    for k in ks:
        _speculative(target, draft, prompts, k, gen_len)  # warm-up: this k's verify shapes (Triton compiles them)
        plain_tpot, spec_runs, exact = [], [], True
        for _ in range(reps):
            tpot, tokens = _plain(target, prompts, gen_len)
            res = _speculative(target, draft, prompts, k, gen_len)
            plain_tpot.append(tpot)
            spec_runs.append(res)
            exact &= res.tokens == tokens
        measured = _measured(k, exact, spec_runs, plain_tpot, gen_len)
        out.append(price(measured, target.spec, draft.spec if draft_ref is None else draft_ref, hw, batch=batch,
                         prompt_len=prompt_len, gen_len=gen_len, dtype=dtype, efficiency=efficiency,
                         backend=backend))
    return out


def _measured(k: int, exact: bool, runs: list[SpeculativeResult], plain_tpot: list[float],
              gen_len: int) -> Comparison:
    """The measured side of one k (medians over the repeats); the predictions NaN until `price`."""
    med, nan = statistics.median, float("nan")
    steps = max(gen_len - 1, 1)
    tpots = [(r.wall_s - r.prefill_s) / steps for r in runs]
    a = med(r.acceptance_rate for r in runs)
    return Comparison(
        num_draft_tokens=k, exact=exact, acceptance=a, tokens_per_cycle=med(r.tokens_per_cycle for r in runs),
        tokens_per_cycle_model=expected_tokens(a, k), draft_s=med(r.draft_s for r in runs), draft_pred_s=nan,
        verify_s=med(r.verify_s for r in runs), verify_pred_s=nan, decode_s=med(r.wall_s - r.prefill_s for r in runs),
        decode_pred_s=nan, tpot_s=med(tpots), tpot_min_s=min(tpots), tpot_max_s=max(tpots), tpot_pred_s=nan,
        tpot_plain_s=med(plain_tpot), tpot_plain_pred_s=nan, speedup=med(plain_tpot) / med(tpots),
        speedup_pred=nan, time_model="", engine="")


def price(row: Comparison, target: Any, draft: Any, hardware: Any, *, batch: int, prompt_len: int, gen_len: int,
          dtype: str, efficiency: str | None = None, backend: str = "sdpa") -> Comparison:
    """`row` with its predictions: `speculate` at the row's measured acceptance, priced as llmperf's
    own engine runs on `hardware` (`own_engine_time_model`: its calibration where it has one, else
    the device's expected time; on a GPU the eager engine profile). `target`, `draft`: specs (or
    names, paths; the draft also "early-exit:N"). A measured run can be priced again this way
    (`--reprice`): nothing measured changes."""
    hw = load_hardware(hardware)
    est = speculate(load_model(target) if isinstance(target, (str, Path)) else target, draft, hw,
                    num_draft_tokens=row.num_draft_tokens, acceptance=row.acceptance, batch=batch,
                    prompt_len=prompt_len, gen_len=gen_len, precision=dtype,
                    time_model=lambda h, d: own_engine_time_model(h, efficiency, d, backend))
    s = est.summary()
    return replace(row, draft_pred_s=est.draft_total_s, verify_pred_s=est.verify_total_s, decode_pred_s=est.decode_s,
                   tpot_pred_s=est.tpot_s, tpot_plain_pred_s=est.target.tpot_s, speedup_pred=est.speedup,
                   time_model=s["time_model"], engine=s["engine"])


def lines(rows: list[Comparison]) -> list[str]:
    """The table: one line per k, measured / predicted / predicted over measured."""
    out = [f"{'k':>2} {'exact':>5} {'accept':>6} {'tok/cycle (model)':>17}  {'draft s (pred, x)':>24}  "
           f"{'verify s (pred, x)':>24}  {'TPOT ms [min, max] (pred, x)':>36}  {'speedup (pred)':>14}"]
    for r in rows:
        out.append(
            f"{r.num_draft_tokens:>2} {'yes' if r.exact else 'NO':>5} {r.acceptance:>6.3f} "
            f"{r.tokens_per_cycle:>7.3f} ({r.tokens_per_cycle_model:.3f})  "
            f"{r.draft_s:>8.3f} ({r.draft_pred_s:.3f}, {r.ratio('draft_s'):.2f}x)  "
            f"{r.verify_s:>8.3f} ({r.verify_pred_s:.3f}, {r.ratio('verify_s'):.2f}x)  "
            f"{r.tpot_s * 1e3:>7.2f} [{r.tpot_min_s * 1e3:.2f}, {r.tpot_max_s * 1e3:.2f}] "
            f"({r.tpot_pred_s * 1e3:.2f}, {r.ratio('tpot_s'):.2f}x)  {r.speedup:>5.2f}x ({r.speedup_pred:.2f}x)")
    if rows:
        r = rows[0]
        out.append(f"plain decoding TPOT {r.tpot_plain_s * 1e3:.2f} ms measured, {r.tpot_plain_pred_s * 1e3:.2f} ms "
                   f"predicted ({r.ratio('tpot_plain_s'):.2f}x); priced with the {r.time_model} time model, "
                   f"engine profile {r.engine}; x: predicted / measured")
    return out


def scale_tail(model: Transformer, first: int, scale: float) -> None:
    """Multiply layers `first` onward's output projections (attention's o, the FFN's down) by `scale`,
    in place: their updates to the residual stream shrink, so an exit after `first` layers predicts
    the target's token more often (a stand-in for a trained model's refining last layers)."""
    for layer in model.layers[first:]:
        for name in ("o_weight", "down_weight"):
            w = getattr(layer, name, None)
            if w is None:
                raise SpecError(f"--tail-scale: {model.spec.name}'s layers have no {name} (a plain Llama-style "
                                "layer is needed)")
            w.mul_(scale)


def _reprice(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], list[Comparison]]:
    """`--reprice DIR`: the run in DIR/speculative.json priced again on `--hardware` / `--efficiency`
    (its measured figures as they are). The model (and a separate draft) must be the run's."""
    path = args.reprice / "speculative.json"
    try:
        data = json.loads(path.read_text())
        st, env, rows = data["settings"], data["environment"], [Comparison(**r) for r in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"--reprice: {path}: not a speculative.json this benchmark wrote ({exc})") from None
    spec = load_model(args.model)
    if spec.name != st["model"]:
        raise SpecError(f"--reprice: {args.reprice} measured {st['model']!r}, not {spec.name!r}")
    if st.get("early_exit") is not None:
        draft: Any = f"early-exit:{st['early_exit']}"
    elif args.draft is None or load_model(args.draft).name != st["draft"]:
        raise SpecError(f"--reprice: {args.reprice} measured the draft {st['draft']!r}: name its config with --draft")
    else:
        draft = load_model(args.draft)
    hw = load_hardware(args.hardware)
    rows = [price(r, spec, draft, hw, batch=st["batch"], prompt_len=st["prompt_len"], gen_len=st["gen_len"],
                  dtype=st["dtype"], efficiency=args.efficiency, backend=st.get("backend", "sdpa")) for r in rows]
    settings = dict(st, hardware=args.hardware, efficiency=args.efficiency, repriced_from=str(args.reprice))
    return env, settings, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmperf.measure.speculative", description=__doc__.split("\n")[0])
    p.add_argument("model", help="the target: a built-in name or a YAML / HF config.json path (random weights)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--draft", help="a draft model of the same vocabulary (random weights, seed 1)")
    g.add_argument("--early-exit", type=int, help="the draft is the target's first N layers (the same tensors)")
    p.add_argument("--tail-scale", type=float, default=None,
                   help="with --early-exit: multiply the later layers' output projections (o, down) by this, so "
                        "they refine the early exit's prediction as a trained model's last layers do and the "
                        "draft is accepted more often (random weights: every layer rewrites it)")
    p.add_argument("-H", "--hardware", default="local", help="the device that prices the run (default: local, "
                   "this machine's calibration)")
    p.add_argument("--efficiency", default=None, help="time model (default: the hardware's calibration where it "
                   "has one, else the device's expected time; on a GPU with the eager engine profile)")
    p.add_argument("-k", "--tokens", default="1,2,4", help="draft tokens per cycle (a list)")
    p.add_argument("-b", "--batch", type=int, default=1)
    p.add_argument("-p", "--prompt-len", type=int, default=64)
    p.add_argument("-g", "--gen-len", type=int, default=64)
    p.add_argument("--dtype", default=None, help="fp32 or bf16 (default: fp32)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--backend", default="sdpa", help="attention backend: sdpa, naive or triton (default: sdpa)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--reprice", type=Path, default=None, metavar="DIR",
                   help="measure nothing: price the run saved in DIR again on --hardware / --efficiency")
    p.add_argument("--out", type=Path, default=None, help="write speculative.txt and speculative.json here")
    args = p.parse_args(argv)
    if args.reprice is None and args.draft is None and args.early_exit is None:
        p.error("one of the arguments --draft --early-exit is required")
    try:
        ks = tuple(int(x) for x in args.tokens.split(","))
    except ValueError:
        p.error(f"--tokens: {args.tokens!r} is not a comma-separated list of integers")
    for name in ("batch", "prompt_len", "gen_len", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
    dtype = args.dtype or "fp32"
    try:
        if args.reprice is not None:
            env, settings, rows = _reprice(args)
        else:
            env, settings, rows = _run(args, ks, dtype)
    except (SpecError, ValueError) as exc:
        p.exit(2, f"error: {exc}\n")
    when = f"measured {env['date'][:10]}, priced {time.strftime('%Y-%m-%d')}" if args.reprice is not None else None
    report_comparison("speculative decoding", "speculative", env, settings, lines(rows), args.out,
                      dict(rows=[asdict(r) for r in rows]), when=when)
    return 0


def _run(args: argparse.Namespace, ks: tuple[int, ...], dtype: str) -> tuple[dict[str, Any], dict[str, Any],
                                                                             list[Comparison]]:
    if dtype not in ("fp32", "bf16"):
        raise SpecError(f"--dtype: must be fp32 or bf16, got {dtype!r}")
    if args.device not in ("cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        raise SpecError(f"--device: must be cpu or cuda (with a CUDA GPU present), got {args.device!r}")
    spec = load_model(args.model)
    load_hardware(args.hardware)  # before the models are built
    target = build_model(spec, seed=0, dtype=dtype, device=args.device, attention=args.backend)
    if args.tail_scale is not None:
        if args.early_exit is None or not 0.0 <= args.tail_scale <= 1.0:
            raise SpecError(f"--tail-scale: needs --early-exit and a value in [0, 1], got {args.tail_scale}")
        scale_tail(target, args.early_exit, args.tail_scale)
    draft = (early_exit_draft(target, args.early_exit) if args.early_exit is not None
             else build_model(load_model(args.draft), seed=1, dtype=dtype, device=args.device,
                              attention=args.backend))
    env = environment()
    if args.device == "cuda":
        env["gpu"] = describe("cuda")
    settings = dict(model=spec.name, draft=draft.spec.name, early_exit=args.early_exit,
                    tail_scale=args.tail_scale, hardware=args.hardware,
                    efficiency=args.efficiency, tokens=list(ks), batch=args.batch, prompt_len=args.prompt_len,
                    gen_len=args.gen_len, dtype=dtype, device=args.device, backend=args.backend, reps=args.reps,
                    threads=torch.get_num_threads())
    rows = compare(target, draft, args.hardware, ks=ks, batch=args.batch, prompt_len=args.prompt_len,
                   gen_len=args.gen_len, reps=args.reps, efficiency=args.efficiency,
                   draft_ref=None if args.early_exit is None else f"early-exit:{args.early_exit}",
                   backend=args.backend)
    return env, settings, rows


if __name__ == "__main__":
    raise SystemExit(main())
