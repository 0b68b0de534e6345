"""The engine's own operator overheads: what its eager code pays per operator, per attention backend.

- `measure_op_overheads`: the median per-layer time of each engine operator (`attn_norm`,
  `qkv_proj`, `rope`, `kv_write`, `attention`, ...) over the decode steps of a tiny model's recorded
  greedy generation (hidden 64, 2 layers: no evaluated configuration leaks into the calibration),
  per backend (sdpa and naive; triton on CUDA). At that size the device work is a fraction of a
  microsecond, so what is measured is the engine's dispatch; on a CPU each operator runs right after
  a 32 MiB GEMV (`COLD_GEMM`), as in a real step whose weights stream through the caches. On CUDA the
  recorder's events measure the time the GPU waits between an operator's first and last launch.
- `measure_op_overhead_rows` (CPU): the same per compute dtype at one and two rows, and for the
  weight GEMMs on both sides of each edge between the engine's GEMM paths (llmperf's own kernels,
  AMX, oneDNN's packed GEMM: `llmperf.engine.paths`); every operator that reads no weights is
  measured in situ, in the recorded decode of a model with Llama 3.2 1B's layer shapes
  (`dispatch_spec`), between GEMMs whose weights stream from DRAM; a MoE layer's own ones
  (`moe_route`, `moe_sum`) in the same model with experts (`dispatch_moe_spec`). Where the engine runs a decode
  step's layers in one call (`engine.cpu_kernels.decode_layers`), each operator's record is its part
  of that call.
- `measure_step_overhead`: the host time of an engine step outside its forward pass (sampling and
  cache bookkeeping).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmperf.analysis.vocabulary import WEIGHT_MATMUL_OPS
from llmperf.measure.calibrate.ceilings import _gemm_path_edges
from llmperf.measure.calibrate.settings import Progress, Settings
from llmperf.measure.timers import gc_paused, steps_timed_unrecorded

WEIGHT_OPS = frozenset(str(op) for op in WEIGHT_MATMUL_OPS)  # the engine's weight GEMMs, by name


#: On a CPU, every operator of a real decode step dispatches right after a weight matrix streamed
#: through the caches, which evicts the interpreter's and the framework's dispatch state: measured on
#: the 2-core development machine, the engine's RMSNorm at (4, 1024) fp32 took 14 us back to back but
#: 95 us (1 thread) to 198 us (2 threads) right after a (4,1024)@(1024,7168) GEMM, and 76-117 us after
#: reading 32 MB. So the tiny model's operators are each timed right after such a GEMM (outside the
#: timed region), as `do_bench` flushes a GPU's L2 before each call. A GPU engine's host never streams
#: the weights, so CUDA runs keep warm host caches.
COLD_GEMM = (1024, 8192)  # (K, N) of the fp32 GEMV before each operator: 32 MiB of weights, two of them


def _cold_caches(device: Any) -> Callable[[], Any] | None:
    """The hook a CPU recorder runs before each operator: a GEMV over one of two 32 MiB weight matrices
    in turn (at the calibration's threads, like the engine's own projections)."""
    import itertools

    import torch

    if device.type != "cpu":
        return None
    k, n = COLD_GEMM
    x = torch.randn(1, k)
    weights = itertools.cycle([torch.randn(k, n), torch.randn(k, n)])
    return lambda: torch.matmul(x, next(weights))


#: the tiny model of the engine measurements: hidden 64, 2 layers (nothing like an evaluated model)
TINY_SPEC = dict(name="calibrate-tiny", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                 num_kv_heads=2, ffn_size=128, max_positions=256)


def op_overhead_backends(device: Any) -> tuple[str, ...]:
    """The attention backends whose operator overheads are measured: Triton only where it is timed."""
    return ("sdpa", "naive", "triton") if device.type == "cuda" else ("sdpa", "naive")


#: Recorded and unrecorded runs of the tiny model, interleaved, whose median recorder share moves the
#: figures: one pair on the 2026-11-27m H100 read -7.9 to +24.6 us a call for the same Triton engine across
#: four tiny models (negative: the unrecorded pass came out slower, which only a moving host explains).
SHARE_PAIRS = 3


def measure_op_overheads(s: Settings, device: Any, progress: Progress, *, cold: bool = True,
                         dtype: str | None = None, batch: int = 1, spec: dict[str, Any] | None = None,
                         model: Any = None, unrecorded: bool | None = None,
                         notes: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Per attention backend, the median time of one call of each engine operator over the decode
    steps of a recorded greedy generation of `batch` sequences at `dtype` (default: bf16 on CUDA,
    fp32 on CPU; per layer for per-layer operators) by the model `spec` (default: the tiny model); on
    a CPU with `cold`, each operator right after a 32 MiB GEMV (`_cold_caches`). `model`: that model
    already built at `dtype`, run by every backend's engine (default: one built per backend).
    `unrecorded` (default: on CUDA, where `profile` times steps without recording): each call's figure
    moves by the recorder's share (`recorder_share`), so that a decode step's calls add up to its
    unrecorded forward pass: the median share of `SHARE_PAIRS` interleaved recorded and unrecorded runs
    (the figures pool the recorded runs' calls); the share is noted in `notes`."""
    import statistics
    from collections import defaultdict

    import torch

    from llmperf.engine import Engine, Recorder, SamplingParams, build_model
    from llmperf.specs import ModelSpec

    spec = ModelSpec(**(spec or TINY_SPEC))
    before_op = _cold_caches(device) if cold else None
    unrecorded = steps_timed_unrecorded(device.type) if unrecorded is None else unrecorded
    dtype = dtype or ("bf16" if device.type == "cuda" else "fp32")
    out: dict[str, dict[str, float]] = {}
    prompt = [[1, 2, 3, 4]] * batch
    params = SamplingParams(max_new_tokens=s.op_overhead_tokens, min_new_tokens=s.op_overhead_tokens)
    for backend in op_overhead_backends(device):
        progress(f"operator overheads ({spec.name}, {backend}{', cold caches' if before_op else ''})")
        try:
            net = model or build_model(spec, seed=0, dtype=dtype, device=device, attention=backend)
            engine = Engine(net, cache="contiguous", attention=backend)
            engine.generate(prompt, params)  # warm-up: the same lengths, so every kernel is compiled
            pairs = []  # (recorded, unrecorded or None), interleaved so that a host's drift falls on both
            with gc_paused():  # as profile times the engine: no garbage collection inside a timed operator
                for _ in range(SHARE_PAIRS if unrecorded else 1):
                    rec = Recorder(device, before_op=before_op)
                    engine.generate(prompt, params, recorder=rec)
                    bare = None
                    if unrecorded:
                        bare = Recorder(device, ops=False)
                        engine.generate(prompt, params, recorder=bare)
                    pairs.append((rec, bare))
        except Exception:  # noqa: BLE001 - a backend this build cannot run keeps the per-kind figures (noted)
            continue
        samples: dict[str, list[float]] = defaultdict(list)
        for rec, _ in pairs:
            for r in rec.trace.ops:
                if r.phase == "decode":
                    samples[r.op].append(r.seconds)
        out[backend] = {op: float(statistics.median(v)) for op, v in samples.items()}
        shares = [recorder_share(rec.trace, bare.trace) for rec, bare in pairs if bare is not None]
        shares = [sh for sh in shares if sh[1]]
        if shares:  # the pair whose share is the median (an odd count): its own sums in the note
            share, calls, summed, forward = sorted(shares)[len(shares) // 2]
            out[backend] = {op: max(v - share, 0.0) for op, v in out[backend].items()}
            if notes is not None:
                spread = (f" (median of {len(shares)} interleaved pairs of runs: "
                          f"{', '.join(f'{sh[0] * 1e6:+.2f}' for sh in shares)} us)" if len(shares) > 1 else "")
                notes.append(f"operator overheads ({spec.name}, {backend}): each call {share * 1e6:+.2f} us less, "
                             f"the recorder's share{spread}: its {calls} calls a decode step add up to "
                             f"{summed * 1e3:.3f} ms recorded, the unrecorded forward pass takes "
                             f"{forward * 1e3:.3f} ms")
        del engine, net
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def dispatch_spec(hidden: int) -> dict[str, Any]:
    """The model whose recorded decode gives a CPU's in-situ dispatch (`Settings.dispatch_hidden`): 2
    layers with Llama 3.2 1B's shapes at hidden 2048 (FFN 4x, heads of 64, 4 query heads per KV
    head), vocabulary 256. Nothing like an evaluated model."""
    heads = max(hidden // 64, 1)
    return dict(name="calibrate-dispatch", vocab_size=256, hidden_size=hidden, num_layers=2, num_heads=heads,
                num_kv_heads=max(heads // 4, 1), ffn_size=4 * hidden, max_positions=256)


#: the operators only a mixture-of-experts layer runs that read no weights: the router's choice (about
#: ten small torch calls) and the sum of the experts' outputs (a call per expert), timed in situ in
#: `dispatch_moe_spec`'s decode (on the 2-core CPU they took 0.13-0.38 ms a layer where the per-kind
#: dispatch priced about 1 us: reports/profile, runs 2026-11-27f-h)
MOE_DISPATCH_OPS = ("moe_route", "moe_sum")


def dispatch_moe_spec(hidden: int) -> dict[str, Any]:
    """`dispatch_spec` with a mixture of experts on both layers (8 experts of a quarter of its width,
    2 a token, softmax routing renormalised as Qwen3-MoE's): the model whose recorded decode gives
    `MOE_DISPATCH_OPS`' in-situ dispatch."""
    return dict(dispatch_spec(hidden), name="calibrate-dispatch-moe", num_experts=8, experts_per_token=2,
                moe_ffn_size=max(hidden // 4, 16))


#: the tiny model with experts (8 of width 32, 2 a token, softmax routing renormalised as Qwen3-MoE's)
#: whose recorded decode gives a GPU's `MOE_DISPATCH_OPS` (a host-bound GPU engine pays the same host
#: time at any width: measured on an H100 on 2026-11-27, Qwen3-30B-A3B's router choice took 0.9 ms a
#: layer and its sum 0.13 ms an expert, recorded, where the per-kind figures priced 10 us and 9 us)
TINY_MOE_SPEC = dict(TINY_SPEC, name="calibrate-tiny-moe", num_experts=8, experts_per_token=2, moe_ffn_size=32)


#: the tiny model with a norm over each query and key head (Qwen3's), Gemma's sandwich norms and its
#: embedding scale, and the operators only it runs (measured on an H100 on 2026-11-27, Qwen3-30B-A3B's
#: `qk_norm` recorded 2.5-4.8x its per-kind price: it normalises the query and the key heads apart)
NORMS_FIELDS = dict(qk_norm="rmsnorm", sandwich_norms=True, embedding_scale=True)
TINY_NORMS_SPEC = dict(TINY_SPEC, name="calibrate-tiny-norms", **NORMS_FIELDS)
NORM_OPS = ("qk_norm", "post_attn_norm", "post_mlp_norm", "embed_scale")
#: the tiny model with multi-head latent attention (DeepSeek's: a low-rank query, a latent of 32, rotary
#: width 16 interleaved) and its own operators (on that H100 DeepSeek-V3's MLA projections, absorptions
#: and norms recorded 1.3-10x their per-kind prices)
TINY_MLA_SPEC = dict(TINY_SPEC, name="calibrate-tiny-mla", num_kv_heads=4, head_dim=32, kv_lora_rank=32,
                     q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, rotary_dim=16,
                     rope_interleaved=True)
MLA_OPS = ("q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "kv_b_proj", "q_absorb", "v_absorb")
#: what a GPU's calibration times beyond the Llama-shaped tiny model: (what, tiny model, its operators)
FAMILY_DISPATCH = (("MoE dispatch", TINY_MOE_SPEC, MOE_DISPATCH_OPS),
                   ("QK and sandwich norms", TINY_NORMS_SPEC, NORM_OPS), ("MLA", TINY_MLA_SPEC, MLA_OPS))


def measure_family_dispatch(s: Settings, device: Any, progress: Progress, notes: list[str] | None = None
                            ) -> dict[str, dict[str, float]]:
    """Per attention backend, the figures (one call each) of the operators today's families run and the
    Llama-shaped tiny model does not (`FAMILY_DISPATCH`: a MoE layer's router choice and experts' sum,
    the QK and sandwich norms and Gemma's embedding scale, MLA's projections, norms and absorptions),
    each from its tiny model's recorded decode as `measure_op_overheads` times the tiny model's (on
    CUDA less the recorder's share). A backend that cannot run one keeps the per-kind figures for its
    operators, noted."""
    out: dict[str, dict[str, float]] = {}
    for what, spec, keep in FAMILY_DISPATCH:
        runs = measure_op_overheads(s, device, progress, cold=False, spec=spec, notes=notes)
        got = {b: {op: v for op, v in ops.items() if op in keep} for b, ops in runs.items()}
        for b, ops in got.items():
            out.setdefault(b, {}).update(ops)
        missing = [b for b in op_overhead_backends(device) if not got.get(b)]
        if missing and notes is not None:
            notes.append(f"{what} ({', '.join(keep)}) not measured for {', '.join(missing)}: "
                         "the per-kind figures price them")
    return {b: ops for b, ops in out.items() if ops}


def dispatch_by_op_spec(hidden: int) -> dict[str, Any]:
    """`dispatch_spec` with a norm over each query and key head (Qwen3's), Gemma's norms after attention
    and after the MLP and its embedding scale (`NORMS_FIELDS`): the model whose decode, run operator by
    operator, gives the dispatch of every model whose decode step does not run in one call
    (`measure_by_op_rows`)."""
    return dict(dispatch_spec(hidden), name="calibrate-dispatch-by-op", **NORMS_FIELDS)


def measure_by_op_rows(s: Settings, device: Any, progress: Progress, notes: list[str] | None = None
                       ) -> dict[str, dict[str, dict[str, list[list[float]]]]]:
    """CPU: per compute dtype and backend, each operator that reads no weights as `[[rows, seconds],
    ...]` at `OVERHEAD_ROWS`, in situ in `dispatch_by_op_spec`'s decode with every operator called
    from Python (`decode_in_one_call` off). A Llama-shaped model's decode step runs its layers in one
    call of llmperf's kernels (`ModelSpec.one_call_layers`), which is what the rows table measures;
    every other model (today's families: a QK norm, sandwich norms, experts, MLA), a prefill, and a
    decode of more rows than the one call takes dispatch each operator from Python. Measured on the
    2-core development CPU (fp32, one row): an RMSNorm 2 us in the one call, 14-20 us one by one. {}
    when `s.dispatch_hidden` is 0 or the model cannot be built (noted)."""
    if not s.dispatch_hidden:
        return {}
    spec = dispatch_by_op_spec(s.dispatch_hidden)
    out: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for dname in OVERHEAD_DTYPES:
        if dname not in s.dtypes:
            continue
        runs = _situ_runs(s, device, progress, spec, dname, notes, "operators one by one",
                          "the rows table prices every model", one_call=False)
        if runs is not None:
            out[dname] = _rows_curves(runs, lambda op: op not in WEIGHT_OPS)
    return out


def _situ_runs(s: Settings, device: Any, progress: Progress, spec: dict[str, Any], dname: str,
               notes: list[str] | None, label: str, otherwise: str, one_call: bool = True
               ) -> dict[int, dict[str, dict[str, float]]] | None:
    """Per rows of `OVERHEAD_ROWS`, `measure_op_overheads` in situ (warm host, one model built at `dname`)
    over `spec`'s recorded decode; `one_call` False: every operator called from Python. None when the
    model cannot be built, noted as `label dname (name): not measured (why); otherwise`."""
    from llmperf.engine import build_model
    from llmperf.specs import ModelSpec

    try:
        model = build_model(ModelSpec(**spec), seed=0, dtype=dname, device=device)
    except (RuntimeError, ValueError, MemoryError) as exc:
        if notes is not None:
            notes.append(f"{label} {dname} ({spec['name']}): not measured ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); {otherwise}")
        return None
    model.decode_in_one_call = one_call
    runs = {rows: measure_op_overheads(s, device, progress, cold=False, dtype=dname, batch=rows, spec=spec,
                                       model=model) for rows in OVERHEAD_ROWS}
    del model
    return runs


def _rows_curves(runs: dict[int, dict[str, dict[str, float]]], keep: Callable[[str], bool]
                 ) -> dict[str, dict[str, list[list[float]]]]:
    """{backend: {operator: [[rows, seconds], ...]}} from per-rows runs: each operator `keep` takes that
    was measured at every rows of `OVERHEAD_ROWS`."""
    return {b: {op: [[r, runs[r][b][op]] for r in OVERHEAD_ROWS] for op in sorted(ops)
                if keep(op) and all(op in runs.get(r, {}).get(b, {}) for r in OVERHEAD_ROWS)}
            for b, ops in runs.get(OVERHEAD_ROWS[0], {}).items()}


def one_call_facts(device: Any) -> dict[str, Any]:
    """Where a CPU decode step runs its layers in one call (`engine.paths.one_call_rows`): the most rows
    per compute dtype (0: never) and the largest head dim the kernels take; {} on CUDA (never)."""
    if device.type != "cpu":
        return {}
    import torch

    from llmperf.engine.cpu import kernels
    from llmperf.engine.paths import one_call_rows

    return dict(max_head_dim=kernels.MAX_HEAD_DIM if kernels.available() else 0,
                rows={d: one_call_rows(t) if kernels.available() else 0
                      for d, t in (("fp32", torch.float32), ("bf16", torch.bfloat16))})


def in_situ(cold: dict[str, dict[str, float]], situ: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per backend, the weight GEMMs' dispatch from `cold` (the tiny model, a GEMV before each) and
    every other operator's from `situ` (a real layer's decode) where it was measured, with the
    operators only `situ` ran (`MOE_DISPATCH_OPS`)."""
    out = {}
    for backend, ops in cold.items():
        here = situ.get(backend, {})
        out[backend] = {op: (v if op in WEIGHT_OPS else here.get(op, v)) for op, v in ops.items()}
        out[backend].update({op: v for op, v in here.items() if op not in ops and op not in WEIGHT_OPS})
    return out


#: a routed expert's operators that read no weights and cost differently from a dense layer's, which
#: llmperf's engine calls once per expert (`EfficiencyTimeModel.expert_launches`): its activation runs
#: between an expert's small GEMMs, a dense layer's after a GEMM over the whole FFN (on the 2-core CPU
#: in situ at hidden 2048: 8.4 us a call against 19.4 us)
EXPERT_OPS = ("act",)


def _in_situ_overheads(s: Settings, device: Any, progress: Progress, dname: str, notes: list[str] | None
                       ) -> tuple[dict[int, dict[str, dict[str, float]]], dict[int, dict[str, dict[str, float]]]]:
    """Per rows of `OVERHEAD_ROWS`, the operators' dispatch in `dispatch_spec`'s decode at `dname`, and a
    routed expert's own (`EXPERT_OPS`, in `dispatch_moe_spec`'s) apart ({} when `s.dispatch_hidden` is
    0, or when a model cannot be built: noted, the cold figures stand)."""
    if not s.dispatch_hidden:
        return {}, {}
    out: dict[int, dict[str, dict[str, float]]] = {}
    experts: dict[int, dict[str, dict[str, float]]] = {}
    for spec, keep in ((dispatch_spec(s.dispatch_hidden), None), (dispatch_moe_spec(s.dispatch_hidden),
                                                                  MOE_DISPATCH_OPS)):
        what = "every operator keeps the cold figure" if keep is None else "the per-kind figures price them"
        runs = _situ_runs(s, device, progress, spec, dname, notes, "in-situ dispatch", what)
        if runs is None:
            if keep is None:
                return {}, {}
            continue
        for rows, by_backend in runs.items():
            for backend, ops in by_backend.items():
                mine = out.setdefault(rows, {}).setdefault(backend, {})
                mine.update(ops if keep is None else {op: v for op, v in ops.items() if op in keep})
                if keep is not None:
                    experts.setdefault(rows, {})[backend] = {op: v for op, v in ops.items() if op in EXPERT_OPS}
    return out, experts


def recorder_share(recorded: Any, bare: Any) -> tuple[float, int, float, float]:
    """What recording adds to each operator call of a decode step: (share in seconds, calls per
    step, the calls' recorded seconds per step, the unrecorded forward pass's seconds), from the
    traces of the same generation recorded (`recorded`) and unrecorded (`bare`, steps only).

    The share is (recorded calls' sum - unrecorded forward) / calls, medians over the decode steps;
    negative where the code between operators costs more than recording adds. On CUDA a call's two
    events take part of their own host time inside the interval they measure, and a host-bound step
    waits for it. The tiny model's share on an H100 (2026-11-27): 2.3 us a call with SDPA, 14 us with
    the Triton kernels; a real model's recorded steps ran 1.5-2.4x its unrecorded ones there (on a host
    that moved), more than this share explains. (0.0, 0, 0.0, 0.0) without decode steps in both."""
    import statistics
    from collections import defaultdict

    per_step: dict[int, list[float]] = defaultdict(list)
    for r in recorded.ops:
        if r.phase == "decode":
            per_step[r.step].append(r.seconds)
    forwards = [st.forward_seconds for st in bare.steps if st.phase == "decode"]
    if not per_step or not forwards:
        return 0.0, 0, 0.0, 0.0
    calls = int(statistics.median(len(v) for v in per_step.values()))
    summed = float(statistics.median(sum(v) for v in per_step.values()))
    forward = float(statistics.median(forwards))
    return (summed - forward) / calls, calls, summed, forward


OVERHEAD_ROWS = (1, 2)  # decoding one and two sequences; weight GEMMs add their path edges (gemm_dispatch_rows)
OVERHEAD_DTYPES = ("fp32", "bf16")  # the CPU dtypes whose GEMM path differs (fp16 is never packed)


def gemm_dispatch_rows(dname: str, device: Any) -> tuple[int, ...]:
    """The rows at which `calibrate` times a weight GEMM's dispatch for the engine at `dname`: 1 and 2
    (`OVERHEAD_ROWS`, decoding one and two sequences) and both sides of every edge between the
    engine's GEMM paths (`engine.paths.gemm_path_edges`): fp32 with llmperf's kernels 1, 2, 8, 9 (its
    own GEMM to 8 rows, oneDNN's packed one from 9), bf16 1, 2, 4, 5 (1, 2, 3, 16, 17 on an AMX CPU:
    its own GEMM to 2 rows, AMX 3-16, oneDNN from 17); with torch's kernels alone
    fp32 1, 2 (the GEMV, then packed) and bf16 1, 2 (always packed)."""
    return tuple(sorted(set(OVERHEAD_ROWS) | set(_gemm_path_edges(dname, device))))


def measure_op_overhead_rows(s: Settings, device: Any, progress: Progress, fp32_rows1: dict[str, dict[str, float]],
                             notes: list[str] | None = None
                             ) -> tuple[dict[str, dict[str, dict[str, list[list[float]]]]],
                                        dict[str, dict[str, dict[str, list[list[float]]]]]]:
    """CPU: each engine operator's dispatch per compute dtype (fp32, bf16) and per rows, as
    `[[rows, seconds], ...]`: the weight GEMMs cold (the tiny model, a 32 MiB GEMV before each;
    `fp32_rows1` is the fp32 one-sequence run already made) at `gemm_dispatch_rows` (1, 2 and each side of
    every edge between the engine's GEMM paths, so that a batch is priced with the path it runs),
    every other operator at 1 and 2 rows in situ (`dispatch_spec`'s decode, unless `s.dispatch_hidden`
    is 0). Measured 2026-11-23 on the 2-core CPU: a projection took 38 us at one fp32 row (torch's
    matrix-vector kernel) and 123 us at two (oneDNN's packed GEMM), bf16 about 130 us at any rows
    (packed); llmperf's own GEMM 72-84 us at one bf16 row. Second, the same for a routed expert's own
    operators (`EXPERT_OPS`, in `dispatch_moe_spec`'s decode: one call each)."""
    out: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    expert_out: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for dname in OVERHEAD_DTYPES:
        if dname not in s.dtypes:
            continue
        all_rows = gemm_dispatch_rows(dname, device)
        runs = {}
        for rows in all_rows:
            if dname == "fp32" and rows == 1 and fp32_rows1:
                runs[rows] = fp32_rows1
                continue
            progress(f"operator overheads ({dname}, {rows} row{'s' if rows > 1 else ''}, cold caches)")
            runs[rows] = measure_op_overheads(s, device, progress, dtype=dname, batch=rows)
        situ_rows, experts = _in_situ_overheads(s, device, progress, dname, notes)
        for rows, situ in situ_rows.items():
            runs[rows] = in_situ(runs[rows], situ)
        expert = _rows_curves(experts, lambda op: True)
        if any(expert.values()):
            expert_out[dname] = {b: ops for b, ops in expert.items() if ops}
        table: dict[str, dict[str, list[list[float]]]] = {}
        for backend in runs[all_rows[0]]:
            # every operator at the decode rows; a weight GEMM at each of its rows too
            ops = {op for op in set.intersection(*(set(runs[r].get(backend, {})) for r in OVERHEAD_ROWS))
                   if op not in WEIGHT_OPS or all(op in runs[r].get(backend, {}) for r in all_rows)}
            table[backend] = {op: [[r, runs[r][backend][op]] for r in (all_rows if op in WEIGHT_OPS else OVERHEAD_ROWS)]
                              for op in sorted(ops)}
        out[dname] = table
    return out, expert_out


def measure_step_overhead(device: Any, progress: Progress) -> float:
    """Host time of an engine decode step outside its forward pass (sampling, cache bookkeeping),
    median over the steps of a tiny model's greedy generation."""
    import statistics

    from llmperf.engine import Engine, Recorder, SamplingParams, build_model
    from llmperf.specs import ModelSpec

    progress("engine step overhead")
    spec = ModelSpec(**TINY_SPEC)
    engine = Engine(build_model(spec, seed=0, device=device), cache="contiguous")
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4))  # warm-up
    rec = Recorder(device, ops=False)
    with gc_paused():
        engine.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=32), recorder=rec)
    gaps = [st.seconds - st.forward_seconds for st in rec.trace.steps if st.phase == "decode"]
    return max(statistics.median(gaps), 0.0) if gaps else 0.0
