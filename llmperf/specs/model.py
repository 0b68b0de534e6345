"""`ModelSpec`: the shape of a decoder-only transformer, enough to count every FLOP and byte.

Parameter counts follow the Hugging Face implementations exactly (biases, norms, learned positions,
tied embeddings), so Llama-2-7B is 6,738,415,616. KV cache bytes per token are
`2 * layers * kv_heads * head_dim * bytes(kv_dtype)` (K and V, every layer), defined once in
`llmperf.specs.kvcache.KVCacheSpec`. Structural fields a spec leaves out come from its family's
description (`llmperf.specs.families`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from llmperf.errors import SpecError
from llmperf.specs.families import FAMILIES as _FAMILY_DESCRIPTIONS
from llmperf.specs.families import FAMILY_FIELDS, get_family
from llmperf.specs.kvcache import KVCacheSpec
from llmperf.specs.precision import dtype_bytes, normalize_dtype
from llmperf.specs.quantization import QuantizationSpec

FFN_KINDS = ("gelu", "relu", "swiglu")  # gelu/relu: two matrices (up, down); swiglu: gate, up, down
NORM_KINDS = ("rmsnorm", "layernorm")
POS_ENCODINGS = ("rope", "learned")
FAMILIES = tuple(_FAMILY_DESCRIPTIONS)  # the names; the descriptions are in llmperf.specs.families


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Sizes are counts (not bytes); `head_dim` defaults to hidden/heads.

    `family` picks the block structure the engine builds: `llama` (RMSNorm, RoPE, SwiGLU; also
    Mistral, Mixtral, Qwen2), `gpt2` (LayerNorm, learned positions, GELU MLP, tied embeddings),
    `opt` and `gpt_neox` (cost model only). The structural fields (norm_kind, ffn_kind, hidden_act,
    pos_encoding, biases, tied_embeddings, parallel_residual, position_offset) default to the
    family's description; after construction they always hold a value.

    `sliding_window` (None: full attention) caps the tokens every layer attends to and the KV cache
    holds. `quantization` describes a weight-only quantized checkpoint (AWQ, GPTQ). `attn_scale` and
    `attn_scale_inverse_layer_idx` are GPT-2's `scale_attn_weights` and
    `scale_attn_by_inverse_layer_idx`: the softmax logits are divided by sqrt(head_dim) (if
    attn_scale) and by layer_idx + 1 (if attn_scale_inverse_layer_idx); they change values, not costs.
    """

    name: str
    family: str = "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    ffn_size: int
    ffn_kind: str = None  # type: ignore[assignment]  # family default (None only before __post_init__)
    hidden_act: str = None  # type: ignore[assignment]  # by its HF name (silu, gelu_new, gelu, relu)
    num_experts: int = 1  # 1 = dense FFN
    experts_per_token: int = 1
    shared_experts: int = 0  # always-active experts of size ffn_size, on top of the routed ones
    norm_kind: str = None  # type: ignore[assignment]  # family default
    norm_eps: float = 1e-5
    pos_encoding: str = None  # type: ignore[assignment]  # family default
    rope_theta: float = 10000.0
    rotary_dim: int | None = None  # partial rotary (GPT-NeoX); defaults to head_dim
    rope_scaling: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    position_offset: int = None  # type: ignore[assignment]  # OPT stores 2 extra learned position rows
    tied_embeddings: bool = None  # type: ignore[assignment]  # family default
    max_positions: int
    qkv_bias: bool = None  # type: ignore[assignment]  # family default
    out_bias: bool = None  # type: ignore[assignment]  # family default
    mlp_bias: bool = None  # type: ignore[assignment]  # family default
    parallel_residual: bool = None  # type: ignore[assignment]  # GPT-NeoX: attention and MLP read the same input
    sliding_window: int | None = None  # tokens each query attends to (and the cache holds); None = all
    attn_scale: bool = True  # divide attention logits by sqrt(head_dim) (GPT-2 scale_attn_weights)
    attn_scale_inverse_layer_idx: bool = False  # also by layer_idx + 1 (GPT-2 scale_attn_by_inverse_layer_idx)
    quantization: QuantizationSpec | None = None  # weight-only quantized checkpoint (AWQ, GPTQ)
    dtype: str = "fp16"  # the checkpoint's native dtype (of the unquantized tensors when quantized)
    source: str = ""

    def __post_init__(self) -> None:
        from llmperf.specs.names import check_spec_name
        check_spec_name(self.name)
        family = get_family(self.family, str(self.name))
        for f, default in family.defaults().items():
            if getattr(self, f) is None:
                object.__setattr__(self, f, default)
        if isinstance(self.quantization, Mapping):
            object.__setattr__(self, "quantization", _quantization(self.name, self.quantization))
        elif self.quantization is not None and not isinstance(self.quantization, QuantizationSpec):
            raise SpecError(f"{self.name}: quantization must be a mapping of method, bits, group_size, "
                            f"zero_point, got {self.quantization!r}")
        for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_size", "max_positions",
                  "num_experts", "experts_per_token"):
            _positive_int(self, f)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        _positive_int(self, "num_kv_heads")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise SpecError(f"{self.name}: num_heads={self.num_heads} does not divide "
                                f"hidden_size={self.hidden_size}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _positive_int(self, "head_dim")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"{self.name}: num_kv_heads={self.num_kv_heads} does not divide "
                            f"num_heads={self.num_heads}")
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        _positive_int(self, "rotary_dim")
        if self.rotary_dim > self.head_dim:
            raise SpecError(f"{self.name}: rotary_dim={self.rotary_dim} exceeds head_dim={self.head_dim}")
        for f in ("tied_embeddings", "qkv_bias", "out_bias", "mlp_bias", "parallel_residual", "attn_scale",
                  "attn_scale_inverse_layer_idx"):
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"{self.name}: {f} must be true or false, got {getattr(self, f)!r}")
        for f in ("norm_eps", "rope_theta"):
            _positive_number(self.name, f, getattr(self, f))
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, Mapping):
                raise SpecError(f"{self.name}: rope_scaling must be a mapping, got {self.rope_scaling!r}")
            for key, value in self.rope_scaling.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    _positive_number(self.name, f"rope_scaling.{key}", value)
                elif isinstance(value, (list, tuple)) and not all(
                        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
                    raise SpecError(f"{self.name}: rope_scaling.{key} must be finite numbers, got {value!r}")
        if self.sliding_window is not None:
            _positive_int(self, "sliding_window")
        if not isinstance(self.hidden_act, str) or not self.hidden_act:
            raise SpecError(f"{self.name}: hidden_act must be an activation name, got {self.hidden_act!r}")
        for f in ("shared_experts", "position_offset"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{self.name}: {f} must be an integer >= 0, got {value!r}")
        if self.experts_per_token > self.num_experts:
            raise SpecError(f"{self.name}: experts_per_token={self.experts_per_token} exceeds "
                            f"num_experts={self.num_experts}")
        for f, allowed in (("ffn_kind", FFN_KINDS), ("norm_kind", NORM_KINDS),
                           ("pos_encoding", POS_ENCODINGS)):
            if getattr(self, f) not in allowed:
                raise SpecError(f"{self.name}: {f} must be one of {', '.join(allowed)}, "
                                f"got {getattr(self, f)!r}")
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype, f"{self.name}: dtype"))

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection's output, num_heads * head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection's output, num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head: 1 for MHA, num_heads for MQA."""
        return self.num_heads // self.num_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.ffn_kind == "swiglu" else 2

    # ---- parameter counts ----------------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm_kind == "layernorm" else 1)

    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        n = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.qkv_bias:
            n += self.q_size + 2 * self.kv_size
        if self.out_bias:
            n += h
        return n

    @property
    def expert_params(self) -> int:
        """Parameters of one FFN (one expert, or the dense FFN)."""
        h, f = self.hidden_size, self.ffn_size
        n = self.ffn_matrices * h * f
        if self.mlp_bias:
            n += (self.ffn_matrices - 1) * f + h
        return n

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def ffn_params_per_layer(self) -> int:
        return (self.num_experts + self.shared_experts) * self.expert_params + self.router_params_per_layer

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.ffn_params_per_layer + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        n = self.vocab_size * self.hidden_size
        if self.pos_encoding == "learned":
            n += (self.max_positions + self.position_offset) * self.hidden_size
        return n

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def param_count(self) -> int:
        """Total parameters, exactly as the Hugging Face model counts them."""
        return (self.embedding_params + self.num_layers * self.params_per_layer
                + self.norm_params + self.lm_head_params)

    @property
    def active_param_count(self) -> int:
        """Parameters one token touches (MoE: only its experts_per_token routed experts)."""
        unused = (self.num_experts - self.experts_per_token) * self.expert_params
        return self.param_count - self.num_layers * unused

    # ---- bytes -----------------------------------------------------------------------------------
    def kv_cache(self, kv: str | float | Any = "fp16") -> KVCacheSpec:
        """The KV-cache spec of this model with elements of `kv` (a dtype name, a byte size, or a
        `Precision`): bytes per token, per block, per context (capped at `sliding_window`)."""
        return KVCacheSpec.from_model(self, kv)

    def kv_bytes_per_token(self, kv_dtype: str | float = "fp16") -> float:
        """KV cache bytes one token occupies: 2 (K and V) * layers * kv_heads * head_dim * bytes."""
        return self.kv_cache(kv_dtype).bytes_per_token

    def weight_bytes(self, weight_dtype: str = "fp16") -> float:
        return self.param_count * dtype_bytes(weight_dtype)

    def scaled(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed (e.g. a 2-layer version for tests); re-validated.
        Changing `family` re-derives the structural fields not given from the new family."""
        if "family" in changes and changes["family"] != self.family:
            for f in FAMILY_FIELDS:
                changes.setdefault(f, None)
        if "hidden_size" in changes or "num_heads" in changes:
            changes.setdefault("head_dim", None)
        if changes.get("head_dim", self.head_dim) != self.head_dim or "head_dim" in changes:
            changes.setdefault("rotary_dim", None)  # re-derived from the new head_dim
        return replace(self, **changes)

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike[str], name: str | None = None) -> ModelSpec:
        """Read a Hugging Face `config.json` (the file or its directory), for the llama, mistral,
        mixtral, qwen2, gpt2, opt and gpt_neox model types."""
        from llmperf.specs.hf import model_spec_from_hf_config
        return model_spec_from_hf_config(path, name=name)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


def _quantization(model: str, data: Mapping[str, Any]) -> QuantizationSpec:
    allowed = ("method", "bits", "group_size", "zero_point", "act_order")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise SpecError(f"{model}: unknown field 'quantization.{unknown[0]}' (fields: {', '.join(allowed)})")
    if "method" not in data or "bits" not in data:
        raise SpecError(f"{model}: missing field 'quantization.{'method' if 'method' not in data else 'bits'}'")
    try:
        return QuantizationSpec(**data)
    except SpecError as exc:
        raise SpecError(f"{model}: {exc}") from None


def _positive_number(model: str, name: str, value: Any) -> None:
    """A real number > 0 that is finite (NaN and infinity are refused: they poison every result)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(f"{model}: {name} must be a finite positive number, got {value!r}")


def _positive_int(spec: ModelSpec, name: str) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{spec.name}: {name} must be a positive integer, got {value!r}")
    if value > 2**53:  # float64 holds every count up to 2**53 exactly, and no model is near it
        raise SpecError(f"{spec.name}: {name} must be at most 2**53, got {value!r}")

