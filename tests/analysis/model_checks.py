"""Helpers the analysis tests of today's families share: a transformers model from a config dict, the
tensors its checkpoint holds, the check that the serving cost model prices a static batch as
`estimate` does (prefill and every decode step, 1e-9), and the check that a config with junk in it
reads to a spec or one SpecError line (the spec tests use it too)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import llmperf
from llmperf.analysis.rollup import Conventions
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError
from llmperf.serving.costmodel import StepCostModel
from llmperf.specs import ModelSpec, load_hardware


def hf_model(cfg: dict, device: str = "meta"):  # noqa: ANN201
    """transformers' causal LM of the config dict `cfg` (`torch_dtype` left out), on `device`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    logging.disable(logging.WARNING)
    try:
        with torch.device(device):
            config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "torch_dtype"})
            return transformers.AutoModelForCausalLM.from_config(config)
    finally:
        logging.disable(logging.NOTSET)


def checkpoint_count(model) -> int:  # noqa: ANN001
    """The parameters (a tied tensor once) and persistent buffers a checkpoint of `model` holds."""
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    for mod in model.modules():
        for name, buf in mod.named_buffers(recurse=False):
            if name not in mod._non_persistent_buffers_set:
                n += buf.numel()
    return n


def assert_static_batch_is_estimate(spec: ModelSpec, tp: int, eff: str, *, batch: int = 3, prompt: int = 40,
                                    steps: int = 6) -> None:
    """On an H200: `estimate`'s decode total is the sum of its steps, and the serving cost model prices the
    batch's prefill and each of its decode steps as `estimate` does."""
    hw = load_hardware("h200")
    tm = None if eff == "roofline" else time_model_for(hw, eff, "bf16")
    est = llmperf.estimate(spec, hw, batch=batch, prompt_len=prompt, gen_len=steps, tp=tp, time_model=tm)
    assert est.e2e_s == pytest.approx(est.ttft_s + est.decode_step_times_s().sum(), rel=1e-9)
    cm = StepCostModel(model=est.model, hardware=hw, precision=est.precision, tp=tp, time_model=tm,
                       conventions=Conventions())
    assert cm.step_time_s([prompt] * batch, [prompt] * batch, batch) == pytest.approx(est.ttft_s, rel=1e-9)
    decode = [cm.step_time_s([1] * batch, [prompt + j] * batch, batch) for j in range(1, steps)]
    assert np.allclose(decode, est.decode_step_times_s(), rtol=1e-9)


def assert_read_or_one_error(read, cfg: dict) -> None:  # noqa: ANN001
    """`read(cfg)` gives a ModelSpec with parameters and a KV cache, or raises a SpecError of one line:
    never another exception."""
    try:
        spec = read(cfg)
    except SpecError as exc:
        assert "\n" not in str(exc)
    else:
        assert spec.param_count > 0 and spec.kv_width_per_token_per_layer > 0
        assert spec.kv_cache("fp16").bytes_per_token >= 0  # every layer linear: none
