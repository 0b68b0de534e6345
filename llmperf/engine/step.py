"""One forward step's metadata: what the runner prepares (through the cache) and every attention
backend reads. Its own module, imported by both `attention` and `cache`, so neither imports the other.

Letters: B sequences in the step, T new tokens per sequence (`q_len`), S keys attended.

A step feeds T new tokens of each of B sequences; sequence b already holds `starts[b]` tokens in the
cache. What the step carries says how its K/V are addressed, and backends dispatch on that, never
on the cache's class:

- `block_tables` (B, max_blocks) int32 and `slot_mapping` (B*T,): a paged cache (PagedAttention
  reads the block pools `store.pools(layer)` in place). A hybrid model's paged cache (sliding or
  chunked layers beside full ones, `llmperf.serving.blocks.WindowedBlockManager`) keeps one table per
  KV-cache group: `block_tables` / `slot_mapping` are then the full-attention layers', `group_tables` /
  `group_slots` each sub-group's (a block that slid out of the window is a null entry, block 0, never
  read unmasked), and `layer_tables[layer]` says which one a layer reads (0: the full layers', i: the
  i-th group's); backends ask `block_tables_for(layer)` / `slot_mapping_for(layer)`. Positions stay
  absolute in every group (`mask` is unchanged). A model with one kind of layer leaves the three None;
- `rows` (B,) (and `row_slice` when consecutive): a contiguous cache (Flash-Decoding reads the rows
  `store.rows_of(layer, meta)`);
- neither, `store` None: no cache (a full forward from position 0).

`store` is the `KVStore` (the cache's tensor side: `write`, `gather`, `pools`, `rows_of`, `blocks`); nothing
here reaches into the cache's block bookkeeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class KVStore(Protocol):
    """The tensor side of a cache that the model and the backends use (the engine's caches implement it)."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor | None, meta: StepMeta) -> None:
        """Store this step's K and V `(B, T, H_kv, D)` of `layer` at the step's slots (a latent cache,
        multi-head latent attention's: `k` the latent `(B, T, 1, R + Dr)`, `v` None)."""

    def gather(self, layer: int, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V `(B, H_kv, S, D)` of `layer` for the step's sequences (S = the longest context)."""

    def pools(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Paged: the K and V block pools `(N, P, H_kv, D)` of `layer`."""

    def rows_of(self, layer: int, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous: the step's K and V rows `(B, H_kv, S_max, D)` of `layer`."""

    def blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Either cache: K and V of `layer` as blocks `(num_blocks, slots, H_kv, D)` (a contiguous cache's
        block is a row), addressed by `StepMeta.block_table()`."""


@dataclass(frozen=True, eq=False)
class LayerAttn:
    """What one layer's attention computes beyond plain causal softmax(QK^T * scale) V, set by the
    model for every step (`StepMeta.attn(layer)`), read by every backend:

    - `scale`: the factor on QK^T (1/sqrt(D), GPT-2's per-layer scalings, Gemma's query_pre_attn_scalar,
      DeepSeek's yarn mscale);
    - `window`: a sliding layer's query at position p sees keys s with p - window < s <= p (Mistral,
      Gemma, gpt-oss: the window counts the query itself);
    - `chunk`: a chunked layer's query sees the keys of its own block, s // chunk == p // chunk, s <= p
      (Llama 4's attention_chunk_size);
    - `sinks`: (H,) learned logits, one per query head, that join the softmax's denominator and
      contribute no value (gpt-oss);
    - `softcap`: scores become softcap * tanh(score / softcap) before the softmax (Gemma 2).
    """

    scale: float
    window: int | None = None
    chunk: int | None = None
    sinks: torch.Tensor | None = None
    softcap: float | None = None


@dataclass(eq=False)
class StepMeta:
    """What every layer needs to know about one forward step (built once per step, by the cache's
    `prepare`, which the runner calls).

    `positions` (B, T) int64 on the model's device; `starts` / `seq_lens` python ints per sequence
    (tokens cached before / after this step). Cache addressing: `rows` (contiguous cache: the batch's
    rows, `row_slice` when they are consecutive), or `slot_mapping` (B*T,) and `block_tables`
    (B, max_blocks) int32 (paged cache), and for a hybrid model's paged cache `group_tables`,
    `group_slots`, `layer_tables` (each layer's through `block_tables_for` / `slot_mapping_for`).
    `store`: where the K/V live (None: no cache). `starts` and `seq_lens` count slots; `positions` are
    the same numbers unless a cache that evicts sets `last_position` (`max_position`).
    """

    positions: torch.Tensor
    starts: tuple[int, ...]
    q_len: int
    store: KVStore | None = None
    rows: torch.Tensor | None = None
    row_slice: slice | None = None
    slot_mapping: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    # A hybrid paged cache: each sub-group's tables and slots, and per layer its table (see the module).
    group_tables: tuple[torch.Tensor, ...] | None = None
    group_slots: tuple[torch.Tensor, ...] | None = None
    layer_tables: tuple[int, ...] | None = None
    # A cache that evicts (`llmperf.engine.streaming`): the step's largest absolute position, which runs
    # past its slots; None: positions are slot indices, the largest `max_seq_len - 1` (see `max_position`).
    last_position: int | None = None
    # A model with linear (Gated DeltaNet) layers: the cache's `cache.LinearStates` and the step's
    # sequences' slots in it (B,) int64; None: no state kept (a forward from position 0 without a cache).
    states: Any = None
    state_rows: torch.Tensor | None = None
    # Per sequence, its prompt's length (the runner's; None: unknown, as for a step built on its own): Mamba-2
    # layers clamp dt at the prompt's positions only, as transformers' generate() does (`mamba2`).
    prompt_lens: tuple[int, ...] | None = None
    # Set by the model for its forward (ModelSpec fields that change the math): the keys a query of
    # a model whose layers all slide alike may see (None = all; the CPU's one-call decode reads it).
    window: int | None = None
    # Set by the model for its forward: every layer's attention parameters (None: plain causal
    # attention at 1/sqrt(D) in every layer, e.g. a step timed on its own by calibrate).
    layers: tuple[LayerAttn, ...] | None = None
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)

    def attn(self, layer: int, head_dim: int | None = None) -> LayerAttn:
        """`layer`'s attention parameters (`LayerAttn`); without the model's (a step built on its
        own), the step's window and 1/sqrt(head_dim)."""
        if self.layers is not None:
            return self.layers[layer]
        if head_dim is None:
            raise ValueError("meta: a step without the model's layer parameters needs head_dim")
        return LayerAttn(scale=1.0 / math.sqrt(head_dim), window=self.window)

    def limited(self, p: LayerAttn) -> bool:
        """Some query of the step has keys outside its layer's window or chunk (it matters)."""
        return ((p.window is not None and self.max_seq_len > p.window)
                or (p.chunk is not None and self.max_seq_len > p.chunk))

    @property
    def batch(self) -> int:
        return len(self.starts)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(s + self.q_len for s in self.starts)

    @property
    def max_seq_len(self) -> int:
        return max(self.starts) + self.q_len

    @property
    def max_position(self) -> int:
        """The step's largest absolute position (what the rotary tables and max_positions must cover):
        `max_seq_len - 1`, unless a cache that evicts set `last_position`."""
        return self.max_seq_len - 1 if self.last_position is None else self.last_position

    @property
    def fresh(self) -> bool:
        """Every sequence starts empty: this step's K and V are all the keys."""
        return max(self.starts) == 0

    @property
    def uniform(self) -> bool:
        """Every sequence has the same context (no padding mask needed)."""
        return min(self.starts) == max(self.starts)

    def seq_lens_tensor(self) -> torch.Tensor:
        """(B,) int32 on the model's device (what the kernels take)."""
        if "seq_lens" not in self._memo:
            self._memo["seq_lens"] = torch.tensor(self.seq_lens, dtype=torch.int32, device=self.positions.device)
        return self._memo["seq_lens"]

    def mask(self, S: int, p: LayerAttn | None = None) -> torch.Tensor | None:
        """(B, 1, T, S) bool, True where query (b, t) may see key s: s <= its position p and, with a
        sliding window W, s > p - W (Mistral / Hugging Face: each query sees its last W keys, itself
        included), with a chunk C, s // C == p // C. `p`: the layer's parameters (default: the
        step's window). None when every query sees every one of the S keys (uniform decode)."""
        window, chunk = (self.window, None) if p is None else (p.window, p.chunk)
        window = window if window is not None and self.max_seq_len > window else None
        chunk = chunk if chunk is not None and self.max_seq_len > chunk else None
        if self.q_len == 1 and self.uniform and S == self.max_seq_len and window is None and chunk is None:
            return None
        key = (S, window, chunk)
        if key not in self._memo:
            keys = torch.arange(S, device=self.positions.device)[None, None, :]  # (1, 1, S)
            pos = self.positions[:, :, None]  # (B, T, 1)
            visible = keys <= pos
            if window is not None:
                visible &= keys > pos - window
            if chunk is not None:
                visible &= keys // chunk == pos // chunk
            self._memo[key] = visible[:, None]  # (B, 1, T, S)
        return self._memo[key]

    @classmethod
    def decode(cls, batch: int, kv_len: int, device: torch.device | str) -> StepMeta:
        """A decode step of `batch` sequences that each hold `kv_len` tokens after it (the new one
        included), with no cache attached (what `calibrate` and `profile` time attention with)."""
        positions = torch.full((batch, 1), kv_len - 1, dtype=torch.long, device=device)
        return cls(positions=positions, starts=(kv_len - 1,) * batch, q_len=1)

    @classmethod
    def no_cache(cls, batch: int, q_len: int, device: torch.device | str) -> StepMeta:
        """A full forward of `q_len` tokens from position 0, with no cache (recomputation)."""
        positions = torch.arange(q_len, device=device).expand(batch, q_len)  # (B, T)
        return cls(positions=positions, starts=(0,) * batch, q_len=q_len)


    @property
    def paged(self) -> bool:
        """K/V are addressed by block tables (read the pools in place)."""
        return self.block_tables is not None

    @property
    def contiguous(self) -> bool:
        """K/V are addressed by cache rows."""
        return self.rows is not None

    def table_index(self, layer: int) -> int:
        """Which block table `layer` reads: 0 (the full layers', or the only one), i (`group_tables[i - 1]`)."""
        return 0 if self.layer_tables is None else self.layer_tables[layer]

    def block_tables_for(self, layer: int) -> torch.Tensor | None:
        """(B, max_blocks) int32: the block tables `layer`'s keys are found through (paged caches)."""
        t = self.table_index(layer)
        return self.block_tables if t == 0 else self.group_tables[t - 1]  # type: ignore[index]

    def slot_mapping_for(self, layer: int) -> torch.Tensor | None:
        """(B*T,) int64: where `layer` writes this step's K and V (paged caches)."""
        t = self.table_index(layer)
        return self.slot_mapping if t == 0 else self.group_slots[t - 1]  # type: ignore[index]

    def block_table(self) -> torch.Tensor:
        """(B, width) int32: each sequence's blocks in `store.blocks(layer)`: the block tables (paged),
        or its row, its one block (contiguous)."""
        if self.block_tables is not None:
            return self.block_tables
        if self.rows is None:
            raise ValueError("meta: a step without a cache has no block table")
        if "row_table" not in self._memo:
            self._memo["row_table"] = self.rows.to(torch.int32)[:, None].contiguous()
        return self._memo["row_table"]


__all__ = ["KVStore", "LayerAttn", "StepMeta"]
