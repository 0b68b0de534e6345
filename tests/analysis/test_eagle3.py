"""An EAGLE-3 head as a draft (`llmperf.analysis.speculative`, `--draft eagle3`): its layer, `fc`, norms,
draft-vocabulary head and map counted exactly; `fc` at a cycle's first draft step only; a head's
config.json read as vLLM's `LlamaForCausalLMEagle3`; and the heads it cannot price refused by name."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmperf.analysis.roofline import ROOFLINE
from llmperf.analysis.speculative import EAGLE3, eagle3_ops, resolve_draft, speculate
from llmperf.cli import app
from llmperf.errors import SpecError
from llmperf.specs import load_model

LLAMA_HEAD = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=4096,
                  num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, num_hidden_layers=1,
                  vocab_size=128256, draft_vocab_size=32000, rms_norm_eps=1e-5, torch_dtype="bfloat16")


def _head(tmp_path, **changes) -> str:
    path = tmp_path / "eagle3" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**LLAMA_HEAD, **changes}))
    return str(path.parent)


def test_the_head_is_one_layer_of_the_targets_width_over_a_draft_vocabulary(tmp_path) -> None:
    target = load_model("llama-3.1-8b")
    spec, kind = resolve_draft(target, "eagle3")
    assert kind == EAGLE3 and spec.num_layers == 1 and spec.vocab_size == 32000
    assert (spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.ffn_size) == (4096, 32, 8, 14336)
    from_config, kind = resolve_draft(target, _head(tmp_path))  # the same head, from its config.json
    assert kind == EAGLE3 and from_config.param_count == spec.param_count
    assert resolve_draft(target, "eagle3:128256")[0].vocab_size == 128256


def test_its_weights_are_counted_exactly() -> None:
    """Llama-3.1-8B's head in bf16: Q/K/V over 2 x 4096 in, o_proj, the SwiGLU FFN, four norms (input,
    post-attention, hidden_norm, final), fc (3 x 4096 -> 4096), a 32,000-token head, and d2t in int64;
    no embedding (the target's)."""
    h, q, kv, ffn, v = 4096, 32 * 128, 8 * 128, 14336, 32000
    params = 2 * h * (q + 2 * kv) + q * h + 3 * h * ffn + 4 * h + 3 * h * h + h * v
    est = speculate("llama-3.1-8b", "eagle3", "h100-sxm", num_draft_tokens=3, acceptance=0.8)
    assert est.draft_weights_bytes == 2 * params + 8 * v
    assert est.summary()["draft"] == "llama-3.1-8b EAGLE-3"


def test_fc_joins_the_targets_features_at_the_first_draft_step_only() -> None:
    est = speculate("llama-3.1-8b", "eagle3", "h100-sxm", num_draft_tokens=3, acceptance=0.8, time_model=ROOFLINE)
    fm = est.draft.forward_model()
    first, later = eagle3_ops(fm, 4.0, True), eagle3_ops(fm, 4.0, False)
    assert [o.name for o in first] == ["eagle_hidden_norm", "eagle_qkv_hidden", "eagle_fc"]
    assert [o.name for o in later] == ["eagle_hidden_norm", "eagle_qkv_hidden"]
    fc = first[-1]
    assert fc.flops == 2 * 4.0 * 3 * 4096 * 4096 and fc.weight_bytes == 3 * 4096 * 4096 * 2
    # the head's k steps are cheaper than k steps of a one-layer model with the target's whole head
    whole = speculate("llama-3.1-8b", "eagle3:128256", "h100-sxm", num_draft_tokens=3, acceptance=0.8,
                      time_model=ROOFLINE)
    assert est.first_draft_s < whole.first_draft_s and est.speedup > whole.speedup


@pytest.mark.parametrize(("target", "changes", "message"), [
    ("deepseek-v3", None, "multi-head latent attention) needs the head's config.json"),
    ("llama-3.1-8b", dict(hidden_size=2048), "an EAGLE-3 head of hidden_size 2048"),
    ("llama-3.1-8b", dict(vocab_size=32000), "vocab_size 32000 differs from llama-3.1-8b's 128256"),
    ("llama-3.1-8b", dict(num_hidden_layers=2), "num_hidden_layers=2; EAGLE-3 heads of one decoder layer"),
])
def test_heads_it_cannot_price_are_refused(tmp_path, target: str, changes: dict | None, message: str) -> None:
    draft = "eagle3" if changes is None else _head(tmp_path, **changes)
    with pytest.raises(SpecError, match="^draft: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        resolve_draft(load_model(target), draft)


def test_the_command_line_prices_it_and_refuses_a_bad_vocabulary() -> None:
    ok = CliRunner().invoke(app, ["speculate", "llama-3.1-8b", "--draft", "eagle3", "-k", "3", "-a", "0.8",
                                  "-f", "json"])
    assert ok.exit_code == 0, ok.output
    (row,) = json.loads(ok.stdout)
    assert row["draft"] == "llama-3.1-8b EAGLE-3" and row["num_draft_tokens"] == 3 and row["speedup"] > 1
    bad = CliRunner().invoke(app, ["speculate", "llama-3.1-8b", "--draft", "eagle3:x", "-k", "3", "-a", "0.8"])
    assert bad.exit_code == 2 and "draft: eagle3:N needs N" in bad.output and "Traceback" not in bad.output


def test_simulate_serves_with_an_eagle3_head() -> None:
    res = CliRunner().invoke(app, ["simulate", "llama-3.1-8b", "-H", "h100-sxm", "-n", "8", "--rate", "4",
                                   "--draft", "eagle3", "--draft-tokens", "3", "--acceptance", "0.8",
                                   "--efficiency", "roofline", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["settings"]["draft"] == "llama-3.1-8b EAGLE-3"
