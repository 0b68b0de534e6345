"""Two prefill operators of today's MoE families on a CPU, the engine's code against the code it
replaced, side by side in one process (`reports/engine/README.md`, "Prefill operators of today's MoE
families"):

- **MLA prefill attention** (`llmperf.engine.mla`, unabsorbed form, `sdpa` backend) at the quarter
  DeepSeek-V3's widths (`reports/profile/deepseek-v3-quarter-cpu.yaml`: 32 heads, q/k 32 + 16, v 32):
  before, K = [k_nope | k_rope] concatenated and V the value half of kv_b's output, SDPA at q/k 48
  and v 32 (torch's math path); after, `MLAttention._unabsorbed` as the engine runs it (one [v | k]
  row per key and head, V read at the q/k width, the extra outputs dropped: torch's flash kernel).
  Timed: the `attention` operator alone and the form's whole glue (kv_b_proj's output to attention's
  output: K and V built, attention, the outputs reshaped), one sequence of T tokens.
- **Qwen3-30B-A3B's qk_norm** (`llmperf.engine.model.Block._rotate`; 32 q heads, 4 KV heads, head 128)
  at T tokens: before, each of q and k normalised out of place and concatenated; after, both
  normalised in place in the QKV output (`Norm.heads_`). Timed: qk_norm alone, and qk_norm with the
  RoPE that follows (before into a fresh tensor; after over the QKV output's q and k heads too).

Each repeat runs before and after on fresh inputs (the QKV output copied outside the clock, as a GEMM
leaves it), in alternating order; printed: each one's median [min, max] in ms and the median [min,
max] of the per-repeat ratio before / after, the SDPA kernel each form ran (`torch.profiler`), and
the largest difference between their outputs.

- **In the engine** (`--only engine`): recorded prefills of both models cut to a cheap size, main's
  methods patched in for "before" (`run_engine`): the operators as `llmperf profile` records them,
  and whether the tokens are the same.

    python reports/engine/prefill_ops_bench.py --reps 7 --tokens 512 1024 2048 [--threads 1]

On a machine shared with other work, torch's 2 threads wait at each parallel region for a
descheduled thread (timings in multiples of ~4 ms): `--threads 1` gives steadier ratios there.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's llmperf, not an installed one

from llmperf.engine import attention as backends
from llmperf.engine.mla import MLAttention
from llmperf.engine.ops import ops_for
from llmperf.engine.parts import Norm
from llmperf.engine.step import StepMeta
from llmperf.specs import load_model

MLA_SPEC = Path(__file__).resolve().parents[1] / "profile" / "deepseek-v3-quarter-cpu.yaml"
QK_NORM_SPEC = "qwen3-30b-a3b"


class _NoRec:
    """A recorder that times nothing (the benchmark times around the calls)."""

    active = False

    def op(self, name: str, layer: int | None = None) -> Any:
        import contextlib

        return contextlib.nullcontext()


# ---- MLA ------------------------------------------------------------------------------------------
def mla_before(layer: MLAttention, kv: torch.Tensor, keys: torch.Tensor, q: torch.Tensor, meta: StepMeta,
               timed: dict[str, float]) -> torch.Tensor:
    """The unabsorbed form after kv_b_proj as the engine ran it before (main at 2937fc6): K concatenated,
    V the value half of kv_b's output, `sdpa_core` at q/k Dq and v Dv. `(B*T, H*Dv)`."""
    B, S, H, _ = kv.shape
    T = q.shape[1]
    Dn, R, Dv = layer.Dn, layer.R, layer.Dv
    k = torch.cat((kv[..., :Dn], keys[:, :, None, R:].expand(B, S, H, layer.Dr)), dim=-1)  # (B, S, H, Dq)
    start = time.perf_counter()
    o = backends.sdpa_core(q, k.transpose(1, 2), kv[..., Dn:].transpose(1, 2), meta, meta.attn(0, layer.Dq))
    timed["attention"] = time.perf_counter() - start
    return o.reshape(B * T, H * Dv)


def mla_after(layer: MLAttention, kv: torch.Tensor, keys: torch.Tensor, q: torch.Tensor, meta: StepMeta,
              timed: dict[str, float]) -> torch.Tensor:
    """The same through the engine's `MLAttention._unabsorbed` (kv_b_proj's output given, so both forms
    start from the same tensor; `_attend` timed as the operator)."""
    B, S, H, _ = kv.shape
    T = q.shape[1]
    attend = layer._attend

    def timed_attend(*args: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = attend(*args)
        timed["attention"] = time.perf_counter() - start
        return out

    ops = layer.ops
    layer._attend = timed_attend
    layer.ops = SimpleNamespace(linear=lambda x, w, b=None: kv)  # kv_b_proj: the given output
    try:
        ctx = SimpleNamespace(rec=_NoRec(), attend=backends.sdpa_attention)
        return layer._unabsorbed(q[..., :layer.Dn].reshape(B * T, H, layer.Dn),
                                 q[..., layer.Dn:].reshape(B * T, H, layer.Dr), keys[:, :, None], meta, B, T, ctx)
    finally:
        del layer._attend
        layer.ops = ops


def sdpa_kernel(fn: Callable[[], Any]) -> str:
    """The aten SDPA implementation `fn` ran (flash or math), from `torch.profiler`."""
    from torch.profiler import profile

    with profile() as prof:
        fn()
    names = [e.key for e in prof.key_averages()
             if "scaled_dot_product" in e.key and e.key != "aten::scaled_dot_product_attention"]
    return ", ".join(sorted(set(n.replace("aten::", "") for n in names))) or "?"


# ---- qk_norm --------------------------------------------------------------------------------------
def qk_before(qkv: torch.Tensor, qn: Norm, kn: Norm, H: int, H_kv: int, rope: Any, timed: dict[str, float]) -> Any:
    """main at 2937fc6: each of q and k normed out of place, concatenated; RoPE over the concatenation."""
    start = time.perf_counter()
    qk = qkv[:, :H + H_kv]
    qk = torch.cat((qn.forward(qk[:, :H]), kn.forward(qk[:, H:])), dim=1)
    timed["qk_norm"] = time.perf_counter() - start
    out = rope(qk)
    timed["qk_norm+rope"] = time.perf_counter() - start
    return out


def qk_after(qkv: torch.Tensor, qn: Norm, kn: Norm, H: int, H_kv: int, rope: Any, timed: dict[str, float]) -> Any:
    """The engine's `Block._rotate` now: both normed in place in the QKV output, then rotated in place."""
    start = time.perf_counter()
    qn.heads_(qkv[:, :H])
    kn.heads_(qkv[:, H:H + H_kv])
    timed["qk_norm"] = time.perf_counter() - start
    out = rope(qkv, in_place=True)
    timed["qk_norm+rope"] = time.perf_counter() - start
    return out


# ---- the runs -------------------------------------------------------------------------------------
def _summary(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def side_by_side(label: str, make: Callable[[], tuple[Any, ...]], before: Callable[..., Any],
                 after: Callable[..., Any], reps: int, keys: tuple[str, ...]) -> dict[str, float]:
    """`reps` alternating runs of before and after on fresh inputs from `make()`; prints each timed key."""
    times = {(side, k): [] for side in ("before", "after") for k in keys}
    ratios = {k: [] for k in keys}
    diff = 0.0
    for rep in range(reps + 1):  # the first a warm-up
        got: dict[str, dict[str, float]] = {}
        outs = {}
        for side in (("before", "after") if rep % 2 else ("after", "before")):
            args = make()
            timed: dict[str, float] = {}
            outs[side] = (before if side == "before" else after)(*args, timed)
            got[side] = timed
        diff = max(diff, float((outs["before"].float() - outs["after"].float()).abs().max()))
        if rep == 0:
            continue
        for k in keys:
            for side in ("before", "after"):
                times[(side, k)].append(got[side][k] * 1e3)
            ratios[k].append(got["before"][k] / got["after"][k])
    print(f"{label}  (largest |before - after| {diff:.2e})")
    for k in keys:
        print(f"  {k:<22} before {_summary(times[('before', k)])} ms   after {_summary(times[('after', k)])} ms   "
              f"before/after {_summary(ratios[k])}")
    return {k: statistics.median(v) for k, v in ratios.items()}


def run_mla(tokens: list[int], reps: int) -> None:
    spec = load_model(MLA_SPEC)
    layer = MLAttention(spec, 0, ops_for("cpu", torch.float32))
    H, Dq, Dn, Dv, R, Dr = layer.H, layer.Dq, layer.Dn, layer.Dv, layer.R, layer.Dr
    print(f"MLA prefill attention, {spec.name}: {H} heads, q/k {Dn} + {Dr}, v {Dv}, latent {R}; one sequence")
    for T in tokens:
        g = torch.Generator().manual_seed(T)
        kv0 = torch.randn(1, T, H, Dn + Dv, generator=g)
        keys0 = torch.randn(1, T, R + Dr, generator=g)
        q0 = torch.randn(1, T, H, Dq, generator=g)
        meta = StepMeta.no_cache(1, T, "cpu")

        def make() -> tuple[Any, ...]:
            return layer, kv0.clone(), keys0.clone(), q0.clone(), meta

        def whole(fn: Callable[..., Any]) -> Callable[..., Any]:
            def timed_fn(*args: Any) -> Any:
                timed = args[-1]
                start = time.perf_counter()
                out = fn(*args)
                timed["glue + attention"] = time.perf_counter() - start
                return out
            return timed_fn

        side_by_side(f" T={T}", make, whole(mla_before), whole(mla_after), reps, ("attention", "glue + attention"))
        print(f"  SDPA kernel: before {sdpa_kernel(lambda: mla_before(*make(), {}))}; "
              f"after {sdpa_kernel(lambda: mla_after(*make(), {}))}")


def run_qk_norm(tokens: list[int], reps: int) -> None:
    spec = load_model(QK_NORM_SPEC)
    H, H_kv, D = spec.num_heads, spec.num_kv_heads, spec.head_dim
    ops = ops_for("cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    norms = []
    for _ in range(2):
        n = Norm("rmsnorm", D, eps=spec.norm_eps, ops=ops)
        n.weight.data = 1 + 0.1 * torch.randn(D, generator=g)
        norms.append(n)
    print(f"qk_norm, {spec.name}: {H} q heads, {H_kv} KV heads, head {D}; one sequence")
    for T in tokens:
        src = torch.randn(T, H + 2 * H_kv, D, generator=g)
        cos, sin = torch.randn(T, spec.rotary_dim, generator=g), torch.randn(T, spec.rotary_dim, generator=g)

        def rope(x: torch.Tensor, in_place: bool = False) -> torch.Tensor:
            return ops.rope(x, H + H_kv, cos, sin, in_place=in_place)

        def make() -> tuple[Any, ...]:
            return src.clone(), norms[0], norms[1], H, H_kv, rope

        side_by_side(f" T={T}", make, qk_before, qk_after, reps, ("qk_norm", "qk_norm+rope"))


# ---- in the engine: recorded prefills ------------------------------------------------------------
def _rotate_before(self: Any, qkv: torch.Tensor, ctx: Any) -> torch.Tensor:
    """`Block._rotate` of main at 2937fc6 for a Qwen3 layer (q/k norms, RoPE; no L2 norm or NoPE)."""
    rec, i, H, H_kv = ctx.rec, self.index, self.H, self.H_kv
    qk = qkv[:, :H + H_kv]
    with rec.op("qk_norm", i):
        qk = torch.cat((self.q_norm.forward(qk[:, :H]), self.k_norm.forward(qk[:, H:])), dim=1)
    with rec.op("rope", i):
        return self.ops.rope(qk, H + H_kv, ctx.cos, ctx.sin, self.rope_interleaved)


def _unabsorbed_before(self: Any, q_nope: torch.Tensor, q_rope: torch.Tensor, lat: torch.Tensor, meta: StepMeta,
                       B: int, T: int, ctx: Any) -> torch.Tensor:
    """`MLAttention._unabsorbed` of main at 2937fc6 on the sdpa backend."""
    rec, i, H, R, Dn = ctx.rec, self.index, self.H, self.R, self.Dn
    keys = self._keys(lat, meta)[:, 0]
    S = keys.shape[1]
    with rec.op("kv_b_proj", i):
        kv = self.ops.linear(keys[..., :R], self.kv_b_weight).view(B, S, H, Dn + self.Dv)
    k = torch.cat((kv[..., :Dn], keys[:, :, None, R:].expand(B, S, H, self.Dr)), dim=-1)
    q = torch.cat((q_nope, q_rope), dim=-1).view(B, T, H, self.Dq)
    with rec.op("attention", i):
        o = backends.sdpa_core(q, k.transpose(1, 2), kv[..., Dn:].transpose(1, 2), meta, meta.attn(i, self.Dq))
    return o.reshape(B * T, H * self.Dv)


def run_engine(shapes: list[tuple[int, int]], reps: int) -> None:
    """Recorded prefills (`Recorder`, the instrument `llmperf profile` reads) of the two models cut to a
    cheap size (vocabulary 256; Qwen3-MoE 1 layer of 8 experts; the DeepSeek 2 layers, the second of
    8 experts), every width kept: each operator's recorded seconds, summed over layers, before (main's
    methods patched in) and after, alternated; and whether the greedy token of each prompt is the same.
    (Where a fresh tensor's pages come from, reused or newly faulted, moves cost between the qk_norm
    and the RoPE after it: hence their sum too.)"""
    from llmperf.engine import Engine, Recorder, SamplingParams, build_model
    from llmperf.engine.model import Block

    cases = [("qwen3-30b-a3b", load_model(QK_NORM_SPEC).scaled(num_layers=1, vocab_size=256, num_experts=8),
              Block, "_rotate", _rotate_before, ("qk_norm", "rope", "qk_norm+rope")),
             ("deepseek-v3-quarter", load_model(MLA_SPEC).scaled(num_layers=2, vocab_size=256, num_experts=8,
                                                                  experts_per_token=2, dense_layers=(0,),
                                                                  router_groups=1, router_topk_groups=1),
              MLAttention, "_unabsorbed", _unabsorbed_before, ("attention",))]
    for name, spec, cls, method, before, ops in cases:
        engine = Engine(build_model(spec, seed=0), cache="contiguous")
        after = getattr(cls, method)
        print(f"in the engine, {name} (recorded prefill, {spec.num_layers} layer(s), vocabulary 256)")
        for batch, prompt in shapes:
            prompts = [[1 + (7 * b + j) % 255 for j in range(prompt)] for b in range(batch)]
            times = {(side, op): [] for side in ("before", "after") for op in ops}
            tokens = {}
            for rep in range(reps + 1):
                for side in (("before", "after") if rep % 2 else ("after", "before")):
                    setattr(cls, method, before if side == "before" else after)
                    try:
                        rec = Recorder("cpu")
                        out = engine.generate(prompts, SamplingParams(max_new_tokens=1), recorder=rec)
                    finally:
                        setattr(cls, method, after)
                    tokens[side] = [o.tokens for o in out]
                    if rep:
                        for op in ops:
                            times[(side, op)].append(1e3 * sum(r.seconds for r in rec.trace.ops
                                                               if r.phase == "prefill" and r.op in op.split("+")))
            same = "same tokens" if tokens["before"] == tokens["after"] else "TOKENS DIFFER"
            print(f"  batch {batch} x {prompt} tokens ({same})")
            for op in ops:
                b, a = times[("before", op)], times[("after", op)]
                print(f"    {op:<20} before {_summary(b)} ms   after {_summary(a)} ms   before/after "
                      f"{_summary([x / y for x, y in zip(b, a)])}")
        del engine


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--only", choices=("mla", "qk_norm", "engine"), default=None)
    ap.add_argument("--engine-shapes", nargs="+", default=["1x512", "1x2048", "4x512"],
                    help="batch x prompt of the recorded prefills")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{_cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.reps} repeats (+1 warm-up)")
    with torch.inference_mode():
        if args.only in (None, "mla"):
            run_mla(args.tokens, args.reps)
        if args.only in (None, "qk_norm"):
            run_qk_norm(args.tokens, args.reps)
    if args.only in (None, "engine"):
        run_engine([tuple(int(v) for v in s.split("x")) for s in args.engine_shapes], args.reps)


if __name__ == "__main__":
    main()
