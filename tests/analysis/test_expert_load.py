"""The busiest expert-parallel GPU under uniform random routing (`llmperf.analysis.routing`) against
Monte Carlo routing of today's MoE layouts, and its invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmperf.analysis import estimate
from llmperf.analysis.operators import expected_experts_touched
from llmperf.analysis.roofline import ROOFLINE
from llmperf.analysis.routing import EXACT_SUPPORT, busiest_expert_load
from llmperf.specs import load_model


def monte_carlo(tokens: int, num_experts: int, k: int, ep: int, trials: int, seed: int = 0) -> tuple[float, float]:
    """(rows, experts touched) of the busiest GPU, averaged over `trials` routings: each token picks k
    distinct experts uniformly (the k smallest of E uniform draws), expert e lives on GPU e // (E / ep)."""
    rng = np.random.default_rng(seed)
    local = num_experts // ep
    picks = np.argpartition(rng.random((trials, tokens, num_experts)), k - 1, axis=2)[:, :, :k]
    gpu = picks // local
    rows = np.stack([(gpu == g).sum(axis=(1, 2)) for g in range(ep)], axis=1)
    hit = np.zeros((trials, num_experts), dtype=bool)
    np.put_along_axis(hit, picks.reshape(trials, -1), True, axis=1)
    touched = hit.reshape(trials, ep, local).sum(axis=2)
    return float(rows.max(axis=1).mean()), float(touched.max(axis=1).mean())


# (tokens, experts, k, ep): DeepSeek-V3 / Kimi-K2-like at EP 8 and 32, Qwen3-30B-A3B at EP 4 and 8,
# GLM-4.5 at EP 8, gpt-oss-20b at EP 4, Mixtral at EP 2 and 8, Llama 4 Scout at EP 16; decode batches
# on both sides of the exact pmf's support (`EXACT_SUPPORT`) and one prefill-sized step
CASES = [(1, 256, 8, 8), (8, 256, 8, 8), (32, 256, 8, 8), (128, 256, 8, 8), (64, 256, 8, 32),
         (4, 128, 8, 4), (32, 128, 8, 8), (16, 160, 8, 8), (64, 32, 4, 4), (16, 8, 2, 2), (64, 8, 2, 8),
         (5, 16, 1, 16), (512, 32, 4, 4)]


@pytest.mark.parametrize(("tokens", "experts", "k", "ep"), CASES)
def test_the_busiest_gpu_matches_monte_carlo_routing(tokens: int, experts: int, k: int, ep: int) -> None:
    trials = max(200, min(2000, 400_000 // (tokens * experts)))
    mc_rows, mc_touched = monte_carlo(tokens, experts, k, ep, trials)
    rows, touched = busiest_expert_load(tokens, experts, k, ep)
    assert rows == pytest.approx(mc_rows, rel=0.03)
    assert touched == pytest.approx(mc_touched, rel=0.03)
    # and it is above the mean that a perfectly balanced layout would give
    assert rows >= tokens * k / ep and touched >= expected_experts_touched(tokens, experts, k) / ep - 1e-9


def test_both_sides_of_the_exact_support_agree() -> None:
    """The exact pmf below `EXACT_SUPPORT` possible rows and the normal above it meet without a step."""
    last_exact = EXACT_SUPPORT // 8  # DeepSeek-V3 at ep 8: a token puts at most 8 rows on one GPU
    before, below, above, after = busiest_expert_load(np.arange(last_exact - 1, last_exact + 3), 256, 8, 8)[0]
    steps = np.array([below - before, above - below, after - above])
    assert np.all(steps > 0) and steps.max() < 1.25 * steps.min()


def test_the_excess_falls_with_the_tokens_and_vanishes_without_ep() -> None:
    tokens = np.array([1, 8, 32, 256, 4096, 32768])
    rows, touched = busiest_expert_load(tokens, 256, 8, 8)
    excess = rows / (tokens * 8 / 8)
    assert np.all(np.diff(excess) < 0) and excess[-1] < 1.01
    assert touched[-1] == 32  # every expert of every GPU
    one_rows, one_touched = busiest_expert_load(tokens, 256, 8, 1)
    assert np.array_equal(one_rows, tokens * 8.0)
    assert np.allclose(one_touched, expected_experts_touched(tokens, 256, 8))
    # one expert a GPU (Mixtral at ep 8): any token touches some GPU's only expert
    assert busiest_expert_load(1, 8, 2, 8) == (1.0, 1.0)


@given(st.integers(0, 3000), st.sampled_from([(256, 8, 8), (128, 8, 4), (8, 2, 8), (32, 4, 2), (16, 1, 16)]),
       st.floats(0.0, 1.0))
def test_loads_grow_with_the_tokens_within_their_bounds(tokens: int, layout: tuple[int, int, int],
                                                        frac: float) -> None:
    experts, k, ep = layout
    rows, touched = busiest_expert_load(tokens, experts, k, ep)
    more_rows, more_touched = busiest_expert_load(tokens + 1, experts, k, ep)
    assert more_rows >= rows and more_touched >= touched - 1e-9
    assert tokens * k / ep <= rows <= tokens * min(k, experts // ep)
    assert touched <= experts // ep
    # a fractional token count (a mean batch) lies between its neighbours; arrays price as scalars
    mid = busiest_expert_load(tokens + frac, experts, k, ep)
    assert rows - 1e-9 <= mid[0] <= more_rows + 1e-9
    arr = busiest_expert_load(np.array([tokens + frac, tokens]), experts, k, ep)
    assert arr[0][0] == pytest.approx(mid[0]) and arr[1][1] == pytest.approx(touched)


def test_expert_parallel_decode_pays_for_its_busiest_gpu_and_tensor_parallel_does_not() -> None:
    """DeepSeek-V3 on 8 H200s under the roofline: at batch 1 the busiest of 8 expert-parallel GPUs
    reads ~2.5 whole experts where 8 tensor-parallel ones each read an eighth of 8; at batch 256
    every GPU reads all its experts either way, and the busiest GPU's extra rows cost little."""
    m = load_model("deepseek-v3")
    kw = dict(prompt_len=512, gen_len=16, tp=8, time_model=ROOFLINE)
    for batch, worse in ((1, 1.3), (32, 1.08)):
        tp = estimate(m, "h200", batch=batch, **kw)
        ep = estimate(m, "h200", batch=batch, ep=8, **kw)
        assert ep.tpot_s > worse * tp.tpot_s, batch
    tp, ep = (estimate(m, "h200", batch=256, ep=e, **kw) for e in (1, 8))
    assert 0.9 * tp.tpot_s < ep.tpot_s < 1.02 * tp.tpot_s  # (tp: each GPU reads every routed row's input)


def test_every_row_names_the_busiest_gpus_excess() -> None:
    """The result schema carries the excess a decode step's busiest GPU is priced at (1 without ep, and for a
    dense model); `estimate` and `sweep` agree."""
    from llmperf.analysis import sweep

    est = estimate("deepseek-v3", "h200", batch=32, tp=8, ep=8).summary()
    rows, touched = busiest_expert_load(32, 256, 8, 8)
    assert est["ep_busiest_rows"] == pytest.approx(rows / 32)
    assert est["ep_busiest_experts"] == pytest.approx(touched / (expected_experts_touched(32, 256, 8) / 8))
    table = sweep(["deepseek-v3"], ["h200"], batch=[1, 32], prompt_len=[512], gen_len=[16], tp=8, ep=8)
    assert list(table["ep_busiest_rows"]) == pytest.approx([busiest_expert_load(1, 256, 8, 8)[0], rows / 32])
    plain = estimate("deepseek-v3", "h200", batch=32, tp=8).summary()
    dense = estimate("llama-3.1-8b", "h100-sxm", batch=32).summary()
    assert plain["ep_busiest_rows"] == plain["ep_busiest_experts"] == dense["ep_busiest_rows"] == 1.0
