"""FLOPs and bytes of every operator of a decoder-only transformer's forward pass (`ForwardModel`).

One cost function per operator, each with the signature `(batch, q_len, kv_len)`: prefill is
`q_len = kv_len = prompt`, a decode step is `q_len = 1, kv_len = context` (the new token included).
Arguments may be numpy arrays (sweeps). Formulas: GEMM `A(m,k) @ B(k,n)` = `2mkn` FLOPs (NVIDIA,
"Matrix Multiplication Background User's Guide"); attention as in FlashAttention (Dao et al. 2022,
arXiv:2205.14135): the naive form writes S = QK^T and P = softmax(S) to memory, the fused form keeps
them on chip and reads Q, K, V and writes O once (`attention_core`, `attended_pairs`, `keys_read`).
Mixture-of-experts bytes count only the experts the batch touches in expectation under uniform
routing (`expected_experts_touched`; with `ep`, the busiest GPU's rows and experts,
`llmperf.analysis.routing`); the router's choice of experts (`moe_route`) and the weighted
sum of each token's expert outputs (`moe_sum`) are small operators of their own.

Layers differ (`ModelSpec.layer_groups`): a forward pass sums the groups of layers of one kind, each
distinct attention or FFN part built once and labelled with its kinds (`forward_ops`,
`ForwardModel.sections`). Sliding layers (Beltagy et al. 2020, arXiv:2004.05150) see their last
`window` keys, chunked ones (Llama 4) their own chunk; Gated DeltaNet layers (`linear_ops`) read and
write a state a sequence (`kv_*_bytes`). Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434) has
two exact forms, unabsorbed (`kv_b_proj`) and absorbed (`q_absorb`, MQA over the latent, `v_absorb`),
chosen by `mla_mode`. Expert parallelism (`ep`; DeepSpeed-MoE,
arXiv:2201.05596) and data-parallel attention (`dp_attention`, SGLang's DP attention) set the per-GPU
dimensions (`ShardDims`); counts are per GPU, for the busiest one.

Fused projections (`fused_qkv`, `fused_gate_up`) are off in `ForwardModel` by default and on in
`estimate`, `sweep` and the CLI. The counting conventions: docs/model.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from llmperf.analysis.attention_eff import AttnShape
from llmperf.analysis.gemm import GemmShape
from llmperf.analysis.roofline import Number, OpCost
from llmperf.analysis.routing import busiest_expert_load, expected_experts_touched, measured_routing
from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, Precision
from llmperf.specs.expert_load import ExpertLoad
from llmperf.specs.kvcache import recurrent_state_element_bytes
from llmperf.specs.model import LINEAR_CHUNK_DEFAULTS, LayerKind

ATTENTION_IMPLS = ("fused", "naive")
FLOP_CONVENTIONS = ("executed", "dense")
MLA_MODES = ("auto", "absorbed", "unabsorbed")

# FLOPs per element of the vector operators (documented estimates; all are memory-bound anyway)
# square, sum, rsqrt-scale, weight (+ mean, sub, bias)
NORM_FLOPS = {"rmsnorm": 4, "layernorm": 7, "layernorm_no_bias": 6, "l2": 3}
ACT_FLOPS = {"swiglu": 6, "gelu": 8, "relu": 1}  # silu(g) * u; tanh-approximate GELU; max(x, 0)
RELU2_FLOPS = 2  # max(x, 0)^2 (Nemotron-H's relu2, a two-matrix FFN)
SOFTMAX_FLOPS = 5  # max, subtract, exp, sum, divide
ROPE_FLOPS = 3  # x * cos + rotate(x) * sin
SOFTCAP_FLOPS = 3  # divide, tanh, multiply
SINK_FLOPS = 2  # the sink logit's exponential and its add to the row sum
ROUTE_FLOPS = 4  # per expert logit: its score (an exponential or a sigmoid), a sum or divide, the top-k's compare
FP32_BYTES = 4  # a value kept in fp32 whatever the model's dtype (DeepSeek's router score-correction bias)
ROUTE_CHOICE_BYTES = 12  # a chosen expert: its weight (fp32), id and token-expert index (int32), as vLLM's topk_softmax
GATE_FLOPS = 5  # sigmoid(g) * x: an exponential, an add, a divide, a multiply (and the read of g)
# Gated DeltaNet (Yang et al. 2024, arXiv:2412.06464; FLA's kernels): the chunked form's block size, the
# recurrent step's FLOPs per state element (decay, read k^T S, delta, rank-1 update, read q^T S), the
# chunked form's per-state-element term (v_new, the output's state read, the state update: 3 GEMMs) and
# the gates' and norms' FLOPs per value head (softplus, exp, sigmoid; q and k L2 norms per key element)
DELTANET_CHUNK = LINEAR_CHUNK_DEFAULTS["gated_deltanet"]
DELTANET_STEP_FLOPS = 7
DELTANET_CHUNK_STATE_FLOPS = 6
DELTANET_GATE_FLOPS = 10
CONV_ACT_FLOPS = 4  # SiLU after the causal convolution
# Mamba-2 (Dao and Gu 2024, arXiv:2405.21060; the SSD kernels of mamba_ssm, which vLLM runs): the chunked
# form's default block size (mamba_ssm's chunk_size; a config's `chunk_size` replaces it), the recurrent
# step's FLOPs per state element (decay, the rank-1 update dt x B^T, the read C^T h) and the per-token
# elementwise FLOPs per head (softplus of dt, exp(dt A)) and per channel (the D skip, its add)
MAMBA2_CHUNK = LINEAR_CHUNK_DEFAULTS["mamba2"]
MAMBA2_STEP_FLOPS = 5
MAMBA2_HEAD_FLOPS = 8
MAMBA2_CHANNEL_FLOPS = 2

#: the module names `Precision.matrix_bytes(..., module=)` and `Precision.matmul_dtype(module)` take
MODULES = ("attention", "dense_mlp", "expert", "shared_expert", "router", "embedding", "lm_head")


def _chunk_prefix(m: Number, chunk: int) -> Number:
    """Sum over positions p = 0 .. m-1 of `p mod chunk + 1` (keys each query of a chunked layer sees)."""
    full, r = np.floor_divide(m, chunk), np.mod(m, chunk)
    return chunk * (chunk + 1) / 2 * full + r * (r + 1) / 2


def attended_pairs(q_len: Number, kv_len: Number, causal: bool, window: int | None = None,
                   chunk: int | None = None) -> Number:
    """(query, key) pairs a causal or full attention actually needs, per sequence and head.

    Causal with queries at the last `q_len` of `kv_len` positions: query i sees `kv_len - q_len + i + 1`
    keys, so the sum is `q_len * kv_len - q_len * (q_len - 1) / 2` (prefill: n(n+1)/2; decode: n).
    With a sliding `window` a query sees `min(keys, window)`: the sum of `min(n, W)` for n from
    `kv_len - q_len + 1` to `kv_len`. With a `chunk` (chunked attention) the query at position p sees
    `p mod C + 1` keys.
    """
    if chunk is not None:
        if not causal:
            return q_len * np.minimum(kv_len, chunk)
        return _chunk_prefix(kv_len, chunk) - _chunk_prefix(kv_len - q_len, chunk)
    if not causal:
        return q_len * (kv_len if window is None else np.minimum(kv_len, window))
    if window is None:
        return q_len * kv_len - q_len * (q_len - 1) / 2
    lo, hi = kv_len - q_len + 1, kv_len
    top = np.minimum(hi, window)  # n in [lo, top] contribute n; n in [max(lo, W+1), hi] contribute W
    below = np.maximum(top - lo + 1, 0) * (lo + top) / 2
    above = np.maximum(hi - np.maximum(lo, window + 1) + 1, 0) * window
    return below + above


def keys_read(q_len: Number, kv_len: Number, window: int | None = None, chunk: int | None = None) -> Number:
    """Keys (per sequence and KV head) a step must read: all of them; with a sliding window the
    `q_len + window - 1` most recent ones; with chunks those from the first query's chunk on."""
    if chunk is not None:
        return kv_len - np.floor_divide(kv_len - q_len, chunk) * chunk
    return kv_len if window is None else np.minimum(kv_len, q_len + window - 1)


@dataclass(frozen=True, kw_only=True)
class AttentionShape:
    """What an attention core computes, per sequence: `heads` query heads, a QK product `qk_dim` wide
    and a PV product `v_dim` wide per head; per key it reads `k_elems` elements for the scores,
    `v_elems` for the values, and `union_elems` in all when fused (MLA's absorbed form reads its latent
    once: V is part of K). `from_cache`: K and V are read from the KV cache (at `kv_bytes`), else
    they are activations (MLA's unabsorbed form materialises them). `latent`: MLA's, either form (its
    keys are not a GQA cache: a time model that prices a KV head's group does not apply)."""

    heads: int
    qk_dim: int
    v_dim: int
    k_elems: int
    v_elems: int
    union_elems: int
    from_cache: bool = True
    latent: bool = False

    @classmethod
    def gqa(cls, num_heads: int, num_kv_heads: int, head_dim: int, v_head_dim: int | None = None) -> AttentionShape:
        """The shape of grouped-query attention: `num_heads` query heads over `num_kv_heads` K/V heads of
        `head_dim` (values of `v_head_dim`, default `head_dim`)."""
        dv = head_dim if v_head_dim is None else v_head_dim
        return cls(heads=num_heads, qk_dim=head_dim, v_dim=dv, k_elems=num_kv_heads * head_dim,
                   v_elems=num_kv_heads * dv, union_elems=num_kv_heads * (head_dim + dv))


def attention_cost(batch: Number, q_len: Number, kv_len: Number, *, num_heads: int, num_kv_heads: int,
                   head_dim: int, act_bytes: float = 2.0, kv_bytes: float = 2.0, impl: str = "fused",
                   causal: bool = True, flops: str = "executed", window: int | None = None,
                   chunk: int | None = None, sinks: bool = False) -> OpCost:
    """The whole of attention as one operator (fused: FlashAttention / Flash-Decoding / PagedAttention;
    naive: the sum of score, softmax and value). The kernel benchmarks take their counts from here.

    Q is `(batch, num_heads, q_len, head_dim)`, K and V `(batch, num_kv_heads, kv_len, head_dim)`.
    """
    parts = attention_parts(batch, q_len, kv_len, num_heads=num_heads, num_kv_heads=num_kv_heads,
                            head_dim=head_dim, act_bytes=act_bytes, kv_bytes=kv_bytes, impl=impl,
                            causal=causal, flops=flops, window=window, chunk=chunk, sinks=sinks)
    if len(parts) == 1:
        return parts[0]
    total = {f: sum(getattr(p, f) for p in parts) for f in
             ("flops", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")}
    return OpCost(name="attention", kind="attention", rows=batch * q_len, **total)


def attention_parts(batch: Number, q_len: Number, kv_len: Number, *, num_heads: int, num_kv_heads: int,
                    head_dim: int, act_bytes: float, kv_bytes: float, impl: str, causal: bool,
                    flops: str = "executed", window: int | None = None, chunk: int | None = None,
                    sinks: bool = False, softcap: float | None = None) -> list[OpCost]:
    """Fused: `[attention]`. Naive: `[attn_score, (attn_softcap,) attn_softmax, attn_value]` with S and
    P in memory."""
    return attention_core(batch, q_len, kv_len, shape=AttentionShape.gqa(num_heads, num_kv_heads, head_dim),
                          act_bytes=act_bytes, kv_bytes=kv_bytes, impl=impl, causal=causal, flops=flops,
                          window=window, chunk=chunk, sinks=sinks, softcap=softcap)


def attention_core(batch: Number, q_len: Number, kv_len: Number, *, shape: AttentionShape, act_bytes: float,
                   kv_bytes: float, impl: str, causal: bool = True, flops: str = "executed",
                   window: int | None = None, chunk: int | None = None, sinks: bool = False,
                   softcap: float | None = None) -> list[OpCost]:
    """The attention core of any `AttentionShape` (GQA/MQA/MHA, MLA absorbed or not)."""
    if impl not in ATTENTION_IMPLS:
        raise SpecError(f"attention: must be one of {', '.join(ATTENTION_IMPLS)}, got {impl!r}")
    if flops not in FLOP_CONVENTIONS:
        raise SpecError(f"attention_flops: must be one of {', '.join(FLOP_CONVENTIONS)}, got {flops!r}")
    B, H, s = batch, shape.heads, shape
    keys = keys_read(q_len, kv_len, window, chunk)
    square = q_len * keys
    executed = (attended_pairs(q_len, kv_len, causal, window, chunk) if (impl == "fused" and flops == "executed")
                else square)
    q_bytes = B * q_len * H * s.qk_dim * act_bytes
    o_bytes = B * q_len * H * s.v_dim * act_bytes
    kv_el = kv_bytes if s.from_cache else act_bytes
    kv_field = "kv_read_bytes" if s.from_cache else "act_read_bytes"
    rows = B * q_len
    if impl == "fused":
        extra = (SOFTCAP_FLOPS * B * H * executed if softcap else 0.0) + (SINK_FLOPS * B * H * q_len if sinks else 0.0)
        counts = {"act_read_bytes": q_bytes, "kv_read_bytes": 0.0}
        counts[kv_field] = counts[kv_field] + B * keys * s.union_elems * kv_el
        # its shape on this GPU, for a time model that prices fused attention by shape (the context is
        # the keys it reads: a sliding layer's window)
        attn = AttnShape(batch=B, q_len=q_len, context=keys, heads=H, kv_heads=s.k_elems // s.qk_dim,
                         head_dim=s.qk_dim, latent=s.latent)
        return [OpCost(name="attention", kind="attention", flops=2 * B * H * executed * (s.qk_dim + s.v_dim) + extra,
                       act_write_bytes=o_bytes, rows=rows, attn=attn, **counts)]
    cols = keys + 1 if sinks else keys  # the sink is one more column of S and P
    s_bytes = B * H * q_len * cols * act_bytes  # the materialised score / probability matrix
    score = {"act_read_bytes": q_bytes, "kv_read_bytes": 0.0}
    score[kv_field] = score[kv_field] + B * keys * s.k_elems * kv_el
    value = {"act_read_bytes": s_bytes, "kv_read_bytes": 0.0}
    value[kv_field] = value[kv_field] + B * keys * s.v_elems * kv_el
    ops = [OpCost(name="attn_score", kind="attention", flops=2 * B * H * executed * s.qk_dim,
                  act_write_bytes=s_bytes, rows=rows, **score)]
    if softcap:
        ops.append(OpCost(name="attn_softcap", kind="elementwise", flops=SOFTCAP_FLOPS * B * H * square,
                          act_read_bytes=s_bytes, act_write_bytes=s_bytes, rows=rows))
    ops += [
        OpCost(name="attn_softmax", kind="elementwise", flops=SOFTMAX_FLOPS * B * H * q_len * cols,
               act_read_bytes=s_bytes, act_write_bytes=s_bytes, rows=rows),
        OpCost(name="attn_value", kind="attention", flops=2 * B * H * executed * s.v_dim,
               act_write_bytes=o_bytes, rows=rows, **value),
    ]
    return ops


@dataclass(frozen=True, kw_only=True)
class ShardDims:
    """Per-GPU sizes of one layer under tensor parallelism of degree `tp` (Megatron-LM: Shoeybi et al.
    2019, arXiv:1909.08053): query heads, FFN widths (dense, each routed and shared expert) and
    vocabulary are split; KV heads are split when `tp` divides them, else replicated so each GPU
    holds one (as vLLM does). MLA's latent cache is never split (one for all heads).

    Expert parallelism of degree `ep` (dividing `tp` and the number of experts): each GPU holds
    `num_experts / ep` routed experts, each split `tp / ep` ways. Data-parallel attention
    (`dp_attention`, SGLang's DP attention for MLA models): attention runs whole (heads and KV heads
    not split, its weights replicated) on each GPU's own share of the sequences; the shared experts
    are replicated too; dense FFNs stay split `tp` ways; MoE layers run expert-parallel over the
    group (`ep` = `tp`)."""

    tp: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int  # the dense FFN (dense models, dense layers of MoE models)
    vocab_size: int
    expert_ffn_size: int = 0  # one routed expert
    shared_ffn_size: int = 0  # every shared expert together (shared_experts * shared_expert_ffn_size)
    ep: int = 1
    dp_attention: bool = False
    attn_tp: int = 1  # ways attention is split (tp, or 1 with dp_attention)
    local_experts: int = 1  # routed experts on each GPU (num_experts / ep)
    linear_key_heads: int = 0  # Gated DeltaNet heads on each GPU (split like attention heads)
    linear_value_heads: int = 0

    @classmethod
    def of(cls, model: ModelSpec, tp: int = 1, ep: int = 1, dp_attention: bool = False) -> ShardDims:
        """The per-GPU dimensions of `model` split `tp` ways (experts `ep` ways; attention whole per GPU with
        `dp_attention`); a degree that does not divide what it splits is refused."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise SpecError(f"tp: must be a positive integer, got {tp!r}")
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
            raise SpecError(f"ep: must be a positive integer, got {ep!r}")
        if not isinstance(dp_attention, bool):
            raise SpecError(f"dp_attention: must be true or false, got {dp_attention!r}")
        if ep > 1 and not model.is_moe:
            raise SpecError(f"ep: {ep} needs a mixture-of-experts model, {model.name} has no experts")
        if tp % ep:
            raise SpecError(f"ep: {ep} does not divide tp={tp} (experts are split over the tensor-parallel group)")
        if model.is_moe and model.num_experts % ep:
            raise SpecError(f"ep: {ep} does not divide {model.name}'s num_experts={model.num_experts}")
        if dp_attention and model.is_moe and ep != tp:
            raise SpecError(f"ep: {ep} must equal tp={tp} with dp_attention (the MoE layers run expert-parallel "
                            "over the group)")
        attn_tp = 1 if dp_attention else tp
        if model.num_heads % attn_tp:
            raise SpecError(f"tp: {tp} does not divide {model.name}'s num_heads={model.num_heads}")
        if not model.is_mla and model.num_kv_heads % attn_tp and attn_tp % model.num_kv_heads:
            raise SpecError(f"tp: {tp} neither divides nor is a multiple of {model.name}'s "
                            f"num_kv_heads={model.num_kv_heads}")
        if model.has_linear_layers:
            for f in ("linear_num_key_heads", "linear_num_value_heads"):
                if getattr(model, f) % attn_tp:
                    raise SpecError(f"tp: {tp} does not divide {model.name}'s {f}={getattr(model, f)}")
        expert_tp = tp // ep
        shared = model.shared_experts * model.shared_expert_ffn_size if model.is_moe else 0
        shared_tp = 1 if dp_attention else tp
        widths = [("ffn_size", model.ffn_size, tp)]
        if model.is_moe:
            widths.append(("expert_ffn_size", model.expert_ffn_size, expert_tp))
        if shared:
            widths.append(("shared_experts x shared_expert_ffn_size", shared, shared_tp))
        for label, width, ways in widths:
            if width % ways:
                raise SpecError(f"tp: {ways} does not divide {model.name}'s {label}={width}")
        return cls(tp=tp, num_heads=model.num_heads // attn_tp,
                   num_kv_heads=max(1, model.num_kv_heads // attn_tp),
                   ffn_size=model.ffn_size // tp, vocab_size=-(-model.vocab_size // tp),
                   expert_ffn_size=(model.expert_ffn_size // expert_tp if model.is_moe else 0),
                   shared_ffn_size=shared // shared_tp, ep=ep, dp_attention=dp_attention, attn_tp=attn_tp,
                   local_experts=model.num_experts // ep,
                   linear_key_heads=(model.linear_num_key_heads or 0) // attn_tp,
                   linear_value_heads=(model.linear_num_value_heads or 0) // attn_tp)


@dataclass(frozen=True, kw_only=True)
class ForwardModel:
    """Cost functions of every operator of `model` at `precision`, on one GPU of a `tp`-way group
    (`ep`: its experts split over the group; `dp_attention`: its attention data-parallel over it).

    Each method has the signature `(batch, q_len, kv_len)` and returns an `OpCost` for one layer
    (per-layer operators) or for the whole model (`embed`, `pos_embed`, `final_norm`, `lm_head`).
    Per-layer methods take the layer's `kind` (default: the model's first layer kind); `layer_ops`
    and `forward_ops` take the group's batch (with `dp_attention`, attention operators count the
    busiest GPU's `local_batch` of it). `mla_mode` picks MLA's computation (module docstring).
    """

    model: ModelSpec
    precision: Precision
    attention: str = "fused"
    tp: int = 1
    all_logits: bool = False
    attention_flops: str = "executed"
    fused_qkv: bool = False  # one qkv_proj GEMM instead of q_proj, k_proj, v_proj
    fused_gate_up: bool = False  # one gate_up_proj GEMM instead of gate_proj, up_proj (gated FFNs)
    mla_mode: str = "auto"  # MLA: auto (unabsorbed prefill, absorbed decode) | absorbed | unabsorbed
    ep: int = 1  # expert parallelism within the tp group (divides tp and num_experts)
    dp_attention: bool = False  # attention data-parallel over the tp group (each GPU its own sequences)
    expert_load: ExpertLoad | None = None  # a measured router's load (None: uniform routing)
    eplb: int | None = None  # EPLB's redundant experts per MoE layer (None: experts placed contiguously)

    def __post_init__(self) -> None:
        for flag in ("all_logits", "fused_qkv", "fused_gate_up"):
            if not isinstance(getattr(self, flag), bool):
                raise SpecError(f"{flag}: must be true or false, got {getattr(self, flag)!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise SpecError(f"attention: must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention!r}")
        if self.attention_flops not in FLOP_CONVENTIONS:
            raise SpecError(f"attention_flops: must be one of {', '.join(FLOP_CONVENTIONS)}, "
                            f"got {self.attention_flops!r}")
        if self.mla_mode not in MLA_MODES:
            raise SpecError(f"mla_mode: must be one of {', '.join(MLA_MODES)}, got {self.mla_mode!r}")
        if self.model.is_v4_attention and self.tp > 1 and not self.dp_attention:
            raise SpecError(f"tp: DeepSeek-V4's attention ({self.model.name}, o_groups) is not split by heads here: "
                            f"tp={self.tp} needs dp_attention (attention whole on each GPU, its own sequences; the "
                            "experts expert-parallel, ep = tp)")
        object.__setattr__(self, "dims", ShardDims.of(self.model, self.tp, self.ep, self.dp_attention))
        object.__setattr__(self, "routing", measured_routing(self.model, self.ep, self.expert_load, self.eplb))
        # DeepSeek-V4: its window and compressed entries are counted by its own operators (`v4_kv_write`,
        # `compress_pool`), its cache's size by `deepseek_v4_cache_elements`
        object.__setattr__(self, "kv_spec", None if self.model.is_v4_attention
                           else self.model.kv_cache(self.precision).sharded(tp=self.dims.attn_tp))
        object.__setattr__(self, "groups", self.model.layer_groups())
        object.__setattr__(self, "sections", _sections(self.groups))
        object.__setattr__(self, "_weights", {})  # (d_in, d_out, bias, module) -> (bytes, matmul dtype)
        object.__setattr__(self, "_views", {})  # Gemma 4's full layers: the forward model as they see the model

    def _for_kind(self, kind: LayerKind | None) -> ForwardModel:
        """This forward model as a layer of `kind` sees the model (`ModelSpec.attention_view`: Gemma 4's full
        layers price their attention at their own head dim and KV heads); itself for every other layer."""
        if kind is None or not kind.global_shape:
            return self
        return self._view("global", lambda: self.model.attention_view(kind))

    def _view(self, key: str, model: Callable[[], ModelSpec]) -> ForwardModel:
        """This forward model over the `model()` a part of some layers sees (built once per `key`)."""
        view = self._views.get(key)
        if view is None:
            seen = model()
            view = self._views[key] = self if seen == self.model else replace(self, model=seen)
        return view

    # ---- helpers -------------------------------------------------------------------------------
    def _matrix_bytes(self, d_in: int, d_out: int, module: str) -> float:
        """Bytes of one `d_in x d_out` weight matrix of `module` (one of `MODULES`): THE place where
        per-module weight formats are wired in."""
        p = self.precision
        if module in ("embedding", "lm_head"):
            return p.embedding_matrix_bytes(d_in, d_out)
        return p.matrix_bytes(d_in, d_out, module=module)

    def _matmul_dtype(self, module: str) -> str | None:
        """The format `module`'s matrix products run in, when the precision says so per module
        (`Precision.matmul_dtype`); None: the phase's compute format."""
        return self.precision.matmul_dtype(module)

    def _linear(self, name: str, tokens: Number, d_in: int, d_out: int, bias: bool,
                weight_copies: Number = 1.0, per_layer: bool = True, rows: Number | None = None,
                module: str = "attention", gemm: GemmShape | None | bool = True) -> OpCost:
        """`tokens x d_in @ d_in x d_out`; `weight_copies` distinct weight matrices are read (MoE);
        the matrix is stored at `module`'s format (`MODULES`). `gemm`: its per-GPU GEMM shape (True:
        one GEMM of `tokens` rows, N = d_out, K = d_in; False: none, for a GEMM whose rows depend on
        the context)."""
        p = self.precision
        key = (d_in, d_out, bias, module)
        hit = self._weights.get(key)
        if hit is None:  # the matrix's bytes, format and plain GEMM shape depend on its shape and module only
            w = self._matrix_bytes(d_in, d_out, module) + (d_out * p.act_bytes if bias else 0.0)
            hit = self._weights[key] = (w, self._matmul_dtype(module), GemmShape(n=d_out, k=d_in))
        w, dtype, plain = hit
        if gemm is True:
            gemm = plain
        return OpCost(name=name, kind="matmul", flops=2 * tokens * d_in * d_out + (tokens * d_out if bias else 0),
                      weight_bytes=w * weight_copies, act_read_bytes=tokens * d_in * p.act_bytes,
                      act_write_bytes=tokens * d_out * p.act_bytes, per_layer=per_layer,
                      rows=tokens if rows is None else rows, compute_dtype=dtype, gemm=gemm or None)

    def _norm(self, name: str, tokens: Number, per_layer: bool = True, width: int | None = None,
              kind: str | None = None, weights: int = 1) -> OpCost:
        """A norm over `width` (default hidden) elements per row, `tokens` rows; `weights` weight
        vectors of `width` (q/k norms share one per tensor)."""
        m, a = self.model, self.precision.act_bytes
        width = m.hidden_size if width is None else width
        kind = m.norm_kind if kind is None else kind
        n_w = 0 if kind == "l2" else (2 if kind == "layernorm" else 1) * weights
        return OpCost(name=name, kind="norm", flops=NORM_FLOPS[kind] * tokens * width,
                      weight_bytes=n_w * width * a, act_read_bytes=tokens * width * a,
                      act_write_bytes=tokens * width * a, per_layer=per_layer, rows=tokens)

    def _elementwise(self, name: str, rows: Number, width: Number, flops_per: float, reads: int = 1,
                     per_layer: bool = True) -> OpCost:
        a = self.precision.act_bytes
        return OpCost(name=name, kind="elementwise", flops=flops_per * rows * width,
                      act_read_bytes=reads * rows * width * a, act_write_bytes=rows * width * a,
                      per_layer=per_layer, rows=rows)

    def _residual(self, name: str, tokens: Number) -> OpCost:
        """A residual add of `tokens` rows (Granite: the sublayer's output times `residual_multiplier` first,
        fused: one multiply and one add an element)."""
        h, a = self.model.hidden_size, self.precision.act_bytes
        per = 1 if self.model.residual_multiplier == 1.0 else 2
        return OpCost(name=name, kind="elementwise", flops=per * tokens * h, act_read_bytes=2 * tokens * h * a,
                      act_write_bytes=tokens * h * a, rows=tokens)

    def _allreduce(self, name: str, tokens: Number) -> OpCost:
        """Ring all-reduce of the `tokens x hidden` activations: each GPU sends 2(t-1)/t of them."""
        t = self.tp
        msg = tokens * self.model.hidden_size * self.precision.act_bytes
        return OpCost(name=name, kind="comm", flops=tokens * self.model.hidden_size * (t - 1) / t,
                      comm_bytes=2 * (t - 1) / t * msg, rows=tokens, comm_gpus=int(t))

    def local_batch(self, batch: Number) -> Number:
        """Sequences whose attention one GPU runs: all of them, or with `dp_attention` its share
        (the busiest GPU's: `ceil(batch / tp)`)."""
        return np.ceil(batch / self.tp) if self.dp_attention and self.tp > 1 else batch

    def _all_to_all(self, name: str, batch: Number, q_len: Number) -> OpCost:
        """Expert parallelism with data-parallel attention: each of a GPU's own tokens sends its k expert
        copies of its hidden state to the GPUs of its experts (`moe_dispatch`), and they come back
        (`moe_combine`); (ep - 1) / ep of them cross between GPUs. The busiest GPU moves the larger of
        what it sends and the routed rows its experts receive (`busiest_expert_load`)."""
        m, e = self.model, self.ep
        tokens = self.local_batch(batch) * q_len
        received, _, _, _ = self._ffn_shape(batch, q_len, "routed")
        rows = np.maximum(tokens * m.experts_per_token, received)
        rows = float(rows) if np.ndim(rows) == 0 else rows
        msg = rows * m.expert_model_dim * self.precision.act_bytes  # a latent MoE sends its latent rows
        return OpCost(name=name, kind="comm", comm_bytes=msg * (e - 1) / e, rows=tokens, comm_gpus=int(e))

    def _kind(self, kind: LayerKind | None) -> LayerKind:
        return self.groups[0][0] if kind is None else kind

    @property
    def head_dim(self) -> int:
        return self.model.head_dim

    def absorbed(self, q_len: Number) -> Number:
        """MLA: whether a step of `q_len` new tokens per sequence runs the absorbed form (a bool, or
        an array of them for array `q_len` under `mla_mode="auto"`)."""
        if self.mla_mode != "auto":
            return self.mla_mode == "absorbed"
        out = np.asarray(q_len) == 1
        return bool(out) if out.ndim == 0 else out

    # ---- operators, in forward order -------------------------------------------------------------
    def embed(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The token-embedding gather: one row of the table read and written per token."""
        tokens = batch * q_len
        h, p = self.model.hidden_size, self.precision
        return OpCost(name="embed", kind="embedding", weight_bytes=tokens * h * p.embedding_bytes,
                      act_write_bytes=tokens * h * p.act_bytes, per_layer=False, rows=tokens)

    def embed_allreduce(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Tensor parallelism: each GPU holds `vocab / tp` rows of the embedding (`ShardDims.vocab_size`),
        looks up the tokens in its range (zero rows for the others) and the `tokens x hidden` partial
        embeddings are all-reduced at the activation dtype (Megatron-LM's and vLLM's
        `VocabParallelEmbedding.forward`: mask, `F.embedding`, `tensor_model_parallel_all_reduce`). With
        `dp_attention` the group's tokens, as its dense FFN's collective (the embedding stays vocabulary-split:
        `rollup.stage_weight_bytes`; SGLang would replicate it instead and need no collective)."""
        return replace(self._allreduce("embed_allreduce", batch * q_len), per_layer=False)

    def pos_embed(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Learned positions (GPT-2, OPT): one row of the position table read and added per token."""
        tokens = batch * q_len
        h, p = self.model.hidden_size, self.precision
        return OpCost(name="pos_embed", kind="embedding", flops=tokens * h,
                      weight_bytes=tokens * h * p.embedding_bytes, act_read_bytes=tokens * h * p.act_bytes,
                      act_write_bytes=tokens * h * p.act_bytes, per_layer=False, rows=tokens)

    def embed_scale(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gemma: the embedding times sqrt(hidden_size); Granite: times its `embedding_multiplier`; one multiply
        per element."""
        return self._elementwise("embed_scale", batch * q_len, self.model.hidden_size, 1, per_layer=False)

    def attn_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The norm before attention, over the hidden size of every token."""
        return self._norm("attn_norm", batch * q_len)

    def q_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The query projection, hidden -> heads x head_dim (MLA without `q_lora_rank`: heads x (nope +
        rope))."""
        m = self.model
        width = m.mla_q_head_dim if m.is_mla else self.head_dim * (2 if m.attn_output_gate else 1)
        return self._linear("q_proj", batch * q_len, m.hidden_size, self.dims.num_heads * width, m.qkv_bias)

    def qkv_proj(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """Q, K and V as one GEMM over the concatenated weight: the input is read once (with an output
        gate, q_proj's gate half too; a Gemma 4 full layer with K = V: Q and K; a KV-shared layer: Q alone)."""
        m = self.model
        q_heads = self.dims.num_heads * (2 if m.attn_output_gate else 1)
        kv = m.kv_projections(self._kind(kind))
        return self._linear("qkv_proj", batch * q_len, m.hidden_size,
                            (q_heads + kv * self.dims.num_kv_heads) * self.head_dim, m.qkv_bias)

    def k_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The key projection, hidden -> kv_heads x head_dim (this GPU's heads)."""
        return self._linear("k_proj", batch * q_len, self.model.hidden_size,
                            self.dims.num_kv_heads * self.head_dim, self.model.qkv_bias)

    def v_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The value projection, hidden -> kv_heads x head_dim (this GPU's heads)."""
        return self._linear("v_proj", batch * q_len, self.model.hidden_size,
                            self.dims.num_kv_heads * self.head_dim, self.model.qkv_bias)

    # MLA projections
    def q_a_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MLA: hidden -> q_lora_rank (replicated on every tensor-parallel rank)."""
        m = self.model
        return self._linear("q_a_proj", batch * q_len, m.hidden_size, m.q_lora_rank, m.qkv_bias)

    def q_a_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MLA: the norm over the `q_lora_rank` query latent."""
        return self._norm("q_a_norm", batch * q_len, width=self.model.q_lora_rank)

    def q_b_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MLA: q_lora_rank -> heads x (qk_nope_head_dim + qk_rope_head_dim)."""
        m = self.model
        return self._linear("q_b_proj", batch * q_len, m.q_lora_rank, self.dims.num_heads * m.mla_q_head_dim, False)

    def kv_a_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MLA: hidden -> kv_lora_rank + qk_rope_head_dim (the latent and the shared rotary key;
        replicated on every tensor-parallel rank)."""
        m = self.model
        return self._linear("kv_a_proj", batch * q_len, m.hidden_size, m.kv_lora_rank + m.qk_rope_head_dim,
                            m.qkv_bias)

    def kv_a_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MLA: the norm over the `kv_lora_rank` KV latent."""
        return self._norm("kv_a_norm", batch * q_len, width=self.model.kv_lora_rank)

    def kv_b_proj(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """MLA unabsorbed: latent -> heads x (qk_nope_head_dim + v_head_dim) for every key the step
        attends to; the latents of the cached keys (beyond the `q_len` new ones) come from the cache."""
        m, p = self.model, self.precision
        keys = self._keys(q_len, kv_len, kind)
        rows = batch * keys
        # no GEMM shape: its M (every key attended) grows with the context, and a time model must not
        op = self._linear("kv_b_proj", rows, m.kv_lora_rank,
                          self.dims.num_heads * (m.qk_nope_head_dim + m.v_head_dim), False, rows=batch * q_len,
                          gemm=False)
        cached = batch * (keys - q_len) * m.kv_lora_rank
        return replace(op, act_read_bytes=op.act_read_bytes - cached * p.act_bytes,
                       kv_read_bytes=cached * p.kv_bytes)

    def q_absorb(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MLA absorbed: each head's q_nope times W_UK (qk_nope_head_dim -> kv_lora_rank). No GEMM
        shape (a batched GEMM of `heads` groups): the serving step model prices it with the attention
        core, as counts linear in the step's features, which a shape's time is not (kv_b_proj and
        v_absorb likewise); they keep the matmul kind's per-rows curves."""
        m, tokens, n = self.model, batch * q_len, self.dims.num_heads
        return self._linear("q_absorb", tokens * n, m.qk_nope_head_dim, m.kv_lora_rank, False, weight_copies=n,
                            rows=tokens, gemm=False)

    def v_absorb(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MLA absorbed: each head's attention output over the latent times W_UV (kv_lora_rank -> v_head_dim)."""
        m, tokens, n = self.model, batch * q_len, self.dims.num_heads
        return self._linear("v_absorb", tokens * n, m.kv_lora_rank, m.v_head_dim, False, weight_copies=n,
                            rows=tokens, gemm=False)

    def qk_norm(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """RMSNorm (or a weightless L2 norm) over head_dim of every query and key head (Gemma 4: and a weightless
        one of every value head); MiniMax-M2's (`rmsnorm_across_heads`) over all of a token's query heads and all
        its key heads at once, the same elements and FLOPs with a weight for each element (this GPU's heads'); a
        KV-shared layer's of its queries alone."""
        d = self.dims
        heads = d.num_heads + d.num_kv_heads * (2 if self.model.v_norm else 1)  # Gemma 4: a weightless V norm
        if self._kind(kind).kv_shared:  # Gemma 4: the queries alone (K and V come from an earlier layer's cache)
            return self._norm("qk_norm", batch * q_len * d.num_heads, width=self.head_dim, kind=self.model.qk_norm)
        if self._qk_gathered:  # every GPU norms all the heads, gathered (`qk_norm_gather`)
            heads = self.model.num_heads + self.model.num_kv_heads
        if self.model.qk_norm == "rmsnorm_across_heads":
            return self._norm("qk_norm", batch * q_len * heads, width=self.head_dim, kind="rmsnorm", weights=heads)
        return self._norm("qk_norm", batch * q_len * heads, width=self.head_dim, kind=self.model.qk_norm,
                          weights=2)

    @property
    def _qk_gathered(self) -> bool:
        """OLMo 2/3's q/k norm under tensor parallelism: q and k gathered whole onto every GPU first."""
        return self.model.qk_norm_gathered and self.tp > 1 and not self.dp_attention

    def qk_norm_gather(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """OLMo 2/3 under tensor parallelism: each GPU's query and key heads all-gathered so that every GPU
        norms all of them with the whole weight, then keeps its own (vLLM's `Olmo2Attention._apply_qk_norm`):
        each GPU receives `(tp - 1) / tp` of the tokens' full q and k, in the activation dtype."""
        t, m, tokens = self.tp, self.model, self.local_batch(batch) * q_len
        width = (m.num_heads + m.num_kv_heads) * m.head_dim
        return OpCost(name="qk_norm_gather", kind="comm",
                      comm_bytes=(t - 1) / t * tokens * width * self.precision.act_bytes, rows=tokens,
                      comm_gpus=int(t))

    def qk_norm_allreduce(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """MiniMax-M2 under tensor parallelism: each GPU holds some heads, so the q and k norms' variances
        are summed across the group, one all-reduce of two fp32 values a token (vLLM's
        `MiniMaxText01RMSNormTP.forward_qk`)."""
        t, tokens = self.tp, self.local_batch(batch) * q_len
        return OpCost(name="qk_norm_allreduce", kind="comm", flops=tokens * 2 * (t - 1) / t,
                      comm_bytes=2 * (t - 1) / t * tokens * 2 * FP32_BYTES, rows=tokens, comm_gpus=int(t))

    def rope(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """Rotary positions applied to every query head and every K head of each token (MLA: the rotary parts
        and the one shared rotary key; a KV-shared layer: the queries alone)."""
        tokens, a, m = batch * q_len, self.precision.act_bytes, self.model
        if m.is_mla:  # every query head's rotary part and the one shared rotary key
            rotated = tokens * (self.dims.num_heads + 1) * m.qk_rope_head_dim
        else:
            k_heads = 0 if self._kind(kind).kv_shared else self.dims.num_kv_heads
            rotated = tokens * (self.dims.num_heads + k_heads) * m.rotary_dim
        return OpCost(name="rope", kind="elementwise", flops=ROPE_FLOPS * rotated,
                      act_read_bytes=rotated * a, act_write_bytes=rotated * a, rows=tokens)

    def kv_write(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The new tokens' K and V (MLA: latent and rotary key) appended to the cache (read at
        activation, written at KV precision)."""
        tokens = batch * q_len
        if self.model.is_mla:  # one latent for all heads: not split by tensor parallelism
            values = tokens * self.model.kv_width_per_token_per_layer
            return OpCost(name="kv_write", kind="elementwise", act_read_bytes=values * self.precision.act_bytes,
                          kv_write_bytes=values * self.precision.kv_bytes, rows=tokens)
        kv = self.kv_spec  # the one KV formula: 2 (K and V) x KV heads per GPU x head_dim x bytes
        values = tokens * kv.bytes_per_token_per_layer / kv.element_bytes
        return OpCost(name="kv_write", kind="elementwise", act_read_bytes=values * self.precision.act_bytes,
                      kv_write_bytes=tokens * kv.bytes_per_token_per_layer, rows=tokens)

    def _span(self, kind: LayerKind | None) -> tuple[int | None, int | None]:
        """(window, chunk) of a layer kind's attention; DeepSeek Sparse Attention's main attention reads
        `index_topk` keys a query, counted as a window of that many (the pairs and keys of each query; the
        keys it picks need not be the latest, which changes no count)."""
        k = self._kind(kind)
        if self.model.is_sparse_attention:
            return (self.model.index_topk, None)
        return (k.window if k.attention == "sliding" else None, k.window if k.attention == "chunked" else None)

    def _keys(self, q_len: Number, kv_len: Number, kind: LayerKind | None) -> Number:
        window, chunk = self._span(kind)
        return keys_read(q_len, kv_len, window, chunk)

    def attention_shape(self, absorbed: bool) -> AttentionShape:
        """The attention core of this model on one GPU (MLA: `absorbed` or not)."""
        m, d = self.model, self.dims
        if not m.is_mla:
            return AttentionShape.gqa(d.num_heads, d.num_kv_heads, self.head_dim)
        n, r, dr = d.num_heads, m.kv_lora_rank, m.qk_rope_head_dim
        if absorbed:  # MQA over the latent: K = [c_KV, k_R] (r + dr), V = c_KV (r), read once
            return AttentionShape(heads=n, qk_dim=r + dr, v_dim=r, k_elems=r + dr, v_elems=r, union_elems=r + dr,
                                  latent=True)
        qk = m.mla_q_head_dim  # materialised per-head K (nope + the shared rope key) and V
        return AttentionShape(heads=n, qk_dim=qk, v_dim=m.v_head_dim, k_elems=n * qk, v_elems=n * m.v_head_dim,
                              union_elems=n * (qk + m.v_head_dim), from_cache=False, latent=True)

    def attention_ops(self, batch: Number, q_len: Number, kv_len: Number,
                      kind: LayerKind | None = None) -> list[OpCost]:
        """`[attention]` (fused) or `[attn_score, (attn_softcap,) attn_softmax, attn_value]` (naive); a
        Gated DeltaNet layer's core: `[deltanet]`."""
        if self._for_kind(kind) is not self:
            return self._for_kind(kind).attention_ops(batch, q_len, kv_len, kind)
        m = self.model
        if self._kind(kind).attention == "linear":
            return [self.ssd(batch, q_len, kv_len) if m.is_mamba else self.deltanet(batch, q_len, kv_len)]
        if self._kind(kind).attention == "none":
            return []
        if m.is_v4_attention:
            return self.v4_attention_ops(batch, q_len, kv_len, kind=kind)
        window, chunk = self._span(kind)
        kw = dict(act_bytes=self.precision.act_bytes, kv_bytes=self.precision.kv_bytes, impl=self.attention,
                  causal=True, flops=self.attention_flops, window=window, chunk=chunk, sinks=m.attn_sinks,
                  softcap=m.attn_softcap)
        if not m.is_mla:
            return attention_core(batch, q_len, kv_len, shape=self.attention_shape(False), **kw)
        absorbed = self.absorbed(q_len)
        if isinstance(absorbed, bool):
            return attention_core(batch, q_len, kv_len, shape=self.attention_shape(absorbed), **kw)
        # auto over an array of q_len: each row takes its own form (same operator names either way)
        a = attention_core(batch, q_len, kv_len, shape=self.attention_shape(True), **kw)
        u = attention_core(batch, q_len, kv_len, shape=self.attention_shape(False), **kw)
        return [_where(absorbed, x, y) for x, y in zip(a, u)]

    def attn_gate(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Qwen3-Next / Qwen3.5 full attention: its output times sigmoid(gate), gate from q_proj."""
        return self._elementwise("attn_gate", batch * q_len, self.dims.num_heads * self.head_dim, GATE_FLOPS, reads=2)

    def o_proj(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """The attention output projection, heads x head_dim (MLA: v_head_dim) -> hidden; in a Gated
        DeltaNet layer (`kind` linear) its out_proj, value heads x value head dim -> hidden."""
        m = self.model
        if kind is not None and kind.attention == "linear":
            width = self.dims.linear_value_heads * m.linear_value_head_dim  # type: ignore[operator]
            return self._linear("o_proj", batch * q_len, width, m.hidden_size, m.linear_proj_bias)
        width = m.v_head_dim if m.is_mla else self.head_dim
        return self._linear("o_proj", batch * q_len, self.dims.num_heads * width, m.hidden_size, m.out_bias)

    # ---- DeepSeek Sparse Attention's lightning indexer --------------------------------------------------
    def index_q_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DSA: the indexer's queries from the compressed query, q_lora_rank -> index heads x index head dim
        (the indexer is replicated on every tensor-parallel rank, as vLLM runs it)."""
        m = self.model
        return self._linear("index_q_proj", batch * q_len, m.q_lora_rank, m.index_n_heads * m.index_head_dim,
                            False)

    def index_k_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DSA: the indexer's key (index head dim) and its heads' weights (index heads), from the hidden state."""
        m = self.model
        return self._linear("index_k_proj", batch * q_len, m.hidden_size, m.index_head_dim + m.index_n_heads, False)

    def index_k_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DSA: LayerNorm of each new token's indexer key."""
        return self._norm("index_k_norm", batch * q_len, width=self.model.index_head_dim, kind="layernorm")

    def index_write(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DSA: each new token's indexer key into its cache, fp8 and its scale (`KVCacheSpec.index_bytes_per_token`)."""
        tokens = batch * q_len
        return OpCost(name="index_write", kind="elementwise",
                      act_read_bytes=tokens * self.model.index_head_dim * self.precision.act_bytes,
                      kv_write_bytes=tokens * self.kv_spec.index_bytes_per_token, rows=tokens)

    def index_score(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DSA: every query's score against every key it may see (causal, the whole context), in fp8 (DeepSeek's
        `fp8_index`, vLLM's `fp8_mqa_logits`): per (query, key) pair and index head a dot product of index head
        dim (2 d FLOPs), then ReLU, the head's weight and the sum over heads (3 FLOPs); the sequence's cached
        indexer keys read once, the fp32 scores written."""
        m = self.model
        hi, di, tokens = m.index_n_heads, m.index_head_dim, batch * q_len
        pairs = batch * attended_pairs(q_len, kv_len, causal=True)
        return OpCost(name="index_score", kind="attention", flops=pairs * hi * (2 * di + 3),
                      act_read_bytes=tokens * hi * (di + FP32_BYTES),
                      kv_read_bytes=batch * keys_read(q_len, kv_len) * self.kv_spec.index_bytes_per_token,
                      act_write_bytes=pairs * FP32_BYTES, rows=tokens, compute_dtype="fp8")

    def index_topk(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DSA: each query's `index_topk` keys from its scores (one compare a score; the indices written as int32)."""
        m = self.model
        pairs = batch * attended_pairs(q_len, kv_len, causal=True)
        tokens = batch * q_len
        return OpCost(name="index_topk", kind="elementwise", flops=pairs, act_read_bytes=pairs * FP32_BYTES,
                      act_write_bytes=tokens * m.index_topk * FP32_BYTES, rows=tokens)

    def indexer_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """DSA's lightning indexer, in forward order (DeepSeek-V3.2; arXiv:2512.02556)."""
        args = (batch, q_len, kv_len)
        return [self.index_q_proj(*args), self.index_k_proj(*args), self.index_k_norm(*args), self.index_write(*args),
                self.index_score(*args), self.index_topk(*args)]

    # ---- DeepSeek-V4 (transformers' modeling_deepseek_v4; counts of an efficient kernel, docs/model.md) -------
    def _v4_width(self, kind: LayerKind | None) -> int:
        """Elements one token leaves in the window of a layer of `kind`: K = V once in a csa / hca layer, K and
        V apart in a sliding layer (transformers' DynamicSlidingWindowLayer keeps both)."""
        return self.head_dim * (2 if self._kind(kind).attention == "sliding" else 1)

    def _v4_rate(self, kind: LayerKind | None) -> int | None:
        """Tokens per compressed entry of a layer of `kind` (csa_rate, hca_rate; None: a sliding layer)."""
        return {"csa": self.model.csa_rate, "hca": self.model.hca_rate}.get(self._kind(kind).attention)

    def hc_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4's hyper-connection (before attention, before the FFN): the `hc_mult` streams, flattened
        and RMS-normed, times its fp32 `fn`, n x hidden -> (2 + n) n mixing logits (pre, post, comb), in fp32.
        No GEMM shape: a (2 + n) n-wide product an efficient kernel fuses with the norm (DeepSeek's reference
        fuses the hyper-connection's norm, product and Sinkhorn); the matmul kind's per-rows curves price it."""
        m, tokens = self.model, batch * q_len
        n, h = m.hc_mult, m.hidden_size
        d_in, d_out = n * h, (2 + n) * n
        return OpCost(name="hc_proj", kind="matmul", flops=2 * tokens * d_in * d_out,
                      weight_bytes=(d_in * d_out + d_out + 3) * FP32_BYTES, act_read_bytes=tokens * d_in * FP32_BYTES,
                      act_write_bytes=tokens * d_out * FP32_BYTES, rows=tokens,
                      gemm=None)

    def hc_pre(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The hyper-connection's small operators: the streams' weightless RMSNorm (before `hc_proj`), the
        sigmoids of pre and post, comb's softmax and `hc_sinkhorn_iters` Sinkhorn normalisations (a column, then
        row and column ones, 2 FLOPs an element each), and the streams collapsed by pre into the sublayer's input."""
        m, a, tokens = self.model, self.precision.act_bytes, batch * q_len
        n, h, it = m.hc_mult, m.hidden_size, m.hc_sinkhorn_iters
        small = 2 * n * 5 + n * n * (SOFTMAX_FLOPS + 1) + 2 * n * n * max(2 * it - 1, 0)
        flops = tokens * (3 * n * h + small + 2 * n * h)
        return OpCost(name="hc_pre", kind="elementwise", flops=flops, act_read_bytes=2 * tokens * n * h * a,
                      act_write_bytes=tokens * h * a, rows=tokens)

    def hc_post(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The hyper-connection's mixing after the sublayer: post x output + comb^T @ streams, each of the n
        streams (2 n^2 hidden + 2 n hidden FLOPs a token: transformers' `torch.matmul` of comb and the streams)."""
        m, a, tokens = self.model, self.precision.act_bytes, batch * q_len
        n, h = m.hc_mult, m.hidden_size
        return OpCost(name="hc_post", kind="elementwise", flops=tokens * (2 * n * n * h + 2 * n * h),
                      act_read_bytes=tokens * (n + 1) * h * a, act_write_bytes=tokens * n * h * a, rows=tokens)

    def hc_head(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The hyper-head before the final norm, on the rows that need logits: the streams RMS-normed, times
        hc_fn (n x hidden -> n, fp32), sigmoid, collapsed to one hidden vector."""
        m, a, rows = self.model, self.precision.act_bytes, self._logit_rows(batch, q_len)
        n, h = m.hc_mult, m.hidden_size
        return OpCost(name="hc_head", kind="matmul", flops=rows * (2 * n * h * n + 3 * n * h + 6 * n + 2 * n * h),
                      weight_bytes=(n * n * h + n + 1) * FP32_BYTES, act_read_bytes=rows * n * h * a,
                      act_write_bytes=rows * h * a, per_layer=False, rows=rows, compute_dtype="fp32")

    def v4_q_b_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4: q_lora_rank -> heads x head_dim (named `q_b_proj`)."""
        m = self.model
        return self._linear("q_b_proj", batch * q_len, m.q_lora_rank, m.num_heads * self.head_dim, False)

    def v4_q_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4: the weightless RMSNorm over head_dim of every query head (named `qk_norm`)."""
        return self._norm("qk_norm", batch * q_len * self.model.num_heads, width=self.head_dim, kind="l2")

    def kv_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4: hidden -> the one head_dim vector read as both K and V."""
        return self._linear("kv_proj", batch * q_len, self.model.hidden_size, self.head_dim, False)

    def kv_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4: the RMSNorm of that K = V vector."""
        return self._norm("kv_norm", batch * q_len, width=self.head_dim)

    def v4_rope(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4's partial rotary (the last `rotary_dim` of each head): every query head and the K = V head,
        and its inverse on every head of the attention output (K = V carried the rotation into V)."""
        tokens, a, m = batch * q_len, self.precision.act_bytes, self.model
        rotated = tokens * (2 * m.num_heads + 1) * m.rotary_dim
        return OpCost(name="rope", kind="elementwise", flops=ROPE_FLOPS * rotated,
                      act_read_bytes=rotated * a, act_write_bytes=rotated * a, rows=tokens)

    def v4_kv_write(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """DeepSeek-V4: each new token's window entry into the cache (K = V: head_dim; a sliding layer K and V
        apart, as transformers keeps them: twice)."""
        tokens, p = batch * q_len, self.precision
        values = tokens * self._v4_width(kind)
        return OpCost(name="kv_write", kind="elementwise", act_read_bytes=tokens * self.head_dim * p.act_bytes,
                      kv_write_bytes=values * p.kv_bytes, rows=tokens)

    def _entries(self, kv_len: Number, rate: int) -> Number:
        """Compressed entries a sequence of `kv_len` tokens has closed (one per full window of `rate`)."""
        return np.floor_divide(kv_len, rate)

    def compress_proj(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """DeepSeek-V4's compressor (csa / hca layer): hidden -> its kv and gate projections, head_dim each (a csa
        layer's two overlapping series: 2 head_dim each), for every new token."""
        c = 2 if self._kind(kind).attention == "csa" else 1
        return self._linear("compress_proj", batch * q_len, self.model.hidden_size, 2 * c * self.head_dim, False)

    def compress_pool(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """The compressors' gated pooling (a csa layer's and its indexer's): every window of `rate` tokens closed
        by this step (2 rate slots in a csa layer: the previous window's first series and this one's second), the
        gate plus its position bias softmaxed over the slots (5 FLOPs), times the kv and summed (2), then the entry's
        RMSNorm and rotary; the entries written to the cache (at the KV dtype, the indexer's keys too)."""
        m, p = self.model, self.precision
        rate, csa = self._v4_rate(kind), self._kind(kind).attention == "csa"
        new = batch * (self._entries(kv_len, rate) - self._entries(kv_len - q_len, rate))
        width = self.head_dim + (m.index_head_dim if csa else 0)
        slots = (2 if csa else 1) * rate
        flops = new * width * (slots * (SOFTMAX_FLOPS + 1 + 2) + NORM_FLOPS["rmsnorm"]) \
            + new * ROPE_FLOPS * m.rotary_dim * (2 if csa else 1)
        return OpCost(name="compress_pool", kind="elementwise", flops=flops,
                      act_read_bytes=new * slots * width * 2 * p.act_bytes, kv_write_bytes=new * width * p.kv_bytes,
                      rows=batch * q_len)

    def _seen_entries(self, q_len: Number, kv_len: Number, rate: int, cap: int | None = None) -> Number:
        """Sum over the step's queries (positions kv_len - q_len .. kv_len - 1) of the compressed entries each may
        see, floor((position + 1) / rate), at most `cap` each: a closed form over the positions."""
        def prefix(n):  # noqa: ANN001, ANN202  -- sum of min(floor(j / rate), cap) for j = 1 .. n
            n = np.asarray(n, dtype=float)
            full = np.floor_divide(n, rate)  # sum_{j<=n} floor(j/r) = r * f(f-1)/2 + f * (n - r f + 1)
            s = rate * full * (full - 1) / 2 + full * (n - rate * full + 1)
            if cap is None:
                return s
            top = float(cap * rate)  # from j = cap * rate on every query sees cap entries
            ft = cap
            st = rate * ft * (ft - 1) / 2 + ft * (top - rate * ft + 1)
            return np.where(n <= top, s, st + (n - top) * cap)
        out = prefix(kv_len) - prefix(kv_len - q_len)
        return float(out) if np.ndim(out) == 0 else out

    def v4_index_k_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4's indexer (csa layers): hidden -> its compressor's kv and gate (2 index_head_dim each) and
        its heads' weights (index heads), for every new token (named `index_k_proj`)."""
        m = self.model
        return self._linear("index_k_proj", batch * q_len, m.hidden_size, 4 * m.index_head_dim + m.index_n_heads,
                            False)

    def v4_index_score(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None) -> OpCost:
        """DeepSeek-V4's indexer: each query against the compressed indexer keys it may see (`executed`; `dense`:
        every entry of the sequence, as transformers' eager scorer does before masking): per pair and index head a
        dot product of index_head_dim, ReLU, the head's weight and the sum over heads; the keys read once."""
        m, p = self.model, self.precision
        hi, di, tokens, rate = m.index_n_heads, m.index_head_dim, batch * q_len, m.csa_rate
        entries = self._entries(kv_len, rate)
        seen = q_len * entries if self.attention_flops == "dense" else self._seen_entries(q_len, kv_len, rate)
        pairs = batch * seen
        return OpCost(name="index_score", kind="attention", flops=pairs * hi * (2 * di + 3),
                      act_read_bytes=tokens * hi * (di + FP32_BYTES), kv_read_bytes=batch * entries * di * p.kv_bytes,
                      act_write_bytes=pairs * FP32_BYTES, rows=tokens)

    def v4_index_topk(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4's indexer: each query's min(index_topk, entries seen) entries from its scores."""
        m = self.model
        pairs = batch * self._seen_entries(q_len, kv_len, m.csa_rate)
        picked = batch * self._seen_entries(q_len, kv_len, m.csa_rate, m.index_topk)
        return OpCost(name="index_topk", kind="elementwise", flops=pairs, act_read_bytes=pairs * FP32_BYTES,
                      act_write_bytes=picked * FP32_BYTES, rows=batch * q_len)

    def v4_attention_ops(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind | None = None
                         ) -> list[OpCost]:
        """DeepSeek-V4's attention core: MQA of every head over one K = V head, a sink per head, over the
        `sliding_window` latest tokens plus, in a csa layer, the min(index_topk, entries seen) compressed entries
        its indexer picks, in an hca layer every entry seen. Counted as an efficient sparse kernel runs it
        (`executed`: only those pairs, the window's keys and the entries read once); `dense` counts what
        transformers' eager attention computes, every query against every key and every entry, masked."""
        m, p, k = self.model, self.precision, self._kind(kind)
        shape = AttentionShape(heads=m.num_heads, qk_dim=self.head_dim, v_dim=self.head_dim, k_elems=self.head_dim,
                               v_elems=self.head_dim, union_elems=self.head_dim)
        ops = attention_core(batch, q_len, kv_len, shape=shape, act_bytes=p.act_bytes, kv_bytes=p.kv_bytes,
                             impl=self.attention, causal=True, flops=self.attention_flops, window=m.sliding_window,
                             sinks=True)
        rate = self._v4_rate(k)
        if rate is None:
            return ops
        entries = self._entries(kv_len, rate)
        cap = m.index_topk if k.attention == "csa" else None
        dense = self.attention_flops == "dense" or self.attention == "naive"  # the naive form's whole square
        pairs = q_len * entries if dense else self._seen_entries(q_len, kv_len, rate, cap)
        cols = q_len * entries  # the naive form's extra columns of S and P
        read = entries if cap is None else np.minimum(entries, q_len * cap)
        B, H, d, a = batch, m.num_heads, self.head_dim, p.act_bytes
        out = []
        for op in ops:
            if op.name == "attention":
                attn = replace(op.attn, context=op.attn.context + read) if op.attn is not None else None
                op = replace(op, flops=op.flops + 4 * B * H * pairs * d, kv_read_bytes=op.kv_read_bytes
                             + B * read * d * p.kv_bytes, attn=attn)
            elif op.name == "attn_score":
                op = replace(op, flops=op.flops + 2 * B * H * pairs * d, kv_read_bytes=op.kv_read_bytes
                             + B * read * d * p.kv_bytes, act_write_bytes=op.act_write_bytes + B * H * cols * a)
            elif op.name == "attn_softmax":
                extra = B * H * cols
                op = replace(op, flops=op.flops + SOFTMAX_FLOPS * extra, act_read_bytes=op.act_read_bytes + extra * a,
                             act_write_bytes=op.act_write_bytes + extra * a)
            elif op.name == "attn_value":
                op = replace(op, flops=op.flops + 2 * B * H * pairs * d, kv_read_bytes=op.kv_read_bytes
                             + B * read * d * p.kv_bytes, act_read_bytes=op.act_read_bytes + B * H * cols * a)
            out.append(op)
        return out

    def o_a_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """DeepSeek-V4's grouped output projection: each of `o_groups` groups of heads x head_dim / o_groups ->
        o_lora_rank (a batched GEMM of o_groups blocks; no GEMM shape); `o_proj` is o_b_proj, o_groups x
        o_lora_rank -> hidden."""
        m, tokens = self.model, batch * q_len
        g = m.o_groups
        return self._linear("o_a_proj", tokens * g, m.num_heads * self.head_dim // g, m.o_lora_rank, False,
                            weight_copies=g, rows=tokens, gemm=False)

    def _v4_block(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind) -> list[OpCost]:
        """DeepSeek-V4's attention, from q_a_proj to o_proj (o_b_proj)."""
        m, args = self.model, (batch, q_len, kv_len)
        ops = [self.q_a_proj(*args), self.q_a_norm(*args), self.v4_q_b_proj(*args), self.v4_q_norm(*args),
               self.kv_proj(*args), self.kv_norm(*args), self.v4_rope(*args), self.v4_kv_write(*args, kind=kind)]
        if kind.attention in ("csa", "hca"):
            ops += [self.compress_proj(*args, kind=kind)]
            if kind.attention == "csa":
                ops += [self.v4_index_k_proj(*args), self.index_q_proj(*args)]
            ops += [self.compress_pool(*args, kind=kind)]
            if kind.attention == "csa":
                ops += [self.v4_index_score(*args, kind=kind), self.v4_index_topk(*args)]
        ops += self.attention_ops(*args, kind=kind)
        ops += [self.o_a_proj(*args),
                self._linear("o_proj", batch * q_len, m.o_groups * m.o_lora_rank, m.hidden_size, False)]
        return ops

    # ---- Gated DeltaNet (linear layers) ----------------------------------------------------------
    def _linear_widths(self) -> tuple[int, int, int]:
        """(key width, value width, convolution channels) of this GPU's Gated DeltaNet heads."""
        m, d = self.model, self.dims
        kd = d.linear_key_heads * m.linear_key_head_dim  # type: ignore[operator]
        vd = d.linear_value_heads * m.linear_value_head_dim  # type: ignore[operator]
        return kd, vd, 2 * kd + vd

    def in_proj_qkvz(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gated DeltaNet: hidden -> q, k (key width each), v and the output gate z (value width each)."""
        kd, vd, _ = self._linear_widths()
        return self._linear("in_proj_qkvz", batch * q_len, self.model.hidden_size, 2 * kd + 2 * vd, False)

    def in_proj_ba(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gated DeltaNet: hidden -> each value head's write strength b and decay input a."""
        return self._linear("in_proj_ba", batch * q_len, self.model.hidden_size, 2 * self.dims.linear_value_heads,
                            False)

    @property
    def linear_chunk(self) -> int:
        """Tokens a block of the linear layers' chunked prefill form (`ModelSpec.linear_chunk`)."""
        return self.model.linear_chunk

    def in_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Mamba-2: hidden -> the gate z and x (value width each), B and C (key width each: groups x state) and
        each head's dt, one GEMM."""
        kd, vd, _ = self._linear_widths()
        return self._linear("in_proj", batch * q_len, self.model.hidden_size,
                            2 * kd + 2 * vd + self.dims.linear_value_heads, self.model.linear_proj_bias)

    def _chunks(self, q_len: Number) -> Number:
        """Blocks of the chunked form a sequence of `q_len` new tokens runs (0 for a one-token step)."""
        blocks = np.where(np.asarray(q_len) > 1, np.ceil(np.asarray(q_len, dtype=float) / self.linear_chunk), 0.0)
        return float(blocks) if np.ndim(blocks) == 0 else blocks

    def ssd(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Mamba-2's core, the state-space dual (SSD) scan over each head's P x N state (P: head dim, N: state
        size; B and C shared by the heads of a group). A decode token runs the recurrent step
        (`MAMBA2_STEP_FLOPS` per state element); a chunk of q tokens the chunked form in ceil(q / C) blocks (the
        last one padded, as mamba_ssm's kernels run it): per block 2 C^2 N a group (C B^T) and 2 C^2 P + 4 C N P a
        head (the masked in-block output, the block's state and the output's read of the state before it), each
        block's state written and read once. Reads x, B, C and dt, writes y; each sequence's state is read (when
        it has one) and written back once, at `state_dtype` (else the activations')."""
        m, d, a = self.model, self.dims, self.precision.act_bytes
        n, p, nh, ng = m.linear_key_head_dim, m.linear_value_head_dim, d.linear_value_heads, d.linear_key_heads
        kd, vd, conv = self._linear_widths()
        tokens, c = batch * q_len, self.linear_chunk
        blocks = self._chunks(q_len)
        per_block = ng * 2 * c * c * n + nh * (2 * c * c * p + 4 * c * n * p)  # type: ignore[operator]
        step = np.where(np.asarray(q_len) > 1, 0.0, MAMBA2_STEP_FLOPS * n * p * np.asarray(q_len, dtype=float))
        step = float(step) if np.ndim(step) == 0 else step
        flops = batch * (blocks * per_block + nh * step) + tokens * (nh * MAMBA2_HEAD_FLOPS + vd * MAMBA2_CHANNEL_FLOPS)
        state = batch * nh * n * p * recurrent_state_element_bytes(m, a)  # type: ignore[operator]
        chunk_states = batch * blocks * nh * n * p * a  # type: ignore[operator]
        reads = tokens * (conv + nh) * a + chunk_states
        return OpCost(name="ssd", kind="attention", flops=flops, act_read_bytes=reads, weight_bytes=3 * nh * a,
                      act_write_bytes=tokens * vd * a + chunk_states,
                      kv_read_bytes=state * self._continues(q_len, kv_len), kv_write_bytes=state, rows=tokens)

    def _continues(self, q_len: Number, kv_len: Number) -> Number:
        """1 where a sequence has a state from earlier steps (context beyond this step's tokens), else 0."""
        out = (np.asarray(kv_len) > np.asarray(q_len)).astype(float)
        return float(out) if out.ndim == 0 else out

    def conv1d(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """A linear layer's causal depthwise convolution of width K over q, k and v (Mamba-2: x, B and C, with
        its bias), then SiLU; each sequence reads its last K - 1 inputs (when it has a state) and writes the
        new ones."""
        m, a = self.model, self.precision.act_bytes
        _, _, conv = self._linear_widths()
        k, tokens = m.linear_conv_kernel, batch * q_len
        state = batch * (k - 1) * conv * a  # type: ignore[operator]
        return OpCost(name="conv1d", kind="elementwise", flops=(2 * k + CONV_ACT_FLOPS) * tokens * conv,
                      weight_bytes=(k + m.linear_conv_bias) * conv * a, act_read_bytes=tokens * conv * a,  # type: ignore
                      act_write_bytes=tokens * conv * a,
                      kv_read_bytes=state * self._continues(q_len, kv_len), kv_write_bytes=state, rows=tokens)

    def deltanet(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gated DeltaNet's core: the gated delta rule over each value head's dk x dv state. A decode token
        runs the recurrent step (`DELTANET_STEP_FLOPS` per state element); a chunk of q tokens the chunked
        form in ceil(q / C) blocks of C = 64 tokens (`linear_chunk`; the last one padded, as FLA's and
        transformers' kernels run it): per block and head C^2 (5 dk + 3 dv) (the in-block k k^T and q k^T,
        their two triangular solves, the in-block output) + 6 C dk dv (three products with the state), each
        block's state written and read once. Reads q, k, v and the gates (and each head's A_log and dt_bias), writes the
        output; each sequence's state is read (when it has one) and written back once, at `state_dtype`
        (else the activations')."""
        m, d, a = self.model, self.dims, self.precision.act_bytes
        dk, dv, nv = m.linear_key_head_dim, m.linear_value_head_dim, d.linear_value_heads
        kd, vd, conv = self._linear_widths()
        tokens, c = batch * q_len, self.linear_chunk
        blocks = self._chunks(q_len)
        per_block = c * c * (5 * dk + 3 * dv) + DELTANET_CHUNK_STATE_FLOPS * c * dk * dv  # type: ignore[operator]
        step = np.where(np.asarray(q_len) > 1, 0.0, DELTANET_STEP_FLOPS * dk * dv * np.asarray(q_len, dtype=float))
        step = float(step) if np.ndim(step) == 0 else step
        flops = (batch * nv * (blocks * per_block + step) + tokens * nv * DELTANET_GATE_FLOPS
                 + tokens * 2 * kd * NORM_FLOPS["l2"])
        state = batch * nv * dk * dv * recurrent_state_element_bytes(m, a)  # type: ignore[operator]
        chunk_states = batch * blocks * nv * dk * dv * a  # type: ignore[operator]
        reads = tokens * (conv * a + 2 * nv * FP32_BYTES) + chunk_states
        return OpCost(name="deltanet", kind="attention", flops=flops, act_read_bytes=reads, weight_bytes=2 * nv * a,
                      act_write_bytes=tokens * vd * a + chunk_states,
                      kv_read_bytes=state * self._continues(q_len, kv_len), kv_write_bytes=state, rows=tokens)

    def gated_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gated DeltaNet: RMSNorm over each value head's output (one weight of dv), times silu(z); Mamba-2:
        RMSNorm of silu(z)-gated y over each group's channels (one weight of every channel)."""
        m, a = self.model, self.precision.act_bytes
        rows, dv = batch * q_len * self.dims.linear_value_heads, m.linear_value_head_dim
        weight = self._linear_widths()[1] if m.is_mamba else dv
        return OpCost(name="gated_norm", kind="norm", flops=(NORM_FLOPS["rmsnorm"] + GATE_FLOPS) * rows * dv,
                      weight_bytes=weight * a, act_read_bytes=2 * rows * dv * a, act_write_bytes=rows * dv * a,
                      rows=batch * q_len)

    def linear_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """A Gated DeltaNet or Mamba-2 token mixer, from its input projections to out_proj (`o_proj`)."""
        args = (batch, q_len, kv_len)
        if self.model.is_mamba:
            return [self.in_proj(*args), self.conv1d(*args), self.ssd(*args), self.gated_norm(*args),
                    self.o_proj(*args, kind=_LINEAR_KIND)]
        return [self.in_proj_qkvz(*args), self.in_proj_ba(*args), self.conv1d(*args), self.deltanet(*args),
                self.gated_norm(*args), self.o_proj(*args, kind=_LINEAR_KIND)]

    def post_attn_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The sandwich norm after attention (Gemma 2/3)."""
        return self._norm("post_attn_norm", batch * q_len)

    def attn_residual(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The residual add after attention."""
        return self._residual("attn_residual", batch * q_len)

    def mlp_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The norm before the FFN."""
        return self._norm("mlp_norm", batch * q_len)

    def router(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """hidden -> experts logits (with a bias, gpt-oss), + the per-expert score correction
        (DeepSeek-V3's noaux_tc bias: one add per logit)."""
        m, tokens = self.model, batch * q_len
        op = self._linear("router", tokens, m.hidden_size, m.num_experts, m.router_bias, module="router")
        if m.router_score_bias:  # fp32 in every engine and checkpoint
            op = replace(op, flops=op.flops + tokens * m.num_experts,
                         weight_bytes=op.weight_bytes + m.num_experts * FP32_BYTES)
        if m.moe_parallel_ffn:  # Gemma 4: a weightless RMSNorm of its input times a learned vector; per-expert scales
            h, a = m.hidden_size, self.precision.act_bytes
            op = replace(op, flops=op.flops + tokens * h * (NORM_FLOPS["rmsnorm"] + 1),
                         weight_bytes=op.weight_bytes + (h + m.num_experts) * a,
                         act_read_bytes=op.act_read_bytes + tokens * h * a,
                         act_write_bytes=op.act_write_bytes + tokens * h * a)
        return op

    # ---- Gemma 4's per-layer embeddings (not split by tensor parallelism) ----------------------------------
    def ple_embed(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Per-layer embeddings: each token's row of the second table (every layer's ple_dim inputs at once)."""
        tokens, width, p = batch * q_len, self.model.num_layers * self.model.ple_dim, self.precision
        return OpCost(name="ple_embed", kind="embedding", weight_bytes=tokens * width * p.embedding_bytes,
                      act_write_bytes=tokens * width * p.act_bytes, per_layer=False, rows=tokens)

    def ple_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Per-layer embeddings: the scaled embedding projected to every layer's input, hidden -> layers x
        ple_dim."""
        m = self.model
        return self._linear("ple_proj", batch * q_len, m.hidden_size, m.num_layers * m.ple_dim, False,
                            per_layer=False, module="dense_mlp")

    def ple_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Per-layer embeddings: the projection RMS-normed per layer, added to the table's rows and scaled."""
        m, a = self.model, self.precision.act_bytes
        rows = batch * q_len * m.num_layers
        op = self._norm("ple_norm", rows, per_layer=False, width=m.ple_dim)
        return replace(op, flops=op.flops + 2 * rows * m.ple_dim,
                       act_read_bytes=op.act_read_bytes + rows * m.ple_dim * a)

    def ple_gate(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """A layer's per-layer input gate, hidden -> ple_dim."""
        m = self.model
        return self._linear("ple_gate", batch * q_len, m.hidden_size, m.ple_dim, False, module="dense_mlp")

    def ple_act(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The gate's activation times the layer's per-layer input."""
        m = self.model
        return self._elementwise("ple_act", batch * q_len, m.ple_dim, ACT_FLOPS[m.ffn_kind] + 1, reads=2)

    def ple_out(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The gated per-layer input projected back, ple_dim -> hidden."""
        m = self.model
        return self._linear("ple_out", batch * q_len, m.ple_dim, m.hidden_size, False, module="dense_mlp")

    def ple_out_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Its norm and the residual add."""
        tokens, h, a = batch * q_len, self.model.hidden_size, self.precision.act_bytes
        op = self._norm("ple_out_norm", tokens)
        return replace(op, flops=op.flops + tokens * h, act_read_bytes=op.act_read_bytes + tokens * h * a)

    def moe_branch_norms(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gemma 4's MoE layer: the experts' own norm of the layer input, a norm of each branch's output (the
        dense FFN's, the experts'), and their sum."""
        tokens, h, a = batch * q_len, self.model.hidden_size, self.precision.act_bytes
        op = self._norm("moe_branch_norms", 3 * tokens, weights=3)
        return replace(op, flops=op.flops + tokens * h, act_read_bytes=op.act_read_bytes + 2 * tokens * h * a,
                       act_write_bytes=op.act_write_bytes + tokens * h * a, rows=tokens)

    def moe_route(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The router's choice from its logits (the `router` GEMM's output): each token's score of every
        expert (softmax or sigmoid; DeepSeek's score correction and group limits), its k best and their
        weights (renormalised where the family does): one small kernel in the serving engines (vLLM's
        `topk_softmax`, grouped top-k). Reads the logits, writes k (weight, expert id, index) per token;
        Llama 4 also writes each chosen expert's copy of the token scaled by its weight (`router_input_scaling`)."""
        m, a = self.model, self.precision.act_bytes
        tokens, experts, k = batch * q_len, m.num_experts, m.experts_per_token
        flops, read, write = ROUTE_FLOPS * tokens * experts, tokens * experts * a, tokens * k * ROUTE_CHOICE_BYTES
        if m.router_input_scaling:
            h = m.hidden_size
            flops, read, write = flops + tokens * k * h, read + tokens * h * a, write + tokens * k * h * a
        return OpCost(name="moe_route", kind="elementwise", flops=flops, act_read_bytes=read,
                      act_write_bytes=write, rows=tokens)

    def moe_sum(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The weighted sum of each token's k expert outputs (vLLM's `moe_sum` after the down GEMM):
        reads the routed rows and their weights (fp32), writes one hidden vector per token (an engine that runs
        each expert apart adds each expert's rows in a call of its own: `OpCost.experts`). With data-parallel
        attention over expert-parallel GPUs the rows come home first (`moe_combine`) and each GPU sums
        its own tokens' k rows; otherwise each GPU sums the rows of its experts (`tokens x k / ep`) into
        every token, and the tp all-reduce adds the GPUs' partial sums."""
        m, a = self.model, self.precision.act_bytes
        h, k = m.expert_model_dim, m.experts_per_token  # a latent MoE sums its latent rows
        routed, experts, _, _ = self._ffn_shape(batch, q_len, "routed")
        if self.dp_attention and self.ep > 1:
            tokens = self.local_batch(batch) * q_len
            rows = tokens * k
        else:
            tokens, rows = batch * q_len, routed
        return OpCost(name="moe_sum", kind="elementwise", flops=2 * rows * h,
                      act_read_bytes=rows * h * a + rows * 4, act_write_bytes=tokens * h * a, rows=tokens,
                      experts=experts)

    def moe_latent_down(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """A latent MoE (Nemotron-H's `fc1_latent_proj`): every token's hidden state -> the experts' latent width,
        before dispatch; replicated on every tensor-parallel GPU (each its own tokens with dp_attention), as
        vLLM's `ReplicatedLinear`."""
        m = self.model
        return self._linear("moe_latent_down", batch * q_len, m.hidden_size, m.moe_latent_size, m.mlp_bias,
                            module="dense_mlp")

    def moe_latent_up(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """A latent MoE (`fc2_latent_proj`): the summed expert output -> hidden, once a token after `moe_sum`."""
        m = self.model
        return self._linear("moe_latent_up", batch * q_len, m.moe_latent_size, m.hidden_size, m.mlp_bias,
                            module="dense_mlp")

    def _ffn_shape(self, batch: Number, q_len: Number, part: str) -> tuple[Number, Number, int, str]:
        """(token rows, distinct weight copies read, width per GPU, module) of `part`: `dense` (an FFN
        of ffn_size), `routed` (the experts the tokens route to) or `shared` (always on)."""
        m, tokens = self.model, batch * q_len
        if part == "routed":  # the group's tokens, spread over the ep GPUs holding the experts: the busiest one's
            if self.routing is not None:  # a measured router, or EPLB's placement
                rows, touched = self.routing.busiest(tokens)
                return rows, touched, self.dims.expert_ffn_size, "expert"
            if self.ep == 1:
                touched = expected_experts_touched(tokens, m.num_experts, m.experts_per_token)
                return tokens * m.experts_per_token, touched, self.dims.expert_ffn_size, "expert"
            rows, touched = busiest_expert_load(tokens, m.num_experts, m.experts_per_token, self.ep)
            return rows, touched, self.dims.expert_ffn_size, "expert"
        if part == "shared":  # replicated with dp_attention: each GPU its own tokens
            return self.local_batch(batch) * q_len, 1.0, self.dims.shared_ffn_size, "shared_expert"
        return tokens, 1.0, self.dims.ffn_size, "dense_mlp"

    def _ffn_ops(self, batch: Number, q_len: Number, part: str, fused: bool | None = None) -> list[OpCost]:
        """The FFN matrices and activation of `part` (`_ffn_shape`), in forward order; `fused`
        (default `fused_gate_up`): one gate+up GEMM."""
        m, a = self.model, self.precision.act_bytes
        rows, copies, width, module = self._ffn_shape(batch, q_len, part)
        pre = "shared_" if part == "shared" else ""
        h, bias = (m.expert_model_dim if part == "routed" else m.hidden_size), m.mlp_bias
        if part == "routed":  # each touched expert's share of the rows (none touched: no rows either)
            with np.errstate(divide="ignore"):
                per_expert = np.where(np.asarray(copies) > 0, 1.0 / np.maximum(copies, 1e-300), 0.0)
            per_expert = float(per_expert) if np.ndim(per_expert) == 0 else per_expert

        def lin(name: str, d_in: int, d_out: int) -> OpCost:
            # routed experts: one GEMM per expert the rows touch on this GPU, each an equal share of them
            if part != "routed":
                return self._linear(pre + name, rows, d_in, d_out, bias, copies, module=module)
            shape = GemmShape(n=d_out, k=d_in, groups=copies, m_per_row=per_expert)
            return replace(self._linear(pre + name, rows, d_in, d_out, bias, copies, module=module, gemm=shape),
                           experts=copies)

        if m.ffn_kind == "swiglu" and (self.fused_gate_up if fused is None else fused):
            ops = [lin("gate_up_proj", h, 2 * width)]
        elif m.ffn_kind == "swiglu":
            ops = [lin("gate_proj", h, width), lin("up_proj", h, width)]
        else:
            ops = [lin("up_proj", h, width)]
        n = rows * width
        reads = 2 if m.ffn_kind == "swiglu" else 1
        act = RELU2_FLOPS if m.hidden_act == "relu2" and m.ffn_kind == "relu" else ACT_FLOPS[m.ffn_kind]
        ops.append(OpCost(name=pre + "act", kind="elementwise", flops=act * n,
                          act_read_bytes=reads * n * a, act_write_bytes=n * a, rows=rows,
                          experts=copies if part == "routed" else None))
        ops.append(lin("down_proj", width, h))
        return ops

    def gate_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The FFN's gate projection, hidden -> ffn width (gated FFNs; `gate_up_proj` is the fused GEMM)."""
        return self._ffn_op("gate_proj", batch, q_len)

    def gate_up_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gate and up projections as one GEMM (gated FFNs only): the input is read once."""
        return self._ffn_op("gate_up_proj", batch, q_len)

    def up_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The FFN's up projection, hidden -> ffn width."""
        return self._ffn_op("up_proj", batch, q_len)

    def act(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The FFN's activation (SiLU(gate) x up for a gated FFN)."""
        return self._ffn_op("act", batch, q_len)

    def down_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The FFN's down projection, ffn width -> hidden."""
        return self._ffn_op("down_proj", batch, q_len)

    def _ffn_op(self, name: str, batch: Number, q_len: Number) -> OpCost:
        """One operator of the first layer's FFN (routed experts on an MoE layer)."""
        part = "routed" if self._kind(None).moe else "dense"
        fused = {"gate_up_proj": True, "gate_proj": False, "up_proj": False}.get(name, self.fused_gate_up)
        if self.model.ffn_kind != "swiglu":
            fused = False
        for op in self._ffn_ops(batch, q_len, part, fused):
            if op.name == name:
                return op
        raise ValueError(f"{name}: not an operator of {self.model.name}'s FFN ({self.model.ffn_kind})")

    def shared_expert_gate(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Qwen2-MoE: hidden -> 1 sigmoid gate scaling the shared experts' output."""
        return self._linear("shared_expert_gate", batch * q_len, self.model.hidden_size, 1, False,
                            module="shared_expert")

    def post_mlp_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The sandwich norm after the FFN (Gemma 2/3)."""
        return self._norm("post_mlp_norm", batch * q_len)

    def mlp_residual(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The residual add after the FFN (Gemma 4: then the layer's output times its learned scalar)."""
        op = self._residual("mlp_residual", batch * q_len)
        if self.model.layer_scalar:
            op = replace(op, flops=2 * op.flops)  # one add and one multiply an element, fused
        return op

    def final_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The norm after the last layer (once per forward pass, not per layer)."""
        return self._norm("final_norm", batch * q_len, per_layer=False)

    def _logit_rows(self, batch: Number, q_len: Number) -> Number:
        return batch * q_len if self.all_logits else batch

    def lm_head(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The LM head, hidden -> vocabulary (this GPU's share), on the rows that need logits (prefill: the
        last position unless `all_logits`)."""
        return self._linear("lm_head", self._logit_rows(batch, q_len), self.model.hidden_size,
                            self.dims.vocab_size, False, per_layer=False, module="lm_head")

    def logits_gather(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Tensor parallelism: each GPU's `rows x vocab / tp` slice of the logits gathered before sampling
        (vLLM's `LogitsProcessor._gather_logits`: `tensor_model_parallel_gather` to rank 0, or an all-gather
        where the platform needs one; the padded vocabulary's tail is cut after it). Priced as an all-gather
        of `rows x padded vocab` (`tp x ShardDims.vocab_size`) in the activation dtype, the dtype the LM head
        computes its logits in (the sampler casts them to fp32 after the gather): bus bytes `(tp - 1) / tp`
        of it per GPU, what a gather's root receives too."""
        t = self.tp
        total = self._logit_rows(batch, q_len) * t * self.dims.vocab_size * self.precision.act_bytes
        return OpCost(name="logits_gather", kind="comm", comm_bytes=(t - 1) / t * total,
                      rows=self._logit_rows(batch, q_len), per_layer=False, comm_gpus=int(t))

    def final_softcap(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gemma 2: cap * tanh(logit / cap) on every logit, after `logits_gather` at tp > 1 (vLLM's
        `LogitsProcessor` caps the gathered logits, their padding cut: the whole vocabulary)."""
        return self._elementwise("final_softcap", self._logit_rows(batch, q_len), self.model.vocab_size,
                                 SOFTCAP_FLOPS, per_layer=False)

    def logits_scale(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Granite: every logit divided by `logits_scaling`; Cohere: times `logit_scale` (vLLM's `LogitsProcessor`
        scales the gathered logits, the whole vocabulary), one operation a logit."""
        return self._elementwise("logits_scale", self._logit_rows(batch, q_len), self.model.vocab_size, 1,
                                 per_layer=False)

    # ---- the pass ----------------------------------------------------------------------------------
    def _attention_block(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind) -> list[OpCost]:
        """From the input projections to o_proj (GQA or MLA)."""
        m, args = self.model, (batch, q_len, kv_len)
        if kind.attention == "linear":
            return self.linear_ops(*args)
        if m.is_mla:
            return self._mla_block(batch, q_len, kv_len, kind)
        if self.fused_qkv:
            ops = [self.qkv_proj(*args, kind=kind)]
        else:  # Gemma 4: no v_proj where V is the key projection, neither where K and V are an earlier layer's
            ops = [self.q_proj(*args)] + [self.k_proj(*args), self.v_proj(*args)][:m.kv_projections(kind)]
        if m.qk_norm in ("rmsnorm", "rmsnorm_across_heads") or (m.qk_norm == "l2" and kind.rope):
            ops.append(self.qk_norm(*args, kind=kind))
        if self._qk_gathered:  # OLMo 2/3 under tp: q and k gathered before their norm
            ops.insert(len(ops) - 1, self.qk_norm_gather(*args))
        elif m.qk_norm == "rmsnorm_across_heads" and self.tp > 1 and not self.dp_attention:
            ops.append(self.qk_norm_allreduce(*args))
        if kind.rope and m.pos_encoding == "rope":
            ops.append(self.rope(*args, kind=kind))
        if not kind.kv_shared:
            ops.append(self.kv_write(*args))
        ops += self.attention_ops(*args, kind=kind)
        if m.attn_output_gate:
            ops.append(self.attn_gate(*args))
        ops.append(self.o_proj(*args))
        return ops

    def _mla_block(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind) -> list[OpCost]:
        m, args = self.model, (batch, q_len, kv_len)
        ops = ([self.q_a_proj(*args), self.q_a_norm(*args), self.q_b_proj(*args)] if m.q_lora_rank
               else [self.q_proj(*args)])
        ops += [self.kv_a_proj(*args), self.kv_a_norm(*args)]
        if m.is_sparse_attention and not kind.shared_topk:  # a shared layer reuses an earlier layer's top-k
            ops += self.indexer_ops(*args)
        absorbed = self.absorbed(q_len)
        unabs = np.logical_not(absorbed)
        if np.any(unabs):
            ops.append(_where(unabs, self.kv_b_proj(*args, kind=kind), None))
        if np.any(absorbed):
            ops.append(_where(absorbed, self.q_absorb(*args), None))
        if kind.rope:
            ops.append(self.rope(*args))
        ops.append(self.kv_write(*args))
        ops += self.attention_ops(*args, kind=kind)
        if np.any(absorbed):
            ops.append(_where(absorbed, self.v_absorb(*args), None))
        ops.append(self.o_proj(*args))
        return ops

    def _ffn_block(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind) -> list[OpCost]:
        """The FFN of a layer of `kind` over the group's `batch` and its collectives: the tp all-reduce
        (with dp_attention, a dense FFN's gather and scatter of every token, the same bytes), or the
        expert-parallel all-to-alls of each GPU's own tokens."""
        m, tokens = self.model, batch * q_len
        local = self.local_batch(batch)
        if not kind.moe:
            ops = self._ffn_ops(batch, q_len, "dense")
            return ops + ([self._allreduce("mlp_allreduce", tokens)] if self.tp > 1 else [])
        a2a = self.dp_attention and self.ep > 1
        ops = [self.router(local, q_len, kv_len), self.moe_route(local, q_len, kv_len)]
        ops += [self.moe_latent_down(local, q_len, kv_len)] if m.moe_latent_size else []
        ops += [self._all_to_all("moe_dispatch", batch, q_len)] if a2a else []
        ops += self._ffn_ops(batch, q_len, "routed")
        ops += [self._all_to_all("moe_combine", batch, q_len)] if a2a else []
        ops.append(self.moe_sum(batch, q_len, kv_len))
        ops += [self.moe_latent_up(local, q_len, kv_len)] if m.moe_latent_size else []
        if m.shared_experts:
            ops += self._ffn_ops(batch, q_len, "shared")
            if m.shared_expert_gate:
                ops.append(self.shared_expert_gate(local, q_len, kv_len))
        if m.moe_parallel_ffn:
            ops.append(self.moe_branch_norms(local, q_len, kv_len))
        if self.tp > 1 and not self.dp_attention:
            ops.append(self._allreduce("mlp_allreduce", tokens))
        return ops

    def _attention_section(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind) -> list[OpCost]:
        """A block's operators up to the FFN (norm, attention, its collective, residual, the MLP norm):
        they depend on the kind's attention (`attention`, `window`, `rope`), not on its FFN."""
        if self._for_kind(kind) is not self:
            return self._for_kind(kind)._attention_section(batch, q_len, kv_len, kind)
        m = self.model
        local = self.local_batch(batch)
        args = (local, q_len, kv_len)
        if kind.attention == "none":  # an FFN alone (Nemotron-H): its norm only
            return [self.mlp_norm(*args)]
        if m.is_v4_attention:  # the hyper-connections in place of the residual adds
            return ([self.hc_proj(*args), self.hc_pre(*args), self.attn_norm(*args)]
                    + self._v4_block(*args, kind) + [self.hc_post(*args)])
        ops = [self.attn_norm(*args)] + self._attention_block(*args, kind)
        if self.dims.attn_tp > 1:
            ops.append(self._allreduce("attn_allreduce", local * q_len))
        if m.sandwich_norms:
            ops.append(self.post_attn_norm(*args))
        ops += [self.attn_residual(*args)] + ([self.mlp_norm(*args)] if kind.ffn and not m.shared_input_norm else [])
        return ops

    def _ffn_section(self, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind) -> list[OpCost]:
        """A block's FFN and what follows it (sandwich norm, residual, Gemma 4's per-layer input): they depend on
        `kind.moe` only (and on `kind.kv_shared` where those layers' FFN is twice as wide)."""
        if not kind.ffn:  # a token mixer alone (Nemotron-H)
            return []
        if self.model.dense_ffn_width(kind) != self.model.ffn_size:
            return self._view("wide", lambda: self.model.ffn_view(kind))._ffn_section(batch, q_len, kv_len, kind)
        local = self.local_batch(batch)
        ops = self._ffn_block(batch, q_len, kv_len, kind)
        if self.model.is_v4_attention:  # DeepSeek-V4: its hyper-connection around the FFN, no residual add
            if kind.hash_router:  # the router's GEMM still runs; the frozen table replaces the correction bias
                ops = [self._hash_router(op) if op.name == "router" else op for op in ops]
            args = (local, q_len, kv_len)
            return [self.hc_proj(*args), self.hc_pre(*args), self.mlp_norm(*args)] + ops + [self.hc_post(*args)]
        if self.model.sandwich_norms:
            ops.append(self.post_mlp_norm(local, q_len, kv_len))
        ops.append(self.mlp_residual(local, q_len, kv_len))
        if self.model.ple_dim:
            ops += [self.ple_gate(local, q_len, kv_len), self.ple_act(local, q_len, kv_len),
                    self.ple_out(local, q_len, kv_len), self.ple_out_norm(local, q_len, kv_len)]
        return ops

    def _hash_router(self, op: OpCost) -> OpCost:
        """A DeepSeek-V4 hash layer's router: its GEMM (the scores weight the chosen experts) without the
        score-correction add; the k expert ids read from the token table (int64) a token."""
        m = self.model
        tokens = op.rows
        if m.router_score_bias:
            op = replace(op, flops=op.flops - tokens * m.num_experts,
                         weight_bytes=op.weight_bytes - m.num_experts * FP32_BYTES)
        return replace(op, weight_bytes=op.weight_bytes + tokens * m.experts_per_token * 8)

    def section_ops(self, part: str, batch: Number, q_len: Number, kv_len: Number, kind: LayerKind) -> list[OpCost]:
        """The operators of one layer's `part` (`attention` or `ffn`, `ForwardModel.sections`) of `kind`."""
        if part == "attention":
            return self._attention_section(batch, q_len, kv_len, kind)
        return self._ffn_section(batch, q_len, kv_len, kind)

    def layer_ops(self, batch: Number, q_len: Number, kv_len: Number,
                  kind: LayerKind | None = None) -> list[OpCost]:
        """The operators of one transformer block of `kind` (default: the first layer's), in execution
        order, each labelled with the kind (`OpCost.layer`). `batch` is the group's sequences (with
        `dp_attention` each GPU's attention runs `local_batch(batch)` of them)."""
        kind = self._kind(kind)
        ops = self._attention_section(batch, q_len, kv_len, kind) + self._ffn_section(batch, q_len, kv_len, kind)
        return [op.scaled(1, layer=kind.label) for op in ops]

    def head_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """Operators before the first block (embeddings; at tp > 1 the vocabulary-split lookup's all-reduce)."""
        ops = [self.embed(batch, q_len, kv_len)]
        if self.tp > 1:
            ops.append(self.embed_allreduce(batch, q_len, kv_len))
        if self.model.pos_encoding == "learned":
            ops.append(self.pos_embed(batch, q_len, kv_len))
        if self.model.embedding_scale or self.model.embedding_multiplier != 1.0:
            ops.append(self.embed_scale(batch, q_len, kv_len))
        if self.model.ple_dim:
            ops += [self.ple_embed(batch, q_len, kv_len), self.ple_proj(batch, q_len, kv_len),
                    self.ple_norm(batch, q_len, kv_len)]
        return ops

    def tail_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """Operators after the last block (final norm, logits; at tp > 1 the logit slices' gather)."""
        ops = [self.final_norm(batch, q_len, kv_len), self.lm_head(batch, q_len, kv_len)]
        if self.model.hc_mult is not None:
            ops.insert(0, self.hc_head(batch, q_len, kv_len))
        if self.tp > 1:
            ops.append(self.logits_gather(batch, q_len, kv_len))
        if self.model.final_softcap:
            ops.append(self.final_softcap(batch, q_len, kv_len))
        if self.model.logits_scaling != 1.0 or self.model.logit_scale is not None:
            ops.append(self.logits_scale(batch, q_len, kv_len))
        return ops

    def group_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[tuple[LayerKind, int, list[OpCost]]]:
        """(kind, number of layers, the operators of ONE layer of that kind) for every layer kind."""
        return [(kind, count, self.layer_ops(batch, q_len, kv_len, kind)) for kind, count in self.groups]

    def forward_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """Every operator of one forward pass, between the model-level ones: each layer section
        (`sections`: the attention part of the layers that share their attention, the FFN part of
        those that share their FFN) computed once, multiplied by its number of layers and labelled
        with the kinds that share it (`full+full/moe`: DeepSeek-V3's attention, the same in its
        dense and MoE layers). A model with one layer kind: each of its operators once, labelled
        with the kind."""
        ops = self.head_ops(batch, q_len, kv_len)
        for part, kind, count, label in self.sections:
            ops += [op.scaled(count, layer=label) for op in self.section_ops(part, batch, q_len, kv_len, kind)]
        return ops + self.tail_ops(batch, q_len, kv_len)

    def attention_core_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """The attention cores (`attention_ops`) of `forward_ops`, the same objects' counts in the same
        order, without building the rest of the pass (the regime searches that read only them)."""
        local = self.local_batch(batch)
        return [op.scaled(count, layer=label) for part, kind, count, label in self.sections if part == "attention"
                for op in self.attention_ops(local, q_len, kv_len, kind=kind)]


_LINEAR_KIND = LayerKind(attention="linear", window=None, rope=False, moe=False)


def _attention_key(kind: LayerKind) -> tuple:
    return (kind.attention, kind.window, kind.rope, kind.shared_topk, kind.global_shape, kind.kv_shared, kind.ffn)


def _sections(groups: tuple[tuple[LayerKind, int], ...]) -> tuple[tuple[str, LayerKind, int, str], ...]:
    """(part, a kind that has it, layers that share it, label) for the attention part of each distinct
    attention (`attention`, `window`, `rope`, `shared_topk`, Gemma 4's `global_shape` and `kv_shared`) and the FFN
    part of each distinct FFN (`moe`, `kv_shared`, DeepSeek-V4's `hash_router`), in order of first appearance; the
    label joins the labels of the kinds that share the part with `+`. A layer without an FFN (`ffn=False`,
    Nemotron-H) has no FFN part."""
    # kv_shared: Gemma 4's wide FFN; hash_router: DeepSeek-V4's router without its correction bias
    keys = {"attention": _attention_key, "ffn": lambda k: (k.moe, k.kv_shared, k.hash_router)}
    found: dict[tuple, list] = {}
    order: list[tuple] = []
    for kind, count in groups:
        for part in ("attention", "ffn") if kind.ffn else ("attention",):
            key = (part, keys[part](kind))
            if key not in found:
                found[key] = [kind, 0, []]
                order.append(key)
            found[key][1] += count
            found[key][2].append(kind.label)
    return tuple((key[0], found[key][0], found[key][1], "+".join(found[key][2])) for key in order)


def _where(mask: Number, a: OpCost, b: OpCost | None) -> OpCost:
    """`a`'s counts where `mask`, else `b`'s (zero when `b` is None), elementwise: one operator list
    for arrays of configurations whose rows take different forms (MLA's auto mode)."""
    if isinstance(mask, (bool, np.bool_)) and b is None and mask:
        return a
    fields = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes",
              "comm_bytes", "rows", "calls")
    vals = {f: np.where(mask, getattr(a, f), 0.0 if b is None else getattr(b, f)) for f in fields}
    if a.attn is not None and b is not None and b.attn is not None:  # each row its own form's shape
        vals["attn"] = AttnShape(**{f: np.where(mask, getattr(a.attn, f), getattr(b.attn, f))
                                    for f in ("batch", "q_len", "context", "heads", "kv_heads", "head_dim", "latent")})
    return replace(a, **vals)
