"""`llmperf profile`: measure a model on this device op by op and step by step, and join every
measurement with its prediction under two time models.

For every configuration (batch x prompt length x generation length):
(a) micro-benchmarks (`kind="micro"`) of each operator at the model's real shapes, one layer's call:
    the projections and FFN as GEMM (prefill, rows = batch * prompt) and GEMV-like (decode, rows =
    batch), each at the analytical model's own GEMM shape (`micro_matmuls`: a dense layer's, the
    router and shared experts of a MoE layer; not the routed experts), the LM head, and attention
    prefill / decode through the engine's backend (SDPA, naive, or on CUDA the Triton kernels).
    Each weight is rotated through enough copies to exceed the last-level cache, as the weights of a
    real forward pass do;
(b) the engine's whole greedy generation (`kind="generation"`), timed per step and per operator with
    `llmperf.engine.Recorder` (per-layer records summed over the layers of each kind).

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

Each measurement is joined with `llmperf.analysis` by (phase, operator, layer kind, batch, q_len,
kv_len) through the shared vocabulary (`llmperf.analysis.vocabulary`). A model's layers differ
(`ModelSpec.layer_kinds`: sliding or full attention, dense or mixture-of-experts FFN, rotary or not):
a generation row sums an operator over the layers of one kind (ops.csv `layer`, the kind's label;
`model` for the model-level operators) and is joined to ONE layer of that kind's prediction times
their number, so Gemma's sliding and full layers, DeepSeek's dense and MoE layers, and MLA's
unabsorbed prefill and absorbed decode each meet their own counts. A fused measurement (`qkv_proj`,
`gate_up_proj`, `shared_gate_up_proj`) is joined to the sum of its parts (`FUSED_PARTS`), so the
engine may time either. Nothing is dropped silently: per phase and layer kind, `run.json` `join`
lists the operators joined and those on one side only (measured with no prediction: its row keeps
NaN predictions; predicted and never measured), and any of the latter fails the check "operators
joined to predictions". Predictions:
`roofline` (e = 1, overhead 0, on the same hardware spec: for `local`, the ceilings calibrate
measured, i.e. uncalibrated but peak-measured) and `calibrated` (the spec's time model,
`llmperf.analysis.timemodel`). The calibrated terms come from `llmperf calibrate`'s own
micro-benchmarks only: nothing is fitted here, so the errors reported on the generations are
held-out errors.

Errors (`run.json` "errors"): median and p90 of |predicted / measured - 1| per phase over every
prefill step, every decode step, and every whole generation (`e2e`).

Exact cross-checks (`run.json` "checks"): the analytical matmul FLOPs of a prefill and of one decode
step against `torch.utils.flop_counter.FlopCounterMode` on the real model (dense convention, naive
attention so every product is a counted matmul); the analytical weight bytes against the real
parameters; the weight bytes a decode step reads (embedding rows, every matrix, and of a mixture of
experts the experts its router chose) against the parameters the engine reads; the analytical
KV-cache bytes against the real cache's storage.

Mixture of experts: every MoE layer reports the distinct routed experts its tokens chose in each step
(`llmperf.engine.instrument.EXPERTS_TOUCHED`), shown beside the analytical expectation under uniform
routing, `E * (1 - (1 - k/E) ** tokens)` (`llmperf.analysis.operators.expected_experts_touched`,
what the analytical model reads expert weights for): `experts.csv` per step, `run.json`
`experts_touched` per configuration, phase and layer.

`--layers N` keeps N layers with their kinds: the first layer of each kind, then the earliest others
(`kept_layer_indices`; `run.json` `layers_kept`).

Files (the run-directory contract, see docs/schemas.md): `run.json` (written atomically, updated after
every configuration), `ops.csv`, `steps.csv`, `generations.csv` and for a MoE model `experts.csv`
(rows appended and flushed as they are measured: an interrupted sweep keeps them).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from llmperf.analysis.memory import activation_peak_bytes, weight_bytes_per_gpu
from llmperf.analysis.operators import ForwardModel, expected_experts_touched
from llmperf.analysis.roofline import OpCost
from llmperf.analysis.timemodel import ROOFLINE_MODEL, EfficiencyTimeModel, time_model_for
from llmperf.analysis.vocabulary import FUSED_PARTS, OP_NAMES, WEIGHT_MATMUL_OPS, Op, Phase
from llmperf.errors import SpecError
from llmperf.outputs import json_text, jsonable, write_file
from llmperf.specs import HardwareSpec, ModelSpec, Precision
from llmperf.specs.model import LayerKind

SCHEMA_VERSION = 1
E2E = "e2e"  # the error row of whole generations (not a step phase)
OPS_COLUMNS = ("kind", "phase", "op", "batch", "q_len", "kv_len", "measured_s", "measured_spread_s", "n",
               "predicted_roofline_s", "predicted_calibrated_s", "ratio_roofline", "ratio_calibrated", "flops",
               "bytes", "intensity", "achieved_flops_per_s", "achieved_bytes_per_s", "roofline_fraction", "bound",
               "layer")
STEPS_COLUMNS = ("config", "step", "phase", "batch", "q_len", "kv_len", "measured_s", "measured_recorded_s",
                 "predicted_roofline_s", "predicted_calibrated_s")
GENERATIONS_COLUMNS = ("config", "batch", "prompt_len", "gen_len", "measured_ttft_s", "measured_tpot_s",
                       "measured_e2e_s", "predicted_ttft_s_roofline", "predicted_tpot_s_roofline",
                       "predicted_e2e_s_roofline", "predicted_ttft_s_calibrated", "predicted_tpot_s_calibrated",
                       "predicted_e2e_s_calibrated")
EXPERTS_COLUMNS = ("config", "phase", "step", "layer", "batch", "q_len", "kv_len", "tokens", "experts_touched",
                   "expected_uniform")
MODEL_LEVEL = "model"  # the `layer` of a model-level operator's row (embed, final_norm, lm_head, ...)
JOIN_CHECK = "operators joined to predictions"
#: the layer kind the attention micro-benchmark is (plain causal attention over every key)
MICRO_ATTENTION = LayerKind(attention="full", window=None, rope=True, moe=False)
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
    """Predicted seconds of operators under the roofline and the calibrated model. A per-layer operator
    is priced for one layer of a given kind (`LayerKind`: sliding or full attention, dense or MoE FFN;
    default the model's first layer's), the kind of the layer it was measured in."""

    fm: ForwardModel
    hardware: HardwareSpec
    compute_dtype: str
    calibrated: EfficiencyTimeModel | None

    def cost(self, op: Op, batch: int, q_len: int, kv_len: int, kind: LayerKind | None = None) -> OpCost | None:
        """One call's cost (one layer of `kind`, or the model for embed/final_norm/lm_head); a fused name
        is the sum of its parts, its input read once. None when the model has no such operator."""
        for c in self._layer_and_model_ops(batch, q_len, kv_len, kind):
            if c.name == op.value:
                return c
        if op in FUSED_PARTS:
            parts = [self.cost(p, batch, q_len, kv_len, kind) for p in FUSED_PARTS[op]]
            parts = [p for p in parts if p is not None]
            if not parts:
                return None
            fields = ("flops", "weight_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes", "comm_bytes")
            return OpCost(name=op.value, kind=parts[0].kind, act_read_bytes=parts[0].act_read_bytes,
                          layer=parts[0].layer, **{f: sum(getattr(p, f) for p in parts) for f in fields})
        split = replace(self.fm, fused_qkv=False, fused_gate_up=False)  # a part of a fused GEMM (micro rows)
        for c in (split.head_ops(batch, q_len, kv_len) + split.layer_ops(batch, q_len, kv_len, kind)
                  + split.tail_ops(batch, q_len, kv_len)):
            if c.name == op.value:
                return c
        return None

    def _layer_and_model_ops(self, batch: int, q_len: int, kv_len: int,
                             kind: LayerKind | None = None) -> list[OpCost]:
        fm = self.fm
        return (fm.head_ops(batch, q_len, kv_len) + fm.layer_ops(batch, q_len, kv_len, kind)
                + fm.tail_ops(batch, q_len, kv_len))

    @staticmethod
    def rows(cost: OpCost, batch: int, q_len: int, fm: ForwardModel) -> int:
        """Tokens through the operator: the LM head sees one row per sequence unless all logits."""
        if cost.name in (Op.lm_head.value, Op.final_softcap.value) and not fm.all_logits:
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
        """(roofline, calibrated) seconds of a whole forward pass: the model-level operators once, and
        each layer kind's operators times its number of layers (`ForwardModel.group_ops`)."""
        fm = self.fm
        parts = [(1, fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len))]
        parts += [(count, ops) for _kind, count, ops in fm.group_ops(batch, q_len, kv_len)]
        roof = cal = 0.0
        for mult, ops in parts:
            for c in ops:
                r, k = self.times(c, batch, q_len)
                roof, cal = roof + mult * r, cal + mult * k
        return roof, cal

    def step(self, batch: int, q_len: int, kv_len: int) -> tuple[float, float]:
        """A whole engine step: the forward pass, plus the calibrated host overhead per step."""
        roof, cal = self.forward(batch, q_len, kv_len)
        return roof, cal + (self.calibrated.step_overhead_s if self.calibrated else math.nan)


# ---- run directory ------------------------------------------------------------------------------------


def _write_run(path: Path, run: dict[str, Any]) -> None:
    """run.json through `llmperf.outputs` (atomic: a reader never sees half of it; strict JSON, NaN as null)."""
    write_file(path, json_text(run), "--output")


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
    experts: list[dict[str, Any]] = field(default_factory=list)  # experts.csv (MoE models)
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
           layers: int = 1, layer: str = "") -> dict[str, Any]:
    """One ops.csv row; `layers` multiplies a per-layer cost when the measurement sums the layers of
    one kind; `layer` names that kind (`LayerKind.label`, or `model` for a model-level operator)."""
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
        bound="compute" if compute_s > memory_s else "memory", layer=layer)


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


ROUTED_OPS = frozenset({Op.gate_up_proj.value, Op.gate_proj.value, Op.up_proj.value, Op.down_proj.value})


def matmul_flops(spec: ModelSpec, prec: Precision, batch: int, q_len: int, kv_len: int) -> float:
    """The analytical matrix-product FLOPs of one forward pass as `FlopCounterMode` counts them: the
    dense convention (naive attention computes every score of its square), the matmul and attention
    kinds only (norms, soft-caps, sinks, RoPE are elementwise), and no bias adds (an `addmm` counts its
    product only; the router's score correction is an add too)."""
    bare = dict(qkv_bias=False, out_bias=False, mlp_bias=False)
    if spec.is_moe:
        bare.update(router_bias=False, router_score_bias=False)
    fm = ForwardModel(model=spec.scaled(**bare), precision=prec, attention="naive", attention_flops="dense")
    return float(sum(c.flops for c in fm.forward_ops(batch, q_len, kv_len) if c.kind in ("matmul", "attention")))


def step_weight_bytes(spec: ModelSpec, prec: Precision, batch: int, q_len: int, kv_len: int,
                      touched: dict[int, int] | None = None) -> float:
    """The analytical weight bytes one step reads, layer by layer (each of its kind): the embedding rows
    its tokens gather, every layer's matrices and norms (and attention sinks), the LM head. A MoE
    layer's routed experts are read for the experts the step touches: `touched[layer]` of them when
    given (what the engine's router chose), else the uniform-routing expectation
    (`expected_experts_touched`)."""
    fm = ForwardModel(model=spec, precision=prec)
    total = sum(float(c.weight_bytes) for c in fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len))
    expected = float(expected_experts_touched(batch * q_len, spec.num_experts, spec.experts_per_token))
    for i, kind in enumerate(spec.layer_kinds()):
        for c in fm.layer_ops(batch, q_len, kv_len, kind):
            w = float(c.weight_bytes)
            if kind.moe and c.name in ROUTED_OPS and touched is not None:
                w = w / expected * touched[i]  # the per-expert bytes times the experts touched
            total += w
    if spec.attn_sinks:  # one sink logit per head and layer, which the attention operators leave out of
        total += spec.num_layers * spec.num_heads * prec.act_bytes  # their bytes (llmperf.analysis.operators)
    return total


def engine_step_weight_bytes(model: Any, tokens: int, touched: dict[int, int] | None = None) -> int:
    """The bytes of the engine's parameters one step of `tokens` tokens reads: every parameter once
    (a tied LM head is the embedding, read whole), the embedding and learned positions for the rows
    gathered, and of each MoE layer's stacked expert tensors (`experts*` parameters of
    `llmperf.engine.moe.MoE`, one slice per expert) the slices of the `touched[layer]` experts."""
    spec = model.spec
    per_expert = {}
    for block in model.layers:
        if getattr(block, "moe_ffn", None) is not None:
            for name, p in block.moe_ffn.named_parameters():
                if name.startswith("experts"):
                    per_expert[id(p)] = block.index
    gathered = {id(model.embed_weight)} | ({id(model.pos_weight)} if model.pos_weight is not None else set())
    total = 0
    for p in model.parameters():  # a tied tensor once
        nbytes = p.numel() * p.element_size()
        if id(p) in gathered:
            rows = tokens * p.shape[1] * p.element_size()
            nbytes = rows + (nbytes if p is model.lm_head_weight else 0)
        elif id(p) in per_expert:
            if touched is None:
                raise ValueError("touched: a MoE step's expert bytes need the experts each layer touched")
            nbytes = nbytes // spec.num_experts * touched[per_expert[id(p)]]
        total += nbytes
    return total


def _check(name: str, analytical: float, real: float, real_name: str, context: str) -> dict[str, Any]:
    """A run.json check: the analytical count equals the real one, to the unit."""
    return dict(name=name, passed=int(analytical) == int(real),
                detail=f"analytical {int(analytical)} vs {real_name} {int(real)} ({context})")


def cross_checks(model: Any, spec: ModelSpec, prec: Precision, settings: ProfileSettings) -> list[dict[str, Any]]:
    """Exact checks of the analytical counts against the engine: matmul FLOPs of a prefill and of one
    decode step against `FlopCounterMode` (naive attention, so every product is a counted matmul),
    the weight bytes against the parameters, the weight bytes a decode step reads against the
    parameters it reads (with a MoE model's experts as its router chose them), the KV-cache bytes
    against the cache's storage."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from llmperf.engine import Engine, Recorder, SamplingParams
    from llmperf.engine.cache import make_cache
    from llmperf.engine.instrument import EXPERTS_TOUCHED

    checks = []
    # the decode step's context (seq + 1) within every sliding window and chunk: past them the engine's
    # naive attention still scores every cached key and masks the rest, where the analytical model
    # counts the keys a window or chunk sees
    spans = [k.window for k in spec.layer_kinds() if k.window is not None]
    batch, seq = min(max(settings.batches), 4), max(1, min(min(settings.prompt_lens), 32, *(w - 1 for w in spans)))
    gen = torch.Generator().manual_seed(settings.seed)
    prompts = torch.randint(0, spec.vocab_size, (batch, seq), generator=gen)
    backend = model.attention_backend
    try:
        model.set_attention("naive")  # every attention product a plain matmul the counter sees
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            model(prompts.to(model.device))
        prefill = counter.get_total_flops()
        rec = Recorder(model.device, ops=False)  # the steps' shapes and the experts each MoE layer touched
        with FlopCounterMode(display=False) as counter:
            Engine(model, cache=settings.kv, attention="naive").generate(
                prompts.tolist(), SamplingParams(max_new_tokens=2, min_new_tokens=2), seed=settings.seed, recorder=rec)
        generation = counter.get_total_flops()
    finally:
        model.set_attention(backend)
    checks.append(_check("matmul FLOPs vs FlopCounterMode", matmul_flops(spec, prec, batch, seq, seq), prefill,
                         "counted", f"prefill of {batch} x {seq} tokens, dense attention, logits of the last position"))
    dec = next(st for st in rec.trace.steps if st.phase == Phase.decode.value)
    checks.append(_check("decode-step matmul FLOPs vs FlopCounterMode",
                         matmul_flops(spec, prec, dec.batch, dec.q_len, dec.kv_len), generation - prefill,
                         "counted", f"a decode step of {dec.batch} sequences at context {dec.kv_len}: the "
                         "generation's count less its prefill's"))
    seen: set[int] = set()
    real = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:  # tied embeddings are one tensor
            seen.add(p.data_ptr())
            real += p.numel() * p.element_size()
    checks.append(_check("weight bytes vs parameters", weight_bytes_per_gpu(spec, prec), real, "real", "bytes"))
    touched = {c.layer: c.value for c in rec.trace.counts
               if c.name == EXPERTS_TOUCHED and c.phase == dec.phase and c.step == dec.step}
    experts = (f"; MoE layers' experts touched {[touched[i] for i in sorted(touched)]} of {spec.num_experts}"
               if spec.is_moe else "")
    checks.append(_check("decode-step weight bytes vs parameters read",
                         step_weight_bytes(spec, prec, dec.batch, 1, dec.kv_len, touched if spec.is_moe else None),
                         engine_step_weight_bytes(model, dec.batch, touched if spec.is_moe else None),
                         "real", f"bytes; {dec.batch} tokens' embedding rows{experts}"))
    b, ctx = max(settings.batches), max(settings.prompt_lens) + max(settings.gen_lens)
    cache = make_cache(settings.kv, spec, dtype=model.dtype, device=model.device, max_batch=b, max_seq_len=ctx,
                       block_size=PAGED_BLOCK)
    # a paged cache holds whole blocks of 16 tokens per sequence (the engine's default block size)
    slots = ctx if settings.kv == "contiguous" else -(-ctx // PAGED_BLOCK) * PAGED_BLOCK
    checks.append(_check("KV cache bytes vs cache storage", b * slots * spec.kv_bytes_per_token(prec.kv),
                         cache.capacity_bytes, "real", f"bytes; {settings.kv}, {b} x {slots} token slots"))
    del cache
    return checks


# ---- micro-benchmarks (torch) ---------------------------------------------------------------------------


def micro_matmuls(pred: Predictor, batch: int, q_len: int,
                  kv_len: int) -> list[tuple[Op, int, int, OpCost, str]]:
    """(operator, in, out, cost, layer kind) of every weight matmul the micro-benchmarks time, each one
    plain GEMM of the model at the analytical model's own shape (`OpCost.gemm`): the split parts of
    the fused GEMMs, of the first dense layer (its attention and FFN) and of the first MoE layer (its
    router and shared experts, and its attention when no layer is dense), and the LM head. Not timed
    here: routed experts (a GEMM per expert over the rows the routing decides) and MLA's kv_b_proj,
    q_absorb and v_absorb (rows or groups set by the context and the heads)."""
    kinds = pred.fm.model.layer_kinds()
    first = [next((k for k in kinds if not k.moe), None), next((k for k in kinds if k.moe), None)]
    out: dict[Op, tuple[Op, int, int, OpCost, str]] = {}
    for kind in (k for k in first if k is not None):
        routed = {Op.gate_proj, Op.up_proj, Op.down_proj} if kind.moe else set()
        for op in Op:
            if op not in WEIGHT_MATMUL_OPS or op in FUSED_PARTS or op in routed or op in out:
                continue
            cost = pred.cost(op, batch, q_len, kv_len, kind)
            if cost is None or cost.gemm is None or np.ndim(cost.gemm.groups) or cost.gemm.groups != 1:
                continue
            out[op] = (op, cost.gemm.k, cost.gemm.n, cost, kind.label if cost.per_layer else MODEL_LEVEL)
    return [out[op] for op in Op if op in out]


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
    for phase, q_len, kv_len in shapes:
        for op, d_in, d_out, cost, label in micro_matmuls(pred, batch, q_len, kv_len):
            rows = pred.rows(cost, batch, q_len, pred.fm)
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
            rows_out.append(op_row("micro", phase.value, op.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                                   cost, pred.times(cost, batch, q_len, micro=True), pred.hardware, pred.compute_dtype,
                                   layer=label))
            del ws, x
            gemm.clear()
        rows_out += _attention_micro(model, spec, pred, settings, batch, phase, q_len, kv_len)
    return rows_out


def _attention_micro(model: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, batch: int,
                     phase: Phase, q_len: int, kv_len: int) -> list[dict[str, Any]]:
    """The attention core of one layer through the engine's backend at (batch, q_len, kv_len): plain
    causal GQA over every key, so it is predicted as a full-attention layer's core without soft-cap or
    sinks (`MICRO_ATTENTION`; the engine's sliding, capped or sinked layers are in the generation rows).
    None for MLA, whose latent attention is not this core."""
    import torch
    import torch.nn.functional as F

    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta
    from llmperf.measure.timers import time_fn

    if spec.is_mla:
        return []
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
    core = replace(pred, fm=replace(pred.fm, model=spec.scaled(attn_softcap=None, attn_sinks=False)))
    costs = [core.cost(n, batch, q_len, kv_len, MICRO_ATTENTION) for n in names]
    if settings.backend == "naive":  # one timed call covers the three naive operators: join it to their sum
        total = OpCost(name=Op.attention.value, kind="attention",
                       **{f: sum(getattr(c, f) for c in costs) for f in
                          ("flops", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")})
        times = [pred.times(c, batch, q_len, micro=True) for c in costs]
        p = (sum(t_[0] for t_ in times), sum(t_[1] for t_ in times))
        return [op_row("micro", phase.value, Op.attention.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                       total, p, pred.hardware, pred.compute_dtype, layer=MICRO_ATTENTION.label)]
    cost = costs[0]
    return [op_row("micro", phase.value, Op.attention.value, batch, q_len, kv_len, t.median_s, t.spread_s, t.n,
                   cost, pred.times(cost, batch, q_len, micro=True), pred.hardware, pred.compute_dtype,
                   layer=MICRO_ATTENTION.label)]


# ---- the generation loop (torch) ------------------------------------------------------------------------


class Generated(NamedTuple):
    """What one profiled generation produced: its ops.csv, steps.csv and generations.csv rows, the join
    of its measured operators with the predicted ones (`join_report`) and, for a mixture-of-experts
    model, the experts.csv rows (`expert_rows`)."""

    ops: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    generation: dict[str, Any]
    join: list[dict[str, Any]]
    experts: list[dict[str, Any]]


def generation(engine: Any, spec: ModelSpec, pred: Predictor, settings: ProfileSettings, config: str, batch: int,
               prompt_len: int, gen_len: int) -> Generated:
    """One greedy generation: its steps timed in an unrecorded run when `settings.two_runs`, its
    operators in a recorded run (see the module docstring)."""
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
    ops_rows = joined_op_rows(trace.ops, spec, pred)
    join = join_report(trace, spec, pred.fm, config)
    experts = expert_rows(trace, spec, config)

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
    return Generated(ops_rows, steps_rows, gen_row, join, experts)


def joined_op_rows(records: Iterable[Any], spec: ModelSpec, pred: Predictor) -> list[dict[str, Any]]:
    """ops.csv rows (kind `generation`) from a recorded run's `OpRecord`s: per step, each operator summed
    over the layers of one kind (and over the experts of a MoE layer, each timed apart); then one row
    per (phase, operator, layer kind, batch, q_len, kv_len) with the median over steps, joined to one
    layer of that kind's prediction times its number of layers. A name with no prediction keeps its
    row, its predictions NaN (`join_report` names it)."""
    kinds = spec.layer_kinds()
    groups = {kind.label: (kind, count) for kind, count in spec.layer_groups()}
    per_step: dict[tuple, float] = defaultdict(float)
    for r in records:
        label = MODEL_LEVEL if r.layer is None else kinds[r.layer].label
        per_step[(r.phase, r.step, r.op, label, r.batch, r.q_len, r.kv_len)] += r.seconds
    grouped: dict[tuple, list[float]] = defaultdict(list)
    for (phase, _step, op, label, b, q, kv), s in per_step.items():
        grouped[(phase, op, label, b, q, kv)].append(s)
    rows = []
    for (phase, name, label, b, q, kv), samples in sorted(grouped.items(), key=lambda kv_: (kv_[0][0], kv_[0][5])):
        op = Op(name) if name in OP_NAMES else None
        kind, layers = groups.get(label, (None, 1))
        cost = pred.cost(op, b, q, kv, kind) if op is not None else None
        if cost is None:
            p = (math.nan, math.nan)
        else:
            r, c = pred.times(cost, b, q)
            p = (r * layers, c * layers)
        spread = (float(np.quantile(samples, 0.9) - np.quantile(samples, 0.1))) if len(samples) > 1 else 0.0
        rows.append(op_row("generation", phase, name, b, q, kv, statistics.median(samples), spread, len(samples),
                           cost, p, pred.hardware, pred.compute_dtype, layers=layers, layer=label))
    return rows


def _parts(name: str) -> set[str]:
    """A fused operator's parts (`FUSED_PARTS`), any other name itself."""
    op = Op(name) if name in OP_NAMES else None
    return {p.value for p in FUSED_PARTS[op]} if op in FUSED_PARTS else {name}


def unmatched(measured: Iterable[str], predicted: Iterable[str]) -> tuple[list[str], list[str]]:
    """(measured names with no prediction, predicted names with no measurement) of one phase and layer
    kind. A fused name matches its parts on the other side: a measured `qkv_proj` is joined when q, k
    and v are all predicted (split or fused), a predicted `gate_up_proj` when the gate and up projections
    were both measured."""
    measured, predicted = set(measured), set(predicted)
    m_parts = measured.union(*(_parts(n) for n in measured))
    p_parts = predicted.union(*(_parts(n) for n in predicted))
    return (sorted(n for n in measured if not _parts(n) <= p_parts),
            sorted(n for n in predicted if not _parts(n) <= m_parts))


def predicted_names(fm: ForwardModel, batch: int, q_len: int, kv_len: int,
                    kind: LayerKind | None) -> list[str]:
    """The operators the analytical model runs in one layer of `kind` (None: the model-level ones) of a
    step of this shape, in forward order (MLA's absorbed form in decode, unabsorbed in prefill)."""
    if kind is None:
        ops = fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len)
    else:
        ops = fm.layer_ops(batch, q_len, kv_len, kind)
    return [c.name for c in ops]


def join_report(trace: Any, spec: ModelSpec, fm: ForwardModel, config: str) -> list[dict[str, Any]]:
    """Per (phase, layer kind): the operators measured and joined to a prediction, and those on one side
    only (`unmatched`), over every step of the recorded run. Nothing is dropped silently: a name on one
    side only is listed, and `run.json` turns any into a failed check."""
    kinds = spec.layer_kinds()
    groups = {kind.label: kind for kind, _count in spec.layer_groups()}
    measured: dict[tuple[str, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in trace.ops:
        measured[(r.phase, r.step)][MODEL_LEVEL if r.layer is None else kinds[r.layer].label].add(r.op)
    found: dict[tuple[str, str], dict[str, set[str]]] = {}
    for st in trace.steps:
        names = measured.get((st.phase, st.step))
        if names is None:  # operators not recorded (ops=False): nothing to join
            continue
        for label in (MODEL_LEVEL, *groups):
            kind = groups.get(label)
            pred = predicted_names(fm, st.batch, st.q_len, st.kv_len, kind)
            only_m, only_p = unmatched(names.get(label, set()), pred)
            entry = found.setdefault((st.phase, label), dict(joined=set(), measured_only=set(),
                                                             predicted_only=set()))
            entry["joined"] |= names.get(label, set()) - set(only_m)
            entry["measured_only"] |= set(only_m)
            entry["predicted_only"] |= set(only_p)
    return [dict(config=config, phase=phase, layer=label, joined=sorted(e["joined"]),
                 measured_only=sorted(e["measured_only"]), predicted_only=sorted(e["predicted_only"]))
            for (phase, label), e in found.items()]


def merge_joins(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`join_report` entries of every configuration merged per (phase, layer kind) for run.json."""
    merged: dict[tuple[str, str], dict[str, set[str]]] = {}
    for e in entries:
        m = merged.setdefault((e["phase"], e["layer"]), dict(joined=set(), measured_only=set(), predicted_only=set()))
        for key in m:
            m[key] |= set(e[key])
    return [dict(phase=phase, layer=label, **{k: sorted(v) for k, v in m.items()})
            for (phase, label), m in merged.items()]


def join_check(join: list[dict[str, Any]]) -> dict[str, Any]:
    """The run.json check that every measured operator found its prediction and every predicted one
    was measured, per phase and layer kind."""
    bad = [f"{e['phase']} {e['layer']}: " + "; ".join(
        part for part in (f"measured, not predicted: {', '.join(e['measured_only'])}" if e["measured_only"] else "",
                          f"predicted, not measured: {', '.join(e['predicted_only'])}" if e["predicted_only"] else "")
        if part) for e in join if e["measured_only"] or e["predicted_only"]]
    n = sum(len(e["joined"]) for e in join)
    return dict(name=JOIN_CHECK, passed=not bad and bool(join),
                detail="; ".join(bad) if bad else (f"{n} (phase, layer kind, operator) joined, none on one side only"
                                                   if join else "no operator was recorded"))


def expert_rows(trace: Any, spec: ModelSpec, config: str) -> list[dict[str, Any]]:
    """experts.csv rows: per step and MoE layer, the distinct routed experts its tokens chose (the
    layer's `EXPERTS_TOUCHED` count) beside the analytical expectation under uniform routing,
    `E * (1 - (1 - k / E) ** tokens)` (`expected_experts_touched`, what the analytical model reads
    the expert weights of)."""
    from llmperf.engine.instrument import EXPERTS_TOUCHED

    rows = []
    for c in trace.counts:
        if c.name != EXPERTS_TOUCHED:
            continue
        tokens = c.batch * c.q_len
        rows.append(dict(config=config, phase=c.phase, step=c.step, layer=c.layer, batch=c.batch, q_len=c.q_len,
                         kv_len=c.kv_len, tokens=tokens, experts_touched=c.value,
                         expected_uniform=float(expected_experts_touched(tokens, spec.num_experts,
                                                                         spec.experts_per_token))))
    return rows


def experts_summary(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """run.json `experts_touched`: per (configuration, phase, layer), the mean, least and most distinct
    experts touched over the steps, beside the uniform-routing expectation at the phase's tokens per
    step (the mean over steps; every decode step of a generation has the same tokens)."""
    by: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["config"], r["phase"], r["layer"])].append(r)
    out = []
    for (config, phase, layer), rs in by.items():
        touched = [r["experts_touched"] for r in rs]
        out.append(dict(config=config, phase=phase, layer=layer, batch=rs[0]["batch"], tokens=rs[0]["tokens"],
                        steps=len(rs), measured_mean=float(np.mean(touched)), measured_min=int(min(touched)),
                        measured_max=int(max(touched)),
                        expected_uniform=float(np.mean([r["expected_uniform"] for r in rs]))))
    return out


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


def kept_layer_indices(spec: ModelSpec, n: int) -> tuple[int, ...]:
    """Which of `spec`'s layers `--layers n` keeps, in order: the first layer of each kind (its attention,
    window, rotary and FFN: `ModelSpec.layer_kinds`), as many as `n` allows, then the earliest others.
    So 2 layers of Gemma 3 (5 sliding : 1 full) are its layers 0 and 5, and 2 of DeepSeek-V3 (3 dense
    layers, then MoE) its layers 0 and 3: every kind the model runs is measured and joined when `n` is
    at least its number of kinds; a uniform model keeps its first `n` layers."""
    kinds = spec.layer_kinds()
    firsts = list(dict.fromkeys(kinds))  # the distinct kinds in order of first appearance
    chosen = [kinds.index(k) for k in firsts][:n]
    rest = [i for i in range(spec.num_layers) if i not in chosen]
    return tuple(sorted(chosen + rest[:max(n - len(chosen), 0)]))


def keep_layers(spec: ModelSpec, n: int) -> ModelSpec:
    """`spec` with `n` layers (`--layers`): fewer keep `kept_layer_indices` with their kinds (the
    per-layer `layer_types`, `dense_layers` and `nope_layers` follow them); more repeat the pattern
    (`ModelSpec.scaled`)."""
    if n >= spec.num_layers:
        return spec.scaled(num_layers=n)
    kept = kept_layer_indices(spec, n)
    types = None if spec.layer_types is None else tuple(spec.layer_types[i] for i in kept)
    return spec.scaled(num_layers=n, layer_types=types,
                       dense_layers=tuple(j for j, i in enumerate(kept) if i in spec.dense_layers),
                       nope_layers=tuple(j for j, i in enumerate(kept) if i in spec.nope_layers))


def layers_kept(settings: ProfileSettings) -> list[int] | None:
    """run.json `layers_kept`: the model's layers that `--layers` kept (None: all of them)."""
    from llmperf.specs import load_model

    if settings.layers is None:
        return None
    spec = load_model(settings.model)
    return list(kept_layer_indices(spec, settings.layers)) if settings.layers < spec.num_layers else None


def resolve_spec(settings: ProfileSettings) -> ModelSpec:
    from llmperf.specs import load_model

    spec = load_model(settings.model)
    if settings.layers is not None:
        spec = keep_layers(spec, settings.layers)
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
    if spec.quantization is not None:
        notes.append(f"{spec.name} ships {spec.quantization.method}-quantised weights: the engine runs random weights "
                     f"at {settings.dtype} and the predictions price {settings.dtype} weights, not the shipped format")
    spans = [k.window for k in spec.layer_kinds() if k.window is not None]
    if settings.backend == "naive" and spans and max(settings.prompt_lens) + max(settings.gen_lens) > min(spans):
        notes.append(f"naive attention past a sliding window or chunk ({min(spans)} tokens): the engine scores every "
                     "cached key and masks those outside it, the analytical model counts the keys inside it")
    if settings.micro and spec.is_mla:
        notes.append("multi-head latent attention: no attention micro-benchmark (its latent core is timed in the "
                     "generation rows only), nor kv_b_proj, q_absorb, v_absorb (rows or groups set by the context "
                     "and the heads)")
    if settings.micro and all(k.moe for k in spec.layer_kinds()):
        notes.append("every layer is a mixture of experts: the routed experts' GEMMs are not micro-benchmarked "
                     "(per expert, over the rows the routing decides); they are in the generation rows")
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
                      backend=settings.backend, kv=settings.kv, layers=spec.num_layers,
                      layers_kept=layers_kept(settings),
                      layer_kinds=[kind.label for kind in spec.layer_kinds()], reps=settings.reps,
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
                      model_spec=jsonable(spec.to_dict()),
                      hardware_spec=jsonable({k: v for k, v in hardware.to_dict().items()
                                                 if k not in ("calibration",)})),
        measurements=measurement_sources(settings), errors=[], checks=[], join=[], status="running")
    run_path = out_dir / "run.json"
    _write_run(run_path, run)
    tables = dict(ops=_Table(out, "ops.csv", OPS_COLUMNS), steps=_Table(out, "steps.csv", STEPS_COLUMNS),
                  generations=_Table(out, "generations.csv", GENERATIONS_COLUMNS))
    if spec.is_moe:  # the experts each MoE layer touched, per step
        tables["experts"] = _Table(out, "experts.csv", EXPERTS_COLUMNS)
    joins: list[dict[str, Any]] = []
    result = ProfileResult(out_dir=out_dir, run=run)
    try:
        tick("building the model")
        model = build_model(spec, seed=settings.seed, dtype=settings.dtype, device=device, attention=settings.backend)
        tick("cross-checks")
        checks = cross_checks(model, spec, prec, settings)
        run["checks"] = checks
        _write_run(run_path, run)
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
            done = generation(engine, spec, pred, settings, config, b, p, g)
            for row in done.ops:
                tables["ops"].append(row)
            for row in done.steps:
                tables["steps"].append(row)
            tables["generations"].append(done.generation)
            for row in done.experts:
                tables["experts"].append(row)
            joins += done.join
            run["join"] = merge_joins(joins)
            run["checks"] = checks + [join_check(run["join"])]
            if spec.is_moe:
                run["experts_touched"] = experts_summary(tables["experts"].rows)
            run["errors"] = errors_table(tables["steps"].rows, tables["generations"].rows)
            run["settings"]["configs_done"] = i + 1
            _write_run(run_path, run)
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
        _write_run(run_path, run)
    result.ops, result.steps, result.generations = (tables["ops"].rows, tables["steps"].rows,
                                                    tables["generations"].rows)
    result.experts = tables["experts"].rows if "experts" in tables else []
    return result
