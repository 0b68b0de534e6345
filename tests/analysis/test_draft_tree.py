"""Draft trees (EAGLE-2/3 in SGLang: `DraftTree`, `--tree TOPK:TOKENS`): the tree a depth can hold, a
topk-1 tree is the chain exactly, a wide tree's verify costs what its tokens cost (a gain at batch 1, a
loss at large batches), the simulator's step equals `speculate`'s cycle and schedules the tree's tokens,
and the trees a depth cannot build are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from llmperf.analysis.speculative import DraftTree, speculate
from llmperf.analysis.timemodel import time_model_for
from llmperf.cli import app
from llmperf.errors import SpecError
from llmperf.serving.simulator import ServingConfig, simulate
from llmperf.serving.speculative import SpeculativeConfig
from llmperf.serving.workload import Workload

TYPICAL = lambda h, dtype: time_model_for(h, "typical", dtype)  # noqa: E731


def test_the_nodes_a_depth_holds() -> None:
    tree = DraftTree(4, 8)
    assert [tree.capacity(d) for d in range(4)] == [1, 5, 21, 37]
    assert tree.verify_tokens(1) == 5 and tree.verify_tokens(3) == 8  # a cut cycle verifies what it holds
    assert tree.accept_depth(1) == 1 and tree.accept_depth(3) == 3
    assert DraftTree(4, 3).accept_depth(5) == 2  # three nodes hold a path of two drafts at most
    assert DraftTree.parse("--tree", "8:32") == DraftTree(8, 32)


@pytest.mark.parametrize(("tree", "depth", "message"), [
    (DraftTree(4, 8), 1, "tree: 8 verified tokens, but 1 draft steps of topk 4 build at most 5 nodes"),
    (DraftTree(1, 3), 3, "tree: topk 1 is a chain of k \\+ 1 = 4 tokens, got 3"),
])
def test_a_tree_its_depth_cannot_build_is_refused(tree: DraftTree, depth: int, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        speculate("llama-3.1-8b", "eagle3", "h100-sxm", num_draft_tokens=depth, acceptance=0.8, tree=tree)


@pytest.mark.parametrize(("text", "message"), [("4", "not TOPK:TOKENS"), ("0:8", "topk must be an integer in 1"),
                                              ("4:1", "tokens must be an integer in 2")])
def test_a_bad_tree_option_names_it(text: str, message: str) -> None:
    with pytest.raises(SpecError, match="^--tree: .*" + message):
        DraftTree.parse("--tree", text)


def test_a_topk_1_tree_is_the_chain() -> None:
    kw = dict(num_draft_tokens=3, acceptance=0.8, batch=8, time_model=TYPICAL)
    chain = speculate("llama-3.1-8b", "eagle3", "h100-sxm", **kw)
    tree = speculate("llama-3.1-8b", "eagle3", "h100-sxm", tree=DraftTree(1, 4), **kw)
    assert (tree.tpot_s, tree.first_draft_s, tree.first_verify_s) == (chain.tpot_s, chain.first_draft_s,
                                                                       chain.first_verify_s)


def test_a_wide_tree_pays_at_batch_1_and_costs_at_large_batches() -> None:
    """At batch 1 the target's forward is weight-bound, so verifying 32 tokens costs about what 4 do and the
    tree's higher acceptance wins; at batch 64 the verify's 64 x 32 rows are compute-bound and the tree
    loses to the chain."""
    def run(batch: int, tree: DraftTree | None, a: float):  # noqa: ANN202
        return speculate("llama-3.1-8b", "eagle3", "h100-sxm", num_draft_tokens=3, acceptance=a, batch=batch,
                         tree=tree, time_model=TYPICAL)

    wide = DraftTree(8, 32)
    one, one_chain = run(1, wide, 0.85), run(1, None, 0.8)
    assert one.first_verify_s < 1.05 * one_chain.first_verify_s and one.speedup > one_chain.speedup
    big, big_chain = run(64, wide, 0.85), run(64, None, 0.8)
    assert big.first_verify_s > 3 * big_chain.first_verify_s and big.speedup < big_chain.speedup
    assert one.summary()["verify_tokens"] == 32 and one.summary()["tree_topk"] == 8


def test_the_simulated_step_is_the_trees_cycle() -> None:
    B, P, k, tree = 4, 300, 3, DraftTree(4, 8)
    est = speculate("llama-3.1-8b", "eagle3", "h100-sxm", num_draft_tokens=k, acceptance=0.8, batch=B,
                    prompt_len=P, gen_len=64, time_model=TYPICAL, tree=tree)
    sp = SpeculativeConfig(draft="eagle3", num_draft_tokens=k, acceptance=0.8, tree=tree)
    cfg = ServingConfig.build("llama-3.1-8b", "h100-sxm", speculative=sp, policy="static", max_batch=B,
                              max_batched_tokens=None, chunked_prefill=False, prefix_sharing=False,
                              efficiency="typical")
    w = Workload(arrival_s=np.zeros(B), prompt_tokens=np.full(B, P), output_tokens=np.full(B, 64),
                 shared_prefix_tokens=np.zeros(B, dtype=int))
    res = simulate(w, cfg)
    assert [i.num_tokens for i in res.log[1].items] == [8] * B  # each cycle verifies the tree's 8 tokens
    steps = res.steps["duration_s"].to_numpy()
    assert steps[1] == pytest.approx(est.first_draft_s + est.first_verify_s + est.cycle_overhead_s, rel=1e-9)
    assert res.settings["tree_topk"] == 4 and res.settings["verify_tokens"] == 8
    s = res.summary()
    assert 1.0 < s["tokens_per_cycle"] <= 4.0  # at most the depth's 3 drafts and the target's token


def test_the_command_line_sweeps_the_depths_that_build_the_tree() -> None:
    res = CliRunner().invoke(app, ["speculate", "llama-3.1-8b", "--draft", "eagle3", "--tree", "4:8", "-k", "1,2,3",
                                   "-a", "0.8", "-f", "json"])
    assert res.exit_code == 0, res.output
    assert [r["num_draft_tokens"] for r in json.loads(res.stdout)] == [2, 3]  # depth 1 holds 5 nodes, not 8
    assert "--tokens 1 left out: 8 verified tokens, but 1 draft steps" in res.stderr
    bad = CliRunner().invoke(app, ["speculate", "llama-3.1-8b", "--draft", "eagle3", "--tree", "4:100", "-k", "2"])
    assert bad.exit_code == 2 and "--tree: no draft length in --tokens builds it" in bad.output
    sim = CliRunner().invoke(app, ["simulate", "llama-3.1-8b", "-n", "4", "--rate", "2", "--draft", "eagle3",
                                   "--draft-tokens", "1", "--acceptance", "0.8", "--tree", "4:8"])
    assert sim.exit_code == 2 and "--tree: 8 verified tokens, but 1 draft steps of topk 4" in sim.output
