"""The paged KV cache's bookkeeping: which physical blocks each sequence's tokens live in. No torch.

PagedAttention (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023, arXiv:2309.06180) stores a sequence's keys and values in fixed-size
blocks of `block_size` token slots, found through a per-sequence block table; sequences forked from
one another share blocks under reference counts, and the first write into a shared block copies it
(copy-on-write). Layered like vLLM's KV-cache manager (`vllm/v1/core/block_pool.py`,
`kv_cache_utils.py`): block record -> free queue -> pool (`BlockPool`) -> per-sequence manager
(`BlockManager`).

Everything here is python ints: the scheduler (`llmperf.serving.scheduler`) drives this manager
directly in the simulator and through the engine's paged cache (`llmperf/engine/cache.py`, which owns
the tensors and performs the copies asked for) in the real engine: one bookkeeping for both.
`WindowedBlockManager` adds sliding and chunked layers (vLLM's hybrid KV-cache manager): each
`WindowGroup` gives back the blocks that left its window or chunk; `HybridLayout` says which layers
page together; `CappedBlockManager` caps a model whose every layer slides with one window (Mistral
7B v0.1, StreamingLLM): its one table gives back what left the window. Prefix sharing (vLLM's
automatic prefix caching, block granularity): a computed full block is published under the key
`(previous block id, its tokens)`, and a new sequence whose prompt starts with the same tokens takes
it by reference (`allocate(..., prefix=)`).

Conventions: a token at position p lives in block `table[p // block_size]` at offset `p %
block_size`, flat slot `block_id * block_size + offset`. An expected shortage returns None or False
with nothing changed; misuse (unknown ids, double free, a seq id used twice) raises ValueError.
Copy-on-write, prefix keys and window groups in full: docs/serving.md, "Paged KV bookkeeping".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from llmperf.numeric import is_count
from llmperf.specs.kvcache import first_key, pages_per_block


@dataclass(slots=True)
class Block:
    """One physical block: its id and how many block tables hold it (0: it is in the free queue);
    `BlockPool.block` gives one."""

    block_id: int
    ref_count: int = 0


class FreeBlockQueue:
    """Free block ids, first freed first reused (vLLM's order, which keeps freshly freed blocks
    around longest for prefix reuse); O(1) membership so a double free is caught.

    The ids not handed out yet stay the given range, from `_next` on, ahead of every freed id: the
    order of a queue that started with all of them, without building one (a pool has tens of
    thousands of blocks, and the simulator builds a pool per run)."""

    def __init__(self, block_ids: range) -> None:
        self._fresh = block_ids
        self._next = 0  # _fresh[_next:] were never popped
        self._queue: deque[int] = deque()  # ids pushed back, in order
        self._members: set[int] = set()  # the same ids

    def __len__(self) -> int:
        return len(self._fresh) - self._next + len(self._queue)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._members or block_id in self._fresh[self._next:]

    def pop(self) -> int | None:
        """The block free the longest, or None when none is free."""
        if self._next < len(self._fresh):
            self._next += 1
            return self._fresh[self._next - 1]
        if not self._queue:
            return None
        block_id = self._queue.popleft()
        self._members.remove(block_id)
        return block_id

    def pop_many(self, n: int) -> list[int]:
        """The `n` blocks free the longest, in the order `n` pops give them (fewer when fewer are free)."""
        k = min(n, len(self._fresh) - self._next)
        out = list(self._fresh[self._next:self._next + k])
        self._next += k
        if k < n and self._queue:
            popleft = self._queue.popleft
            rest = [popleft() for _ in range(min(n - k, len(self._queue)))]
            self._members.difference_update(rest)
            out += rest
        return out

    def push(self, block_id: int) -> None:
        """Return a block to the end of the queue; a block already free raises `ValueError`."""
        if block_id in self:
            raise ValueError(f"block {block_id} is already free")
        self._extend((block_id,))

    def _extend(self, block_ids: Sequence[int]) -> None:
        """`push` of each block, known not to be free (the pool's: their reference counts were positive)."""
        self._queue.extend(block_ids)
        self._members.update(block_ids)

    def ids(self) -> list[int]:
        """The free block ids, oldest first."""
        return [*self._fresh[self._next:], *self._queue]


class BlockPool:
    """A fixed set of `num_blocks` blocks with reference counts (a list of ints, by block id: cheap
    to build and to update)."""

    def __init__(self, num_blocks: int) -> None:
        if not is_count(num_blocks) or num_blocks < 1:
            raise ValueError(f"num_blocks: must be a positive integer, got {num_blocks!r}")
        self._refs = [0] * num_blocks
        self._free = FreeBlockQueue(range(num_blocks))

    @property
    def num_blocks(self) -> int:
        return len(self._refs)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def _check(self, block_id: int) -> int:
        if not isinstance(block_id, int) or not 0 <= block_id < len(self._refs):
            raise ValueError(f"block {block_id!r}: unknown id (the pool has blocks 0..{len(self._refs) - 1})")
        return block_id

    def block(self, block_id: int) -> Block:
        """Block `block_id` as it is now (a copy)."""
        return Block(block_id, self._refs[self._check(block_id)])

    def refcount(self, block_id: int) -> int:
        """How many sequences hold block `block_id` (0: free)."""
        return self._refs[self._check(block_id)]

    def allocate(self) -> int | None:
        """A free block with reference count 1, or None when none is free."""
        block_id = self._free.pop()
        if block_id is None:
            return None
        self._refs[block_id] = 1
        return block_id

    def allocate_many(self, n: int) -> list[int] | None:
        """`n` free blocks with reference count 1, those `n` `allocate()` calls would give; None, with
        nothing taken, when fewer are free."""
        if n > len(self._free):
            return None
        ids = self._free.pop_many(n)
        refs = self._refs
        for block_id in ids:
            refs[block_id] = 1
        return ids

    def incref(self, block_id: int) -> None:
        """One more holder of an allocated block (a fork or a shared prefix); a free block raises
        `ValueError`."""
        if self._refs[self._check(block_id)] == 0:
            raise ValueError(f"block {block_id}: incref of a free block (allocate it first)")
        self._refs[block_id] += 1

    def decref(self, block_id: int) -> bool:
        """Drop one reference; at zero the block returns to the free queue (returns True then)."""
        refs = self._refs[self._check(block_id)]
        if refs == 0:
            raise ValueError(f"block {block_id}: decref of a free block (double free?)")
        self._refs[block_id] = refs - 1
        if refs == 1:
            self._free._extend((block_id,))
            return True
        return False

    def decref_all(self, block_ids: Sequence[int]) -> list[int]:
        """`decref` of each block in order; those that went back to the free queue, in order."""
        refs, n, freed = self._refs, len(self._refs), []
        for block_id in block_ids:
            if not isinstance(block_id, int) or not 0 <= block_id < n or refs[block_id] == 0:
                self._free._extend(freed)  # the pool as decref one by one leaves it
                self.decref(block_id)  # raises
            refs[block_id] -= 1
            if not refs[block_id]:
                freed.append(block_id)
        self._free._extend(freed)
        return freed

    def check_invariants(self) -> None:
        """Assert that a block is in the free queue exactly when nothing references it, and no count is
        negative."""
        free = self._free.ids()
        assert len(free) == len(set(free)), f"the free queue holds a block twice: {sorted(free)}"
        for block_id, ref_count in enumerate(self._refs):
            in_free = block_id in self._free
            assert in_free == (ref_count == 0), (
                f"block {block_id} has ref_count {ref_count} but is "
                f"{'in' if in_free else 'not in'} the free queue: a block is free exactly when nothing references it")
            assert ref_count >= 0, f"block {block_id} has a negative ref_count {ref_count}"


@dataclass(frozen=True, slots=True)
class SlotResult:
    """Where to write one new token, and the copy-on-write the cache must do first (if any)."""

    block_id: int
    offset: int
    slot: int  # block_id * block_size + offset
    copy: tuple[int, int] | None = None  # (src_block, dst_block): copy src's first `offset` slots to dst


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockUsage:
    """A snapshot of the cache's occupancy, in blocks, slots (token positions) and tokens."""

    num_blocks: int
    block_size: int
    num_used_blocks: int
    num_sequences: int
    reserved_slots: int  # slots in used blocks
    used_slots: int  # physical slots holding a token (a shared block counts once)
    logical_tokens: int  # sum of sequence lengths (a shared token counts once per sequence)

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    @property
    def utilization(self) -> float:
        """Slots holding tokens / slots reserved (1.0 for an empty cache: nothing is wasted)."""
        return self.used_slots / self.reserved_slots if self.reserved_slots else 1.0

    def reserved_bytes(self, bytes_per_token: float) -> float:
        """Bytes of the reserved slots at `bytes_per_token`."""
        return self.reserved_slots * bytes_per_token

    def used_bytes(self, bytes_per_token: float) -> float:
        """Bytes of the slots holding real tokens at `bytes_per_token`."""
        return self.used_slots * bytes_per_token


class BlockManager:
    """Per-sequence block tables over a `BlockPool` (sequence ids are ints chosen by the caller).

    Also the scheduler's KV protocol (`llmperf.serving.scheduler.KVSpace`) for the simulator:
    `blocks_for`, `reserve`, `reserve_cost`, `fork_cost`, `max_seq_len`, prefix sharing.

    `state_blocks`: pool blocks each sequence holds besides its KV, whatever its length: the constant
    state of a hybrid model's Gated DeltaNet layers (vLLM's hybrid manager gives each running request
    its Mamba-style state in pages of the one pool), taken by `allocate` and `fork`, given back by
    `free`; such a state holds no prefix's keys, so nothing is shared by prefix (`cached_prefix` is 0).
    """

    #: a fork shares every block: it costs no block until one of the forks writes
    fork_cost = 0
    #: the free pool is shared by all sequences, so admission keeps a watermark for their growth
    paged = True
    #: the scheduler may share published prompt blocks between requests
    supports_prefix_sharing = True

    def __init__(self, num_blocks: int, block_size: int, *, max_seq_len: int | None = None,
                 state_blocks: int = 0) -> None:
        if not is_count(block_size) or block_size < 1:
            raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
        if not is_count(state_blocks) or state_blocks < 0:
            raise ValueError(f"state_blocks: must be a non-negative integer, got {state_blocks!r}")
        self.pool = BlockPool(num_blocks)
        self.state_blocks = state_blocks
        self._state: dict[int, list[int]] = {}  # seq id -> its state's blocks (state_blocks > 0 only)
        self._refs = self.pool._refs  # the pool's reference counts, read on the hot paths
        self.block_size = block_size
        self.max_seq_len = num_blocks * block_size if max_seq_len is None else max_seq_len
        self._tables: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}
        # Incremental statistics (usage() is O(1)): tokens in each partly filled used block (a
        # block's fill is the same for all its holders: shared blocks are never written), their
        # sum of empty slots, and the sum of sequence lengths.
        self._partial: dict[int, int] = {}
        self._gap = 0
        self._logical = 0
        # Prefix sharing: (previous block id or -1, tokens of a full block) -> block id, and back.
        self._prefix: dict[tuple[int, tuple[int, ...]], int] = {}
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}

    # --- queries ---------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    @property
    def seq_ids(self) -> list[int]:
        return list(self._tables)

    @property
    def num_seqs(self) -> int:
        return len(self._tables)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._tables

    def _table(self, seq_id: int) -> list[int]:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise ValueError(f"sequence {seq_id!r}: unknown id (known: {sorted(self._tables)})") from None

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block ids, in position order."""
        return list(self._table(seq_id))

    def seq_len(self, seq_id: int) -> int:
        """Positions reserved for the sequence (an unknown sequence raises `ValueError`)."""
        self._table(seq_id)
        return self._lens[seq_id]

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens: `ceil(num_tokens / block_size)`."""
        return -(-num_tokens // self.block_size)

    def blocks_for(self, num_tokens: int) -> int:
        """Pool blocks a sequence of `num_tokens` tokens takes: its tokens' blocks and its state's."""
        return -(-num_tokens // self.block_size) + self.state_blocks

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        """Flat physical slots of positions start..end-1 of a sequence (all already reserved)."""
        table, length = self._table(seq_id), self._lens[seq_id]
        if not 0 <= start <= end <= length:
            raise ValueError(f"slot_mapping: positions [{start}, {end}) are outside sequence {seq_id}'s "
                             f"{length} tokens")
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # --- fill bookkeeping (for the O(1) usage) ----------------------------------------------------

    def _set_fill(self, block_id: int, fill: int) -> None:
        old = self._partial.pop(block_id, None)
        if old is not None:
            self._gap -= self.block_size - old
        if 0 < fill < self.block_size:
            self._partial[block_id] = fill
            self._gap += self.block_size - fill

    def _forget(self, block_id: int) -> None:
        """A block back in the pool: forget its fill and its prefix key."""
        old = self._partial.pop(block_id, None)  # _set_fill(block_id, 0), inlined
        if old is not None:
            self._gap -= self.block_size - old
        key = self._key_of.pop(block_id, None)
        if key is not None:
            del self._prefix[key]

    # --- allocation ------------------------------------------------------------------------------

    def shared_blocks(self, num_tokens: int) -> int:
        """Blocks of a `num_tokens`-token prefix that a sequence continuing from it still holds: its full
        blocks (the scheduler's admission and worst-case counts; fewer in `CappedBlockManager`)."""
        return num_tokens // self.block_size

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of `num_tokens` tokens fits in the free blocks (no prefix shared)."""
        return self.blocks_needed(num_tokens) + self.state_blocks <= self.pool.num_free

    def _prefix_blocks(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Published blocks holding the leading full blocks of `tokens[:limit]`."""
        bs, prev, found = self.block_size, -1, []
        for i in range(min(limit, len(tokens)) // bs):
            block_id = self._prefix.get((prev, tuple(tokens[i * bs:(i + 1) * bs])))
            if block_id is None:
                break
            found.append(block_id)
            prev = block_id
        return found

    def cached_prefix(self, tokens: Sequence[int], limit: int) -> int:
        """How many leading tokens of `tokens[:limit]` are held by published blocks (a multiple of
        block_size): a new sequence with this prefix need not compute them (none with a state: it is
        kept for the sequence's end only)."""
        if self.state_blocks:
            return 0
        return len(self._prefix_blocks(tokens, limit)) * self.block_size

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        """Reserve the blocks of a new sequence's first `num_tokens` positions (its prompt, or its
        first chunk). With `prefix` (the sequence's tokens), the leading full blocks already
        published for those tokens are shared instead of allocated. False, with nothing changed,
        when there are not enough free blocks."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r}: already allocated (free it first)")
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        shared = self._prefix_blocks(prefix, num_tokens) if prefix is not None and not self.state_blocks else []
        if self.blocks_needed(num_tokens) - len(shared) + self.state_blocks > self.pool.num_free:
            return False
        for block_id in shared:
            self.pool.incref(block_id)
        fresh = self.pool.allocate_many(self.blocks_needed(num_tokens) - len(shared))
        assert fresh is not None, "the free count promised enough free blocks"
        self._install(seq_id, shared + fresh, num_tokens)
        self._take_state(seq_id)
        return True

    def _take_state(self, seq_id: int) -> None:
        """The sequence's state blocks (none without a state); ValueError when the pool is short."""
        if self.state_blocks:
            blocks = self.pool.allocate_many(self.state_blocks)
            if blocks is None:
                raise ValueError(f"sequence {seq_id!r}: {self.state_blocks} blocks for its state, "
                                 f"{self.pool.num_free} free")
            self._state[seq_id] = blocks

    def _drop_state(self, seq_id: int) -> None:
        """Give the sequence's state blocks back (they are its own: never shared, never keyed)."""
        blocks = self._state.pop(seq_id, None)
        if blocks:
            self.pool.decref_all(blocks)

    def _state_holders(self, holders: dict[int, int]) -> None:
        """Count the state blocks into `holders` (block -> entries holding it), for `check_invariants`."""
        for seq_id, blocks in self._state.items():
            assert seq_id in self._tables and len(blocks) == self.state_blocks, (
                f"sequence {seq_id} holds {len(blocks)} state blocks, expected {self.state_blocks}")
            for block_id in blocks:
                holders[block_id] = holders.get(block_id, 0) + 1

    def _install(self, seq_id: int, table: list[int], num_tokens: int) -> None:
        """A new sequence's table of its `num_tokens` tokens' blocks, and its last block's fill."""
        self._tables[seq_id] = table
        self._lens[seq_id] = num_tokens
        self._logical += num_tokens
        if table and num_tokens % self.block_size:
            self._set_fill(table[-1], num_tokens % self.block_size)

    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:
        """Make the sequence's full blocks within its first `num_computed` (already computed)
        tokens findable by `cached_prefix` / `allocate(prefix=)` (nothing with a state)."""
        table, bs, prev = self._table(seq_id), self.block_size, -1
        if self.state_blocks:
            return
        for i in range(min(num_computed, self._lens[seq_id], len(tokens)) // bs):
            key = (prev, tuple(tokens[i * bs:(i + 1) * bs]))
            known = self._prefix.get(key)
            if known is None and table[i] not in self._key_of:
                self._prefix[key] = table[i]
                self._key_of[table[i]] = key
            elif known != table[i]:
                return  # another block holds this prefix: this chain is a private copy, stop
            prev = table[i]

    def _blocks_to_append(self, seq_id: int, num_tokens: int) -> tuple[int, bool]:
        """(new blocks needed to add num_tokens positions, whether the last block must be copied first)."""
        table, length = self._table(seq_id), self._lens[seq_id]
        room = len(table) * self.block_size - length  # free slots in the last block
        cow = num_tokens > 0 and room > 0 and self.pool.refcount(table[-1]) > 1
        return self.blocks_needed(max(0, num_tokens - room)) + int(cow), cow

    def reserve_cost(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks that `reserve(seq_id, num_tokens)` would take."""
        return self._blocks_to_append(seq_id, num_tokens)[0]

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `num_tokens` more positions of the sequence fit in the free blocks."""
        return self._blocks_to_append(seq_id, num_tokens)[0] <= self.pool.num_free

    def append_slot(self, seq_id: int) -> SlotResult | None:
        """Reserve position `seq_len` for one more token. Copy-on-write when the last block has room
        but is shared: the sequence gets a private copy (`copy=(src, dst)`). None, with nothing
        changed, when a block is needed and none is free."""
        table, pos = self._table(seq_id), self._lens[seq_id]
        bs = self.block_size
        copy = None
        if pos == len(table) * bs:  # the last block is full (or there is none): open a new one
            block_id = self.pool.allocate()
            if block_id is None:
                return None
            table.append(block_id)
        elif self.pool.refcount(table[-1]) > 1:  # writing into a shared block: copy it first
            dst = self.pool.allocate()
            if dst is None:
                return None
            src = table[-1]
            self.pool.decref(src)  # still referenced by the sequences that share it: never freed here
            table[-1] = dst
            copy = (src, dst)
        self._lens[seq_id] = pos + 1
        self._logical += 1
        block_id, offset = table[pos // bs], pos % bs
        self._set_fill(block_id, offset + 1 if offset + 1 < bs else bs)
        return SlotResult(block_id=block_id, offset=offset, slot=block_id * bs + offset, copy=copy)

    def append_slots(self, seq_id: int, num_tokens: int) -> list[SlotResult] | None:
        """Reserve `num_tokens` more positions at once (a chunk of prefill, or speculative tokens):
        all of them, or None with nothing changed. Only the first result can carry a copy."""
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        if not self.can_append(seq_id, num_tokens):
            return None
        results = [self.append_slot(seq_id) for _ in range(num_tokens)]
        assert None not in results, "can_append promised enough free blocks"
        return results  # type: ignore[return-value]

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        """`append_slots` as the scheduler asks it: True, or False with nothing changed. Without a
        copy-on-write it takes the new blocks at once instead of a `SlotResult` per token (the
        simulator reserves millions of tokens); the resulting state is the same."""
        table = self._tables.get(seq_id)
        if num_tokens == 1 and table is not None:  # a decode token: the hot path, the general one's steps
            length, bs = self._lens[seq_id], self.block_size
            fill = length + 1 - (len(table) - 1) * bs  # the last block's fill after the token
            if 1 < fill <= bs and self._refs[table[-1]] == 1:
                # it was partly filled (fill - 1 tokens): one fewer empty slot, as _set_fill would count
                if fill < bs:
                    self._partial[table[-1]] = fill
                else:
                    del self._partial[table[-1]]
                self._gap -= 1
                self._lens[seq_id] = length + 1
                self._logical += 1
                return True
            if fill == bs + 1:  # the last block is full (or there is none): the token opens a new one
                block_id = self.pool.allocate()
                if block_id is None:
                    return False
                table.append(block_id)
                self._set_fill(block_id, 1)
                self._lens[seq_id] = length + 1
                self._logical += 1
                return True
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        needed, cow = self._blocks_to_append(seq_id, num_tokens)
        if cow:
            return self.append_slots(seq_id, num_tokens) is not None
        if needed > self.pool.num_free:
            return False
        table, length, bs = self._tables[seq_id], self._lens[seq_id], self.block_size
        if len(table) * bs > length:  # the partly filled last block takes what it can
            self._set_fill(table[-1], min(bs, length + num_tokens - (len(table) - 1) * bs))
        fresh = self.pool.allocate_many(needed)
        assert fresh is not None, "the free count promised enough free blocks"
        table += fresh
        end = length + num_tokens
        if needed:
            self._set_fill(table[-1], end - (len(table) - 1) * bs)
        self._lens[seq_id] = end
        self._logical += num_tokens
        return True

    def reserve_each(self, seq_ids: Sequence[int]) -> int:
        """`reserve(s, 1)` for each sequence in order, up to the first that does not fit (False for it,
        nothing changed): how many were reserved. The scheduler's decode tokens, one call a step:
        `reserve`'s hot path (a token into a partly filled last block of the sequence's own) runs
        inline, without a call a token; anything else is `reserve` itself. Each inline token takes one
        empty slot and adds one logical token: those two counts change by the number of inline tokens,
        once, before any `reserve` call (which reads and updates them) and at the end."""
        tables, lens, refs, partial, bs = self._tables, self._lens, self._refs, self._partial, self.block_size
        done = inline = 0  # tokens reserved; of them, inline ones not yet in _gap and _logical
        for seq_id in seq_ids:
            table = tables.get(seq_id)
            if table is not None:
                length = lens[seq_id]
                fill = length + 1 - (len(table) - 1) * bs  # as in reserve
                if 1 < fill <= bs and refs[table[-1]] == 1:
                    if fill < bs:
                        partial[table[-1]] = fill
                    else:
                        del partial[table[-1]]
                    lens[seq_id] = length + 1
                    inline += 1
                    continue
            self._gap -= inline
            self._logical += inline
            done += inline
            inline = 0
            if not self.reserve(seq_id, 1):
                return done
            done += 1
        self._gap -= inline
        self._logical += inline
        return done + inline

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Shorten a sequence to its first `num_tokens` positions, giving back the blocks past them
        (speculative decoding: the slots of rejected draft tokens). The last kept block must be the
        sequence's own (it was written by the step that reserved the positions dropped)."""
        self._table(seq_id)  # ValueError naming an unknown sequence
        length = self._lens[seq_id]
        if not is_count(num_tokens) or not 0 <= num_tokens <= length:
            raise ValueError(f"num_tokens: must be an integer in 0 .. {length} (sequence {seq_id}'s length), "
                             f"got {num_tokens!r}")
        self._cut(seq_id, num_tokens)

    def _cut(self, seq_id: int, num_tokens: int, held: int = 0) -> None:
        """Shorten the sequence to `num_tokens` tokens: the blocks past them back to the pool, the last
        one's fill set (`held`: the table entries before it are null, none to fill)."""
        table, length = self._tables[seq_id], self._lens[seq_id]
        keep = self.blocks_needed(num_tokens)
        if keep < len(table):
            dropped = table[keep:]
            del table[keep:]
            for block_id in self.pool.decref_all(dropped):
                self._forget(block_id)
        if len(table) > held:
            assert self._refs[table[-1]] == 1 or num_tokens == length, (
                f"sequence {seq_id}: truncating into block {table[-1]}, which other sequences share: a shared "
                "block is never written, so its fill cannot change")
            self._set_fill(table[-1], num_tokens - (len(table) - 1) * self.block_size)
        self._logical -= length - num_tokens
        self._lens[seq_id] = num_tokens

    def fork(self, parent_id: int, child_id: int) -> None:
        """A new sequence sharing all of the parent's blocks (reference counts + 1): a beam or
        another sample of the same prompt. Costs no block until one of them writes."""
        table = self._table(parent_id)
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r}: already allocated (fork into a new id)")
        self._take_state(child_id)  # a copy of the parent's state, in blocks of its own
        for block_id in table:
            self.pool.incref(block_id)
        self._tables[child_id] = list(table)
        self._lens[child_id] = self._lens[parent_id]
        self._logical += self._lens[parent_id]

    def free(self, seq_id: int) -> None:
        """Drop a sequence; its blocks return to the pool once no other sequence holds them."""
        table = self._table(seq_id)
        for block_id in self.pool.decref_all(table):  # those back in the pool: forget their fill and key
            self._forget(block_id)
        if self.state_blocks:
            self._drop_state(seq_id)
        self._logical -= self._lens[seq_id]
        del self._tables[seq_id], self._lens[seq_id]

    # --- statistics ------------------------------------------------------------------------------

    def _block_fill(self) -> dict[int, int]:
        """Slots holding a token in each used block, recounted from the tables (O(total blocks): for
        `check_invariants`; `usage()` uses the incremental counts)."""
        fill: dict[int, int] = {}
        bs = self.block_size
        for seq_id, table in self._tables.items():
            length = self._lens[seq_id]
            for i, block_id in enumerate(table):
                fill[block_id] = max(fill.get(block_id, 0), min(bs, max(0, length - i * bs)))
        return fill

    def usage(self) -> BlockUsage:
        """The pool's occupancy now: used blocks, reserved and used slots, sequences, logical tokens."""
        used, reserved = self.slot_counts()
        return BlockUsage(num_blocks=self.num_blocks, block_size=self.block_size,
                          num_used_blocks=self.num_used_blocks, num_sequences=len(self._tables),
                          reserved_slots=reserved, used_slots=used, logical_tokens=self._logical)

    def slot_counts(self) -> tuple[int, int]:
        """(used_slots, reserved_slots) of `usage()`, without building the snapshot (the simulator
        records them every step)."""
        reserved = self.num_used_blocks * self.block_size
        return reserved - self._gap, reserved

    def bytes_reserved(self, bytes_per_block: int) -> int:
        """Bytes of the used blocks at `bytes_per_block`."""
        return self.num_used_blocks * bytes_per_block

    def bytes_used(self, bytes_per_block: int) -> float:
        """Bytes of the slots holding real tokens at `bytes_per_block`."""
        return self.usage().used_slots * bytes_per_block / self.block_size

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (for tests; O(total blocks))."""
        self.pool.check_invariants()
        bs = self.block_size
        holders: dict[int, int] = {}
        fills: dict[int, set[int]] = {}
        for seq_id, table in self._tables.items():
            length = self._lens[seq_id]
            assert len(table) == self.blocks_needed(length), (
                f"sequence {seq_id} has {length} tokens in {len(table)} blocks of {bs}: a table holds exactly "
                "the blocks its tokens need")
            assert len(set(table)) == len(table), f"sequence {seq_id}'s table repeats a block: {table}"
            for i, block_id in enumerate(table):
                holders[block_id] = holders.get(block_id, 0) + 1
                fills.setdefault(block_id, set()).add(min(bs, length - i * bs))
        self._state_holders(holders)
        self._check_holders(holders, fills)

    def _check_holders(self, holders: dict[int, int], fills: dict[int, set[int]]) -> None:
        """`check_invariants`' checks past the tables: every reference a table entry (`holders`: block ->
        entries holding it), a shared block filled alike for all its holders (`fills`: block -> the token
        counts its holders see), the incremental counts, every prefix key's block live."""
        for block_id in range(self.num_blocks):
            refs = self.pool.refcount(block_id)
            assert refs == holders.get(block_id, 0), (
                f"block {block_id} has ref_count {refs} but {holders.get(block_id, 0)} tables hold it: "
                "every reference is a table entry")
        for block_id, seen in fills.items():
            assert len(seen) == 1, (
                f"block {block_id} holds {sorted(seen)} tokens depending on the sequence: a shared block is never "
                "written (copy-on-write), so all its holders see the same tokens")
        recount = sum(self._block_fill().values()) + self.block_size * self.state_blocks * len(self._state)
        assert recount == self.usage().used_slots, (  # a state block counts as full
            f"incremental used slots {self.usage().used_slots} != recounted {recount}")
        assert self._logical == sum(self._lens.values()), "incremental logical token count drifted"
        for key, block_id in self._prefix.items():
            assert self._key_of.get(block_id) == key and self.pool.refcount(block_id) > 0, (
                f"prefix table entry {key[0]}->{block_id} points at a free or re-keyed block: published "
                "blocks leave the table when freed")


@dataclass(frozen=True, slots=True)
class WindowGroup:
    """Layers of a hybrid model that keep only a span of keys (vLLM's sliding-window and
    chunked-local KV managers): `attention` sliding (the last `window` keys) or chunked (the keys of
    the current chunk of `window` tokens), `layers` of them, beside the `full_layers` full-attention
    layers whose blocks the pool's blocks are. A block of this group takes `pages` pool blocks:
    `ceil(layers / full_layers)`, the last one padded (`llmperf.specs.kvcache.pages_per_block`); where one
    of its layers stores `width` elements a token and a full one `full_width` (Gemma 4), by elements."""

    attention: str
    window: int
    layers: int
    full_layers: int
    width: int = 1
    full_width: int = 1

    def __post_init__(self) -> None:
        if self.attention not in ("sliding", "chunked"):
            raise ValueError(f"window group: attention must be sliding or chunked, got {self.attention!r}")
        for name in ("window", "layers", "full_layers", "width", "full_width"):
            v = getattr(self, name)
            if not is_count(v) or v < 1:
                raise ValueError(f"window group: {name} must be a positive integer, got {v!r}")

    def first_key(self, start: int) -> int:
        """The earliest position a step whose first new token is at `start` reads."""
        return first_key(self.attention, self.window, start)

    @property
    def pages(self) -> int:
        """Pool blocks one block of this group takes."""
        return pages_per_block(self.layers, self.full_layers, self.width, self.full_width)

    def units(self, blocks: int) -> int:
        """Pool blocks that `blocks` blocks of this group take."""
        return self.pages * blocks


@dataclass(frozen=True)
class HybridLayout:
    """Which layers page together in a hybrid pool: the `full` layers (their blocks are the pool's
    blocks: one block of `len(full)` layers) and, for each window group, its layers in order; the
    j-th layer of a group lives in its sub-group `j // len(full)` at the pool's layer slot
    `j % len(full)` (vLLM's KV-cache groups of one size, each pool tensor shared by one layer of every
    group: `vllm/v1/core/kv_cache_utils.py`)."""

    full: tuple[int, ...]
    groups: tuple[WindowGroup, ...]
    members: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, kinds: Sequence[tuple[str, int | None]]) -> HybridLayout | None:
        """The layout of layers of these (attention, window) kinds, in layer order; None when they
        do not page apart: no sliding or chunked layer, or no full-attention layer (every layer then
        takes full pages, the simulator's `kv_sliding_full_pages`). Linear (Gated DeltaNet) layers hold
        no KV: they are no part of it (their indices are skipped; their state is `state_blocks`)."""
        full = tuple(i for i, (a, _) in enumerate(kinds) if a == "full")
        by_kind: dict[tuple[str, int], list[int]] = {}
        for i, (a, w) in enumerate(kinds):
            if a not in ("full", "linear", "none"):
                by_kind.setdefault((a, w), []).append(i)  # type: ignore[arg-type]
        if not full or not by_kind:
            return None
        groups = tuple(WindowGroup(attention=a, window=w, layers=len(ids), full_layers=len(full))
                       for (a, w), ids in by_kind.items())
        return cls(full=full, groups=groups, members=tuple(tuple(ids) for ids in by_kind.values()))

    def address(self, layer: int) -> tuple[int, int]:
        """(table, pool layer slot) of `layer`: table 0 is the full layers', then each group's
        sub-groups in order (`tables` of them in all)."""
        if layer in self.full:
            return 0, self.full.index(layer)
        table, F = 1, len(self.full)
        for g, ids in zip(self.groups, self.members):
            if layer in ids:
                j = ids.index(layer)
                return table + j // F, j % F
            table += g.pages
        raise ValueError(f"layer: {layer} is not one of the model's {self.num_layers} layers")

    @property
    def num_layers(self) -> int:
        return len(self.full) + sum(len(ids) for ids in self.members)

    @property
    def tables(self) -> int:
        """Block tables per sequence: the full layers' and one per sub-group."""
        return 1 + sum(g.pages for g in self.groups)


def window_blocks_for(groups: Sequence[WindowGroup], block_size: int, num_tokens: int,
                      max_step_tokens: int | None = None) -> int:
    """Pool blocks a sequence of up to `num_tokens` tokens holds at most when its steps put at most
    `max_step_tokens` new tokens through (None: any number): its full layers' blocks, and for each
    window group the blocks covering what one step reads (its window or chunk before the step's
    first token, and the step's tokens)."""
    full = -(-num_tokens // block_size)
    step = num_tokens if max_step_tokens is None else min(num_tokens, max_step_tokens)
    extra = 0
    for g in groups:
        span = -(-(step + g.window - 1) // block_size) + 1  # the keys read may straddle one more block
        extra += g.units(min(full, span))
    return full + extra


class _Held:
    """One window group's blocks of one sequence: `entries[k]` holds logical block `first + k`, one
    pool block per sub-group (a tuple of `pages` ids); the blocks before `first` were given back."""

    __slots__ = ("entries", "first")

    def __init__(self, first: int = 0, entries: Sequence[tuple[int, ...]] = ()) -> None:
        self.first = first
        self.entries: deque[tuple[int, ...]] = deque(entries)

    @property
    def end(self) -> int:
        return self.first + len(self.entries)


def _reserve_in_order(manager: BlockManager, seq_ids: Sequence[int]) -> int:
    """`manager.reserve(s, 1)` for each sequence in order, up to the first that does not fit: how many
    were reserved (the managers whose `reserve` gives blocks back first, one sequence at a time)."""
    for done, seq_id in enumerate(seq_ids):
        if not manager.reserve(seq_id, 1):
            return done
    return len(seq_ids)


class WindowedBlockManager(BlockManager):
    """The paged KV of a model whose layers keep different spans of keys, as vLLM's hybrid KV-cache
    manager keeps it (`vllm/v1/core/kv_cache_manager.py`, `single_type_kv_cache_manager.py`:
    `FullAttentionManager`, `SlidingWindowManager`, `ChunkedLocalAttentionManager`; one shared block
    pool). The block tables, prefix sharing and copy-on-write of `BlockManager` are the full-attention
    layers'. Each `WindowGroup` keeps, per sequence, its own table of logical blocks, each a tuple of
    `pages` pool blocks (one per sub-group: `HybridLayout`), of which it holds only those covering the
    keys the sequence's next step reads: when the sequence grows (`allocate`, `reserve`,
    `append_slots`), the blocks wholly before the step's first key (its window, or its chunk, from the
    step's first new token) go back to the pool first (vLLM's `remove_skipped_blocks`), and their
    table entries become null (`window_table`).

    Forks share every held block (reference counts); the first write into a shared partly filled
    block copies it (`take_copies`, when built with `record_copies`). Prefix sharing: a group's
    full, computed blocks are published under the key of the full layers' block at the same position
    (which names the whole prefix exactly); a new sequence takes `h` prefix blocks only when every
    group still holds, published, the blocks its first step reads (vLLM's sliding-window prefix hit).

    Block counts: `num_used_blocks` is the pool's; `usage()` counts a window block as full;
    `slot_usage()` gives the slots holding tokens per group, exactly."""

    def __init__(self, num_blocks: int, block_size: int, *, groups: Sequence[WindowGroup],
                 max_seq_len: int | None = None, max_step_tokens: int | None = None,
                 record_copies: bool = False, state_blocks: int = 0) -> None:
        super().__init__(num_blocks, block_size, max_seq_len=max_seq_len, state_blocks=state_blocks)
        if not groups:
            raise ValueError("window groups: give at least one (else use BlockManager)")
        self.groups = tuple(groups)
        self._plain = tuple((g.attention == "sliding", g.window) for g in self.groups)
        self.max_step_tokens = max_step_tokens
        self._held: dict[int, list[_Held]] = {}
        self._window_blocks = 0  # pool blocks the window groups hold, all sequences (a shared one once)
        # Prefix sharing per group: key of the full layers' block at the same position -> entry, and back.
        self._wprefix: list[dict[tuple[int, tuple[int, ...]], tuple[int, ...]]] = [{} for _ in self.groups]
        self._wkey_of: list[dict[int, tuple[int, tuple[int, ...]]]] = [{} for _ in self.groups]
        self._record = record_copies
        self._copies: list[tuple[int, int, int]] = []

    # --- queries ---------------------------------------------------------------------------------

    def blocks_for(self, num_tokens: int) -> int:  # type: ignore[override]
        """Pool blocks a sequence of `num_tokens` tokens takes at most (`window_blocks_for`, and its state's)."""
        return window_blocks_for(self.groups, self.block_size, num_tokens, self.max_step_tokens) + self.state_blocks

    def window_blocks(self, seq_id: int) -> list[int]:
        """Pool blocks each window group holds for the sequence."""
        self._table(seq_id)
        return [g.units(len(h.entries)) for g, h in zip(self.groups, self._held[seq_id])]

    def window_table(self, seq_id: int, group: int) -> list[tuple[int, ...] | None]:
        """Group `group`'s table of the sequence: per logical block up to its length, the pool blocks
        of its sub-groups, or None where the block was given back."""
        self._table(seq_id)
        held = self._held[seq_id][group]
        return [None] * held.first + list(held.entries)

    def window_slot_mapping(self, seq_id: int, group: int, sub: int, start: int, end: int) -> list[int]:
        """Flat slots of positions start..end-1 in sub-group `sub` of window group `group` (all held)."""
        held, bs = self._held[seq_id][group], self.block_size
        if not held.first * bs <= start <= end <= min(self._lens[seq_id], held.end * bs):
            raise ValueError(f"window_slot_mapping: positions [{start}, {end}) are not all held by group {group} "
                             f"of sequence {seq_id} (blocks {held.first}..{held.end - 1})")
        entries, first = held.entries, held.first
        return [entries[p // bs - first][sub] * bs + p % bs for p in range(start, end)]

    def take_copies(self) -> list[tuple[int, int, int]]:
        """The copy-on-writes since the last call, `(src, dst, slots)`: copy src's first `slots` slots
        into dst (every layer slot of the pool) before this step writes (`record_copies` only)."""
        out, self._copies = self._copies, []
        return out

    def slot_usage(self) -> tuple[int, list[int]]:
        """(slots holding tokens in the full layers' blocks, the same for each window group): a block
        shared by forks counts once. O(held window blocks)."""
        full = self.usage().used_slots - (self._window_blocks + self.state_blocks * len(self._state)) * self.block_size
        out = []
        bs = self.block_size
        for gi in range(len(self.groups)):
            fill: dict[int, int] = {}
            for seq_id, groups in self._held.items():
                held, length = groups[gi], self._lens[seq_id]
                for k, entry in enumerate(held.entries):
                    fill[entry[0]] = max(fill.get(entry[0], 0), min(bs, length - (held.first + k) * bs))
            out.append(sum(fill.values()))
        return full, out

    # --- window bookkeeping ------------------------------------------------------------------------

    def _span(self, g: WindowGroup, start: int, end: int) -> tuple[int, int]:
        """Logical blocks [first, last) group `g` must hold for a step writing positions start..end-1."""
        return g.first_key(start) // self.block_size, -(-end // self.block_size)

    def _wrelease(self, gi: int, entry: tuple[int, ...]) -> None:
        for block_id in entry:
            self.pool.decref(block_id)
        if self.pool.refcount(entry[0]) == 0:  # the sub-groups' blocks have the same holders
            self._window_blocks -= len(entry)
            key = self._wkey_of[gi].pop(entry[0], None)
            if key is not None:
                del self._wprefix[gi][key]

    def _wallocate(self, pages: int) -> tuple[int, ...]:
        entry = tuple(self.pool.allocate() for _ in range(pages))
        assert None not in entry, "the free count promised enough free blocks"
        self._window_blocks += pages
        return entry  # type: ignore[return-value]

    def _trim(self, seq_id: int, start: int) -> None:
        """Give back each group's blocks wholly before the first key a step starting at `start` reads."""
        bs = self.block_size
        for gi, (g, held) in enumerate(zip(self.groups, self._held[seq_id])):
            first = g.first_key(start) // bs
            while held.first < first and held.entries:
                self._wrelease(gi, held.entries.popleft())
                held.first += 1
            if not held.entries:
                held.first = max(held.first, first)

    def _window_cost(self, seq_id: int, start: int, end: int) -> int:
        """Free blocks the window groups take for a step writing start..end-1 (after the trim)."""
        cost, bs = 0, self.block_size
        for g, held in zip(self.groups, self._held[seq_id]):
            first, last = self._span(g, start, end)
            have = max(held.end, first)
            cost += g.units(max(0, last - have))
            if end > start and start % bs and held.first <= start // bs < held.end \
                    and self.pool.refcount(held.entries[start // bs - held.first][0]) > 1:
                cost += g.pages  # copy-on-write of the shared block being written
        return cost

    def _grow(self, seq_id: int, start: int, end: int) -> None:
        """Copy a shared block the step writes into, then take each group's new blocks up to `end`."""
        bs = self.block_size
        for gi, (g, held) in enumerate(zip(self.groups, self._held[seq_id])):
            first, last = self._span(g, start, end)
            k = start // bs - held.first
            if end > start and start % bs and 0 <= k < len(held.entries) \
                    and self.pool.refcount(held.entries[k][0]) > 1:
                src = held.entries[k]
                dst = self._wallocate(g.pages)
                self._wrelease(gi, src)  # still held by the sequences that share it
                held.entries[k] = dst
                if self._record:
                    self._copies.extend((s, d, start % bs) for s, d in zip(src, dst))
            if not held.entries:
                held.first = max(held.first, first)
            while held.end < last:
                held.entries.append(self._wallocate(g.pages))

    def _reserve_full(self, seq_id: int, num_tokens: int) -> None:
        """The full layers' slots (room already checked), recording a copy-on-write."""
        if self._blocks_to_append(seq_id, num_tokens)[1]:
            results = [BlockManager.append_slot(self, seq_id) for _ in range(num_tokens)]
            copy = results[0].copy  # type: ignore[union-attr]
            if self._record and copy is not None:
                self._copies.append((copy[0], copy[1], results[0].offset))  # type: ignore[union-attr]
            return
        ok = BlockManager.reserve(self, seq_id, num_tokens)
        assert ok, "the free count promised enough free blocks"

    # --- prefix sharing ----------------------------------------------------------------------------

    def _hybrid_prefix(self, tokens: Sequence[int], limit: int) -> tuple[int, list[list[tuple[int, ...]]]]:
        """(h, each group's published entries for the blocks its first step reads): the longest
        prefix of `h` published full blocks for which every group still holds those entries."""
        found = self._prefix_blocks(tokens, limit)
        keys = [self._key_of[b] for b in found]
        bs = self.block_size
        # Each group's entry for every found block, looked up once, and a running count of the
        # missing ones: a prefix of h blocks is held when none is missing in the blocks its first
        # step reads (from first_key(h * bs) on), a difference of two counts, not a walk of the
        # window for every h (a 2000-token system prompt took 90% of a Gemma 3 simulation so).
        looked = []
        for gi, g in enumerate(self.groups):
            got = [self._wprefix[gi].get(k) for k in keys]
            missing = [0]
            for e in got:
                missing.append(missing[-1] + (e is None))
            looked.append((g, got, missing))
        for h in range(len(found), 0, -1):
            if all(missing[h] == missing[g.first_key(h * bs) // bs] for g, _, missing in looked):
                return h, [got[g.first_key(h * bs) // bs:h] for g, got, _ in looked]  # type: ignore[misc]
        return 0, [[] for _ in self.groups]

    def cached_prefix(self, tokens: Sequence[int], limit: int) -> int:
        """Leading tokens of `tokens[:limit]` every group holds, published (a multiple of block_size)."""
        if self.state_blocks:
            return 0
        return self._hybrid_prefix(tokens, limit)[0] * self.block_size

    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:
        """As `BlockManager.publish`, each group's held full blocks published under the same keys."""
        super().publish(seq_id, tokens, num_computed)
        table = self._tables[seq_id]
        for i in range(min(num_computed, self._lens[seq_id], len(tokens)) // self.block_size):
            key = self._key_of.get(table[i])
            if key is None or self._prefix.get(key) != table[i]:
                return  # a private copy of a published prefix: not published (as the full layers')
            for gi, held in enumerate(self._held[seq_id]):
                if held.first <= i < held.end:
                    entry = held.entries[i - held.first]
                    if key not in self._wprefix[gi] and entry[0] not in self._wkey_of[gi]:
                        self._wprefix[gi][key] = entry
                        self._wkey_of[gi][entry[0]] = key

    # --- allocation ------------------------------------------------------------------------------

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of `num_tokens` tokens fits in the free blocks (no prefix shared)."""
        return self.blocks_needed(num_tokens) + self.state_blocks + sum(
            g.units(-(-num_tokens // self.block_size)) for g in self.groups) <= self.pool.num_free

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        """As `BlockManager.allocate`, also taking each group's blocks for the first step (those of a
        shared prefix by reference); False, with nothing changed, when they do not fit."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r}: already allocated (free it first)")
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        # At most num_tokens - 1 shared: the step computes the last token at least (its logits are
        # needed), as the scheduler's `cached_prefix(prompt, stop - 1)`; a block shared beyond what the
        # step computes from would leave a window group without the keys its first queries read.
        h, shared = (self._hybrid_prefix(prefix, num_tokens - 1) if prefix is not None and num_tokens
                     and not self.state_blocks else (0, [[]] * len(self.groups)))
        start, bs = h * self.block_size, self.block_size
        spans = [self._span(g, start, num_tokens) for g in self.groups]
        fresh = sum(g.units(max(0, last - max(first, h))) for g, (first, last) in zip(self.groups, spans))
        if self.blocks_needed(num_tokens) - h + fresh + self.state_blocks > self.pool.num_free:
            return False
        ok = super().allocate(seq_id, num_tokens, None if prefix is None else list(prefix[:h * bs]))
        assert ok, "the free count promised enough free blocks"
        groups = []
        for gi, (g, (first, last), entries) in enumerate(zip(self.groups, spans, shared)):
            for entry in entries:
                for block_id in entry:
                    self.pool.incref(block_id)
            held = _Held(first, entries)
            while held.end < last:
                held.entries.append(self._wallocate(g.pages))
            groups.append(held)
        self._held[seq_id] = groups
        return True

    def reserve_cost(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks that `reserve(seq_id, num_tokens)` would take, the window groups' included."""
        length = self.seq_len(seq_id)
        return super().reserve_cost(seq_id, num_tokens) + self._window_cost(seq_id, length, length + num_tokens)

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `num_tokens` more positions fit, the window groups' blocks included."""
        return self.reserve_cost(seq_id, num_tokens) <= self.pool.num_free

    def _extend(self, seq_id: int, num_tokens: int) -> bool:
        """Trim what left the windows, then take the step's blocks in every group (all or none)."""
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        length = self.seq_len(seq_id)
        self._trim(seq_id, length)  # what fell out of the window goes back first
        if self.reserve_cost(seq_id, num_tokens) > self.pool.num_free:
            return False
        self._reserve_full(seq_id, num_tokens)
        self._grow(seq_id, length, length + num_tokens)
        return True

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        """As `BlockManager.reserve`, also taking the window groups' new blocks and giving back those
        that left the window; False, with only what left the window given back, when short."""
        held = self._held.get(seq_id)
        if num_tokens == 1 and held is not None:  # a decode token: the hot path
            length, bs = self._lens[seq_id], self.block_size
            last = length // bs + 1  # blocks up to and including position `length`
            for (sliding, window), h in zip(self._plain, held):
                first = (length - window + 1 if length >= window else 0) if sliding else length - length % window
                if h.first != first // bs or h.end != last or (
                        length % bs and self._refs[h.entries[-1][0]] > 1):
                    break
            else:  # every window group keeps its blocks: only the full layers may need one
                table = self._tables[seq_id]
                if length == len(table) * bs or self._refs[table[-1]] == 1:
                    # no copy-on-write (the last block is full, or the sequence's own): the steps below
                    # are `BlockManager.reserve`'s decode-token paths, without the cost counted twice
                    return BlockManager.reserve(self, seq_id, 1)
                if self._blocks_to_append(seq_id, 1)[0] > self.pool.num_free:
                    return False
                self._reserve_full(seq_id, 1)
                return True
        return self._extend(seq_id, num_tokens)

    def reserve_each(self, seq_ids: Sequence[int]) -> int:
        """`reserve(s, 1)` for each sequence in order, up to the first that does not fit: how many were
        reserved."""
        return _reserve_in_order(self, seq_ids)

    def append_slots(self, seq_id: int, num_tokens: int) -> list[SlotResult] | None:
        """The full layers' slots (`BlockManager.append_slots`, copy-on-write included) after the window
        groups' blocks are taken as `reserve` takes them: all of them, or None with only what fell out
        of the windows given back."""
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        length = self.seq_len(seq_id)
        self._trim(seq_id, length)
        if self.reserve_cost(seq_id, num_tokens) > self.pool.num_free:
            return None
        results = [BlockManager.append_slot(self, seq_id) for _ in range(num_tokens)]
        copy = results[0].copy if results else None  # type: ignore[union-attr]
        if self._record and copy is not None:
            self._copies.append((copy[0], copy[1], results[0].offset))  # type: ignore[union-attr]
        self._grow(seq_id, length, length + num_tokens)
        return results  # type: ignore[return-value]

    def append_slot(self, seq_id: int) -> SlotResult | None:
        """One more position of the sequence (`append_slots` of one), or None with nothing changed."""
        results = self.append_slots(seq_id, 1)
        return None if results is None else results[0]

    def fork(self, parent_id: int, child_id: int) -> None:
        """As `BlockManager.fork`, the window groups' blocks shared too."""
        super().fork(parent_id, child_id)
        for held in self._held[parent_id]:
            for entry in held.entries:
                for block_id in entry:
                    self.pool.incref(block_id)
        self._held[child_id] = [_Held(h.first, h.entries) for h in self._held[parent_id]]

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Not supported: a window group may already have given back the blocks a shorter sequence
        reads (speculative decoding is simulated with full pages, kv_window "full")."""
        raise ValueError(f"truncate: the windowed pool cannot shorten sequence {seq_id} (speculative decoding "
                         "needs kv_window full)")

    def free(self, seq_id: int) -> None:
        """As `BlockManager.free`, the window groups' blocks given back too."""
        super().free(seq_id)
        for gi, held in enumerate(self._held.pop(seq_id)):
            for entry in held.entries:
                self._wrelease(gi, entry)

    def check_invariants(self) -> None:
        """Every pool reference is a table entry or a window group's block; a group's blocks cover
        its span; the prefix tables point at live blocks."""
        self.pool.check_invariants()
        holders: dict[int, int] = {}
        window_ids: set[int] = set()
        bs = self.block_size
        for seq_id, table in self._tables.items():
            length = self._lens[seq_id]
            assert len(table) == self.blocks_needed(length), f"sequence {seq_id}'s table size"
            for block_id in table:
                holders[block_id] = holders.get(block_id, 0) + 1
            for g, held in zip(self.groups, self._held[seq_id]):
                assert held.end == -(-length // bs) or not held.entries, (
                    f"sequence {seq_id}: a window group holds blocks {held.first}..{held.end - 1} of "
                    f"{-(-length // bs)}: it holds up to the sequence's last block")
                for entry in held.entries:
                    assert len(entry) == g.pages, f"sequence {seq_id}: an entry {entry} of {g.pages} pages"
                    for block_id in entry:
                        holders[block_id] = holders.get(block_id, 0) + 1
                        window_ids.add(block_id)
        self._state_holders(holders)
        assert len(window_ids) == self._window_blocks, (
            f"window groups hold {len(window_ids)} pool blocks, counted {self._window_blocks}")
        assert sum(self._block_fill().values()) == self.slot_usage()[0], "incremental used slots drifted"
        for block_id in range(self.num_blocks):
            refs = self.pool.refcount(block_id)
            assert refs == holders.get(block_id, 0), (
                f"block {block_id} has ref_count {refs} but {holders.get(block_id, 0)} holders: every reference "
                "is a table entry or a window group's block")
        for gi in range(len(self.groups)):
            for key, entry in self._wprefix[gi].items():
                assert self._wkey_of[gi].get(entry[0]) == key and self.pool.refcount(entry[0]) > 0, (
                    f"group {gi}'s prefix entry {entry} is free or re-keyed")
                assert key in self._prefix, f"group {gi} publishes under a key the full layers dropped: {key}"


def uniform_window(kinds: Sequence[tuple[str, int | None]]) -> tuple[str, int] | None:
    """The one (attention, window) of layers of these kinds when every layer is sliding, or every one
    chunked, with one window (Mistral 7B v0.1, a StreamingLLM model): then `CappedBlockManager` pages
    them; None otherwise (a full-attention layer, or windows of several kinds or sizes)."""
    distinct = set(kinds)
    if len(distinct) != 1:
        return None
    attention, window = distinct.pop()
    return (attention, window) if attention in ("sliding", "chunked") and window else None  # type: ignore[return-value]


def capped_blocks_for(window: int, block_size: int, num_tokens: int, max_step_tokens: int | None = None) -> int:
    """Blocks a sequence of up to `num_tokens` tokens holds at most in a `CappedBlockManager` whose
    steps put at most `max_step_tokens` new tokens through (None: any number): those covering what one
    step reads, its window or chunk before the step's first token and the step's tokens (one more
    when they straddle a block boundary), never more than the whole context's."""
    full = -(-num_tokens // block_size)
    step = num_tokens if max_step_tokens is None else min(num_tokens, max_step_tokens)
    return min(full, -(-(step + window - 1) // block_size) + 1)


class CappedBlockManager(BlockManager):
    """The paged KV of a model whose every layer keeps one span of keys, all sliding or all chunked
    with one `window` (Mistral 7B v0.1; StreamingLLM, `llmperf.specs.streaming`): one table for every
    layer, as `BlockManager`'s, of which a sequence holds only the blocks its next step reads. When it
    grows (`allocate`, `reserve`, `append_slots`) the blocks wholly before the step's first key go back
    to the pool first (vLLM's `SlidingWindowManager.remove_skipped_blocks`) and their table entries
    become None, the null marker (`block_table`; the engine reads block 0 there, keys its masks hide).
    A sequence holds at most `blocks_for(num_tokens)` blocks (`capped_blocks_for`).

    Forks share every held block, copy-on-write as `BlockManager`. Prefix sharing keys a block by its
    previous block and its tokens, as `BlockManager`: a sequence publishes up to its first null entry,
    a key whose previous block went back to the pool is dropped with it (its chain no longer names the
    prefix), and a new sequence sharing `h` blocks takes by reference only those its first step reads
    (from `first_key(h * block_size)`). `truncate` keeps at least what the next step reads."""

    def __init__(self, num_blocks: int, block_size: int, *, window: int, attention: str = "sliding",
                 max_seq_len: int | None = None, max_step_tokens: int | None = None) -> None:
        super().__init__(num_blocks, block_size, max_seq_len=max_seq_len)
        if attention not in ("sliding", "chunked"):
            raise ValueError(f"attention: must be sliding or chunked, got {attention!r}")
        if not is_count(window) or window < 1:
            raise ValueError(f"window: must be a positive integer, got {window!r}")
        self.attention, self.window, self.max_step_tokens = attention, window, max_step_tokens
        self._first: dict[int, int] = {}  # seq id -> its first held block (the entries before are None)
        self._children: dict[int, list[tuple[int, tuple[int, ...]]]] = {}  # block id -> keys chained from it

    def blocks_for(self, num_tokens: int) -> int:  # type: ignore[override]
        """Blocks a sequence of `num_tokens` tokens holds at most (`capped_blocks_for`)."""
        return capped_blocks_for(self.window, self.block_size, num_tokens, self.max_step_tokens)

    def shared_blocks(self, num_tokens: int) -> int:
        """Blocks of a `num_tokens`-token prefix that a sequence continuing from it still holds: its full
        blocks from the first the next step reads (the scheduler's admission and worst-case counts)."""
        return max(0, num_tokens // self.block_size - self._first_needed(num_tokens))

    def first_block(self, seq_id: int) -> int:
        """The sequence's first held block: its table entries before it are None."""
        self._table(seq_id)
        return self._first[seq_id]

    def _first_needed(self, start: int) -> int:
        """The first block a step whose first new token is at `start` reads."""
        return first_key(self.attention, self.window, start) // self.block_size

    def _trim(self, seq_id: int) -> None:
        """Give back the sequence's blocks wholly before the first key its next step reads."""
        first, held = self._first_needed(self._lens[seq_id]), self._first[seq_id]
        if first <= held:
            return
        table = self._tables[seq_id]
        dropped = table[held:first]
        table[held:first] = [None] * (first - held)  # type: ignore[list-item]
        self._first[seq_id] = first
        for block_id in self.pool.decref_all(dropped):
            self._forget(block_id)

    def _forget(self, block_id: int) -> None:
        """As `BlockManager._forget`, also dropping the keys chained from the block: once its id is
        reused, `(its id, tokens)` would name another prefix."""
        super()._forget(block_id)
        for key in self._children.pop(block_id, ()):
            child = self._prefix.pop(key, None)
            if child is not None:
                del self._key_of[child]

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        """As `BlockManager.slot_mapping`, the positions all in held blocks."""
        if start < end and start < self.first_block(seq_id) * self.block_size:
            raise ValueError(f"slot_mapping: positions [{start}, {end}) of sequence {seq_id} start before its "
                             f"first held block {self._first[seq_id]}")
        return super().slot_mapping(seq_id, start, end)

    # --- allocation ------------------------------------------------------------------------------

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        """As `BlockManager.allocate`; of a shared prefix of `h` blocks (at most `num_tokens - 1` tokens,
        as the scheduler's `cached_prefix(prompt, stop - 1)`: the step computes its last token at
        least) only the blocks the first step reads are taken, the others None."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r}: already allocated (free it first)")
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        found = self._prefix_blocks(prefix, num_tokens - 1) if prefix is not None and num_tokens else []
        h = len(found)
        first = self._first_needed(h * self.block_size)
        fresh_count = self.blocks_needed(num_tokens) - h
        if fresh_count > self.pool.num_free:
            return False
        for block_id in found[first:]:
            self.pool.incref(block_id)
        fresh = self.pool.allocate_many(fresh_count)
        assert fresh is not None, "the free count promised enough free blocks"
        table: list[int] = [None] * first + found[first:] + fresh  # type: ignore[list-item]  # first <= h
        self._install(seq_id, table, num_tokens)
        self._first[seq_id] = first
        return True

    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:
        """As `BlockManager.publish`, up to the sequence's first null entry (the chain needs every
        previous block)."""
        table, bs, prev = self._table(seq_id), self.block_size, -1
        for i in range(min(num_computed, self._lens[seq_id], len(tokens)) // bs):
            block_id = table[i]
            if block_id is None:
                return
            key = (prev, tuple(tokens[i * bs:(i + 1) * bs]))
            known = self._prefix.get(key)
            if known is None and block_id not in self._key_of:
                self._prefix[key] = block_id
                self._key_of[block_id] = key
                if prev >= 0:
                    self._children.setdefault(prev, []).append(key)
            elif known != block_id:
                return
            prev = block_id

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        """As `BlockManager.reserve`, after giving back what left the window (given back even when
        the new blocks do not fit: no later step reads them)."""
        self._table(seq_id)
        self._trim(seq_id)
        return super().reserve(seq_id, num_tokens)

    def reserve_each(self, seq_ids: Sequence[int]) -> int:
        """`reserve(s, 1)` for each sequence in order, up to the first that does not fit: how many were
        reserved."""
        return _reserve_in_order(self, seq_ids)

    def append_slots(self, seq_id: int, num_tokens: int) -> list[SlotResult] | None:
        """As `BlockManager.append_slots`, after giving back what left the window (once, before the
        step: its own queries read the keys before its first token)."""
        if not is_count(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        self._table(seq_id)
        self._trim(seq_id)
        if not self.can_append(seq_id, num_tokens):
            return None
        results = [BlockManager.append_slot(self, seq_id) for _ in range(num_tokens)]
        assert None not in results, "can_append promised enough free blocks"
        return results  # type: ignore[return-value]

    def append_slot(self, seq_id: int) -> SlotResult | None:
        """As `BlockManager.append_slot`, after giving back what left the window."""
        self._table(seq_id)
        self._trim(seq_id)
        return BlockManager.append_slot(self, seq_id)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """As `BlockManager.truncate`, down to where the next step still finds its window held: a
        shorter sequence whose next step would read a block already given back raises `ValueError`."""
        self._table(seq_id)  # ValueError naming an unknown sequence
        length = self._lens[seq_id]
        if not is_count(num_tokens) or not 0 <= num_tokens <= length:
            raise ValueError(f"num_tokens: must be an integer in 0 .. {length} (sequence {seq_id}'s length), "
                             f"got {num_tokens!r}")
        held = self._first[seq_id]
        if self._first_needed(num_tokens) < held:
            raise ValueError(f"truncate: sequence {seq_id} gave back its blocks before block {held}; at {num_tokens} "
                             "tokens its next step would read them")
        self._cut(seq_id, num_tokens, held)  # keeps >= held blocks: first_needed(n) <= n // block_size

    def fork(self, parent_id: int, child_id: int) -> None:
        """As `BlockManager.fork`: the child shares the parent's held blocks and its null entries."""
        table = self._table(parent_id)
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r}: already allocated (fork into a new id)")
        held = self._first[parent_id]
        for block_id in table[held:]:
            self.pool.incref(block_id)
        self._tables[child_id] = list(table)
        self._lens[child_id] = self._lens[parent_id]
        self._first[child_id] = held
        self._logical += self._lens[parent_id]

    def free(self, seq_id: int) -> None:
        """As `BlockManager.free`: its held blocks return to the pool once no other sequence holds them."""
        table = self._table(seq_id)
        for block_id in self.pool.decref_all(table[self._first[seq_id]:]):
            self._forget(block_id)
        self._logical -= self._lens[seq_id]
        del self._tables[seq_id], self._lens[seq_id], self._first[seq_id]

    # --- statistics ------------------------------------------------------------------------------

    def _block_fill(self) -> dict[int, int]:
        fill: dict[int, int] = {}
        bs = self.block_size
        for seq_id, table in self._tables.items():
            length, held = self._lens[seq_id], self._first[seq_id]
            for i in range(held, len(table)):
                fill[table[i]] = max(fill.get(table[i], 0), min(bs, max(0, length - i * bs)))
        return fill

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent: null entries exactly before each sequence's first held
        block, every reference a held entry, a shared block filled alike for all holders, every prefix
        key's block and previous block live."""
        self.pool.check_invariants()
        bs = self.block_size
        holders: dict[int, int] = {}
        fills: dict[int, set[int]] = {}
        for seq_id, table in self._tables.items():
            length, held = self._lens[seq_id], self._first[seq_id]
            assert len(table) == self.blocks_needed(length), (
                f"sequence {seq_id} has {length} tokens in {len(table)} table entries of {bs}: a table has an "
                "entry for every block its tokens need")
            assert held <= self._first_needed(length), (
                f"sequence {seq_id} gave back block {held - 1}, which a step at its {length} tokens reads")
            assert all(b is None for b in table[:held]) and None not in table[held:], (
                f"sequence {seq_id}'s table {table}: entries are None exactly before its first held block {held}")
            assert len(set(table[held:])) == len(table) - held, f"sequence {seq_id}'s table repeats a block: {table}"
            for i in range(held, len(table)):
                holders[table[i]] = holders.get(table[i], 0) + 1
                fills.setdefault(table[i], set()).add(min(bs, length - i * bs))
        self._check_holders(holders, fills)
        for key, block_id in self._prefix.items():
            assert key[0] == -1 or self.pool.refcount(key[0]) > 0, (
                f"prefix key {key[0]}->{block_id} chains from a block back in the pool: its id may name another "
                "prefix")


__all__ = ["Block", "BlockManager", "BlockPool", "BlockUsage", "CappedBlockManager", "FreeBlockQueue", "HybridLayout",
           "SlotResult", "WindowGroup", "WindowedBlockManager", "capped_blocks_for", "uniform_window",
           "window_blocks_for"]
