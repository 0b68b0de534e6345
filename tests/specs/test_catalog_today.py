"""`llmperf models` rows and table for today's models: total and active parameters, the attention
(`MLA 512+64`, `GQA 8x128`) and the local layers (`sliding 1:1`, `chunked 3:1`)."""

from __future__ import annotations

from llmperf.cli.listing import models_table, table_text
from llmperf.specs import load_model
from llmperf.specs.catalog import attention_label, local_label, model_row, model_rows


def test_labels():
    assert attention_label(load_model("deepseek-v3")) == "MLA 512+64"
    assert attention_label(load_model("llama-3.1-8b")) == "GQA 8x128"
    assert attention_label(load_model("llama-2-7b")) == "MHA 32x128"
    assert local_label(load_model("gpt-oss-20b")) == "sliding 1:1"
    assert local_label(load_model("gemma-3-27b")) == "sliding 26:5"  # 52 sliding, 10 full
    assert local_label(load_model("llama-4-scout")) == "chunked 3:1"
    assert local_label(load_model("mistral-7b")) == "sliding all"
    assert local_label(load_model("qwen3-8b")) == "-"


def test_rows_carry_the_structure():
    ds = model_row(load_model("deepseek-v3"))
    assert (ds["params"], ds["active_params"]) == (671_026_419_200, 37_552_297_472)
    assert (ds["moe_layers"], ds["shared_experts"], ds["expert_ffn"], ds["mtp_layers"]) == (58, 1, 2048, 1)
    assert ds["kv_elements_per_token_per_layer"] == 576
    oss = model_row(load_model("gpt-oss-120b"))
    assert (oss["sliding_layers"], oss["sliding_window"], oss["experts"], oss["experts_per_token"]) == (18, 128, 128, 4)
    scout = model_row(load_model("llama-4-scout"))
    assert (scout["chunked_layers"], scout["nope_layers"], scout["attention_chunk_size"]) == (36, 12, 8192)
    assert len({tuple(r) for r in model_rows()}) == 1  # the same columns in every row (CSV)


def test_table_shows_total_active_attention_and_local():
    text = table_text(models_table(model_rows()))
    assert max(len(line) for line in text.splitlines()) <= 80
    line = next(line for line in text.splitlines() if line.startswith("deepseek-v3 "))
    assert "671B/37.6B" in line and "MLA 512+64" in line and "8/256+1" in line and line.endswith(" 69")
    line = next(line for line in text.splitlines() if line.startswith("gpt-oss-120b "))
    assert "117B/5.71B" in line and "GQA 8x64" in line and "sliding 1:1" in line
    line = next(line for line in text.splitlines() if line.startswith("kimi-k2 "))
    assert "1.03T/32.9B" in line
