"""`WindowedBlockManager`: the pool of a model with sliding / chunked layers (vLLM's hybrid KV-cache
manager): exact block counts and ids on small cases (the window's tables, forks and copy-on-write,
reference counts, prefix hits), invariants and the `blocks_for` bound under random reserve / free
sequences, and the layout (`HybridLayout`) the engine's cache and the simulator share."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.serving.blocks import HybridLayout, WindowedBlockManager, WindowGroup
from llmperf.serving.simulator import window_groups
from llmperf.specs import load_model


def sliding(window=8, layers=1, full=1):
    return WindowGroup(attention="sliding", window=window, layers=layers, full_layers=full)


def chunked(chunk=8, layers=3, full=1):
    return WindowGroup(attention="chunked", window=chunk, layers=layers, full_layers=full)


def test_a_sliding_group_holds_the_blocks_of_its_window():
    kv = WindowedBlockManager(64, 4, groups=[sliding(window=8)])
    assert kv.allocate(0, 10)  # a 10-token prompt: 3 full-layer blocks, and the prompt's 3 sliding blocks
    assert (kv.num_used_blocks, kv.window_blocks(0)) == (6, [3])
    for _ in range(9):  # decode to 19 tokens; the last step (position 18) reads keys 11..18: blocks 2..4
        assert kv.reserve(0, 1)
    assert kv.seq_len(0) == 19 and kv.window_blocks(0) == [3] and kv.num_used_blocks == 5 + 3
    assert kv.reserve(0, 1)  # position 19 reads keys 12..19: blocks 3 and 4; block 2 goes back
    assert kv.window_blocks(0) == [2] and kv.num_used_blocks == 5 + 2
    kv.check_invariants()
    kv.free(0)
    assert kv.num_used_blocks == 0
    kv.check_invariants()


def test_a_chunked_group_holds_its_chunk_at_its_units():
    """Llama 4's 3 chunked layers per full one: a block of the chunked group is 3 pool blocks."""
    kv = WindowedBlockManager(64, 4, groups=[chunked(chunk=8, layers=3, full=1)])
    assert kv.allocate(0, 6)  # keys 0..5: 2 blocks, 6 pool blocks
    assert kv.window_blocks(0) == [6] and kv.num_used_blocks == 2 + 6
    assert kv.reserve(0, 4)  # positions 6..9 read from chunk 0's start: blocks 0..2
    assert kv.window_blocks(0) == [9]
    assert kv.reserve(0, 1)  # position 10 reads chunk 1 (8..10): block 2 only
    assert kv.window_blocks(0) == [3] and kv.num_used_blocks == 3 + 3
    kv.check_invariants()


def test_a_fractional_group_rounds_up_per_sequence_and_shortage_changes_nothing():
    kv = WindowedBlockManager(7, 4, groups=[sliding(window=4, layers=5, full=2)])  # 3 pool blocks per block
    assert kv.allocate(0, 4)  # 1 full block + 3 (2 + 2 + 1 padded layers)
    assert kv.num_used_blocks == 4
    before = (kv.num_used_blocks, kv.window_blocks(0), kv.seq_len(0))
    assert not kv.reserve(0, 8)  # 2 more full blocks + 3 * 3 = 11 > the 3 left... after the trim
    assert (kv.seq_len(0), kv.num_used_blocks) == (4, before[0])
    assert not kv.allocate(1, 16)
    kv.check_invariants()


def test_slot_by_slot_appends_hold_what_reserve_holds():
    """The engine's path (`append_slot(s)`: a slot per token, copy-on-write) and the simulator's
    (`reserve`) leave the same blocks: the full layers' table and each window group's."""
    by_slot = WindowedBlockManager(64, 4, groups=[sliding(window=8), chunked(chunk=8, layers=3, full=1)])
    by_reserve = WindowedBlockManager(64, 4, groups=[sliding(window=8), chunked(chunk=8, layers=3, full=1)])
    for kv in (by_slot, by_reserve):
        assert kv.allocate(0, 6)
    slots = by_slot.append_slots(0, 5)
    assert slots is not None and [s.offset for s in slots] == [2, 3, 0, 1, 2]
    assert by_reserve.reserve(0, 5)
    for _ in range(9):
        assert by_slot.append_slot(0) is not None and by_reserve.reserve(0, 1)
    for kv in (by_slot, by_reserve):
        kv.check_invariants()
    assert (by_slot.seq_len(0), by_slot.num_used_blocks, by_slot.window_blocks(0)) == \
        (by_reserve.seq_len(0), by_reserve.num_used_blocks, by_reserve.window_blocks(0))
    small = WindowedBlockManager(7, 4, groups=[sliding(window=4, layers=5, full=2)])
    assert small.allocate(0, 4) and small.append_slots(0, 8) is None and small.seq_len(0) == 4


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), min_size=1, max_size=60),
       window=st.integers(1, 20), kind=st.sampled_from(["sliding", "chunked"]), layers=st.integers(1, 5),
       full=st.integers(1, 3))
def test_random_runs_keep_the_invariants_and_the_bound(ops, window, kind, layers, full):
    """Whatever the steps (at most `max_step_tokens` new tokens each), a sequence never holds more
    pool blocks than `blocks_for` its length, and every reference is a table entry or a window block."""
    g = WindowGroup(attention=kind, window=window, layers=layers, full_layers=full)
    step = 12
    kv = WindowedBlockManager(10_000, 4, groups=[g], max_step_tokens=step)
    live: dict[int, int] = {}
    for i, (seq, n) in enumerate(ops):
        if seq in live and i % 7 == 6:
            kv.free(seq)
            del live[seq]
            continue
        if seq not in live:
            assert kv.allocate(seq, n)
            live[seq] = 0
        else:
            assert kv.reserve(seq, n)
        held = kv.blocks_needed(kv.seq_len(seq)) + sum(kv.window_blocks(seq))
        assert held <= kv.blocks_for(kv.seq_len(seq))
    kv.check_invariants()
    for seq in list(live):
        kv.free(seq)
    assert kv.num_used_blocks == 0


def test_window_group_refuses_bad_fields():
    with pytest.raises(ValueError, match="attention must be sliding or chunked"):
        WindowGroup(attention="full", window=4, layers=1, full_layers=1)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        WindowGroup(attention="sliding", window=0, layers=1, full_layers=1)


def test_a_group_pages_whole_blocks_of_the_full_layers_count():
    """vLLM's uniform page: a block of a window group takes ceil(layers / full layers) pool blocks."""
    assert sliding(layers=5, full=2).pages == 3 and sliding(layers=5, full=2).units(2) == 6
    assert sliding(layers=12, full=12).pages == 1  # gpt-oss
    (g,) = window_groups(load_model("gemma-3-27b"))  # 52 sliding, 10 full: 6 groups of 10, the last padded
    assert (g.layers, g.full_layers, g.pages) == (52, 10, 6)
    (c,) = window_groups(load_model("llama-4-scout"))  # 36 chunked : 12 global
    assert (c.attention, c.window, c.pages) == ("chunked", 8192, 3)
    layout = HybridLayout.of([("sliding", 4), ("sliding", 4), ("full", None), ("chunked", 8), ("sliding", 4)])
    assert layout.full == (2,) and layout.members == ((0, 1, 4), (3,)) and layout.tables == 5
    assert [layout.address(i) for i in range(5)] == [(1, 0), (2, 0), (0, 0), (4, 0), (3, 0)]
    assert HybridLayout.of([("sliding", 4)] * 3) is None and HybridLayout.of([("full", None)] * 3) is None


def test_fork_shares_window_blocks_and_the_first_write_copies_them():
    kv = WindowedBlockManager(32, 4, groups=[sliding(window=8, layers=3, full=2)], record_copies=True)
    assert kv.allocate(0, 6)  # full [0, 1]; sliding entries (2, 3), (4, 5)
    assert kv.window_table(0, 0) == [(2, 3), (4, 5)]
    kv.fork(0, 1)
    assert [kv.pool.refcount(b) for b in range(6)] == [2] * 6
    assert kv.reserve(1, 1)  # position 6 of the child: its last block is copied in both groups
    assert (kv.block_table(1), kv.window_table(1, 0)) == ([0, 6], [(2, 3), (7, 8)])
    assert kv.take_copies() == [(1, 6, 2), (4, 7, 2), (5, 8, 2)] and kv.take_copies() == []
    assert [kv.pool.refcount(b) for b in (1, 4, 5, 2)] == [1, 1, 1, 2]
    for _ in range(5):  # the child's window leaves its block 0, which its parent still holds
        assert kv.reserve(1, 1)
    assert kv.window_table(1, 0)[0] is None and kv.pool.refcount(2) == kv.pool.refcount(3) == 1
    assert kv.window_table(0, 0) == [(2, 3), (4, 5)]
    kv.check_invariants()
    kv.free(0)
    assert kv.pool.refcount(2) == 0 and kv.take_copies() == []
    kv.free(1)
    assert kv.num_used_blocks == 0
    kv.check_invariants()


def test_a_prefix_hit_needs_the_window_blocks_its_first_step_reads():
    kv = WindowedBlockManager(64, 4, groups=[sliding(window=8)])
    prompt = list(range(20))
    assert kv.allocate(0, 20)
    kv.publish(0, prompt, 20)
    assert kv.cached_prefix(prompt, 19) == 16  # 4 blocks; a step from 16 reads 9..: blocks 2 and 3 held
    assert kv.allocate(1, 19, prefix=prompt)
    assert kv.block_table(1)[:4] == kv.block_table(0)[:4] and kv.block_table(1)[4] != kv.block_table(0)[4]
    assert kv.window_table(1, 0)[:4] == [None, None] + kv.window_table(0, 0)[2:4]
    kv.free(1)
    for _ in range(5):  # the publisher's window moves to 17..24: blocks 2 and 3 go back
        assert kv.reserve(0, 1)
    assert kv.window_table(0, 0)[:4] == [None] * 4
    assert kv.cached_prefix(prompt, 19) == 0  # every shorter prefix needs a block that is gone too
    kv.check_invariants()


def test_slot_usage_counts_the_tokens_of_each_group_and_shared_blocks_once():
    kv = WindowedBlockManager(64, 4, groups=[chunked(chunk=8, layers=1, full=1)])
    assert kv.allocate(0, 10)
    assert kv.slot_usage() == (10, [10])
    kv.fork(0, 1)
    assert kv.slot_usage() == (10, [10])
    assert kv.reserve(0, 7)  # positions 10..16: the step reads from chunk 1 (8..), blocks 0 and 1 go back
    assert kv.window_table(0, 0)[:2] == [None, None] and kv.slot_usage() == (17 + 2, [17 - 8 + 10])
    kv.check_invariants()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["new", "grow", "fork", "free"]), st.integers(0, 5),
                              st.integers(1, 9)), min_size=1, max_size=50),
       window=st.integers(1, 12), kind=st.sampled_from(["sliding", "chunked"]), layers=st.integers(1, 4))
def test_forks_prefixes_and_frees_keep_every_count(ops, window, kind, layers):
    """Random allocations with shared prefixes, forks, growth and frees: reference counts, the
    groups' spans, the prefix tables and the used-slot counts stay exact, and every block comes back."""
    kv = WindowedBlockManager(400, 4, groups=[WindowGroup(attention=kind, window=window, layers=layers,
                                                          full_layers=2)], record_copies=True)
    prompt = [7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 7, 8, 9, 9]
    live: list[int] = []
    next_id = 0
    for op, pick, n in ops:
        if op == "new" or not live:
            tokens = prompt[:n + 6] + [next_id]
            assert kv.allocate(next_id, len(tokens), prefix=tokens)
            kv.publish(next_id, tokens, len(tokens))
            live.append(next_id)
            next_id += 1
        elif op == "grow":
            assert kv.reserve(live[pick % len(live)], n)
        elif op == "fork":
            kv.fork(live[pick % len(live)], next_id)
            live.append(next_id)
            next_id += 1
        else:
            kv.free(live.pop(pick % len(live)))
        for src, dst, slots in kv.take_copies():
            assert src != dst and 0 < slots < 4
        kv.check_invariants()
    for seq in live:
        kv.free(seq)
    assert kv.num_used_blocks == 0 and kv.slot_usage() == (0, [0])
    kv.check_invariants()


def test_synthetic_prompt_slices_are_its_tokens():
    import itertools

    from llmperf.serving.simulator import SyntheticPrompt
    for shared, length, rid in [(0, 10, 3), (5, 10, 0), (10, 10, 2), (12, 30, 7), (0, 0, 1)]:
        p = SyntheticPrompt(rid, shared, length)
        tokens = [p[i] for i in range(length)]
        bounds = [*range(-12, 33), None]
        for a, b, c in itertools.product(bounds, bounds, [None, 1, 2, -1]):
            assert p[a:b:c] == tuple(tokens[a:b:c])
