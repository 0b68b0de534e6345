"""Collectives other than the measured all-reduce: their latency share and bus bytes."""

import pytest


def test_other_collectives_pay_their_ring_steps_share_of_the_all_reduce_latency():
    """All-to-all (MoE dispatch/combine) and a pipeline send take half an all-reduce's latency over the
    same GPUs (n-1 ring steps against 2(n-1); one of a 2-GPU all-reduce's two) and its bus fraction."""
    from llmperf.analysis.collectives import LATENCY_SHARE, OP_COLLECTIVE, latency_share, load_collectives
    from llmperf.analysis.roofline import OpCost
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.analysis.vocabulary import COMM_OPS
    from llmperf.specs import load_hardware

    assert {op.value for op in COMM_OPS} == set(OP_COLLECTIVE)
    assert latency_share("attn_allreduce") == 1.0 and latency_share("moe_dispatch") == 0.5
    assert LATENCY_SHARE["send"] == 0.5
    hw = load_hardware("h100-sxm")
    tm = time_model_for(hw, "typical", "bf16")
    alpha, _ = load_collectives().terms(hw.name, 8)
    ar = tm.efficiency(OpCost(name="mlp_allreduce", kind="comm", comm_bytes=1.0, comm_gpus=8), hw)
    a2a = tm.efficiency(OpCost(name="moe_dispatch", kind="comm", comm_bytes=1.0, comm_gpus=8), hw)
    assert ar.comm_latency_s == pytest.approx(alpha) and a2a.comm_latency_s == pytest.approx(alpha / 2)
    assert a2a.e_comm == ar.e_comm
    coll = load_collectives()
    send = coll.time_s(hw.name, hw.interconnect_bytes_per_s, 2, 0.0, "send")
    assert send == pytest.approx(coll.terms(hw.name, 2)[0] / 2)
