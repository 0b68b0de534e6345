"""Issue 8's defects, one regression test each, and a property test with injected failures: the
engine survives bad requests, pools too small and failing steps, and its pool always comes back
whole. Scheduling decisions (which request is preempted, where it goes) are asserted, not only
tokens (recompute keeps tokens right even when the decisions are wrong)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmperf.engine import Engine, SamplingParams, build_model, from_pretrained
from llmperf.engine.sampling import top_p_filter
from llmperf.engine.workload import Request

from engine_testing import check_schedule, hf_twin, make_model, tiny


@pytest.fixture(scope="module")
def model():
    return make_model("llama", seed=3)


def _alone(model, prompt, params, seed=0):
    return [c.tokens for c in Engine(model, cache="contiguous").generate([prompt], params, seed=seed)[0].completions]


# --- 1: a preempted multi-sample / beam request is recomputed with its fork structure ------------


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=10, do_sample=True, num_return_sequences=3),
                                    SamplingParams(max_new_tokens=10, num_beams=3, num_return_sequences=2)])
def test_preempted_multi_sequence_request_comes_back_forked(model, params):
    long = Request(request_id=0, prompt=tuple(range(1, 13)), max_new_tokens=12)
    wide = Request(request_id=1, prompt=tuple(range(30, 42)), max_new_tokens=10, sampling=params)
    # The wide request needs 3 prompt blocks + 3 x 3 of its own = 12 alone: it fits a pool of 12,
    # but not beside the long one, so it is preempted (it is the newest) and recomputed.
    engine = Engine(model, cache="paged", block_size=4, num_blocks=12, watermark=0.0)
    result = engine.serve([long, wide], realtime=False, seed=5)
    assert result.outputs[1].metrics.num_preemptions >= 1
    check_schedule(engine.last_schedule)
    back = [i for log in engine.last_schedule for i in log.items if i.request_id == 1 and i.start == 0]
    assert len(back) >= 2 and all(len(i.seq_ids) == 1 for i in back), "the prompt is recomputed once"
    assert back[-1].fork_into, "then forked into the other sequences"
    assert [c.tokens for c in result.outputs[1].completions] == _alone(model, list(wide.prompt), params, seed=6)
    assert engine.cache.num_free_blocks == 12


def test_a_shortage_names_what_is_short(model):
    engine = Engine(model, cache="paged", block_size=4, num_blocks=8)
    params = SamplingParams(max_new_tokens=12, do_sample=True, num_return_sequences=3)
    with pytest.raises(ValueError, match=r"needs up to 12 blocks .* the cache has 8"):
        engine.generate([list(range(1, 13))], params)
    assert engine.cache.num_free_blocks == 8


# --- 2: an engine with a fixed pool survives any exception in generate -------------------------


def test_engine_is_reusable_after_a_bad_request(model):
    engine = Engine(model, cache="paged", block_size=4, num_blocks=16)
    ok = SamplingParams(max_new_tokens=5)
    with pytest.raises(ValueError, match="bad_words_ids"):
        engine.generate([[1, 2, 3], [4, 5]], [ok, SamplingParams(max_new_tokens=5, bad_words_ids=[[9999]])])
    assert engine.cache.num_free_blocks == 16 and engine.cache.num_seqs == 0
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1, 2, 3], list(range(80))], ok)
    assert engine.cache.num_free_blocks == 16
    assert engine.generate([[1, 2, 3]], ok)[0].tokens == _alone(model, [1, 2, 3], ok)[0]


def test_engine_is_reusable_after_a_step_fails(model, monkeypatch):
    engine = Engine(model, cache="paged", block_size=4, num_blocks=32)
    ok = SamplingParams(max_new_tokens=6, do_sample=True, num_return_sequences=2)
    calls = {"n": 0}
    real = type(model).forward

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate([[1, 2, 3], [4, 5, 6, 7]], ok)
    monkeypatch.undo()
    assert engine.cache.num_free_blocks == 32 and engine.cache.num_seqs == 0
    engine.cache.check_invariants()
    assert [c.tokens for c in engine.generate([[1, 2, 3]], ok)[0].completions] == _alone(model, [1, 2, 3], ok)


@pytest.mark.parametrize("kind", ["paged", "contiguous"])
def test_a_fork_failing_halfway_leaves_nothing_behind(model, monkeypatch, kind):
    """The second of a 3-sample request's two forks fails: the first child is in the cache but the
    request is not yet marked forked. Everything is freed all the same."""
    from llmperf.engine import ContiguousKVCache, PagedKVCache

    owner = PagedKVCache if kind == "paged" else ContiguousKVCache
    engine = Engine(model, cache=kind, block_size=4, num_blocks=16, max_batch=3 if kind == "contiguous" else None,
                    max_seq_len=16 if kind == "contiguous" else None)
    total = engine.cache.num_blocks
    real, calls = owner.fork, {"n": 0}

    def flaky(self, parent, child):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure")
        return real(self, parent, child)

    monkeypatch.setattr(owner, "fork", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=4, do_sample=True, num_return_sequences=3))
    monkeypatch.undo()
    assert calls["n"] == 2 and engine.cache.num_seqs == 0 and engine.cache.num_free_blocks == total


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 10), st.integers(1, 8), st.sampled_from(["greedy", "sample", "beam", "bad"])),
                min_size=1, max_size=5),
       st.integers(4, 24), st.one_of(st.none(), st.integers(1, 6)), st.sampled_from(["forward", "reserve", "fork"]),
       st.booleans(), st.sampled_from(["paged", "contiguous"]))
def test_random_workloads_with_failures_leave_the_pool_empty(model, spec, num_blocks, fail_at, where, chunked, kind):
    """Random requests (some bad), pools too small, and a failure injected at the `fail_at`-th call of
    the model's forward, the cache's `reserve` or its `fork`: the pool comes back whole every time and
    the engine serves the next call."""
    from llmperf.engine import ContiguousKVCache, PagedKVCache

    size = dict(block_size=4, num_blocks=num_blocks) if kind == "paged" else dict(max_batch=max(3, num_blocks // 4),
                                                                                 max_seq_len=24)
    engine = Engine(model, cache=kind, chunked_prefill=chunked, max_batched_tokens=8 if chunked else None, **size)
    total = engine.cache.num_blocks
    # three samples: a fork that fails after the first of a request's two forks leaves a child behind
    kinds = {"greedy": SamplingParams(max_new_tokens=4), "sample": SamplingParams(max_new_tokens=4, do_sample=True,
                                                                                   num_return_sequences=3),
             "beam": SamplingParams(max_new_tokens=4, num_beams=2), "bad": SamplingParams(max_new_tokens=4,
                                                                                        eos_token_id=10 ** 6)}
    prompts = [list(range(1, 1 + p + o)) for p, o, _ in spec]
    params = [kinds[k] for _, _, k in spec]
    owner = type(model) if where == "forward" else PagedKVCache if kind == "paged" else ContiguousKVCache
    real = getattr(owner, where)
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if fail_at is not None and calls["n"] == fail_at:
            raise RuntimeError("injected failure")
        return real(self, *args, **kwargs)

    setattr(owner, where, flaky)
    try:
        engine.generate(prompts, params)
    except (ValueError, RuntimeError):
        pass
    finally:
        setattr(owner, where, real)
    assert engine.cache.num_free_blocks == total and engine.cache.num_seqs == 0
    if kind == "paged":
        engine.cache.check_invariants()
    out = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, do_sample=True, num_return_sequences=2))
    assert [len(c.tokens) for c in out[0].completions] == [2, 2] and engine.cache.num_free_blocks == total


# --- 3: the position limit is HF's: the last token is never fed back ----------------------------


def test_position_limit_matches_hf_at_the_edge():
    pytest.importorskip("transformers")
    spec = tiny("gpt2", num_kv_heads=4, ffn_size=256, max_positions=16)
    model = build_model(spec, seed=2)
    hf = hf_twin(model)
    engine = Engine(model)
    for prompt_len, new in ((15, 2), (16, 1)):
        prompt = list(range(3, 3 + prompt_len))
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, prompt_len, dtype=torch.long),
                              max_new_tokens=new, do_sample=False)[0, prompt_len:].tolist()
        assert engine.generate([prompt], SamplingParams(max_new_tokens=new))[0].tokens == ref
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([list(range(15))], SamplingParams(max_new_tokens=3))


# --- 5: bad input is a ValueError naming the argument --------------------------------------------


def test_bad_input_names_the_argument(model):
    engine = Engine(model)
    with pytest.raises(ValueError, match="params"):
        engine.generate([[1, 2, 3]], {"max_new_tokens": 3})
    with pytest.raises(ValueError, match="prompts"):
        engine.generate([np.int64(1), np.int64(2)])
    with pytest.raises(ValueError, match="prompts"):
        engine.generate("hello")
    with pytest.raises(ValueError, match="eos_token_id"):
        engine.generate([[1, 2]], SamplingParams(eos_token_id=100_000))
    with pytest.raises(ValueError, match="seed"):
        engine.generate([[1, 2]], seed=-1)
    with pytest.raises(ValueError, match="stop_sequences"):
        engine.generate([[1, 2]], SamplingParams(stop_sequences=[[100_000]]))
    with pytest.raises(ValueError, match=r"requests\[0\]"):
        engine.serve([[1, 2, 3]], realtime=False)
    with pytest.raises(ValueError, match="requests"):
        engine.serve({"a": 1}, realtime=False)
    reqs = [Request(request_id=i, prompt=(1, 2, 3), max_new_tokens=2) for i in range(2)]
    served = engine.serve((r for r in reqs), realtime=False)  # a generator is read once
    assert [o.request_id for o in served.outputs] == [0, 1] and all(len(o.tokens) == 2 for o in served.outputs)
    with pytest.raises(ValueError, match="attention"):
        Engine(model, attention="flash")
    with pytest.raises(ValueError, match="prefix_sharing"):
        Engine(model, cache="contiguous", prefix_sharing=True)


# --- 6: rough edges ------------------------------------------------------------------------------


def test_from_pretrained_stops_at_the_checkpoint_eos(tmp_path):
    pytest.importorskip("transformers")
    model = make_model("llama", seed=9)
    prompt = [5, 6, 7]
    greedy = Engine(model).generate([prompt], SamplingParams(max_new_tokens=8))[0].tokens
    eos = greedy[3]  # the 4th greedy token becomes the checkpoint's EOS
    hf = hf_twin(model)
    hf.config.eos_token_id = eos
    hf.generation_config.eos_token_id = eos
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "generation_config.json").read_text())
    assert cfg["eos_token_id"] == eos
    loaded = from_pretrained(tmp_path, dtype="fp32")
    assert loaded.eos_token_id == eos
    out = Engine(loaded).generate([prompt])[0]
    assert out.tokens == greedy[:greedy.index(eos) + 1] and out.completions[0].finish_reason == "eos"
    # Given params stop there too (HF merges a call's kwargs over the generation config), unless
    # they say otherwise; serve() resolves it the same way.
    engine = Engine(loaded)
    assert engine.generate([prompt], SamplingParams(max_new_tokens=8))[0].tokens == out.tokens
    assert engine.generate([prompt], SamplingParams(max_new_tokens=8, eos_token_id=None))[0].tokens == greedy
    assert engine.generate([prompt], SamplingParams(max_new_tokens=8, eos_token_id=greedy[1]))[0].tokens == greedy[:2]
    served = engine.serve([Request(request_id=0, prompt=tuple(prompt), max_new_tokens=8)], realtime=False)
    assert served.outputs[0].tokens == out.tokens
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 3, dtype=torch.long), max_new_tokens=8,
                          do_sample=False)[0, 3:].tolist()
    assert ref == out.tokens  # HF itself stops at the generation config's EOS with only max_new_tokens given


def test_a_checkpoint_eos_outside_the_vocabulary_is_named_as_the_checkpoints():
    model = make_model("llama", seed=9)
    model.eos_token_id = 50256  # as a tiny GPT-2 checkpoint's config.json may say
    engine = Engine(model)
    with pytest.raises(ValueError, match=r"eos_token_id: .*50256.*the checkpoint's EOS"):
        engine.generate([[1, 2]])
    assert len(engine.generate([[1, 2]], SamplingParams(max_new_tokens=2, eos_token_id=None))[0].tokens) == 2


def test_attention_backend_belongs_to_the_engine(model):
    from llmperf.engine import Recorder

    naive = Engine(model, attention="naive")
    plain = Engine(model)
    assert model.attention_backend == "sdpa" and plain.attention == "sdpa" and naive.attention == "naive"
    rec_plain, rec_naive = Recorder(), Recorder()
    a = plain.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3), recorder=rec_plain)[0].tokens
    b = naive.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3), recorder=rec_naive)[0].tokens
    assert a == b
    assert "attn_score" not in set(rec_plain.trace.to_frame().op) and "attention" in set(rec_plain.trace.to_frame().op)
    assert "attn_score" in set(rec_naive.trace.to_frame().op)


@pytest.mark.parametrize("block_size, num_blocks, prompt_len", [(2, 12, 4), (2, 20, 8), (4, 12, 8), (2, 30, 8)])
def test_small_pool_never_thrashes(model, block_size, num_blocks, prompt_len):
    # < 100 blocks: a 1% watermark alone rounds to 0 or 1 block, and with only that as admission
    # headroom the first three cases re-admit and preempt the same request on consecutive steps.
    reqs = [Request(request_id=i, prompt=tuple(range(1 + i, 1 + i + prompt_len)), max_new_tokens=12)
            for i in range(6)]
    engine = Engine(model, cache="paged", block_size=block_size, num_blocks=num_blocks)
    result = engine.serve(reqs, realtime=False)
    assert result.num_preemptions > 0
    check_schedule(engine.last_schedule)  # no preemption right after admission, none twice without progress
    assert engine.cache.num_free_blocks == num_blocks


# --- the mutation survivors: scheduling decisions and the top-p boundary -------------------------


def test_preemption_takes_the_newest_and_requeues_it_at_the_front(model):
    reqs = [Request(request_id=i, prompt=tuple(range(1 + i, 6 + i)), max_new_tokens=16) for i in range(5)]
    engine = Engine(model, cache="paged", block_size=4, num_blocks=14, watermark=0.0)
    result = engine.serve(reqs, realtime=False)
    assert result.num_preemptions > 0
    check_schedule(engine.last_schedule)


def test_check_schedule_catches_wrong_decisions():
    from llmperf.analysis.vocabulary import Phase
    from llmperf.serving import StepLog

    def log(step, admitted=(), preempted=(), finished=()):
        return StepLog(step=step, phase=Phase.decode, start_s=0, duration_s=0, items=(), admitted=admitted,
                       preempted=preempted, finished=finished, num_running=0, num_waiting=0, free_blocks=0)

    with pytest.raises(AssertionError, match="newest"):  # preempting the oldest
        check_schedule([log(0, admitted=(0, 1)), log(1, preempted=(0,))])
    with pytest.raises(AssertionError, match="front"):  # the preempted request went to the back
        check_schedule([log(0, admitted=(0, 1)), log(1), log(2, preempted=(1,)), log(3, admitted=(2,))])
    with pytest.raises(AssertionError, match="thrash"):  # admitted, then preempted at once
        check_schedule([log(0, admitted=(0,)), log(1, admitted=(1,)), log(2, preempted=(1,))])
    with pytest.raises(AssertionError, match="without producing a token"):  # preempted twice, no progress
        check_schedule([log(0, admitted=(0, 1)), log(1), log(2, preempted=(1,)), log(3, admitted=(1,)), log(4),
                        log(5, preempted=(1,))])
    check_schedule([log(0, admitted=(0, 1)), log(1), log(2, preempted=(1,)), log(3, admitted=(1,)),
                    log(4, finished=(0, 1))])


def test_top_p_keeps_the_boundary_token_as_hf_does():
    transformers = pytest.importorskip("transformers")
    logits = torch.zeros(1, 4)  # probabilities exactly 1/4: cumulative 0.25, 0.5, 0.75, 1
    ours = top_p_filter(logits, 0.75)
    assert int(torch.isfinite(ours).sum()) == 3, "the token that brings the mass to exactly p is kept"
    hf = transformers.TopPLogitsWarper(top_p=0.75)(torch.zeros(1, 1, dtype=torch.long), logits.clone())
    assert torch.equal(torch.isfinite(ours), torch.isfinite(hf))


def test_checkpoint_eos_is_decided_as_transformers_decides_it(tmp_path):
    """generation_config.json decides alone (no eos_token_id there: never stop, as transformers reloads
    it as None); config.json decides only without one; several ids stop on any (Llama 3, Qwen3)."""
    from llmperf.engine.weights import checkpoint_eos

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert checkpoint_eos(tmp_path) == 2  # no generation config: config.json's
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))
    assert checkpoint_eos(tmp_path) is None  # a generation config without EOS: none, not config.json's 2
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert checkpoint_eos(tmp_path) == (7, 9)
    model = make_model("llama", seed=9)
    prompt = [5, 6, 7]
    greedy = Engine(model).generate([prompt], SamplingParams(max_new_tokens=8))[0].tokens
    model.eos_token_id = (greedy[5], greedy[2])  # any of several ends the sequence, the first reached
    assert Engine(model).generate([prompt])[0].tokens[-1] == greedy[2]


def test_a_checkpoint_that_does_not_match_its_config_is_refused_before_allocation(tmp_path, monkeypatch):
    """A tensor of the wrong shape, or a missing one, is named with both shapes from the safetensors
    headers, before the model's parameters are allocated anywhere but on the meta device."""
    from safetensors.torch import load_file, save_file

    from llmperf.engine import from_pretrained
    from llmperf.engine import weights as weights_mod

    hf = hf_twin(make_model("llama", seed=9))
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = tensors[name][:-8].clone()  # a config with more KV heads than the weights hold
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    built = []
    real = weights_mod.Transformer

    def spy(*args, **kw):
        built.append(str(kw.get("device", "cpu")))
        return real(*args, **kw)

    monkeypatch.setattr(weights_mod, "Transformer", spy)
    with pytest.raises(ValueError, match=r"k_proj\.weight.*shape \(24, 64\).*expects \(32, 64\)"):
        from_pretrained(tmp_path, dtype="fp32")
    assert built == ["meta"]
    del tensors[name]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.weight'"):
        from_pretrained(tmp_path, dtype="fp32")
    assert built == ["meta", "meta"]


def test_a_quantised_checkpoint_is_refused_by_name(tmp_path):
    """gpt-oss ships MXFP4 experts, DeepSeek-V3 FP8 blocks: packed tensors and scales the engine does
    not load; refused naming `quantization` before anything is read or allocated."""
    hf = hf_twin(make_model("llama", seed=9))
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from llmperf.engine import from_pretrained

    with pytest.raises(ValueError, match=r"^quantization: .*fp8 checkpoint"):
        from_pretrained(tmp_path)


_DEEPSEEK = dict(model_type="deepseek_v3", vocab_size=128, hidden_size=64, intermediate_size=96,
                 moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 max_position_embeddings=64, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16,
                 qk_nope_head_dim=16, v_head_dim=24, first_k_dense_replace=1, n_routed_experts=8,
                 num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1)


@pytest.mark.parametrize("case", ["missing kv_b_proj", "expert count", "latent width"])
def test_a_deepseek_checkpoint_that_does_not_match_its_config_is_named(tmp_path, case):
    """The issue's three cases on a DeepSeek-V3 checkpoint (MLA + MoE): one line naming the tensor
    and both shapes (or the missing tensor), before anything is allocated."""
    from safetensors.torch import load_file, save_file

    from llmperf.engine import from_pretrained

    from checkpoints import saved_checkpoint

    saved_checkpoint(_DEEPSEEK, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(tmp_path / "model.safetensors")
    if case == "missing kv_b_proj":
        del tensors["model.layers.0.self_attn.kv_b_proj.weight"]
        expected = r"missing tensor 'model\.layers\.0\.self_attn\.kv_b_proj\.weight'"
    elif case == "expert count":  # the config says 16 experts, the checkpoint holds 8
        cfg["n_routed_experts"] = 16
        expected = r"model\.layers\.1\.mlp\.(gate\.weight|experts\.\w+).*(16|8)"
    else:  # a latent of 24 where the config says 32
        cfg["kv_lora_rank"] = 24
        expected = r"model\.layers\.0\.self_attn\.kv_a_(proj_with_mqa|layernorm)\.weight.*shape \(\d+(, 64)?\)"
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=expected) as err:
        from_pretrained(tmp_path, dtype="fp32")
    assert "\n" not in str(err.value)
