"""`llmperf calibrate` and `llmperf profile` through typer's CliRunner: good runs and every bad input
(exit code 2, one line naming the option and the value, nothing half-written)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from llmperf.cli import app

runner = CliRunner()
NO_CUDA = not torch.cuda.is_available()
TINY = dict(name="tiny-llama", family="llama", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
            num_kv_heads=2, ffn_size=128, max_positions=256)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "dev.yaml"
    res = runner.invoke(app, ["calibrate", "--quick", "--threads", "1", "-o", str(path)])
    assert res.exit_code == 0, res.output
    assert "measured ceilings" in res.output and "wrote" in res.output
    return path


@pytest.fixture
def model_path(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(TINY))
    return str(p)


def _one_error_line(res, *needles):
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert text.startswith("error:") and "Traceback" not in text, text
    for n in needles:
        assert n in text, text


def test_calibrate_writes_a_loadable_spec(calibrated):
    from llmperf.specs import load_hardware

    spec = load_hardware(str(calibrated))
    assert spec.efficiency["model"] == "calibrated" and spec.calibration["tool"] == "llmperf calibrate"


def test_calibrate_defaults_to_the_cache_dir(fresh_cache):
    res = runner.invoke(app, ["calibrate", "--quick", "--threads", "1", "--dtypes", "fp32", "--json"])
    assert res.exit_code == 0, res.output
    assert (fresh_cache / "local.yaml").is_file()
    assert json.loads(res.stdout[:res.stdout.rindex("}") + 1])["name"] == "local"  # a re-timed point notes on stderr


@pytest.mark.skipif(not NO_CUDA, reason="checks the no-CUDA path")
@pytest.mark.parametrize("command", [["calibrate", "--quick"], ["profile", "gpt2"]])
def test_device_cuda_without_cuda_exits_2(command, tmp_path):
    res = runner.invoke(app, [*command, "--device", "cuda", "-o", str(tmp_path / "x")])
    _one_error_line(res, "--device", "cuda")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args, needles", [
    (["--dtypes", "fp64"], ("--dtypes", "fp64")), (["--threads", "0"], ("--threads",)),
    (["--device", "tpu"], ("--device", "tpu")),
])
def test_calibrate_bad_input(args, needles, tmp_path):
    res = runner.invoke(app, ["calibrate", "--quick", *args, "-o", str(tmp_path / "c.yaml")])
    _one_error_line(res, *needles)
    assert not (tmp_path / "c.yaml").exists()


def test_profile_end_to_end(calibrated, model_path, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["profile", model_path, "-H", str(calibrated), "--device", "cpu", "-b", "1,2",
                              "-p", "8", "-g", "3", "--reps", "1", "--threads", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    for text in ("per phase", "exact cross-checks", "pass", "Triton kernels are not timed", "wrote"):
        assert text in res.output
    assert "FAIL" not in res.output
    doc = json.loads((out / "run.json").read_text())
    assert doc["status"] == "complete" and doc["hardware"] == "local"
    again = runner.invoke(app, ["profile", model_path, "-H", str(calibrated), "--device", "cpu", "-o", str(out)])
    _one_error_line(again, "--output", "already holds a run")


@pytest.mark.parametrize("args, needles", [
    (["--backend", "triton"], ("--backend triton", "not timed")), (["--backend", "flash"], ("--backend", "flash")),
    (["--kv", "ring"], ("--kv", "ring")), (["--batch", "1,x"], ("--batch",)), (["--dtype", "int4"], ("--dtype",)),
    (["--layers", "0"], ("--layers",)), (["--prompt-len", "300"], ("max_positions=256",)),
])
def test_profile_bad_input(args, needles, calibrated, model_path, tmp_path):
    res = runner.invoke(app, ["profile", model_path, "-H", str(calibrated), "--device", "cpu", *args,
                              "-o", str(tmp_path / "run")])
    _one_error_line(res, *needles)
    assert not (tmp_path / "run").exists()


def test_profile_unknown_model_and_corrupt_calibration(calibrated, model_path, tmp_path):
    res = runner.invoke(app, ["profile", "llama-9", "-H", str(calibrated), "--device", "cpu"])
    _one_error_line(res, "llama-9")
    bad = tmp_path / "bad.yaml"
    data = yaml.safe_load(calibrated.read_text())
    data["calibration"]["tool"] = "someone else"
    bad.write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["profile", model_path, "-H", str(bad), "--device", "cpu", "-o", str(tmp_path / "r")])
    _one_error_line(res, str(bad), "foreign")
    assert not (tmp_path / "r").exists()


def test_profile_shape_that_does_not_fit(calibrated, tmp_path):
    """Llama-3.1-8B at batch 4096 x 8k tokens needs terabytes: refused with the figures, nothing run."""
    res = runner.invoke(app, ["profile", "llama-3.1-8b", "-H", str(calibrated), "--device", "cpu", "-b", "4096",
                              "-p", "8192", "-o", str(tmp_path / "run")])
    _one_error_line(res, "GiB", "weights", "KV cache", "free")
    assert not (tmp_path / "run").exists()


def _summary(args):
    res = runner.invoke(app, ["estimate", *args, "-f", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["configurations"]


def test_estimate_says_which_time_model_produced_the_numbers(calibrated):
    roof = _summary(["-H", "h100-sxm,a100-80gb-sxm", "-b", "1,8", "--efficiency", "roofline"])
    typical = _summary(["-H", "h100-sxm,a100-80gb-sxm", "-b", "1,8", "--efficiency", "typical"])
    assert [r["time_model"] for r in roof] == ["roofline"] * 4 and [r["time_model"] for r in typical] == ["typical"] * 4
    for r, t in zip(roof, typical):
        assert (r["hardware"], r["batch"]) == (t["hardware"], t["batch"])
        assert t["tpot_s"] > r["tpot_s"] and t["ttft_s"] > r["ttft_s"]
    cal = _summary(["gpt2", "-H", str(calibrated), "--dtype", "fp32", "--efficiency", "calibrated"])
    assert cal[0]["time_model"] == "calibrated"


@pytest.mark.parametrize("args, needles", [
    (["-H", "h100-sxm", "--efficiency", "calibrated"], ("no calibration", "llmperf calibrate")),
    (["-H", "h100-sxm", "--efficiency", "measured"], ("--efficiency", "measured")),
])
def test_estimate_efficiency_bad_input(args, needles):
    _one_error_line(runner.invoke(app, ["estimate", *args]), *needles)


def test_estimate_typical_refused_for_a_cpu(calibrated):
    _one_error_line(runner.invoke(app, ["estimate", "gpt2", "-H", str(calibrated), "--efficiency", "typical"]),
                    "GPU measurements")


def test_profile_calibrates_first_when_there_is_no_local(model_path, tmp_path, monkeypatch, fresh_cache):
    from llmperf.measure import calibrate as cal_mod

    monkeypatch.setattr(cal_mod.Settings, "for_device",
                        classmethod(lambda cls, device, **kw: cls.tiny(device=device, **kw)))
    res = runner.invoke(app, ["profile", model_path, "--device", "cpu", "-p", "8", "-g", "2", "--reps", "1",
                              "--threads", "1", "--no-micro", "-o", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert (fresh_cache / "local.yaml").is_file()
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    assert doc["hardware"] == "local" and doc["status"] == "complete"
    assert yaml.safe_load((fresh_cache / "local.yaml").read_text())["calibration"]["threads"] == 1


def test_profile_separate_step_run_flag(calibrated, model_path, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["profile", model_path, "-H", str(calibrated), "--device", "cpu", "-b", "1", "-p", "8",
                              "-g", "3", "--reps", "1", "--threads", "1", "--no-micro", "--separate-step-run",
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "run.json").read_text())
    assert doc["settings"]["separate_step_run"] is True and "unrecorded" in doc["measurements"]["steps"]


def test_calibrate_shows_the_operator_overheads(tmp_path):
    res = runner.invoke(app, ["calibrate", "--quick", "--threads", "1", "--dtypes", "fp32", "-o",
                              str(tmp_path / "c.yaml")])
    assert res.exit_code == 0, res.output
    assert "engine operator overheads" in res.output and "rope" in res.output and "naive" in res.output
