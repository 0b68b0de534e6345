"""`CappedBlockManager`: the pool of a model whose every layer slides with one window (Mistral 7B v0.1,
StreamingLLM): exact block ids on small cases, the `blocks_for` bound, and under random allocate /
reserve / append / fork / truncate / free runs with shared prefixes, the invariants and a shadow of
the slots' contents: every key a sequence's next step reads holds what that sequence wrote there."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.serving.blocks import CappedBlockManager, capped_blocks_for, uniform_window
from llmperf.specs.kvcache import first_key


def test_blocks_before_the_window_go_back_and_leave_null_entries():
    kv = CappedBlockManager(64, 4, window=8)
    assert kv.allocate(0, 10)  # a 10-token prompt: blocks 0, 1, 2
    assert kv.block_table(0) == [0, 1, 2] and kv.num_used_blocks == 3
    for _ in range(9):  # to 19 tokens; position 18 reads keys 11..18: blocks 2..4, blocks 0 and 1 gone
        assert kv.reserve(0, 1)
    assert kv.block_table(0) == [None, None, 2, 3, 4] and kv.num_used_blocks == 3
    assert kv.reserve(0, 1)  # position 19 reads keys 12..19: block 2 goes back
    assert kv.block_table(0) == [None, None, None, 3, 4] and kv.first_block(0) == 3
    assert kv.slot_mapping(0, 19, 20) == [4 * 4 + 3]
    with pytest.raises(ValueError, match="first held block"):
        kv.slot_mapping(0, 8, 12)
    kv.check_invariants()
    kv.free(0)
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 64
    kv.check_invariants()


def test_the_bound_is_the_window_and_a_step_not_the_context():
    # a step of at most 16 tokens reads its 15 keys before and its own: 31 keys, 8 blocks, 9 straddling
    assert capped_blocks_for(16, 4, 10_000, 16) == 9
    assert capped_blocks_for(16, 4, 10, 16) == 3  # never more than the context's blocks
    assert capped_blocks_for(16, 4, 10_000) == 2500  # any step size: the whole context may be one step
    kv = CappedBlockManager(64, 4, window=16, max_step_tokens=16)
    assert kv.blocks_for(10_000) == 9
    assert kv.allocate(0, 16)
    for _ in range(50):
        assert kv.reserve(0, 7)
        assert kv.num_used_blocks <= kv.blocks_for(kv.seq_len(0))


def test_truncate_keeps_what_the_next_step_reads_and_refuses_less():
    kv = CappedBlockManager(64, 4, window=6)
    assert kv.allocate(0, 20) and kv.reserve(0, 4)  # the step at 20 reads from 15: blocks 0..2 went back
    assert kv.first_block(0) == 3 and kv.seq_len(0) == 24
    kv.truncate(0, 21)  # speculative decoding: three drafts rejected
    assert kv.seq_len(0) == 21 and kv.block_table(0) == [None, None, None, 3, 4, 5]
    kv.check_invariants()
    with pytest.raises(ValueError, match="gave back"):
        kv.truncate(0, 12)  # its next step would read keys 7..12: block 1, given back
    kv.check_invariants()


def test_a_shared_prefix_takes_only_the_blocks_the_first_step_reads():
    kv = CappedBlockManager(64, 4, window=6)
    prompt = list(range(100, 124))  # 24 tokens, 6 full blocks
    assert kv.allocate(0, 24)
    kv.publish(0, prompt, 24)
    tokens = prompt + [1, 2]
    assert kv.cached_prefix(tokens, 25) == 24
    assert kv.allocate(1, 26, prefix=tokens)  # starts at 24, reads from 19: block 4 on
    assert kv.block_table(1) == [None, None, None, None, 4, 5, 6]
    assert [kv.pool.refcount(b) for b in (3, 4, 5, 6)] == [1, 2, 2, 1]
    kv.check_invariants()


def test_a_prefix_chain_is_dropped_with_the_block_it_starts_from():
    kv = CappedBlockManager(5, 4, window=4)  # five blocks: a freed id is soon reused
    prompt = list(range(16))
    assert kv.allocate(0, 16)
    kv.publish(0, prompt, 16)
    assert kv.reserve(0, 4)  # the step at 16 reads from 13: blocks 0..2 go back, their keys with them
    assert kv.block_table(0) == [None, None, None, 3, 4]
    assert kv.cached_prefix(prompt + [0], 16) == 0  # the chain from block 0 is gone
    kv.check_invariants()  # no key chains from a block back in the pool
    assert kv.allocate(1, 4) and kv.block_table(1) == [0]  # block 0's id reused for other tokens
    kv.publish(1, [9, 9, 9, 9], 4)
    assert kv.cached_prefix([9, 9, 9, 9, 12, 13, 14, 15, 0], 8) == 4  # (0, block 3's tokens) names nothing
    kv.check_invariants()


def test_shared_blocks_are_those_a_continuing_sequence_still_holds():
    kv = CappedBlockManager(8, 4, window=6)
    # a 24-token prefix: its next step (from 24) reads from 19, so full blocks 4 and 5 of its 6; at 26 from
    # 21: block 5 (block 6 is not full); within the window every full block
    assert [kv.shared_blocks(n) for n in (0, 3, 4, 8, 24, 26)] == [0, 0, 1, 2, 2, 1]
    assert CappedBlockManager(8, 4, window=64).shared_blocks(24) == 6


def test_uniform_window_is_one_windowed_kind_only():
    assert uniform_window([("sliding", 8)] * 3) == ("sliding", 8)
    assert uniform_window([("chunked", 8)] * 2) == ("chunked", 8)
    assert uniform_window([("sliding", 8), ("full", None)]) is None
    assert uniform_window([("sliding", 8), ("sliding", 16)]) is None
    assert uniform_window([("sliding", 8), ("chunked", 8)]) is None
    assert uniform_window([("full", None)] * 2) is None


def test_bad_fields_are_refused():
    with pytest.raises(ValueError, match="window"):
        CappedBlockManager(8, 4, window=0)
    with pytest.raises(ValueError, match="attention"):
        CappedBlockManager(8, 4, window=4, attention="full")


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["new", "reserve", "append", "fork", "truncate", "free"]),
                              st.integers(0, 7), st.integers(1, 9)), min_size=1, max_size=60),
       window=st.integers(1, 14), kind=st.sampled_from(["sliding", "chunked"]), step=st.integers(9, 16))
def test_random_runs_keep_the_invariants_the_bound_and_the_contents(ops, window, kind, step):
    """Every op keeps the bookkeeping exact and every sequence within `blocks_for`; a shadow of the
    pool's slots (written as an engine writes, copies done as asked) shows each sequence's next step
    finds in its window exactly the keys of its own tokens, prefix hits and forks included."""
    bs = 4
    kv = CappedBlockManager(500, bs, window=window, attention=kind, max_step_tokens=step)
    mem: dict[int, tuple[int, ...]] = {}  # slot -> the tokens up to and including its position (its K/V)
    toks: dict[int, list[int]] = {}
    published: dict[int, int] = {}  # tokens of each sequence's prompt (published: never truncated)
    system = [7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 7, 8, 9, 9]
    next_id, fresh = 0, iter(range(1000, 10**6))

    def write(seq: int, start: int) -> None:
        for p, slot in zip(range(start, kv.seq_len(seq)), kv.slot_mapping(seq, start, kv.seq_len(seq))):
            mem[slot] = tuple(toks[seq][:p + 1])

    def grow(seq: int, n: int, use_append: bool) -> None:
        start = kv.seq_len(seq)
        if use_append:
            results = kv.append_slots(seq, n)
            assert results is not None
            if results and results[0].copy is not None:
                src, dst = results[0].copy
                for o in range(results[0].offset):
                    mem[dst * bs + o] = mem[src * bs + o]
        else:
            if kv.reserve_cost(seq, n):  # a copy-on-write needs append_slots' copy: use it
                return grow(seq, n, True)
            assert kv.reserve(seq, n)
        toks[seq] += [next(fresh) for _ in range(n)]
        write(seq, start)

    for op, pick, n in ops:
        live = list(toks)
        seq = live[pick % len(live)] if live else None
        if op == "new" or seq is None:
            tokens = system[:n + 4] + [next(fresh) for _ in range(pick)]
            shared = kv.cached_prefix(tokens, len(tokens) - 1)
            assert kv.allocate(next_id, len(tokens), prefix=tokens)
            toks[next_id], published[next_id] = tokens, len(tokens)
            write(next_id, shared)
            kv.publish(next_id, tokens, len(tokens))
            next_id += 1
        elif op in ("reserve", "append"):
            grow(seq, n, op == "append")
        elif op == "fork":
            kv.fork(seq, next_id)
            toks[next_id], published[next_id] = list(toks[seq]), published[seq]
            next_id += 1
        elif op == "truncate":
            length = kv.seq_len(seq)
            target = max(published[seq], length - n)  # rejected drafts: past the published prompt
            keep = -(-target // bs)
            if first_key(kind, window, target) // bs < kv.first_block(seq):
                with pytest.raises(ValueError):
                    kv.truncate(seq, target)
            elif target < length and keep > kv.first_block(seq) and kv.pool.refcount(kv.block_table(seq)[keep - 1]) > 1:
                pass  # truncating into a shared block: misuse (a step truncates only what it reserved itself)
            else:
                kv.truncate(seq, target)
                del toks[seq][target:]
        else:
            kv.free(seq)
            del toks[seq], published[seq]
        kv.check_invariants()
        for s, tokens in toks.items():
            length = kv.seq_len(s)
            assert length == len(tokens)
            assert kv.num_used_blocks >= len([b for b in kv.block_table(s) if b is not None])
            lo = first_key(kind, window, length)
            for p, slot in zip(range(lo, length), kv.slot_mapping(s, lo, length)):
                assert mem[slot] == tuple(tokens[:p + 1]), f"sequence {s}'s key {p} holds another prefix"
    for s in list(toks):
        kv.free(s)
    assert kv.num_used_blocks == 0
    kv.check_invariants()


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.integers(1, 12), min_size=1, max_size=40), window=st.integers(1, 20),
       kind=st.sampled_from(["sliding", "chunked"]), prompt=st.integers(1, 12))
def test_a_sequence_holds_at_most_blocks_for_its_length(steps, window, kind, prompt):
    kv = CappedBlockManager(10_000, 4, window=window, attention=kind, max_step_tokens=12)
    assert kv.allocate(0, prompt)
    for n in steps:
        assert kv.reserve(0, n)
        assert kv.num_used_blocks <= kv.blocks_for(kv.seq_len(0))
    kv.check_invariants()
