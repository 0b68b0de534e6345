"""The `efficiency:` block of a hardware file, read and checked field by field: what `llmperf calibrate`
writes into `local.yaml` and what `models_spec/efficiency/typical.yaml` holds.

The block gives, per compute dtype and operator kind, efficiency curves (`Curve`: `[rows, value]`
points, log-linear between) and overheads (`KindTerms`), per-operator overheads, memory efficiencies
and device floors (operator names from `llmperf.analysis.vocabulary`), and from schema 5 the GEMM shape
model's terms (`gemm`) and fused attention's (`attention_eff`), from schema 6 a CPU weight GEMM's
memory efficiency by rows and weight size (`gemm_e_memory`, `GemmBytesCurves`; from schema 7 each
point read as its weight's stream), from schema 9 a CPU decode attention's cost per byte as a line in
its query-head group (`decode_attention`, `DecodeGroupTerms`). What each term means and how a time is
made of them: `llmperf.analysis.timemodel`, `llmperf.analysis.gemm`, `llmperf.analysis.attention_eff`.
A spec-level check, so that a corrupt calibration is refused when it is loaded (`llmperf.specs.local`).
Pure Python + numpy (no torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmperf.errors import SpecError
from llmperf.numeric import is_real

Number = Any  # float or numpy array

OP_KINDS = ("matmul", "attention", "elementwise", "norm", "embedding", "comm")
EFFICIENCY_SCHEMA = 3  # what `llmperf calibrate` writes on a CPU without `gemm_e_memory` (with it: 7;
# on CUDA, with the device floors: 4, with the shape terms: 5)
# 2 added `overhead_mode`, `op_overhead_s`; 3 `op_e_memory`, `op_overhead_rows_s`; 4 a kind's `floor_s`, `op_floor_s`;
# 5 `gemm` (the GEMM shape model's terms, `llmperf.analysis.gemm`) and `attention_eff` (fused attention by shape);
# 6 `gemm_e_memory` (a CPU weight GEMM's memory efficiency by rows and weight bytes, `GemmBytesCurves`);
# 7 the same curves, each point's call read as a stream of its weight alone (`GemmBytesCurves.reads`);
# 8 `op_overhead_rows_by_op_s` (the operators' dispatch called one by one), `one_call` (where a CPU
# decode step runs its layers in one call instead) and `op_overhead_rows_expert_s` (a routed expert's own);
# 9 `decode_attention` (a CPU decode attention's seconds per byte, a line in its query-head group)
READABLE_SCHEMAS = (1, 2, 3, 4, 5, 6, 7, 8, 9)
GEMM_READS = ("call", "weight")  # what a `gemm_e_memory` point's time was read as: schema 6, schema 7
OVERHEAD_MODES = ("add", "overlap")
BACKENDS = ("sdpa", "naive", "triton")  # the engine's attention backends (`llmperf.engine`)
# the operators `op_e_memory` may price: vector operators whose bytes never depend on the context
BYTES_CURVE_OPS = ("embed", "attn_norm", "qk_norm", "rope", "kv_write", "attn_residual", "mlp_norm", "act",
                   "mlp_residual", "final_norm")

#: the GEMM shape model's terms (`llmperf.analysis.gemm`): (lowest, lowest allowed?, highest, how a
#: message says it)
GEMM_FIELDS = ("e_peak", "e_memory", "latency_s", "feed_flop_per_byte")
GEMM_LIMITS = dict(e_peak=(0.0, False, 1.0, "a fraction in (0, 1]"), e_memory=(0.0, False, 1.0, "a fraction in (0, 1]"),
                   latency_s=(0.0, True, 1e-3, "seconds in [0, 1e-3]"),
                   feed_flop_per_byte=(0.0, False, 1e4, "a number in (0, 1e4]"))

#: the fused-attention model's terms (`llmperf.analysis.attention_eff`): name -> (what it is, lower bound,
#: upper bound); bounds are what a yaml may say
ATTENTION_PARAMS: dict[str, tuple[str, float, float]] = {
    "e_compute": ("plateau of the dense matrix peak a large prefill reaches", 1e-3, 1.0),
    "head_dim_half": ("head dim at which e_compute is half its plateau's head-dim share", 0.0, 1024.0),
    "mma_rows": ("rows of a tensor-core tile (decode fills g * q of them)", 1.0, 256.0),
    "cta_half": ("work tiles per SM at which prefill runs at half occupancy", 0.0, 64.0),
    "e_memory": ("plateau of the memory bandwidth a long decode streams the KV cache at", 1e-3, 1.0),
    "kv_half": ("KV streams (batch x KV heads) per SM at half the bandwidth plateau", 0.0, 64.0),
    "latency_s": ("a launch's fixed device time, added to the roofs, seconds", 0.0, 1e-3),
    "wave_s": ("device time added per KV stream per SM (prologue, epilogue, split-KV combine), seconds", 0.0, 1e-3),
}


@dataclass(frozen=True)
class Curve:
    """A value as a function of rows: `[rows, value]` points, log-linear between, flat outside."""

    points: tuple[tuple[float, float], ...]

    @classmethod
    def parse(cls, raw: Any, where: str, x: str = "rows", what: str = "efficiency") -> Curve:
        """`x` names the abscissa in messages (rows, or bytes for `op_e_memory`); `what` the values
        ("efficiency": in (0, 1]; "seconds": in (0, 1), an overhead)."""
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):  # NaN: refused below, by value
            raw = [[1, raw]]
        if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
            raise SpecError(f"{where}: expected a number or a list of [{x}, value] pairs, got {raw!r}")
        pts = []
        for p in raw:
            if (not isinstance(p, Sequence) or isinstance(p, str) or len(p) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)):
                raise SpecError(f"{where}: each point must be [{x}, value], got {p!r}")
            rows, value = float(p[0]), float(p[1])
            if not (rows >= 1 and math.isfinite(rows)):
                raise SpecError(f"{where}: {x} must be >= 1, got {p[0]!r}")
            if what == "seconds" and not (0 < value < 1):
                raise SpecError(f"{where}: seconds must be in (0, 1), got {p[1]!r}")
            if what != "seconds" and not (0 < value <= 1):
                raise SpecError(f"{where}: an efficiency must be in (0, 1], got {p[1]!r}")
            pts.append((rows, value))
        pts.sort()
        if len({r for r, _ in pts}) != len(pts):
            raise SpecError(f"{where}: {x} repeat in {raw!r}")
        return cls(tuple(pts))

    def __call__(self, rows: Number) -> Number:
        xs = np.log([r for r, _ in self.points])
        ys = np.array([v for _, v in self.points])
        out = np.interp(np.log(np.maximum(np.asarray(rows, dtype=float), 1.0)), xs, ys)
        return float(out) if np.ndim(out) == 0 else out

    def to_list(self) -> list[list[float]]:
        """The points as `[[rows, value], ...]`, as an efficiency file writes them."""
        return [[r, v] for r, v in self.points]


@dataclass(frozen=True)
class KindTerms:
    """The efficiencies and overhead of one operator kind."""

    e_compute: Curve
    e_memory: Curve
    overhead_s: float = 0.0
    floor_s: float = 0.0  # a kernel's minimum device time (schema 4), not the host's launch cost

    @classmethod
    def parse(cls, raw: Any, where: str) -> KindTerms:
        """One kind's terms from an efficiency file's mapping (`e_compute`, `e_memory`, `overhead_s`,
        `floor_s`); an unknown or invalid field is refused naming `where`."""
        fields = ("e_compute", "e_memory", "overhead_s", "floor_s")
        if not isinstance(raw, Mapping):
            raise SpecError(f"{where}: expected a mapping with {', '.join(fields)}, got {raw!r}")
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise SpecError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(fields)})")
        overhead, floor = (check_seconds(raw.get(f, 0.0), f"{where}.{f}") for f in ("overhead_s", "floor_s"))
        return cls(e_compute=Curve.parse(raw.get("e_compute", 1.0), f"{where}.e_compute"),
                   e_memory=Curve.parse(raw.get("e_memory", 1.0), f"{where}.e_memory"),
                   overhead_s=overhead, floor_s=floor)


def parse_kinds(raw: Any, where: str) -> dict[str, KindTerms]:
    """An efficiency file's per-kind block: operator kind -> `KindTerms`; an unknown kind is refused naming
    `where`."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of operator kind -> terms, got {raw!r}")
    out = {}
    for kind, terms in raw.items():
        if kind not in OP_KINDS:
            raise SpecError(f"{where}: unknown operator kind {kind!r} (kinds: {', '.join(OP_KINDS)})")
        out[kind] = KindTerms.parse(terms, f"{where}.{kind}")
    return out


def check_seconds(value: Any, where: str) -> float:
    """`value` as seconds in [0, 1), else an error naming `where`."""
    if not is_real(value) or not 0 <= value < 1:
        raise SpecError(f"{where}: must be seconds in [0, 1), got {value!r}")
    return float(value)


def _check_op_names(ops: Any, where: str, shape: str) -> None:
    """`ops` is a mapping whose keys are operator names of the shared vocabulary (`shape` names its
    values in the message)."""
    from llmperf.analysis.vocabulary import OP_NAMES

    if not isinstance(ops, Mapping):
        raise SpecError(f"{where}: expected a mapping of operator -> {shape}, got {ops!r}")
    for op in ops:
        if op not in OP_NAMES:
            raise SpecError(f"{where}: unknown operator {op!r} (see llmperf.analysis.vocabulary)")


def _per_backend(raw: Any, where: str, value: Callable[[Any, str], Any], shape: str) -> dict[str, dict[str, Any]]:
    """{backend: {operator: value}}: known attention backends, vocabulary operator names, each value
    read by `value(raw, where)` (`shape` names the values in the messages)."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of attention backend -> {{operator: {shape}}}, got {raw!r}")
    out: dict[str, dict[str, Any]] = {}
    for backend, ops in raw.items():
        if backend not in BACKENDS:
            raise SpecError(f"{where}: unknown attention backend {backend!r} (backends: {', '.join(BACKENDS)})")
        _check_op_names(ops, f"{where}.{backend}", shape)
        out[str(backend)] = {str(op): value(v, f"{where}.{backend}.{op}") for op, v in ops.items()}
    return out


def parse_op_overheads(raw: Any, where: str) -> dict[str, dict[str, float]]:
    """`op_overhead_s`: {backend: {operator name: seconds}}, names from the shared vocabulary."""
    return _per_backend(raw, where, check_seconds, "seconds")


def parse_op_e_memory(raw: Any, where: str) -> dict[str, dict[str, Curve]]:
    """`op_e_memory`: {compute dtype: {operator name: [[bytes of one call, e_memory], ...]}}."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of compute dtype -> {{operator: curve}}, got {raw!r}")
    out: dict[str, dict[str, Curve]] = {}
    for dtype, ops in raw.items():
        _check_op_names(ops, f"{where}.{dtype}", "[[bytes, e_memory], ...]")
        for op in ops:
            if op not in BYTES_CURVE_OPS:
                raise SpecError(f"{where}.{dtype}: {op!r} cannot take a per-operator memory efficiency "
                                f"(operators: {', '.join(BYTES_CURVE_OPS)})")
        out[str(dtype)] = {str(op): Curve.parse(c, f"{where}.{dtype}.{op}", x="bytes") for op, c in ops.items()}
    return out


@dataclass(frozen=True)
class GemmBytesCurves:
    """A weight GEMM's memory efficiency as a function of its rows and of the bytes of one call's weight:
    per measured row count a `Curve` over the weight's bytes (log-linear between sizes, flat outside),
    log-linear in rows between measured row counts. `covers(rows)`: rows up to the most measured (how a
    time model prices a GEMM beyond them: `llmperf.analysis.timemodel`). `reads` says what a point's
    time was read as: `weight` (schema 7), its weight's bytes alone, so the time depends only on the
    rows and the weight (the FLOPs are 2 x rows x weight elements whatever the N x K), or `call`
    (schema 6), the bytes of the measured call, activations of the measured shape included."""

    by_rows: tuple[tuple[float, Curve], ...]
    reads: str = "call"

    @classmethod
    def parse(cls, raw: Any, where: str, reads: str = "call") -> GemmBytesCurves:
        """{rows: [[weight bytes, e_memory], ...]}; a bad row count or curve is refused naming `where`."""
        if not isinstance(raw, Mapping) or not raw:
            raise SpecError(f"{where}: expected a mapping of rows -> [[weight bytes, e_memory], ...], got {raw!r}")
        out = []
        for rows, curve in raw.items():
            r = rows
            if isinstance(rows, str) and rows.strip().isdigit():
                r = int(rows)
            if not is_real(r) or not r >= 1 or float(r) != int(r):
                raise SpecError(f"{where}: rows must be an integer >= 1, got {rows!r}")
            out.append((float(r), Curve.parse(curve, f"{where}.{rows}", x="bytes")))
        out.sort(key=lambda rc: rc[0])
        if len({r for r, _ in out}) != len(out):
            raise SpecError(f"{where}: rows repeat in {list(raw)!r}")
        if reads not in GEMM_READS:
            raise ValueError(f"reads: one of {', '.join(GEMM_READS)}, got {reads!r}")
        return cls(tuple(out), reads)

    @property
    def max_rows(self) -> float:
        return self.by_rows[-1][0]

    def covers(self, rows: Number) -> Number:
        """Whether `rows` is within the measured row counts (at most the largest)."""
        return np.asarray(rows, dtype=float) <= self.max_rows

    def __call__(self, rows: Number, weight_bytes: Number) -> Number:
        """e_memory at `rows` for a weight of `weight_bytes` (one call's): each row count's curve at the
        weight's bytes, then log-linear in rows between the two measured row counts around `rows`."""
        xs = np.log([r for r, _ in self.by_rows])
        lr = np.log(np.maximum(np.asarray(rows, dtype=float), 1.0))
        vals = np.stack(np.broadcast_arrays(*[np.asarray(c(weight_bytes), dtype=float) for _, c in self.by_rows]))
        if len(xs) == 1:
            out = vals[0] * np.ones_like(lr)
        else:
            lr_c = np.clip(lr, xs[0], xs[-1])
            i = np.clip(np.searchsorted(xs, lr_c, side="right") - 1, 0, len(xs) - 2)
            w = (lr_c - xs[i]) / (xs[i + 1] - xs[i])
            lo, hi = (np.choose(j, vals) if vals.ndim > 1 else vals[j] for j in (i, i + 1))
            out = lo * (1 - w) + hi * w
        return float(out) if np.ndim(out) == 0 else out

    def to_dict(self) -> dict[int, list[list[float]]]:
        """`{rows: [[bytes, e_memory], ...]}`, as an efficiency file writes it."""
        return {int(r): c.to_list() for r, c in self.by_rows}


def parse_gemm_e_memory(raw: Any, where: str, reads: str = "call") -> dict[str, GemmBytesCurves]:
    """`gemm_e_memory`: {compute dtype: {rows: [[weight bytes of one call, e_memory], ...]}}; `reads` as
    `GemmBytesCurves` (the file's schema says which)."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of compute dtype -> {{rows: curve}}, got {raw!r}")
    return {str(d): GemmBytesCurves.parse(c, f"{where}.{d}", reads) for d, c in raw.items()}


#: the additive decode-attention model's fields (`DecodeGroupTerms`); the first two are seconds per byte
DECODE_ATTENTION_FIELDS = ("s_per_byte", "s_per_byte_per_group", "groups", "source")
_MAX_S_PER_BYTE = 1e-6  # 1 MB/s: far slower than any memory; a larger figure is a unit slip


@dataclass(frozen=True, kw_only=True)
class DecodeGroupTerms:
    """A CPU decode attention's cost per byte of its call (K and V streamed once per KV head) as a line in
    its group G, query heads per KV head: `s_per_byte + s_per_byte_per_group * G` seconds (schema 9,
    fitted by `llmperf.measure.calibrate.fit.fit_decode_groups` on the engine's decode attention timed
    at `groups`). Both terms are >= 0 and at least one is positive; `source` says where they come from.
    How a time model uses it: `llmperf.analysis.timemodel`, `EfficiencyTimeModel.decode_group_efficiency`."""

    s_per_byte: float
    s_per_byte_per_group: float
    groups: tuple[int, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("s_per_byte", "s_per_byte_per_group"):
            value = getattr(self, name)
            if not is_real(value) or not 0 <= value < _MAX_S_PER_BYTE:
                raise SpecError(f"{name}: must be seconds per byte in [0, {_MAX_S_PER_BYTE:g}), got {value!r}")
        if self.s_per_byte + self.s_per_byte_per_group <= 0:
            raise SpecError(f"s_per_byte, s_per_byte_per_group: one must be positive, got {self.s_per_byte!r} "
                            f"and {self.s_per_byte_per_group!r}")
        if any(not isinstance(g, int) or isinstance(g, bool) or g < 1 for g in self.groups):
            raise SpecError(f"groups: must be integers >= 1, got {self.groups!r}")

    @classmethod
    def parse(cls, raw: Any, where: str) -> DecodeGroupTerms:
        """From a mapping of `DECODE_ATTENTION_FIELDS` (`groups` and `source` optional); an unknown or bad
        field is refused naming `where` and the field."""
        if not isinstance(raw, Mapping):
            raise SpecError(f"{where}: expected a mapping with {', '.join(DECODE_ATTENTION_FIELDS)}, got {raw!r}")
        unknown = sorted(set(raw) - set(DECODE_ATTENTION_FIELDS))
        if unknown:
            raise SpecError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(DECODE_ATTENTION_FIELDS)})")
        groups = raw.get("groups", [])
        if not isinstance(groups, Sequence) or isinstance(groups, str):
            raise SpecError(f"{where}.groups: expected a list of integers >= 1, got {groups!r}")
        try:
            return cls(s_per_byte=raw.get("s_per_byte"), s_per_byte_per_group=raw.get("s_per_byte_per_group", 0.0),
                       groups=tuple(groups), source=str(raw.get("source", "")))
        except SpecError as exc:
            raise SpecError(f"{where}.{exc}") from None

    def seconds_per_byte(self, group: Number) -> Number:
        """`s_per_byte + s_per_byte_per_group * group`."""
        return self.s_per_byte + self.s_per_byte_per_group * np.asarray(group, dtype=float)

    def to_dict(self) -> dict[str, Any]:
        """The terms as an efficiency file writes them."""
        return dict(s_per_byte=self.s_per_byte, s_per_byte_per_group=self.s_per_byte_per_group,
                    groups=list(self.groups), source=self.source)


def parse_decode_attention(raw: Any, where: str) -> dict[str, DecodeGroupTerms]:
    """`decode_attention`: {compute dtype: {s_per_byte, s_per_byte_per_group, groups, source}}."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of compute dtype -> terms, got {raw!r}")
    return {str(d): DecodeGroupTerms.parse(t, f"{where}.{d}") for d, t in raw.items()}


def parse_op_floors(raw: Any, where: str) -> dict[str, dict[str, float]]:
    """`op_floor_s`: {compute dtype: {operator name: seconds}}, a kernel's minimum device time."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of compute dtype -> {{operator: seconds}}, got {raw!r}")
    out: dict[str, dict[str, float]] = {}
    for dtype, ops in raw.items():
        _check_op_names(ops, f"{where}.{dtype}", "seconds")
        out[str(dtype)] = {str(op): check_seconds(v, f"{where}.{dtype}.{op}") for op, v in ops.items()}
    return out


def parse_op_overhead_rows(raw: Any, where: str) -> dict[str, dict[str, dict[str, Curve]]]:
    """`op_overhead_rows_s`: {compute dtype: {backend: {operator: [[rows, seconds], ...]}}}."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of compute dtype -> {{backend: {{operator: curve}}}}, "
                        f"got {raw!r}")

    def curve(c: Any, at: str) -> Curve:
        return Curve.parse(c, at, x="rows", what="seconds")
    return {str(dtype): _per_backend(backends, f"{where}.{dtype}", curve, "[[rows, seconds], ...]")
            for dtype, backends in raw.items()}


def parse_one_call(raw: Any, where: str) -> dict[str, Any]:
    """`one_call`: {max_head_dim: int, rows: {compute dtype: int}}, where a CPU decode step runs its
    layers in one call of llmperf's kernels (0: never); {} when absent."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping with max_head_dim and rows, got {raw!r}")
    unknown = sorted(set(raw) - {"max_head_dim", "rows"})
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r} (fields: max_head_dim, rows)")
    if not raw:
        return {}
    head = raw.get("max_head_dim", 0)
    if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head <= 4096:
        raise SpecError(f"{where}.max_head_dim: must be an integer in [0, 4096], got {head!r}")
    rows = raw.get("rows") or {}
    if not isinstance(rows, Mapping):
        raise SpecError(f"{where}.rows: expected a mapping of compute dtype -> rows, got {rows!r}")
    for d, n in rows.items():
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 4096:
            raise SpecError(f"{where}.rows.{d}: must be an integer in [0, 4096], got {n!r}")
    return dict(max_head_dim=head, rows={str(d): n for d, n in rows.items()})


def attention_terms(raw: Any, where: str) -> dict[str, Any]:
    """One dtype's fused-attention terms: a mapping of `ATTENTION_PARAMS` (each optional) and an optional
    `source`; unknown fields and values out of range are refused with the field's name."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of {', '.join(ATTENTION_PARAMS)}, got {raw!r}")
    unknown = sorted(set(raw) - set(ATTENTION_PARAMS) - {"source"})
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(ATTENTION_PARAMS)}, source)")
    for name in ATTENTION_PARAMS:
        if name in raw:
            check_attention_term(name, raw[name], where)
    return {str(k): (str(v) if k == "source" else v) for k, v in raw.items()}


def parse_attention_eff(raw: Any, where: str) -> dict[str, dict[str, Any]]:
    """`attention_eff`: {compute dtype: {e_compute, head_dim_half, mma_rows, cta_half, e_memory, kv_half,
    latency_s, wave_s, source}} (`llmperf.analysis.attention_eff`), each dtype's terms checked."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping of compute dtype -> terms, got {raw!r}")
    return {str(d): attention_terms(terms, f"{where}.{d}") for d, terms in raw.items()}


def gemm_terms(raw: Any, where: str) -> dict[str, Any]:
    """The `gemm:` block (`llmperf.analysis.gemm`): `GEMM_FIELDS` as floats and `source`; a bad or missing
    value raises one line naming the field."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping with {', '.join(GEMM_FIELDS)}, got {raw!r}")
    unknown = sorted(set(raw) - set(GEMM_FIELDS) - {"source"})
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(GEMM_FIELDS)}, source)")
    vals: dict[str, Any] = {}
    for f in GEMM_FIELDS:
        v = raw.get(f)
        lo, closed, hi, what = GEMM_LIMITS[f]
        ok = is_real(v) and v <= hi and (v >= lo if closed else v > lo)
        if not ok:
            raise SpecError(f"{where}.{f}: must be {what}, got {v!r}")
        vals[f] = float(v)
    return {**vals, "source": str(raw.get("source", ""))}


def parse_efficiency(raw: Any, where: str) -> dict[str, Any]:
    """Validate an `efficiency:` block: {schema_version, model, step_overhead_s, dtypes: {dtype: kinds}}
    and, from schema 2, `overhead_mode` (add | overlap) and `op_overhead_s` ({backend: {op: s}}); `gemm`
    and `attention_eff` come back as checked mappings (`llmperf.analysis.timemodel.parse_efficiency`
    makes them the analysis' objects)."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping, got {type(raw).__name__}")
    version = raw.get("schema_version")
    if version not in READABLE_SCHEMAS or isinstance(version, bool):
        raise SpecError(f"{where}.schema_version: expected one of {', '.join(map(str, READABLE_SCHEMAS))}, "
                        f"got {version!r}")
    for needs, fields in ((2, {"overhead_mode", "op_overhead_s", "op_overhead_warm_s", "warm_below_bytes"}),
                          (3, {"op_e_memory", "op_overhead_rows_s"}), (4, {"op_floor_s"}),
                          (5, {"gemm", "attention_eff"}), (6, {"gemm_e_memory"}),
                          (8, {"op_overhead_rows_by_op_s", "one_call", "op_overhead_rows_expert_s"}),
                          (9, {"decode_attention"})):
        newer = sorted(fields & set(raw))
        if version < needs and newer:
            raise SpecError(f"{where}.{newer[0]}: needs schema_version {needs}, the file says {version}")
    mode = raw.get("overhead_mode", "add")
    if mode not in OVERHEAD_MODES:
        raise SpecError(f"{where}.overhead_mode: must be one of {', '.join(OVERHEAD_MODES)}, got {mode!r}")
    op_overheads = parse_op_overheads(raw.get("op_overhead_s") or {}, f"{where}.op_overhead_s")
    warm_overheads = parse_op_overheads(raw.get("op_overhead_warm_s") or {}, f"{where}.op_overhead_warm_s")
    warm_below = raw.get("warm_below_bytes", 0)
    if not is_real(warm_below) or not 0 <= warm_below < 1e15:
        raise SpecError(f"{where}.warm_below_bytes: must be bytes >= 0, got {warm_below!r}")
    dtypes = raw.get("dtypes")
    if not isinstance(dtypes, Mapping) or not dtypes:
        raise SpecError(f"{where}.dtypes: expected a mapping of compute dtype -> kinds, got {dtypes!r}")
    if version < 4:
        for d, kinds in dtypes.items():
            for kind, terms in (kinds.items() if isinstance(kinds, Mapping) else ()):
                if isinstance(terms, Mapping) and "floor_s" in terms:
                    raise SpecError(f"{where}.dtypes.{d}.{kind}.floor_s: needs schema_version 4, "
                                    f"the file says {version}")
    step = raw.get("step_overhead_s", 0.0)
    if not is_real(step) or not 0 <= step < 1:
        raise SpecError(f"{where}.step_overhead_s: must be seconds in [0, 1), got {step!r}")
    return dict(model=str(raw.get("model", "calibrated")), step_overhead_s=float(step),
                source=str(raw.get("source", "")), overhead_mode=mode, op_overhead_s=op_overheads,
                op_overhead_warm_s=warm_overheads, warm_below_bytes=float(warm_below),
                op_e_memory=parse_op_e_memory(raw.get("op_e_memory") or {}, f"{where}.op_e_memory"),
                op_overhead_rows_s=parse_op_overhead_rows(raw.get("op_overhead_rows_s") or {},
                                                          f"{where}.op_overhead_rows_s"),
                op_overhead_rows_by_op_s=parse_op_overhead_rows(raw.get("op_overhead_rows_by_op_s") or {},
                                                                f"{where}.op_overhead_rows_by_op_s"),
                one_call=parse_one_call(raw.get("one_call") or {}, f"{where}.one_call"),
                op_overhead_rows_expert_s=parse_op_overhead_rows(raw.get("op_overhead_rows_expert_s") or {},
                                                                 f"{where}.op_overhead_rows_expert_s"),
                op_floor_s=parse_op_floors(raw.get("op_floor_s") or {}, f"{where}.op_floor_s"),
                gemm=None if raw.get("gemm") is None else gemm_terms(raw["gemm"], f"{where}.gemm"),
                attention_eff=parse_attention_eff(raw.get("attention_eff") or {}, f"{where}.attention_eff"),
                gemm_e_memory=parse_gemm_e_memory(raw.get("gemm_e_memory") or {}, f"{where}.gemm_e_memory",
                                                  "weight" if version >= 7 else "call"),
                decode_attention=parse_decode_attention(raw.get("decode_attention") or {},
                                                        f"{where}.decode_attention"),
                dtypes={str(d): parse_kinds(k, f"{where}.dtypes.{d}") for d, k in dtypes.items()})


def check_attention_term(name: str, value: Any, where: str) -> None:
    """`value` is a finite number within `ATTENTION_PARAMS[name]`'s bounds, or an error naming `where.name`."""
    what, lo, hi = ATTENTION_PARAMS[name]
    if not is_real(value) or not lo <= value <= hi:
        raise SpecError(f"{where}.{name}: must be a number in [{lo:g}, {hi:g}] ({what}), got {value!r}")


__all__ = ["ATTENTION_PARAMS", "BACKENDS", "BYTES_CURVE_OPS", "Curve", "DECODE_ATTENTION_FIELDS", "DecodeGroupTerms",
           "EFFICIENCY_SCHEMA", "GEMM_FIELDS", "GEMM_LIMITS", "GEMM_READS", "GemmBytesCurves", "KindTerms", "OP_KINDS",
           "OVERHEAD_MODES", "READABLE_SCHEMAS", "attention_terms", "check_attention_term", "check_seconds",
           "gemm_terms", "parse_attention_eff", "parse_decode_attention", "parse_efficiency", "parse_gemm_e_memory",
           "parse_kinds", "parse_one_call", "parse_op_e_memory", "parse_op_floors", "parse_op_overhead_rows",
           "parse_op_overheads"]
