"""StreamingLLM measured and predicted side by side: the engine's decode steps under StreamingLLM's
eviction (`llmperf.engine.streaming`) and plain decoding's of the same prompts, each beside the time
the analytical model gives that step (`estimate --streaming`: a sliding window of S + W).

    python -m llmperf.measure.streaming reports/streaming/kv-heavy-cpu.yaml --sinks 4 --window 252 -H local

The model (a built-in name or a YAML / HF config.json path) gets random weights (seed 0); every
prompt has the same length, so the batch's sequences share each step's context. Plain decoding runs
`Engine.generate` (contiguous cache); the stream's steps include a long prompt's tokens past S + W,
fed one at a time. Each step is priced at its own context by the time model the device names
(`-H local`: this machine's calibration), the plain model at its full context and the stream at
min(context, S + W). Printed per run: the median |predicted / measured - 1| of the steps, the
medians of the first and last tenth of the steps (plain decoding's steps grow with the context, the
stream's do not), and the evictions' seconds (one token's K/V moved per row between steps, which the
model does not price). Asserts nothing (a benchmark).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmperf.analysis.phase import phase_time_s
from llmperf.analysis.roofline import engine_label, model_time_model, phase_time_model
from llmperf.analysis.timemodel import default_efficiency, time_model_for
from llmperf.analysis.vocabulary import Phase
from llmperf.engine.generate import Engine
from llmperf.engine.model import Transformer
from llmperf.engine.sampling import SamplingParams
from llmperf.engine.streaming import streaming_generate
from llmperf.engine.weights import build_model
from llmperf.errors import SpecError
from llmperf.measure.engine_bench import environment, report_comparison
from llmperf.measure.timers import gc_paused
from llmperf.specs import ModelSpec, Precision, load_hardware, load_model
from llmperf.specs.streaming import streaming


@dataclass(frozen=True, kw_only=True)
class StepSeries:
    """One run's decode steps: the context each attended (keys, per sequence), measured and predicted
    seconds."""

    name: str
    context: list[int]
    measured_s: list[float]
    predicted_s: list[float]
    evict_s: float = 0.0  # the evictions' seconds over the run (the stream)

    def errors(self) -> np.ndarray:
        return np.abs(np.asarray(self.predicted_s) / np.asarray(self.measured_s) - 1.0)

    def tenth(self, last: bool) -> tuple[float, float]:
        """(measured, predicted) medians of the first or last tenth of the steps."""
        n = max(len(self.measured_s) // 10, 1)
        part = slice(-n, None) if last else slice(0, n)
        return statistics.median(self.measured_s[part]), statistics.median(self.predicted_s[part])


def _predicted(spec: ModelSpec, hardware: Any, dtype: str, batch: int, contexts: np.ndarray,
               efficiency: str | None) -> tuple[np.ndarray, str, str]:
    """Each decode step's time at its context (keys per sequence, the new token's included), and the
    names of the time model and engine profile."""
    hw = load_hardware(hardware)
    tm = time_model_for(hw, efficiency or default_efficiency(hw), hw.compute_dtype(dtype), engine=None)
    tm_decode = phase_time_model(model_time_model(tm, spec), "decode")
    from llmperf.analysis.rollup import Conventions, forward_model
    fm = forward_model(spec, Precision.uniform(dtype), Conventions(), 1)
    t = phase_time_s(fm, hw, float(batch), 1.0, contexts.astype(float), compute_dtype=hw.compute_dtype(dtype),
                     time_model=tm_decode)
    return np.asarray(t, dtype=float) + 0.0 * contexts, tm.name, engine_label(tm)


def measure(model: Transformer, hardware: Any, *, sink_tokens: int, window: int, batch: int = 4,
            prompt_len: int = 512, gen_len: int = 512, efficiency: str | None = None,
            seed: int = 0) -> tuple[list[StepSeries], str, str]:
    """Plain and streaming decoding of the same random prompts on `model`, each step priced on
    `hardware`; returns the two series and the time model's and engine profile's names."""
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[model.dtype]
    prompts = torch.randint(0, model.spec.vocab_size, (batch, prompt_len),
                            generator=torch.Generator().manual_seed(seed)).to(model.device)
    engine = Engine(model, cache="contiguous", max_batch=batch, max_seq_len=prompt_len + gen_len)
    engine.generate(prompts[:, :8], SamplingParams(max_new_tokens=4))  # warm-up: packed weights
    with gc_paused():
        engine.generate(prompts, SamplingParams(max_new_tokens=gen_len))
    plain_steps = [s.seconds for s in engine.last_steps if s.phase == Phase.decode]
    with gc_paused():
        res = streaming_generate(model, prompts, sink_tokens=sink_tokens, window=window, max_new_tokens=gen_len)
    plain_ctx = prompt_len + 1 + np.arange(len(plain_steps))  # decode step j reads prompt_len + j keys
    stream_ctx = np.array([min(s.max_position + 1, sink_tokens + window) for s in res.steps])
    plain_pred, tm_name, engine_name = _predicted(model.spec, hardware, dtype, batch, plain_ctx, efficiency)
    stream_spec = streaming(model.spec, sink_tokens, window)
    stream_pred, _, _ = _predicted(stream_spec, hardware, dtype, batch,
                                   np.array([s.max_position + 1 for s in res.steps]), efficiency)
    series = [StepSeries(name="plain", context=plain_ctx.tolist(), measured_s=plain_steps,
                         predicted_s=plain_pred.tolist()),
              StepSeries(name=f"streaming {sink_tokens}+{window}", context=stream_ctx.tolist(),
                         measured_s=[s.seconds for s in res.steps], predicted_s=stream_pred.tolist(),
                         evict_s=res.evict_s)]
    return series, tm_name, engine_name


def lines(series: list[StepSeries], tm_name: str, engine_name: str) -> list[str]:
    out = [f"{'run':>20} {'steps':>6} {'keys':>11}  {'median |pred/meas-1|':>21}  {'first tenth ms (pred)':>22}  "
           f"{'last tenth ms (pred)':>21}  {'eviction s':>12}"]
    for s in series:
        e = s.errors()
        (m0, p0), (m1, p1) = s.tenth(False), s.tenth(True)
        out.append(f"{s.name:>20} {len(s.measured_s):>6} {min(s.context):>5}-{max(s.context):<5}  "
                   f"{float(np.median(e)):>20.1%}  {m0 * 1e3:>9.2f} ({p0 * 1e3:.2f})  "
                   f"{m1 * 1e3:>9.2f} ({p1 * 1e3:.2f})  {s.evict_s:>12.3f}")
    out.append(f"priced with the {tm_name} time model, engine profile {engine_name}; keys: per sequence, "
               "the new token's included")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmperf.measure.streaming", description=__doc__.split("\n")[0])
    p.add_argument("model", help="a built-in name or a YAML / HF config.json path (random weights)")
    p.add_argument("--sinks", type=int, default=4, help="StreamingLLM's sink tokens (default 4)")
    p.add_argument("--window", type=int, default=252, help="recent tokens kept (default 252)")
    p.add_argument("-H", "--hardware", default="local", help="the device that prices the steps (default: local)")
    p.add_argument("--efficiency", default=None, help="time model (default: the device's expected one)")
    p.add_argument("-b", "--batch", type=int, default=4)
    p.add_argument("-p", "--prompt-len", type=int, default=512)
    p.add_argument("-g", "--gen-len", type=int, default=512)
    p.add_argument("--dtype", default="fp32", help="fp32 or bf16")
    p.add_argument("--out", type=Path, default=None, help="write streaming.txt and streaming.json here")
    args = p.parse_args(argv)
    try:
        for name in ("batch", "prompt_len", "gen_len"):
            if getattr(args, name) < 1:
                raise SpecError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
        if args.dtype not in ("fp32", "bf16"):
            raise SpecError(f"--dtype: must be fp32 or bf16, got {args.dtype!r}")
        spec = load_model(args.model)
        streaming(spec, args.sinks, args.window)  # refused before anything is built
        load_hardware(args.hardware)
        model = build_model(spec, seed=0, dtype=args.dtype)
        env = environment()
        settings = dict(model=spec.name, sinks=args.sinks, window=args.window, hardware=args.hardware,
                        efficiency=args.efficiency, batch=args.batch, prompt_len=args.prompt_len,
                        gen_len=args.gen_len, dtype=args.dtype, threads=torch.get_num_threads())
        series, tm_name, engine_name = measure(model, args.hardware, sink_tokens=args.sinks, window=args.window,
                                               batch=args.batch, prompt_len=args.prompt_len, gen_len=args.gen_len,
                                               efficiency=args.efficiency)
    except (SpecError, ValueError) as exc:
        p.exit(2, f"error: {exc}\n")
    report_comparison("StreamingLLM", "streaming", env, settings, lines(series, tm_name, engine_name), args.out,
                      dict(time_model=tm_name, engine=engine_name, series=[asdict(s) for s in series]),
                      indent=None)  # compact: thousands of steps per series
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
