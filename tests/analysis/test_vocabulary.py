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
