"""Under the roofline a step cost model reads each operator's rates once, not once per (rows, shape):
the step times are those of a model that reads them at every step size (bit for bit), for dense,
sliding-window, MLA and Gated DeltaNet models, at tp 1 and 2."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.analysis.roofline import ROOFLINE
from llmperf.serving.costmodel import StepCostModel
from llmperf.specs import Precision, load_hardware, load_model
from tests.serving.test_deltanet_serving import _small as small_qwen3_next


class PerRows(StepCostModel):
    """A step cost model whose rates are read per (rows, shape) whatever its time model."""

    @property
    def _rates_by_rows(self) -> bool:
        return True


STEPS = st.lists(st.lists(st.tuples(st.integers(1, 600), st.integers(0, 5000)), min_size=1, max_size=12),
                 min_size=1, max_size=8)


@pytest.mark.parametrize("name,tp,time_model", [("llama-3.1-8b", 1, None), ("gpt-oss-20b", 2, None),
                                                ("deepseek-v3", 8, ROOFLINE), ("gemma-3-27b", 1, ROOFLINE),
                                                ("qwen3-next", 2, None)])
@settings(max_examples=15, deadline=None)
@given(steps=STEPS)
def test_roofline_rates_read_once_price_every_step_alike(name, tp, time_model, steps):
    model = small_qwen3_next() if name == "qwen3-next" else load_model(name)
    kw = dict(model=model, hardware=load_hardware("h100-sxm"), precision=Precision.uniform("bf16"), tp=tp,
              time_model=time_model)
    once, per_rows = StepCostModel(**kw), PerRows(**kw)
    assert not once._rates_by_rows
    for step in steps:
        q = [a for a, _ in step]
        kv = [a + b for a, b in step]
        rows = sum(1 for a in q if a == 1)
        assert once.step_time_s(q, kv, rows) == per_rows.step_time_s(q, kv, rows)
    assert len(once._rates) <= len(once.parts) + len(once.state_parts)
