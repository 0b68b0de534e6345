"""`ModelSpec`: the shape of a decoder-only transformer, enough to count every FLOP and byte.

Parameter counts follow the Hugging Face implementations exactly (biases, norms, learned positions,
tied embeddings), so Llama-2-7B is 6,738,415,616. KV cache bytes per token are
`2 * layers * kv_heads * head_dim * bytes(kv_dtype)` (K and V, every layer), defined once in
`llmperf.specs.kvcache.KVCacheSpec`. Structural fields a spec leaves out come from its family's
description (`llmperf.specs.families`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from llmperf.errors import SpecError
from llmperf.numeric import check_number, is_count, is_real, layer_indices
from llmperf.specs.families import FAMILIES as _FAMILY_DESCRIPTIONS
from llmperf.specs.families import FAMILY_FIELDS, get_family
from llmperf.specs.kvcache import KVCacheSpec
from llmperf.specs.precision import dtype_bytes, normalize_dtype
from llmperf.specs.quantization import QuantizationSpec

FFN_KINDS = ("gelu", "relu", "swiglu")  # gelu/relu: two matrices (up, down); swiglu: gate, up, down
NORM_KINDS = ("rmsnorm", "layernorm", "layernorm_no_bias")  # the last: Cohere's LayerNorm, a weight and no bias
POS_ENCODINGS = ("rope", "learned")
FAMILIES = tuple(_FAMILY_DESCRIPTIONS)  # the names; the descriptions are in llmperf.specs.families


ATTENTION_KINDS = ("full", "sliding", "chunked", "linear", "none", "csa", "hca")  # per-layer attention (layer_types)
#: linear: a Gated DeltaNet (Qwen3-Next, Qwen3.5) or Mamba-2 (Nemotron-H) token mixer: no KV cache, a constant
#: state per sequence; none: no token mixer, the layer is its FFN alone (Nemotron-H's MLP and MoE layers)
#: csa / hca: DeepSeek-V4's compressed sparse and heavily compressed attention, each beside a sliding window
#: (`ModelSpec.o_groups` set: DeepSeek-V4's attention)
LINEAR_MIXERS = ("gated_deltanet", "mamba2")
#: tokens a block of each linear mixer's chunked prefill form when the spec names none (FLA's and transformers'
#: Gated DeltaNet chunk; mamba_ssm's default chunk_size)
LINEAR_CHUNK_DEFAULTS = {"gated_deltanet": 64, "mamba2": 256}
QK_NORMS = ("rmsnorm", "l2", "rmsnorm_across_heads")


@dataclass(frozen=True, kw_only=True)
class LayerKind:
    """What sets one layer's costs apart from another's: its attention (`full`, `sliding` over the
    last `window` tokens, `chunked` within blocks of `window` tokens, or `linear`: a Gated DeltaNet
    token mixer with a constant recurrent state instead of a KV cache), whether it applies rotary
    positions (`rope`; Llama 4's global layers do not), whether its FFN is a mixture of experts, and
    (DeepSeek Sparse Attention) whether it reuses an earlier layer's top-k instead of running its own
    indexer (`shared_topk`: GLM-5's `indexer_types` "shared"), and (Gemma 4) whether it has the full layers'
    own attention shape (`global_shape`) and whether it reads an earlier layer's KV cache (`kv_shared`).
    Nemotron-H's layers are one sublayer each: a token mixer without an FFN (`ffn=False`) or an FFN without
    a token mixer (`attention="none"`)."""

    attention: str
    window: int | None
    rope: bool
    moe: bool
    shared_topk: bool = False
    global_shape: bool = False  # Gemma 4: a full layer with the full layers' own head dim and KV heads
    kv_shared: bool = False  # Gemma 4: it reads an earlier layer's cache (no K/V of its own)
    ffn: bool = True  # Nemotron-H: False for a layer that is its token mixer alone
    hash_router: bool = False  # DeepSeek-V4: its experts are chosen by a frozen token -> experts table

    @property
    def label(self) -> str:
        """A short name for tables: `full`, `sliding-4096`, `chunked-8192`, + `/moe`, `/nope`, `/no-ffn`; a layer
        without a token mixer: `ffn` or `moe`."""
        if self.attention == "none":
            return "moe" if self.moe else "ffn"
        text = self.attention if self.window is None else f"{self.attention}-{self.window}"
        return (text + ("/moe" if self.moe else "") + ("" if self.rope or self.attention == "linear" else "/nope")
                + ("/shared-topk" if self.shared_topk else "") + ("/kv-shared" if self.kv_shared else "")
                + ("" if self.ffn else "/no-ffn") + ("/hash" if self.hash_router else ""))


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
    # ---- per-layer structure (today's models; every field below defaults to "absent") ----------
    layer_types: tuple[str, ...] | None = None  # per layer: full | sliding | chunked | linear | none (None: all alike)
    mixer_only_layers: tuple[int, ...] = ()  # layers without an FFN (Nemotron-H's Mamba-2 and attention layers)
    attention_chunk_size: int | None = None  # chunked layers attend within blocks of this many tokens
    nope_layers: tuple[int, ...] = ()  # layers without rotary positions (Llama 4's global layers)
    kv_lora_rank: int | None = None  # set: multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2)
    q_lora_rank: int | None = None  # MLA: low-rank query (q_a_proj, q_a_norm, q_b_proj); None: plain q_proj
    qk_nope_head_dim: int | None = None  # MLA: per-head query/key width without rotary positions
    qk_rope_head_dim: int | None = None  # MLA: rotary width, one key shared by every head
    v_head_dim: int | None = None  # MLA: per-head value width
    moe_ffn_size: int | None = None  # routed expert width (None: ffn_size)
    moe_latent_size: int | None = None  # routed experts read and write this width, a projection down before them
    # and one up after (Nemotron-H's latent MoE: fc1_latent_proj, fc2_latent_proj); None: hidden_size
    shared_ffn_size: int | None = None  # width of each shared expert (None: moe_ffn_size)
    shared_expert_gate: bool = False  # a hidden -> 1 sigmoid gate on the shared expert (Qwen2-MoE)
    dense_layers: tuple[int, ...] = ()  # MoE models: layers with a dense FFN of ffn_size instead
    router_bias: bool = False  # the router linear has a bias (gpt-oss)
    router_score_bias: bool = False  # one routing-score correction per expert (DeepSeek-V3 noaux_tc)
    # rmsnorm: a head_dim norm on q and k (Qwen3, Gemma 3); l2: no weights, on rope layers (Llama 4);
    # rmsnorm_across_heads: one norm over all query heads, one over all key heads (MiniMax-M2, OLMo 2/3)
    qk_norm: str | None = None
    qk_norm_gathered: bool = False  # across heads under tensor parallelism: q and k all-gathered, normed whole on every
    # GPU and split again (vLLM's OLMo 2/3 `_apply_qk_norm`); else the variances are all-reduced (MiniMax-M2)
    attn_sinks: bool = False  # one learned sink logit per query head per layer (gpt-oss)
    attn_softcap: float | None = None  # Gemma 2: cap * tanh(score / cap) on every attention score
    final_softcap: float | None = None  # Gemma 2: the same on the logits
    sandwich_norms: bool = False  # Gemma 2/3: a norm after attention and after the MLP too (4 per layer)
    post_norm: bool = False  # OLMo 2/3: each sublayer's output normed before its residual add, no input norms
    shared_input_norm: bool = False  # Cohere: attention and the FFN both read one norm of the layer input (one norm a
    # layer, no mlp_norm) and both outputs join its residual
    logit_scale: float | None = None  # Cohere: the logits times this
    embedding_scale: bool = False  # Gemma: the embedding is multiplied by sqrt(hidden_size)
    mtp_layers: int = 0  # multi-token-prediction layers in the checkpoint (not built, not counted)
    # `linear` layers: Gated DeltaNet (Yang et al. 2024, arXiv:2412.06464) or Mamba-2 (Dao and Gu 2024,
    # arXiv:2405.21060; `linear_mixer`), set iff a layer is linear. Mamba-2 in the same terms (its state-space
    # duality): key heads = its groups (B and C: keys and queries), key head dim = its state size N, value heads
    # and value head dim = its heads and head dim (x: values); conv channels 2 G N + heads x head dim
    linear_mixer: str = "gated_deltanet"  # gated_deltanet | mamba2
    linear_num_key_heads: int | None = None  # query / key heads of the delta rule
    linear_num_value_heads: int | None = None  # value heads (each key head serves nv / nk of them)
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel: int | None = None  # the causal depthwise convolution's width K (state: K - 1 inputs)
    linear_chunk_size: int | None = None  # tokens a block of the chunked prefill form (None: DeltaNet 64, Mamba-2 256)
    linear_conv_bias: bool = False  # Mamba-2: the convolution has a bias (use_conv_bias)
    linear_proj_bias: bool = False  # Mamba-2: in_proj and out_proj have biases (use_bias)
    linear_dt_min: float = 0.0  # Mamba-2: transformers clamps dt below at this in its chunked scan (time_step_min)
    state_dtype: str | None = None  # the recurrent state's dtype (mamba_ssm_dtype); None: the KV cache's
    attn_output_gate: bool = False  # full layers: q_proj also yields a gate, output *= sigmoid(gate)
    # DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer picks each query's index_topk keys
    index_n_heads: int | None = None  # the indexer's heads (set: every MLA layer has one, but shared_topk_layers)
    index_head_dim: int | None = None
    index_topk: int | None = None  # keys each query's main attention reads
    shared_topk_layers: tuple[int, ...] = ()  # layers with no indexer: they reuse the previous indexed layer's top-k
    # Gemma 4: full layers with their own attention shape; dense FFN and experts side by side
    global_head_dim: int | None = None  # full layers' head_dim (None: head_dim)
    global_kv_heads: int | None = None  # full layers' KV heads (None: num_kv_heads)
    global_k_eq_v: bool = False  # full layers have no v_proj: V is the key projection, normed apart (cached apart)
    v_norm: bool = False  # a weightless RMSNorm over every value head
    moe_parallel_ffn: bool = False  # the shared expert (the dense FFN) and the experts read their own norms of the
    # layer input and their outputs are normed apart; the router RMS-norms its input times a learned vector and
    # scales each chosen expert's weight by a learned per-expert factor (Gemma4TextDecoderLayer, Gemma4TextRouter)
    layer_scalar: bool = False  # each layer's output times one learned scalar (a 1-element tensor of the checkpoint)
    ple_dim: int | None = None  # per-layer embeddings: each layer's own input of this width (a second table)
    ple_vocab: int | None = None  # rows of the per-layer embedding table (None: vocab_size)
    kv_shared_layers: tuple[int, ...] = ()  # layers that read the cache of the last earlier layer of their attention
    # kind: no k/v projections or norms, no cache of their own
    wide_shared_ffn: bool = False  # the KV-shared layers' dense FFN is twice ffn_size wide (use_double_wide_mlp)
    # DeepSeek-V4 (transformers' DeepseekV4ForCausalLM): shared-KV MQA (num_kv_heads 1, K = V) with a low-rank
    # query and a grouped output projection; csa / hca layers compress the sequence beside their sliding window
    o_groups: int | None = None  # set: DeepSeek-V4's attention; o_a_proj maps each of o_groups head groups
    o_lora_rank: int | None = None  # ... to this width, o_b_proj the o_groups x o_lora_rank concatenation to hidden
    csa_rate: int | None = None  # csa layers: one compressed entry (and one indexer key) per this many tokens
    hca_rate: int | None = None  # hca layers: one compressed entry per this many tokens
    hc_mult: int | None = None  # manifold-constrained hyper-connections: residual streams (None: a plain residual)
    hc_sinkhorn_iters: int = 0  # Sinkhorn-Knopp iterations of each hyper-connection's mixing matrix
    hash_moe_layers: tuple[int, ...] = ()  # MoE layers routed by a frozen token -> experts table (tid2eid)
    # ---- numerics: change values, not costs (the engine honours them; every default is "absent") --
    router_scoring: str = "softmax"  # softmax | sigmoid | sqrtsoftplus: how router logits become expert scores
    router_renormalize: bool = True  # the chosen experts' weights sum to 1 (norm_topk_prob; Mixtral: always)
    router_scale: float = 1.0  # routed_scaling_factor: the routed experts' weights are multiplied by it
    router_groups: int = 1  # n_group: experts in groups; a token routes within router_topk_groups of them
    router_topk_groups: int = 1  # topk_group (group score: top-2 sum with router_score_bias, else the max)
    router_input_scaling: bool = False  # Llama 4: the router weight scales the expert's input, not its output
    swiglu_limit: float | None = None  # gpt-oss: clamped SwiGLU (gate * sigmoid(1.702 gate) * (up + 1))
    query_pre_attn_scalar: float | None = None  # Gemma: softmax scale 1/sqrt(this), not 1/sqrt(head_dim)
    norm_offset: bool = False  # Gemma: RMSNorm multiplies by (1 + weight), in fp32
    rope_interleaved: bool = False  # DeepSeek, Llama 4: rotary pairs are adjacent features (2i, 2i+1)
    rope_local_theta: float | None = None  # Gemma 3: the sliding layers' rotary base, without rope_scaling
    nope_temperature: tuple[float, float] | None = None  # Llama 4: (floor_scale, attn_scale) on NoPE layers
    # Ministral 3: (beta, interval): every layer's queries, once rotated, times 1 + beta * log(1 + floor(position /
    # interval)) (its rope_parameters' llama_4_scaling_beta and original_max_position_embeddings)
    query_log_scale: tuple[float, float] | None = None
    attn_scale: bool = True  # divide attention logits by sqrt(head_dim) (GPT-2 scale_attn_weights)
    attn_scale_inverse_layer_idx: bool = False  # also by layer_idx + 1 (GPT-2 scale_attn_by_inverse_layer_idx)
    # Granite (granite, granitemoe, granitemoeshared, granitemoehybrid): four scalars; the embedding, each sublayer's
    # output before its residual add and the logits are an elementwise multiply (or divide) each, counted as such
    attention_multiplier: float | None = None  # the softmax scale itself (None: 1/sqrt(head_dim) or the above)
    embedding_multiplier: float = 1.0  # the embedding times it
    residual_multiplier: float = 1.0  # each sublayer's output times it before the residual add
    logits_scaling: float = 1.0  # the logits divided by it
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
                # a key a message can print on its one line as it is, else its repr ('\n' would break the line)
                plain = isinstance(key, str) and key.isprintable() and key == key.strip() != ""
                field = f"rope_scaling.{key}" if plain else f"rope_scaling[{key!r}]"
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    _positive_number(self.name, field, value)
                elif isinstance(value, (list, tuple)) and not all(is_real(v) for v in value):
                    raise SpecError(f"{self.name}: {field} must be finite numbers, got {value!r}")
        if self.sliding_window is not None:
            _positive_int(self, "sliding_window")
        if not isinstance(self.hidden_act, str) or not self.hidden_act:
            raise SpecError(f"{self.name}: hidden_act must be an activation name, got {self.hidden_act!r}")
        for f in ("shared_experts", "position_offset"):
            value = getattr(self, f)
            if not is_count(value) or value < 0:
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
        _check_layer_structure(self)

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
    def is_mla(self) -> bool:
        """Multi-head latent attention: the cache holds one compressed latent per token and layer."""
        return self.kv_lora_rank is not None

    @property
    def mla_q_head_dim(self) -> int:
        """MLA: query/key width per head, qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]

    @property
    def kv_width_per_token_per_layer(self) -> int:
        """Elements one token leaves in one layer's cache: 2 * kv_heads * head_dim (K and V), or for
        MLA the latent and the shared rotary key, kv_lora_rank + qk_rope_head_dim (Gemma 4: a sliding layer's;
        `kv_cache(...).layer_elements` gives each kind's). DeepSeek-V4's cache, not one width a token (its window
        and compressed entries: `kv_cache(...).groups`), is refused naming `o_groups`."""
        if self.is_v4_attention:
            raise SpecError(f"{self.name}: o_groups={self.o_groups!r}: DeepSeek-V4's cache is a window plus "
                            "compressed entries, not one width a token (KVCacheSpec.from_model(...).groups)")
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim  # type: ignore[operator]
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """Attention parameters of one layer (the same in every layer: sliding, chunked and NoPE
        layers share the shapes). MLA: q_a_proj + q_a_layernorm + q_b_proj (or q_proj),
        kv_a_proj_with_mqa + kv_a_layernorm, kv_b_proj, o_proj, as transformers' DeepseekV3Attention."""
        h = self.hidden_size
        if self.is_mla:
            n, qd = self.num_heads, self.mla_q_head_dim
            r, dr = self.kv_lora_rank, self.qk_rope_head_dim
            if self.q_lora_rank:
                qr = self.q_lora_rank
                q = h * qr + qr * n * qd + self._norm_weights(qr) + (qr if self.qkv_bias else 0)
            else:
                q = h * n * qd
            kv = h * (r + dr) + self._norm_weights(r) + r * n * (self.qk_nope_head_dim + self.v_head_dim)
            if self.qkv_bias:
                kv += r + dr
            o = n * self.v_head_dim * h + (h if self.out_bias else 0)
            return q + kv + o + (n if self.attn_sinks else 0) + self.indexer_params_per_layer
        return self._gqa_params(self.head_dim, self.num_kv_heads)

    def _gqa_params(self, head_dim: int, kv_heads: int, *, kv_mats: int = 2) -> int:
        """Grouped-query attention of `head_dim` over `kv_heads` with `kv_mats` of k_proj and v_proj
        (`kv_projections`; none: no k norm either)."""
        h, q, kv = self.hidden_size, self.num_heads * head_dim, kv_heads * head_dim
        gate = 2 if self.attn_output_gate else 1
        n = h * q * gate + kv_mats * h * kv + q * h
        if self.qkv_bias:
            n += q * gate + kv_mats * kv
        if self.out_bias:
            n += h
        keys = 1 if kv_mats else 0  # a layer without k_proj has no k norm
        if self.qk_norm == "rmsnorm":
            n += (1 + keys) * self._norm_weights(head_dim)
        elif self.qk_norm == "rmsnorm_across_heads":  # one norm over all query heads, one over all key heads
            n += self._norm_weights(q) + keys * self._norm_weights(kv)
        if self.attn_sinks:
            n += self.num_heads
        return n

    def kv_projections(self, kind: LayerKind) -> int:
        """k_proj and v_proj in a layer of `kind`: 2; Gemma 4's full layers with K = V, 1 (V is the key
        projection); its KV-shared layers, 0 (K and V are an earlier layer's)."""
        if kind.kv_shared:
            return 0
        return 1 if kind.global_shape and self.global_k_eq_v else 2

    def attention_dims(self, kind: LayerKind) -> tuple[int, int]:
        """(head_dim, KV heads) of a layer of `kind`: Gemma 4's full layers have their own."""
        if kind.global_shape:
            return self.global_head_dim or self.head_dim, self.global_kv_heads or self.num_kv_heads
        return self.head_dim, self.num_kv_heads

    @property
    def has_global_attention(self) -> bool:
        """Full layers of another attention shape than the others' (Gemma 4)."""
        return self.global_head_dim is not None or self.global_kv_heads is not None or self.global_k_eq_v

    def attention_view(self, kind: LayerKind) -> ModelSpec:
        """This model as a layer of `kind` sees it: Gemma 4's full layers' head dim and KV heads as the
        model's (the model itself for every other layer and model)."""
        if not kind.global_shape:
            return self
        return _global_view(self)

    def _norm_weights(self, width: int) -> int:
        return width * (2 if self.norm_kind == "layernorm" else 1)

    @property
    def is_sparse_attention(self) -> bool:
        """DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): each query's main attention reads the `index_topk`
        keys its indexer picks (DeepSeek-V4's csa layers pick compressed entries: `is_v4_attention`)."""
        return self.index_topk is not None and not self.is_v4_attention

    @property
    def is_v4_attention(self) -> bool:
        """DeepSeek-V4's attention (`o_groups` set): shared-KV MQA, a low-rank query, a grouped output projection,
        a sink per head, and in its csa / hca layers a compressor (csa: with a Lightning Indexer)."""
        return self.o_groups is not None

    def _v4_attn_params(self, kind: LayerKind) -> int:
        """One DeepSeek-V4 attention of `kind`, as transformers' DeepseekV4Attention: q_a_proj, q_a_norm, q_b_proj
        (the per-head q norm has no weight), kv_proj and kv_norm (one head of head_dim, read as K and V), o_a_proj
        (o_groups blocks of heads x head_dim / o_groups -> o_lora_rank), o_b_proj, the sinks; an hca layer's
        compressor (kv_proj, gate_proj: hidden -> head_dim; position_bias: hca_rate x head_dim; kv_norm), a csa
        layer's (the same at twice head_dim, position_bias csa_rate x 2 head_dim, kv_norm of head_dim) and its
        indexer (kv_proj, gate_proj: hidden -> 2 index_head_dim; position_bias; kv_norm; q_b_proj: q_lora_rank ->
        index heads x index_head_dim; weights_proj: hidden -> index heads)."""
        h, n, d, qr = self.hidden_size, self.num_heads, self.head_dim, self.q_lora_rank
        g, r = self.o_groups, self.o_lora_rank
        norm = self._norm_weights
        p = (h * qr + norm(qr) + qr * n * d + h * d + norm(d)  # type: ignore[operator]
             + (n * d // g) * g * r + g * r * h + (n if self.attn_sinks else 0))  # type: ignore[operator]
        if kind.attention == "hca":
            p += 2 * h * d + self.hca_rate * d + norm(d)  # type: ignore[operator]
        elif kind.attention == "csa":
            hi, di, m = self.index_n_heads, self.index_head_dim, self.csa_rate
            p += 2 * h * 2 * d + m * 2 * d + norm(d)  # type: ignore[operator]
            p += 2 * h * 2 * di + m * 2 * di + norm(di) + qr * hi * di + h * hi  # type: ignore[operator]
        return p

    @property
    def hc_layer_params(self) -> int:
        """A layer's two hyper-connections (before attention, before the FFN), as transformers'
        DeepseekV4HyperConnection: fn ((2 + n) n x n hidden), base ((2 + n) n), scale (3); 0 without them."""
        if self.hc_mult is None:
            return 0
        n = self.hc_mult
        return 2 * ((2 + n) * n * n * self.hidden_size + (2 + n) * n + 3)

    @property
    def hc_head_params(self) -> int:
        """The hyper-head that collapses the residual streams before the final norm (DeepseekV4HyperHead: hc_fn
        (n x n hidden), hc_base (n), hc_scale (1)); 0 without hyper-connections."""
        if self.hc_mult is None:
            return 0
        n = self.hc_mult
        return n * n * self.hidden_size + n + 1

    def router_table_params(self, kind: LayerKind) -> int:
        """What a hash-routed layer's router holds instead of the score-correction bias: the frozen token ->
        experts table (DeepseekV4HashRouter.tid2eid, vocab x experts_per_token, a persistent buffer of the
        checkpoint) less that bias; 0 for other layers."""
        if not kind.hash_router:
            return 0
        return self.vocab_size * self.experts_per_token - (self.num_experts if self.router_score_bias else 0)

    @property
    def indexer_params_per_layer(self) -> int:
        """DSA's lightning indexer in one layer, as transformers' DeepseekV32Indexer: wq_b (q_lora_rank ->
        index heads x index head dim), wk (hidden -> index head dim), k_norm (a LayerNorm: weight and bias),
        weights_proj (hidden -> index heads); 0 without DSA."""
        if not self.is_sparse_attention:
            return 0
        hi, di = self.index_n_heads, self.index_head_dim
        return self.q_lora_rank * hi * di + self.hidden_size * di + 2 * di + self.hidden_size * hi  # type: ignore

    @property
    def has_linear_layers(self) -> bool:
        """Some layer is a Gated DeltaNet or Mamba-2 (`linear`) layer."""
        return self.layer_types is not None and "linear" in self.layer_types

    @property
    def is_mamba(self) -> bool:
        """The linear layers are Mamba-2 mixers (Nemotron-H), not Gated DeltaNet."""
        return self.linear_mixer == "mamba2"

    @property
    def linear_chunk(self) -> int:
        """Tokens a block of the linear layers' chunked prefill form: `linear_chunk_size`, else the mixer's
        default (`LINEAR_CHUNK_DEFAULTS`)."""
        return self.linear_chunk_size or LINEAR_CHUNK_DEFAULTS[self.linear_mixer]

    @property
    def linear_mixer_name(self) -> str:
        """The linear layers' mixer as tables name it: `Mamba-2` or `Gated DeltaNet`."""
        return "Mamba-2" if self.is_mamba else "Gated DeltaNet"

    @property
    def sublayer_layers(self) -> bool:
        """Some layer is one sublayer only: a token mixer without an FFN or an FFN without a mixer (Nemotron-H)."""
        return bool(self.mixer_only_layers) or (self.layer_types is not None and "none" in self.layer_types)

    @property
    def linear_key_dim(self) -> int:
        """Gated DeltaNet: query (and key) width, linear_num_key_heads * linear_key_head_dim."""
        return self.linear_num_key_heads * self.linear_key_head_dim  # type: ignore[operator]

    @property
    def linear_value_dim(self) -> int:
        """Gated DeltaNet: value (and output gate) width, linear_num_value_heads * linear_value_head_dim."""
        return self.linear_num_value_heads * self.linear_value_head_dim  # type: ignore[operator]

    @property
    def linear_conv_dim(self) -> int:
        """Gated DeltaNet: channels of the causal convolution, q, k and v side by side (2 key_dim + value_dim)."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def linear_state_elements(self) -> int:
        """Gated DeltaNet: one layer's recurrent state per sequence, value heads x key dim x value dim."""
        return self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim  # type: ignore

    @property
    def linear_conv_state_elements(self) -> int:
        """Gated DeltaNet: one layer's convolution state per sequence, the last K - 1 inputs of every channel."""
        return (self.linear_conv_kernel - 1) * self.linear_conv_dim  # type: ignore[operator]

    @property
    def linear_params_per_layer(self) -> int:
        """One Gated DeltaNet token mixer, as transformers' Qwen3NextGatedDeltaNet: in_proj_qkvz (hidden ->
        2 key_dim + 2 value_dim), in_proj_ba (hidden -> 2 value heads), conv1d (conv_dim x K, no bias),
        dt_bias and A_log (one a value head), the gated norm (value head dim), out_proj (value_dim -> hidden).
        A Mamba-2 mixer, as transformers' NemotronHMamba2Mixer: in_proj (hidden -> z, x, B, C and dt: 2 value_dim
        + 2 key_dim + heads), conv1d (conv_dim x K, + a bias), dt_bias, A_log and D (one a head), the gated
        norm (value_dim), out_proj (value_dim -> hidden); in_proj and out_proj with biases if linear_proj_bias."""
        h, nv = self.hidden_size, self.linear_num_value_heads
        if self.is_mamba:
            proj = 2 * self.linear_key_dim + 2 * self.linear_value_dim + nv  # type: ignore[operator]
            conv = self.linear_conv_dim * (self.linear_conv_kernel + self.linear_conv_bias)  # type: ignore[operator]
            bias = (proj + h) if self.linear_proj_bias else 0
            return h * proj + conv + 3 * nv + self.linear_value_dim + self.linear_value_dim * h + bias  # type: ignore
        return (h * (2 * self.linear_key_dim + 2 * self.linear_value_dim) + h * 2 * nv  # type: ignore[operator]
                + self.linear_conv_dim * self.linear_conv_kernel + 2 * nv  # type: ignore[operator]
                + self.linear_value_head_dim + self.linear_value_dim * h)  # type: ignore[operator]

    def ffn_params(self, width: int, model_dim: int | None = None) -> int:
        """Parameters of one FFN (an expert, a shared expert or a dense FFN) of `width` hidden units over
        `model_dim` (default hidden_size; a latent MoE's routed experts: `expert_model_dim`)."""
        h = model_dim or self.hidden_size
        n = self.ffn_matrices * h * width
        if self.mlp_bias:
            n += (self.ffn_matrices - 1) * width + h
        return n

    @property
    def expert_ffn_size(self) -> int:
        """Width of one routed expert (moe_ffn_size, else ffn_size)."""
        return self.moe_ffn_size or self.ffn_size

    @property
    def shared_expert_ffn_size(self) -> int:
        """Width of one shared expert (shared_ffn_size, else the routed expert's)."""
        return self.shared_ffn_size or self.expert_ffn_size

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (of the dense FFN for a dense model)."""
        return self.ffn_params(self.expert_ffn_size, self.expert_model_dim)

    @property
    def expert_model_dim(self) -> int:
        """The width routed experts read and write: moe_latent_size (a latent MoE), else hidden_size."""
        return self.moe_latent_size or self.hidden_size

    @property
    def latent_proj_params(self) -> int:
        """A latent MoE layer's projections down to its experts' width and back up (with biases if mlp_bias);
        0 without one."""
        if not self.moe_latent_size:
            return 0
        h, d = self.hidden_size, self.moe_latent_size
        return 2 * h * d + ((h + d) if self.mlp_bias else 0)

    @property
    def dense_ffn_params(self) -> int:
        """Parameters of the FFN of a dense layer (ffn_size wide)."""
        return self.ffn_params(self.ffn_size)

    @property
    def router_params_per_layer(self) -> int:
        """The router of one MoE layer: hidden x experts, + a bias (gpt-oss), + the score-correction
        bias (DeepSeek-V3, GLM-4.5: a persistent buffer in transformers, a tensor of the checkpoint)."""
        if not self.is_moe:
            return 0
        e = self.num_experts
        return self.hidden_size * e + (e if self.router_bias else 0) + (e if self.router_score_bias else 0)

    @property
    def moe_ffn_params(self) -> int:
        """The FFN of one MoE layer: routed and shared experts, the router, the shared-expert gate."""
        parallel = (3 * self.norm_params + self.hidden_size + self.num_experts) if self.moe_parallel_ffn else 0
        return (self.num_experts * self.expert_params
                + self.shared_experts * self.ffn_params(self.shared_expert_ffn_size)
                + self.router_params_per_layer + (self.hidden_size if self.shared_expert_gate else 0) + parallel
                + self.latent_proj_params)

    @property
    def ffn_params_per_layer(self) -> int:
        """FFN parameters of an MoE layer (of every layer for a dense model); see `layer_params`."""
        return self.moe_ffn_params if self.is_moe else self.dense_ffn_params

    @property
    def norms_per_layer(self) -> int:
        """Hidden-size norms per layer: before attention and MLP (+ after each: Gemma's sandwich)."""
        return 4 if self.sandwich_norms else 1 if self.shared_input_norm else 2

    def layer_norms(self, kind: LayerKind) -> int:
        """Hidden-size norms in a layer of `kind`: `norms_per_layer`, less the one of a sublayer it lacks
        (Nemotron-H's layers of one sublayer have one)."""
        return self.norms_per_layer - (not kind.ffn and not self.shared_input_norm) - (kind.attention == "none")

    def layer_params(self, kind: LayerKind) -> int:
        """Parameters of one layer of `kind` (attention, its FFN, its norms; a layer of one sublayer has its
        norm only: Nemotron-H)."""
        ffn = 0 if not kind.ffn else self.moe_ffn_params if kind.moe else self.ffn_params(self.dense_ffn_width(kind))
        return (self.attn_params(kind) + ffn + self.layer_norms(kind) * self.norm_params
                + (1 if self.layer_scalar else 0) + self.ple_layer_params + self.hc_layer_params
                + self.router_table_params(kind))

    def dense_ffn_width(self, kind: LayerKind) -> int:
        """The dense FFN's width in a layer of `kind`: ffn_size, twice it in Gemma 4's KV-shared layers with
        `wide_shared_ffn`."""
        return self.ffn_size * (2 if self.wide_shared_ffn and kind.kv_shared else 1)

    def ffn_view(self, kind: LayerKind) -> ModelSpec:
        """This model as the FFN of a layer of `kind` sees it: Gemma 4's wide KV-shared layers' ffn_size doubled."""
        if self.dense_ffn_width(kind) == self.ffn_size:
            return self
        return replace(self, ffn_size=self.dense_ffn_width(kind), wide_shared_ffn=False, kv_shared_layers=())

    @property
    def ple_params(self) -> int:
        """Per-layer embeddings' model-level parameters: the table (ple_vocab x layers x ple_dim), the
        projection of the embedding (hidden -> layers x ple_dim) and its norm (ple_dim); 0 without them."""
        if not self.ple_dim:
            return 0
        width = self.num_layers * self.ple_dim
        return (self.ple_vocab or self.vocab_size) * width + self.hidden_size * width + self._norm_weights(self.ple_dim)

    @property
    def ple_layer_params(self) -> int:
        """Per-layer embeddings in one layer: the gate (hidden -> ple_dim), the projection back (ple_dim ->
        hidden) and the norm after it; 0 without them."""
        return 2 * self.hidden_size * self.ple_dim + self.norm_params if self.ple_dim else 0

    def attn_params(self, kind: LayerKind) -> int:
        """Parameters of one layer's mixer of `kind`: its attention (a shared-top-k layer's without the
        indexer it does not have; Gemma 4's full layers of their own shape) or its linear attention (0 for none)."""
        if kind.attention == "none":
            return 0
        if kind.attention == "linear":
            return self.linear_params_per_layer
        if self.is_v4_attention:
            return self._v4_attn_params(kind)
        if kind.global_shape or kind.kv_shared:
            return self._gqa_params(*self.attention_dims(kind), kv_mats=self.kv_projections(kind))
        if kind.shared_topk:  # no indexer of its own
            return self.attn_params_per_layer - self.indexer_params_per_layer
        return self.attn_params_per_layer

    @property
    def params_per_layer(self) -> int:
        """Parameters of one layer; for a model whose layers differ, of its first MoE layer."""
        return self.layer_params(LayerKind(attention="full", window=None, rope=True, moe=self.is_moe))

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
        """Total parameters, exactly the tensors of the Hugging Face checkpoint that transformers
        builds: `model.parameters()` (a tied head once), plus the persistent buffer DeepSeek-V3 and
        GLM-4.5 keep for noaux_tc routing (`router_score_bias`: one fp32 per expert per MoE layer,
        stored and read like a weight) and DeepSeek-V4's hash layers' token table (`router_table_params`).
        The input embedding and an untied lm_head are included; multi-token-prediction layers
        (`mtp_layers`) are excluded, as transformers does not build them (DeepSeek-V3: 671.0B here,
        "685B" on its model card with the MTP layer). Checked against
        transformers on the meta device in tests/specs/test_hf_crosscheck.py and test_hf_today.py."""
        layers = sum(count * self.layer_params(kind) for kind, count in self.layer_groups())
        return (self.embedding_params + layers + self.norm_params + self.lm_head_params + self.ple_params
                + self.hc_head_params)

    @property
    def active_param_count(self) -> int:
        """Parameters one token touches: every dense part, its experts_per_token routed experts and
        the shared experts, the input embedding included and MTP layers excluded, as `param_count`
        (the convention of ARCHITECTURES.md §11; OpenAI's "5.1B active" for gpt-oss-120b leaves out
        the input embedding, which FLOPs do not touch: 2 * (active - vocab * hidden) per token)."""
        unused = (self.num_experts - self.experts_per_token) * self.expert_params
        return self.param_count - self.num_moe_layers * unused

    # ---- layers ------------------------------------------------------------------------------------
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Every layer's kind, in order: its attention (full, sliding or chunked with the tokens it
        sees), whether it rotates positions, whether its FFN is a mixture of experts."""
        return _layer_kinds(self)

    def layer_groups(self) -> tuple[tuple[LayerKind, int], ...]:
        """(kind, number of layers) for each distinct kind, in order of first appearance."""
        counts: dict[LayerKind, int] = {}
        for kind in self.layer_kinds():
            counts[kind] = counts.get(kind, 0) + 1
        return tuple(counts.items())

    @property
    def num_moe_layers(self) -> int:
        return sum(count for kind, count in self.layer_groups() if kind.moe)

    @property
    def uniform_layers(self) -> bool:
        """Every layer alike (the models of 2023-24); the engine builds only these."""
        return len(self.layer_groups()) == 1

    @property
    def plain_llama_layers(self) -> bool:
        """The plain Llama structure: uniform layers and nothing of today's models (MLA, a QK norm,
        sinks, soft-caps, sandwich, post or shared norms, Gemma's norm offset and query scalar, Ministral 3's query
        scale, interleaved or skipped rotary positions, layers of several kinds, Granite's residual multiplier)."""
        return (self.uniform_layers and not self.is_mla and self.qk_norm is None and not self.attn_sinks
                and self.attn_softcap is None and not self.sandwich_norms and not self.post_norm
                and not self.norm_offset and self.query_log_scale is None and not self.shared_input_norm
                and self.query_pre_attn_scalar is None and not self.rope_interleaved and not self.nope_layers
                and self.layer_types is None and not self.mixer_only_layers and self.residual_multiplier == 1.0)

    @property
    def one_call_layers(self) -> bool:
        """Whether llmperf's CPU engine may run a decode step of this model's layers in one call of its
        kernels (`engine.cpu.ops.CpuOps.decode_layers`; the one rule it asks): plain Llama layers with
        RMSNorm, rotary positions, a SiLU-gated FFN and no experts. The run decides the rest: fp32 or
        bf16 with the kernels built, the sdpa backend, a head dim and rows the kernels take
        (`EfficiencyTimeModel.for_model` prices the operators of the path a model runs)."""
        return (self.plain_llama_layers and self.norm_kind == "rmsnorm" and self.pos_encoding == "rope"
                and self.ffn_kind == "swiglu" and self.hidden_act in ("silu", "swish") and not self.is_moe)

    # ---- bytes -----------------------------------------------------------------------------------
    def kv_cache(self, kv: str | float | Any = "fp16") -> KVCacheSpec:
        """The KV-cache spec of this model with elements of `kv` (a dtype name, a byte size, or a
        `Precision`): bytes per token, per block, per context (capped at `sliding_window`)."""
        return KVCacheSpec.from_model(self, kv)

    def kv_bytes_per_token(self, kv_dtype: str | float = "fp16") -> float:
        """KV cache bytes one token occupies: 2 (K and V) * layers * kv_heads * head_dim * bytes."""
        return self.kv_cache(kv_dtype).bytes_per_token

    def weight_bytes(self, weight_dtype: str = "fp16") -> float:
        """Bytes of every parameter at `weight_dtype` (no quantisation scales; see `llmperf.analysis.memory`
        for those)."""
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
        n = changes.get("num_layers", self.num_layers)
        if isinstance(n, int) and n != self.num_layers:
            # fewer (or more) layers keep the per-layer pattern: the first n layers of it, repeated
            if self.layer_types is not None and "layer_types" not in changes:
                pattern = self.layer_types
                changes["layer_types"] = tuple(pattern[i % len(pattern)] for i in range(max(n, 0)))
            for f in ("dense_layers", "nope_layers", "shared_topk_layers", "mixer_only_layers", "hash_moe_layers"):
                if f not in changes:
                    changes[f] = tuple(i for i in getattr(self, f) if i < n)
        return replace(self, **changes)

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike[str], name: str | None = None) -> ModelSpec:
        """Read a Hugging Face `config.json` (the file or its directory); the model types are listed in
        `llmperf.specs.hf.SUPPORTED_MODEL_TYPES` (Llama 1-4, Mistral, Mixtral, Qwen2/3, DeepSeek-V2/V3,
        Kimi-K2, GLM-4.5, gpt-oss, Gemma 2/3, GPT-2, OPT, GPT-NeoX)."""
        from llmperf.specs.hf import model_spec_from_hf_config
        return model_spec_from_hf_config(path, name=name)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain data (`dataclasses.asdict`)."""
        from dataclasses import asdict
        return asdict(self)


def _quantization(model: str, data: Mapping[str, Any]) -> QuantizationSpec:
    try:
        return QuantizationSpec.from_mapping(dict(data))
    except SpecError as exc:
        raise SpecError(f"{model}: {exc}") from None


def _positive_number(model: str, name: str, value: Any) -> None:
    """A real number > 0 that is finite (NaN and infinity are refused: they poison every result)."""
    check_number(f"{model}: {name}", value)


def _positive_int(spec: ModelSpec, name: str) -> None:
    value = getattr(spec, name)
    if not is_count(value) or value <= 0:
        raise SpecError(f"{spec.name}: {name} must be a positive integer, got {value!r}")
    if value > 2**53:  # float64 holds every count up to 2**53 exactly, and no model is near it
        raise SpecError(f"{spec.name}: {name} must be at most 2**53, got {value!r}")



def _layer_kinds(spec: ModelSpec) -> tuple[LayerKind, ...]:
    types = spec.layer_types or (("sliding" if spec.sliding_window is not None else "full"),) * spec.num_layers
    dense, nope, shared = set(spec.dense_layers), set(spec.nope_layers), set(spec.shared_topk_layers)
    rope = spec.pos_encoding == "rope"
    windows = {"full": None, "sliding": spec.sliding_window, "chunked": spec.attention_chunk_size, "linear": None,
               "none": None, "csa": spec.sliding_window, "hca": spec.sliding_window}
    hashed = set(spec.hash_moe_layers)
    wide, kv_shared, alone = spec.has_global_attention, set(spec.kv_shared_layers), set(spec.mixer_only_layers)
    return tuple(LayerKind(attention=t, window=windows[t], rope=rope and i not in nope and t not in ("linear", "none"),
                           moe=spec.is_moe and i not in dense and i not in alone, shared_topk=i in shared,
                           global_shape=wide and t == "full", kv_shared=i in kv_shared, ffn=i not in alone,
                           hash_router=i in hashed)
                 for i, t in enumerate(types))


def _global_view(spec: ModelSpec) -> ModelSpec:
    """`spec` with its full layers' attention shape as the model's (`ModelSpec.attention_view`)."""
    hd = spec.global_head_dim or spec.head_dim
    return replace(spec, head_dim=hd, num_kv_heads=spec.global_kv_heads or spec.num_kv_heads,
                   rotary_dim=hd if spec.rotary_dim == spec.head_dim else min(spec.rotary_dim, hd),
                   global_head_dim=None, global_kv_heads=None)  # global_k_eq_v kept: its full layers have no v_proj


def _optional_positive_int(spec: ModelSpec, name: str) -> None:
    if getattr(spec, name) is not None:
        _positive_int(spec, name)


def _layer_indices(spec: ModelSpec, name: str) -> None:
    object.__setattr__(spec, name, layer_indices(f"{spec.name}: {name}", getattr(spec, name), spec.num_layers))


def _check_layer_structure(spec: ModelSpec) -> None:
    """The per-layer fields agree with each other and with the model's shape (one line naming the
    field otherwise)."""
    name = spec.name
    lt = spec.layer_types
    if isinstance(lt, list):
        lt = tuple(lt)
        object.__setattr__(spec, "layer_types", lt)
    if lt is not None:
        if not isinstance(lt, tuple) or not all(isinstance(t, str) for t in lt):
            raise SpecError(f"{name}: layer_types must be a list of {', '.join(ATTENTION_KINDS)}, got {lt!r}")
        if len(lt) != spec.num_layers:
            raise SpecError(f"{name}: layer_types has {len(lt)} entries, num_layers={spec.num_layers}")
        unknown = [t for t in lt if t not in ATTENTION_KINDS]
        if unknown:
            raise SpecError(f"{name}: layer_types holds {unknown[0]!r} (choose from {', '.join(ATTENTION_KINDS)})")
        for t in ("sliding", "csa", "hca"):
            if t in lt and spec.sliding_window is None:
                raise SpecError(f"{name}: layer_types has {t} layers but sliding_window is not set")
        if "chunked" in lt and spec.attention_chunk_size is None:
            raise SpecError(f"{name}: layer_types has chunked layers but attention_chunk_size is not set")
    for f in ("attention_chunk_size", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim", "moe_ffn_size", "shared_ffn_size", "moe_latent_size"):
        _optional_positive_int(spec, f)
    _check_linear_layers(spec)
    _check_sparse_attention(spec)
    _layer_indices(spec, "nope_layers")
    _layer_indices(spec, "dense_layers")
    _check_sublayers(spec)
    if spec.dense_layers and not spec.is_moe:
        raise SpecError(f"{name}: dense_layers={list(spec.dense_layers)} needs num_experts > 1")
    if spec.is_moe and len(spec.dense_layers) == spec.num_layers:
        raise SpecError(f"{name}: dense_layers lists every layer, so no layer is a mixture of experts")
    for f in ("moe_ffn_size", "moe_latent_size", "shared_expert_gate", "router_bias", "router_score_bias"):
        if getattr(spec, f) and not spec.is_moe:
            raise SpecError(f"{name}: {f}={getattr(spec, f)!r} needs num_experts > 1")
    if spec.shared_ffn_size is not None and not spec.shared_experts:
        raise SpecError(f"{name}: shared_ffn_size={spec.shared_ffn_size} needs shared_experts >= 1")
    if spec.shared_expert_gate and not spec.shared_experts:
        raise SpecError(f"{name}: shared_expert_gate needs shared_experts >= 1")
    mla = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if spec.kv_lora_rank is not None:
        missing = [f for f in mla if getattr(spec, f) is None]
        if missing:
            raise SpecError(f"{name}: multi-head latent attention (kv_lora_rank={spec.kv_lora_rank}) needs "
                            f"{missing[0]}")
        if spec.qk_norm is not None or spec.attn_sinks:
            raise SpecError(f"{name}: {'qk_norm' if spec.qk_norm else 'attn_sinks'} is not defined for "
                            "multi-head latent attention")
        if spec.pos_encoding != "rope":
            raise SpecError(f"{name}: multi-head latent attention needs pos_encoding=rope")
    else:
        given = [f for f in (*mla, *(() if spec.is_v4_attention else ("q_lora_rank",))) if getattr(spec, f) is not None]
        if given:
            raise SpecError(f"{name}: {given[0]}={getattr(spec, given[0])} needs kv_lora_rank "
                            "(multi-head latent attention)")
    if spec.qk_norm is not None and spec.qk_norm not in QK_NORMS:
        raise SpecError(f"{name}: qk_norm must be one of {', '.join(QK_NORMS)} or null, got {spec.qk_norm!r}")
    for f in ("sandwich_norms", "post_norm", "embedding_scale", "attn_sinks", "shared_expert_gate", "router_bias",
              "router_score_bias", "shared_input_norm"):
        if not isinstance(getattr(spec, f), bool):
            raise SpecError(f"{name}: {f} must be true or false, got {getattr(spec, f)!r}")
    if spec.post_norm and spec.sandwich_norms:
        raise SpecError(f"{name}: post_norm (norms after each sublayer only) excludes sandwich_norms (before and "
                        "after)")
    if spec.shared_input_norm and (spec.post_norm or spec.sandwich_norms or spec.parallel_residual
                                   or spec.mixer_only_layers):
        raise SpecError(f"{name}: shared_input_norm (one norm before attention and the FFN side by side) excludes "
                        "post_norm, sandwich_norms, parallel_residual and layers of one sublayer")
    for f in ("attn_softcap", "final_softcap", "logit_scale"):
        if getattr(spec, f) is not None:
            _positive_number(name, f, getattr(spec, f))
    _check_global_attention(spec)
    _check_v4(spec)
    _check_numerics(spec)
    m = spec.mtp_layers
    if not is_count(m) or m < 0:
        raise SpecError(f"{name}: mtp_layers must be an integer >= 0, got {m!r}")


def _check_global_attention(spec: ModelSpec) -> None:
    """Gemma 4's fields: its full layers' head dim and KV heads (dividing the query heads), not with latent
    attention; per-layer embeddings' width (and table rows); each KV-shared layer has an earlier layer of its
    kind with a cache of its own to read; its FFN beside the experts needs one shared expert (the dense FFN)."""
    name = spec.name
    for f in ("global_k_eq_v", "v_norm", "moe_parallel_ffn", "layer_scalar", "wide_shared_ffn", "qk_norm_gathered"):
        if not isinstance(getattr(spec, f), bool):
            raise SpecError(f"{name}: {f} must be true or false, got {getattr(spec, f)!r}")
    _optional_positive_int(spec, "global_head_dim")
    _optional_positive_int(spec, "global_kv_heads")
    if spec.global_kv_heads is not None and spec.num_heads % spec.global_kv_heads:
        raise SpecError(f"{name}: global_kv_heads={spec.global_kv_heads} does not divide num_heads={spec.num_heads}")
    if spec.has_global_attention and spec.is_mla:
        raise SpecError(f"{name}: global_head_dim / global_kv_heads / global_k_eq_v are not defined for multi-head "
                        "latent attention")
    _optional_positive_int(spec, "ple_dim")
    _optional_positive_int(spec, "ple_vocab")
    if spec.ple_vocab is not None and spec.ple_dim is None:
        raise SpecError(f"{name}: ple_vocab={spec.ple_vocab} needs ple_dim (per-layer embeddings)")
    _layer_indices(spec, "kv_shared_layers")
    if spec.kv_shared_layers:
        kinds = spec.layer_types or ("sliding" if spec.sliding_window is not None else "full",) * spec.num_layers
        for i in spec.kv_shared_layers:
            earlier = [kinds[j] for j in range(i) if j not in spec.kv_shared_layers]
            if kinds[i] in ("linear", "none") or kinds[i] not in earlier:
                raise SpecError(f"{name}: kv_shared_layers holds layer {i}, with no earlier {kinds[i]} layer of its "
                                "own cache to read")
        if spec.is_mla:
            raise SpecError(f"{name}: kv_shared_layers is not defined for multi-head latent attention")
    if spec.qk_norm_gathered and spec.qk_norm != "rmsnorm_across_heads":
        raise SpecError(f"{name}: qk_norm_gathered needs qk_norm=rmsnorm_across_heads, got {spec.qk_norm!r}")
    if spec.wide_shared_ffn and spec.is_moe:
        raise SpecError(f"{name}: wide_shared_ffn (a double-wide dense FFN in the KV-shared layers) is not modelled "
                        "with mixture-of-experts layers")
    if spec.moe_parallel_ffn and (not spec.is_moe or spec.shared_experts != 1):
        raise SpecError(f"{name}: moe_parallel_ffn needs num_experts > 1 and shared_experts=1 (the dense FFN), "
                        f"got num_experts={spec.num_experts}, shared_experts={spec.shared_experts}")


LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_conv_kernel")


INDEX_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")


def _check_sparse_attention(spec: ModelSpec) -> None:
    """DSA's fields: all three or none, counts, on multi-head latent attention with a q_lora_rank (the
    indexer's query reads the compressed query); `shared_topk_layers` only with them, never layer 0
    (a shared layer reuses the top-k of an earlier layer that ran its indexer)."""
    _layer_indices(spec, "shared_topk_layers")
    given = [f for f in INDEX_FIELDS if getattr(spec, f) is not None]
    if not given:
        if spec.shared_topk_layers:
            raise SpecError(f"{spec.name}: shared_topk_layers={list(spec.shared_topk_layers)} needs index_topk "
                            "(DeepSeek Sparse Attention)")
        return
    if 0 in spec.shared_topk_layers:
        raise SpecError(f"{spec.name}: shared_topk_layers holds layer 0, which has no earlier top-k to reuse")
    if len(given) < len(INDEX_FIELDS):
        missing = next(f for f in INDEX_FIELDS if getattr(spec, f) is None)
        raise SpecError(f"{spec.name}: {given[0]}={getattr(spec, given[0])!r} needs {missing} (DeepSeek Sparse "
                        "Attention's indexer)")
    for f in INDEX_FIELDS:
        _positive_int(spec, f)
    if not (spec.is_mla or spec.is_v4_attention) or spec.q_lora_rank is None:
        raise SpecError(f"{spec.name}: index_topk (DeepSeek Sparse Attention) needs multi-head latent attention "
                        "with q_lora_rank (or DeepSeek-V4's attention, o_groups)")


def _check_v4(spec: ModelSpec) -> None:
    """DeepSeek-V4's fields: its attention (`o_groups`) has a low-rank query, one shared K = V head, an
    `o_lora_rank`, head groups that split the heads' output evenly, no MLA; csa and hca layers need it and their
    rates (csa: the indexer's fields); hyper-connections' streams and Sinkhorn iterations; hash-routed layers
    are MoE layers."""
    name = spec.name
    for f in ("o_groups", "o_lora_rank", "csa_rate", "hca_rate", "hc_mult"):
        _optional_positive_int(spec, f)
    it = spec.hc_sinkhorn_iters
    if not is_count(it) or it < 0:
        raise SpecError(f"{name}: hc_sinkhorn_iters must be an integer >= 0, got {it!r}")
    if it and spec.hc_mult is None:
        raise SpecError(f"{name}: hc_sinkhorn_iters={it} needs hc_mult (hyper-connections)")
    _layer_indices(spec, "hash_moe_layers")
    bad = [i for i in spec.hash_moe_layers if not spec.is_moe or i in spec.dense_layers or i in spec.mixer_only_layers]
    if bad:
        raise SpecError(f"{name}: hash_moe_layers holds layer {bad[0]}, which is not a mixture-of-experts layer")
    kinds = spec.layer_types or ()
    if spec.is_v4_attention:
        if spec.is_mla or spec.q_lora_rank is None or spec.o_lora_rank is None:
            raise SpecError(f"{name}: o_groups (DeepSeek-V4's attention) needs q_lora_rank and o_lora_rank, without "
                            "kv_lora_rank")
        if spec.num_kv_heads != 1 or spec.qk_norm is not None:
            raise SpecError(f"{name}: o_groups (DeepSeek-V4's attention) has one shared K = V head and no qk_norm, got "
                            f"num_kv_heads={spec.num_kv_heads}, qk_norm={spec.qk_norm!r}")
        if (spec.num_heads * spec.head_dim) % spec.o_groups:  # type: ignore[operator]
            raise SpecError(f"{name}: o_groups={spec.o_groups} does not divide num_heads x head_dim="
                            f"{spec.num_heads * spec.head_dim}")
        for t, f in (("csa", "csa_rate"), ("hca", "hca_rate"), ("csa", "index_topk")):
            if t in kinds and getattr(spec, f) is None:
                raise SpecError(f"{name}: layer_types has {t} layers but {f} is not set")
    else:
        given = [f for f in ("o_lora_rank", "csa_rate", "hca_rate") if getattr(spec, f) is not None]
        given += [t for t in ("csa", "hca") if t in kinds]
        if given:
            raise SpecError(f"{name}: {given[0]} needs o_groups (DeepSeek-V4's attention)")
        for f in ("hc_mult", "hash_moe_layers"):  # modelled inside DeepSeek-V4's layers only, as no other model has
            if getattr(spec, f) not in (None, ()):
                raise SpecError(f"{name}: {f}={getattr(spec, f)!r}: DeepSeek-V4's hyper-connections and hash routing "
                                "are modelled with its attention only (o_groups), not on a spec of their own")


def _check_sublayers(spec: ModelSpec) -> None:
    """Layers of one sublayer (Nemotron-H): `mixer_only_layers` are layers with a token mixer, and none of the
    block structures that assume both sublayers (sandwich or post norms, a parallel residual, per-layer
    embeddings) is set."""
    _layer_indices(spec, "mixer_only_layers")
    kinds = spec.layer_types or ()
    for i in spec.mixer_only_layers:
        if kinds and kinds[i] == "none":
            raise SpecError(f"{spec.name}: mixer_only_layers holds layer {i}, whose layer_types entry is none: a "
                            "layer with neither a token mixer nor an FFN")
    if spec.sublayer_layers:
        for f in ("sandwich_norms", "post_norm", "parallel_residual", "ple_dim", "wide_shared_ffn"):
            if getattr(spec, f):
                raise SpecError(f"{spec.name}: {f}={getattr(spec, f)!r} is not modelled with layers of one sublayer "
                                "(mixer_only_layers, layer_types none)")


def _check_linear_layers(spec: ModelSpec) -> None:
    """Linear-layer fields: all set iff a layer is `linear`, counts, value heads a multiple of key
    heads, a convolution of at least 2 taps, a known mixer (Gated DeltaNet has no biases); the state dtype a
    known one; the output gate a flag."""
    name = spec.name
    if spec.linear_mixer not in LINEAR_MIXERS:
        raise SpecError(f"{name}: linear_mixer must be one of {', '.join(LINEAR_MIXERS)}, got {spec.linear_mixer!r}")
    for f in ("linear_conv_bias", "linear_proj_bias"):
        if not isinstance(getattr(spec, f), bool):
            raise SpecError(f"{name}: {f} must be true or false, got {getattr(spec, f)!r}")
        if getattr(spec, f) and not spec.is_mamba:
            raise SpecError(f"{name}: {f}=True needs linear_mixer=mamba2 (Gated DeltaNet has no such bias)")
    _optional_positive_int(spec, "linear_chunk_size")
    dt_min = spec.linear_dt_min
    if isinstance(dt_min, bool) or not isinstance(dt_min, (int, float)) or not 0 <= dt_min < float("inf"):
        raise SpecError(f"{name}: linear_dt_min must be a finite number >= 0, got {dt_min!r}")
    if dt_min and not spec.is_mamba:
        raise SpecError(f"{name}: linear_dt_min={dt_min!r} needs linear_mixer=mamba2 (Gated DeltaNet has no dt clamp)")
    if not isinstance(spec.attn_output_gate, bool):
        raise SpecError(f"{name}: attn_output_gate must be true or false, got {spec.attn_output_gate!r}")
    if spec.attn_output_gate and spec.is_mla:
        raise SpecError(f"{name}: attn_output_gate is not defined for multi-head latent attention")
    if spec.has_linear_layers:
        for f in LINEAR_FIELDS:
            if getattr(spec, f) is None:
                raise SpecError(f"{name}: layer_types has linear ({spec.linear_mixer_name}) layers but {f} is not set")
            _positive_int(spec, f)
        if spec.linear_num_value_heads % spec.linear_num_key_heads:  # type: ignore[operator]
            raise SpecError(f"{name}: linear_num_key_heads={spec.linear_num_key_heads} does not divide "
                            f"linear_num_value_heads={spec.linear_num_value_heads}")
        if spec.linear_conv_kernel < 2:  # type: ignore[operator]
            raise SpecError(f"{name}: linear_conv_kernel must be at least 2, got {spec.linear_conv_kernel!r}")
        if spec.is_mla:
            raise SpecError(f"{name}: linear ({spec.linear_mixer_name}) layers beside multi-head latent attention "
                            "are not modelled")
    else:
        given = [f for f in (*LINEAR_FIELDS, "state_dtype", "linear_chunk_size") if getattr(spec, f) is not None]
        given += ["linear_mixer"] if spec.is_mamba else []
        if given:
            raise SpecError(f"{name}: {given[0]}={getattr(spec, given[0])!r} needs linear (Gated DeltaNet or "
                            "Mamba-2) layers in layer_types")
    if spec.state_dtype is not None:
        object.__setattr__(spec, "state_dtype", normalize_dtype(spec.state_dtype, f"{name}: state_dtype"))


ROUTER_SCORINGS = ("softmax", "sigmoid", "sqrtsoftplus")


def _check_numerics(spec: ModelSpec) -> None:
    """The numerics fields (routing, clamps, scales, rotary variants): one line naming the field."""
    name = spec.name
    if spec.router_scoring not in ROUTER_SCORINGS:
        raise SpecError(f"{name}: router_scoring must be one of {', '.join(ROUTER_SCORINGS)}, "
                        f"got {spec.router_scoring!r}")
    for f in ("router_renormalize", "router_input_scaling", "norm_offset", "rope_interleaved"):
        if not isinstance(getattr(spec, f), bool):
            raise SpecError(f"{name}: {f} must be true or false, got {getattr(spec, f)!r}")
    _positive_number(name, "router_scale", spec.router_scale)
    for f in ("router_groups", "router_topk_groups"):
        _positive_int(spec, f)
    if spec.num_experts % spec.router_groups:
        raise SpecError(f"{name}: router_groups={spec.router_groups} does not divide num_experts={spec.num_experts}")
    if spec.router_topk_groups > spec.router_groups:
        raise SpecError(f"{name}: router_topk_groups={spec.router_topk_groups} exceeds "
                        f"router_groups={spec.router_groups}")
    for f in ("swiglu_limit", "query_pre_attn_scalar", "rope_local_theta", "attention_multiplier"):
        if getattr(spec, f) is not None:
            _positive_number(name, f, getattr(spec, f))
    for f in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
        _positive_number(name, f, getattr(spec, f))
    if spec.attention_multiplier is not None and (spec.query_pre_attn_scalar is not None or spec.is_mla):
        raise SpecError(f"{name}: attention_multiplier (the softmax scale) is not defined with "
                        f"{'multi-head latent attention' if spec.is_mla else 'query_pre_attn_scalar'}")
    # Llama 4's NoPE temperature and Ministral 3's query scale: a pair of positive numbers each
    for f, parts in (("nope_temperature", ("floor_scale", "attn_scale")), ("query_log_scale", ("beta", "interval"))):
        t = getattr(spec, f)
        if isinstance(t, list):
            t = tuple(t)
            object.__setattr__(spec, f, t)
        if t is None:
            continue
        if not isinstance(t, tuple) or len(t) != 2:
            raise SpecError(f"{name}: {f} must be [{', '.join(parts)}], got {t!r}")
        for part, value in zip(parts, t):
            _positive_number(name, f"{f}.{part}", value)
