"""How fast is the engine's generation loop? Greedy decoding against Hugging Face `generate()`.

    python -m llmperf.engine.bench                       # ~200M-parameter Llama-style model, fp32, batch 1 and 8
    python -m llmperf.engine.bench --batch 1 4 16 --new-tokens 128 --threads 2 --dtype bf16 --cache paged

Both sides run the same weights (random, seeded), dtype, thread count (`torch.set_num_threads`) and
prompts, greedy, for exactly `--new-tokens` tokens (no EOS), measured side by side in one process:
one warm-up run each, then `--reps` alternating repetitions; the figure is the median. Tokens/s
counts generated tokens (batch x new tokens) over the whole `generate()` call, prefill included, so
both sides pay for the same work. The ratio is ours / transformers (> 1: the engine is faster).
The generated tokens are compared too (they must be equal in fp32).

Prints one table row per batch size; `run_benchmark()` returns the rows for notebooks and reports.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from llmperf.engine.generate import Engine
from llmperf.engine.sampling import SamplingParams
from llmperf.engine.weights import build_model, hf_config, to_hf_state_dict
from llmperf.specs import ModelSpec, load_model


def bench_spec(hidden: int = 1024, layers: int = 12, vocab: int = 32000) -> ModelSpec:
    """A Llama-3-style model scaled to ~200M parameters: GQA (16 query / 4 KV heads), SwiGLU."""
    return load_model("llama-3.1-8b").scaled(
        name=f"llama-bench-{hidden}x{layers}", hidden_size=hidden, num_layers=layers, num_heads=16,
        num_kv_heads=4, ffn_size=int(hidden * 2.75), vocab_size=vocab, max_positions=4096, rotary_dim=None)


@dataclass(frozen=True, kw_only=True)
class BenchRow:
    model: str
    params_m: float
    dtype: str
    threads: int
    cache: str
    batch: int
    prompt_len: int
    new_tokens: int
    ours_tokens_per_s: float
    hf_tokens_per_s: float
    same_tokens: bool

    @property
    def ratio(self) -> float:
        return self.ours_tokens_per_s / self.hf_tokens_per_s


def _hf_model(model, spec: ModelSpec, dtype: torch.dtype):
    import transformers

    cfg = transformers.AutoConfig.for_model(**hf_config(spec))
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=False)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def run_benchmark(*, batches: tuple[int, ...] = (1, 8), prompt_len: int = 32, new_tokens: int = 64, reps: int = 3,
                  threads: int | None = None, dtype: str = "fp32", cache: str = "contiguous",
                  spec: ModelSpec | None = None, seed: int = 0, verbose: bool = True) -> list[BenchRow]:
    if threads is not None:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    spec = spec or bench_spec()
    model = build_model(spec, seed=seed, dtype=dtype)
    hf = _hf_model(model, spec, model.dtype)
    params = SamplingParams(max_new_tokens=new_tokens)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for B in batches:
        prompts = torch.randint(0, spec.vocab_size, (B, prompt_len), generator=gen)
        engine = Engine(model, cache=cache, max_batch=B, max_seq_len=prompt_len + new_tokens,
                        num_blocks=B * -(-(prompt_len + new_tokens) // 16) if cache == "paged" else None)

        def ours() -> list[list[int]]:
            return [o.tokens for o in engine.generate(prompts, params)]

        def theirs() -> list[list[int]]:
            with torch.inference_mode():
                out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False)
            return out[:, prompt_len:].tolist()

        same = ours() == theirs()  # also the warm-up
        times: dict[str, list[float]] = {"ours": [], "hf": []}
        for _ in range(reps):
            for name, fn in (("ours", ours), ("hf", theirs)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        tokens = B * new_tokens
        row = BenchRow(model=spec.name, params_m=spec.param_count / 1e6, dtype=dtype, threads=threads, cache=cache,
                       batch=B, prompt_len=prompt_len, new_tokens=new_tokens,
                       ours_tokens_per_s=tokens / statistics.median(times["ours"]),
                       hf_tokens_per_s=tokens / statistics.median(times["hf"]), same_tokens=same)
        rows.append(row)
        if verbose:
            print(_format(row), flush=True)
    return rows


def _format(r: BenchRow) -> str:
    return (f"{r.model} ({r.params_m:.0f}M) {r.dtype} threads={r.threads} cache={r.cache} batch={r.batch:>3} "
            f"prompt={r.prompt_len} new={r.new_tokens}: ours {r.ours_tokens_per_s:8.1f} tok/s, "
            f"transformers {r.hf_tokens_per_s:8.1f} tok/s, ratio {r.ratio:.2f}"
            f"{'' if r.same_tokens else '  (TOKENS DIFFER)'}")


def main(argv: list[str] | None = None) -> list[BenchRow]:
    ap = argparse.ArgumentParser(prog="python -m llmperf.engine.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default: 1 8)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per side (median reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--cache", default="contiguous", choices=["contiguous", "paged"])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.device != "cpu":
        raise SystemExit("--device: only cpu is benchmarked against transformers here")
    rows = run_benchmark(batches=tuple(args.batch), prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                         reps=args.reps, threads=args.threads, dtype=args.dtype, cache=args.cache,
                         spec=bench_spec(args.hidden, args.layers, args.vocab))
    return rows


if __name__ == "__main__":
    main()


__all__ = ["BenchRow", "bench_spec", "run_benchmark"]
