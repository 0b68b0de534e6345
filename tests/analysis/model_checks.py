"""Helpers the analysis tests of today's families share: a transformers model from a config dict, the
tensors its checkpoint holds, the checks that the serving cost model and the simulator price a static batch
as `estimate` does (prefill and every decode step, 1e-9), that transformers' save of a config reads back the
same, and that a config with junk in it reads to a spec or one SpecError line (the spec tests use it too)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import llmperf
from llmperf.analysis.rollup import Conventions
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError
from llmperf.serving.costmodel import StepCostModel
from llmperf.serving.simulator import ServingConfig, simulate
from llmperf.serving.workload import Workload
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


def assert_simulated_static_batch_is_estimate(spec: ModelSpec, *, batch: int = 4, prompt: int = 150, gen: int = 8,
                                              tp: int = 2, **par: object) -> ServingConfig:
    """The simulator's own sums (its per-item features, not the cost model's arrays): a static batch on an H200,
    at the roofline, has `estimate`'s TTFT and end-to-end time, every decode step `estimate`'s. Returns the
    config (for a chunked run beside it). `par`: parallelism both take (ep, dp_attention)."""
    est = llmperf.estimate(spec, "h200", batch=batch, prompt_len=prompt, gen_len=gen, tp=tp, **par)
    cfg = ServingConfig.build(spec, "h200", tp=tp, policy="static", max_batch=batch, max_batched_tokens=None,
                              chunked_prefill=False, prefix_sharing=False, num_blocks=4000, efficiency="roofline",
                              **par)
    zeros = np.zeros(batch)
    r = simulate(Workload(arrival_s=zeros, prompt_tokens=np.full(batch, prompt), output_tokens=np.full(batch, gen),
                          shared_prefix_tokens=zeros.astype(int)), cfg).requests
    assert r["ttft_s"].to_numpy() == pytest.approx(np.full(batch, est.ttft_s), rel=1e-9)
    e2e = est.ttft_s + est.decode_step_times_s().sum()
    assert r["e2e_s"].to_numpy() == pytest.approx(np.full(batch, e2e), rel=1e-9)
    return cfg


def assert_saved_config_reads_back(read, cfg: dict, tmp_path, *, every_key_read: bool = False) -> None:  # noqa: ANN001
    """transformers' own save of `cfg` reads back to the same model (parameters, layer kinds, KV cache); every key
    read is one llmperf lists (and, with `every_key_read`, every key of `cfg` is read)."""
    from llmperf.specs.hf import HF_CONFIG_FIELDS, HF_REFUSED_FIELDS, read_hf_config

    hf_model(cfg).config.save_pretrained(tmp_path)
    back, spec = ModelSpec.from_hf_config(tmp_path), read(cfg)
    assert back.param_count == spec.param_count and back.layer_kinds() == spec.layer_kinds()
    assert back.kv_cache("bf16") == spec.kv_cache("bf16")
    _, keys = read_hf_config(dict(cfg), "t", "config")
    assert keys <= set(HF_CONFIG_FIELDS) | set(HF_REFUSED_FIELDS), keys - set(HF_CONFIG_FIELDS)
    assert not every_key_read or set(cfg) <= keys, set(cfg) - keys


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
