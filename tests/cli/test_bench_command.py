"""`llmperf bench`: one command for the project's benchmarks, each run through its module's `main(argv)`."""

from __future__ import annotations

import importlib

import pytest
from typer.testing import CliRunner

import llmperf.cli
from llmperf.cli.commands.bench import BENCHMARKS

runner = CliRunner()


def test_without_a_name_it_lists_every_benchmark():
    r = runner.invoke(llmperf.cli.app, ["bench"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for name, (module, _, _) in BENCHMARKS.items():
        assert name in r.output and module in r.output


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_each_names_a_module_with_a_main(name):
    assert callable(importlib.import_module(BENCHMARKS[name][0]).main)


def test_an_unknown_name_is_one_line_and_exit_2():
    r = runner.invoke(llmperf.cli.app, ["bench", "nope"])
    assert r.exit_code == 2
    assert "no benchmark 'nope'" in r.output and "Traceback" not in r.output


def test_the_arguments_after_the_name_reach_the_benchmark(monkeypatch):
    seen = []
    module = importlib.import_module(BENCHMARKS["simulator"][0])
    monkeypatch.setattr(module, "main", lambda argv: seen.append(argv))
    r = runner.invoke(llmperf.cli.app, ["bench", "simulator", "--requests", "10", "--help"])
    assert r.exit_code == 0, r.output
    assert seen == [["--requests", "10", "--help"]]


def test_a_benchmark_runs_and_its_exit_code_is_the_command_s():
    r = runner.invoke(llmperf.cli.app, ["bench", "kernels", "--dry-run", "--quick"])
    assert r.exit_code == 0, r.output
    assert "mla B=1 T=4096" in r.output
    r = runner.invoke(llmperf.cli.app, ["bench", "kernels", "--bogus"])
    assert r.exit_code == 2
