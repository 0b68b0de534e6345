"""USD per million input and output tokens: the GPU-hours split by prefill and decode step time."""

import math

import pandas as pd
import pytest

from llmperf.serving import planner
from llmperf.serving.costsplit import input_time_share, token_prices
from llmperf.serving.simulator import SLO
from llmperf.serving.workload import WorkloadSpec


def test_step_time_is_split_by_phase_and_mixed_steps_by_tokens():
    steps = pd.DataFrame(dict(duration_s=[1.0, 3.0, 2.0], prefill_tokens=[100, 0, 30], decode_tokens=[0, 8, 10]))
    # 1 s prefill, 3 s decode, 2 s mixed at 30 / 40 prefill tokens
    assert input_time_share(steps) == pytest.approx((1.0 + 2.0 * 0.75) / 6.0)
    assert math.isnan(input_time_share(steps.iloc[:0]))


def test_input_and_output_prices_add_up_to_the_bill():
    p = token_prices(36.0, 0.25, input_tokens_per_s=5000.0, output_tokens_per_s=1000.0)
    bill_per_s = 36.0 / 3600
    assert p.usd_per_million_input * 5000 / 1e6 + p.usd_per_million_output * 1000 / 1e6 == pytest.approx(bill_per_s)
    assert p.usd_per_million_input == pytest.approx(bill_per_s * 0.25 / 5000 * 1e6)
    assert token_prices(None, 0.5, 1.0, 1.0).usd_per_million_output is None


def test_plan_rows_price_input_and_output_tokens_apart():
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:200:400", output_len="uniform:5:20", num_requests=40)
    (row,) = planner.plan("llama-3.1-8b", rate=2.0, slo=SLO(ttft_s=5.0), workload=spec, devices=["a100-80gb-sxm"],
                          precisions=["bf16"], tps=[1], jobs=1, gpu_cost=2.0).rows
    assert 0 < row.prefill_time_share < 1
    assert row.cost_per_million_input_tokens > 0 and row.cost_per_million_output_tokens > 0
    # the two prices over the tokens served recover the cost per hour
    d = row.as_dict()
    assert {"cost_per_million_input_tokens", "cost_per_million_output_tokens", "prefill_time_share"} <= set(d)


def test_plan_rows_show_the_roofline_bound_beside_the_expected_percentiles():
    """plan answers with the expected time (typical) and shows the same replica load under the roofline
    beside it: never slower than the answer; under the roofline itself the two are one."""
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:200:400", output_len="uniform:5:20", num_requests=40)
    kw = dict(rate=2.0, slo=SLO(ttft_s=5.0, tpot_s=1.0), workload=spec, devices=["a100-80gb-sxm"],
              precisions=["bf16"], tps=[1], jobs=1)
    (row,) = planner.plan("llama-3.1-8b", **kw).rows
    assert row.time_model == "typical" and row.feasible
    assert 0 < row.tpot_bound_s < row.tpot_s and 0 < row.ttft_bound_s < row.ttft_s
    assert {"ttft_bound_s", "tpot_bound_s"} <= set(row.as_dict())
    (roof,) = planner.plan("llama-3.1-8b", efficiency="roofline", **kw).rows
    assert (roof.ttft_bound_s, roof.tpot_bound_s) == (roof.ttft_s, roof.tpot_s)
