"""`ModelSpec`: the shape of a decoder-only transformer, enough to count every FLOP and byte.

Parameter counts follow the Hugging Face implementations exactly (biases, norms, learned positions,
tied embeddings), so Llama-2-7B is 6,738,415,616. KV cache bytes per token are
`2 * layers * kv_heads * head_dim * bytes(kv_dtype)` (K and V, every layer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from llmperf.errors import SpecError
from llmperf.specs.precision import dtype_bytes, normalize_dtype

FFN_KINDS = ("gelu", "relu", "swiglu")  # gelu/relu: two matrices (up, down); swiglu: gate, up, down
NORM_KINDS = ("rmsnorm", "layernorm")
POS_ENCODINGS = ("rope", "learned")
FAMILIES = ("llama", "gpt2", "opt", "gpt_neox")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Sizes are counts (not bytes); `head_dim` defaults to hidden/heads.

    `family` picks the block structure the engine builds: `llama` (RMSNorm, RoPE, SwiGLU; also
    Mistral, Mixtral, Qwen2), `gpt2` (LayerNorm, learned positions, GELU MLP, tied embeddings),
    `opt` and `gpt_neox` (cost model only).
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
    ffn_kind: str = "swiglu"
    hidden_act: str = "silu"  # the activation function by its HF name (silu, gelu_new, gelu, relu)
    num_experts: int = 1  # 1 = dense FFN
    experts_per_token: int = 1
    shared_experts: int = 0  # always-active experts of size ffn_size, on top of the routed ones
    norm_kind: str = "rmsnorm"
    norm_eps: float = 1e-5
    pos_encoding: str = "rope"
    rope_theta: float = 10000.0
    rotary_dim: int | None = None  # partial rotary (GPT-NeoX); defaults to head_dim
    rope_scaling: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    position_offset: int = 0  # OPT stores 2 extra learned position rows
    tied_embeddings: bool = False
    max_positions: int
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    parallel_residual: bool = False  # GPT-NeoX: attention and MLP read the same input
    sliding_window: int | None = None  # tokens each query attends to (and the cache holds); None = all
    attn_scale: bool = True  # divide attention logits by sqrt(head_dim) (GPT-2 scale_attn_weights)
    attn_scale_inverse_layer_idx: bool = False  # also by layer_idx + 1 (GPT-2 scale_attn_by_inverse_layer_idx)
    dtype: str = "fp16"  # the checkpoint's native dtype
    source: str = ""

    def __post_init__(self) -> None:
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
        if self.sliding_window is not None:
            _positive_int(self, "sliding_window")
        for f in ("norm_eps", "rope_theta"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise SpecError(f"{self.name}: {f} must be a positive number, got {value!r}")
        for f in ("shared_experts", "position_offset"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{self.name}: {f} must be an integer >= 0, got {value!r}")
        if self.experts_per_token > self.num_experts:
            raise SpecError(f"{self.name}: experts_per_token={self.experts_per_token} exceeds "
                            f"num_experts={self.num_experts}")
        for f, allowed in (("ffn_kind", FFN_KINDS), ("norm_kind", NORM_KINDS),
                           ("pos_encoding", POS_ENCODINGS), ("family", FAMILIES)):
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
    def kv_bytes_per_token(self, kv_dtype: str = "fp16") -> float:
        """KV cache bytes one token occupies: 2 (K and V) * layers * kv_heads * head_dim * bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def weight_bytes(self, weight_dtype: str = "fp16") -> float:
        return self.param_count * dtype_bytes(weight_dtype)

    def scaled(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed (e.g. a 2-layer version for tests); re-validated."""
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


def _positive_int(spec: ModelSpec, name: str) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{spec.name}: {name} must be a positive integer, got {value!r}")

