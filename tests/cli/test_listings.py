"""`llmperf models`, `llmperf hardware` and `llmperf --version`: formats, files, 80 columns, no
truncated names."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from llmperf import __version__
from llmperf.cli import app
from llmperf.cli.listing import hardware_table, models_table, table_text
from llmperf.specs import list_hardware, list_models, load_model
from llmperf.specs.catalog import hardware_rows, model_rows


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"llmperf {__version__}"


@pytest.mark.parametrize("command,names", [("models", list_models()), ("hardware", list_hardware())])
@pytest.mark.parametrize("columns", ["80", "200"])
def test_table_fits_80_columns_with_whole_names(command, names, columns):
    r = run(command, env={"COLUMNS": columns})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    first_words = {line.split()[0] for line in lines if line.strip()}
    assert set(names) <= first_words  # every name whole, on its own row


@pytest.mark.parametrize("table,rows", [(models_table, model_rows), (hardware_table, hardware_rows)])
def test_table_text_is_80_columns(table, rows):
    text = table_text(table(rows()))
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "\x1b" not in text and text.endswith("\n")


def test_models_json_has_exact_counts():
    r = run("models", "-f", "json")
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert set(rows) == set(list_models())
    assert rows["llama-2-7b"]["params"] == 6_738_415_616
    assert rows["llama-2-7b"]["kv_bytes_per_token_fp16"] == 524_288
    assert rows["mixtral-8x7b"]["active_params"] == 12_879_925_248
    assert rows["mistral-7b"]["sliding_window"] == 4096 and rows["llama-2-7b"]["sliding_window"] is None


def test_hardware_json_is_strict_json():
    r = run("hardware", "-f", "json")
    assert r.exit_code == 0 and "NaN" not in r.stdout
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert set(rows) == set(list_hardware())
    a100 = rows["a100-80gb-sxm"]
    assert (a100["fp16_tflops"], a100["bandwidth_gbps"], a100["memory_gib"]) == (312.0, 2039, 80)
    assert a100["fp8_tflops"] is None  # no fp8 units on Ampere: null, not NaN
    assert a100["ridge_fp16"] == pytest.approx(312e12 / 2039e9)


@pytest.mark.parametrize("command", ["models", "hardware"])
def test_csv_has_the_json_columns(command):
    rows = json.loads(run(command, "-f", "json").stdout)
    r = run(command, "-f", "csv")
    assert r.exit_code == 0
    parsed = list(csv.DictReader(io.StringIO(r.stdout)))
    assert list(parsed[0]) == list(rows[0]) and len(parsed) == len(rows)
    assert [p["name"] for p in parsed] == [row["name"] for row in rows]


@pytest.mark.parametrize("command", ["models", "hardware"])
@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_output_file(tmp_path, command, fmt):
    out = tmp_path / f"listing.{fmt}"
    r = run(command, "-f", fmt, "-o", str(out))
    assert r.exit_code == 0 and r.stdout == ""
    text = out.read_text(encoding="utf-8")
    assert text == (run(command, "-f", fmt).stdout if fmt != "table" else text)
    assert "a100-80gb-sxm" in text or "llama-3.1-8b" in text
    if fmt == "table":
        assert "\x1b" not in text and max(len(line) for line in text.splitlines()) <= 80


def test_bad_format_is_exit_2():
    r = run("models", "-f", "xml")
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_model_rows_match_the_specs():
    for row in model_rows():
        m = load_model(row["name"])
        assert row["params"] == m.param_count and row["kv_bytes_per_token_fp16"] == m.kv_bytes_per_token("fp16")
