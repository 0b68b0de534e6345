"""The one roll-up: operator costs -> phase times -> a whole generation, memory and regimes, for
arrays of (batch, prompt_len, gen_len). `estimate` is a roll-up of one row, `sweep` of many: the same
code computes every number of both, so a single estimate equals the same row of a sweep.

- Phase time: the sum over operators of `op_time` (each through the `TimeModel`), plus `pp - 1`
  stage-to-stage transfers with pipeline parallelism.
- Decode: step j (j = 1 .. gen_len - 1) attends to a context of `prompt_len + j` tokens. Every
  operator's roofs are linear in the context (up to a sliding window, after which they are
  constant), so the sum over steps of `max(lines) + overhead` has a closed form (`sum_max_lines`):
  a generation of 1e9 tokens costs what one of 10 does.
- Memory (per GPU, the tightest pipeline stage): weights, a paged KV cache and ONE activation
  reservation for the per-step token budget `max_batched_tokens`, as vLLM reserves it (it profiles one
  forward of `max_num_batched_tokens` tokens and gives the rest of `gpu_memory_utilization` to KV
  blocks). Activations are transient: they do not grow with the number of sequences. Max batch is
  what the KV memory left over then holds.
- Regimes: vectorised bisections (critical batches, attention crossovers).

All arithmetic is float64, so products such as batch x context x bytes never overflow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from llmperf.analysis.operators import (
    ATTENTION_IMPLS,
    FLOP_CONVENTIONS,
    FP32_BYTES,
    MLA_MODES,
    ForwardModel,
)
from llmperf.analysis.roofline import (
    TimeModel,
    engine_label,
    memory_bound,
    model_time_model,
    op_time,
    peak_in_use_flops_per_s,
    phase_time_model,
    resolve_time_model,
    step_overhead_s,
)
from llmperf.analysis.routing import busiest_expert_load, check_eplb, expected_experts_touched, measured_routing
from llmperf.analysis.vocabulary import ATTENTION_OPS, Op

#: vLLM V1's default `max_num_batched_tokens` for its OpenAI server on an 80 GB-class GPU
#: (vllm/engine/arg_utils.py, `_set_default_args_v1`: 8192; 2048 on smaller GPUs, 16384 offline);
#: one default for estimate, simulate and plan (`llmperf.defaults`)
from llmperf.defaults import DEFAULT_MAX_BATCHED_TOKENS
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision
from llmperf.specs.expert_load import ExpertLoad
from llmperf.specs.kvcache import KV_WINDOW_MODES, KVCacheSpec, KVGroup, pipeline_stages
from llmperf.specs.model import LayerKind
from llmperf.specs.precision import gemm_mode

#: the largest value the regime searches try before answering "none" (67M)
SEARCH_MAX = 1 << 26
#: the largest count (batch, lengths, block size, token budget, ...) accepted: float64 holds every
#: integer up to 2**53 exactly, and the integer columns (int64) hold it too
MAX_COUNT = 2**53
#: columns that are integers or missing (no answer up to SEARCH_MAX)
REGIME_COLUMNS = ("critical_batch_matmul", "critical_batch", "attention_flops_crossover",
                  "attention_bytes_crossover", "attention_critical_context")
_ATTN_CORE = frozenset(op.value for op in ATTENTION_OPS)
_ATTN_NAMES = _ATTN_CORE | {Op.kv_write.value}


@dataclass(frozen=True, kw_only=True)
class Conventions:
    """Everything besides model, device, precision, parallelism and lengths that changes a number."""

    attention: str = "fused"  # fused (FlashAttention) | naive (S and P in memory)
    attention_flops: str = "executed"  # executed (skip masked tiles) | dense (the whole square)
    all_logits: bool = False  # prefill computes logits at every position (else the last only)
    fused_qkv: bool = True  # one QKV GEMM (reads the input once), as vLLM / TensorRT-LLM
    fused_gate_up: bool = True  # one gate+up GEMM
    max_seq_len: int | None = None  # contiguous cache reservation per sequence (None: model max)
    block_size: int = 16  # paged KV block, tokens
    mem_util: float = 0.9  # fraction of device memory the server uses (vLLM gpu_memory_utilization)
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS  # per-step token budget (activation reservation)
    kv_window: str = "capped"  # sliding/chunked layers hold their window (vLLM's hybrid manager) | full pages
    mla_mode: str = "auto"  # MLA: auto (unabsorbed prefill, absorbed decode) | absorbed | unabsorbed
    ep: int = 1  # expert parallelism within the tp group (divides tp and num_experts)
    dp_attention: bool = False  # attention data-parallel over the tp group, MoE expert-parallel (ep = tp)
    expert_load: ExpertLoad | None = None  # a measured router's load per expert (None: uniform routing)
    eplb: int | None = None  # EPLB's redundant experts per MoE layer (None: experts placed contiguously)

    def __post_init__(self) -> None:
        if self.kv_window not in KV_WINDOW_MODES:
            raise SpecError(f"kv_window: must be one of {', '.join(KV_WINDOW_MODES)}, got {self.kv_window!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise SpecError(f"attention: must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention!r}")
        if self.attention_flops not in FLOP_CONVENTIONS:
            raise SpecError(f"attention_flops: must be one of {', '.join(FLOP_CONVENTIONS)}, "
                            f"got {self.attention_flops!r}")
        for flag in ("all_logits", "fused_qkv", "fused_gate_up", "dp_attention"):
            if not isinstance(getattr(self, flag), bool):
                raise SpecError(f"{flag}: must be true or false, got {getattr(self, flag)!r}")
        if self.mla_mode not in MLA_MODES:
            raise SpecError(f"mla_mode: must be one of {', '.join(MLA_MODES)}, got {self.mla_mode!r}")
        for name in ("block_size", "max_batched_tokens", "ep"):
            _check_positive_int(name, getattr(self, name))
        if self.expert_load is not None and not isinstance(self.expert_load, ExpertLoad):
            raise SpecError(f"expert_load: must be an ExpertLoad (llmperf.specs.expert_load), got {self.expert_load!r}")
        if self.max_seq_len is not None:
            _check_positive_int("max_seq_len", self.max_seq_len)
        mu = self.mem_util
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu <= 1:
            raise SpecError(f"mem_util: must be in (0, 1], got {mu!r}")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_COUNT:
        raise SpecError(f"{name}: must be an integer in 1 .. 2**53, got {value!r}")


# ---- closed-form sums ------------------------------------------------------------------------------
def _line_sum(a, b, lo, hi):  # noqa: ANN001, ANN202
    """Sum of `a + b x` over integers x in [lo, hi] (zero when empty)."""
    count = np.maximum(hi - lo + 1, 0)
    return count * a + b * (lo + hi) * count / 2


def sum_max_lines(intercepts, slopes, lo, hi):  # noqa: ANN001, ANN201
    """Sum over integers x in [lo, hi] of `max_i(a_i + b_i x)`, elementwise on arrays. Exact.

    Between two consecutive crossings of the lines the same line is on top, so the range splits at
    the (floored) crossings into at most k(k-1)/2 + 1 segments, each a sum of one line."""
    a = [np.asarray(x, dtype=float) for x in intercepts]
    b = [np.asarray(x, dtype=float) for x in slopes]
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    shape = np.broadcast_shapes(lo.shape, hi.shape, *(x.shape for x in a), *(x.shape for x in b))
    a = [np.broadcast_to(x, shape) for x in a]
    b = [np.broadcast_to(x, shape) for x in b]
    lo, hi = np.broadcast_to(lo, shape), np.broadcast_to(hi, shape)
    if (all(not x.any() for x in b) and all(np.isfinite(x).all() for x in a) and (hi >= lo - 1).all()
            and (np.floor(lo) == lo).all()):
        # flat lines (an operator the context does not change): every crossing cut falls on lo - 1, so
        # every segment but [lo, hi] is empty and adds exactly 0.0; this is that last segment, the
        # same operations in the same order, without the k(k-1)/2 cuts (bit-identical)
        n1, n2 = lo - 1 + 1, hi
        mid = (n1 + n2) / 2
        top = np.argmax(np.stack([ai + bi * mid for ai, bi in zip(a, b)]), axis=0)
        total = np.zeros(shape) + _line_sum(np.choose(top, a), np.choose(top, b), n1, n2)
        return total if total.ndim else float(total)
    cuts = [lo - 1, hi]
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            db = b[i] - b[j]
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                xc = np.where(db != 0, (a[j] - a[i]) / np.where(db != 0, db, 1.0), lo - 1)
            cuts.append(np.clip(np.floor(np.nan_to_num(xc, nan=-np.inf)), lo - 1, hi))
    cuts = np.sort(np.stack(cuts), axis=0)
    total = np.zeros(shape)
    for s in range(1, cuts.shape[0]):
        n1, n2 = cuts[s - 1] + 1, cuts[s]
        mid = (n1 + n2) / 2
        values = np.stack([ai + bi * mid for ai, bi in zip(a, b)])
        top = np.argmax(values, axis=0)
        a_top = np.choose(top, a)
        b_top = np.choose(top, b)
        total = total + _line_sum(a_top, b_top, n1, n2)
    return total if total.ndim else float(total)


def sum_max_linear(u0, u1, v0, v1, x_lo, x_hi):  # noqa: ANN001, ANN201
    """Sum over integers x in [x_lo, x_hi] of `max(u0 + u1 x, v0 + v1 x)`, elementwise on arrays."""
    return sum_max_lines([u0, v0], [u1, v1], x_lo, x_hi)


def _sum_ceil_div(n, size):  # noqa: ANN001, ANN202
    """Sum over L = 1 .. n of ceil(L / size) (n >= 0): full blocks of `size` plus the remainder."""
    q, r = np.floor_divide(n, size), np.mod(n, size)
    return size * q * (q + 1) / 2 + r * (q + 1)


# ---- phases --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseArrays:
    """Totals of one forward pass, elementwise over configurations."""

    time_s: np.ndarray
    flops: np.ndarray
    bytes_total: np.ndarray
    memory_bound_s: np.ndarray  # time spent in memory-bound operators
    comm_bound_s: np.ndarray | float = 0.0  # time spent in interconnect-bound operators (collectives)
    op_time_s: np.ndarray | None = None  # the operators' time alone (no step overhead, no pipeline sends)

    @property
    def intensity(self) -> np.ndarray:
        return np.where(self.bytes_total > 0, self.flops / np.where(self.bytes_total > 0, self.bytes_total, 1), 0.0)

    @property
    def bound(self) -> np.ndarray:
        return phase_bound(self.memory_bound_s, self.time_s if self.op_time_s is None else self.op_time_s,
                           self.comm_bound_s)


def phase_bound(memory_bound_s, time_s, comm_bound_s=0.0):  # noqa: ANN001, ANN201
    """The one phase rule: the roof under which the largest share of the phase's OPERATOR time is
    spent: 'memory' (memory-bound operators), 'comm' (interconnect-bound ones: a tensor-parallel
    decode step of many layers whose all-reduces are latency-bound) or 'compute' (the rest); at least
    half always wins. `time_s` is the operators' time: an engine's fixed step cost is host time, under
    no roof, so it is not counted (it would otherwise turn a memory-bound step 'compute')."""
    mem, comm = np.asarray(memory_bound_s, dtype=float), np.asarray(comm_bound_s, dtype=float)
    rest = np.asarray(time_s, dtype=float) - mem - comm
    out = np.where((mem >= comm) & (mem >= rest), "memory", np.where(comm >= rest, "comm", "compute"))
    return str(out) if out.ndim == 0 else out


def pipeline_transfer_s(fm: ForwardModel, hardware: HardwareSpec, batch, q_len, pp: int,  # noqa: ANN001, ANN201
                        time_model: TimeModel | None = None):
    """`pp - 1` sends of the `batch*q_len x hidden` activations between pipeline stages: at the link's
    bandwidth (the roofline), or, under a time model with collectives terms (`typical`), each a
    point-to-point send between 2 GPUs: half a 2-GPU all-reduce's latency (one ring step of its two)
    plus the bytes at their bus bandwidth
    (`llmperf.analysis.collectives`)."""
    if pp <= 1:
        return 0.0 * batch * q_len
    if hardware.interconnect_bytes_per_s <= 0:
        raise SpecError(f"pp: {pp} needs an interconnect, but {hardware.name} has interconnect_gbps 0")
    msg = batch * q_len * fm.model.hidden_size * fm.precision.act_bytes
    coll = getattr(time_model, "collectives", None)
    if coll is not None:
        return (pp - 1) * coll.time_s(hardware.name, hardware.interconnect_bytes_per_s, 2, msg, "send")
    return (pp - 1) * msg / hardware.interconnect_bytes_per_s


def phase_arrays(fm: ForwardModel, hw: HardwareSpec, batch, q_len, kv_len, *, pp: int, compute_dtype: str,  # noqa: ANN001
                 time_model: TimeModel | None = None) -> PhaseArrays:
    """Time, FLOPs, bytes and memory-bound time of one forward pass, for array arguments."""
    time = pipeline_transfer_s(fm, hw, batch, q_len, pp, time_model) + 0.0 * kv_len + step_overhead_s(time_model)
    flops = nbytes = mem_time = comm_time = op_time_s = 0.0
    for c in fm.forward_ops(batch, q_len, kv_len):
        t = op_time(c, hw, compute_dtype, time_model)
        time = time + t.time_s
        op_time_s = op_time_s + t.time_s
        flops = flops + c.flops
        nbytes = nbytes + c.bytes_total
        mem_time = mem_time + np.where(memory_bound(t.compute_s, t.memory_s, t.comm_s), t.time_s, 0.0)
        if c.kind == "comm":  # only collectives can be interconnect-bound
            comm_time = comm_time + np.where(t.comm_s > np.maximum(t.compute_s, t.memory_s), t.time_s, 0.0)
    f = lambda x: np.asarray(x, dtype=float) + 0.0 * time  # noqa: E731
    return PhaseArrays(time_s=f(time), flops=f(flops), bytes_total=f(nbytes), memory_bound_s=f(mem_time),
                       comm_bound_s=f(comm_time), op_time_s=f(op_time_s))


def decode_sums(fm: ForwardModel, hw: HardwareSpec, batch, prompt_len, gen_len, *, pp: int,  # noqa: ANN001, ANN201
                compute_dtype: str, time_model: TimeModel | None = None):
    """(time, FLOPs, bytes) summed over decode steps j = 1 .. gen_len - 1 (context prompt_len + j),
    exact and O(1) in gen_len. A decode step of a layer sees `n(x)` keys at context x: x (full
    attention), min(x, W) (sliding), (x - 1) mod C + 1 (chunked: the position within its chunk), and
    its cost equals a full-attention layer's at context n(x). Each operator's roofs are lines in n
    and the time model's efficiencies do not depend on the context, so the sum over steps of
    `max(lines) + overhead` is a sum of `sum_max_lines` over ranges of n (`_sum_over_steps`). A Gated
    DeltaNet layer's step is the same at every context (its state's), priced once at a continuing one;
    DeepSeek Sparse Attention's main attention sees min(x, index_topk) keys, its indexer all x."""
    x_lo, x_hi = prompt_len + 1.0, prompt_len + gen_len - 1.0
    steps = np.maximum(gen_len - 1.0, 0)
    zero = 0.0 * prompt_len
    # (attention, span, each operator at n = 0 keys, at n = 1): its cost is a line in n between them
    groups = [("full", None, fm.head_ops(batch, 1, zero) + fm.tail_ops(batch, 1, zero),
               fm.head_ops(batch, 1, zero + 1) + fm.tail_ops(batch, 1, zero + 1))]
    topk = fm.model.index_topk
    for part, kind, count, _ in fm.sections:  # each section once, for all the layers that share it
        if part == "attention" and kind.attention in ("linear", "none"):  # flat: priced once at a continuing context
            ops = [op.scaled(count) for op in fm.section_ops(part, batch, 1, zero + 2, kind)]
            groups.append(("full", None, ops, ops))
            continue
        lin = replace(kind, attention="full", window=None)  # the same layer seeing n keys
        attention, span = (kind.attention, kind.window) if part == "attention" else ("full", None)  # FFN: flat
        ops0 = [op.scaled(count) for op in fm.section_ops(part, batch, 1, zero, lin)]
        ops1 = [op.scaled(count) for op in fm.section_ops(part, batch, 1, zero + 1, lin)]
        if part == "attention" and topk is not None:  # DSA: the indexer sees every key, the rest its top-k
            index = [op.name.startswith("index_") for op in ops0]
            groups.append(("full", None, *([op for op, i in zip(ops, index) if i] for ops in (ops0, ops1))))
            ops0, ops1 = ([op for op, i in zip(ops, index) if not i] for ops in (ops0, ops1))
            attention, span = "sliding", topk
        groups.append((attention, span, ops0, ops1))
    time = flops = nbytes = 0.0
    for attention, span, ops0, ops1 in groups:
        for c0, c1 in zip(ops0, ops1):
            t0 = op_time(c0, hw, compute_dtype, time_model)
            t1 = op_time(c1, hw, compute_dtype, time_model)
            # the overlapped host dispatch and the kernels' device floor: a fourth line, flat in the context
            a = [t0.compute_s, t0.memory_s, t0.comm_s, np.maximum(t0.host_s, t0.floor_s) + 0.0 * t0.compute_s]
            b = [t1.compute_s - t0.compute_s, t1.memory_s - t0.memory_s, t1.comm_s - t0.comm_s,
                 0.0 * t0.compute_s]
            fa, fb = c0.flops, c1.flops - c0.flops
            ba, bb = c0.bytes_total, c1.bytes_total - c0.bytes_total
            time = time + _sum_over_steps(attention, span, x_lo, x_hi,
                                          lambda lo, hi: sum_max_lines(a, b, lo, hi))  # noqa: B023
            flops = flops + _sum_over_steps(attention, span, x_lo, x_hi,
                                            lambda lo, hi: _line_sum(fa, fb, lo, hi))  # noqa: B023
            nbytes = nbytes + _sum_over_steps(attention, span, x_lo, x_hi,
                                              lambda lo, hi: _line_sum(ba, bb, lo, hi))  # noqa: B023
            # the overhead is per launch, the same at every step
            time = time + steps * t0.overhead_s
    time = time + steps * (pipeline_transfer_s(fm, hw, batch, 1, pp, time_model) + step_overhead_s(time_model))
    return time, flops, nbytes


def _sum_over_steps(attention: str, span: int | None, x_lo, x_hi, total):  # noqa: ANN001, ANN202
    """Sum over contexts x in [x_lo, x_hi] of g(n(x)), where `total(lo, hi)` is the sum of g over
    n in [lo, hi] (called with hi >= lo - 1: an empty range is zero) and n(x) is the keys a decode
    step of an `attention` layer (`span`: its window or chunk) sees."""
    x_lo, x_hi = np.asarray(x_lo, dtype=float), np.asarray(x_hi, dtype=float)
    x_hi = np.maximum(x_hi, x_lo - 1)

    def rng(lo, hi):  # noqa: ANN001, ANN202
        return total(lo, np.maximum(hi, lo - 1))

    if attention == "full" or span is None:
        return rng(x_lo, x_hi)
    w = float(span)
    if attention == "sliding":  # linear up to the window, flat after it
        below = rng(x_lo, np.minimum(x_hi, w))
        flat = np.maximum(x_hi - np.maximum(x_lo - 1, w), 0)
        return below + flat * total(w + 0.0 * x_lo, w + 0.0 * x_lo)
    # chunked: n = (x - 1) mod C + 1 runs 1 .. C in every chunk of C positions
    a, b = x_lo - 1, x_hi - 1
    qa, qb = np.floor_divide(a, w), np.floor_divide(b, w)
    ra, rb = np.mod(a, w) + 1, np.mod(b, w) + 1
    one = 1.0 + 0.0 * x_lo
    same = rng(ra, np.where(qa == qb, rb, ra - 1))
    split = rng(ra, w * one) + np.maximum(qb - qa - 1, 0) * rng(one, w * one) + rng(one, rb)
    return np.where(x_hi < x_lo, 0.0, np.where(qa == qb, same, split))


# ---- memory --------------------------------------------------------------------------------------
# Layout of one pipeline stage's `tp` GPUs (see llmperf.analysis.memory for the whole story):
# - attention: heads split `tp` ways (KV heads never below one; MLA's q_a/kv_a down-projections and
#   their norms replicated, q_b/kv_b/o split by heads, as vLLM's DeepseekV2MLAAttention), or with
#   `dp_attention` replicated whole on every GPU, each GPU serving its own sequences;
# - dense FFNs: split `tp` ways; shared experts split `tp` ways, or with `dp_attention` replicated,
#   each GPU running them on its own tokens (SGLang's DP attention with DeepEP);
# - routed experts: `num_experts / ep` whole experts a GPU group of `tp / ep`, each split `tp / ep` ways;
# - router, norms and biases: replicated, at the activation precision.
def _module_matrix_bytes(precision: Precision, d_in: int, d_out: int, module: str) -> float:
    """`Precision.matrix_bytes` for one module kind (attention, dense_mlp, expert, shared_expert), for
    precisions that tell modules apart; else the one weight format."""
    return precision.matrix_bytes(d_in, d_out, module=module)


def check_parallelism(model: ModelSpec, tp: int, ep: int = 1, dp_attention: bool = False) -> None:
    """The layout is possible: one rule for the compute and the memory side (`ShardDims.of`): `tp`
    splits what it splits (heads unless `dp_attention`, FFN widths), `ep` divides the routed experts
    and `tp`, and with `dp_attention` a MoE model runs its experts over the whole group (ep = tp)."""
    from llmperf.analysis.operators import ShardDims
    ShardDims.of(model, tp, ep, dp_attention)


def stage_layer_ranges(model: ModelSpec, pp: int) -> list[range]:
    """The layers (indices) of each pipeline stage, as vLLM partitions them (`stage_layers`)."""
    if isinstance(pp, bool) or not isinstance(pp, (int, np.integer)) or pp < 1:
        raise SpecError(f"pp: must be a positive integer, got {pp!r}")
    if pp > model.num_layers:
        raise SpecError(f"pp: {pp} exceeds {model.name}'s num_layers={model.num_layers}")
    return list(pipeline_stages(model.num_layers, pp))


def stage_layers(model: ModelSpec, pp: int) -> list[int]:
    """Layers of each pipeline stage, as vLLM partitions them (`get_pp_indices`): `L // pp` each, the
    remainder one more each on the stages before the last (the last one holds the lm_head). Stage 0
    holds the first layers (DeepSeek's dense layers 0..2 all sit there)."""
    return [len(r) for r in stage_layer_ranges(model, pp)]


def _attention_weight_bytes(model: ModelSpec, p: Precision, tp: int, kind: LayerKind | None = None) -> float:
    """One layer's attention (of `kind`) on one GPU of `tp` splitting its heads (tp = 1: replicated whole):
    the matrices at the weight precision, the vectors (biases, q/k and latent norms, sinks) at the
    activation precision, not split (but MiniMax-M2's q/k norm weights across heads, which each GPU holds for
    its own heads, as vLLM's `MiniMaxText01RMSNormTP`)."""
    m, h, ab = model, model.hidden_size, p.act_bytes
    mat = lambda d_in, d_out: _module_matrix_bytes(p, d_in, d_out, "attention")  # noqa: E731
    if m.is_mla:
        n, qd, r, dr = m.num_heads, m.mla_q_head_dim, m.kv_lora_rank, m.qk_rope_head_dim
        nt = n // tp
        if m.q_lora_rank:  # q_a (replicated) -> q_a_layernorm -> q_b (split by heads)
            qr = m.q_lora_rank
            q, q_params = mat(h, qr) + mat(qr, nt * qd), h * qr + qr * n * qd
        else:
            q, q_params = mat(h, nt * qd), h * n * qd
        kv = mat(h, r + dr) + mat(r, nt * (m.qk_nope_head_dim + m.v_head_dim))  # kv_a replicated, kv_b split
        o = mat(nt * m.v_head_dim, h)
        matrices = q_params + h * (r + dr) + r * n * (m.qk_nope_head_dim + m.v_head_dim) + n * m.v_head_dim * h
        params = m.attn_params_per_layer if kind is None else m.attn_params(kind)
        if m.is_sparse_attention and not (kind is not None and kind.shared_topk):
            # DSA's indexer (a shared-top-k layer has none), replicated on every rank: wq_b, wk and weights_proj
            hi, di = m.index_n_heads, m.index_head_dim
            q += mat(m.q_lora_rank, hi * di) + mat(h, di + hi)
            matrices += m.q_lora_rank * hi * di + h * (di + hi)
        return q + kv + o + (params - matrices) * ab
    params = m.attn_params_per_layer if kind is None else m.attn_params(kind)
    if kind is not None:  # Gemma 4's full layers: their own head dim and KV heads, K = V without a v_proj
        m = m.attention_view(kind)
    hd, gate = m.head_dim, 2 if m.attn_output_gate else 1
    kv_mats = 2 if kind is None else m.kv_projections(kind)
    nh, nkv = m.num_heads // tp, max(1, m.num_kv_heads // tp)
    attn = mat(h, gate * nh * hd) + kv_mats * mat(h, nkv * hd) + mat(nh * hd, h)
    vectors = params - (gate * h * m.q_size + kv_mats * h * m.kv_size + m.q_size * h)
    if m.qk_norm == "rmsnorm_across_heads" and not m.qk_norm_gathered:  # MiniMax-M2: each GPU its heads' weights
        vectors -= (m.q_size + m.kv_size) - (nh + nkv) * hd
    return attn + vectors * ab


def _linear_layer_weight_bytes(model: ModelSpec, p: Precision, tp: int) -> float:
    """One Gated DeltaNet token mixer on one GPU of `tp` splitting its heads: in_proj_qkvz, in_proj_ba and
    out_proj at the weight precision, the convolution, A_log, dt_bias (split with the heads) and the gated
    norm's weight (whole) at the activation precision. A Mamba-2 mixer: in_proj and out_proj at the weight
    precision; the convolution (and its bias), A_log, dt_bias, D, the gated norm's weight and in_proj's bias
    split with the heads, out_proj's bias whole, at the activation precision."""
    m, h = model, model.hidden_size
    mat = lambda d_in, d_out: _module_matrix_bytes(p, d_in, d_out, "attention")  # noqa: E731
    kd, vd, nv = m.linear_key_dim // tp, m.linear_value_dim // tp, m.linear_num_value_heads // tp  # type: ignore
    if m.is_mamba:
        proj = 2 * kd + 2 * vd + nv
        vectors = ((2 * kd + vd) * (m.linear_conv_kernel + m.linear_conv_bias) + 3 * nv + vd  # type: ignore
                   + ((proj + h) if m.linear_proj_bias else 0))
        return mat(h, proj) + mat(vd, h) + vectors * p.act_bytes
    vectors = (2 * kd + vd) * m.linear_conv_kernel + 2 * nv + m.linear_value_head_dim  # type: ignore[operator]
    return mat(h, 2 * kd + 2 * vd) + mat(h, 2 * nv) + mat(vd, h) + vectors * p.act_bytes


def _ffn_weight_bytes(model: ModelSpec, p: Precision, width: int, split: int, copies: float,
                      module: str) -> float:
    """`copies` FFNs of `width` hidden units, each split `split` ways: matrices at the weight
    precision, biases (not split) at the activation precision. Routed experts read and write
    `expert_model_dim` (a latent MoE's latent width)."""
    m = model
    h = m.expert_model_dim if module == "expert" else m.hidden_size
    if not copies:
        return 0.0
    w = width // split
    one = (m.ffn_matrices - 1) * _module_matrix_bytes(p, h, w, module) + _module_matrix_bytes(p, w, h, module)
    biases = m.ffn_params(width, h) - m.ffn_matrices * h * width
    return copies * one + copies * biases * p.act_bytes


def _latent_weight_bytes(model: ModelSpec, p: Precision) -> float:
    """A latent MoE layer's projections down to the experts' width and back (replicated on every GPU): matrices at
    the weight precision, biases at the activation precision; 0 without one."""
    m = model
    if not m.moe_latent_size:
        return 0.0
    h, d = m.hidden_size, m.moe_latent_size
    biases = m.latent_proj_params - 2 * h * d
    return (_module_matrix_bytes(p, h, d, "dense_mlp") + _module_matrix_bytes(p, d, h, "dense_mlp")
            + biases * p.act_bytes)


def layer_weight_bytes(model: ModelSpec, precision: Precision, kind: LayerKind, tp: int = 1, *, ep: int = 1,
                       dp_attention: bool = False, redundant_experts: int = 0) -> float:
    """Weight bytes of one layer of `kind` on one GPU (the layout above; EPLB's `redundant_experts`
    add their copies, `(num_experts + redundant) / ep` routed experts a GPU)."""
    m, ab = model, precision.act_bytes
    if kind.attention == "none":  # an FFN alone (Nemotron-H)
        attn = 0.0
    elif kind.attention == "linear":
        attn = _linear_layer_weight_bytes(m, precision, 1 if dp_attention else tp)
    else:
        attn = _attention_weight_bytes(m, precision, 1 if dp_attention else tp, kind)
    if not kind.ffn:  # a token mixer alone (Nemotron-H)
        ffn = 0.0
    elif kind.moe:
        local = (m.num_experts + redundant_experts) // ep
        ffn = (_ffn_weight_bytes(m, precision, m.expert_ffn_size, tp // ep, local, "expert")
               + _ffn_weight_bytes(m, precision, m.shared_expert_ffn_size, 1 if dp_attention else tp,
                                   m.shared_experts, "shared_expert")
               + (m.router_params_per_layer + (m.hidden_size if m.shared_expert_gate else 0)) * ab
               + (m.num_experts * (FP32_BYTES - ab) if m.router_score_bias else 0)  # that bias is fp32
               # Gemma 4: the branches' three norms, the router's input scale and its per-expert scales
               + ((3 * m.norm_params + m.hidden_size + m.num_experts) * ab if m.moe_parallel_ffn else 0)
               + _latent_weight_bytes(m, precision))
    else:
        ffn = _ffn_weight_bytes(m, precision, m.dense_ffn_width(kind), tp, 1, "dense_mlp")
    ple = 0.0
    if m.ple_dim:  # Gemma 4's per-layer input: gate and projection (not split by tp) and a norm
        ple = 2 * _module_matrix_bytes(precision, m.hidden_size, m.ple_dim, "dense_mlp") + m.norm_params * ab
    return attn + ffn + ple + (m.layer_norms(kind) * m.norm_params + (1 if m.layer_scalar else 0)) * ab


def stage_weight_bytes(model: ModelSpec, precision: Precision, tp: int = 1, pp: int = 1, *, ep: int = 1,
                       dp_attention: bool = False, redundant_experts: int = 0) -> list[float]:
    """Weight bytes on one GPU of each pipeline stage: the sum over the stage's own layers (dense
    and MoE layers differ) of `layer_weight_bytes`. Matrices at the weight precision with their
    group scales, embedding and lm_head at the embedding precision, norms, biases and routers at the
    activation precision; heads, FFN and vocabulary split `tp` ways (KV heads replicated when `tp`
    exceeds them), routed experts `ep` ways, attention replicated with `dp_attention`. The first
    stage holds the embeddings, the last the final norm and the lm_head (a tied lm_head shares the
    embedding only when both sit on one GPU, i.e. pp = 1). At tp = pp = 1 and one precision the
    stages sum to `param_count` x bytes."""
    from llmperf.analysis.operators import ShardDims
    check_parallelism(model, tp, ep, dp_attention)
    m, p, ab = model, precision, precision.act_bytes
    h = m.hidden_size
    vocab_shard = ShardDims.of(m, tp).vocab_size if not dp_attention else -(-m.vocab_size // tp)
    redundant = check_eplb(m, ep, redundant_experts or None)
    per_kind = {kind: layer_weight_bytes(m, p, kind, tp, ep=ep, dp_attention=dp_attention, redundant_experts=redundant)
                for kind, _ in m.layer_groups()}
    kinds = m.layer_kinds()
    vocab = p.embedding_matrix_bytes(h, vocab_shard)
    embed = vocab + (m.embedding_params - m.vocab_size * h) * p.embedding_bytes  # + learned positions
    if m.ple_dim:  # Gemma 4's per-layer embeddings, their projection and its norm (not split by tp)
        width = m.num_layers * m.ple_dim
        embed += (p.embedding_matrix_bytes(width, m.ple_vocab or m.vocab_size)
                  + _module_matrix_bytes(p, h, width, "dense_mlp") + m.ple_dim * ab)
    head = m.norm_params * ab + (vocab if (not m.tied_embeddings or pp > 1) else 0.0)
    out = []
    for r in stage_layer_ranges(m, pp):
        counts: dict[LayerKind, int] = {}
        for i in r:
            counts[kinds[i]] = counts.get(kinds[i], 0) + 1
        out.append(sum(n * per_kind[kind] for kind, n in counts.items()))
    out[0] += embed
    out[-1] += head
    return out


def _attention_keys(model: ModelSpec, q_len, kv_len):  # noqa: ANN001, ANN202
    """Keys a naive attention's score matrix spans, the widest over the model's layers: every key,
    or `q_len + window - 1` for layers that see only a window (sliding) or a chunk (chunked)."""
    windows = {kind.window for kind in model.layer_kinds()}
    if None in windows:
        return kv_len
    return np.minimum(kv_len, q_len + max(windows) - 1)


def activation_peak_bytes(model: ModelSpec, precision: Precision, batch, q_len, kv_len, *,  # noqa: ANN001, ANN201
                          tp: int = 1, attention: str = "fused", all_logits: bool = False, ep: int = 1,
                          dp_attention: bool = False):
    """Largest transient working set of one forward pass: the residual stream and its normalised
    copy, plus the larger of the attention block's tensors (Q, K, V, output; S and P when naive) and
    the FFN's (gate, up, activation outputs of the routed rows), taking the largest over the model's
    layer kinds, plus fp32 logits.

    MLA materialises per-head keys and values in prefill (the unabsorbed form): per token Q
    `n (dn + dr)`, K `n (dn + dr)`, V and output `n dv`, plus the latent `r + dr` (and `q_lora_rank`).
    A MoE layer's routed rows are `experts_per_token` per token at `expert_ffn_size` (with `ep`, a
    GPU holds 1/ep of the experts and receives 1/ep of the rows on average, each `ep` times wider:
    the same bytes), its shared experts' `shared_experts` rows at their width; a dense layer's one
    row at `ffn_size`. With `dp_attention` a GPU runs all heads on its own tokens, and its FFN
    shard sees the tokens of all `tp` GPUs (gathered). A Gated DeltaNet layer's tensors (its projections'
    outputs, the convolution's, the chunked form's in-block matrices) count as attention's."""
    check_parallelism(model, tp, ep, dp_attention)
    m, a = model, precision.act_bytes
    att_tp = 1 if dp_attention else tp
    tokens = batch * q_len
    stream = 2 * tokens * m.hidden_size * a
    heads = m.num_heads // att_tp
    if m.is_mla:
        per_head = 2 * m.mla_q_head_dim + 2 * m.v_head_dim
        latent = m.kv_lora_rank + m.qk_rope_head_dim + (m.q_lora_rank or 0)
        attn = tokens * (heads * per_head + latent) * a
    else:
        q_out = 3 if m.attn_output_gate else 2  # Q and the output (and the gate)
        attn = tokens * (q_out * heads + 2 * max(1, m.num_kv_heads // att_tp)) * m.head_dim * a
    if attention == "naive":
        attn = attn + 2 * batch * heads * q_len * _attention_keys(m, q_len, kv_len) * a
    kd, vd, nv = (m.linear_key_dim // att_tp, m.linear_value_dim // att_tp,
                  m.linear_num_value_heads // att_tp) if m.has_linear_layers else (0, 0, 0)
    if m.has_linear_layers and m.is_mamba:  # in_proj's output, the convolution's, y and its gated norm; the
        # chunked form's fp32 C x C matrix a block and group (C B^T)
        attn = np.maximum(attn, tokens * ((4 * kd + 5 * vd + nv) * a
                                          + m.linear_num_key_heads // att_tp * m.linear_chunk * FP32_BYTES))
    elif m.has_linear_layers:  # in_proj_qkvz's and in_proj_ba's outputs, the convolution's, the output; the
        # chunked form's two fp32 64 x 64 matrices a block and value head (the in-block k k^T and q k^T)
        attn = np.maximum(attn, tokens * ((4 * kd + 4 * vd + 2 * nv) * a + nv * 2 * m.linear_chunk * FP32_BYTES))
    mats = 3 if m.ffn_kind == "swiglu" else 2
    ffn_tokens = tokens * (tp if dp_attention and tp > 1 else 1)
    ffn = 0.0
    kinds = {kind.moe for kind in m.layer_kinds() if kind.ffn}
    if True in kinds:
        width = m.experts_per_token * (m.expert_ffn_size // (tp // ep))
        if ep > 1:
            width = width / ep
        if m.shared_experts:
            width = width + m.shared_experts * (m.shared_expert_ffn_size // tp)
        ffn = np.maximum(ffn, ffn_tokens * width * a * mats)
    if False in kinds:
        ffn = np.maximum(ffn, ffn_tokens * (m.ffn_size // tp) * a * mats)
    logits = (tokens if all_logits else batch) * (-(-m.vocab_size // tp)) * 4
    return stream + np.maximum(attn, ffn) + logits


def activation_reserve_bytes(model: ModelSpec, precision: Precision, conv: Conventions, tp: int = 1, *,
                             ep: int = 1, dp_attention: bool = False) -> float:
    """The one activation reservation: the peak of a forward of `max_batched_tokens` tokens (one
    chunk of that many tokens; logits for its last position, or for all with `all_logits`)."""
    t = conv.max_batched_tokens
    return float(activation_peak_bytes(model, precision, 1, t, t, tp=tp, attention=conv.attention,
                                       all_logits=conv.all_logits, ep=ep, dp_attention=dp_attention))


def kv_tokens_held(model: ModelSpec, context, window: str = "capped"):  # noqa: ANN001, ANN201
    """Tokens of KV a sequence of `context` tokens keeps per layer (`KVCacheSpec.tokens_held`): all,
    the sliding window's, or with layers of several kinds their average over layers."""
    return KVCacheSpec.from_model(model, window=window).tokens_held(context)


def _stage_kv(stage: KVCacheSpec, ctx, max_seq, lo, hi, gen_len, bs: float):  # noqa: ANN001, ANN202
    """(paged, contiguous, used mean, paged mean) bytes of one sequence on one GPU of a stage, summed
    over its groups of layers (each pages separately), plus its linear layers' state (whatever the context)."""
    paged = contiguous = used = paged_mean = stage.state_bytes
    for g in stage.groups:
        per_token = g.bytes_per_token
        paged = paged + g.paged_tokens(ctx, bs) * per_token
        contiguous = contiguous + g.tokens_held(max_seq) * per_token
        # lengths during the generation: prompt + 1 .. prompt + gen (closed-form means, O(1) in gen_len)
        used = used + _capped_sum(g, lo, hi, lambda n: n * (n + 1) / 2) / gen_len * per_token
        blocks = (lambda n: bs * _sum_ceil_div(n, bs)) if g.paged else (lambda n: n * (n + 1) / 2)
        paged_mean = paged_mean + _capped_sum(g, lo, hi, blocks) / gen_len * per_token
    return paged, contiguous, used, paged_mean


def memory_arrays(model: ModelSpec, precision: Precision, hw: HardwareSpec, conv: Conventions, *,  # noqa: ANN001
                  tp: int, pp: int, batch, prompt_len, gen_len, ep: int = 1,
                  dp_attention: bool = False) -> dict[str, np.ndarray]:
    """Per-GPU memory of every configuration (the tightest pipeline stage decides max batch).

    A sequence's KV on a stage is the sum over the stage's groups of layers of layers x bytes per
    token and layer x tokens held, paged by `block_size` per group, plus the constant state of its Gated
    DeltaNet layers (`KVCacheSpec.state_bytes`); sliding and chunked layers hold
    their window when `conv.kv_window` is "capped", the whole context when "full". With
    `dp_attention` every GPU of the `tp` group holds the whole KV (every head, or MLA's latent) of
    its own sequences only: max batch is `tp` times one GPU's, and a batch spreads over the `tp`
    GPUs (`ceil(batch / tp)` sequences the most loaded one)."""
    check_parallelism(model, tp, ep, dp_attention)
    kv_all = KVCacheSpec.from_model(model, precision, window=conv.kv_window)
    kv_all = kv_all.sharded(tp=1 if dp_attention else tp)  # the one KV formula (llmperf.specs.kvcache)
    batch, prompt_len, gen_len = (np.asarray(x, dtype=float) for x in (batch, prompt_len, gen_len))
    ctx = prompt_len + gen_len
    if conv.max_seq_len is None:
        max_seq = np.maximum(ctx, float(model.max_positions))
    else:
        max_seq = np.full_like(ctx, float(conv.max_seq_len))
        if np.any(ctx > max_seq):
            worst = int(ctx.max())
            raise SpecError(f"max_seq_len: {conv.max_seq_len} is shorter than a context of {worst} tokens "
                            f"(prompt_len + gen_len)")
    bs = float(conv.block_size)
    usable = hw.memory_bytes * conv.mem_util
    act = activation_reserve_bytes(model, precision, conv, tp, ep=ep, dp_attention=dp_attention)
    weights = stage_weight_bytes(model, precision, tp, pp, ep=ep, dp_attention=dp_attention,
                                 redundant_experts=check_eplb(model, ep, conv.eplb))
    ranges = stage_layer_ranges(model, pp)
    lo, hi = prompt_len + 1, ctx
    stages = [kv_all.layers(r.start, r.stop) for r in ranges]
    per_stage = [_stage_kv(s, ctx, max_seq, lo, hi, gen_len, bs) for s in stages]
    max_batch = max_batch_contig = None
    for w, (paged, contiguous, _, _) in zip(weights, per_stage):  # every stage must hold the batch
        free = np.maximum(usable - w - act, 0.0)
        mb = np.floor(free / paged)
        mbc = np.floor(free / contiguous)
        max_batch = mb if max_batch is None else np.minimum(max_batch, mb)
        max_batch_contig = mbc if max_batch_contig is None else np.minimum(max_batch_contig, mbc)
    seqs_per_gpu = batch
    if dp_attention:  # each GPU of the group serves its own sequences
        max_batch, max_batch_contig = tp * max_batch, tp * max_batch_contig
        seqs_per_gpu = np.ceil(batch / tp)
    heavy = int(np.argmax(weights))
    # the KV columns are the stage whose sequence occupies the most (the first of equals)
    paged = np.stack([np.broadcast_to(s[0], ctx.shape) for s in per_stage])
    pick = np.argmax(paged, axis=0)[None]
    col = lambda k: np.take_along_axis(  # noqa: E731
        np.stack([np.broadcast_to(s[k], ctx.shape) for s in per_stage]), pick, axis=0)[0]
    kv_tok = max(s.bytes_per_token for s in stages)
    return dict(
        weights_bytes=np.full_like(ctx, weights[heavy]), kv_bytes_per_token=np.full_like(ctx, kv_tok),
        kv_cache_bytes=seqs_per_gpu * col(0), activation_bytes=np.full_like(ctx, act),
        usable_bytes=np.full_like(ctx, usable), device_bytes=np.full_like(ctx, hw.memory_bytes),
        max_batch=max_batch, max_batch_contiguous=max_batch_contig, max_seq_len=max_seq,
        kv_used_bytes=col(2), kv_paged_bytes=col(3), kv_contiguous_bytes=col(1))


def _capped_sum(group: KVGroup, lo, hi, prefix):  # noqa: ANN001, ANN202
    """Sum over lengths L in [lo, hi] of f(tokens the `group`'s layers use at L), where `prefix(n)` =
    sum of f over 1..n (prefix(0) = 0): f(L) for full layers; f(min(L, W)) for sliding ones; for
    chunked ones f(((L - 1) % C) + 1), the current chunk, whose sum over 1..n is
    `(n // C) prefix(C) + prefix(n % C)`; every layer f(L) when not capped. DeepSeek-V4's groups of rate r:
    f(L // r) (`compressed`), f(L mod r) (`partial`), f(r) once L >= r (`overlap`), each summed in closed form."""
    w = group.cap
    if w is None:
        return prefix(hi) - prefix(lo - 1)
    if group.attention in ("compressed", "partial", "overlap"):
        f_w = prefix(float(w)) - prefix(float(w) - 1)

        def total(n):  # noqa: ANN001, ANN202  -- sum over L = 1 .. n (n >= 0)
            n = np.asarray(n, dtype=float)
            if group.attention == "partial":
                return np.floor_divide(n, w) * prefix(float(w - 1)) + prefix(np.mod(n, w))
            if group.attention == "overlap":
                return np.maximum(n - w + 1, 0) * f_w
            q = np.floor_divide(n, w)
            below = np.maximum(q - 1, 0)
            return np.where(q > 0, w * prefix(below) + (n - q * w + 1) * (prefix(q) - prefix(below)), 0.0)
        return total(hi) - total(lo - 1)
    if group.attention == "chunked":
        def total(n):  # noqa: ANN001, ANN202
            return np.floor_divide(n, w) * prefix(float(w)) + prefix(np.mod(n, w))
        return total(hi) - total(lo - 1)
    top = np.minimum(hi, w)
    below = np.where(top >= lo, prefix(top) - prefix(np.minimum(lo - 1, top)), 0.0)
    f_w = prefix(float(w)) - prefix(float(w) - 1)
    above = np.maximum(hi - np.maximum(lo - 1, w), 0) * f_w
    return below + above


# ---- regimes -------------------------------------------------------------------------------------
def first_true_array(pred, size: int, lo: int = 1, hi: int = SEARCH_MAX, ways: int = 32):  # noqa: ANN001, ANN201
    """Smallest n in [lo, hi] with pred(n) True, elementwise over `size` rows, for a pred that stays
    True once True; NaN where pred(hi) is False. A doubling bracket, then a `ways`-ary search: pred
    takes an (size, k) array of candidates (each row's own) and returns booleans of that shape, so an
    answer near 2^12 in 1 .. 2^26 needs 4 calls (32 ways: arrays half as wide as 64 ways' 3 calls, and
    a sweep's regime searches about 10 % faster on this 2-core CPU; the answers are the same)."""
    lo_a, hi_a = np.full(size, float(lo)), np.full(size, float(hi))
    # first a doubling bracket, lo + 2^j - 1 up to hi (hi last: whether any n works), in one call:
    # answers are usually far below hi, so the linear steps then start from a span near the answer
    # (sorted and deduplicated without np.unique, whose masked-array check imports numpy.ma: start-up time)
    geo = np.array(sorted(set(np.minimum(lo + 2.0 ** np.arange(0, int(np.ceil(np.log2(hi - lo + 1))) + 1) - 1,
                                         hi).tolist())))
    pts = np.broadcast_to(geo, (size, geo.size))
    up = np.asarray(pred(pts), dtype=bool).reshape(size, geo.size)
    ok = up[:, -1]
    first = np.argmax(up | (pts >= hi_a[:, None]), axis=1)
    rows = np.arange(size)
    hi_a = pts[rows, first]
    lo_a = np.where(first > 0, pts[rows, np.maximum(first - 1, 0)] + 1, lo_a)
    lo_a = np.where(ok, lo_a, hi_a)  # no n works: nothing to narrow (the answer is NaN)
    steps = np.arange(1, ways + 1) / ways
    while np.any(lo_a < hi_a):
        span = hi_a - lo_a
        pts = np.minimum(lo_a[:, None] + np.floor(span[:, None] * steps), hi_a[:, None])  # last = hi
        up = np.asarray(pred(pts), dtype=bool).reshape(size, ways) | (pts >= hi_a[:, None])
        first = np.argmax(up, axis=1)
        rows = np.arange(size)
        new_hi = pts[rows, first]
        new_lo = np.where(first > 0, pts[rows, np.maximum(first - 1, 0)] + 1, lo_a)
        lo_a, hi_a = np.minimum(new_lo, new_hi), new_hi
    return np.where(ok, lo_a, np.nan)


def regime_arrays(fm: ForwardModel, hw: HardwareSpec, dtype: str, tm: TimeModel | None, *, batch, context,  # noqa: ANN001
                  size: int) -> dict[str, np.ndarray]:
    """Critical batches (decode turns compute-bound: compute time strictly above memory time), the
    attention crossovers (attention FLOPs / bytes reach those of the rest of the layer) and the
    decode context from which the step's attention itself is compute-bound (MLA's absorbed form:
    every head shares one latent, so its intensity approaches 2 n (2r + dr) / ((r + dr) b), near the
    ridge point; GQA decode attention, about 2 g / b FLOP/B, never gets there). Each search runs once
    per distinct value it depends on (the context, the batch, or nothing)."""
    batch = np.asarray(batch, dtype=float) + np.zeros(size)
    context = np.asarray(context, dtype=float) + np.zeros(size)

    def compute_bound(b, ctx, only_matmul: bool):  # noqa: ANN001, ANN202
        comp = mem = 0.0
        for c in fm.forward_ops(b, 1, ctx):
            if only_matmul and c.kind != "matmul":
                continue
            t = op_time(c, hw, dtype, tm)
            comp, mem = comp + t.compute_s, mem + t.memory_s
        return np.asarray(comp > mem) & np.ones(np.shape(b), dtype=bool)

    def split(b, q, kv, field: str):  # noqa: ANN001, ANN202
        attn = rest = 0.0
        for c in fm.forward_ops(b, q, kv):
            if not c.per_layer:
                continue
            if c.name in _ATTN_NAMES:
                attn = attn + getattr(c, field)
            else:
                rest = rest + getattr(c, field)
        return np.asarray(attn >= rest) & np.ones(np.broadcast_shapes(np.shape(b), np.shape(q)), dtype=bool)

    def attention_bound(b, ctx):  # noqa: ANN001, ANN202
        comp = mem = 0.0
        for c in fm.attention_core_ops(b, 1, ctx):  # forward_ops' attention cores, nothing else built
            if c.name in _ATTN_CORE:
                t = op_time(c, hw, dtype, tm)
                comp, mem = comp + t.compute_s, mem + t.memory_s
        return np.asarray(comp > mem) & np.ones(np.broadcast_shapes(np.shape(b), np.shape(ctx)), dtype=bool)

    def per_value(values, search):  # noqa: ANN001, ANN202
        """Run `search(unique_values[:, None], n)` once per distinct value, spread back to the rows."""
        uniq, inverse = np.unique(values, return_inverse=True)
        return search(uniq[:, None], uniq.size)[inverse.reshape(-1)]

    ctx1 = context[:1, None]  # the matmuls' roofs do not depend on the context
    return dict(
        critical_batch_matmul=np.repeat(first_true_array(lambda b: compute_bound(b, ctx1, True), 1), size),
        critical_batch=per_value(context, lambda ctx, n: first_true_array(
            lambda b: compute_bound(b, ctx, False), n)),
        attention_flops_crossover=np.repeat(first_true_array(lambda n: split(1, n, n, "flops"), 1), size),
        attention_bytes_crossover=per_value(batch, lambda b, n: first_true_array(
            lambda c: split(b, 1, c, "bytes_total"), n)),
        attention_critical_context=per_value(batch, lambda b, n: first_true_array(
            lambda c: attention_bound(b, c), n)))


# ---- the roll-up ---------------------------------------------------------------------------------
def ep_excess(model: ModelSpec, ep: int, tokens: np.ndarray, load: ExpertLoad | None = None,
              eplb: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Expert parallelism's busiest GPU over the mean at a step of `tokens` tokens (a decode step's:
    the batch): its routed rows and its experts touched, each a ratio to uniform routing's mean
    (`busiest_expert_load`, under a measured `load` and EPLB's `eplb` redundant experts when given; 1
    without experts split apart)."""
    t = np.asarray(tokens, dtype=float)
    if not model.is_moe or ep <= 1:
        return np.ones_like(t), np.ones_like(t)
    e, k = model.num_experts, model.experts_per_token
    rows, touched = busiest_expert_load(t, e, k, ep, measured_routing(model, ep, load, eplb))
    mean_rows, mean_touched = t * k / ep, expected_experts_touched(t, e, k) / ep
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.where(mean_rows > 0, rows / np.where(mean_rows > 0, mean_rows, 1), 1.0),
                np.where(mean_touched > 0, touched / np.where(mean_touched > 0, mean_touched, 1), 1.0))


def forward_model(model: ModelSpec, precision: Precision, conv: Conventions, tp: int) -> ForwardModel:
    """The `ForwardModel` of `model` at `precision` under the conventions `conv`, split `tp` ways."""
    return ForwardModel(model=model, precision=precision, attention=conv.attention, tp=tp,
                        all_logits=conv.all_logits, attention_flops=conv.attention_flops,
                        fused_qkv=conv.fused_qkv, fused_gate_up=conv.fused_gate_up, mla_mode=conv.mla_mode,
                        ep=conv.ep, dp_attention=conv.dp_attention, expert_load=conv.expert_load, eplb=conv.eplb)


def rollup(model: ModelSpec, hw: HardwareSpec, precision: Precision, *, tp: int, pp: int, conv: Conventions,
           batch, prompt_len, gen_len, time_model: TimeModel | None = None) -> dict[str, object]:  # noqa: ANN001
    """Every column of the result schema for arrays of (batch, prompt_len, gen_len) (same shape)."""
    tm = model_time_model(resolve_time_model(time_model), model)
    stage_layers(model, pp)
    if tp > 1 and hw.interconnect_bytes_per_s <= 0:  # the all-reduces need a link (as pp's transfers do)
        raise SpecError(f"tp: {tp} needs an interconnect, but {hw.name} has interconnect_gbps 0")
    fm = forward_model(model, precision, conv, tp)
    dtype = hw.compute_dtype(precision.activations)
    B, P, G = (np.asarray(x, dtype=float).ravel() for x in (batch, prompt_len, gen_len))
    n = B.size
    prefill = phase_arrays(fm, hw, B, P, P, pp=pp, compute_dtype=dtype, time_model=phase_time_model(tm, "prefill"))
    first = phase_arrays(fm, hw, B, 1.0, P + 1, pp=pp, compute_dtype=dtype, time_model=tm)
    last = phase_arrays(fm, hw, B, 1.0, P + np.maximum(G - 1, 1), pp=pp, compute_dtype=dtype, time_model=tm)
    d_time, d_flops, d_bytes = decode_sums(fm, hw, B, P, G, pp=pp, compute_dtype=dtype, time_model=tm)
    steps = np.maximum(G - 1, 0)
    has_steps = steps > 0
    e2e = prefill.time_s + d_time
    tpot = np.where(has_steps, d_time / np.maximum(steps, 1), 0.0)
    if tm.name == "roofline":  # the bound beside the expected time: the same numbers under the roofline
        ttft_bound, tpot_bound, e2e_bound = prefill.time_s, tpot, e2e
    else:
        ttft_bound = phase_arrays(fm, hw, B, P, P, pp=pp, compute_dtype=dtype).time_s
        d_bound = decode_sums(fm, hw, B, P, G, pp=pp, compute_dtype=dtype)[0]
        tpot_bound, e2e_bound = np.where(has_steps, d_bound / np.maximum(steps, 1), 0.0), ttft_bound + d_bound
    total_flops = prefill.flops + d_flops
    peak = peak_in_use_flops_per_s(hw, dtype, precision)  # fp8-block / fp4 modules may run faster
    mem = memory_arrays(model, precision, hw, conv, tp=tp, pp=pp, batch=B, prompt_len=P, gen_len=G, ep=conv.ep,
                        dp_attention=conv.dp_attention)
    reg = regime_arrays(fm, hw, dtype, tm, batch=B, context=P + G, size=n)
    ep_rows, ep_experts = ep_excess(model, conv.ep, B, conv.expert_load, conv.eplb)
    gib = 2.0 ** 30
    total_mem = mem["weights_bytes"] + mem["kv_cache_bytes"] + mem["activation_bytes"]
    return dict(
        model=model.name, hardware=hw.name, precision=precision.label(), weights=precision.weights,
        activations=precision.activations, kv=precision.kv, embeddings=precision.embedding_dtype,
        group_size=precision.effective_group_size if precision.quantized else None,
        tp=tp, pp=pp, gpus=tp * pp, ep=conv.ep, dp_attention=conv.dp_attention,
        ep_busiest_rows=ep_rows, ep_busiest_experts=ep_experts,
        expert_load=None if conv.expert_load is None else conv.expert_load.source, eplb=conv.eplb,
        attention=conv.attention, attention_flops=conv.attention_flops,
        all_logits=conv.all_logits, fused_qkv=conv.fused_qkv, fused_gate_up=conv.fused_gate_up,
        mla_mode=conv.mla_mode, kv_window=conv.kv_window,
        sliding_window=model.sliding_window, time_model=tm.name, engine=engine_label(tm),
        batch=B.astype(np.int64), prompt_len=P.astype(np.int64), gen_len=G.astype(np.int64),
        params_total=model.param_count, params_active=model.active_param_count,
        ttft_s=prefill.time_s, tpot_s=tpot, e2e_s=e2e, decode_s=d_time,
        ttft_bound_s=ttft_bound + 0.0 * B, tpot_bound_s=tpot_bound + 0.0 * B, e2e_bound_s=e2e_bound + 0.0 * B,
        tpot_first_s=np.where(has_steps, first.time_s, 0.0), tpot_last_s=np.where(has_steps, last.time_s, 0.0),
        tokens_per_s=np.where(e2e > 0, B * G / np.where(e2e > 0, e2e, 1), 0.0),
        decode_tokens_per_s=np.where(tpot > 0, B / np.where(tpot > 0, tpot, 1), 0.0),
        prefill_flops=prefill.flops, prefill_bytes=prefill.bytes_total,
        decode_flops=d_flops, decode_bytes=d_bytes, total_flops=total_flops,
        total_bytes=prefill.bytes_total + d_bytes,
        peak_fraction=np.where(e2e > 0, total_flops / np.where(e2e > 0, e2e, 1) / (pp * peak), 0.0),
        prefill_intensity=prefill.intensity, prefill_bound=prefill.bound,
        decode_intensity=first.intensity, decode_bound=first.bound,
        compute_dtype=dtype, gemm=gemm_mode(precision, hw), ridge_point=hw.ridge_point(dtype),
        weights_gib=mem["weights_bytes"] / gib, kv_bytes_per_token=mem["kv_bytes_per_token"],
        kv_cache_gib=mem["kv_cache_bytes"] / gib, activation_peak_gib=mem["activation_bytes"] / gib,
        total_gib=total_mem / gib, usable_gib=mem["usable_bytes"] / gib, device_gib=mem["device_bytes"] / gib,
        mem_util=conv.mem_util, max_batched_tokens=conv.max_batched_tokens, block_size=conv.block_size,
        max_seq_len=mem["max_seq_len"].astype(np.int64),
        fits=B <= mem["max_batch"], max_batch=mem["max_batch"].astype(np.int64),
        max_batch_contiguous=mem["max_batch_contiguous"].astype(np.int64),
        kv_util_contiguous=mem["kv_used_bytes"] / mem["kv_contiguous_bytes"],
        kv_util_paged=mem["kv_used_bytes"] / mem["kv_paged_bytes"],
        **reg,
        # private: the KV utilisation inputs `estimate` keeps in its `KVUtilization` (not columns)
        _kv_used_bytes=mem["kv_used_bytes"], _kv_paged_bytes=mem["kv_paged_bytes"],
        _kv_contiguous_bytes=mem["kv_contiguous_bytes"])
