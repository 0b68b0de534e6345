"""Issue 20 (audit `bad-inputs.md`): fields read from YAML and JSON files are taken at their type, never
truthy-coerced or silently collapsed, and a bad one is refused in one line naming the field and value
(D4, D5, D10 `name`, D15 pipes, D16 control characters, D17 counts, duplicate keys, device_names)."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from llmperf.errors import SpecError
from llmperf.specs import load_hardware, load_model

SHAPE = dict(vocab_size=1000, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, ffn_size=512,
             max_positions=2048)
HF = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
      "max_position_embeddings": 2048}
HW = "name: dup\npeak_tflops: {fp32: 19.5, fp16: 312}\nmemory_bandwidth_gbps: 2039\nmemory_gib: 80\n"


def yaml_of(fields: dict) -> str:
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def hf_dir(tmp_path, **extra):
    d = tmp_path / "hf"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**HF, **extra}))
    return d


@pytest.mark.parametrize("key", ["attention_bias", "mlp_bias"])
@pytest.mark.parametrize("value", ["false", "true", 0, 1, "no", [], None])
def test_hf_booleans_are_booleans(tmp_path, key, value):
    """D4: `"attention_bias": "false"` turned the biases on (`bool("false")` is True)."""
    plain = load_model(str(hf_dir(tmp_path)))
    if value is None:  # null: the HF default (no bias)
        assert load_model(str(hf_dir(tmp_path, **{key: value}))).param_count == plain.param_count
        return
    with pytest.raises(SpecError, match=rf"^.*config\.json: {key} must be true or false, got {value!r}$".replace(
            "[", r"\[").replace("]", r"\]")):
        load_model(str(hf_dir(tmp_path, **{key: value})))


def test_hf_real_booleans_still_work(tmp_path):
    plain = load_model(str(hf_dir(tmp_path)))
    assert load_model(str(hf_dir(tmp_path, attention_bias=False))).param_count == plain.param_count == 2873600
    assert load_model(str(hf_dir(tmp_path, attention_bias=True))).param_count == 2873600 + 3072  # q/k/v/o biases


def test_opt_and_qwen_flags_are_strict(tmp_path):
    opt = {"model_type": "opt", "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "ffn_dim": 512, "max_position_embeddings": 2048, "enable_bias": "false"}
    (tmp_path / "config.json").write_text(json.dumps(opt))
    with pytest.raises(SpecError, match="enable_bias must be true or false, got 'false'"):
        load_model(str(tmp_path / "config.json"))
    qwen = {**HF, "model_type": "qwen2", "use_sliding_window": "yes", "sliding_window": 128}
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    with pytest.raises(SpecError, match="use_sliding_window must be true or false, got 'yes'"):
        load_model(str(tmp_path / "config.json"))


@pytest.mark.parametrize("second", ["FP16", "float16", "Fp16"])
def test_case_duplicate_peaks_are_refused(tmp_path, second):
    """D5: fp16 and FP16 normalise to one dtype; the last silently won (a 290x wrong TTFT)."""
    h = tmp_path / "h.yaml"
    h.write_text(f"name: dup\npeak_tflops: {{fp32: 19.5, fp16: 312, bf16: 312, {second}: 1}}\n"
                 "memory_bandwidth_gbps: 2039\nmemory_gib: 80\n")
    with pytest.raises(SpecError, match=rf"^dup: peak_tflops lists 'fp16' and '{second}', the same dtype \(fp16\)"):
        load_hardware(str(h))


def test_duplicate_keys_are_refused(tmp_path):
    """D17 (EM52): a field given twice; YAML and JSON alike, at any depth."""
    m = tmp_path / "m.yaml"
    m.write_text(yaml_of(SHAPE) + "hidden_size: 512\n")
    dup = r"m\.yaml: not valid YAML \(duplicate key 'hidden_size' \(line 2 and line 8\)\)"
    with pytest.raises(SpecError, match=dup):
        load_model(str(m))
    h = tmp_path / "h.yaml"
    h.write_text("name: dup\npeak_tflops: {fp32: 19.5, fp32: 20}\nmemory_bandwidth_gbps: 2039\nmemory_gib: 80\n")
    with pytest.raises(SpecError, match="duplicate key 'fp32'"):
        load_hardware(str(h))
    j = tmp_path / "m.json"
    j.write_text('{"name": "j", "vocab_size": 1000, "vocab_size": 2000}')
    with pytest.raises(SpecError, match=r"m\.json: not valid JSON \(duplicate key 'vocab_size'"):
        load_model(str(j))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(HF)[:-1] + ', "hidden_size": 512}')
    with pytest.raises(SpecError, match="duplicate key 'hidden_size'"):
        load_model(str(tmp_path / "hf"))


@pytest.mark.parametrize("name, message", [
    ("[a, b]", "name: must be a string, got ['a', 'b']"),  # D10 (EM29): not a pandas message
    ("12", "name: must be a string, got 12"),
    ('"ansi\\e[31mRED\\e]0;pwned\\a"', "name: must not hold control characters"),  # D16 (EM56)
    ('"tab\\there"', "name: must not hold control characters"),
    ('"  "', "name: must not be empty"),
])
def test_bad_names(tmp_path, name, message):
    m = tmp_path / "m.yaml"
    m.write_text(f"name: {name}\n" + yaml_of(SHAPE))
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_model(str(m))
    h = tmp_path / "h.yaml"
    h.write_text(f"name: {name}\n" + HW.split("\n", 1)[1])
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_hardware(str(h))


def test_markup_in_a_name_is_a_valid_name(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text('name: "my-model[/v2]"\n' + yaml_of(SHAPE))
    assert load_model(str(m)).name == "my-model[/v2]"


@pytest.mark.parametrize("value", ["10000000000000000000000000000", str(2**53 + 1)])
def test_counts_above_2_53_are_refused(tmp_path, value):
    """D17 (EM08, EM09): float64 cannot hold these counts exactly."""
    m = tmp_path / "big.yaml"
    m.write_text(yaml_of({**SHAPE, "vocab_size": value}))
    with pytest.raises(SpecError, match=rf"big: vocab_size must be at most 2\*\*53, got {value}"):
        load_model(str(m))


def test_hf_count_as_a_float_is_refused(tmp_path):
    with pytest.raises(SpecError, match="vocab_size"):  # EF45: 1e30 is a float, not a count
        load_model(str(hf_dir(tmp_path, vocab_size=1e30)))


def test_device_names_must_be_a_list(tmp_path):
    """D17 (EH20): a string was split into its characters, ('A', '1', '0', '0')."""
    h = tmp_path / "h.yaml"
    h.write_text(HW + "device_names: A100\n")
    with pytest.raises(SpecError, match="device_names must be a list of names, got 'A100'"):
        load_hardware(str(h))
    h.write_text(HW + "device_names: [A100]\n")
    assert load_hardware(str(h)).device_names == ("A100",)


def test_a_name_too_long_for_a_path(tmp_path):
    """D10 (E077): named MODEL, shortened, instead of '--output: [Errno 36] ...' and 100,000 characters."""
    with pytest.raises(SpecError) as err:
        load_model("x" * 100_000)
    msg = str(err.value)
    assert msg.startswith("model: 'xxxx") and "100000 characters" in msg and len(msg) < 200
    with pytest.raises(SpecError, match=r"^--hardware: .*too long for a file path"):
        load_hardware("y" * 5000)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX FIFOs")
def test_specs_are_read_from_pipes(tmp_path):
    """D15: a FIFO (or `<(cat spec.yaml)`) is read, once, even when a command loads the spec twice."""
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    text = "name: piped\n" + yaml_of(SHAPE)
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    try:
        assert load_model(str(fifo)).name == "piped"
        assert load_model(str(fifo)).name == "piped"  # the second load does not block on an empty pipe
    finally:
        writer.join(timeout=10)
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(SpecError, match="is a directory"):
        load_hardware(str(tmp_path / "dir.yaml"))
