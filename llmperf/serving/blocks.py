"""The paged KV cache's bookkeeping: which physical blocks each sequence's tokens live in. No torch.

PagedAttention (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023) stores a sequence's keys and values in fixed-size blocks of `block_size`
token slots, found through a per-sequence block table, so a sequence reserves at most one partly
filled block instead of `max_seq_len` slots. Sequences forked from one another (beams, several samples
of one prompt) share blocks under reference counts; the first write into a shared block copies it
(copy-on-write). Layered like vLLM's KV-cache manager (`vllm/v1/core/block_pool.py`,
`kv_cache_utils.py`): block record -> free queue -> pool -> per-sequence manager.

The engine's `llmperf/engine/cache.py` owns the tensors `(num_blocks, block_size, H_kv, D)` and performs
the data copies this module asks for; everything here is python ints, so the scheduler
(`llmperf.serving.scheduler`) drives this manager directly in the simulator and through the engine's
paged cache in the real engine: one bookkeeping for both.

Prefix sharing (vLLM's automatic prefix caching, block granularity): a *full* block whose tokens
have been computed can be published under a key `(previous block id, its tokens)`; a new sequence
whose prompt starts with the same tokens takes those blocks by reference (`allocate(..., prefix=)`).
Keys chain through the previous block's id, so equal keys mean equal whole prefixes, exactly (no
hash collisions). Full blocks are never written again (copy-on-write only ever copies a partly
filled last block), so sharing them is safe. Only live blocks are shared: a block leaves the prefix
table when its last holder frees it (vLLM also keeps freed blocks findable until reuse; we do not).

Public API (engine-core builds on it; keep stable):

    BlockPool(num_blocks)
        .allocate() -> int | None          (None: no free block, an expected shortage)
        .incref(block_id)   .decref(block_id) -> bool (True when the block went back to the free queue)
        .refcount(block_id) -> int   .num_free   .num_used   .num_blocks   .check_invariants()
    SlotResult(block_id, offset, slot, copy)   copy: (src_block, dst_block) | None
    BlockUsage(...)  counts, .utilization, .reserved_bytes(bytes_per_token), .used_bytes(bytes_per_token)
    BlockManager(num_blocks, block_size)
        .blocks_needed(num_tokens) -> int
        .can_allocate(num_tokens) -> bool
        .allocate(seq_id, num_tokens, prefix=None) -> bool   (False, nothing changed, when blocks are short;
                                                   prefix: the tokens, to share published full blocks)
        .cached_prefix(tokens, limit) -> int       (leading tokens available as published blocks)
        .publish(seq_id, tokens, num_computed)     (make the sequence's computed full blocks shareable)
        .reserve(seq_id, num_tokens) -> bool       (append_slots for the scheduler: True / False)
        .reserve_cost(seq_id, num_tokens) -> int   (free blocks that reserve would take)
        .append_slot(seq_id) -> SlotResult | None  (None, nothing changed, when blocks are short)
        .append_slots(seq_id, num_tokens) -> list[SlotResult] | None   (all or nothing)
        .can_append(seq_id, num_tokens=1) -> bool
        .fork(parent_id, child_id)   .free(seq_id)
        .block_table(seq_id) -> list[int]   .seq_len(seq_id) -> int   .seq_ids -> list[int]
        .slot_mapping(seq_id, start, end) -> list[int]   (flat slots block_id * block_size + offset)
        .num_free_blocks   .num_used_blocks   .usage() -> BlockUsage  (O(1): kept up to date on every change)
        .bytes_reserved(bytes_per_block) -> int   .bytes_used(bytes_per_block) -> float
        .check_invariants()

    WindowedBlockManager(num_blocks, block_size, groups=[WindowGroup(...)], max_step_tokens=None)
        a BlockManager whose model also has sliding / chunked layers: each `WindowGroup` holds, per
        sequence, the blocks its next step reads (the simulator's path: allocate / reserve / free)

Conventions: a token at position p of a sequence lives in block `table[p // block_size]` at offset
`p % block_size`, flat slot `block_id * block_size + offset`. `allocate(seq_id, n)` reserves and
counts the first n positions (the prompt, written by prefill through `slot_mapping(seq_id, 0, n)`);
`append_slot` reserves and counts one more. When a `SlotResult` carries `copy=(src, dst)`, the cache
must copy block src's first `offset` slots into block dst before writing the new token: dst replaced
src in this sequence's table, and src stays with the sequences that still share it. Misuse (unknown
ids, double free, a seq id used twice) raises ValueError.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class Block:
    """One physical block: its id and how many block tables hold it (0: it is in the free queue)."""

    block_id: int
    ref_count: int = 0


class FreeBlockQueue:
    """Free block ids, first freed first reused (vLLM's order, which keeps freshly freed blocks
    around longest for prefix reuse); O(1) membership so a double free is caught."""

    def __init__(self, block_ids: range) -> None:
        self._queue: deque[int] = deque(block_ids)
        self._members: set[int] = set(block_ids)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._members

    def pop(self) -> int | None:
        """The block free the longest, or None when none is free."""
        if not self._queue:
            return None
        block_id = self._queue.popleft()
        self._members.remove(block_id)
        return block_id

    def push(self, block_id: int) -> None:
        """Return a block to the end of the queue; a block already free raises `ValueError`."""
        if block_id in self._members:
            raise ValueError(f"block {block_id} is already free")
        self._queue.append(block_id)
        self._members.add(block_id)

    def ids(self) -> list[int]:
        """The free block ids, oldest first."""
        return list(self._queue)


class BlockPool:
    """A fixed set of `num_blocks` blocks with reference counts."""

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_blocks: must be a positive integer, got {num_blocks!r}")
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free = FreeBlockQueue(range(num_blocks))

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def _block(self, block_id: int) -> Block:
        if not isinstance(block_id, int) or not 0 <= block_id < len(self._blocks):
            raise ValueError(f"block {block_id!r}: unknown id (the pool has blocks 0..{len(self._blocks) - 1})")
        return self._blocks[block_id]

    def refcount(self, block_id: int) -> int:
        """How many sequences hold block `block_id` (0: free)."""
        return self._block(block_id).ref_count

    def allocate(self) -> int | None:
        """A free block with reference count 1, or None when none is free."""
        block_id = self._free.pop()
        if block_id is None:
            return None
        self._blocks[block_id].ref_count = 1
        return block_id

    def incref(self, block_id: int) -> None:
        """One more holder of an allocated block (a fork or a shared prefix); a free block raises
        `ValueError`."""
        block = self._block(block_id)
        if block.ref_count == 0:
            raise ValueError(f"block {block_id}: incref of a free block (allocate it first)")
        block.ref_count += 1

    def decref(self, block_id: int) -> bool:
        """Drop one reference; at zero the block returns to the free queue (returns True then)."""
        block = self._block(block_id)
        if block.ref_count == 0:
            raise ValueError(f"block {block_id}: decref of a free block (double free?)")
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free.push(block_id)
            return True
        return False

    def check_invariants(self) -> None:
        """Assert that a block is in the free queue exactly when nothing references it, and no count is
        negative."""
        free = self._free.ids()
        assert len(free) == len(set(free)), f"the free queue holds a block twice: {sorted(free)}"
        for block in self._blocks:
            in_free = block.block_id in self._free
            assert in_free == (block.ref_count == 0), (
                f"block {block.block_id} has ref_count {block.ref_count} but is "
                f"{'in' if in_free else 'not in'} the free queue: a block is free exactly when nothing references it")
            assert block.ref_count >= 0, f"block {block.block_id} has a negative ref_count {block.ref_count}"


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
    """

    #: a fork shares every block: it costs no block until one of the forks writes
    fork_cost = 0
    #: the free pool is shared by all sequences, so admission keeps a watermark for their growth
    paged = True
    #: the scheduler may share published prompt blocks between requests
    supports_prefix_sharing = True

    def __init__(self, num_blocks: int, block_size: int, *, max_seq_len: int | None = None) -> None:
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
        self.pool = BlockPool(num_blocks)
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

    blocks_for = blocks_needed

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

    def _release(self, block_id: int) -> None:
        """Drop one reference; forget the block's fill and prefix key when it goes back to the pool."""
        if self.pool.decref(block_id):
            self._set_fill(block_id, 0)
            key = self._key_of.pop(block_id, None)
            if key is not None:
                del self._prefix[key]

    # --- allocation ------------------------------------------------------------------------------

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of `num_tokens` tokens fits in the free blocks (no prefix shared)."""
        return self.blocks_needed(num_tokens) <= self.pool.num_free

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
        block_size): a new sequence with this prefix need not compute them."""
        return len(self._prefix_blocks(tokens, limit)) * self.block_size

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        """Reserve the blocks of a new sequence's first `num_tokens` positions (its prompt, or its
        first chunk). With `prefix` (the sequence's tokens), the leading full blocks already
        published for those tokens are shared instead of allocated. False, with nothing changed,
        when there are not enough free blocks."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r}: already allocated (free it first)")
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        shared = self._prefix_blocks(prefix, num_tokens) if prefix is not None else []
        if self.blocks_needed(num_tokens) - len(shared) > self.pool.num_free:
            return False
        for block_id in shared:
            self.pool.incref(block_id)
        fresh = [self.pool.allocate() for _ in range(self.blocks_needed(num_tokens) - len(shared))]
        assert None not in fresh, "the free count promised enough free blocks"
        table = shared + fresh  # type: ignore[operator]
        self._tables[seq_id] = table
        self._lens[seq_id] = num_tokens
        self._logical += num_tokens
        if table and num_tokens % self.block_size:
            self._set_fill(table[-1], num_tokens % self.block_size)
        return True

    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:
        """Make the sequence's full blocks within its first `num_computed` (already computed)
        tokens findable by `cached_prefix` / `allocate(prefix=)`."""
        table, bs, prev = self._table(seq_id), self.block_size, -1
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
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
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
        if num_tokens == 1 and table is not None:  # a decode token: the hot path
            length, bs = self._lens[seq_id], self.block_size
            fill = length + 1 - (len(table) - 1) * bs  # the last block's fill after the token
            if 1 < fill <= bs and self.pool._blocks[table[-1]].ref_count == 1:
                # it was partly filled (fill - 1 tokens): one fewer empty slot, as _set_fill would count
                if fill < bs:
                    self._partial[table[-1]] = fill
                else:
                    del self._partial[table[-1]]
                self._gap -= 1
                self._lens[seq_id] = length + 1
                self._logical += 1
                return True
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        needed, cow = self._blocks_to_append(seq_id, num_tokens)
        if cow:
            return self.append_slots(seq_id, num_tokens) is not None
        if needed > self.pool.num_free:
            return False
        table, length, bs = self._tables[seq_id], self._lens[seq_id], self.block_size
        if len(table) * bs > length:  # the partly filled last block takes what it can
            self._set_fill(table[-1], min(bs, length + num_tokens - (len(table) - 1) * bs))
        for _ in range(needed):
            block_id = self.pool.allocate()
            assert block_id is not None, "the free count promised enough free blocks"
            table.append(block_id)
        end = length + num_tokens
        if needed:
            self._set_fill(table[-1], end - (len(table) - 1) * bs)
        self._lens[seq_id] = end
        self._logical += num_tokens
        return True

    def fork(self, parent_id: int, child_id: int) -> None:
        """A new sequence sharing all of the parent's blocks (reference counts + 1): a beam or
        another sample of the same prompt. Costs no block until one of them writes."""
        table = self._table(parent_id)
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r}: already allocated (fork into a new id)")
        for block_id in table:
            self.pool.incref(block_id)
        self._tables[child_id] = list(table)
        self._lens[child_id] = self._lens[parent_id]
        self._logical += self._lens[parent_id]

    def free(self, seq_id: int) -> None:
        """Drop a sequence; its blocks return to the pool once no other sequence holds them."""
        table = self._table(seq_id)
        for block_id in table:
            self._release(block_id)
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
        reserved = self.num_used_blocks * self.block_size
        return BlockUsage(num_blocks=self.num_blocks, block_size=self.block_size,
                          num_used_blocks=self.num_used_blocks, num_sequences=len(self._tables),
                          reserved_slots=reserved, used_slots=reserved - self._gap, logical_tokens=self._logical)

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
        for block_id in range(self.num_blocks):
            refs = self.pool.refcount(block_id)
            assert refs == holders.get(block_id, 0), (
                f"block {block_id} has ref_count {refs} but {holders.get(block_id, 0)} tables hold it: "
                "every reference is a table entry")
        for block_id, seen in fills.items():
            assert len(seen) == 1, (
                f"block {block_id} holds {sorted(seen)} tokens depending on the sequence: a shared block is never "
                "written (copy-on-write), so all its holders see the same tokens")
        recount = self._block_fill()
        assert sum(recount.values()) == self.usage().used_slots, (
            f"incremental used slots {self.usage().used_slots} != recounted {sum(recount.values())}")
        assert self._logical == sum(self._lens.values()), "incremental logical token count drifted"
        for key, block_id in self._prefix.items():
            assert self._key_of.get(block_id) == key and self.pool.refcount(block_id) > 0, (
                f"prefix table entry {key[0]}->{block_id} points at a free or re-keyed block: published "
                "blocks leave the table when freed")


@dataclass(frozen=True, slots=True)
class WindowGroup:
    """Layers of a hybrid model that keep only a span of keys (vLLM's sliding-window and
    chunked-local KV managers): `attention` sliding (the last `window` keys) or chunked (the keys of
    the current chunk of `window` tokens), `layers` of them, against the `full_layers` layers whose
    blocks the pool's blocks are (a block of this group costs layers / full_layers pool blocks)."""

    attention: str
    window: int
    layers: int
    full_layers: int

    def __post_init__(self) -> None:
        if self.attention not in ("sliding", "chunked"):
            raise ValueError(f"window group: attention must be sliding or chunked, got {self.attention!r}")
        for name in ("window", "layers", "full_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"window group: {name} must be a positive integer, got {v!r}")

    def first_key(self, start: int) -> int:
        """The earliest position a step whose first new token is at `start` reads."""
        if self.attention == "sliding":
            return max(0, start - self.window + 1)
        return (start // self.window) * self.window

    def units(self, blocks: int) -> int:
        """Pool blocks that `blocks` blocks of this group take (rounded up per sequence)."""
        return -(-(self.layers * blocks) // self.full_layers)


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


class WindowedBlockManager(BlockManager):
    """The paged KV of a model whose layers keep different spans of keys, as vLLM's hybrid KV-cache
    manager keeps it (`vllm/v1/core/single_type_kv_cache_manager.py`: full attention, sliding window,
    chunked local attention; one shared block pool): the block tables and prefix sharing are the
    full-attention layers' (`BlockManager`); each `WindowGroup` also holds, per sequence, the blocks
    covering the keys its next step reads (taken from the same pool, `WindowGroup.units` pool blocks
    per block of its own), and gives back those that fall out of its window or chunk when the
    sequence next grows (vLLM frees them at its next allocation too).

    A window group's blocks are private to their sequence (vLLM shares a common prefix's window
    blocks as well: slightly pessimistic with prefix sharing), and count as full in `usage()`."""

    def __init__(self, num_blocks: int, block_size: int, *, groups: Sequence[WindowGroup],
                 max_seq_len: int | None = None, max_step_tokens: int | None = None) -> None:
        super().__init__(num_blocks, block_size, max_seq_len=max_seq_len)
        if not groups:
            raise ValueError("window groups: give at least one (else use BlockManager)")
        self.groups = tuple(groups)
        self._plain = tuple((g.attention == "sliding", g.window, g.layers, g.full_layers) for g in self.groups)
        self.max_step_tokens = max_step_tokens
        self._extra: dict[int, list[deque[int]]] = {}  # seq -> per group, its pool blocks, oldest first

    def blocks_for(self, num_tokens: int) -> int:  # type: ignore[override]
        """Blocks a sequence of `num_tokens` tokens takes across the window groups (each sliding group holds
        its window only)."""
        return window_blocks_for(self.groups, self.block_size, num_tokens, self.max_step_tokens)

    def _needs(self, start: int, end: int) -> list[int]:
        """Pool blocks each group needs for a step of positions start..end-1."""
        bs = self.block_size
        last = -(-end // bs)
        return [g.units(last - g.first_key(start) // bs) for g in self.groups]

    def _trim(self, seq_id: int, needs: list[int]) -> None:
        """Give back each group's blocks beyond what it needs (the oldest: out of the window)."""
        for held, need in zip(self._extra[seq_id], needs):
            while len(held) > need:
                self.pool.decref(held.popleft())

    def _grow(self, seq_id: int, needs: list[int]) -> None:
        for held, need in zip(self._extra[seq_id], needs):
            while len(held) < need:
                block_id = self.pool.allocate()
                assert block_id is not None, "the free count promised enough free blocks"
                held.append(block_id)

    def _extra_cost(self, seq_id: int, needs: list[int]) -> int:
        return sum(max(0, need - len(held)) for held, need in zip(self._extra[seq_id], needs))

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        """As `BlockManager.allocate`, also reserving each window group's blocks; False, with nothing changed,
        when they do not fit."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r}: already allocated (free it first)")
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        shared = len(self._prefix_blocks(prefix, num_tokens)) if prefix is not None else 0
        needs = self._needs(shared * self.block_size, num_tokens) if num_tokens else [0] * len(self.groups)
        if self.blocks_needed(num_tokens) - shared + sum(needs) > self.pool.num_free:
            return False
        ok = super().allocate(seq_id, num_tokens, prefix)
        assert ok, "the free count promised enough free blocks"
        self._extra[seq_id] = [deque() for _ in self.groups]
        self._grow(seq_id, needs)
        return True

    def reserve_cost(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks that `reserve(seq_id, num_tokens)` would take, the window groups' included."""
        length = self.seq_len(seq_id)
        return super().reserve_cost(seq_id, num_tokens) + self._extra_cost(seq_id, self._needs(length, length +
                                                                                                num_tokens))

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `num_tokens` more positions fit, the window groups' blocks included."""
        return self.reserve_cost(seq_id, num_tokens) <= self.pool.num_free

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        """As `BlockManager.reserve`, also taking the window groups' new blocks and giving back those that
        left the window."""
        extra = self._extra.get(seq_id)
        if num_tokens == 1 and extra is not None:  # a decode token: the hot path
            length, bs = self._lens[seq_id], self.block_size
            last = length // bs + 1  # blocks up to and including position `length`
            for (sliding, window, layers, full), held in zip(self._plain, extra):
                first = (length - window + 1 if length >= window else 0) if sliding else length - length % window
                if -(-(layers * (last - first // bs)) // full) != len(held):
                    break
            else:  # every window group keeps its blocks: only the full layers may need one
                return super().reserve(seq_id, 1)
        length = self.seq_len(seq_id)
        needs = self._needs(length, length + num_tokens)
        self._trim(seq_id, needs)  # what fell out of the window goes back first
        extra = self._extra_cost(seq_id, needs)
        if super().reserve_cost(seq_id, num_tokens) + extra > self.pool.num_free:
            return False
        ok = super().reserve(seq_id, num_tokens)
        assert ok, "the free count promised enough free blocks"
        self._grow(seq_id, needs)
        return True

    def append_slots(self, seq_id: int, num_tokens: int) -> list[SlotResult] | None:
        """`BlockManager.append_slots` (the full layers' slots, copy-on-write included), plus the blocks
        each window group reads for these positions: all of them, or None with only what fell out of
        the windows given back (as `reserve`)."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens: must be a non-negative integer, got {num_tokens!r}")
        length = self.seq_len(seq_id)
        needs = self._needs(length, length + num_tokens)
        self._trim(seq_id, needs)
        if not self.can_append(seq_id, num_tokens):
            return None
        results = [BlockManager.append_slot(self, seq_id) for _ in range(num_tokens)]
        assert None not in results, "can_append promised enough free blocks"
        self._grow(seq_id, needs)
        return results  # type: ignore[return-value]

    def append_slot(self, seq_id: int) -> SlotResult | None:
        """One more position of the sequence (`append_slots` of one), or None with nothing changed."""
        results = self.append_slots(seq_id, 1)
        return None if results is None else results[0]

    def fork(self, parent_id: int, child_id: int) -> None:
        """As `BlockManager.fork`, the window groups' blocks shared too."""
        super().fork(parent_id, child_id)
        for held in self._extra[parent_id]:
            for block_id in held:
                self.pool.incref(block_id)
        self._extra[child_id] = [deque(held) for held in self._extra[parent_id]]

    def free(self, seq_id: int) -> None:
        """As `BlockManager.free`, the window groups' blocks given back too."""
        super().free(seq_id)
        for held in self._extra.pop(seq_id):
            for block_id in held:
                self.pool.decref(block_id)

    def window_blocks(self, seq_id: int) -> list[int]:
        """Pool blocks each window group holds for the sequence."""
        self._table(seq_id)
        return [len(held) for held in self._extra[seq_id]]

    def check_invariants(self) -> None:
        """Every pool reference is a table entry or a window group's block."""
        self.pool.check_invariants()
        holders: dict[int, int] = {}
        for seq_id, table in self._tables.items():
            assert len(table) == self.blocks_needed(self._lens[seq_id]), f"sequence {seq_id}'s table size"
            for block_id in table:
                holders[block_id] = holders.get(block_id, 0) + 1
            for held in self._extra[seq_id]:
                for block_id in held:
                    holders[block_id] = holders.get(block_id, 0) + 1
        for block_id in range(self.num_blocks):
            refs = self.pool.refcount(block_id)
            assert refs == holders.get(block_id, 0), (
                f"block {block_id} has ref_count {refs} but {holders.get(block_id, 0)} holders: every reference "
                "is a table entry or a window group's block")


__all__ = ["Block", "BlockManager", "BlockPool", "BlockUsage", "FreeBlockQueue", "SlotResult", "WindowGroup",
           "WindowedBlockManager", "window_blocks_for"]
