"""DeepSeek-V4's operators (`ForwardModel` on a `deepseek_v4` spec): the matrix FLOPs of a forward pass against
`torch.utils.flop_counter` on tiny structures of our own, in transformers' eager form (`attention="naive"`,
`attention_flops="dense"`: every query against every window key and every compressed entry, masked; the indexer
scoring every entry). Where the counts differ, and why: the counter sees the hyper-connections' `comb^T @ streams`
(our `hc_post`, an elementwise operator) and the hyper-head's product (`hc_head`) as matrix products, and neither
the indexer's ReLU / weight / head-sum epilogue (3 FLOPs a pair and head in `index_score`) nor the router's
score-correction add. The executed convention counts each query's window plus its seen (csa: at most index_topk)
entries, checked against a brute-force sum over positions."""

from __future__ import annotations

import pytest

from llmperf.analysis import ForwardModel
from llmperf.errors import SpecError
from llmperf.specs import Precision
from llmperf.specs.model import _layer_kinds
from tests.analysis.model_checks import hf_model
from tests.specs.test_deepseek_v4 import STRUCTURES, read


@pytest.mark.parametrize("name", ["tiny", "legacy", "sliding-only", "all-hash-tied"])
def test_matrix_flops_are_transformers_eager(name):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    cfg = STRUCTURES[name]
    model = hf_model(cfg, device="cpu").eval()
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    batch, seq = 2, 21
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, cfg["vocab_size"], (batch, seq)))
    spec = read(cfg)
    fm = ForwardModel(model=spec, precision=Precision(), attention="naive", all_logits=True, attention_flops="dense")
    ops = fm.forward_ops(batch, seq, seq)
    tokens, n, h = batch * seq, spec.hc_mult, spec.hidden_size
    ours = sum(o.flops for o in ops if o.kind in ("matmul", "attention") and o.name != "hc_head")
    comb = 2 * tokens * n * n * h * 2 * spec.num_layers  # two hc_post a layer
    head = 2 * tokens * n * h * n
    entries = seq // spec.csa_rate if spec.csa_rate else 0
    epilogue = 3 * batch * seq * entries * (spec.index_n_heads or 0) * spec.layer_types.count("csa")
    scored = sum(1 for i in range(spec.num_layers) if i not in spec.hash_moe_layers)
    correction = tokens * spec.num_experts * scored if spec.router_score_bias else 0
    assert counter.get_total_flops() == ours + comb + head - epilogue - correction


@pytest.mark.parametrize("q_len,kv_len", [(1, 1), (1, 37), (5, 40), (40, 40), (1, 300), (17, 300)])
def test_executed_attention_counts_each_query_window_and_entries(q_len, kv_len):
    spec = read(STRUCTURES["tiny"])
    fm = ForwardModel(model=spec, precision=Precision())
    W, k = spec.sliding_window, spec.index_topk
    for kind in {kk.attention: kk for kk in _layer_kinds(spec)}.values():
        rate = {"csa": spec.csa_rate, "hca": spec.hca_rate}.get(kind.attention)
        pairs = 0
        for p in range(kv_len - q_len, kv_len):
            seen = 0 if rate is None else (p + 1) // rate
            pairs += min(p + 1, W) + (min(seen, k) if kind.attention == "csa" else seen)
        (attn,) = fm.v4_attention_ops(3, q_len, kv_len, kind=kind)
        H, d = spec.num_heads, spec.head_dim
        assert attn.flops == 3 * (4 * H * pairs * d + 2 * H * q_len)  # QK and PV, the sinks


def test_decode_reads_the_window_and_the_picked_entries():
    spec = read(STRUCTURES["tiny"])
    fm = ForwardModel(model=spec, precision=Precision())
    csa = next(k for k in _layer_kinds(spec) if k.attention == "csa")
    (attn,) = fm.v4_attention_ops(1, 1, 400, kind=csa)
    d, kvb = spec.head_dim, fm.precision.kv_bytes
    assert attn.kv_read_bytes == (spec.sliding_window + min(400 // spec.csa_rate, spec.index_topk)) * d * kvb


def test_tensor_parallelism_is_refused_by_name():
    spec = read(STRUCTURES["tiny"])
    with pytest.raises(SpecError, match="tp: DeepSeek-V4's attention"):
        ForwardModel(model=spec, precision=Precision(), tp=2)


@pytest.mark.parametrize("lo,hi", [(1, 1), (1, 3), (2, 9), (4, 4), (5, 40), (17, 300), (128, 1000)])
def test_the_generation_means_of_the_compressed_groups_are_brute_force(lo, hi):
    """The closed forms `estimate` sums a generation's cache with (`_capped_sum`: used and paged means) for
    DeepSeek-V4's compressed, partial and overlap groups, against the sum over every length."""
    import numpy as np

    from llmperf.analysis.rollup import _capped_sum, _sum_ceil_div

    cache = read(STRUCTURES["tiny"]).kv_cache("bf16")
    bs = 16
    prefixes = {"used": (lambda n: n * (n + 1) / 2, lambda t: t),
                "paged": (lambda n: bs * _sum_ceil_div(n, bs), lambda t: bs * -(-t // bs))}
    for g in cache.groups:
        for prefix, f in prefixes.values():
            want = sum(f(int(g.tokens_held(n))) for n in range(lo, hi + 1))
            assert float(_capped_sum(g, np.float64(lo), np.float64(hi), prefix)) == pytest.approx(want), g.label


def test_its_mtp_module_and_a_guessed_eagle3_head_are_refused_by_name():
    from llmperf.analysis.speculative import eagle3_spec, mtp_spec

    spec = read(STRUCTURES["tiny"])
    with pytest.raises(SpecError, match="MTP module \\(DeepSeek-V4, o_groups\\) is not modelled"):
        mtp_spec(spec)
    with pytest.raises(SpecError, match="DeepSeek-V4's attention, o_groups\\) needs the head's config.json"):
        eagle3_spec(spec)


def test_the_regime_searches_see_the_same_attention():
    """`attention_core_ops` (what the regime searches read) are the cores of `forward_ops`, window and entries."""
    spec = read(STRUCTURES["tiny"])
    fm = ForwardModel(model=spec, precision=Precision())
    cores = [op for op in fm.forward_ops(3, 1, 300) if op.name == "attention"]
    assert [(o.flops, o.kv_read_bytes) for o in fm.attention_core_ops(3, 1, 300)] == [
        (o.flops, o.kv_read_bytes) for o in cores]
