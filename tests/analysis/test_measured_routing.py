"""A measured router's load and EPLB's placement (`llmperf.analysis.routing.SkewedRouting`,
`llmperf.specs.expert_load`): uniform popularity gives the uniform model exactly; skewed loads, placed
contiguously or by EPLB with redundant experts, against Monte Carlo routing; the files, the memory of
redundant experts, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from llmperf.analysis import estimate
from llmperf.analysis.roofline import ROOFLINE
from llmperf.analysis.routing import SkewedRouting, busiest_expert_load, expert_slots
from llmperf.cli import app
from llmperf.errors import SpecError
from llmperf.specs import load_model
from llmperf.specs.expert_load import ExpertLoad, expert_load_document, load_expert_load


def _sample(weights: np.ndarray, k: int, tokens: int, trials: int, rng: np.random.Generator) -> np.ndarray:
    """(trials, tokens, k) distinct experts per token, drawn without replacement in proportion to
    `weights` (Gumbel top-k): a skewed router."""
    keys = np.log(weights) - np.log(-np.log(rng.random((trials, tokens, weights.size))))
    return np.argpartition(-keys, k - 1, axis=2)[..., :k]


def _monte_carlo(picks: np.ndarray, share: np.ndarray, gpu: np.ndarray, replicas: np.ndarray, ep: int,
                 rng: np.random.Generator) -> tuple[float, float]:
    """(rows, distinct slots touched) of the busiest GPU, averaged over routings; a pick of expert e
    goes to one of its replicas at random (slots of e are consecutive, as `expert_slots` lays them)."""
    first = np.concatenate([[0], np.cumsum(replicas)[:-1]])
    slot = first[picks] + (rng.random(picks.shape) * replicas[picks]).astype(int)
    where = gpu[slot]
    trials = picks.shape[0]
    rows = np.stack([(where == g).sum(axis=(1, 2)) for g in range(ep)], axis=1)
    hit = np.zeros((trials, share.size), dtype=bool)
    np.put_along_axis(hit, slot.reshape(trials, -1), True, axis=1)
    touched = np.stack([hit[:, gpu == g].sum(axis=1) for g in range(ep)], axis=1)
    return float(rows.max(axis=1).mean()), float(touched.max(axis=1).mean())


@pytest.mark.parametrize(("experts", "k", "ep"), [(256, 8, 8), (128, 8, 4), (64, 6, 8), (8, 2, 2)])
def test_uniform_popularity_is_the_uniform_model(experts: int, k: int, ep: int) -> None:
    skew = SkewedRouting(np.full((2, experts), k / experts), k, ep)
    tokens = np.array([1, 3, 17, 64, 1000, 4096.5])
    assert np.allclose(skew.busiest(tokens), busiest_expert_load(tokens, experts, k, ep), rtol=1e-9)


# (experts, k, ep, redundant, skew): DeepSeek-V3 EP 8 with and without 32 redundant experts, Qwen3-30B-A3B EP 4
# with 16, a 64-expert k 6 model at EP 8; skew: the shape of the gamma weights (smaller: more skewed)
MC_CASES = [(256, 8, 8, None, 1.0), (256, 8, 8, 0, 1.0), (256, 8, 8, 32, 1.0), (128, 8, 4, 16, 0.5),
            (64, 6, 8, None, 2.0), (64, 6, 8, 8, 1.0)]


@pytest.mark.parametrize(("experts", "k", "ep", "redundant", "shape"), MC_CASES)
def test_a_skewed_router_matches_monte_carlo(experts: int, k: int, ep: int, redundant: int | None,
                                             shape: float) -> None:
    rng = np.random.default_rng(7)
    weights = rng.gamma(shape, size=experts)
    measured = np.bincount(_sample(weights / weights.sum(), k, 2000, 2, rng).ravel(), minlength=experts)
    popularity = measured / measured.sum() * k  # what a recorder measured, as --expert-load reads it
    skew = SkewedRouting(popularity[None, :], k, ep, redundant)
    share, gpu = expert_slots(popularity, ep, redundant)
    replicas = np.bincount(np.repeat(np.arange(experts), 1), minlength=experts)
    if redundant:
        replicas = np.ones(experts, dtype=int)
        for _ in range(redundant):
            replicas[int(np.argmax(popularity / replicas))] += 1
    for tokens in (1, 8, 64):
        trials = max(150, 120_000 // (tokens * experts))
        picks = _sample(weights / weights.sum(), k, tokens, trials, rng)
        mc_rows, mc_touched = _monte_carlo(picks, share, gpu, replicas, ep, rng)
        rows, touched = skew.busiest(tokens)
        assert rows == pytest.approx(mc_rows, rel=0.05), tokens
        assert touched == pytest.approx(mc_touched, rel=0.05), tokens


def test_eplb_replicates_the_hottest_experts_and_balances_the_gpus() -> None:
    popularity = np.array([4.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]) / 9.0 * 2  # k = 2
    share, gpu = expert_slots(popularity, 4, 4)
    assert share.size == 12 and np.bincount(gpu).tolist() == [3, 3, 3, 3]
    assert share.sum() == pytest.approx(2.0)  # the replicas split their expert's tokens
    assert np.allclose(share[:5], popularity[0] / 5)  # expert 0, the hottest per replica, got all 4 redundant slots
    contiguous = np.bincount(expert_slots(popularity, 4, None)[1], weights=popularity)
    balanced = np.bincount(gpu, weights=share)
    assert balanced.max() < contiguous.max() and balanced.max() == pytest.approx(0.5, rel=0.12)


def _skewed_file(path, experts: int, layers: int = 3, seed: int = 0, sglang: bool = True) -> str:
    rng = np.random.default_rng(seed)
    counts = np.round(rng.gamma(0.5, size=(layers, experts)) * 1000)
    if sglang:  # a leading axis (steps) is summed
        doc = {"logical_count": [counts.tolist(), counts.tolist()]}
    else:
        doc = expert_load_document(dict(enumerate(counts)), experts, model="m", experts_per_token=8, source="t")
    path.write_text(json.dumps(doc))
    return str(path)


def test_both_file_formats_read_the_same_shares(tmp_path) -> None:
    a = load_expert_load(_skewed_file(tmp_path / "sglang.json", 128))
    b = load_expert_load(_skewed_file(tmp_path / "llmperf.json", 128, sglang=False))
    assert a.layers == b.layers == (0, 1, 2)
    assert np.allclose(a.popularity(128, 8), b.popularity(128, 8))
    assert np.allclose(a.popularity(128, 8).sum(axis=1), 8.0)


@pytest.mark.parametrize(("doc", "message"), [
    ({"logical_count": [[1, 2, -1, 4]]}, "finite and non-negative"),
    ({"logical_count": [[0, 0, 0, 0], [1, 1, 1, 1]]}, "layer 0 has no rows"),
    ({"logical_count": [["a", 1]]}, "lists of numbers"),
    ({"format": "other", "layers": []}, "format must be"),
    ({"format": "llmperf-expert-load", "layers": [{"layer": 0, "counts": [1, 2]}, {"layer": 0, "counts": [1, 2]}]},
     "distinct integers"),
    ({"format": "llmperf-expert-load", "num_experts": 3, "layers": [{"layer": 0, "counts": [1, 2]}]},
     "num_experts is 3"),
])
def test_bad_files_are_refused_naming_the_field(tmp_path, doc: dict, message: str) -> None:
    path = tmp_path / "load.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=message) as err:
        load_expert_load(path)
    assert str(err.value).startswith("expert_load:")


def test_a_load_must_fit_the_model() -> None:
    load = ExpertLoad(counts=np.array([[10.0, 1, 1, 1]]), layers=(5,), source="x.json")
    with pytest.raises(SpecError, match="4 experts per layer, the model 8"):
        load.popularity(8, 2)
    with pytest.raises(SpecError, match="layer 5 expert 0 takes 76.9% of the rows, more than one in k = 2"):
        load.popularity(4, 2)


def test_estimate_prices_the_skew_and_the_redundant_experts(tmp_path) -> None:
    path = _skewed_file(tmp_path / "load.json", 256)
    opts = dict(batch=64, prompt_len=2048, gen_len=16, precision="fp8", tp=8, ep=8, time_model=ROOFLINE)
    plain = estimate("deepseek-v3", "h200", **opts).summary()
    skewed = estimate("deepseek-v3", "h200", expert_load=path, **opts).summary()
    balanced = estimate("deepseek-v3", "h200", expert_load=path, eplb=32, **opts).summary()
    # the hot GPU gets more rows: prefill waits longer; fewer distinct experts: decode reads fewer weights
    assert skewed["ttft_s"] > plain["ttft_s"] and skewed["ep_busiest_rows"] > plain["ep_busiest_rows"]
    assert skewed["ep_busiest_experts"] < plain["ep_busiest_experts"]
    assert balanced["ttft_s"] < skewed["ttft_s"]  # EPLB spreads the hot experts' rows
    assert skewed["expert_load"] == path and skewed["eplb"] is None and balanced["eplb"] == 32
    assert plain["expert_load"] is None
    # 32 redundant experts over 8 GPUs: 4 more routed experts a GPU in each of the 58 MoE layers
    m = load_model("deepseek-v3")
    expert_bytes = 3 * m.hidden_size * m.expert_ffn_size * 1.0  # fp8, plus its block scales
    extra = (balanced["weights_gib"] - skewed["weights_gib"]) * 2**30
    assert extra == pytest.approx(4 * 58 * expert_bytes, rel=0.01)


def test_estimate_without_expert_parallelism_reads_the_experts_a_skewed_router_touches(tmp_path) -> None:
    path = _skewed_file(tmp_path / "load.json", 128)
    opts = dict(batch=16, prompt_len=512, gen_len=8, time_model=ROOFLINE)
    plain = estimate("qwen3-30b-a3b", "h100-sxm", **opts).summary()
    skewed = estimate("qwen3-30b-a3b", "h100-sxm", expert_load=path, **opts).summary()
    assert skewed["tpot_s"] < plain["tpot_s"]  # decode is weight-bound: fewer distinct experts read
    assert skewed["ep_busiest_rows"] == plain["ep_busiest_rows"] == 1.0


@pytest.mark.parametrize(("args", "message"), [
    (["--tp", "8", "--ep", "8", "--eplb", "3"], "eplb: 256 experts + 3 redundant do not divide over ep=8 GPUs"),
    (["--tp", "8", "--eplb", "8"], "eplb: 8 needs expert parallelism (ep > 1)"),
    (["--tp", "8", "--ep", "8", "--eplb", "-1"], "eplb: must be an integer >= 0"),
])
def test_the_command_line_refuses_an_impossible_balancer(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["estimate", "deepseek-v3", "-H", "h200", *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_the_command_line_refuses_a_load_of_another_model(tmp_path) -> None:
    path = _skewed_file(tmp_path / "load.json", 128)
    res = CliRunner().invoke(app, ["estimate", "deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8",
                                   "--expert-load", path])
    assert res.exit_code == 2 and "expert_load:" in res.output and "128 experts per layer, the model 256" in res.output
    res = CliRunner().invoke(app, ["estimate", "llama-3.1-8b", "--expert-load", path])
    assert res.exit_code == 2 and "needs a mixture-of-experts model" in res.output


def test_the_command_line_says_what_priced_the_experts(tmp_path) -> None:
    path = _skewed_file(tmp_path / "load.json", 256)
    res = CliRunner().invoke(app, ["estimate", "deepseek-v3", "-H", "h200", "--dtype", "fp8", "--tp", "8", "--ep", "8",
                                   "--expert-load", path, "--eplb", "32", "-f", "json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["configurations"][0]
    assert row["expert_load"] == path and row["eplb"] == 32
    res = CliRunner().invoke(app, ["estimate", "deepseek-v3", "-H", "h200", "--dtype", "fp8", "--tp", "8", "--ep", "8",
                                   "--expert-load", path, "--eplb", "32"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.replace("│", " ").split())  # the table's cell wraps at the terminal's width
    assert "placed by EPLB with 32 redundant experts" in text and "measured load of load.json" in text
