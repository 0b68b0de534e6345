"""DeepSeek-V4's cache in the serving simulator: `V4Pages` (what one sequence reserves, from `KVCacheSpec`'s v4
groups) and `V4BlockManager` (the scheduler's `KVSpace` over a pool of equal pages, counts only). No torch.

Each paged group is paged apart, as vLLM's hybrid allocator pages every KV-cache group in pages of one size
(`vllm/v1/core/kv_cache_utils.py`): a group's block holds `block_size` of its units (the window's tokens, or the
compressed entries, one every `rate` tokens) in every layer of the group, and takes `pages` pool pages of
`page_bytes`, the largest size dividing every group's block (so nothing is padded). A sequence of c tokens holds
`KVGroup.paged_tokens(c, block_size) / block_size` blocks of each: the window's `min(c, sliding_window - 1)`
tokens, each compressed group's floor(c / rate) entries, in whole blocks (`KVCacheSpec.paged_bytes_for_context`);
the window's blocks behind it go back as it slides (counted, not tracked: a ring straddling a block boundary is
not charged the block more). The `partial` and `overlap` buffers are per-sequence state (as Mamba's and Gated
DeltaNet's states are, `BlockManager.state_blocks`): their largest size (rate - 1 partial tokens, the overlap's
rate slots) in whole pages, from admission to the sequence's end. Nothing is shared by prefix (a sequence's
compressed entries and partial windows are its own); a fork copies the sequence (`fork_cost` 1: its whole
reservation again). Worked rules and figures: docs/serving.md, "DeepSeek-V4's pages".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from llmperf.errors import SpecError
from llmperf.numeric import is_count
from llmperf.specs.kvcache import KVCacheSpec


@dataclass(frozen=True)
class V4Pages:
    """What a DeepSeek-V4 sequence reserves in a pool of `page_bytes` pages: per paged group (`KVCacheSpec.groups`
    order, `partial` and `overlap` left out) its unit's cap (the window's tokens, or None: entries grow) and rate
    (1 for the window), and the pages one block of it takes; `state_pages` for the partial and overlap buffers."""

    block_size: int
    page_bytes: float
    groups: tuple[tuple[str, int | None, int, int], ...]  # (attention, cap, rate, pages a block)
    state_bytes: float  # the partial windows' and the overlaps' largest size, one sequence
    state_pages: int
    unit_bytes: tuple[float, ...] = ()  # a paged group's unit (a token, an entry) in every layer of the group
    buffers: tuple[tuple[str, int, float], ...] = ()  # (partial | overlap, rate, bytes a token or slot)

    @classmethod
    def of(cls, kv: KVCacheSpec, block_size: int) -> V4Pages:
        """The pages of `kv` (a v4 cache, one GPU's) in blocks of `block_size` units."""
        if not kv.v4:
            raise SpecError("kv cache: V4Pages needs DeepSeek-V4's cache (v4)")
        if not is_count(block_size) or block_size < 1:
            raise SpecError(f"--block-size: must be a positive integer, got {block_size!r}")
        paged = [g for g in kv.groups if g.paged]
        sizes = [Fraction(block_size * g.bytes_per_token).limit_denominator(1 << 20) for g in paged]
        den = math.lcm(*(s.denominator for s in sizes))
        page = Fraction(math.gcd(*(int(s * den) for s in sizes)), den)
        groups = tuple((g.attention, g.window if g.attention in ("sliding", "window") else None,
                        1 if g.attention in ("sliding", "window") else g.window, int(s / page))
                       for g, s in zip(paged, sizes))
        state = sum(g.bytes_per_token * (g.window - 1 if g.attention == "partial" else g.window)
                    for g in kv.groups if not g.paged)
        return cls(block_size=block_size, page_bytes=float(page), groups=groups, state_bytes=float(state),
                   state_pages=math.ceil(state / float(page)) if state else 0,
                   unit_bytes=tuple(g.bytes_per_token for g in paged),
                   buffers=tuple((g.attention, g.window, g.bytes_per_token) for g in kv.groups if not g.paged))

    def used_bytes(self, num_tokens: int) -> float:
        """Bytes a sequence of `num_tokens` tokens' cache holds, unpadded (`KVCacheSpec.bytes_for_context`): its
        groups' units and its buffers' tokens (`num_tokens mod rate` partial, the overlap's rate once a window
        closed)."""
        out = 0.0
        for (_, cap, rate, _), b in zip(self.groups, self.unit_bytes):
            out += (num_tokens // rate if cap is None else min(num_tokens, cap)) * b
        for kind, rate, b in self.buffers:
            out += (num_tokens % rate if kind == "partial" else (rate if num_tokens >= rate else 0)) * b
        return out

    def group_blocks(self, num_tokens: int) -> tuple[int, ...]:
        """Blocks each paged group holds for a sequence of `num_tokens` tokens."""
        bs, out = self.block_size, []
        for _, cap, rate, _ in self.groups:
            units = num_tokens // rate if cap is None else min(num_tokens, cap)
            out.append(-(-units // bs))
        return tuple(out)

    def kv_pages(self, num_tokens: int) -> int:
        """Pool pages of a sequence's paged groups at `num_tokens` tokens (its state's apart)."""
        return sum(b * g[3] for b, g in zip(self.group_blocks(num_tokens), self.groups))

    def pages(self, num_tokens: int) -> int:
        """Pool pages a sequence of `num_tokens` tokens reserves: its groups' blocks and its state's."""
        return self.kv_pages(num_tokens) + self.state_pages

    def reserved_bytes(self, num_tokens: int) -> float:
        """Bytes those pages hold."""
        return self.pages(num_tokens) * self.page_bytes


class V4BlockManager:
    """The scheduler's `KVSpace` for DeepSeek-V4 (`V4Pages`): a pool of `num_blocks` pages, each sequence holding
    `pages.pages(its length)` of them (counts: no page ids, no prefix sharing). `slot_counts` reports bytes as
    slots of `page_bytes / block_size` bytes, the simulator's `kv_bytes_per_token`."""

    fork_cost = 1  # a fork copies the sequence's whole reservation
    paged = True
    #: the scheduler may ask for shared prefixes; none is found (`cached_prefix` is 0), as with a Mamba state
    supports_prefix_sharing = True

    def __init__(self, num_blocks: int, pages: V4Pages, *, max_seq_len: int | None = None) -> None:
        if not is_count(num_blocks) or num_blocks < 0:
            raise ValueError(f"num_blocks: must be a non-negative integer, got {num_blocks!r}")
        self.num_blocks, self.v4 = num_blocks, pages
        self.block_size = pages.block_size
        self.max_seq_len = num_blocks * pages.block_size if max_seq_len is None else max_seq_len
        self._lens: dict[int, int] = {}
        self._held: dict[int, int] = {}
        self._used = 0
        self._bytes = 0.0  # the sequences' caches, unpadded (`V4Pages.used_bytes`)

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._used

    @property
    def num_used_blocks(self) -> int:
        return self._used

    @property
    def num_seqs(self) -> int:
        return len(self._lens)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._lens

    def _known(self, seq_id: int) -> int:
        try:
            return self._lens[seq_id]
        except KeyError:
            raise ValueError(f"sequence {seq_id!r}: unknown id (known: {sorted(self._lens)})") from None

    def seq_len(self, seq_id: int) -> int:
        return self._known(seq_id)

    def held(self, seq_id: int) -> int:
        """Pages the sequence holds."""
        self._known(seq_id)
        return self._held[seq_id]

    def blocks_for(self, num_tokens: int) -> int:
        return self.v4.pages(num_tokens)

    def shared_blocks(self, num_tokens: int) -> int:  # noqa: ARG002 -- nothing is shared by prefix
        return 0

    def can_allocate(self, num_tokens: int) -> bool:
        return self.v4.pages(num_tokens) <= self.num_free_blocks

    def cached_prefix(self, tokens: Sequence[int], limit: int) -> int:  # noqa: ARG002
        return 0

    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:  # noqa: ARG002
        self._known(seq_id)

    def _set(self, seq_id: int, num_tokens: int) -> None:
        old = self._held.get(seq_id, 0)
        new = self.v4.pages(num_tokens)
        self._used += new - old
        self._bytes += self.v4.used_bytes(num_tokens) - (self.v4.used_bytes(self._lens[seq_id]) if seq_id in self._lens
                                                         else 0.0)
        self._held[seq_id], self._lens[seq_id] = new, num_tokens

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:  # noqa: ARG002
        if seq_id in self._lens:
            raise ValueError(f"sequence {seq_id!r}: already allocated (free it first)")
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        if self.v4.pages(num_tokens) > self.num_free_blocks:
            return False
        self._set(seq_id, num_tokens)
        return True

    def reserve_cost(self, seq_id: int, num_tokens: int = 1) -> int:
        n = self._known(seq_id)
        return self.v4.pages(n + num_tokens) - self._held[seq_id]

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        return self.reserve_cost(seq_id, num_tokens) <= self.num_free_blocks

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        if self.reserve_cost(seq_id, num_tokens) > self.num_free_blocks:
            return False
        self._set(seq_id, self._lens[seq_id] + num_tokens)
        return True

    def reserve_each(self, seq_ids: Sequence[int]) -> int:
        """`reserve(s, 1)` for each in order up to the first that does not fit; how many did."""
        for i, s in enumerate(seq_ids):
            if not self.reserve(s, 1):
                return i
        return len(seq_ids)

    def fork(self, parent_id: int, child_id: int) -> None:
        n = self._known(parent_id)
        if child_id in self._lens:
            raise ValueError(f"sequence {child_id!r}: already allocated (free it first)")
        if self._held[parent_id] > self.num_free_blocks:
            raise ValueError(f"fork: sequence {parent_id}'s {self._held[parent_id]} pages, "
                             f"{self.num_free_blocks} free")
        self._set(child_id, n)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        n = self._known(seq_id)
        if not 0 <= num_tokens <= n:
            raise ValueError(f"truncate: {num_tokens} is not within sequence {seq_id}'s {n} tokens")
        self._set(seq_id, num_tokens)

    def free(self, seq_id: int) -> None:
        self._known(seq_id)
        self._used -= self._held.pop(seq_id)
        self._bytes -= self.v4.used_bytes(self._lens.pop(seq_id))

    def slot_counts(self) -> tuple[float, int]:
        """(used, reserved) in slots of `page_bytes / block_size` bytes: the bytes the sequences' caches hold
        (`V4Pages.used_bytes`), and the pages reserved."""
        return max(0.0, self._bytes) * self.block_size / self.v4.page_bytes, self._used * self.block_size

    def check_invariants(self) -> None:
        assert self._used == sum(self._held.values()) <= self.num_blocks
        assert all(self._held[s] == self.v4.pages(n) for s, n in self._lens.items())


__all__ = ["V4BlockManager", "V4Pages"]
