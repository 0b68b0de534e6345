"""Today's families on a CUDA device: the engine on the GPU (SDPA, and the Triton kernels: windows,
chunks, sinks, MLA decode over the paged latent cache) gives transformers' logits and greedy tokens
on the same GPU, for the tiny checkpoints the CPU tests use. Skipped without CUDA (`-m gpu` runs it)."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, from_pretrained

from checkpoints import CASES, ENGINES, PROMPTS, saved_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _configs() -> dict[str, dict]:
    from test_mla import CONFIGS as MLA
    from test_moe_families import CONFIGS as MOE
    from test_qwen3_gemma import CONFIGS as DENSE

    # gpt-oss at its real clamp (7.0): transformers before 5.24 ignores the config's `swiglu_limit` (the CPU
    # tests, on the pinned version, check a clamp that binds)
    return {**DENSE, **MOE, "gpt_oss": dict(MOE["gpt_oss"], swiglu_limit=7.0), "kimi_like": MLA["kimi_k2"],
            "deepseek_v2_bias": MLA["deepseek_v2"]}


CONFIGS = _configs()
#: (family, backend): Triton has no soft-capping kernels, so Gemma 2 runs on SDPA only (the engine refuses it)
RUNS = [(n, b) for n in CONFIGS for b in ("sdpa", "triton") if not (n == "gemma2" and b == "triton")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        hf = saved_checkpoint(cfg, path, seed=3, noise=0.2)
        # eager attention is the reference: transformers before 5.24 runs Gemma 2 on SDPA, which drops
        # its attention soft-capping
        hf.set_attn_implementation("eager")
        out[name] = (path, hf.to("cuda"))
    return out


@pytest.mark.parametrize("name,backend", RUNS)
def test_logits_equal_transformers_on_the_gpu(checkpoints, name, backend):
    path, hf = checkpoints[name]
    model = from_pretrained(path, dtype="fp32", device="cuda", attention=backend)
    ids = torch.randint(0, model.spec.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, all_logits=True), hf(ids).logits, rtol=2e-4, atol=2e-4)


_EXPECTED: dict = {}


def _hf_greedy(hf, prompts, params) -> list[list[list[int]]]:
    """transformers' greedy `generate()` on the GPU, each prompt alone (no EOS in these checkpoints)."""
    from llmperf.engine.sampling import hf_generate_kwargs

    out = []
    for p in prompts:
        with torch.no_grad():
            seqs = hf.generate(torch.tensor([p], device="cuda"),
                               attention_mask=torch.ones(1, len(p), dtype=torch.long, device="cuda"),
                               **hf_generate_kwargs(params))
        out.append(seqs[:, len(p):].tolist())
    return out


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("name,backend", RUNS)
def test_greedy_tokens_equal_transformers_on_the_gpu(checkpoints, name, backend, engine):
    """Paged (latent blocks for MLA, window-sized blocks freed as they slide out), contiguous, and
    chunked prefill across windows and chunks."""
    path, hf = checkpoints[name]
    params = CASES["greedy"]
    if name not in _EXPECTED:
        _EXPECTED[name] = _hf_greedy(hf, [list(p) for p in PROMPTS], params)
    model = from_pretrained(path, dtype="fp32", device="cuda", attention=backend)
    outputs = Engine(model, **ENGINES[engine]).generate([list(p) for p in PROMPTS], params)
    assert [[c.tokens for c in o.completions] for o in outputs] == _EXPECTED[name]
