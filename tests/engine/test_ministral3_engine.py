"""Ministral 3 (`ministral3`: yarn rotary positions and queries scaled by 1 + beta * log(1 + floor(position /
original_max_position_embeddings)), its `llama_4_scaling_beta`) and the text model of a Mistral 3 multimodal
checkpoint (`mistral3`: its `model.language_model.` tensors beside a vision tower the engine does not load) from
tiny checkpoints saved by transformers: the engine's logits and generate() tokens equal transformers' (paged,
contiguous, chunked prefill), and its parameter count is the spec's."""

from __future__ import annotations

import torch

from llmperf.engine import from_pretrained
from llmperf.specs import ModelSpec

from checkpoints import assert_param_counts_equal, checkpoint_checks

_TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=None,
             bos_token_id=None, eos_token_id=None)
# the query scale steps at positions 8 and 16 (a big beta, so that it matters): inside the prompts and the decode
_ROPE = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8, beta_fast=32.0,
             beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.5)
_VISION = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               head_dim=16, image_size=28, patch_size=14)
CONFIGS = {
    "ministral3": (dict(_TEXT, model_type="ministral3", rope_parameters=_ROPE, sliding_window=6),
                   "AutoModelForCausalLM"),
    # Mistral Small 3.x: a mistral text model, its head tied by the outer config's default
    "mistral3": (dict(model_type="mistral3", text_config=dict(_TEXT, model_type="mistral"), vision_config=_VISION,
                      spatial_merge_size=1), "AutoModelForImageTextToText"),
    "mistral3-ministral3": (dict(model_type="mistral3", text_config=dict(_TEXT, model_type="ministral3",
                                                                         rope_parameters=_ROPE),
                                 vision_config=_VISION, spatial_merge_size=1, tie_word_embeddings=False),
                            "AutoModelForImageTextToText"),
}


# the checkpoints fixture; the logits and generate() tokens of every config equal transformers'
globals().update(checkpoint_checks(CONFIGS, seed=5, tol=1e-5))


def _text_params(hf) -> int:
    """transformers' text model and head (a tied head once), not the vision tower and projector."""
    lm = getattr(getattr(hf, "model", None), "language_model", None)
    params = {id(p): p for p in (lm.parameters() if lm is not None else hf.model.parameters())}
    params.update({id(p): p for p in hf.lm_head.parameters()})
    return sum(p.numel() for p in params.values())


def test_the_checkpoints_are_what_they_claim(checkpoints):
    mini = ModelSpec.from_hf_config(checkpoints["ministral3"][0])
    assert mini.query_log_scale == (0.5, 8.0) and mini.sliding_window == 6 and mini.rope_scaling["factor"] == 4.0
    assert ModelSpec.from_hf_config(checkpoints["mistral3"][0]).tied_embeddings
    wrapped = ModelSpec.from_hf_config(checkpoints["mistral3-ministral3"][0])
    assert wrapped.query_log_scale == (0.5, 8.0) and not wrapped.tied_embeddings
    assert_param_counts_equal(checkpoints, hf_params=_text_params)


def test_the_query_scale_matters(checkpoints):
    """Without the scale the logits differ from transformers' past position 8 (the test would see a lost scale)."""
    from dataclasses import replace

    from llmperf.specs.hf import model_spec_from_hf_config
    path, hf = checkpoints["ministral3"]
    spec = replace(model_spec_from_hf_config(path), query_log_scale=None)
    model = from_pretrained(path, dtype="fp32", spec=spec)
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = model(ids, all_logits=True), hf(ids).logits
    torch.testing.assert_close(got[:, :8], want[:, :8], rtol=1e-4, atol=1e-4)
    assert (got[:, 8:] - want[:, 8:]).abs().max() > 1e-2
