"""Block families: one data description per transformer block structure.

A family says how a block is built (norm, FFN kind, activation, positions, where the biases are,
whether the LM head is tied to the embedding), which is what the cost model counts and the engine
builds. `ModelSpec` fills every structural field a spec leaves out from its family's description, and
the Hugging Face reader (`llmperf/specs/hf.py`) maps each `model_type` onto a family. Adding a family
means adding one `Family` to `FAMILIES` (and, to read its configs, one `HFModelType` in hf.py): no
`if family == ...` branches elsewhere in `llmperf.specs`.

Today's models (Qwen3, DeepSeek-V2/V3, Kimi-K2, GLM-4.5, gpt-oss, Llama 4, Gemma 2/3) are llama blocks
(RMSNorm, RoPE, a gated FFN) whose differences are per-spec fields (MLA ranks, experts, q/k norms, sinks,
sandwich norms, soft-caps, per-layer attention), not a family of their own.

Sources: the `transformers` modelling files of each family (`modeling_llama.py`, `modeling_gpt2.py`,
`modeling_opt.py`, `modeling_gpt_neox.py`, and `modeling_<type>.py` of each type above).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from llmperf.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class Family:
    """How one family builds a decoder block. Each field is the default of the `ModelSpec` field of
    the same name; a spec may still override any of them (e.g. Qwen2's q/k/v biases on a llama block)."""

    name: str
    description: str
    norm_kind: str  # rmsnorm | layernorm
    ffn_kind: str  # swiglu (gate, up, down) | gelu | relu (up, down)
    hidden_act: str  # by its Hugging Face name
    pos_encoding: str  # rope | learned
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    tied_embeddings: bool
    parallel_residual: bool = False  # attention and MLP read the same input (GPT-NeoX)
    position_offset: int = 0  # extra learned position rows (OPT stores 2)
    hf_model_types: tuple[str, ...] = ()  # Hugging Face `model_type`s built this way (read by hf.py)

    def defaults(self) -> dict[str, object]:
        """The `ModelSpec` fields this family fills when a spec leaves them out."""
        return {f: getattr(self, f) for f in FAMILY_FIELDS}


#: the ModelSpec fields a family describes
FAMILY_FIELDS = ("norm_kind", "ffn_kind", "hidden_act", "pos_encoding", "qkv_bias", "out_bias", "mlp_bias",
                 "tied_embeddings", "parallel_residual", "position_offset")

_ALL = (
    Family(name="llama", description="RMSNorm, RoPE, gated FFN, untied head (Llama 1-4, Mistral, Mixtral, "
                                     "Qwen2/3, Qwen2-MoE, Qwen3-Next/3.5, DeepSeek-V2/V3/V3.2, Kimi-K2/K2.5, "
                                     "GLM-4.5/4.7-Flash/5, MiniMax-M2, SmolLM3, Seed-OSS, OLMo 2/3, OLMoE, EXAONE 4, "
                                     "ERNIE 4.5, Ministral 3, Phi-3, GLM-4, Command R7B/A, gpt-oss, Gemma 1/2/3, "
                                     "Granite 3 and 4, Bamba)",
           norm_kind="rmsnorm", ffn_kind="swiglu", hidden_act="silu", pos_encoding="rope",
           qkv_bias=False, out_bias=False, mlp_bias=False, tied_embeddings=False,
           hf_model_types=("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2",
                           "deepseek_v2", "deepseek_v32", "glm4_moe", "gpt_oss", "llama4_text", "gemma2",
                           "gemma3_text", "gemma4_text", "nemotron_h", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
                           "glm_moe_dsa", "glm4_moe_lite", "minimax_m2", "smollm3", "seed_oss", "olmo2", "olmo3",
                           "exaone4", "ernie4_5_moe", "granite", "granitemoe", "granitemoeshared",
                           "granitemoehybrid", "bamba",
                           "ministral3", "phi3", "glm4", "cohere2", "gemma", "qwen2_moe", "olmoe", "deepseek_v4")),
    Family(name="gpt2", description="LayerNorm, learned positions, GELU MLP, biases, tied head",
           norm_kind="layernorm", ffn_kind="gelu", hidden_act="gelu_new", pos_encoding="learned",
           qkv_bias=True, out_bias=True, mlp_bias=True, tied_embeddings=True, hf_model_types=("gpt2",)),
    Family(name="opt", description="LayerNorm, learned positions (+2 rows), ReLU MLP, biases, tied head",
           norm_kind="layernorm", ffn_kind="relu", hidden_act="relu", pos_encoding="learned",
           qkv_bias=True, out_bias=True, mlp_bias=True, tied_embeddings=True, position_offset=2,
           hf_model_types=("opt",)),
    Family(name="gpt_neox", description="LayerNorm, partial RoPE, GELU MLP, parallel residual",
           norm_kind="layernorm", ffn_kind="gelu", hidden_act="gelu", pos_encoding="rope",
           qkv_bias=True, out_bias=True, mlp_bias=True, tied_embeddings=False, parallel_residual=True,
           hf_model_types=("gpt_neox",)),
)

#: every known family by name
FAMILIES: Mapping[str, Family] = MappingProxyType({f.name: f for f in _ALL})


def get_family(name: str, origin: str = "model") -> Family:
    """The family called `name`; an unknown name is a `SpecError` listing the known ones."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise SpecError(f"{origin}: family must be one of {', '.join(FAMILIES)}, got {name!r}") from None
