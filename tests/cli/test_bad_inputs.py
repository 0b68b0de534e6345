"""Issue 20 (audit `bad-inputs.md`): the reproducers of D7, D10, D17 (traces, group sizes), D18 and D20,
each refused in one line naming the option or field and the value (exit 2), or answered."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import llmperf
from llmperf.cli import app
from llmperf.errors import SpecError

runner = CliRunner()
PLAN = ["plan", "-H", "a100-80gb-sxm", "--precisions", "bf16", "--tp", "1", "-n", "20", "-j", "1", "--slo-ttft", "1"]


def one_error_line(res, *needles: str) -> str:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output and "Warning" not in res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize("args, needles", [
    (["--prompt-len", "lognormal:1000:1"], ["lognormal:1000:1:1", "more than 2**31", "upper bound"]),  # S029
    (["--prompt-len", "normal:1e308:1e308"], ["normal:1e+308:1e+308:1", "more than 2**31"]),  # S030
    (["--output-len", "lognormal:60:1"], ["lognormal:60:1:1"]),
])
def test_huge_length_distributions(args, needles):
    one_error_line(runner.invoke(app, ["simulate", "-n", "5", *args]), *needles)


def test_lognormal_mean_does_not_overflow():
    from llmperf.serving.workload import parse_length
    assert parse_length("lognormal:1000:1").mean == float("inf")
    assert parse_length("lognormal:1000:1:16:4096").sample(3, __import__("numpy").random.default_rng(0)).max() == 4096


@pytest.mark.parametrize("text, needles", [
    # ST10
    ("arrival_s,prompt_tokens,output_tokens\n0,1e20,10\n", ["line 2: prompt_tokens: '1e20' exceeds 2**31 tokens"]),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,1e20\n", ["line 2: output_tokens"]),
    ("arrival_s,arrival_s,prompt_tokens,output_tokens\n0,1,10,10\n", ["column 'arrival_s' appears twice"]),  # ST34
])
def test_trace_values(tmp_path, text, needles):
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    line = one_error_line(runner.invoke(app, ["simulate", "--trace", str(trace)]), *needles)
    assert "has no tokens" not in line


def test_block_larger_than_the_pool_names_block_size():
    """D10 (S051): the message blamed the weights, which fit (15.16 < 72 GiB)."""
    line = one_error_line(runner.invoke(app, ["simulate", "-n", "5", "--block-size", "1000000000"]),
                          "--block-size: one block of 1000000000 tokens")
    assert "no room for a KV cache" not in line


@pytest.mark.parametrize("value, needle", [("nan", "--user-interval: must be a number > 0, got nan"),  # P47
                                           ("inf", "--user-interval: must be a finite number, got inf"),
                                           ("0", "--user-interval: must be a number > 0, got 0")])
def test_user_interval_is_named(value, needle):
    one_error_line(runner.invoke(app, [*PLAN, "--users", "10", "--user-interval", value]), needle)


@pytest.mark.parametrize("call, needle", [
    (lambda: llmperf.sweep([], ["a100-80gb-sxm"]), "models: needs at least one value"),  # A37
    # A41
    (lambda: llmperf.sweep(["llama-3.1-8b"], ["a100-80gb-sxm"], weights=[]), "weights: needs at least one value"),
    (lambda: llmperf.sweep(["llama-3.1-8b"], []), "hardware: needs at least one value"),
    (lambda: llmperf.sweep(["llama-3.1-8b"], ["a100-80gb-sxm"], tp=[]), "tp: needs at least one value"),
])
def test_empty_sweep_lists(call, needle):
    with pytest.raises(SpecError, match=needle):
        call()


@pytest.mark.parametrize("group", ["7", "100000", "48"])
def test_group_size_must_tile_the_rows(group):
    """D17 (E038, E039): g=100000 gave fewer scale bytes than one scale per row, an impossible layout."""
    one_error_line(runner.invoke(app, ["estimate", "--weights", "int4", "--group-size", group]),
                   f"group_size: {group} does not divide llama-3.1-8b's hidden_size=4096")


@pytest.mark.parametrize("group", ["64", "128", "1024", "-1"])
def test_group_sizes_that_tile_are_fine(group):
    assert runner.invoke(app, ["estimate", "--weights", "int4", "--group-size", group, "-f", "csv"]).exit_code == 0


def test_options_that_would_be_ignored():
    """D18: --cv without gamma arrivals (S012), --user-interval with --rate (P46), -H '' (P28)."""
    one_error_line(runner.invoke(app, ["simulate", "--cv", "3", "--rate", "5", "-n", "20"]),
                   "--cv", "--arrival gamma")
    assert runner.invoke(app, ["simulate", "--cv", "3", "--rate", "5", "-n", "20", "--arrival", "gamma"]).exit_code == 0
    one_error_line(runner.invoke(app, [*PLAN, "--rate", "1", "--user-interval", "5"]), "--user-interval", "--users")
    one_error_line(runner.invoke(app, ["plan", "--rate", "1", "--slo-ttft", "1", "-H", ""]), "--hardware", "empty")


def test_gpu_cost_names():
    """D18 (P20, P21): a device priced twice is refused; names are case-insensitive, as everywhere."""
    one_error_line(runner.invoke(app, [*PLAN, "--rate", "1", "--gpu-cost", "a100-80gb-sxm=2,a100-80gb-sxm=3"]),
                   "--gpu-cost: 'a100-80gb-sxm' is priced twice (2 and 3)")
    res = runner.invoke(app, [*PLAN, "--rate", "1", "--gpu-cost", "A100-80GB-SXM=2", "-f", "csv",
                              "--prompt-len", "100", "--output-len", "10"])
    assert res.exit_code == 0, res.output


def test_decode_step_times_take_step_indices():
    """D20 (A35): a fractional start gave the times of contexts 513.5, 514.5, ..."""
    est = llmperf.estimate("llama-3.1-8b", "a100-80gb-sxm")
    assert len(est.decode_step_times_s(start=3)) == est.gen_len - 3
    for bad in (1.5, "2", True):
        with pytest.raises(ValueError, match="start: must be an integer step index"):
            est.decode_step_times_s(start=bad)
    with pytest.raises(ValueError, match="stop: must be an integer step index"):
        est.decode_step_times_s(stop=4.0)
