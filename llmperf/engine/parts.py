"""The parts a `model.Transformer` is built from, and the rules for building one: dtypes, activations,
the matrix layouts, norms, each layer's attention parameters (`layer_attention`), the per-forward
context the layers share, and `check_buildable`, which refuses what the engine does not build by the
field's name before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmperf.analysis.vocabulary import Op
from llmperf.engine.ops import TorchOps
from llmperf.engine.rope import check_rope
from llmperf.engine.step import LayerAttn
from llmperf.specs import ModelSpec

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),  # Nemotron-H (transformers' ReLUSquaredActivation)
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
    """RMSNorm (`weight`) or LayerNorm (`weight`, `bias`); `offset`: Gemma's RMSNorm, which scales
    by (1 + weight) in fp32 before casting back."""

    def __init__(self, kind: str, size: int, eps: float, ops: TorchOps, offset: bool = False, **kw: Any) -> None:
        super().__init__()
        self.kind, self.eps, self.shape, self.ops, self.offset = kind, eps, (size,), ops, offset
        self.weight = nn.Parameter(torch.ones(size, **kw))
        self.bias = nn.Parameter(torch.zeros(size, **kw)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)
        if self.kind == "layernorm_no_bias":  # Cohere: in fp32, a weight and no bias
            return F.layer_norm(x.float(), self.shape, self.weight.float(), None, self.eps).to(x.dtype)
        if self.offset:
            return (F.rms_norm(x.float(), self.shape, eps=self.eps) * (1.0 + self.weight.float())).to(x.dtype)
        return self.ops.rms_norm(x, self.weight, self.eps)

    def heads_(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of every head of `x (N, heads, size)` written back into `x` (a view of a buffer the
        caller owns, such as a QKV GEMM's output): no fresh tensor for the result on the ops' in-place
        path (`TorchOps.rms_norm_heads_`), the same values as `forward`. A norm whose weight spans all the
        heads (`ModelSpec.qk_norm == "rmsnorm_across_heads"`: MiniMax-M2, OLMo 2/3) norms each row of `x`
        across its heads at once (transformers norms q_proj's output before splitting it into heads)."""
        if self.shape[0] != x.shape[-1]:  # a row's heads are contiguous: a view (N, heads * size)
            return x.copy_(self.forward(x.reshape(x.shape[0], -1)).view_as(x))
        if self.kind == "rmsnorm" and not self.offset:
            return self.ops.rms_norm_heads_(x, self.weight, self.eps)
        return x.copy_(self.forward(x))


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


class ForwardContext:
    """Per-forward values shared by the layers: recorder, attention function, RoPE tables (the global
    ones, and Gemma 3's local ones), the step's token positions `(1, N)`."""

    __slots__ = ("rec", "attend", "cos", "sin", "cos_local", "sin_local", "positions")

    def __init__(self, rec: Any, attend: Any, cos: torch.Tensor | None, sin: torch.Tensor | None,
                 positions: torch.Tensor | None = None, cos_local: torch.Tensor | None = None,
                 sin_local: torch.Tensor | None = None) -> None:
        self.rec, self.attend, self.cos, self.sin = rec, attend, cos, sin
        self.positions, self.cos_local, self.sin_local = positions, cos_local, sin_local


def check_buildable(spec: ModelSpec) -> None:
    """A ValueError naming the field the engine cannot build (family, activation, rope type, ...),
    raised before anything is allocated, so a command can refuse the spec before it starts."""
    if spec.family not in ENGINE_FAMILIES:
        raise ValueError(f"family: the engine builds {', '.join(ENGINE_FAMILIES)} models, "
                         f"got {spec.family!r} ({spec.name})")
    v4 = [f for f in ("o_groups", "hc_mult", "hash_moe_layers") if getattr(spec, f) not in (None, ())]
    if v4:
        raise ValueError(f"{v4[0]}: the engine does not build DeepSeek-V4's layers ({spec.name}: its shared-KV "
                         "attention with compressed entries, hyper-connections, hash routing); llmperf reads and "
                         "counts them, and prices them in estimate (not simulate or plan)")
    if spec.moe_latent_size:
        raise ValueError(f"moe_latent_size: the engine does not build a latent MoE's projections ({spec.name}); "
                         "llmperf prices them (estimate, simulate, plan)")
    if spec.hidden_act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act: {spec.hidden_act!r} is not supported "
                         f"(supported: {', '.join(_ACTIVATIONS)})")
    if spec.pos_encoding == "rope":
        check_rope(spec)
    if spec.embedding_scale and spec.embedding_multiplier != 1.0:
        raise ValueError(f"embedding_multiplier: the engine scales an embedding by Gemma's sqrt(hidden) or by "
                         f"Granite's multiplier, not both ({spec.name})")
    if spec.is_sparse_attention:
        raise ValueError(f"index_topk: the engine does not run DeepSeek Sparse Attention's indexer and top-k "
                         f"attention ({spec.name}); llmperf prices it (estimate, simulate, plan)")
    gemma4 = [f for f in ("global_head_dim", "global_kv_heads", "global_k_eq_v", "v_norm", "moe_parallel_ffn",
                          "layer_scalar", "ple_dim", "kv_shared_layers", "wide_shared_ffn")
              if getattr(spec, f) not in (None, False, ())]
    if gemma4:
        raise ValueError(f"{gemma4[0]}: the engine does not build Gemma 4's layers ({spec.name}); llmperf prices "
                         "them (estimate, simulate, plan)")
    if spec.is_mla:
        from llmperf.engine.mla import check_mla
        check_mla(spec)
    if spec.is_moe:
        from llmperf.engine.moe import check_moe
        check_moe(spec)
    if spec.has_linear_layers:
        from llmperf.engine.deltanet import check_linear
        check_linear(spec)


def linear_mixer(spec: ModelSpec, index: int, ops: TorchOps, **kw: Any) -> nn.Module:
    """Layer `index`'s linear token mixer: Mamba-2 (`mamba2.Mamba2Mixer`, Nemotron-H) or Gated DeltaNet
    (`deltanet.GatedDeltaNet`, Qwen3-Next, Qwen3.5), by `spec.linear_mixer`."""
    if spec.is_mamba:
        from llmperf.engine.mamba2 import Mamba2Mixer
        return Mamba2Mixer(spec, index, ops, **kw)
    from llmperf.engine.deltanet import GatedDeltaNet
    return GatedDeltaNet(spec, index, ops, **kw)


def shared_norm_block(block: Any, x: torch.Tensor, spans: Sequence[Any], ctx: ForwardContext) -> torch.Tensor:
    """A layer whose attention and FFN both read one norm of its input `x` (1, N, C) and whose output is x plus
    both (`ModelSpec.shared_input_norm`, Cohere), each sublayer summed over ranks under tensor parallelism first."""
    rec, i = ctx.rec, block.index
    h = block._norm(block.attn_norm, x, ctx, "attn_norm")
    o = block._attend(h, spans, ctx)
    y = block._ffn(h, block.up_weight, block.up_bias, block.down_weight, block.down_bias, rec, block.ops.linear)
    if block.reduce is not None:
        with rec.op("mlp_allreduce", i):
            block.reduce(y)
    with rec.op("attn_residual", i):
        o.add_(x)
    with rec.op("mlp_residual", i):
        return o.add_(y)


def query_temperature(spec: ModelSpec, rope: bool) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The factor a layer multiplies its rotated queries by at each position `(N,)` fp32, or None: Llama 4's
    NoPE layers (`nope_temperature`: 1 + attn_scale * log(1 + floor((pos + 1) / floor_scale))) and Ministral 3's
    every layer (`query_log_scale`: 1 + beta * log(1 + floor(pos / interval)), transformers'
    `get_llama_4_attn_scale`)."""
    if spec.query_log_scale is not None:
        beta, interval = spec.query_log_scale
        return lambda pos: 1.0 + beta * torch.log1p(torch.floor(pos / interval))
    if spec.nope_temperature is not None and not rope:
        floor_scale, attn_scale = spec.nope_temperature
        return lambda pos: torch.log1p(torch.floor((pos + 1.0) / floor_scale)) * attn_scale + 1.0
    return None


def layer_attention(spec: ModelSpec, sinks: Sequence[torch.Tensor | None]) -> tuple[LayerAttn, ...]:
    """Every layer's attention parameters (`LayerAttn`): its softmax scale (1/sqrt(D); GPT-2's
    per-layer scalings; Gemma's query_pre_attn_scalar; Granite's attention_multiplier; for MLA the q/k
    width and yarn's mscale), its window or chunk, its sinks (the layer's parameter), the soft-cap."""
    if spec.is_mla:
        from llmperf.engine.rope import yarn_softmax_mscale
        base = spec.mla_q_head_dim ** -0.5 * yarn_softmax_mscale(spec)
    elif spec.attention_multiplier is not None:  # Granite: the softmax scale itself
        base = spec.attention_multiplier
    elif spec.query_pre_attn_scalar is not None:
        base = spec.query_pre_attn_scalar ** -0.5
    else:
        base = spec.head_dim ** -0.5 if spec.attn_scale else 1.0
    out = []
    for i, kind in enumerate(spec.layer_kinds()):
        scale = base / (i + 1) if spec.attn_scale_inverse_layer_idx else base
        out.append(LayerAttn(scale=scale, window=kind.window if kind.attention == "sliding" else None,
                             chunk=kind.window if kind.attention == "chunked" else None, sinks=sinks[i],
                             softcap=spec.attn_softcap))
    return tuple(out)


def embedding_factor(spec: ModelSpec, dtype: torch.dtype) -> float | torch.Tensor | None:
    """What the embedding is multiplied by, as transformers multiplies it: Gemma's sqrt(hidden) rounded to the
    activation dtype first, Granite's `embedding_multiplier` as a Python number (the op's own precision); None."""
    if spec.embedding_scale:
        return torch.tensor(spec.hidden_size ** 0.5, dtype=dtype)
    return spec.embedding_multiplier if spec.embedding_multiplier != 1.0 else None


def finish_logits(spec: ModelSpec, logits: torch.Tensor, rec: Any) -> torch.Tensor:
    """The logits as the model's head ends them: Granite's divided by `logits_scaling` and Cohere's times
    `logit_scale` (`Op.logits_scale`), Gemma 2's soft-capped (`cap * tanh(logits / cap)`, `Op.final_softcap`)."""
    if spec.logits_scaling != 1.0:
        with rec.op(Op.logits_scale.value):
            logits = logits / spec.logits_scaling
    if spec.logit_scale is not None:
        with rec.op(Op.logits_scale.value):
            logits = logits * spec.logit_scale
    cap = spec.final_softcap
    if cap is None:
        return logits
    with rec.op(Op.final_softcap.value):
        return torch.tanh(logits / cap) * cap
