"""Tensor parallelism measured and predicted side by side: the engine run on N ranks
(`llmperf.engine.tensor_parallel`: heads, FFN columns and vocabulary sharded, two all-reduces a layer, the
embedding's all-reduce and the logits' gather a step; gloo between CPU processes, NCCL between GPUs) beside
one rank, and the analytical model's `--tp N` price of each step.

    python -m llmperf.measure.tensor_parallel MODEL --tp 1,2 -H CAL -b 1,8 -p 64 -g 32 --threads-per-rank 1
    llmperf bench tensor-parallel MODEL --tp 1,2 -H CAL --out DIR

The model (a built-in name or a YAML / HF config.json path) gets random weights (seed 0), the same on
every rank. Each (tp, batch) runs greedy generation of the same random prompts, `--reps` times after a
warm-up, each rank in its own process with `--threads-per-rank` threads (default: the cores over the
largest tp, so every run uses the same threads a rank): tp 1 is the plain engine in one such process.
Recorded: the tokens (checked equal to tp 1's), the prefill and the decode steps, and each decode step's
seconds in its collectives; each step is priced at its context with `forward_model(..., tp)` (its
collectives included) under the time model llmperf's engine is priced with (`own_engine_time_model`: the
`-H` calibration where it has one) and under the roofline. A sharded rank runs its operators one by one
(no one-call decode layer), and is priced so; `--replicated-vocab` keeps the embedding and LM head whole
on every rank (the engine before the vocabulary split), priced whole. Printed: per (tp, batch) the median
decode step measured and predicted, the collectives' share measured and predicted, and the speedup over
tp 1, both ways.

A CPU's ranks share its DRAM and its last-level cache, where the model gives every rank a device of its
own: a `-H` calibration taken with `--threads` equal to the threads a rank runs prices one rank alone.
Asserts nothing (a benchmark).
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, Precision, load_hardware, load_model


@dataclass(frozen=True, kw_only=True)
class TPRow:
    """One (tp, batch): medians over the repeats, measured beside predicted (NaN where not measured)."""

    tp: int
    batch: int
    prompt_len: int
    gen_len: int
    exact: bool  # every repeat's tokens equal tp 1's (True for tp 1 itself)
    prefill_s: float
    prefill_pred_s: float
    decode_step_s: float  # the median decode step
    decode_step_min_s: float  # the repeats' medians: min and max
    decode_step_max_s: float
    decode_step_pred_s: float
    decode_step_bound_s: float  # the roofline's
    allreduce_s: float  # a decode step's seconds in its collectives (median; 0 for tp 1)
    allreduce_pred_s: float
    speedup: float = float("nan")  # tp 1's decode step over this one's (NaN without a tp 1 row)
    speedup_pred: float = float("nan")
    time_model: str = ""
    engine: str = ""
    vocab_parallel: bool = True  # tp > 1 split the vocabulary (embedding, LM head), else kept them whole

    def ratio(self, name: str) -> float:
        """predicted / measured of `name` (prefill_s, decode_step_s, allreduce_s, speedup)."""
        pred = getattr(self, name[:-2] + "_pred_s" if name.endswith("_s") else name + "_pred")
        meas = getattr(self, name)
        return pred / meas if meas else float("nan")


def _steps_of(engine: Any, prompt_len: int) -> list[tuple[str, int, int, int, float]]:
    """(phase, batch, q_len, kv_len, seconds) of the engine's last run: one prefill of every prompt, then
    lockstep decode steps (equal prompts, no preemption: what these runs are)."""
    out, decoded = [], 0
    for s in engine.last_steps:
        if s.phase.value == "prefill":
            out.append(("prefill", s.batch, prompt_len, prompt_len, s.seconds))
        else:
            decoded += 1
            out.append(("decode", s.batch, 1, prompt_len + decoded, s.seconds))
    return out


def _plain_worker(rank: int, world: int, spec: ModelSpec, prompts: list[list[int]], gen_len: int, seed: int,
                  dtype: str, device: str, attention: str, reps: int) -> dict[str, Any]:  # pragma: no cover
    """tp 1 in a process of its own (the same threads as a rank): the plain engine, warm, `reps` runs."""
    import torch

    from llmperf.engine.generate import Engine
    from llmperf.engine.sampling import SamplingParams
    from llmperf.engine.weights import build_model
    from llmperf.measure.timers import gc_paused

    model = build_model(spec, seed=seed, dtype=dtype, device=device, attention=attention)
    tokens = torch.tensor(prompts, device=model.device)
    B, T = tokens.shape
    engine = Engine(model, cache="contiguous", max_batch=B, max_seq_len=T + gen_len)
    engine.generate(tokens, SamplingParams(max_new_tokens=gen_len))  # warm-up
    runs = []
    for _ in range(reps):
        with gc_paused():
            out = engine.generate(tokens, SamplingParams(max_new_tokens=gen_len))
        runs.append(dict(tokens=[o.tokens for o in out], steps=_steps_of(engine, T), allreduce_s=None))
    return dict(runs=runs)


def measure(spec: ModelSpec, tp: int, *, batch: int, prompt_len: int, gen_len: int, reps: int = 3, seed: int = 0,
            dtype: str = "fp32", device: str = "cpu", attention: str = "sdpa",
            threads_per_rank: int | None = None, vocab_parallel: bool = True) -> list[dict[str, Any]]:
    """`reps` warm runs of greedy generation at `tp` ranks: each run's tokens, steps (phase, batch,
    q_len, kv_len, seconds) and, for tp > 1, each step's seconds in its collectives."""
    import torch

    from llmperf.engine.tensor_parallel import run_ranks, tp_generate

    prompts = torch.randint(0, spec.vocab_size, (batch, prompt_len),
                            generator=torch.Generator().manual_seed(seed)).tolist()
    if tp == 1:
        res = run_ranks(1, _plain_worker, spec, prompts, gen_len, seed, dtype, device, attention, reps,
                        backend="nccl" if device == "cuda" else "gloo", threads_per_rank=threads_per_rank)
        return res[0]["runs"]
    runs = []
    for _ in range(reps):  # tp_generate warms up before its timed run
        r = tp_generate(spec, prompts, tp, max_new_tokens=gen_len, seed=seed, dtype=dtype, device=device,
                        attention=attention, threads_per_rank=threads_per_rank, record=True,
                        vocab_parallel=vocab_parallel)
        runs.append(dict(tokens=r.tokens, steps=list(r.steps), allreduce_s=list(r.allreduce_s or [])))
    return runs


def predicted(spec: ModelSpec, tp: int, hardware: Any, steps: list[tuple[str, int, int, int, float]], *,
              dtype: str, efficiency: str | None = None, backend: str = "sdpa",
              vocab_parallel: bool = True) -> dict[str, Any]:
    """Each step's price at `tp`, expected and roofline (`Predictor.step`, as `profile` prices an
    engine step), and a decode step's seconds in its collectives, with the names of the time model and
    engine profile. `forward_model(..., tp)` as it stands: the vocabulary split, `embed_allreduce` and
    `logits_gather` included; with `vocab_parallel=False` the embedding, final norm and LM head are
    priced whole instead, as an engine that replicates them runs them (every rank computes every logit)."""
    from llmperf.analysis.rollup import Conventions, forward_model
    from llmperf.analysis.roofline import engine_label
    from llmperf.measure.profile.predict import Predictor, own_engine_time_model

    hw = load_hardware(hardware)
    cdt = hw.compute_dtype(dtype)
    tm = own_engine_time_model(hw, efficiency, cdt, backend)
    if hasattr(tm, "for_model"):
        tm = tm.for_model(spec, one_call=None if tp == 1 else False)  # a shard runs no one-call decode
    prec, conv = Precision.uniform(dtype), Conventions()
    sharded = Predictor(fm=forward_model(spec, prec, conv, tp), hardware=hw, compute_dtype=cdt, calibrated=tm)
    whole = Predictor(fm=forward_model(spec, prec, conv, 1), hardware=hw, compute_dtype=cdt, calibrated=tm)

    def ends(pr: Predictor, b: int, q: int, kv: int) -> np.ndarray:
        ops = pr.fm.head_ops(b, q, kv) + pr.fm.tail_ops(b, q, kv)
        return np.sum([pr.times(c, b, q) for c in ops], axis=0)

    replicated = tp > 1 and not vocab_parallel
    exp, bound = [], []
    for _phase, b, q, kv, _ in steps:
        roof, cal = np.asarray(sharded.step(b, q, kv))
        if replicated:
            roof, cal = np.asarray((roof, cal)) - ends(sharded, b, q, kv) + ends(whole, b, q, kv)
        exp.append(float(cal if tm.name != "roofline" else roof))
        bound.append(float(roof))
    comm = 0.0
    decodes = [s for s in steps if s[0] == "decode"]
    if tp > 1 and decodes:
        _, b, q, kv, _ = decodes[len(decodes) // 2]
        k = 0 if tm.name == "roofline" else 1
        fm = sharded.fm
        parts = [(count, ops) for _kind, count, ops in fm.group_ops(b, q, kv)]
        if not replicated:  # the vocabulary's two collectives, once a step
            parts.append((1, fm.head_ops(b, q, kv) + fm.tail_ops(b, q, kv)))
        for count, ops in parts:
            comm += count * sum(sharded.times(c, b, q)[k] for c in ops if c.kind == "comm")
    return dict(expected=exp, bound=bound, allreduce_s=comm, time_model=tm.name, engine=engine_label(tm))


def compare(spec: ModelSpec, hardware: Any, *, tps: tuple[int, ...] = (1, 2), batches: tuple[int, ...] = (1, 8),
            prompt_len: int = 64, gen_len: int = 32, reps: int = 3, dtype: str = "fp32", device: str = "cpu",
            attention: str = "sdpa", threads_per_rank: int | None = None, efficiency: str | None = None,
            seed: int = 0, vocab_parallel: bool = True) -> list[TPRow]:
    """Measure and price every (tp, batch); a tp 1 row first where asked, the others' speedups over it."""
    med = statistics.median
    rows: list[TPRow] = []
    for batch in batches:
        base: TPRow | None = None
        base_tokens = None
        for tp in tps:
            runs = measure(spec, tp, batch=batch, prompt_len=prompt_len, gen_len=gen_len, reps=reps, seed=seed,
                           dtype=dtype, device=device, attention=attention, threads_per_rank=threads_per_rank,
                           vocab_parallel=vocab_parallel)
            steps = runs[0]["steps"]
            pred = predicted(spec, tp, hardware, steps, dtype=dtype, efficiency=efficiency, backend=attention,
                             vocab_parallel=vocab_parallel)
            dec = [i for i, s in enumerate(steps) if s[0] == "decode"]
            pre = [i for i, s in enumerate(steps) if s[0] == "prefill"]
            per_run = [med([r["steps"][i][4] for i in dec]) for r in runs]
            reduce = [med([r["allreduce_s"][i] for i in dec]) for r in runs if r["allreduce_s"]]
            if base_tokens is None and tp == 1:
                base_tokens = runs[0]["tokens"]
            row = TPRow(tp=tp, batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                        exact=base_tokens is None or all(r["tokens"] == base_tokens for r in runs),
                        prefill_s=med([sum(r["steps"][i][4] for i in pre) for r in runs]),
                        prefill_pred_s=sum(pred["expected"][i] for i in pre),
                        decode_step_s=med(per_run), decode_step_min_s=min(per_run), decode_step_max_s=max(per_run),
                        decode_step_pred_s=med([pred["expected"][i] for i in dec]),
                        decode_step_bound_s=med([pred["bound"][i] for i in dec]),
                        allreduce_s=med(reduce) if reduce else 0.0, allreduce_pred_s=pred["allreduce_s"],
                        time_model=pred["time_model"], engine=pred["engine"], vocab_parallel=vocab_parallel)
            if tp == 1:
                base = row
            elif base is not None:
                row = _with_speedup(row, base)
            rows.append(row)
    return rows


def _with_speedup(row: TPRow, base: TPRow) -> TPRow:
    from dataclasses import replace
    return replace(row, speedup=base.decode_step_s / row.decode_step_s,
                   speedup_pred=base.decode_step_pred_s / row.decode_step_pred_s)


def lines(rows: list[TPRow]) -> list[str]:
    """The table: one line per (tp, batch), measured (predicted, predicted / measured)."""
    out = [f"{'tp':>2} {'B':>3} {'exact':>5}  {'decode step ms [min, max] (pred, x) [bound]':>44}  "
           f"{'collectives ms a step (pred, x)':>30}  {'prefill ms (pred, x)':>24}  {'speedup (pred)':>14}"]
    for r in rows:
        ar = (f"{r.allreduce_s * 1e3:>8.3f} ({r.allreduce_pred_s * 1e3:.3f}, {r.ratio('allreduce_s'):.2f}x)"
              if r.tp > 1 else f"{'-':>8}")
        sp = f"{r.speedup:>5.2f}x ({r.speedup_pred:.2f}x)" if r.tp > 1 and np.isfinite(r.speedup) else "-"
        out.append(f"{r.tp:>2} {r.batch:>3} {'yes' if r.exact else 'NO':>5}  "
                   f"{r.decode_step_s * 1e3:>7.2f} [{r.decode_step_min_s * 1e3:.2f}, {r.decode_step_max_s * 1e3:.2f}] "
                   f"({r.decode_step_pred_s * 1e3:.2f}, {r.ratio('decode_step_s'):.2f}x) "
                   f"[{r.decode_step_bound_s * 1e3:.2f}]  {ar:>30}  "
                   f"{r.prefill_s * 1e3:>8.2f} ({r.prefill_pred_s * 1e3:.2f}, {r.ratio('prefill_s'):.2f}x)  {sp:>14}")
    if rows:
        vocab = "split" if rows[0].vocab_parallel else "whole on every rank"
        out.append(f"priced with the {rows[0].time_model} time model, engine profile {rows[0].engine} "
                   f"([bound]: the roofline); x: predicted / measured; vocabulary {vocab} at tp > 1")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmperf.measure.tensor_parallel", description=__doc__.split("\n")[0])
    p.add_argument("model", help="a built-in name or a YAML / HF config.json path (random weights)")
    p.add_argument("--tp", default="1,2", help="tensor-parallel ranks (a list; default 1,2)")
    p.add_argument("-H", "--hardware", default="local", help="the device that prices one rank (default: local, "
                   "this machine's calibration; take it with --threads equal to --threads-per-rank)")
    p.add_argument("--efficiency", default=None, help="time model (default: the calibration where -H has one)")
    p.add_argument("-b", "--batch", default="1,8", help="batch sizes (a list)")
    p.add_argument("-p", "--prompt-len", type=int, default=64)
    p.add_argument("-g", "--gen-len", type=int, default=32)
    p.add_argument("--dtype", default="fp32", help="fp32 or bf16 (default: fp32)")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, a GPU a rank) (default: cpu)")
    p.add_argument("--backend", default="sdpa", help="attention backend: sdpa, naive or triton (default: sdpa)")
    p.add_argument("--threads-per-rank", type=int, default=None,
                   help="CPU threads each rank (and tp 1) runs (default: the cores over the largest tp)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--replicated-vocab", action="store_true",
                   help="keep the embedding and the LM head whole on every rank (default: split by vocabulary)")
    p.add_argument("--out", type=Path, default=None, help="write tensor_parallel.txt and .json here")
    args = p.parse_args(argv)
    lists = {}
    for name in ("tp", "batch"):
        raw = getattr(args, name)
        try:
            lists[name] = tuple(int(x) for x in raw.split(","))
        except ValueError:
            p.error(f"--{name}: {raw!r} is not a comma-separated list of integers")
        if any(v < 1 for v in lists[name]):
            p.error(f"--{name}: every value must be a positive integer, got {raw!r}")
    for name in ("prompt_len", "gen_len", "reps", "threads_per_rank"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')}: must be a positive integer, got {v}")
    tps = tuple(sorted(set(lists["tp"])))
    threads = args.threads_per_rank or max(1, (os.cpu_count() or 1) // max(tps))
    try:
        if args.dtype not in ("fp32", "bf16"):
            raise SpecError(f"--dtype: must be fp32 or bf16, got {args.dtype!r}")
        if args.device not in ("cpu", "cuda"):
            raise SpecError(f"--device: must be cpu or cuda, got {args.device!r}")
        if args.device == "cuda":
            import torch
            if torch.cuda.device_count() < max(tps):
                raise SpecError(f"--tp {max(tps)}: needs as many CUDA GPUs, found {torch.cuda.device_count()}")
        spec = load_model(args.model)
        hw = load_hardware(args.hardware)
        if max(tps) > 1 and not hw.interconnect_gbps:
            raise SpecError(f"--hardware {args.hardware}: no all-reduce measured (interconnect_gbps 0), so a tp > 1 "
                            "run's all-reduces would be priced free: calibrate with --allreduce")
        from llmperf.engine.tensor_parallel import shard_spec
        for tp in tps:
            shard_spec(spec, tp)  # refusals before any process starts
        from llmperf.measure.engine_bench import environment, report_comparison
        env = environment()
        settings = dict(model=spec.name, tp=list(tps), batch=list(lists["batch"]), prompt_len=args.prompt_len,
                        gen_len=args.gen_len, dtype=args.dtype, device=args.device, backend=args.backend,
                        threads_per_rank=threads, reps=args.reps, hardware=args.hardware, efficiency=args.efficiency,
                        vocab_parallel=not args.replicated_vocab)
        rows = compare(spec, args.hardware, tps=tps, batches=lists["batch"], prompt_len=args.prompt_len,
                       gen_len=args.gen_len, reps=args.reps, dtype=args.dtype, device=args.device,
                       attention=args.backend, threads_per_rank=threads, efficiency=args.efficiency,
                       vocab_parallel=not args.replicated_vocab)
    except (SpecError, ValueError) as exc:
        p.exit(2, f"error: {exc}\n")
    report_comparison("tensor parallelism", "tensor_parallel", env, settings, lines(rows), args.out,
                      dict(rows=[asdict(r) for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
