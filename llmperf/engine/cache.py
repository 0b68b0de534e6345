"""KV caches: the tensors that hold every layer's keys and values, and their byte accounting.

Letters: L layers, B_max sequence rows, H_kv KV heads, S_max tokens per row, D head dim,
N blocks in the paged pool, P tokens per block (block_size), R latent rank, Dr rotary key width.

- `ContiguousKVCache`: one tensor `(L, 2, B_max, H_kv, S_max, D)` (2 = K, V), allocated up front:
  every sequence owns a row of S_max slots, as a naive server preallocates the maximum length (Kwon
  et al. 2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention",
  arXiv:2309.06180, §2.3).
- `PagedKVCache`: one tensor `(L, 2, N, P, H_kv, D)`, blocks handed out on demand by
  `llmperf.serving.blocks.BlockManager` (block tables, reference counts, copy-on-write); when no block
  is free `append_slot` returns False and the scheduler preempts. A hybrid model (sliding or chunked
  layers beside full ones) pages its kinds apart as vLLM's hybrid KV-cache manager does
  (`kv_window="capped"`, the default; `llmperf.serving.blocks.HybridLayout`, `WindowedBlockManager`):
  the tensor is `(F, 2, N, P, H_kv, D)` over the F full-attention layers, and the blocks behind a
  window go back to the pool; so do a model's whose every layer slides with one window (Mistral 7B
  v0.1, StreamingLLM; `CappedBlockManager`); `kv_window="full"` keeps every layer's whole context.
- Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, §2.1.2; `ModelSpec.is_mla`) caches one
  vector of R + Dr per token and layer: `(L, 1, B_max, 1, S_max, R + Dr)` and `(L, 1, N, P, 1, R + Dr)`,
  its K and V views the same tensor.

Both caches take the same calls (`allocate`, `append_slot`, `fork`, `reorder`, `free`, `prepare`,
`write`, `gather`), implement the scheduler's `llmperf.serving.scheduler.KVSpace`, and report
`usage()` (capacity, reserved and used bytes), which `llmperf.specs.kvcache.KVCacheSpec` predicts
block for block. The accounting in full: docs/engine.md, "KV caches".
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmperf.engine.step import StepMeta
from llmperf.serving.blocks import BlockManager, CappedBlockManager, HybridLayout, WindowedBlockManager, uniform_window
from llmperf.specs import ModelSpec

CACHE_KINDS = ("contiguous", "paged")
#: "capped": a hybrid model's sliding / chunked layers hold only their window (paged cache);
#: "full": every layer holds the whole context
KV_WINDOWS = ("capped", "full")


def hybrid_layout(spec: ModelSpec, kv_window: str = "capped") -> HybridLayout | None:
    """How a paged cache pages `spec`'s layers apart (None: one table for every layer, as for a model
    with one kind of layer, one without a full-attention layer, or `kv_window="full"`)."""
    if kv_window not in KV_WINDOWS:
        raise ValueError(f"kv_window: must be one of {', '.join(KV_WINDOWS)}, got {kv_window!r}")
    if kv_window == "full":
        return None
    return HybridLayout.of(_attention_kinds(spec))  # indexed by attention layer (`KVCache.kv_index`)


def _attention_kinds(spec: ModelSpec) -> list[tuple[str, int | None]]:
    """(attention, window) of every layer that keeps K/V: linear (Gated DeltaNet, Mamba-2) layers keep a state
    instead, and Nemotron-H's FFN layers (attention none) nothing."""
    return [(k.attention, k.window) for k in spec.layer_kinds() if k.attention not in ("linear", "none")]


def capped_window(spec: ModelSpec, kv_window: str = "capped") -> tuple[str, int] | None:
    """The (attention, window) by which a paged cache caps a model whose every layer is windowed alike
    (all sliding, or all chunked, one window: `CappedBlockManager`); None for any other model or with
    `kv_window="full"`."""
    if kv_window not in KV_WINDOWS:
        raise ValueError(f"kv_window: must be one of {', '.join(KV_WINDOWS)}, got {kv_window!r}")
    # one kind of windowed layer only: a model with a full-attention layer (hybrid) or none windowed gets None
    return None if kv_window == "full" else uniform_window(_attention_kinds(spec))


@dataclass(frozen=True, kw_only=True)
class CacheUsage:
    """A cache's memory at one moment, in bytes (decimal units, as everywhere in llmperf)."""

    kind: str
    bytes_per_token: int
    capacity_bytes: int  # the storage allocated up front
    reserved_bytes: int  # storage held by live sequences (their rows / their blocks)
    used_bytes: int  # storage holding real tokens (a block shared by forks counts once)
    logical_tokens: int  # sum of the live sequences' lengths (shared tokens counted per sequence)
    num_seqs: int
    # Linear (Gated DeltaNet) layers: their per-sequence state (conv + recurrent, every linear layer),
    # held by the live sequences and allocated now; 0 for a model without such layers. Not in the
    # K/V fields above.
    state_bytes: int = 0
    state_capacity_bytes: int = 0

    @property
    def utilization(self) -> float:
        """Share of the reserved bytes that hold real tokens (1.0 when nothing is reserved)."""
        return self.used_bytes / self.reserved_bytes if self.reserved_bytes else 1.0

    @property
    def pool_utilization(self) -> float:
        """Share of the whole storage that holds real tokens."""
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


class KVCache(ABC):
    """What the engine needs from a cache. Sequence ids are the caller's (any distinct ints)."""

    kind: str

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device | str) -> None:
        self.spec = spec
        self.dtype = dtype
        self.device = torch.device(device)
        kinds = spec.layer_kinds()
        # Layers that keep K/V (linear layers keep a per-sequence state instead, `states`; FFN layers nothing):
        # the storage's first dimension counts these, and `kv_index` maps a model layer to its index among them.
        self.attention_layers = tuple(i for i, k in enumerate(kinds) if k.attention not in ("linear", "none"))
        self.kv_index = {layer: j for j, layer in enumerate(self.attention_layers)}
        self.num_layers = len(self.attention_layers)
        self.states: LinearStates | None = LinearStates(spec, dtype, self.device) if spec.has_linear_layers else None
        if self.states is not None:
            self.supports_prefix_sharing = False  # a cached prefix's blocks carry no state
        # MLA: one part (the latent and the rotary key, R + Dr wide) on one head; else K and V (H_kv, D)
        self.latent = spec.is_mla
        self.parts = 1 if self.latent else 2
        self.num_kv_heads = 1 if self.latent else spec.num_kv_heads
        self.head_dim = spec.kv_width_per_token_per_layer if self.latent else spec.head_dim
        self._v = self.parts - 1  # the part V is read from: 1, or the latent itself

    @property
    def state_bytes_per_seq(self) -> int:
        """What one live sequence holds in the linear (Gated DeltaNet) layers whatever its length: the
        conv state (K - 1 inputs of 2 nk dk + nv dv channels, the model's dtype) and the recurrent state
        (nv dk dv, fp32) of every linear layer; 0 without linear layers."""
        return 0 if self.states is None else self.states.bytes_per_seq

    def _state_usage(self) -> dict[str, int]:
        """`CacheUsage`'s state fields now."""
        if self.states is None:
            return {}
        return dict(state_bytes=self.states.num_seqs * self.states.bytes_per_seq,
                    state_capacity_bytes=self.states.capacity_bytes)

    def _attach_states(self, meta: StepMeta, seq_ids: Sequence[int]) -> StepMeta:
        """The step's linear-layer states and its sequences' slots in them."""
        if self.states is not None:
            meta.states, meta.state_rows = self.states, self.states.rows(seq_ids)
        return meta

    @property
    def bytes_per_token(self) -> int:
        """What one token leaves in every layer: 2 * L * H_kv * D * element size (K and V), or for
        MLA L * (R + Dr) * element size (the latent and the rotary key)."""
        return self.parts * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def _written(self, k: torch.Tensor, v: torch.Tensor | None) -> tuple[tuple[int, torch.Tensor], ...]:
        """(part, tensor) pairs a write stores: K and V, or a latent cache's one part (`k`)."""
        return ((0, k),) if self.parts == 1 else ((0, k), (1, v))

    # Subclasses allocate their storage as one tensor `self.kv` and set `self._max_seq_len`.
    kv: torch.Tensor
    _max_seq_len: int

    @property
    def capacity_bytes(self) -> int:
        """The storage allocated up front."""
        return self.kv.numel() * self.kv.element_size()

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the cache can hold."""
        return self._max_seq_len

    @abstractmethod
    def __contains__(self, seq_id: int) -> bool: ...

    @property
    @abstractmethod
    def num_seqs(self) -> int:
        """Live sequences."""

    @abstractmethod
    def seq_len(self, seq_id: int) -> int:
        """Token slots the sequence holds (its tokens written so far plus those about to be written)."""

    # ---- sequence lifetime ----------------------------------------------------------------------
    @abstractmethod
    def can_allocate(self, lengths: Sequence[int], forks: int = 0, headroom: int = 0) -> bool:
        """Whether new sequences of these lengths fit now, plus `forks` more forked from the first,
        leaving `headroom` blocks free (paged cache; ignored by the contiguous one)."""

    @abstractmethod
    def allocate(self, seq_id: int, num_tokens: int) -> bool:
        """Reserve the first `num_tokens` slots of a new sequence; False (nothing changed) if full."""

    @abstractmethod
    def append_slot(self, seq_id: int) -> bool:
        """Reserve one more slot at the end of the sequence (copying a shared block first); False
        (nothing changed) when the cache has no room: the caller must free something and retry."""

    @abstractmethod
    def fork(self, parent: int, child: int) -> bool:
        """A new sequence `child` holding the same tokens as `parent`; False if there is no room."""

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """The sequence ended: its storage returns to the cache."""

    @abstractmethod
    def live_ids(self) -> list[int]:
        """Ids of the sequences the cache holds."""

    def clear(self) -> None:
        """Free every sequence (after a failure: the cache is empty and reusable again)."""
        for seq_id in self.live_ids():
            self.free(seq_id)

    def reorder(self, seq_ids: Sequence[int], sources: Sequence[int]) -> bool:
        """Beam search: afterwards `seq_ids[i]` holds what `seq_ids[sources[i]]` held before (its K/V
        and its linear layers' state). False (nothing changed) if there is no room for the copies."""
        seq_ids, sources = list(seq_ids), list(sources)
        if sources == list(range(len(seq_ids))):
            return True
        ok = self._reorder(seq_ids, sources)
        if ok and self.states is not None:
            self.states.reorder(seq_ids, sources)
        return ok

    @abstractmethod
    def _reorder(self, seq_ids: list[int], sources: list[int]) -> bool: ...

    # ---- a forward step -----------------------------------------------------------------------
    @abstractmethod
    def prepare(self, seq_ids: Sequence[int], q_len: int) -> StepMeta:
        """Metadata for a step that feeds the last `q_len` reserved slots of each sequence."""

    @abstractmethod
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor | None, meta: StepMeta) -> None:
        """Store this step's K and V `(B, T, H_kv, D)` of `layer` at the step's slots (a latent cache:
        `k` is the latent `(B, T, 1, R + Dr)`, `v` is ignored)."""

    @abstractmethod
    def gather(self, layer: int, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V `(B, H_kv, S, D)` of `layer` for the step's sequences, S = the longest context;
        positions past a shorter sequence's end hold finite junk that attention must mask."""

    @abstractmethod
    def blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `layer` as blocks `(num_blocks, slots, H_kv, D)` (views, the same strides in every
        layer): sequence b's token p in block `meta.block_table()[b, p // slots]`, slot `p % slots`."""

    # ---- accounting ------------------------------------------------------------------------------
    @abstractmethod
    def usage(self) -> CacheUsage: ...

    def _positions(self, starts: Sequence[int], q_len: int) -> torch.Tensor:
        """(B, T) int64: position of each new token."""
        starts_t = torch.tensor(starts, dtype=torch.long)
        return (starts_t[:, None] + torch.arange(q_len)[None, :]).to(self.device, non_blocking=True)

    def _starts(self, seq_ids: Sequence[int], q_len: int) -> tuple[int, ...]:
        starts = tuple(self.seq_len(s) - q_len for s in seq_ids)
        if min(starts) < 0:
            raise ValueError(f"q_len: {q_len} exceeds a sequence's reserved slots {min(starts) + q_len}")
        return starts


# ---------------------------------------------------------------------------------------------------


class LinearStates:
    """Every linear layer's state per live sequence: `conv (L_lin, S, W, K - 1)` in the model's dtype (the
    last K - 1 convolution inputs) and `recurrent (L_lin, S, nv, dk, dv)` fp32, S slots, one per
    sequence id (`allocate` zeroes it, `fork` copies it, `reorder` permutes it, `free` gives it back).
    The slots grow (doubling) when every one is taken, so admission is the KV cache's alone."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device, slots: int = 4) -> None:
        self.layers = tuple(i for i, k in enumerate(spec.layer_kinds()) if k.attention == "linear")
        self._index = {layer: j for j, layer in enumerate(self.layers)}
        self.shape_conv = (spec.linear_conv_dim, spec.linear_conv_kernel - 1)  # type: ignore[operator]
        self.shape_rec = (spec.linear_num_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim)
        L = len(self.layers)
        self.conv = torch.zeros(L, slots, *self.shape_conv, dtype=dtype, device=device)
        self.recurrent = torch.zeros(L, slots, *self.shape_rec, dtype=torch.float32, device=device)
        self._slot: dict[int, int] = {}
        self._free = list(range(slots))

    def layer(self, layer: int) -> int:
        """The index of model layer `layer` among the linear layers."""
        return self._index[layer]

    @property
    def bytes_per_seq(self) -> int:
        """One sequence's state in every linear layer: conv (K - 1) W and recurrent nv dk dv elements."""
        conv = self.shape_conv[0] * self.shape_conv[1] * self.conv.element_size()
        rec = self.shape_rec[0] * self.shape_rec[1] * self.shape_rec[2] * self.recurrent.element_size()
        return len(self.layers) * (conv + rec)

    @property
    def capacity_bytes(self) -> int:
        """The storage allocated now (every slot)."""
        return self.conv.numel() * self.conv.element_size() + self.recurrent.numel() * self.recurrent.element_size()

    @property
    def num_seqs(self) -> int:
        """Sequences holding a slot."""
        return len(self._slot)

    def _grow(self) -> None:
        n = self.conv.shape[1]
        self.conv = torch.cat((self.conv, torch.zeros_like(self.conv)), dim=1)
        self.recurrent = torch.cat((self.recurrent, torch.zeros_like(self.recurrent)), dim=1)
        self._free += list(range(n, 2 * n))
        heapq.heapify(self._free)

    def allocate(self, seq_id: int) -> None:
        """A slot for a new sequence, zeroed (a sequence allocated again, after preemption, restarts)."""
        if seq_id in self._slot:
            self.free(seq_id)
        if not self._free:
            self._grow()
        s = self._slot[seq_id] = heapq.heappop(self._free)
        self.conv[:, s].zero_()
        self.recurrent[:, s].zero_()

    def fork(self, parent: int, child: int) -> None:
        """`child` starts with a copy of `parent`'s state (beams, several samples of one prompt)."""
        self.allocate(child)
        p, c = self._slot[parent], self._slot[child]
        self.conv[:, c] = self.conv[:, p]
        self.recurrent[:, c] = self.recurrent[:, p]

    def reorder(self, seq_ids: Sequence[int], sources: Sequence[int]) -> None:
        """Beam search: afterwards `seq_ids[i]` holds what `seq_ids[sources[i]]` held."""
        dst = torch.tensor([self._slot[s] for s in seq_ids], device=self.conv.device)
        src = torch.tensor([self._slot[seq_ids[j]] for j in sources], device=self.conv.device)
        self.conv.index_copy_(1, dst, self.conv.index_select(1, src))
        self.recurrent.index_copy_(1, dst, self.recurrent.index_select(1, src))

    def free(self, seq_id: int) -> None:
        """The sequence ended: its slot returns."""
        s = self._slot.pop(seq_id, None)
        if s is not None:
            heapq.heappush(self._free, s)

    def rows(self, seq_ids: Sequence[int]) -> torch.Tensor:
        """(B,) int64: the step's sequences' slots."""
        return torch.tensor([self._slot[s] for s in seq_ids], dtype=torch.long).to(self.conv.device,
                                                                                   non_blocking=True)


# ---------------------------------------------------------------------------------------------------


class ContiguousKVCache(KVCache):
    """Max-length preallocation: `kv` is `(L, 2, B_max, H_kv, S_max, D)` (MLA: `(L, 1, B_max, 1, S_max,
    R + Dr)`); a sequence owns a row.

    A row holds every layer's whole context, sliding and chunked layers included: this is the naive
    server's cache, which reserves the maximum length up front and reclaims nothing while a sequence
    lives (a ring buffer for the sliding layers would only shorten rows that are already reserved
    whole; the paged cache is where freed memory can serve another sequence)."""

    kind = "contiguous"

    def __init__(self, spec: ModelSpec, *, max_batch: int, max_seq_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(spec, dtype, device)
        for name, value in (("max_batch", max_batch), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        self.max_batch, self._max_seq_len = max_batch, max_seq_len
        self.block_size = max_seq_len  # KVSpace: a "block" is a whole row
        # Zeros, not empty: attention reads (masked) slots past a sequence's end, and 0 * NaN = NaN.
        self.kv = torch.zeros(self.num_layers, self.parts, max_batch, self.num_kv_heads, max_seq_len, self.head_dim,
                              dtype=dtype, device=self.device)  # (L, 2, B_max, H_kv, S_max, D), L attention layers
        self._row: dict[int, int] = {}
        self._len: dict[int, int] = {}
        self._free_rows = list(range(max_batch))  # a heap: the lowest free row first, so a batch's
        # rows stay consecutive and the step addresses them with a slice, not a gather

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._len

    @property
    def num_seqs(self) -> int:
        return len(self._len)

    def live_ids(self) -> list[int]:
        return list(self._len)

    def seq_len(self, seq_id: int) -> int:
        return self._len[seq_id]

    def row(self, seq_id: int) -> int:
        return self._row[seq_id]

    # ---- KVSpace (the shared scheduler's view): a block is a row ------------------------------
    fork_cost = 1
    paged = False
    supports_prefix_sharing = False

    @property
    def num_blocks(self) -> int:
        return self.max_batch

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_rows)

    def blocks_for(self, num_tokens: int) -> int:
        return 1 if num_tokens <= self._max_seq_len else self.max_batch + 1

    def reserve_cost(self, seq_id: int, num_tokens: int = 1) -> int:
        return 0

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        if self._len[seq_id] + num_tokens > self._max_seq_len:
            return False
        self._len[seq_id] += num_tokens
        return True

    def cached_prefix(self, tokens: Sequence[int], limit: int) -> int:
        return 0

    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:
        return None

    def can_allocate(self, lengths: Sequence[int], forks: int = 0, headroom: int = 0) -> bool:
        return len(self._free_rows) >= len(lengths) + forks and max(lengths) <= self._max_seq_len

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        if seq_id in self._len:
            raise ValueError(f"seq_id: {seq_id} is already in the cache")
        if not self.can_allocate([num_tokens]):
            return False
        self._row[seq_id] = heapq.heappop(self._free_rows)
        self._len[seq_id] = num_tokens
        if self.states is not None:
            self.states.allocate(seq_id)
        return True

    def append_slot(self, seq_id: int) -> bool:
        return self.reserve(seq_id, 1)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep only the first `num_tokens` slots of the sequence (speculative decoding's rollback of
        rejected draft tokens). The slots past the new end keep stale K/V: every backend masks keys
        past a query's position, and the next step overwrites them."""
        n = self._len[seq_id]
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 < num_tokens <= n:
            raise ValueError(f"num_tokens: must be an integer in [1, {n}] (sequence {seq_id}'s slots), "
                             f"got {num_tokens!r}")
        self._len[seq_id] = num_tokens

    def fork(self, parent: int, child: int) -> bool:
        if child in self._len:
            raise ValueError(f"child: {child} is already in the cache")
        if not self._free_rows:  # the contract: an expected shortage is a value the caller acts on
            return False
        n = self._len[parent]
        row = heapq.heappop(self._free_rows)
        self.kv[:, :, row, :, :n] = self.kv[:, :, self._row[parent], :, :n]
        self._row[child], self._len[child] = row, n
        if self.states is not None:
            self.states.fork(parent, child)
        return True

    def free(self, seq_id: int) -> None:
        heapq.heappush(self._free_rows, self._row.pop(seq_id))
        del self._len[seq_id]
        if self.states is not None:
            self.states.free(seq_id)

    def _reorder(self, seq_ids: list[int], sources: list[int]) -> bool:
        rows = [self._row[s] for s in seq_ids]
        n = max(self._len[s] for s in seq_ids)
        dst = torch.tensor(rows, device=self.device)
        src = torch.tensor([rows[j] for j in sources], device=self.device)
        # index_select makes a copy first, so a row may be both read and overwritten.
        self.kv[:, :, :, :, :n].index_copy_(2, dst, self.kv[:, :, :, :, :n].index_select(2, src))
        lens = [self._len[seq_ids[j]] for j in sources]
        for s, n_s in zip(seq_ids, lens):
            self._len[s] = n_s
        return True

    def prepare(self, seq_ids: Sequence[int], q_len: int) -> StepMeta:
        starts = self._starts(seq_ids, q_len)
        rows = [self._row[s] for s in seq_ids]
        consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
        return self._attach_states(StepMeta(positions=self._positions(starts, q_len), starts=starts, q_len=q_len,
                                            store=self, rows=torch.tensor(rows, device=self.device),
                                            row_slice=slice(rows[0], rows[0] + len(rows)) if consecutive else None),
                                   seq_ids)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor | None, meta: StepMeta) -> None:
        layer = self.kv_index[layer]
        T = meta.q_len
        if meta.row_slice is not None and meta.uniform:
            s = meta.starts[0]
            for part, x in self._written(k, v):
                self.kv[layer, part, meta.row_slice, :, s:s + T] = x.transpose(1, 2)  # (B, H_kv, T, D)
            return
        # Advanced indices around a slice put their dims first: the target is (B, T, H_kv, D) like k.
        rows = meta.rows[:, None]  # (B, 1)
        for part, x in self._written(k, v):
            self.kv[layer, part][rows, :, meta.positions] = x

    def rows_of(self, layer: int, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V rows `(B, H_kv, S_max, D)` of the step's sequences (a view when the rows are
        consecutive, else a copy): what Flash-Decoding reads."""
        layer = self.kv_index[layer]
        if meta.row_slice is not None:
            return self.kv[layer, 0, meta.row_slice], self.kv[layer, self._v, meta.row_slice]
        k = self.kv[layer, 0].index_select(0, meta.rows)
        return k, (k if self.latent else self.kv[layer, 1].index_select(0, meta.rows))

    def blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A row is a block of S_max slots: `(B_max, S_max, H_kv, D)` views."""
        layer = self.kv_index[layer]
        return self.kv[layer, 0].transpose(1, 2), self.kv[layer, self._v].transpose(1, 2)

    def gather(self, layer: int, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.kv_index[layer]
        S = meta.max_seq_len
        if meta.row_slice is not None:
            return self.kv[layer, 0, meta.row_slice, :, :S], self.kv[layer, self._v, meta.row_slice, :, :S]
        k = self.kv[layer, 0, :, :, :S].index_select(0, meta.rows)
        return k, (k if self.latent else self.kv[layer, 1, :, :, :S].index_select(0, meta.rows))

    def usage(self) -> CacheUsage:
        tokens = sum(self._len.values())
        bpt = self.bytes_per_token
        return CacheUsage(kind=self.kind, bytes_per_token=bpt, capacity_bytes=self.capacity_bytes,
                          reserved_bytes=len(self._row) * self._max_seq_len * bpt, used_bytes=tokens * bpt,
                          logical_tokens=tokens, num_seqs=len(self._len), **self._state_usage())


# ---------------------------------------------------------------------------------------------------


class PagedKVCache(KVCache):
    """Block pools `kv` `(L, 2, N, P, H_kv, D)` (MLA: `(L, 1, N, P, 1, R + Dr)`) handed out by a
    `BlockManager` (PagedAttention); a hybrid model's `(F, 2, N, P, H_kv, D)` by a
    `WindowedBlockManager`; a model windowed alike in every layer's by a `CappedBlockManager` (see the
    module). `max_step_tokens`: the most tokens a step puts through (the scheduler's budget), which
    bounds the blocks a window holds (`blocks_for`)."""

    kind = "paged"

    def __init__(self, spec: ModelSpec, *, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 max_seq_len: int | None = None, kv_window: str = "capped",
                 max_step_tokens: int | None = None) -> None:
        super().__init__(spec, dtype, device)
        self.layout = hybrid_layout(spec, kv_window)
        self.window = capped_window(spec, kv_window)
        if self.window is None:
            self._max_seq_len = min(max_seq_len or num_blocks * block_size, num_blocks * block_size)
        else:  # a sequence holds its window's blocks: the model bounds its length, not the pool
            self._max_seq_len = max_seq_len or spec.max_positions
        self.manager: BlockManager
        if self.window is not None:  # every layer windowed alike: one table, capped at the window
            self.manager = CappedBlockManager(num_blocks, block_size, attention=self.window[0], window=self.window[1],
                                              max_seq_len=self._max_seq_len, max_step_tokens=max_step_tokens)
            pool_layers = self.num_layers
        elif self.layout is None:
            self.manager = BlockManager(num_blocks, block_size, max_seq_len=self._max_seq_len)
            pool_layers = self.num_layers
        else:
            self.manager = WindowedBlockManager(num_blocks, block_size, groups=self.layout.groups,
                                                max_seq_len=self._max_seq_len, max_step_tokens=max_step_tokens,
                                                record_copies=True)
            pool_layers = len(self.layout.full)
            # (table, pool slot) per model layer; a linear layer keeps no K/V (never addressed)
            self._address = tuple(self.layout.address(self.kv_index[i]) if i in self.kv_index else (0, 0)
                                  for i in range(spec.num_layers))
        self.block_size = block_size
        # Zeros: the gather for attention reads whole blocks (masked past each sequence's end).
        self.kv = torch.zeros(pool_layers, self.parts, num_blocks, block_size, self.num_kv_heads, self.head_dim,
                              dtype=dtype, device=self.device)  # (L or F, 2, N, P, H_kv, D)

    @property
    def pages_per_block(self) -> int:
        """Pool blocks one block of every layer takes: 1, or a hybrid model's tables (`HybridLayout.tables`)."""
        return 1 if self.layout is None else self.layout.tables

    def _slot(self, layer: int) -> int:
        """`layer`'s index in the pool tensor's first dimension."""
        return self.kv_index[layer] if self.layout is None else self._address[layer][1]

    # ---- KVSpace (the shared scheduler's view) ------------------------------------------------
    fork_cost = 0
    paged = True
    supports_prefix_sharing = True

    @property
    def num_blocks(self) -> int:
        return self.manager.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return self.manager.blocks_for(num_tokens)

    def reserve_cost(self, seq_id: int, num_tokens: int = 1) -> int:
        return self.manager.reserve_cost(seq_id, num_tokens)

    def shared_blocks(self, num_tokens: int) -> int:
        """Blocks of a `num_tokens`-token prefix a sequence continuing from it still holds (KVSpace)."""
        return self.manager.shared_blocks(num_tokens)

    def cached_prefix(self, tokens: Sequence[int], limit: int) -> int:
        if self.states is not None:  # a cached prefix's blocks carry no linear-layer state
            return 0
        return self.manager.cached_prefix(tokens, limit)

    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:
        self.manager.publish(seq_id, tokens, num_computed)

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Reserve `num_tokens` more slots (all or none), copying a shared last block first."""
        if self.manager.seq_len(seq_id) + num_tokens > self._max_seq_len:
            return False
        if self.layout is not None:  # every group's copy-on-write, recorded by the manager
            if not self.manager.reserve(seq_id, num_tokens):
                return False
            for src, dst, n in self.manager.take_copies():  # type: ignore[attr-defined]
                self.kv[:, :, dst, :n] = self.kv[:, :, src, :n]
            return True
        results = self.manager.append_slots(seq_id, num_tokens)
        if results is None:
            return False
        if results and results[0].copy is not None:  # copy-on-write: the shared block's filled slots
            src, dst = results[0].copy
            self.kv[:, :, dst, :results[0].offset] = self.kv[:, :, src, :results[0].offset]
        return True

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.manager

    @property
    def num_seqs(self) -> int:
        return self.manager.num_seqs

    def live_ids(self) -> list[int]:
        return self.manager.seq_ids

    def seq_len(self, seq_id: int) -> int:
        return self.manager.seq_len(seq_id)

    def block_table(self, seq_id: int) -> list[int]:
        """The blocks holding the sequence's tokens, in order."""
        return self.manager.block_table(seq_id)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence (a block shared by forks counts once)."""
        return self.manager.num_used_blocks

    def check_invariants(self) -> None:
        """Assert the block bookkeeping is consistent (reference counts, free list, tables)."""
        self.manager.check_invariants()

    def pools(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V block pools of `layer`, `(N, P, H_kv, D)` each (what PagedAttention reads through
        `meta.block_tables_for(layer)`; a latent cache's one pool `(N, P, 1, R + Dr)` twice)."""
        slot = self._slot(layer)
        return self.kv[slot, 0], self.kv[slot, self._v]

    def blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The block pools `(N, P, H_kv, D)` (addressed by `meta.block_tables_for(layer)`)."""
        return self.pools(layer)

    def can_allocate(self, lengths: Sequence[int], forks: int = 0, headroom: int = 0) -> bool:
        # forks share blocks: free; a new sequence's first step holds every group's blocks
        needed = sum(self.manager.blocks_needed(n) for n in lengths) * self.pages_per_block
        return needed + headroom <= self.manager.num_free_blocks and max(lengths) <= self._max_seq_len

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        if num_tokens > self._max_seq_len:
            return False
        ok = self.manager.allocate(seq_id, num_tokens, prefix=prefix if self.states is None else None)
        if ok and self.states is not None:
            self.states.allocate(seq_id)
        return ok

    def append_slot(self, seq_id: int) -> bool:
        return self.reserve(seq_id, 1)

    def fork(self, parent: int, child: int) -> bool:
        self.manager.fork(parent, child)
        if self.states is not None:
            self.states.fork(parent, child)
        return True

    def free(self, seq_id: int) -> None:
        self.manager.free(seq_id)
        if self.states is not None:
            self.states.free(seq_id)

    def _reorder(self, seq_ids: list[int], sources: list[int]) -> bool:
        # Share blocks by reference: fork each changed beam's source into a temporary id, drop the
        # old tables, then move the temporaries to the beams' ids. No block is needed or copied.
        changed = [i for i, j in enumerate(sources) if j != i]
        tmp = {i: -1 - i for i in changed}  # callers' ids are >= 0
        for i in changed:
            self.manager.fork(seq_ids[sources[i]], tmp[i])
        for i in changed:
            self.manager.free(seq_ids[i])
        for i in changed:
            self.manager.fork(tmp[i], seq_ids[i])
            self.manager.free(tmp[i])
        return True

    def prepare(self, seq_ids: Sequence[int], q_len: int) -> StepMeta:
        starts = self._starts(seq_ids, q_len)
        slots: list[int] = []
        tables = []
        for s, start in zip(seq_ids, starts):
            slots += self.manager.slot_mapping(s, start, start + q_len)
            # a block given back behind a capped window is a null entry, block 0: only masked keys fall in it
            tables.append([0 if b is None else b for b in self.manager.block_table(s)])
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]  # padding points at block 0: masked
        meta = StepMeta(positions=self._positions(starts, q_len), starts=starts, q_len=q_len, store=self,
                        slot_mapping=torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True),
                        block_tables=torch.tensor(padded, dtype=torch.int32).to(self.device, non_blocking=True))
        nb = -(-meta.max_seq_len // self.block_size)
        meta._memo["block_runs"] = _block_runs(tables, nb)
        if self.layout is not None:
            self._prepare_groups(meta, seq_ids, starts, q_len, width, nb)
        return self._attach_states(meta, seq_ids)

    def _prepare_groups(self, meta: StepMeta, seq_ids: Sequence[int], starts: Sequence[int], q_len: int,
                        width: int, nb: int) -> None:
        """Each window sub-group's block tables and slots for the step (`StepMeta.group_tables`): a
        block given back is a null entry, block 0, which only masked keys fall in."""
        manager = self.manager
        group_tables, group_slots = [], []
        for gi, g in enumerate(self.layout.groups):  # type: ignore[union-attr]
            rows = [manager.window_table(s, gi) for s in seq_ids]  # type: ignore[attr-defined]
            for sub in range(g.pages):
                tables = [[0 if e is None else e[sub] for e in row] for row in rows]
                slots: list[int] = []
                for s, start in zip(seq_ids, starts):
                    slots += manager.window_slot_mapping(s, gi, sub, start, start + q_len)  # type: ignore[attr-defined]
                padded = [t + [0] * (width - len(t)) for t in tables]
                group_tables.append(torch.tensor(padded, dtype=torch.int32).to(self.device, non_blocking=True))
                group_slots.append(torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True))
                meta._memo[("block_runs", len(group_tables))] = _block_runs(tables, nb)
        meta.group_tables, meta.group_slots = tuple(group_tables), tuple(group_slots)
        meta.layer_tables = tuple(a[0] for a in self._address)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor | None, meta: StepMeta) -> None:
        N, P = self.kv.shape[2], self.kv.shape[3]
        rows = k.shape[0] * k.shape[1]
        slot, slots = self._slot(layer), meta.slot_mapping_for(layer)
        for part, x in self._written(k, v):
            flat = self.kv[slot, part].view(N * P, self.num_kv_heads, self.head_dim)  # (N*P, H_kv, D)
            flat.index_copy_(0, slots, x.reshape(rows, self.num_kv_heads, self.head_dim))

    def gather(self, layer: int, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
        S = meta.max_seq_len
        t, slot = meta.table_index(layer), self._slot(layer)
        key = "tables_long" if t == 0 else ("tables_long", t)
        if key not in meta._memo:
            nb = -(-S // self.block_size)
            meta._memo[key] = meta.block_tables_for(layer)[:, :nb].long()  # (B, nb)
        tables = meta._memo[key]
        B, nb = tables.shape
        runs = meta._memo.get("block_runs" if t == 0 else ("block_runs", t))
        if runs is not None:  # every sequence's blocks are one run, equally spaced: a view, no copy
            first, spacing = runs
            P, H_kv, D = self.block_size, self.num_kv_heads, self.head_dim
            return tuple(kv.as_strided((B, H_kv, S, D), (spacing * P * H_kv * D, D, H_kv * D, 1),
                                       kv.storage_offset() + first * P * H_kv * D)
                         for kv in (self.kv[slot, 0], self.kv[slot, self._v]))  # (B, H_kv, S, D) each
        out = []
        flat = tables.reshape(-1)  # (B*nb,)
        for kv in self.kv[slot]:  # K and V, or the one latent part
            # index_select, not kv[tables]: one contiguous gather of whole blocks, measured 1.14-1.51x
            # faster than advanced indexing on this CPU at 2048 tokens (issue 8).
            blocks = kv.index_select(0, flat).view(B, nb, *kv.shape[1:])  # (B, nb, P, H_kv, D)
            out.append(blocks.view(B, nb * self.block_size, self.num_kv_heads, self.head_dim)[:, :S].transpose(1, 2))
        return out[0], out[-1]  # (B, H_kv, S, D) each

    def usage(self) -> CacheUsage:
        u = self.manager.usage()
        bpt = self.bytes_per_token
        if self.layout is None:
            reserved, used = u.reserved_slots * bpt, u.used_slots * bpt
        else:  # a pool slot holds F layers; a window group's slot its sub-group's layers
            per_layer = bpt // self.num_layers
            full, groups = self.manager.slot_usage()  # type: ignore[attr-defined]
            F = len(self.layout.full)
            reserved = u.reserved_slots * F * per_layer
            used = (full * F + sum(n * g.layers for n, g in zip(groups, self.layout.groups))) * per_layer
        return CacheUsage(kind=self.kind, bytes_per_token=bpt, capacity_bytes=self.capacity_bytes,
                          reserved_bytes=reserved, used_bytes=used,
                          logical_tokens=u.logical_tokens, num_seqs=u.num_sequences, **self._state_usage())


def _block_runs(tables: Sequence[Sequence[int]], nb: int) -> tuple[int, int] | None:
    """(first block, spacing between sequences) when the first `nb` blocks of every table are one
    run of consecutive ids and the runs start equally spaced, so the step's K/V is a strided view
    of the pool (PagedAttention reading the blocks in place); None otherwise (then a gather copies)."""
    firsts = []
    for t in tables:
        if len(t) < nb or t[nb - 1] - t[0] != nb - 1 or any(t[j + 1] != t[j] + 1 for j in range(nb - 1)):
            return None
        firsts.append(t[0])
    spacing = firsts[1] - firsts[0] if len(firsts) > 1 else nb
    if spacing < nb or any(b - a != spacing for a, b in zip(firsts, firsts[1:])):
        return None
    return firsts[0], spacing


def make_cache(kind: str, spec: ModelSpec, *, dtype: torch.dtype, device: torch.device | str,
               max_batch: int, max_seq_len: int, block_size: int = 16, num_blocks: int | None = None,
               kv_window: str = "capped", max_step_tokens: int | None = None) -> KVCache:
    """A contiguous cache of `max_batch` rows of `max_seq_len`, or a paged one of `num_blocks` blocks
    (default: room for `max_batch` sequences of `max_seq_len` in every layer). `kv_window` and
    `max_step_tokens`: a paged cache's (`PagedKVCache`)."""
    if kind == "contiguous":
        return ContiguousKVCache(spec, max_batch=max_batch, max_seq_len=max_seq_len, dtype=dtype, device=device)
    if kind == "paged":
        if num_blocks is None:
            layout = hybrid_layout(spec, kv_window)
            num_blocks = max_batch * -(-max_seq_len // block_size) * (1 if layout is None else layout.tables)
        return PagedKVCache(spec, num_blocks=num_blocks, block_size=block_size, dtype=dtype, device=device,
                            max_seq_len=max_seq_len, kv_window=kv_window, max_step_tokens=max_step_tokens)
    raise ValueError(f"cache: must be one of {', '.join(CACHE_KINDS)}, got {kind!r}")
