"""Memory of inference: weights, KV cache, activations, what fits, and how much a KV cache wastes
(`estimate_memory`, `weight_bytes_per_gpu`, `kv_bytes_per_token_per_gpu`, `kv_utilization`).

KV cache sizes come from `llmperf.specs.kvcache`, the one KV formula (MLA's latent, sliding and
chunked windows, `Conventions.kv_window`). A contiguous cache reserves `max_seq_len` tokens for every
sequence up front; a paged cache (Kwon et al., "Efficient Memory Management for Large Language Model
Serving with PagedAttention", SOSP 2023, arXiv:2309.06180) reserves blocks of `block_size` tokens as
they fill, wasting less than one block per sequence and group of layers. Capacities are reported in
bytes and shown in GiB.

The rule (computed in `llmperf.analysis.rollup`, the one roll-up): weights + the KV blocks of the
batch + ONE activation reservation for a forward of `max_batched_tokens` tokens must fit in
`mem_util` of the device, on every pipeline stage (stages hold contiguous layers as vLLM partitions
them). Max batch is what the KV memory left then holds.

The layout of the `tp` GPUs of one stage: plain tensor parallelism by default (Megatron-LM, Shoeybi
et al. 2019, arXiv:1909.08053: heads, FFN and vocabulary split, KV heads never below one per GPU);
`ep` splits the routed experts (DeepSpeed-MoE, arXiv:2201.05596); `dp_attention` gives every GPU the
whole attention and the KV of its own sequences (SGLang's DP attention). MLA's down-projections and
latent cache are replicated on every rank, as vLLM's `DeepseekV2MLAAttention` holds them. Which part
each GPU holds, module by module: docs/model.md, "Parallelism".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llmperf.analysis.rollup import (
    DEFAULT_MAX_BATCHED_TOKENS,
    Conventions,
    activation_peak_bytes,
    check_parallelism,
    memory_arrays,
    stage_layer_ranges,
    stage_layers,
    stage_weight_bytes,
)
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, KVCacheSpec, ModelSpec, Precision

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["KVUtilization", "MemoryEstimate", "activation_peak_bytes", "estimate_memory",
           "kv_bytes_per_token_per_gpu", "kv_utilization", "layers_per_stage", "max_batch_that_fits",
           "weight_bytes_per_gpu"]


def layers_per_stage(model: ModelSpec, pp: int) -> int:
    """Layers of the most loaded pipeline stage (vLLM's partition, `stage_layers`)."""
    return max(stage_layers(model, pp))


def weight_bytes_per_gpu(model: ModelSpec, precision: Precision, tp: int = 1, pp: int = 1, *, ep: int = 1,
                         dp_attention: bool = False, redundant_experts: int = 0) -> float:
    """Weights on the most loaded GPU (see `stage_weight_bytes`; EPLB's `redundant_experts` add theirs)."""
    return max(stage_weight_bytes(model, precision, tp, pp, ep=ep, dp_attention=dp_attention,
                                  redundant_experts=redundant_experts))


def kv_bytes_per_token_per_gpu(model: ModelSpec, precision: Precision, tp: int = 1, pp: int = 1, *,
                               ep: int = 1, dp_attention: bool = False) -> float:
    """KV bytes per token (every layer, no window reached) on one GPU of the stage that holds the
    most: 2 (K and V) x layers x KV heads per GPU (replicated, never 0, when tp exceeds them) x
    head_dim x bytes; MLA's latent is not split by tp, nor is anything with `dp_attention`."""
    check_parallelism(model, tp, ep, dp_attention)  # validates the layout (tp against the heads, ep)
    kv = KVCacheSpec.from_model(model, precision).sharded(tp=1 if dp_attention else tp)
    return max(kv.layers(r.start, r.stop).bytes_per_token for r in stage_layer_ranges(model, pp))


@dataclass(frozen=True, kw_only=True)
class KVUtilization:
    """KV cache bytes reserved vs holding real tokens, for a contiguous and a paged cache."""

    used_bytes: float  # average over the generation
    contiguous_reserved_bytes: float
    paged_reserved_bytes: float  # average over the generation
    max_seq_len: int
    block_size: int

    @property
    def contiguous_utilization(self) -> float:
        return self.used_bytes / self.contiguous_reserved_bytes if self.contiguous_reserved_bytes else 0.0

    @property
    def paged_utilization(self) -> float:
        return self.used_bytes / self.paged_reserved_bytes if self.paged_reserved_bytes else 0.0


def kv_utilization(lengths, kv_bytes_per_token: float, *, max_seq_len: int, block_size: int = 16) -> KVUtilization:  # noqa: ANN001
    """Reserved vs used KV bytes for sequences whose current lengths are `lengths` (any shape: e.g.
    every sequence at every step of a generation; the result averages over them)."""
    if block_size < 1:
        raise SpecError(f"block_size: must be a positive integer, got {block_size!r}")
    lengths = np.asarray(lengths, dtype=float)
    if lengths.size and lengths.max() > max_seq_len:
        raise SpecError(f"max_seq_len: {max_seq_len} is shorter than a sequence of {int(lengths.max())} tokens")
    used = float(lengths.mean()) * kv_bytes_per_token if lengths.size else 0.0
    paged = float((np.ceil(lengths / block_size) * block_size).mean()) * kv_bytes_per_token if lengths.size else 0.0
    return KVUtilization(used_bytes=used, contiguous_reserved_bytes=max_seq_len * kv_bytes_per_token,
                         paged_reserved_bytes=paged, max_seq_len=max_seq_len, block_size=block_size)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Per-GPU memory of a generation of `batch` sequences of `context` = prompt + generated tokens."""

    weights_bytes: float
    kv_bytes_per_token: float
    kv_cache_bytes: float
    activation_peak_bytes: float
    device_bytes: float
    mem_util: float  # fraction of device memory the server may use (vLLM's gpu_memory_utilization)
    max_batch: int  # paged cache: sequences of `context` tokens that fit
    max_batch_contiguous: int  # contiguous cache reserving `max_seq_len` per sequence
    kv: KVUtilization
    batch: int = 1
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS  # the activation reservation's token budget

    @property
    def activation_bytes(self) -> float:
        """The one activation reservation (a forward of `max_batched_tokens` tokens)."""
        return self.activation_peak_bytes

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_peak_bytes

    @property
    def usable_bytes(self) -> float:
        return self.device_bytes * self.mem_util

    @property
    def fits(self) -> bool:
        """The batch fits when every pipeline stage holds its KV blocks next to weights and the
        activation reservation: `batch <= max_batch`."""
        return self.batch <= self.max_batch

    def to_frame(self) -> pd.DataFrame:
        """`summary()` as a one-row DataFrame."""
        import pandas as pd

        return pd.DataFrame([self.summary()])

    def summary(self) -> dict[str, float | int | bool]:
        """The memory split per GPU in GiB (KV per token in bytes), whether the batch fits, the largest
        batches and the KV utilisations."""
        return dict(weights_gib=self.weights_bytes / 2**30, kv_bytes_per_token=self.kv_bytes_per_token,
                    kv_cache_gib=self.kv_cache_bytes / 2**30,
                    activation_peak_gib=self.activation_peak_bytes / 2**30,
                    total_gib=self.total_bytes / 2**30, device_gib=self.device_bytes / 2**30,
                    fits=self.fits, max_batch=self.max_batch, max_batch_contiguous=self.max_batch_contiguous,
                    kv_util_contiguous=self.kv.contiguous_utilization, kv_util_paged=self.kv.paged_utilization)


def max_batch_that_fits(usable_bytes, weights_bytes, per_seq_bytes):  # noqa: ANN001, ANN201
    """Largest batch with `weights + batch * per_seq <= usable` (memory is linear in batch)."""
    free = np.asarray(usable_bytes - weights_bytes, dtype=float)
    out = np.where(free > 0, np.floor(free / per_seq_bytes), 0).astype(np.int64)
    return int(out) if out.ndim == 0 else out


def estimate_memory(model: ModelSpec, precision: Precision, hardware: HardwareSpec, *, batch: int,
                    prompt_len: int, gen_len: int, tp: int = 1, pp: int = 1, attention: str = "fused",
                    max_seq_len: int | None = None, block_size: int = 16, mem_util: float = 0.9,
                    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                    all_logits: bool = False, ep: int = 1, dp_attention: bool = False,
                    kv_window: str = "capped") -> MemoryEstimate:
    """Memory of one GPU serving `batch` sequences of `prompt_len + gen_len` tokens (the roll-up's
    memory rule: weights + paged KV + one activation reservation for `max_batched_tokens`). `ep`,
    `dp_attention`: the layout of the module docstring; `kv_window`: "capped" or "full" pages for
    sliding and chunked layers."""
    conv = Conventions(attention=attention, max_seq_len=max_seq_len, block_size=block_size, mem_util=mem_util,
                       max_batched_tokens=max_batched_tokens, all_logits=all_logits, kv_window=kv_window)
    mem = memory_arrays(model, precision, hardware, conv, tp=tp, pp=pp, batch=[batch], prompt_len=[prompt_len],
                        gen_len=[gen_len], ep=ep, dp_attention=dp_attention)
    one = {k: float(v[0]) for k, v in mem.items()}
    kv = KVUtilization(used_bytes=one["kv_used_bytes"], contiguous_reserved_bytes=one["kv_contiguous_bytes"],
                       paged_reserved_bytes=one["kv_paged_bytes"], max_seq_len=int(one["max_seq_len"]),
                       block_size=block_size)
    return MemoryEstimate(weights_bytes=one["weights_bytes"], kv_bytes_per_token=one["kv_bytes_per_token"],
                          kv_cache_bytes=one["kv_cache_bytes"], activation_peak_bytes=one["activation_bytes"],
                          device_bytes=hardware.memory_bytes, mem_util=mem_util, max_batch=int(one["max_batch"]),
                          max_batch_contiguous=int(one["max_batch_contiguous"]), kv=kv, batch=batch,
                          max_batched_tokens=max_batched_tokens)
