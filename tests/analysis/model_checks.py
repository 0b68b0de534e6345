"""Helpers the analysis tests of today's families share: a transformers model from a config dict, the
tensors its checkpoint holds, the checks that the serving cost model and the simulator price a static batch
as `estimate` does (prefill and every decode step, 1e-9), that transformers' save of a config reads back the
same, and that a config with junk in it reads to a spec or one SpecError line (the spec tests use it too);
and `hf_type_checks`, the tests every config type of tests/specs/test_hf_*.py shares, made for its TINY configs."""

from __future__ import annotations

import json
import logging
import re

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


def read_config(cfg: dict) -> ModelSpec:
    """The spec of a config dict as a saved config.json would give it (a JSON round trip; named "t")."""
    from llmperf.specs.hf import model_spec_from_hf_config

    return model_spec_from_hf_config(json.loads(json.dumps(cfg)), name="t")


def spec_at_class_defaults(model_type: str) -> ModelSpec:
    """The spec of `model_type`'s config class at its defaults: its parameters exact against transformers' model
    of them (on the meta device), and an absent key read as the class's default (a bare model_type the same)."""
    transformers = pytest.importorskip("transformers")
    spec = read_config(transformers.AutoConfig.for_model(model_type).to_dict())
    assert spec.param_count == checkpoint_count(hf_model({"model_type": model_type}))
    assert read_config({"model_type": model_type}).param_count == spec.param_count
    return spec


def assert_kv_width_matches_cache(spec: ModelSpec, model) -> None:  # noqa: ANN001
    """The KV cache transformers' `model` fills for 5 tokens has a layer per spec layer, each of 5 positions and
    of the spec's K+V width."""
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        cache = model.eval()(input_ids=torch.randint(0, 128, (1, 5)), use_cache=True).past_key_values
    assert len(cache.layers) == spec.num_layers
    for layer in cache.layers:
        width = layer.keys.shape[1] * layer.keys.shape[3] + layer.values.shape[1] * layer.values.shape[3]
        assert layer.keys.shape[2] == 5 and width == spec.kv_width_per_token_per_layer


def assert_refused_in_one_line(read, cfg: dict, needle: str) -> None:  # noqa: ANN001
    """`read(cfg)` raises a SpecError of one line that names `needle`."""
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        read(cfg)
    assert "\n" not in str(info.value)


def estimate_row_of_saved_config(save, tmp_path) -> dict:  # noqa: ANN001
    """`llmperf estimate DIR -f json` on the directory `save(tmp_path)` wrote: exit 0, its one configuration."""
    from typer.testing import CliRunner

    from llmperf.cli import app
    save(tmp_path)
    r = CliRunner().invoke(app, ["estimate", str(tmp_path), "-f", "json"])
    assert r.exit_code == 0, r.output
    row, = json.loads(r.stdout)["configurations"]
    return row


def hf_type_checks(tiny: dict[str, dict], *, refused: list, junk: list, junk_config, estimate: tuple[str, int],
                   simulated: list[str] | None = None, kv: list[str] | None = None, saved: list[str] | None = None,
                   every_key_read: bool = False, read=read_config, params=None, kv_model=None,
                   save=None) -> dict:  # noqa: ANN001
    """The tests every config type of a spec module shares, by name, for `globals().update(...)`: the tiny
    configs' (`tiny`) parameters exact against transformers (`params(cfg)`: its checkpoint's count on the meta
    device), KV widths (over `kv`, all by default) as the cache of `kv_model(cfg)` (a CPU model) fills them,
    transformers' save read back (over `saved`) reading every key but the token ids (or with `every_key_read`,
    every key), `refused` [(cfg, needle)] in one line, `junk` [(key, value)] (`junk_config(key, value)`) a spec
    or one error, the simulator's static batch (over `simulated`, the first config by default) as `estimate`,
    and `estimate` = (name, kv_bytes_per_token) of `llmperf estimate` on the directory `save(cfg, path)` wrote."""
    params = params or (lambda cfg: checkpoint_count(hf_model(cfg)))
    kv_model = kv_model or (lambda cfg: hf_model(cfg, device="cpu"))
    save = save or (lambda cfg, path: hf_model(cfg).config.save_pretrained(path))
    first = next(iter(tiny))

    @pytest.mark.parametrize("name", sorted(tiny))
    def test_tiny_param_count_is_exact(name):  # noqa: ANN001, ANN202
        assert read(tiny[name]).param_count == params(tiny[name])

    @pytest.mark.parametrize("name", kv or sorted(tiny))
    def test_kv_width_matches_the_cache(name):  # noqa: ANN001, ANN202
        assert_kv_width_matches_cache(read(tiny[name]), kv_model(tiny[name]))

    @pytest.mark.parametrize("name", saved or sorted(tiny))
    def test_saved_by_transformers_reads_back(name, tmp_path):  # noqa: ANN001, ANN202
        from llmperf.specs.hf import read_hf_config

        assert_saved_config_reads_back(read, tiny[name], tmp_path, every_key_read=every_key_read)
        if not every_key_read:
            _, keys = read_hf_config(dict(tiny[name]), "t", "config")  # every key but the token ids (no math)
            assert set(tiny[name]) - keys == {"pad_token_id", "bos_token_id", "eos_token_id"}

    @pytest.mark.parametrize("cfg, needle", refused)
    def test_refused_by_name_in_one_line(cfg, needle):  # noqa: ANN001, ANN202
        assert_refused_in_one_line(read, cfg, needle)

    @pytest.mark.parametrize("key, value", junk)
    def test_junk_gives_a_spec_or_one_error(key, value):  # noqa: ANN001, ANN202
        assert_read_or_one_error(read, junk_config(key, value))

    if simulated is None:  # one test, of the first config
        def test_the_simulator_prices_a_static_batch_as_estimate():  # noqa: ANN202
            assert_simulated_static_batch_is_estimate(read(tiny[first]))
    else:
        @pytest.mark.parametrize("name", simulated)
        def test_the_simulator_prices_a_static_batch_as_estimate(name):  # noqa: ANN001, ANN202
            assert_simulated_static_batch_is_estimate(read(tiny[name]))

    def test_estimate_reads_a_saved_config_dir(tmp_path):  # noqa: ANN001, ANN202
        name, kv_bytes = estimate
        row = estimate_row_of_saved_config(lambda path: save(tiny[name], path), tmp_path)
        assert row["kv_bytes_per_token"] == kv_bytes

    return {f.__name__: f for f in (
        test_tiny_param_count_is_exact, test_kv_width_matches_the_cache, test_saved_by_transformers_reads_back,
        test_refused_by_name_in_one_line, test_junk_gives_a_spec_or_one_error,
        test_the_simulator_prices_a_static_batch_as_estimate, test_estimate_reads_a_saved_config_dir)}


def hf_matrix_flops_less_scan(cfg: dict, mixer: str, *, eager_experts: bool = False) -> int:
    """The FLOPs `torch.utils.flop_counter` counts in transformers' eager forward of `cfg` (2 x 21 tokens, on the
    CPU; with `eager_experts`, its experts run eagerly too), less the Mamba-2 scan's own products: what each module
    named `*.{mixer}` counts beyond its in_proj and out_proj (transformers' reference loop, not mamba_ssm's)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    model = hf_model(cfg, device="cpu").eval()
    model.config._attn_implementation = "eager"
    if eager_experts:
        model.config._experts_implementation = "eager"
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 128, (2, 21)))
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    scan = sum(counts[k] - counts.get(k + ".in_proj", 0) - counts.get(k + ".out_proj", 0)
               for k in counts if k.endswith("." + mixer) and k + ".in_proj" in counts)
    return counter.get_total_flops() - scan


def matrix_flops_less_scan(spec: ModelSpec) -> int:
    """The forward model's matmul and attention FLOPs of 2 x 21 tokens (naive attention priced as its whole
    masked square, all logits), less the Mamba-2 scan (`ssd`): what `hf_matrix_flops_less_scan` counts."""
    from llmperf.analysis import ForwardModel
    from llmperf.specs import Precision

    fm = ForwardModel(model=spec, precision=Precision(), attention="naive", all_logits=True, attention_flops="dense")
    return sum(o.flops for o in fm.forward_ops(2, 21, 21) if o.kind in ("matmul", "attention") and o.name != "ssd")


def assert_mamba2_states_and_kv(spec: ModelSpec, cfg: dict, *, state_dtype=None) -> None:  # noqa: ANN001
    """After a 7-token prompt through transformers' model of `cfg` (on the CPU): each Mamba-2 (`linear`) layer's
    recurrent state holds the spec's elements (heads x head dim x state size; of `state_dtype` where given) and its
    convolution's inputs all K of them (transformers keeps K; vLLM, and llmperf, the K - 1 the next step needs);
    the attention (`full`) layers' K and V are the spec's KV bytes for 7 tokens at one byte an element; any other
    layer (MLP, MoE) keeps no tensor."""
    torch = pytest.importorskip("torch")
    model = hf_model(cfg, device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (1, 7)), use_cache=True).past_key_values
    kv_numel = 0
    for layer, kind in zip(cache.layers, spec.layer_types):
        if kind == "linear":
            (state,), (conv,) = layer.recurrent_states.values(), layer.conv_states.values()
            assert state.numel() == spec.linear_state_elements
            assert state_dtype is None or state.dtype == state_dtype
            assert conv.numel() == spec.linear_conv_dim * spec.linear_conv_kernel
        elif kind == "full":
            kv_numel += layer.keys.numel() + layer.values.numel()
        else:
            assert not any(torch.is_tensor(v) for v in vars(layer).values())
    assert spec.kv_cache(1.0).bytes_for_context(7) == kv_numel
