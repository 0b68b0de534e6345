"""StreamingLLM on the engine (`llmperf.engine.streaming`): token for token the engine's own sliding-window
model when there are no sinks, and an uncached forward of the whole sequence under the rule's exact
mask when there are (sdpa, naive, and triton: under its interpreter on a CPU, compiled on CUDA); a
window past the whole sequence is plain decoding; the cache never holds more than S + W tokens a
sequence (positions past the rotary table's first size included); the CPU's one-call decode gives the
same tokens; bad input is refused by name."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from llmperf.engine import Engine, SamplingParams, StreamingKVCache, build_model
from llmperf.engine.cpu import kernels
from llmperf.engine.step import StepMeta
from llmperf.engine.streaming import StreamingResult, streaming_generate

from engine_testing import kernels_available, tiny

# Prompt lengths 3, 10 and 6: shorter and longer than the windows below (S + W of 5 to 8).
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [20, 21, 22, 23, 24, 25]]
N = 24  # max_new_tokens: the generation crosses every window below several times
_MLA = dict(num_experts=4, experts_per_token=2, moe_ffn_size=32, num_layers=5, kv_lora_rank=32, q_lora_rank=48,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=None, rotary_dim=8, router_groups=1,
            router_topk_groups=1, shared_ffn_size=None)
# the Triton kernels on CPU tensors: their interpreter (conftest sets it where there is no CUDA device)
TRITON_ON_CPU = kernels_available()[0] and os.environ.get("TRITON_INTERPRET") == "1"
FAMILIES = {"llama": ("llama-3.1-8b", {}), "qwen3": ("qwen3-8b", {}),  # RoPE; RoPE and q/k norms
            "deepseek": ("deepseek-v3", _MLA)}  # latent attention, its latent cache compacted


def _plain(model, prompts=PROMPTS, max_new_tokens=N, eos_token_id=None) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
    return [o.tokens for o in Engine(model, cache="contiguous").generate(prompts, params)]


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---------------------------------------------------------------------------------------------------
# The uncached reference: the whole sequence every step, each query under the rule's mask


def _rule_mask(T: int, S: int, W: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(T, T) bool: query i sees key j iff j <= i and (j < S or j > i - W)."""
    i, j = torch.arange(T, device=device)[:, None], torch.arange(T, device=device)[None, :]
    return (j <= i) & ((j < S) | (j > i - W))


def _rule_attention(S: int, W: int):
    """An `attend=` function: eager SDPA over the step's own K and V with the rule's mask."""
    def attend(layer, q, k, v, meta, rec):
        B, T, H, D = q.shape
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=_rule_mask(T, S, W, q.device), scale=meta.attn(layer, D).scale,
                                           enable_gqa=True)  # (B, H, T, D)
        return o.transpose(1, 2).reshape(B, T, H * D)
    return attend


class _RuleMeta(StepMeta):
    """A full forward from position 0 without a cache whose mask is the rule's: latent attention picks
    its own form per backend (no `attend=`), and the naive backend masks through the step."""

    rule: tuple[int, int] = (0, 1)

    def mask(self, S, p=None):
        return _rule_mask(S, *self.rule)[None, None]  # (1, 1, T, S)


@torch.inference_mode()
def _reference(model, S: int, W: int, prompts=PROMPTS, max_new_tokens=N) -> list[list[int]]:
    out = []
    for prompt in prompts:
        seq = list(prompt)
        for _ in range(max_new_tokens):
            tokens = torch.tensor([seq], device=model.device)
            if model.spec.is_mla:
                assert model.attention_backend == "naive"
                meta = _RuleMeta(positions=torch.arange(len(seq))[None], starts=(0,), q_len=len(seq))
                meta.rule = (S, W)
                seq.append(model(tokens, meta).argmax(-1).item())
            else:
                seq.append(model(tokens, attend=_rule_attention(S, W)).argmax(-1).item())
        out.append(seq[len(prompt):])
    return out


@pytest.fixture(scope="module")
def llama():
    spec = tiny("llama-3.1-8b")
    return spec, build_model(spec, seed=0)


# ---------------------------------------------------------------------------------------------------
# Exactness


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("window", [4, 7])
def test_no_sinks_is_the_engines_sliding_window(family, window):
    name, changes = FAMILIES[family]
    spec = tiny(name, **changes)
    model = build_model(spec, seed=3)
    sliding = build_model(spec.scaled(sliding_window=window), seed=3)
    assert _same_weights(model, sliding)  # the window changes no parameter: one seed, the same weights
    expected = _plain(sliding)
    assert expected != _plain(model)  # the window matters (the test can fail)
    res = streaming_generate(model, PROMPTS, sink_tokens=0, window=window, max_new_tokens=N)
    assert res.tokens == expected


@pytest.mark.parametrize("family,sinks,window", [("llama", 1, 4), ("llama", 3, 5), ("qwen3", 2, 4),
                                                 ("deepseek", 2, 4)])
def test_sinks_follow_the_rule(family, sinks, window):
    name, changes = FAMILIES[family]
    spec = tiny(name, **changes)
    attention = "naive" if spec.is_mla else "sdpa"
    model = build_model(spec, seed=0, attention=attention)
    expected = _reference(model, sinks, window)
    assert expected != _plain(model)  # the rule differs from full attention (the test can fail)
    assert expected != _reference(model, 0, window)  # and the sinks matter
    for backend in ("sdpa", "naive", "triton") if TRITON_ON_CPU else ("sdpa", "naive"):
        model.set_attention(backend)  # triton: its kernels read the slots from seq_lens
        res = streaming_generate(model, PROMPTS, sink_tokens=sinks, window=window, max_new_tokens=N)
        assert res.tokens == expected, backend
        assert res.max_slots == sinks + window


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cuda_backends_follow_the_rule(family):
    name, changes = FAMILIES[family]
    model = build_model(tiny(name, **changes), seed=0, device="cuda")
    expected = _reference(model, 2, 4)
    assert expected != _reference(model, 0, 4)
    for backend in ("sdpa", "triton") if kernels_available()[0] else ("sdpa",):
        model.set_attention(backend)
        res = streaming_generate(model, PROMPTS, sink_tokens=2, window=4, max_new_tokens=N)
        assert res.tokens == expected, backend


@pytest.mark.parametrize("sinks,window", [(0, 40), (2, 38), (4, 200)])
def test_a_window_past_the_sequence_is_plain_decoding(llama, sinks, window):
    _, model = llama
    res = streaming_generate(model, PROMPTS, sink_tokens=sinks, window=window, max_new_tokens=N)
    assert res.tokens == _plain(model)
    assert res.max_slots == max(len(p) for p in PROMPTS) + N - 1  # nothing evicted: the last token is never fed


def test_one_call_decode_gives_the_same_tokens(llama, monkeypatch):
    """The CPU's one-call decode takes the rotary tables at the absolute positions and the slots from
    `seq_lens`: the same tokens with it and without it (where the kernels run, it did run)."""
    _, model = llama
    calls = []
    real = kernels.decode_layers
    monkeypatch.setattr(kernels, "decode_layers", lambda *a, **k: calls.append(1) or real(*a, **k))
    one_call = streaming_generate(model, PROMPTS, sink_tokens=2, window=4, max_new_tokens=N)
    ran = len(calls)
    model.decode_in_one_call = False
    try:
        layers = streaming_generate(model, PROMPTS, sink_tokens=2, window=4, max_new_tokens=N)
    finally:
        model.decode_in_one_call = True
    assert len(calls) == ran
    assert one_call.tokens == layers.tokens
    if kernels.use_layers_for(torch.zeros(1, 1, model.spec.hidden_size)):
        assert ran == len(one_call.steps)


def test_eos_stops_a_sequence_and_the_others_go_on(llama):
    _, model = llama
    full = streaming_generate(model, PROMPTS, sink_tokens=1, window=5, max_new_tokens=N).tokens
    eos = full[1][4]  # a token the second prompt emits mid-way
    expected = [t[:t.index(eos) + 1] if eos in t else t for t in full]
    assert len(expected[1]) == full[1].index(eos) + 1 < N
    res = streaming_generate(model, PROMPTS, sink_tokens=1, window=5, max_new_tokens=N, eos_token_id=eos)
    assert res.tokens == expected


# ---------------------------------------------------------------------------------------------------
# The cache and the result


def test_long_stream_stays_within_its_slots():
    """300 tokens past a 16-slot row, positions past the rotary table's first 256 rows: the engine's
    sliding window of 16 token for token (no sinks), and never more than S + W slots."""
    spec = tiny("llama-3.1-8b", max_positions=512)
    model = build_model(spec, seed=1)
    prompts, n = [[1, 2, 3, 4, 5], list(range(30, 50))], 300
    res = streaming_generate(model, prompts, sink_tokens=0, window=16, max_new_tokens=n)
    assert res.tokens == _plain(build_model(spec.scaled(sliding_window=16), seed=1), prompts, n)
    res = streaming_generate(model, prompts, sink_tokens=4, window=12, max_new_tokens=n)
    assert res.prefill_slots == [5, 16]
    # every token after the first forward's, bar each sequence's last, is fed one step at a time
    assert len(res.steps) == 20 + n - 1 - 16
    assert res.max_slots == 16 and all(s.max_slots <= 16 for s in res.steps)
    assert all(slots == min(p + 1, 16) for s in res.steps for p, slots in zip(s.positions, s.slots))
    assert [s.positions for s in res.steps[:2]] == [(5, 16), (6, 17)]
    assert res.steps[n - 2].positions == (5 + n - 2, 16 + n - 2)  # the first sequence's last step
    assert res.steps[-1].positions == (20 + n - 2,)  # it left: the second goes on alone
    assert all(s.seconds >= 0 and s.evict_s >= 0 for s in res.steps)
    assert res.decode_s == pytest.approx(sum(s.seconds for s in res.steps))
    assert min(res.prefill_s, res.wall_s) >= 0


def test_result_as_json_and_frame(llama):
    _, model = llama
    res = streaming_generate(model, PROMPTS, sink_tokens=2, window=4, max_new_tokens=5)
    assert isinstance(res, StreamingResult) and (res.sink_tokens, res.window) == (2, 4)
    data = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert data["tokens"] == res.tokens and data["max_slots"] == 6 and len(data["steps"]) == len(res.steps)
    assert data["steps"][0]["positions"] == list(res.steps[0].positions)
    frame = res.steps_frame()
    assert list(frame.columns) == ["batch", "max_position", "max_slots", "evict_s", "seconds"]
    assert len(frame) == len(res.steps) and frame["max_slots"].max() == 6


def test_evict_compacts_the_full_rows():
    """Slots hold their token's position; a full row drops its oldest non-sink token by moving the newest
    (the last slot) into its slot, and keeps the sinks and the last W - 1 tokens."""
    spec = tiny("llama-3.1-8b")
    cache = StreamingKVCache(spec, sink_tokens=2, window=4, max_batch=3)
    for seq, n in ((0, 6), (1, 4), (2, 6)):
        assert cache.allocate(seq, n)
        cache.kv[:, :, cache.row(seq), :, :n] = torch.arange(n, dtype=cache.dtype)[:, None]
    assert cache.evict([0, 1]) == 1  # row 2 is full but not asked; row 1 is not full
    assert cache.kv[0, 1, cache.row(0), 0, :, 0].tolist() == [0, 1, 5, 3, 4, 5]  # the last slot is now free
    assert cache.kv[0, 0, cache.row(2), 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert (cache.seq_len(0), cache.length(0), cache.seq_len(1)) == (5, 6, 4)
    assert cache.reserve(0, 1) and cache.reserve(1, 1)
    meta = cache.prepare([0, 1], 1)
    assert meta.positions.tolist() == [[6], [4]] and meta.starts == (5, 4) and meta.max_position == 6
    assert not cache.reserve(0, 1)  # full again: the next step evicts first
    cache.kv[:, :, cache.row(0), :, 5] = 6.0  # the token at position 6, written in the last slot
    for position in (7, 8, 9):  # each step drops the oldest window token: 3, 4, 5, then 6
        assert cache.evict([0]) == 1 and cache.reserve(0, 1)
        cache.kv[:, :, cache.row(0), :, 5] = float(position)
    assert sorted(cache.kv[0, 0, cache.row(0), 0, :, 0].tolist()) == [0, 1, 6, 7, 8, 9]  # sinks + the last 4
    with pytest.raises(ValueError, match="window"):
        StreamingKVCache(spec, sink_tokens=2, window=0, max_batch=1)


# ---------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("kwargs,field", [
    (dict(sink_tokens=-1), "sink_tokens"), (dict(sink_tokens=1.0), "sink_tokens"),
    (dict(sink_tokens=True), "sink_tokens"),
    (dict(window=0), "window"), (dict(window="4"), "window"), (dict(sink_tokens=0, window=1), "window"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(max_new_tokens=248), "max_new_tokens"),  # the longest prompt (10) + 248 > max_positions 256 + 1
    (dict(prompts=[[1, 256]]), r"prompts\[0\]"), (dict(prompts=[[]]), r"prompts\[0\]"),
    (dict(eos_token_id=300), "eos_token_id"), (dict(eos_token_id=-1), "eos_token_id"),
])
def test_bad_input_is_refused_by_name(llama, kwargs, field):
    _, model = llama
    args = dict(prompts=PROMPTS, sink_tokens=2, window=4, max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=field):
        streaming_generate(model, args.pop("prompts"), **args)


def test_a_stream_may_reach_max_positions(llama):
    spec, model = llama
    prompt = list(range(10))
    res = streaming_generate(model, [prompt], sink_tokens=2, window=4, max_new_tokens=spec.max_positions - 9)
    assert len(res.tokens[0]) == spec.max_positions - 9  # the engine's limit: prompt + new <= max_positions + 1
    assert res.steps[-1].max_position == spec.max_positions - 1  # the last token is never fed


@pytest.mark.parametrize("name,changes", [
    ("mistral-7b", dict(sliding_window=6)),
    ("gemma-3-27b", dict(num_layers=4, sliding_window=4, layer_types=("sliding", "full", "sliding", "full"))),
])
def test_models_that_bound_their_attention_are_refused(name, changes):
    model = build_model(tiny(name, **changes), seed=0)
    with pytest.raises(ValueError, match="model: .* already bounds its attention"):
        streaming_generate(model, PROMPTS, sink_tokens=2, window=4, max_new_tokens=4)


def test_a_model_must_be_the_engines():
    with pytest.raises(ValueError, match="model: must be an llmperf.engine Transformer"):
        streaming_generate("llama", PROMPTS, sink_tokens=2, window=4, max_new_tokens=4)


def test_the_cache_refuses_rollback_fork_and_reorder():
    cache = StreamingKVCache(tiny("llama-3.1-8b"), sink_tokens=1, window=3, max_batch=2)
    assert cache.allocate(0, 2) and cache.allocate(1, 2)
    for call, name in ((lambda: cache.truncate(0, 1), "truncate"), (lambda: cache.fork(0, 5), "fork"),
                       (lambda: cache.reorder([0, 1], [1, 0]), "reorder")):
        with pytest.raises(ValueError, match=f"^{name}: a StreamingKVCache"):
            call()
