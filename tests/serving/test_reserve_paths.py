"""The block managers' decode-token shortcuts leave exactly the state of their general paths.

`BlockManager.reserve_each` (its inline tokens counted into the slot counts once a call) against
`reserve(s, 1)` one sequence at a time; `WindowedBlockManager.reserve`'s decode token without a
copy-on-write (handed to `BlockManager.reserve`) against the general `_extend`. Both managers of a
pair go through the same random allocations, forks, frees and growths (copy-on-write and a short
pool included), and after every step their whole bookkeeping is compared: tables, lengths,
reference counts, the free queue in order, fills, slot counts, prefix keys and window groups.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.serving.blocks import BlockManager, WindowedBlockManager, WindowGroup

# (operation, a size, picks among the live sequences); a decode with an even size takes every live one,
# as the scheduler's steps do
OPS = st.lists(st.tuples(st.sampled_from(["new"] * 3 + ["fork", "free", "grow"] + ["decode"] * 6), st.integers(0, 12),
                         st.lists(st.integers(0, 9), max_size=8)), min_size=20, max_size=80)


def snapshot(kv: BlockManager) -> dict:
    """Everything the manager keeps, as plain values (the free queue in its order)."""
    out = dict(tables={s: list(t) for s, t in kv._tables.items()}, lens=dict(kv._lens), refs=list(kv.pool._refs),
               free=kv.pool._free.ids(), partial=dict(kv._partial), gap=kv._gap, logical=kv._logical,
               prefix=dict(kv._prefix), usage=kv.usage())
    if isinstance(kv, WindowedBlockManager):
        out |= dict(held={s: [(h.first, list(h.entries)) for h in groups] for s, groups in kv._held.items()},
                    window_blocks=kv._window_blocks, copies=kv.take_copies(), wprefix=[dict(p) for p in kv._wprefix])
    return out


def drive(pair: tuple[BlockManager, BlockManager], ops: list, decode) -> None:  # noqa: ANN001
    """Run `ops` on both managers (`decode(kv, i, seq_ids)`: manager i's decode tokens), comparing
    them after every step."""
    live: list[int] = []
    next_id = 0
    for op, n, picks in ops:
        chosen = [live[p % len(live)] for p in picks] if live else []
        if op == "decode" and n % 2 == 0:
            chosen = list(live)
        results = []
        for i, kv in enumerate(pair):
            if op == "new":
                prompt = [1] * (n // 2) + list(range(n - n // 2))  # a shared head: prefix hits
                ok = kv.allocate(next_id, n, prefix=prompt)
                if ok:
                    kv.publish(next_id, prompt, n)
                results.append(ok)
            elif op == "fork" and chosen:
                kv.fork(chosen[0], next_id)
            elif op == "free" and chosen:
                kv.free(chosen[0])
            elif op == "grow" and chosen:
                results.append(kv.reserve(chosen[0], 1 + n % 5))
            elif op == "decode":
                results.append(decode(kv, i, list(dict.fromkeys(chosen))))
        assert results[: len(results) // 2] == results[len(results) // 2:]
        assert snapshot(pair[0]) == snapshot(pair[1]), (op, n, chosen)
        if op == "new" and results[0] or op == "fork" and chosen:
            live.append(next_id)
            next_id += 1
        elif op == "free" and chosen:
            live.remove(chosen[0])
    for kv in pair:
        kv.check_invariants()


def one_by_one(kv: BlockManager, seq_ids: list[int]) -> int:
    for done, s in enumerate(seq_ids):
        if not kv.reserve(s, 1):
            return done
    return len(seq_ids)


@settings(max_examples=100, deadline=None)
@given(ops=OPS, num_blocks=st.integers(4, 80), block_size=st.sampled_from([1, 2, 3, 4]))
def test_reserve_each_leaves_the_state_of_one_reserve_at_a_time(ops, num_blocks, block_size):
    pair = (BlockManager(num_blocks, block_size), BlockManager(num_blocks, block_size))
    drive(pair, ops, lambda kv, i, ids: kv.reserve_each(ids) if i == 0 else one_by_one(kv, ids))


@settings(max_examples=100, deadline=None)
@given(ops=OPS, num_blocks=st.integers(6, 100), block_size=st.sampled_from([1, 2, 3, 4]),
       kind=st.sampled_from(["sliding", "chunked"]), window=st.integers(1, 9), layers=st.integers(1, 3))
def test_windowed_decode_token_leaves_the_state_of_the_general_path(ops, num_blocks, block_size, kind, window,
                                                                    layers):
    def make() -> WindowedBlockManager:
        return WindowedBlockManager(num_blocks, block_size, record_copies=True,
                                    groups=[WindowGroup(attention=kind, window=window, layers=layers, full_layers=1)])

    def decode(kv: WindowedBlockManager, i: int, seq_ids: list[int]) -> int:
        reserve = kv.reserve if i == 0 else kv._extend  # the shortcut, or the general path it skips to
        for done, s in enumerate(seq_ids):
            if not reserve(s, 1):
                return done
        return len(seq_ids)

    drive((make(), make()), ops, decode)
