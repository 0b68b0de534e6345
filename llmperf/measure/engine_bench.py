"""How fast is the engine? Ratios measured side by side in one run, each with its spread over repeats.

    python -m llmperf.measure.engine_bench --out reports/engine/$(date +%F)-cpu   # ~200M-parameter Llama-style model
    python -m llmperf.measure.engine_bench --hidden 256 --layers 4 --reps 3 --context 512   # quick, print only

1. **Decode step vs the memory limit**, for batch 1, 2, 4 and 8 in fp32 and bf16: the floor is
   `(weight bytes + KV bytes) / copy bandwidth`, the copy bandwidth measured here with
   `torch.Tensor.copy_` over a buffer larger than the caches, read + write counted, as STREAM's "copy"
   does (McCalpin, STREAM benchmark). The figure is floor / measured step time (1.0: at the roofline).
2. **Engine vs `transformers.generate`** at batch 8 (fp32, greedy, the same weights, prompts and
   number of tokens, no EOS): tokens/s ours / tokens/s theirs, the two timed alternately.
3. **Paged vs contiguous KV cache** at a long context (default 2048 tokens, batch 1): contiguous
   decode step time / paged decode step time (1.0: paging costs nothing).
4. **llmperf's own CPU kernels vs torch's operators** (`engine.cpu.kernels`), and **a decode step's
   layers in one call vs the same kernels called one by one** (`Transformer.decode_in_one_call`),
   alternated on one engine, with whether the tokens match.

Each figure is the median over `--reps` repeats with the [min, max] beside it; a decode-step time is
the median over one `generate()` call's decode steps (`Engine.last_steps`). The machine's other load
moves every figure: read them as ratios taken under the same conditions. Every run prints (and with
`--out DIR` writes to `engine_bench.txt` and `engine_bench.json`) the date, the machine, the versions,
the git commit and the settings beside the figures. What the bytes count: docs/measure.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from llmperf.analysis.vocabulary import Phase
from llmperf.engine.cpu import kernels as cpu_kernels
from llmperf.engine.generate import Engine
from llmperf.engine.model import Transformer
from llmperf.engine.paths import EnginePaths, engine_paths
from llmperf.engine.sampling import SamplingParams
from llmperf.engine.weights import build_model, hf_config, to_hf_state_dict
from llmperf.measure.device import describe_cpu, git_commit, versions
from llmperf.measure.timers import gc_paused
from llmperf.specs import ModelSpec, load_model

MiB = 1 << 20
BATCHES = (1, 2, 4, 8)  # decode / memory limit: the batches of the target (1-8), both sides of each GEMM path
SIDE_BY_SIDE = (("bf16", 1), ("bf16", 8), ("fp32", 8))  # (dtype, batch) of the own-kernel and one-call figures


def bench_spec(hidden: int = 1024, layers: int = 12, vocab: int = 32000, max_positions: int = 4096) -> ModelSpec:
    """A Llama-3-style model scaled to ~200M parameters: GQA (16 query / 4 KV heads), SwiGLU."""
    heads = max(1, hidden // 64)
    return load_model("llama-3.1-8b").scaled(
        name=f"llama-bench-{hidden}x{layers}", hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=max(1, heads // 4), ffn_size=int(hidden * 2.75), vocab_size=vocab,
        max_positions=max_positions, rotary_dim=None)


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One benchmark figure: the median over repeats and their range."""

    name: str
    median: float
    low: float
    high: float
    detail: str = ""

    @classmethod
    def of(cls, name: str, values: list[float], detail: str = "") -> Figure:
        return cls(name=name, median=statistics.median(values), low=min(values), high=max(values), detail=detail)

    def line(self) -> str:
        return f"{self.name:<44} {self.median:6.2f}  [{self.low:.2f}, {self.high:.2f}]  {self.detail}"


def copy_bandwidth_bytes_per_s(size_bytes: int = 512 * MiB, reps: int = 5) -> float:
    """`dst.copy_(src)` over fp32 buffers of `size_bytes`, read + write counted; the fastest call
    (a shared machine only slows a call down)."""
    n = size_bytes // 4
    src = torch.rand(n)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * size_bytes / best


def weight_bytes_read(model: Transformer) -> int:
    """Bytes of the parameters a decode step reads in full (gathered embeddings excluded)."""
    skip = set()
    if not model.spec.tied_embeddings:
        skip.add(id(model.embed_weight))
    if model.pos_weight is not None:
        skip.add(id(model.pos_weight))
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in skip or id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


def _decode_run(engine: Engine, prompts: torch.Tensor, new_tokens: int) -> tuple[float, float, list[list[int]]]:
    """(median decode-step seconds, mean tokens in cache during the decode steps, the tokens made) of
    one call."""
    with gc_paused():
        outputs = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    steps = [s for s in engine.last_steps if s.phase == Phase.decode]
    tokens = statistics.mean(s.usage.logical_tokens for s in steps)
    return statistics.median(s.seconds for s in steps), tokens, [o.tokens for o in outputs]


def _decode_steps(engine: Engine, prompts: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(median decode-step seconds, mean tokens in cache during the decode steps) of one call."""
    return _decode_run(engine, prompts, new_tokens)[:2]


def memory_limit_fractions(spec: ModelSpec, dtype: str, batch: int, *, prompt_len: int, new_tokens: int,
                           reps: int, bandwidth: float, seed: int = 0) -> Figure:
    model = build_model(spec, seed=seed, dtype=dtype)
    wbytes = weight_bytes_read(model)
    kv_per_token = spec.kv_bytes_per_token(dtype)
    prompts = torch.randint(0, spec.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    engine = Engine(model, cache="contiguous", max_batch=batch, max_seq_len=prompt_len + new_tokens)
    _decode_steps(engine, prompts, new_tokens)  # warm-up
    fractions = []
    for _ in range(reps):
        step_s, tokens = _decode_steps(engine, prompts, new_tokens)
        floor_s = (wbytes + tokens * kv_per_token) / bandwidth
        fractions.append(floor_s / step_s)
    return Figure.of(f"decode / memory limit  {dtype} batch {batch}", fractions,
                     f"weights {wbytes / 1e6:.0f} MB, KV {kv_per_token * prompt_len * batch / 1e6:.1f} MB")


def _alternated(spec: ModelSpec, baseline: Callable[[Transformer], AbstractContextManager[Any]], *, prompt_len: int,
                new_tokens: int, reps: int, dtype: str, batch: int, seed: int) -> tuple[list[float], bool]:
    """Decode-step seconds inside `baseline(model)` / outside it, alternated on one engine `reps` times
    (after a warm-up that compiles the kernels on first use), and whether every run made the same tokens."""
    model = build_model(spec, seed=seed, dtype=dtype)
    prompts = torch.randint(0, spec.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    engine = Engine(model, cache="contiguous", max_batch=batch, max_seq_len=prompt_len + new_tokens)
    _decode_steps(engine, prompts, new_tokens)  # warm-up
    ratios, same = [], True
    for _ in range(reps):
        with baseline(model):
            base_s, _, theirs = _decode_run(engine, prompts, new_tokens)
        ours_s, _, ours = _decode_run(engine, prompts, new_tokens)
        same &= theirs == ours
        ratios.append(base_s / ours_s)
    return ratios, same


def own_kernels_speedup(spec: ModelSpec, *, prompt_len: int, new_tokens: int, reps: int, dtype: str = "bf16",
                        batch: int = 1, seed: int = 0) -> Figure:
    """Decode step on torch's operators / on llmperf's own CPU kernels (`engine.cpu.kernels`: the GEMM
    of few rows, the RMSNorm, RoPE, SwiGLU activation and decode attention), the two alternated on one
    engine (1.0: they gain nothing, or are unavailable here). Both runs read the weights in the layout
    the model was built with."""
    ratios, same = _alternated(spec, lambda model: cpu_kernels.disabled(), prompt_len=prompt_len,
                               new_tokens=new_tokens, reps=reps, dtype=dtype, batch=batch, seed=seed)
    return Figure.of(f"own CPU kernels / torch  {dtype} batch {batch}", ratios,
                     f"cpu_kernels {cpu_kernels.status()}" + (", same tokens" if same else ", tokens differ"))


@contextmanager
def _one_by_one(model: Transformer) -> Iterator[None]:
    """The model's decode steps with their operators called one by one (`decode_in_one_call` off)."""
    model.decode_in_one_call = False
    try:
        yield
    finally:
        model.decode_in_one_call = True


def one_call_speedup(spec: ModelSpec, *, prompt_len: int, new_tokens: int, reps: int, dtype: str = "bf16",
                     batch: int = 1, seed: int = 0) -> Figure:
    """Decode step with the operators called one by one from Python / with a step's layers in one
    call of the same kernels (`Transformer.decode_in_one_call`), the two alternated on one engine (1.0
    where the one call does not apply: no kernels here, or more rows than they take)."""
    ratios, same = _alternated(spec, _one_by_one, prompt_len=prompt_len, new_tokens=new_tokens, reps=reps,
                               dtype=dtype, batch=batch, seed=seed)
    return Figure.of(f"layers in one call / one by one  {dtype} b{batch}", ratios,
                     "same tokens" if same else "tokens differ")


def _hf_model(model: Transformer, spec: ModelSpec):
    import transformers

    cfg = transformers.AutoConfig.for_model(**hf_config(spec))
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=model.dtype).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=False)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def versus_transformers(spec: ModelSpec, *, batch: int, prompt_len: int, new_tokens: int, reps: int,
                        seed: int = 0) -> Figure:
    model = build_model(spec, seed=seed, dtype="fp32")
    hf = _hf_model(model, spec)
    prompts = torch.randint(0, spec.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    engine = Engine(model, cache="contiguous", max_batch=batch, max_seq_len=prompt_len + new_tokens)
    params = SamplingParams(max_new_tokens=new_tokens)

    def ours() -> list[list[int]]:
        return [o.tokens for o in engine.generate(prompts, params)]

    def theirs() -> list[list[int]]:
        with torch.inference_mode():
            out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False)
        return out[:, prompt_len:].tolist()

    same = ours() == theirs()  # also the warm-up
    ratios = []
    for _ in range(reps):
        t = {}
        for name, fn in (("ours", ours), ("hf", theirs)):
            t0 = time.perf_counter()
            fn()
            t[name] = time.perf_counter() - t0
        ratios.append(t["hf"] / t["ours"])  # = tokens/s ours / tokens/s theirs (same tokens)
    return Figure.of(f"engine / transformers.generate  batch {batch}", ratios,
                     "same tokens" if same else "TOKENS DIFFER")


def paged_versus_contiguous(spec: ModelSpec, *, context: int, new_tokens: int, reps: int, block_size: int = 16,
                            seed: int = 0) -> Figure:
    model = build_model(spec, seed=seed, dtype="fp32")
    prompts = torch.randint(0, spec.vocab_size, (1, context), generator=torch.Generator().manual_seed(seed))
    engines = {kind: Engine(model, cache=kind, block_size=block_size, max_batch=1, max_seq_len=context + new_tokens,
                            num_blocks=-(-(context + new_tokens) // block_size) + 2 if kind == "paged" else None)
               for kind in ("contiguous", "paged")}
    for e in engines.values():
        _decode_steps(e, prompts, new_tokens)  # warm-up
    ratios = []
    for _ in range(reps):
        t = {kind: _decode_steps(e, prompts, new_tokens)[0] for kind, e in engines.items()}
        ratios.append(t["contiguous"] / t["paged"])
    return Figure.of(f"paged / contiguous speed  context {context}", ratios, f"block_size {block_size}")


def environment(paths: EnginePaths | None = None) -> dict[str, Any]:
    """When and where a run happens: date, machine (CPU model, cores, threads, ISA), versions, commit,
    and which kernel runs each of the engine's paths here (`engine.paths`)."""
    env: dict[str, Any] = dict(date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), machine=describe_cpu(), versions=versions(),
                               git_commit=git_commit(), paths=(paths or engine_paths()).line())
    try:
        import transformers
        env["versions"]["transformers"] = str(transformers.__version__)
    except ImportError:
        env["versions"]["transformers"] = "not installed"
    return env


def _header(env: dict[str, Any], spec: ModelSpec, bw: float, copy_mib: int) -> list[str]:
    m = env["machine"]
    return [f"# llmperf engine benchmark  {env['date']}  commit {env['git_commit'] or 'unknown'}",
            f"# machine: {m['name']} ({m['machine']}), {m['cores']} cores, torch threads {m['threads']}, "
            f"ISA {' '.join(m['isa']) or '-'}, memory {m['memory_bytes'] / 2**30:.0f} GiB",
            "# versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
            f"# model {spec.name} ({spec.param_count / 1e6:.0f}M params), copy bandwidth {bw / 1e9:.1f} GB/s "
            f"(read+write, {copy_mib} MiB)",
            f"# llmperf's own CPU kernels (GEMM of few rows, RMSNorm, RoPE, SwiGLU, decode attention; "
            f"llmperf.engine.cpu.kernels): "
            f"{cpu_kernels.status()}",
            f"# engine paths (llmperf.engine.paths): {env['paths']}"]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Which figures this machine can inform, and the targets it can reach (`plan_for`)."""

    memory_limit: tuple[tuple[str, int], ...]  # (dtype, batch) of the decode / memory-limit figures
    kernels: bool  # llmperf's kernels run here: their side-by-side figures are measured
    targets: str  # the targets line
    notes: tuple[str, ...]  # why a figure or a target is left out


def plan_for(paths: EnginePaths) -> Plan:
    """The figures and targets for these engine paths. Where bf16 has no native kernel (no AVX512_BF16
    or AMX, e.g. an AVX2-only CPU) a bf16 decode step is compute-bound on converting every element
    (measured 0.05 of the memory limit at batch 8 on an AVX2 EPYC, 808 ms a step for 336M parameters):
    it is measured at batch 1 and 8 to show it, with no memory-limit target. Without llmperf's kernels
    their side-by-side figures (own kernels / torch, layers in one call) would compare torch with
    itself, so they are left out, saying why."""
    notes = []
    bf16 = BATCHES if paths.native_bf16 else (BATCHES[0], BATCHES[-1])
    targets = "decode >= 0.8 of the memory limit (fp32" + (", bf16" if paths.native_bf16 else "") + ")"
    if not paths.native_bf16:
        notes.append("bf16 is emulated here (no AVX512_BF16 or AMX): its decode step is compute-bound on "
                     "conversions, not a memory-limit figure; measured at batch 1 and 8 without a target")
    if not paths.kernels.startswith("on"):
        notes.append(f"own-kernel and one-call figures not measured: llmperf's CPU kernels are {paths.kernels}")
    return Plan(memory_limit=(*(("fp32", b) for b in BATCHES), *(("bf16", b) for b in bf16)),
                kernels=paths.kernels.startswith("on"), notes=tuple(notes),
                targets=f"# targets (issue 8): {targets}; >= 1.3x transformers at batch 8; paged >= 0.9x")


def run(*, spec: ModelSpec, prompt_len: int = 32, new_tokens: int = 32, context: int = 2048, reps: int = 5,
        threads: int | None = None, copy_mib: int = 512, out: str | Path | None = None,
        say: Callable[[str], None] = print) -> list[Figure]:
    """Every figure, printed as it is measured (and written under `out`, if given); returns them."""
    if threads is not None:
        torch.set_num_threads(threads)
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        say(line)

    paths = engine_paths()
    env, plan = environment(paths), plan_for(paths)
    bw = copy_bandwidth_bytes_per_s(copy_mib * MiB)
    for line in _header(env, spec, bw, copy_mib):
        emit(line)
    for note in plan.notes:
        emit(f"# {note}")
    settings = dict(prompt_len=prompt_len, new_tokens=new_tokens, context=context, reps=reps, copy_mib=copy_mib,
                    hidden=spec.hidden_size, layers=spec.num_layers, vocab=spec.vocab_size)
    emit("# settings: " + ", ".join(f"{k} {v}" for k, v in settings.items()))
    emit(f"{'figure':<44} median  [min, max] over {reps} repeats")
    figures = []
    for fig in (
        *(memory_limit_fractions(spec, dtype, b, prompt_len=prompt_len, new_tokens=new_tokens, reps=reps,
                                 bandwidth=bw) for dtype, b in plan.memory_limit),
        *(own_kernels_speedup(spec, prompt_len=prompt_len, new_tokens=new_tokens, reps=reps, dtype=dtype, batch=b)
          for dtype, b in SIDE_BY_SIDE if plan.kernels),
        *(one_call_speedup(spec, prompt_len=prompt_len, new_tokens=new_tokens, reps=reps, dtype=dtype, batch=b)
          for dtype, b in SIDE_BY_SIDE if plan.kernels),
        versus_transformers(spec, batch=8, prompt_len=prompt_len, new_tokens=new_tokens, reps=reps),
        paged_versus_contiguous(spec, context=context, new_tokens=min(new_tokens, 16), reps=reps),
    ):
        emit(fig.line())
        figures.append(fig)
    emit(plan.targets)
    if out is not None:
        write_results(Path(out), lines, env=env, settings=settings, bandwidth=bw, spec=spec, figures=figures)
        say(f"# written to {out}/engine_bench.txt and engine_bench.json")
    return figures


def write_results(out: Path, lines: list[str], *, env: dict[str, Any], settings: dict[str, Any], bandwidth: float,
                  spec: ModelSpec, figures: list[Figure]) -> None:
    """`out/engine_bench.txt` (what was printed) and `out/engine_bench.json` (the same, typed)."""
    from llmperf.outputs import check_dir
    d = check_dir(out, "--out")
    doc = dict(env, settings=settings, model=dict(name=spec.name, params=spec.param_count),
               copy_bandwidth_bytes_per_s=bandwidth, figures=[asdict(f) for f in figures])
    with d.transaction():
        d.write("engine_bench.txt", "\n".join(lines) + "\n")
        d.write("engine_bench.json", json.dumps(doc, indent=2) + "\n")


def comparison_head(title: str, env: dict[str, Any], settings: dict[str, Any], when: str | None = None) -> list[str]:
    """A comparison benchmark's first lines: what, when (default today), the machine (and its GPU),
    the versions and commit, the settings."""
    import time
    return [f"{title}, measured and predicted: {when or time.strftime('%Y-%m-%d')}, {env['machine']}"
            + (f", GPU {env['gpu']}" if "gpu" in env else ""),
            f"versions {env['versions']}, commit {env['git_commit']}", f"settings {settings}"]


def save_comparison(out: Path, name: str, text: str, doc: dict[str, Any], *, indent: int | None = 2) -> None:
    """A benchmark's `out/NAME.txt` (what it printed) and `out/NAME.json` (`doc`: its environment, settings
    and rows), written together or not at all (`llmperf.outputs.OutputDir.transaction`). `indent`
    None: compact JSON (thousands of steps)."""
    from llmperf.outputs import check_dir
    d = check_dir(out, "--out")
    with d.transaction():
        d.write(f"{name}.txt", text + "\n")
        d.write(f"{name}.json", json.dumps(doc, indent=indent, default=str) + "\n")


def report_comparison(title: str, name: str, env: dict[str, Any], settings: dict[str, Any], body: list[str],
                      out: Path | None, fields: dict[str, Any], *, when: str | None = None,
                      indent: int | None = 2) -> None:
    """A comparison benchmark's report: its head (`comparison_head`) and `body` printed, and with `out` saved
    (`save_comparison`: the text, and the environment, the settings and `fields` as JSON)."""
    text = "\n".join(comparison_head(title, env, settings, when) + body)
    print(text)
    if out is not None:
        save_comparison(out, name, text, dict(environment=env, settings=settings, **fields), indent=indent)


def main(argv: list[str] | None = None) -> list[Figure]:
    ap = argparse.ArgumentParser(prog="python -m llmperf.measure.engine_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048, help="context of the paged-vs-contiguous figure")
    ap.add_argument("--reps", type=int, default=5, help="repeats per figure (median and [min, max] printed)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--copy-mib", type=int, default=512, help="buffer of the copy-bandwidth measurement")
    ap.add_argument("--out", default=None, help="write engine_bench.txt / .json here (e.g. reports/engine/<date>-cpu)")
    args = ap.parse_args(argv)
    for name in ("prompt_len", "new_tokens", "context", "reps", "hidden", "layers", "vocab", "copy_mib"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
    if args.new_tokens < 2:
        ap.error(f"--new-tokens: at least 2 (one decode step), got {args.new_tokens}")
    # 8192 positions: the llama3 rope scaling it inherits starts at 8192 (transformers warns below that)
    spec = bench_spec(args.hidden, args.layers, args.vocab, max_positions=max(8192, args.context + args.new_tokens))
    return run(spec=spec, prompt_len=args.prompt_len, new_tokens=args.new_tokens, context=args.context,
               reps=args.reps, threads=args.threads, copy_mib=args.copy_mib, out=args.out)


if __name__ == "__main__":
    main()


__all__ = ["Figure", "Plan", "bench_spec", "copy_bandwidth_bytes_per_s", "environment", "memory_limit_fractions",
           "one_call_speedup", "own_kernels_speedup", "paged_versus_contiguous", "plan_for", "run",
           "versus_transformers",
           "weight_bytes_read", "write_results"]
