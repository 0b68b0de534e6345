"""Nothing loads silently wrong: every Hugging Face config field in `MATH_FIELDS` is honoured
(the loaded model equals `transformers` on the same checkpoint) or refused with its name."""

from __future__ import annotations

import pytest
import torch

from engine_testing import SPECS, hf_twin, make_model
from llmperf.engine import from_pretrained, hf_config
from llmperf.engine.weights import MATH_FIELDS, honour_hf_fields

transformers = pytest.importorskip("transformers")


def _cfg(kind: str, **changes):
    cfg = hf_config(SPECS[kind]())
    cfg.update(changes)
    return cfg


# field -> (base spec, config changes, expected ModelSpec changes or the refusal)
CASES = {
    "sliding_window": ("llama", dict(model_type="mistral", sliding_window=5), dict(sliding_window=5)),
    "use_sliding_window": ("qwen2", dict(use_sliding_window=True, sliding_window=7, max_window_layers=0),
                           dict(sliding_window=7)),
    "max_window_layers": ("qwen2", dict(use_sliding_window=True, sliding_window=7, max_window_layers=1), "refused"),
    "layer_types": ("llama", dict(model_type="mistral", sliding_window=5,
                                  layer_types=["full_attention", "sliding_attention"]), "refused"),
    "scale_attn_weights": ("gpt2", dict(scale_attn_weights=False), dict(attn_scale=False)),
    "scale_attn_by_inverse_layer_idx": ("gpt2", dict(scale_attn_by_inverse_layer_idx=True),
                                        dict(attn_scale_inverse_layer_idx=True)),
    "attn_logit_softcapping": ("llama", dict(attn_logit_softcapping=50.0), "refused"),
    "final_logit_softcapping": ("llama", dict(final_logit_softcapping=30.0), "refused"),
    "attention_chunk_size": ("llama", dict(attention_chunk_size=8), "refused"),
}


def test_every_math_field_has_a_case():
    assert set(CASES) == set(MATH_FIELDS)


@pytest.mark.parametrize("field", sorted(MATH_FIELDS))
def test_math_field_is_honoured_or_refused(field):
    kind, changes, expected = CASES[field]
    spec = SPECS[kind]()
    if expected == "refused":
        assert MATH_FIELDS[field].startswith("refused") or "refused" in MATH_FIELDS[field]
        with pytest.raises(ValueError, match=field):
            honour_hf_fields(spec, _cfg(kind, **changes))
        return
    got = honour_hf_fields(spec, _cfg(kind, **changes))
    for name, value in expected.items():
        assert getattr(got, name) == value, f"{field} not honoured: {name}={getattr(got, name)!r}"


def test_qwen2_window_off_unless_enabled_and_full_layers():
    spec = SPECS["qwen2"]()
    assert honour_hf_fields(spec, _cfg("qwen2", sliding_window=4, use_sliding_window=False)).sliding_window is None
    assert honour_hf_fields(spec, _cfg("qwen2", sliding_window=4, use_sliding_window=True,
                                       max_window_layers=spec.num_layers)).sliding_window is None


@pytest.mark.parametrize("kind", ["mistral", "gpt2_scaled"])
def test_from_pretrained_honours_the_checkpoint(tmp_path, kind):
    """A saved HF checkpoint with a sliding window / GPT-2 scalings loads into a model equal to HF's."""
    model = make_model(kind, seed=4)
    hf = hf_twin(model)
    hf.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path, dtype="fp32")
    assert loaded.spec.sliding_window == model.spec.sliding_window
    assert (loaded.spec.attn_scale, loaded.spec.attn_scale_inverse_layer_idx) == (
        model.spec.attn_scale, model.spec.attn_scale_inverse_layer_idx)
    tokens = torch.randint(0, model.spec.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, all_logits=True), hf(tokens).logits, rtol=1e-5, atol=1e-5)


def test_triton_refuses_a_window_that_matters():
    from engine_testing import kernels_available
    from llmperf.engine import Engine, SamplingParams

    ok, why = kernels_available()
    if not ok:
        pytest.skip(why)
    engine = Engine(make_model("mistral", seed=1), attention="triton")
    with pytest.raises(ValueError, match="sliding_window"):
        engine.generate([list(range(1, 10))], SamplingParams(max_new_tokens=2))
    assert engine.cache.num_seqs == 0
