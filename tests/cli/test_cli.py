"""The CLI through typer's CliRunner: exit codes and content, for good and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pandas as pd
import pytest
from typer.testing import CliRunner

from llmperf.cli import app

runner = CliRunner()


def run(*args: str):  # noqa: ANN201
    return runner.invoke(app, list(args))


def test_estimate_default_runs():
    r = run("estimate")
    assert r.exit_code == 0, r.output
    assert "llama-3.1-8b on a100-80gb-sxm" in r.output
    assert "time to first token" in r.output and "memory" in r.output


def test_estimate_per_op_names_every_operator():
    r = run("estimate", "--per-op", "--batch", "4", "--split-qkv", "--split-gate-up")
    assert r.exit_code == 0, r.output
    for name in ("embed", "q_proj", "k_proj", "v_proj", "rope", "attention", "o_proj", "gate_proj",
                 "down_proj", "lm_head"):
        assert name in r.output
    r = run("estimate", "--per-op")  # fused projections by default, as vLLM runs them
    assert "qkv_proj" in r.output and "gate_up_proj" in r.output and "q_proj " not in r.output


def test_estimate_json_pipes_cleanly():
    r = run("estimate", "--format", "json", "--per-op")
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and len(doc["configurations"]) == 1
    assert doc["configurations"][0]["model"] == "llama-3.1-8b"
    assert doc["configurations"][0]["kv_bytes_per_token"] == 131072
    assert {o["op"] for o in doc["ops"]} >= {"attention", "lm_head"}


def test_estimate_csv_sweep():
    r = run("estimate", "--batch", "1,8,64,512", "--prompt-len", "128,1024", "--format", "csv")
    assert r.exit_code == 0, r.output
    frame = pd.read_csv(StringIO(r.stdout))
    assert len(frame) == 8 and set(frame["batch"]) == {1, 8, 64, 512}


def test_estimate_sweep_table():
    r = run("estimate", "--batch", "1,8", "--attention", "naive")
    assert r.exit_code == 0 and "2 configurations" in r.output


def test_precision_options():
    r = run("estimate", "--weights", "int4", "--kv", "fp8", "-f", "json")
    s = json.loads(r.stdout)["configurations"][0]
    assert s["precision"] == "w:int4/a:bf16/kv:fp8 (g128, zp)" and s["group_size"] == 128
    assert s["kv_bytes_per_token"] == 65536


def test_output_file_is_written_atomically(tmp_path):
    out = tmp_path / "est.json"
    r = run("estimate", "-f", "json", "-o", str(out))
    assert r.exit_code == 0
    assert json.loads(out.read_text())["configurations"][0]["batch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["est.json"]  # no temporary left behind


def test_model_from_yaml_and_hf_config(tmp_path):
    (tmp_path / "m.yaml").write_text("name: mine\nvocab_size: 1000\nhidden_size: 256\nnum_layers: 2\n"
                                     "num_heads: 4\nffn_size: 512\nmax_positions: 2048\n")
    r = run("estimate", str(tmp_path / "m.yaml"), "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["configurations"][0]["model"] == "mine"
    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
           "max_position_embeddings": 2048}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    r = run("estimate", str(tmp_path / "hf"), "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["configurations"][0]["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2


def test_models_and_hardware_lists():
    r = run("models")
    assert r.exit_code == 0 and "llama-3.1-8b" in r.output
    r = run("hardware", "-f", "json")
    assert any(d["name"] == "a100-80gb-sxm" for d in json.loads(r.stdout))


def test_help_names_units():
    r = run("estimate", "--help")
    assert r.exit_code == 0
    assert "tokens" in r.output and "GiB" in r.output


@pytest.mark.parametrize("args, needle", [
    (["estimate", "llama-3-8b"], "unknown model 'llama-3-8b'"),
    (["estimate", "--hardware", "a100"], "unknown hardware 'a100'"),
    (["estimate", "--batch", "1,x"], "--batch"),
    (["estimate", "--batch", "0"], "--batch: 0"),
    (["estimate", "--batch", "1,,2"], "--batch"),
    (["estimate", "--prompt-len", "-5"], "--prompt-len"),
    (["estimate", "--tp", "3"], "tp: 3 does not divide"),
    (["estimate", "--tp", "0"], "--tp: 0"),
    (["estimate", "--pp", "1000"], "pp: 1000 exceeds"),
    (["estimate", "--dtype", "fp12"], "unknown dtype 'fp12'"),
    (["estimate", "--kv", "fp7"], "precision.kv"),
    (["estimate", "--mem-util", "1.5"], "--mem-util: must be in (0, 1], got 1.5"),
    (["estimate", "--block-size", "0"], "--block-size"),
    (["estimate", "does/not/exist.yaml"], "file not found"),
    (["estimate", "-o", "/nonexistent-dir/x.json", "-f", "json"], "--output"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("content, needle", [
    ("name: x\nvocab_size: [1\n", "not valid YAML"),
    ("name: x\nvocab_size: 10\n", "missing field 'hidden_size'"),
    ("name: x\nvocab_size: 10\nhidden_size: 0\nnum_layers: 1\nnum_heads: 1\nffn_size: 4\nmax_positions: 8\n",
     "hidden_size must be a positive integer, got 0"),
    ("name: x\nvocab_size: 10\nhidden_size: 10\nnum_layers: 1\nnum_heads: 3\nffn_size: 4\nmax_positions: 8\n",
     "num_heads=3 does not divide hidden_size=10"),
    ("name: x\nvocab_size: 10\nhidden_size: 12\nnum_layers: 1\nnum_heads: 4\nnum_kv_heads: 3\nffn_size: 4\n"
     "max_positions: 8\n", "num_kv_heads=3 does not divide num_heads=4"),
    ("name: x\nvocab_size: 10\nhidden_size: 12\nnum_layers: 1\nnum_heads: 4\nffn_size: 4\nmax_positions: 8\n"
     "colour: red\n", "unknown field 'colour'"),
])
def test_bad_model_files(tmp_path, content, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    r = run("estimate", str(path))
    assert r.exit_code == 2 and needle in r.stderr, r.stderr


def test_bad_hardware_file(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("name: x\npeak_tflops: {fp16: -1}\nmemory_bandwidth_gbps: 1\nmemory_gib: 1\nnum_sms: 1\n"
                    "sram_per_sm_kib: 1\nl2_cache_mib: 1\n")
    r = run("estimate", "--hardware", str(path))
    assert r.exit_code == 2 and "peak_tflops.fp16" in r.stderr


def test_hardware_without_an_fp32_peak_is_refused_naming_the_field(tmp_path):
    """Elementwise operators run at the fp32 vector peak: a device file listing only fp16 used to
    fail with 'no compute peak for dtype fp32 or a wider one', naming neither field nor file value."""
    path = tmp_path / "hw.yaml"
    path.write_text("name: x\npeak_tflops: {fp16: 100}\nmemory_bandwidth_gbps: 1000\nmemory_gib: 10\n")
    out = tmp_path / "out.json"
    r = run("estimate", "--hardware", str(path), "-f", "json", "-o", str(out))
    assert r.exit_code == 2 and not out.exists()
    assert "peak_tflops has no fp32 entry" in r.stderr and "'fp16': 100.0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output
    path.write_text("name: x\npeak_tflops: {fp16: 100, fp32: 10}\nmemory_bandwidth_gbps: 1000\nmemory_gib: 10\n")
    assert run("estimate", "--hardware", str(path), "-f", "json").exit_code == 0


@pytest.mark.parametrize("args, needle", [
    (["estimate", "--block-size", "x"], "'--block-size'"),
    (["estimate", "--mem-util", "lots"], "'--mem-util'"),
    (["estimate", "--bogus"], "No such option: --bogus"),
    (["estimate", "--attention", "flash"], "'flash' is not one of"),
    (["models", "-f", "xml"], "'xml' is not one of"),
])
def test_usage_errors_are_one_line(tmp_path, args, needle):
    """typer drew these as a five-line box; every bad input is one line naming the option."""
    out = tmp_path / "out.json"
    r = run(*args, "-o", str(out))
    assert r.exit_code == 2 and not out.exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_memory_table_says_the_sliding_window_caps_the_kv(monkeypatch):
    """Mistral-7B keeps 4,096 of 8,200 tokens; the table said '1 x 8200 tokens' beside 0.5 GiB."""
    monkeypatch.setenv("COLUMNS", "200")
    r = run("estimate", "mistral-7b", "-p", "8000", "-g", "200")
    assert r.exit_code == 0 and "(1 x 4,096 tokens, sliding window;" in r.stdout, r.stdout
    assert "(1 x 640 tokens)" in run("estimate", "mistral-7b").stdout


def test_context_beyond_positions_warns_but_runs():
    r = run("estimate", "--prompt-len", "200000", "-f", "csv")
    assert r.exit_code == 0
    assert "warning" in r.stderr and "max_positions=131072" in r.stderr


def test_cli_and_analysis_do_not_import_torch():
    code = ("import sys, llmperf, llmperf.analysis, llmperf.cli\n"
            "from typer.testing import CliRunner\n"
            "r = CliRunner().invoke(llmperf.cli.app, ['estimate', '--per-op'])\n"
            "assert r.exit_code == 0, r.output\n"
            "print('torch' in sys.modules, 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


# ---- issue 7: one schema, every convention, lists, unfit configurations, 80 columns ------------------
def test_single_and_sweep_share_one_schema():
    one = json.loads(run("estimate", "-f", "json").stdout)
    many = json.loads(run("estimate", "-b", "1,2", "--tp", "1,2", "--weights", "bf16,int4", "-f", "json").stdout)
    assert one["schema_version"] == many["schema_version"] == 1
    assert list(one["configurations"][0]) == list(many["configurations"][0])
    assert len(many["configurations"]) == 8 and {c["gpus"] for c in many["configurations"]} == {1, 2}
    same = [c for c in many["configurations"] if c["batch"] == 1 and c["tp"] == 1 and c["weights"] == "bf16"]
    assert same == one["configurations"]  # a single estimate is the same row of a sweep
    csv = pd.read_csv(StringIO(run("estimate", "-b", "1,2", "-f", "csv").stdout))
    assert list(csv.columns) == list(one["configurations"][0])


def test_every_convention_reaches_the_numbers():
    def row(*args: str) -> dict:
        r = run("estimate", "-f", "json", *args)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["configurations"][0]
    base = row()
    assert row("--all-logits")["prefill_flops"] > base["prefill_flops"]
    assert row("--attention-flops", "dense")["prefill_flops"] > base["prefill_flops"]
    assert row("--attention", "naive")["prefill_bytes"] > base["prefill_bytes"]
    assert row("--split-qkv")["prefill_bytes"] > base["prefill_bytes"]
    assert row("--split-gate-up")["prefill_bytes"] > base["prefill_bytes"]
    assert row("--max-batched-tokens", "2048")["max_batch"] > base["max_batch"]
    assert row("--weights", "int4", "--group-size", "32")["weights_gib"] > row("--weights", "int4")["weights_gib"]
    assert row("--weights", "int4", "--embeddings", "int4")["weights_gib"] < row("--weights", "int4")["weights_gib"]
    assert row("--max-seq-len", "8192")["max_batch_contiguous"] > base["max_batch_contiguous"]
    lists = json.loads(run("estimate", "-b", "1,2", "--max-seq-len", "8192", "--per-op", "-f", "json").stdout)
    assert {c["max_seq_len"] for c in lists["configurations"]} == {8192}
    assert {o["configuration"] for o in lists["ops"]} == {0, 1}
    # the default is the expected time (typical, priced by the compiled engine), the roofline bound beside it
    assert base["time_model"] == "typical" and base["engine"] == "compiled" and base["params_total"] == 8_030_261_248
    for name in ("ttft", "tpot", "e2e"):
        assert 0 < base[f"{name}_bound_s"] < base[f"{name}_s"]


def test_unfit_configuration_is_flagged_and_warned_but_answers():
    r = run("estimate", "-b", "100000", "-f", "json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["configurations"][0]["fits"] is False
    assert "does not fit" in r.stderr
    r = run("estimate", "-b", "1,100000")
    assert r.exit_code == 0 and "NO" in r.stdout and "1 of 2 configurations do not fit" in r.stderr


def test_tables_fit_in_80_columns_without_truncating_names(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for args in (["estimate"], ["estimate", "--per-op"],
                 ["estimate", "mixtral-8x7b,llama-3.1-8b", "-H", "a100-80gb-sxm,h100-sxm", "-b", "1,64"]):
        r = run(*args)
        assert r.exit_code == 0, r.output
        assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
        assert "…" not in r.stdout
    assert "mixtral-8x7b" in r.stdout and "a100-80gb-sxm" in r.stdout


def test_a_sweep_too_wide_for_80_columns_splits_by_model_device_precision(monkeypatch):
    """With every key varying, the one table folded 'llama-3.1-8b' into 'llama-3' / '.1-8b' and
    'a100-80gb-sxm' into 'a100-80g' / 'b-sxm'; now each (model, device, precision) gets a table."""
    monkeypatch.setenv("COLUMNS", "80")
    r = run("estimate", "llama-3.1-8b,mixtral-8x7b", "-H", "a100-80gb-sxm,h100-sxm", "--weights", "bf16,int4",
            "--tp", "1,2", "--pp", "1,2", "-b", "1,8", "-p", "128,1024", "-g", "16,64")
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    titles = [line for line in r.stdout.splitlines() if line.startswith("32 configurations: ")]
    assert len(titles) == 8
    assert "32 configurations: llama-3.1-8b · a100-80gb-sxm · bf16" in r.stdout
    assert "32 configurations: mixtral-8x7b · h100-sxm · w:int4/a:bf16/kv:bf16" in " ".join(r.stdout.split())
    wide = run("estimate", "llama-3.1-8b,mixtral-8x7b", "-b", "1,8")  # fits: still one table
    assert wide.stdout.count("configurations") == 1


def test_per_op_rows_stay_on_one_line_in_80_columns(monkeypatch):
    """Piped (80 columns), the per-operator table drops its least needed columns (and says so)
    rather than folding 'matmul' into 'matmu / l' and 'compute' into 'comput / e'."""
    monkeypatch.setenv("COLUMNS", "80")
    for args in (["estimate", "--per-op", "--weights", "int4"], ["estimate", "-b", "1,2", "--per-op"]):
        r = run(*args)
        assert r.exit_code == 0, r.output
        rows = [line.split() for line in r.stdout.splitlines()
                if line.split() and line.split()[0] in ("qkv_proj", "gate_up_proj", "lm_head", "total")]
        assert rows and all(row[-1] in ("memory", "compute") for row in rows), r.stdout
        assert "not shown: kind" in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= 80
    monkeypatch.setenv("COLUMNS", "200")
    wide = run("estimate", "--per-op")
    assert "not shown" not in wide.stdout and " matmul " in wide.stdout


@pytest.mark.parametrize("args, needle", [
    (["--max-batched-tokens", "0"], "--max-batched-tokens: must be a positive integer, got 0"),
    (["--group-size", "0", "--weights", "int4"], "group_size: must be a positive integer"),
    (["--group-size", "64"], "group scales apply to int4/int8 weights"),
    (["--attention-flops", "sparse"], "--attention-flops: must be executed or dense, got 'sparse'"),
    (["--tp", "1,x"], "--tp"),
    (["--pp", "2,0"], "--pp: 0"),
    (["--weights", "int4,fp9"], "unknown dtype 'fp9'"),
    (["--max-seq-len", "600"], "max_seq_len: 600 is shorter than a context of 640"),
    (["--embeddings", "fp5"], "precision.embeddings"),
    # beyond 2**53: an OverflowError traceback (batch, prompt) or a max_seq_len of -9223372036854775808
    (["-b", "99999999999999999999"], "batch: every value must be an integer in 1 .. 2**53"),
    (["-p", "1,99999999999999999999"], "prompt_len: every value must be an integer in 1 .. 2**53"),
    (["--max-seq-len", "99999999999999999999"], "max_seq_len: must be an integer in 1 .. 2**53"),
    (["--max-batched-tokens", "99999999999999999999"], "max_batched_tokens: must be an integer in 1 .. 2**53"),
])
def test_new_bad_inputs_exit_2_and_leave_no_file(tmp_path, args, needle):
    out = tmp_path / "out.json"
    r = run("estimate", *args, "-f", "json", "-o", str(out))
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []
