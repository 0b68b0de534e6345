"""The one vocabulary of operators and phases (DESIGN.md, "One vocabulary of operators").

The analytical model names its cost functions with these, the engine's instrumentation names its
timers with them, the kernel benchmarks and `llmperf profile` join measurements to predictions by
them, and reports label charts with them. Nothing else spells an operator name as a string literal.

`Op` and `Phase` are `str` enums, so `Op.q_proj == "q_proj"` and they serialise to plain strings in
CSV and JSON. The order of `Op` is forward order through one decoder layer (model-level operators
first and last).

Fused operators: fast engines (vLLM, TensorRT-LLM) run Q, K and V as one GEMM over a concatenated
weight (`qkv_proj`) and the gate and up projections of a gated FFN as one GEMM (`gate_up_proj`). A
fused GEMM reads its input activations once. `FUSED_PARTS` maps each fused name to the names it
replaces, so a split prediction can be joined to a fused measurement and back.
"""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType


class Op(str, Enum):
    """Operator names, in forward order."""

    embed = "embed"
    pos_embed = "pos_embed"
    attn_norm = "attn_norm"
    qkv_proj = "qkv_proj"
    q_proj = "q_proj"
    k_proj = "k_proj"
    v_proj = "v_proj"
    rope = "rope"
    kv_write = "kv_write"
    attention = "attention"  # fused: S and P stay on chip
    attn_score = "attn_score"  # naive: S = Q K^T written to memory
    attn_softmax = "attn_softmax"  # naive: P = softmax(S) written to memory
    attn_value = "attn_value"  # naive: O = P V
    o_proj = "o_proj"
    attn_allreduce = "attn_allreduce"
    attn_residual = "attn_residual"
    mlp_norm = "mlp_norm"
    router = "router"
    gate_up_proj = "gate_up_proj"
    gate_proj = "gate_proj"
    up_proj = "up_proj"
    act = "act"
    down_proj = "down_proj"
    mlp_allreduce = "mlp_allreduce"
    mlp_residual = "mlp_residual"
    final_norm = "final_norm"
    lm_head = "lm_head"
    pp_send = "pp_send"  # activations handed to the next pipeline stage

    def __str__(self) -> str:
        return self.value


class Phase(str, Enum):
    """What a step does. A step's phase is set by whoever schedules it, never guessed from shapes.

    prefill: every sequence of the step processes prompt tokens (all of them, or a chunk);
    decode: every sequence of the step processes exactly one new token;
    mixed: prefill chunks and decode tokens in one step (chunked prefill, Sarathi-Serve);
    verify: several draft tokens per sequence checked at once (speculative decoding).
    """

    prefill = "prefill"
    decode = "decode"
    mixed = "mixed"
    verify = "verify"

    def __str__(self) -> str:
        return self.value


#: fused operator -> the operators it replaces
FUSED_PARTS: MappingProxyType[Op, tuple[Op, ...]] = MappingProxyType({
    Op.qkv_proj: (Op.q_proj, Op.k_proj, Op.v_proj),
    Op.gate_up_proj: (Op.gate_proj, Op.up_proj),
})

#: operators that exist once per model rather than once per layer
MODEL_LEVEL_OPS: frozenset[Op] = frozenset({Op.embed, Op.pos_embed, Op.final_norm, Op.lm_head, Op.pp_send})

#: operators that are a matrix multiply against weights (GEMM in prefill, GEMV-like in decode)
WEIGHT_MATMUL_OPS: frozenset[Op] = frozenset({
    Op.qkv_proj, Op.q_proj, Op.k_proj, Op.v_proj, Op.o_proj, Op.router, Op.gate_up_proj, Op.gate_proj,
    Op.up_proj, Op.down_proj, Op.lm_head,
})

#: operators of the attention core (what the attention kernels compute)
ATTENTION_OPS: frozenset[Op] = frozenset({Op.attention, Op.attn_score, Op.attn_softmax, Op.attn_value})

OP_NAMES: tuple[str, ...] = tuple(op.value for op in Op)
PHASE_NAMES: tuple[str, ...] = tuple(ph.value for ph in Phase)


def as_op(name: str | Op) -> Op:
    """`Op` from a name; an unknown name raises ValueError listing the vocabulary."""
    try:
        return Op(name)
    except ValueError:
        raise ValueError(f"operator {name!r} is not in the vocabulary ({', '.join(OP_NAMES)})") from None


def as_phase(name: str | Phase) -> Phase:
    """`Phase` from a name; an unknown name raises ValueError listing the phases."""
    try:
        return Phase(name)
    except ValueError:
        raise ValueError(f"phase {name!r} is not one of {', '.join(PHASE_NAMES)}") from None
