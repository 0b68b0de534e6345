"""A decoder-only transformer built from a `ModelSpec`: the Llama and GPT-2 families, in plain torch.

Letters: B batch, T new tokens per sequence, C hidden size, H / H_kv query / key-value heads,
D head dim, F FFN width, V vocabulary, E experts, K experts per token.

- Llama family (Llama 2/3, Mistral, Qwen2 with `qkv_bias`, Mixtral with `num_experts > 1`): RMSNorm
  (Zhang & Sennrich 2019), rotary position embeddings (Su et al. 2021, arXiv:2104.09864; the
  "rotate half" layout of Hugging Face checkpoints; `linear` and `llama3` frequency scaling), grouped-
  query attention (Ainslie et al. 2023), SwiGLU MLP (Shazeer 2020).
- GPT-2 family: LayerNorm, learned absolute positions, GELU MLP (`gelu_new`, tanh approximation),
  biases everywhere, tied input/output embeddings (Radford et al. 2019).

Numerics follow Hugging Face `transformers` (RMSNorm in fp32 then cast; RoPE tables in fp32, cast to
the activation dtype; router softmax in fp32), so fp32 greedy decoding reproduces `generate()`.

Matrix layout (`weight_layout`): "out_in" (`nn.Linear`'s `(out, in)`, `F.linear`; "auto" is this on
every device) or "in_out" (`x @ W + b`, GPT-2's Conv1D). Every operator that has a faster
implementation somewhere (the GEMMs, RMSNorm, RoPE, SwiGLU's activation, a whole decode step) runs
through the model's ops object (`llmperf.engine.ops.ops_for`: plain torch by default, a faster
implementation where one is chosen), which keeps any other layout of the weights as its private copy.

Fused weights for speed: Q, K and V are one `(C, q_size + 2 kv_size)` matrix and SwiGLU's gate and
up one `(C, 2F)` matrix, so a decode step runs one GEMM where three (two) would do the same work, and
one RoPE call rotates the adjacent q and k heads. A `Recorder` times exactly these fused GEMMs, under
the shared vocabulary's fused names (`qkv_proj`, `gate_up_proj`; `llmperf.analysis.vocabulary.FUSED_PARTS`
joins them to the split predictions): recording never changes what runs.

The forward pass takes the step's metadata (`StepMeta`: positions, cache addressing) and returns the
logits of the last position of each sequence (as serving engines do), or of every position with
`all_logits=True`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmperf.analysis.vocabulary import Op
from llmperf.engine.attention import BACKENDS, get_backend
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.engine.ops import TorchOps, ops_for
from llmperf.engine.rope import RotaryTable, apply_rope, check_rope, rope_inv_freq
from llmperf.engine.step import StepMeta
from llmperf.specs import ModelSpec

# The fused projections are the model's structure (one GEMM each, as vLLM runs them), and the
# recorder times them under their fused names.
_QKV, _GATE_UP = Op.qkv_proj.value, Op.gate_up_proj.value

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}

ENGINE_FAMILIES = ("llama", "gpt2")


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`fp32` / `fp16` / `bf16` (or a torch dtype among those) as a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype}")
        return dtype
    key = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(str(dtype), str(dtype))
    if key not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[key]


# ---------------------------------------------------------------------------------------------------
# Building blocks (parameters only; the math is in `Block.forward`)


class Norm(nn.Module):
    """RMSNorm (`weight`) or LayerNorm (`weight`, `bias`)."""

    def __init__(self, kind: str, size: int, eps: float, ops: TorchOps, **kw: Any) -> None:
        super().__init__()
        self.kind, self.eps, self.shape, self.ops = kind, eps, (size,), ops
        self.weight = nn.Parameter(torch.ones(size, **kw))
        self.bias = nn.Parameter(torch.zeros(size, **kw)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)
        return self.ops.rms_norm(x, self.weight, self.eps)


WEIGHT_LAYOUTS = ("auto", "in_out", "out_in")


def resolve_layout(layout: str) -> bool:
    """True when matrices are stored `(in, out)`: "in_out" only ("auto" is `(out, in)` everywhere)."""
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout: must be one of {', '.join(WEIGHT_LAYOUTS)}, got {layout!r}")
    return layout == "in_out"


def _mat(in_f: int, out_f: int, in_out: bool, **kw: Any) -> nn.Parameter:
    return nn.Parameter(torch.empty((in_f, out_f) if in_out else (out_f, in_f), **kw))


def _linear_params(module: nn.Module, name: str, in_f: int, out_f: int, bias: bool, in_out: bool, **kw: Any) -> None:
    module.register_parameter(f"{name}_weight", _mat(in_f, out_f, in_out, **kw))
    module.register_parameter(f"{name}_bias", nn.Parameter(torch.empty(out_f, **kw)) if bias else None)


class Block(nn.Module):
    """One transformer layer. Parameters (names used by `weights.py`):

    attn_norm; qkv_weight (C, q_size + 2 kv_size) [+ qkv_bias]; o_weight (q_size, C) [+ o_bias];
    mlp_norm; dense MLP: up_weight (C, F), or (C, 2F) for SwiGLU as [gate | up], [+ up_bias],
    down_weight (F, C) [+ down_bias]; MoE: router_weight (C, E), experts_up_weight (E, C, 2F),
    experts_down_weight (E, F, C). Shapes are for `weight_layout="in_out"` (y = x @ W + b);
    "out_in" stores each matrix transposed (y = x @ W^T + b, `F.linear`).
    """

    def __init__(self, spec: ModelSpec, index: int, ops: TorchOps, **kw: Any) -> None:
        super().__init__()
        self.index = index
        in_out = self.in_out = ops.in_out
        self.ops = ops
        C, F_ = spec.hidden_size, spec.ffn_size
        self.H, self.H_kv, self.D = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.q_size, spec.kv_size
        self.swiglu = spec.ffn_kind == "swiglu"
        self.ffn_size = F_
        self.act = _ACTIVATIONS[spec.hidden_act]
        self.silu = self.act is F.silu
        self.rope = spec.pos_encoding == "rope"
        self.moe = spec.num_experts > 1
        self.top_k = spec.experts_per_token
        self.attn_norm = Norm(spec.norm_kind, C, spec.norm_eps, ops, **kw)
        self.mlp_norm = Norm(spec.norm_kind, C, spec.norm_eps, ops, **kw)
        _linear_params(self, "qkv", C, self.q_size + 2 * self.kv_size, spec.qkv_bias, in_out, **kw)
        _linear_params(self, "o", self.q_size, C, spec.out_bias, in_out, **kw)
        up_rows = 2 * F_ if self.swiglu else F_
        if self.moe:
            E = spec.num_experts
            self.router_weight = _mat(C, E, in_out, **kw)
            self.experts_up_weight = nn.Parameter(torch.empty((E, C, up_rows) if in_out else (E, up_rows, C), **kw))
            self.experts_down_weight = nn.Parameter(torch.empty((E, F_, C) if in_out else (E, C, F_), **kw))
        else:
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

    def _moe(self, h: torch.Tensor, rec: Any) -> torch.Tensor:
        """Mixtral routing: softmax over experts in fp32, top-k, renormalise, weighted sum of experts."""
        B, T, C = h.shape
        flat = h.reshape(B * T, C)  # (N, C)
        with rec.op("router", self.index):
            logits = self.ops.plain(flat, self.router_weight)  # (N, E)
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights, chosen = torch.topk(weights, self.top_k, dim=-1)  # (N, K)
            weights = weights / weights.sum(dim=-1, keepdim=True)  # fp32, as Hugging Face keeps them
        out = torch.zeros_like(flat)
        for e in torch.unique(chosen).tolist():
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            # experts run plain: their weights are views made per step, not packable parameters
            y = self._ffn(flat[rows], self.experts_up_weight[e], None, self.experts_down_weight[e], None, rec,
                          self.ops.plain)
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out.view(B, T, C)

    def mlp(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        rec, i = ctx.rec, self.index
        with rec.op("mlp_norm", i):
            h = self.mlp_norm.forward(x)
        if self.moe:
            y = self._moe(h, rec)
        else:
            y = self._ffn(h, self.up_weight, self.up_bias, self.down_weight, self.down_bias, rec, self.ops.linear)
        with rec.op("mlp_residual", i):
            return y.add_(x)

    def attention(self, x: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]],
                  ctx: ForwardContext) -> torch.Tensor:
        """`x` (1, N, C): the step's tokens, one group after another; `spans` gives each group's
        (meta, B, T, first row). The norm and the QKV / output GEMMs run once over all N tokens (each
        weight read once), RoPE too (the tables are per token); the KV write and attention run per
        group, each with its own metadata (a plain step is one group)."""
        rec, i = ctx.rec, self.index
        N = x.shape[1]
        H, H_kv, D = self.H, self.H_kv, self.D
        with rec.op("attn_norm", i):
            h = self.attn_norm.forward(x)
        qkv = self._qkv(h, rec).view(N, H + 2 * H_kv, D)
        if self.rope:  # q and k heads are adjacent: one rotation for both
            with rec.op("rope", i):
                qk = self.ops.rope(qkv, H + H_kv, ctx.cos, ctx.sin)  # (N, H + H_kv, D)
        else:
            qk = qkv[:, :H + H_kv]
        outs = []
        for meta, B, T, lo in spans:
            part = qk[lo:lo + B * T].view(B, T, H + H_kv, D)
            q, k = part[:, :, :H], part[:, :, H:]
            v = qkv[lo:lo + B * T, H + H_kv:].view(B, T, H_kv, D)
            if meta.store is not None:
                with rec.op("kv_write", i):
                    meta.store.write(i, k, v, meta)
            outs.append(ctx.attend(i, q, k, v, meta, rec).reshape(B * T, H * D))
        o = (outs[0] if len(outs) == 1 else torch.cat(outs))[None]  # (1, N, H*D)
        with rec.op("o_proj", i):
            o = self.ops.linear(o, self.o_weight, self.o_bias)
        with rec.op("attn_residual", i):
            return o.add_(x)  # o is this layer's own buffer: add the residual into it

    def forward(self, x: torch.Tensor, spans: Sequence[tuple[StepMeta, int, int, int]],
                ctx: ForwardContext) -> torch.Tensor:
        return self.mlp(self.attention(x, spans, ctx), ctx)


class ForwardContext:
    """Per-forward values shared by the layers: recorder, attention function, RoPE tables."""

    __slots__ = ("rec", "attend", "cos", "sin")

    def __init__(self, rec: Any, attend: Any, cos: torch.Tensor | None, sin: torch.Tensor | None) -> None:
        self.rec, self.attend, self.cos, self.sin = rec, attend, cos, sin


def check_buildable(spec: ModelSpec) -> None:
    """A ValueError naming the field the engine cannot build (family, activation, rope type, ...),
    raised before anything is allocated, so a command can refuse the spec before it starts."""
    if spec.family not in ENGINE_FAMILIES:
        raise ValueError(f"family: the engine builds {', '.join(ENGINE_FAMILIES)} models, "
                         f"got {spec.family!r} ({spec.name})")
    if spec.hidden_act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act: {spec.hidden_act!r} is not supported "
                         f"(supported: {', '.join(_ACTIVATIONS)})")
    if spec.ffn_kind != "swiglu" and spec.num_experts > 1:
        raise ValueError(f"num_experts: mixture-of-experts needs ffn_kind='swiglu', got {spec.ffn_kind!r}")
    if spec.shared_experts:  # the cost model counts them; running without them would be another model
        raise ValueError(f"shared_experts: the engine runs routed experts only (Mixtral), got "
                         f"{spec.shared_experts} shared experts ({spec.name})")
    _check_todays_fields(spec)
    if spec.pos_encoding == "rope":
        check_rope(spec)


#: ModelSpec fields of today's models the engine does not build yet, with the value that means "absent"
_NOT_BUILT = (("layer_types", None), ("nope_layers", ()), ("kv_lora_rank", None), ("moe_ffn_size", None),
              ("dense_layers", ()), ("router_bias", False), ("router_score_bias", False), ("qk_norm", None),
              ("attn_sinks", False), ("attn_softcap", None), ("final_softcap", None), ("sandwich_norms", False),
              ("embedding_scale", False), ("shared_expert_gate", False))


def _check_todays_fields(spec: ModelSpec) -> None:
    """The per-layer and architecture fields of today's models (MLA, mixed layers, q/k norms, sinks,
    soft-capping) are costed by the analytical model; the engine refuses them by name rather than
    run another model."""
    for field, absent in _NOT_BUILT:
        value = getattr(spec, field)
        if value != absent and not (field == "layer_types" and spec.uniform_layers and value is not None
                                    and set(value) == {"sliding" if spec.sliding_window else "full"}):
            shown = value if not isinstance(value, tuple) or len(value) <= 4 else f"{list(value[:4])}..."
            raise ValueError(f"{field}: the engine does not build this yet (got {shown!r} for {spec.name}); "
                             "estimate, simulate and plan model it")


class Transformer(nn.Module):
    """The whole decoder. Build with `Transformer(spec, dtype="fp32", device="cpu")` (parameters left
    uninitialised) and fill with `llmperf.engine.weights` (`init_random`, `load_hf_state_dict`), or use
    `weights.build_model(spec, seed=...)` / `weights.from_pretrained(path)`.

    Parameters: embed_weight (V, C); pos_weight (max_positions, C) (learned positions);
    layers.{i}.*; final_norm; lm_head_weight (C, V) ("in_out") or (V, C), or when tied the embedding
    itself (V, C).
    """

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
        self.final_norm = Norm(spec.norm_kind, C, spec.norm_eps, self.ops, **kw)
        if spec.tied_embeddings:  # the embedding itself, (V, C) whatever the layout
            self.lm_head_weight = self.embed_weight
            self._head_ops = ops_for(device, self.dtype) if self.in_out else self.ops
        else:
            self.lm_head_weight = _mat(C, spec.vocab_size, self.in_out, **kw)
            self._head_ops = self.ops
        self.rotary = RotaryTable(spec, device) if spec.pos_encoding == "rope" else None
        # Math-changing spec fields, honoured by every backend through the step metadata:
        # GPT-2's softmax scale per layer (HF `GPT2Attention.scaling`), and the sliding window.
        if spec.attn_scale and not spec.attn_scale_inverse_layer_idx:
            self.layer_scales: tuple[float, ...] | None = None  # the usual 1/sqrt(D)
        else:
            base = spec.head_dim ** -0.5 if spec.attn_scale else 1.0
            self.layer_scales = tuple(base / (i + 1 if spec.attn_scale_inverse_layer_idx else 1)
                                      for i in range(spec.num_layers))
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
            if isinstance(module, (Block, Norm)):
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
            return self._head_ops.linear(x, self.lm_head_weight)

    def _place(self, tokens: torch.Tensor, meta: StepMeta) -> tuple[int, int]:
        """(B, T) of one group, checked against its metadata, which gets the model's math fields."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected (B, T) token ids, got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if meta.positions.shape != (B, T):
            raise ValueError(f"meta: positions {tuple(meta.positions.shape)} do not match tokens {(B, T)}")
        if meta.max_seq_len > self.spec.max_positions:
            raise ValueError(f"tokens: positions up to {meta.max_seq_len - 1} exceed the model's "
                             f"max_positions={self.spec.max_positions}")
        meta.window, meta.layer_scales = self.spec.sliding_window, self.layer_scales
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
        cos = sin = None
        if self.rotary is not None:
            cos, sin = self.rotary.lookup(positions, max(m.max_seq_len for _, m in groups) - 1, self.dtype)
        ctx = ForwardContext(rec, attend or self._attend, cos, sin)
        with rec.op("embed"):
            x = F.embedding(tokens, self.embed_weight)  # (1, N, C)
        if self.pos_weight is not None:
            with rec.op("pos_embed"):
                x = x + F.embedding(positions, self.pos_weight)
        if self.decode_in_one_call and len(spans) == 1:  # the ops may run a decode step's layers in one call
            y = self.ops.decode_layers(self, x, spans[0][0], ctx)
            if y is not None:
                return y
        for layer in self.layers:
            x = layer.forward(x, spans, ctx)  # .forward skips nn.Module hook dispatch
        return x

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
