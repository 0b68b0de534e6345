"""Every operator the cost model emits is named from the one vocabulary (`llmperf.analysis.vocabulary`),
so `profile` can join a measurement to its prediction: a misspelt name in a cost function would
otherwise drop out of every join silently."""

from __future__ import annotations

import pytest

from llmperf.analysis import ForwardModel
from llmperf.analysis.roofline import KINDS
from llmperf.analysis.vocabulary import Op
from llmperf.specs import Precision, load_model


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt2", "mixtral-8x7b", "opt-13b", "mistral-7b"])
@pytest.mark.parametrize("attention", ["fused", "naive"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("tp", [1, 2])
def test_every_operator_name_is_in_the_vocabulary(name, attention, fused, tp):
    fm = ForwardModel(model=load_model(name), precision=Precision(weights="int4"), attention=attention,
                      fused_qkv=fused, fused_gate_up=fused, tp=tp)
    vocabulary = {op.value for op in Op}
    for q_len, kv_len in ((7, 7), (1, 300)):
        ops = fm.forward_ops(2, q_len, kv_len)
        assert {c.name for c in ops} <= vocabulary, {c.name for c in ops} - vocabulary
        assert {c.kind for c in ops} <= set(KINDS)
        names = [c.name for c in ops]
        assert len(names) == len(set(names))  # each operator once per pass
        order = [list(Op).index(Op(n)) for n in names]
        assert order == sorted(order)  # forward order, as `Op` lists them


def _todays_models():  # noqa: ANN202
    from llmperf.specs.hf import model_spec_from_hf_config
    from tests.analysis.test_gemma4 import CASES, read
    from tests.analysis.test_layers import deepseek_v3, gemma2_like, gpt_oss_like, llama4_like
    from tests.analysis.test_minimax_m2 import OLMO3, SPEC
    from tests.analysis.test_nemotron_h import CASES as NEMOTRON_H
    return [gemma2_like(), llama4_like(), gpt_oss_like(), deepseek_v3(), SPEC,
            model_spec_from_hf_config(OLMO3, name="olmo3"), read(CASES["moe"]), read(CASES["ple_kv_shared"]),
            model_spec_from_hf_config(NEMOTRON_H["latent"], name="nemotron-h")]


@pytest.mark.parametrize("attention", ["fused", "naive"])
@pytest.mark.parametrize("parallel", [dict(), dict(tp=2), dict(tp=2, ep=2), dict(tp=4, ep=4, dp_attention=True)])
def test_todays_operators_are_in_the_vocabulary_and_its_sets(attention, parallel):
    """Layers of several kinds repeat a name once per kind (each labelled with it), in forward order
    within a layer; every matmul is a WEIGHT_MATMUL_OP, every attention-kind operator an ATTENTION_OP,
    every model-level one a MODEL_LEVEL_OP, every collective a COMM_OP."""
    from llmperf.analysis.vocabulary import ATTENTION_OPS, COMM_OPS, MODEL_LEVEL_OPS, WEIGHT_MATMUL_OPS
    for m in _todays_models():
        kw = dict(parallel)
        if not m.is_moe:
            kw.pop("ep", None)
            kw.pop("dp_attention", None)
        fm = ForwardModel(model=m, precision=Precision(), attention=attention, **kw)
        for q_len, kv_len in ((7, 7), (1, 300)):
            ops = fm.forward_ops(8, q_len, kv_len)
            pairs = [(c.name, c.layer) for c in ops]
            assert len(pairs) == len(set(pairs))  # each operator once per layer kind
            for c in ops:
                op = Op(c.name)
                assert c.kind in KINDS
                assert (c.kind == "matmul") == (op in WEIGHT_MATMUL_OPS), c.name
                assert (op in ATTENTION_OPS) == (c.name in {"attention", "attn_score", "attn_softcap",
                                                            "attn_softmax", "attn_value"})
                assert (not c.per_layer) == (op in MODEL_LEVEL_OPS), c.name
                assert (c.kind == "comm") == (op in COMM_OPS), c.name
