"""FLOPs and bytes of every operator of a decoder-only transformer's forward pass.

One cost function per operator, each with the signature `(batch, q_len, kv_len)`: prefill is
`q_len = kv_len = prompt`, a decode step is `q_len = 1, kv_len = context` (the new token included).
Arguments may be numpy arrays (sweeps). Formulas: GEMM `A(m,k) @ B(k,n)` = `2mkn` FLOPs (NVIDIA,
"Matrix Multiplication Background User's Guide"); attention as in FlashAttention (Dao et al. 2022,
arXiv:2205.14135): the naive form writes S = QK^T and P = softmax(S) to memory, the fused form keeps
them on chip and reads Q, K, V and writes O once. Mixture-of-experts bytes count only the experts the
batch actually touches (expected number under uniform routing).

Conventions (tested): causal attention aligns the query block to the end of the keys (queries are the
last `q_len` positions); a fused kernel executes only the unmasked pairs (about half the square in
prefill), a naive one the whole square; `attention_flops="dense"` counts the whole square for both,
as `torch.utils.flop_counter` does. Attention FLOPs count the two matmuls (4 per pair per head-dim
element); the naive form's softmax is a separate vector operator (5 FLOPs per score). Prefill
computes logits for the last position only unless `all_logits=True`. Norm weights and biases are
kept at activation precision (quantisation applies to the matrices); integer weights carry their
group scales and zero points (`Precision.matrix_bytes`); embedding and lm_head matrices are at
`Precision.embedding_dtype` (16 bits when the other weights are quantised, as AWQ/GPTQ keep them).

Fused projections (`fused_qkv`, `fused_gate_up`): fast engines (vLLM, TensorRT-LLM) run Q, K and V
as one GEMM over the concatenated weight, and the gate and up projections as one, so the input
activations are read once instead of three (two) times. Off in `ForwardModel` by default (the split
names are what the engine's instrumentation times); `estimate`, `sweep` and the CLI turn them on.

Sliding-window attention (Mistral; Beltagy et al. 2020, arXiv:2004.05150): each query sees at most
the last `window` keys (itself included), so attention FLOPs count `min(i + 1, window)` pairs for
the query at position i, and a step reads at most `q_len + window - 1` keys per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmperf.analysis.roofline import Number, OpCost
from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, Precision

ATTENTION_IMPLS = ("fused", "naive")
FLOP_CONVENTIONS = ("executed", "dense")

# FLOPs per element of the vector operators (documented estimates; all are memory-bound anyway)
NORM_FLOPS = {"rmsnorm": 4, "layernorm": 7}  # square, sum, rsqrt-scale, weight (+ mean, sub, bias)
ACT_FLOPS = {"swiglu": 6, "gelu": 8, "relu": 1}  # silu(g) * u; tanh-approximate GELU; max(x, 0)
SOFTMAX_FLOPS = 5  # max, subtract, exp, sum, divide
ROPE_FLOPS = 3  # x * cos + rotate(x) * sin


def attended_pairs(q_len: Number, kv_len: Number, causal: bool, window: int | None = None) -> Number:
    """(query, key) pairs a causal or full attention actually needs, per sequence and head.

    Causal with queries at the last `q_len` of `kv_len` positions: query i sees `kv_len - q_len + i + 1`
    keys, so the sum is `q_len * kv_len - q_len * (q_len - 1) / 2` (prefill: n(n+1)/2; decode: n).
    With a sliding `window` a query sees `min(keys, window)`: the sum of `min(n, W)` for n from
    `kv_len - q_len + 1` to `kv_len`.
    """
    if not causal:
        return q_len * (kv_len if window is None else np.minimum(kv_len, window))
    if window is None:
        return q_len * kv_len - q_len * (q_len - 1) / 2
    lo, hi = kv_len - q_len + 1, kv_len
    top = np.minimum(hi, window)  # n in [lo, top] contribute n; n in [max(lo, W+1), hi] contribute W
    below = np.maximum(top - lo + 1, 0) * (lo + top) / 2
    above = np.maximum(hi - np.maximum(lo, window + 1) + 1, 0) * window
    return below + above


def keys_read(q_len: Number, kv_len: Number, window: int | None = None) -> Number:
    """Keys (per sequence and KV head) a step must read: all of them, or with a sliding window the
    `q_len + window - 1` most recent ones."""
    return kv_len if window is None else np.minimum(kv_len, q_len + window - 1)


def attention_cost(batch: Number, q_len: Number, kv_len: Number, *, num_heads: int, num_kv_heads: int,
                   head_dim: int, act_bytes: float = 2.0, kv_bytes: float = 2.0, impl: str = "fused",
                   causal: bool = True, flops: str = "executed", window: int | None = None) -> OpCost:
    """The whole of attention as one operator (fused: FlashAttention / Flash-Decoding / PagedAttention;
    naive: the sum of score, softmax and value). The kernel benchmarks take their counts from here.

    Q is `(batch, num_heads, q_len, head_dim)`, K and V `(batch, num_kv_heads, kv_len, head_dim)`.
    """
    parts = attention_parts(batch, q_len, kv_len, num_heads=num_heads, num_kv_heads=num_kv_heads,
                            head_dim=head_dim, act_bytes=act_bytes, kv_bytes=kv_bytes, impl=impl,
                            causal=causal, flops=flops, window=window)
    if len(parts) == 1:
        return parts[0]
    total = {f: sum(getattr(p, f) for p in parts) for f in
             ("flops", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")}
    return OpCost(name="attention", kind="attention", rows=batch * q_len, **total)


def attention_parts(batch: Number, q_len: Number, kv_len: Number, *, num_heads: int, num_kv_heads: int,
                    head_dim: int, act_bytes: float, kv_bytes: float, impl: str, causal: bool,
                    flops: str = "executed", window: int | None = None) -> list[OpCost]:
    """Fused: `[attention]`. Naive: `[attn_score, attn_softmax, attn_value]` with S and P in memory."""
    if impl not in ATTENTION_IMPLS:
        raise SpecError(f"attention: must be one of {', '.join(ATTENTION_IMPLS)}, got {impl!r}")
    if flops not in FLOP_CONVENTIONS:
        raise SpecError(f"attention_flops: must be one of {', '.join(FLOP_CONVENTIONS)}, got {flops!r}")
    B, H, Hkv, D = batch, num_heads, num_kv_heads, head_dim
    keys = keys_read(q_len, kv_len, window)
    square = q_len * keys
    executed = (attended_pairs(q_len, kv_len, causal, window) if (impl == "fused" and flops == "executed")
                else square)
    q_bytes = B * q_len * H * D * act_bytes
    kv_read = 2 * B * keys * Hkv * D * kv_bytes  # K and V, each read once per KV head
    o_bytes = B * q_len * H * D * act_bytes
    rows = B * q_len
    if impl == "fused":
        return [OpCost(name="attention", kind="attention", flops=4 * B * H * executed * D,
                       act_read_bytes=q_bytes, kv_read_bytes=kv_read, act_write_bytes=o_bytes, rows=rows)]
    s_bytes = B * H * square * act_bytes  # the materialised score / probability matrix
    return [
        OpCost(name="attn_score", kind="attention", flops=2 * B * H * executed * D,
               act_read_bytes=q_bytes, kv_read_bytes=kv_read / 2, act_write_bytes=s_bytes, rows=rows),
        OpCost(name="attn_softmax", kind="elementwise", flops=SOFTMAX_FLOPS * B * H * square,
               act_read_bytes=s_bytes, act_write_bytes=s_bytes, rows=rows),
        OpCost(name="attn_value", kind="attention", flops=2 * B * H * executed * D,
               act_read_bytes=s_bytes, kv_read_bytes=kv_read / 2, act_write_bytes=o_bytes, rows=rows),
    ]


def expected_experts_touched(tokens: Number, num_experts: int, experts_per_token: int) -> Number:
    """Expected number of distinct experts that `tokens` tokens route to, each choosing
    `experts_per_token` of `num_experts` uniformly: `E * (1 - (1 - k/E) ** tokens)`."""
    if num_experts <= 1:
        return np.ones_like(np.asarray(tokens, dtype=float)) if np.ndim(tokens) else 1.0
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


@dataclass(frozen=True, kw_only=True)
class ShardDims:
    """Per-GPU sizes of one layer under tensor parallelism of degree `tp` (Megatron-LM: Shoeybi et al.
    2019, arXiv:1909.08053): query heads, FFN width and vocabulary are split; KV heads are split when
    `tp` divides them, else replicated so each GPU holds one (as vLLM does)."""

    tp: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int

    @classmethod
    def of(cls, model: ModelSpec, tp: int = 1) -> ShardDims:
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise SpecError(f"tp: must be a positive integer, got {tp!r}")
        if model.num_heads % tp:
            raise SpecError(f"tp: {tp} does not divide {model.name}'s num_heads={model.num_heads}")
        if model.num_kv_heads % tp and tp % model.num_kv_heads:
            raise SpecError(f"tp: {tp} neither divides nor is a multiple of {model.name}'s "
                            f"num_kv_heads={model.num_kv_heads}")
        if model.ffn_size % tp:
            raise SpecError(f"tp: {tp} does not divide {model.name}'s ffn_size={model.ffn_size}")
        return cls(tp=tp, num_heads=model.num_heads // tp,
                   num_kv_heads=max(1, model.num_kv_heads // tp),
                   ffn_size=model.ffn_size // tp, vocab_size=-(-model.vocab_size // tp))


@dataclass(frozen=True, kw_only=True)
class ForwardModel:
    """Cost functions of every operator of `model` at `precision`, on one GPU of a `tp`-way group.

    Each method has the signature `(batch, q_len, kv_len)` and returns an `OpCost` for one layer
    (per-layer operators) or for the whole model (`embed`, `pos_embed`, `final_norm`, `lm_head`).
    """

    model: ModelSpec
    precision: Precision
    attention: str = "fused"
    tp: int = 1
    all_logits: bool = False
    attention_flops: str = "executed"
    fused_qkv: bool = False  # one qkv_proj GEMM instead of q_proj, k_proj, v_proj
    fused_gate_up: bool = False  # one gate_up_proj GEMM instead of gate_proj, up_proj (gated FFNs)

    def __post_init__(self) -> None:
        for flag in ("all_logits", "fused_qkv", "fused_gate_up"):
            if not isinstance(getattr(self, flag), bool):
                raise SpecError(f"{flag}: must be true or false, got {getattr(self, flag)!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise SpecError(f"attention: must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention!r}")
        if self.attention_flops not in FLOP_CONVENTIONS:
            raise SpecError(f"attention_flops: must be one of {', '.join(FLOP_CONVENTIONS)}, "
                            f"got {self.attention_flops!r}")
        object.__setattr__(self, "dims", ShardDims.of(self.model, self.tp))
        object.__setattr__(self, "kv_spec", self.model.kv_cache(self.precision).sharded(tp=self.tp))

    # ---- helpers -------------------------------------------------------------------------------
    def _linear(self, name: str, tokens: Number, d_in: int, d_out: int, bias: bool,
                weight_copies: Number = 1.0, per_layer: bool = True, rows: Number | None = None,
                embedding: bool = False) -> OpCost:
        """`tokens x d_in @ d_in x d_out`; `weight_copies` distinct weight matrices are read (MoE).
        `embedding`: the matrix is stored at the embedding format (lm_head)."""
        p = self.precision
        matrix = p.embedding_matrix_bytes(d_in, d_out) if embedding else p.matrix_bytes(d_in, d_out)
        w = matrix + (d_out * p.act_bytes if bias else 0.0)
        return OpCost(name=name, kind="matmul", flops=2 * tokens * d_in * d_out + (tokens * d_out if bias else 0),
                      weight_bytes=w * weight_copies, act_read_bytes=tokens * d_in * p.act_bytes,
                      act_write_bytes=tokens * d_out * p.act_bytes, per_layer=per_layer,
                      rows=tokens if rows is None else rows)

    def _norm(self, name: str, tokens: Number, per_layer: bool = True) -> OpCost:
        m, a = self.model, self.precision.act_bytes
        n_w = 2 if m.norm_kind == "layernorm" else 1
        return OpCost(name=name, kind="norm", flops=NORM_FLOPS[m.norm_kind] * tokens * m.hidden_size,
                      weight_bytes=n_w * m.hidden_size * a, act_read_bytes=tokens * m.hidden_size * a,
                      act_write_bytes=tokens * m.hidden_size * a, per_layer=per_layer, rows=tokens)

    def _residual(self, name: str, tokens: Number) -> OpCost:
        h, a = self.model.hidden_size, self.precision.act_bytes
        return OpCost(name=name, kind="elementwise", flops=tokens * h, act_read_bytes=2 * tokens * h * a,
                      act_write_bytes=tokens * h * a, rows=tokens)

    def _allreduce(self, name: str, tokens: Number) -> OpCost:
        """Ring all-reduce of the `tokens x hidden` activations: each GPU sends 2(t-1)/t of them."""
        t = self.tp
        msg = tokens * self.model.hidden_size * self.precision.act_bytes
        return OpCost(name=name, kind="comm", flops=tokens * self.model.hidden_size * (t - 1) / t,
                      comm_bytes=2 * (t - 1) / t * msg, rows=tokens)

    @property
    def head_dim(self) -> int:
        return self.model.head_dim

    # ---- operators, in forward order -------------------------------------------------------------
    def embed(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        tokens = batch * q_len
        h, p = self.model.hidden_size, self.precision
        return OpCost(name="embed", kind="embedding", weight_bytes=tokens * h * p.embedding_bytes,
                      act_write_bytes=tokens * h * p.act_bytes, per_layer=False, rows=tokens)

    def pos_embed(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        tokens = batch * q_len
        h, p = self.model.hidden_size, self.precision
        return OpCost(name="pos_embed", kind="embedding", flops=tokens * h,
                      weight_bytes=tokens * h * p.embedding_bytes, act_read_bytes=tokens * h * p.act_bytes,
                      act_write_bytes=tokens * h * p.act_bytes, per_layer=False, rows=tokens)

    def attn_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._norm("attn_norm", batch * q_len)

    def q_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._linear("q_proj", batch * q_len, self.model.hidden_size,
                            self.dims.num_heads * self.head_dim, self.model.qkv_bias)

    def qkv_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Q, K and V as one GEMM over the concatenated weight: the input is read once."""
        return self._linear("qkv_proj", batch * q_len, self.model.hidden_size,
                            (self.dims.num_heads + 2 * self.dims.num_kv_heads) * self.head_dim,
                            self.model.qkv_bias)

    def k_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._linear("k_proj", batch * q_len, self.model.hidden_size,
                            self.dims.num_kv_heads * self.head_dim, self.model.qkv_bias)

    def v_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._linear("v_proj", batch * q_len, self.model.hidden_size,
                            self.dims.num_kv_heads * self.head_dim, self.model.qkv_bias)

    def rope(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        tokens, a = batch * q_len, self.precision.act_bytes
        rotated = tokens * (self.dims.num_heads + self.dims.num_kv_heads) * self.model.rotary_dim
        return OpCost(name="rope", kind="elementwise", flops=ROPE_FLOPS * rotated,
                      act_read_bytes=rotated * a, act_write_bytes=rotated * a, rows=tokens)

    def kv_write(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """The new tokens' K and V appended to the cache (read at activation, written at KV precision)."""
        kv = self.kv_spec  # the one KV formula: 2 (K and V) x KV heads per GPU x head_dim x bytes
        tokens = batch * q_len
        values = tokens * kv.bytes_per_token_per_layer / kv.element_bytes
        return OpCost(name="kv_write", kind="elementwise", act_read_bytes=values * self.precision.act_bytes,
                      kv_write_bytes=tokens * kv.bytes_per_token_per_layer, rows=tokens)

    def attention_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """`[attention]` (fused) or `[attn_score, attn_softmax, attn_value]` (naive)."""
        return attention_parts(batch, q_len, kv_len, num_heads=self.dims.num_heads,
                               num_kv_heads=self.dims.num_kv_heads, head_dim=self.head_dim,
                               act_bytes=self.precision.act_bytes, kv_bytes=self.precision.kv_bytes,
                               impl=self.attention, causal=True, flops=self.attention_flops,
                               window=self.model.sliding_window)

    def o_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._linear("o_proj", batch * q_len, self.dims.num_heads * self.head_dim,
                            self.model.hidden_size, self.model.out_bias)

    def attn_residual(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._residual("attn_residual", batch * q_len)

    def mlp_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._norm("mlp_norm", batch * q_len)

    def router(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._linear("router", batch * q_len, self.model.hidden_size, self.model.num_experts, False)

    def _expert_rows_and_copies(self, batch: Number, q_len: Number) -> tuple[Number, Number]:
        """Token rows through the FFN matrices, and how many distinct expert weights are read."""
        m, tokens = self.model, batch * q_len
        touched = expected_experts_touched(tokens, m.num_experts, m.experts_per_token)
        return tokens * (m.experts_per_token + m.shared_experts), touched + m.shared_experts

    def gate_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        rows, copies = self._expert_rows_and_copies(batch, q_len)
        return self._linear("gate_proj", rows, self.model.hidden_size, self.dims.ffn_size,
                            self.model.mlp_bias, copies)

    def gate_up_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        """Gate and up projections as one GEMM (gated FFNs only): the input is read once."""
        rows, copies = self._expert_rows_and_copies(batch, q_len)
        return self._linear("gate_up_proj", rows, self.model.hidden_size, 2 * self.dims.ffn_size,
                            self.model.mlp_bias, copies)

    def up_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        rows, copies = self._expert_rows_and_copies(batch, q_len)
        return self._linear("up_proj", rows, self.model.hidden_size, self.dims.ffn_size,
                            self.model.mlp_bias, copies)

    def act(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        rows, _ = self._expert_rows_and_copies(batch, q_len)
        n, a = rows * self.dims.ffn_size, self.precision.act_bytes
        reads = 2 if self.model.ffn_kind == "swiglu" else 1
        return OpCost(name="act", kind="elementwise", flops=ACT_FLOPS[self.model.ffn_kind] * n,
                      act_read_bytes=reads * n * a, act_write_bytes=n * a, rows=rows)

    def down_proj(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        rows, copies = self._expert_rows_and_copies(batch, q_len)
        return self._linear("down_proj", rows, self.dims.ffn_size, self.model.hidden_size,
                            self.model.mlp_bias, copies)

    def mlp_residual(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._residual("mlp_residual", batch * q_len)

    def final_norm(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        return self._norm("final_norm", batch * q_len, per_layer=False)

    def lm_head(self, batch: Number, q_len: Number, kv_len: Number) -> OpCost:
        rows = batch * q_len if self.all_logits else batch
        return self._linear("lm_head", rows, self.model.hidden_size, self.dims.vocab_size, False,
                            per_layer=False, embedding=True)

    # ---- the pass ----------------------------------------------------------------------------------
    def layer_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """The operators of one transformer block, in execution order."""
        m = self.model
        ops = [self.attn_norm(batch, q_len, kv_len)]
        if self.fused_qkv:
            ops.append(self.qkv_proj(batch, q_len, kv_len))
        else:
            ops += [self.q_proj(batch, q_len, kv_len), self.k_proj(batch, q_len, kv_len),
                    self.v_proj(batch, q_len, kv_len)]
        if m.pos_encoding == "rope":
            ops.append(self.rope(batch, q_len, kv_len))
        ops.append(self.kv_write(batch, q_len, kv_len))
        ops += self.attention_ops(batch, q_len, kv_len)
        ops.append(self.o_proj(batch, q_len, kv_len))
        if self.tp > 1:
            ops.append(self._allreduce("attn_allreduce", batch * q_len))
        ops += [self.attn_residual(batch, q_len, kv_len), self.mlp_norm(batch, q_len, kv_len)]
        if m.is_moe:
            ops.append(self.router(batch, q_len, kv_len))
        if m.ffn_kind == "swiglu" and self.fused_gate_up:
            ops.append(self.gate_up_proj(batch, q_len, kv_len))
        elif m.ffn_kind == "swiglu":
            ops += [self.gate_proj(batch, q_len, kv_len), self.up_proj(batch, q_len, kv_len)]
        else:
            ops.append(self.up_proj(batch, q_len, kv_len))
        ops += [self.act(batch, q_len, kv_len), self.down_proj(batch, q_len, kv_len)]
        if self.tp > 1:
            ops.append(self._allreduce("mlp_allreduce", batch * q_len))
        ops.append(self.mlp_residual(batch, q_len, kv_len))
        return ops

    def head_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """Operators before the first block (embeddings)."""
        ops = [self.embed(batch, q_len, kv_len)]
        if self.model.pos_encoding == "learned":
            ops.append(self.pos_embed(batch, q_len, kv_len))
        return ops

    def tail_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """Operators after the last block (final norm, logits)."""
        return [self.final_norm(batch, q_len, kv_len), self.lm_head(batch, q_len, kv_len)]

    def forward_ops(self, batch: Number, q_len: Number, kv_len: Number) -> list[OpCost]:
        """Every operator of one forward pass, per-layer ones multiplied by the number of layers."""
        L = self.model.num_layers
        return (self.head_ops(batch, q_len, kv_len)
                + [op.scaled(L) for op in self.layer_ops(batch, q_len, kv_len)]
                + self.tail_ops(batch, q_len, kv_len))
