"""A decoder-only transformer built from a `ModelSpec`, in plain torch: the Llama family and today's
models built on it, and the GPT-2 family (`Transformer`, one `Block` per layer).

Letters: B batch, T new tokens per sequence, C hidden size, H / H_kv query / key-value heads,
D head dim, F FFN width, V vocabulary, E experts, K experts per token.

- Llama family: RMSNorm (Zhang & Sennrich 2019), rotary position embeddings (Su et al. 2021,
  arXiv:2104.09864; `rope`), grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245), SwiGLU
  (Shazeer 2020, arXiv:2002.05202). Per layer (`ModelSpec.layer_kinds`): q/k norms, sliding-window
  and chunked layers, NoPE layers, learned sinks, soft-capping, sandwich or post norms, dense first layers,
  the experts of `moe.MoE` and the latent attention of `mla.MLAttention`.
- GPT-2 family (Radford et al. 2019): LayerNorm, learned positions, GELU (`gelu_new`), biases, tied
  embeddings.

Numerics follow `transformers` (`models/<family>/modeling_<family>.py`), so fp32 greedy decoding
reproduces `generate()`. Q, K and V are one fused matrix and SwiGLU's gate and up another; a
`Recorder` times these fused GEMMs as `qkv_proj` and `gate_up_proj`. Matrices are stored `(out, in)`
or, with `weight_layout="in_out"`, `(in, out)`; every operator with a faster implementation runs
through the model's ops object (`llmperf.engine.ops.ops_for`). The forward pass takes the step's
`StepMeta` and returns the logits of each sequence's last position (every position with
`all_logits=True`). Design notes: docs/engine.md, "The model".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmperf.analysis.vocabulary import Op
from llmperf.engine.attention import BACKENDS, get_backend
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.engine.ops import TorchOps, ops_for
from llmperf.engine.parts import (
    _ACTIVATIONS,
    DTYPES,
    ForwardContext,
    Norm,
    _linear_params,
    _mat,
    check_buildable,
    embedding_factor,
    finish_logits,
    layer_attention,
    linear_mixer,
    query_temperature,
    resolve_layout,
    shared_norm_block,
    torch_dtype,
)
from llmperf.engine.rope import RotaryTable, apply_rope, rope_inv_freq
from llmperf.engine.step import StepMeta
from llmperf.specs import ModelSpec

# The fused projections are the model's structure (one GEMM each, as vLLM runs them), timed under their fused names
_QKV, _GATE_UP = Op.qkv_proj.value, Op.gate_up_proj.value
# A tensor-parallel layer's two sums over ranks (`llmperf.engine.tensor_parallel`), named as priced
_ATTN_REDUCE, _MLP_REDUCE = Op.attn_allreduce.value, Op.mlp_allreduce.value
_ATTN_GATE = Op.attn_gate.value  # the full layers' sigmoid output gate (Qwen3-Next, Qwen3.5)
# ... and a vocabulary-parallel shard's two per pass: the embedding's sum and the logit slices' gather
_EMBED_REDUCE, _LOGITS_GATHER = Op.embed_allreduce.value, Op.logits_gather.value

class Block(nn.Module):
    """One transformer layer. Parameters (names used by `weights.py`):

    attn_norm; qkv_weight (C, q_size + 2 kv_size) [+ qkv_bias]; o_weight (q_size, C) [+ o_bias]; [q_norm, k_norm
    (D; MiniMax-M2: q_size, kv_size)]; [sinks (H): gpt-oss]; or, for multi-head latent attention, `attn`
    (`llmperf.engine.mla.MLAttention`); [post_attn_norm]; mlp_norm (none with Cohere's `shared_input_norm`);
    dense MLP: up_weight (C, F), or (C, 2F) for a gated FFN as [gate | up], [+ up_bias], down_weight (F, C)
    [+ down_bias]; or a mixture of experts, `moe_ffn` (`llmperf.engine.moe.MoE`); [post_mlp_norm]. Shapes are
    for `weight_layout="in_out"` (y = x @ W + b); "out_in" stores each matrix transposed (`F.linear`).

    A `linear` layer has `linear_attn` in place of attention (`parts.linear_mixer`: Gated DeltaNet or Mamba-2);
    Nemotron-H's layers are one sublayer each: a mixer without mlp_norm and FFN, or an FFN without attn_norm and
    attention. With `attn_output_gate` a full layer's qkv_weight is [q | k | v | gate] and the attention output
    is multiplied by sigmoid(gate) before o_proj.

    `reduce` (None: a whole model): a tensor-parallel shard's in-place sum over ranks of the o projection's and the
    FFN's outputs, before the post norms and residual adds (set by `tensor_parallel.shard_model`: no one-call decode).

    The layer's kind (`ModelSpec.layer_kinds`) decides its attention (full, sliding, chunked: the model's `LayerAttn`),
    whether it rotates positions (not Llama 4's NoPE layers) and whether its FFN is MoE (dense ones: `ffn_size`).
    """

    reduce: Callable[[torch.Tensor], None] | None = None  # a class default: nothing to look up per layer

    def __init__(self, spec: ModelSpec, index: int, ops: TorchOps, **kw: Any) -> None:
        super().__init__()
        self.index = index
        kind = self.kind = spec.layer_kinds()[index]
        in_out = self.in_out = ops.in_out
        self.ops = ops
        C, F_ = spec.hidden_size, spec.ffn_size
        self.H, self.H_kv, self.D = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.q_size, spec.kv_size
        self.swiglu = spec.ffn_kind == "swiglu"
        self.ffn_size = F_
        self.act = _ACTIVATIONS[spec.hidden_act]
        self.silu = self.act is F.silu
        self.rope = spec.pos_encoding == "rope" and kind.rope
        self.rope_interleaved = spec.rope_interleaved
        # Gemma 3's sliding layers rotate with their own base (the model's local table)
        self.local_rope = kind.attention == "sliding" and spec.rope_local_theta is not None
        self.moe, self.residual = kind.moe, spec.residual_multiplier  # Granite: sublayer outputs times it
        self.top_k = spec.experts_per_token
        norm = dict(eps=spec.norm_eps, ops=ops, offset=spec.norm_offset, **kw)
        # Nemotron-H's layers of one sublayer: a token mixer alone (kind.ffn False) or an FFN alone (attention none)
        self.mixer, self.ffn = kind.attention != "none", kind.ffn
        self.attn_norm = Norm(spec.norm_kind, C, **norm) if self.mixer else None
        self.mlp_norm = Norm(spec.norm_kind, C, **norm) if self.ffn and not spec.shared_input_norm else None
        self.post_attn_norm = Norm(spec.norm_kind, C, **norm) if spec.sandwich_norms else None
        self.post_mlp_norm = Norm(spec.norm_kind, C, **norm) if spec.sandwich_norms else None
        self.post_norm = spec.post_norm  # OLMo 2/3, EXAONE 4: attn_norm / mlp_norm norm a sublayer's output
        # Llama 4: a weightless L2 norm on q and k of its rotary layers, after the rotation
        self.qk_l2 = spec.qk_norm == "l2" and self.rope
        self.norm_eps = spec.norm_eps
        # Llama 4's NoPE layers, Ministral 3's every layer: queries times a factor that grows with the position
        self.q_temperature = query_temperature(spec, self.rope)
        self.attn: nn.Module | None = None
        self.linear_attn: nn.Module | None = None
        # Qwen3-Next / Qwen3.5 full layers: q_proj also yields a gate per head, stored after v (`_attend`)
        self.gate_size = self.q_size if spec.attn_output_gate else 0
        if kind.attention in ("linear", "none"):  # a linear mixer (own projections and state), or no mixer at all
            self.linear_attn = linear_mixer(spec, index, ops, **kw) if kind.attention == "linear" else None
            self.q_norm = self.k_norm = self.sinks = None
        elif spec.is_mla:
            from llmperf.engine.mla import MLAttention
            self.attn = MLAttention(spec, index, ops, **kw)
        else:
            _linear_params(self, "qkv", C, self.q_size + 2 * self.kv_size + self.gate_size, spec.qkv_bias, in_out,
                           **kw)
            _linear_params(self, "o", self.q_size, C, spec.out_bias, in_out, **kw)
            rms = spec.qk_norm in ("rmsnorm", "rmsnorm_across_heads")
            across = spec.qk_norm == "rmsnorm_across_heads"  # MiniMax-M2, OLMo 2/3: one weight of H * D, H_kv * D
            self.q_norm = Norm("rmsnorm", self.q_size if across else self.D, **norm) if rms else None
            self.k_norm = Norm("rmsnorm", self.kv_size if across else self.D, **norm) if rms else None
            self.sinks = nn.Parameter(torch.empty(self.H, **kw)) if spec.attn_sinks else None
        self.moe_ffn: nn.Module | None = None
        if self.moe:
            from llmperf.engine.moe import MoE
            self.moe_ffn = MoE(spec, index, ops, **kw)
        elif self.ffn:
            up_rows = 2 * F_ if self.swiglu else F_
            _linear_params(self, "up", C, up_rows, spec.mlp_bias, in_out, **kw)
            _linear_params(self, "down", F_, C, spec.mlp_bias, in_out, **kw)

    # ---- attention ------------------------------------------------------------------------------
    def _qkv(self, h: torch.Tensor, rec: Any) -> torch.Tensor:
        """[q | k | v] `(B, T, q_size + 2 kv_size)`: one fused GEMM, timed as `Op.qkv_proj` (what runs
        is what is measured; `FUSED_PARTS` joins it to the q/k/v predictions)."""
        with rec.op(_QKV, self.index):
            return self.ops.linear(h, self.qkv_weight, self.qkv_bias)

    # ---- MLP ------------------------------------------------------------------------------------
    def _ffn(self, h: torch.Tensor, up_w: torch.Tensor, up_b: torch.Tensor | None, down_w: torch.Tensor,
             down_b: torch.Tensor | None, rec: Any, linear: Any) -> torch.Tensor:
        i = self.index
        if self.swiglu:
            with rec.op(_GATE_UP, i):  # one fused GEMM over [gate | up], timed as such
                gate_up = linear(h, up_w, up_b)
            with rec.op("act", i):
                a = self.ops.glu(gate_up, self.act)
        else:
            with rec.op("up_proj", i):
                a = linear(h, up_w, up_b)
            with rec.op("act", i):
                a = self.act(a)
        with rec.op("down_proj", i):
            return linear(a, down_w, down_b)

    def _norm(self, norm: Norm, x: torch.Tensor, ctx: ForwardContext, name: str) -> torch.Tensor:
        with ctx.rec.op(name, self.index):
            return norm.forward(x)

    def mlp(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        rec, i = ctx.rec, self.index
        h = x if self.post_norm else self._norm(self.mlp_norm, x, ctx, "mlp_norm")
        if self.moe_ffn is not None:
            y = self.moe_ffn.forward(h, rec)
        else:
            y = self._ffn(h, self.up_weight, self.up_bias, self.down_weight, self.down_bias, rec, self.ops.linear)
        if self.reduce is not None:  # tensor parallel: the ranks' partial sums, before the post norm
            with rec.op(_MLP_REDUCE, i):
                self.reduce(y)
        if self.post_mlp_norm is not None:
            with rec.op("post_mlp_norm", i):
                y = self.post_mlp_norm.forward(y)
        y = self._norm(self.mlp_norm, y, ctx, "mlp_norm") if self.post_norm else y
        with rec.op("mlp_residual", i):
            return (y if self.residual == 1.0 else y.mul_(self.residual)).add_(x)

    def _rotate(self, qkv: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """q and k heads `(N, H + H_kv, D)`, normed (q/k norm), rotated and scaled as the layer does."""
        rec, i, H, H_kv = ctx.rec, self.index, self.H, self.H_kv
        qk = qkv[:, :H + H_kv]
        if self.q_norm is not None:  # Qwen3, Gemma 3: RMSNorm of every q and k head (MiniMax-M2: across them), in place
            with rec.op("qk_norm", i):  # (qkv is this layer's own GEMM output: no fresh q, k or concatenation)
                self.q_norm.heads_(qkv[:, :H])
                self.k_norm.heads_(qkv[:, H:H + H_kv])
        if self.rope:  # q and k heads are adjacent: one rotation for both
            cos, sin = (ctx.cos_local, ctx.sin_local) if self.local_rope else (ctx.cos, ctx.sin)
            with rec.op("rope", i):
                qk = self.ops.rope(qkv, H + H_kv, cos, sin, self.rope_interleaved,
                                   in_place=True)  # (N, H + H_kv, D), over qkv's q and k where the ops can
        if self.qk_l2:
            with rec.op("qk_norm", i):
                qk = F.rms_norm(qk.float(), (self.D,), eps=self.norm_eps).to(qk.dtype)
        if self.q_temperature is not None:  # Llama 4 attn_temperature_tuning, Ministral 3 (queries only)
            scales = self.q_temperature(ctx.positions.reshape(-1).float()).to(qk.dtype)  # (N,)
            qk = torch.cat((qk[:, :H] * scales[:, None, None], qk[:, H:]), dim=1)
        return qk

    def attention(self, x: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]],
                  ctx: ForwardContext) -> torch.Tensor:
        """`x` (1, N, C): the step's tokens, one group after another; `spans` gives each group's
        (meta, B, T, first row). The norm and the QKV / output GEMMs run once over all N tokens (each
        weight read once), RoPE too (the tables are per token); the KV write and attention run per
        group, each with its own metadata (a plain step is one group)."""
        rec, i = ctx.rec, self.index
        h = x if self.post_norm else self._norm(self.attn_norm, x, ctx, "attn_norm")
        if self.linear_attn is not None:  # Gated DeltaNet, Mamba-2: own projections and per-sequence state
            o = self.linear_attn.forward(h, spans, ctx)
        elif self.attn is not None:  # multi-head latent attention: its own projections and cache
            o = self.attn.forward(h, spans, ctx)
        else:
            o = self._attend(h, spans, ctx)
        if self.post_attn_norm is not None:
            with rec.op("post_attn_norm", i):
                o = self.post_attn_norm.forward(o)
        o = self._norm(self.attn_norm, o, ctx, "attn_norm") if self.post_norm else o
        with rec.op("attn_residual", i):  # o is this layer's own buffer: add the residual into it
            return (o if self.residual == 1.0 else o.mul_(self.residual)).add_(x)

    def _attend(self, h: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]],
                ctx: ForwardContext) -> torch.Tensor:
        rec, i = ctx.rec, self.index
        N = h.shape[1]
        H, H_kv, D = self.H, self.H_kv, self.D
        gated = self.gate_size > 0
        qkv = self._qkv(h, rec).view(N, H * (2 if gated else 1) + 2 * H_kv, D)  # [q | k | v (| gate)]
        qk = self._rotate(qkv, ctx)
        outs = []
        for meta, B, T, lo in spans:
            part = qk[lo:lo + B * T].view(B, T, H + H_kv, D)
            q, k = part[:, :, :H], part[:, :, H:]
            v = qkv[lo:lo + B * T, H + H_kv:H + 2 * H_kv].view(B, T, H_kv, D)
            if meta.store is not None:
                with rec.op("kv_write", i):
                    meta.store.write(i, k, v, meta)
            outs.append(ctx.attend(i, q, k, v, meta, rec).reshape(B * T, H * D))
        o = (outs[0] if len(outs) == 1 else torch.cat(outs))[None]  # (1, N, H*D)
        if gated:  # Qwen3-Next / Qwen3.5: the output times sigmoid(gate), in the activation dtype
            with rec.op(_ATTN_GATE, i):
                o = o * torch.sigmoid(qkv[:, H + 2 * H_kv:].reshape(1, N, H * D))
        with rec.op("o_proj", i):
            o = self.ops.linear(o, self.o_weight, self.o_bias)  # (1, N, C)
        if self.reduce is not None:  # tensor parallel: the ranks' partial sums, before the post norm
            with rec.op(_ATTN_REDUCE, i):
                self.reduce(o)
        return o

    def forward(self, x: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]],
                ctx: ForwardContext) -> torch.Tensor:
        if self.mlp_norm is None and self.mixer and self.ffn:  # Cohere: one norm, attention and FFN side by side
            return shared_norm_block(self, x, spans, ctx)
        x = self.attention(x, spans, ctx) if self.mixer else x
        return self.mlp(x, ctx) if self.ffn else x


class Transformer(nn.Module):
    """The whole decoder. Build with `Transformer(spec, dtype="fp32", device="cpu")` (parameters left
    uninitialised) and fill with `llmperf.engine.weights` (`init_random`, `load_hf_state_dict`), or use
    `weights.build_model(spec, seed=...)` / `weights.from_pretrained(path)`.

    Parameters: embed_weight (V, C); pos_weight (max_positions, C) (learned positions);
    layers.{i}.*; final_norm; lm_head_weight (C, V) ("in_out") or (V, C), or when tied the embedding
    itself (V, C).

    Vocabulary-parallel (a tensor-parallel shard, `tensor_parallel.shard_model` sets these): the embedding
    and the LM head hold the rows `[vocab_start, vocab_start + V_r)` of the vocabulary only; a token
    outside them embeds as a zero row and `embed_reduce` sums the shards' rows in place; `gather_logits`
    turns each shard's `(..., V_r)` logits into the whole padded vocabulary's `(..., w V_r)`, cut to V.
    """

    vocab_start = 0  # class defaults: a whole model looks nothing up per call
    embed_reduce: Callable[[torch.Tensor], None] | None = None
    gather_logits: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, spec: ModelSpec, *, dtype: str | torch.dtype = "fp32",
                 device: str | torch.device = "cpu", attention: str = "sdpa", weight_layout: str = "auto") -> None:
        super().__init__()
        check_buildable(spec)
        self.spec = spec
        self.dtype = torch_dtype(dtype)
        device = torch.device(device)
        self.in_out = resolve_layout(weight_layout)
        self.weight_layout = "in_out" if self.in_out else "out_in"
        self.ops = ops_for(device, self.dtype, self.in_out)  # what runs the operators (the one choice)
        kw = dict(dtype=self.dtype, device=device)
        C = spec.hidden_size
        self.embed_weight = nn.Parameter(torch.empty(spec.vocab_size, C, **kw))
        self.pos_weight = (nn.Parameter(torch.empty(spec.max_positions, C, **kw))
                           if spec.pos_encoding == "learned" else None)
        self.layers = nn.ModuleList(Block(spec, i, self.ops, **kw) for i in range(spec.num_layers))
        self.final_norm = Norm(spec.norm_kind, C, spec.norm_eps, self.ops, offset=spec.norm_offset, **kw)
        if spec.tied_embeddings:  # the embedding itself, (V, C) whatever the layout
            self.lm_head_weight = self.embed_weight
            self._head_ops = ops_for(device, self.dtype) if self.in_out else self.ops
        else:
            self.lm_head_weight = _mat(C, spec.vocab_size, self.in_out, **kw)
            self._head_ops = self.ops
        self.embed_factor = embedding_factor(spec, self.dtype)
        self.rotary = RotaryTable(spec, device) if spec.pos_encoding == "rope" else None
        self.rotary_local = (RotaryTable(spec, device, local=True)
                             if self.rotary is not None and spec.rope_local_theta is not None else None)
        # Math-changing spec fields (each layer's softmax scale, window, chunk, sinks, soft-cap),
        # honoured by every backend through the step metadata
        self.attn_params = layer_attention(spec, [getattr(b, "sinks", None) for b in self.layers])
        self.set_attention(attention)
        self.decode_in_one_call = True  # False: every operator from Python (side-by-side measurements)
        self.eos_token_id: int | tuple[int, ...] | None = None  # the checkpoint's (from_pretrained)
        self.requires_grad_(False)  # an inference engine: no autograd graph, ever
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    def set_attention(self, backend: str) -> None:
        """Choose the attention backend: one of `BACKENDS` ("sdpa", "naive", "triton")."""
        self._attend = get_backend(backend)
        self.attention_backend = backend

    def set_ops(self, ops: TorchOps) -> None:
        """Run the operators on `ops` instead (side-by-side measurements; `ops_for` chose the default)."""
        if ops.in_out != self.in_out:
            raise ValueError(f"ops: in_out={ops.in_out} does not match the model's weight_layout {self.weight_layout}")
        for module in self.modules():
            if module is not self and isinstance(getattr(module, "ops", None), TorchOps):  # blocks, norms, MLA, MoE
                module.ops = ops
        self._head_ops = self._head_ops if self.in_out and self.spec.tied_embeddings else ops
        self.ops = ops

    def forward(self, tokens: torch.Tensor, meta: StepMeta | None = None, *, all_logits: bool = False,
                rec: Any = NULL_RECORDER, attend: Any = None) -> torch.Tensor:
        """Logits `(B, V)` of each sequence's last new token, or `(B, T, V)` with `all_logits`.

        `tokens` (B, T) int64: T new tokens of each of B sequences. `meta` places them (positions,
        cache); None runs a full causal forward from position 0 without a cache. `attend`: an
        attention function (`attention.get_backend(name)`) for this call; default: the model's.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected (B, T) token ids, got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if meta is None:
            meta = StepMeta.no_cache(B, T, tokens.device)
        x = self._layers([(tokens, meta)], rec, attend).view(B, T, -1)  # (B, T, C)
        # (B, C): serving engines only need the next token's logits
        return self._logits(x if all_logits else x[:, -1], rec)  # (B, V) or (B, T, V)

    def _logits(self, x: torch.Tensor, rec: Any) -> torch.Tensor:
        with rec.op("final_norm"):
            x = self.final_norm.forward(x)
        with rec.op("lm_head"):
            logits = self._head_ops.linear(x, self.lm_head_weight)  # (..., V), a shard's (..., V_r)
        if self.gather_logits is not None:  # the padding's logits (zero rows) are cut, never sampled
            with rec.op(_LOGITS_GATHER):
                logits = self.gather_logits(logits)[..., :self.spec.vocab_size]  # (..., V)
        return finish_logits(self.spec, logits, rec)  # Granite's and Cohere's scaling, Gemma 2's soft-cap

    def _place(self, tokens: torch.Tensor, meta: StepMeta) -> tuple[int, int]:
        """(B, T) of one group, checked against its metadata, which gets the model's math fields."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected (B, T) token ids, got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if meta.positions.shape != (B, T):
            raise ValueError(f"meta: positions {tuple(meta.positions.shape)} do not match tokens {(B, T)}")
        if meta.max_position >= self.spec.max_positions:
            raise ValueError(f"tokens: positions up to {meta.max_position} exceed the model's "
                             f"max_positions={self.spec.max_positions}")
        meta.window = self.spec.sliding_window if self.spec.layer_types is None else None
        meta.layers = self.attn_params
        return B, T

    def _layers(self, groups: Sequence[tuple[torch.Tensor, StepMeta]], rec: Any, attend: Any) -> torch.Tensor:
        """Embeddings and every layer over the groups' tokens, one group after another: `(1, N, C)`."""
        spans, lo = [], 0
        for tokens, meta in groups:
            B, T = self._place(tokens, meta)
            spans.append((meta, B, T, lo))
            lo += B * T
        if len(groups) == 1:
            tokens, positions = groups[0][0].reshape(1, -1), groups[0][1].positions.reshape(1, -1)
        else:
            tokens = torch.cat([t.reshape(-1) for t, _ in groups])[None]  # (1, N)
            positions = torch.cat([m.positions.reshape(-1) for _, m in groups])[None]  # (1, N)
        cos = sin = cos_local = sin_local = None
        last = max(m.max_position for _, m in groups)
        if self.rotary is not None:
            cos, sin = self.rotary.lookup(positions, last, self.dtype)
        if self.rotary_local is not None:
            cos_local, sin_local = self.rotary_local.lookup(positions, last, self.dtype)
        ctx = ForwardContext(rec, attend or self._attend, cos, sin, positions, cos_local, sin_local)
        with rec.op("embed"):
            x = F.embedding(tokens, self.embed_weight) if self.embed_reduce is None else self._embed_shard(tokens)
        if self.embed_reduce is not None:
            with rec.op(_EMBED_REDUCE):
                self.embed_reduce(x)  # (1, N, C): every token's row, from the shard that holds it
        if self.embed_factor is not None:  # Gemma: sqrt(hidden) in the activation dtype; Granite: its multiplier
            with rec.op("embed_scale"):
                x = x * self.embed_factor
        if self.pos_weight is not None:
            with rec.op("pos_embed"):
                x = x + F.embedding(positions, self.pos_weight)
        # The ops may run a decode step's layers in one call; never a shard's, which would skip its sums
        # (`tensor_parallel.shard_model` turns `decode_in_one_call` off and sets every layer's `reduce`).
        if self.decode_in_one_call and len(spans) == 1 and self.layers[0].reduce is None:
            y = self.ops.decode_layers(self, x, spans[0][0], ctx)
            if y is not None:
                return y
        for layer in self.layers:
            x = layer.forward(x, spans, ctx)  # .forward skips nn.Module hook dispatch
        return x

    def _embed_shard(self, tokens: torch.Tensor) -> torch.Tensor:
        """A vocabulary shard's lookup (vLLM's `VocabParallelEmbedding.forward`): the tokens in its rows, a zero
        row for every other token."""
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.embed_weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.embed_weight)  # (1, N, C)
        return x.masked_fill_(outside[..., None], 0)

    def forward_groups(self, groups: Sequence[tuple[torch.Tensor, StepMeta]], *, rec: Any = NULL_RECORDER,
                       attend: Any = None) -> list[torch.Tensor]:
        """One forward pass over groups of sequences that feed different numbers of new tokens (a
        mixed step: decode tokens and prefill chunks). `groups`: `(tokens (B_g, T_g), meta_g)` per
        group, each placed by its own metadata. Every GEMM, norm and activation runs once over all the
        step's tokens, so each weight is read once per step, as a serving engine does and as the
        simulator prices a mixed step; the KV writes and attention run per group. Returns each group's
        logits `(B_g, V)` of its sequences' last new tokens."""
        if not groups:
            raise ValueError("groups: expected at least one (tokens, meta) group")
        x = self._layers(groups, rec, attend)
        last, lo = [], 0
        for tokens, _ in groups:
            B, T = tokens.shape
            last += [lo + b * T + T - 1 for b in range(B)]
            lo += B * T
        x = x[0, torch.tensor(last, device=x.device)]  # (sum B_g, C): each sequence's last new token
        return list(self._logits(x, rec).split([t.shape[0] for t, _ in groups]))


__all__ = ["BACKENDS", "DTYPES", "Block", "Norm", "RotaryTable", "Transformer", "apply_rope", "rope_inv_freq",
           "torch_dtype"]
