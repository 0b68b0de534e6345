"""Ministral 3 (`ministral3`) and the text model of a Mistral 3 multimodal checkpoint (`mistral3`, its
`text_config` a mistral or ministral3 model; the vision tower and projector not counted): read with the
config classes' defaults for absent keys, parameters exact against transformers (tiny structures and the
classes' defaults, on the meta device), KV widths as transformers' cache fills them, transformers' own
save read back, refusals by name, the simulator's static batch priced as `estimate`, and `llmperf estimate`
on a saved config directory. (The engine: tests/engine/test_ministral3_engine.py.)"""

from __future__ import annotations

import json
import logging

import pytest

from llmperf.specs.hf import model_spec_from_hf_config
from tests.analysis.model_checks import hf_type_checks
from tests.analysis.model_checks import read_config as read

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, num_hidden_layers=3, max_position_embeddings=4096)
_ROPE = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=1024, beta_fast=32.0,
             beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)
TINY = {
    "ministral3": dict(_TEXT, model_type="ministral3", rope_parameters=_ROPE, sliding_window=8),
    "ministral3-default-rope": dict(_TEXT, model_type="ministral3"),
    "mistral3": dict(model_type="mistral3", text_config=dict(_TEXT, model_type="mistral", sliding_window=None)),
    "mistral3-untied": dict(model_type="mistral3", tie_word_embeddings=False,
                            text_config=dict(_TEXT, model_type="ministral3", rope_parameters=_ROPE)),
}


def hf_text_model(cfg: dict, device: str = "meta"):  # noqa: ANN201
    """transformers' text model and head of `cfg`: a mistral3 wrapper's language model (its head tied or not as
    the wrapper builds it), else the causal LM. Returns (model, parameters of the text model and head)."""
    logging.disable(logging.WARNING)
    try:
        with torch.device(device):
            config = transformers.AutoConfig.for_model(**json.loads(json.dumps(cfg)))
            if cfg["model_type"] == "mistral3":
                full = transformers.Mistral3ForConditionalGeneration(config)
                params = {id(p): p for m in (full.model.language_model, full.lm_head) for p in m.parameters()}
                return full, sum(p.numel() for p in params.values())
            model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        logging.disable(logging.NOTSET)
    return model, sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("model_type, params, tied", [("ministral3", 8_489_553_920, False),
                                                      ("mistral3", 22_901_314_560, True)])
def test_the_config_class_defaults_are_exact(model_type, params, tied):
    """At the classes' defaults: Mistral3Config's own text model (not MistralConfig's defaults) with its head
    tied by the wrapper's tie_word_embeddings (default true); an absent text_config reads the same."""
    cfg = transformers.AutoConfig.for_model(model_type).to_dict()
    spec = read(cfg)
    assert spec.param_count == hf_text_model({"model_type": model_type})[1] == params
    assert spec.tied_embeddings is tied
    assert read({"model_type": model_type}).param_count == params
    if model_type == "ministral3":  # its default rope: yarn, and the query scale by position
        assert spec.query_log_scale == (0.1, 16384.0) and spec.rope_theta == 1e6
        assert spec.rope_scaling["rope_type"] == "yarn" and spec.rope_scaling["factor"] == 16.0


def test_structure_read():
    mini = read(TINY["ministral3"])
    assert mini.query_log_scale == (0.1, 1024.0) and mini.sliding_window == 8 and mini.rope_theta == 10000.0
    assert mini.head_dim == 32 and mini.num_kv_heads == 2 and not mini.tied_embeddings
    wrapped = read(TINY["mistral3-untied"])
    assert wrapped.query_log_scale == (0.1, 1024.0) and not wrapped.tied_embeddings
    plain = read(TINY["mistral3"])
    assert plain.query_log_scale is None and plain.tied_embeddings and plain.sliding_window is None
    assert "the text model of a mistral3 checkpoint" in plain.source
    # beta 0: no scaling at all
    zero = read(dict(TINY["ministral3"], rope_parameters=dict(_ROPE, llama_4_scaling_beta=0.0)))
    assert zero.query_log_scale is None


def test_a_saved_mistral3_reads_back(tmp_path):
    config = transformers.AutoConfig.for_model(**TINY["mistral3-untied"])
    config.save_pretrained(tmp_path)
    back = model_spec_from_hf_config(tmp_path)
    assert back.param_count == read(TINY["mistral3-untied"]).param_count
    assert back.query_log_scale == (0.1, 1024.0) and not back.tied_embeddings


# the tests every type shares: tiny parameters exact (the text model and head), KV widths, transformers' save read
# back (every key read), refusals in one line, junk (in the rope parameters) a spec or one error, the simulator's
# static batch, `llmperf estimate` on a saved config directory
globals().update(hf_type_checks(
    TINY,
    params=lambda cfg: hf_text_model(cfg)[1],
    kv=["ministral3", "mistral3-untied"],
    kv_model=lambda cfg: hf_text_model(cfg, device="cpu")[0],
    saved=["ministral3", "ministral3-default-rope"],
    every_key_read=True,
    refused=[
        (dict(TINY["ministral3"], rope_parameters={k: v for k, v in _ROPE.items() if k != "llama_4_scaling_beta"}),
         "missing field 'rope_parameters.llama_4_scaling_beta'"),
        (dict(TINY["ministral3"], rope_parameters=dict(_ROPE, llama_4_scaling_beta=-1.0)),
         "rope_parameters.llama_4_scaling_beta must be >= 0, got -1.0"),
        (dict(TINY["ministral3-default-rope"], rope_theta=5.0), "rope_theta=5.0 is not modelled"),
        (dict(_TEXT, model_type="mistral", rope_parameters=_ROPE),
         "rope_parameters.llama_4_scaling_beta=0.1 is not modelled (Ministral 3's query scaling is read for ministral3 "
         "only; transformers' mistral ignores it)"),
        (dict(TINY["mistral3"], text_config=dict(_TEXT, model_type="llama")),
         "text_config.model_type='llama', expected 'mistral' in a mistral3 config"),
        (dict(TINY["mistral3"], tie_word_embeddings="yes"), "tie_word_embeddings must be true or false"),
    ],
    junk=[("llama_4_scaling_beta", "x"), ("original_max_position_embeddings", 0),
          ("original_max_position_embeddings", None), ("factor", -2.0), ("rope_type", "su")],
    junk_config=lambda key, value: dict(TINY["ministral3"], rope_parameters=dict(_ROPE, **{key: value})),
    simulated=["ministral3", "mistral3"],
    estimate=("mistral3-untied", 3 * 2 * 2 * 32 * 2),  # layers x K,V x kv heads x head_dim x fp16
    save=lambda cfg, path: transformers.AutoConfig.for_model(**cfg).save_pretrained(path),
))
