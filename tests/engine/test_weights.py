"""Loading Hugging Face checkpoints (safetensors, sharded, GPT-2's prefix-less names, Mixtral's
per-expert layout) reproduces the `transformers` model's logits; random weights are seeded."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from llmperf.engine import from_pretrained, load_hf_state_dict, to_hf_state_dict
from llmperf.engine.model import Transformer
from llmperf.engine.weights import TensorSource

from engine_testing import hf_twin, make_model


def _logits(model, tokens):
    with torch.no_grad():
        out = model(tokens)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2", "mixtral"])
def test_saved_checkpoint_reproduces_transformers_logits(kind, tmp_path):
    hf = hf_twin(make_model(kind, seed=7))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert list(tmp_path.glob("*.safetensors"))
    tokens = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(0))
    for layout in ("in_out", "out_in"):
        model = from_pretrained(tmp_path, dtype="fp32", weight_layout=layout)
        with torch.no_grad():
            torch.testing.assert_close(model(tokens, all_logits=True), hf(tokens).logits, rtol=1e-5, atol=1e-5)


def test_sharded_checkpoint_with_index(tmp_path):
    hf = hf_twin(make_model("llama", seed=8))
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model = from_pretrained(tmp_path, dtype="fp32")
    tokens = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, all_logits=True), hf(tokens).logits, rtol=1e-5, atol=1e-5)


def test_checkpoint_dtype_is_kept_unless_asked(tmp_path):
    hf = hf_twin(make_model("llama", seed=9)).to(torch.bfloat16)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert from_pretrained(tmp_path).dtype == torch.bfloat16
    assert from_pretrained(tmp_path, dtype="fp32").dtype == torch.float32


def test_original_gpt2_names_without_transformer_prefix(tmp_path):
    model = make_model("gpt2", seed=3)
    sd = {k.removeprefix("transformer."): v for k, v in to_hf_state_dict(model).items() if k != "lm_head.weight"}
    other = Transformer(model.spec)
    load_hf_state_dict(other, sd)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))


def test_mixtral_per_expert_checkpoint_layout():
    """Published Mixtral checkpoints store experts one by one (w1 gate, w3 up, w2 down)."""
    model = make_model("mixtral", seed=5, weight_layout="out_in")
    other = make_model("mixtral", seed=5, weight_layout="in_out")
    assert torch.equal(model.layers[0].o_weight, other.layers[0].o_weight.t())
    spec = model.spec
    sd = to_hf_state_dict(model)
    old = {}
    for k, v in sd.items():
        if ".mlp.experts.gate_up_proj" in k:
            prefix = k.replace("mlp.experts.gate_up_proj", "block_sparse_moe.experts.")
            for j in range(spec.num_experts):
                old[f"{prefix}{j}.w1.weight"] = v[j, :spec.ffn_size]
                old[f"{prefix}{j}.w3.weight"] = v[j, spec.ffn_size:]
        elif ".mlp.experts.down_proj" in k:
            prefix = k.replace("mlp.experts.down_proj", "block_sparse_moe.experts.")
            for j in range(spec.num_experts):
                old[f"{prefix}{j}.w2.weight"] = v[j]
        else:
            old[k.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = v
    other = Transformer(spec, weight_layout="out_in")
    load_hf_state_dict(other, old)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))


def test_missing_or_misshapen_tensors_are_named(tmp_path):
    model = make_model("llama")
    sd = to_hf_state_dict(model)
    broken = dict(sd)
    del broken["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="k_proj"):
        load_hf_state_dict(Transformer(model.spec), broken)
    broken = dict(sd, **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_hf_state_dict(Transformer(model.spec), broken)
    with pytest.raises(ValueError, match="checkpoint"):
        TensorSource(tmp_path)
    with pytest.raises(ValueError, match="path"):
        from_pretrained(tmp_path / "nope")


def test_tensor_source_reads_lazily_from_shards(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "x-1.safetensors"))
    save_file({"b": torch.zeros(3)}, str(tmp_path / "x-2.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "x-1.safetensors", "b": "x-2.safetensors"}}))
    src = TensorSource(tmp_path)
    assert sorted(src) == ["a", "b"] and len(src) == 2
    assert torch.equal(src["b"], torch.zeros(3))
