"""Paged KV bookkeeping: exact block ids and reference counts on small cases, copy-on-write exactly
when a shared last block is written, and a hypothesis state machine that keeps a shadow copy of every
sequence's tokens (stored in simulated block slots, applying the copies the manager asks for)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from llmperf.engine.block_pool import Block, BlockManager, BlockPool, FreeBlockQueue, SlotResult
from llmperf.serving.blocks import WindowedBlockManager, WindowGroup


def manager(num_blocks: int = 8, block_size: int = 4) -> BlockManager:
    return BlockManager(num_blocks, block_size)


# --- BlockPool ----------------------------------------------------------------------------------------


def test_pool_allocates_in_order_and_returns_none_when_empty():
    pool = BlockPool(3)
    assert [pool.allocate(), pool.allocate(), pool.allocate()] == [0, 1, 2]
    assert pool.allocate() is None and pool.num_free == 0 and pool.num_used == 3
    assert [pool.refcount(b) for b in range(3)] == [1, 1, 1]
    pool.check_invariants()


def test_pool_refcounts_and_fifo_reuse():
    pool = BlockPool(4)
    a, b = pool.allocate(), pool.allocate()
    pool.incref(a)
    assert pool.refcount(a) == 2
    assert pool.decref(a) is False and pool.refcount(a) == 1 and pool.num_free == 2
    assert pool.decref(a) is True and pool.refcount(a) == 0 and pool.num_free == 3
    assert pool.decref(b) is True
    # Free queue was [2, 3]; the freed 0 then 1 join its end: first freed, first reused.
    assert [pool.allocate() for _ in range(4)] == [2, 3, 0, 1]
    pool.check_invariants()


@pytest.mark.parametrize("misuse, message", [
    (lambda p: p.decref(0), "decref of a free block"),
    (lambda p: p.incref(1), "incref of a free block"),
    (lambda p: p.refcount(4), "unknown id"),
    (lambda p: p.decref(-1), "unknown id"),
])
def test_pool_misuse_raises(misuse, message):
    pool = BlockPool(4)
    pool.decref(pool.allocate())  # block 0 allocated then freed: a second decref is a double free
    with pytest.raises(ValueError, match=message):
        misuse(pool)
    pool.check_invariants()


def test_pool_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)


def test_free_queue_hands_out_unused_ids_first_then_freed_ones_in_order():
    """The ids never handed out are kept as a range, not a list: the same order as a queue that
    started with all of them, and the same membership (a double free raises)."""
    q = FreeBlockQueue(range(4))
    assert len(q) == 4 and all(b in q for b in range(4)) and 4 not in q
    assert [q.pop(), q.pop()] == [0, 1]
    q.push(1)
    q.push(0)
    assert q.ids() == [2, 3, 1, 0] and len(q) == 4 and 0 in q and 1 in q
    for b in (0, 3):
        with pytest.raises(ValueError, match="already free"):
            q.push(b)
    assert [q.pop() for _ in range(5)] == [2, 3, 1, 0, None] and len(q) == 0 and 2 not in q


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=30))
def test_pool_bulk_ops_equal_one_by_one(ops):
    """allocate_many / decref_all give the blocks, and leave the queue, as allocate / decref one by one."""
    bulk, single = BlockPool(12), BlockPool(12)
    held: list[int] = []
    for take, n in ops:
        if take:
            got = bulk.allocate_many(n)
            if n > single.num_free:
                assert got is None
                continue
            assert got == [single.allocate() for _ in range(n)]
            held += got
        else:
            ids, held = held[:n], held[n:]
            assert bulk.decref_all(ids) == [b for b in ids if single.decref(b)]
        assert bulk._free.ids() == single._free.ids()
    bulk.check_invariants()
    with pytest.raises(ValueError, match="decref of a free block"):
        bulk.decref_all([*held, held[0]] if held else [0])


def _managers(windowed: bool, block_size: int):
    if windowed:
        return WindowedBlockManager(14, block_size, groups=[WindowGroup("sliding", 5, 2, 2)])
    return BlockManager(12, block_size)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(1, 4), st.integers(1, 30), st.booleans(),
       st.booleans())
def test_reserve_each_equals_reserve_one_by_one(prompts, block_size, steps, fork, windowed):
    """reserve_each (the scheduler's decode tokens, a run at a time) reserves as reserve(s, 1) in order
    would, up to the first that does not fit; copy-on-write of a forked last block included."""
    def build():
        m, ids = _managers(windowed, block_size), []
        for i, p in enumerate(prompts):
            if m.allocate(i, p):
                ids.append(i)
        if fork and ids:
            m.fork(ids[0], 100)
            ids.append(100)
        return m, ids

    (a, ids), (b, _) = build(), build()
    for _ in range(steps):
        k = a.reserve_each(ids)
        assert k == next((j for j, s in enumerate(ids) if not b.reserve(s, 1)), len(ids))
        assert (a._tables, a._lens, a._partial, a.usage(), a.pool._free.ids()) == \
               (b._tables, b._lens, b._partial, b.usage(), b.pool._free.ids())
        if k < len(ids):  # out of blocks: the newest goes, in both
            a.free(ids[-1])
            b.free(ids.pop())
        if not ids:
            break
    a.check_invariants()


def test_pool_block_record():
    pool = BlockPool(3)
    b = pool.allocate()
    pool.incref(b)
    assert pool.block(b) == Block(b, 2) and pool.block(2) == Block(2, 0)


# --- BlockManager: small cases --------------------------------------------------------------------------


def test_allocate_prompt_and_slot_mapping():
    m = manager()
    assert m.allocate(7, 6)
    assert m.block_table(7) == [0, 1] and m.seq_len(7) == 6
    assert m.slot_mapping(7, 0, 6) == [0, 1, 2, 3, 4, 5]
    assert m.slot_mapping(7, 4, 6) == [4, 5]
    assert m.num_free_blocks == 6
    m.check_invariants()


def test_allocate_fails_without_change_when_short():
    m = manager(num_blocks=3)
    assert m.allocate(0, 8)
    assert not m.can_allocate(5) and m.can_allocate(4)
    assert m.allocate(1, 5) is False
    assert 1 not in m and m.num_free_blocks == 1 and m.block_table(0) == [0, 1]
    m.check_invariants()


def test_append_fills_the_last_block_then_opens_a_new_one():
    m = manager()
    m.allocate(0, 3)
    assert m.append_slot(0) == SlotResult(block_id=0, offset=3, slot=3, copy=None)
    assert m.append_slot(0) == SlotResult(block_id=1, offset=0, slot=4, copy=None)
    assert m.block_table(0) == [0, 1] and m.seq_len(0) == 5
    m.check_invariants()


def test_empty_sequence_then_appends():
    m = manager()
    m.allocate(0, 0)
    assert m.block_table(0) == [] and m.seq_len(0) == 0
    assert m.append_slot(0) == SlotResult(block_id=0, offset=0, slot=0)
    m.check_invariants()


def test_fork_shares_every_block():
    m = manager()
    m.allocate(0, 6)
    m.fork(0, 1)
    assert m.block_table(1) == [0, 1] and m.seq_len(1) == 6
    assert [m.pool.refcount(b) for b in (0, 1)] == [2, 2]
    assert m.num_used_blocks == 2
    m.check_invariants()


def test_copy_on_write_when_the_shared_last_block_has_room():
    m = manager()
    m.allocate(0, 6)  # blocks [0, 1], block 1 holds 2 of 4 slots
    m.fork(0, 1)
    res = m.append_slot(1)
    assert res == SlotResult(block_id=2, offset=2, slot=10, copy=(1, 2))
    assert m.block_table(1) == [0, 2] and m.block_table(0) == [0, 1]
    assert [m.pool.refcount(b) for b in (0, 1, 2)] == [2, 1, 1]
    # The parent now owns block 1 alone: it writes in place, no copy.
    assert m.append_slot(0) == SlotResult(block_id=1, offset=2, slot=6, copy=None)
    m.check_invariants()


def test_no_copy_when_the_shared_last_block_is_full():
    m = manager()
    m.allocate(0, 8)  # blocks [0, 1], both full
    m.fork(0, 1)
    assert m.append_slot(1) == SlotResult(block_id=2, offset=0, slot=8, copy=None)
    assert m.append_slot(0) == SlotResult(block_id=3, offset=0, slot=12, copy=None)
    assert [m.pool.refcount(b) for b in range(4)] == [2, 2, 1, 1]
    m.check_invariants()


def test_three_way_share_copies_for_each_writer_but_the_last():
    m = manager()
    m.allocate(0, 2)
    m.fork(0, 1)
    m.fork(0, 2)
    assert m.pool.refcount(0) == 3
    assert m.append_slot(1).copy == (0, 1)
    assert m.append_slot(2).copy == (0, 2)
    assert m.append_slot(0).copy is None  # the last holder writes in place
    assert [m.block_table(s) for s in range(3)] == [[0], [1], [2]]
    m.check_invariants()


def test_free_returns_blocks_only_when_unreferenced():
    m = manager()
    m.allocate(0, 6)
    m.fork(0, 1)
    m.free(0)
    assert m.num_free_blocks == 6 and [m.pool.refcount(b) for b in (0, 1)] == [1, 1]
    m.free(1)
    assert m.num_free_blocks == 8 and m.seq_ids == []
    m.check_invariants()


def test_append_returns_none_and_changes_nothing_when_out_of_blocks():
    m = manager(num_blocks=2)
    m.allocate(0, 8)
    assert m.append_slot(0) is None
    assert m.seq_len(0) == 8 and m.block_table(0) == [0, 1]
    m2 = manager(num_blocks=2)
    m2.allocate(0, 6)
    m2.fork(0, 1)  # copy-on-write needs a block and there is none
    assert m2.append_slot(1) is None
    assert m2.block_table(1) == [0, 1] and m2.seq_len(1) == 6 and m2.pool.refcount(1) == 2
    m.check_invariants()
    m2.check_invariants()


def test_append_slots_is_all_or_nothing():
    m = manager(num_blocks=3)
    m.allocate(0, 6)
    m.fork(0, 1)
    assert not m.can_append(1, 3)  # copy of block 1 + one new block for the 3rd token: 2 > 1 free
    assert m.append_slots(1, 3) is None and m.seq_len(1) == 6 and m.num_free_blocks == 1
    res = m.append_slots(1, 2)
    assert [r.slot for r in res] == [10, 11] and res[0].copy == (1, 2) and res[1].copy is None
    assert m.append_slots(0, 0) == []
    m.check_invariants()


def test_usage_and_bytes():
    m = manager(num_blocks=8, block_size=4)
    m.allocate(0, 6)
    m.fork(0, 1)
    m.allocate(2, 1)
    u = m.usage()
    assert (u.num_used_blocks, u.reserved_slots, u.used_slots, u.logical_tokens) == (3, 12, 7, 13)
    assert u.num_free_blocks == 5 and u.num_sequences == 3
    assert u.utilization == pytest.approx(7 / 12)
    assert u.reserved_bytes(100) == 1200 and u.used_bytes(100) == 700
    assert m.bytes_reserved(400) == 1200 and m.bytes_used(400) == pytest.approx(700)
    assert BlockManager(4, 4).usage().utilization == 1.0


@pytest.mark.parametrize("misuse, message", [
    (lambda m: m.allocate(0, 1), "already allocated"),
    (lambda m: m.fork(0, 0), "already allocated"),
    (lambda m: m.fork(5, 6), "unknown id"),
    (lambda m: m.free(5), "unknown id"),
    (lambda m: m.append_slot(5), "unknown id"),
    (lambda m: m.block_table(5), "unknown id"),
    (lambda m: m.slot_mapping(0, 2, 9), "outside"),
    (lambda m: m.allocate(1, -1), "num_tokens"),
])
def test_manager_misuse_raises(misuse, message):
    m = manager()
    m.allocate(0, 3)
    with pytest.raises(ValueError, match=message):
        misuse(m)
    m.check_invariants()


def test_check_invariants_catches_corruption():
    m = manager()
    m.allocate(0, 3)
    m.pool.incref(0)  # a reference no table holds
    with pytest.raises(AssertionError, match="every reference is a table entry"):
        m.check_invariants()


# --- stateful: a shadow model of every sequence's tokens --------------------------------------------------


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free against a shadow copy of each sequence's tokens. Token
    values are unique, written into simulated slots at the places the manager gives, with its copies
    applied, so any aliasing bug shows up as one sequence reading another's token."""

    @initialize(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4))
    def setup(self, num_blocks, block_size):
        self.m = BlockManager(num_blocks, block_size)
        self.storage: dict[int, list[int | None]] = {b: [None] * block_size for b in range(num_blocks)}
        self.shadow: dict[int, list[int]] = {}
        self.next_token = 0
        self.next_seq = 0

    def _token(self) -> int:
        self.next_token += 1
        return self.next_token

    def _write(self, res: SlotResult, token: int) -> None:
        if res.copy is not None:
            src, dst = res.copy
            assert self.m.pool.refcount(src) >= 1, "the copy source must still be held by someone"
            self.storage[dst][:res.offset] = self.storage[src][:res.offset]
        self.storage[res.block_id][res.offset] = token

    def _snapshot(self):
        return {s: (self.m.block_table(s), self.m.seq_len(s)) for s in self.m.seq_ids}, self.m.num_free_blocks

    @rule(num_tokens=st.integers(0, 9))
    def allocate(self, num_tokens):
        seq, before = self.next_seq, self._snapshot()
        self.next_seq += 1
        if self.m.allocate(seq, num_tokens):
            tokens = [self._token() for _ in range(num_tokens)]
            bs = self.m.block_size
            for slot, tok in zip(self.m.slot_mapping(seq, 0, num_tokens), tokens, strict=True):
                self.storage[slot // bs][slot % bs] = tok
            self.shadow[seq] = tokens
        else:
            assert self.m.blocks_needed(num_tokens) > self.m.num_free_blocks
            assert self._snapshot() == before, "a failed allocate changed the state"

    @precondition(lambda self: self.shadow)
    @rule(data=st.data(), count=st.integers(1, 3))
    def append(self, data, count):
        seq = data.draw(st.sampled_from(sorted(self.shadow)))
        before = self._snapshot()
        results = self.m.append_slots(seq, count) if count > 1 else [self.m.append_slot(seq)]
        if results is None or results == [None]:
            assert not self.m.can_append(seq, count)
            assert self._snapshot() == before, "a failed append changed the state"
            return
        for res in results:
            tok = self._token()
            self._write(res, tok)
            self.shadow[seq].append(tok)

    @precondition(lambda self: self.shadow)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.shadow)))
        child, self.next_seq = self.next_seq, self.next_seq + 1
        self.m.fork(parent, child)
        self.shadow[child] = list(self.shadow[parent])

    @precondition(lambda self: self.shadow)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.shadow)))
        self.m.free(seq)
        del self.shadow[seq]
        with pytest.raises(ValueError):
            self.m.free(seq)  # a second free is misuse, never a silent double decref

    @invariant()
    def bookkeeping_is_consistent(self):
        self.m.check_invariants()
        assert sorted(self.m.seq_ids) == sorted(self.shadow)
        if not self.shadow:
            assert self.m.num_free_blocks == self.m.num_blocks, "blocks leaked with no sequence left"

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        bs = self.m.block_size
        for seq, tokens in self.shadow.items():
            slots = self.m.slot_mapping(seq, 0, len(tokens))
            assert [self.storage[s // bs][s % bs] for s in slots] == tokens, f"sequence {seq}'s tokens changed"


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
