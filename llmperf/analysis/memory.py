"""Memory of inference: weights, KV cache, activations, what fits, and how much a KV cache wastes.

KV cache bytes per token = `2 * layers * kv_heads * head_dim * bytes(kv_dtype)` (Llama-2-7B fp16:
524,288 B = 512 KiB, 2 GiB at 4096 tokens). A contiguous cache reserves `max_seq_len` tokens for
every sequence up front; a paged cache (Kwon et al., "Efficient Memory Management for Large Language
Model Serving with PagedAttention", SOSP 2023) reserves blocks of `block_size` tokens as they fill,
wasting less than one block per sequence. Capacities are reported in bytes and shown in GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmperf.analysis.operators import ShardDims
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision


def layers_per_stage(model: ModelSpec, pp: int) -> int:
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise SpecError(f"pp: must be a positive integer, got {pp!r}")
    if pp > model.num_layers:
        raise SpecError(f"pp: {pp} exceeds {model.name}'s num_layers={model.num_layers}")
    return -(-model.num_layers // pp)


def weight_bytes_per_gpu(model: ModelSpec, precision: Precision, tp: int = 1, pp: int = 1) -> float:
    """Weights on the most loaded GPU. Matrices at the weight precision, norms and biases at the
    activation precision; attention, FFN and vocabulary split `tp` ways, layers `pp` ways (the first
    stage holds the embeddings, the last the final norm and lm_head)."""
    d = ShardDims.of(model, tp)
    m, wb, ab = model, precision.weight_bytes, precision.act_bytes
    h, hd = m.hidden_size, m.head_dim
    attn = h * (d.num_heads + 2 * d.num_kv_heads) * hd + d.num_heads * hd * h
    experts = (m.num_experts + m.shared_experts) * m.ffn_matrices * h * d.ffn_size
    small = 2 * m.norm_params + m.router_params_per_layer  # replicated
    biases = m.attn_params_per_layer - (h * m.q_size + 2 * h * m.kv_size + m.q_size * h)
    biases += (m.num_experts + m.shared_experts) * (m.expert_params - m.ffn_matrices * h * m.ffn_size)
    layer = (attn + experts) * wb + (small + biases) * ab
    embed = d.vocab_size * h * wb + (m.embedding_params - m.vocab_size * h) * wb
    head = m.norm_params * ab + (d.vocab_size * h * wb if (not m.tied_embeddings or pp > 1) else 0.0)
    ends = embed + head if pp == 1 else max(embed, head)
    return layers_per_stage(m, pp) * layer + ends


def kv_bytes_per_token_per_gpu(model: ModelSpec, precision: Precision, tp: int = 1, pp: int = 1) -> float:
    d = ShardDims.of(model, tp)
    return 2 * layers_per_stage(model, pp) * d.num_kv_heads * model.head_dim * precision.kv_bytes


def activation_peak_bytes(model: ModelSpec, precision: Precision, batch, q_len, kv_len, *,  # noqa: ANN001
                          tp: int = 1, attention: str = "fused", all_logits: bool = False):
    """Largest transient working set of one forward pass: the residual stream and its normalised
    copy, plus the larger of the attention block's tensors (Q, K, V, output; S and P when naive) and
    the FFN's (gate, up, activation outputs of the routed rows), plus fp32 logits."""
    d = ShardDims.of(model, tp)
    m, a = model, precision.act_bytes
    tokens = batch * q_len
    stream = 2 * tokens * m.hidden_size * a
    attn = tokens * (2 * d.num_heads + 2 * d.num_kv_heads) * m.head_dim * a
    if attention == "naive":
        attn = attn + 2 * batch * d.num_heads * q_len * kv_len * a
    rows = tokens * (m.experts_per_token + m.shared_experts)
    ffn = rows * d.ffn_size * a * (3 if m.ffn_kind == "swiglu" else 2)
    logits = (tokens if all_logits else batch) * d.vocab_size * 4
    return stream + np.maximum(attn, ffn) + logits


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

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_peak_bytes

    @property
    def usable_bytes(self) -> float:
        return self.device_bytes * self.mem_util

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.summary()])

    def summary(self) -> dict[str, float | int | bool]:
        return dict(weights_gib=self.weights_bytes / 2**30, kv_bytes_per_token=self.kv_bytes_per_token,
                    kv_cache_gib=self.kv_cache_bytes / 2**30,
                    activation_peak_gib=self.activation_peak_bytes / 2**30,
                    total_gib=self.total_bytes / 2**30, device_gib=self.device_bytes / 2**30,
                    fits=self.fits, max_batch=self.max_batch, max_batch_contiguous=self.max_batch_contiguous,
                    kv_util_contiguous=self.kv.contiguous_utilization, kv_util_paged=self.kv.paged_utilization)


def max_batch_that_fits(usable_bytes, weights_bytes, per_seq_bytes):  # noqa: ANN001
    """Largest batch with `weights + batch * per_seq <= usable` (memory is linear in batch)."""
    free = np.asarray(usable_bytes - weights_bytes, dtype=float)
    out = np.where(free > 0, np.floor(free / per_seq_bytes), 0).astype(np.int64)
    return int(out) if out.ndim == 0 else out


def estimate_memory(model: ModelSpec, precision: Precision, hardware: HardwareSpec, *, batch: int,
                    prompt_len: int, gen_len: int, tp: int = 1, pp: int = 1, attention: str = "fused",
                    max_seq_len: int | None = None, block_size: int = 16, mem_util: float = 0.9) -> MemoryEstimate:
    """Memory of one GPU serving `batch` sequences of `prompt_len + gen_len` tokens."""
    if not 0 < mem_util <= 1:
        raise SpecError(f"mem_util: must be in (0, 1], got {mem_util!r}")
    context = prompt_len + gen_len
    max_seq_len = max(context, max_seq_len or model.max_positions)
    weights = weight_bytes_per_gpu(model, precision, tp, pp)
    kv_tok = kv_bytes_per_token_per_gpu(model, precision, tp, pp)
    act = float(activation_peak_bytes(model, precision, batch, prompt_len, prompt_len, tp=tp, attention=attention))
    act_one = float(activation_peak_bytes(model, precision, 1, prompt_len, prompt_len, tp=tp, attention=attention))
    usable = hardware.memory_bytes * mem_util
    steps = prompt_len + np.arange(1, gen_len + 1)  # lengths during the generation
    paged_per_seq = -(-context // block_size) * block_size * kv_tok
    return MemoryEstimate(
        weights_bytes=weights, kv_bytes_per_token=kv_tok, kv_cache_bytes=batch * context * kv_tok,
        activation_peak_bytes=act, device_bytes=hardware.memory_bytes, mem_util=mem_util,
        max_batch=max_batch_that_fits(usable, weights, paged_per_seq + act_one),
        max_batch_contiguous=max_batch_that_fits(usable, weights, max_seq_len * kv_tok + act_one),
        kv=kv_utilization(steps, kv_tok, max_seq_len=max_seq_len, block_size=block_size))
