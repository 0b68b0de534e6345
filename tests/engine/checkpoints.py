"""Tiny random checkpoints saved by `transformers` itself, and the checks every family of today's
models runs against them: the engine loads the directory (`from_pretrained`, config.json and
safetensors, as a user's checkpoint) and must give transformers' logits and `generate()` tokens.

A module of its own (not conftest.py) so that the family test modules import it by a unique name.
Each family's test module owns its tiny config (a few layers, hidden 64, small vocab) and calls
`saved_checkpoint`, `assert_logits_match` and `assert_generation_matches`; the modules of one checkpoint a
config take their `checkpoints` fixture and the logits and generate() tests from `checkpoint_checks`, the hybrid
(Mamba-2) families' theirs and the decode-step and saved-weights tests from `hybrid_checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from llmperf.engine import Engine, SamplingParams, from_pretrained

from engine_testing import hf_generate

#: prompts of different lengths (ragged), longer than the tiny configs' windows and chunks
PROMPTS = [[11, 42, 7, 99, 3, 8, 21, 5, 60, 2, 14], [5, 100, 17], [8] * 9 + [31, 4]]

#: decoding cases compared token for token with transformers' generate()
CASES = {
    "greedy": SamplingParams(max_new_tokens=10),
    "greedy_processors": SamplingParams(max_new_tokens=10, repetition_penalty=1.3, no_repeat_ngram_size=2),
    "beam": SamplingParams(max_new_tokens=8, num_beams=3, num_return_sequences=2),
}

#: engine settings every case runs under: both caches, chunked prefill across windows and chunks
ENGINES = {
    "paged": dict(cache="paged", block_size=4),
    "contiguous": dict(cache="contiguous"),
    "chunked": dict(cache="paged", block_size=4, chunked_prefill=True, max_batched_tokens=5),
}


def saved_checkpoint(cfg: dict[str, Any], path: Path, *, seed: int = 0, noise: float = 0.05,
                     auto_class: str = "AutoModelForCausalLM"):
    """A `transformers` model from the config dict `cfg` (`model_type` included), its weights moved off
    the init's zeros and ones by seeded noise so every tensor matters, saved to `path` as a checkpoint
    (config.json + model.safetensors) with no EOS of its own. Returns the fp32 model in eval mode.
    `auto_class`: the transformers auto class that builds it (a multimodal wrapper's own)."""
    import transformers

    torch.manual_seed(seed)
    hf = getattr(transformers, auto_class).from_config(transformers.AutoConfig.for_model(**cfg),
                                                       dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    hf.generation_config.pad_token_id = 0
    hf.save_pretrained(path)
    return hf


def assert_logits_match(path: Path, hf, *, tokens: int = 24, batch: int = 2, tol: float = 1e-4, **load: Any) -> None:
    """The engine's full-forward logits of a batch equal transformers' (fp32)."""
    model = from_pretrained(path, dtype="fp32", **load)
    vocab = model.spec.vocab_size
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, all_logits=True), hf(ids).logits, rtol=tol, atol=tol)


def assert_generation_matches(path: Path, hf, case: str, engine: str, *, prompts: Sequence[Sequence[int]] = PROMPTS,
                              attention: str = "sdpa", memo: dict | None = None) -> None:
    """`Engine.generate` on the checkpoint gives transformers' exact tokens for `CASES[case]` under
    `ENGINES[engine]`. `memo`: a dict to keep transformers' tokens across engine settings."""
    params = CASES[case]
    key = (str(path), case)
    if memo is None or key not in memo:
        expected = hf_generate(hf, [list(p) for p in prompts], params)
        if memo is not None:
            memo[key] = expected
    else:
        expected = memo[key]
    model = from_pretrained(path, dtype="fp32", attention=attention)
    outputs = Engine(model, **ENGINES[engine]).generate([list(p) for p in prompts], params)
    assert [[c.tokens for c in o.completions] for o in outputs] == expected


def hf_param_count(hf) -> int:  # noqa: ANN001
    """transformers' parameters (a tied tensor once)."""
    return sum(p.numel() for p in hf.parameters())


def assert_param_counts_equal(checkpoints: dict, *, hf_tensor: str | None = None, hf_params=hf_param_count) -> None:  # noqa: ANN001
    """Every checkpoint loads (fp32) with the spec's parameter count, which is transformers' (`hf_params(hf)`);
    with `hf_tensor`, transformers' state dict holds a tensor of that name's ending."""
    for name, (path, hf) in checkpoints.items():
        if hf_tensor is not None:
            assert any(k.endswith(hf_tensor) for k in hf.state_dict())
        model = from_pretrained(path, dtype="fp32")
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert n == model.spec.param_count == hf_params(hf), name


def checkpoint_checks(configs: dict, *, seed: int, tol: float = 1e-4) -> dict:
    """For a test module's `globals().update(...)`: its module-scoped `checkpoints` fixture (name -> (path,
    transformers' model), each config saved by `saved_checkpoint` with `seed` and noise 0.2; a config given
    as (dict, auto class) is built by that class), and its tests that the engine's logits equal transformers'
    (`tol`) and that generate()'s greedy tokens do under every engine setting, for every config."""
    memo: dict = {}

    @pytest.fixture(scope="module")
    def checkpoints(tmp_path_factory):  # noqa: ANN001, ANN202
        made = {}
        for name, cfg in configs.items():
            cfg, auto = cfg if isinstance(cfg, tuple) else (cfg, "AutoModelForCausalLM")
            path = tmp_path_factory.mktemp(name)
            made[name] = (path, saved_checkpoint(cfg, path, seed=seed, noise=0.2, auto_class=auto))
        return made

    @pytest.mark.parametrize("name", list(configs))
    def test_logits_equal_transformers(checkpoints, name):  # noqa: ANN001, ANN202
        path, hf = checkpoints[name]
        assert_logits_match(path, hf, tol=tol)

    @pytest.mark.parametrize("engine", ["paged", "contiguous", "chunked"])
    @pytest.mark.parametrize("name", list(configs))
    def test_tokens_equal_transformers_generate(checkpoints, name, engine):  # noqa: ANN001, ANN202
        path, hf = checkpoints[name]
        with torch.no_grad():
            assert_generation_matches(path, hf, "greedy", engine, memo=memo)

    return {"checkpoints": checkpoints, "test_logits_equal_transformers": test_logits_equal_transformers,
            "test_tokens_equal_transformers_generate": test_tokens_equal_transformers_generate}


def hybrid_checks(configs: dict, *, noise, tol: float, after=None, step_positions: bool = False) -> dict:  # noqa: ANN001
    """For the hybrid (Mamba-2) families' modules, `globals().update(...)`: their module-scoped `checkpoints`
    fixture (name -> (checkpoint directory, transformers model, the engine's fp32 model of it); each config saved
    with `noise[name]` (or `noise`), then `after(hf, path)` if given) and their tests, for every config: a
    13-token prompt's logits equal transformers' (`tol`); a 13-token prefill through each cache, then 4 one-token
    steps, each step's logits transformers' own cached step's (its recurrent form; with `step_positions`, the
    step's position passed as generate() passes it, for a model that numbers a step's tokens from 0 unless told);
    generate() tokens identical for every case and engine setting; the weights saved back under the names and
    layouts transformers holds in memory (`model.`, experts stacked)."""
    from llmperf.engine import to_hf_state_dict
    from llmperf.engine.cache import ContiguousKVCache, PagedKVCache

    memo: dict = {}

    @pytest.fixture(scope="module")
    def checkpoints(tmp_path_factory):  # noqa: ANN001, ANN202
        import transformers.utils.logging as hf_logging

        hf_logging.set_verbosity_error()
        out = {}
        for name, cfg in configs.items():
            path = tmp_path_factory.mktemp(name)
            hf = saved_checkpoint(cfg, path, noise=noise[name] if isinstance(noise, dict) else noise)
            if after is not None:
                after(hf, path)
            out[name] = (path, hf, from_pretrained(path, dtype="fp32"))
        return out

    @pytest.mark.parametrize("name", configs)
    def test_logits_equal_transformers(checkpoints, name):  # noqa: ANN001, ANN202
        path, hf, _ = checkpoints[name]
        assert_logits_match(path, hf, tokens=13, tol=tol)

    @pytest.mark.parametrize("cache", ["paged", "contiguous"])
    @pytest.mark.parametrize("name", configs)
    def test_decode_step_logits_equal_transformers(checkpoints, name, cache):  # noqa: ANN001, ANN202
        _, hf, model = checkpoints[name]
        c = (PagedKVCache(model.spec, num_blocks=16, block_size=4) if cache == "paged"
             else ContiguousKVCache(model.spec, max_batch=1, max_seq_len=20))
        seq = PROMPTS[0] + [1, 2]
        assert c.allocate(7, len(seq))
        with torch.no_grad():
            logits = model(torch.tensor([seq]), c.prepare([7], len(seq)))
            theirs = hf(torch.tensor([seq]), use_cache=True)
            for _ in range(4):
                torch.testing.assert_close(logits, theirs.logits[:, -1], rtol=tol, atol=tol)
                seq.append(int(logits.argmax()))
                assert c.append_slot(7)
                logits = model(torch.tensor([seq[-1:]]), c.prepare([7], 1))
                at = dict(position_ids=torch.tensor([[len(seq) - 1]])) if step_positions else {}
                theirs = hf(torch.tensor([seq[-1:]]), cache=theirs.past_key_values, use_cache=True, **at)

    @pytest.mark.parametrize("engine", ENGINES)
    @pytest.mark.parametrize("case", CASES)
    @pytest.mark.parametrize("name", configs)
    def test_generate_equals_transformers(checkpoints, name, case, engine):  # noqa: ANN001, ANN202
        path, hf, _ = checkpoints[name]
        assert_generation_matches(path, hf, case, engine, memo=memo)

    def test_weights_save_back_under_transformers_names(checkpoints):  # noqa: ANN001, ANN202
        for name in configs:
            _, hf, model = checkpoints[name]
            back, theirs = to_hf_state_dict(model), hf.state_dict()
            assert set(back) == set(theirs), name
            for key, value in back.items():
                assert torch.equal(value, theirs[key]), key

    return {"checkpoints": checkpoints, "test_logits_equal_transformers": test_logits_equal_transformers,
            "test_decode_step_logits_equal_transformers": test_decode_step_logits_equal_transformers,
            "test_generate_equals_transformers": test_generate_equals_transformers,
            "test_weights_save_back_under_transformers_names": test_weights_save_back_under_transformers_names}


def assert_mamba2_refused_without_state_rollback(model) -> None:  # noqa: ANN001
    """The engine features that roll a sequence's cache back (speculative decoding, StreamingLLM, prefix sharing)
    refuse the Mamba-2 layers of `model` by name."""
    from llmperf.engine import speculative_generate, streaming_generate

    with pytest.raises(ValueError, match=r"speculative decoding: .*linear \(Mamba-2\)"):
        speculative_generate(model, model, [[1, 2]], num_draft_tokens=2, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"StreamingLLM: .*linear \(Mamba-2\)"):
        streaming_generate(model, [[1, 2]], sink_tokens=1, window=4, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prefix_sharing: .*linear \(Mamba-2\)"):
        Engine(model, prefix_sharing=True)


__all__ = ["CASES", "ENGINES", "PROMPTS", "assert_generation_matches", "assert_logits_match",
           "assert_mamba2_refused_without_state_rollback", "assert_param_counts_equal", "checkpoint_checks",
           "hf_param_count", "hybrid_checks", "saved_checkpoint"]
