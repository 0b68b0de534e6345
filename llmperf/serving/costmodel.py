"""The cost-model runner: prices each step of the shared scheduler with `llmperf.analysis`.

A serving step puts a set of sequences through one forward pass: decode sequences one token each,
prefill sequences a chunk of their prompt (Sarathi-Serve's mixed steps, Agrawal et al., OSDI 2024).
Its time is priced from the same operator costs as `llmperf.estimate` (`ForwardModel`, `op_time`):

- every operator outside attention (norms, projections, FFN, embeddings, all-reduces) runs once
  over the step's `T` tokens, so the weights are read once per step; its FLOPs and activation bytes
  grow with `T` (`ForwardModel.<op>(batch=T, q_len=1, ...)`, exactly the cost `estimate` gives a
  batch of `B` prompts of `P` tokens with `T = B * P`);
- `lm_head` runs over one row per sequence that samples a token this step (prefill computes logits
  for the last position only, as serving engines do);
- attention runs once per step over every sequence's own chunk and context (one varlen kernel, as
  FlashAttention's varlen / vLLM's paged kernels): its FLOPs and bytes are the sums over sequences of
  each sequence's `attention_parts(1, q_i, kv_i)`. Those counts are linear in four features of a
  sequence, `(q, kv, q * kv, q (q - 1) / 2)` (fused: causal pairs `q kv - q (q - 1) / 2`, Q/O
  bytes in `q`, K/V bytes in `kv`; naive: the square `q kv`); the coefficients are read off the
  analytical model once (exact, checked on probe points), so a step costs a few multiply-adds;
- the time of each operator is `op_time` (the roofline, or the calibrated time model passed as
  `time_model`, whose efficiencies depend on the operator and its rows `T`, never on the context);
  the time of everything outside attention is cached per `T` (vectorised over blocks of `T`);
- a calibrated time model's `step_overhead_s` (the host's fixed cost per engine step: sampling,
  bookkeeping) is added once per step.

So a static batch (B prompts of P tokens, then decode steps at contexts P+1, P+2, ...) is priced
exactly as `estimate` prices it (tested), and a mixed step adds its prefill chunks and decode tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from llmperf.analysis import op_time
from llmperf.analysis.rollup import Conventions, forward_model, pipeline_transfer_s
from llmperf.analysis.roofline import OpCost
from llmperf.analysis.vocabulary import ATTENTION_OPS, Op
from llmperf.specs import HardwareSpec, ModelSpec, Precision

_ATTN_NAMES = frozenset(op.value for op in ATTENTION_OPS)
_COUNT_FIELDS = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes",
                 "comm_bytes")
# (q, kv) probe points: enough to determine the four coefficients, plus checks
_PROBES = np.array([(1, 1), (1, 7), (3, 5), (4, 4), (2, 9), (5, 11), (8, 8), (7, 30)], dtype=float)
_BLOCK = 256  # dense-time cache is filled this many token counts at a time


def _features(q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    return np.stack([q, kv, q * kv, q * (q - 1) / 2], axis=-1)


def _op_time(cost: OpCost, hardware: HardwareSpec, dtype: str, time_model: object | None):  # noqa: ANN202
    if time_model is None:
        return op_time(cost, hardware, dtype)
    return op_time(cost, hardware, dtype, time_model)


@dataclass(frozen=True)
class _AttnPart:
    """One attention operator: the count fields as linear functions of the sequence features."""

    name: str
    kind: str
    coef: np.ndarray  # (fields, 4), already multiplied by the number of layers
    layers: int = 1  # layers of its kind (each launches it once)


@dataclass
class StepCostModel:
    """Seconds of one step on one replica (a `tp`-way tensor-parallel group, `pp` stages), from the
    per-sequence chunk lengths `q_lens` and contexts after the step `kv_lens`, and the number of
    sequences that sample a token (`logit_rows`)."""

    model: ModelSpec
    hardware: HardwareSpec
    precision: Precision
    tp: int = 1
    pp: int = 1
    attention: str = "fused"
    time_model: object | None = None
    conventions: Conventions | None = None  # fused projections, attention FLOPs, logits (as `estimate`)
    _dense: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    _head: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _rates: dict[tuple[str, int], tuple[float, float, float, float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        conv = self.conventions or Conventions(attention=self.attention)
        self.fm = forward_model(self.model, self.precision, conv, self.tp)
        if self.fm.model.is_mla and self.fm.mla_mode == "auto":
            # one form for every sequence of a step, so the attention counts stay linear in the
            # features: the absorbed one (decode's; a prefill chunk priced as absorbed)
            self.fm = replace(self.fm, mla_mode="absorbed")
        from llmperf.analysis.memory import layers_per_stage
        layers_per_stage(self.model, self.pp)
        self.dtype = self.hardware.compute_dtype(self.precision.activations)
        self.parts = self._fit_attention()
        # per part: FLOP and memory-byte coefficients as plain floats (the per-step hot path)
        self._lines = [(tuple(float(x) for x in p.coef[0]), tuple(float(x) for x in p.coef[1:6].sum(axis=0)))
                       for p in self.parts]

    # ---- attention: linear coefficients ----------------------------------------------------------
    def _fit_attention(self) -> list[_AttnPart]:
        q, kv = _PROBES[:, 0], _PROBES[:, 1]
        X = _features(q, kv)
        parts = []
        # every layer kind's attention, priced as full attention (its counts are linear in the
        # features; a window or chunk caps each sequence's keys, which summed features cannot express)
        for kind, L in self.model.layer_groups():
            parts += self._fit_kind(replace(kind, attention="full", window=None), L, X, q, kv)
        return parts

    def _fit_kind(self, kind, L: int, X: np.ndarray, q: np.ndarray, kv: np.ndarray) -> list[_AttnPart]:  # noqa: ANN001
        parts = []
        for op in self.fm.attention_ops(1.0, q, kv, kind=kind):
            Y = np.stack([np.broadcast_to(np.asarray(getattr(op, f), dtype=float), q.shape) for f in _COUNT_FIELDS],
                         axis=1)
            coef, *_ = np.linalg.lstsq(X, Y, rcond=None)
            if not np.allclose(X @ coef, Y, rtol=1e-9, atol=1e-6):
                raise AssertionError(f"attention operator {op.name}: counts are not linear in "
                                     "(q, kv, q*kv, q(q-1)/2); the step cost model needs them to be")
            # data-parallel attention: each GPU runs its share of the step's sequences (balanced)
            share = 1.0 / self.tp if self.fm.dp_attention else 1.0
            parts.append(_AttnPart(name=op.name, kind=op.kind, coef=coef.T * L * share, layers=L))
        return parts

    def _rates_for(self, part: _AttnPart, rows: int) -> tuple[float, float, float, float]:
        """(seconds per FLOP, seconds per byte, fixed seconds, overlapped host seconds) of `part` at
        `rows` tokens: the time model's efficiencies depend on the operator and its rows only, so they
        are read once."""
        key = (part.name, rows)
        hit = self._rates.get(key)
        if hit is None:
            base = _op_time(OpCost(name=part.name, kind=part.kind, rows=rows), self.hardware, self.dtype,
                            self.time_model) if _has_rows() else None
            zero = base.overhead_s if base is not None else 0.0
            host = base.host_s if base is not None else 0.0
            per_flop = _op_time(_cost(part, rows, flops=1.0), self.hardware, self.dtype, self.time_model).compute_s
            per_byte = _op_time(_cost(part, rows, act_read_bytes=1.0), self.hardware, self.dtype,
                                self.time_model).memory_s
            hit = (float(per_flop), float(per_byte), float(zero), float(host))
            self._rates[key] = hit
        return hit

    def attention_counts(self, q_lens: np.ndarray, kv_lens: np.ndarray) -> list[np.ndarray]:
        """Per attention operator, its count fields summed over the sequences (all layers)."""
        F = _features(np.asarray(q_lens, dtype=float), np.asarray(kv_lens, dtype=float)).sum(axis=0)
        return [p.coef @ F for p in self.parts]

    def attention_time_s(self, features, rows: int) -> float:  # noqa: ANN001
        """Attention time of a step whose summed sequence features are `features` (4 numbers)."""
        f0, f1, f2, f3 = (float(x) for x in features)
        total = 0.0
        for p, (c, b) in zip(self.parts, self._lines):
            L = p.layers
            per_flop, per_byte, fixed, host = self._rates_for(p, rows)
            flops = c[0] * f0 + c[1] * f1 + c[2] * f2 + c[3] * f3
            nbytes = b[0] * f0 + b[1] * f1 + b[2] * f2 + b[3] * f3
            # the counts are summed over the layers; every layer launches the operator once
            total += L * (max(flops * per_flop / L, nbytes * per_byte / L, host) + fixed)
        return total

    # ---- everything else: cached per token count ---------------------------------------------------
    def dense_time_s(self, tokens: int) -> float:
        """Every operator outside attention and lm_head, over `tokens` tokens, plus pipeline transfers."""
        block = tokens // _BLOCK
        table = self._dense.get(block)
        if table is None:
            table = self._dense_block(block)
            self._dense[block] = table
        return float(table[tokens - block * _BLOCK])

    def _dense_block(self, block: int) -> np.ndarray:
        T = np.arange(block * _BLOCK, (block + 1) * _BLOCK, dtype=float)
        T1 = np.maximum(T, 1.0)  # row 0 is never used; keep the formulas away from zero tokens
        try:
            return self._dense_times(T1)
        except (TypeError, ValueError):  # a time model that only takes scalars
            return np.array([float(self._dense_times(t)) for t in T1])

    def _dense_times(self, T):  # noqa: ANN001, ANN202
        total = pipeline_transfer_s(self.fm, self.hardware, T, 1, self.pp) + 0.0 * T
        for cost in self.fm.forward_ops(T, 1, 1):
            if cost.name in _ATTN_NAMES or cost.name == Op.lm_head.value:
                continue
            total = total + _op_time(cost, self.hardware, self.dtype, self.time_model).time_s
        return np.asarray(total, dtype=float)

    def head_time_s(self, rows: int) -> float:
        """`lm_head` over `rows` sequences (one logit row each)."""
        hit = self._head.get(rows)
        if hit is None:
            cost = self.fm.lm_head(rows, 1, 1)
            hit = float(_op_time(cost, self.hardware, self.dtype, self.time_model).time_s) if rows else 0.0
            self._head[rows] = hit
        return hit

    # ---- a step ----------------------------------------------------------------------------------
    def step_time_s(self, q_lens: Iterable[int], kv_lens: Iterable[int], logit_rows: int) -> float:
        q = np.asarray(list(q_lens) if not isinstance(q_lens, np.ndarray) else q_lens, dtype=float)
        kv = np.asarray(list(kv_lens) if not isinstance(kv_lens, np.ndarray) else kv_lens, dtype=float)
        return self.step_time_from_features(int(q.sum()), _features(q, kv).sum(axis=0), logit_rows)

    @property
    def step_overhead_s(self) -> float:
        """The host's fixed cost per engine step outside the forward pass (sampling, bookkeeping),
        from a calibrated time model (0 for the roofline)."""
        return float(getattr(self.time_model, "step_overhead_s", 0.0) or 0.0)

    def step_time_from_features(self, tokens: int, features: np.ndarray, logit_rows: int) -> float:
        if tokens <= 0:
            return 0.0
        return (self.dense_time_s(tokens) + self.attention_time_s(features, tokens) + self.head_time_s(logit_rows)
                + self.step_overhead_s)


def _cost(part: _AttnPart, rows: int, **counts: float) -> OpCost:
    kw = dict(name=part.name, kind=part.kind, **counts)
    if _has_rows():
        kw["rows"] = rows
    return OpCost(**kw)


def _has_rows() -> bool:
    """Whether `OpCost` carries `rows` (the time-model hook of `llmperf.analysis`)."""
    return _HAS_ROWS


_HAS_ROWS = "rows" in OpCost.__dataclass_fields__


__all__ = ["StepCostModel"]
