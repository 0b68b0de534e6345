"""`KVCacheSpec`: the one place the KV-cache size formula lives.

Every attention layer stores a key and a value vector per KV head for each token it can still attend
to, `2 * kv_heads * head_dim` elements per token and layer. Multi-head latent attention (MLA:
DeepSeek-V2/V3, Kimi-K2; DeepSeek-AI, arXiv:2405.04434) stores one compressed latent shared by every
head, `kv_lora_rank + qk_rope_head_dim` elements: one "latent head" (`latent=True`, `num_kv_heads=1`)
that tensor parallelism cannot split (aiconfigurator `get_kvcache_elements_per_token`; vLLM's MLA
backends).

A layer holds the whole context (`full`), its last W tokens (`sliding`) or at most its chunk C
(`chunked`, `tokens_held`; `tokens_in_use` is the current chunk). `window="capped"` gives sliding and
chunked layers only their window, as vLLM's hybrid KV-cache manager does (`SlidingWindowManager`,
`ChunkedLocalAttentionManager`); `window="full"` gives every layer the whole context, as engines with unified
pages do (TensorRT-LLM, hf-mem). A paged cache allocates `block_size` tokens at a time, one block table per
group of layers of one kind (`paged_bytes_for_context`); `paged_blocks`, `paged_reserved_bytes` and
`paged_used_bytes` follow a paged engine block by block and equal `llmperf.engine.cache.PagedKVCache.usage()`.
`sharded` splits KV heads over tensor parallelism (never below one a GPU) and layers over pipeline stages as
vLLM partitions them (`pipeline_stages`).

Gated DeltaNet and Mamba-2 layers (`linear`: Qwen3-Next, Qwen3.5, Nemotron-H) hold no KV but one state per
sequence whatever its context (`state_bytes`: the recurrent state, value heads x key dim x value dim, and the
last K - 1 inputs of its convolution), outside the token groups (`groups`: the KV-holding layers; `none`
layers, Nemotron-H's FFN alone, hold nothing). Contexts may be Python numbers or numpy arrays (a sweep
evaluates many at once). Worked figures and the block-by-block rules: docs/model.md, "Memory and the KV cache".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from llmperf.errors import SpecError
from llmperf.numeric import is_count, is_int, is_real, layer_indices
from llmperf.specs.precision import dtype_bytes

if TYPE_CHECKING:
    from llmperf.specs.model import ModelSpec

KV_ATTENTION_KINDS = ("full", "sliding", "chunked", "linear", "none", "csa", "hca")
#: DeepSeek-V4's parts of a cache, as `KVGroup.attention` (`KVCacheSpec.v4`): a csa / hca layer's window of
#: K = V (`window`), its compressed entries (`compressed`, one per `window` tokens), its compressors' partial
#: window (`partial`, the tokens past the last full one) and a csa layer's last window's first series (`overlap`)
V4_GROUP_KINDS = ("window", "compressed", "partial", "overlap")
#: the bytes of a DeepSeek-V4 compressor's position-bias dtype (fp32 in transformers and a checkpoint): the
#: dtype of the overlap's gate
V4_GATE_BYTES = 4.0
#: how sliding and chunked layers are allocated: their window only (vLLM's hybrid manager) or the
#: whole context like a full layer (no hybrid manager, hf-mem >= PR #70)
KV_WINDOW_MODES = ("capped", "full")


def first_key(attention: str, window: int | None, start: int) -> int:
    """The earliest key position a step whose first new token is at `start` reads in a layer of this
    attention kind: 0 (full), `start - window + 1` (sliding, the query itself counted), the start of
    `start`'s chunk (chunked)."""
    if attention == "sliding":
        return max(0, start - window + 1)  # type: ignore[operator]
    if attention == "chunked":
        return (start // window) * window  # type: ignore[operator]
    return 0


def pages_per_block(layers: int, full_layers: int, layer_elements: int = 1, full_layer_elements: int = 1) -> int:
    """Pool blocks one block of a window group of `layers` layers takes when a pool block holds the
    `full_layers` full-attention layers: `ceil(layers / full_layers)`, the last sub-group padded. vLLM
    pages every KV-cache group alike (`vllm/v1/core/kv_cache_utils.py`,
    `_get_kv_cache_groups_uniform_page_size`): a group holds as many layers as the smallest kind has,
    the full layers in Gemma 2/3, gpt-oss and Llama 4 (Gemma 3 27B: 10 full, 52 sliding = 6 groups of
    10, the last padded from 2). Where a layer of the group stores another number of elements a token
    than a full one (Gemma 4), by bytes: `ceil(layers x layer_elements / (full_layers x
    full_layer_elements))` (vLLM evens such pages out by the block size instead; the bytes agree within a
    block)."""
    return -(-(layers * layer_elements) // (full_layers * full_layer_elements))


def pipeline_stages(num_layers: int, pp: int) -> tuple[range, ...]:
    """The layers of each pipeline stage, as vLLM partitions them (`get_pp_indices`): `L // pp` each,
    the remainder one more each on the stages before the last (the last one holds the lm_head)."""
    _check_positive_int("pp", pp)
    if pp > num_layers:
        raise SpecError(f"pp: {pp} exceeds num_layers={num_layers}")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    starts = np.cumsum([0, *parts]).tolist()
    return tuple(range(a, b) for a, b in zip(starts[:-1], starts[1:]))


@dataclass(frozen=True, kw_only=True)
class KVGroup:
    """The layers of one attention kind in a cache: what one of them stores per token
    (`bytes_per_token_per_layer`) and how many tokens it keeps. `capped=False`: the engine gives
    these layers the whole context even though they attend to a window (see the module docstring)."""

    attention: str  # full | sliding | chunked, or DeepSeek-V4's window | compressed | partial | overlap
    window: int | None  # sliding: the window W; chunked: the chunk C; full: None; V4's compressed ones: the rate
    num_layers: int
    bytes_per_token_per_layer: float
    capped: bool = True

    @property
    def label(self) -> str:
        """`full`, `sliding-4096`, `chunked-8192` (+ ` (full pages)` when not capped)."""
        text = self.attention if self.window is None else f"{self.attention}-{self.window}"
        return text if self.capped or self.window is None else f"{text} (full pages)"

    @property
    def cap(self) -> int | None:
        """Most tokens a layer of this group keeps (None: the whole context)."""
        return self.window if self.capped else None

    @property
    def bytes_per_token(self) -> float:
        """One token in every layer of the group."""
        return self.num_layers * self.bytes_per_token_per_layer

    @property
    def unit(self) -> str:
        """What `tokens_held` counts: tokens, or a DeepSeek-V4 compressed group's entries (`slots`: the overlap's
        window of the compressor's first series)."""
        return {"compressed": "entries", "overlap": "slots"}.get(self.attention, "tokens")

    def tokens_held(self, context: Any) -> Any:
        """Tokens one layer keeps for a sequence of `context` tokens, as allocated: all of them, or
        at most the window (the chunk, for chunked layers: the size of the last complete chunk).
        DeepSeek-V4's groups of rate r (`V4_GROUP_KINDS`): `compressed` floor(context / r) entries, `partial`
        context mod r tokens, `overlap` r slots once a window has closed."""
        cap = self.cap
        if self.attention in ("compressed", "partial", "overlap"):
            c = np.asarray(context)
            out = (np.floor_divide(c, cap) if self.attention == "compressed" else np.mod(c, cap)
                   if self.attention == "partial" else np.where(c >= cap, cap, 0))
            return out if out.ndim else out.item()
        if cap is None:
            return context
        if isinstance(context, (int, float, np.integer, np.floating)):
            return min(context, cap)
        return np.minimum(context, cap)

    def tokens_in_use(self, context: Any) -> Any:
        """Tokens one layer needs at this moment: as `tokens_held`, except that a (capped) chunked
        layer needs only the current chunk, `((context - 1) % C) + 1`."""
        if self.attention != "chunked" or self.cap is None:
            return self.tokens_held(context)
        c = self.cap
        out = np.where(np.asarray(context) > 0, (np.asarray(context) - 1) % c + 1, 0)
        return out if out.ndim else out.item()

    def bytes_for_context(self, context: Any) -> Any:
        """KV bytes this group holds for a sequence of `context` tokens (its window's tokens at most)."""
        return self.tokens_held(context) * self.bytes_per_token

    @property
    def paged(self) -> bool:
        """Whether a paged cache allocates this group in blocks: every group but DeepSeek-V4's `partial` and
        `overlap` buffers (one per sequence, exactly their size); its compressed entries are paged in blocks of
        `block_size` entries."""
        return self.attention not in ("partial", "overlap")

    def paged_tokens(self, context: Any, block_size: int) -> Any:
        """`tokens_held` rounded up to whole blocks of `block_size` (as it is, for a group not `paged`)."""
        held = np.asarray(self.tokens_held(context), dtype=float)
        out = np.ceil(held / block_size) * block_size if self.paged else held
        return out if out.ndim else out.item()

    def first_block(self, start: int, block_size: int) -> int:
        """The first block a paged engine still holds in these layers once a step starting at
        position `start` was reserved: the blocks wholly before the step's first key went back
        (0 when the group is not capped)."""
        if self.cap is None:
            return 0
        return first_key(self.attention, self.window, start) // block_size

    def blocks_held(self, context: int, block_size: int, start: int | None = None) -> int:
        """Blocks of `block_size` tokens one of these layers holds for a sequence of `context` tokens
        whose last step began at position `start` (default `context - 1`: a decode step): those up to
        the sequence's last, from `first_block(start)`."""
        if context <= 0:
            return 0
        start = context - 1 if start is None else start
        return -(-context // block_size) - self.first_block(start, block_size)

    def slots_used(self, context: int, block_size: int, start: int | None = None) -> int:
        """Token slots holding a token in those blocks (the last block's empty tail excluded)."""
        if context <= 0:
            return 0
        start = context - 1 if start is None else start
        return context - self.first_block(start, block_size) * block_size


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """The KV cache of one model at one element size. Sizes are per sequence, over every layer held.

    `layer_types` gives each layer's attention kind (None: every layer `sliding` when
    `sliding_window` is set, else `full`, the models of 2023-24); `sliding_window` is the window of
    the sliding layers and `attention_chunk_size` the chunk of the chunked ones. `latent=True`: MLA,
    one latent of `head_dim` elements per token and layer on `num_kv_heads=1` (no separate K and V).
    `window` chooses how sliding and chunked layers are allocated (`KV_WINDOW_MODES`)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    element_bytes: float  # bytes of one K or V element (fp16: 2, int4: 0.5)
    sliding_window: int | None = None  # window of the sliding layers (every layer when layer_types is None)
    layer_types: tuple[str, ...] | None = None  # per layer: full | sliding | chunked
    attention_chunk_size: int | None = None  # chunk of the chunked layers
    latent: bool = False  # MLA: one shared latent per token and layer, not split by tensor parallelism
    window: str = "capped"  # capped | full
    state_bytes_per_layer: float = 0.0  # linear layers: one sequence's state in one of them (this shard's)
    index_bytes_per_token: float = 0.0  # DSA: the indexer's key of one token in one layer (fp8 + scale; whole)
    shared_topk_layers: tuple[int, ...] = ()  # DSA layers with no indexer (GLM-5's shared top-k): no indexer key
    global_kv_heads: int | None = None  # Gemma 4: the full layers' K/V heads (None: num_kv_heads)
    global_head_dim: int | None = None  # Gemma 4: the full layers' head dim (None: head_dim)
    kv_shared_layers: tuple[int, ...] = ()  # Gemma 4: layers reading an earlier layer's cache (none of their own)
    v4: bool = False  # DeepSeek-V4's cache (`deepseek_v4_cache_elements`): layer_types sliding / csa / hca
    csa_rate: int | None = None  # DeepSeek-V4: tokens per compressed entry of the csa layers
    hca_rate: int | None = None  # DeepSeek-V4: of the hca layers
    v4_index_dim: int = 0  # DeepSeek-V4: a csa layer's indexer key per entry (index_head_dim)

    def __post_init__(self) -> None:
        for f in ("num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, f)
            if not is_count(value) or value <= 0:
                raise SpecError(f"kv cache: {f} must be a positive integer, got {value!r}")
        for f in ("global_kv_heads", "global_head_dim"):
            value = getattr(self, f)
            if value is not None and (not is_count(value) or value <= 0 or self.latent):
                raise SpecError(f"kv cache: {f} must be a positive integer or None (not with a latent cache), "
                                f"got {value!r}")
        eb = self.element_bytes
        if not is_real(eb) or eb <= 0:
            raise SpecError(f"kv cache: element_bytes must be a finite positive number, got {eb!r}")
        for f in ("sliding_window", "attention_chunk_size"):
            value = getattr(self, f)
            if value is not None and (not is_count(value) or value <= 0):
                raise SpecError(f"kv cache: {f} must be a positive integer or None, got {value!r}")
        lt = self.layer_types
        if isinstance(lt, list):
            lt = tuple(lt)
            object.__setattr__(self, "layer_types", lt)
        if lt is not None:
            if not isinstance(lt, tuple) or len(lt) != self.num_layers:
                raise SpecError(f"kv cache: layer_types must list num_layers={self.num_layers} kinds, got {lt!r}")
            bad = [t for t in lt if t not in KV_ATTENTION_KINDS]
            if bad:
                raise SpecError(f"kv cache: layer_types holds {bad[0]!r} (choose from "
                                f"{', '.join(KV_ATTENTION_KINDS)})")
            for kind, f in (("sliding", "sliding_window"), ("chunked", "attention_chunk_size")):
                if kind in lt and getattr(self, f) is None:
                    raise SpecError(f"kv cache: layer_types has {kind} layers but {f} is not set")
        if not isinstance(self.latent, bool):
            raise SpecError(f"kv cache: latent must be true or false, got {self.latent!r}")
        if self.latent and self.num_kv_heads != 1:
            raise SpecError(f"kv cache: a latent cache (MLA) has one latent head, got num_kv_heads={self.num_kv_heads}")
        if self.window not in KV_WINDOW_MODES:
            raise SpecError(f"kv cache: window must be one of {', '.join(KV_WINDOW_MODES)}, got {self.window!r}")
        ib = self.index_bytes_per_token
        if not is_real(ib) or ib < 0:
            raise SpecError(f"kv cache: index_bytes_per_token must be a finite number >= 0, got {ib!r}")
        shared = layer_indices("kv cache: shared_topk_layers", self.shared_topk_layers, self.num_layers)
        object.__setattr__(self, "shared_topk_layers", shared)
        object.__setattr__(self, "kv_shared_layers",
                           layer_indices("kv cache: kv_shared_layers", self.kv_shared_layers, self.num_layers))
        if any(self.kinds()[i] in ("linear", "none") for i in self.kv_shared_layers):
            raise SpecError("kv cache: kv_shared_layers must be attention layers")
        if shared and (ib == 0 or any(self.kinds()[i] in ("linear", "none") for i in shared)):
            raise SpecError("kv cache: shared_topk_layers needs an indexer key (index_bytes_per_token > 0) and "
                            "attention layers")
        self._check_v4()
        sb = self.state_bytes_per_layer
        if not is_real(sb) or sb < 0 or (sb == 0 and "linear" in self.kinds()):  # a stage may hold none
            raise SpecError(f"kv cache: state_bytes_per_layer must be a finite number, > 0 when some layer is "
                            f"linear, got {sb!r}")

    def _check_v4(self) -> None:
        """DeepSeek-V4's fields: csa / hca layers only in its cache, each with its rate; a window to hold."""
        kinds = self.kinds()
        if not isinstance(self.v4, bool):
            raise SpecError(f"kv cache: v4 must be true or false, got {self.v4!r}")
        if not self.v4:
            if "csa" in kinds or "hca" in kinds or self.csa_rate or self.hca_rate or self.v4_index_dim:
                raise SpecError("kv cache: csa / hca layers and their rates need v4 (DeepSeek-V4's cache)")
            return
        if self.sliding_window is None or self.latent or self.window != "capped" or self.num_kv_heads != 1:
            raise SpecError("kv cache: DeepSeek-V4's cache needs a sliding_window, one K = V head, no latent and "
                            f"capped windows, got window={self.window!r}")
        if any(k not in ("sliding", "csa", "hca") for k in kinds):
            raise SpecError("kv cache: DeepSeek-V4's layer_types are sliding, csa and hca")
        for kind, f in (("csa", "csa_rate"), ("hca", "hca_rate")):
            value = getattr(self, f)
            if (kind in kinds or value is not None) and (not is_count(value) or value <= 0):
                raise SpecError(f"kv cache: {f} must be a positive integer with {kind} layers, got {value!r}")
        if not is_count(self.v4_index_dim) or ("csa" in kinds and self.v4_index_dim <= 0):
            raise SpecError(f"kv cache: v4_index_dim must be a positive integer with csa layers, got "
                            f"{self.v4_index_dim!r}")

    @classmethod
    def from_model(cls, model: ModelSpec, kv: str | float | Any = "fp16", *, window: str = "capped") -> KVCacheSpec:
        """The cache of `model` with elements of `kv`: a dtype name (`"fp8"`), a size in bytes
        (`0.5`), or a `Precision` (its `kv_bytes`); `window`: `"capped"` or `"full"` pages for
        sliding and chunked layers."""
        if isinstance(kv, str):
            element = dtype_bytes(kv)
        elif hasattr(kv, "kv_bytes"):
            element = kv.kv_bytes
        else:
            element = kv
        if getattr(model, "o_groups", None) is not None:  # DeepSeek-V4: what transformers' cache holds
            if window != "capped":
                raise SpecError(f"kv_window: DeepSeek-V4's cache holds its window and compressed entries as "
                                f"transformers does (capped); {window!r} pages are not modelled")
            return cls(num_layers=model.num_layers, num_kv_heads=1, head_dim=model.head_dim, element_bytes=element,
                       sliding_window=model.sliding_window,
                       layer_types=model.layer_types or ("sliding",) * model.num_layers, v4=True,
                       csa_rate=model.csa_rate, hca_rate=model.hca_rate,
                       v4_index_dim=model.index_head_dim if "csa" in (model.layer_types or ()) else 0)
        if getattr(model, "kv_lora_rank", None) is not None:  # MLA: the latent and the shared rotary key
            heads, dim, latent = 1, model.kv_lora_rank + model.qk_rope_head_dim, True
        else:
            heads, dim, latent = model.num_kv_heads, model.head_dim, False
        glob = {}
        if getattr(model, "has_global_attention", False):  # Gemma 4: the full layers' own K/V shape
            glob = dict(global_kv_heads=model.global_kv_heads or heads, global_head_dim=model.global_head_dim or dim)
        return cls(num_layers=model.num_layers, num_kv_heads=heads, head_dim=dim, element_bytes=element,
                   sliding_window=model.sliding_window, layer_types=getattr(model, "layer_types", None),
                   attention_chunk_size=getattr(model, "attention_chunk_size", None), latent=latent,
                   window=window, state_bytes_per_layer=linear_state_bytes(model, kv),
                   index_bytes_per_token=indexer_key_bytes(model),
                   shared_topk_layers=tuple(getattr(model, "shared_topk_layers", ())),
                   kv_shared_layers=tuple(getattr(model, "kv_shared_layers", ())), **glob)

    def with_window(self, window: str) -> KVCacheSpec:
        """The same cache with sliding and chunked layers allocated `"capped"` or `"full"`."""
        return replace(self, window=window)

    # ---- layers ----------------------------------------------------------------------------------
    def kinds(self) -> tuple[str, ...]:
        """Every layer's attention kind, in order."""
        if self.layer_types is not None:
            return self.layer_types
        return ("sliding" if self.sliding_window is not None else "full",) * self.num_layers

    def held_kinds(self) -> tuple[str, ...]:
        """The attention kind of every layer holding a cache of its own, in order (not the linear layers nor the
        layers without a token mixer, nor Gemma 4's KV-shared ones)."""
        shared = set(self.kv_shared_layers)
        return tuple(k for i, k in enumerate(self.kinds()) if k not in ("linear", "none") and i not in shared)

    @property
    def groups(self) -> tuple[KVGroup, ...]:
        """The KV-holding layers of each attention kind (in order of first appearance; linear layers hold
        none), each with its bytes per token and layer and its window (DeepSeek-V4: `_v4_groups`)."""
        if self.v4:
            return self._v4_groups()
        windows = {"full": None, "sliding": self.sliding_window, "chunked": self.attention_chunk_size}
        counts: dict[str, int] = {}
        for kind in self.held_kinds():
            counts[kind] = counts.get(kind, 0) + 1
        capped = self.window == "capped"
        return tuple(KVGroup(attention=kind, window=windows[kind], num_layers=n,
                             bytes_per_token_per_layer=self.layer_bytes(kind), capped=capped)
                     for kind, n in counts.items())

    def _v4_groups(self) -> tuple[KVGroup, ...]:
        """DeepSeek-V4's cache as transformers keeps it (`deepseek_v4_cache_elements`): the last sliding_window - 1
        tokens (`sliding`: K and V apart, 2 head_dim; `window`: a csa / hca layer's K = V, head_dim), and in csa /
        hca layers of rate r the `compressed` entries (head_dim, + the indexer's key in csa), the `partial`
        window's kv and gate projections (csa 4 (head_dim + index_head_dim) a token, hca 2 head_dim) and a csa
        layer's `overlap` (r x (head_dim + index_head_dim) of kv at the element size and of gate at fp32)."""
        kinds, d, di, e = self.held_kinds(), self.head_dim, self.v4_index_dim, self.element_bytes
        w = self.sliding_window - 1  # type: ignore[operator]
        n = {k: kinds.count(k) for k in ("sliding", "csa", "hca")}
        out = []
        if n["sliding"]:
            out.append(KVGroup(attention="sliding", window=w, num_layers=n["sliding"],
                               bytes_per_token_per_layer=2 * d * e))
        if n["csa"] + n["hca"]:
            out.append(KVGroup(attention="window", window=w, num_layers=n["csa"] + n["hca"],
                               bytes_per_token_per_layer=d * e))
        parts = (("csa", self.csa_rate, d + di, 4 * (d + di)), ("hca", self.hca_rate, d, 2 * d))
        for kind, rate, width, partial in parts:
            if n[kind]:
                out += [KVGroup(attention="compressed", window=rate, num_layers=n[kind],
                                bytes_per_token_per_layer=width * e),
                        KVGroup(attention="partial", window=rate, num_layers=n[kind],
                                bytes_per_token_per_layer=partial * e)]
                if kind == "csa":
                    out.append(KVGroup(attention="overlap", window=rate, num_layers=n[kind],
                                       bytes_per_token_per_layer=width * (e + V4_GATE_BYTES)))
        return tuple(out)

    @property
    def uniform(self) -> bool:
        """Every layer keeps the same tokens (one group)."""
        return len(self.groups) == 1

    def layers(self, start: int, stop: int) -> KVCacheSpec:
        """The cache of layers `start .. stop - 1` only (one pipeline stage)."""
        if not 0 <= start < stop <= self.num_layers:
            raise SpecError(f"kv cache: layers {start}..{stop - 1} are not within 0..{self.num_layers - 1}")
        lt = None if self.layer_types is None else self.layer_types[start:stop]
        shared = tuple(i - start for i in self.shared_topk_layers if start <= i < stop)
        reading = tuple(i - start for i in self.kv_shared_layers if start <= i < stop)
        return replace(self, num_layers=stop - start, layer_types=lt, shared_topk_layers=shared,
                       kv_shared_layers=reading)

    def stage(self, index: int, pp: int) -> KVCacheSpec:
        """The cache of pipeline stage `index` of `pp` (vLLM's partition, `pipeline_stages`)."""
        stages = pipeline_stages(self.num_layers, pp)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < pp:
            raise SpecError(f"stage: must be an integer in 0..{pp - 1}, got {index!r}")
        r = stages[index]
        return self.layers(r.start, r.stop)

    # ---- per token -------------------------------------------------------------------------------
    @property
    def elements_per_token_per_layer(self) -> int:
        """K and V of one token in one layer (2 * kv_heads * head_dim), or the MLA latent (head_dim); with
        Gemma 4's full layers of their own shape, a non-full layer's (`layer_elements`)."""
        return self.num_kv_heads * self.head_dim * (1 if self.latent else 2)

    @property
    def has_global(self) -> bool:
        """Full layers store another K/V shape than the others (Gemma 4)."""
        return self.global_kv_heads is not None or self.global_head_dim is not None

    def layer_elements(self, kind: str) -> int:
        """K and V of one token in one layer of `kind` (Gemma 4's full layers: their own heads and head dim)."""
        if kind == "full" and self.has_global:
            return 2 * (self.global_kv_heads or self.num_kv_heads) * (self.global_head_dim or self.head_dim)
        return self.elements_per_token_per_layer

    def layer_bytes(self, kind: str) -> float:
        """One token in one layer of `kind` (`bytes_per_token_per_layer` but for Gemma 4's full layers)."""
        if not self.has_global:
            return self.bytes_per_token_per_layer
        return self.layer_elements(kind) * self.element_bytes

    @property
    def bytes_per_token_per_layer(self) -> float:
        """K and V of one token in one layer: 2 * kv_heads * head_dim * element_bytes (MLA: the
        latent, head_dim * element_bytes; with DSA its indexer's key too, averaged over the KV layers
        when some reuse an earlier layer's top-k and keep none). The same in every layer; Gemma 4's
        layers differ (full ones of their own shape): their average over the KV layers (`layer_bytes`
        gives each kind's)."""
        if self.has_global or self.v4:
            return self.bytes_per_token / self.kv_layers
        index = self.index_bytes_per_token
        if self.shared_topk_layers:
            index = index * (self.kv_layers - len(self.shared_topk_layers)) / self.kv_layers
        return self.elements_per_token_per_layer * self.element_bytes + index

    @property
    def kv_layers(self) -> int:
        """Layers holding KV (every layer but the linear ones, those without a mixer and Gemma 4's KV-shared ones)."""
        return len(self.held_kinds())

    @property
    def linear_layers(self) -> int:
        """Gated DeltaNet or Mamba-2 layers: a constant state per sequence each, no KV."""
        return sum(k == "linear" for k in self.kinds())

    @property
    def state_bytes(self) -> float:
        """One sequence's state in every linear layer held, whatever its context (0 without linear layers)."""
        return self.linear_layers * self.state_bytes_per_layer

    @property
    def bytes_per_token(self) -> float:
        """One token in every layer held: what a token costs while the context is shorter than every
        window (no cap reached), and the slope of `bytes_for_context` of a model without windows
        (DeepSeek-V4: its slope at length, each compressed entry's bytes over its rate; 0 without csa / hca
        layers)."""
        if self.has_global:
            return sum(self.layer_bytes(k) for k in self.held_kinds())
        if self.v4:  # DeepSeek-V4: the slope at length, its compressed entries' bytes over their rates
            return sum(g.bytes_per_token / g.window for g in self.groups if g.attention == "compressed")
        return self.kv_layers * self.bytes_per_token_per_layer

    def bytes_per_block(self, block_size: int) -> float:
        """One paged block of `block_size` tokens (every layer)."""
        _check_positive_int("block_size", block_size)
        return block_size * self.bytes_per_token

    # ---- per sequence ----------------------------------------------------------------------------
    def tokens_held(self, context: Any) -> Any:
        """Tokens a sequence of `context` tokens keeps in the cache, per layer: all of them, or at
        most `sliding_window` when every layer slides. With layers of several kinds, the average over
        layers (`bytes_for_context / bytes_per_token`). Arrays give arrays."""
        _check_context(context)
        groups = self.groups
        if len(groups) == 1:
            return groups[0].tokens_held(context)
        return self.bytes_for_context(context) / self.bytes_per_token

    def bytes_for_context(self, context: Any) -> Any:
        """Bytes the cache of one sequence with `context` tokens occupies (unpaged): the sum over
        groups of layers * bytes per token and layer * tokens held."""
        _check_context(context)
        groups = self.groups
        if len(groups) == 1:
            return groups[0].tokens_held(context) * groups[0].bytes_per_token
        return sum(g.tokens_held(context) * g.bytes_per_token for g in groups)

    def paged_bytes_for_context(self, context: Any, block_size: int) -> Any:
        """Bytes one sequence of `context` tokens occupies in a paged cache: each group allocates
        whole blocks of `block_size` tokens (vLLM's hybrid allocator pages every group separately)."""
        _check_context(context)
        _check_positive_int("block_size", block_size)
        return sum(np.asarray(g.paged_tokens(context, block_size), dtype=float) * g.bytes_per_token
                   for g in self.groups)

    # ---- a paged engine, block by block --------------------------------------------------------
    @property
    def pages_apart(self) -> bool:
        """Sliding / chunked layers page apart from the full ones (the engine's and the simulator's
        `WindowedBlockManager`): capped windows, at least one full-attention layer and one other."""
        groups = self.groups
        return (self.window == "capped" and len(groups) > 1
                and any(g.cap is None for g in groups) and any(g.cap is not None for g in groups))

    @property
    def capped_alone(self) -> bool:
        """Every layer windowed alike and capped (Mistral 7B v0.1, StreamingLLM): one pool table whose
        blocks behind the window go back (the engine's and the simulator's `CappedBlockManager`)."""
        return self.window == "capped" and len(self.groups) == 1 and self.groups[0].cap is not None

    def paged_blocks(self, context: int, block_size: int, start: int | None = None) -> tuple[int, ...]:
        """Pool blocks one sequence of `context` tokens holds in a paged engine, per group (in
        `groups` order), its last step having begun at `start` (default: a decode step). Paged apart
        (`pages_apart`), a pool block holds the full layers' `block_size` tokens and a window group's
        block takes `pages_per_block(layers, full layers)` of them; windowed alike (`capped_alone`), the
        blocks of the window; else every group takes the context's blocks of one pool block holding
        every layer, reported once."""
        _check_positive_int("block_size", block_size)
        if self.capped_alone:
            return (self.groups[0].blocks_held(context, block_size, start),)
        if not self.pages_apart:
            return (-(-context // block_size),)
        full = sum(g.num_layers for g in self.groups if g.cap is None)
        return tuple(g.blocks_held(context, block_size, start)
                     * (1 if g.cap is None else pages_per_block(g.num_layers, full, self.layer_elements(g.attention),
                                                                self.layer_elements("full")))
                     for g in self.groups)

    def paged_block_bytes(self, block_size: int) -> float:
        """One pool block: `block_size` tokens of the full layers (paged apart), else of every layer."""
        _check_positive_int("block_size", block_size)
        if not self.pages_apart:
            return self.bytes_per_block(block_size)
        full = sum(g.num_layers for g in self.groups if g.cap is None)
        return block_size * full * self.layer_bytes("full")

    def paged_reserved_bytes(self, context: int, block_size: int, start: int | None = None) -> float:
        """Bytes of the pool blocks one sequence holds (padded sub-groups included): what a paged
        engine's `usage().reserved_bytes` says for it."""
        return sum(self.paged_blocks(context, block_size, start)) * self.paged_block_bytes(block_size)

    def paged_used_bytes(self, context: int, block_size: int, start: int | None = None) -> float:
        """Bytes of those blocks' slots holding a token, in the layers that exist (the last block's
        empty tail and a sub-group's padding excluded): the engine's `usage().used_bytes`."""
        if self.capped_alone:
            return self.groups[0].slots_used(context, block_size, start) * self.bytes_per_token
        if not self.pages_apart:
            return max(0, context) * self.bytes_per_token
        return sum(g.slots_used(context, block_size, start) * g.bytes_per_token for g in self.groups)

    def by_layer_kind(self, context: Any) -> list[tuple[str, int, Any]]:
        """(label, layers, bytes) of one sequence of `context` tokens for each group of layers."""
        _check_context(context)
        return [(g.label, g.num_layers, g.bytes_for_context(context)) for g in self.groups]

    # ---- parallelism -----------------------------------------------------------------------------
    def sharded(self, *, tp: int = 1, pp: int = 1) -> KVCacheSpec:
        """The part one GPU holds: `max(1, kv_heads // tp)` KV heads (replicated once `tp` exceeds
        them, as vLLM does; an MLA latent is one head, so every rank holds it whole) of the largest
        pipeline stage: `ceil(layers / pp)` layers when every layer is alike; with layers of several
        kinds, the stage (`pipeline_stages`) with the most layers holding the whole context, then the
        most layers, then the most bytes a token (for one given stage, `stage(index, pp)`)."""
        _check_positive_int("tp", tp)
        _check_positive_int("pp", pp)
        heads = replace(self, num_kv_heads=max(1, self.num_kv_heads // tp),
                        state_bytes_per_layer=self.state_bytes_per_layer / tp,  # linear heads split by tp
                        global_kv_heads=None if self.global_kv_heads is None else max(1, self.global_kv_heads // tp))
        if self.layer_types is None and not self.shared_topk_layers and not self.kv_shared_layers:
            return replace(heads, num_layers=-(-self.num_layers // pp))
        stages = [heads.stage(i, pp) for i in range(pp)]

        def size(s: KVCacheSpec) -> tuple[int, int, float]:  # then the most indexer keys (DSA shared top-k)
            return sum(g.num_layers for g in s.groups if g.cap is None), s.num_layers, s.bytes_per_token

        return max(stages, key=size)  # max keeps the first of equals


#: DSA's indexer keys are fp8 with one fp32 scale per block of this many elements (vLLM's indexer cache)
INDEX_SCALE_BLOCK = 128


def indexer_key_bytes(model: Any) -> float:
    """One token's key in one layer's DSA indexer cache (0 without DSA): `index_head_dim` fp8 bytes and an
    fp32 scale per 128 of them, as vLLM and DeepSeek's kernels keep it (132 B for DeepSeek-V3.2); not split
    by tensor parallelism (one key for all the indexer's heads)."""
    if getattr(model, "index_topk", None) is None:
        return 0.0
    d = model.index_head_dim
    return float(d + 4 * -(-d // INDEX_SCALE_BLOCK))


#: the parts of DeepSeek-V4's cache (`deepseek_v4_cache_elements`)
V4_CACHE_PARTS = ("window", "compressed", "indexer_keys", "partial_windows")


def deepseek_v4_cache_elements(model: Any, context: int) -> dict[str, int]:
    """Elements transformers' DeepSeek-V4 cache holds for one sequence of `context` tokens, summed over layers, by
    part (`V4_CACHE_PARTS`), as DynamicCache builds it (DynamicSlidingWindowLayer, DeepseekV4HCACache,
    DeepseekV4CSACache): `window`, the last `sliding_window - 1` tokens' head_dim K (a sliding layer keeps V apart,
    the same values: twice; a csa / hca layer one tensor for both); `compressed`, one head_dim entry per full
    window of csa_rate / hca_rate tokens; `indexer_keys`, a csa layer's index_head_dim key per window;
    `partial_windows`, the compressors' projections of the tokens past the last full window (kv and gate: csa
    2 x 2 head_dim and 2 x 2 index_head_dim a token, hca 2 x head_dim) and, once a csa layer has closed a
    window, its last window's first series (kv and gate, csa_rate x (head_dim + index_head_dim) each). The
    gate of that last part is of the compressors' position_bias dtype (fp32 in a checkpoint), the rest of the
    activations'. `KVCacheSpec.from_model` prices exactly these (`_v4_groups`), the overlap's gate at fp32."""
    if not is_int(context) or context < 0:
        raise SpecError(f"context: must be an integer >= 0, got {context!r}")
    d, held = model.head_dim, min(context, model.sliding_window - 1)
    parts = dict.fromkeys(V4_CACHE_PARTS, 0)
    for kind in model.layer_types or ("sliding",) * model.num_layers:
        parts["window"] += held * d * (2 if kind == "sliding" else 1)
        if kind == "hca":
            m = model.hca_rate
            parts["compressed"] += context // m * d
            parts["partial_windows"] += context % m * 2 * d
        elif kind == "csa":
            m, di = model.csa_rate, model.index_head_dim
            parts["compressed"] += context // m * d
            parts["indexer_keys"] += context // m * di
            parts["partial_windows"] += context % m * 4 * (d + di) + (2 * m * (d + di) if context >= m else 0)
    return parts


def linear_state_bytes(model: Any, kv: Any = None) -> float:
    """One sequence's state in one linear layer of `model` (0 without linear layers): the recurrent
    state at `state_dtype` (else the activations' dtype) and the convolution's last K - 1 inputs at the
    activations' dtype (`kv`'s `act_bytes` when it is a `Precision`, else the checkpoint's dtype), as
    vLLM's Mamba-style state cache keeps them (`MambaStateDtypeCalculator`, "auto": the model's dtype)."""
    if not getattr(model, "has_linear_layers", False):
        return 0.0
    act = kv.act_bytes if hasattr(kv, "act_bytes") else dtype_bytes(model.dtype)
    state = recurrent_state_element_bytes(model, act)
    return model.linear_state_elements * state + model.linear_conv_state_elements * act


def recurrent_state_element_bytes(model: Any, act_bytes: float) -> float:
    """Bytes of one element of a linear layer's recurrent state: `state_dtype`'s, else the activations'."""
    return dtype_bytes(model.state_dtype) if model.state_dtype is not None else act_bytes


def _check_positive_int(name: str, value: Any) -> None:
    if not is_int(value) or value <= 0:
        raise SpecError(f"{name}: must be a positive integer, got {value!r}")


def _check_context(context: Any) -> None:
    if isinstance(context, bool):
        raise SpecError(f"context: must be a number of tokens >= 0, got {context!r}")
    arr = np.asarray(context)
    if arr.dtype.kind not in "iuf" or (arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0)):
        raise SpecError(f"context: must be a number of tokens >= 0, got {context!r}")
