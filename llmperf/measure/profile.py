"""`llmperf profile`: measure a model on this device op by op and step by step, and join every
measurement with its prediction under two time models.

For every configuration (batch x prompt length x generation length):
(a) micro-benchmarks (`kind="micro"`) of each operator at the model's real shapes, one layer's call:
    the projections and FFN as GEMM (prefill, rows = batch * prompt) and GEMV-like (decode, rows =
    batch), the LM head, and attention prefill / decode through the engine's backend (SDPA, naive, or
    on CUDA the Triton kernels). Each weight is rotated through enough copies to exceed the last-level
    cache, as the weights of a real forward pass do;
(b) the engine's whole greedy generation (`kind="generation"`), timed per step and per operator with
    `llmperf.engine.Recorder` (per-layer records summed over layers).

Two runs of each generation on CUDA. Per-operator recording costs host time (a pair of CUDA events
created and recorded per operator) and an eager engine on a GPU is launch-bound, so a recorded
step is slower than a real one. The step, TTFT, TPOT and end-to-end times (`steps.csv`,
`generations.csv`, the errors) therefore come from a run recorded per step only (`ops=False`:
synchronise, perf_counter, synchronise), and the per-operator breakdown (`ops.csv`, kind
`generation`) from a second, recorded run of the same greedy generation; `steps.csv` keeps the
recorded run's step time beside (`measured_recorded_s`) so the instrumentation's cost shows. On
CPU one recorded run serves both by default: there an operator's record is two `perf_counter`
calls and a small object, about a microsecond against the milliseconds of any operator the CPU
runs are about (`separate_step_run=True` forces the second run on CPU too). `run.json`
`measurements` says which run every number came from.

Each measurement is joined with `llmperf.analysis` by (phase, operator, batch, q_len, kv_len) through
the shared vocabulary (`llmperf.analysis.vocabulary`): a fused measurement (`qkv_proj`, `gate_up_proj`)
is joined to the sum of its parts (`FUSED_PARTS`), so the engine may time either. Predictions:
`roofline` (e = 1, overhead 0, on the same hardware spec: for `local`, the ceilings calibrate
measured, i.e. uncalibrated but peak-measured) and `calibrated` (the spec's time model,
`llmperf.analysis.timemodel`). The calibrated terms come from `llmperf calibrate`'s own
micro-benchmarks only: nothing is fitted here, so the errors reported on the generations are
held-out errors.

Errors (`run.json` "errors"): median and p90 of |predicted / measured - 1| per phase over every
prefill step, every decode step, and every whole generation (`e2e`).

Exact cross-checks (`run.json` "checks"): the analytical matmul FLOPs of a forward pass against
`torch.utils.flop_counter.FlopCounterMode` on the real model (dense convention, naive attention so
every product is a counted matmul); the analytical weight bytes against the real parameters; the
analytical KV-cache bytes against the real cache's storage.

Files (the run-directory contract, see docs/schemas.md): `run.json` (written atomically, updated after
every configuration), `ops.csv`, `steps.csv`, `generations.csv` (rows appended and flushed as they
are measured: an interrupted sweep keeps them).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from llmperf.analysis.memory import activation_peak_bytes, weight_bytes_per_gpu
from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.roofline import OpCost
from llmperf.analysis.timemodel import ROOFLINE_MODEL, EfficiencyTimeModel, time_model_for
from llmperf.analysis.vocabulary import FUSED_PARTS, MODEL_LEVEL_OPS, WEIGHT_MATMUL_OPS, Op, Phase, as_op
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision

SCHEMA_VERSION = 1
E2E = "e2e"  # the error row of whole generations (not a step phase)
OPS_COLUMNS = ("kind", "phase", "op", "batch", "q_len", "kv_len", "measured_s", "measured_spread_s", "n",
               "predicted_roofline_s", "predicted_calibrated_s", "ratio_roofline", "ratio_calibrated", "flops",
               "bytes", "intensity", "achieved_flops_per_s", "achieved_bytes_per_s", "roofline_fraction", "bound")
STEPS_COLUMNS = ("config", "step", "phase", "batch", "q_len", "kv_len", "measured_s", "measured_recorded_s",
                 "predicted_roofline_s", "predicted_calibrated_s")
GENERATIONS_COLUMNS = ("config", "batch", "prompt_len", "gen_len", "measured_ttft_s", "measured_tpot_s",
                       "measured_e2e_s", "predicted_ttft_s_roofline", "predicted_tpot_s_roofline",
                       "predicted_e2e_s_roofline", "predicted_ttft_s_calibrated", "predicted_tpot_s_calibrated",
                       "predicted_e2e_s_calibrated")
BACKENDS = ("sdpa", "naive", "triton")
KV_KINDS = ("contiguous", "paged")
MEMORY_HEADROOM = 0.9  # refuse a run that needs more than this share of the free memory
CACHE_ROTATION_FACTOR = 2  # rotate weights through copies totalling 2x the last-level cache
PAGED_BLOCK = 16  # tokens per block of the paged cache (vLLM's default, the engine's)
MICRO_BUDGET_S = 2.0  # a micro-benchmark stops repeating (after two calls) once it has spent this

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class ProfileSettings:
    model: str
    hardware: str
    device: str = "cpu"
    batches: tuple[int, ...] = (1,)
    prompt_lens: tuple[int, ...] = (64,)
    gen_lens: tuple[int, ...] = (16,)
    dtype: str = "fp32"
    backend: str = "sdpa"
    kv: str = "contiguous"
    layers: int | None = None
    reps: int = 5
    micro: bool = True
    seed: int = 0
    threads: int | None = None  # CPU threads (torch.set_num_threads); None: torch's default
    separate_step_run: bool | None = None  # time steps in an unrecorded run; None: on CUDA only

    @property
    def two_runs(self) -> bool:
        """Whether steps are timed in a run without per-operator recording (see the module docstring)."""
        return self.device == "cuda" if self.separate_step_run is None else self.separate_step_run

    def configs(self) -> list[tuple[int, int, int]]:
        return [(b, p, g) for b in self.batches for p in self.prompt_lens for g in self.gen_lens]

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise SpecError(f"--backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.kv not in KV_KINDS:
            raise SpecError(f"--kv: must be one of {', '.join(KV_KINDS)}, got {self.kv!r}")
        if self.device not in ("cpu", "cuda"):
            raise SpecError(f"--device: must be cpu or cuda, got {self.device!r}")
        if self.device == "cpu" and self.backend == "triton":
            raise SpecError("--backend triton: on CPU the Triton kernels run in the interpreter, which says "
                            "nothing about speed, so they are not timed (use sdpa or naive, or --device cuda)")
        if self.layers is not None and self.layers < 1:
            raise SpecError(f"--layers: must be a positive integer, got {self.layers}")
        if self.threads is not None and self.threads < 1:
            raise SpecError(f"--threads: must be a positive integer, got {self.threads}")
        if self.reps < 1:
            raise SpecError(f"--reps: must be a positive integer, got {self.reps}")
        for name, values in (("--batch", self.batches), ("--prompt-len", self.prompt_lens),
                             ("--gen-len", self.gen_lens)):
            if not values or min(values) < 1:
                raise SpecError(f"{name}: every value must be a positive integer, got {list(values)}")


@dataclass
class Predictor:
    """Predicted seconds of operators under the roofline and the calibrated model."""

    fm: ForwardModel
    hardware: HardwareSpec
    compute_dtype: str
    calibrated: EfficiencyTimeModel | None

    def cost(self, op: Op, batch: int, q_len: int, kv_len: int) -> OpCost | None:
        """One call's cost (one layer, or the model for embed/final_norm/lm_head); a fused name is the sum
        of its parts, its input read once. None when the model has no such operator."""
        for c in self._layer_and_model_ops(batch, q_len, kv_len):
            if c.name == op.value:
                return c
        if op in FUSED_PARTS:
            parts = [self.cost(p, batch, q_len, kv_len) for p in FUSED_PARTS[op]]
            parts = [p for p in parts if p is not None]
            if not parts:
                return None
            fields = ("flops", "weight_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes", "comm_bytes")
            return OpCost(name=op.value, kind=parts[0].kind, act_read_bytes=parts[0].act_read_bytes,
                          **{f: sum(getattr(p, f) for p in parts) for f in fields})
        split = replace(self.fm, fused_qkv=False, fused_gate_up=False)  # a part of a fused GEMM (micro rows)
        for c in split.head_ops(batch, q_len, kv_len) + split.layer_ops(batch, q_len, kv_len):
            if c.name == op.value:
                return c
        return None

    def _layer_and_model_ops(self, batch: int, q_len: int, kv_len: int) -> list[OpCost]:
        fm = self.fm
        return (fm.head_ops(batch, q_len, kv_len) + fm.layer_ops(batch, q_len, kv_len)
                + fm.tail_ops(batch, q_len, kv_len))

    @staticmethod
    def rows(cost: OpCost, batch: int, q_len: int, fm: ForwardModel) -> int:
        """Tokens through the operator: the LM head sees one row per sequence unless all logits."""
        if cost.name == Op.lm_head.value and not fm.all_logits:
            return batch
        return batch * q_len

    def times(self, cost: OpCost, batch: int, q_len: int, micro: bool = False) -> tuple[float, float]:
        """(roofline, calibrated) seconds of one call; calibrated is NaN without a calibrated model.

        `micro`: an isolated kernel call (a micro-benchmark), priced with the per-kind overhead of one
        tiny framework call; the per-operator overheads are what the ENGINE pays around its kernels
        (reshapes, cache bookkeeping, several calls per operator), which a lone call does not."""
        rows = self.rows(cost, batch, q_len, self.fm)
        roof = float(ROOFLINE_MODEL.op_time_s(cost, self.hardware, self.compute_dtype, rows))
        tm = self.calibrated
        if tm is not None and micro:
            tm = tm.per_kind_overheads()
        cal = float(tm.op_time_s(cost, self.hardware, self.compute_dtype, rows)) if tm else math.nan
        return roof, cal

    def forward(self, batch: int, q_len: int, kv_len: int) -> tuple[float, float]:
        """(roofline, calibrated) seconds of a whole forward pass (per-layer operators x layers)."""
        L = self.fm.model.num_layers
        roof = cal = 0.0
        for c in self._layer_and_model_ops(batch, q_len, kv_len):
            r, k = self.times(c, batch, q_len)
            mult = L if c.per_layer else 1
            roof, cal = roof + mult * r, cal + mult * k
        return roof, cal

    def step(self, batch: int, q_len: int, kv_len: int) -> tuple[float, float]:
        """A whole engine step: the forward pass, plus the calibrated host overhead per step."""
        roof, cal = self.forward(batch, q_len, kv_len)
        return roof, cal + (self.calibrated.step_overhead_s if self.calibrated else math.nan)


# ---- run directory ------------------------------------------------------------------------------------


def _atomic_json(path: Path, doc: dict[str, Any]) -> None:
    """run.json through `llmperf.outputs` (atomic: a reader never sees half of it)."""
    from llmperf.outputs import write_file
    write_file(path, json.dumps(doc, indent=2, default=_json_default, allow_nan=False), "--output")


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _plain_dict(x: Any) -> Any:
    """Tuples and mappings as JSON lists and dicts (a spec's `to_dict`)."""
    if isinstance(x, dict) or hasattr(x, "items"):
        return {str(k): _plain_dict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain_dict(v) for v in x]
    return x


def _finite(x: Any) -> Any:
    """NaN -> None for JSON (strict JSON has no NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


class _Table:
    """A CSV file whose rows are appended and flushed one by one."""

    def __init__(self, folder: Any, name: str, columns: Iterable[str]) -> None:
        self.path = folder.path / name
        self.columns = tuple(columns)
        self._fh = folder.open_stream(name)  # llmperf.outputs.OutputDir: checked, 0666 less the umask
        self._writer = csv.DictWriter(self._fh, fieldnames=self.columns)
        self._writer.writeheader()
        self._fh.flush()
        self.rows: list[dict[str, Any]] = []

    def append(self, row: dict[str, Any]) -> None:
        missing = set(self.columns) - set(row)
        assert not missing, f"{self.path.name}: row lacks {sorted(missing)}"
        self._writer.writerow({k: row[k] for k in self.columns})
        self._fh.flush()
        self.rows.append(row)

    def close(self) -> None:
        self._fh.close()


@dataclass
class ProfileResult:
    """What `run_profile` produced (the same content as the run directory)."""

    out_dir: Path
    run: dict[str, Any]
    ops: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    generations: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False


# ---- errors and rows --------------------------------------------------------------------------------


def error_stats(pred: Iterable[float], meas: Iterable[float]) -> tuple[float, float, int]:
    """Median and p90 of |pred / meas - 1| (pairs with a NaN prediction are skipped)."""
    errs = sorted(abs(p / m - 1) for p, m in zip(pred, meas) if m > 0 and math.isfinite(p))
    if not errs:
        return math.nan, math.nan, 0
    return float(np.median(errs)), float(np.quantile(errs, 0.9)), len(errs)


def errors_table(steps: list[dict[str, Any]], gens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for model in ("roofline", "calibrated"):
        for phase in (Phase.prefill.value, Phase.decode.value):
            rows = [s for s in steps if s["phase"] == phase]
            med, p90, n = error_stats([r[f"predicted_{model}_s"] for r in rows], [r["measured_s"] for r in rows])
            out.append(dict(phase=phase, model=model, median_abs_err=med, p90_abs_err=p90, n=n))
        med, p90, n = error_stats([g[f"predicted_e2e_s_{model}"] for g in gens], [g["measured_e2e_s"] for g in gens])
        out.append(dict(phase=E2E, model=model, median_abs_err=med, p90_abs_err=p90, n=n))
    return out


def op_row(kind: str, phase: str, op: str, batch: int, q_len: int, kv_len: int, measured: float, spread: float,
           n: int, cost: OpCost | None, pred: tuple[float, float], hardware: HardwareSpec, compute_dtype: str,
           layers: int = 1) -> dict[str, Any]:
    """One ops.csv row; `layers` multiplies a per-layer cost when the measurement sums the layers."""
    roof, cal = pred
    flops = float(cost.flops) * layers if cost else math.nan
    nbytes = float(cost.bytes_total) * layers if cost else math.nan
    compute_s = flops / (hardware.peak_flops_per_s(compute_dtype) if cost and cost.kind in ("matmul", "attention")
                         else hardware.peak_flops_per_s("fp32"))
    memory_s = nbytes / hardware.mem_bandwidth_bytes_per_s
    return dict(
        kind=kind, phase=phase, op=op, batch=batch, q_len=q_len, kv_len=kv_len, measured_s=measured,
        measured_spread_s=spread, n=n, predicted_roofline_s=roof, predicted_calibrated_s=cal,
        ratio_roofline=roof / measured if measured > 0 else math.nan,
        ratio_calibrated=cal / measured if measured > 0 else math.nan,
        flops=flops, bytes=nbytes, intensity=flops / nbytes if nbytes else math.nan,
        achieved_flops_per_s=flops / measured if measured > 0 else math.nan,
        achieved_bytes_per_s=nbytes / measured if measured > 0 else math.nan,
        roofline_fraction=roof / measured if measured > 0 else math.nan,
        bound="compute" if compute_s > memory_s else "memory")


# ---- memory check ---------------------------------------------------------------------------------------


def memory_needed(spec: ModelSpec, prec: Precision, settings: ProfileSettings, attention: str) -> dict[str, float]:
    """Predicted bytes of the largest configuration: weights, KV cache, transient activations."""
    b, p, g = max(settings.batches), max(settings.prompt_lens), max(settings.gen_lens)
    weights = weight_bytes_per_gpu(spec, prec)
    kv = b * (p + g) * spec.kv_bytes_per_token(prec.kv)
    act = float(activation_peak_bytes(spec, prec, b, p, p, attention=attention))
    return dict(weights=weights, kv=kv, activations=act, total=weights + kv + act)


def check_fits(need: dict[str, float], available: float, device: str) -> None:
    if need["total"] > MEMORY_HEADROOM * available:
        gib = 2**30
        raise SpecError(
            f"--batch/--prompt-len/--gen-len: the largest configuration needs {need['total'] / gib:.2f} GiB "
            f"(weights {need['weights'] / gib:.2f} + KV cache {need['kv'] / gib:.2f} + activations "
            f"{need['activations'] / gib:.2f}) but {device} has {available / gib:.2f} GiB free "
            f"(at most {MEMORY_HEADROOM:.0%} is used); lower the batch or lengths, or use --layers")


# ---- cross-checks (torch) -----------------------------------------------------------------------------


def cross_checks(model: Any, spec: ModelSpec, prec: Precision, settings: ProfileSettings) -> list[dict[str, Any]]:
    """FLOPs against FlopCounterMode, weight bytes against the parameters, KV bytes against the cache."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from llmperf.engine.cache import make_cache

    checks = []
    batch, seq = 1, min(min(settings.prompt_lens), 32)
    fm = ForwardModel(model=spec, precision=prec, attention="naive", attention_flops="dense")
    analytical = 0.0
    for c in fm.forward_ops(batch, seq, seq):
        if c.kind in ("matmul", "attention"):  # the counter counts matrix products, and a bias add not at all
            bias = batch * seq * _bias_width(spec, c.name) if _has_bias(spec, c.name) else 0
            analytical += c.flops - bias * (spec.num_layers if c.per_layer else 1)
    backend = model.attention_backend
    tokens = torch.randint(0, spec.vocab_size, (batch, seq), device=model.device)
    try:
        model.set_attention("naive")  # every attention product a plain matmul the counter sees
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            model(tokens)
    finally:
        model.set_attention(backend)
    counted = counter.get_total_flops()
    checks.append(dict(name="matmul FLOPs vs FlopCounterMode", passed=int(analytical) == int(counted),
                       detail=f"analytical {int(analytical)} vs counted {int(counted)} (prefill of {seq} tokens, "
                              "dense attention, logits of the last position)"))
    seen: set[int] = set()
    real = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:  # tied embeddings are one tensor
            seen.add(p.data_ptr())
            real += p.numel() * p.element_size()
    predicted_w = weight_bytes_per_gpu(spec, prec)
    checks.append(dict(name="weight bytes vs parameters", passed=int(predicted_w) == real,
                       detail=f"analytical {int(predicted_w)} B vs real {real} B"))
    b, ctx = max(settings.batches), max(settings.prompt_lens) + max(settings.gen_lens)
    cache = make_cache(settings.kv, spec, dtype=model.dtype, device=model.device, max_batch=b, max_seq_len=ctx,
                       block_size=PAGED_BLOCK)
    # a paged cache holds whole blocks of 16 tokens per sequence (the engine's default block size)
    slots = ctx if settings.kv == "contiguous" else -(-ctx // PAGED_BLOCK) * PAGED_BLOCK
    predicted_kv = b * slots * spec.kv_bytes_per_token(prec.kv)
    checks.append(dict(name="KV cache bytes vs cache storage", passed=int(predicted_kv) == int(cache.capacity_bytes),
                       detail=f"analytical {int(predicted_kv)} B vs real {int(cache.capacity_bytes)} B "
                              f"({settings.kv}, {b} x {slots} token slots)"))
    del cache
    return checks


def _has_bias(spec: ModelSpec, name: str) -> bool:
    return ((name in ("q_proj", "k_proj", "v_proj") and spec.qkv_bias) or (name == "o_proj" and spec.out_bias)
            or (name in ("up_proj", "gate_proj", "down_proj") and spec.mlp_bias))


def _bias_width(spec: ModelSpec, name: str) -> int:
    return {"q_proj": spec.q_size, "k_proj": spec.kv_size, "v_proj": spec.kv_size, "o_proj": spec.hidden_size,
            "up_proj": spec.ffn_size, "gate_proj": spec.ffn_size, "down_proj": spec.hidden_size}[name]


# ---- micro-benchmarks (torch) ---------------------------------------------------------------------------


def _weight_shape(spec: ModelSpec, op: Op) -> tuple[int, int] | None:
    """(in, out) of a weight matmul, or None when the model has no such operator."""
    C, F_ = spec.hidden_size, spec.ffn_size
    shapes = {Op.q_proj: (C, spec.q_size), Op.k_proj: (C, spec.kv_size), Op.v_proj: (C, spec.kv_size),
              Op.o_proj: (spec.q_size, C), Op.up_proj: (C, F_), Op.down_proj: (F_, C), Op.lm_head: (C, spec.vocab_size)}
    if spec.ffn_kind == "swiglu":
        shapes[Op.gate_proj] = (C, F_)
    return shapes.get(op)


def _llc_bytes(dev: dict[str, Any]) -> int:
    caches = dev.get("caches") or {}
    return int(max(caches.values()) if caches else dev.get("l2_cache_bytes", 0))


def micro_benchmarks(model: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, batch: int,
                     prompt_len: int, gen_len: int, llc: int) -> list[dict[str, Any]]:
    """Every weight matmul and the attention of one layer, at this configuration's prefill and at its
    middle decode step (context prompt + gen / 2)."""
    import torch

    from llmperf.engine.ops import ops_for
    from llmperf.measure.timers import time_fn

    device, dtype = model.device, model.dtype
    in_out = False  # the engine stores (out, in) on every device
    gemm = ops_for(device, dtype)  # the engine's GEMM: packed where it packs
    linear = gemm.linear
    elem = torch.empty((), dtype=dtype).element_size()
    rows_out = []
    shapes = [(Phase.prefill, prompt_len, prompt_len), (Phase.decode, 1, prompt_len + max(gen_len // 2, 1))]
    ops = [op for op in Op if op in WEIGHT_MATMUL_OPS and op not in FUSED_PARTS and _weight_shape(spec, op)]
    for phase, q_len, kv_len in shapes:
        for op in ops:
            d_in, d_out = _weight_shape(spec, op)
            rows = batch if (op is Op.lm_head) else batch * q_len
            copies = max(1, min(8, -(-CACHE_ROTATION_FACTOR * llc // (d_in * d_out * elem)))) if llc else 1
            ws = [torch.randn((d_in, d_out) if in_out else (d_out, d_in), device=device, dtype=dtype)
                  for _ in range(copies)]
            x = torch.randn(rows, d_in, device=device, dtype=dtype)
            for w in ws:
                linear(x, w)  # pack every copy before timing
            state = {"i": 0}

            def call(x=x, ws=ws, state=state) -> Any:
                state["i"] = (state["i"] + 1) % len(ws)
                return linear(x, ws[state["i"]])

            t = time_fn(call, device, reps=settings.reps, warmup=1, max_time_s=MICRO_BUDGET_S)
            cost = pred.cost(op, batch, q_len, kv_len)
            rows_out.append(op_row("micro", phase.value, op.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                                   cost, pred.times(cost, batch, q_len, micro=True), pred.hardware, pred.compute_dtype))
            del ws, x
            gemm.clear()
        rows_out += _attention_micro(model, spec, pred, settings, batch, phase, q_len, kv_len)
    return rows_out


def _attention_micro(model: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, batch: int,
                     phase: Phase, q_len: int, kv_len: int) -> list[dict[str, Any]]:
    """The attention core of one layer through the engine's backend at (batch, q_len, kv_len)."""
    import torch
    import torch.nn.functional as F

    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta
    from llmperf.measure.timers import time_fn

    device, dtype = model.device, model.dtype
    H, H_kv, D = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q = torch.randn(batch, H, q_len, D, device=device, dtype=dtype)
    k = torch.randn(batch, H_kv, kv_len, D, device=device, dtype=dtype)
    v = torch.randn_like(k)
    causal = q_len > 1
    if settings.backend == "triton":
        import kernels
        if q_len > 1:
            fn = lambda: kernels.flash_attention(q, k, v, causal=True)  # noqa: E731
        else:
            lens = torch.full((batch,), kv_len, dtype=torch.int32, device=device)
            fn = lambda: kernels.flash_decoding(q[:, :, 0], k, v, lens, validate=False)  # noqa: E731
    elif settings.backend == "naive":
        import kernels
        fn = lambda: kernels.naive_attention(q, k, v, causal)  # noqa: E731
    elif q_len == 1:  # the engine's decode path (llmperf's own kernel on a CPU that runs them)
        meta = StepMeta.decode(batch, kv_len, device)
        fn = lambda: sdpa_decode(q[:, :, 0], k, v, meta, D ** -0.5)  # noqa: E731
    else:
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != H_kv)  # noqa: E731
    t = time_fn(fn, device, reps=settings.reps, warmup=1, max_time_s=MICRO_BUDGET_S)
    names = [Op.attention] if settings.backend != "naive" else [Op.attn_score, Op.attn_softmax, Op.attn_value]
    costs = [pred.cost(n, batch, q_len, kv_len) for n in names]
    if settings.backend == "naive":  # one timed call covers the three naive operators: join it to their sum
        total = OpCost(name=Op.attention.value, kind="attention",
                       **{f: sum(getattr(c, f) for c in costs) for f in
                          ("flops", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")})
        times = [pred.times(c, batch, q_len, micro=True) for c in costs]
        p = (sum(t_[0] for t_ in times), sum(t_[1] for t_ in times))
        return [op_row("micro", phase.value, Op.attention.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                       total, p, pred.hardware, pred.compute_dtype)]
    cost = costs[0]
    return [op_row("micro", phase.value, Op.attention.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                   cost, pred.times(cost, batch, q_len, micro=True), pred.hardware, pred.compute_dtype)]


# ---- the generation loop (torch) ------------------------------------------------------------------------


def generation(engine: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, config: str, batch: int,
               prompt_len: int, gen_len: int) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """One greedy generation: its steps timed in an unrecorded run when `settings.two_runs`, its
    operators in a recorded run (see the module docstring); returns (ops rows, steps rows,
    generations row)."""
    import torch

    from llmperf.engine import Recorder, SamplingParams
    from llmperf.measure.timers import gc_paused

    gen = torch.Generator().manual_seed(settings.seed)
    prompts = torch.randint(0, spec.vocab_size, (batch, prompt_len), generator=gen).tolist()
    params = SamplingParams(max_new_tokens=gen_len, min_new_tokens=gen_len)
    device = engine.model.device
    if device.type == "cuda":
        # the whole generation once: Triton autotunes per length bucket (prefill, and decode's split
        # count), which must not land in a timed step; a GPU generation costs well under a second
        engine.generate(prompts, params, seed=settings.seed)
    else:
        # the real prompts and one decode step: oneDNN builds a GEMM primitive for every new row count on
        # its first call (a bf16 64-token prefill's first QKV GEMM took 4.3 ms, then 0.25 ms), and the
        # allocator first meets the prefill's sizes; the time model prices the steady state
        engine.generate(prompts, SamplingParams(max_new_tokens=2, min_new_tokens=2), seed=settings.seed)
    step_trace = None
    if settings.two_runs:  # the steps as they run without per-operator instrumentation
        step_rec = Recorder(device, ops=False)
        with gc_paused():
            engine.generate(prompts, params, seed=settings.seed, recorder=step_rec)
        step_trace = step_rec.trace
    rec = Recorder(device)
    with gc_paused():  # a garbage collection inside a timed step is not the engine's time
        engine.generate(prompts, params, seed=settings.seed, recorder=rec)
    trace = rec.trace
    recorded = {(st.phase, st.step): st.seconds for st in trace.steps}

    steps_rows = []
    for st in (step_trace or trace).steps:
        roof, cal = pred.step(st.batch, st.q_len, st.kv_len)
        steps_rows.append(dict(config=config, step=st.step, phase=st.phase, batch=st.batch, q_len=st.q_len,
                               kv_len=st.kv_len, measured_s=st.seconds,
                               measured_recorded_s=recorded.get((st.phase, st.step), math.nan),
                               predicted_roofline_s=roof, predicted_calibrated_s=cal))

    # per step: each operator summed over layers; then per (phase, op, batch, q_len, kv_len) over steps
    per_step: dict[tuple, float] = defaultdict(float)
    for r in trace.ops:
        per_step[(r.phase, r.step, r.op, r.batch, r.q_len, r.kv_len)] += r.seconds
    grouped: dict[tuple, list[float]] = defaultdict(list)
    for (phase, _step, op, b, q, kv), s in per_step.items():
        grouped[(phase, op, b, q, kv)].append(s)
    ops_rows = []
    L = spec.num_layers
    for (phase, name, b, q, kv), samples in sorted(grouped.items(), key=lambda kv_: (kv_[0][0], kv_[0][4])):
        op = as_op(name)
        cost = pred.cost(op, b, q, kv)
        layers = 1 if op in MODEL_LEVEL_OPS else L
        if cost is None:
            p = (math.nan, math.nan)
        else:
            r, c = pred.times(cost, b, q)
            p = (r * layers, c * layers)
        spread = (float(np.quantile(samples, 0.9) - np.quantile(samples, 0.1))) if len(samples) > 1 else 0.0
        ops_rows.append(op_row("generation", phase, op.value, b, q, kv, statistics.median(samples), spread,
                               len(samples), cost, p, pred.hardware, pred.compute_dtype, layers=layers))

    pre = [s for s in steps_rows if s["phase"] == Phase.prefill.value]
    dec = [s for s in steps_rows if s["phase"] == Phase.decode.value]

    def total(rows: list[dict], key: str) -> float:
        return float(sum(r[key] for r in rows))

    gen_row: dict[str, Any] = dict(config=config, batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                                   measured_ttft_s=total(pre, "measured_s"),
                                   measured_tpot_s=total(dec, "measured_s") / len(dec) if dec else 0.0,
                                   measured_e2e_s=total(pre + dec, "measured_s"))
    for model in ("roofline", "calibrated"):
        key = f"predicted_{model}_s"
        gen_row[f"predicted_ttft_s_{model}"] = total(pre, key)
        gen_row[f"predicted_tpot_s_{model}"] = total(dec, key) / len(dec) if dec else 0.0
        gen_row[f"predicted_e2e_s_{model}"] = total(pre + dec, key)
    return ops_rows, steps_rows, gen_row


# ---- the run ------------------------------------------------------------------------------------------------


def calibrated_model(hardware: HardwareSpec, spec: ModelSpec, prec: Precision, compute_dtype: str,
                     backend: str) -> EfficiencyTimeModel:
    """The calibrated time model that predicts `spec` as the engine runs it: the backend's per-operator
    overheads, warm ones when the model's weights fit the private caches (`time_model_for`). On a GPU the
    engine profiled is llmperf's own, eager one: its `eager` profile (the calibration's own overheads)."""
    from llmperf.analysis.timemodel import is_cpu
    return time_model_for(hardware, "calibrated", compute_dtype, backend=backend,
                          weight_bytes=weight_bytes_per_gpu(spec, prec), engine=None if is_cpu(hardware) else "eager")


def measurement_sources(settings: ProfileSettings) -> dict[str, str]:
    """Which run each number of the run directory came from (run.json `measurements`)."""
    ops_run = ("the recorded run (a pair of CUDA events per operator, read at the end of each step)"
               if settings.device == "cuda" else "the recorded run (perf_counter around each operator)")
    steps_run = ("the unrecorded run (steps timed with synchronize + perf_counter; no per-operator recording)"
                 if settings.two_runs else ops_run + "; one run serves steps and operators")
    return dict(steps=steps_run, generations=steps_run + " (TTFT, TPOT, e2e summed from its steps)",
                errors=steps_run, ops_generation=ops_run,
                steps_measured_recorded_s=ops_run,
                ops_micro="micro-benchmarks (llmperf.measure.timers.time_fn: CUDA events / do_bench on GPU, "
                          "warmed-up median perf_counter on CPU)")


def resolve_spec(settings: ProfileSettings) -> ModelSpec:
    from llmperf.specs import load_model

    spec = load_model(settings.model)
    if settings.layers is not None:
        spec = spec.scaled(num_layers=settings.layers)
    if max(settings.prompt_lens) + max(settings.gen_lens) > spec.max_positions:
        raise SpecError(f"--prompt-len/--gen-len: a context of {max(settings.prompt_lens) + max(settings.gen_lens)} "
                        f"exceeds {spec.name}'s max_positions={spec.max_positions}")
    from llmperf.engine.model import check_buildable
    try:
        check_buildable(spec)  # an unsupported family, activation or rope type before any folder is made
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return spec


def run_profile(settings: ProfileSettings, hardware: HardwareSpec, out_dir: Path, *,
                progress: Progress | None = None) -> ProfileResult:
    """Measure, predict, join and write the run directory (see the module docstring)."""
    import torch

    previous = torch.get_num_threads()
    if settings.threads is not None and settings.threads >= 1:
        torch.set_num_threads(settings.threads)
    try:
        return _run_profile(settings, hardware, out_dir, progress)
    finally:
        torch.set_num_threads(previous)


def _run_profile(settings: ProfileSettings, hardware: HardwareSpec, out_dir: Path,
                 progress: Progress | None) -> ProfileResult:
    import torch

    from llmperf.engine import Engine, build_model
    from llmperf.measure.device import available_memory_bytes, describe, git_commit, versions

    settings.validate()
    tick = progress or (lambda msg: None)
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device: cuda requested but torch sees no CUDA device")
    device = torch.device(settings.device)
    spec = resolve_spec(settings)
    prec = Precision.uniform(settings.dtype)
    attention = "naive" if settings.backend == "naive" else "fused"
    check_fits(memory_needed(spec, prec, settings, attention), available_memory_bytes(device), settings.device)
    compute_dtype = hardware.compute_dtype(settings.dtype)
    calibrated = (calibrated_model(hardware, spec, prec, compute_dtype, settings.backend)
                  if hardware.efficiency else None)
    # the engine runs Q, K, V as one GEMM and gate + up as one (llmperf.engine.model): predict that engine
    fm = ForwardModel(model=spec, precision=prec, attention=attention, fused_qkv=True, fused_gate_up=True)
    pred = Predictor(fm=fm, hardware=hardware, compute_dtype=compute_dtype, calibrated=calibrated)

    from llmperf.outputs import OutputDir, check_dir
    out = out_dir if isinstance(out_dir, OutputDir) else check_dir(out_dir, "--output")
    out_dir = Path(out.create())
    dev = describe(device)
    notes = []
    if settings.device == "cpu":
        notes.append("Triton kernels are not timed on CPU (the interpreter says nothing about speed)")
    cal_threads = (hardware.calibration or {}).get("threads")
    if settings.device == "cpu" and cal_threads and cal_threads != torch.get_num_threads():
        notes.append(f"calibrated with {cal_threads} threads but profiled with {torch.get_num_threads()}: "
                     "the calibrated ceilings do not describe this run (pass --threads to match)")
    if calibrated is not None and not calibrated.has_op_overheads:
        notes.append(f"the calibration has no per-operator overheads for the {settings.backend} backend: the "
                     "per-kind tiny-operator figures are used (re-run `llmperf calibrate`)")
    if calibrated is not None and calibrated.has_op_overheads and settings.kv == "paged":
        notes.append("the per-operator overheads were measured with a contiguous KV cache: kv_write and "
                     "attention with the paged cache may dispatch more")
    if calibrated is None:
        notes.append(f"hardware {hardware.name!r} has no calibration: predicted_calibrated_s is empty "
                     "(run `llmperf calibrate`, then --hardware local)")
    run: dict[str, Any] = dict(
        kind="profile", schema_version=SCHEMA_VERSION,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), model=spec.name,
        hardware=hardware.name, device=dev, versions=versions(), git_commit=git_commit(),
        settings=dict(batch=list(settings.batches), prompt_len=list(settings.prompt_lens),
                      gen_len=list(settings.gen_lens), dtype=settings.dtype, compute_dtype=compute_dtype,
                      backend=settings.backend, kv=settings.kv, layers=spec.num_layers, reps=settings.reps,
                      micro=settings.micro, seed=settings.seed, device=settings.device,
                      threads=torch.get_num_threads() if settings.device == "cpu" else None,
                      separate_step_run=settings.two_runs,
                      time_models=dict(roofline=ROOFLINE_MODEL.source,
                                       calibrated=calibrated.source if calibrated else None),
                      calibrated_overheads=None if calibrated is None else dict(
                          mode=calibrated.overhead_mode, backend=calibrated.backend or None,
                          per_operator=sorted(calibrated.op_overhead_s),
                          per_operator_and_rows=sorted(calibrated.op_overhead_rows)),
                      hardware_source=hardware.source, notes=notes,
                      model_spec=_plain_dict(spec.to_dict()),
                      hardware_spec=_plain_dict({k: v for k, v in hardware.to_dict().items()
                                                 if k not in ("calibration",)})),
        measurements=measurement_sources(settings), errors=[], checks=[], status="running")
    run_path = out_dir / "run.json"
    _atomic_json(run_path, _finite(run))
    tables = dict(ops=_Table(out, "ops.csv", OPS_COLUMNS), steps=_Table(out, "steps.csv", STEPS_COLUMNS),
                  generations=_Table(out, "generations.csv", GENERATIONS_COLUMNS))
    result = ProfileResult(out_dir=out_dir, run=run)
    try:
        tick("building the model")
        model = build_model(spec, seed=settings.seed, dtype=settings.dtype, device=device, attention=settings.backend)
        tick("cross-checks")
        run["checks"] = cross_checks(model, spec, prec, settings)
        _atomic_json(run_path, _finite(run))
        engine = Engine(model, cache=settings.kv, attention=settings.backend)
        llc = _llc_bytes(dev)
        for i, (b, p, g) in enumerate(settings.configs()):
            config = f"b{b}-p{p}-g{g}"
            if settings.micro:
                tick(f"micro-benchmarks {config}")
                with torch.inference_mode():
                    for row in micro_benchmarks(model, spec, pred, settings, b, p, g, llc):
                        tables["ops"].append(row)
            tick(f"generation {config}")
            ops_rows, steps_rows, gen_row = generation(engine, spec, pred, settings, config, b, p, g)
            for row in ops_rows:
                tables["ops"].append(row)
            for row in steps_rows:
                tables["steps"].append(row)
            tables["generations"].append(gen_row)
            run["errors"] = errors_table(tables["steps"].rows, tables["generations"].rows)
            run["settings"]["configs_done"] = i + 1
            _atomic_json(run_path, _finite(run))
        run["status"] = "complete"
    except KeyboardInterrupt:
        run["status"] = "interrupted"
        result.interrupted = True
    finally:
        for t in tables.values():
            t.close()
        run["errors"] = errors_table(tables["steps"].rows, tables["generations"].rows)
        if run["status"] == "running":
            run["status"] = "failed"
        _atomic_json(run_path, _finite(run))
    result.ops, result.steps, result.generations = (tables["ops"].rows, tables["steps"].rows,
                                                    tables["generations"].rows)
    return result
