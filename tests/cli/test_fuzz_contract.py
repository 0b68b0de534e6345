"""The command line's contract under random input (issue 20), driven by hypothesis: for any values of the
options and of the spec files' fields (numbers, NaN / inf / huge / negative, empty, unicode, rich
markup, control characters), a command either

- exits 0 with valid output (CSV or JSON that parses; the `-o` file written, nothing else), or
- exits 2 with exactly one line `error: ...` on stderr, no traceback, and no file changed at all.

Examples are few per run (the machine is small); hypothesis' database replays any failure it found."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from llmperf.cli import app

runner = CliRunner()

NASTY = ["", " ", "0", "-1", "1", "2", "3", "7", "nan", "NaN", "inf", "-inf", "1e308", "1e-308", "1e20",
         "9007199254740993", "0.5", "1.5", "abc", "[/]", "[bold]x", "foo[/]", "\x1b[31m", "é", "名前", "1,2",
         ",", "1,,2", "-", "/", "./", "../x", "a" * 300, "fp16", "bf16", "int4", "FP16", "float16",
         "uniform:1:5", "normal:10:3", "lognormal:1000:1", "lognormal:3:1:1:64", "cycle:3,5", "file:nope"]
values = st.one_of(st.sampled_from(NASTY), st.text(max_size=12),
                   st.integers(-10, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr))

FUZZ = settings(max_examples=int(os.environ.get("LLMPERF_FUZZ_EXAMPLES", "25")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file's (mtime, size) and every folder (whose mtime moves with what is written inside)."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) if p.is_file() else "folder"
            for p in folder.rglob("*")}


def check_contract(res, folder: Path, before: dict, out: str | None, fmt: str | None) -> None:
    assert not (res.exception and not isinstance(res.exception, SystemExit)), (
        f"{type(res.exception).__name__}: {res.exception}\n{res.output}")
    assert "Traceback" not in res.output
    after = snapshot(folder)
    if res.exit_code == 0:
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        assert changed <= ({out} if out else set()), changed
        text = (folder / out).read_text() if out else res.stdout
        if fmt == "csv":
            rows = list(csv.DictReader(io.StringIO(text)))
            assert rows
        elif fmt == "json":
            json.loads(text)
        return
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.output
    assert after == before, "a command that failed changed a file"


ESTIMATE_OPTIONS = ["--batch", "--prompt-len", "--gen-len", "--dtype", "--weights", "--kv", "--tp", "--pp",
                    "--hardware", "--mem-util", "--block-size", "--max-seq-len", "--group-size",
                    "--max-batched-tokens", "--attention-flops", "--efficiency"]


@FUZZ
@given(st.dictionaries(st.sampled_from(ESTIMATE_OPTIONS), values, max_size=3),
       st.sampled_from(["csv", "json"]), st.booleans(), st.sampled_from(["llama-3.1-8b", "gpt2", "model.yaml"]))
def test_estimate_contract(tmp_path_factory, options, fmt, to_file, model):
    folder = tmp_path_factory.mktemp("estimate")
    (folder / "model.yaml").write_text("vocab_size: 1000\nhidden_size: 256\nnum_layers: 4\nnum_heads: 4\n"
                                       "num_kv_heads: 2\nffn_size: 512\nmax_positions: 2048\n")
    args = ["estimate", str(folder / model) if model.endswith(".yaml") else model, "-f", fmt]
    for opt, value in options.items():
        if opt in ("--batch", "--prompt-len", "--gen-len") and len(value) > 6:
            value = value[:6]  # a sweep of 10**6 rows is a valid, slow answer: keep examples quick
        args += [opt, value]
    out = "out.txt" if to_file else None
    if out:
        args += ["-o", str(folder / out)]
    before = snapshot(folder)
    res = runner.invoke(app, args)
    check_contract(res, folder, before, out, fmt)


SIMULATE_OPTIONS = ["--rate", "--prompt-len", "--output-len", "--block-size", "--mem-util", "--max-batch",
                    "--max-batched-tokens", "--tp", "--cv", "--arrival", "--system-prompt-len", "--dtype",
                    "--slo-ttft", "--slo-percentile", "--hardware"]


@FUZZ
@given(st.dictionaries(st.sampled_from(SIMULATE_OPTIONS), values, max_size=3), st.sampled_from(["csv", "json"]),
       st.booleans())
def test_simulate_contract(tmp_path_factory, options, fmt, run_dir):
    folder = tmp_path_factory.mktemp("simulate")
    args = ["simulate", "-n", "5", "-f", fmt, "-o", str(folder / "out.txt")]
    for opt, value in options.items():
        args += [opt, value]
    if run_dir:
        args += ["--run-dir", str(folder / "rd")]
    before = snapshot(folder)
    res = runner.invoke(app, args)
    if res.exit_code == 0 and run_dir:  # the run directory is asked for too
        before = {**before, **{k: v for k, v in snapshot(folder).items() if k.startswith("rd")}}
    check_contract(res, folder, before, "out.txt", fmt)


MODEL_FIELDS = {"vocab_size": "1000", "hidden_size": "256", "num_layers": "4", "num_heads": "4",
                "num_kv_heads": "2", "ffn_size": "512", "max_positions": "2048"}
YAML_VALUES = st.one_of(st.sampled_from(["0", "-1", ".nan", ".inf", "1e30", "10000000000000000000", "true",
                                         "'false'", "[1, 2]", "{a: 1}", "null", "''", "'[/]'", "2.5", "'x'"]),
                        st.integers(-5, 5000).map(str))


@FUZZ
@given(st.dictionaries(st.sampled_from([*MODEL_FIELDS, "name", "dtype", "family", "tied_embeddings",
                                        "sliding_window", "qkv_bias"]), YAML_VALUES, max_size=3))
def test_model_file_contract(tmp_path_factory, fields):
    folder = tmp_path_factory.mktemp("spec")
    data = {**MODEL_FIELDS, **fields}
    (folder / "m.yaml").write_text("".join(f"{k}: {v}\n" for k, v in data.items()))
    before = snapshot(folder)
    res = runner.invoke(app, ["estimate", str(folder / "m.yaml"), "-f", "csv"])
    check_contract(res, folder, before, None, "csv")


HW_FIELDS = {"name": "h", "peak_tflops": "{fp32: 19.5, bf16: 312}", "memory_bandwidth_gbps": "2039",
             "memory_gib": "80"}


@FUZZ
@given(st.dictionaries(st.sampled_from([*HW_FIELDS, "interconnect_gbps", "num_sms", "device_names"]),
                       st.one_of(YAML_VALUES, st.sampled_from(["{fp32: 1, FP32: 2}", "{fp16: 1}", "{}", "[A100]"])),
                       max_size=3))
def test_hardware_file_contract(tmp_path_factory, fields):
    folder = tmp_path_factory.mktemp("hw")
    data = {**HW_FIELDS, **fields}
    (folder / "h.yaml").write_text("".join(f"{k}: {v}\n" for k, v in data.items()))
    before = snapshot(folder)
    res = runner.invoke(app, ["estimate", "-H", str(folder / "h.yaml"), "-f", "csv"])
    check_contract(res, folder, before, None, "csv")


@pytest.mark.parametrize("command", [["models"], ["hardware"]])
@FUZZ
@given(value=st.sampled_from(["", "-", "/dev/null", ".", "./", "dir/", "x" * 300, "[/]", "sub/out.json"]))
def test_listing_output_contract(tmp_path_factory, command, value):
    folder = tmp_path_factory.mktemp("listing")
    (folder / "sub").mkdir()
    target = value if value in ("", "-", "/dev/null") else f"{folder}/{value}"
    before = snapshot(folder)
    res = runner.invoke(app, [*command, "-f", "json", "-o", target])
    asked = "sub/out.json" if value == "sub/out.json" else None
    check_contract(res, folder, before, asked if res.exit_code == 0 and asked else None, "json")


PLAN_OPTIONS = ["--max-batch", "--block-size", "--mem-util", "--users", "--user-interval", "--gpu-cost",
                "--slo-ttft", "--slo-tpot", "--slo-percentile", "--max-replicas", "--precisions", "--hardware"]


@settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 3))
@given(st.dictionaries(st.sampled_from(PLAN_OPTIONS), values, max_size=2), st.sampled_from(["csv", "json"]),
       st.booleans())
def test_plan_contract(tmp_path_factory, options, fmt, run_dir):
    folder = tmp_path_factory.mktemp("plan")
    base = {"--hardware": "a100-80gb-sxm", "--precisions": "bf16", "--slo-ttft": "1"}
    args = ["plan", "--tp", "1", "-n", "10", "-j", "1", "--prompt-len", "100", "--output-len", "10", "-f", fmt,
            "-o", str(folder / "out.txt")]
    if "--users" not in options:
        args += ["--rate", "1"]
    for opt, value in {**base, **options}.items():
        args += [opt, value]
    if run_dir:
        args += ["--run-dir", str(folder / "rd")]
    before = snapshot(folder)
    res = runner.invoke(app, args)
    if res.exit_code == 0 and run_dir:
        before = {**before, **{k: v for k, v in snapshot(folder).items() if k.startswith("rd")}}
    check_contract(res, folder, before, "out.txt", fmt)
