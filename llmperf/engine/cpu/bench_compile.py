"""A decode step on this CPU, four ways side by side in one run: the engine on its CPU ops (`CpuOps`:
llmperf's C++ kernels, oneDNN's packed GEMM), the engine on plain torch ops (`TorchOps`), and a
static-shape decode step of the same weights (a gpt-fast-style function: a fixed-size cache written
at each sequence's position, attention over all of it under a mask) run eagerly and under
`torch.compile` (inductor's C++ backend, `freezing` on, as recommended for CPU inference).

    python -m llmperf.engine.cpu.bench_compile --reps 7 --out DIR            # this CPU as it is
    python -m llmperf.engine.cpu.bench_compile --kind avx2 --reps 7 --out DIR  # as an AVX2-only CPU

`--kind avx2` re-runs itself with `ATEN_CPU_CAPABILITY=avx2` (torch and inductor's code),
`ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN) and `LLMPERF_MAX_CPU_ISA=avx2` (llmperf's kernels), so every
layer sees a CPU without AVX-512. Each repeat runs every variant in turn (the order rotating), a
few decode steps each; the figure is seconds per step, median [min, max] over repeats, and each
variant's ratio to the engine on torch ops is taken within a repeat. Before timing, the static
step's logits are checked against the engine's over a short prompt (the same greedy tokens).

Letters: B batch, S cache slots, L layers, H / H_kv heads, D head dim, C hidden size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "LLMPERF_MAX_CPU_ISA": "avx2"}
DEFAULT_SPEC = Path(__file__).resolve().parents[3] / "reports" / "profile" / "llama-style-cpu.yaml"


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, w.shape, w, eps)
    return w * F.rms_norm(x.float(), w.shape, eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rd = cos.shape[-1]
    xr, rest = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    return torch.cat((xr * cos + torch.cat((-x2, x1), dim=-1) * sin, rest), dim=-1)


class StaticDecoder:
    """A Llama-family decode step with static shapes, on a model's own weights `(out, in)`: caches
    `(L, B, H_kv, S, D)`, each sequence's new token written at its position `pos (B,)`, attention over
    all S slots under a mask (what gpt-fast compiles)."""

    def __init__(self, model: Any, batch: int, slots: int) -> None:
        spec = model.spec
        self.model, self.eps = model, spec.norm_eps
        self.H, self.H_kv, self.D = spec.num_heads, spec.num_kv_heads, spec.head_dim
        shape = (spec.num_layers, batch, self.H_kv, slots, self.D)
        self.k = torch.zeros(shape, dtype=model.dtype)
        self.v = torch.zeros(shape, dtype=model.dtype)
        cos, sin = model.rotary.lookup(torch.arange(slots)[None], slots - 1, model.dtype)  # (1, S, 1, rd)
        self.cos, self.sin = cos[0, :, 0], sin[0, :, 0]  # (S, rd)
        self.slots = torch.arange(slots)
        self.scale = spec.head_dim ** -0.5

    def step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits `(B, V)` of `tokens (B, 1)` at positions `pos (B,)`."""
        m, H, H_kv, D = self.model, self.H, self.H_kv, self.D
        B = tokens.shape[0]
        rows = torch.arange(B)
        x = F.embedding(tokens, m.embed_weight)  # (B, 1, C)
        cos, sin = self.cos[pos][:, None, None], self.sin[pos][:, None, None]  # (B, 1, 1, rd)
        mask = (self.slots[None] <= pos[:, None])[:, None, None]  # (B, 1, 1, S)
        for i, layer in enumerate(m.layers):
            h = _rms(x, layer.attn_norm.weight, self.eps)
            qkv = F.linear(h, layer.qkv_weight, layer.qkv_bias).view(B, 1, H + 2 * H_kv, D)
            qk = _rotate(qkv[:, :, :H + H_kv], cos, sin)
            q, k, v = qk[:, 0, :H], qk[:, 0, H:], qkv[:, 0, H + H_kv:]  # (B, heads, D)
            self.k[i, rows, :, pos] = k
            self.v[i, rows, :, pos] = v
            qg = q.reshape(B, H_kv, H // H_kv, D)  # the G query heads of each KV head: no cache copy
            o = F.scaled_dot_product_attention(qg, self.k[i], self.v[i], attn_mask=mask, scale=self.scale)
            x = x + F.linear(o.reshape(B, 1, H * D), layer.o_weight, layer.o_bias)
            h = _rms(x, layer.mlp_norm.weight, self.eps)
            gate, up = F.linear(h, layer.up_weight, layer.up_bias).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down_weight, layer.down_bias)
        x = _rms(x[:, -1], m.final_norm.weight, self.eps)
        return F.linear(x, m.lm_head_weight)


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One variant's decode step at one (dtype, batch): seconds per step and its ratio to the engine
    on torch ops, each median [min, max] over repeats."""

    kind: str
    dtype: str
    batch: int
    variant: str
    step_s: float
    step_min_s: float
    step_max_s: float
    vs_torch: float
    vs_torch_min: float
    vs_torch_max: float
    compile_s: float | None = None


def _engine_step(model: Any, batch: int, context: int) -> Callable[[], Any]:
    """The engine's decode step (the model's forward) of `batch` sequences at `context` tokens."""
    from llmperf.engine import ContiguousKVCache

    cache = ContiguousKVCache(model.spec, max_batch=batch, max_seq_len=context + 8, dtype=model.dtype)
    g = torch.Generator().manual_seed(0)
    for s in range(batch):
        assert cache.allocate(s, context)
        model(torch.randint(0, model.spec.vocab_size, (1, context), generator=g), cache.prepare([s], context))
        assert cache.append_slot(s)
    meta = cache.prepare(list(range(batch)), 1)
    tokens = torch.randint(0, model.spec.vocab_size, (batch, 1), generator=g)
    return lambda: model(tokens, meta)


def _check_static(model: Any, step: Callable[..., torch.Tensor], decoder: StaticDecoder, batch: int) -> str:
    """Feed the same 8 tokens per sequence to the engine (one at a time, with a cache) and to the static
    step: the largest logit difference and how many greedy tokens agree; in fp32 raises if one differs
    (bf16 rounds in other places once inductor fuses, so a near tie may go the other way)."""
    from llmperf.engine import ContiguousKVCache

    cache = ContiguousKVCache(model.spec, max_batch=batch, max_seq_len=16, dtype=model.dtype)
    tokens = torch.randint(0, model.spec.vocab_size, (batch, 8), generator=torch.Generator().manual_seed(1))
    for s in range(batch):
        assert cache.allocate(s, 1)
    for t in range(8):
        if t:
            for s in range(batch):
                assert cache.append_slot(s)
        ours = model(tokens[:, t:t + 1], cache.prepare(list(range(batch)), 1))
        theirs = step(tokens[:, t:t + 1], torch.full((batch,), t))
    same = int((ours.argmax(-1) == theirs.argmax(-1)).sum())
    if same != batch and model.dtype == torch.float32:
        raise AssertionError(f"static step: greedy tokens differ from the engine's ({model.dtype}, batch {batch})")
    gap = float((ours.float() - theirs.float()).abs().max())
    return f"{same}/{batch} greedy tokens as the engine's, logits within {gap:.2g}"


def _set_ops(model: Any, ops: Any) -> None:
    model.set_ops(ops)


def measure(kind: str, spec_ref: str, dtypes: list[str], batches: list[int], reps: int, steps: int,
            context: int) -> tuple[list[Figure], list[str]]:
    from llmperf.engine import build_model
    from llmperf.engine.cpu import kernels
    from llmperf.engine.ops import TorchOps
    from llmperf.specs import load_model

    torch._inductor.config.freezing = True  # weights as constants, packed for oneDNN by inductor
    spec = load_model(spec_ref)
    figures, notes = [], []
    for dname in dtypes:
        model = build_model(spec, seed=0, dtype=dname)
        cpu_ops, torch_ops = model.ops, TorchOps()
        for batch in batches:
            decoder = StaticDecoder(model, batch, context + 8)
            compiled = torch.compile(decoder.step, fullgraph=True, dynamic=False)
            start = time.perf_counter()
            with torch.no_grad():
                diff = _check_static(model, compiled, decoder, batch)
            compile_s = time.perf_counter() - start
            notes.append(f"{kind} {dname} batch {batch}: static step, compiled: {diff}; eager: "
                         f"{_check_static(model, decoder.step, decoder, batch)}; compile + check {compile_s:.0f} s")
            pos = torch.full((batch,), context)
            tok = torch.randint(0, spec.vocab_size, (batch, 1), generator=torch.Generator().manual_seed(2))
            engine = _engine_step(model, batch, context)
            variants: dict[str, Callable[[], Any]] = {
                "engine, torch ops": lambda: (_set_ops(model, torch_ops), engine),
                "engine, CPU ops": lambda: (_set_ops(model, cpu_ops), engine),
                "static, eager": lambda: (None, lambda: decoder.step(tok, pos)),
                "static, torch.compile": lambda: (None, lambda: compiled(tok, pos)),
            }
            if kernels.available():
                def oneDNN_only() -> tuple[None, Callable[[], Any]]:
                    _set_ops(model, cpu_ops)

                    def run() -> Any:
                        with kernels.disabled():
                            return engine()
                    return None, run
                variants["engine, CPU ops, kernels off (oneDNN)"] = oneDNN_only
            times: dict[str, list[float]] = {v: [] for v in variants}
            names = list(variants)
            with torch.no_grad():
                for rep in range(reps + 1):  # the first round warms every variant up, untimed
                    for name in names[rep % len(names):] + names[:rep % len(names)]:
                        _, fn = variants[name]()
                        fn()
                        start = time.perf_counter()
                        for _ in range(steps):
                            fn()
                        if rep:
                            times[name].append((time.perf_counter() - start) / steps)
            _set_ops(model, cpu_ops)
            base = times["engine, torch ops"]
            for name, ts in times.items():
                ratios = [b / t for b, t in zip(base, ts)]
                figures.append(Figure(kind=kind, dtype=dname, batch=batch, variant=name,
                                      step_s=statistics.median(ts), step_min_s=min(ts), step_max_s=max(ts),
                                      vs_torch=statistics.median(ratios), vs_torch_min=min(ratios),
                                      vs_torch_max=max(ratios),
                                      compile_s=compile_s if name == "static, torch.compile" else None))
                print(_line(figures[-1]), flush=True)
    return figures, notes


def _line(f: Figure) -> str:
    return (f"{f.kind:6} {f.dtype} batch {f.batch}: {f.variant:38} {f.step_s * 1e3:8.2f} ms "
            f"[{f.step_min_s * 1e3:.2f}, {f.step_max_s * 1e3:.2f}]  x{f.vs_torch:.2f} "
            f"[{f.vs_torch_min:.2f}, {f.vs_torch_max:.2f}] vs engine on torch ops")


def _header(kind: str) -> list[str]:
    import llmperf
    from llmperf.engine.paths import machine_line

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "llmperf": getattr(llmperf, "__version__", "?")}
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = "?"
    return [f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, kind {kind}, commit {commit}",
            f"# {machine_line()}", f"# torch threads {torch.get_num_threads()}, versions {versions}",
            f"# load average {os.getloadavg()}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("native", "avx2"), default="native")
    parser.add_argument("--spec", default=str(DEFAULT_SPEC))
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4, help="decode steps per variant per repeat")
    parser.add_argument("--context", type=int, default=64, help="tokens in the cache at the timed step")
    parser.add_argument("--threads", type=int, default=None, help="torch (and llmperf kernel) threads; default torch's")
    parser.add_argument("--out", type=Path, default=None, help="folder for bench_compile-<kind>.{txt,json}")
    args = parser.parse_args(argv)
    if args.kind == "avx2" and any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        return subprocess.call([sys.executable, "-m", "llmperf.engine.cpu.bench_compile", *(argv or sys.argv[1:])],
                               env={**os.environ, **AVX2_ENV})
    if args.threads:
        torch.set_num_threads(args.threads)
    header = _header(args.kind)
    print("\n".join(header), flush=True)
    figures, notes = measure(args.kind, args.spec, args.dtypes.split(","), [int(b) for b in args.batches.split(",")],
                             args.reps, args.steps, args.context)
    print("\n".join(f"# {n}" for n in notes))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        text = "\n".join([*header, *map(_line, figures), *(f"# {n}" for n in notes)]) + "\n"
        name = f"bench_compile-{args.kind}" + (f"-{args.threads}t" if args.threads else "")
        (args.out / f"{name}.txt").write_text(text)
        (args.out / f"{name}.json").write_text(
            json.dumps({"header": header, "notes": notes, "figures": [asdict(f) for f in figures]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
