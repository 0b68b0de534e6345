"""`KVCacheSpec`: the one place the KV-cache size formula lives.

Every layer stores a key and a value vector per KV head for every token it attends to:
`bytes per token = 2 (K and V) * layers * kv_heads * head_dim * bytes(kv dtype)` (Llama-2-7B at fp16:
2 * 32 * 32 * 128 * 2 = 524,288 B = 512 KiB). With sliding-window attention (Mistral, Qwen2 with
`use_sliding_window`) a layer only ever attends to the last `sliding_window` tokens, so a cache that
evicts older tokens (a rolling buffer, as Mistral's reference code and vLLM do) holds at most
`sliding_window` tokens per sequence. A paged cache allocates `block_size` tokens at a time.
Tensor parallelism splits KV heads across GPUs, but never below one head per GPU (vLLM replicates KV
heads when `tp` exceeds them); pipeline parallelism splits layers, and the largest stage holds
`ceil(layers / pp)` of them.

Contexts may be Python numbers or numpy arrays (a sweep evaluates many at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from llmperf.errors import SpecError
from llmperf.specs.precision import dtype_bytes

if TYPE_CHECKING:
    from llmperf.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """The KV cache of one model at one element size. Sizes are per sequence, over every layer held."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    element_bytes: float  # bytes of one K or V element (fp16: 2, int4: 0.5)
    sliding_window: int | None = None  # None: full attention, every token of the context is held

    def __post_init__(self) -> None:
        for f in ("num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"kv cache: {f} must be a positive integer, got {value!r}")
        eb = self.element_bytes
        if isinstance(eb, bool) or not isinstance(eb, (int, float)) or not math.isfinite(eb) or eb <= 0:
            raise SpecError(f"kv cache: element_bytes must be a finite positive number, got {eb!r}")
        sw = self.sliding_window
        if sw is not None and (isinstance(sw, bool) or not isinstance(sw, int) or sw <= 0):
            raise SpecError(f"kv cache: sliding_window must be a positive integer or None, got {sw!r}")

    @classmethod
    def from_model(cls, model: ModelSpec, kv: str | float | Any = "fp16") -> KVCacheSpec:
        """The cache of `model` with elements of `kv`: a dtype name (`"fp8"`), a size in bytes
        (`0.5`), or a `Precision` (its `kv_bytes`)."""
        if isinstance(kv, str):
            element = dtype_bytes(kv)
        elif hasattr(kv, "kv_bytes"):
            element = kv.kv_bytes
        else:
            element = kv
        return cls(num_layers=model.num_layers, num_kv_heads=model.num_kv_heads, head_dim=model.head_dim,
                   element_bytes=element, sliding_window=model.sliding_window)

    # ---- per token -------------------------------------------------------------------------------
    @property
    def bytes_per_token_per_layer(self) -> float:
        """K and V of one token in one layer: 2 * kv_heads * head_dim * element_bytes."""
        return 2 * self.num_kv_heads * self.head_dim * self.element_bytes

    @property
    def bytes_per_token(self) -> float:
        """K and V of one token in every layer held."""
        return self.num_layers * self.bytes_per_token_per_layer

    def bytes_per_block(self, block_size: int) -> float:
        """One paged block of `block_size` tokens (every layer)."""
        _check_positive_int("block_size", block_size)
        return block_size * self.bytes_per_token

    # ---- per sequence ----------------------------------------------------------------------------
    def tokens_held(self, context: Any) -> Any:
        """Tokens a sequence of `context` tokens keeps in the cache: all of them, or at most
        `sliding_window`. Arrays give arrays."""
        _check_context(context)
        if self.sliding_window is None:
            return context
        if isinstance(context, (int, float, np.integer, np.floating)):
            return min(context, self.sliding_window)
        return np.minimum(context, self.sliding_window)

    def bytes_for_context(self, context: Any) -> Any:
        """Bytes the cache of one sequence with `context` tokens occupies (unpaged)."""
        return self.tokens_held(context) * self.bytes_per_token

    # ---- parallelism -----------------------------------------------------------------------------
    def sharded(self, *, tp: int = 1, pp: int = 1) -> KVCacheSpec:
        """The part one GPU holds: `max(1, kv_heads // tp)` KV heads (replicated once `tp` exceeds
        them, as vLLM does) of `ceil(layers / pp)` layers (the largest pipeline stage)."""
        _check_positive_int("tp", tp)
        _check_positive_int("pp", pp)
        return replace(self, num_kv_heads=max(1, self.num_kv_heads // tp),
                       num_layers=-(-self.num_layers // pp))


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise SpecError(f"{name}: must be a positive integer, got {value!r}")


def _check_context(context: Any) -> None:
    if isinstance(context, bool):
        raise SpecError(f"context: must be a number of tokens >= 0, got {context!r}")
    arr = np.asarray(context)
    if arr.dtype.kind not in "iuf" or (arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0)):
        raise SpecError(f"context: must be a number of tokens >= 0, got {context!r}")
