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

Layers of different kinds (full, sliding, chunked attention; MoE or dense FFN) run the same operator
names: a cost carries its layer kind separately (`OpCost.layer`), so a join by name still works. Gated
DeltaNet layers (Qwen3-Next, Qwen3.5) run `in_proj_qkvz`, `in_proj_ba`, `conv1d`, `deltanet`, `gated_norm`
and `o_proj` in place of attention; Mamba-2 layers (Nemotron-H) `in_proj`, `conv1d`, `ssd`, `gated_norm`, `o_proj`.
Multi-head latent attention (MLA) adds its projections (`q_a_proj` .. `kv_b_proj`; DeepSeek Sparse Attention
its indexer's, `index_*`) and, in the absorbed form, `q_absorb` and `v_absorb`; mixture-of-experts layers add
the router's GEMM (`router`), its choice of experts (`moe_route`), the routed experts' FFN, the weighted sum of
each token's expert outputs (`moe_sum`), the shared experts' operators (`shared_*`) and, with expert
parallelism, the `moe_dispatch` / `moe_combine` all-to-alls. Tensor parallelism's vocabulary-split embedding and LM head
add one collective each per forward pass: `embed_allreduce` and `logits_gather`.
"""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType


class Op(str, Enum):
    """Operator names, in forward order."""

    embed = "embed"
    embed_allreduce = "embed_allreduce"  # tensor parallel: the vocabulary-split embedding's partial rows summed
    pos_embed = "pos_embed"
    embed_scale = "embed_scale"  # Gemma: the embedding times sqrt(hidden); Granite: times embedding_multiplier
    ple_embed = "ple_embed"  # Gemma 4: each token's per-layer embeddings (a second table, every layer's at once)
    ple_proj = "ple_proj"  # Gemma 4: the embedding projected to every layer's per-layer input
    ple_norm = "ple_norm"  # Gemma 4: that projection normed, added to the per-layer embeddings and scaled
    hc_proj = "hc_proj"  # DeepSeek-V4: the hyper-connection's mixing logits from the normed streams (fp32 GEMM)
    hc_pre = "hc_pre"  # DeepSeek-V4: its norm, sigmoids, Sinkhorn iterations and the streams' collapse
    attn_norm = "attn_norm"
    in_proj_qkvz = "in_proj_qkvz"  # Gated DeltaNet: hidden -> q, k, v and the output gate z (linear layers)
    in_proj_ba = "in_proj_ba"  # Gated DeltaNet: hidden -> each value head's write strength b and decay a
    in_proj = "in_proj"  # Mamba-2: hidden -> z, x, B, C and each head's dt (linear layers)
    conv1d = "conv1d"  # linear layers: the causal depthwise convolution over q, k, v / x, B, C (state: the last K-1)
    deltanet = "deltanet"  # Gated DeltaNet: the gated delta rule over the recurrent state (chunked in prefill)
    ssd = "ssd"  # Mamba-2: the state-space dual scan over the recurrent state (chunked in prefill)
    gated_norm = "gated_norm"  # linear layers: RMSNorm of the output times silu(z)
    qkv_proj = "qkv_proj"
    q_proj = "q_proj"  # (MLA without q_lora_rank: hidden -> heads x (nope + rope))
    k_proj = "k_proj"
    v_proj = "v_proj"
    q_a_proj = "q_a_proj"  # MLA: hidden -> q_lora_rank
    q_a_norm = "q_a_norm"  # MLA: norm over q_lora_rank
    q_b_proj = "q_b_proj"  # MLA: q_lora_rank -> heads x (nope + rope)
    kv_a_proj = "kv_a_proj"  # MLA: hidden -> kv_lora_rank + rope (the latent and the shared rotary key)
    kv_a_norm = "kv_a_norm"  # MLA: norm over kv_lora_rank
    index_q_proj = "index_q_proj"  # DSA's indexer: q_lora_rank -> index heads x index head dim (wq_b)
    index_k_proj = "index_k_proj"  # DSA's indexer: hidden -> its key and its heads' weights (wk, weights_proj)
    index_k_norm = "index_k_norm"  # DSA's indexer: LayerNorm of its key
    index_write = "index_write"  # DSA's indexer: the new tokens' keys into its cache (fp8 and a scale)
    index_score = "index_score"  # DSA's indexer: every query's scores against every cached key
    index_topk = "index_topk"  # DSA's indexer: each query's top-k keys from its scores
    kv_proj = "kv_proj"  # DeepSeek-V4: hidden -> the one K = V head
    kv_norm = "kv_norm"  # DeepSeek-V4: its RMSNorm
    compress_proj = "compress_proj"  # DeepSeek-V4: a csa / hca layer's compressor, hidden -> its kv and gate
    compress_pool = "compress_pool"  # DeepSeek-V4: the gated pooling of each closed window into a compressed entry
    kv_b_proj = "kv_b_proj"  # MLA unabsorbed: latent -> heads x (nope K + V)
    q_absorb = "q_absorb"  # MLA absorbed: q_nope x W_UK per head
    qk_norm_gather = "qk_norm_gather"  # OLMo 2/3 under tp: every GPU's q and k heads gathered before the norm
    qk_norm = "qk_norm"  # a norm over head_dim of every query and key head (Qwen3, Gemma 3/4, Llama 4; Gemma 4's V)
    qk_norm_allreduce = "qk_norm_allreduce"  # MiniMax-M2 under tp: the q and k norms' partial variances summed
    rope = "rope"
    kv_write = "kv_write"
    attention = "attention"  # fused: S and P stay on chip
    attn_score = "attn_score"  # naive: S = Q K^T written to memory
    attn_softcap = "attn_softcap"  # naive: S = cap * tanh(S / cap) (Gemma 2)
    attn_softmax = "attn_softmax"  # naive: P = softmax(S) written to memory
    attn_value = "attn_value"  # naive: O = P V
    v_absorb = "v_absorb"  # MLA absorbed: the latent output x W_UV per head
    attn_gate = "attn_gate"  # Qwen3-Next / Qwen3.5: the attention output times sigmoid(gate), gate from q_proj
    o_a_proj = "o_a_proj"  # DeepSeek-V4: each head group -> o_lora_rank (the grouped output projection)
    o_proj = "o_proj"  # (a Gated DeltaNet layer's out_proj too; DeepSeek-V4's o_b_proj)
    hc_post = "hc_post"  # DeepSeek-V4: the sublayer's output mixed back into the residual streams
    attn_allreduce = "attn_allreduce"
    post_attn_norm = "post_attn_norm"  # Gemma's sandwich norm after attention
    attn_residual = "attn_residual"
    mlp_norm = "mlp_norm"
    router = "router"
    moe_route = "moe_route"  # the router's choice from its logits: scores, top-k, their weights
    moe_latent_down = "moe_latent_down"  # a latent MoE (Nemotron-H): hidden -> the experts' latent width
    moe_dispatch = "moe_dispatch"  # expert parallelism: tokens all-to-all to their experts' GPUs
    gate_up_proj = "gate_up_proj"
    gate_proj = "gate_proj"
    up_proj = "up_proj"
    act = "act"
    down_proj = "down_proj"
    moe_combine = "moe_combine"  # expert parallelism: expert outputs all-to-all back
    moe_sum = "moe_sum"  # each token's k expert outputs, weighted and summed
    moe_latent_up = "moe_latent_up"  # a latent MoE: the summed expert output back to hidden
    shared_gate_up_proj = "shared_gate_up_proj"  # the shared experts (always on, every token)
    shared_gate_proj = "shared_gate_proj"
    shared_up_proj = "shared_up_proj"
    shared_act = "shared_act"
    shared_down_proj = "shared_down_proj"
    shared_expert_gate = "shared_expert_gate"  # Qwen2-MoE: hidden -> 1 sigmoid gate on the shared experts
    moe_branch_norms = "moe_branch_norms"  # Gemma 4: the experts' input norm, both branches' output norms, their sum
    mlp_allreduce = "mlp_allreduce"
    post_mlp_norm = "post_mlp_norm"  # Gemma's sandwich norm after the MLP
    mlp_residual = "mlp_residual"
    ple_gate = "ple_gate"  # Gemma 4: hidden -> the per-layer input's width
    ple_act = "ple_act"  # Gemma 4: the gate's activation times the layer's per-layer input
    ple_out = "ple_out"  # Gemma 4: back to hidden
    ple_out_norm = "ple_out_norm"  # Gemma 4: its norm and residual add
    hc_head = "hc_head"  # DeepSeek-V4: the hyper-head collapsing the streams before the final norm
    final_norm = "final_norm"
    lm_head = "lm_head"
    logits_gather = "logits_gather"  # tensor parallel: every GPU's vocabulary slice of the logits gathered
    final_softcap = "final_softcap"  # Gemma 2: cap * tanh(logit / cap)
    logits_scale = "logits_scale"  # Granite: every logit divided by logits_scaling; Cohere: times logit_scale
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
    Op.shared_gate_up_proj: (Op.shared_gate_proj, Op.shared_up_proj),
})

#: operators that exist once per model rather than once per layer
MODEL_LEVEL_OPS: frozenset[Op] = frozenset({Op.embed, Op.embed_allreduce, Op.pos_embed, Op.embed_scale,
                                           Op.ple_embed, Op.ple_proj, Op.ple_norm, Op.hc_head,
                                           Op.final_norm, Op.lm_head, Op.logits_gather, Op.final_softcap,
                                           Op.logits_scale, Op.pp_send})

#: operators that are a matrix multiply against weights (GEMM in prefill, GEMV-like in decode)
WEIGHT_MATMUL_OPS: frozenset[Op] = frozenset({
    Op.in_proj_qkvz, Op.in_proj_ba, Op.in_proj, Op.index_q_proj, Op.index_k_proj,
    Op.qkv_proj, Op.q_proj, Op.k_proj, Op.v_proj, Op.q_a_proj, Op.q_b_proj, Op.kv_a_proj, Op.kv_b_proj,
    Op.q_absorb, Op.v_absorb, Op.o_proj, Op.router, Op.moe_latent_down, Op.moe_latent_up, Op.gate_up_proj,
    Op.gate_proj, Op.up_proj, Op.down_proj,
    Op.shared_gate_up_proj, Op.shared_gate_proj, Op.shared_up_proj, Op.shared_down_proj, Op.shared_expert_gate,
    Op.lm_head, Op.ple_proj, Op.ple_gate, Op.ple_out, Op.hc_proj, Op.kv_proj, Op.compress_proj, Op.o_a_proj,
})

#: operators of the attention core (what the attention kernels compute)
ATTENTION_OPS: frozenset[Op] = frozenset({Op.attention, Op.attn_score, Op.attn_softcap, Op.attn_softmax,
                                         Op.attn_value})

#: collectives (kind "comm")
COMM_OPS: frozenset[Op] = frozenset({Op.embed_allreduce, Op.qk_norm_gather, Op.qk_norm_allreduce,
                                     Op.attn_allreduce, Op.mlp_allreduce, Op.moe_dispatch,
                                     Op.moe_combine, Op.logits_gather, Op.pp_send})

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
