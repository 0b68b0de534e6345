"""fp8 as deployed: fp8 weights with fp8 GEMMs (W8A8) and 16-bit activations between operators and
all-reduces on a device with fp8 tensor cores (H100); weight-only (W8A16) on one without (A100); the
outputs say which."""

import pytest

from llmperf.analysis import op_time
from llmperf.analysis.generation import resolve_precision
from llmperf.analysis.operators import ForwardModel
from llmperf.serving.planner import plan_precision
from llmperf.specs import Precision, load_hardware, load_model
from llmperf.specs.precision import gemm_mode, precision_note

M = load_model("llama-3.1-8b")


def _ops(precision, tokens=16):  # noqa: ANN001, ANN202
    fm = ForwardModel(model=M, precision=precision, tp=2)
    return {c.name: c for c in fm.forward_ops(tokens, 1, 1)}


@pytest.mark.parametrize("make", [lambda: resolve_precision(M, "fp8"), lambda: plan_precision(M, "fp8")])
def test_fp8_preset_is_fp8_weights_with_16_bit_activations(make):
    p = make()
    assert (p.weights, p.activations, p.kv) == ("fp8", "bf16", "fp8")
    assert p.matmul_dtype("dense_mlp") == "fp8" and p.matmul_dtype() == "bf16"


def test_activation_and_all_reduce_bytes_are_16_bit_on_both_devices():
    fp8, bf16 = _ops(resolve_precision(M, "fp8")), _ops(Precision.uniform("bf16"))
    old = _ops(Precision.uniform("fp8"))  # fp8 activations too: what the preset was before
    for name in ("down_proj", "o_proj"):
        assert fp8[name].act_read_bytes == bf16[name].act_read_bytes == 2 * old[name].act_read_bytes
        assert fp8[name].weight_bytes == pytest.approx(bf16[name].weight_bytes / 2, rel=1e-6)
    comm = [n for n, c in fp8.items() if c.kind == "comm"]
    assert comm
    for name in comm:
        assert fp8[name].comm_bytes == bf16[name].comm_bytes == 2 * old[name].comm_bytes


@pytest.mark.parametrize("device, mode, peak", [("h100-sxm", "W8A8", "fp8"), ("a100-80gb-sxm", "W8A16", "bf16")])
def test_gemm_peak_and_mode_by_device(device, mode, peak):
    hw = load_hardware(device)
    p = resolve_precision(M, "fp8")
    cost = _ops(p, tokens=4096)["down_proj"]
    t = op_time(cost, hw, hw.compute_dtype(p.activations))
    assert cost.flops / t.compute_s == pytest.approx(hw.peak_flops_per_s(peak))
    assert gemm_mode(p, hw) == mode
    note = precision_note(p, hw)
    assert mode in note and ("weight-only" in note) == (mode == "W8A16")
    assert precision_note(Precision.uniform("bf16"), hw) == ""
    assert gemm_mode(plan_precision(M, "int4"), hw) == "W4A16"


def test_outputs_say_which(tmp_path):
    import json

    from typer.testing import CliRunner

    from llmperf.cli import app
    runner = CliRunner()
    for device, mode in (("h100-sxm", "W8A8"), ("a100-80gb-sxm", "W8A16")):
        res = runner.invoke(app, ["estimate", "-H", device, "--dtype", "fp8", "-f", "json"])
        assert json.loads(res.output)["configurations"][0]["gemm"] == mode
        res = runner.invoke(app, ["estimate", "-H", device, "--dtype", "fp8"], terminal_width=200)
        assert mode in res.output
        res = runner.invoke(app, ["simulate", "-H", device, "--dtype", "fp8", "-n", "5", "-f", "json"])
        st = json.loads(res.output)["settings"]
        assert st["gemm"] == mode and (("weight-only" in st["precision_note"]) == (mode == "W8A16"))
    res = runner.invoke(app, ["plan", "--rate", "1", "-H", "a100-80gb-sxm", "--precisions", "fp8", "--tp", "1",
                              "-n", "20", "-j", "1", "--slo-ttft", "5", "--prompt-len", "100", "--output-len", "10",
                              "-f", "json"])
    doc = json.loads(res.output)
    assert doc["rows"][0]["gemm"] == "W8A16" and "weight-only" in doc["settings"]["precision_notes"][0]
