"""The analytical FLOP counts against PyTorch's own counter (`torch.utils.flop_counter`) on real
Hugging Face models built from the same spec (random weights, no download)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from llmperf.analysis import ForwardModel  # noqa: E402
from llmperf.specs import ModelSpec, Precision  # noqa: E402


def analytical_matmul_flops(spec: ModelSpec, batch: int, seq: int) -> float:
    """Dense convention (the whole attention square) and logits at every position, like HF."""
    fm = ForwardModel(model=spec, precision=Precision(), attention="naive", all_logits=True,
                      attention_flops="dense")
    ops = fm.forward_ops(batch, seq, seq)
    # the counter counts matrix products only, and a bias add not at all
    return sum(o.flops - (batch * seq * _bias_width(spec, o.name) if _has_bias(spec, o.name) else 0)
               for o in ops if o.kind in ("matmul", "attention"))


def _has_bias(spec: ModelSpec, name: str) -> bool:
    return ((name in ("q_proj", "k_proj", "v_proj") and spec.qkv_bias) or (name == "o_proj" and spec.out_bias)
            or (name in ("up_proj", "gate_proj", "down_proj") and spec.mlp_bias))


def _bias_width(spec: ModelSpec, name: str) -> int:
    return {"q_proj": spec.q_size, "k_proj": spec.kv_size, "v_proj": spec.kv_size, "o_proj": spec.hidden_size,
            "up_proj": spec.ffn_size, "gate_proj": spec.ffn_size,
            "down_proj": spec.hidden_size}[name] * spec.num_layers


def counted(model, batch: int, seq: int) -> int:  # noqa: ANN001
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    return counter.get_total_flops()


def test_llama_gqa_matches_flop_counter():
    spec = ModelSpec(name="t", vocab_size=320, hidden_size=128, num_layers=3, num_heads=8, num_kv_heads=2,
                     ffn_size=352, max_positions=512)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=128, num_hidden_layers=3, num_attention_heads=8,
                                   num_key_value_heads=2, intermediate_size=352, max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "eager"
    assert counted(model, 2, 37) == analytical_matmul_flops(spec, 2, 37)


def test_gpt2_matches_flop_counter():
    spec = ModelSpec(name="t", family="gpt2", vocab_size=300, hidden_size=96, num_layers=2, num_heads=4,
                     ffn_size=384, ffn_kind="gelu", hidden_act="gelu_new", norm_kind="layernorm",
                     pos_encoding="learned", tied_embeddings=True, max_positions=128, qkv_bias=True,
                     out_bias=True, mlp_bias=True)
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=96, n_layer=2, n_head=4, n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.config._attn_implementation = "eager"
    assert counted(model, 3, 20) == analytical_matmul_flops(spec, 3, 20)
