"""Per-step and per-operator timings of the engine, named as `llmperf.analysis` names its operators.

The model asks a recorder for a context manager around every operator (`with rec.op("o_proj", i):`).
By default it gets `NULL_RECORDER`, whose `op` returns one shared do-nothing context manager: no
clock, no synchronisation, no allocation. With a `Recorder` attached each operator is timed:

- on CPU with `time.perf_counter` around the operator (CPU kernels run synchronously);
- on CUDA with a pair of CUDA events per operator (`mode="events"`, the default), read once at the
  end of each step, so the GPU queue is never drained between operators; or with a
  `torch.cuda.synchronize()` before and after each operator (`mode="sync"`), which adds launch
  overhead to each operator but times exactly what the host waits for.

Operator names are the one vocabulary, `llmperf.analysis.vocabulary.Op`. What is timed is what
normally runs: fused GEMMs stay fused (`qkv_proj`, `gate_up_proj`; `FUSED_PARTS` joins them to split
predictions), and where a decode step's layers run in one call of llmperf's CPU kernels
(`cpu.kernels.decode_layers`) each operator is timed inside the call and handed over with
`Recorder.add`. Per-layer operators carry their layer index, the others `layer=None`. A layer may also
report a number (`rec.count(name, layer, value)`, a `CountRecord`): an MoE layer reports the distinct
experts its router chose (`EXPERTS_TOUCHED`), and the rows each of them got (`rec.routing`, a
`RoutingRecord`), kept even when operators are not timed (`ops=False`).

A recorded run is a `Trace`: `trace.ops` (`OpRecord`), `trace.steps` (`StepRecord`), `trace.counts`,
`trace.to_frame()` / `trace.steps_frame()` (pandas), `trace.op_totals()` (seconds per (phase, op)).
Which operator each backend and layer kind records: docs/engine.md, "Instrumentation".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from llmperf.analysis.vocabulary import Op, Phase

if TYPE_CHECKING:
    import pandas as pd

#: operator names in forward order (each appears only where the model has it; the collectives in a
#: tensor-parallel shard, `llmperf.engine.tensor_parallel`)
OP_NAMES = tuple(op.value for op in (
    Op.embed, Op.embed_allreduce, Op.pos_embed, Op.attn_norm, Op.qkv_proj, Op.rope, Op.kv_write, Op.attn_score,
    Op.attn_softmax,
    Op.attn_value, Op.attention, Op.o_proj, Op.attn_allreduce, Op.attn_residual, Op.mlp_norm, Op.router,
    Op.moe_route, Op.gate_up_proj, Op.up_proj, Op.act, Op.down_proj, Op.moe_sum, Op.shared_gate_up_proj,
    Op.shared_act, Op.shared_down_proj, Op.shared_expert_gate, Op.mlp_allreduce, Op.mlp_residual, Op.final_norm,
    Op.lm_head, Op.logits_gather,
    # multi-head latent attention (`mla.MLAttention`)
    Op.q_a_proj, Op.q_a_norm, Op.q_b_proj, Op.q_proj, Op.kv_a_proj, Op.kv_a_norm, Op.kv_b_proj, Op.q_absorb,
    Op.v_absorb,
))
#: the count a mixture-of-experts layer reports per step: distinct routed experts its tokens chose
EXPERTS_TOUCHED = "experts_touched"
#: the phases a step can have; set by the scheduler (`llmperf.serving`), never guessed from shapes
PHASES = (Phase.prefill.value, Phase.decode.value, Phase.mixed.value)


@dataclass(frozen=True, kw_only=True)
class OpRecord:
    """One operator of one forward pass. `layer` is None for embed / pos_embed / final_norm / lm_head.

    `batch`, `q_len` and `kv_len` are the step's shape in the analytical model's terms (`kv_len`: the
    longest context in the batch, the new tokens included), so a record joins a cost function call.
    """

    phase: str
    step: int
    layer: int | None
    op: str
    seconds: float
    batch: int
    q_len: int
    kv_len: int


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One engine step: a forward pass plus the sampling and cache bookkeeping around it.

    `forward_seconds` is the model's forward pass alone; `seconds` the whole step.
    `kv_len` is the longest context, `tokens_in_cache` the sum of all sequences' contexts.
    """

    phase: str
    step: int
    batch: int
    q_len: int
    kv_len: int
    tokens_in_cache: int
    seconds: float
    forward_seconds: float


@dataclass(frozen=True, kw_only=True)
class CountRecord:
    """A number one layer reported about one step (`Recorder.count`), stamped with the step's shape."""

    phase: str
    step: int
    layer: int | None
    name: str
    value: int
    batch: int
    q_len: int
    kv_len: int


@dataclass(frozen=True, kw_only=True)
class RoutingRecord:
    """One MoE layer's routing in one step (`Recorder.routing`): the distinct experts its router chose,
    ascending, and the token rows each got (they sum to the step's tokens x k), stamped with the step's shape."""

    phase: str
    step: int
    layer: int
    experts: tuple[int, ...]
    rows: tuple[int, ...]
    batch: int
    q_len: int
    kv_len: int


@dataclass
class Trace:
    """Everything a `Recorder` measured."""

    ops: list[OpRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    counts: list[CountRecord] = field(default_factory=list)
    routes: list[RoutingRecord] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        """One row per operator record: phase, step, layer (nullable int), op, seconds, batch, q_len, kv_len."""
        import pandas as pd
        cols = ["phase", "step", "layer", "op", "seconds", "batch", "q_len", "kv_len"]
        df = pd.DataFrame([asdict(r) for r in self.ops], columns=cols)
        df["layer"] = df["layer"].astype("Int64")
        return df

    def steps_frame(self) -> pd.DataFrame:
        import pandas as pd
        cols = ["phase", "step", "batch", "q_len", "kv_len", "tokens_in_cache", "seconds", "forward_seconds"]
        return pd.DataFrame([asdict(r) for r in self.steps], columns=cols)

    def op_totals(self) -> dict[tuple[str, str], float]:
        """Seconds per (phase, op), summed over layers and steps."""
        out: dict[tuple[str, str], float] = {}
        for r in self.ops:
            out[(r.phase, r.op)] = out.get((r.phase, r.op), 0.0) + r.seconds
        return out


class _NoOp:
    """A context manager that does nothing; one instance is shared by every operator."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


_NOOP = _NoOp()


class NullRecorder:
    """The recorder the model uses when nothing is measured: every method is trivially cheap."""

    active = False

    def op(self, name: str, layer: int | None = None) -> _NoOp:
        return _NOOP

    def count(self, name: str, layer: int | None, value: int) -> None:
        return None

    def routing(self, layer: int, experts: Sequence[int], pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        return None

    @contextmanager
    def step(self, phase: str, *, batch: int, q_len: int, kv_len: int, tokens_in_cache: int) -> Iterator[None]:
        yield

    @contextmanager
    def forward(self) -> Iterator[None]:
        yield


NULL_RECORDER = NullRecorder()


class _CpuOp:
    __slots__ = ("rec", "name", "layer", "t0")

    def __init__(self, rec: Recorder, name: str, layer: int | None) -> None:
        self.rec, self.name, self.layer = rec, name, layer

    def __enter__(self) -> None:
        if self.rec.before_op is not None:
            self.rec.before_op()
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> bool:
        self.rec._pending.append((self.name, self.layer, time.perf_counter() - self.t0))
        return False


class _SyncOp(_CpuOp):
    __slots__ = ()

    def __enter__(self) -> None:
        torch.cuda.synchronize(self.rec.device)
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> bool:
        torch.cuda.synchronize(self.rec.device)
        self.rec._pending.append((self.name, self.layer, time.perf_counter() - self.t0))
        return False


class _EventOp:
    __slots__ = ("rec", "name", "layer", "start", "end")

    def __init__(self, rec: Recorder, name: str, layer: int | None) -> None:
        self.rec, self.name, self.layer = rec, name, layer

    def __enter__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.start.record()

    def __exit__(self, *exc: object) -> bool:
        self.end.record()
        self.rec._pending.append((self.name, self.layer, (self.start, self.end)))
        return False


class Recorder:
    """Times engine steps and, if `ops=True`, every operator of every forward pass.

    `device`: where the model runs (CUDA timing needs it). `mode`: "events" or "sync" on CUDA (see the
    module docstring); ignored on CPU. `before_op` (CPU only): called before each operator's clock
    starts, outside the timed region (`llmperf calibrate` runs a GEMM there, so that each operator
    dispatches with the caches as cold as a real decode step leaves them). Attach with
    `Engine.generate(..., recorder=rec)` or
    `model.forward(..., rec=rec)`; read with `rec.trace`.
    """

    active = True

    def __init__(self, device: torch.device | str = "cpu", *, ops: bool = True, mode: str = "events",
                 before_op: Callable[[], Any] | None = None) -> None:
        if mode not in ("events", "sync"):
            raise ValueError(f"mode must be 'events' or 'sync', got {mode!r}")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.mode = mode
        self.record_ops = ops
        self.active = ops  # operators are timed (the model runs the same code either way)
        self.trace = Trace()
        self._pending: list[tuple[str, int | None, Any]] = []
        self._counts: list[tuple[str, int | None, int]] = []
        self._routes: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
        self._step_index = {p: 0 for p in PHASES}
        self._forward_seconds = 0.0
        self._op_cls = (_EventOp if mode == "events" else _SyncOp) if self.cuda else _CpuOp
        if before_op is not None and self.cuda:
            raise ValueError("before_op: only a CPU recorder runs a hook before each operator")
        self.before_op = before_op

    def op(self, name: str, layer: int | None = None) -> Any:
        if not self.record_ops:
            return _NOOP
        return self._op_cls(self, name, layer)

    def add(self, name: str, layer: int | None, seconds: float) -> None:
        """Record an operator timed elsewhere (`decode_layers` times the parts of its layers inside
        its one call, with the clock `time.perf_counter` reads)."""
        if self.record_ops:
            self._pending.append((name, layer, seconds))

    def count(self, name: str, layer: int | None, value: int) -> None:
        """Record a number about this step (`EXPERTS_TOUCHED`: a MoE layer's distinct experts); kept
        with or without operator timing."""
        self._counts.append((name, layer, int(value)))

    def routing(self, layer: int, experts: Sequence[int], pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Record a MoE layer's routing in this step: its distinct `experts` and, from each one's
        (token rows, slots) `pairs`, how many rows it got (their lengths: no wait for the device)."""
        self._routes.append((layer, tuple(int(e) for e in experts), tuple(int(r.shape[0]) for r, _ in pairs)))

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Around the model's forward pass inside a step (times it apart from sampling)."""
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        self._forward_seconds += time.perf_counter() - t0

    @contextmanager
    def step(self, phase: str, *, batch: int, q_len: int, kv_len: int, tokens_in_cache: int) -> Iterator[None]:
        """Around one engine step; operator records made inside it are stamped with its shape."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        phase = Phase(phase).value  # a plain string in records and frames
        self._sync()
        self._pending.clear()
        self._counts.clear()
        self._routes.clear()
        self._forward_seconds = 0.0
        t0 = time.perf_counter()
        yield
        self._sync()
        seconds = time.perf_counter() - t0
        step = self._step_index[phase]
        self._step_index[phase] += 1
        for name, layer, t in self._pending:
            if isinstance(t, tuple):
                t = t[0].elapsed_time(t[1]) / 1e3
            self.trace.ops.append(OpRecord(phase=phase, step=step, layer=layer, op=name, seconds=t,
                                           batch=batch, q_len=q_len, kv_len=kv_len))
        for name, layer, value in self._counts:
            self.trace.counts.append(CountRecord(phase=phase, step=step, layer=layer, name=name, value=value,
                                                 batch=batch, q_len=q_len, kv_len=kv_len))
        for layer, experts, rows in self._routes:
            self.trace.routes.append(RoutingRecord(phase=phase, step=step, layer=layer, experts=experts, rows=rows,
                                                   batch=batch, q_len=q_len, kv_len=kv_len))
        self._pending.clear()
        self._counts.clear()
        self._routes.clear()
        self.trace.steps.append(StepRecord(phase=phase, step=step, batch=batch, q_len=q_len, kv_len=kv_len,
                                           tokens_in_cache=tokens_in_cache, seconds=seconds,
                                           forward_seconds=self._forward_seconds))
