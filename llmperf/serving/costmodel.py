"""The cost-model runner: prices each step of the shared scheduler with `llmperf.analysis` (`StepCostModel`).
A step puts decode sequences (one token each) and prefill chunks through one forward pass (Sarathi-Serve,
arXiv:2403.02310), priced from the same operator costs as `llmperf.estimate` (`ForwardModel`, `op_time`):

- every operator outside attention runs once over the step's `T` tokens, so the weights are read once
  per step (`dense_time_s`, cached per `T`); `lm_head` runs over one row per sequence that samples;
- attention runs once per step over every sequence's own chunk and context (one varlen kernel, as
  FlashAttention's varlen and vLLM's paged kernels): per layer kind its FLOPs and bytes are exactly
  linear in four features of a sequence, `(q, keys read, attended pairs, q * keys read)`
  (`span_features`), whose coefficients are read off the analytical model once, so sliding and
  chunked layers pay their window, and a step costs a few multiply-adds per group of layers;
- MLA under `mla_mode="auto"` prices decode sequences in the absorbed form and prefill chunks in the
  unabsorbed one, as `ForwardModel.absorbed` decides for `estimate`;
- Gated DeltaNet layers' `conv1d` and `deltanet` are linear in six sums over the sequences
  (`state_features`), priced once per step; DSA's indexer scores with the attention, over every key;
- a calibrated time model's `step_overhead_s` is added once per step, and a step with a prefill chunk
  is priced with its prefill terms (`for_phase("prefill")`).

So a static batch is priced exactly as `estimate` prices it (tested), and a mixed step adds its
prefill chunks and decode tokens. The derivation in full: docs/serving.md, "How a step is priced".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace

import numpy as np

from llmperf.analysis import op_time
from llmperf.analysis.attention_eff import AttnShape
from llmperf.analysis.operators import DELTANET_CHUNK, attended_pairs, keys_read
from llmperf.analysis.rollup import Conventions, forward_model, pipeline_transfer_s
from llmperf.analysis.roofline import ROOFLINE, OpCost
from llmperf.analysis.vocabulary import ATTENTION_OPS, Op
from llmperf.specs import HardwareSpec, ModelSpec, Precision

_ATTN_NAMES = frozenset(op.value for op in ATTENTION_OPS)
# MLA's operators that exist in one form only (unabsorbed: kv_b_proj over the keys; absorbed: the
# query and value absorptions): priced with the attention, per sequence, never per step's tokens
_MLA_FORM_OPS = frozenset({"kv_b_proj", "q_absorb", "v_absorb"})
# operators over the logit rows (one per sampling sequence), not over the step's tokens
_LOGIT_OPS = frozenset({Op.lm_head.value, Op.logits_gather.value, "final_softcap", Op.logits_scale.value,
                        "hc_head"})  # DeepSeek-V4: its hyper-head, over the logit rows as lm_head
_COUNT_FIELDS = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes",
                 "comm_bytes")
# (q, kv) probe points: enough to determine the five coefficients, plus checks; a window or chunk
# adds points around it (`_probes`)
_PROBES = ((1, 1), (1, 7), (3, 5), (4, 4), (2, 9), (5, 11), (8, 8), (7, 30))
_BLOCK = 256  # dense-time cache is filled this many token counts at a time
# DeepSeek Sparse Attention's indexer operators that depend on every key (priced with the attention)
_INDEX_KEY_OPS = ("index_score", "index_topk")
# linear layers' operators that depend on each sequence (its state, its chunk): priced per step (Gated
# DeltaNet's core is `deltanet`, Mamba-2's `ssd`; `StepCostModel.state_ops`)
_STATE_OPS = ("conv1d", "deltanet")
# (q, kv) probes of one sequence for their fit: decode and chunks, first and continuing, across the chunk size
_STATE_PROBES = ((1, 1), (1, 5), (2, 2), (3, 10), (7, 7), (64, 64), (65, 65), (100, 300), (130, 130),
                 (200, 1000), (1, 4000), (64, 700))


def state_features(q, kv, chunk: int = DELTANET_CHUNK) -> np.ndarray:  # noqa: ANN001
    """A linear layer's features of sequences of `q` new tokens over contexts `kv` (after the step), summed:
    `[[sequences, tokens, q == 1 ones, continuing ones (kv > q)], [sum of q min(q, C) and of ceil(q / C) over
    the q > 1 ones, 0, 0]]` (C: the chunked form's block, `ForwardModel.linear_chunk`); `conv1d`'s and the
    core's (`deltanet`, `ssd`) counts are linear in them."""
    q = np.asarray(q, dtype=float).reshape(-1)
    kv = np.asarray(kv, dtype=float).reshape(-1)
    multi = q > 1
    return np.array([[q.size, q.sum(), float(np.sum(~multi)), float(np.sum(kv > q))],
                     [float(np.sum(np.where(multi, q * np.minimum(q, chunk), 0.0))),
                      float(np.sum(np.where(multi, np.ceil(q / chunk), 0.0))), 0.0, 0.0]])


def scalar_state_features(q: int, kv: int, chunk: int = DELTANET_CHUNK) -> tuple[float, float, float, float]:
    """(q == 1, continuing, q min(q, C) if q > 1, blocks if q > 1) of one sequence, in plain Python (the
    simulator's per-item path) -- without the sequence and token counts, which it sums itself."""
    if q == 1:
        return 1.0, float(kv > q), 0.0, 0.0
    return 0.0, float(kv > q), float(q * min(q, chunk)), float(-(-q // chunk))


def _probes(span: tuple[int | None, int | None]) -> tuple[np.ndarray, np.ndarray]:
    pts = list(_PROBES)
    w = span[0] or span[1]
    if w:  # both sides of the window: short contexts, long ones, chunks across a chunk boundary
        pts += [(1, w), (1, w + 3), (2, 2 * w + 1), (w + 1, w + 1), (5, 3 * w + 2), (w + 7, 2 * w + 9),
                (3, w - 1 if w > 1 else 1), (2 * w + 3, 2 * w + 3)]
    q, kv = np.array(pts, dtype=float).T
    return q, kv


def span_features(q, kv, span: tuple[int | None, int | None]):  # noqa: ANN001, ANN201
    """A sequence's attention features for layers of `span` = (window, chunk): `(q, keys read,
    attended pairs, q * keys read)`; every attention count is linear in them (`attention_core`)."""
    window, chunk = span
    k = keys_read(q, kv, window, chunk)
    return np.stack(np.broadcast_arrays(q, k, attended_pairs(q, kv, True, window, chunk), q * k), axis=-1)


def _scalar_features(q: int, kv: int, window: int | None, chunk: int | None) -> tuple[float, float]:
    """(keys read, attended pairs) of one sequence, in plain Python (the simulator's per-item path)."""
    if chunk is not None:
        lo = kv - q
        k = kv - (lo // chunk) * chunk

        def pre(m: int) -> float:
            f, r = divmod(m, chunk)
            return chunk * (chunk + 1) / 2 * f + r * (r + 1) / 2
        return k, pre(kv) - pre(lo)
    if window is None:
        return kv, q * kv - q * (q - 1) / 2
    if q == 1:
        k = kv if kv < window else window
        return k, k
    k = min(kv, q + window - 1)
    lo, hi = kv - q + 1, kv
    top = min(hi, window)
    below = max(top - lo + 1, 0) * (lo + top) / 2
    above = max(hi - max(lo, window + 1) + 1, 0) * window
    return k, below + above


def _op_time(cost: OpCost, hardware: HardwareSpec, dtype: str, time_model: object | None):  # noqa: ANN202
    if time_model is None:
        return op_time(cost, hardware, dtype)
    return op_time(cost, hardware, dtype, time_model)


@dataclass(frozen=True)
class _AttnPart:
    """One attention operator of one layer kind (and, for MLA, one form): its count fields as linear
    functions of the summed sequence features of its `group`. Column 0 of `coef` is paid once per
    step when the group has a sequence at all (the weights of MLA's kv_b_proj / absorptions), columns
    1-4 multiply the summed features."""

    name: str
    kind: str
    coef: np.ndarray  # (fields, 5), already multiplied by the number of layers (and the dp share)
    group: int = 0  # index into the step's feature groups (form x span)
    layers: int = 1  # layers of its kind (each launches it once)
    compute_dtype: str | None = None
    heads: tuple[float, float, float] | None = None  # a fused attention's (heads, KV heads, head dim) per GPU
    latent: bool = False  # MLA's attention (`AttnShape.latent`)


@dataclass(frozen=True)
class _StatePart:
    """A Gated DeltaNet operator priced per step: its per-layer count fields as `coef @ x` (x: the six
    summed `state_features`) plus its weights, read once a step; `ref` gives its other fields."""

    ref: OpCost
    coef: np.ndarray  # (fields, 6), weight_bytes' row zero
    weight_bytes: float
    layers: int
    label: str


@dataclass
class StepCostModel:
    """Seconds of one step on one replica (a `tp`-way group, `pp` stages), from the per-sequence
    chunk lengths `q_lens` and contexts after the step `kv_lens`, and the number of sequences that
    sample a token (`logit_rows`).

    Sequences' attention features are kept per group: one group per distinct attention span of the
    model's layer kinds (full, each sliding window, each chunk size), and for MLA under
    `mla_mode="auto"` per form too (decode sequences, q = 1, run the absorbed form; prefill chunks,
    q > 1, the unabsorbed one, as `ForwardModel.absorbed` says): `groups` lists them as
    (absorbed or None, (window, chunk)). A model with Gated DeltaNet layers adds two rows after them
    (`state_features`; `state_parts` prices them)."""

    model: ModelSpec
    hardware: HardwareSpec
    precision: Precision
    tp: int = 1
    pp: int = 1
    attention: str = "fused"
    time_model: object | None = None
    conventions: Conventions | None = None  # fused projections, attention FLOPs, logits, MLA form, ep, dp
    _dense: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    _head: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _rates: dict[tuple, tuple[float, ...]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        conv = self.conventions or Conventions(attention=self.attention)
        self.fm = forward_model(self.model, self.precision, conv, self.tp)
        from llmperf.analysis.memory import layers_per_stage
        layers_per_stage(self.model, self.pp)
        self.dtype = self.hardware.compute_dtype(self.precision.activations)
        m = self.fm.model
        if m.is_mla and self.fm.mla_mode == "auto":
            self.forms: tuple[bool | None, ...] = (True, False)  # absorbed (q == 1), unabsorbed (q > 1)
        elif m.is_mla:
            self.forms = (self.fm.mla_mode == "absorbed",)
        else:
            self.forms = (None,)
        #: DeepSeek-V4: its attention's counts are not linear in a sequence's features (entries every rate
        #: tokens, the indexer's top-k): the operators that depend on the context are priced per step from the
        #: step's (new tokens, context) pairs (`v4_time_s`), no span groups
        self.v4 = bool(m.is_v4_attention)
        self.v4_ops = self._v4_sequence_ops() if self.v4 else frozenset()
        spans: list[tuple[int | None, int | None]] = []
        for kind, _ in self.model.layer_groups():
            if self.v4:
                break
            if kind.attention not in ("linear", "none") and self.fm._span(kind) not in spans:
                spans.append(self.fm._span(kind))
        if m.is_sparse_attention and (None, None) not in spans:  # DSA's indexer scores every key
            spans.append((None, None))
        self.spans = tuple(spans)
        self.groups = tuple((f, s) for f in self.forms for s in self.spans)
        #: the common case: one group, full attention (the simulator's fast path)
        #: the linear layers' per-sequence operators and their chunked form's block (`state_features`)
        self.state_ops = ("conv1d", "ssd") if m.is_mamba else _STATE_OPS
        self.state_chunk = self.fm.linear_chunk
        self.state_parts = self._fit_state() if m.has_linear_layers else []
        self.simple = (not self.v4 and len(self.groups) == 1 and self.spans[0] == (None, None)
                       and not self.state_parts)
        self.parts = [] if self.v4 else self._fit_attention()
        # per part: (intercept, FLOP line, memory-byte line) as plain floats (the per-step hot path)
        self._lines = [(float(p.coef[1:6, 0].sum()), tuple(float(x) for x in p.coef[0, 1:]),
                        tuple(float(x) for x in p.coef[1:6, 1:].sum(axis=0)), float(p.coef[0, 0]))
                       for p in self.parts]

    # ---- DeepSeek-V4: its attention per step, from the sequences -----------------------------------
    def _v4_sequence_ops(self) -> frozenset[str]:
        """The operators of DeepSeek-V4's attention sections that depend on a sequence's context or are not
        linear in its new tokens (the attention core, the compressors' pooling, the indexer's scores and top-k):
        every one whose counts at some (new tokens, context) differ from new tokens x a one-token step's."""
        q = np.array([1.0, 1, 1, 3, 5, 8, 17, 40, 200, 700])
        kv = np.array([1.0, 9, 700, 3, 300, 8, 4000, 40, 1000, 700])
        names = set(_ATTN_NAMES)
        for part, kind, _, _ in self.fm.sections:
            if part != "attention":
                continue
            one = {op.name: op for op in self.fm.section_ops(part, 1.0, 1.0, 1.0, kind)}
            for op in self.fm.section_ops(part, 1.0, q, kv, kind):
                base = one[op.name]
                if any(not np.allclose(np.broadcast_to(np.asarray(getattr(op, f), dtype=float), q.shape),
                                       q * float(getattr(base, f)), rtol=1e-12, atol=0.0)
                       for f in _COUNT_FIELDS if f not in ("weight_bytes", "comm_bytes")):
                    names.add(op.name)
        return frozenset(names)

    def v4_features(self, q_lens, kv_lens) -> dict[tuple[float, float], float]:  # noqa: ANN001
        """DeepSeek-V4's step features: sequences by (new tokens, context after the step), how many of each."""
        out: dict[tuple[float, float], float] = {}
        for q, kv in zip(np.asarray(q_lens, dtype=float).reshape(-1), np.asarray(kv_lens, dtype=float).reshape(-1)):
            out[(float(q), float(kv))] = out.get((float(q), float(kv)), 0.0) + 1.0
        return out

    def v4_time_s(self, features: dict[tuple[float, float], float]) -> float:
        """Seconds of DeepSeek-V4's context-dependent operators (`v4_ops`) in a step whose sequences are
        `features` ((new tokens, context) -> sequences): each operator's counts evaluated per distinct pair as
        `estimate` evaluates a batch of them (`ForwardModel.section_ops`, every layer of each attention section),
        summed over the pairs (one kernel over the step's sequences), priced once; a static batch is one pair:
        `estimate`'s operator exactly. With data-parallel attention the busiest GPU runs ceil(N / tp) of the step's
        N sequences, a balanced share of every pair (one pair: `estimate`'s `local_batch`)."""
        if not features:
            return 0.0
        keys = list(features)
        n = np.array([features[k] for k in keys])
        q = np.array([k[0] for k in keys])
        kv = np.array([k[1] for k in keys])
        dp = self.tp if self.fm.dp_attention and self.tp > 1 else 1
        share = -(-float(n.sum()) // dp) / float(n.sum())  # 1 without data-parallel attention
        total = 0.0
        for part, kind, count, label in self.fm.sections:
            if part != "attention":
                continue
            # with dp, section_ops runs local_batch(n x dp) = n sequences of each pair on one GPU, scaled to its share
            for op in self.fm.section_ops(part, n * dp, q, kv, kind):
                if op.name not in self.v4_ops:
                    continue
                op = _v4_sum(op.scaled(count, layer=label), len(keys), share)
                total += float(_op_time(op, self.hardware, self.dtype, self.time_model).time_s)
        return total

    # ---- attention: linear coefficients ----------------------------------------------------------
    def group_of(self, q_len: int, span_index: int) -> int:
        """The feature group of a sequence of `q_len` new tokens on the span `span_index`."""
        form = 0 if len(self.forms) == 1 or q_len == 1 else 1
        return form * len(self.spans) + span_index

    def _fit_attention(self) -> list[_AttnPart]:
        parts = []
        for fi, form in enumerate(self.forms):
            fm = self.fm if form is None else replace(self.fm, mla_mode="absorbed" if form else "unabsorbed")
            for kind, L in self.model.layer_groups():
                if kind.attention in ("linear", "none"):  # no KV: a state's operators are `state_parts`
                    continue
                g = fi * len(self.spans) + self.spans.index(self.fm._span(kind))
                parts += self._fit_kind(fm, kind, L, g)
                if self.model.is_sparse_attention and not kind.shared_topk:  # indexer scores, top-k: every key
                    parts += self._fit_kind(fm, kind, L, fi * len(self.spans) + self.spans.index((None, None)),
                                            names=_INDEX_KEY_OPS)
        return parts

    def _fit_kind(self, fm, kind, L: int, group: int, names: tuple[str, ...] = ()) -> list[_AttnPart]:  # noqa: ANN001
        """The attention operators of `kind` (or the operators `names`) as lines in the group's features."""
        span = self.groups[group][1]
        q, kv = _probes(span)
        X = np.column_stack([np.ones_like(q), span_features(q, kv, span)])
        # features of very different sizes (a 4096-token window): solve with rows and columns scaled
        scale = np.abs(X).max(axis=0)
        row = 1.0 / np.abs(X / scale).max(axis=1)
        ops = fm.attention_ops(1.0, q, kv, kind=kind)
        if names:
            ops = [getattr(fm, name)(1.0, q, kv) for name in names]
        elif self.model.is_mla:
            ops = ([fm.kv_b_proj(1.0, q, kv, kind=kind)] if fm.mla_mode == "unabsorbed"
                   else [fm.q_absorb(1.0, q, kv), fm.v_absorb(1.0, q, kv)]) + ops
        parts = []
        for op in ops:
            Y = np.stack([np.broadcast_to(np.asarray(getattr(op, f), dtype=float), q.shape) for f in _COUNT_FIELDS],
                         axis=1)
            coef, *_ = np.linalg.lstsq(X / scale * row[:, None], Y * row[:, None], rcond=None)
            coef = coef / scale[:, None]
            if not np.allclose(X @ coef, Y, rtol=1e-9, atol=1e-6 + 1e-12 * np.abs(Y).max()):
                raise AssertionError(f"attention operator {op.name} ({kind.label}): counts are not linear in "
                                     "(1, q, keys, pairs, q*keys); the step cost model needs them to be")
            coef = coef.T * L
            # data-parallel attention: each GPU runs its share of the step's sequences (balanced);
            # the weights (column 0) are read once on every GPU
            if self.fm.dp_attention and self.tp > 1:
                coef[:, 1:] /= self.tp
            a = getattr(op, "attn", None)  # fused attention: priced by shape where the time model does
            heads = None if a is None else tuple(float(np.ravel(x)[0]) for x in (a.heads, a.kv_heads, a.head_dim))
            parts.append(_AttnPart(name=op.name, kind=op.kind, coef=coef, group=group, layers=L,
                                   compute_dtype=op.compute_dtype, heads=heads,
                                   latent=a is not None and bool(np.any(a.latent))))
        return parts

    def _fit_state(self) -> list[_StatePart]:
        """`conv1d` and the core (`state_ops`) of each section of linear layers, as linear functions of the
        summed `state_features` (checked on probes: the step cost model needs them to be linear)."""
        q, kv = np.array(_STATE_PROBES, dtype=float).T
        c = self.state_chunk  # probes across its block too
        q = np.concatenate([q, [c, c + 1, 3 * c + 5]])
        kv = np.concatenate([kv, [c, 2 * c + 1, 3 * c + 5]])
        X = np.stack([state_features(a, b, c).reshape(-1)[:6] for a, b in zip(q, kv)])
        scale = np.abs(X).max(axis=0)
        parts = []
        for part, kind, count, label in self.fm.sections:
            if part != "attention" or kind.attention != "linear":
                continue
            for name in self.state_ops:
                op = getattr(self.fm, name)(1.0, q, kv)
                weight = np.broadcast_to(np.asarray(op.weight_bytes, dtype=float), q.shape)
                if not np.all(weight == weight[0]):
                    raise AssertionError(f"{name}: its weights depend on the sequence")
                Y = np.stack([np.broadcast_to(np.asarray(getattr(op, f), dtype=float), q.shape)
                              if f != "weight_bytes" else np.zeros_like(q) for f in _COUNT_FIELDS], axis=1)
                if np.any(Y[:, _COUNT_FIELDS.index("comm_bytes")]):  # `state_time_s` prices no collective
                    raise AssertionError(f"{name}: it moves bytes over the interconnect")
                coef, *_ = np.linalg.lstsq(X / scale, Y, rcond=None)
                coef = coef / scale[:, None]
                if not np.allclose(X @ coef, Y, rtol=1e-9, atol=1e-6 + 1e-12 * np.abs(Y).max()):
                    raise AssertionError(f"{name} ({label}): counts are not linear in the state features")
                if self.fm.dp_attention and self.tp > 1:  # each GPU its share of the sequences (balanced)
                    coef = coef / self.tp
                ref = getattr(self.fm, name)(1.0, 2.0, 2.0)
                parts.append(_StatePart(ref=ref, coef=coef.T, weight_bytes=float(weight[0]), layers=count,
                                        label=label))
        return parts

    def state_time_s(self, features) -> float:  # noqa: ANN001
        """Seconds of the Gated DeltaNet layers' `conv1d` and `deltanet` in a step whose summed
        `state_features` are `features` (the two rows after the attention groups'), every layer."""
        f = np.asarray(features[len(self.groups):len(self.groups) + 2], dtype=float).reshape(-1)[:6]
        if f[0] <= 0:
            return 0.0
        dp = self.tp if self.fm.dp_attention and self.tp > 1 else 1
        rows = float(f[1]) if dp == 1 else float(-(-int(f[1]) // dp))
        total = 0.0
        for i, p in enumerate(self.state_parts):
            per_flop, per_byte, fixed, host = self._state_rates(i, rows)
            counts = p.coef @ f  # one layer's
            flops, nbytes = float(counts[0]), float(counts[1:6].sum()) + p.weight_bytes
            total += p.layers * (max(flops * per_flop, nbytes * per_byte, host) + fixed)
        return total

    @property
    def _rates_by_rows(self) -> bool:
        """Whether an operator's rates (`_rates_for`, `_state_rates`) depend on its rows and shape: not
        under the roofline (`op_time` with `ROOFLINE`: e = 1, no latency, no overhead, for any operator
        reads only its counts, kind and dtype): its rates are read once per operator, not once per
        (rows, shape) a run meets (three `op_time` calls each, thousands a run)."""
        return self.time_model is not None and self.time_model is not ROOFLINE

    def _state_rates(self, i: int, rows: float) -> tuple[float, float, float, float]:
        """(seconds per FLOP, seconds per byte, fixed seconds, overlapped floor) of `state_parts[i]` at
        `rows` tokens, one layer: its efficiencies depend on its kind and rows, not its counts (neither
        is an operator `op_e_memory` prices by bytes), so they are read once per rows, as `_rates_for`."""
        key = ("state", i, rows if self._rates_by_rows else None)
        hit = self._rates.get(key)
        if hit is None:
            ref, big = self.state_parts[i].ref, 2.0 ** 50
            zero = dict.fromkeys(_COUNT_FIELDS, 0.0)
            base, t_flop, t_byte = (_op_time(replace(ref, rows=rows, **{**zero, **one}), self.hardware, self.dtype,
                                             self.time_model) for one in ({}, {"flops": big}, {"act_read_bytes": big}))
            hit = (float(t_flop.compute_s) / big, float(t_byte.memory_s) / big, float(base.overhead_s),
                   max(float(base.host_s), float(base.floor_s)))
            self._rates[key] = hit
        return hit

    def _rates_for(self, part: _AttnPart, rows: int, q_len: int = 1) -> tuple[float, float, float, float, float]:
        """(seconds per FLOP, seconds per byte, fixed seconds, overlapped floor: the host's dispatch or the
        kernels' device minimum, a fused attention's device latency added to both roofs) of `part` at
        `rows` tokens of `q_len` new tokens per sequence: the time model's efficiencies depend on the
        operator, its rows and (fused attention) its shape without the context, so they are read once."""
        key = (part.name, part.kind, part.compute_dtype, part.heads)  # Gemma 4: shapes differ by kind
        if self._rates_by_rows:
            key += (rows, q_len)
        hit = self._rates.get(key)
        if hit is None:
            base = (_op_time(_cost(part, rows, q_len), self.hardware, self.dtype, self.time_model) if _has_rows()
                    else None)
            zero = base.overhead_s if base is not None else 0.0
            host = max(float(base.host_s), float(base.floor_s)) if base is not None else 0.0  # flat floors
            lat = float(base.compute_s) if base is not None else 0.0  # zero counts: only the latency is left
            big = 2.0 ** 50  # a large count: the latency's rounding stays far below the rate's
            t_flop = _op_time(_cost(part, rows, q_len, flops=big), self.hardware, self.dtype, self.time_model)
            t_byte = _op_time(_cost(part, rows, q_len, act_read_bytes=big), self.hardware, self.dtype,
                              self.time_model)
            per_flop = (float(t_flop.compute_s) - lat) / big
            per_byte = (float(t_byte.memory_s) - lat) / big
            hit = (per_flop, per_byte, float(zero), float(host), lat)
            self._rates[key] = hit
        return hit

    def features(self, q_lens, kv_lens) -> np.ndarray:  # noqa: ANN001
        """The summed features of the sequences, per group: (groups, 4); with Gated DeltaNet layers two
        rows more, their `state_features` (DeepSeek-V4: `v4_features`)."""
        if self.v4:
            return self.v4_features(q_lens, kv_lens)  # type: ignore[return-value]
        q = np.asarray(q_lens, dtype=float).reshape(-1)
        kv = np.asarray(kv_lens, dtype=float).reshape(-1)
        out = np.zeros((len(self.groups) + (2 if self.state_parts else 0), 4))
        if self.state_parts:
            out[len(self.groups):] = state_features(q, kv, self.state_chunk)
        for si, span in enumerate(self.spans):
            f = span_features(q, kv, span).reshape(-1, 4)
            if len(self.forms) == 1:
                out[si] = f.sum(axis=0)
            else:
                dec = q == 1
                out[si] = f[dec].sum(axis=0)
                out[len(self.spans) + si] = f[~dec].sum(axis=0)
        return out

    def attention_counts(self, q_lens, kv_lens) -> list[np.ndarray]:  # noqa: ANN001
        """Per attention operator, its count fields summed over the sequences (all layers)."""
        F = self.features(q_lens, kv_lens)
        return [p.coef[:, 0] * (F[p.group][0] > 0) + p.coef[:, 1:] @ F[p.group] for p in self.parts]

    def attention_time_s(self, features, rows: int | None = None) -> float:  # noqa: ANN001
        """Attention time of a step whose summed sequence features are `features`, one row of 4
        numbers per group (`groups`); a group's rows are its sequences' new tokens (the busiest
        GPU's share of them with data-parallel attention). DeepSeek-V4: `v4_time_s`."""
        if self.v4:
            return self.v4_time_s(features)
        total = 0.0
        dp = self.tp if self.fm.dp_attention and self.tp > 1 else 1
        for p, (wb, c, b, wf) in zip(self.parts, self._lines):
            f0, f1, f2, f3 = (float(x) for x in features[p.group])
            if f0 <= 0:
                continue
            L = p.layers
            r = int(f0) if dp == 1 else -(-int(f0) // dp)
            # new tokens per sequence, weighted by the keys each reads (a static batch's prompt length,
            # decode's 1; a mixed step's is dominated by its long sequences): fused attention's shape
            q_eff = max(1, round(f3 / f1)) if p.heads is not None and f1 > 0 else 1
            per_flop, per_byte, fixed, host, lat = self._rates_for(p, r, q_eff)
            flops = wf + c[0] * f0 + c[1] * f1 + c[2] * f2 + c[3] * f3
            nbytes = wb + b[0] * f0 + b[1] * f1 + b[2] * f2 + b[3] * f3
            # the counts are summed over the layers; every layer launches the operator once
            total += L * (max(lat + flops * per_flop / L, lat + nbytes * per_byte / L, host) + fixed)
        if self.state_parts:
            total += self.state_time_s(features)
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
        total = pipeline_transfer_s(self.fm, self.hardware, T, 1, self.pp, self.time_model) + 0.0 * T
        state = self.state_ops if self.state_parts else ()  # priced per step, from the sequences (`state_time_s`)
        state += _INDEX_KEY_OPS if self.model.is_sparse_attention else ()
        state += tuple(self.v4_ops)  # DeepSeek-V4: its context-dependent operators are priced per step
        for cost in self.fm.forward_ops(T, 1, 1):
            if cost.name in _ATTN_NAMES or cost.name in _MLA_FORM_OPS or cost.name in _LOGIT_OPS or cost.name in state:
                continue
            total = total + _op_time(cost, self.hardware, self.dtype, self.time_model).time_s
        return np.asarray(total, dtype=float)

    def head_time_s(self, rows: int) -> float:
        """`lm_head` (and Gemma's final soft-capping) over `rows` sequences (one logit row each)."""
        hit = self._head.get(rows)
        if hit is None:
            hit = 0.0
            if rows:
                for cost in self.fm.tail_ops(rows, 1, 1):
                    if cost.name in _LOGIT_OPS:
                        hit += float(_op_time(cost, self.hardware, self.dtype, self.time_model).time_s)
            self._head[rows] = hit
        return hit

    # ---- a step ----------------------------------------------------------------------------------
    def step_time_s(self, q_lens: Iterable[int], kv_lens: Iterable[int], logit_rows: int) -> float:
        """Seconds of one step: each sequence's new tokens (`q_lens`) over its context (`kv_lens`), with
        `logit_rows` rows through the LM head."""
        q = np.asarray(list(q_lens) if not isinstance(q_lens, np.ndarray) else q_lens, dtype=float)
        kv = np.asarray(list(kv_lens) if not isinstance(kv_lens, np.ndarray) else kv_lens, dtype=float)
        return self.step_time_from_features(int(q.sum()), self.features(q, kv), logit_rows)

    @property
    def prefill_costs(self) -> StepCostModel:
        """This model for a step with a prefill chunk (a token count above its logit rows): the time
        model's prefill terms where its engine prices them apart (a CUDA graph replays only decode
        steps), else this model itself."""
        pre = getattr(self, "_prefill_costs", None)
        if pre is None:
            for_phase = getattr(self.time_model, "for_phase", None)
            tm = for_phase("prefill") if for_phase is not None else self.time_model
            pre = self if tm is self.time_model else replace(self, time_model=tm)
            self._prefill_costs = pre
        return pre

    @property
    def step_overhead_s(self) -> float:
        """The host's fixed cost per engine step outside the forward pass (sampling, bookkeeping),
        from a calibrated time model (0 for the roofline)."""
        return float(getattr(self.time_model, "step_overhead_s", 0.0) or 0.0)

    def step_time_from_features(self, tokens: int, features, logit_rows: int) -> float:  # noqa: ANN001
        """A step of `tokens` new tokens whose sequences' summed features are `features` (one row of
        4 per group, `features`)."""
        if tokens <= 0:
            return 0.0
        if tokens > logit_rows and self.prefill_costs is not self:  # a prefill chunk: the engine's prefill terms
            return self.prefill_costs.step_time_from_features(tokens, features, logit_rows)
        return (self.dense_time_s(tokens) + self.attention_time_s(features) + self.head_time_s(logit_rows)
                + self.step_overhead_s)


def _cost(part: _AttnPart, rows: int, q_len: int = 1, **counts: float) -> OpCost:
    kw = dict(name=part.name, kind=part.kind, compute_dtype=part.compute_dtype, **counts)
    if _has_rows():
        kw["rows"] = rows
    if part.heads is not None:  # one call's shape on this GPU (the time model never looks at the context)
        heads, kv_heads, head_dim = part.heads
        kw["attn"] = AttnShape(batch=rows / q_len, q_len=float(q_len), context=0.0, heads=heads, kv_heads=kv_heads,
                               head_dim=head_dim, latent=part.latent)
    return OpCost(**kw)


def _v4_sum(op: OpCost, k: int, share: float = 1.0) -> OpCost:
    """One operator evaluated over `k` (new tokens, context) pairs as one: its counts and rows summed and scaled by
    `share` (its weights read once), its shape (a fused attention's, a GEMM's) the pair with the most rows' (its batch
    scaled too); one pair at share 1: that pair's operator as it is."""
    def pick(x, i):  # noqa: ANN001, ANN202
        a = np.asarray(x)
        return a.reshape(-1)[i].item() if a.ndim and a.size == k else (a.item() if isinstance(x, np.ndarray) else x)

    rows = np.broadcast_to(np.asarray(op.rows, dtype=float), (k,))
    i = int(np.argmax(rows))
    vals = {f: float(np.broadcast_to(np.asarray(getattr(op, f), dtype=float), (k,)).sum()) * share
            for f in (*_COUNT_FIELDS, "rows") if f != "weight_bytes"}
    vals["weight_bytes"] = float(np.max(np.asarray(op.weight_bytes, dtype=float)))  # read once a step
    vals["calls"] = float(np.max(np.asarray(op.calls, dtype=float)))
    if op.experts is not None:
        vals["experts"] = pick(op.experts, i)
    if op.attn is not None:
        shape = {f: pick(getattr(op.attn, f), i) for f in
                 ("batch", "q_len", "context", "heads", "kv_heads", "head_dim", "latent")}
        vals["attn"] = replace(op.attn, **shape | dict(batch=shape["batch"] * share))
    if op.gemm is not None:
        vals["gemm"] = replace(op.gemm, **{f.name: pick(getattr(op.gemm, f.name), i)
                                            for f in fields(op.gemm)})
    return replace(op, **vals)


def _has_rows() -> bool:
    """Whether `OpCost` carries `rows` (the time-model hook of `llmperf.analysis`)."""
    return _HAS_ROWS


_HAS_ROWS = "rows" in OpCost.__dataclass_fields__


__all__ = ["StepCostModel", "scalar_state_features", "state_features"]
