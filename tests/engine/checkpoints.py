"""Tiny random checkpoints saved by `transformers` itself, and the checks every family of today's
models runs against them: the engine loads the directory (`from_pretrained`, config.json and
safetensors, as a user's checkpoint) and must give transformers' logits and `generate()` tokens.

A module of its own (not conftest.py) so that the family test modules import it by a unique name.
Each family's test module owns its tiny config (a few layers, hidden 64, small vocab) and calls
`saved_checkpoint`, `assert_logits_match` and `assert_generation_matches`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


__all__ = ["CASES", "ENGINES", "PROMPTS", "assert_generation_matches", "assert_logits_match", "saved_checkpoint"]
