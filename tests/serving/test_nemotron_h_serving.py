"""The serving simulator on Nemotron-H (Mamba-2 hybrids): its Mamba-2 layers hold no KV blocks but a constant
state per sequence (paged as pool blocks from admission to its end), its MLP and MoE layers nothing; `conv1d`
and `ssd` are priced per step from the sequences (the chunked form's block is the config's `chunk_size`), so a
static batch's steps, and a prompt in chunks, are `estimate`'s; `simulate` and `plan` run end to end.
The shape is NemotronHConfig's defaults (not a released model) with a layer pattern of its block types."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import llmperf
from llmperf.analysis.rollup import Conventions
from llmperf.cli import app
from llmperf.serving.costmodel import StepCostModel
from llmperf.serving.simulator import ServingConfig, plan_memory, simulate
from llmperf.serving.workload import Workload
from llmperf.specs import Precision
from llmperf.specs.hf import model_spec_from_hf_config
from llmperf.specs.kvcache import KVCacheSpec
from tests.analysis.model_checks import assert_simulated_static_batch_is_estimate, assert_static_batch_is_estimate

NEMOTRON_H = dict(model_type="nemotron_h", torch_dtype="bfloat16",
                  layers_block_type=["linear_attention", "moe", "linear_attention", "moe", "full_attention", "moe",
                                     "linear_attention", "mlp"])


def _model():
    return model_spec_from_hf_config(dict(NEMOTRON_H), name="nemotron-h-default")


def _workload(n, prompt, out):
    return Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, prompt), output_tokens=np.full(n, out),
                    shared_prefix_tokens=np.zeros(n, dtype=int))


def test_the_memory_plan_pages_the_mamba_state_beside_the_attention_kv():
    """One attention layer holds KV (8 KV heads x 128, split by tp); three Mamba-2 layers a state each: 128
    heads x 64 x 128 at fp32 and 3 inputs of 8 x 2 x 128 + 128 x 64 channels at bf16, split by tp."""
    m = _model()
    mem = plan_memory(ServingConfig.build(m, "h200", tp=2))
    kv = KVCacheSpec.from_model(m, Precision.uniform("bf16")).sharded(tp=2)
    assert mem.kv_bytes_per_token == kv.bytes_per_token == 1 * 2 * 4 * 128 * 2
    assert mem.state_bytes == kv.state_bytes == 3 * (128 * 64 * 128 * 4 + 3 * (2 * 8 * 128 + 128 * 64) * 2) / 2
    assert mem.state_blocks > 0 and not mem.window_groups


@pytest.mark.parametrize("tp, eff, batch, prompt", [(1, "roofline", 4, 300), (2, "typical", 3, 40),
                                                    (2, "roofline", 5, 129)])
def test_a_static_batch_is_priced_as_estimate(tp, eff, batch, prompt):
    assert_static_batch_is_estimate(_model(), tp, eff, batch=batch, prompt=prompt)


def test_a_mixed_step_is_the_sum_of_its_sequences():
    """conv1d and ssd of a step of decodes, a continued chunk and a first one: each sequence's counts summed
    (the weights once a step), with the config's 128-token blocks."""
    m = _model()
    cm = StepCostModel(model=m, hardware=llmperf.specs.load_hardware("h200"), precision=Precision.uniform("bf16"),
                       tp=2, conventions=Conventions())
    assert [p.ref.name for p in cm.state_parts] == ["conv1d", "ssd"] and cm.state_chunk == 128
    q, kv = [1, 1, 300, 129], [500, 3000, 812, 129]
    f = cm.features(q, kv)[len(cm.groups):].reshape(-1)[:6]
    fields = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")
    for part in cm.state_parts:
        ops = [getattr(cm.fm, part.ref.name)(1.0, a, b) for a, b in zip(q, kv)]
        got = part.coef @ f * part.layers
        for j, name in enumerate(fields):
            expect = sum(getattr(op, name) for op in ops) if name != "weight_bytes" else 0.0
            assert got[j] == pytest.approx(3 * expect, rel=1e-9, abs=1e-3)


def test_the_simulators_own_sums_price_a_static_batch_and_chunks_as_estimate():
    m = _model()
    cfg = assert_simulated_static_batch_is_estimate(m)
    # a 300-token prompt in chunks of 160: the first chunk 2 blocks of 128, the second reads the state
    chunked = ServingConfig.build(m, "h200", tp=2, max_batched_tokens=160, num_blocks=4000, efficiency="roofline")
    res = simulate(_workload(1, 300, 2), chunked)
    cm = StepCostModel(model=m, hardware=cfg.hardware, precision=cfg.precision, tp=2, conventions=cfg.conventions())
    expect = sum(cm.step_time_s([q], [kv], int(kv == 300)) for q, kv in ((160, 160), (140, 300)))
    assert res.requests["ttft_s"].iloc[0] == pytest.approx(expect, rel=1e-9)


def _config_dir(tmp_path):
    d = tmp_path / "nemotron-h"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(NEMOTRON_H))
    return d


def test_simulate_runs_and_streaming_is_refused(tmp_path):
    runner, d = CliRunner(), _config_dir(tmp_path)
    res = runner.invoke(app, ["simulate", str(d), "-H", "h200", "--requests", "30", "--rate", "5",
                              "--prompt-len", "uniform:50:300", "--output-len", "uniform:5:30", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["summary"]["requests"] == 30 and "3 Mamba-2 layers hold no KV" in doc["settings"]["kv_note"]
    bad = runner.invoke(app, ["simulate", str(d), "-H", "h200", "--requests", "5", "--streaming", "4:1000"])
    assert bad.exit_code == 2 and "Mamba-2 (linear) layers" in bad.output and "Traceback" not in bad.output


def test_estimate_and_plan_run(tmp_path):
    runner, d = CliRunner(), _config_dir(tmp_path)
    res = runner.invoke(app, ["estimate", str(d), "-H", "h200", "--batch", "8", "--prompt-len", "1000",
                              "--gen-len", "100"])
    assert res.exit_code == 0, res.output
    assert "Mamba-2 state" in res.output
    res = runner.invoke(app, ["plan", str(d), "--rate", "4", "-H", "h200", "--precisions", "bf16", "--tp", "1",
                              "--slo-ttft", "0.5", "--slo-tpot", "0.05", "--requests", "30",
                              "--prompt-len", "uniform:100:400", "--output-len", "uniform:10:60", "-f", "json"])
    assert res.exit_code == 0, res.output
    assert any(r["feasible"] for r in json.loads(res.stdout)["rows"])
